//! A real Kubernetes control plane on one machine: etcd, kube-apiserver and
//! kube-controller-manager built from their Go modules (`conformance/cluster/build.sh`), run in a
//! network namespace of their own with a stand-in kubelet ([`kubelet`]) that runs pods as echo
//! servers on real pod addresses of both families, and a stand-in load-balancer controller
//! ([`loadbalancer`]) that gives LoadBalancer Services addresses of both families and forwards
//! their traffic with nftables. With a real node ([`node`], `Options::real_node`) MetalLB in L2
//! mode ([`metallb`], `LoadBalancerKind::MetalLb`) can take the stand-in's place.
//!
//! Reachability: [`Cluster::start`] moves the calling thread into the namespace, so the API
//! server (`https://127.0.0.1:6443`, or `[::1]` on an IPv6-only cluster), every pod address and
//! every process the thread starts (the control plane, duet under test) share one network; a
//! test drives it from a current-thread Tokio runtime. Another thread or process joins with
//! [`netns::enter_path`] / `nsenter --net=PATH` on [`Cluster::netns_path`].
//!
//! Cleanup: every process runs under `setpriv --pdeathsig KILL`, so it dies with the thread that
//! started it however that thread ends; dropping the [`Cluster`] kills them at once. The
//! namespace has no name and disappears with its last member.

pub mod echo_basic;
pub mod faults;
pub mod kubelet;
pub mod loadbalancer;
pub mod metallb;
pub mod netns;
pub mod node;
mod pki;
mod pod_logs;
pub mod podnet;
pub mod shared;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use http::Method;

use crate::echo::Family;
use crate::runner::kube_api::KubeApi;
pub use faults::{Fault, FaultProxy};
pub use kubelet::POD_SHAPE_ANNOTATION;
pub use netns::NetNs;
pub use shared::{shared, SharedCluster};

/// The one node's name.
pub const NODE_NAME: &str = "duet-node";
/// The IPv4 pod CIDR (the node holds its first address).
pub const POD_CIDR_V4: &str = "10.244.0.0/16";
/// The IPv6 pod CIDR (the node holds its first address).
pub const POD_CIDR_V6: &str = "fd00:10:244::/64";
/// The node's IPv4 address (the API server advertises it).
pub const NODE_IP_V4: &str = "10.244.0.1";
/// The node's IPv6 address.
pub const NODE_IP_V6: &str = "fd00:10:244::1";
/// The IPv4 Service range.
pub const SERVICE_CIDR_V4: &str = "10.96.0.0/16";
/// The IPv6 Service range.
pub const SERVICE_CIDR_V6: &str = "fd00:10:96::/112";

/// `setpriv` (util-linux) gives every process a parent-death signal without `unsafe` code here.
const SETPRIV: &str = "/usr/bin/setpriv";
/// How long the control plane may take to answer.
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// The families of a cluster's Service and pod networks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Stack {
    /// IPv4 and IPv6, IPv4 primary.
    Dual,
    /// IPv4 and IPv6, IPv6 primary (the Service range lists IPv6 first, so `PreferDualStack`
    /// Services get `ipFamilies: [IPv6, IPv4]`). Not offered by `duet-cluster up`.
    #[value(skip)]
    DualIpv6,
    /// IPv4 only.
    Ipv4,
    /// IPv6 only.
    Ipv6,
}

impl Stack {
    /// Its families, primary first.
    pub fn families(self) -> &'static [Family] {
        match self {
            Stack::Dual => &Family::BOTH,
            Stack::DualIpv6 => &[Family::V6, Family::V4],
            Stack::Ipv4 => &[Family::V4],
            Stack::Ipv6 => &[Family::V6],
        }
    }

    /// `--service-cluster-ip-range`.
    fn service_range(self) -> String {
        let ranges: Vec<&str> = self
            .families()
            .iter()
            .map(|f| match f {
                Family::V4 => SERVICE_CIDR_V4,
                Family::V6 => SERVICE_CIDR_V6,
            })
            .collect();
        ranges.join(",")
    }

    /// The node address the API server advertises (of the primary family).
    fn advertise_address(self) -> &'static str {
        match self.families()[0] {
            Family::V4 => NODE_IP_V4,
            Family::V6 => NODE_IP_V6,
        }
    }

    /// The API server URL in the kubeconfig.
    fn server_url(self) -> &'static str {
        match self.families()[0] {
            Family::V4 => "https://127.0.0.1:6443",
            Family::V6 => "https://[::1]:6443",
        }
    }
}

