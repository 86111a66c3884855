//! In-process echo pods of one Service on loopback, and the Service and per-family EndpointSlices
//! that describe them, shaped as the EndpointSlice controller writes them: one slice per family
//! and port mapping, up to 100 endpoints each. On IPv4 each pod has its own loopback address
//! (`127.0.0.2`, `127.0.0.3`, ...; all of `127.0.0.0/8` is loopback) and the pods share one port,
//! so every IPv4 endpoint lands in one slice; on IPv6 there is only `::1`, so pods listen on ports
//! of their own and, as the controller does for differing ports, get a slice each.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::Context;
use serde_json::Value;
use socket2::{Domain, Protocol, Socket, Type};

use crate::echo::{self, EchoOptions, EchoServer, Family, Identity, PodListeners};
use crate::manifests::{endpoint_slice, service, Endpoint};

/// The Service port every fleet exposes: named `http`, number 8080.
pub const SERVICE_PORT: (&str, u16) = ("http", 8080);

/// The most endpoints the EndpointSlice controller puts in one slice (`--max-endpoints-per-slice`).
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;

/// What a pod has on one family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Port {
    /// No address of this family.
    Absent,
    /// An address with the echo server listening.
    Listen,
    /// An address whose port refuses connections (bound, never listening), listed in the
    /// EndpointSlice as if it served.
    Closed,
    /// An address that accepts connections, reads a request head and closes the connection
    /// without an answer (a pod whose server exits as it terminates), listed as if it served.
    Hangup,
}

/// A pod to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSpec {
    /// The pod's name.
    pub name: String,
    /// Its IPv4 side.
    pub v4: Port,
    /// Its IPv6 side.
    pub v6: Port,
    /// `conditions.ready` of its endpoints.
    pub ready: bool,
}

impl PodSpec {
    /// A dual-stack pod serving on both families.
    pub fn dual(name: &str) -> PodSpec {
        PodSpec {
            name: name.into(),
            v4: Port::Listen,
            v6: Port::Listen,
            ready: true,
        }
    }

    /// An IPv4-only pod.
    pub fn v4_only(name: &str) -> PodSpec {
        PodSpec {
            v6: Port::Absent,
            ..PodSpec::dual(name)
        }
    }

    /// An IPv6-only pod.
    pub fn v6_only(name: &str) -> PodSpec {
        PodSpec {
            v4: Port::Absent,
            ..PodSpec::dual(name)
        }
    }

    /// Changes one family's side.
    pub fn with(mut self, family: Family, port: Port) -> PodSpec {
        match family {
            Family::V4 => self.v4 = port,
            Family::V6 => self.v6 = port,
        }
        self
    }

    /// Marks the pod's endpoints not ready.
    pub fn not_ready(mut self) -> PodSpec {
        self.ready = false;
        self
    }

    /// What the pod has on one family.
    pub fn port(&self, family: Family) -> Port {
        match family {
            Family::V4 => self.v4,
            Family::V6 => self.v6,
        }
    }
}

/// A started pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pod {
    /// The pod's name (echoed as `pod`).
    pub name: String,
    /// The uid in its EndpointSlices' `targetRef`.
    pub uid: String,
    /// Its IPv4 address (listening or closed), if any.
    pub v4: Option<SocketAddr>,
    /// Its IPv6 address (listening or closed), if any.
    pub v6: Option<SocketAddr>,
    /// Whether its endpoints are ready.
    pub ready: bool,
}

impl Pod {
    /// Its address of one family.
    pub fn addr(&self, family: Family) -> Option<SocketAddr> {
        match family {
            Family::V4 => self.v4,
            Family::V6 => self.v6,
        }
    }
}

/// The pods of one Service, served in-process until dropped.
#[derive(Debug)]
pub struct Fleet {
    namespace: String,
    service: String,
    pods: Vec<Pod>,
    listening: Vec<(String, Vec<SocketAddr>)>,
    server: Option<EchoServer>,
    /// Duplicates of the listening sockets, held across [`Fleet::restart`]: the ports are
    /// ephemeral ones, and while no socket held them another one (a client's source port) could
    /// take them before the restarted server bound them again. Let go by [`Fleet::stop`].
    kept: Vec<PodListeners>,
    options: EchoOptions,
    /// Makes this fleet's slice names unique, as the controller's random suffix does.
    slice_suffix: String,
    _closed: Vec<Socket>,
}

/// One pod's socket on one family: listening, or bound and refusing connections (or hanging
/// up on each request: answered by a thread of its own).
enum Side {
    Listening(std::net::TcpListener),
    Closed(Socket),
}

