//! `duet-conformance gateway` leaves nothing behind when it is killed (SIGKILL) in the middle of
//! a run: not the suite (`conformance.test`, exec'd by `run.sh`), not the `echo-basic` pods, not
//! duet, not the control plane or the namespace holders. Every process descended from the runner
//! at the time of the kill is gone soon after; and a bad flag exits 64 with one line.
//!
//! Needs the `duet` binary beside `duet-conformance` (`cargo test --workspace` builds both), and
//! root, Go and nft for the real control plane (as `real_cluster.rs`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

/// Every live process: pid to (parent pid, command name). Zombies count as gone.
fn processes() -> HashMap<u32, (u32, String)> {
    let mut out = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = stat[open + 1..close].to_owned();
        let mut rest = stat[close + 1..].split_whitespace();
        let (state, ppid) = (rest.next(), rest.next().and_then(|p| p.parse().ok()));
        if let (Some(state), Some(ppid)) = (state, ppid) {
            if state != "Z" {
                out.insert(pid, (ppid, comm));
            }
        }
    }
    out
}

/// The live descendants of `root`: pid and command name.
fn descendants(root: u32) -> Vec<(u32, String)> {
    let all = processes();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            all.iter()
                .filter(|(_, (ppid, _))| *ppid == parent)
                .map(|(pid, _)| *pid),
        );
        i += 1;
    }
    found
        .into_iter()
        .skip(1)
        .filter_map(|pid| all.get(&pid).map(|(_, comm)| (pid, comm.clone())))
        .collect()
}

#[test]
fn sigkill_mid_run_leaves_no_process_behind() {
    let reports = tempfile::tempdir().unwrap();
    let mut runner = Command::new(env!("CARGO_BIN_EXE_duet-conformance"))
        .args(["gateway", "--family", "ipv4", "--report-dir"])
        .arg(reports.path())
        .arg("--duet")
        .arg(duet_bin())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Mid-run: the suite runs and the kubelet runs echo-basic pods.
    let deadline = Instant::now() + Duration::from_secs(300);
    let before = loop {
        let now = descendants(runner.id());
        let has = |name: &str| now.iter().any(|(_, comm)| comm == name);
        // Command names are cut at 15 bytes.
        if has("conformance.tes") && has("echo-basic") && has("duet") {
            break now;
        }
        if let Ok(Some(status)) = runner.try_wait() {
            panic!("the runner exited before the suite ran ({status}); it had {now:?}");
        }
        assert!(
            Instant::now() < deadline,
            "no suite and pods after 300 s: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    runner.kill().unwrap();
    runner.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let all = processes();
        let left: Vec<&(u32, String)> = before
            .iter()
            .filter(|(pid, comm)| all.get(pid).is_some_and(|(_, c)| c == comm))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left behind 15 s after SIGKILL: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_bad_gateway_flag_exits_64_with_one_line() {
    for args in [
        vec!["gateway", "--family", "ipv5", "--report-dir", "x"],
        vec!["gateway"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_duet-conformance"))
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
    }
}
