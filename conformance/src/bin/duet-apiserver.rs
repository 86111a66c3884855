//! `duet-apiserver`: the test Kubernetes API server as a process, for trying duet by hand or from
//! scripts (the chart's Helm install test). It prints its URL, writes a kubeconfig, and takes
//! objects and history expiry on `/_test/` endpoints (see `conformance::apiserver`).
//!
//! ```text
//! duet-apiserver --listen [::1]:6443 --kubeconfig /tmp/kubeconfig
//! curl -X POST 'http://[::1]:6443/_test/expire'
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use conformance::apiserver::{write_kubeconfig, ApiServer, Options};

#[derive(Debug, Parser)]
#[command(
    name = "duet-apiserver",
    version,
    about = "Test Kubernetes API server for duet"
)]
struct Args {
    /// Address to listen on, e.g. `127.0.0.1:6443` or `[::1]:6443` (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Also write the kubeconfig to this path.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Milliseconds between BOOKMARK events on watches that allow them.
    #[arg(long, default_value_t = 5000)]
    bookmark_interval_ms: u64,
    /// Upper bound of a watch's duration in seconds (clients ask for up to 290 s).
    #[arg(long)]
    max_watch_timeout_secs: Option<u64>,
    /// Events kept for resuming watches.
    #[arg(long, default_value_t = 100_000)]
    history_limit: usize,
    /// Require `Authorization: Bearer TOKEN` (the kubeconfig carries it).
    #[arg(long)]
    token: Option<String>,
}

fn main() {
    let args: Args = conformance::parse_args("duet-apiserver");
    if let Err(e) = run(args) {
        eprintln!("duet-apiserver: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let options = Options {
            bookmark_interval: Duration::from_millis(args.bookmark_interval_ms),
            max_watch_timeout: args.max_watch_timeout_secs.map(Duration::from_secs),
            history_limit: args.history_limit,
            token: args.token.clone(),
            ..Options::default()
        };
        let server = ApiServer::start_with(args.listen, options)?;
        let kubeconfig = match &args.kubeconfig {
            Some(path) => {
                write_kubeconfig(path, server.addr(), args.token.as_deref())?;
                path.clone()
            }
            None => server.kubeconfig().to_owned(),
        };
        println!("listening on {}", server.url());
        println!("kubeconfig {}", kubeconfig.display());
        tokio::signal::ctrl_c().await?;
        Ok(())
    })
}
