//! The fault proxy in front of the real control plane: a cut of the watches ends every watch the
//! cut could have reached, also one that was still on its way to the API server when the cut
//! came (else it streams on, and a test that made changes "behind duet's back" sees them served
//! during the fault). Raw HTTP/1.1 over both loopbacks.

use std::time::Duration;

use conformance::cluster::{FaultProxy, Stack};
use conformance::Family;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const WATCH: &str = "/api/v1/namespaces/default/configmaps?watch=true";

/// Joins the shared dual-stack cluster and starts a fault proxy in front of it.
fn proxy() -> anyhow::Result<FaultProxy> {
    let cluster = conformance::cluster::shared(Stack::Dual)?;
    cluster.enter()?;
    FaultProxy::start(cluster.kubeconfig())
}

/// Sends a watch through the proxy over `family`; the connection, its request written.
async fn start_watch(proxy: &FaultProxy, family: Family) -> anyhow::Result<TcpStream> {
    let mut stream = TcpStream::connect(proxy.addr(family)).await?;
    let request = format!("GET {WATCH} HTTP/1.1\r\nHost: api\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    Ok(stream)
}

/// Whether the proxy ends the connection within `within`, and what it sent.
async fn ends_within(stream: &mut TcpStream, within: Duration) -> (bool, String) {
    let mut seen = Vec::new();
    let ended = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    (ended, String::from_utf8_lossy(&seen).into_owned())
}

async fn cut_reaches_a_watch_on_its_way(family: Family) -> anyhow::Result<()> {
    let proxy = proxy()?;
    // Held in the proxy, as a slow API server would: the watch arrives, the cut comes, and only
    // then does the API server answer.
    let stall = Duration::from_secs(2);
    proxy.stall_for(stall);
    let mut watch = start_watch(&proxy, family).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.cut_watches();
    let (ended, seen) = ends_within(&mut watch, stall + Duration::from_secs(3)).await;
    anyhow::ensure!(ended, "the watch streams on after the cut: {seen:?}");
    anyhow::ensure!(seen.starts_with("HTTP/1.1 200"), "answered {seen:?}");

    // A watch after the cut is not cut by it: it still streams 3 s later.
    let mut later = start_watch(&proxy, family).await?;
    let (ended, seen) = ends_within(&mut later, Duration::from_secs(3)).await;
    anyhow::ensure!(!ended, "a watch made after the cut ended: {seen:?}");
    anyhow::ensure!(
        proxy.open_watches("/configmaps") == 1,
        "{} watches open",
        proxy.open_watches("/configmaps")
    );
    Ok(())
}

#[tokio::test]
async fn a_cut_ends_a_watch_still_on_its_way_on_ipv4() -> anyhow::Result<()> {
    cut_reaches_a_watch_on_its_way(Family::V4).await
}

#[tokio::test]
async fn a_cut_ends_a_watch_still_on_its_way_on_ipv6() -> anyhow::Result<()> {
    cut_reaches_a_watch_on_its_way(Family::V6).await
}
