//! `duet-cluster`: a real Kubernetes control plane (etcd, kube-apiserver,
//! kube-controller-manager, built by `conformance/cluster/build.sh`) with the stand-in kubelet, in
//! a network namespace of its own (see `conformance::cluster`).
//!
//! ```text
//! duet-cluster up --dir /tmp/c [--single-stack[=ipv4|ipv6]]   # foreground; Ctrl-C stops it
//! duet-cluster up --dir /tmp/c --real-node [--metallb]      # a real node [and MetalLB]
//! duet-cluster exec --dir /tmp/c -- curl -sk https://127.0.0.1:6443/version
//! duet-cluster down --dir /tmp/c
//! ```

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use conformance::cluster::{Cluster, LoadBalancerKind, Options, Stack};

#[derive(Debug, Parser)]
#[command(
    name = "duet-cluster",
    version,
    about = "A real Kubernetes control plane in a network namespace, for duet's tests"
)]
struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Starts a cluster and runs until SIGINT/SIGTERM or `down`; prints `ready` when usable.
    Up {
        /// The cluster's folder: kubeconfig, certificates, etcd data, logs/, pid, netns.
        #[arg(long)]
        dir: PathBuf,
        /// One family only (IPv4 unless `=ipv6`); the default is dual-stack, IPv4 primary.
        #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "ipv4", require_equals = true)]
        single_stack: Option<Stack>,
        /// Dual-stack with IPv6 as the primary family (Service range and pod IPs IPv6 first).
        #[arg(long, conflicts_with = "single_stack")]
        ipv6_primary: bool,
        /// Install the Gateway API standard CRDs (go run ./cmd/crds apply) before the controllers.
        #[arg(long)]
        gateway_api: bool,
        /// Where etcd, kube-apiserver and kube-controller-manager are (default: build.sh's).
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        /// Run a real node (kubelet, containerd, CNI, kube-proxy; conformance/node/build.sh)
        /// instead of the stand-in kubelet. Writes the namespace outside the node, where
        /// clients of LoadBalancer Services stand, to DIR/outside-netns.
        #[arg(long)]
        real_node: bool,
        /// An OCI image archive (images/build.sh) to load into the real node's containerd.
        /// Repeatable.
        #[arg(long, requires = "real_node")]
        image: Vec<PathBuf>,
        /// MetalLB in L2 mode (built by conformance/node/build.sh) instead of the stand-in load
        /// balancer: LoadBalancer addresses from the uplink subnets (10.255.0.100-199,
        /// fd00:10:255::100-1ff), announced on the node's eth0.
        #[arg(long, requires = "real_node")]
        metallb: bool,
    },
    /// Stops the cluster started with the same `--dir` and waits until it is gone.
    Down {
        /// The cluster's folder.
        #[arg(long)]
        dir: PathBuf,
    },
    /// Runs a command inside the cluster's network namespace (`nsenter --net`).
    Exec {
        /// The cluster's folder.
        #[arg(long)]
        dir: PathBuf,
        /// The command and its arguments.
        #[arg(trailing_var_arg = true, required = true)]
        command: Vec<String>,
    },
}

fn main() {
    let args: Args = conformance::parse_args("duet-cluster");
    let result = match args.command {
        Cmd::Up {
            dir,
            single_stack,
            ipv6_primary,
            gateway_api,
            bin_dir,
            real_node,
            image,
            metallb,
        } => {
            let dual = if ipv6_primary {
                Stack::DualIpv6
            } else {
                Stack::Dual
            };
            let options = Options {
                stack: single_stack.unwrap_or(dual),
                bin_dir,
                gateway_api,
                real_node,
                load_balancer: if metallb {
                    LoadBalancerKind::MetalLb
                } else {
                    LoadBalancerKind::StandIn
                },
                ..Options::default()
            };
            up(dir, options, &image)
        }
        Cmd::Down { dir } => down(&dir),
        Cmd::Exec { dir, command } => exec(&dir, &command),
    };
    if let Err(e) = result {
        eprintln!("duet-cluster: {e:#}");
        std::process::exit(1);
    }
}

