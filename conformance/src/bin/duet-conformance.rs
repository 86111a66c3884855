//! `duet-conformance`: the Ingress conformance runner (see `conformance::runner`).

use clap::Parser;

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
    match conformance::runner::main(cli).await {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("duet-conformance: {e:#}");
            std::process::exit(1);
        }
    }
}
