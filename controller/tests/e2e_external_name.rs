//! End to end, over real sockets on 127.0.0.1 and [::1]: ExternalName Services as backends. A
//! DNS server started by the test on a loopback address (port 53, so the test runs as root, as
//! the cluster tests do) answers A and AAAA with short TTLs; duet reads it from `--resolv-conf`.
//! The name is one target holding both families' addresses: IPv4 clients reach its IPv4
//! address, IPv6 clients its IPv6 address, and the per-family fallback applies when one is
//! missing. A changed answer is picked up when the TTL runs out, a failing server leaves the last
//! good answer in service, NXDOMAIN answers 503 for that route only, and an IP literal needs no
//! lookup.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use conformance::client::{self, Conn};
use conformance::echo::{EchoOptions, EchoServer, Identity, PodListeners};
use conformance::{DuetBuilder, Family, Fleet, Ingress, ManifestDir, PathType, PodSpec, PortRef};
use hickory_proto::op::{Message, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{RData, Record, RecordType};
use serde_json::{json, Value};
use tokio::net::UdpSocket;

const DUET: &str = env!("CARGO_BIN_EXE_duet");
const TTL: u32 = 1;

/// What the test DNS server answers for one name.
#[derive(Clone, Debug, Default)]
struct Answer {
    v4: Vec<Ipv4Addr>,
    v6: Vec<Ipv6Addr>,
    /// Drop the queries (a server that stopped answering).
    silent: bool,
}

/// The zone: names (lower case, no trailing dot) to answers; other names are NXDOMAIN.
type Zone = Arc<Mutex<HashMap<String, Answer>>>;

/// A DNS server on `127.a.b.c:53` answering from `zone`; returns its address.
async fn dns_server(zone: Zone) -> anyhow::Result<IpAddr> {
    let mut last = None;
    for _ in 0..20 {
        let ip = IpAddr::V4(Ipv4Addr::new(
            127,
            fastrand::u8(100..=250),
            fastrand::u8(1..=254),
            fastrand::u8(1..=254),
        ));
        match UdpSocket::bind(SocketAddr::new(ip, 53)).await {
            Ok(socket) => {
                tokio::spawn(serve_dns(socket, zone));
                return Ok(ip);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("tried"))
        .context("cannot bind a DNS server on a loopback address, port 53 (run as root)")
}

async fn serve_dns(socket: UdpSocket, zone: Zone) {
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, from)) = socket.recv_from(&mut buf).await else {
            return;
        };
        let Some(reply) = Message::from_vec(&buf[..n])
            .ok()
            .and_then(|q| answer(&q, &zone))
        else {
            continue;
        };
        if let Ok(bytes) = reply.to_vec() {
            let _ = socket.send_to(&bytes, from).await;
        }
    }
}

/// The reply to one query; `None` to stay silent.
fn answer(query: &Message, zone: &Zone) -> Option<Message> {
    let question = query.queries.first()?.clone();
    let name = question
        .name()
        .to_ascii()
        .trim_end_matches('.')
        .to_ascii_lowercase();
    let mut reply = Message::response(query.metadata.id, OpCode::Query);
    reply.metadata.recursion_desired = query.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    reply.metadata.authoritative = true;
    reply.add_query(question.clone());
    let found = zone.lock().unwrap().get(&name).cloned();
    let Some(found) = found else {
        reply.metadata.response_code = ResponseCode::NXDomain;
        return Some(reply);
    };
    if found.silent {
        return None;
    }
    let owner = question.name().clone();
    match question.query_type() {
        RecordType::A => {
            for ip in found.v4 {
                reply.add_answer(Record::from_rdata(owner.clone(), TTL, RData::A(A(ip))));
            }
        }
        RecordType::AAAA => {
            for ip in found.v6 {
                reply.add_answer(Record::from_rdata(
                    owner.clone(),
                    TTL,
                    RData::AAAA(AAAA(ip)),
                ));
            }
        }
        _ => {}
    }
    Some(reply)
}

/// Echo pods sharing one port: `one` on 127.0.0.81 and [::1], `two` on 127.0.0.82.
fn external_pods() -> anyhow::Result<(EchoServer, u16)> {
    for _ in 0..20 {
        let one_v4 = conformance::echo::bind(SocketAddr::from(([127, 0, 0, 81], 0)))?;
        let port = one_v4.local_addr()?.port();
        let (Ok(one_v6), Ok(two)) = (
            conformance::echo::bind(SocketAddr::from((Ipv6Addr::LOCALHOST, port))),
            conformance::echo::bind(SocketAddr::from(([127, 0, 0, 82], port))),
        ) else {
            continue;
        };
        let identity = Identity {
            namespace: "ext".into(),
            ingress: String::new(),
            service: "outside".into(),
        };
        let pods = vec![
            PodListeners {
                name: "one".into(),
                listeners: vec![one_v4, one_v6],
            },
            PodListeners {
                name: "two".into(),
                listeners: vec![two],
            },
        ];
        return Ok((
            EchoServer::serve(identity, pods, EchoOptions::default())?,
            port,
        ));
    }
    anyhow::bail!("no port free on 127.0.0.81, 127.0.0.82 and ::1")
}

fn external_service(name: &str, external: &str, port: u16) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "ext"},
        "spec": {"type": "ExternalName", "externalName": external, "ports": [{"name": "http", "port": port}]},
    })
}

