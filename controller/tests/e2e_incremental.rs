//! End to end, over real sockets on 127.0.0.1 and [::1]: the incremental paths of the control
//! loop serve what a full rebuild would. An EndpointSlice change (published without rebuilding
//! routes, only that Service's backends replaced in the runtime), then an Ingress change (the
//! hosts it touches rebuilt, the others reused) and a Service change (the hosts of the Ingresses
//! reading it rebuilt) are each checked from clients of both families,
//! on the changed host and on a host the change did not touch, on new and on kept-alive
//! connections.

use std::time::Duration;

use conformance::client::{self, Conn};
use conformance::{DuetBuilder, Family, Fleet, Ingress, ManifestDir, PathType, PodSpec, PortRef};

const DUET: &str = env!("CARGO_BIN_EXE_duet");

/// How long a change may take to go live (debounce is ~50-500 ms; generous for a loaded box).
const LIVE: Duration = Duration::from_secs(15);

/// Waits until `host` `path` is served by `pod` for clients of both families, on fresh
/// connections, and every one of 10 requests then is.
async fn until_served_by(
    duet: &conformance::Duet,
    host: &str,
    path: &str,
    pod: &str,
) -> anyhow::Result<()> {
    for family in Family::BOTH {
        client::eventually(
            &format!("{host}{path} is served by {pod} to {family} clients"),
            LIVE,
            || async {
                let replies = client::load(duet.http(family), host, path, 10, 1).await?;
                for reply in &replies {
                    let echo = reply.echo()?;
                    anyhow::ensure!(echo.pod == pod, "served by {}", echo.pod);
                    anyhow::ensure!(echo.family == family, "reached over {}", echo.family);
                }
                Ok(())
            },
        )
        .await?;
    }
    Ok(())
}

/// Waits until `host` `path` answers `status` to clients of both families.
async fn until_status(
    duet: &conformance::Duet,
    host: &str,
    path: &str,
    status: u16,
) -> anyhow::Result<()> {
    for family in Family::BOTH {
        client::eventually(
            &format!("{host}{path} answers {status} to {family} clients"),
            LIVE,
            || async {
                let reply = client::get(duet.http(family), host, path).await?;
                anyhow::ensure!(reply.status == status, "answered {}", reply.status);
                Ok(())
            },
        )
        .await?;
    }
    Ok(())
}

/// `host` `path` is served by `pod` on each kept-alive connection, in its own family.
async fn kept_alive_served_by(
    conns: &mut [Conn],
    host: &str,
    path: &str,
    pod: &str,
) -> anyhow::Result<()> {
    for conn in conns.iter_mut() {
        let family = conn.family();
        assert!(!conn.is_closed(), "the {family} connection was closed");
        let echo = conn.get(host, path).await?.echo()?;
        assert_eq!(echo.pod, pod, "{host}{path} over the {family} connection");
        assert_eq!(echo.family, family);
    }
    Ok(())
}

/// The boolean `field` of duet's "Snapshot applied" line of `version`.
fn snapshot_flag(duet: &conformance::Duet, version: u64, field: &str) -> Option<bool> {
    let logs = duet.logs();
    let marker = format!("snapshot.version={version} ");
    let line = logs
        .lines()
        .find(|l| l.contains("Snapshot applied") && l.contains(&marker))?;
    if line.contains(&format!("{field}=true")) {
        Some(true)
    } else if line.contains(&format!("{field}=false")) {
        Some(false)
    } else {
        None
    }
}

/// The `routes.rebuilt` field of duet's "Snapshot applied" line of `version`.
fn routes_rebuilt(duet: &conformance::Duet, version: u64) -> Option<bool> {
    snapshot_flag(duet, version, "routes.rebuilt")
}

