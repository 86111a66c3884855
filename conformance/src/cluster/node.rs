//! A real node for the test cluster: kube-scheduler, the kubelet, containerd 2 with runc, the CNI
//! plugins (bridge with host-local addresses of both families, portmap, loopback) and kube-proxy
//! in nftables mode, built from their Go modules by `conformance/node/build.sh`. Pods are
//! containers in network namespaces of their own, behind the bridge `cni0` of the cluster's
//! namespace, which plays the node's host namespace.
//!
//! Isolation from the machine: every process runs in the cluster's network namespace and in a
//! mount namespace of the node's own (so the kubelet's and containerd's mounts vanish with it);
//! containers live in the cgroup `/duet-node-PID` of every hierarchy (`cgroupRoot`), containerd
//! and its shims in its `runtime` child. Teardown kills what the cgroup holds and removes it; a
//! reaper does the same when the starting thread dies without dropping the node. The kubelet
//! sets `vm.overcommit_memory`, `kernel.panic` and `kernel.panic_on_oops` for the whole machine
//! (its `protectKernelDefaults: false`); the node puts back what they were once it is up and on
//! teardown.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::netns::{self, NetNs};
use super::{command, Stack, NODE_IP_V4, NODE_IP_V6, NODE_NAME};
use crate::echo::Family;

/// The pods' IPv4 range (host-local), inside the cluster's IPv4 pod CIDR; the bridge holds its
/// first address.
pub const POD_RANGE_V4: &str = "10.244.1.0/24";
/// The pods' IPv6 range.
pub const POD_RANGE_V6: &str = "fd00:10:244:1::/64";
/// The node's uplink network (`eth0`, its default route), shared with the namespace outside it
/// ([`Node::outside`]): the node holds `.2`, the outside `.1`.
pub const UPLINK_V4: (&str, &str) = ("10.255.0.2", "10.255.0.1");
/// The IPv6 uplink (a /64).
pub const UPLINK_V6: (&str, &str) = ("fd00:10:255::2", "fd00:10:255::1");
/// The sandbox image containerd runs for every pod (built from the kubernetes module's pause.c).
pub const PAUSE_IMAGE: &str = "duet.local/pause:3.10";

/// The machine-wide sysctls the kubelet changes at start.
const KUBELET_SYSCTLS: &[&str] = &[
    "vm/overcommit_memory",
    "kernel/panic",
    "kernel/panic_on_oops",
];
/// How long the node may take to become Ready.
const NODE_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs `conformance/node/build.sh` (which reuses an up-to-date build) and returns the folder
/// holding the binaries. `DUET_NODE_BIN` names a folder of prebuilt binaries instead.
pub fn build() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("DUET_NODE_BIN").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("node/build.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({})", script.display(), out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    Ok(PathBuf::from(
        stdout.lines().last().unwrap_or_default().trim(),
    ))
}

/// The node's identities: a kubeconfig for each of the kubelet, kube-proxy and kube-scheduler.
#[derive(Debug)]
pub struct Credentials {
    /// `system:node:duet-node` in `system:nodes`.
    pub kubelet: PathBuf,
    /// `system:kube-proxy`.
    pub proxy: PathBuf,
    /// `system:kube-scheduler`.
    pub scheduler: PathBuf,
    /// The cluster CA (the kubelet checks client certificates with it).
    pub ca: PathBuf,
}