/// The pod and the address (the pod's side of the connection) that served `host` over `family`.
async fn served(
    duet: &conformance::Duet,
    family: Family,
    host: &str,
) -> anyhow::Result<(String, IpAddr)> {
    let mut conn = Conn::http1(duet.http(family)).await?;
    let reply = conn.get(host, "/").await?;
    client::expect_status(&reply, 200)?;
    let echo = reply.echo()?;
    Ok((echo.pod, echo.local.ip()))
}

/// Waits until `host` over `family` is served by `pod` on `ip`.
async fn until_served(
    duet: &conformance::Duet,
    family: Family,
    host: &str,
    want: (&str, IpAddr),
) -> anyhow::Result<()> {
    client::eventually(
        &format!("{host} over {family}"),
        Duration::from_secs(15),
        || async {
            let got = served(duet, family, host).await?;
            anyhow::ensure!(
                got.0 == want.0 && got.1 == want.1,
                "served by {got:?}, want {want:?}"
            );
            Ok(())
        },
    )
    .await
}

fn has_diagnostic(routes: &Value, service: &str, text: &str) -> bool {
    routes["diagnostics"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|d| {
            d["object"]["name"] == service
                && d["reason"] == "UnresolvedExternalName"
                && d["message"].as_str().is_some_and(|m| m.contains(text))
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_names_resolve_per_family_follow_ttls_and_fail_per_route() -> anyhow::Result<()> {
    let (_pods, port) = external_pods()?;
    let one_v4 = IpAddr::from([127, 0, 0, 81]);
    let two_v4 = IpAddr::from([127, 0, 0, 82]);
    let v6 = IpAddr::from(Ipv6Addr::LOCALHOST);
    let zone: Zone = Arc::default();
    zone.lock().unwrap().insert(
        "db.ext.test".into(),
        Answer {
            v4: vec![[127, 0, 0, 81].into()],
            v6: vec![Ipv6Addr::LOCALHOST],
            silent: false,
        },
    );
    let server = dns_server(zone.clone()).await?;
    let resolv = tempfile::NamedTempFile::new()?;
    std::fs::write(
        resolv.path(),
        format!("nameserver {server}\noptions timeout:1 attempts:1\n"),
    )?;

    let web = Fleet::start("ext", "web", &[PodSpec::dual("pod")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("web.yaml", &web.manifests())?;
    dir.write(
        "external.yaml",
        &[
            external_service("db", "db.ext.test.", port),
            external_service("gone", "gone.ext.test", port),
            external_service("literal", "127.0.0.82", port),
        ],
    )?;
    let route = |name: &str, service: &str| {
        Ingress::new("ext", name).path(
            Some(&format!("{name}.test")),
            PathType::Prefix,
            "/",
            service,
            PortRef::Number(port),
        )
    };
    let ingresses = [
        route("db", "db"),
        route("gone", "gone"),
        route("literal", "literal"),
        Ingress::new("ext", "web").host("web.test", "web"),
    ];
    dir.write("ingress.yaml", &ingresses.map(|i| i.build()))?;
    let resolv_flag = resolv.path().display().to_string();
    let duet = DuetBuilder::new(DUET, dir.path())
        .args(["--resolv-conf", &resolv_flag])
        .start()
        .await?;

    // One target, both families: each client family reaches the name's address of its family.
    until_served(&duet, Family::V4, "db.test", ("one", one_v4)).await?;
    until_served(&duet, Family::V6, "db.test", ("one", v6)).await?;
    // An IP literal needs no lookup; the IPv6 client falls back to its IPv4 address.
    for family in Family::BOTH {
        until_served(&duet, family, "literal.test", ("two", two_v4)).await?;
        // NXDOMAIN: that route answers 503, the others keep working.
        let reply = client::get(duet.http(family), "gone.test", "/").await?;
        client::expect_status(&reply, 503)?;
        assert_eq!(served(&duet, family, "web.test").await?.0, "pod");
    }
    let routes = duet.debug_routes().await?;
    assert!(has_diagnostic(&routes, "gone", "NXDOMAIN"), "{routes:#}");

    // The answer changes: picked up once the 1 s TTL ran out. Without an AAAA record the IPv6
    // client falls back to the IPv4 address.
    zone.lock().unwrap().insert(
        "db.ext.test".into(),
        Answer {
            v4: vec![[127, 0, 0, 82].into()],
            v6: Vec::new(),
            silent: false,
        },
    );
    until_served(&duet, Family::V4, "db.test", ("two", two_v4)).await?;
    until_served(&duet, Family::V6, "db.test", ("two", two_v4)).await?;

    // The server stops answering: the last good answer stays in service, with a diagnostic.
    zone.lock().unwrap().get_mut("db.ext.test").unwrap().silent = true;
    client::eventually(
        "the failed lookup is reported",
        Duration::from_secs(15),
        || async {
            let routes = duet.debug_routes().await?;
            anyhow::ensure!(
                has_diagnostic(&routes, "db", "serving the last good answer"),
                "{routes:#}"
            );
            Ok(())
        },
    )
    .await?;
    for family in Family::BOTH {
        assert_eq!(
            served(&duet, family, "db.test").await?,
            ("two".to_owned(), two_v4)
        );
    }
    Ok(())
}
