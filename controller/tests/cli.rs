//! The `duet` binary's command-line contract: a bad flag or value exits 64 with one line on
//! stderr, help and version exit 0, a listener that cannot bind exits 1 naming the address, and
//! SIGTERM drains and exits 0.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const DUET: &str = env!("CARGO_BIN_EXE_duet");

fn run(args: &[&str]) -> Output {
    Command::new(DUET)
        .args(args)
        .env_remove("DUET_LOG")
        .output()
        .expect("duet runs")
}

fn stderr_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Asserts exit code 64 and exactly one stderr line starting with `duet: `; returns the line.
fn usage_error(args: &[&str]) -> String {
    let out = run(args);
    assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
    let lines = stderr_lines(&out);
    assert_eq!(
        lines.len(),
        1,
        "{args:?}: one line expected, got {lines:#?}"
    );
    assert!(lines[0].starts_with("duet: "), "{}", lines[0]);
    assert!(out.stdout.is_empty());
    lines[0].clone()
}

#[test]
fn bad_flags_and_values_exit_64_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();

    let line = usage_error(&["serve", "--manifests", d, "--upstream-family", "x"]);
    assert!(
        line.starts_with("duet: invalid value 'x' for '--upstream-family': "),
        "{line}"
    );
    assert!(line.contains("PreferSameFamily"), "{line}");

    let line = usage_error(&["serve", "--manifests", d, "--lb", "random"]);
    assert!(
        line.contains("'--lb'") && line.contains("round-robin"),
        "{line}"
    );

    let line = usage_error(&["serve", "--manifests", d, "--canary-scope", "global"]);
    assert!(
        line.starts_with("duet: invalid value 'global' for '--canary-scope': "),
        "{line}"
    );
    assert!(line.contains("namespace or cluster"), "{line}");
    let line = usage_error(&["migrate", "check", "--canary-scope", "Cluster", d]);
    assert!(line.contains("'--canary-scope'"), "{line}");

    let line = usage_error(&["serve", "--manifests", d, "--http-listen", "localhost"]);
    assert!(line.contains("'--http-listen'"), "{line}");

    let line = usage_error(&["serve", "--manifests", d, "--connect-timeout", "soon"]);
    assert!(line.contains("'--connect-timeout'"), "{line}");

    let line = usage_error(&["serve", "--manifests", d, "--no-such-flag"]);
    assert!(line.contains("--no-such-flag"), "{line}");

    let line = usage_error(&["serve", "--manifests", "/nonexistent/duet-manifests"]);
    assert!(line.contains("/nonexistent/duet-manifests"), "{line}");

    let line = usage_error(&["frobnicate"]);
    assert!(line.contains("frobnicate"), "{line}");
    let line = usage_error(&[]);
    assert!(line.contains("missing subcommand"), "{line}");
}

#[test]
fn bad_gateway_flags_exit_64_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let line = usage_error(&[
        "serve",
        "--manifests",
        d,
        "--gateway-controller-name",
        "duet",
    ]);
    assert!(
        line.starts_with("duet: invalid value 'duet' for '--gateway-controller-name': "),
        "{line}"
    );
    let line = usage_error(&[
        "serve",
        "--manifests",
        d,
        "--gateway-pod-selector",
        "app duet",
    ]);
    assert!(line.contains("'--gateway-pod-selector'"), "{line}");
}

