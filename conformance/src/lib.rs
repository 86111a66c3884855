//! duet's test harness: the echo backend (the upstream conformance JSON contract plus the family
//! and addresses a request arrived on), in-process echo pods on ephemeral loopback ports, manifest
//! builders, a runner for the real `duet` binary, a family-aware HTTP client and a real
//! Kubernetes control plane ([`cluster`]).
//!
//! A typical end-to-end test:
//!
//! ```no_run
//! # async fn t() -> anyhow::Result<()> {
//! use conformance::{DuetBuilder, Family, Fleet, Ingress, ManifestDir, PodSpec};
//! let pods = Fleet::start("demo", "echo", &[PodSpec::dual("a"), PodSpec::v6_only("b")])?;
//! let dir = ManifestDir::new()?;
//! dir.write("class.yaml", &[conformance::manifests::ingress_class("duet", conformance::manifests::CONTROLLER)])?;
//! dir.write("echo.yaml", &pods.manifests())?;
//! dir.write("ingress.yaml", &[Ingress::new("demo", "echo").host("demo.test", "echo").build()])?;
//! let duet = DuetBuilder::new("target/debug/duet", dir.path()).start().await?;
//! let reply = conformance::client::get(duet.http(Family::V6), "demo.test", "/").await?;
//! assert_eq!(reply.echo()?.family, Family::V6);
//! # Ok(()) }
//! ```

pub mod client;
pub mod cluster;
pub mod duet;
pub mod echo;
pub mod fleet;
pub mod h3client;
pub mod manifests;
pub mod raw;
pub mod runner;
pub mod tls;

pub use client::{Conn, Reply};
// Re-exported so tests build requests with the same versions without depending on them.
pub use duet::{Duet, DuetBuilder};
pub use echo::{Echo, EchoServer, Family, Identity};
pub use fleet::{Fleet, Pod, PodSpec, Port};
pub use manifests::{Ingress, ManifestDir, PathType, PortRef};
pub use {bytes, http, http_body_util, rustls};

/// Parses the flags of one of the harness's binaries as duet parses its own: `--help` and
/// `--version` print and exit 0; a bad flag prints one line, `PROGRAM: reason`, and exits 64.
pub fn parse_args<A: clap::Parser>(program: &str) -> A {
    match A::try_parse() {
        Ok(args) => args,
        Err(e) if !e.use_stderr() => {
            print!("{e}");
            std::process::exit(0);
        }
        Err(e) => {
            let first = e.to_string();
            let line = first.lines().next().unwrap_or("invalid arguments");
            eprintln!("{program}: {}", line.trim_start_matches("error: "));
            std::process::exit(64);
        }
    }
}

/// Generates, for each `async fn name(family: Family) -> anyhow::Result<()>` named, a module
/// `name` with a `v4` and a `v6` `#[tokio::test]` running it over that family.
#[macro_export]
macro_rules! both_families {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn v4() {
                super::$name($crate::Family::V4).await.unwrap();
            }
            #[tokio::test]
            async fn v6() {
                super::$name($crate::Family::V6).await.unwrap();
            }
        }
    )*};
}
