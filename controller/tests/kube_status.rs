//! Kubernetes mode end to end: Ingress status and leader election. Two `duet` processes elect
//! one leader (Lease `duet-leader`), only it writes status, and the other takes over when it
//! stops; Ingresses that cannot be served fully get one Event per problem, and a new leader
//! reports the problems that already existed; an idle leader sleeps, with its API server up or
//! gone. The test API server runs on 127.0.0.1 and [::1]; status from a real Service's addresses
//! and the IngressClass rules are tested on the real control plane (`kube_real_cluster.rs`).

mod kube_support;

use std::time::{Duration, Instant};

use conformance::apiserver::ApiServer;
use conformance::client;
use conformance::{Family, Fleet, Ingress, PodSpec};
use kube_support::*;
use serde_json::json;

const UPDATED: &str = "Ingress status updated";

fn publish_service(cluster_ips: &[&str], families: &[&str]) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "edge", "namespace": "duet"},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": cluster_ips[0],
            "clusterIPs": cluster_ips,
            "ipFamilies": families,
            "ports": [{"name": "http", "port": 80}],
        },
    })
}

/// The election namespace the tests use.
fn election_namespace(api: &ApiServer) -> anyhow::Result<()> {
    apply(
        api,
        &[json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "duet"}})],
    )
}

fn lease_holder(api: &ApiServer) -> Option<String> {
    let lease = api.get(
        "coordination.k8s.io/v1",
        "Lease",
        Some("duet"),
        "duet-leader",
    )?;
    lease["spec"]["holderIdentity"].as_str().map(str::to_owned)
}

/// The identity a duet logged at start.
fn identity(duet: &conformance::Duet) -> Option<String> {
    let logs = duet.logs();
    let line = logs
        .lines()
        .find(|l| l.contains("Watching the Kubernetes API"))?;
    let id = line.split("identity=").nth(1)?;
    Some(id.split_whitespace().next()?.to_owned())
}

/// One good rule and one to a Service that does not exist: served in part, with a problem.
fn mixed_ingress() -> serde_json::Value {
    Ingress::new("kube", "mixed")
        .host("good.test", "web")
        .host("bad.test", "missing")
        .build()
}

/// The Events (`events.k8s.io/v1`) regarding the Ingress `name`.
fn events_of(api: &ApiServer, name: &str) -> Vec<serde_json::Value> {
    api.list("events.k8s.io/v1", "Event")
        .into_iter()
        .filter(|e| e["regarding"]["name"] == name)
        .collect()
}

