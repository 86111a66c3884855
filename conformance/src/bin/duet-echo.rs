//! `duet-echo`: the echo backend as a process. Serves one or more named "pods", each on its own
//! sockets (IPv6 ones `IPV6_V6ONLY`), answering with the conformance echo JSON plus the family and
//! addresses the request arrived on, and echoing bytes back after a WebSocket-style upgrade.
//!
//! ```text
//! duet-echo --pod dual=127.0.0.1:9001,[::1]:9001 --pod v4only=127.0.0.1:9002 \
//!           --pod v6only=[::1]:9003 --namespace demo --service echo
//! ```
//!
//! Without `--pod` it behaves like the upstream image: one pod named `$POD_NAME` on
//! `0.0.0.0:$HTTP_PORT` and `[::]:$HTTP_PORT` (port 3000 by default).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use anyhow::{bail, Context};
use clap::Parser;
use conformance::echo::{EchoOptions, EchoServer, Identity};

#[derive(Debug, Parser)]
#[command(
    name = "duet-echo",
    version,
    about = "Echo backend for duet's tests and demo"
)]
struct Args {
    /// A pod to serve: NAME=ADDR[,ADDR...], e.g. `dual=127.0.0.1:9001,[::1]:9001`. Repeatable.
    #[arg(long = "pod", value_name = "NAME=ADDRS", value_parser = parse_pod)]
    pods: Vec<(String, Vec<SocketAddr>)>,
    /// Namespace reported in the echo JSON.
    #[arg(long, env = "NAMESPACE", default_value = "")]
    namespace: String,
    /// Service name reported in the echo JSON.
    #[arg(long, env = "SERVICE_NAME", default_value = "")]
    service: String,
    /// Ingress name reported in the echo JSON.
    #[arg(long, env = "INGRESS_NAME", default_value = "")]
    ingress: String,
    /// Pod name when no --pod is given.
    #[arg(long, env = "POD_NAME", default_value = "echo")]
    pod_name: String,
    /// Port when no --pod is given (both families, all addresses).
    #[arg(long, env = "HTTP_PORT", default_value_t = 3000)]
    http_port: u16,
    /// Do not print a line per request.
    #[arg(long)]
    quiet: bool,
}

fn parse_pod(value: &str) -> Result<(String, Vec<SocketAddr>), String> {
    let (name, addrs) = value
        .split_once('=')
        .ok_or_else(|| format!("{value:?} is not NAME=ADDR[,ADDR...]"))?;
    if name.is_empty() {
        return Err(format!("{value:?} has an empty pod name"));
    }
    let addrs = addrs
        .split(',')
        .map(|a| {
            a.trim().parse::<SocketAddr>().map_err(|e| {
                format!("{a:?} is not an address like 127.0.0.1:9001 or [::1]:9001: {e}")
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((name.to_owned(), addrs))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let identity = Identity {
        namespace: args.namespace,
        ingress: args.ingress,
        service: args.service,
    };
    let options = EchoOptions {
        log: !args.quiet,
        ..EchoOptions::default()
    };
    let server = if args.pods.is_empty() {
        let v4 = SocketAddr::from((Ipv4Addr::UNSPECIFIED, args.http_port));
        let v6 = SocketAddr::from((Ipv6Addr::UNSPECIFIED, args.http_port));
        let both = vec![(args.pod_name.clone(), vec![v4, v6])];
        match EchoServer::bind(identity.clone(), &both, options.clone()) {
            Ok(server) => server,
            Err(e) => {
                eprintln!("duet-echo: {e}; serving IPv4 only");
                EchoServer::bind(identity, &[(args.pod_name, vec![v4])], options)?
            }
        }
    } else {
        let mut names: Vec<&str> = args.pods.iter().map(|(n, _)| n.as_str()).collect();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) {
            bail!("each --pod needs its own name");
        }
        EchoServer::bind(identity, &args.pods, options).context("starting the echo pods")?
    };
    for pod in server.pods() {
        let addrs: Vec<String> = pod.addrs.iter().map(ToString::to_string).collect();
        eprintln!(
            "duet-echo: pod {} listening on {}",
            pod.name,
            addrs.join(", ")
        );
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    server.shutdown();
    Ok(())
}
