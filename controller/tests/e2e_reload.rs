//! End to end, over real sockets on 127.0.0.1 and [::1]: manifest changes (edit, add, delete a
//! file) go live without a restart while keep-alive connections opened before stay usable, and a
//! broken file never takes the other routes down.

use std::time::Duration;

use conformance::client::{self, Conn};
use conformance::{DuetBuilder, Family, Fleet, Ingress, ManifestDir, PodSpec};

const DUET: &str = env!("CARGO_BIN_EXE_duet");

/// How long a change may take to go live (debounce is ~50-500 ms; generous for a loaded box).
const LIVE: Duration = Duration::from_secs(15);

/// Waits until `host` answers `status` from both families, on fresh connections.
async fn until_status(duet: &conformance::Duet, host: &str, status: u16) -> anyhow::Result<()> {
    for family in Family::BOTH {
        client::eventually(
            &format!("{host} answers {status} to {family} clients"),
            LIVE,
            || async {
                let reply = client::get(duet.http(family), host, "/").await?;
                client::expect_status(&reply, status)
            },
        )
        .await?;
    }
    Ok(())
}

/// A request on each old connection still works and the connection was not replaced.
async fn old_connections_work(conns: &mut [Conn], host: &str, status: u16) -> anyhow::Result<()> {
    for conn in conns.iter_mut() {
        assert!(
            !conn.is_closed(),
            "the {} keep-alive connection was closed",
            conn.family()
        );
        let reply = conn.get(host, "/").await?;
        client::expect_status(&reply, status)?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifest_changes_go_live_without_restart_and_keep_alive_survives() -> anyhow::Result<()> {
    let first = Fleet::start("e2e", "web", &[PodSpec::dual("first")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("web.yaml", &first.manifests())?;
    dir.write(
        "ingress.yaml",
        &[Ingress::new("e2e", "web").host("a.test", "web").build()],
    )?;
    let mut duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    let pid = duet.pid();

    let mut conns = vec![
        Conn::http1(duet.http(Family::V4)).await?,
        Conn::http1(duet.http(Family::V6)).await?,
    ];
    for conn in &mut conns {
        let echo = conn.get("a.test", "/").await?.echo()?;
        assert_eq!(echo.pod, "first");
        assert_eq!(echo.family, conn.family());
        assert_eq!(conn.get("b.test", "/").await?.status, 404);
    }

    // Edit a file: a second host on the same Ingress.
    dir.write(
        "ingress.yaml",
        &[Ingress::new("e2e", "web")
            .host("a.test", "web")
            .host("b.test", "web")
            .build()],
    )?;
    until_status(&duet, "b.test", 200).await?;
    old_connections_work(&mut conns, "b.test", 200).await?;

    // Add a file: EndpointSlices of a second, IPv6-only pod of the same Service.
    let second = Fleet::start("e2e", "web", &[PodSpec::v6_only("second")])?;
    dir.write("web-second.yaml", &second.slices())?;
    for family in Family::BOTH {
        client::eventually(
            &format!("{family} clients reach the added pod"),
            LIVE,
            || async {
                let echo = client::get(duet.http(family), "a.test", "/")
                    .await?
                    .echo()?;
                anyhow::ensure!(echo.pod == "second", "served by {}", echo.pod);
                assert_eq!(
                    echo.family,
                    Family::V6,
                    "the IPv6-only pod is reached over IPv6"
                );
                Ok(())
            },
        )
        .await?;
    }
    old_connections_work(&mut conns, "a.test", 200).await?;

    // Add another file with its own Ingress, then delete it.
    dir.write(
        "other.yaml",
        &[Ingress::new("e2e", "other").host("c.test", "web").build()],
    )?;
    until_status(&duet, "c.test", 200).await?;
    old_connections_work(&mut conns, "c.test", 200).await?;
    dir.remove("other.yaml")?;
    until_status(&duet, "c.test", 404).await?;
    old_connections_work(&mut conns, "c.test", 404).await?;

    // Delete the second pod's slices: only the first pod serves again.
    dir.remove("web-second.yaml")?;
    for family in Family::BOTH {
        client::eventually(
            &format!("{family} clients only reach the first pod"),
            LIVE,
            || async {
                let replies = client::load(duet.http(family), "a.test", "/", 20, 1).await?;
                for r in &replies {
                    let echo = r.echo()?;
                    anyhow::ensure!(echo.pod == "first", "served by {}", echo.pod);
                }
                Ok(())
            },
        )
        .await?;
    }
    old_connections_work(&mut conns, "a.test", 200).await?;

    duet.check_running()?;
    assert_eq!(duet.pid(), pid, "duet was restarted");
    Ok(())
}

const BROKEN_YAML: &str =
    "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: [name: oops\n  spec: {{\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_files_leave_the_other_routes_serving() -> anyhow::Result<()> {
    let fleet = Fleet::start("e2e", "web", &[PodSpec::dual("web")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("web.yaml", &fleet.manifests())?;
    dir.write(
        "a.yaml",
        &[Ingress::new("e2e", "a").host("a.test", "web").build()],
    )?;
    dir.write(
        "b.yaml",
        &[Ingress::new("e2e", "b").host("b.test", "web").build()],
    )?;
    let mut duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    until_status(&duet, "a.test", 200).await?;
    until_status(&duet, "b.test", 200).await?;
    let mut conns = vec![
        Conn::http1(duet.http(Family::V4)).await?,
        Conn::http1(duet.http(Family::V6)).await?,
    ];

    // A new file that is not YAML, one with an unknown kind and an Ingress to a missing Service.
    dir.write_raw("broken.yaml", BROKEN_YAML)?;
    dir.write_raw(
        "odd.yaml",
        "apiVersion: example.com/v1\nkind: Gadget\nmetadata:\n  name: g\n  namespace: e2e\n---\n",
    )?;
    dir.write(
        "dangling.yaml",
        &[Ingress::new("e2e", "dangling")
            .host("dangling.test", "nope")
            .build()],
    )?;
    // A valid change made after them: once it is live, the broken files have been read too.
    dir.write(
        "c.yaml",
        &[Ingress::new("e2e", "c").host("c.test", "web").build()],
    )?;
    until_status(&duet, "c.test", 200).await?;
    until_status(&duet, "a.test", 200).await?;
    until_status(&duet, "b.test", 200).await?;
    old_connections_work(&mut conns, "a.test", 200).await?;

    // Break a file that held a route: the routes of the other files keep serving.
    dir.write_raw("b.yaml", BROKEN_YAML)?;
    dir.write(
        "d.yaml",
        &[Ingress::new("e2e", "d").host("d.test", "web").build()],
    )?;
    until_status(&duet, "d.test", 200).await?;
    for host in ["a.test", "c.test"] {
        until_status(&duet, host, 200).await?;
    }
    old_connections_work(&mut conns, "a.test", 200).await?;
    // The broken file keeps its last good objects: b.test still serves, now (d.yaml, written
    // after it, is live, so the broken b.yaml has been read), on both families.
    for family in Family::BOTH {
        let reply = client::get(duet.http(family), "b.test", "/").await?;
        client::expect_status(&reply, 200)
            .map_err(|e| e.context(format!("{family}: b.test after b.yaml broke")))?;
    }
    old_connections_work(&mut conns, "b.test", 200).await?;

    // Fixing it replaces those objects by the file's new ones.
    dir.write(
        "b.yaml",
        &[Ingress::new("e2e", "b").host("b2.test", "web").build()],
    )?;
    until_status(&duet, "b2.test", 200).await?;
    until_status(&duet, "b.test", 404).await?;

    duet.check_running()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_with_a_broken_file_and_serves_the_rest() -> anyhow::Result<()> {
    let fleet = Fleet::start("e2e", "web", &[PodSpec::dual("web")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("web.yaml", &fleet.manifests())?;
    dir.write(
        "a.yaml",
        &[Ingress::new("e2e", "a").host("a.test", "web").build()],
    )?;
    dir.write_raw("broken.yaml", BROKEN_YAML)?;
    let mut duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    until_status(&duet, "a.test", 200).await?;
    duet.check_running()?;
    Ok(())
}
