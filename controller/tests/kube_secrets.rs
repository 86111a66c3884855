//! Kubernetes mode end to end: duet reads `kubernetes.io/tls` Secrets and, by name, the CA
//! Secrets Ingresses name (`duet.dev/backend-ca-secret`), and no other Secret: every Secret
//! request it makes to the API server selects `type=kubernetes.io/tls` or one `metadata.name`,
//! so an `Opaque` Secret no Ingress names is never listed, watched or cached. A named CA Secret
//! is read when an Ingress starts naming it, its updates apply live (the TLS upstream answers
//! 502 with the wrong CA, 200 with the right one, to clients of both families), a duet that starts
//! is ready only once it has read the named Secrets, and the watch stops when no Ingress names
//! it any more. The htpasswd Secret of ingress-nginx's `auth-secret` is read by name the same way.
//! The API server runs on 127.0.0.1 and [::1].

mod kube_support;

use std::time::Duration;

use conformance::client;
use conformance::cluster::{Fault, Stack};
use conformance::echo::EchoOptions;
use conformance::http::Method;
use conformance::tls::{self, TestCa};
use conformance::{Duet, Family, Ingress};
use kube_support::*;

/// Every Secret request duet made, as `WATCH|GET path fieldSelector`.
fn secret_requests(env: &Env) -> Vec<String> {
    env.proxy
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/secrets") || r.path.contains("/secrets/"))
        .map(|r| {
            let verb = if r.is_watch() { "WATCH" } else { &r.method };
            let selector = r.param("fieldSelector").unwrap_or_default();
            format!("{verb} {} {selector}", r.path)
        })
        .collect()
}

/// Waits until `host` answers `status` to clients of both families.
async fn until(duet: &Duet, host: &str, status: u16, why: &str) -> anyhow::Result<()> {
    for family in Family::BOTH {
        client::eventually(&format!("{why} ({family} client)"), LIVE, || async {
            let reply = client::get(duet.http(family), host, "/").await?;
            client::expect_status(&reply, status)
        })
        .await?;
    }
    Ok(())
}

