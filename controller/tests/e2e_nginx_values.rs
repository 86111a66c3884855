//! End to end, over real sockets on 127.0.0.1 and [::1]: top-40 ingress-nginx keys whose own
//! values were only unit-tested (their defaults are covered in `e2e_nginx_traffic.rs`):
//! `cors-allow-methods` and `cors-allow-headers` (a preflight gets exactly those lists, an invalid
//! list falls back to ingress-nginx's default) and `session-cookie-expires` (the affinity cookie's
//! `Expires`, that many seconds ahead, beside `Max-Age`).

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

/// An HTTP date (`Tue, 14 Nov 2023 22:14:20 GMT`) in Unix seconds.
fn http_date(text: &str) -> Option<i64> {
    let parts: Vec<&str> = text.split([' ', ':']).collect();
    let [_, day, month, year, h, m, sec, "GMT"] = parts.as_slice() else {
        return None;
    };
    let months = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = months.iter().position(|x| x == month)? as i64 + 1;
    let (y, d): (i64, i64) = (year.parse().ok()?, day.parse().ok()?);
    // Days from civil (Howard Hinnant's algorithm).
    let y = if month <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs =
        h.parse::<i64>().ok()? * 3600 + m.parse::<i64>().ok()? * 60 + sec.parse::<i64>().ok()?;
    Some(days * 86_400 + secs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_affinity_cookie_expires_when_asked() -> anyhow::Result<()> {
    let fleet = Fleet::start(
        "aff",
        "web",
        &[PodSpec::dual("web-0"), PodSpec::dual("web-1")],
    )?;
    let dir = ManifestDir::with_class()?;
    dir.write("fleet.yaml", &fleet.manifests())?;
    let ingress = Ingress::new("aff", "sticky")
        .nginx_annotations(&[
            ("affinity", "cookie"),
            ("session-cookie-expires", "7200"),
            ("session-cookie-max-age", "3600"),
        ])
        .host("sticky.test", "web");
    dir.write("ingress.yaml", &[ingress.build()])?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    for family in Family::BOTH {
        let mut conn = Conn::http1(duet.http(family)).await?;
        let req = client::request(Method::GET, "sticky.test", "/").body(Full::new(Bytes::new()))?;
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs() as i64;
        let reply = conn.send(req).await?;
        client::expect_status(&reply, 200)?;
        let cookie = reply.header("set-cookie").unwrap_or_default().to_owned();
        assert!(cookie.contains("; Max-Age=3600"), "{family}: {cookie}");
        let expires = cookie
            .split("; ")
            .find_map(|a| a.strip_prefix("Expires="))
            .and_then(http_date);
        let Some(expires) = expires else {
            anyhow::bail!("{family}: no Expires in {cookie}");
        };
        let ahead = expires - before;
        assert!(
            (7195..=7260).contains(&ahead),
            "{family}: {ahead} s ahead: {cookie}"
        );
    }
    Ok(())
}
