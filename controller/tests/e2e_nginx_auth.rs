//! End to end, over real sockets on 127.0.0.1 and [::1] with a real HTTP client: ingress-nginx's
//! access annotations. `auth-type: basic` checks htpasswd users (bcrypt, apr1, `{SHA}`; `auth-file`
//! and `auth-map` Secrets; Secret changes picked up; a missing Secret fails closed with 503);
//! `auth-url` asks an auth service on either family (an IPv6-literal URL included) with
//! ingress-nginx's headers, copies `auth-response-headers` upstream, turns a 401 into a redirect
//! to `auth-signin` with `rd=`, and answers 500 when the service is down; `limit-rpm`,
//! `limit-connections` and `limit-whitelist` key clients per address, IPv6 clients per /64
//! (claimed through PROXY protocol headers), IPv4-mapped ones as IPv4.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance::bytes::Bytes;
use conformance::client::{self, Conn, Reply};
use conformance::echo::EchoOptions;
use conformance::fleet::closed_port;
use conformance::http::{HeaderMap, Method, Request, Response, StatusCode};
use conformance::http_body_util::{BodyExt as _, Full};
use conformance::tls::{self, base64};
use conformance::{
    Duet, DuetBuilder, Family, Fleet, Ingress, ManifestDir, PathType, PodSpec, PortRef,
};
use dataplane::proxy_protocol::encode_v1;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt as _;

const DUET: &str = env!("CARGO_BIN_EXE_duet");
const N: &str = conformance::manifests::NGINX_ANNOTATION_PREFIX;

fn opaque(namespace: &str, name: &str, data: &[(&str, &str)]) -> Value {
    let data: serde_json::Map<String, Value> = data
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::from(base64(v.as_bytes()))))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"namespace": namespace, "name": name},
        "data": data,
    })
}

/// `method path` to `host` over a fresh HTTP/1.1 connection, with extra headers.
/// `GET /` with `Authorization` when given.
async fn get(to: SocketAddr, host: &str, authorization: Option<String>) -> anyhow::Result<Reply> {
    match authorization {
        Some(a) => send(to, Method::GET, host, "/", &[("authorization", &a)]).await,
        None => send(to, Method::GET, host, "/", &[]).await,
    }
}