/// What gives LoadBalancer Services their addresses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LoadBalancerKind {
    /// The stand-in controller ([`loadbalancer`]): addresses of its own pools, forwarded by its
    /// own nftables rules.
    #[default]
    StandIn,
    /// MetalLB in L2 mode ([`metallb`]) on the real node: addresses of the node's uplink subnets,
    /// announced by ARP and NDP on the uplink, forwarded by kube-proxy. Needs `real_node`.
    MetalLb,
}

/// The release channel of the Gateway API CRDs a cluster gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum GatewayChannel {
    /// The standard channel: the stable kinds and fields.
    #[default]
    Standard,
    /// The experimental channel: the same kinds with their experimental fields (HTTPRoute
    /// retries among them), and the experimental kinds.
    Experimental,
}

impl GatewayChannel {
    /// The channel's name, as `cmd/crds -channel` and the CRDs' annotation spell it.
    pub fn name(self) -> &'static str {
        match self {
            GatewayChannel::Standard => "standard",
            GatewayChannel::Experimental => "experimental",
        }
    }
}

/// How to start a cluster.
#[derive(Clone, Debug)]
pub struct Options {
    /// The network families.
    pub stack: Stack,
    /// Where etcd, kube-apiserver and kube-controller-manager are (default: what
    /// `conformance/cluster/build.sh` builds or reuses).
    pub bin_dir: Option<PathBuf>,
    /// Where the certificates, kubeconfig, etcd data and logs go (default: a temporary folder
    /// removed on drop).
    pub dir: Option<PathBuf>,
    /// Flags added to kube-apiserver's own (e.g. `--watch-cache=false` and a short
    /// `--etcd-compaction-interval`, to make `410 Gone` happen).
    pub apiserver_flags: Vec<String>,
    /// Install the Gateway API CRDs ([`Cluster::install_gateway_crds`]) before
    /// kube-controller-manager starts, so its garbage collector watches Gateways from the start
    /// (CRDs added later are picked up at its next discovery resync, up to 30 s on).
    pub gateway_api: bool,
    /// The release channel of those CRDs.
    pub gateway_channel: GatewayChannel,
    /// The `echo-basic` program ([`echo_basic::build`]): when set, the kubelet runs pods of the
    /// Gateway API suite's echo image ([`echo_basic::ECHO_BASIC_IMAGE`]) as that real program,
    /// each in a network namespace of its own; every other pod stays an in-process echo server.
    pub echo_basic: Option<PathBuf>,
    /// Run a real node ([`node`]: kubelet, containerd, CNI, kube-proxy, kube-scheduler) instead
    /// of the stand-in kubelet: pods are containers of images imported with
    /// [`Cluster::import_image`].
    pub real_node: bool,
    /// The load balancer (MetalLB only with `real_node`).
    pub load_balancer: LoadBalancerKind,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            stack: Stack::Dual,
            bin_dir: None,
            dir: None,
            apiserver_flags: Vec::new(),
            gateway_api: false,
            gateway_channel: GatewayChannel::Standard,
            echo_basic: None,
            real_node: false,
            load_balancer: LoadBalancerKind::StandIn,
        }
    }
}

/// A running cluster; dropping it stops everything.
#[derive(Debug)]
pub struct Cluster {
    // Field order is drop order: the load balancer, the kubelet, then the processes (newest
    // first), then the namespace holder and the folder.
    loadbalancer: Option<loadbalancer::LoadBalancer>,
    kubelet: Option<kubelet::Kubelet>,
    node: Option<node::Node>,
    processes: Vec<(&'static str, Child)>,
    netns: NetNs,
    stack: Stack,
    dir: PathBuf,
    kubeconfig: PathBuf,
    control_plane: String,
    /// The API server's program and arguments, to start it again.
    apiserver: (PathBuf, Vec<String>),
    temp: Option<tempfile::TempDir>,
    /// Removes the temporary folder when the starting thread ends without dropping the
    /// cluster (a runner that exits, or is killed).
    reaper: Option<Child>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        drop(self.loadbalancer.take());
        drop(self.kubelet.take());
        drop(self.node.take());
        for (_, child) in self.processes.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
        drop(self.temp.take());
        if let Some(mut reaper) = self.reaper.take() {
            // SIGTERM: it stops its sleep and removes the folder, already gone.
            let _ = Command::new("kill").arg(reaper.id().to_string()).status();
            let _ = reaper.wait();
        }
    }
}

