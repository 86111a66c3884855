//! `duet-conformance`: the Ingress conformance runner (see `conformance::runner`),
//! `duet-conformance gateway`, the Gateway API conformance runner
//! (`conformance::runner::gateway`), and `duet-conformance node-scenarios`, duet on a real node
//! under load while it rolls and fails (`conformance::runner::node_scenarios`).

use clap::Parser;
use conformance::runner::gateway::GatewayCli;
use conformance::runner::node_scenarios::NodeScenariosCli;
use conformance::runner::Cli;
use tokio::signal::unix::{signal, SignalKind};

/// What to run.
enum Command {
    Ingress(Cli),
    Gateway(GatewayCli),
    NodeScenarios(NodeScenariosCli),
}

/// Parses the command line; a bad one exits 64 with its first line, `--help` exits 0.
fn parse() -> Command {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let parsed = if args.get(1).is_some_and(|a| a == "gateway") {
        args.remove(1);
        GatewayCli::try_parse_from(args).map(Command::Gateway)
    } else if args.get(1).is_some_and(|a| a == "node-scenarios") {
        args.remove(1);
        NodeScenariosCli::try_parse_from(args).map(Command::NodeScenarios)
    } else {
        Cli::try_parse_from(args).map(Command::Ingress)
    };
    match parsed {
        Ok(command) => command,
        Err(e) if e.use_stderr() => {
            let text = e.to_string();
            eprintln!("{}", text.lines().next().unwrap_or("bad arguments"));
            std::process::exit(64);
        }
        Err(e) => {
            let _ = e.print();
            std::process::exit(0);
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let command = parse();
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
        result = run(command) => match result {
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

async fn run(command: Command) -> anyhow::Result<i32> {
    match command {
        Command::Ingress(cli) => conformance::runner::main(cli).await,
        Command::Gateway(cli) => conformance::runner::gateway::main(cli).await,
        Command::NodeScenarios(cli) => conformance::runner::node_scenarios::main(cli).await,
    }
}

/// Stops the runner's children when main unwinds.
struct Shutdown;

impl Drop for Shutdown {
    fn drop(&mut self) {
        conformance::runner::shutdown();
    }
}
