//! `duet-cluster up` leaves nothing behind: after `duet-cluster down`, and after a SIGKILL of
//! `up` itself, none of its processes (etcd, kube-apiserver, kube-controller-manager, the
//! namespace holder) runs and no process is left in its network namespace. A bad flag exits 64.
//!
//! Needs what `real_cluster.rs` needs (root, Go for the first build, iproute2, util-linux).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};

const BIN: &str = env!("CARGO_BIN_EXE_duet-cluster");

/// Clusters start one at a time (see real_cluster.rs).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Whether a process exists and is not a zombie.
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

/// Every live process: (pid, parent pid).
fn processes() -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if matches!(fields.first(), Some(&"Z") | Some(&"X")) {
            continue;
        }
        if let Some(ppid) = fields.get(1).and_then(|p| p.parse().ok()) {
            out.push((pid, ppid));
        }
    }
    out
}

/// Live processes whose network namespace is `ns` (`net:[inode]`).
fn members(ns: &Path) -> Vec<u32> {
    processes()
        .into_iter()
        .map(|(pid, _)| pid)
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/ns/net")).is_ok_and(|l| l == ns))
        .collect()
}

/// Starts `duet-cluster up`; returns it, its children and its namespace once it is ready.
fn up(dir: &Path) -> anyhow::Result<(Child, Vec<u32>, std::path::PathBuf)> {
    let mut child = Command::new(BIN)
        .args(["up", "--single-stack", "--dir"])
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(300);
    while !dir.join("ready").exists() {
        if let Some(status) = child.try_wait()? {
            bail!("duet-cluster up exited: {status}");
        }
        ensure!(
            Instant::now() < deadline,
            "duet-cluster up not ready in 300 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let netns = std::fs::read_to_string(dir.join("netns"))?;
    let ns = std::fs::read_link(netns.trim()).context("the namespace link")?;
    let children: Vec<u32> = processes()
        .into_iter()
        .filter(|&(_, ppid)| ppid == child.id())
        .map(|(pid, _)| pid)
        .collect();
    // The namespace holder, etcd, kube-apiserver, kube-controller-manager.
    ensure!(children.len() >= 4, "children of up: {children:?}");
    ensure!(!members(&ns).is_empty(), "nothing in {}", ns.display());
    Ok((child, children, ns))
}

/// Fails unless every child and every member of the namespace is gone within 10 s.
fn all_gone(children: &[u32], ns: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<u32> = children.iter().copied().filter(|&p| alive(p)).collect();
        let inside = members(ns);
        if left.is_empty() && inside.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            for pid in left.iter().chain(&inside) {
                let _ = Command::new("kill")
                    .arg("-KILL")
                    .arg(pid.to_string())
                    .status();
            }
            bail!("still running: children {left:?}, in the namespace {inside:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn down_stops_every_process_and_the_namespace() -> anyhow::Result<()> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir()?;
    let (mut child, children, ns) = up(dir.path())?;
    let down = Command::new(BIN)
        .args(["down", "--dir"])
        .arg(dir.path())
        .output()?;
    ensure!(down.status.success(), "down: {down:?}");
    ensure!(child.wait()?.success(), "up did not exit cleanly");
    all_gone(&children, &ns)?;
    for file in ["pid", "ready", "netns"] {
        ensure!(!dir.path().join(file).exists(), "{file} left behind");
    }
    Ok(())
}

#[test]
fn sigkill_of_up_stops_every_process_and_the_namespace() -> anyhow::Result<()> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir()?;
    let (mut child, children, ns) = up(dir.path())?;
    child.kill()?;
    child.wait()?;
    all_gone(&children, &ns)
}

#[test]
fn a_bad_flag_exits_64() -> anyhow::Result<()> {
    let out = Command::new(BIN)
        .args(["up", "--dir", "/nonexistent", "--single-stack=ipv5"])
        .output()?;
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ipv5"), "{stderr}");
    Ok(())
}