async fn send(
    to: SocketAddr,
    method: Method,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> anyhow::Result<Reply> {
    let mut req = client::request(method, host, path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    Conn::http1(to)
        .await?
        .send(req.body(Full::new(Bytes::new()))?)
        .await
}

fn basic(user: &str, password: &str) -> String {
    format!("Basic {}", base64(format!("{user}:{password}").as_bytes()))
}

// bcrypt: the OpenBSD vector ("U*U", cost 5); apr1 and {SHA}: Apache's documented examples.
const BCRYPT: &str = "$2a$05$CCCCCCCCCCCCCCCCCCCCC.E5YPO9kmyuRGyh0XouQYb4YMJKvyOeW";
const APR1: &str = "$apr1$r31.....$HqJZimcKQFAMYayBlzkrA/";
const SHA: &str = "{SHA}VBPuJHI7uixaa6LQGWx4s+5GKNE=";

/// Basic auth with htpasswd users of three hash formats, an `auth-map` Secret, a Secret rotated
/// and a missing one created while duet runs; over both families.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_auth_checks_htpasswd_users_and_follows_the_secret() -> anyhow::Result<()> {
    let fleet = Fleet::start("ba", "echo", &[PodSpec::dual("dual")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    let htpasswd = format!("# staff\nalice:{BCRYPT}\nbob:{APR1}\ncarol:{SHA}:comment\n");
    dir.write(
        "users.yaml",
        &[opaque("ba", "users", &[("auth", &htpasswd)])],
    )?;
    dir.write(
        "map.yaml",
        &[
            opaque("ba", "map", &[("dave", SHA)]),
            opaque("ba", "no-auth-key", &[("users", &htpasswd)]),
        ],
    )?;
    let ba = |name: &str, pairs: &[(&str, &str)]| {
        Ingress::new("ba", name)
            .nginx_annotations(pairs)
            .host(&format!("{name}.test"), "echo")
            .build()
    };
    dir.write(
        "ingress.yaml",
        &[
            ba(
                "file",
                &[
                    ("auth-type", "basic"),
                    ("auth-secret", "users"),
                    ("auth-realm", "Staff only"),
                ],
            ),
            ba(
                "map",
                &[
                    ("auth-type", "basic"),
                    ("auth-secret", "ba/map"),
                    ("auth-secret-type", "auth-map"),
                ],
            ),
            ba(
                "missing",
                &[("auth-type", "basic"), ("auth-secret", "later")],
            ),
            ba(
                "no-key",
                &[("auth-type", "basic"), ("auth-secret", "no-auth-key")],
            ),
            ba("no-type", &[("auth-secret", "users")]),
        ],
    )?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    for family in Family::BOTH {
        let to = duet.http(family);
        for auth in [
            None,
            Some(basic("alice", "U*V")),
            Some(basic("eve", "U*U")),
            Some("Basic !!".into()),
        ] {
            let reply = get(to, "file.test", auth.clone()).await?;
            assert_eq!(reply.status, 401, "{family} {auth:?}: {}", reply.text());
            assert_eq!(
                reply.header("www-authenticate"),
                Some("Basic realm=\"Staff only\""),
                "{family}"
            );
        }
        for (user, password) in [
            ("alice", "U*U"),
            ("bob", "myPassword"),
            ("carol", "myPassword"),
        ] {
            let reply = get(to, "file.test", Some(basic(user, password))).await?;
            assert_eq!(reply.status, 200, "{family} {user}: {}", reply.text());
            let echo = reply.echo()?;
            assert_eq!(echo.family, family);
            // As ingress-nginx: the credentials are not passed upstream.
            assert_eq!(echo.header("authorization"), None, "{family} {user}");
        }
        client::expect_status(
            &get(to, "map.test", Some(basic("dave", "myPassword"))).await?,
            200,
        )?;
        let reply = get(to, "map.test", Some(basic("dave", "wrong"))).await?;
        assert_eq!(reply.header("www-authenticate"), Some("Basic realm=\"\""));
        // A Secret that is missing or has no `auth` key fails closed; without auth-type there is
        // no authentication at all (as ingress-nginx).
        for host in ["missing.test", "no-key.test"] {
            let reply = get(to, host, Some(basic("alice", "U*U"))).await?;
            assert_eq!(reply.status, 503, "{family} {host}: {}", reply.text());
        }
        client::expect_status(&get(to, "no-type.test", None).await?, 200)?;
    }
    // The report and the debug view: hashes never shown.
    let routes = duet.debug_routes().await?.to_string();
    assert!(
        routes.contains("alice:bcrypt") && routes.contains("bob:apr1"),
        "{routes}"
    );
    assert!(
        !routes.contains("CCCCCCCC") && !routes.contains("HqJZ"),
        "{routes}"
    );
    assert!(
        routes.contains("Secret ba/later does not exist"),
        "{routes}"
    );

    // Rotating alice's password and creating the missing Secret take effect without a restart.
    let rotated = format!("alice:{{PLAIN}}rotated\nbob:{APR1}\n");
    dir.write(
        "users.yaml",
        &[opaque("ba", "users", &[("auth", &rotated)])],
    )?;
    dir.write(
        "later.yaml",
        &[opaque("ba", "later", &[("auth", "frank:{PLAIN}f\n")])],
    )?;
    for family in Family::BOTH {
        let to = duet.http(family);
        client::eventually("rotated password", Duration::from_secs(10), || async {
            let old = get(to, "file.test", Some(basic("alice", "U*U"))).await?;
            let new = get(to, "file.test", Some(basic("alice", "rotated"))).await?;
            let later = get(to, "missing.test", Some(basic("frank", "f"))).await?;
            anyhow::ensure!(
                (
                    old.status.as_u16(),
                    new.status.as_u16(),
                    later.status.as_u16()
                ) == (401, 200, 200),
                "{family}: {} {} {}",
                old.status,
                new.status,
                later.status
            );
            Ok(())
        })
        .await?;
    }
    Ok(())
}

/// The flag letting auth requests reach the loopback auth services of these tests.
const ALLOW_LOOPBACK: &str = "--auth-allowed-destinations=127.0.0.0/8,::1";

/// The token the auth service admits.
const GOOD: [(&str, &str); 1] = [("authorization", "Bearer good")];

/// One request the auth service saw.
#[derive(Clone, Debug)]
struct Seen {
    family: Family,
    method: String,
    uri: String,
    headers: HeaderMap,
    body: Bytes,
}

/// An auth service on 127.0.0.1 and [::1]: `Authorization: Bearer good` gets 200 with
/// `X-Auth-Request-User`/`-Email`; `/forbidden` 403; `/broken` 502; anything else 401.
struct AuthService {
    v4: SocketAddr,
    v6: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Connections accepted, over both families.
    accepted: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for AuthService {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl AuthService {
    async fn start() -> anyhow::Result<AuthService> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let accepted = Arc::new(AtomicUsize::new(0));
        let mut addrs = Vec::new();
        let mut tasks = Vec::new();
        for (family, bind) in [(Family::V4, "127.0.0.1:0"), (Family::V6, "[::1]:0")] {
            let listener = tokio::net::TcpListener::bind(bind).await?;
            addrs.push(listener.local_addr()?);
            let seen = seen.clone();
            let accepted = accepted.clone();
            tasks.push(tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    accepted.fetch_add(1, Ordering::SeqCst);
                    let seen = seen.clone();
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |req| {
                            let seen = seen.clone();
                            async move {
                                Ok::<_, std::convert::Infallible>(answer(req, family, &seen).await)
                            }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            }));
        }
        Ok(AuthService {
            v4: addrs[0],
            v6: addrs[1],
            seen,
            accepted,
            tasks,
        })
    }

    fn last(&self) -> Seen {
        self.seen
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("the auth service was asked")
    }

    fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

async fn answer(
    req: Request<hyper::body::Incoming>,
    family: Family,
    seen: &Mutex<Vec<Seen>>,
) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let original = header("x-original-url");
    seen.lock().unwrap().push(Seen {
        family,
        method: parts.method.to_string(),
        uri: parts.uri.to_string(),
        headers: parts.headers.clone(),
        body,
    });
    let mut res = Response::new(Full::new(Bytes::from_static(b"auth says")));
    let (status, extra): (u16, &[(&str, &str)]) = if original.contains("/forbidden") {
        (403, &[])
    } else if original.contains("/broken") {
        (502, &[])
    } else if header("authorization") == "Bearer good" {
        (
            200,
            &[
                ("x-auth-request-user", "alice"),
                ("x-auth-request-email", "alice@example.test"),
                ("x-not-listed", "secret"),
                ("set-cookie", "session=refreshed; Path=/"),
            ],
        )
    } else {
        (
            401,
            &[
                ("www-authenticate", "Bearer realm=\"test\""),
                ("set-cookie", "csrf=1; Path=/"),
            ],
        )
    };
    *res.status_mut() = StatusCode::from_u16(status).expect("a status");
    for (k, v) in extra {
        res.headers_mut()
            .insert(*k, v.parse().expect("a header value"));
    }
    res
}

/// `auth-url` on IPv4 and on an IPv6 literal, asked from clients of both families.
/// Passwords longer than htpasswd's 255 bytes match nothing (401, never hashed), and a Secret
/// with a bcrypt hash above cost 12 is refused (503 with a diagnostic) instead of holding a core
/// for seconds on every request; over both families.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_passwords_and_costly_bcrypt_hashes_are_refused() -> anyhow::Result<()> {
    let fleet = Fleet::start("bl", "echo", &[PodSpec::dual("dual")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    let (longest, longer) = ("p".repeat(255), "p".repeat(256));
    let htpasswd = format!("max:{{PLAIN}}{longest}\nover:{{PLAIN}}{longer}\nbob:{APR1}\n");
    let costly = format!("slow:{}\n", BCRYPT.replacen("$05$", "$13$", 1));
    dir.write(
        "users.yaml",
        &[
            opaque("bl", "users", &[("auth", &htpasswd)]),
            opaque("bl", "costly", &[("auth", &costly)]),
        ],
    )?;
    let ba = |name: &str| {
        Ingress::new("bl", name)
            .nginx_annotations(&[("auth-type", "basic"), ("auth-secret", name)])
            .host(&format!("{name}.test"), "echo")
            .build()
    };
    dir.write("ingress.yaml", &[ba("users"), ba("costly")])?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    for family in Family::BOTH {
        let to = duet.http(family);
        let status = |user: &'static str, password: String, host: &'static str| async move {
            anyhow::Ok(get(to, host, Some(basic(user, &password))).await?.status)
        };
        assert_eq!(
            status("max", longest.clone(), "users.test").await?,
            200,
            "{family}"
        );
        assert_eq!(
            status("over", longer.clone(), "users.test").await?,
            401,
            "{family}"
        );
        let apr1_flood = format!("myPassword{}", "x".repeat(20_000));
        assert_eq!(
            status("bob", apr1_flood, "users.test").await?,
            401,
            "{family}"
        );
        assert_eq!(status("bob", "myPassword".into(), "users.test").await?, 200);
        assert_eq!(
            status("slow", "U*U".into(), "costly.test").await?,
            503,
            "{family}"
        );
    }
    let routes = duet.debug_routes().await?.to_string();
    assert!(
        routes.contains("Secret bl/costly has bcrypt hashes of a cost above 12"),
        "{routes}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_auth_asks_the_service_with_ingress_nginx_headers() -> anyhow::Result<()> {
    let auth = AuthService::start().await?;
    let (down, _down) = closed_port(Family::V6)?;
    let fleet = Fleet::start("ext", "echo", &[PodSpec::dual("dual")])?;
    // An HTTPS auth service (an echo pod answering 200 to everything over TLS only).
    let cert = tls::cert(&["auth.test"]);
    let options = EchoOptions {
        tls: Some(tls::server_config(&cert, &["http/1.1"])),
        ..EchoOptions::default()
    };
    let https_auth = Fleet::start_with("ext", "tls-auth", &[PodSpec::dual("tls")], options)?;
    let https_auth = https_auth.pod("tls");
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    let url4 = format!("http://{}/auth?check=1", auth.v4);
    let url6 = format!("http://{}/oauth2/auth", auth.v6);
    let down = format!("http://{down}/auth");
    let ext = |name: &str, pairs: &[(&str, &str)]| {
        Ingress::new("ext", name)
            .nginx_annotations(pairs)
            .host(&format!("{name}.test"), "echo")
            .build()
    };
    let headers = "X-Auth-Request-User, X-Auth-Request-Email, X-Auth-Request-Groups";
    dir.write(
        "ingress.yaml",
        &[
            ext(
                "ext4",
                &[("auth-url", &url4), ("auth-response-headers", headers)],
            ),
            ext(
                "ext6",
                &[
                    ("auth-url", &url6),
                    ("auth-signin", "https://login.test/start"),
                    ("auth-method", "POST"),
                    ("auth-request-redirect", "https://back.test/here"),
                ],
            ),
            ext("down", &[("auth-url", &down)]),
            ext(
                "byname",
                &[(
                    "auth-url",
                    &format!("http://localhost:{}/auth", auth.v4.port()),
                )],
            ),
            ext(
                "tls4",
                &[(
                    "auth-url",
                    &format!("https://{}/auth", https_auth.addr(Family::V4).expect("v4")),
                )],
            ),
            ext(
                "tls6",
                &[(
                    "auth-url",
                    &format!("https://{}/auth", https_auth.addr(Family::V6).expect("v6")),
                )],
            ),
            ext("bad", &[("auth-url", "http://$upstream_addr/auth")]),
        ],
    )?;
    let duet = DuetBuilder::new(DUET, dir.path())
        .args([ALLOW_LOOPBACK])
        .start()
        .await?;
    for family in Family::BOTH {
        let to = duet.http(family);
        let client_ip = if family == Family::V4 {
            "127.0.0.1"
        } else {
            "::1"
        };
        // Admitted: the auth service's listed headers replace what the client sent; a listed
        // header the service did not send is removed; the body is not sent to the service.
        let mut req = client::request(Method::PUT, "ext4.test", "/app/?q=1")
            .header("authorization", "Bearer good")
            .header("x-auth-request-email", "mallory@evil.test")
            .header("x-auth-request-groups", "admins")
            .header("x-forwarded-proto", "https");
        req = req.header("x-request-id", "client-chosen");
        let reply = Conn::http1(to)
            .await?
            .send(req.body(Full::new(Bytes::from_static(b"the body")))?)
            .await?;
        assert_eq!(reply.status, 200, "{family}: {}", reply.text());
        // The auth response's cookie reaches the client (nginx's add_header on a 200).
        assert_eq!(
            reply.header("set-cookie"),
            Some("session=refreshed; Path=/"),
            "{family}"
        );
        let echo = reply.echo()?;
        assert_eq!(echo.family, family);
        assert_eq!(echo.header("x-auth-request-user").as_deref(), Some("alice"));
        assert_eq!(
            echo.header("x-auth-request-email").as_deref(),
            Some("alice@example.test")
        );
        assert_eq!(echo.header("x-auth-request-groups"), None, "{family}");
        assert_eq!(echo.header("x-not-listed"), None, "{family}");
        assert_eq!(echo.method, "PUT");
        let seen = auth.last();
        assert_eq!(seen.family, Family::V4);
        assert_eq!(
            (seen.method.as_str(), seen.uri.as_str()),
            ("GET", "/auth?check=1")
        );
        assert!(seen.body.is_empty(), "{family}: {:?}", seen.body);
        let h = |name: &str| {
            seen.headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        assert_eq!(h("host"), Some(auth.v4.to_string()));
        assert_eq!(
            h("x-original-url").as_deref(),
            Some("http://ext4.test/app/?q=1")
        );
        assert_eq!(h("x-original-method").as_deref(), Some("PUT"));
        assert_eq!(h("x-auth-request-redirect").as_deref(), Some("/app/?q=1"));
        assert_eq!(
            h("x-sent-from").as_deref(),
            Some("nginx-ingress-controller")
        );
        assert_eq!(h("x-real-ip").as_deref(), Some(client_ip), "{family}");
        assert_eq!(h("x-forwarded-for").as_deref(), Some(client_ip), "{family}");
        assert_eq!(
            h("x-forwarded-proto"),
            None,
            "{family}: blanked, as ingress-nginx"
        );
        assert_eq!(h("authorization").as_deref(), Some("Bearer good"));
        assert_eq!(h("content-length"), None, "{family}");
        let id = h("x-request-id").unwrap_or_default();
        assert!(id.len() == 32 && id != "client-chosen", "{family}: {id}");

        // Refused: 401 with the service's challenge, 403, and anything else 500.
        let reply = send(to, Method::GET, "ext4.test", "/app", &[]).await?;
        assert_eq!(reply.status, 401, "{family}");
        assert_eq!(
            reply.header("www-authenticate"),
            Some("Bearer realm=\"test\"")
        );
        let reply = send(
            to,
            Method::GET,
            "ext4.test",
            "/forbidden",
            &[("authorization", "Bearer good")],
        )
        .await?;
        assert_eq!(reply.status, 403, "{family}");
        let reply = send(to, Method::GET, "ext4.test", "/broken", &[]).await?;
        assert_eq!(reply.status, 500, "{family}");

        // The IPv6-literal auth-url with auth-method and auth-signin.
        let before = auth.count();
        let reply = send(to, Method::GET, "ext6.test", "/p/q?x=1&y=%20", &[]).await?;
        assert_eq!(reply.status, 302, "{family}: {}", reply.text());
        assert_eq!(
            reply.header("location"),
            Some("https://login.test/start?rd=http://ext6.test%2Fp%2Fq%3Fx%3D1%26y%3D%2520"),
            "{family}"
        );
        assert_eq!(reply.header("set-cookie"), Some("csrf=1; Path=/"));
        assert!(auth.count() > before);
        let seen = auth.last();
        assert_eq!((seen.family, seen.method.as_str()), (Family::V6, "POST"));
        let h = |name: &str| {
            seen.headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        assert_eq!(
            h("host"),
            Some(auth.v6.to_string()),
            "bracketed, with the port"
        );
        assert_eq!(
            h("x-auth-request-redirect").as_deref(),
            Some("https://back.test/here")
        );
        assert_eq!(h("x-original-uri").as_deref(), Some("/p/q?x=1&y=%20"));
        assert_eq!(h("x-original-method").as_deref(), Some("GET"));
        assert_eq!(h("x-forwarded-for").as_deref(), Some(client_ip), "{family}");
        let reply = send(
            to,
            Method::GET,
            "ext6.test",
            "/",
            &[("authorization", "Bearer good")],
        )
        .await?;
        assert_eq!(reply.status, 200, "{family}");
        let reply = send(to, Method::GET, "ext6.test", "/forbidden", &[]).await?;
        assert_eq!(reply.status, 403, "{family}: a 403 is not redirected");

        // A name is resolved (the system resolver); Host is the URL's authority.
        let reply = send(
            to,
            Method::GET,
            "byname.test",
            "/",
            &[("authorization", "Bearer good")],
        )
        .await?;
        assert_eq!(reply.status, 200, "{family}: {}", reply.text());
        let host = auth.last().headers.get("host").cloned();
        assert_eq!(
            host.as_ref().and_then(|h| h.to_str().ok()),
            Some(format!("localhost:{}", auth.v4.port()).as_str())
        );
        // HTTPS auth URLs, IPv4 and IPv6 literals (not verified, as ingress-nginx).
        for host in ["tls4.test", "tls6.test"] {
            let reply = send(to, Method::GET, host, "/", &[]).await?;
            assert_eq!(reply.status, 200, "{family} {host}: {}", reply.text());
        }
        // The service down: 500. An auth-url duet cannot use: 503 (fail closed).
        let reply = send(
            to,
            Method::GET,
            "down.test",
            "/",
            &[("authorization", "Bearer good")],
        )
        .await?;
        assert_eq!(reply.status, 500, "{family}: {}", reply.text());
        let reply = send(
            to,
            Method::GET,
            "bad.test",
            "/",
            &[("authorization", "Bearer good")],
        )
        .await?;
        assert_eq!(reply.status, 503, "{family}: {}", reply.text());
    }
    let routes = duet.debug_routes().await?["annotations"].to_string();
    for (key, status) in [
        ("auth-url", "invalid-value"),
        ("auth-response-headers", "honoured"),
        ("auth-method", "honoured"),
    ] {
        let want = format!(r#""key":"{N}{key}","status":"{status}""#);
        assert!(routes.contains(&want), "{want}: {routes}");
    }
    Ok(())
}

/// An Ingress of namespace `ext` with these annotations, `/` to `echo` on `host` (`None`: every
/// host).
fn ext_ingress(name: &str, host: Option<&str>, pairs: &[(&str, &str)]) -> Value {
    Ingress::new("ext", name)
        .nginx_annotations(pairs)
        .path(
            host,
            PathType::Prefix,
            "/",
            "echo",
            PortRef::Name("http".into()),
        )
        .build()
}

/// An auth service, and duet started with `args` serving the Ingresses `ingresses` makes for it
/// in front of an echo pod of both families (namespace `ext`).
struct AuthSetup {
    auth: AuthService,
    duet: Duet,
    _fleet: Fleet,
    _dir: ManifestDir,
}

impl AuthSetup {
    async fn start(
        ingresses: impl FnOnce(&AuthService) -> Vec<Value>,
        args: &[&str],
    ) -> anyhow::Result<AuthSetup> {
        let auth = AuthService::start().await?;
        let fleet = Fleet::start("ext", "echo", &[PodSpec::dual("dual")])?;
        let dir = ManifestDir::with_class()?;
        dir.write("echo.yaml", &fleet.manifests())?;
        dir.write("ingress.yaml", &ingresses(&auth))?;
        let duet = DuetBuilder::new(DUET, dir.path())
            .args(args.iter().copied())
            .start()
            .await?;
        Ok(AuthSetup {
            auth,
            duet,
            _fleet: fleet,
            _dir: dir,
        })
    }
}

/// Without `--auth-allowed-destinations`, auth URLs on loopback (IPv4 and IPv6 literals, an
/// IPv4-mapped one, a name resolving to them) are refused at connect time: 500, the service never
/// asked, a diagnostic on the Ingress and a log line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_requests_to_loopback_are_refused_by_default() -> anyhow::Result<()> {
    let hosts = ["v4.test", "v6.test", "mapped.test", "name.test"];
    let urls = |auth: &AuthService| {
        let port = auth.v4.port();
        [
            format!("http://{}/auth", auth.v4),
            format!("http://{}/auth", auth.v6),
            format!("http://[::ffff:127.0.0.1]:{port}/auth"),
            format!("http://localhost:{port}/auth"),
        ]
    };
    let ingresses = |auth: &AuthService| {
        let urls = urls(auth);
        let pairs = hosts.iter().zip(&urls);
        pairs
            .map(|(host, url)| {
                ext_ingress(&host.replace('.', "-"), Some(host), &[("auth-url", url)])
            })
            .collect()
    };
    let setup = AuthSetup::start(ingresses, &[]).await?;
    let (auth, duet) = (&setup.auth, &setup.duet);
    for family in Family::BOTH {
        for host in hosts {
            let reply = send(duet.http(family), Method::GET, host, "/", &GOOD).await?;
            assert_eq!(reply.status, 500, "{family} {host}: {}", reply.text());
        }
    }
    assert_eq!(
        auth.accepted.load(Ordering::SeqCst),
        0,
        "the service was reached"
    );
    let routes = duet.debug_routes().await?.to_string();
    assert!(
        routes.contains("auth-url: 127.0.0.1 is a loopback, link-local or unspecified address"),
        "{routes}"
    );
    assert!(routes.contains("auth-url: ::1 is a loopback"), "{routes}");
    let logs = duet.logs();
    assert!(
        logs.contains("refused by --auth-allowed-destinations"),
        "{logs}"
    );
    Ok(())
}

/// `$http_host` in an auth URL's authority is the routed host without the client's port: a
/// client sending `Host: 127.0.0.1:PORT` (`[::1]:PORT`) cannot aim the auth request at PORT,
/// and a port written in the URL is the one used whatever port the client sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_cannot_pick_the_auth_request_port() -> anyhow::Result<()> {
    let ingresses = |auth: &AuthService| {
        let ported = format!("http://$http_host:{}/probe", auth.v4.port());
        vec![
            ext_ingress("aimed", None, &[("auth-url", "http://$http_host/probe")]),
            ext_ingress("ported", Some("localhost"), &[("auth-url", &ported)]),
        ]
    };
    let setup = AuthSetup::start(ingresses, &[ALLOW_LOOPBACK]).await?;
    let (auth, duet) = (&setup.auth, &setup.duet);
    for family in Family::BOTH {
        let to = duet.http(family);
        let aimed = match family {
            Family::V4 => auth.v4.to_string(),
            Family::V6 => auth.v6.to_string(),
        };
        let before = auth.accepted.load(Ordering::SeqCst);
        let reply = send(to, Method::GET, &aimed, "/", &GOOD).await?;
        assert_eq!(reply.status, 500, "{family} {aimed}: {}", reply.text());
        let after = auth.accepted.load(Ordering::SeqCst);
        assert_eq!(after, before, "{family}: the client's port was used");
        let reply = send(to, Method::GET, "localhost:19999", "/", &GOOD).await?;
        assert_eq!(reply.status, 200, "{family}: {}", reply.text());
        let host = auth.last().headers.get("host").cloned();
        let want = format!("localhost:{}", auth.v4.port());
        assert_eq!(host.as_ref().and_then(|h| h.to_str().ok()), Some(&*want));
    }
    Ok(())
}

/// Auth requests to one destination share pooled connections, as requests to pods do: four auth
/// checks (from new client connections of both families, admitted and refused) reach the
/// service over one connection, for a GET to its IPv4 address and a POST to its IPv6 one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_requests_reuse_pooled_connections() -> anyhow::Result<()> {
    let ingresses = |auth: &AuthService| {
        let (url4, url6) = (
            format!("http://{}/a", auth.v4),
            format!("http://{}/a", auth.v6),
        );
        let post = [("auth-url", url6.as_str()), ("auth-method", "POST")];
        vec![
            ext_ingress("four", Some("four.test"), &[("auth-url", &url4)]),
            ext_ingress("six", Some("six.test"), &post),
        ]
    };
    let setup = AuthSetup::start(ingresses, &[ALLOW_LOOPBACK]).await?;
    let (auth, duet) = (&setup.auth, &setup.duet);
    for (host, service) in [("four.test", Family::V4), ("six.test", Family::V6)] {
        let before = auth.accepted.load(Ordering::SeqCst);
        for family in Family::BOTH {
            for (token, want) in [("Bearer good", 200), ("Bearer bad", 401)] {
                let header = [("authorization", token)];
                let reply = send(duet.http(family), Method::GET, host, "/", &header).await?;
                assert_eq!(reply.status, want, "{family} {host}: {}", reply.text());
                assert_eq!(auth.last().family, service);
            }
        }
        let opened = auth.accepted.load(Ordering::SeqCst) - before;
        assert_eq!(opened, 1, "{host}: 4 auth checks over {opened} connections");
    }
    Ok(())
}

/// A request from a claimed client address (a PROXY protocol v1 header) over a listener of
/// `via`'s family.
async fn from(
    duet: &conformance::Duet,
    via: Family,
    client: &str,
    host: &str,
) -> anyhow::Result<u16> {
    let to = duet.http(via);
    let source: SocketAddr = SocketAddr::new(client.parse()?, 4711);
    let destination = if source.is_ipv4() {
        "192.0.2.254:80".parse()?
    } else {
        "[2001:db8::fe]:80".parse()?
    };
    let mut stream = client::connect_tcp(to).await?;
    stream.write_all(&encode_v1(source, destination)).await?;
    let local = stream.local_addr()?;
    let mut conn = Conn::over(stream, local, to, false).await?;
    let reply = conn.get(host, "/").await?;
    if reply.status != 200 {
        assert_eq!(reply.header("server"), Some("duet"), "{}", reply.text());
    }
    Ok(reply.status.as_u16())
}

/// `limit-rpm` with a burst: clients keyed per address as ingress-nginx does, IPv6 clients per
/// /64 with `duet.dev/limit-ipv6-prefix: "64"`, IPv4-mapped as IPv4, the allow-list spared, a bad
/// value failing closed; the claimed clients arrive over listeners of both families.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_key_per_address_and_ipv6_per_64_on_request() -> anyhow::Result<()> {
    let fleet = Fleet::start("rl", "echo", &[PodSpec::dual("dual")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    // 2 per minute, burst 2 × 1: three at once, then 503 for half a minute.
    let limits = [
        ("limit-rpm", "2"),
        ("limit-burst-multiplier", "1"),
        ("limit-whitelist", "198.51.100.0/24, 2001:db8:ffff::/48"),
    ];
    dir.write(
        "ingress.yaml",
        &[
            Ingress::new("rl", "per64")
                .nginx_annotations(&limits)
                .annotation("duet.dev/limit-ipv6-prefix", "64")
                .host("per64.test", "echo")
                .build(),
            Ingress::new("rl", "per128")
                .nginx_annotations(&limits)
                .host("per128.test", "echo")
                .build(),
            Ingress::new("rl", "bad")
                .nginx_annotations(&[("limit-rps", "ten")])
                .host("bad.test", "echo")
                .build(),
        ],
    )?;
    let duet = DuetBuilder::new(DUET, dir.path())
        .args(["--proxy-protocol=http"])
        .start()
        .await?;
    let via = |i: usize| Family::BOTH[i % 2];
    // IPv4: three per address; the IPv4-mapped form of the same address shares its bucket.
    for i in 0..3 {
        assert_eq!(
            from(&duet, via(i), "192.0.2.1", "per64.test").await?,
            200,
            "{i}"
        );
    }
    assert_eq!(
        from(&duet, Family::V4, "192.0.2.1", "per64.test").await?,
        503
    );
    assert_eq!(
        from(&duet, Family::V6, "::ffff:192.0.2.1", "per64.test").await?,
        503
    );
    assert_eq!(
        from(&duet, Family::V6, "192.0.2.2", "per64.test").await?,
        200
    );
    // IPv6: three per /64, whatever the addresses in it.
    for (i, client) in ["2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2:abcd::3"]
        .iter()
        .enumerate()
    {
        assert_eq!(
            from(&duet, via(i), client, "per64.test").await?,
            200,
            "{client}"
        );
    }
    for client in ["2001:db8:1:2::4", "2001:db8:1:2:ffff:ffff:ffff:ffff"] {
        assert_eq!(
            from(&duet, Family::V4, client, "per64.test").await?,
            503,
            "{client}"
        );
    }
    assert_eq!(
        from(&duet, Family::V6, "2001:db8:1:3::1", "per64.test").await?,
        200
    );
    // Per /128 (the default, ingress-nginx's keying): rotating addresses escapes, one does not.
    for i in 1..=6 {
        let client = format!("2001:db8:1:2::{i}");
        assert_eq!(
            from(&duet, via(i), &client, "per128.test").await?,
            200,
            "{client}"
        );
    }
    for i in 0..3 {
        assert_eq!(
            from(&duet, via(i), "2001:db8:9::9", "per128.test").await?,
            200
        );
    }
    assert_eq!(
        from(&duet, Family::V6, "2001:db8:9::9", "per128.test").await?,
        503
    );
    // Zones are per Ingress: per64's exhausted /64 is fresh on per128.
    // The allow-list of both families is never limited.
    for i in 0..6 {
        assert_eq!(
            from(&duet, via(i), "198.51.100.7", "per64.test").await?,
            200,
            "{i}"
        );
        assert_eq!(
            from(&duet, via(i), "2001:db8:ffff:1::7", "per64.test").await?,
            200,
            "{i}"
        );
    }
    // A value that does not parse fails closed.
    for family in Family::BOTH {
        assert_eq!(from(&duet, family, "192.0.2.77", "bad.test").await?, 503);
    }
    Ok(())
}

/// `limit-connections: "1"`: a second request of a client while its first is in progress gets
/// 503; a client of the other family is another key; once the first is done, it is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_connections_counts_requests_in_progress_per_client() -> anyhow::Result<()> {
    let fleet = Fleet::start("lc", "echo", &[PodSpec::dual("dual")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    dir.write(
        "ingress.yaml",
        &[Ingress::new("lc", "one")
            .nginx_annotations(&[("limit-connections", "1")])
            .host("one.test", "echo")
            .build()],
    )?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    for family in Family::BOTH {
        let to = duet.http(family);
        let other = duet.http(if family == Family::V4 {
            Family::V6
        } else {
            Family::V4
        });
        // A probe may hold the slot when the slow request arrives (then the slow one is refused
        // and is sent again): wait until a probe is refused while the slow one is in progress.
        let mut slow = None;
        for _ in 0..10 {
            let task = tokio::spawn(async move {
                send(
                    to,
                    Method::GET,
                    "one.test",
                    "/",
                    &[("x-echo-delay-ms", "3000")],
                )
                .await
            });
            let refused = loop {
                let probe = send(to, Method::GET, "one.test", "/", &[]).await?;
                if probe.status == 503 {
                    break true;
                }
                if task.is_finished() {
                    break false;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            };
            if refused {
                slow = Some(task);
                break;
            }
        }
        let slow = slow.ok_or_else(|| anyhow::anyhow!("{family}: no probe refused"))?;
        client::expect_status(&send(other, Method::GET, "one.test", "/", &[]).await?, 200)?;
        client::expect_status(&slow.await??, 200)?;
        client::expect_status(&send(to, Method::GET, "one.test", "/", &[]).await?, 200)?;
    }
    Ok(())
}