/// The latest published snapshot version in duet's log.
fn latest_version(duet: &conformance::Duet) -> u64 {
    duet.logs()
        .lines()
        .filter(|l| l.contains("Snapshot applied"))
        .filter_map(|l| {
            let rest = l.split("snapshot.version=").nth(1)?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .max()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_and_ingress_changes_serve_both_families_on_changed_and_untouched_hosts(
) -> anyhow::Result<()> {
    let web_1 = Fleet::start("e2e", "web", &[PodSpec::dual("web-1")])?;
    let web_2 = Fleet::start("e2e", "web", &[PodSpec::dual("web-2")])?;
    let api = Fleet::start("e2e", "api", &[PodSpec::dual("api-1")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("web.yaml", &web_1.manifests())?;
    dir.write("api.yaml", &api.manifests())?;
    dir.write(
        "a.yaml",
        &[Ingress::new("e2e", "a").host("a.test", "web").build()],
    )?;
    dir.write(
        "b.yaml",
        &[Ingress::new("e2e", "b").host("b.test", "api").build()],
    )?;
    let mut duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    until_served_by(&duet, "a.test", "/", "web-1").await?;
    until_served_by(&duet, "b.test", "/", "api-1").await?;
    let mut conns = vec![
        Conn::http1(duet.http(Family::V4)).await?,
        Conn::http1(duet.http(Family::V6)).await?,
    ];
    kept_alive_served_by(&mut conns, "a.test", "/", "web-1").await?;

    // An EndpointSlice change: web's pod is replaced (same Service, other slices).
    let before = latest_version(&duet);
    dir.write("web.yaml", &web_2.manifests())?;
    until_served_by(&duet, "a.test", "/", "web-2").await?;
    until_served_by(&duet, "b.test", "/", "api-1").await?;
    kept_alive_served_by(&mut conns, "a.test", "/", "web-2").await?;
    kept_alive_served_by(&mut conns, "b.test", "/", "api-1").await?;
    let endpoint_version = latest_version(&duet);
    assert!(endpoint_version > before, "no snapshot was published");
    for version in before + 1..=endpoint_version {
        assert_eq!(
            routes_rebuilt(&duet, version),
            Some(false),
            "snapshot {version} after an EndpointSlice change rebuilt routes:\n{}",
            duet.logs()
        );
    }

    // An Ingress change: a.test gets an Exact /api to the api Service, and a new host c.test.
    let changed = Ingress::new("e2e", "a")
        .host("a.test", "web")
        .path(
            Some("a.test"),
            PathType::Exact,
            "/api",
            "api",
            PortRef::Name("http".into()),
        )
        .host("c.test", "web");
    dir.write("a.yaml", &[changed.build()])?;
    until_served_by(&duet, "a.test", "/api", "api-1").await?;
    until_served_by(&duet, "c.test", "/", "web-2").await?;
    until_served_by(&duet, "a.test", "/", "web-2").await?;
    until_served_by(&duet, "b.test", "/", "api-1").await?;
    kept_alive_served_by(&mut conns, "a.test", "/api", "api-1").await?;
    kept_alive_served_by(&mut conns, "b.test", "/", "api-1").await?;
    assert_eq!(
        routes_rebuilt(&duet, latest_version(&duet)),
        Some(true),
        "an Ingress change rebuilds routes"
    );

    // A Service change: api's port renamed, so the routes naming its port "http" lose their
    // backend: b.test has no route left, a.test's Exact /api falls to its Prefix / (web). Only
    // the Ingresses reading api (a and b) are planned again, host by host.
    let before = latest_version(&duet);
    let mut renamed = api.manifests();
    renamed[0]["spec"]["ports"][0]["name"] = "web".into();
    dir.write("api.yaml", &renamed)?;
    until_served_by(&duet, "a.test", "/api", "web-2").await?;
    until_status(&duet, "b.test", "/", 404).await?;
    until_served_by(&duet, "c.test", "/", "web-2").await?;
    kept_alive_served_by(&mut conns, "a.test", "/", "web-2").await?;
    // And back: the same routes again.
    dir.write("api.yaml", &api.manifests())?;
    until_served_by(&duet, "a.test", "/api", "api-1").await?;
    until_served_by(&duet, "b.test", "/", "api-1").await?;
    kept_alive_served_by(&mut conns, "b.test", "/", "api-1").await?;
    let service_version = latest_version(&duet);
    assert!(
        service_version >= before + 2,
        "two snapshots:\n{}",
        duet.logs()
    );
    for version in before + 1..=service_version {
        assert_eq!(
            snapshot_flag(&duet, version, "routes.by_host"),
            Some(true),
            "snapshot {version} after a Service change did not plan routes host by host:\n{}",
            duet.logs()
        );
    }

    // And an EndpointSlice change after it: back to web's first pod, on every host of web.
    dir.write("web.yaml", &web_1.manifests())?;
    until_served_by(&duet, "a.test", "/", "web-1").await?;
    until_served_by(&duet, "c.test", "/", "web-1").await?;
    until_served_by(&duet, "a.test", "/api", "api-1").await?;
    kept_alive_served_by(&mut conns, "c.test", "/", "web-1").await?;
    duet.check_running()?;
    Ok(())
}
