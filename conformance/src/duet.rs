//! Runs the real `duet` binary for a test: free ports on `127.0.0.1` and `[::1]` for every
//! listener, its output captured to a file (printed when the test fails), `/readyz` awaited, and
//! the process killed on drop.

use std::fs::OpenOptions;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::Value;

use crate::client::{self, Reply};
use crate::echo::Family;

/// How long `duet` gets to become ready (debug build, loaded 2-core machine).
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How to start `duet serve`.
#[derive(Clone, Debug)]
pub struct DuetBuilder {
    bin: PathBuf,
    source: Source,
    args: Vec<String>,
    env: Vec<(String, String)>,
    until_ready: bool,
    die_with_parent: bool,
}

/// `setpriv` (util-linux) runs a program with a parent-death signal, so a child outlives no
/// parent that dies abruptly (SIGKILL, a crash), without `unsafe` code in the parent.
const SETPRIV: &str = "/usr/bin/setpriv";

/// Where the `duet` under test reads objects from.
#[derive(Clone, Debug)]
enum Source {
    /// `--manifests DIR`.
    Manifests(PathBuf),
    /// `--kubeconfig PATH` (Kubernetes mode).
    Kubeconfig(PathBuf),
}

impl DuetBuilder {
    /// `duet serve --manifests DIR` with the binary at `bin` (in tests:
    /// `env!("CARGO_BIN_EXE_duet")`).
    pub fn new(bin: impl AsRef<Path>, manifests: impl AsRef<Path>) -> DuetBuilder {
        DuetBuilder {
            bin: bin.as_ref().to_owned(),
            source: Source::Manifests(manifests.as_ref().to_owned()),
            args: Vec::new(),
            env: Vec::new(),
            until_ready: true,
            die_with_parent: false,
        }
    }

    /// `duet serve --kubeconfig PATH`: Kubernetes mode against the API server of that
    /// kubeconfig (e.g. the real control plane's, [`crate::cluster`]).
    pub fn kube(bin: impl AsRef<Path>, kubeconfig: impl AsRef<Path>) -> DuetBuilder {
        DuetBuilder {
            bin: bin.as_ref().to_owned(),
            source: Source::Kubeconfig(kubeconfig.as_ref().to_owned()),
            args: Vec::new(),
            env: Vec::new(),
            until_ready: true,
            die_with_parent: false,
        }
    }

    /// Adds command-line arguments after the generated ones.
    pub fn args<I, S>(mut self, args: I) -> DuetBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Makes [`DuetBuilder::start`] return once the admin listener answers, whatever `/readyz`
    /// says (to watch readiness itself).
    pub fn without_waiting_for_ready(mut self) -> DuetBuilder {
        self.until_ready = false;
        self
    }

    /// Makes the process get SIGKILL when the thread that started it ends or this process dies,
    /// however it dies (through `setpriv --pdeathsig KILL`, when `/usr/bin/setpriv` exists; with
    /// `CI` set, a missing setpriv fails the start instead). For
    /// long-lived owners such as the conformance runner: a test's `Duet` is killed on drop anyway.
    pub fn die_with_parent(mut self) -> DuetBuilder {
        self.die_with_parent = true;
        self
    }

