//! In-process echo pods of one Service on ephemeral loopback ports (`127.0.0.1:0`, `[::1]:0`), and
//! the Service and per-family EndpointSlices that describe them.

use std::net::SocketAddr;

use anyhow::Context;
use serde_json::Value;
use socket2::{Domain, Protocol, Socket, Type};

use crate::echo::{self, EchoOptions, EchoServer, Family, Identity, PodListeners};
use crate::manifests::{endpoint_slice, service, Endpoint};

/// The Service port every fleet exposes: named `http`, number 8080.
pub const SERVICE_PORT: (&str, u16) = ("http", 8080);

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
    options: EchoOptions,
    _closed: Vec<Socket>,
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
        for spec in specs {
            let mut pod = Pod {
                name: spec.name.clone(),
                uid: format!("uid-{namespace}-{service}-{}", spec.name),
                v4: None,
                v6: None,
                ready: spec.ready,
            };
            let mut mine = Vec::new();
            for family in Family::BOTH {
                let addr = match spec.port(family) {
                    Port::Absent => None,
                    Port::Listen => {
                        let listener = echo::bind(SocketAddr::new(family.loopback(), 0))
                            .with_context(|| format!("binding pod {} on {family}", spec.name))?;
                        let addr = listener.local_addr()?;
                        mine.push(listener);
                        Some(addr)
                    }
                    Port::Closed => {
                        let (addr, socket) = closed_port(family)?;
                        closed.push(socket);
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
        let server = EchoServer::serve(identity, listeners, options.clone())?;
        Ok(Fleet {
            options,
            namespace: namespace.into(),
            service: service.into(),
            pods,
            listening,
            server: Some(server),
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

    /// One EndpointSlice per pod and family (each pod listens on its own ports), named
    /// `<service>-<pod>-<ipv4|ipv6>`, joined by `targetRef.uid`.
    pub fn slices(&self) -> Vec<Value> {
        let mut docs = Vec::new();
        for pod in &self.pods {
            for family in Family::BOTH {
                if let Some(addr) = pod.addr(family) {
                    docs.push(endpoint_slice(
                        &self.namespace,
                        &self.service,
                        &format!("{}-{}-{}", self.service, pod.name, family),
                        family,
                        SERVICE_PORT.0,
                        addr.port(),
                        &[Endpoint {
                            pod: pod.name.clone(),
                            uid: pod.uid.clone(),
                            ip: addr.ip(),
                            ready: pod.ready,
                        }],
                    ));
                }
            }
        }
        docs
    }

    /// Stops serving: open connections are cut and the ports refuse connections (until the
    /// kernel hands them to someone else, or [`Fleet::restart`]).
    pub fn stop(&mut self) {
        self.server = None;
    }

    /// Stops serving (cutting open connections) and serves again on the same addresses, like
    /// pods whose process restarted.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        if let Some(server) = self.server.take() {
            server.close().await;
        }
        let identity = Identity {
            namespace: self.namespace.clone(),
            ingress: String::new(),
            service: self.service.clone(),
        };
        let server = EchoServer::bind(identity, &self.listening, self.options.clone())?;
        self.server = Some(server);
        Ok(())
    }
}