/// `setpriv --pdeathsig KILL -- PROGRAM ARGS`: the process gets SIGKILL when the thread that
/// started it ends.
pub fn command(program: &str, args: &[&str]) -> anyhow::Result<Command> {
    if !Path::new(SETPRIV).exists() {
        bail!(
            "{SETPRIV} (util-linux) is missing: the cluster's processes need a parent-death signal"
        );
    }
    let mut cmd = Command::new(SETPRIV);
    cmd.args(["--pdeathsig", "KILL", "--", program]).args(args);
    Ok(cmd)
}

/// A process that removes `dir` (the cluster's etcd data, certificates and logs: over 100 MB)
/// once the thread that started it ends, however it ends: its parent-death signal is SIGTERM,
/// which it traps, and it waits a moment for etcd (killed at the same time) to be gone. The
/// cluster's own drop removes the folder first in the ordinary case.
fn spawn_reaper(dir: &Path) -> anyhow::Result<Child> {
    let script =
        r#"trap 'kill $p; sleep 1; rm -rf -- "$0"; exit 0' TERM; sleep 2147483647 & p=$!; wait $p"#;
    Command::new(SETPRIV)
        .args(["--pdeathsig", "TERM", "--", "sh", "-c", script])
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start the folder reaper (setpriv, sh)")
}

/// Runs `conformance/cluster/build.sh` (which reuses an up-to-date build) and returns the folder
/// holding the binaries. `DUET_CLUSTER_BIN` names a folder of prebuilt binaries instead.
pub fn build_control_plane() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("DUET_CLUSTER_BIN").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        if dir.join("stamp").exists() {
            return Ok(dir);
        }
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("cluster/build.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({})", script.display(), out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = stdout.lines().last().unwrap_or_default().trim();
    Ok(PathBuf::from(dir))
}

impl Cluster {
    /// Starts a cluster and waits until it is usable: the API server ready, the controllers
    /// running (the `default` ServiceAccount exists) and the node registered. Moves the calling
    /// thread into the cluster's network namespace (see the module documentation).
    pub async fn start(options: Options) -> anyhow::Result<Cluster> {
        let bin = match &options.bin_dir {
            Some(dir) => dir.clone(),
            None => build_control_plane()?,
        };
        let (dir, temp, reaper) = match &options.dir {
            Some(dir) => (dir.clone(), None, None),
            None => {
                let temp = tempfile::Builder::new().prefix("duet-cluster-").tempdir()?;
                let reaper = spawn_reaper(temp.path())?;
                (temp.path().to_owned(), Some(temp), Some(reaper))
            }
        };
        std::fs::create_dir_all(dir.join("logs"))?;
        let netns = NetNs::create()?;
        netns.enter()?;
        setup_network(options.stack)?;
        let pki = pki::Pki::generate(&dir.join("pki"))?;
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(&kubeconfig, pki.kubeconfig(options.stack.server_url()))?;
        let mut cluster = Cluster {
            loadbalancer: None,
            kubelet: None,
            node: None,
            processes: Vec::new(),
            netns,
            stack: options.stack,
            dir,
            kubeconfig,
            control_plane: String::new(),
            apiserver: (bin.join("kube-apiserver"), Vec::new()),
            temp,
            reaper,
        };
        cluster.spawn("etcd", &bin.join("etcd"), &cluster.etcd_args())?;
        cluster.apiserver.1 = cluster.apiserver_args(&pki);
        cluster
            .apiserver
            .1
            .extend(options.apiserver_flags.iter().cloned());
        let (program, args) = cluster.apiserver.clone();
        cluster.spawn("kube-apiserver", &program, &args)?;
        let api = KubeApi::from_kubeconfig(&cluster.kubeconfig).await?;
        let apiserver_version = cluster.wait_ready(&api).await?;
        if options.gateway_api {
            cluster.install_gateway_crds(options.gateway_channel)?;
        }
        let kcm_args = cluster.controller_manager_args(options.real_node.then_some(&pki));
        cluster.spawn(
            "kube-controller-manager",
            &bin.join("kube-controller-manager"),
            &kcm_args,
        )?;
        if options.load_balancer == LoadBalancerKind::MetalLb && !options.real_node {
            bail!("MetalLB runs on the real node only (Options::real_node)");
        }
        if options.real_node {
            let bin = cluster.start_node(&pki, &api).await?;
            cluster
                .start_load_balancer(options.load_balancer, &bin, &api)
                .await?;
        } else {
            cluster.start_stand_ins(&options)?;
        }
        cluster.wait_controllers(&api).await?;
        let kcm_version = version_of(&bin.join("kube-controller-manager"))?;
        cluster.control_plane =
            format!("kube-apiserver {apiserver_version}, kube-controller-manager {kcm_version}");
        Ok(cluster)
    }

