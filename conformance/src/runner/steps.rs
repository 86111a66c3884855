//! The step definitions: the upstream patterns (NOTES.md §3), with the upstream semantics, run
//! against the cluster over the profile's address family.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use bytes::Bytes;
use cucumber::step::Context;
use futures_util::future::LocalBoxFuture;
use http::{HeaderMap, Method};
use http_body_util::Full;
use regex::Regex;
use serde_json::Value;

use super::cluster::Cluster;
use super::pod_shape::PodShape;
use crate::client::{self, Conn, Reply};
use crate::echo::Family;
use crate::fleet::{PodSpec, Port};

/// What every scenario shares: the cluster, the profile and the waits.
#[derive(Debug)]
pub struct Shared {
    /// The cluster under test.
    pub cluster: Cluster,
    /// How long the status wait of the ingress_class scenario lasts.
    pub class_wait: Duration,
    /// How long a status may take to appear.
    pub status_timeout: Duration,
}

/// Set once before the features run.
pub static SHARED: OnceLock<Shared> = OnceLock::new();

fn shared() -> &'static Shared {
    SHARED
        .get()
        .expect("cluster started before the features run")
}

/// One captured round trip.
#[derive(Debug)]
pub struct Captured {
    status: u16,
    version: http::Version,
    headers: HeaderMap,
    echo: Value,
    tls_verified: Option<String>,
    client: Option<SocketAddr>,
}

/// The state of one scenario.
#[derive(Debug, Default, cucumber::World)]
pub struct ConformanceWorld {
    /// The scenario's namespace.
    pub namespace: Option<String>,
    /// The profile: the client's address family (set before the scenario starts).
    pub family: Option<Family>,
    ingress: Option<String>,
    address: Option<IpAddr>,
    /// The status address as the Host header names it (an IPv6 one bracketed, or the FQDN).
    location: Option<String>,
    response: Option<Captured>,
    buckets: BTreeMap<u16, BTreeSet<String>>,
    /// Every response of the last `I send N requests` step, in order.
    replies: Vec<Served>,
    /// The pods of the Services this scenario declared.
    pods: Vec<PodSpec>,
}

/// What one of many requests got: its status, and which pod answered over which address.
#[derive(Clone, Debug)]
struct Served {
    status: u16,
    pod: String,
    local: Option<SocketAddr>,
}

type StepFn = for<'a> fn(&'a mut ConformanceWorld, Context) -> LocalBoxFuture<'a, ()>;

macro_rules! step {
    ($name:ident, $imp:ident) => {
        fn $name(w: &mut ConformanceWorld, ctx: Context) -> LocalBoxFuture<'_, ()> {
            Box::pin(async move {
                if let Err(e) = $imp(w, ctx).await {
                    panic!("{e:#}");
                }
            })
        }
    };
}

