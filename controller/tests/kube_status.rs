//! Kubernetes mode end to end on the real control plane: Ingress status and leader election.
//! Two `duet` processes, each through a fault proxy of its own, elect one leader (Lease
//! `duet-leader`); only it writes status (while its proxy refuses its status writes, the status
//! stays as it was: the follower does not write in its place), and the other takes over when it
//! stops; Ingresses that cannot be served fully get one Event per problem, and a new leader
//! reports the problems that already existed; an idle leader sleeps, with its API server up or gone (the
//! fault proxy dropping every connection). On an IPv4-only and an IPv6-only cluster a publish
//! Service of the chart's shape (`PreferDualStack`, no `ipFamilies`) gets one cluster IP, the
//! status lists exactly it and `/debug/routes` warns of nothing; on a dual-stack cluster a
//! `SingleStack` one is warned about until made `PreferDualStack`. The API server is reached over 127.0.0.1 and [::1]; status from a
//! dual-stack Service's addresses and the IngressClass rules are in `kube_real_cluster.rs`.

mod kube_support;

use std::time::{Duration, Instant};

use conformance::client;
use conformance::cluster::{Fault, FaultProxy, Stack};
use conformance::http::Method;
use conformance::{Family, Ingress};
use kube_support::*;
use serde_json::{json, Value};

const UPDATED: &str = "Ingress status updated";

/// The publish Service `edge`: a `LoadBalancer` (no load balancer controller runs; the test
/// writes its status) whose status lists `addresses`.
async fn publish_service(env: &Env, addresses: &[&str]) -> anyhow::Result<()> {
    env.apply(&[json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": env.ns, "name": "edge"},
        "spec": {
            "type": "LoadBalancer",
            "ipFamilyPolicy": "PreferDualStack",
            "selector": {"app.kubernetes.io/name": "duet"},
            "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
        },
    })])
    .await?;
    let ingress: Vec<Value> = addresses
        .iter()
        .map(|ip| json!({"ip": ip, "ipMode": "VIP"}))
        .collect();
    env.api
        .merge_patch(
            "v1",
            "Service",
            Some(&env.ns),
            "edge/status",
            &json!({"status": {"loadBalancer": {"ingress": ingress}}}),
        )
        .await?;
    Ok(())
}

async fn lease_holder(env: &Env) -> anyhow::Result<Option<String>> {
    let lease = env
        .api
        .get(
            "coordination.k8s.io/v1",
            "Lease",
            Some(&env.ns),
            "duet-leader",
        )
        .await?;
    Ok(lease.and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned)))
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
fn mixed_ingress(ns: &str) -> serde_json::Value {
    Ingress::new(ns, "mixed")
        .host("good.test", "web")
        .host("bad.test", "missing")
        .build()
}

/// The Events (`events.k8s.io/v1`) regarding the Ingress `name`.
async fn events_of(env: &Env, name: &str) -> anyhow::Result<Vec<serde_json::Value>> {
    Ok(env
        .events(&env.ns)
        .await?
        .into_iter()
        .filter(|e| e["regarding"]["name"] == name)
        .collect())
}

/// A test's namespace with the Deployment `web` of one ready pod.
async fn with_web(stack: Stack, ns: &str) -> anyhow::Result<Env> {
    let env = env(stack, &[ns]).await?;
    env.web(ns, "web", 1).await?;
    env.ready_pods(ns, "web", 1).await?;
    Ok(env)
}

/// Waits until the Lease has a holder.
async fn until_leader(env: &Env) -> anyhow::Result<()> {
    client::eventually("a leader", LIVE, || async {
        anyhow::ensure!(lease_holder(env).await?.is_some());
        Ok(())
    })
    .await
}

