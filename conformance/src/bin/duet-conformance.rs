//! `duet-conformance`: the Ingress conformance runner (see `conformance::runner`).

use clap::Parser;
use tokio::signal::unix::{signal, SignalKind};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let cli = match conformance::runner::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            let text = e.to_string();
            eprintln!("{}", text.lines().next().unwrap_or("bad arguments"));
            std::process::exit(64);
        }
        Err(e) => {
            let _ = e.print();
            std::process::exit(0);
        }
    };
    // A panic unwinding out of main drops the guard; `exit` skips destructors, so every exit
    // below calls `shutdown` itself. (A SIGKILL is covered by duet's parent-death signal.)
    let _guard = Shutdown;
    let mut term = match signal(SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            eprintln!("duet-conformance: cannot handle SIGTERM: {e}");
            std::process::exit(1);
        }
    };
    let code = tokio::select! {
        result = conformance::runner::main(cli) => match result {
            Ok(code) => code,
            Err(e) => {
                eprintln!("duet-conformance: {e:#}");
                1
            }
        },
        _ = tokio::signal::ctrl_c() => {
            eprintln!("duet-conformance: interrupted, stopping duet");
            130
        }
        _ = term.recv() => {
            eprintln!("duet-conformance: terminated, stopping duet");
            143
        }
    };
    conformance::runner::shutdown();
    std::process::exit(code);
}

/// Stops the runner's children when main unwinds.
struct Shutdown;

impl Drop for Shutdown {
    fn drop(&mut self) {
        conformance::runner::shutdown();
    }
}
