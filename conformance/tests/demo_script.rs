//! `examples/demo.sh` (the README's run command) stops everything it started when the script
//! alone gets SIGTERM (`kill PID`, `timeout`, a supervisor), SIGHUP (a closed terminal) or SIGINT:
//! once it serves duet's demo on both families, the signal goes to the script's pid only; the
//! script exits with 128 + the signal's number, every process it started (duet, the echo pods)
//! is gone, and every port it listened on is free again, on 127.0.0.1 and [::1].
//!
//! Each run has a network namespace of its own (the demo's ports are fixed), so it needs root,
//! util-linux (`unshare`, `setsid`) and iproute2, as the cluster tests. The script runs the debug
//! `duet` and `duet-echo` beside this test (`DUET_DEMO_BIN`) instead of building release ones.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use conformance::cluster::netns::{self, NetNs};

/// Every port the demo listens on: HTTP, HTTPS, the demo Gateway, debug, admin, the echo pods.
const PORTS: [u16; 8] = [8080, 8443, 8081, 10253, 10254, 9001, 9002, 9003];
const LOOPBACKS: [&str; 2] = ["127.0.0.1", "[::1]"];
/// Time for the debug build of duet to start and serve on a busy machine.
const SERVE_WITHIN: Duration = Duration::from_secs(60);
/// Time for the script and its processes to end once signalled (no shutdown delay in the demo).
const STOP_WITHIN: Duration = Duration::from_secs(15);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// The folder of the debug `duet-echo`, with `duet` beside it.
fn bin_dir() -> PathBuf {
    let echo = PathBuf::from(env!("CARGO_BIN_EXE_duet-echo"));
    let dir = echo.parent().expect("a folder").to_path_buf();
    assert!(
        dir.join("duet").exists(),
        "{} is missing: build it with `cargo build -p controller --bin duet`",
        dir.join("duet").display()
    );
    dir
}

/// `/proc/PID/stat`: the command name, the state and the parent pid.
fn stat(pid: u32) -> Option<(String, char, u32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, rest) = text.rsplit_once(") ")?;
    let comm = head.split_once(" (")?.1.to_string();
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((comm, state, ppid))
}

fn alive(pid: u32) -> bool {
    stat(pid).is_some_and(|(_, state, _)| state != 'Z' && state != 'X')
}

/// Every living descendant of `root`, with its command name.
fn descendants(root: u32) -> anyhow::Result<BTreeMap<u32, String>> {
    let mut children: BTreeMap<u32, Vec<(u32, String)>> = BTreeMap::new();
    for entry in std::fs::read_dir("/proc")? {
        let Some(pid) = entry?.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if let Some((comm, state, ppid)) = stat(pid) {
            if state != 'Z' {
                children.entry(ppid).or_default().push((pid, comm));
            }
        }
    }
    let mut found = BTreeMap::new();
    let mut todo = vec![root];
    while let Some(pid) = todo.pop() {
        for (child, comm) in children.remove(&pid).unwrap_or_default() {
            todo.push(child);
            found.insert(child, comm);
        }
    }
    Ok(found)
}