/// A running node; dropping it stops every container and process and removes its cgroups.
#[derive(Debug)]
pub struct Node {
    // Drop order: the processes (newest first), the containers, the mount namespace.
    processes: Vec<Process>,
    outside: Option<NetNs>,
    mounts: Child,
    reaper: Child,
    cgroup: String,
    dir: PathBuf,
    bin: PathBuf,
    sysctls: Vec<(&'static str, String)>,
    versions: String,
}

impl Drop for Node {
    fn drop(&mut self) {
        for process in self.processes.iter_mut().rev() {
            let _ = process.child.kill();
            let _ = process.child.wait();
        }
        kill_cgroup(&self.cgroup);
        let _ = self.mounts.kill();
        let _ = self.mounts.wait();
        remove_cgroup(&self.cgroup);
        restore_sysctls(&self.sysctls);
        let _ = self.reaper.kill();
        let _ = self.reaper.wait();
    }
}

impl Node {
    /// Starts the node in the calling thread's (the cluster's) network namespace and waits until
    /// it is Ready. `dir/node` holds its state and `dir/logs` its logs.
    pub async fn start(
        dir: &Path,
        bin: &Path,
        stack: Stack,
        credentials: &Credentials,
        api: &crate::runner::kube_api::KubeApi,
    ) -> anyhow::Result<Node> {
        let root = dir.join("node");
        std::fs::create_dir_all(&root)?;
        let sysctls = save_sysctls();
        let (mounts, reaper, cgroup) = isolate(&root, &sysctls)?;
        let mut node = Node {
            processes: Vec::new(),
            outside: None,
            mounts,
            reaper,
            cgroup,
            dir: dir.to_owned(),
            bin: bin.to_owned(),
            sysctls,
            versions: String::new(),
        };
        node.network(stack)?;
        node.start_containerd(&root)?;
        node.import_image(&pause_image(bin, &root)?)?;
        node.start_kubelet(&root, stack, credentials)?;
        node.start_proxy(&root, stack, credentials)?;
        let scheduler = [
            format!("--kubeconfig={}", credentials.scheduler.display()),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
            "--profiling=false".into(),
        ];
        node.spawn("kube-scheduler", "kube-scheduler", &scheduler)?;
        node.wait_ready(api).await?;
        restore_sysctls(&node.sysctls);
        node.versions = node.describe()?;
        Ok(node)
    }

    /// `kubelet v1.37.2, containerd v2.4.2, kube-proxy nftables`.
    pub fn versions(&self) -> &str {
        &self.versions
    }

    /// containerd's socket.
    pub fn containerd_socket(&self) -> PathBuf {
        self.dir.join("node/containerd/containerd.sock")
    }

    /// Loads an OCI image archive into containerd's `k8s.io` namespace, where the kubelet finds
    /// it (pods name it with `imagePullPolicy: IfNotPresent` or `Never`).
    pub fn import_image(&self, archive: &Path) -> anyhow::Result<()> {
        let socket = self.containerd_socket();
        let out = self
            .in_mounts(&self.bin.join("ctr"))
            .args(["--address", &socket.to_string_lossy(), "-n", "k8s.io"])
            .args(["images", "import", "--no-unpack=false"])
            .arg(archive)
            .stdin(Stdio::null())
            .output()
            .context("cannot run ctr")?;
        if !out.status.success() {
            bail!(
                "ctr images import {} failed: {}",
                archive.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// Fails when a node process has exited, with the end of its log.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        for Process { name, child, .. } in &mut self.processes {
            if let Some(status) = child.try_wait()? {
                let log = super::tail(&self.dir.join("logs").join(format!("{name}.log")));
                bail!("{name} exited ({status}):\n{log}");
            }
        }
        Ok(())
    }

    /// Kills `name` (`kubelet`, `containerd`, `kube-proxy`, `kube-scheduler`) with SIGKILL,
    /// waits `down_for` and starts it again with the same arguments. Containers keep running
    /// meanwhile (their shims are not containerd's children).
    pub fn restart(&mut self, name: &str, down_for: Duration) -> anyhow::Result<()> {
        let i = self
            .processes
            .iter()
            .position(|p| p.name == name)
            .with_context(|| format!("no {name} runs on the node"))?;
        let mut process = self.processes.remove(i);
        process.child.kill()?;
        process.child.wait()?;
        std::thread::sleep(down_for);
        self.spawn_program(process.name, &process.program, &process.args)
    }

    /// A command run inside the node's mount namespace (and the caller's network namespace).
    fn in_mounts(&self, program: &Path) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--mount=/proc/{}/ns/mnt", self.mounts.id()))
            .arg("--")
            .arg(program);
        cmd
    }