    /// Sets an environment variable for the process.
    pub fn env(mut self, key: &str, value: &str) -> DuetBuilder {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Starts the process and waits for `/readyz` to answer 200. Retries with other ports when a
    /// port was taken in between (another test picked it).
    pub async fn start(self) -> anyhow::Result<Duet> {
        let mut last = None;
        for _ in 0..3 {
            match self.try_start().await {
                Ok(duet) => return Ok(duet),
                Err(StartError::PortTaken(e)) => last = Some(e),
                Err(StartError::Other(e)) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("duet did not start")))
    }

    async fn try_start(&self) -> Result<Duet, StartError> {
        let ports = FreePorts::pick().map_err(StartError::Other)?;
        let log = tempfile::Builder::new()
            .prefix("duet-log-")
            .suffix(".txt")
            .tempfile()
            .map_err(|e| StartError::Other(e.into()))?;
        let open = || {
            OpenOptions::new()
                .append(true)
                .open(log.path())
                .map_err(|e| StartError::Other(e.into()))
        };
        let has_setpriv = Path::new(SETPRIV).exists();
        if self.die_with_parent && !has_setpriv && std::env::var_os("CI").is_some() {
            // CI must test what it claims: no silent fallback to a duet that can outlive us.
            return Err(StartError::Other(anyhow::anyhow!(
                "{SETPRIV} is missing (apt-get install util-linux); CI is set, so this fails \
                 instead of starting duet without a parent-death signal"
            )));
        }
        let mut cmd = if self.die_with_parent && has_setpriv {
            let mut cmd = Command::new(SETPRIV);
            cmd.arg("--pdeathsig").arg("KILL").arg("--").arg(&self.bin);
            cmd
        } else {
            Command::new(&self.bin)
        };
        cmd.arg("serve");
        match &self.source {
            Source::Manifests(dir) => cmd.arg("--manifests").arg(dir),
            Source::Kubeconfig(path) => cmd.arg("--kubeconfig").arg(path),
        };
        for (flag, addrs) in [
            ("--http-listen", ports.http),
            ("--https-listen", ports.https),
            ("--admin-listen", ports.admin),
            ("--debug-listen", ports.debug),
        ] {
            for addr in addrs {
                cmd.arg(flag).arg(addr.to_string());
            }
        }
        cmd.args(&self.args);
        if std::env::var_os("DUET_LOG").is_none() {
            cmd.env("DUET_LOG", "info");
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null()).stdout(open()?).stderr(open()?);
        let http = ports.http;
        let https = ports.https;
        let admin = ports.admin;
        let debug = ports.debug;
        drop(ports);
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot run {}", self.bin.display()))
            .map_err(StartError::Other)?;
        let mut duet = Duet {
            child,
            http,
            https,
            admin,
            debug,
            log,
        };
        match duet.wait_ready(self.until_ready).await {
            Ok(()) => Ok(duet),
            Err(e) => {
                let logs = duet.logs();
                let exited = duet.child.try_wait().ok().flatten().is_some();
                let e = e.context(format!("duet output:\n{logs}"));
                if exited && (logs.contains("cannot listen") || logs.contains("in use")) {
                    Err(StartError::PortTaken(e))
                } else {
                    Err(StartError::Other(e))
                }
            }
        }
    }
}

enum StartError {
    PortTaken(anyhow::Error),
    Other(anyhow::Error),
}

/// Ports found free by binding port 0; held until just before `duet` starts.
struct FreePorts {
    http: [SocketAddr; 2],
    https: [SocketAddr; 2],
    admin: [SocketAddr; 2],
    debug: [SocketAddr; 2],
    _held: Vec<TcpListener>,
}

impl FreePorts {
    fn pick() -> anyhow::Result<FreePorts> {
        let mut held = Vec::new();
        let mut pair = || -> anyhow::Result<[SocketAddr; 2]> {
            let mut out = [SocketAddr::from(([0, 0, 0, 0], 0)); 2];
            for (slot, family) in out.iter_mut().zip(Family::BOTH) {
                let l = TcpListener::bind(SocketAddr::new(family.loopback(), 0))
                    .with_context(|| format!("no free port on {family} loopback"))?;
                *slot = l.local_addr()?;
                held.push(l);
            }
            Ok(out)
        };
        let http = pair()?;
        let https = pair()?;
        let admin = pair()?;
        let debug = pair()?;
        Ok(FreePorts {
            http,
            https,
            admin,
            debug,
            _held: held,
        })
    }
}

/// A running `duet serve`, killed on drop (its output printed if the test is panicking).
#[derive(Debug)]
pub struct Duet {
    child: Child,
    http: [SocketAddr; 2],
    https: [SocketAddr; 2],
    admin: [SocketAddr; 2],
    debug: [SocketAddr; 2],
    log: tempfile::NamedTempFile,
}

fn index(family: Family) -> usize {
    match family {
        Family::V4 => 0,
        Family::V6 => 1,
    }
}

impl Duet {
    /// The HTTP listener of a family.
    pub fn http(&self, family: Family) -> SocketAddr {
        self.http[index(family)]
    }

    /// The HTTPS listener of a family.
    pub fn https(&self, family: Family) -> SocketAddr {
        self.https[index(family)]
    }