    /// The real node's load balancer: the stand-in, or MetalLB deployed on the node.
    async fn start_load_balancer(
        &mut self,
        kind: LoadBalancerKind,
        bin: &Path,
        api: &KubeApi,
    ) -> anyhow::Result<()> {
        match kind {
            LoadBalancerKind::StandIn => {
                self.loadbalancer = Some(loadbalancer::LoadBalancer::start(
                    self.netns.path(),
                    &self.kubeconfig,
                )?);
                Ok(())
            }
            LoadBalancerKind::MetalLb => {
                let node = self.node.as_ref().context("no real node")?;
                metallb::deploy(api, node, bin, &self.dir, self.stack).await
            }
        }
    }

    /// The real node, its identities written beside the admin kubeconfig; returns the folder of
    /// its binaries.
    async fn start_node(&mut self, pki: &pki::Pki, api: &KubeApi) -> anyhow::Result<PathBuf> {
        let bin = node::build()?;
        let server = self.stack.server_url();
        let write = |name: &str, user: &str, groups: &[&str]| -> anyhow::Result<PathBuf> {
            let path = self.dir.join(format!("{name}.kubeconfig"));
            std::fs::write(&path, pki.client_kubeconfig(server, user, groups))?;
            Ok(path)
        };
        let credentials = node::Credentials {
            kubelet: write(
                "kubelet",
                &format!("system:node:{NODE_NAME}"),
                &["system:nodes"],
            )?,
            proxy: write("kube-proxy", "system:kube-proxy", &[])?,
            scheduler: write("kube-scheduler", "system:kube-scheduler", &[])?,
            ca: pki.ca.clone(),
        };
        let node = node::Node::start(&self.dir, &bin, self.stack, &credentials, api).await?;
        self.node = Some(node);
        Ok(bin)
    }

    /// The stand-in kubelet and load balancer.
    fn start_stand_ins(&mut self, options: &Options) -> anyhow::Result<()> {
        let cluster = self;
        let echo_basic = options
            .echo_basic
            .clone()
            .map(|program| echo_basic::EchoBasic {
                program,
                dir: cluster.dir.clone(),
            });
        cluster.kubelet = Some(kubelet::Kubelet::start(
            cluster.netns.path(),
            &cluster.kubeconfig,
            cluster.stack,
            echo_basic,
        )?);
        cluster.loadbalancer = Some(loadbalancer::LoadBalancer::start(
            cluster.netns.path(),
            &cluster.kubeconfig,
        )?);
        Ok(())
    }

    /// The real node, when the cluster runs one.
    pub fn node(&self) -> Option<&node::Node> {
        self.node.as_ref()
    }

    /// The real node, to restart its processes.
    pub fn node_mut(&mut self) -> Option<&mut node::Node> {
        self.node.as_mut()
    }

