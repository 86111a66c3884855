//! End to end, over real sockets on 127.0.0.1 and [::1]: ingress-nginx's `cors-allow-methods` and
//! `cors-allow-headers` with values of their own (the defaults are covered in
//! `e2e_nginx_traffic.rs`): a preflight gets exactly those lists, an invalid list falls back to
//! ingress-nginx's default.

use conformance::bytes::Bytes;
use conformance::client::{self, Conn};
use conformance::http::Method;
use conformance::http_body_util::Full;
use conformance::{DuetBuilder, Family, Fleet, Ingress, ManifestDir, PodSpec};

const DUET: &str = env!("CARGO_BIN_EXE_duet");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflights_carry_the_configured_methods_and_headers() -> anyhow::Result<()> {
    let fleet = Fleet::start("corsv", "web", &[PodSpec::dual("web-0")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("fleet.yaml", &fleet.manifests())?;
    let ingresses = [
        Ingress::new("corsv", "custom")
            .nginx_annotations(&[
                ("enable-cors", "true"),
                ("cors-allow-methods", "GET, POST"),
                ("cors-allow-headers", "X-Custom, Authorization"),
            ])
            .host("custom.test", "web"),
        Ingress::new("corsv", "bad")
            .nginx_annotations(&[("enable-cors", "true"), ("cors-allow-methods", "GET; DROP")])
            .host("bad.test", "web"),
    ];
    dir.write("ingress.yaml", &ingresses.map(|i| i.build()))?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    let preflight = |host: &str| {
        client::request(Method::OPTIONS, host, "/api")
            .header("origin", "https://app.example.com")
            .header("access-control-request-method", "POST")
            .body(Full::new(Bytes::new()))
    };
    for family in Family::BOTH {
        let mut conn = Conn::http1(duet.http(family)).await?;
        let reply = conn.send(preflight("custom.test")?).await?;
        client::expect_status(&reply, 204)?;
        assert_eq!(
            reply.header("access-control-allow-methods"),
            Some("GET, POST"),
            "{family}"
        );
        assert_eq!(
            reply.header("access-control-allow-headers"),
            Some("X-Custom, Authorization"),
            "{family}"
        );
        let reply = conn.send(preflight("bad.test")?).await?;
        client::expect_status(&reply, 204)?;
        assert_eq!(
            reply.header("access-control-allow-methods"),
            Some("GET, PUT, POST, DELETE, PATCH, OPTIONS"),
            "{family}: the default"
        );
    }
    Ok(())
}