fn up(dir: PathBuf, options: Options, images: &[PathBuf]) -> anyhow::Result<()> {
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let dir = dir.canonicalize()?;
    if let Ok(pid) = std::fs::read_to_string(dir.join("pid")) {
        if Path::new(&format!("/proc/{}", pid.trim())).exists() {
            bail!(
                "a cluster (pid {}) already runs in {}",
                pid.trim(),
                dir.display()
            );
        }
    }
    for stale in ["ready", "netns", "outside-netns"] {
        let _ = std::fs::remove_file(dir.join(stale));
    }
    std::fs::write(dir.join("pid"), std::process::id().to_string())?;
    // One thread: it joins the namespace, starts every process (their parent-death signal is
    // tied to it) and opens every socket.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let options = Options {
            dir: Some(dir.clone()),
            ..options
        };
        let cluster = Cluster::start(options).await?;
        for image in images {
            cluster.import_image(image)?;
        }
        if let Some(node) = cluster.node() {
            std::fs::write(
                dir.join("outside-netns"),
                node.outside().display().to_string(),
            )?;
            println!("node: {}", node.versions());
        }
        std::fs::write(
            dir.join("netns"),
            cluster.netns_path().display().to_string(),
        )?;
        println!("control plane: {}", cluster.control_plane());
        println!("kubeconfig {}", cluster.kubeconfig().display());
        println!(
            "network namespace {} (nsenter --net={} ...)",
            cluster.netns_path().display(),
            cluster.netns_path().display()
        );
        std::fs::write(dir.join("ready"), cluster.control_plane())?;
        println!("ready");
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        drop(cluster);
        anyhow::Ok(())
    })?;
    for file in ["ready", "netns", "outside-netns", "pid"] {
        let _ = std::fs::remove_file(dir.join(file));
    }
    Ok(())
}

fn down(dir: &Path) -> anyhow::Result<()> {
    let pid_file = dir.join("pid");
    let Ok(text) = std::fs::read_to_string(&pid_file) else {
        println!("no cluster runs in {}", dir.display());
        return Ok(());
    };
    let pid: i32 = text
        .trim()
        .parse()
        .with_context(|| format!("{} does not hold a pid", pid_file.display()))?;
    let pid = rustix::process::Pid::from_raw(pid).context("pid 0")?;
    let proc_dir = PathBuf::from(format!("/proc/{}", pid.as_raw_nonzero()));
    if rustix::process::kill_process(pid, rustix::process::Signal::TERM).is_err() {
        println!("no cluster runs in {} (stale pid)", dir.display());
        let _ = std::fs::remove_file(&pid_file);
        return Ok(());
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while running(&proc_dir) {
        if Instant::now() > deadline {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            bail!(
                "duet-cluster (pid {}) did not stop within 30 s: killed",
                pid.as_raw_nonzero()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("stopped");
    Ok(())
}

/// Whether the process of `/proc/PID` runs (exists and is not a zombie waiting for its parent).
fn running(proc_dir: &Path) -> bool {
    std::fs::read_to_string(proc_dir.join("stat")).is_ok_and(|stat| {
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        !matches!(state, Some('Z') | Some('X'))
    })
}

fn exec(dir: &Path, command: &[String]) -> anyhow::Result<()> {
    let netns = std::fs::read_to_string(dir.join("netns"))
        .with_context(|| format!("no running cluster in {} (no netns file)", dir.display()))?;
    let status = std::process::Command::new("nsenter")
        .arg(format!("--net={}", netns.trim()))
        .arg("--")
        .args(command)
        .status()
        .context("cannot run nsenter (util-linux)")?;
    std::process::exit(status.code().unwrap_or(1));
}