impl Side {
    fn bind(addr: SocketAddr, port: Port) -> std::io::Result<Option<Side>> {
        Ok(match port {
            Port::Absent => None,
            Port::Listen => Some(Side::Listening(echo::bind(addr)?)),
            Port::Closed => Some(Side::Closed(closed_socket(addr)?)),
            Port::Hangup => Some(Side::Closed(hangup_socket(addr)?)),
        })
    }

    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(match self {
            Side::Listening(l) => l.local_addr()?,
            Side::Closed(s) => s.local_addr()?.as_socket().context("no address")?,
        })
    }
}

/// The IPv4 loopback address of the `k`th pod of a fleet: `127.0.0.2` on.
fn pod_v4(k: usize) -> IpAddr {
    let n = k + 2;
    IpAddr::V4(Ipv4Addr::new(127, 0, (n / 250) as u8, (n % 250) as u8))
}

/// Binds the IPv4 side of every pod: each on its own loopback address, all on one port (the
/// first pod's ephemeral one). Another process may hold that port on a later address: then it
/// starts over with a new port.
fn bind_v4_sides(specs: &[PodSpec]) -> anyhow::Result<Vec<Option<Side>>> {
    let mut last = None;
    'attempt: for _ in 0..20 {
        let mut port = 0;
        let mut sides = Vec::with_capacity(specs.len());
        for (k, spec) in specs.iter().enumerate() {
            match Side::bind(SocketAddr::new(pod_v4(k), port), spec.v4) {
                Ok(side) => {
                    if let (0, Some(side)) = (port, &side) {
                        port = side.local_addr()?.port();
                    }
                    sides.push(side);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                    last = Some(e);
                    continue 'attempt;
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("binding pod {} on ipv4", spec.name))
                }
            }
        }
        return Ok(sides);
    }
    Err(last.map_or_else(|| anyhow::anyhow!("no port"), anyhow::Error::from))
        .context("no IPv4 port free on every pod's loopback address")
}

/// New descriptors of the same listening sockets (the sockets live while any is open).
fn duplicates(pods: &[PodListeners]) -> std::io::Result<Vec<PodListeners>> {
    pods.iter()
        .map(|pod| {
            Ok(PodListeners {
                name: pod.name.clone(),
                listeners: pod
                    .listeners
                    .iter()
                    .map(std::net::TcpListener::try_clone)
                    .collect::<std::io::Result<_>>()?,
            })
        })
        .collect()
}

/// A socket listening at `addr` whose every connection is accepted, read up to the end of a
/// request head (or 5 s) and closed unanswered, by a thread that lives as long as the process.
fn hangup_socket(addr: SocketAddr) -> std::io::Result<Socket> {
    let socket = closed_socket(addr)?;
    socket.listen(128)?;
    let listener: std::net::TcpListener = socket.try_clone()?.into();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(5)));
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match std::io::Read::read(&mut stream, &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
        }
    });
    Ok(socket)
}

/// A bound, never listening socket at `addr`: connections to it are refused.
fn closed_socket(addr: SocketAddr) -> std::io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&addr.into())?;
    Ok(socket)
}

/// A loopback port of `family` that refuses connections for as long as the socket lives.
pub fn closed_port(family: Family) -> anyhow::Result<(SocketAddr, Socket)> {
    let addr = SocketAddr::new(family.loopback(), 0);
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if family == Family::V6 {
        socket.set_only_v6(true)?;
    }
    socket.bind(&addr.into())?;
    let bound = socket
        .local_addr()?
        .as_socket()
        .context("bound socket has no address")?;
    Ok((bound, socket))
}

/// A loopback port of `family` whose connection attempts hang: it listens with a backlog of 0
/// and one connection, never accepted, fills that, so the kernel drops further SYNs (the way an
/// unreachable address behaves, offline). Holds while the returned sockets live.
pub fn unanswered_port(family: Family) -> anyhow::Result<(SocketAddr, Vec<Socket>)> {
    let (addr, listener) = closed_port(family)?;
    listener.listen(0)?;
    let filler = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    filler
        .connect_timeout(&addr.into(), std::time::Duration::from_secs(5))
        .context("filling the backlog")?;
    Ok((addr, vec![listener, filler]))
}

/// A loopback port of `family` that accepts connections (the kernel completes them) and never
/// answers: nobody accepts them. Holds while the returned listener lives.
pub fn silent_port(family: Family) -> anyhow::Result<(SocketAddr, std::net::TcpListener)> {
    let listener = std::net::TcpListener::bind(SocketAddr::new(family.loopback(), 0))?;
    Ok((listener.local_addr()?, listener))
}

/// A Service (port `http` 8080) with one dual-stack pod `only` at `v4` and `v6`, and its two
/// EndpointSlices: for upstreams that are not echo pods.
pub fn static_service(namespace: &str, name: &str, v4: SocketAddr, v6: SocketAddr) -> Vec<Value> {
    let mut docs = vec![service(namespace, name, &[SERVICE_PORT])];
    for (family, addr) in [(Family::V4, v4), (Family::V6, v6)] {
        docs.push(endpoint_slice(
            namespace,
            name,
            &format!("{name}-{family}"),
            family,
            SERVICE_PORT.0,
            addr.port(),
            &[Endpoint {
                pod: "only".into(),
                uid: format!("uid-{namespace}-{name}"),
                ip: addr.ip(),
                ready: true,
            }],
        ));
    }
    docs
}

