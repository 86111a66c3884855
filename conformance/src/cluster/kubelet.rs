//! The stand-in kubelet: the one piece of the cluster that is not Kubernetes' own. It registers
//! the Node [`NODE_NAME`] (pod CIDRs of the cluster's families), binds every unscheduled Pod to it
//! (there is no kube-scheduler), and runs each Pod as an in-process echo server (the echo
//! contract of `conformance::echo`, identity from the container's `SERVICE_NAME`,
//! `INGRESS_NAME` and a literal `POD_NAME`, else the pod's name) on addresses of its own, taken
//! from the pod CIDRs and added to the namespace's loopback interface, listening on every TCP
//! container port. It reports `podIPs`, `phase: Running` and `Ready=True` through the Pod status
//! API, and when a Pod is deleted it stops the server, removes
//! the addresses and finalizes the deletion (grace period 0).
//!
//! A Pod may ask for its families with the annotation [`POD_SHAPE_ANNOTATION`]:
//! `{"ipv4": "listen", "ipv6": "absent"}` (words of [`crate::runner::pod_shape::PodShape`]:
//! `listen`, `closed`: an address whose ports refuse connections, `absent`: no address). A family
//! the cluster does not have is absent. A pod it cannot run (a bad annotation or port) stays
//! `Pending` with `Ready=False`, reason `DuetKubeletRefused` and the error as message.
//!
//! Pods of the Gateway API suite's echo server (image [`ECHO_BASIC_IMAGE`], any tag) run the real
//! `echo-basic` program instead when the cluster was started with one
//! ([`super::Options::echo_basic`]; see [`super::echo_basic`]): each in a network namespace of
//! its own joined to the cluster's by a veth pair ([`super::podnet`]), with addresses of every
//! cluster family, its container's `env` (values and the downward API's `fieldRef`s) and its
//! secret volumes written to the cluster's folder (a path under a secret volume's `mountPath` in
//! an env value is rewritten to that copy: there is no mount namespace). It is reported ready
//! once its port (the first container port, else 3000) accepts connections; a program that exits
//! before is a refusal as above, with the end of its log as message.
//!
//! With `echo-basic` it also serves those pods' logs ([`super::pod_logs`], `kubectl logs`).
//!
//! It runs on a thread of its own inside the cluster's network namespace, polling the Pod list
//! (a few Pods on one node: a list every 200 ms costs nothing and never misses a change).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use http::Method;
use serde_json::{json, Value};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::sync::oneshot;

use super::echo_basic::{self, EchoBasic};
use super::netns::{enter_path, local_address};
use super::podnet::PodNet;
use super::{Stack, NODE_IP_V4, NODE_IP_V6, NODE_NAME, POD_CIDR_V4, POD_CIDR_V6};
use crate::echo::{EchoOptions, EchoServer, Family, Identity};
use crate::fleet::Port;
use crate::runner::kube_api::KubeApi;
use crate::runner::pod_shape::port_of;

/// The Pod annotation choosing its families (see the module documentation).
pub const POD_SHAPE_ANNOTATION: &str = "conformance.duet.dev/pod-shape";

/// How often the Pod list is read.
const TICK: Duration = Duration::from_millis(200);

