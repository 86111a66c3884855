//! The cluster's network namespace: an anonymous one (no name, no bind mount under
//! `/run/netns`), held open by a `sleep` that dies with the thread that started it
//! (`setpriv --pdeathsig KILL unshare --net sleep infinity`). Threads enter it with `setns(2)`;
//! processes started from a thread inside it are inside it too. It disappears with its last
//! member: nothing to delete, whatever way the owner ends.

use std::fs::File;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::{command, POD_INTERFACE};

/// A network namespace held open by a child process.
#[derive(Debug)]
pub struct NetNs {
    holder: Child,
    path: PathBuf,
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// The inode link of the calling thread's network namespace (`net:[4026531840]`).
fn current_link() -> anyhow::Result<PathBuf> {
    std::fs::read_link("/proc/thread-self/ns/net").context("cannot read /proc/thread-self/ns/net")
}

impl NetNs {
    /// Creates a namespace; the calling thread stays where it is (see [`NetNs::enter`]).
    pub fn create() -> anyhow::Result<NetNs> {
        let holder = command("unshare", &["--net", "--", "sleep", "infinity"])?
            .stdin(Stdio::null())
            .spawn()
            .context("cannot run unshare (util-linux)")?;
        let path = PathBuf::from(format!("/proc/{}/ns/net", holder.id()));
        let mut ns = NetNs { holder, path };
        // unshare(1) runs after the exec: wait until the holder's namespace is not ours.
        let ours = current_link()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = ns.holder.try_wait()? {
                bail!("unshare --net exited ({status}): cannot create a network namespace");
            }
            if std::fs::read_link(&ns.path).is_ok_and(|l| l != ours) {
                return Ok(ns);
            }
            if Instant::now() > deadline {
                bail!("unshare --net did not create a network namespace within 10 s");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// `/proc/PID/ns/net` of the holder: `nsenter --net=PATH` runs a command inside.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// The holder's process id.
    pub fn pid(&self) -> u32 {
        self.holder.id()
    }

    /// Moves the calling thread into the namespace (for good): the sockets it opens from now on
    /// and the processes it starts live there.
    pub fn enter(&self) -> anyhow::Result<()> {
        enter_path(&self.path)
    }
}

/// Moves the calling thread into the network namespace at `path` (a `/proc/PID/ns/net` link).
pub fn enter_path(path: &std::path::Path) -> anyhow::Result<()> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    rustix::thread::move_into_link_name_space(
        file.as_fd(),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .with_context(|| format!("setns({}) failed", path.display()))
}

/// Adds (`verb` "add") or removes ("del") `addr` as a host address (/32, /128) on the pod
/// interface of the calling thread's namespace: a pod's address, or a load balancer's. IPv6
/// addresses are added without duplicate address detection, so they are usable at once.
pub fn local_address(verb: &str, addr: IpAddr) -> anyhow::Result<()> {
    match addr {
        IpAddr::V4(v4) => ip(&["addr", verb, &format!("{v4}/32"), "dev", POD_INTERFACE]),
        IpAddr::V6(v6) if verb == "add" => ip(&[
            "-6",
            "addr",
            "add",
            &format!("{v6}/128"),
            "dev",
            POD_INTERFACE,
            "nodad",
        ]),
        IpAddr::V6(v6) => ip(&[
            "-6",
            "addr",
            verb,
            &format!("{v6}/128"),
            "dev",
            POD_INTERFACE,
        ]),
    }
}

/// Runs `ip ARGS` in the calling thread's namespace, failing with its stderr.
pub fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("cannot run ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