impl Fleet {
    /// Starts the pods of `service` in `namespace`; must be called inside a Tokio runtime.
    pub fn start(namespace: &str, service: &str, specs: &[PodSpec]) -> anyhow::Result<Fleet> {
        Fleet::start_with(namespace, service, specs, EchoOptions::default())
    }

    /// Like [`Fleet::start`], with echo options (e.g. TLS).
    pub fn start_with(
        namespace: &str,
        service: &str,
        specs: &[PodSpec],
        options: EchoOptions,
    ) -> anyhow::Result<Fleet> {
        let mut pods = Vec::with_capacity(specs.len());
        let mut listeners = Vec::new();
        let mut closed = Vec::new();
        let v4_sides = bind_v4_sides(specs)?;
        for (spec, v4) in specs.iter().zip(v4_sides) {
            let mut pod = Pod {
                name: spec.name.clone(),
                uid: format!("uid-{namespace}-{service}-{}", spec.name),
                v4: None,
                v6: None,
                ready: spec.ready,
            };
            let mut mine = Vec::new();
            let v6 = Side::bind(SocketAddr::new(Family::V6.loopback(), 0), spec.v6)
                .with_context(|| format!("binding pod {} on ipv6", spec.name))?;
            for (family, side) in [(Family::V4, v4), (Family::V6, v6)] {
                let addr = match side {
                    None => None,
                    Some(side) => {
                        let addr = side.local_addr()?;
                        match side {
                            Side::Listening(l) => mine.push(l),
                            Side::Closed(s) => closed.push(s),
                        }
                        Some(addr)
                    }
                };
                match family {
                    Family::V4 => pod.v4 = addr,
                    Family::V6 => pod.v6 = addr,
                }
            }
            listeners.push(PodListeners {
                name: spec.name.clone(),
                listeners: mine,
            });
            pods.push(pod);
        }
        let identity = Identity {
            namespace: namespace.into(),
            ingress: String::new(),
            service: service.into(),
        };
        let listening = listeners
            .iter()
            .map(|p| {
                let addrs = p.listeners.iter().filter_map(|l| l.local_addr().ok());
                (p.name.clone(), addrs.collect())
            })
            .collect();
        let kept = duplicates(&listeners)?;
        let server = EchoServer::serve(identity, listeners, options.clone())?;
        static FLEETS: AtomicU32 = AtomicU32::new(0);
        Ok(Fleet {
            slice_suffix: format!("{:x}", FLEETS.fetch_add(1, Ordering::Relaxed)),
            options,
            namespace: namespace.into(),
            service: service.into(),
            pods,
            listening,
            server: Some(server),
            kept,
            _closed: closed,
        })
    }

    /// The Service name.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The pods.
    pub fn pods(&self) -> &[Pod] {
        &self.pods
    }

    /// A pod by name.
    ///
    /// # Panics
    /// When there is no such pod (a test bug).
    pub fn pod(&self, name: &str) -> &Pod {
        self.pods
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no pod {name} in fleet {}", self.service))
    }

    /// The Service (port `http` 8080) and the EndpointSlices.
    pub fn manifests(&self) -> Vec<Value> {
        let mut docs = vec![service(&self.namespace, &self.service, &[SERVICE_PORT])];
        docs.extend(self.slices());
        docs
    }

    /// Like [`Fleet::manifests`], with `appProtocol` set on the Service port.
    pub fn manifests_with_app_protocol(&self, app_protocol: &str) -> Vec<Value> {
        let mut docs = self.manifests();
        docs[0]["spec"]["ports"][0]["appProtocol"] = Value::String(app_protocol.into());
        docs
    }

    /// The EndpointSlices as the EndpointSlice controller writes them: per family, the pods'
    /// endpoints (ready or not) grouped by port, up to [`MAX_ENDPOINTS_PER_SLICE`] a slice, in
    /// pod order; named `<service>-<ipv4|ipv6>-<fleet>-<n>`, and joined across families by
    /// `targetRef.uid`. On IPv4 that is one slice for up to 100 pods; on IPv6 one per pod.
    pub fn slices(&self) -> Vec<Value> {
        let mut docs = Vec::new();
        for family in Family::BOTH {
            let mut by_port: BTreeMap<u16, Vec<Endpoint>> = BTreeMap::new();
            for pod in &self.pods {
                if let Some(addr) = pod.addr(family) {
                    by_port.entry(addr.port()).or_default().push(Endpoint {
                        pod: pod.name.clone(),
                        uid: pod.uid.clone(),
                        ip: addr.ip(),
                        ready: pod.ready,
                    });
                }
            }
            let chunks = by_port.iter().flat_map(|(port, endpoints)| {
                endpoints
                    .chunks(MAX_ENDPOINTS_PER_SLICE)
                    .map(move |chunk| (*port, chunk))
            });
            for (n, (port, chunk)) in chunks.enumerate() {
                docs.push(endpoint_slice(
                    &self.namespace,
                    &self.service,
                    &format!("{}-{family}-{}-{n}", self.service, self.slice_suffix),
                    family,
                    SERVICE_PORT.0,
                    port,
                    chunk,
                ));
            }
        }
        docs
    }