#[test]
fn out_of_range_durations_sizes_and_limits_exit_64_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    for (flag, value, says) in [
        ("--connect-timeout", "2h", "maximum, 1h"),
        ("--upstream-timeout", "100000000000000h", "maximum, 1h"),
        ("--keepalive-timeout", "3601", "maximum, 1h"),
        ("--header-read-timeout", "61m", "maximum, 1h"),
        ("--drain-timeout", "0", "more than zero"),
        ("--shutdown-delay", "2h", "maximum, 1h"),
        ("--election-lease-duration", "2h", "maximum, 1h"),
        ("--max-body-size", "65g", "maximum, 64g"),
        ("--max-connections", "0", "from 1 to"),
        ("--max-connections", "1000001", "from 1 to"),
        ("--max-passthrough-connections", "0", "from 1 to"),
        (
            "--max-passthrough-connections",
            "4097",
            "more than --max-connections (4096)",
        ),
        ("--passthrough-idle-timeout", "2h", "maximum, 1h"),
        ("--proxy-protocol-from", "10.0.0.0/33", ""),
        (
            "--auth-allowed-destinations",
            "10.0.0.0/8,fe80::/129",
            "CIDR",
        ),
        ("--auth-allowed-destinations", "metadata.internal", "CIDR"),
        ("--debug-listen", "localhost:1", ""),
    ] {
        let line = usage_error(&["serve", "--manifests", d, flag, value]);
        assert!(
            line.contains(&format!("'{flag}'")) && line.contains(says),
            "{flag} {value}: {line}"
        );
    }
}

#[test]
fn kubernetes_mode_without_any_config_exits_64_with_one_line() {
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(DUET)
        .args(["serve", "--http-listen", "127.0.0.1:0"])
        .env_remove("DUET_LOG")
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", home.path())
        .output()
        .expect("duet runs");
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let lines = stderr_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    let line = &lines[0];
    assert!(
        line.starts_with("duet: no Kubernetes API configuration"),
        "{line}"
    );
    assert!(
        line.contains("--kubeconfig") && line.contains("--manifests"),
        "{line}"
    );

    // A kubeconfig that does not exist, by flag or by KUBECONFIG, is named.
    let line = usage_error(&["serve", "--kubeconfig", "/nonexistent/duet-kubeconfig"]);
    assert!(line.contains("/nonexistent/duet-kubeconfig"), "{line}");
    let out = Command::new(DUET)
        .args(["serve"])
        .env_remove("DUET_LOG")
        .env("KUBECONFIG", "/nonexistent/duet-kc-env")
        .output()
        .expect("duet runs");
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(stderr_lines(&out)[0].contains("/nonexistent/duet-kc-env"));
    let line = usage_error(&["serve", "--watch-namespace", "Not_A_Namespace"]);
    assert!(line.contains("--watch-namespace"), "{line}");
}

#[test]
fn invalid_log_filter_exits_64() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(DUET)
        .args(["serve", "--manifests", dir.path().to_str().unwrap()])
        .env("DUET_LOG", "web=loudest")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let lines = stderr_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("DUET_LOG"), "{}", lines[0]);
}

#[test]
fn help_and_version_exit_0_on_stdout() {
    let out = run(&["serve", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--manifests",
        "--http-listen",
        "--https-listen",
        "--admin-listen",
        "--ingress-class",
        "--controller-name",
        "--watch-ingress-without-class",
        "--upstream-family",
        "--lb",
        "--connect-timeout",
        "--upstream-timeout",
    ] {
        assert!(help.contains(flag), "help lacks {flag}");
    }
    let out = run(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("duet "));
}

#[test]
fn a_listener_that_cannot_bind_exits_1_naming_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let out = run(&[
        "serve",
        "--manifests",
        dir.path().to_str().unwrap(),
        "--http-listen",
        &addr,
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let lines = stderr_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].starts_with("duet: "), "{}", lines[0]);
    assert!(lines[0].contains(&addr), "{}", lines[0]);
}

#[test]
fn sigterm_drains_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(DUET)
        .args([
            "serve",
            "--manifests",
            dir.path().to_str().unwrap(),
            "--http-listen",
            "127.0.0.1:0",
            "--http-listen",
            "[::1]:0",
            "--https-listen",
            "[::1]:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .env("DUET_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let listening = loop {
        let line = lines
            .next()
            .expect("duet logs before exiting")
            .expect("utf-8 logs");
        if line.contains("Listening") {
            break line;
        }
    };
    // One line lists every bound listener, with the ports actually bound.
    assert!(listening.contains("127.0.0.1:"), "{listening}");
    assert!(listening.contains("[::1]:"), "{listening}");
    assert!(!listening.contains(":0 "), "{listening}");

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        assert!(Instant::now() < deadline, "duet did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(code, Some(0));
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(rest.iter().any(|l| l.contains("Draining")), "{rest:#?}");
}
