//! End to end in `--manifests` mode, over real sockets on 127.0.0.1 and [::1]: which
//! EndpointSlice addresses duet proxies to. Unspecified (`0.0.0.0`, `::`), link-local
//! (`169.254.169.254`, `fe80::1`), link-local multicast (`224.0.0.1`, `ff02::1`), global multicast
//! (`239.255.255.250`, `ff05::2`) and broadcast (`255.255.255.255`) endpoints are dropped (a
//! cluster's API server refuses most of them, but a folder of manifests holds what it is given):
//! each is a `ForbiddenEndpointAddress` diagnostic of its EndpointSlice on `/debug/routes`, a
//! "Configuration problem" warning in the log naming the slice and its file, and counted in
//! `duet_config_diagnostics`. A Service whose slices hold only such addresses answers 503; one
//! that lists a pod next to them sends every request to the pod; the other routes keep serving.
//! Loopback pods are served: `--manifests` mode allows them (Kubernetes mode refuses them unless
//! `--allow-loopback-endpoints`). Clients of both families.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use conformance::client;
use conformance::manifests::{endpoint_slice, service, Endpoint};
use conformance::{Duet, DuetBuilder, Family, Fleet, Ingress, ManifestDir, PodSpec};
use serde_json::Value;

const DUET: &str = env!("CARGO_BIN_EXE_duet");
const NS: &str = "ep";
const REASON: &str = "ForbiddenEndpointAddress";
const LIVE: Duration = Duration::from_secs(10);

/// The IPv4 endpoint addresses duet never proxies to.
const FORBIDDEN_V4: [&str; 5] = [
    "0.0.0.0",
    "169.254.169.254",
    "224.0.0.1",
    "239.255.255.250",
    "255.255.255.255",
];
/// The IPv6 endpoint addresses duet never proxies to.
const FORBIDDEN_V6: [&str; 4] = ["::", "fe80::1", "ff02::1", "ff05::2"];

/// The forbidden addresses of `family`.
fn forbidden(family: Family) -> &'static [&'static str] {
    match family {
        Family::V4 => &FORBIDDEN_V4,
        Family::V6 => &FORBIDDEN_V6,
    }
}

/// A ready endpoint at `ip`, its pod named after its position.
fn endpoint(n: usize, ip: IpAddr) -> Endpoint {
    Endpoint {
        pod: format!("p{n}"),
        uid: format!("uid-p{n}"),
        ip,
        ready: true,
    }
}

/// A selector-less Service `name` (port `http` 8080) with one slice per family,
/// `<name>-<family>`: `pod`'s address of that family (if any) and then every forbidden one, on
/// `pod`'s port (80 without a pod).
fn slices_with_forbidden(name: &str, pod: Option<&conformance::Pod>) -> Vec<Value> {
    let mut docs = vec![service(NS, name, &[("http", 8080)])];
    for family in Family::BOTH {
        let addr = pod.and_then(|p| p.addr(family));
        let forbidden = forbidden(family).iter().map(|a| a.parse().unwrap());
        let ips: Vec<IpAddr> = addr.map(|a| a.ip()).into_iter().chain(forbidden).collect();
        let endpoints: Vec<Endpoint> = ips
            .into_iter()
            .enumerate()
            .map(|(n, ip)| endpoint(n, ip))
            .collect();
        let port = addr.map_or(80, |a| a.port());
        let slice = format!("{name}-{family}");
        docs.push(endpoint_slice(
            NS, name, &slice, family, "http", port, &endpoints,
        ));
    }
    docs
}

/// Every forbidden address of the slices of `services`, as `slice address`.
fn every_forbidden(services: &[&str]) -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    for name in services {
        for family in Family::BOTH {
            for address in forbidden(family) {
                all.insert(format!("{name}-{family} {address}"));
            }
        }
    }
    all
}

/// The `ForbiddenEndpointAddress` diagnostics on `/debug/routes`, as `slice address`; each must
/// be of an EndpointSlice.
async fn refused_on_debug_routes(duet: &Duet) -> anyhow::Result<BTreeSet<String>> {
    let routes = duet.debug_routes().await?;
    let mut refused = BTreeSet::new();
    for d in routes["diagnostics"].as_array().into_iter().flatten() {
        if d["reason"] != REASON {
            continue;
        }
        anyhow::ensure!(d["object"]["kind"] == "EndpointSlice", "{d}");
        let message = d["message"].as_str().unwrap_or_default();
        let address = message
            .strip_prefix("address ")
            .and_then(|m| m.split(' ').next());
        let name = d["object"]["name"].as_str().unwrap_or_default();
        refused.insert(format!("{name} {}", address.unwrap_or(message)));
    }
    Ok(refused)
}

