//! h2spec (github.com/summerwind/h2spec, the HTTP/2 conformance tester, built from the pinned
//! module by `conformance/tools/h2spec/build.sh`) against the real `duet`: the HTTPS listener
//! (TLS, ALPN `h2`) and the cleartext listener (HTTP/2 prior knowledge), over 127.0.0.1 and
//! [::1]. Every case passes except the listed exceptions, each with its reason (README,
//! "HTTP/2 conformance"); a new failure, or an exception that starts passing, is red. Without Go
//! the test is skipped, except under `CI`, where that is a failure.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use conformance::{DuetBuilder, Family, Fleet, Ingress, ManifestDir, PodSpec, PortRef};

const DUET: &str = env!("CARGO_BIN_EXE_duet");

/// Cases that fail on the cleartext listener, by h2spec id. That listener serves HTTP/1.1 and
/// HTTP/2 prior knowledge on one port (as nginx's `listen ... http2` does): bytes that are not
/// the HTTP/2 preface are read as an HTTP/1.1 request, answered `400` and the connection closed,
/// where RFC 9113 §3.4 expects a bare close. Over TLS (ALPN `h2`) the same case passes.
const CLEARTEXT_EXCEPTIONS: &[&str] = &["http2/3.5/2"];

/// Cases that fail on the HTTPS listener: none.
const TLS_EXCEPTIONS: &[&str] = &[];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_owned()
}

/// Builds (once) and locates h2spec; `None` when Go is missing outside CI.
fn h2spec() -> Option<PathBuf> {
    let root = workspace();
    let script = root.join("conformance/tools/h2spec/build.sh");
    let out = root.join("target/tools/h2spec");
    let built = Command::new("bash")
        .arg(&script)
        .arg(&out)
        .output()
        .expect("bash runs");
    if built.status.success() {
        return Some(out);
    }
    let why = String::from_utf8_lossy(&built.stderr).into_owned();
    assert!(
        std::env::var_os("CI").is_none(),
        "CI is set and h2spec could not be built: {why}"
    );
    eprintln!("skipping h2spec: {why}");
    None
}

/// The ids (`http2/5.1/9`) of every case in an h2spec JUnit report, and of the failed ones.
fn report(xml: &str) -> (usize, BTreeSet<String>) {
    let mut total = 0;
    let mut failed = BTreeSet::new();
    let mut index: Option<(String, usize)> = None;
    for case in xml.split("<testcase ").skip(1) {
        let package = case
            .split("package=\"")
            .nth(1)
            .and_then(|p| p.split('"').next())
            .unwrap_or_default()
            .to_owned();
        let n = match &index {
            Some((p, n)) if *p == package => n + 1,
            _ => 1,
        };
        index = Some((package.clone(), n));
        total += 1;
        let body = case.split("</testcase>").next().unwrap_or_default();
        if body.contains("<failure") || body.contains("<error") || body.contains("<skipped") {
            failed.insert(format!("{package}/{n}"));
        }
    }
    (total, failed)
}

#[test]
fn report_parsing() {
    let xml = r#"<testsuites><testsuite package="http2/3.5"><testcase package="http2/3.5" classname="a"></testcase>
<testcase package="http2/3.5" classname="b"><failure>x</failure></testcase></testsuite>
<testsuite package="hpack/2"><testcase package="hpack/2" classname="c"><error>y</error></testcase></testsuite></testsuites>"#;
    let (total, failed) = report(xml);
    assert_eq!(total, 3);
    assert_eq!(
        failed,
        BTreeSet::from(["http2/3.5/2".to_owned(), "hpack/2/1".to_owned()])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2spec_passes_on_both_listeners_and_families() -> anyhow::Result<()> {
    let Some(h2spec) = h2spec() else {
        return Ok(());
    };
    // Requests go to an echo pod, which reads the whole request before answering, as most
    // applications do; h2spec's stream-state cases assume the answer does not come first.
    let fleet = Fleet::start("h2spec", "echo", &[PodSpec::dual("echo")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    let ingress = Ingress::new("h2spec", "all")
        .annotation("duet.dev/ssl-redirect", "false")
        .default_backend("echo", PortRef::Name("http".into()));
    dir.write("ingress.yaml", &[ingress.build()])?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    let mut summary = Vec::new();
    for family in Family::BOTH {
        for (tls, exceptions) in [(false, CLEARTEXT_EXCEPTIONS), (true, TLS_EXCEPTIONS)] {
            let to = if tls {
                duet.https(family)
            } else {
                duet.http(family)
            };
            let junit = tempfile::NamedTempFile::new()?;
            let mut cmd = Command::new(&h2spec);
            // h2spec joins host and port with a colon: an IPv6 host goes in brackets.
            let host = match to {
                std::net::SocketAddr::V4(a) => a.ip().to_string(),
                std::net::SocketAddr::V6(a) => format!("[{}]", a.ip()),
            };
            cmd.arg("-h")
                .arg(host)
                .arg("-p")
                .arg(to.port().to_string())
                .arg("-o")
                .arg("5")
                .arg("-j")
                .arg(junit.path());
            if tls {
                cmd.arg("-t").arg("-k");
            }
            let run = tokio::task::spawn_blocking(move || cmd.output()).await??;
            let xml = std::fs::read_to_string(junit.path())?;
            let (total, failed) = report(&xml);
            let what = format!("{} {to}", if tls { "HTTPS" } else { "cleartext" });
            assert!(
                total >= 145,
                "{what}: only {total} cases ran\n{}",
                String::from_utf8_lossy(&run.stdout)
            );
            let expected: BTreeSet<String> = exceptions.iter().map(|s| s.to_string()).collect();
            assert_eq!(
                failed,
                expected,
                "{what}: failed cases differ from the listed exceptions\n{}",
                String::from_utf8_lossy(&run.stdout)
            );
            summary.push(format!(
                "{what}: {total} cases, {} passed, {} failed (listed exceptions)",
                total - failed.len(),
                failed.len()
            ));
        }
    }
    eprintln!("{}", summary.join("\n"));
    Ok(())
}