/// Every step pattern with its function.
pub fn steps() -> Vec<(Regex, StepFn)> {
    let table: Vec<(&str, StepFn)> = vec![
        (r"^a new random namespace$", new_namespace),
        (
            r#"^an Ingress resource named "([^"]*)" with this spec:$"#,
            ingress_spec,
        ),
        (r"^an Ingress resource$", ingress_manifest),
        (
            r"^an Ingress resource in a new random namespace$",
            ingress_in_new_namespace,
        ),
        (
            r#"^a self-signed TLS secret named "([^"]*)" for the "([^"]*)" hostname$"#,
            tls_secret,
        ),
        (
            r"^The Ingress status shows the IP address or FQDN where it is exposed$",
            status_shows,
        ),
        (
            r"^The Ingress status should not contain the IP address or FQDN$",
            status_empty,
        ),
        (
            r#"^The backend deployment "([^"]*)" for the ingress resource is scaled to (\d+)$"#,
            scale,
        ),
        (
            r#"^I send a "([^"]*)" request to http://"([^"]*)"/"([^"]*)"$"#,
            send_parts,
        ),
        (r#"^I send a "([^"]*)" request to "([^"]*)"$"#, send_url),
        (r#"^I send (\d+) requests to "([^"]*)"$"#, send_many),
        (r"^the response status-code must be (\d+)$", status_is),
        (
            r#"^the response must be served by the "([^"]*)" service$"#,
            served_by,
        ),
        (r#"^the response proto must be "([^"]*)"$"#, response_proto),
        (
            r"^the response headers must contain <key> with matching <value>$",
            response_headers,
        ),
        (r#"^the request method must be "([^"]*)"$"#, request_method),
        (r#"^the request path must be "([^"]*)"$"#, request_path),
        (r#"^the request proto must be "([^"]*)"$"#, request_proto),
        (
            r"^the request headers must contain <key> with matching <value>$",
            request_headers,
        ),
        (r#"^the request host must be "([^"]*)"$"#, request_host),
        (
            r#"^the secure connection must verify the "([^"]*)" hostname$"#,
            verify_hostname,
        ),
        (
            r"^all the responses status-code must be (\d+) and the response body should contain the IP address of (\d+) different Kubernetes pods$",
            pods_seen,
        ),
        (
            r"^the Ingress status must list an IPv4 and an IPv6 address$",
            status_both,
        ),
        (
            r"^the request must reach the pod over the client's address family$",
            same_family,
        ),
        (
            r#"^the request header "X-Forwarded-For" must be the client's address$"#,
            xff_is_client,
        ),
        (
            r#"^the request header "Forwarded" must name the client's address$"#,
            forwarded_is_client,
        ),
        (
            r#"^a Service "([^"]*)" with these pods:$"#,
            service_with_pods,
        ),
        (
            r"^every response status-code must be (\d+)$",
            every_status_is,
        ),
        (
            r#"^each of the pods "([^"]*)" must serve between (\d+) and (\d+) of the requests$"#,
            pods_share,
        ),
        (
            r#"^the pod "([^"]*)" must serve at least (\d+) of the requests$"#,
            pod_serves_at_least,
        ),
        (
            r#"^the pod "([^"]*)" must be reached over (IPv4|IPv6|the client's address family)$"#,
            pod_reached_over,
        ),
        (
            r"^every request must reach a pod over the client's address family$",
            every_same_family,
        ),
        (
            r"^only the pods with an address of the client's family must serve requests$",
            only_client_family_pods,
        ),
    ];
    table
        .into_iter()
        .map(|(re, f)| (Regex::new(re).expect("step regex"), f))
        .collect()
}

fn arg(ctx: &Context, i: usize) -> String {
    ctx.matches.get(i).map(|m| m.1.clone()).unwrap_or_default()
}

fn family(w: &ConformanceWorld) -> Family {
    w.family.unwrap_or(Family::V4)
}

step!(new_namespace, new_namespace_impl);
async fn new_namespace_impl(w: &mut ConformanceWorld, _ctx: Context) -> anyhow::Result<()> {
    w.namespace = Some(shared().cluster.new_namespace().await?);
    Ok(())
}

step!(ingress_spec, ingress_spec_impl);
async fn ingress_spec_impl(w: &mut ConformanceWorld, ctx: Context) -> anyhow::Result<()> {
    let name = arg(&ctx, 1);
    let doc = ctx
        .step
        .docstring
        .clone()
        .context("the step needs a doc string")?;
    let spec: Value = serde_saphyr::from_str(&doc).context("the spec is not YAML")?;
    let ingress = serde_json::json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {"name": name},
        "spec": spec,
    });
    create_ingress(w, ingress).await
}

step!(ingress_manifest, ingress_manifest_impl);
async fn ingress_manifest_impl(w: &mut ConformanceWorld, ctx: Context) -> anyhow::Result<()> {
    let doc = ctx
        .step
        .docstring
        .clone()
        .context("the step needs a doc string")?;
    let ingress: Value = serde_saphyr::from_str(&doc).context("the manifest is not YAML")?;
    create_ingress(w, ingress).await
}

step!(ingress_in_new_namespace, ingress_in_new_namespace_impl);
async fn ingress_in_new_namespace_impl(
    w: &mut ConformanceWorld,
    ctx: Context,
) -> anyhow::Result<()> {
    w.namespace = Some(shared().cluster.new_namespace().await?);
    ingress_manifest_impl(w, ctx).await
}

/// Backends first (one per referenced Service), then the Ingress, as upstream.
async fn create_ingress(w: &mut ConformanceWorld, mut ingress: Value) -> anyhow::Result<()> {
    let ns = w.namespace.clone().context("no namespace yet")?;
    ensure!(ns != "default", "refusing the default namespace");
    let name = ingress["metadata"]["name"]
        .as_str()
        .context("the Ingress has no name")?
        .to_owned();
    ingress["metadata"]["namespace"] = ns.clone().into();
    if ingress["spec"]["ingressClassName"].is_null() {
        ingress["spec"]["ingressClassName"] = shared().cluster.ingress_class.clone().into();
    }
    let mut services = Vec::new();
    if let Some(s) = ingress["spec"]["defaultBackend"]["service"]["name"].as_str() {
        services.push(s.to_owned());
    }
    for rule in ingress["spec"]["rules"].as_array().into_iter().flatten() {
        for path in rule["http"]["paths"].as_array().into_iter().flatten() {
            if let Some(s) = path["backend"]["service"]["name"].as_str() {
                services.push(s.to_owned());
            }
        }
    }
    let cluster = &shared().cluster;
    for service in services {
        cluster.ensure_backend(&ns, &name, &service).await?;
    }
    cluster.kube.create(ingress).await?;
    w.ingress = Some(name);
    Ok(())
}

step!(tls_secret, tls_secret_impl);
async fn tls_secret_impl(w: &mut ConformanceWorld, ctx: Context) -> anyhow::Result<()> {
    let ns = w.namespace.clone().context("no namespace yet")?;
    let hosts = arg(&ctx, 2);
    let names: Vec<&str> = hosts.split(',').collect();
    let cert = crate::tls::cert(&names);
    shared()
        .cluster
        .kube
        .create(crate::tls::secret(&ns, &arg(&ctx, 1), &cert))
        .await?;
    Ok(())
}

/// The status addresses of the scenario's Ingress (`ip`, then `hostname`, per entry).
async fn status_addresses(w: &ConformanceWorld) -> anyhow::Result<Vec<String>> {
    let ns = w.namespace.as_deref().context("no namespace yet")?;
    let name = w.ingress.as_deref().context("no Ingress yet")?;
    let ingress = shared()
        .cluster
        .kube
        .get("networking.k8s.io/v1", "Ingress", Some(ns), name)
        .await?
        .with_context(|| format!("Ingress {ns}/{name} not found"))?;
    let mut out = Vec::new();
    for entry in ingress["status"]["loadBalancer"]["ingress"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for key in ["ip", "hostname"] {
            if let Some(v) = entry[key].as_str().filter(|v| !v.is_empty()) {
                out.push(v.to_owned());
            }
        }
    }
    Ok(out)
}

step!(status_shows, status_shows_impl);
async fn status_shows_impl(w: &mut ConformanceWorld, _ctx: Context) -> anyhow::Result<()> {
    let deadline = Instant::now() + shared().status_timeout;
    let want = family(w);
    loop {
        let addrs = status_addresses(w).await?;
        if !addrs.is_empty() {
            let (ip, location) = pick_address(&addrs, want)
                .await
                .with_context(|| format!("the status lists no {want} address: {addrs:?}"))?;
            w.address = Some(ip);
            w.location = Some(location);
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("no status address after {:?}", shared().status_timeout);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The first status address of the client's family: an IP as written, or a host name resolved
/// to its A and AAAA records. Returns the IP to connect to and the Host header naming it.
async fn pick_address(addrs: &[String], want: Family) -> Option<(IpAddr, String)> {
    for a in addrs {
        if let Ok(ip) = a.parse::<IpAddr>() {
            if Family::of(&SocketAddr::new(ip, 0)) == want {
                let location = match ip {
                    IpAddr::V4(v4) => v4.to_string(),
                    IpAddr::V6(v6) => format!("[{v6}]"),
                };
                return Some((ip, location));
            }
            continue;
        }
        let Ok(resolved) = tokio::net::lookup_host((a.as_str(), 80)).await else {
            continue;
        };
        for sa in resolved {
            if Family::of(&sa) == want {
                return Some((sa.ip(), a.clone()));
            }
        }
    }
    None
}

step!(status_empty, status_empty_impl);
async fn status_empty_impl(w: &mut ConformanceWorld, _ctx: Context) -> anyhow::Result<()> {
    let deadline = Instant::now() + shared().class_wait;
    while Instant::now() < deadline {
        let addrs = status_addresses(w).await?;
        ensure!(addrs.is_empty(), "the status got addresses: {addrs:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

step!(scale, scale_impl);
async fn scale_impl(w: &mut ConformanceWorld, ctx: Context) -> anyhow::Result<()> {
    let ns = w.namespace.clone().context("no namespace yet")?;
    let ingress = w.ingress.clone().context("no Ingress yet")?;
    let replicas: usize = arg(&ctx, 2).parse()?;
    let service = arg(&ctx, 1);
    let deployment = format!("{ingress}-{service}");
    shared()
        .cluster
        .scale(&ns, &deployment, &service, replicas)
        .await
}

/// Upstream's CaptureRoundTrip: connects to the status address (the listener of `scheme`),
/// sends Host `hostname` (or the address) and follows redirects on the same address.
async fn round_trip(
    w: &ConformanceWorld,
    conn: Option<&mut Conn>,
    method: &str,
    scheme: &str,
    hostname: &str,
    path: &str,
) -> anyhow::Result<Captured> {
    let ip = w.address.context("no status address yet")?;
    let location = w.location.clone().context("no status address yet")?;
    let mut conn = conn;
    let (mut scheme, mut hostname, mut path) =
        (scheme.to_owned(), hostname.to_owned(), path.to_owned());
    for _ in 0..10 {
        let host = if hostname.is_empty() {
            location.clone()
        } else {
            hostname.clone()
        };
        let target = format!("/{}", path.trim_start_matches('/'));
        let method = Method::from_bytes(method.as_bytes())?;
        let mut req = client::request(method.clone(), &host, &target)
            .header(http::header::USER_AGENT, "Go-http-client/1.1");
        if [Method::POST, Method::PUT, Method::PATCH].contains(&method) {
            req = req.header(http::header::CONTENT_LENGTH, "0");
        }
        let req = req.body(Full::new(Bytes::new()))?;
        let to = shared().cluster.listener(ip, &scheme);
        let (reply, tls_verified, client): (Reply, Option<String>, SocketAddr) =
            if scheme == "https" {
                let sni = (!hostname.is_empty()).then_some(hostname.as_str());
                let (mut c, hs) = Conn::https(to, sni, &[]).await?;
                let reply = c.send(req).await?;
                let verified = verified_name(&hs.cert, &hostname);
                (reply, verified, c.local_addr())
            } else {
                match conn.as_deref_mut() {
                    Some(c) => (c.send(req).await?, None, c.local_addr()),
                    None => {
                        let mut c = Conn::http1(to).await?;
                        (c.send(req).await?, None, c.local_addr())
                    }
                }
            };
        let status = reply.status.as_u16();
        if [301, 302, 303, 307, 308].contains(&status) {
            let location = reply
                .header("location")
                .context("redirect without Location")?
                .to_owned();
            let uri: http::Uri = location.parse()?;
            if let Some(s) = uri.scheme_str() {
                scheme = s.to_owned();
            }
            if let Some(h) = uri.host() {
                hostname = h.to_owned();
            }
            path = uri.path().to_owned();
            conn = None;
            continue;
        }
        let echo = serde_json::from_slice::<Value>(&reply.body)
            .ok()
            .filter(Value::is_object)
            .unwrap_or(Value::Null);
        return Ok(Captured {
            status,
            version: reply.version,
            headers: reply.headers,
            echo,
            tls_verified,
            client: Some(client),
        });
    }
    bail!("more than 10 redirects")
}

/// `Some(name)` when the leaf certificate is valid for `name` (SAN match, no chain check).
fn verified_name(der: &[u8], name: &str) -> Option<String> {
    let der = rustls::pki_types::CertificateDer::from(der.to_vec());
    let cert = webpki::EndEntityCert::try_from(&der).ok()?;
    let server = rustls::pki_types::ServerName::try_from(name.to_owned()).ok()?;
    cert.verify_is_valid_for_subject_name(&server)
        .ok()
        .map(|()| name.to_owned())
}

step!(send_parts, send_parts_impl);
async fn send_parts_impl(w: &mut ConformanceWorld, ctx: Context) -> anyhow::Result<()> {
    let captured = round_trip(w, None, &arg(&ctx, 1), "http", &arg(&ctx, 2), &arg(&ctx, 3)).await?;
    w.response = Some(captured);
    Ok(())
}

fn split_url(url: &str) -> anyhow::Result<(String, String, String)> {
    let uri: http::Uri = url.parse().with_context(|| format!("bad URL {url}"))?;
    Ok((
        uri.scheme_str().unwrap_or("http").to_owned(),
        uri.host().unwrap_or_default().to_owned(),
        uri.path().to_owned(),
    ))
}

step!(send_url, send_url_impl);
async fn send_url_impl(w: &mut ConformanceWorld, ctx: Context) -> anyhow::Result<()> {
    let (scheme, host, path) = split_url(&arg(&ctx, 2))?;
    let captured = round_trip(w, None, &arg(&ctx, 1), &scheme, &host, &path).await?;
    w.response = Some(captured);
    Ok(())
}

step!(send_many, send_many_impl);
async fn send_many_impl(w: &mut ConformanceWorld, ctx: Context) -> anyhow::Result<()> {
    let count: usize = arg(&ctx, 1).parse()?;
    let (scheme, host, path) = split_url(&arg(&ctx, 2))?;
    let ip = w.address.context("no status address yet")?;
    let to = shared().cluster.listener(ip, &scheme);
    let mut conn = Conn::http1(to).await?;
    let mut buckets: BTreeMap<u16, BTreeSet<String>> = BTreeMap::new();
    let mut replies = Vec::with_capacity(count);
    for _ in 0..count {
        let c = round_trip(w, Some(&mut conn), "GET", &scheme, &host, &path).await?;
        let pod = c.echo["pod"].as_str().unwrap_or_default().to_owned();
        buckets.entry(c.status).or_default().insert(pod.clone());
        replies.push(Served {
            status: c.status,
            pod,
            local: c.echo["local"].as_str().and_then(|l| l.parse().ok()),
        });
    }
    w.buckets = buckets;
    w.replies = replies;
    Ok(())
}

fn response(w: &ConformanceWorld) -> anyhow::Result<&Captured> {
    w.response.as_ref().context("no request was sent")
}

fn echo_field<'a>(w: &'a ConformanceWorld, key: &str) -> anyhow::Result<&'a str> {
    Ok(response(w)?.echo[key].as_str().unwrap_or_default())
}

step!(status_is, status_is_impl);
async fn status_is_impl(w: &mut ConformanceWorld, ctx: Context) -> anyhow::Result<()> {
    let want: u16 = arg(&ctx, 1).parse()?;
    let got = response(w)?.status;
    ensure!(got == want, "expected status {want} but got {got}");
    Ok(())
}

step!(served_by, served_by_impl);
async fn served_by_impl(w: &mut ConformanceWorld, ctx: Context) -> anyhow::Result<()> {
    let want = arg(&ctx, 1);
    let got = echo_field(w, "service")?;
    ensure!(got == want, "expected service {want:?} but got {got:?}");
    Ok(())
}

fn proto(v: http::Version) -> &'static str {
    match v {
        http::Version::HTTP_10 => "HTTP/1.0",
        http::Version::HTTP_2 => "HTTP/2.0",
        _ => "HTTP/1.1",
    }
}

step!(response_proto, response_proto_impl);
async fn response_proto_impl(w: &mut ConformanceWorld, ctx: Context) -> anyhow::Result<()> {
    let want = arg(&ctx, 1);
    let got = proto(response(w)?.version);
    ensure!(got == want, "expected response proto {want} but got {got}");
    Ok(())
}

/// Rows after the header row, as (key, value).
fn table_rows(ctx: &Context) -> anyhow::Result<Vec<(String, String)>> {
    let table = ctx.step.table.as_ref().context("the step needs a table")?;
    let rows: Vec<(String, String)> = table
        .rows
        .iter()
        .skip(1)
        .map(|r| match r.as_slice() {
            [k, v] => Ok((k.clone(), v.clone())),
            _ => bail!("a header row needs 2 cells"),
        })
        .collect::<anyhow::Result<_>>()?;
    ensure!(!rows.is_empty(), "the table has no rows");
    Ok(rows)
}

step!(response_headers, response_headers_impl);
async fn response_headers_impl(w: &mut ConformanceWorld, ctx: Context) -> anyhow::Result<()> {
    let headers = &response(w)?.headers;
    for (key, value) in table_rows(&ctx)? {
        let values: Vec<&str> = headers
            .get_all(key.as_str())
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        ensure!(!values.is_empty(), "response header {key} is missing");
        ensure!(
            value == "*" || values.contains(&value.as_str()),
            "response header {key} is {values:?}, not {value:?}"
        );
    }
    Ok(())
}

step!(request_method, request_method_impl);
async fn request_method_impl(w: &mut ConformanceWorld, ctx: Context) -> anyhow::Result<()> {
    let want = arg(&ctx, 1);
    let got = echo_field(w, "method")?;
    ensure!(got == want, "expected method {want:?} but got {got:?}");
    Ok(())
}

step!(request_path, request_path_impl);
async fn request_path_impl(w: &mut ConformanceWorld, ctx: Context) -> anyhow::Result<()> {
    let want = format!("/{}", arg(&ctx, 1).trim_start_matches('/'));
    let got = echo_field(w, "path")?;
    ensure!(got == want, "expected path {want:?} but got {got:?}");
    Ok(())
}

step!(request_proto, request_proto_impl);
async fn request_proto_impl(w: &mut ConformanceWorld, ctx: Context) -> anyhow::Result<()> {
    let want = arg(&ctx, 1);
    let got = echo_field(w, "proto")?;
    ensure!(
        got == want,
        "expected request proto {want:?} but got {got:?}"
    );
    Ok(())
}

step!(request_headers, request_headers_impl);
async fn request_headers_impl(w: &mut ConformanceWorld, ctx: Context) -> anyhow::Result<()> {
    let headers = &response(w)?.echo["headers"];
    for (key, value) in table_rows(&ctx)? {
        let values: Vec<&str> = headers
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| k.eq_ignore_ascii_case(&key))
            .flat_map(|(_, v)| v.as_array().into_iter().flatten())
            .filter_map(Value::as_str)
            .collect();
        ensure!(!values.is_empty(), "request header {key} is missing");
        ensure!(
            value == "*" || values.contains(&value.as_str()),
            "request header {key} is {values:?}, not {value:?}"
        );
    }
    Ok(())
}

step!(request_host, request_host_impl);
async fn request_host_impl(w: &mut ConformanceWorld, ctx: Context) -> anyhow::Result<()> {
    let want = arg(&ctx, 1);
    let got = echo_field(w, "host")?;
    ensure!(got == want, "expected host {want:?} but got {got:?}");
    Ok(())
}

step!(verify_hostname, verify_hostname_impl);
async fn verify_hostname_impl(w: &mut ConformanceWorld, ctx: Context) -> anyhow::Result<()> {
    let want = arg(&ctx, 1);
    let got = response(w)?
        .tls_verified
        .clone()
        .context("no TLS request was made, or the certificate is not valid for the host")?;
    ensure!(
        got == want,
        "the certificate is valid for {got:?}, not {want:?}"
    );
    Ok(())
}

step!(pods_seen, pods_seen_impl);
async fn pods_seen_impl(w: &mut ConformanceWorld, ctx: Context) -> anyhow::Result<()> {
    let status: u16 = arg(&ctx, 1).parse()?;
    let want: usize = arg(&ctx, 2).parse()?;
    let pods = w
        .buckets
        .get(&status)
        .with_context(|| format!("no response had status {status}: {:?}", w.buckets))?;
    ensure!(
        pods.len() == want,
        "expected {want} different pods but saw {}: {pods:?}",
        pods.len()
    );
    Ok(())
}

step!(status_both, status_both_impl);
async fn status_both_impl(w: &mut ConformanceWorld, _ctx: Context) -> anyhow::Result<()> {
    let addrs = status_addresses(w).await?;
    let ips: Vec<IpAddr> = addrs.iter().filter_map(|a| a.parse().ok()).collect();
    ensure!(
        ips.iter().any(IpAddr::is_ipv4) && ips.iter().any(IpAddr::is_ipv6),
        "the status does not list both families: {addrs:?}"
    );
    Ok(())
}

fn client_ip(w: &ConformanceWorld) -> anyhow::Result<IpAddr> {
    Ok(response(w)?
        .client
        .context("no client address recorded")?
        .ip())
}

step!(same_family, same_family_impl);
async fn same_family_impl(w: &mut ConformanceWorld, _ctx: Context) -> anyhow::Result<()> {
    let client = client_ip(w)?;
    let local = echo_field(w, "local")?;
    let local: SocketAddr = local
        .parse()
        .with_context(|| format!("the echo names no local address: {local:?}"))?;
    ensure!(
        local.is_ipv4() == client.is_ipv4(),
        "a client at {client} reached the pod at {local}"
    );
    Ok(())
}

fn request_header(w: &ConformanceWorld, name: &str) -> anyhow::Result<Vec<String>> {
    let headers = &response(w)?.echo["headers"];
    Ok(headers
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.eq_ignore_ascii_case(name))
        .flat_map(|(_, v)| v.as_array().into_iter().flatten())
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect())
}

step!(xff_is_client, xff_is_client_impl);
async fn xff_is_client_impl(w: &mut ConformanceWorld, _ctx: Context) -> anyhow::Result<()> {
    let want = client_ip(w)?.to_string();
    let got = request_header(w, "X-Forwarded-For")?;
    ensure!(
        got == [want.clone()],
        "X-Forwarded-For is {got:?}, not [{want:?}]"
    );
    Ok(())
}

step!(forwarded_is_client, forwarded_is_client_impl);
async fn forwarded_is_client_impl(w: &mut ConformanceWorld, _ctx: Context) -> anyhow::Result<()> {
    // RFC 7239: the node is the address, optionally with the port; an IPv6 one is bracketed,
    // and a node with a colon is quoted.
    let client = response(w)?.client.context("no client address recorded")?;
    let wants = match client.ip() {
        IpAddr::V4(ip) => vec![format!("for={ip}"), format!("for=\"{client}\"")],
        IpAddr::V6(ip) => vec![format!("for=\"[{ip}]\""), format!("for=\"{client}\"")],
    };
    let got = request_header(w, "Forwarded")?;
    ensure!(
        got.len() == 1
            && got[0]
                .split(';')
                .any(|p| wants.iter().any(|w| p.trim().eq_ignore_ascii_case(w))),
        "Forwarded is {got:?}, not naming the client as one of {wants:?}"
    );
    Ok(())
}

step!(service_with_pods, service_with_pods_impl);
async fn service_with_pods_impl(w: &mut ConformanceWorld, ctx: Context) -> anyhow::Result<()> {
    let ns = w.namespace.clone().context("no namespace yet")?;
    let table = ctx.step.table.as_ref().context("the step needs a table")?;
    let (header, rows) = table.rows.split_first().context("the table is empty")?;
    ensure!(
        header
            .iter()
            .map(String::as_str)
            .eq(["pod", "ipv4", "ipv6"]),
        "the table's columns must be pod | ipv4 | ipv6, not {header:?}"
    );
    let mut specs = Vec::new();
    for row in rows {
        let [pod, v4, v6] = row.as_slice() else {
            bail!("a pod row needs 3 cells: {row:?}");
        };
        let shape = PodShape {
            name: pod.clone(),
            ipv4: v4.clone(),
            ipv6: v6.clone(),
        };
        specs.push(shape.spec()?);
    }
    ensure!(!specs.is_empty(), "the Service needs at least one pod");
    shared()
        .cluster
        .service_with_pods(&ns, &arg(&ctx, 1), &specs)
        .await?;
    w.pods.extend(specs);
    Ok(())
}

fn replies(w: &ConformanceWorld) -> anyhow::Result<&[Served]> {
    ensure!(!w.replies.is_empty(), "no requests were sent");
    Ok(&w.replies)
}

/// How many of the replies each pod served.
fn per_pod(w: &ConformanceWorld) -> anyhow::Result<BTreeMap<&str, usize>> {
    let mut counts = BTreeMap::new();
    for r in replies(w)? {
        *counts.entry(r.pod.as_str()).or_default() += 1;
    }
    Ok(counts)
}

step!(every_status_is, every_status_is_impl);
async fn every_status_is_impl(w: &mut ConformanceWorld, ctx: Context) -> anyhow::Result<()> {
    let want: u16 = arg(&ctx, 1).parse()?;
    let all = replies(w)?;
    let mut by_status: BTreeMap<u16, usize> = BTreeMap::new();
    for r in all {
        *by_status.entry(r.status).or_default() += 1;
    }
    ensure!(
        by_status.keys().all(|s| *s == want),
        "of {} responses, not all had status {want}: count by status {by_status:?}",
        all.len()
    );
    Ok(())
}

step!(pods_share, pods_share_impl);
async fn pods_share_impl(w: &mut ConformanceWorld, ctx: Context) -> anyhow::Result<()> {
    let (low, high): (usize, usize) = (arg(&ctx, 2).parse()?, arg(&ctx, 3).parse()?);
    let counts = per_pod(w)?;
    for pod in arg(&ctx, 1).split(',').map(str::trim) {
        let n = counts.get(pod).copied().unwrap_or_default();
        ensure!(
            (low..=high).contains(&n),
            "pod {pod} served {n} requests, not between {low} and {high}: {counts:?}"
        );
    }
    Ok(())
}

step!(pod_serves_at_least, pod_serves_at_least_impl);
async fn pod_serves_at_least_impl(w: &mut ConformanceWorld, ctx: Context) -> anyhow::Result<()> {
    let pod = arg(&ctx, 1);
    let want: usize = arg(&ctx, 2).parse()?;
    let counts = per_pod(w)?;
    let n = counts.get(pod.as_str()).copied().unwrap_or_default();
    ensure!(
        n >= want,
        "pod {pod} served {n} requests, fewer than {want}: {counts:?}"
    );
    Ok(())
}

/// The family a pod's local address belongs to, failing on a reply that names none.
fn reached_over(r: &Served) -> anyhow::Result<Family> {
    r.local.map(|l| Family::of(&l)).with_context(|| {
        format!(
            "pod {:?} did not report the address it was reached on",
            r.pod
        )
    })
}

step!(pod_reached_over, pod_reached_over_impl);
async fn pod_reached_over_impl(w: &mut ConformanceWorld, ctx: Context) -> anyhow::Result<()> {
    let pod = arg(&ctx, 1);
    let want = match arg(&ctx, 2).as_str() {
        "IPv4" => Family::V4,
        "IPv6" => Family::V6,
        _ => family(w),
    };
    let mine: Vec<&Served> = replies(w)?.iter().filter(|r| r.pod == pod).collect();
    ensure!(!mine.is_empty(), "pod {pod} served none of the requests");
    for r in &mine {
        let got = reached_over(r)?;
        ensure!(
            got == want,
            "pod {pod} was reached over {got} ({:?}), not {want}",
            r.local
        );
    }
    Ok(())
}

step!(every_same_family, every_same_family_impl);
async fn every_same_family_impl(w: &mut ConformanceWorld, _ctx: Context) -> anyhow::Result<()> {
    let want = family(w);
    for r in replies(w)? {
        let got = reached_over(r)?;
        ensure!(
            got == want,
            "an {want} client reached pod {} over {got} ({:?})",
            r.pod,
            r.local
        );
    }
    Ok(())
}

step!(only_client_family_pods, only_client_family_pods_impl);
async fn only_client_family_pods_impl(
    w: &mut ConformanceWorld,
    _ctx: Context,
) -> anyhow::Result<()> {
    let client = family(w);
    let served: BTreeSet<&str> = replies(w)?.iter().map(|r| r.pod.as_str()).collect();
    let eligible: BTreeSet<&str> = w
        .pods
        .iter()
        .filter(|p| p.port(client) != Port::Absent)
        .map(|p| p.name.as_str())
        .collect();
    ensure!(
        served == eligible,
        "an {client} client was served by {served:?}, but exactly {eligible:?} have {client}"
    );
    Ok(())
}
