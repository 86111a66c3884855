//! The manifest-folder source: scans pick up created, modified and deleted files; a broken file
//! keeps its last good objects and never costs other files' routes; and, live through `notify`
//! and the control loop, changes reach the dataplane's routing table (including saves done by
//! writing a temporary file and renaming it over the manifest).

use std::path::Path;
use std::time::Duration;

use controller::app::{App, AppConfig};
use controller::index::{Change, Kind, ObjectKey};
use controller::source::files::{self, FileSource};
use controller::translate;
use dataplane::{ProxyConfig, Runtime};
use tokio::sync::mpsc;

fn ingress(name: &str, host: &str, service: &str) -> String {
    format!(
        r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: {name}}}
spec:
  ingressClassName: duet
  rules:
    - host: {host}
      http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: {service}, port: {{number: 80}}}}}}}}]}}
"#
    )
}

fn service(name: &str) -> String {
    format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec: {{ports: [{{port: 80}}]}}\n")
}

fn write(dir: &Path, name: &str, docs: &[String]) {
    std::fs::write(dir.join(name), docs.join("---\n")).unwrap();
}

/// (kind, name) of applied objects and of deleted keys, sorted.
fn summary(changes: &[Change]) -> (Vec<String>, Vec<String>) {
    let mut applied = Vec::new();
    let mut deleted = Vec::new();
    for c in changes {
        match c {
            Change::Apply { object, .. } => applied.push(object.key().to_string()),
            Change::Delete(key) => deleted.push(key.to_string()),
            Change::Replace { .. } => panic!("the folder source sends Apply and Delete"),
        }
    }
    applied.sort();
    deleted.sort();
    (applied, deleted)
}

#[test]
fn scans_follow_create_modify_delete_and_keep_last_good_objects() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        d,
        "web.yaml",
        &[ingress("web", "web.test", "web"), service("web")],
    );
    write(d, "api.yml", &[service("api")]);
    std::fs::write(d.join("notes.txt"), "not a manifest").unwrap();
    std::fs::write(d.join(".hidden.yaml"), "kind: [broken").unwrap();

    let mut source = FileSource::new(d);
    let (applied, deleted) = summary(&source.scan().unwrap());
    assert_eq!(
        applied,
        [
            "Ingress default/web",
            "Service default/api",
            "Service default/web"
        ]
    );
    assert!(deleted.is_empty());
    // Nothing changed: nothing to report.
    assert!(source.scan().unwrap().is_empty());

    // Modify: only the changed object is applied again.
    write(
        d,
        "web.yaml",
        &[ingress("web", "www.test", "web"), service("web")],
    );
    assert_eq!(summary(&source.scan().unwrap()).0, ["Ingress default/web"]);

    // Break the file: its objects stay (no deletes), nothing is applied.
    std::fs::write(d.join("web.yaml"), "apiVersion: v1\nkind: [oops\n").unwrap();
    assert!(source.scan().unwrap().is_empty());

    // An unknown kind next to a good object: the good one is applied, nothing deleted.
    write(
        d,
        "web.yaml",
        &[
            ingress("web", "www.test", "web"),
            service("web"),
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n".to_owned(),
        ],
    );
    assert!(
        source.scan().unwrap().is_empty(),
        "same objects as the last good state"
    );

    // Delete a file: its objects are deleted.
    std::fs::remove_file(d.join("api.yml")).unwrap();
    let (applied, deleted) = summary(&source.scan().unwrap());
    assert!(applied.is_empty());
    assert_eq!(deleted, ["Service default/api"]);

    // Applied objects carry their file.
    write(d, "api.yml", &[service("api")]);
    let changes = source.scan().unwrap();
    match &changes[..] {
        [Change::Apply {
            file: Some(file), ..
        }] => assert_eq!(&**file, d.join("api.yml")),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn an_object_defined_in_two_files_comes_from_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(d, "a.yaml", &[ingress("web", "a.test", "web")]);
    write(d, "b.yaml", &[ingress("web", "b.test", "web")]);
    let mut source = FileSource::new(d);
    let changes = source.scan().unwrap();
    assert_eq!(changes.len(), 1);
    let Change::Apply { object, file } = &changes[0] else {
        panic!("{changes:?}")
    };
    assert_eq!(
        object.key(),
        ObjectKey::new(Kind::Ingress, "default", "web")
    );
    assert_eq!(file.as_deref(), Some(d.join("a.yaml").as_path()));
    // Removing the first file hands the object to the second.
    std::fs::remove_file(d.join("a.yaml")).unwrap();
    let changes = source.scan().unwrap();
    assert!(
        matches!(&changes[..], [Change::Apply { file: Some(f), .. }] if **f == *d.join("b.yaml"))
    );
}

