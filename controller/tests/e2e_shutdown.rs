//! End to end, over real sockets on 127.0.0.1 and [::1]: shutdown. On SIGTERM `/readyz` answers
//! 503 at once while both families are still served for `--shutdown-delay`; then the proxy
//! listeners close, in-flight requests finish within `--drain-timeout`, and what outlasts it is
//! cut.

use std::time::{Duration, Instant};

use conformance::bytes::Bytes;
use conformance::client::{self, Conn, Reply};
use conformance::http::Method;
use conformance::http_body_util::Full;
use conformance::{Duet, DuetBuilder, Family, Fleet, Ingress, ManifestDir, PodSpec};
use tokio::task::JoinHandle;

const DUET: &str = env!("CARGO_BIN_EXE_duet");

async fn setup(args: &[&str]) -> anyhow::Result<(Fleet, ManifestDir, Duet)> {
    let fleet = Fleet::start("bye", "echo", &[PodSpec::dual("dual")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    dir.write(
        "ingress.yaml",
        &[Ingress::new("bye", "web").host("a.test", "echo").build()],
    )?;
    let duet = DuetBuilder::new(DUET, dir.path())
        .args(args.iter().copied())
        .start()
        .await?;
    Ok((fleet, dir, duet))
}

/// A request the echo pod answers after `delay`, on a connection of its own, per family.
async fn slow_requests(
    duet: &Duet,
    delay: Duration,
) -> anyhow::Result<Vec<JoinHandle<anyhow::Result<Reply>>>> {
    let mut tasks = Vec::new();
    for family in Family::BOTH {
        let mut conn = Conn::http1(duet.http(family)).await?;
        let req = client::request(Method::GET, "a.test", "/slow")
            .header("x-echo-delay-ms", delay.as_millis().to_string())
            .body(Full::new(Bytes::new()))?;
        tasks.push(tokio::spawn(async move { conn.send(req).await }));
    }
    // Let both reach the pod.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(tasks)
}

fn sigterm(duet: &Duet) -> anyhow::Result<()> {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &duet.pid().to_string()])
        .status()?;
    anyhow::ensure!(status.success(), "kill -TERM failed");
    Ok(())
}

async fn exited(duet: &mut Duet, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while duet.check_running().is_ok() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "duet still runs after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_turns_readyz_503_keeps_serving_for_the_delay_then_drains() -> anyhow::Result<()> {
    let delay = Duration::from_secs(4);
    let (_fleet, _dir, mut duet) =
        setup(&["--shutdown-delay", "4s", "--drain-timeout", "20s"]).await?;
    // Outlasts the shutdown delay: finishes during the drain.
    let in_flight = slow_requests(&duet, Duration::from_secs(6)).await?;
    sigterm(&duet)?;
    let signalled = Instant::now();
    for family in Family::BOTH {
        let admin = duet.admin(family);
        let ready = client::eventually("/readyz 503", Duration::from_secs(2), || async move {
            let reply = client::get(admin, "localhost", "/readyz").await?;
            anyhow::ensure!(reply.status == 503, "/readyz answered {}", reply.status);
            Ok(reply)
        });
        ready.await?;
    }
    // New connections of both families are still served while load balancers catch up.
    for family in Family::BOTH {
        let mut conn = Conn::http1(duet.http(family)).await?;
        client::expect_status(&conn.get("a.test", "/during-delay").await?, 200)?;
    }
    assert!(
        signalled.elapsed() < delay,
        "the checks took longer than the delay ({:?}); nothing was shown",
        signalled.elapsed()
    );
    // Then the listeners close.
    for family in Family::BOTH {
        let to = duet.http(family);
        client::eventually(
            "the listener closed",
            Duration::from_secs(10),
            || async move {
                match client::connect_tcp(to).await {
                    Ok(_) => anyhow::bail!("{to} still accepts"),
                    Err(_) => Ok(()),
                }
            },
        )
        .await?;
    }
    assert!(signalled.elapsed() >= delay, "closed before the delay");
    // The requests in flight finish within the drain timeout.
    for task in in_flight {
        let reply = task.await??;
        client::expect_status(&reply, 200)?;
    }
    exited(&mut duet, Duration::from_secs(20)).await?;
    let logs = duet.logs();
    assert!(!logs.contains("Drain timed out"), "{logs}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_outlasting_the_drain_timeout_are_cut() -> anyhow::Result<()> {
    let (_fleet, _dir, mut duet) =
        setup(&["--shutdown-delay", "0", "--drain-timeout", "1s"]).await?;
    let in_flight = slow_requests(&duet, Duration::from_secs(30)).await?;
    let signalled = Instant::now();
    sigterm(&duet)?;
    // Well before the 30 s the requests would take.
    exited(&mut duet, Duration::from_secs(15)).await?;
    assert!(
        signalled.elapsed() >= Duration::from_secs(1),
        "exited before the drain timeout"
    );
    for task in in_flight {
        let reply = task.await?;
        assert!(
            reply.is_err(),
            "cut request answered: {:?}",
            reply.map(|r| r.status)
        );
    }
    assert!(duet.logs().contains("Drain timed out"), "{}", duet.logs());
    Ok(())
}
