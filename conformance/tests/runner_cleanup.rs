//! `duet-conformance` leaves no `duet` process and no control plane behind however it ends:
//! SIGTERM, Ctrl-C (SIGINT) or SIGKILL in the middle of a scenario, on its default (real)
//! control plane: duet, the process holding the cluster's network namespace and the cluster's
//! folder (etcd data, logs) are gone.
//!
//! Needs the `duet` binary beside `duet-conformance` (`cargo test --workspace` builds both), and
//! root and Go for the real control plane (as `real_cluster.rs`).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// A scenario that waits (here 120 s) for a status that never comes: the runner is busy in it
/// with duet running when the signal arrives.
const HANGING_FEATURE: &str = r#"Feature: Hang
  Scenario: Waits for a status that never comes
    Given an Ingress resource in a new random namespace
    """
    apiVersion: networking.k8s.io/v1
    kind: Ingress
    metadata:
      name: hang
    spec:
      ingressClassName: some-invalid-class-name
      defaultBackend:
        service:
          name: hang
          port:
            number: 8080
    """
    Then The Ingress status should not contain the IP address or FQDN
"#;

fn duet_bin() -> PathBuf {
    let runner = PathBuf::from(env!("CARGO_BIN_EXE_duet-conformance"));
    let duet = runner.with_file_name("duet");
    assert!(
        duet.exists(),
        "{} is missing: build it with `cargo build -p controller --bin duet`",
        duet.display()
    );
    duet
}

/// Runners start one at a time: three control planes starting at once on two cores only slow
/// each other down.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Starts the runner on the hanging feature; returns it, its duet's pid and the pid holding its
/// cluster's network namespace once the scenario runs.
fn start_runner(dir: &tempfile::TempDir) -> anyhow::Result<(Child, u32, u32, PathBuf)> {
    let feature = dir.path().join("hang.feature");
    std::fs::write(&feature, HANGING_FEATURE)?;
    let mut runner = Command::new(env!("CARGO_BIN_EXE_duet-conformance"))
        .arg(&feature)
        .args(["--family", "ipv4", "--ingress-class-wait", "120", "--duet"])
        .arg(duet_bin())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = runner.stdout.take().context("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    // `real control plane in /proc/NETNS/ns/net: duet pid PID on ..., folder DIR`
    let (pid, netns, folder) = loop {
        let Some(line) = lines.next() else {
            bail!("the runner ended before it started duet");
        };
        let line = line?;
        if let Some(rest) = line.strip_prefix("real control plane in /proc/") {
            let netns = rest.split('/').next().context("no netns pid")?.parse()?;
            let pid = rest
                .split("duet pid ")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .context("no pid")?
                .parse::<u32>()?;
            let folder = rest.split(", folder ").nth(1).context("no folder")?;
            break (pid, netns, PathBuf::from(folder));
        }
    };
    // Keep draining stdout so the runner never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines.by_ref() {});
    assert!(alive(pid), "duet (pid {pid}) is not running");
    assert!(
        alive(netns),
        "the namespace holder (pid {netns}) is not running"
    );
    assert!(folder.exists(), "no cluster folder {}", folder.display());
    Ok((runner, pid, netns, folder))
}

/// Whether a process exists and is not a zombie (an orphan is reaped by init eventually).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next());
            state != Some('Z') && state != Some('X')
        }
        Err(_) => false,
    }
}

fn send(signal: &str, pid: u32) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()?;
    anyhow::ensure!(status.success(), "kill -{signal} {pid} failed");
    Ok(())
}

fn wait_gone(pid: u32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    !alive(pid)
}

fn check(signal: &str, expected_code: Option<i32>) -> anyhow::Result<()> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir()?;
    let (mut runner, duet, netns, folder) = start_runner(&dir)?;
    send(signal, runner.id())?;
    let status = runner.wait()?;
    let gone = wait_gone(duet, Duration::from_secs(10));
    if !gone {
        let _ = send("KILL", duet);
    }
    let netns_gone = wait_gone(netns, Duration::from_secs(10));
    if !netns_gone {
        let _ = send("KILL", netns);
    }
    assert!(
        gone,
        "duet (pid {duet}) still runs after the runner got SIG{signal}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while folder.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let folder_left = folder.exists();
    if folder_left {
        let _ = std::fs::remove_dir_all(&folder);
    }
    assert!(
        !folder_left,
        "the cluster's folder {} (etcd data, logs) is left after the runner got SIG{signal}",
        folder.display()
    );
    assert!(
        netns_gone,
        "the cluster's namespace holder (pid {netns}) still runs after the runner got SIG{signal}"
    );
    assert_eq!(
        status.code(),
        expected_code,
        "runner exit after SIG{signal}"
    );
    Ok(())
}

#[test]
fn sigterm_stops_duet() -> anyhow::Result<()> {
    check("TERM", Some(143))
}

#[test]
fn ctrl_c_stops_duet() -> anyhow::Result<()> {
    check("INT", Some(130))
}

#[test]
fn sigkill_of_the_runner_stops_duet() -> anyhow::Result<()> {
    check("KILL", None)
}