async fn two_replicas_one_writer(api_family: Family) -> anyhow::Result<()> {
    let env = with_web(Stack::Dual, &format!("replicas-{api_family}")).await?;
    let ns = env.ns.clone();
    publish_service(&env, &["192.0.2.10", "2001:db8::10"]).await?;
    env.apply(&[Ingress::new(&ns, "web").host("a.test", "web").build()])
        .await?;
    let edge = format!("{ns}/edge");
    let flags = [
        "--publish-service",
        &edge,
        "--election-lease-duration",
        "3s",
    ];
    // Each replica through a proxy of its own, to refuse the leader's writes alone.
    let proxy_two = FaultProxy::start(env.cluster.kubeconfig())?;
    let mut one = env.duet(api_family, &flags).await?;
    let mut two = conformance::DuetBuilder::kube(DUET, proxy_two.kubeconfig(api_family))
        .args(["--watch-namespace", &ns, "--election-namespace", &ns])
        .args(flags)
        .die_with_parent()
        .start()
        .await?;
    until_status(&one, "a.test", 200).await?;
    until_status(&two, "a.test", 200).await?;
    let old = strings(&["192.0.2.10", "2001:db8::10"]);
    env.until_status_addresses(&ns, "web", &old).await?;

    let ids = [identity(&one), identity(&two)];
    let holder = lease_holder(&env).await?;
    assert!(
        holder.is_some() && ids.contains(&holder),
        "holder {holder:?}, replicas {ids:?}"
    );
    let (leader, follower, leader_proxy, follower_proxy) = if holder == ids[0] {
        (&mut one, &mut two, &env.proxy, &proxy_two)
    } else {
        (&mut two, &mut one, &proxy_two, &env.proxy)
    };

    // A new publish address while the leader's status writes are refused: the follower, which
    // reads the same Service, must not write it in its place.
    let refusing = Duration::from_secs(8);
    leader_proxy.fail(
        Fault::status(500)
            .method(Method::PATCH)
            .path("/ingresses/web/status")
            .lasting(refusing),
    );
    let refused_from = Instant::now();
    publish_service(&env, &["192.0.2.11", "2001:db8::11"]).await?;
    // Both replicas had every chance to write: each has read the new Service (its
    // /debug/routes shows the addresses its status writer was handed).
    for replica in [&*leader, &*follower] {
        client::eventually("the replica saw the new Service", LIVE, || async {
            let routes = replica.debug_routes().await?;
            let shown = &routes["status"]["addresses"];
            anyhow::ensure!(
                *shown == serde_json::json!(["192.0.2.11", "2001:db8::11"]),
                "{routes}"
            );
            Ok(())
        })
        .await?;
    }
    client::eventually("the leader tried to write", LIVE, || async {
        let refused = leader_proxy
            .requests()
            .iter()
            .filter(|r| r.status == 500)
            .count();
        anyhow::ensure!(refused >= 1, "no refused write yet");
        Ok(())
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        refused_from.elapsed() < refusing,
        "the machine is too slow for this test: the refusal ended before the check"
    );
    assert_eq!(
        env.status_addresses(&ns, "web").await?,
        old,
        "written while the leader could not"
    );
    // Once the leader's writes go through, the new addresses are written, by it.
    env.until_status_addresses(&ns, "web", &strings(&["192.0.2.11", "2001:db8::11"]))
        .await?;
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
    let writes = |proxy: &FaultProxy| {
        proxy
            .requests()
            .iter()
            .filter(|r| r.method == "PATCH" && r.path.ends_with("/ingresses/web/status"))
            .filter(|r| r.status < 300)
            .count()
    };
    assert_eq!(writes(follower_proxy), 0, "the follower wrote status");
    assert_eq!(writes(leader_proxy), 2, "one status write per change");

    // The leader stops (SIGTERM): it releases the Lease; the follower takes over well before the
    // lease would have expired, and from then on it writes.
    let follower_id = identity(follower);
    let stopped = Instant::now();
    assert!(
        leader.terminate(Duration::from_secs(10))?,
        "the leader did not exit"
    );
    client::eventually("the follower holds the Lease", LIVE, || async {
        let holder = lease_holder(&env).await?;
        anyhow::ensure!(holder == follower_id, "holder {holder:?}");
        Ok(())
    })
    .await?;
    println!(
        "API on {api_family}: leader handover after SIGTERM in {:?}",
        stopped.elapsed()
    );
    publish_service(&env, &["192.0.2.12", "2001:db8::12"]).await?;
    env.until_status_addresses(&ns, "web", &strings(&["192.0.2.12", "2001:db8::12"]))
        .await?;
    // The new leader logs its write once it has the API's answer.
    client::eventually("the new leader logged its write", LIVE, || async {
        let writes = follower.logs().matches(UPDATED).count();
        anyhow::ensure!(writes == 1, "{writes} writes logged");
        Ok(())
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn two_replicas_elect_one_status_writer_and_hand_over_api_on_ipv4() -> anyhow::Result<()> {
    two_replicas_one_writer(Family::V4).await
}

#[tokio::test]
async fn two_replicas_elect_one_status_writer_and_hand_over_api_on_ipv6() -> anyhow::Result<()> {
    two_replicas_one_writer(Family::V6).await
}

#[tokio::test]
async fn a_leader_that_dies_is_replaced_after_the_lease_expires() -> anyhow::Result<()> {
    let env = env(Stack::Dual, &["dies"]).await?;
    let flags = ["--election-lease-duration", "2s"];
    let one = env.duet(Family::V6, &flags).await?;
    let two = env.duet(Family::V6, &flags).await?;
    let ids = [identity(&one), identity(&two)];
    until_leader(&env).await?;
    let holder = lease_holder(&env).await?;
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
        let holder = lease_holder(&env).await?;
        anyhow::ensure!(holder == other, "holder {holder:?}");
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

#[tokio::test]
async fn ingresses_not_served_fully_get_one_event_per_problem() -> anyhow::Result<()> {
    let env = with_web(Stack::Dual, "problems").await?;
    let duet = env.duet(Family::V6, &[]).await?;
    until_leader(&env).await?;
    // One good rule, one to a missing Service: the good one is served.
    env.apply(&[mixed_ingress(&env.ns)]).await?;
    until_status(&duet, "good.test", 200).await?;
    client::eventually("an Event for the missing Service", LIVE, || async {
        anyhow::ensure!(!events_of(&env, "mixed").await?.is_empty());
        Ok(())
    })
    .await?;
    let all = events_of(&env, "mixed").await?;
    assert_eq!(all.len(), 1, "{all:#?}");
    assert_eq!(all[0]["reason"], "MissingService");
    assert_eq!(all[0]["type"], "Warning");
    assert_eq!(all[0]["regarding"]["kind"], "Ingress");
    assert!(all[0]["note"]
        .as_str()
        .unwrap_or_default()
        .contains("missing"));

    // Unrelated changes rebuild the table; the same problem is not reported again.
    env.apply(&[Ingress::new(&env.ns, "other")
        .host("other.test", "web")
        .build()])
        .await?;
    until_status(&duet, "other.test", 200).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let all = events_of(&env, "mixed").await?;
    assert_eq!(all.len(), 1, "the problem was reported again: {all:#?}");
    Ok(())
}

/// ingress-nginx annotations duet does not apply get one Warning Event each, naming the key and
/// its status; honoured ones get none, and the Ingress is served.
#[tokio::test]
async fn unhonoured_nginx_annotations_get_one_event_each() -> anyhow::Result<()> {
    let env = with_web(Stack::Dual, "nginx").await?;
    let duet = env.duet(Family::V4, &[]).await?;
    let n = "nginx.ingress.kubernetes.io/";
    env.apply(&[Ingress::new("nginx", "nginx")
        .annotation(&format!("{n}proxy-body-size"), "8m")
        .annotation(&format!("{n}proxy-read-timeout"), "60s")
        .annotation(&format!("{n}rewrite-targt"), "/")
        .annotation(&format!("{n}server-snippet"), "return 200;")
        .host("nginx.test", "web")
        .build()])
        .await?;
    until_status(&duet, "nginx.test", 200).await?;
    client::eventually("three Events", LIVE, || async {
        let n = events_of(&env, "nginx").await?.len();
        anyhow::ensure!(n >= 3, "{n} Events");
        Ok(())
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut got: Vec<(String, String)> = events_of(&env, "nginx")
        .await?
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
#[tokio::test]
async fn a_new_leader_reports_problems_that_already_existed() -> anyhow::Result<()> {
    let env = with_web(Stack::Dual, "takeover").await?;
    env.apply(&[mixed_ingress(&env.ns)]).await?;
    let flags = ["--election-lease-duration", "3s"];
    let mut one = env.duet(Family::V4, &flags).await?;
    let mut two = env.duet(Family::V4, &flags).await?;
    until_status(&one, "good.test", 200).await?;
    until_status(&two, "good.test", 200).await?;
    let reporters = || async {
        anyhow::Ok(
            events_of(&env, "mixed")
                .await?
                .into_iter()
                .filter(|e| e["reason"] == "MissingService")
                .map(|e| {
                    e["reportingInstance"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned()
                })
                .collect::<Vec<_>>(),
        )
    };
    client::eventually("the leader's Event", LIVE, || async {
        anyhow::ensure!(!reporters().await?.is_empty(), "no Event yet");
        Ok(())
    })
    .await?;
    let ids = [identity(&one), identity(&two)];
    let holder = lease_holder(&env).await?;
    assert!(
        holder.is_some() && ids.contains(&holder),
        "holder {holder:?}"
    );
    assert_eq!(reporters().await?, [holder.clone().unwrap_or_default()]);
    let (leader, follower) = if holder == ids[0] {
        (&mut one, &mut two)
    } else {
        (&mut two, &mut one)
    };
    let follower_id = identity(follower).unwrap_or_default();

    assert!(leader.terminate(Duration::from_secs(10))?);
    client::eventually("the new leader's Event", LIVE, || async {
        let reporters = reporters().await?;
        anyhow::ensure!(
            reporters.contains(&follower_id),
            "reported by {reporters:?}"
        );
        Ok(())
    })
    .await?;
    // Once each: the new leader does not repeat it at later rebuilds.
    env.apply(&[Ingress::new(&env.ns, "other")
        .host("other.test", "web")
        .build()])
        .await?;
    until_status(follower, "other.test", 200).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let all = reporters().await?;
    assert_eq!(all.len(), 2, "{all:?}");
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
/// after it is gone for good. (A status writer selecting on the fixed addresses' closed channel,
/// which is always ready, spins: 50 passes a second, ~300 wakeups in 5 s, forever, even after its
/// API server has gone.) A busy-loop detector, not a speed goal: an idle duet measured 36
/// wakeups in 5 s with the API up and 22 with it gone (2-core machine); the bound is 4 times
/// that, half of what a spinning writer does.
#[tokio::test]
async fn an_idle_leader_sleeps_with_its_api_up_and_gone() -> anyhow::Result<()> {
    const WINDOW: Duration = Duration::from_secs(5);
    const MAX: u64 = 150; // 30 a second: 4 times the ~7 measured, half a spinning writer's
    let env = with_web(Stack::Dual, "idle").await?;
    env.apply(&[Ingress::new("idle", "web").host("a.test", "web").build()])
        .await?;
    let mut duet = env
        .duet(
            Family::V6,
            &["--publish-status-address", "203.0.113.5,2001:db8::5"],
        )
        .await?;
    env.until_status_addresses("idle", "web", &strings(&["203.0.113.5", "2001:db8::5"]))
        .await?;

    let up = wakeups_during(duet.pid(), WINDOW).await?;
    // Gone for good: every connection dropped, new ones too.
    env.proxy.outage(Duration::from_secs(3600));
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

/// The publish Service `edge` (ClusterIP) of `ns` with `policy`, applied; its cluster IPs as
/// the real API server allocated them.
async fn edge_service(env: &Env, ns: &str, policy: &str) -> anyhow::Result<Vec<String>> {
    let svc = env
        .api
        .apply(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": ns, "name": "edge"},
            "spec": {
                "ipFamilyPolicy": policy,
                "selector": {"app.kubernetes.io/name": "duet"},
                "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
            },
        }))
        .await?;
    Ok(svc["spec"]["clusterIPs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip.as_str().map(str::to_owned))
        .collect())
}

/// Waits until `/debug/routes` shows `ips` as the status addresses; its status warning then.
async fn routes_warning(duet: &conformance::Duet, ips: &[String]) -> anyhow::Result<Value> {
    client::eventually("the status addresses on /debug/routes", LIVE, || async {
        let routes = duet.debug_routes().await?;
        anyhow::ensure!(routes["status"]["addresses"] == json!(ips), "{routes}");
        Ok(routes["status"]["warning"].clone())
    })
    .await
}

/// On a single-stack cluster the publish Service of the chart's shape (`PreferDualStack`, no
/// `ipFamilies`) gets one cluster IP of the cluster's family, served Ingresses list exactly it,
/// and `/debug/routes` shows it without a single-family warning: the Service asks for dual
/// stack, the cluster has one family, nothing in the Service can be fixed.
async fn status_on_a_single_stack_cluster(stack: Stack) -> anyhow::Result<()> {
    let family = stack.families()[0];
    let env = with_web(stack, &format!("single-{family}")).await?;
    let ns = env.ns.clone();
    let ips = edge_service(&env, &ns, "PreferDualStack").await?;
    anyhow::ensure!(ips.len() == 1, "clusterIPs {ips:?}");
    let ip: std::net::IpAddr = ips[0].parse()?;
    anyhow::ensure!(
        ip.is_ipv4() == (family == Family::V4),
        "a {family} cluster allocated {ip}"
    );
    env.apply(&[Ingress::new(&ns, "web").host("a.test", "web").build()])
        .await?;
    let edge = format!("{ns}/edge");
    let duet = env.duet(family, &["--publish-service", &edge]).await?;
    until_status(&duet, "a.test", 200).await?;
    env.until_status_addresses(&ns, "web", &ips).await?;
    let warning = routes_warning(&duet, &ips).await?;
    anyhow::ensure!(warning.is_null(), "{stack:?} cluster: warning {warning}");
    anyhow::ensure!(
        !duet.logs().contains("Publish Service problem"),
        "{}",
        duet.logs()
    );
    env.cluster.check_running()
}

#[tokio::test]
async fn status_on_an_ipv4_only_cluster_lists_its_one_cluster_ip() -> anyhow::Result<()> {
    status_on_a_single_stack_cluster(Stack::Ipv4).await
}

#[tokio::test]
async fn status_on_an_ipv6_only_cluster_lists_its_one_cluster_ip() -> anyhow::Result<()> {
    status_on_a_single_stack_cluster(Stack::Ipv6).await
}

/// On a dual-stack cluster a `SingleStack` publish Service gets one cluster IP and a warning on
/// `/debug/routes` that names the fix, `ipFamilyPolicy: PreferDualStack`; once the Service is
/// changed so, the API server adds the other family, the status lists both and the warning goes.
#[tokio::test]
async fn a_single_stack_publish_service_on_a_dual_stack_cluster_warns_until_made_dual_stack(
) -> anyhow::Result<()> {
    let env = with_web(Stack::Dual, "warn-single").await?;
    let ns = env.ns.clone();
    let one = edge_service(&env, &ns, "SingleStack").await?;
    anyhow::ensure!(one.len() == 1, "clusterIPs {one:?}");
    env.apply(&[Ingress::new(&ns, "web").host("a.test", "web").build()])
        .await?;
    let edge = format!("{ns}/edge");
    let duet = env.duet(Family::V6, &["--publish-service", &edge]).await?;
    until_status(&duet, "a.test", 200).await?;
    env.until_status_addresses(&ns, "web", &one).await?;
    let warning = routes_warning(&duet, &one).await?;
    let warning = warning.as_str().unwrap_or_default();
    anyhow::ensure!(
        warning.contains(&format!("{ns}/edge"))
            && warning.contains("ipFamilyPolicy SingleStack")
            && warning.contains("no IPv6 address")
            && warning.ends_with("set ipFamilyPolicy: PreferDualStack"),
        "{warning}"
    );
    let both = edge_service(&env, &ns, "PreferDualStack").await?;
    anyhow::ensure!(both.len() == 2 && both[0] == one[0], "clusterIPs {both:?}");
    env.until_status_addresses(&ns, "web", &both).await?;
    let warning = routes_warning(&duet, &both).await?;
    anyhow::ensure!(warning.is_null(), "warning {warning}");
    env.cluster.check_running()
}