    /// Bridged pod traffic goes through netfilter (kube-proxy's rules see pod-to-Service
    /// packets between pods of one bridge) and the namespace forwards both families.
    fn network(&mut self, stack: Stack) -> anyhow::Result<()> {
        let mut settings = vec![
            ("net/ipv4/ip_forward", "1"),
            ("net/ipv6/conf/all/forwarding", "1"),
            ("net/ipv6/conf/default/accept_dad", "0"),
        ];
        if Path::new("/proc/sys/net/bridge").exists() {
            settings.push(("net/bridge/bridge-nf-call-iptables", "1"));
            settings.push(("net/bridge/bridge-nf-call-ip6tables", "1"));
        }
        for (key, value) in settings {
            std::fs::write(format!("/proc/sys/{key}"), value)
                .with_context(|| format!("cannot set {key} in the cluster's namespace"))?;
        }
        self.outside = Some(uplink(stack)?);
        write_cni_config(&self.dir.join("node/cni"), stack)
    }

    /// The namespace outside the node, at the other end of its uplink: where clients of the
    /// cluster's Services stand (`nsenter --net=PATH`, or [`netns::enter_path`]).
    pub fn outside(&self) -> &Path {
        self.outside.as_ref().map_or(Path::new(""), |ns| ns.path())
    }