async fn only_tls_and_named_ca_secrets_are_read(api_family: Family) -> anyhow::Result<()> {
    let env = env(Stack::Dual, &[&format!("sec-{api_family}")]).await?;
    let ns = env.ns.clone();
    let right = TestCa::new("right CA");
    let wrong = TestCa::new("wrong CA");
    let cert = right.issue(&[&format!("secure.{ns}.svc")]);
    let options = EchoOptions {
        tls: Some(tls::server_config(&cert, &["http/1.1"])),
        ..EchoOptions::default()
    };
    let n = if api_family == Family::V4 { 4 } else { 6 };
    let _pod = tls_pod(&env, n, "kubernetes.io/wss", options).await?;
    // A password nobody names, and the CA Secret, holding the wrong CA for now.
    let mut password = tls::ca_secret(&ns, "db-password", "hunter2");
    password["data"] = serde_json::json!({"password": tls::base64(b"hunter2")});
    env.apply(&[
        password,
        tls::ca_secret(&ns, "upstream-ca", &wrong.cert_pem),
    ])
    .await?;
    // The Ingress routes to the TLS Service but names no CA Secret yet.
    let ingress = |ca: Option<&str>| {
        let mut ingress = Ingress::new(&ns, "secure");
        if let Some(ca) = ca {
            ingress = ingress.annotation("duet.dev/backend-ca-secret", ca);
        }
        ingress.host("secure.test", "secure").build()
    };
    env.apply(&[ingress(None)]).await?;
    let duet = env.duet(api_family, &[]).await?;
    // Without a CA, the pod's certificate is checked against the system roots: refused.
    until(&duet, "secure.test", 502, "no CA Secret named").await?;

    // Named: the watch of that Secret starts; its (wrong) CA is used.
    env.apply(&[ingress(Some("upstream-ca"))]).await?;
    client::eventually("a watch for the named Secret", LIVE, || async {
        let open = env.proxy.watches("/secrets?");
        anyhow::ensure!(open.len() == 2, "Secret watches open: {open:#?}");
        Ok(())
    })
    .await?;
    until(&duet, "secure.test", 502, "the wrong CA").await?;
    // Updated to the right CA: applied live.
    env.apply(&[tls::ca_secret(&ns, "upstream-ca", &right.cert_pem)])
        .await?;
    until(&duet, "secure.test", 200, "the right CA after the update").await?;
    // A duet started now waits for the named Secret before it is ready, even when reading it
    // fails for a while (the TLS Secrets are served): its first answers use it.
    env.proxy.fail(
        Fault::status(500)
            .method(Method::GET)
            .query("metadata.name=upstream-ca")
            .lasting(Duration::from_secs(2)),
    );
    let second = env.duet(api_family, &[]).await?;
    for family in Family::BOTH {
        let reply = client::get(second.http(family), "secure.test", "/").await?;
        client::expect_status(&reply, 200)?;
    }
    drop(second);
    let refused = env
        .proxy
        .requests()
        .iter()
        .filter(|r| r.status == 500)
        .filter(|r| {
            r.param("fieldSelector")
                .is_some_and(|f| f.contains("upstream-ca"))
        })
        .count();
    anyhow::ensure!(
        refused >= 1,
        "the second duet's read of the named Secret was not refused"
    );

    // No longer named: its watch stops, and the route has no CA again.
    env.apply(&[ingress(None)]).await?;
    until(&duet, "secure.test", 502, "the CA Secret no longer named").await?;
    client::eventually("the named watch stopped", LIVE, || async {
        let open = env.proxy.open_watches("/secrets?");
        anyhow::ensure!(open == 1, "{open} Secret watches open");
        Ok(())
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Every Secret request selected TLS Secrets or the one named Secret: the password was never
    // listed or watched.
    let requests = secret_requests(&env);
    let named = "metadata.name=upstream-ca,type!=kubernetes.io/tls";
    for request in &requests {
        assert!(
            request.ends_with(" type=kubernetes.io/tls") || request.ends_with(&format!(" {named}")),
            "a Secret request that may return other Secrets: {request}\nall: {requests:#?}"
        );
        assert!(!request.contains("/secrets/"), "a read by name: {request}");
    }
    assert!(
        requests.iter().any(|r| r.ends_with(named)),
        "the named Secret was read: {requests:#?}"
    );
    Ok(())
}

#[tokio::test]
async fn only_tls_and_named_ca_secrets_are_read_api_on_ipv4() -> anyhow::Result<()> {
    only_tls_and_named_ca_secrets_are_read(Family::V4).await
}

#[tokio::test]
async fn only_tls_and_named_ca_secrets_are_read_api_on_ipv6() -> anyhow::Result<()> {
    only_tls_and_named_ca_secrets_are_read(Family::V6).await
}

/// `GET /` on guarded.test as user `ann`; the status.
async fn login(duet: &Duet, family: Family, password: &str) -> anyhow::Result<u16> {
    let authorization = format!(
        "Basic {}",
        tls::base64(format!("ann:{password}").as_bytes())
    );
    let req = client::request(Method::GET, "guarded.test", "/")
        .header("authorization", authorization)
        .body(conformance::http_body_util::Full::new(
            conformance::bytes::Bytes::new(),
        ))?;
    let mut conn = conformance::Conn::http1(duet.http(family)).await?;
    Ok(conn.send(req).await?.status.as_u16())
}

/// ingress-nginx's basic auth in Kubernetes mode: the htpasswd Secret an Ingress names in
/// `nginx.ingress.kubernetes.io/auth-secret` is watched by name (and nothing else is read): the
/// routes fail closed (503) until it exists, then check its users, and follow its updates, for
/// clients of both families.
#[tokio::test]
async fn the_basic_auth_secret_is_read_by_name_and_followed() -> anyhow::Result<()> {
    let env = env(Stack::Dual, &["sec-auth"]).await?;
    let ns = env.ns.clone();
    env.web(&ns, "echo", 1).await?;
    env.ready_pods(&ns, "echo", 1).await?;
    let ingress = Ingress::new(&ns, "guarded")
        .annotation("nginx.ingress.kubernetes.io/auth-type", "basic")
        .annotation(
            "nginx.ingress.kubernetes.io/auth-secret",
            &format!("{ns}/htpasswd"),
        )
        .host("guarded.test", "echo")
        .build();
    env.apply(&[ingress]).await?;
    let duet = env.duet(Family::V6, &[]).await?;
    until(&duet, "guarded.test", 503, "the Secret does not exist yet").await?;
    let htpasswd = |line: &str| {
        let mut secret = tls::ca_secret(&ns, "htpasswd", "");
        secret["data"] = serde_json::json!({"auth": tls::base64(line.as_bytes())});
        secret
    };
    env.apply(&[htpasswd("ann:{PLAIN}first\n")]).await?;
    until(&duet, "guarded.test", 401, "the Secret created").await?;
    for family in Family::BOTH {
        assert_eq!(login(&duet, family, "first").await?, 200, "{family}");
    }
    env.apply(&[htpasswd("ann:{PLAIN}second\n")]).await?;
    for family in Family::BOTH {
        client::eventually("the rotated password", LIVE, || async {
            let (old, new) = (
                login(&duet, family, "first").await?,
                login(&duet, family, "second").await?,
            );
            anyhow::ensure!((old, new) == (401, 200), "{family}: {old} {new}");
            Ok(())
        })
        .await?;
    }
    let requests = secret_requests(&env);
    let named = "metadata.name=htpasswd,type!=kubernetes.io/tls";
    assert!(requests.iter().any(|r| r.ends_with(named)), "{requests:#?}");
    for request in &requests {
        assert!(
            request.ends_with(" type=kubernetes.io/tls") || request.ends_with(&format!(" {named}")),
            "a Secret request that may return other Secrets: {request}"
        );
    }
    Ok(())
}