/// The running kubelet; dropping it stops every pod it runs.
#[derive(Debug)]
pub struct Kubelet {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Kubelet {
    /// Starts the kubelet thread in the namespace at `netns`, talking to the API server of
    /// `kubeconfig`; `echo_basic` runs the suite's echo pods as the real program.
    pub fn start(
        netns: &Path,
        kubeconfig: &Path,
        stack: Stack,
        echo_basic: Option<EchoBasic>,
    ) -> anyhow::Result<Kubelet> {
        let (stop, stopped) = oneshot::channel();
        let (netns, kubeconfig) = (netns.to_owned(), kubeconfig.to_owned());
        let thread = std::thread::Builder::new()
            .name("duet-kubelet".into())
            .spawn(move || run_thread(&netns, &kubeconfig, stack, echo_basic, stopped))
            .context("cannot start the kubelet thread")?;
        Ok(Kubelet {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

fn run_thread(
    netns: &Path,
    kubeconfig: &Path,
    stack: Stack,
    echo_basic: Option<EchoBasic>,
    stopped: oneshot::Receiver<()>,
) {
    let run = async {
        enter_path(netns)?;
        if let Some(echo) = &echo_basic {
            let dir = echo.dir.clone();
            tokio::spawn(async move {
                if let Err(e) = super::pod_logs::serve(dir).await {
                    tracing::warn!(error = %format!("{e:#}"), "The kubelet serves no pod logs");
                }
            });
        }
        let api = KubeApi::from_kubeconfig(kubeconfig).await?;
        let mut kubelet = State::new(api, stack);
        kubelet.echo_basic = echo_basic;
        kubelet.run(stopped).await;
        anyhow::Ok(())
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return tracing::error!(error = %e, "The kubelet cannot start a runtime"),
    };
    if let Err(e) = runtime.block_on(run) {
        tracing::error!(error = %format!("{e:#}"), "The kubelet stopped");
    }
}

/// A pod this kubelet runs.
#[derive(Debug)]
struct Running {
    ips: Vec<IpAddr>,
    _server: Option<EchoServer>,
    _closed: Vec<Socket>,
    /// A pod running a real program in a network namespace of its own (its addresses are there,
    /// not in `ips`); dropping it kills the program and removes the namespace.
    _net: Option<PodNet>,
}

impl Running {
    fn stop(self) {
        for ip in &self.ips {
            if let Err(e) = local_address("del", *ip) {
                tracing::warn!(error = %format!("{e:#}"), "The kubelet could not remove a pod address");
            }
        }
    }
}

#[derive(Debug)]
struct State {
    api: KubeApi,
    stack: Stack,
    /// Pods by uid.
    running: HashMap<String, Running>,
    /// Pods the kubelet refused (by uid): reported once, not retried.
    refused: Vec<String>,
    /// Pods waiting for a Secret (by uid): reported once.
    waiting: Vec<String>,
    allocated: u32,
    /// Runs the suite's echo pods as the real `echo-basic`, when set.
    echo_basic: Option<EchoBasic>,
}

fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// What a pod runs: its families and TCP ports, and who it says it is.
#[derive(Debug)]
struct Plan {
    v4: Port,
    v6: Port,
    ports: Vec<u16>,
    identity: Identity,
}

/// `env[name].value` of the pod's first container that sets it.
fn env_value(pod: &Value, name: &str) -> String {
    let containers = pod["spec"]["containers"].as_array().cloned();
    containers
        .unwrap_or_default()
        .iter()
        .filter_map(|c| c["env"].as_array().cloned())
        .flatten()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Reads what a pod asks for; a bad annotation or port is a refusal, never a panic.
fn plan(pod: &Value, stack: Stack) -> anyhow::Result<Plan> {
    let (mut v4, mut v6) = (Port::Listen, Port::Listen);
    if let Some(shape) = pod["metadata"]["annotations"][POD_SHAPE_ANNOTATION].as_str() {
        let shape: Value = serde_json::from_str(shape)
            .with_context(|| format!("{POD_SHAPE_ANNOTATION} is not JSON"))?;
        v4 = port_of(shape["ipv4"].as_str().unwrap_or("absent"))?;
        v6 = port_of(shape["ipv6"].as_str().unwrap_or("absent"))?;
    }
    if !stack.families().contains(&Family::V4) {
        v4 = Port::Absent;
    }
    if !stack.families().contains(&Family::V6) {
        v6 = Port::Absent;
    }
    if v4 == Port::Absent && v6 == Port::Absent {
        bail!("the pod has no address of a family this cluster has");
    }
    let mut ports = Vec::new();
    for c in pod["spec"]["containers"].as_array().into_iter().flatten() {
        for p in c["ports"].as_array().into_iter().flatten() {
            if p["protocol"].as_str().is_some_and(|proto| proto != "TCP") {
                continue;
            }
            let port = p["containerPort"].as_u64().unwrap_or(0);
            let port = u16::try_from(port)
                .ok()
                .filter(|&p| p != 0)
                .with_context(|| format!("containerPort {port} is not a TCP port"))?;
            ports.push(port);
        }
    }
    Ok(Plan {
        v4,
        v6,
        ports,
        identity: Identity {
            namespace: str_at(pod, "/metadata/namespace").to_owned(),
            ingress: env_value(pod, "INGRESS_NAME"),
            service: env_value(pod, "SERVICE_NAME"),
        },
    })
}

/// A socket bound to `addr` that never listens: connections to it are refused.
fn closed_socket(addr: SocketAddr) -> anyhow::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&addr.into())?;
    Ok(socket)
}

impl State {
    fn new(api: KubeApi, stack: Stack) -> State {
        State {
            api,
            stack,
            running: HashMap::new(),
            refused: Vec::new(),
            waiting: Vec::new(),
            allocated: 1,
            echo_basic: None,
        }
    }

    async fn run(&mut self, mut stopped: oneshot::Receiver<()>) {
        loop {
            if let Err(e) = self.register_node().await {
                tracing::warn!(error = %format!("{e:#}"), "The kubelet could not register its Node");
            } else {
                break;
            }
            tokio::select! {
                _ = &mut stopped => return,
                () = tokio::time::sleep(TICK) => {}
            }
        }
        loop {
            if let Err(e) = self.pass().await {
                tracing::warn!(error = %format!("{e:#}"), "The kubelet failed a pass");
            }
            tokio::select! {
                _ = &mut stopped => break,
                () = tokio::time::sleep(TICK) => {}
            }
        }
        for (_, pod) in self.running.drain() {
            pod.stop();
        }
    }

    async fn register_node(&self) -> anyhow::Result<()> {
        let (cidrs, addresses) = self.node_networks();
        let node = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE_NAME, "labels": {
                "kubernetes.io/hostname": NODE_NAME, "kubernetes.io/os": "linux"}},
            "spec": {"podCIDR": cidrs[0], "podCIDRs": cidrs},
        });
        if self.api.get("v1", "Node", None, NODE_NAME).await?.is_none() {
            self.api.create(node).await?;
        }
        let t = now();
        let status = json!({"status": {
            "addresses": addresses,
            "daemonEndpoints": {"kubeletEndpoint": {"Port": super::pod_logs::KUBELET_PORT}},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "duet stand-in kubelet", "lastHeartbeatTime": t, "lastTransitionTime": t}],
        }});
        self.send(
            Method::PATCH,
            &format!("/api/v1/nodes/{NODE_NAME}/status"),
            &status,
        )
        .await
        .context("cannot report the Node status")?;
        Ok(())
    }

    fn node_networks(&self) -> (Vec<&'static str>, Vec<Value>) {
        let mut cidrs = Vec::new();
        let mut addresses = Vec::new();
        for family in self.stack.families() {
            let (cidr, ip) = match family {
                Family::V4 => (POD_CIDR_V4, NODE_IP_V4),
                Family::V6 => (POD_CIDR_V6, NODE_IP_V6),
            };
            cidrs.push(cidr);
            addresses.push(json!({"type": "InternalIP", "address": ip}));
        }
        addresses.push(json!({"type": "Hostname", "address": NODE_NAME}));
        (cidrs, addresses)
    }

    async fn send(&self, method: Method, path: &str, body: &Value) -> anyhow::Result<Value> {
        let content_type = if method == Method::PATCH {
            "application/merge-patch+json"
        } else {
            "application/json"
        };
        Ok(self
            .api
            .send(method, path, content_type, serde_json::to_vec(body)?)
            .await?)
    }

    /// One look at every Pod.
    async fn pass(&mut self) -> anyhow::Result<()> {
        let list = self
            .api
            .send(Method::GET, "/api/v1/pods", "application/json", Vec::new())
            .await
            .context("cannot list Pods")?;
        let pods = list["items"].as_array().cloned().unwrap_or_default();
        let mut live = Vec::new();
        for pod in &pods {
            live.push(str_at(pod, "/metadata/uid").to_owned());
            if let Err(e) = self.sync(pod).await {
                tracing::warn!(pod = str_at(pod, "/metadata/name"), error = %format!("{e:#}"), "The kubelet failed a pod");
            }
        }
        let gone: Vec<String> = self
            .running
            .keys()
            .filter(|uid| !live.contains(uid))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(pod) = self.running.remove(&uid) {
                pod.stop();
            }
        }
        self.refused.retain(|uid| live.contains(uid));
        self.waiting
            .retain(|uid| live.contains(uid) && !self.running.contains_key(uid));
        Ok(())
    }

    async fn sync(&mut self, pod: &Value) -> anyhow::Result<()> {
        let uid = str_at(pod, "/metadata/uid").to_owned();
        let path = format!(
            "/api/v1/namespaces/{}/pods/{}",
            str_at(pod, "/metadata/namespace"),
            str_at(pod, "/metadata/name")
        );
        if !pod["metadata"]["deletionTimestamp"].is_null() {
            return self.terminate(&uid, &path).await;
        }
        match str_at(pod, "/spec/nodeName") {
            "" => return self.bind(pod, &path).await,
            NODE_NAME => {}
            _ => return Ok(()),
        }
        if self.running.contains_key(&uid) || self.refused.contains(&uid) {
            return Ok(());
        }
        let planned = match &self.echo_basic {
            Some(_) if echo_basic::runs(pod) => {
                if let Some(secret) = echo_basic::missing_secret(&self.api, pod).await? {
                    return self.wait_for_secret(&uid, &path, &secret).await;
                }
                self.run_echo_basic(pod, &uid, &path).await
            }
            _ => match plan(pod, self.stack) {
                Ok(plan) => return self.run_pod(pod, &uid, &path, plan).await,
                Err(e) => Err(e),
            },
        };
        match planned {
            Ok(()) => Ok(()),
            Err(e) => {
                self.refused.push(uid);
                let t = now();
                let status = json!({"status": {"phase": "Pending", "conditions": [
                    {"type": "Ready", "status": "False", "reason": "DuetKubeletRefused",
                     "message": format!("{e:#}"), "lastTransitionTime": t}]}});
                self.send(Method::PATCH, &format!("{path}/status"), &status)
                    .await?;
                Err(e)
            }
        }
    }

    /// Reports (once) a pod waiting for a Secret its volumes name; the next passes look again.
    async fn wait_for_secret(&mut self, uid: &str, path: &str, secret: &str) -> anyhow::Result<()> {
        if self.waiting.iter().any(|u| u == uid) {
            return Ok(());
        }
        self.waiting.push(uid.to_owned());
        let status = json!({"status": {"phase": "Pending", "conditions": [
            {"type": "Ready", "status": "False", "reason": "ContainerCreating",
             "message": format!("waiting for Secret {secret}"), "lastTransitionTime": now()}]}});
        self.send(Method::PATCH, &format!("{path}/status"), &status)
            .await?;
        Ok(())
    }

    /// Runs a pod of the suite's echo image as the real `echo-basic` in a network namespace of
    /// its own, addresses of every cluster family; reports it running once it listens.
    async fn run_echo_basic(&mut self, pod: &Value, uid: &str, path: &str) -> anyhow::Result<()> {
        let Some(echo) = self.echo_basic.clone() else {
            bail!("no echo-basic program");
        };
        self.allocated += 1;
        let n = self.allocated;
        let ips: Vec<IpAddr> = self
            .stack
            .families()
            .iter()
            .map(|&f| self.allocate(f))
            .collect();
        let mut net = PodNet::create(n, &ips)?;
        echo.start(&self.api, pod, &ips, &mut net).await?;
        self.report_running(pod, path, &ips).await?;
        self.running.insert(
            uid.to_owned(),
            Running {
                ips: Vec::new(),
                _server: None,
                _closed: Vec::new(),
                _net: Some(net),
            },
        );
        Ok(())
    }

    /// Binds an unscheduled pod to this node (what kube-scheduler would do).
    async fn bind(&self, pod: &Value, path: &str) -> anyhow::Result<()> {
        let binding = json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": str_at(pod, "/metadata/name"), "namespace": str_at(pod, "/metadata/namespace")},
            "target": {"apiVersion": "v1", "kind": "Node", "name": NODE_NAME},
        });
        self.send(Method::POST, &format!("{path}/binding"), &binding)
            .await
            .context("cannot bind the pod")?;
        Ok(())
    }

    /// Stops a deleted pod and finalizes its deletion.
    async fn terminate(&mut self, uid: &str, path: &str) -> anyhow::Result<()> {
        if let Some(pod) = self.running.remove(uid) {
            pod.stop();
        }
        let options = json!({"apiVersion": "v1", "kind": "DeleteOptions",
            "gracePeriodSeconds": 0, "preconditions": {"uid": uid}});
        match self.send(Method::DELETE, path, &options).await {
            Ok(_) => Ok(()),
            Err(e) => match e.downcast_ref::<kube::Error>() {
                Some(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
                _ => Err(e.context("cannot finalize the pod's deletion")),
            },
        }
    }

    fn allocate(&mut self, family: Family) -> IpAddr {
        let n = self.allocated;
        match family {
            Family::V4 => IpAddr::V4(Ipv4Addr::new(10, 244, (n >> 8) as u8, n as u8)),
            Family::V6 => IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0x244, 0, 0, 0, 0, n as u16)),
        }
    }

    /// Starts a pod's servers on fresh addresses and reports it running and ready; on failure
    /// nothing of it is left and the next pass tries again.
    async fn run_pod(
        &mut self,
        pod: &Value,
        uid: &str,
        path: &str,
        plan: Plan,
    ) -> anyhow::Result<()> {
        self.allocated += 1;
        let ips: Vec<(IpAddr, Port)> = [(Family::V4, plan.v4), (Family::V6, plan.v6)]
            .into_iter()
            .filter(|&(_, port)| port != Port::Absent)
            .map(|(family, port)| (self.allocate(family), port))
            .collect();
        let mut running = Running {
            ips: Vec::new(),
            _server: None,
            _closed: Vec::new(),
            _net: None,
        };
        let started = start_servers(pod, plan, &ips, &mut running);
        let reported = match started {
            Ok(()) => {
                let ips: Vec<IpAddr> = ips.iter().map(|&(ip, _)| ip).collect();
                self.report_running(pod, path, &ips).await
            }
            Err(e) => Err(e),
        };
        match reported {
            Ok(()) => {
                self.running.insert(uid.to_owned(), running);
                Ok(())
            }
            Err(e) => {
                running.stop();
                Err(e)
            }
        }
    }

    async fn report_running(&self, pod: &Value, path: &str, ips: &[IpAddr]) -> anyhow::Result<()> {
        let t = now();
        let (_, node) = self.node_networks();
        let host_ips: Vec<Value> = node
            .iter()
            .filter(|a| a["type"] == "InternalIP")
            .map(|a| json!({"ip": a["address"]}))
            .collect();
        let containers: Vec<Value> = pod["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                json!({"name": c["name"], "image": c["image"], "imageID": "",
                "containerID": format!("duet://{}", str_at(c, "/name")),
                "ready": true, "started": true, "restartCount": 0,
                "state": {"running": {"startedAt": t}}})
            })
            .collect();
        let condition =
            |kind: &str| json!({"type": kind, "status": "True", "lastTransitionTime": t});
        let status = json!({"status": {
            "phase": "Running",
            "hostIP": host_ips[0]["ip"], "hostIPs": host_ips,
            "podIP": ips[0].to_string(),
            "podIPs": ips.iter().map(|ip| json!({"ip": ip.to_string()})).collect::<Vec<_>>(),
            "startTime": t,
            "conditions": [condition("PodScheduled"), condition("Initialized"),
                condition("ContainersReady"), condition("Ready")],
            "containerStatuses": containers,
        }});
        self.send(Method::PATCH, &format!("{path}/status"), &status)
            .await
            .context("cannot report the pod running")?;
        Ok(())
    }
}

/// Adds a pod's addresses and binds its sockets, recording each in `running` as it goes.
fn start_servers(
    pod: &Value,
    plan: Plan,
    ips: &[(IpAddr, Port)],
    running: &mut Running,
) -> anyhow::Result<()> {
    let mut listen = Vec::new();
    for &(ip, port) in ips {
        local_address("add", ip)?;
        running.ips.push(ip);
        for &p in &plan.ports {
            let addr = SocketAddr::new(ip, p);
            match port {
                Port::Listen => listen.push(addr),
                _ => running._closed.push(closed_socket(addr)?),
            }
        }
    }
    // The echo server names itself by `POD_NAME` (upstream sets it from `metadata.name`, which
    // is what a `fieldRef` gives here too); a literal value wins, as in a real container.
    let mut name = env_value(pod, "POD_NAME");
    if name.is_empty() {
        name = str_at(pod, "/metadata/name").to_owned();
    }
    running._server = Some(EchoServer::bind(
        plan.identity,
        &[(name, listen)],
        EchoOptions::default(),
    )?);
    Ok(())
}