/// The "Configuration problem" warnings of `ForbiddenEndpointAddress` in duet's log, as
/// `slice address`; each must name `file`.
fn refused_in_log(duet: &Duet, file: &str) -> anyhow::Result<BTreeSet<String>> {
    let mut refused = BTreeSet::new();
    let logs = duet.logs();
    let lines = logs.lines().filter(|l| l.contains("Configuration problem"));
    for line in lines.filter(|l| l.contains(&format!("reason={REASON}"))) {
        anyhow::ensure!(line.contains(" WARN "), "{line}");
        anyhow::ensure!(line.contains(&format!("file={file}")), "{line}");
        let after = |marker: &str| line.split(marker).nth(1)?.split([' ', ';']).next();
        let slice = after(&format!("object=EndpointSlice {NS}/"));
        let address = after("detail=address ");
        refused.insert(format!(
            "{} {}",
            slice.unwrap_or(line),
            address.unwrap_or(line)
        ));
    }
    Ok(refused)
}

/// `duet_config_diagnostics{reason="ForbiddenEndpointAddress"}` on `family`'s admin listener.
async fn forbidden_gauge(duet: &Duet, family: Family) -> anyhow::Result<String> {
    let reply = duet.admin_get(family, "/metrics").await?;
    let text = String::from_utf8_lossy(&reply.body).into_owned();
    let series = format!("duet_config_diagnostics{{reason=\"{REASON}\"}} ");
    let line = text.lines().find_map(|l| l.strip_prefix(series.as_str()));
    Ok(line.unwrap_or("absent").to_owned())
}

/// Waits until `host` answers `status` to clients of both families.
async fn until_status(duet: &Duet, host: &str, status: u16) -> anyhow::Result<()> {
    for family in Family::BOTH {
        let what = format!("{host} answers {status} to {family} clients");
        client::eventually(&what, LIVE, || async {
            let reply = client::get(duet.http(family), host, "/").await?;
            client::expect_status(&reply, status)
        })
        .await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forbidden_endpoint_addresses_are_dropped_and_reported() -> anyhow::Result<()> {
    let web = Fleet::start(NS, "web", &[PodSpec::dual("loop")])?;
    let mixed = Fleet::start(NS, "mixed", &[PodSpec::dual("pod")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("web.yaml", &web.manifests())?;
    let mut slices = slices_with_forbidden("meta", None);
    slices.extend(slices_with_forbidden("mixed", Some(mixed.pod("pod"))));
    dir.write("endpoints.yaml", &slices)?;
    let ingress = Ingress::new(NS, "sites")
        .host("web.test", "web")
        .host("meta.test", "meta")
        .host("mixed.test", "mixed");
    dir.write("ingress.yaml", &[ingress.build()])?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;

    let want = every_forbidden(&["meta", "mixed"]);
    client::eventually("one diagnostic per dropped endpoint", LIVE, || async {
        let got = refused_on_debug_routes(&duet).await?;
        anyhow::ensure!(got == want, "/debug/routes lists {got:?}");
        Ok(())
    })
    .await?;
    let file = dir.path().join("endpoints.yaml");
    let file = file.display().to_string();
    client::eventually("one warning per dropped endpoint", LIVE, || async {
        let logged = refused_in_log(&duet, &file)?;
        anyhow::ensure!(logged == want, "warnings for {logged:?}");
        Ok(())
    })
    .await?;
    for family in Family::BOTH {
        let gauge = forbidden_gauge(&duet, family).await?;
        assert_eq!(gauge, want.len().to_string(), "over {family}");
    }

    // Only forbidden addresses: no target. The loopback pod is served (manifests mode).
    until_status(&duet, "meta.test", 503).await?;
    until_status(&duet, "web.test", 200).await?;
    // Next to forbidden addresses, the pod gets every request, over the client's family.
    let pod = mixed.pod("pod");
    for family in Family::BOTH {
        for _ in 0..20 {
            let echo = client::get(duet.http(family), "mixed.test", "/")
                .await?
                .echo()?;
            assert_eq!(echo.pod, "pod", "{family}");
            assert_eq!(Some(echo.local), pod.addr(family), "{family}");
        }
        let echo = client::get(duet.http(family), "web.test", "/")
            .await?
            .echo()?;
        assert_eq!((echo.service.as_str(), echo.family), ("web", family));
    }
    Ok(())
}