/// `GET /` with `Host: demo.local` on the demo's HTTP port: the status line, if it answered.
fn get(addr: SocketAddr) -> Option<String> {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    conn.write_all(b"GET / HTTP/1.1\r\nHost: demo.local\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer).ok()?;
    answer.lines().next().map(str::to_string)
}

/// Waits until the demo answers 200 over both families (the script's output on failure).
fn wait_serving(script: &mut Child, log: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + SERVE_WITHIN;
    loop {
        let answers: Vec<Option<String>> = LOOPBACKS
            .iter()
            .map(|ip| get(format!("{ip}:8080").parse().expect("an address")))
            .collect();
        if answers
            .iter()
            .all(|a| a.as_deref().is_some_and(|l| l.contains(" 200 ")))
        {
            return Ok(());
        }
        let output = || std::fs::read_to_string(log).unwrap_or_default();
        if let Some(status) = script.try_wait()? {
            bail!("demo.sh exited ({status}) before serving:\n{}", output());
        }
        if Instant::now() > deadline {
            bail!(
                "demo.sh not serving within {SERVE_WITHIN:?} ({answers:?}):\n{}",
                output()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The demo's ports still listened on (in the calling thread's namespace).
fn ports_in_use() -> Vec<String> {
    let mut taken = Vec::new();
    for ip in LOOPBACKS {
        for port in PORTS {
            let addr = format!("{ip}:{port}");
            if TcpListener::bind(&addr).is_err() {
                taken.push(addr);
            }
        }
    }
    taken
}

fn send(signal: &str, pid: u32) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .context("cannot run kill")?;
    anyhow::ensure!(status.success(), "kill -{signal} {pid} failed");
    Ok(())
}

/// Ends what a failed run left behind, so that one failure does not leak processes.
fn kill_all(pids: &BTreeSet<u32>) {
    for pid in pids.iter().filter(|p| alive(**p)) {
        let _ = send("KILL", *pid);
    }
}

/// Runs the demo in a namespace of its own, signals the script once it serves, and checks that
/// the script exits with `code` leaving no process and no listening port behind.
fn check(signal: &'static str, code: i32) -> anyhow::Result<()> {
    let ns = NetNs::create()?;
    let path = ns.path().to_path_buf();
    let run = std::thread::spawn(move || -> anyhow::Result<()> {
        netns::enter_path(&path)?;
        netns::ip(&["link", "set", "lo", "up"])?;
        anyhow::ensure!(
            ports_in_use().is_empty(),
            "a fresh namespace has ports in use"
        );
        let log = tempfile::NamedTempFile::new()?;
        // As a terminal starts it: SIGINT and SIGHUP handled by default, even when this test
        // runs where they are ignored (a background job), which bash could not trap.
        let mut script = Command::new("env")
            .arg("--default-signal=INT,HUP,TERM")
            .arg(repo().join("examples/demo.sh"))
            .env("DUET_DEMO_BIN", bin_dir())
            .stdin(Stdio::null())
            .stdout(log.reopen()?)
            .stderr(log.reopen()?)
            .spawn()
            .context("cannot run examples/demo.sh")?;
        let pid = script.id();
        let serving = wait_serving(&mut script, log.path());
        let started = descendants(pid)?;
        let mut every: BTreeSet<u32> = started.keys().copied().collect();
        every.insert(pid);
        if let Err(e) = serving {
            kill_all(&every);
            return Err(e);
        }
        let names: BTreeSet<&str> = started.values().map(String::as_str).collect();
        let expected = BTreeSet::from(["duet", "duet-echo"]);
        if !expected.is_subset(&names) {
            kill_all(&every);
            bail!("demo.sh started {started:?}, not duet and duet-echo");
        }
        send(signal, pid)?;
        let deadline = Instant::now() + STOP_WITHIN;
        let status = loop {
            if let Some(status) = script.try_wait()? {
                break Some(status);
            }
            if Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        while Instant::now() < deadline && started.keys().any(|p| alive(*p)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let left: Vec<String> = started
            .iter()
            .filter(|(p, _)| alive(**p))
            .map(|(p, c)| format!("{c} (pid {p})"))
            .collect();
        let ports = ports_in_use();
        kill_all(&every);
        let _ = script.wait();
        let output = std::fs::read_to_string(log.path()).unwrap_or_default();
        let Some(status) = status else {
            bail!("demo.sh still runs {STOP_WITHIN:?} after SIG{signal}:\n{output}");
        };
        anyhow::ensure!(
            left.is_empty(),
            "left running after SIG{signal} to demo.sh: {left:?}\n{output}"
        );
        anyhow::ensure!(
            ports.is_empty(),
            "ports still in use after SIG{signal}: {ports:?}"
        );
        anyhow::ensure!(
            status.code() == Some(code),
            "demo.sh exited {status} after SIG{signal}, not {code}"
        );
        Ok(())
    });
    let result = run
        .join()
        .map_err(|_| anyhow::anyhow!("the demo thread panicked"))?;
    drop(ns);
    result
}

/// One demo at a time: each starts duet and three pods, and they would share the two cores.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn sigterm_to_the_script_stops_duet_and_the_pods() -> anyhow::Result<()> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    check("TERM", 143)
}

#[test]
fn sighup_to_the_script_stops_duet_and_the_pods() -> anyhow::Result<()> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    check("HUP", 129)
}

#[test]
fn ctrl_c_to_the_script_stops_duet_and_the_pods() -> anyhow::Result<()> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    check("INT", 130)
}
