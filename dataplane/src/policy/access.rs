//! The access policies a route applies before a target is chosen: ingress-nginx's rate limits
//! ([`rate_limit`]), basic auth ([`basic_auth`]) and external auth ([`ext_auth`]), in that order.
//! The snapshot carries their settings as plain data ([`Access`] on the route, from
//! [`crate::access_policy`]); their runtime state (limiter buckets, requests in progress) lives in
//! the [`Gate`], kept across snapshots while an Ingress's limits are unchanged.

use super::{basic_auth, ext_auth, rate_limit};

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode};
use tokio::sync::Semaphore;

use crate::access_policy::{Access, AuthDestinations, BasicAuth, ExternalAuth, RateLimit};
use crate::metrics::Metrics;
use crate::upstream::Upstream;

/// What an admitted request holds until its response is done: its `limit-connections` slot,
/// and the auth response's `Set-Cookie` headers for the client.
#[derive(Debug, Default)]
pub struct Admission {
    _slot: Option<rate_limit::Slot>,
    cookies: Vec<HeaderValue>,
}

impl Admission {
    /// Adds the auth response's `Set-Cookie` to a response whose status is one nginx's
    /// `add_header` applies to (200, 201, 204, 206, 301, 302, 303, 304, 307, 308).
    pub fn decorate(&self, status: StatusCode, headers: &mut HeaderMap) {
        const STATUSES: [u16; 10] = [200, 201, 204, 206, 301, 302, 303, 304, 307, 308];
        if STATUSES.contains(&status.as_u16()) {
            for cookie in &self.cookies {
                headers.append(header::SET_COOKIE, cookie.clone());
            }
        }
    }
}

/// What the policies need to know of a request besides its head: from its connection and route.
#[derive(Clone, Copy, Debug)]
pub struct Client<'a> {
    /// The client's address (the peer after PROXY protocol; IPv4-mapped IPv6 as IPv4).
    pub ip: IpAddr,
    /// `$scheme`: the connection's (`http` or `https`).
    pub scheme: &'static str,
    /// `$pass_access_scheme`: the scheme, or `X-Forwarded-Proto` from a trusted proxy.
    pub pass_scheme: &'static str,
    /// The Host as received (port and IPv6 brackets kept).
    pub host: &'a str,
}

/// The answer to a refused request (boxed: it is large, and the rare case).
pub type Refusal = Box<Response<Bytes>>;

type ZoneKey = (Arc<str>, Arc<str>);

/// The runtime side of the access policies, shared by every listener.
#[derive(Debug)]
pub struct Gate {
    zones: Mutex<HashMap<ZoneKey, Arc<rate_limit::Zone>>>,
    clients: Arc<rate_limit::Clients>,
    auth: ext_auth::AuthClient,
    /// Places for slow password hashes (bcrypt, MD5-crypt) on the blocking pool.
    hashing: Arc<Semaphore>,
}

impl Gate {
    /// A gate whose auth requests go over `upstream`'s pools to the allowed destinations, with
    /// these connect and response timeouts, counting the clients its rate-limit zones forget in
    /// `metrics`.
    pub(crate) fn new(
        upstream: Arc<Upstream>,
        destinations: AuthDestinations,
        timeouts: (Duration, Duration),
        metrics: Arc<Metrics>,
    ) -> Gate {
        let (per_zone, total) = (rate_limit::ZONE_KEYS, rate_limit::TOTAL_KEYS);
        Gate {
            zones: Mutex::default(),
            clients: rate_limit::Clients::new(per_zone, total, metrics),
            auth: ext_auth::AuthClient::new(upstream, destinations, timeouts),
            hashing: Arc::new(Semaphore::new(hashing_places())),
        }
    }

    /// Applies a route's access policy to a request: the limits, then basic auth, then external
    /// auth. Admitted, the request carries the auth response's headers and no longer the basic
    /// credentials; refused, the answer to send.
    pub async fn admit<B>(
        &self,
        access: Option<&Access>,
        zone: (&str, &str),
        req: &mut Request<B>,
        client: Client<'_>,
    ) -> Result<Admission, Refusal> {
        let Some(access) = access else {
            return Ok(Admission::default());
        };
        let slot = match &access.rate_limit {
            Some(limits) => self.limit(limits, zone, client.ip)?,
            None => None,
        };
        if let Some(basic) = &access.basic_auth {
            authenticate(basic, req, &self.hashing).await?;
        }
        let mut cookies = Vec::new();
        if let Some(auth) = &access.external_auth {
            cookies = self.ask(auth, req, client).await?;
        }
        if access.basic_auth.is_some() {
            // As ingress-nginx: `proxy_set_header Authorization ""`.
            req.headers_mut().remove(header::AUTHORIZATION);
        }
        Ok(Admission {
            _slot: slot,
            cookies,
        })
    }

    fn limit(
        &self,
        limits: &RateLimit,
        zone: (&str, &str),
        ip: IpAddr,
    ) -> Result<Option<rate_limit::Slot>, Refusal> {
        let zone = self.zone(limits, zone);
        match zone.admit(ip, Instant::now()) {
            rate_limit::Verdict::Admitted(slot) => Ok(slot),
            rate_limit::Verdict::Limited => Err(text(
                StatusCode::SERVICE_UNAVAILABLE,
                "503 too many requests from this client\n",
            )),
            rate_limit::Verdict::Misconfigured => Err(misconfigured()),
        }
    }

