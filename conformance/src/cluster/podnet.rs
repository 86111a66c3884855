//! A pod of its own network namespace: what a CNI plugin gives a real pod, as little as the
//! test cluster needs. The stand-in kubelet uses it for pods that run a real program (the
//! Gateway API suite's `echo-basic`, [`super::kubelet`]), which listens on wildcard addresses
//! and so needs a network of its own; the in-process echo pods keep their addresses on the
//! cluster namespace's loopback.
//!
//! Per pod: a namespace held by `unshare --net sleep` (as the cluster's, [`NetNs`]), a veth pair
//! `dvN` (cluster side) / `eth0` (pod side), the pod's addresses (one per family, /32 and /128)
//! on `eth0`, and routes both ways: in the cluster namespace a host route to each pod address
//! over `dvN`, with the node's address as source; in the pod, IPv4 default over `eth0` (the
//! cluster side answers ARP for the node address, a local address there) and IPv6 default via
//! the link-local `fe80::1` of `dvN`. Deleting the namespace deletes the pair and its routes.
//!
//! The pod's program runs under `setpriv --pdeathsig KILL nsenter --net=...`: it dies with the
//! kubelet thread that started it, and [`PodNet::stop`] kills it first.

use std::net::IpAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::Context;

use super::netns::{ip, NetNs};
use super::{command, NODE_IP_V4, NODE_IP_V6};

/// The link-local address of the cluster side of every pod's veth pair (the pod's IPv6 gateway).
const GATEWAY_V6: &str = "fe80::1";
/// The pod side's link-local address (fixed, so no duplicate address detection delays it).
const POD_LINK_LOCAL_V6: &str = "fe80::2";

/// A pod's network namespace and the program running in it; [`PodNet::stop`] (or drop) ends both.
#[derive(Debug)]
pub struct PodNet {
    netns: NetNs,
    child: Option<Child>,
}

impl Drop for PodNet {
    fn drop(&mut self) {
        self.stop();
    }
}

impl PodNet {
    /// Creates the namespace of pod number `n` with `ips` (at most one per family) and routes
    /// both ways, from a thread in the cluster's namespace.
    pub fn create(n: u32, ips: &[IpAddr]) -> anyhow::Result<PodNet> {
        let netns = NetNs::create()?;
        let pod = PodNet { netns, child: None };
        pod.connect(&format!("dv{n}"), ips)
            .with_context(|| format!("cannot connect pod network dv{n}"))?;
        Ok(pod)
    }

    /// `ip ARGS` inside the pod's namespace.
    fn ip_inside(&self, args: &[&str]) -> anyhow::Result<()> {
        let ns = format!("--net={}", self.netns.path().display());
        let out = Command::new("nsenter")
            .arg(&ns)
            .arg("--")
            .arg("ip")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("cannot run nsenter (util-linux)")?;
        anyhow::ensure!(
            out.status.success(),
            "ip {} in the pod failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(())
    }

    fn connect(&self, host: &str, ips: &[IpAddr]) -> anyhow::Result<()> {
        let pid = self.netns.pid().to_string();
        ip(&[
            "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", &pid,
        ])?;
        ip(&["link", "set", host, "up"])?;
        self.ip_inside(&["link", "set", "lo", "up"])?;
        self.ip_inside(&["link", "set", "eth0", "up"])?;
        for addr in ips {
            match addr {
                IpAddr::V4(v4) => {
                    self.ip_inside(&["addr", "add", &format!("{v4}/32"), "dev", "eth0"])?;
                    self.ip_inside(&["route", "add", "default", "dev", "eth0"])?;
                    ip(&[
                        "route",
                        "add",
                        &format!("{v4}/32"),
                        "dev",
                        host,
                        "src",
                        NODE_IP_V4,
                    ])?;
                }
                IpAddr::V6(v6) => {
                    ip(&[
                        "-6",
                        "addr",
                        "add",
                        &format!("{GATEWAY_V6}/64"),
                        "dev",
                        host,
                        "nodad",
                    ])?;
                    for a in [format!("{v6}/128"), format!("{POD_LINK_LOCAL_V6}/64")] {
                        self.ip_inside(&["-6", "addr", "add", &a, "dev", "eth0", "nodad"])?;
                    }
                    self.ip_inside(&[
                        "-6", "route", "add", "default", "via", GATEWAY_V6, "dev", "eth0",
                    ])?;
                    ip(&[
                        "-6",
                        "route",
                        "add",
                        &format!("{v6}/128"),
                        "dev",
                        host,
                        "src",
                        NODE_IP_V6,
                    ])?;
                }
            }
        }
        Ok(())
    }

    /// Starts `program` in the pod's namespace with exactly `env` (nothing of the kubelet's own
    /// environment), its output appended to `log`.
    pub fn run(
        &mut self,
        program: &Path,
        env: &[(String, String)],
        log: &Path,
    ) -> anyhow::Result<()> {
        let ns = format!("--net={}", self.netns.path().display());
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("cannot open {}", log.display()))?;
        let child = command("nsenter", &[&ns, "--", &program.to_string_lossy()])?
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("cannot start {}", program.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// Whether the program has exited (with its status).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Kills the program; the namespace (with the veth pair and its routes) goes on drop.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