    /// Loads an OCI image archive into the real node's containerd.
    pub fn import_image(&self, archive: &Path) -> anyhow::Result<()> {
        self.node
            .as_ref()
            .context("the cluster runs no real node")?
            .import_image(archive)
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The cluster's folder (certificates, kubeconfig, etcd data, `logs/`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The network families.
    pub fn stack(&self) -> Stack {
        self.stack
    }

    /// `kube-apiserver v1.37.2, kube-controller-manager v1.37.2`: what runs, as it reports itself.
    pub fn control_plane(&self) -> &str {
        &self.control_plane
    }

    /// `/proc/PID/ns/net` of the cluster's network namespace.
    pub fn netns_path(&self) -> &Path {
        self.netns.path()
    }

    /// The pid of the process holding the namespace.
    pub fn netns_pid(&self) -> u32 {
        self.netns.pid()
    }

    /// An admin client.
    pub async fn api(&self) -> anyhow::Result<KubeApi> {
        KubeApi::from_kubeconfig(&self.kubeconfig).await
    }

    /// Fails when a control-plane process has exited, with the end of its log.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        if let Some(node) = &mut self.node {
            node.check_running()?;
        }
        for (name, child) in &mut self.processes {
            if let Some(status) = child.try_wait()? {
                let log = tail(&self.dir.join("logs").join(format!("{name}.log")));
                bail!("{name} exited ({status}):\n{log}");
            }
        }
        Ok(())
    }

    /// Kills kube-apiserver (SIGKILL), waits `down_for`, starts it again with the same
    /// arguments and waits until it is ready. Clients see refused connections meanwhile, then
    /// the same objects and resource versions (etcd keeps running).
    pub async fn restart_apiserver(&mut self, down_for: Duration) -> anyhow::Result<()> {
        let i = self
            .processes
            .iter()
            .position(|(name, _)| *name == "kube-apiserver")
            .context("no kube-apiserver runs")?;
        let (_, mut child) = self.processes.remove(i);
        child.kill()?;
        child.wait()?;
        tokio::time::sleep(down_for).await;
        let (program, args) = self.apiserver.clone();
        self.spawn("kube-apiserver", &program, &args)?;
        let api = self.api().await?;
        self.wait_ready(&api).await?;
        Ok(())
    }

    /// Creates (or updates) the Gateway API CRDs of a channel of the version
    /// `conformance/gateway/go.mod` pins and waits until they are Established:
    /// `go run ./cmd/crds apply` in `conformance/gateway/` (the Go module cache must hold the
    /// module: the namespace has no network).
    pub fn install_gateway_crds(&self, channel: GatewayChannel) -> anyhow::Result<()> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("gateway");
        let out = Command::new("go")
            .args(["run", "-mod=readonly", "./cmd/crds", "apply", "-kubeconfig"])
            .arg(&self.kubeconfig)
            .args(["-channel", channel.name()])
            .current_dir(&dir)
            .env("GOPROXY", "off")
            .stdin(Stdio::null())
            .output()
            .context("cannot run go (the Gateway API CRDs are installed by conformance/gateway/cmd/crds)")?;
        if !out.status.success() {
            bail!(
                "go run ./cmd/crds apply failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    fn spawn(&mut self, name: &'static str, program: &Path, args: &[String]) -> anyhow::Result<()> {
        if !program.exists() {
            bail!(
                "{} is missing: run conformance/cluster/build.sh",
                program.display()
            );
        }
        // Appended: a restarted process keeps the log of its first run.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("logs").join(format!("{name}.log")))?;
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let child = command(&program.to_string_lossy(), &args)?
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {name}"))?;
        self.processes.push((name, child));
        Ok(())
    }

    fn etcd_args(&self) -> Vec<String> {
        let data = self.dir.join("etcd");
        vec![
            format!("--data-dir={}", data.display()),
            "--name=duet".into(),
            "--listen-client-urls=http://127.0.0.1:2379".into(),
            "--advertise-client-urls=http://127.0.0.1:2379".into(),
            "--listen-peer-urls=http://127.0.0.1:2380".into(),
            "--initial-advertise-peer-urls=http://127.0.0.1:2380".into(),
            "--initial-cluster=duet=http://127.0.0.1:2380".into(),
            "--unsafe-no-fsync".into(),
            "--log-level=warn".into(),
        ]
    }

    fn apiserver_args(&self, pki: &pki::Pki) -> Vec<String> {
        let p = |path: &Path| path.display().to_string();
        vec![
            "--etcd-servers=http://127.0.0.1:2379".into(),
            "--bind-address=::".into(),
            "--secure-port=6443".into(),
            format!("--advertise-address={}", self.stack.advertise_address()),
            format!("--service-cluster-ip-range={}", self.stack.service_range()),
            "--authorization-mode=Node,RBAC".into(),
            format!("--client-ca-file={}", p(&pki.ca)),
            format!("--tls-cert-file={}", p(&pki.serving.0)),
            format!("--tls-private-key-file={}", p(&pki.serving.1)),
            format!("--service-account-key-file={}", p(&pki.sa_pub)),
            format!("--service-account-signing-key-file={}", p(&pki.sa_key)),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--cert-dir={}", p(&self.dir.join("pki"))),
            "--profiling=false".into(),
            // The stand-in kubelet's Node names no resolvable host name: logs by its address.
            "--kubelet-preferred-address-types=InternalIP".into(),
            // A real kubelet refuses anonymous clients: `pods/log` (the suite reads a mirror
            // pod's log) needs the API server to present a certificate it trusts.
            format!("--kubelet-client-certificate={}", p(&pki.kubelet_client.0)),
            format!("--kubelet-client-key={}", p(&pki.kubelet_client.1)),
        ]
    }

    /// With a real node (`pki` given), also DaemonSets, the `kube-root-ca.crt` ConfigMap every
    /// projected service-account volume needs, and the garbage collection of pods.
    fn controller_manager_args(&self, pki: Option<&pki::Pki>) -> Vec<String> {
        let mut args = vec![
            format!("--kubeconfig={}", self.kubeconfig.display()),
            // Deployments become ReplicaSets become Pods; Services get EndpointSlices; deleted
            // namespaces and owners take their objects along; namespaces get a `default`
            // ServiceAccount, without which no Pod is admitted.
            "--controllers=deployment-controller,replicaset-controller,endpointslice-controller,\
             namespace-controller,garbage-collector-controller,serviceaccount-controller"
                .into(),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
            "--profiling=false".into(),
        ];
        if let Some(pki) = pki {
            args[1].push_str(
                ",daemonset-controller,root-ca-certificate-publisher-controller,node-lifecycle-controller,\
                 pod-garbage-collector-controller",
            );
            args.push(format!("--root-ca-file={}", pki.ca.display()));
        }
        args
    }

    /// Waits for `/readyz` and returns the API server's `gitVersion`.
    async fn wait_ready(&mut self, api: &KubeApi) -> anyhow::Result<String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            self.check_running()?;
            if let Ok(version) = api
                .send(Method::GET, "/version", "application/json", Vec::new())
                .await
            {
                let ready = api
                    .client()
                    .request_text(http::Request::get("/readyz").body(Vec::new())?)
                    .await;
                if ready.is_ok_and(|body| body.trim() == "ok") {
                    return Ok(version["gitVersion"]
                        .as_str()
                        .unwrap_or("unknown")
                        .to_owned());
                }
            }
            if Instant::now() > deadline {
                let log = tail(&self.dir.join("logs/kube-apiserver.log"));
                bail!("kube-apiserver not ready within {START_TIMEOUT:?}:\n{log}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits for the controllers (the `default` ServiceAccount) and the node.
    async fn wait_controllers(&mut self, api: &KubeApi) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            self.check_running()?;
            let sa = api
                .send(
                    Method::GET,
                    "/api/v1/namespaces/default/serviceaccounts/default",
                    "application/json",
                    Vec::new(),
                )
                .await;
            let node = api.get("v1", "Node", None, NODE_NAME).await;
            let node_ready = node.ok().flatten().is_some_and(|n| {
                n["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
            if sa.is_ok() && node_ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                let log = tail(&self.dir.join("logs/kube-controller-manager.log"));
                bail!("no default ServiceAccount or Ready node within {START_TIMEOUT:?}:\n{log}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The interface holding the node's and the pods' addresses: the namespace's loopback (every
/// address on it is local to the namespace, and it needs no `dummy` kernel module, which some
/// kernels lack).
pub const POD_INTERFACE: &str = "lo";

/// Loopback up with the node's addresses (the kubelet adds each pod's).
fn setup_network(stack: Stack) -> anyhow::Result<()> {
    netns::ip(&["link", "set", "lo", "up"])?;
    for family in stack.families() {
        match family {
            Family::V4 => netns::ip(&[
                "addr",
                "add",
                &format!("{NODE_IP_V4}/32"),
                "dev",
                POD_INTERFACE,
            ])?,
            Family::V6 => netns::ip(&[
                "-6",
                "addr",
                "add",
                &format!("{NODE_IP_V6}/128"),
                "dev",
                POD_INTERFACE,
                "nodad",
            ])?,
        }
    }
    Ok(())
}

/// `v1.37.2` from `PROGRAM --version` (`Kubernetes v1.37.2`).
pub(crate) fn version_of(program: &Path) -> anyhow::Result<String> {
    let out = Command::new(program)
        .arg("--version")
        .output()
        .with_context(|| format!("cannot run {} --version", program.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .split_whitespace()
        .last()
        .unwrap_or("unknown")
        .to_owned())
}

/// The last 40 lines of a log.
pub(crate) fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