/// Polls until `check` holds, for up to 10 s.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn routes(runtime: &Runtime, host: &str) -> Option<String> {
    runtime
        .load()
        .snapshot
        .routes
        .find(host, "/")
        .map(|m| m.action.backend.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_changes_reach_the_routing_table() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    write(
        &d,
        "web.yaml",
        &[ingress("web", "web.test", "web"), service("web")],
    );
    write(
        &d,
        "shop.yaml",
        &[ingress("shop", "shop.test", "shop"), service("shop")],
    );

    let runtime = Runtime::new(ProxyConfig::default());
    let app = App::new(
        AppConfig::new(translate::Config::default()),
        runtime.clone(),
    );
    let diagnostics = app.diagnostics();
    let (tx, rx) = mpsc::channel(16);
    let source = files::spawn(d.clone(), tx).unwrap();
    let app = tokio::spawn(app.run(rx));

    eventually("the first scan is served", || runtime.is_ready()).await;
    assert_eq!(
        routes(&runtime, "web.test").as_deref(),
        Some("default/web:80")
    );
    assert_eq!(
        routes(&runtime, "shop.test").as_deref(),
        Some("default/shop:80")
    );

    // Create a file.
    write(
        &d,
        "api.yaml",
        &[ingress("api", "api.test", "api"), service("api")],
    );
    eventually("a new file is served", || {
        routes(&runtime, "api.test").is_some()
    })
    .await;

    // Modify a file (a second host).
    write(
        &d,
        "web.yaml",
        &[
            ingress("web", "web.test", "web"),
            ingress("web2", "www.test", "web"),
            service("web"),
        ],
    );
    eventually("a modified file is served", || {
        routes(&runtime, "www.test").is_some()
    })
    .await;

    // Break a file: every route stays, its own included.
    let version = runtime.load().snapshot.version;
    std::fs::write(d.join("shop.yaml"), "apiVersion: v1\nkind: [oops\n").unwrap();
    // A later, good change proves the broken file was read in between.
    write(&d, "extra.yaml", &[ingress("extra", "extra.test", "web")]);
    eventually("the change after the broken file is served", || {
        routes(&runtime, "extra.test").is_some()
    })
    .await;
    assert!(runtime.load().snapshot.version > version);
    for host in ["web.test", "www.test", "api.test", "shop.test"] {
        assert!(routes(&runtime, host).is_some(), "{host} lost its route");
    }

    // An Ingress pointing at a missing Service is diagnosed; the rest keeps serving.
    write(
        &d,
        "ghost.yaml",
        &[ingress("ghost", "ghost.test", "nowhere")],
    );
    eventually("the missing Service is diagnosed", || {
        diagnostics.current().iter().any(|r| {
            r.diagnostic.reason == translate::Reason::MissingService
                && r.file.as_deref() == Some(d.join("ghost.yaml").as_path())
        })
    })
    .await;
    assert!(routes(&runtime, "ghost.test").is_none());
    assert!(routes(&runtime, "web.test").is_some());

    // Save by rename (how many editors write): a temporary file renamed over the manifest.
    std::fs::write(
        d.join(".api.yaml.tmp"),
        [ingress("api", "api2.test", "api"), service("api")].join("---\n"),
    )
    .unwrap();
    std::fs::rename(d.join(".api.yaml.tmp"), d.join("api.yaml")).unwrap();
    eventually("a renamed-over file is served", || {
        routes(&runtime, "api2.test").is_some() && routes(&runtime, "api.test").is_none()
    })
    .await;

    // Delete a file.
    std::fs::remove_file(d.join("api.yaml")).unwrap();
    eventually("a deleted file's routes go", || {
        routes(&runtime, "api2.test").is_none()
    })
    .await;
    assert!(routes(&runtime, "web.test").is_some());

    source.abort();
    let _ = source.await;
    // The source's sender is gone: the loop ends.
    tokio::time::timeout(Duration::from_secs(5), app)
        .await
        .expect("the loop ends when its source does")
        .unwrap();
}

#[test]
fn a_rewrite_keeping_size_and_modification_time_is_picked_up() {
    // Tools like `cp -p`, `rsync -t` and tar restore the modification time: the rescan must not
    // trust size and mtime alone (a file is only skipped unread when its inode, size,
    // modification and change times are all as at the last read).
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let path = d.join("web.yaml");
    write(d, "web.yaml", &[ingress("web", "aaa.test", "web")]);
    let old = std::time::SystemTime::now() - Duration::from_secs(3600);
    let set_mtime = |path: &Path| {
        let file = std::fs::File::options().write(true).open(path).unwrap();
        file.set_modified(old).unwrap();
    };
    set_mtime(&path);
    let mut source = FileSource::new(d);
    assert_eq!(summary(&source.scan().unwrap()).0, ["Ingress default/web"]);
    assert!(source.scan().unwrap().is_empty());

    // Same length, same inode, modification time put back.
    std::fs::write(&path, ingress("web", "bbb.test", "web")).unwrap();
    set_mtime(&path);
    let changes = source.scan().unwrap();
    let [Change::Apply { object, .. }] = &changes[..] else {
        panic!("the rewrite was missed: {changes:?}")
    };
    let controller::index::Object::Ingress(ingress) = object else {
        panic!("{object:?}")
    };
    let rules = ingress.spec.as_ref().unwrap().rules.as_ref().unwrap();
    assert_eq!(rules[0].host.as_deref(), Some("bbb.test"));
    assert!(source.scan().unwrap().is_empty(), "read once, then skipped");
}
