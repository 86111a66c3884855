//! End to end, over real sockets on 127.0.0.1 and [::1]: balancing over pods (a dual-stack pod
//! counts once), the family a pod is reached over under each family policy, and fallback to a
//! pod's other family when one of its ports is closed.

use std::collections::BTreeMap;

use conformance::client::{self, Reply};
use conformance::manifests::FAMILY_ANNOTATION;
use conformance::{Duet, DuetBuilder, Echo, Family, Fleet, Ingress, ManifestDir, PodSpec, Port};

const DUET: &str = env!("CARGO_BIN_EXE_duet");

/// Pods of the Service `echo` in namespace `e2e`: one dual-stack, one IPv4-only, one IPv6-only.
fn three_pods() -> Vec<PodSpec> {
    vec![
        PodSpec::dual("dual"),
        PodSpec::v4_only("v4only"),
        PodSpec::v6_only("v6only"),
    ]
}

struct Setup {
    fleet: Fleet,
    duet: Duet,
    _dir: ManifestDir,
}

async fn setup(pods: &[PodSpec], ingresses: &[Ingress], args: &[&str]) -> anyhow::Result<Setup> {
    let fleet = Fleet::start("e2e", "echo", pods)?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    let docs: Vec<_> = ingresses.iter().map(Ingress::build).collect();
    dir.write("ingress.yaml", &docs)?;
    let duet = DuetBuilder::new(DUET, dir.path())
        .args(args.iter().copied())
        .start()
        .await?;
    Ok(Setup {
        fleet,
        duet,
        _dir: dir,
    })
}

/// Every reply must be a 200 echo; returns the echoes.
fn echoes(replies: &[Reply]) -> anyhow::Result<Vec<Echo>> {
    replies
        .iter()
        .map(|r| {
            client::expect_status(r, 200)?;
            r.echo()
        })
        .collect()
}

fn per_pod(echoes: &[Echo]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for e in echoes {
        *counts.entry(e.pod.clone()).or_insert(0) += 1;
    }
    counts
}

/// Checks that every echo came from a pod over `expected(pod)` and to that pod's address of it.
fn check_families(
    fleet: &Fleet,
    client: Family,
    echoes: &[Echo],
    expected: impl Fn(&conformance::Pod) -> Family,
) {
    for e in echoes {
        let pod = fleet.pod(&e.pod);
        let want = expected(pod);
        assert_eq!(
            e.family, want,
            "{client} client reached pod {} over {} (want {want})",
            e.pod, e.family
        );
        assert_eq!(
            Some(e.local),
            pod.addr(want),
            "pod {} answered on an address it does not have",
            e.pod
        );
    }
}

/// The client's family when the pod has it, else the other one.
fn same_family_if_possible(client: Family) -> impl Fn(&conformance::Pod) -> Family {
    move |pod| {
        if pod.addr(client).is_some() {
            client
        } else {
            client.other()
        }
    }
}