async fn two_replicas_one_writer(api_family: Family) -> anyhow::Result<()> {
    let api = api(api_family)?;
    let pods = Fleet::start("kube", "web", &[PodSpec::dual("only")])?;
    apply(&api, &pods.manifests())?;
    apply(
        &api,
        &[publish_service(
            &["10.96.0.10", "fd00::10"],
            &["IPv4", "IPv6"],
        )],
    )?;
    apply(
        &api,
        &[Ingress::new("kube", "web").host("a.test", "web").build()],
    )?;
    let flags = [
        "--publish-service",
        "duet/edge",
        "--election-namespace",
        "duet",
        "--election-lease-duration",
        "3s",
    ];
    let mut one = duet(&api, &flags).await?;
    let mut two = duet(&api, &flags).await?;
    until_status(&one, "a.test", 200).await?;
    until_status(&two, "a.test", 200).await?;
    until_status_addresses(&api, "kube", "web", &["10.96.0.10", "fd00::10"]).await?;

    let ids = [identity(&one), identity(&two)];
    let holder = lease_holder(&api);
    assert!(
        holder.is_some() && ids.contains(&holder),
        "holder {holder:?}, replicas {ids:?}"
    );
    let (leader, follower) = if holder == ids[0] {
        (&mut one, &mut two)
    } else {
        (&mut two, &mut one)
    };

    // A new publish address: written once, by the leader only.
    apply(
        &api,
        &[publish_service(
            &["10.96.0.11", "fd00::11"],
            &["IPv4", "IPv6"],
        )],
    )?;
    until_status_addresses(&api, "kube", "web", &["10.96.0.11", "fd00::11"]).await?;
    // Both replicas had every chance to write: each has read the new Service (its
    // /debug/routes shows the addresses its status writer was handed), and the leader has
    // logged its write.
    for replica in [&*leader, &*follower] {
        client::eventually("the replica saw the new Service", LIVE, || async {
            let routes = replica.debug_routes().await?;
            let shown = &routes["status"]["addresses"];
            anyhow::ensure!(
                *shown == serde_json::json!(["10.96.0.11", "fd00::11"]),
                "{routes}"
            );
            Ok(())
        })
        .await?;
    }
    client::eventually("the leader logged its write", LIVE, || async {
        let writes = leader.logs().matches(UPDATED).count();
        anyhow::ensure!(writes >= 2, "{writes} writes logged");
        Ok(())
    })
    .await?;
    assert_eq!(
        leader.logs().matches(UPDATED).count(),
        2,
        "{}",
        leader.logs()
    );
    assert_eq!(
        follower.logs().matches(UPDATED).count(),
        0,
        "the follower wrote status"
    );
    let patches = api
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with("/ingresses/web/status"))
        .count();
    assert_eq!(patches, 2, "one status write per change");

    // The leader stops (SIGTERM): it releases the Lease; the follower takes over well before the
    // lease would have expired, and from then on it writes.
    let follower_id = identity(follower);
    let stopped = Instant::now();
    assert!(
        leader.terminate(Duration::from_secs(10))?,
        "the leader did not exit"
    );
    client::eventually("the follower holds the Lease", LIVE, || async {
        anyhow::ensure!(
            lease_holder(&api) == follower_id,
            "holder {:?}",
            lease_holder(&api)
        );
        Ok(())
    })
    .await?;
    println!(
        "API on {api_family}: leader handover after SIGTERM in {:?}",
        stopped.elapsed()
    );
    apply(
        &api,
        &[publish_service(
            &["10.96.0.12", "fd00::12"],
            &["IPv4", "IPv6"],
        )],
    )?;
    until_status_addresses(&api, "kube", "web", &["10.96.0.12", "fd00::12"]).await?;
    // The new leader logs its write once it has the API's answer.
    client::eventually("the new leader logged its write", LIVE, || async {
        let writes = follower.logs().matches(UPDATED).count();
        anyhow::ensure!(writes == 1, "{writes} writes logged");
        Ok(())
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_elect_one_status_writer_and_hand_over_api_on_ipv4() -> anyhow::Result<()> {
    two_replicas_one_writer(Family::V4).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_elect_one_status_writer_and_hand_over_api_on_ipv6() -> anyhow::Result<()> {
    two_replicas_one_writer(Family::V6).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_dies_is_replaced_after_the_lease_expires() -> anyhow::Result<()> {
    let api = api(Family::V6)?;
    election_namespace(&api)?;
    let flags = [
        "--election-namespace",
        "duet",
        "--election-lease-duration",
        "2s",
    ];
    let one = duet(&api, &flags).await?;
    let two = duet(&api, &flags).await?;
    let ids = [identity(&one), identity(&two)];
    client::eventually("a leader", LIVE, || async {
        anyhow::ensure!(lease_holder(&api).is_some());
        Ok(())
    })
    .await?;
    let holder = lease_holder(&api);
    let mut duets = vec![one, two];
    let leader = ids
        .iter()
        .position(|id| *id == holder)
        .ok_or_else(|| anyhow::anyhow!("holder {holder:?} is neither of {ids:?}"))?;
    let other = ids[1 - leader].clone();
    // Dropping a Duet kills it with SIGKILL: no release, the Lease has to expire.
    drop(duets.remove(leader));
    let killed = Instant::now();
    client::eventually("the other replica holds the Lease", LIVE, || async {
        anyhow::ensure!(
            lease_holder(&api) == other,
            "holder {:?}",
            lease_holder(&api)
        );
        Ok(())
    })
    .await?;
    let took = killed.elapsed();
    println!("leader killed -> new leader after {took:?} (lease 2 s)");
    // The follower waits a whole lease (2 s) from the last renewal it saw, which can be up to a
    // retry period (2/3 s) before the kill; a released Lease would be taken within 2/3 s.
    assert!(
        took >= Duration::from_secs(1),
        "took over before the lease expired: {took:?}"
    );
    Ok(())
}

async fn duet_with_addresses(api: &ApiServer) -> anyhow::Result<conformance::Duet> {
    duet(
        api,
        &[
            "--publish-status-address",
            "203.0.113.5,2001:db8::5",
            "--election-namespace",
            "duet",
        ],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingresses_not_served_fully_get_one_event_per_problem() -> anyhow::Result<()> {
    let api = api(Family::V6)?;
    election_namespace(&api)?;
    let pods = Fleet::start("kube", "web", &[PodSpec::dual("only")])?;
    apply(&api, &pods.manifests())?;
    let duet = duet(&api, &["--election-namespace", "duet"]).await?;
    client::eventually("a leader", LIVE, || async {
        anyhow::ensure!(lease_holder(&api).is_some());
        Ok(())
    })
    .await?;
    // One good rule, one to a missing Service: the good one is served.
    apply(&api, &[mixed_ingress()])?;
    until_status(&duet, "good.test", 200).await?;
    let events = || events_of(&api, "mixed");
    client::eventually("an Event for the missing Service", LIVE, || async {
        anyhow::ensure!(!events().is_empty());
        Ok(())
    })
    .await?;
    let all = events();
    assert_eq!(all.len(), 1, "{all:#?}");
    assert_eq!(all[0]["reason"], "MissingService");
    assert_eq!(all[0]["type"], "Warning");
    assert_eq!(all[0]["regarding"]["kind"], "Ingress");
    assert!(all[0]["note"]
        .as_str()
        .unwrap_or_default()
        .contains("missing"));

    // Unrelated changes rebuild the table; the same problem is not reported again.
    apply(
        &api,
        &[Ingress::new("kube", "other")
            .host("other.test", "web")
            .build()],
    )?;
    until_status(&duet, "other.test", 200).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(events().len(), 1, "the problem was reported again");
    Ok(())
}

/// ingress-nginx annotations duet does not apply get one Warning Event each, naming the key and
/// its status; honoured ones get none, and the Ingress is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unhonoured_nginx_annotations_get_one_event_each() -> anyhow::Result<()> {
    let api = api(Family::V4)?;
    election_namespace(&api)?;
    let pods = Fleet::start("kube", "web", &[PodSpec::dual("only")])?;
    apply(&api, &pods.manifests())?;
    let duet = duet(&api, &["--election-namespace", "duet"]).await?;
    let n = "nginx.ingress.kubernetes.io/";
    apply(
        &api,
        &[Ingress::new("kube", "nginx")
            .annotation(&format!("{n}proxy-body-size"), "8m")
            .annotation(&format!("{n}proxy-read-timeout"), "60s")
            .annotation(&format!("{n}rewrite-targt"), "/")
            .annotation(&format!("{n}server-snippet"), "return 200;")
            .host("nginx.test", "web")
            .build()],
    )?;
    until_status(&duet, "nginx.test", 200).await?;
    let events = || events_of(&api, "nginx");
    client::eventually("three Events", LIVE, || async {
        anyhow::ensure!(events().len() >= 3, "{} Events", events().len());
        Ok(())
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut got: Vec<(String, String)> = events()
        .iter()
        .map(|e| {
            assert_eq!(e["type"], "Warning");
            let note = e["note"].as_str().unwrap_or_default();
            (
                e["reason"].as_str().unwrap_or_default().to_owned(),
                note.split(": ").take(2).collect::<Vec<_>>().join(": "),
            )
        })
        .collect();
    got.sort();
    let want = [
        (
            "IgnoredAnnotation",
            "nginx.ingress.kubernetes.io/rewrite-targt: ignored-unknown",
        ),
        (
            "InvalidAnnotation",
            "nginx.ingress.kubernetes.io/proxy-read-timeout: invalid-value",
        ),
        (
            "SnippetAnnotation",
            "nginx.ingress.kubernetes.io/server-snippet: ignored-unsupported",
        ),
    ]
    .map(|(r, n)| (r.to_owned(), n.to_owned()));
    assert_eq!(got, want);
    Ok(())
}

/// A replica that takes over reports the problems that already existed: its own Event, naming
/// itself as the reporting instance, for the problem the old leader reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_reports_problems_that_already_existed() -> anyhow::Result<()> {
    let api = api(Family::V4)?;
    election_namespace(&api)?;
    let pods = Fleet::start("kube", "web", &[PodSpec::dual("only")])?;
    apply(&api, &pods.manifests())?;
    apply(&api, &[mixed_ingress()])?;
    let flags = [
        "--election-namespace",
        "duet",
        "--election-lease-duration",
        "3s",
    ];
    let mut one = duet(&api, &flags).await?;
    let mut two = duet(&api, &flags).await?;
    until_status(&one, "good.test", 200).await?;
    until_status(&two, "good.test", 200).await?;
    let reporters = || {
        events_of(&api, "mixed")
            .into_iter()
            .filter(|e| e["reason"] == "MissingService")
            .map(|e| {
                e["reportingInstance"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect::<Vec<_>>()
    };
    client::eventually("the leader's Event", LIVE, || async {
        anyhow::ensure!(!reporters().is_empty(), "no Event yet");
        Ok(())
    })
    .await?;
    let ids = [identity(&one), identity(&two)];
    let holder = lease_holder(&api);
    assert!(
        holder.is_some() && ids.contains(&holder),
        "holder {holder:?}"
    );
    assert_eq!(reporters(), [holder.clone().unwrap_or_default()]);
    let (leader, follower) = if holder == ids[0] {
        (&mut one, &mut two)
    } else {
        (&mut two, &mut one)
    };
    let follower_id = identity(follower).unwrap_or_default();

    assert!(leader.terminate(Duration::from_secs(10))?);
    client::eventually("the new leader's Event", LIVE, || async {
        let reporters = reporters();
        anyhow::ensure!(
            reporters.contains(&follower_id),
            "reported by {reporters:?}"
        );
        Ok(())
    })
    .await?;
    // Once each: the new leader does not repeat it at later rebuilds.
    apply(
        &api,
        &[Ingress::new("kube", "other")
            .host("other.test", "web")
            .build()],
    )?;
    until_status(follower, "other.test", 200).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(reporters().len(), 2, "{:?}", reporters());
    Ok(())
}

/// Times the threads of process `pid` went to sleep by themselves (voluntary context switches,
/// summed over `/proc/PID/task/*/status`): how often an idle process wakes up.
fn wakeups(pid: u32) -> anyhow::Result<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let status = std::fs::read_to_string(task?.path().join("status"))?;
        total += status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(total)
}

/// Wakeups of `pid` during `window`.
async fn wakeups_during(pid: u32, window: Duration) -> anyhow::Result<u64> {
    let before = wakeups(pid)?;
    tokio::time::sleep(window).await;
    Ok(wakeups(pid)?.saturating_sub(before))
}

/// An idle leader with `--publish-status-address` does not spin, with the API server up and
/// after it is gone for good. (The status writer used to select on the fixed addresses' closed
/// channel, which is always ready: 50 passes a second, ~300 wakeups in 5 s, forever, even after
/// its API server had gone.) A busy-loop detector, not a speed goal: an idle duet measured 36
/// wakeups in 5 s with the API up and 22 with it gone (2-core machine); the bound is 4 times
/// that, half of what the spinning writer did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_leader_sleeps_with_its_api_up_and_gone() -> anyhow::Result<()> {
    const WINDOW: Duration = Duration::from_secs(5);
    const MAX: u64 = 150; // 30 a second: 4 times the ~7 measured, half the old spin
    let api = api(Family::V6)?;
    election_namespace(&api)?;
    let pods = Fleet::start("kube", "web", &[PodSpec::dual("only")])?;
    apply(&api, &pods.manifests())?;
    apply(
        &api,
        &[Ingress::new("kube", "web").host("a.test", "web").build()],
    )?;
    let mut duet = duet_with_addresses(&api).await?;
    until_status_addresses(&api, "kube", "web", &["203.0.113.5", "2001:db8::5"]).await?;

    let up = wakeups_during(duet.pid(), WINDOW).await?;
    api.stop();
    // Let the first, faster watch retries pass (0.5 s doubling).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let gone = wakeups_during(duet.pid(), WINDOW).await?;
    println!("idle leader wakeups in {WINDOW:?}: {up} with the API up, {gone} with it gone");
    duet.check_running()?;
    assert!(up < MAX, "{up} wakeups in {WINDOW:?} with the API up");
    assert!(gone < MAX, "{gone} wakeups in {WINDOW:?} with the API gone");
    until_status(&duet, "a.test", 200).await?;
    Ok(())
}