    /// The zone of an Ingress (namespace and name), started over when its limits changed.
    fn zone(&self, limits: &RateLimit, (namespace, name): (&str, &str)) -> Arc<rate_limit::Zone> {
        let key: ZoneKey = (namespace.into(), name.into());
        let mut zones = self.zones.lock().unwrap_or_else(|e| e.into_inner());
        match zones.get(&key) {
            Some(zone) if zone.config() == limits => zone.clone(),
            _ => {
                let zone = Arc::new(rate_limit::Zone::new(limits.clone(), &self.clients));
                zones.insert(key, zone.clone());
                zone
            }
        }
    }

    async fn ask<B>(
        &self,
        auth: &ExternalAuth,
        req: &mut Request<B>,
        client: Client<'_>,
    ) -> Result<Vec<HeaderValue>, Refusal> {
        if auth.error.is_some() {
            return Err(misconfigured());
        }
        let request_uri = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let vars = ext_auth::Vars {
            scheme: client.scheme,
            pass_scheme: client.pass_scheme,
            http_host: client.host,
            request_uri: &request_uri,
        };
        match self.auth.check(auth, req, client.ip, &vars).await {
            ext_auth::Outcome::Allow { headers, cookies } => {
                for (name, value) in headers {
                    match value {
                        Some(value) => req.headers_mut().insert(name, value),
                        None => req.headers_mut().remove(name),
                    };
                }
                Ok(cookies)
            }
            ext_auth::Outcome::Deny(res) => Err(Box::new(res)),
        }
    }
}

/// Slow hashes checked at once: half the cores (at least one), so that password checks never
/// take every core from the proxy's workers.
fn hashing_places() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

/// Checks basic credentials. A password longer than [`basic_auth::MAX_PASSWORD_BYTES`] matches
/// nothing and is never hashed.
async fn authenticate<B>(
    basic: &BasicAuth,
    req: &Request<B>,
    hashing: &Arc<Semaphore>,
) -> Result<(), Refusal> {
    if basic.error.is_some() {
        return Err(misconfigured());
    }
    let verified = match basic_auth::credentials(req.headers()) {
        Some((user, password)) if password.len() <= basic_auth::MAX_PASSWORD_BYTES => {
            match basic.hash_of(&user) {
                Some(hash) => matches(hash, password, hashing).await,
                None => false,
            }
        }
        _ => false,
    };
    if verified {
        return Ok(());
    }
    let mut res = text(StatusCode::UNAUTHORIZED, "401 authorization required\n");
    res.headers_mut()
        .insert(header::WWW_AUTHENTICATE, basic.challenge());
    Err(res)
}

/// Whether `password` matches `hash`: fast schemes on the calling worker; slow ones (bcrypt,
/// MD5-crypt: milliseconds each) on the blocking pool, at most `hashing`'s places at once (the
/// others wait their turn without holding a worker).
async fn matches(hash: Arc<str>, password: Vec<u8>, hashing: &Arc<Semaphore>) -> bool {
    if !basic_auth::is_slow(&hash) {
        return basic_auth::verify(&hash, &password);
    }
    let Ok(place) = hashing.clone().acquire_owned().await else {
        return false;
    };
    tokio::task::spawn_blocking(move || {
        let _place = place;
        basic_auth::verify(&hash, &password)
    })
    .await
    .unwrap_or(false)
}

fn text(status: StatusCode, body: &'static str) -> Refusal {
    let mut res = ext_auth::answer(status);
    *res.body_mut() = Bytes::from_static(body.as_bytes());
    Box::new(res)
}

/// `503`: the route's access settings are invalid (fail closed).
fn misconfigured() -> Refusal {
    Box::new(ext_auth::answer(StatusCode::SERVICE_UNAVAILABLE))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(rpm: u32) -> Access {
        Access {
            rate_limit: Some(RateLimit {
                rpm: Some(rpm),
                burst_multiplier: 1,
                ..RateLimit::default()
            }),
            ..Access::default()
        }
    }

    async fn status(gate: &Gate, access: &Access, zone: (&str, &str)) -> u16 {
        let client = Client {
            ip: "192.0.2.1".parse().unwrap(),
            scheme: "http",
            pass_scheme: "http",
            host: "a.test",
        };
        let mut req = Request::new(());
        match gate.admit(Some(access), zone, &mut req, client).await {
            Ok(_) => 200,
            Err(res) => res.status().as_u16(),
        }
    }

    #[tokio::test]
    async fn zones_outlive_snapshots_while_their_limits_are_unchanged() {
        let upstream = Arc::new(Upstream::new(Duration::from_secs(60), 8));
        let second = Duration::from_secs(1);
        let timeouts = (second, second);
        let gate = Gate::new(
            upstream,
            AuthDestinations::Default,
            timeouts,
            Metrics::unregistered(),
        );
        let zone = ("ns", "ing");
        // rpm 1, burst 1: two at once.
        for want in [200, 200, 503] {
            assert_eq!(status(&gate, &access(1), zone).await, want);
        }
        // A new snapshot carries an equal (not the same) Access: the bucket is kept.
        assert_eq!(status(&gate, &access(1).clone(), zone).await, 503);
        // Another Ingress has its own zone; changed limits start over.
        assert_eq!(status(&gate, &access(1), ("ns", "other")).await, 200);
        assert_eq!(status(&gate, &access(2), zone).await, 200);
    }
}
