//! The aioquic HTTP/3 client of the end-to-end tests (`h3client/h3client.py`), in a venv
//! `h3client/setup.sh` makes on demand: one JSON plan in, one JSON report out (the plan and
//! report are described at the top of the script).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;

/// The venv's python with aioquic, made once per test binary by setup.sh (which installs it on
/// a fresh machine): the tests never skip for want of a client.
pub fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let setup = Path::new(env!("CARGO_MANIFEST_DIR")).join("h3client/setup.sh");
        let out = std::process::Command::new(&setup)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", setup.display()));
        assert!(
            out.status.success(),
            "{} failed: {}",
            setup.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}

/// Runs one plan through the client and returns its report (the plan is read at once: the
/// future borrows nothing).
pub fn run(plan: &Value) -> impl Future<Output = anyhow::Result<Value>> + Send + 'static {
    let plan = plan.to_string();
    async move {
        let python = python().to_owned();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("h3client/h3client.py");
        let out = tokio::process::Command::new(python)
            .arg(script)
            .arg(plan)
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(60), out).await??;
        anyhow::ensure!(
            out.status.success(),
            "h3client failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(serde_json::from_slice(&out.stdout)?)
    }
}

/// Bytes as the report's lowercase hex (the server's certificate).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