    /// Stops serving: open connections are cut and the ports refuse connections (until the
    /// kernel hands them to someone else, or [`Fleet::restart`]).
    pub fn stop(&mut self) {
        self.server = None;
        self.kept.clear();
    }

    /// Stops serving (cutting open connections) and serves again on the same addresses, like
    /// pods whose process restarted. The listening sockets stay open in between (connections
    /// made meanwhile wait in their backlog), unless [`Fleet::stop`] let the ports go: then they
    /// are bound again.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        if let Some(server) = self.server.take() {
            server.close().await;
        }
        if self.kept.is_empty() {
            self.kept = PodListeners::bind(&self.listening)?;
        }
        let identity = Identity {
            namespace: self.namespace.clone(),
            ingress: String::new(),
            service: self.service.clone(),
        };
        let listeners = duplicates(&self.kept)?;
        self.server = Some(EchoServer::serve(
            identity,
            listeners,
            self.options.clone(),
        )?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoints(slice: &Value) -> Vec<(String, String)> {
        slice["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["targetRef"]["name"].as_str().unwrap().to_owned(),
                    e["addresses"][0].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    fn of_family<'a>(slices: &'a [Value], family: &str) -> Vec<&'a Value> {
        slices
            .iter()
            .filter(|s| s["addressType"] == family)
            .collect()
    }

    #[tokio::test]
    async fn slices_are_shaped_as_the_controller_writes_them() -> anyhow::Result<()> {
        let fleet = Fleet::start(
            "ns",
            "web",
            &[
                PodSpec::dual("a"),
                PodSpec::v4_only("b"),
                PodSpec::v6_only("c"),
                PodSpec::dual("d").with(Family::V4, Port::Closed),
            ],
        )?;
        let slices = fleet.slices();
        // IPv4: one slice, every pod having IPv4 (the closed one too), one shared port.
        let v4 = of_family(&slices, "IPv4");
        assert_eq!(v4.len(), 1, "{v4:?}");
        assert_eq!(
            endpoints(v4[0]),
            [("a", "127.0.0.2"), ("b", "127.0.0.3"), ("d", "127.0.0.5")]
                .map(|(p, a)| (p.to_owned(), a.to_owned()))
        );
        let port = v4[0]["ports"][0]["port"].as_u64().unwrap() as u16;
        assert_eq!(fleet.pod("a").v4.unwrap().port(), port);
        // The pods answer at their slice addresses; the closed one refuses.
        std::net::TcpStream::connect(fleet.pod("a").v4.unwrap())?;
        std::net::TcpStream::connect(fleet.pod("b").v4.unwrap())?;
        assert!(std::net::TcpStream::connect(fleet.pod("d").v4.unwrap()).is_err());
        // IPv6: only ::1, one port per pod, so one slice per pod.
        let v6 = of_family(&slices, "IPv6");
        let mut pods: Vec<String> = v6.iter().flat_map(|s| endpoints(s)).map(|e| e.0).collect();
        pods.sort();
        assert_eq!(pods, ["a", "c", "d"]);
        assert!(v6.iter().all(|s| endpoints(s).len() == 1));
        // Names are unique across fleets of the same Service.
        let other = Fleet::start("ns", "web", &[PodSpec::dual("e")])?;
        let names = |slices: &[Value]| -> Vec<String> {
            slices
                .iter()
                .map(|s| s["metadata"]["name"].as_str().unwrap().to_owned())
                .collect()
        };
        let mine = names(&slices);
        assert!(names(&other.slices()).iter().all(|n| !mine.contains(n)));
        Ok(())
    }

    #[tokio::test]
    async fn a_slice_holds_at_most_100_endpoints() -> anyhow::Result<()> {
        let specs: Vec<PodSpec> = (0..130)
            .map(|i| PodSpec::v4_only(&format!("p{i}")))
            .collect();
        let fleet = Fleet::start("ns", "big", &specs)?;
        let sizes: Vec<usize> = fleet.slices().iter().map(|s| endpoints(s).len()).collect();
        assert_eq!(sizes, [100, 30]);
        Ok(())
    }
}
