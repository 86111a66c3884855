//! Kubernetes mode end to end: a leader whose API server hangs (requests held unanswered, the
//! connections open) steps down on its own timer, before the lease it last renewed could expire
//! for another replica, and leads again once the API answers; the Lease is named by
//! `--election-id`. On the real control plane; the hang is the fault proxy holding every request
//! (`FaultProxy::stall_for`), reached on 127.0.0.1 and [::1].

mod kube_support;

use std::time::{Duration, Instant};

use conformance::client;
use conformance::cluster::Stack;
use conformance::Family;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube_support::*;

const LEASE: &str = "edge-duet";
const LEASE_SECONDS: u64 = 6;

async fn lease(env: &Env) -> anyhow::Result<Option<serde_json::Value>> {
    env.api
        .get("coordination.k8s.io/v1", "Lease", Some(&env.ns), LEASE)
        .await
}

async fn leader_steps_down_when_the_api_hangs(api_family: Family) -> anyhow::Result<()> {
    let env = env(Stack::Dual, &[&format!("leader-{api_family}")]).await?;
    let lease_duration = format!("{LEASE_SECONDS}s");
    let duet = env
        .duet(
            api_family,
            &[
                "--publish-status-address",
                "192.0.2.1,2001:db8::1",
                "--election-id",
                LEASE,
                "--election-lease-duration",
                &lease_duration,
            ],
        )
        .await?;
    client::eventually("duet leads, holding its named Lease", LIVE, || async {
        anyhow::ensure!(duet.logs().contains("Leading"), "not leading yet");
        let holder = lease(&env)
            .await?
            .map(|l| l["spec"]["holderIdentity"].clone());
        anyhow::ensure!(
            holder.as_ref().and_then(|h| h.as_str()).is_some(),
            "Lease {LEASE}: {holder:?}"
        );
        Ok(())
    })
    .await?;
    let default_lease = env
        .api
        .get(
            "coordination.k8s.io/v1",
            "Lease",
            Some(&env.ns),
            "duet-leader",
        )
        .await?;
    assert!(default_lease.is_none(), "--election-id names the Lease");

    // The API server hangs: nothing is answered for three lease durations.
    let renewed: Timestamp = lease(&env).await?.expect("the Lease")["spec"]["renewTime"]
        .as_str()
        .expect("renewTime")
        .parse()?;
    env.proxy.stall_for(Duration::from_secs(3 * LEASE_SECONDS));
    let stalled = Instant::now();
    // From the last renewal the API holds, another replica waits at least a lease duration.
    let expires = renewed + SignedDuration::from_secs(LEASE_SECONDS as i64);
    let stepped_down = loop {
        if duet.logs().contains("No longer leading") {
            break Timestamp::now();
        }
        anyhow::ensure!(
            stalled.elapsed() < Duration::from_secs(2 * LEASE_SECONDS),
            "still leading {:?} after the API server hung:\n{}",
            stalled.elapsed(),
            duet.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!(
        "API on {api_family}: stepped down {:.2} s after the API hung, {:.2} s before the lease could expire",
        stalled.elapsed().as_secs_f64(),
        expires.duration_since(stepped_down).as_secs_f64()
    );
    assert!(
        stepped_down < expires,
        "stepped down at {stepped_down}, after the lease renewed at {renewed} could expire ({expires})"
    );
    assert!(duet.logs().contains("renew deadline; stepping down"));

    // Once the API answers again, it leads again.
    client::eventually("duet leads again", 2 * LIVE, || async {
        let logs = duet.logs();
        anyhow::ensure!(
            logs.matches("Leading").count() >= 2,
            "not leading again yet"
        );
        Ok(())
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_leader_whose_api_hangs_steps_down_before_its_lease_expires_api_on_ipv4(
) -> anyhow::Result<()> {
    leader_steps_down_when_the_api_hangs(Family::V4).await
}

#[tokio::test]
async fn a_leader_whose_api_hangs_steps_down_before_its_lease_expires_api_on_ipv6(
) -> anyhow::Result<()> {
    leader_steps_down_when_the_api_hangs(Family::V6).await
}