/// 300 requests from each family over three keep-alive connections each.
async fn balanced_run(args: &[&str]) -> anyhow::Result<()> {
    let s = setup(
        &three_pods(),
        &[Ingress::new("e2e", "echo").host("lb.test", "echo")],
        args,
    )
    .await?;
    let mut all = Vec::new();
    for family in Family::BOTH {
        let replies = client::load(s.duet.http(family), "lb.test", "/", 300, 3).await?;
        let got = echoes(&replies)?;
        check_families(&s.fleet, family, &got, same_family_if_possible(family));
        // Per family each pod should get about 100 of 300; allow ±40%.
        let counts = per_pod(&got);
        for pod in ["dual", "v4only", "v6only"] {
            let n = counts.get(pod).copied().unwrap_or(0);
            assert!(
                (60..=140).contains(&n),
                "{family} clients: pod {pod} got {n} of 300: {counts:?}"
            );
        }
        all.extend(got);
    }
    // Overall each pod gets a third of 600 = 200, within ±25% (150..=250): the dual-stack pod is
    // weighted once, not once per family.
    let counts = per_pod(&all);
    for pod in ["dual", "v4only", "v6only"] {
        let n = counts.get(pod).copied().unwrap_or(0);
        assert!(
            (150..=250).contains(&n),
            "pod {pod} got {n} of 600: {counts:?}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefer_same_family_spreads_over_pods_and_keeps_the_client_family() -> anyhow::Result<()> {
    balanced_run(&[]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_spreads_over_pods_and_keeps_the_client_family() -> anyhow::Result<()> {
    balanced_run(&["--lb", "round-robin"]).await
}

/// Under RequireSameFamily each family's clients reach only the pods having that family, over it,
/// and both such pods share the load.
async fn check_required(duet: &Duet, fleet: &Fleet, host: &str) -> anyhow::Result<()> {
    for family in Family::BOTH {
        let replies = client::load(duet.http(family), host, "/", 100, 2).await?;
        let got = echoes(&replies)?;
        check_families(fleet, family, &got, |_| family);
        let counts = per_pod(&got);
        let (allowed, excluded) = match family {
            Family::V4 => (["dual", "v4only"], "v6only"),
            Family::V6 => (["dual", "v6only"], "v4only"),
        };
        assert!(
            !counts.contains_key(excluded),
            "{family} clients reached {excluded}: {counts:?}"
        );
        for pod in allowed {
            // About 50 each; at least 25.
            let n = counts.get(pod).copied().unwrap_or(0);
            assert!(
                n >= 25,
                "{family} clients: pod {pod} got {n} of 100: {counts:?}"
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_same_family_flag_excludes_pods_lacking_the_client_family() -> anyhow::Result<()> {
    let s = setup(
        &three_pods(),
        &[Ingress::new("e2e", "echo").host("strict.test", "echo")],
        &["--upstream-family", "RequireSameFamily"],
    )
    .await?;
    check_required(&s.duet, &s.fleet, "strict.test").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_same_family_annotation_applies_to_its_ingress_only() -> anyhow::Result<()> {
    let s = setup(
        &three_pods(),
        &[
            Ingress::new("e2e", "strict")
                .annotation(FAMILY_ANNOTATION, "RequireSameFamily")
                .host("strict.test", "echo"),
            Ingress::new("e2e", "loose").host("loose.test", "echo"),
        ],
        &[],
    )
    .await?;
    check_required(&s.duet, &s.fleet, "strict.test").await?;
    // The other Ingress on the same Service keeps the default PreferSameFamily: every pod is
    // reached, single-family pods through their only family.
    for family in Family::BOTH {
        let replies = client::load(s.duet.http(family), "loose.test", "/", 90, 2).await?;
        let got = echoes(&replies)?;
        check_families(&s.fleet, family, &got, same_family_if_possible(family));
        let counts = per_pod(&got);
        assert_eq!(
            counts.len(),
            3,
            "{family} clients on loose.test: {counts:?}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_ipv6_port_falls_back_to_the_same_pods_ipv4_address() -> anyhow::Result<()> {
    let s = setup(
        &[PodSpec::dual("dual").with(Family::V6, Port::Closed)],
        &[Ingress::new("e2e", "echo").host("fallback.test", "echo")],
        &[],
    )
    .await?;
    // 100 IPv6 clients' requests, half on fresh connections: not one may fail.
    let mut got =
        echoes(&client::load(s.duet.http(Family::V6), "fallback.test", "/", 50, 2).await?)?;
    for i in 0..50 {
        let reply = client::get(
            s.duet.http(Family::V6),
            "fallback.test",
            &format!("/fresh/{i}"),
        )
        .await?;
        client::expect_status(&reply, 200)?;
        got.push(reply.echo()?);
    }
    assert_eq!(got.len(), 100);
    check_families(&s.fleet, Family::V6, &got, |_| Family::V4);
    // IPv4 clients are unaffected.
    let got = echoes(&client::load(s.duet.http(Family::V4), "fallback.test", "/", 100, 2).await?)?;
    check_families(&s.fleet, Family::V4, &got, |_| Family::V4);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_ipv6_port_among_other_pods_loses_no_request() -> anyhow::Result<()> {
    let s = setup(
        &[
            PodSpec::dual("dual").with(Family::V6, Port::Closed),
            PodSpec::v4_only("v4only"),
            PodSpec::v6_only("v6only"),
        ],
        &[Ingress::new("e2e", "echo").host("fallback.test", "echo")],
        &[],
    )
    .await?;
    let got = echoes(&client::load(s.duet.http(Family::V6), "fallback.test", "/", 100, 2).await?)?;
    // The broken pod is served over IPv4, the others over the family they have.
    check_families(&s.fleet, Family::V6, &got, |pod| {
        if pod.name == "v4only" || pod.name == "dual" {
            Family::V4
        } else {
            Family::V6
        }
    });
    // The pod stays a candidate through its IPv4 address (about a third; at least 10).
    let counts = per_pod(&got);
    let dual = counts.get("dual").copied().unwrap_or(0);
    assert!(
        dual >= 10,
        "the pod with a closed IPv6 port got {dual} of 100: {counts:?}"
    );
    let got = echoes(&client::load(s.duet.http(Family::V4), "fallback.test", "/", 100, 2).await?)?;
    check_families(
        &s.fleet,
        Family::V4,
        &got,
        same_family_if_possible(Family::V4),
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_pods_lose_no_request_to_stale_pooled_connections() -> anyhow::Result<()> {
    let mut s = setup(
        &three_pods(),
        &[Ingress::new("e2e", "echo").host("restart.test", "echo")],
        &[],
    )
    .await?;
    for round in 0..30 {
        // Fill duet's upstream pool from both families, then restart every pod: the pooled
        // connections are closed by the pods, and the next requests must not fail on them.
        for family in Family::BOTH {
            echoes(&client::load(s.duet.http(family), "restart.test", "/", 12, 3).await?)?;
        }
        s.fleet.restart().await?;
        for family in Family::BOTH {
            let replies = client::load(s.duet.http(family), "restart.test", "/", 12, 3).await;
            let replies = replies.map_err(|e| e.context(format!("round {round}")))?;
            for r in &replies {
                assert_eq!(r.status, 200, "round {round}, {family}: {}", r.text());
            }
        }
    }
    Ok(())
}