    /// The admin listener of a family.
    pub fn admin(&self, family: Family) -> SocketAddr {
        self.admin[index(family)]
    }

    /// The `/debug/routes` listener of a family.
    pub fn debug(&self, family: Family) -> SocketAddr {
        self.debug[index(family)]
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM and waits up to `timeout` for the process to exit; returns whether it did.
    pub fn terminate(&mut self, timeout: Duration) -> anyhow::Result<bool> {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .context("cannot run kill")?;
        if !status.success() {
            bail!("kill -TERM {} failed: {status}", self.child.id());
        }
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if self.child.try_wait()?.is_some() {
                return Ok(true);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(false)
    }

    /// Sends SIGKILL without waiting (for a shared handle, e.g. from a signal handler; the
    /// process is reaped on drop or by init).
    pub fn kill_now(&self) {
        let _ = Command::new("kill")
            .arg("-KILL")
            .arg(self.child.id().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }

    /// Everything the process printed so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// Fails if the process has exited.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("duet exited ({status}); output:\n{}", self.logs());
        }
        Ok(())
    }

    /// Waits for `/readyz` to answer 200 (any answer unless `until_ready`).
    async fn wait_ready(&mut self, until_ready: bool) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        let addr = self.admin(Family::V4);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("duet exited before it was ready ({status})");
            }
            let last = match client::get(addr, "localhost", "/readyz").await {
                Ok(r) if r.status == 200 || !until_ready => return Ok(()),
                Ok(r) => format!("/readyz answered {}", r.status),
                Err(e) => format!("{e:#}"),
            };
            if tokio::time::Instant::now() >= deadline {
                bail!("duet not ready after {READY_TIMEOUT:?}: {last}");
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// `GET path` on the admin listener of a family.
    pub async fn admin_get(&self, family: Family, path: &str) -> anyhow::Result<Reply> {
        client::get(self.admin(family), "localhost", path).await
    }

    /// `GET path` on the debug listener of a family.
    pub async fn debug_get(&self, family: Family, path: &str) -> anyhow::Result<Reply> {
        client::get(self.debug(family), "localhost", path).await
    }

    /// `/debug/routes` as JSON (from the debug listener).
    pub async fn debug_routes(&self) -> anyhow::Result<Value> {
        let reply = self.debug_get(Family::V4, "/debug/routes").await?;
        client::expect_status(&reply, 200)?;
        serde_json::from_slice(&reply.body).context("/debug/routes is not JSON")
    }
}

/// A port free on both 0.0.0.0 and [::] (IPv6-only), for a Gateway listener: duet binds each of
/// its ports on both families.
pub fn free_port() -> anyhow::Result<u16> {
    for _ in 0..20 {
        let v4 = dataplane::listen::bind("0.0.0.0:0".parse()?)?;
        let port = v4.local_addr()?.port();
        if dataplane::listen::bind(SocketAddr::from(([0u16; 8], port))).is_ok() {
            return Ok(port);
        }
    }
    bail!("no port free on both families")
}

/// The finding for the ingress-nginx annotation `key` (without its prefix) of the Ingress named
/// `ingress` in a `/debug/routes` answer's annotation report, if it lists one.
pub fn nginx_finding(routes: &Value, ingress: &str, key: &str) -> Option<Value> {
    let full = format!("{}{key}", crate::manifests::NGINX_ANNOTATION_PREFIX);
    routes["annotations"]
        .as_array()?
        .iter()
        .find(|r| r["ingress"]["name"] == ingress)?["annotations"]
        .as_array()?
        .iter()
        .find(|f| f["key"] == full.as_str())
        .cloned()
}

/// The status of [`nginx_finding`]'s finding (`honoured`, `invalid-value`, ...).
pub fn nginx_status(routes: &Value, ingress: &str, key: &str) -> Option<String> {
    nginx_finding(routes, ingress, key).map(|f| f["status"].as_str().unwrap_or_default().to_owned())
}

impl Drop for Duet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let logs = self.logs();
            let lines: Vec<&str> = logs.lines().collect();
            let tail = &lines[lines.len().saturating_sub(200)..];
            eprintln!("---- duet output (last {} lines) ----", tail.len());
            for line in tail {
                eprintln!("{line}");
            }
            eprintln!("---- end of duet output ----");
        }
    }
}