    fn start_containerd(&mut self, root: &Path) -> anyhow::Result<()> {
        let state = root.join("containerd");
        std::fs::create_dir_all(&state)?;
        let config = state.join("config.toml");
        std::fs::write(&config, containerd_config(root, &self.bin))?;
        let program = self.bin.join("containerd");
        let procs = format!("/sys/fs/cgroup/pids{}/runtime/cgroup.procs", self.cgroup);
        // Into the node's cgroup before the exec, so containerd and every shim it starts are in it.
        let script = r#"echo $$ > "$0" && exec "$@""#;
        let args = [
            "-c".to_owned(),
            script.to_owned(),
            procs,
            program.display().to_string(),
            format!("--config={}", config.display()),
        ];
        self.spawn_program("containerd", Path::new("/bin/sh"), &args)?;
        let socket = self.containerd_socket();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !socket.exists() {
            self.check_running()?;
            if Instant::now() > deadline {
                bail!("containerd did not open {} within 30 s", socket.display());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    fn start_kubelet(
        &mut self,
        root: &Path,
        stack: Stack,
        credentials: &Credentials,
    ) -> anyhow::Result<()> {
        let config = root.join("kubelet.yaml");
        std::fs::write(&config, kubelet_config(root, &self.cgroup, credentials))?;
        let node_ips: Vec<&str> = stack.families().iter().map(|f| node_ip(*f)).collect();
        let args = [
            format!("--config={}", config.display()),
            format!("--kubeconfig={}", credentials.kubelet.display()),
            format!("--root-dir={}", root.join("kubelet").display()),
            format!("--cert-dir={}", root.join("kubelet/pki").display()),
            format!("--hostname-override={NODE_NAME}"),
            format!("--node-ip={}", node_ips.join(",")),
            "--v=1".into(),
        ];
        self.spawn("kubelet", "kubelet", &args)
    }

    fn start_proxy(
        &mut self,
        root: &Path,
        stack: Stack,
        credentials: &Credentials,
    ) -> anyhow::Result<()> {
        let config = root.join("kube-proxy.yaml");
        std::fs::write(&config, proxy_config(stack, credentials))?;
        let args = [format!("--config={}", config.display()), "--v=1".into()];
        self.spawn("kube-proxy", "kube-proxy", &args)
    }

    fn spawn(&mut self, name: &'static str, program: &str, args: &[String]) -> anyhow::Result<()> {
        let program = self.bin.join(program);
        if !program.exists() {
            bail!(
                "{} is missing: run conformance/node/build.sh",
                program.display()
            );
        }
        self.spawn_program(name, &program, args)
    }

    /// Starts `program` in the node's mount namespace with a parent-death signal, its output
    /// appended to `logs/NAME.log`, and the node's binaries first on its `PATH` (containerd finds
    /// its shim there, the kubelet and kube-proxy find `nft` after them).
    fn spawn_program(
        &mut self,
        name: &'static str,
        program: &Path,
        args: &[String],
    ) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("logs").join(format!("{name}.log")))?;
        let mnt = format!("--mount=/proc/{}/ns/mnt", self.mounts.id());
        let mut all = vec![mnt.as_str(), "--", &*program.to_string_lossy()]
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>();
        all.extend(args.iter().cloned());
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let path = format!(
            "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            self.bin.display()
        );
        let child = command("nsenter", &all)?
            .env("PATH", path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {name}"))?;
        self.processes.push(Process {
            name,
            program: program.to_owned(),
            args: args.to_vec(),
            child,
        });
        Ok(())
    }

    /// Waits until the Node object says Ready (the kubelet found the runtime and the CNI
    /// configuration).
    async fn wait_ready(&mut self, api: &crate::runner::kube_api::KubeApi) -> anyhow::Result<()> {
        let deadline = Instant::now() + NODE_TIMEOUT;
        loop {
            self.check_running()?;
            let node = api.get("v1", "Node", None, NODE_NAME).await.ok().flatten();
            let ready = node.is_some_and(|n| {
                n["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                let log = super::tail(&self.dir.join("logs/kubelet.log"));
                bail!("node {NODE_NAME} not Ready within {NODE_TIMEOUT:?}:\n{log}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn describe(&self) -> anyhow::Result<String> {
        let kubelet = super::version_of(&self.bin.join("kubelet"))?;
        let out = Command::new(self.bin.join("containerd"))
            .arg("--version")
            .output()?;
        // `containerd github.com/containerd/containerd/v2 v2.4.2 module`
        let text = String::from_utf8_lossy(&out.stdout);
        let containerd = text.split_whitespace().nth(2).unwrap_or("unknown");
        Ok(format!(
            "kubelet {kubelet}, containerd {containerd}, kube-proxy nftables"
        ))
    }
}

/// The node's uplink: a veth pair `eth0` between the cluster's namespace and a new one outside
/// it, an address of each family of the cluster at both ends, and the node's default routes
/// through the outside end (a node has one: without it, connections to a Service's ClusterIP
/// from the node find no route before kube-proxy's rules rewrite them).
fn uplink(stack: Stack) -> anyhow::Result<NetNs> {
    let outside = NetNs::create()?;
    let pid = outside.pid().to_string();
    netns::ip(&[
        "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", &pid,
    ])?;
    let there = |args: &[&str]| -> anyhow::Result<()> {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", outside.path().display()))
            .arg("ip")
            .args(args)
            .output()
            .context("cannot run nsenter ip")?;
        if !out.status.success() {
            bail!(
                "ip {} (outside): {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    };
    for family in stack.families() {
        let (node, gateway, prefix, flag) = match family {
            Family::V4 => (UPLINK_V4.0, UPLINK_V4.1, 24, "-4"),
            Family::V6 => (UPLINK_V6.0, UPLINK_V6.1, 64, "-6"),
        };
        netns::ip(&[
            flag,
            "addr",
            "add",
            &format!("{node}/{prefix}"),
            "dev",
            "eth0",
            "nodad",
        ])?;
        there(&[
            flag,
            "addr",
            "add",
            &format!("{gateway}/{prefix}"),
            "dev",
            "eth0",
            "nodad",
        ])?;
    }
    netns::ip(&["link", "set", "eth0", "up"])?;
    there(&["link", "set", "eth0", "up"])?;
    there(&["link", "set", "lo", "up"])?;
    // The load balancer's addresses are on the node: the outside reaches them through it.
    for family in stack.families() {
        match family {
            Family::V4 => {
                netns::ip(&["-4", "route", "add", "default", "via", UPLINK_V4.1])?;
                there(&[
                    "-4",
                    "route",
                    "add",
                    super::loadbalancer::POOL_V4,
                    "via",
                    UPLINK_V4.0,
                ])?;
            }
            Family::V6 => {
                netns::ip(&["-6", "route", "add", "default", "via", UPLINK_V6.1])?;
                there(&[
                    "-6",
                    "route",
                    "add",
                    super::loadbalancer::POOL_V6,
                    "via",
                    UPLINK_V6.0,
                ])?;
            }
        }
    }
    Ok(outside)
}

/// A node process and how it was started.
#[derive(Debug)]
struct Process {
    name: &'static str,
    program: PathBuf,
    args: Vec<String>,
    child: Child,
}

fn node_ip(family: Family) -> &'static str {
    match family {
        Family::V4 => NODE_IP_V4,
        Family::V6 => NODE_IP_V6,
    }
}

/// The mount namespace holder, the reaper and the cgroup name. The cgroup is created in every
/// v1 hierarchy the kubelet uses (it creates the pods' cgroups below it) and in `pids` with a
/// `runtime` child for containerd.
fn isolate(
    root: &Path,
    sysctls: &[(&'static str, String)],
) -> anyhow::Result<(Child, Child, String)> {
    let mounts = command(
        "unshare",
        &[
            "--mount",
            "--propagation",
            "private",
            "--",
            "sleep",
            "infinity",
        ],
    )?
    .stdin(Stdio::null())
    .spawn()
    .context("cannot run unshare --mount (util-linux)")?;
    let cgroup = format!("/duet-node-{}", mounts.id());
    create_cgroup(&cgroup)?;
    let restore: Vec<String> = sysctls
        .iter()
        .map(|(key, value)| format!("echo {value} > /proc/sys/{key}"))
        .collect();
    // On SIGTERM (its parent-death signal): kill what the cgroup holds, remove it, restore.
    let script = format!(
        "trap 'kill $p; {kill}; sleep 1; {remove}; {restore}; exit 0' TERM; \
         sleep 2147483647 & p=$!; wait $p",
        kill = "for f in $(find /sys/fs/cgroup/pids\"$0\" -name cgroup.procs); do \
                xargs -r kill -9 < $f; done",
        remove = "for h in /sys/fs/cgroup/*/; do \
                  [ -d \"$h$0\" ] && find \"$h$0\" -depth -type d -exec rmdir {} \\; ; done",
        restore = restore.join("; "),
    );
    let reaper = Command::new(super::SETPRIV)
        .args(["--pdeathsig", "TERM", "--", "sh", "-c", &script])
        .arg(&cgroup)
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start the node's reaper")?;
    wait_mount_namespace(&mounts)?;
    Ok((mounts, reaper, cgroup))
}

/// The node's cgroup in every v1 hierarchy (the kubelet checks `cgroupRoot` exists in each),
/// cpuset's with the machine's CPUs and memory nodes (a new cpuset cgroup has none), and the
/// `runtime` child in `pids` for containerd.
fn create_cgroup(cgroup: &str) -> anyhow::Result<()> {
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").context("cannot read /sys/fs/cgroup")? {
        let hierarchy = hierarchy?.path();
        if hierarchy.ends_with("unified") {
            continue;
        }
        let dir = hierarchy.join(cgroup.trim_start_matches('/'));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        for file in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(value) = std::fs::read_to_string(hierarchy.join(file)) {
                std::fs::write(dir.join(file), value.trim())
                    .with_context(|| format!("cannot write {file} of {}", dir.display()))?;
            }
        }
    }
    let runtime = format!("/sys/fs/cgroup/pids{cgroup}/runtime");
    std::fs::create_dir_all(&runtime).with_context(|| format!("cannot create {runtime}"))
}

/// unshare(1) changes namespace after the exec: wait until the holder's differs from ours.
fn wait_mount_namespace(holder: &Child) -> anyhow::Result<()> {
    let ours = std::fs::read_link("/proc/self/ns/mnt")?;
    let path = format!("/proc/{}/ns/mnt", holder.id());
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_link(&path).map_or(true, |l| l == ours) {
        if Instant::now() > deadline {
            bail!("unshare --mount did not create a mount namespace within 10 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// SIGKILL to every process in the node's cgroup (containers, shims, containerd), twice: a
/// shim may start a process between the read and the kill.
fn kill_cgroup(cgroup: &str) {
    for _ in 0..2 {
        for procs in cgroup_files(&format!("/sys/fs/cgroup/pids{cgroup}"), "cgroup.procs") {
            for pid in std::fs::read_to_string(&procs).unwrap_or_default().lines() {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Removes the node's cgroup from every hierarchy, children first.
fn remove_cgroup(cgroup: &str) {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for hierarchy in hierarchies.flatten() {
        let top = hierarchy.path().join(cgroup.trim_start_matches('/'));
        let mut dirs = cgroup_dirs(&top);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for dir in dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn cgroup_dirs(top: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![top.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(entry.path());
            }
        }
        found.push(dir);
    }
    found
}

fn cgroup_files(top: &str, name: &str) -> Vec<PathBuf> {
    cgroup_dirs(Path::new(top))
        .into_iter()
        .map(|d| d.join(name))
        .filter(|f| f.exists())
        .collect()
}

fn save_sysctls() -> Vec<(&'static str, String)> {
    KUBELET_SYSCTLS
        .iter()
        .filter_map(|key| {
            let value = std::fs::read_to_string(format!("/proc/sys/{key}")).ok()?;
            Some((*key, value.trim().to_owned()))
        })
        .collect()
}

fn restore_sysctls(saved: &[(&'static str, String)]) {
    for (key, value) in saved {
        let _ = std::fs::write(format!("/proc/sys/{key}"), value);
    }
}

/// The sandbox image: the pause binary in an OCI archive (`images/build.sh pause`).
fn pause_image(bin: &Path, root: &Path) -> anyhow::Result<PathBuf> {
    let out = root.join("pause.tar");
    build_image("pause", &bin.join("pause"), &[PAUSE_IMAGE], &out)?;
    Ok(out)
}

/// `images/build.sh KIND --binary BINARY --tag REFERENCE... --out ARCHIVE`: an OCI image
/// archive of one of the repository's images, built from `binary` with no daemon and no
/// registry, under every reference given.
pub fn build_image(
    kind: &str,
    binary: &Path,
    references: &[&str],
    out: &Path,
) -> anyhow::Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/build.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(&script).arg(kind).arg("--binary").arg(binary);
    for reference in references {
        cmd.args(["--tag", reference]);
    }
    let output = cmd
        .arg("--out")
        .arg(out)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    if !output.status.success() {
        bail!(
            "images/build.sh {kind} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// containerd's configuration (version 3): state under `root/containerd`, the CRI plugin with
/// runc through the v2 shim and cgroupfs, `restrict_oom_score_adj` (the machine lacks
/// CAP_SYS_RESOURCE, so nothing may lower `oom_score_adj`), the local pause image, and the CNI
/// plugins and configuration of the node.
fn containerd_config(root: &Path, bin: &Path) -> String {
    let state = root.join("containerd");
    let cni = root.join("cni");
    format!(
        r#"version = 3
root = "{state}/root"
state = "{state}/state"
[grpc]
  address = "{state}/containerd.sock"
[ttrpc]
  address = "{state}/containerd.sock.ttrpc"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '{PAUSE_IMAGE}'
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = '{runc}'
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['{bin}']
    conf_dir = '{cni}/net.d'
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
"#,
        state = state.display(),
        runc = bin.join("runc").display(),
        bin = bin.display(),
        cni = cni.display(),
    )
}

/// One network of a bridge, pod addresses from host-local (one range per family of the
/// cluster), portmap for `hostPort`, and hairpin so a pod reaches itself through a Service.
fn write_cni_config(dir: &Path, stack: Stack) -> anyhow::Result<()> {
    let ranges: Vec<serde_json::Value> = stack
        .families()
        .iter()
        .map(|f| {
            let subnet = match f {
                Family::V4 => POD_RANGE_V4,
                Family::V6 => POD_RANGE_V6,
            };
            serde_json::json!([{ "subnet": subnet }])
        })
        .collect();
    let routes: Vec<serde_json::Value> = stack
        .families()
        .iter()
        .map(|f| match f {
            Family::V4 => serde_json::json!({"dst": "0.0.0.0/0"}),
            Family::V6 => serde_json::json!({"dst": "::/0"}),
        })
        .collect();
    let config = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "duet",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": ranges,
                    "routes": routes,
                    "dataDir": dir.join("ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}, "backend": "nftables"},
        ],
    });
    std::fs::create_dir_all(dir.join("net.d"))?;
    std::fs::write(
        dir.join("net.d/10-duet.conflist"),
        serde_json::to_vec_pretty(&config)?,
    )?;
    Ok(())
}

/// The kubelet's configuration, after kind's: cgroupfs under the node's cgroup, cgroup v1
/// allowed (`failCgroupV1: false`), no swap check, no image garbage collection or eviction (a
/// test machine's disk is not the node's business), webhook authentication and authorization
/// against the API server, no cluster DNS (the tests reach Services by address).
fn kubelet_config(root: &Path, cgroup: &str, credentials: &Credentials) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: {cgroup}
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://{socket}
podLogsDir: {logs}
address: "::"
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 0
resolvConf: ""
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {ca}
authorization:
  mode: Webhook
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  nodefs.available: "0%"
  nodefs.inodesFree: "0%"
  imagefs.available: "0%"
  imagefs.inodesFree: "0%"
localStorageCapacityIsolation: false
protectKernelDefaults: false
serializeImagePulls: false
"#,
        socket = root.join("containerd/containerd.sock").display(),
        logs = root.join("pod-logs").display(),
        ca = credentials.ca.display(),
    )
}

/// kube-proxy in nftables mode for the cluster's families; conntrack left as the machine has it.
fn proxy_config(stack: Stack, credentials: &Credentials) -> String {
    let cidrs: Vec<&str> = stack
        .families()
        .iter()
        .map(|f| match f {
            Family::V4 => super::POD_CIDR_V4,
            Family::V6 => super::POD_CIDR_V6,
        })
        .collect();
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
hostnameOverride: {NODE_NAME}
clusterCIDR: "{cidrs}"
clientConnection:
  kubeconfig: {kubeconfig}
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
metricsBindAddress: "127.0.0.1:10249"
healthzBindAddress: ""
"#,
        cidrs = cidrs.join(","),
        kubeconfig = credentials.proxy.display(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cni_configuration_gives_a_range_and_a_default_route_per_family() {
        let dir = tempfile::tempdir().unwrap();
        write_cni_config(dir.path(), Stack::DualIpv6).unwrap();
        let text = std::fs::read_to_string(dir.path().join("net.d/10-duet.conflist")).unwrap();
        let config: serde_json::Value = serde_json::from_str(&text).unwrap();
        let ipam = &config["plugins"][0]["ipam"];
        assert_eq!(ipam["ranges"][0][0]["subnet"], POD_RANGE_V6);
        assert_eq!(ipam["ranges"][1][0]["subnet"], POD_RANGE_V4);
        assert_eq!(ipam["routes"][0]["dst"], "::/0");
        write_cni_config(dir.path(), Stack::Ipv4).unwrap();
        let text = std::fs::read_to_string(dir.path().join("net.d/10-duet.conflist")).unwrap();
        assert!(!text.contains(POD_RANGE_V6), "{text}");
    }
}
