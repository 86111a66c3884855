//! The per-request choices of a route ([`crate::route_policy`] holds their data): which backend
//! serves (the first matching step, else a weighted draw: ingress-nginx canaries), which of its
//! targets (a session-affinity cookie naming the pod, a consistent hash of a request key, else the
//! balancer), the `Host` sent upstream, and the affinity cookie sent back.

use super::{affinity, canary, cors, hash};

use std::net::IpAddr;

use http::{HeaderMap, HeaderValue, Uri};

use crate::balance::{LiveBackend, Pick};
use crate::route_policy::Pinning;
use crate::table::{BackendId, Family, FamilyPolicy, RouteAction};

/// What the choices look at in a request.
#[derive(Clone, Copy, Debug)]
pub struct RequestView<'a> {
    /// The request headers as received.
    pub headers: &'a HeaderMap,
    /// The normalised origin-form target (path and query).
    pub target: &'a Uri,
    /// The request host, without port.
    pub host: &'a str,
    /// The client address (IPv4-mapped IPv6 already IPv4).
    pub client: IpAddr,
}

/// The backend chosen for a request and how to choose its target.
#[derive(Clone, Debug)]
pub struct Steered<'a> {
    /// The backend serving the request.
    pub backend: &'a BackendId,
    pinning: &'a Pinning,
    /// The cookie's target token, or the hash of the key.
    value: Option<u64>,
}

static NONE: Pinning = Pinning::None;

/// The live backends by id, as the proxy holds them: in copy-on-write shards (a change copies
/// one), each hashed fast (foldhash, seeded per process): the keys are the snapshot's backend
/// ids, never what a client sends, and every request looks its backend up.
pub type Backends = crate::table::BackendMap<std::sync::Arc<LiveBackend>>;

/// Chooses the backend of a request and reads what pins its target. A request whose affinity
/// cookie names a pod of one of the route's backends stays on that backend before any canary
/// rule (ingress-nginx's `affinity-canary-behavior: sticky`, its default).
pub fn steer<'a>(
    action: &'a RouteAction,
    view: &RequestView<'_>,
    backends: &Backends,
) -> Steered<'a> {
    let Some(choice) = action.choice.as_deref() else {
        return Steered {
            backend: &action.backend,
            pinning: &NONE,
            value: None,
        };
    };
    let arm = affinity::sticky_arm(choice, &action.backend, view.headers, backends)
        .unwrap_or_else(|| canary::arm(choice, view.headers));
    let (backend, pinning) = match arm {
        0 => (&action.backend, &choice.primary),
        k => {
            let alt = &choice.alternatives[k - 1];
            (&alt.backend, &alt.pinning)
        }
    };
    let value = match pinning {
        Pinning::None => None,
        Pinning::Cookie(c) => affinity::named(view.headers, &c.name),
        Pinning::Hash(key) => Some(hash::key_hash(key, view)),
    };
    Steered {
        backend,
        pinning,
        value,
    }
}

impl Steered<'_> {
    /// Picks a target not yet tried: the one the cookie names or the key hashes to when the
    /// family policy admits it, else the balancer's.
    pub fn pick(
        &self,
        backend: &LiveBackend,
        client: Family,
        policy: FamilyPolicy,
        tried: &[usize],
    ) -> Option<Pick> {
        let pinned = match (self.pinning, self.value) {
            (Pinning::Cookie(_), Some(token)) => {
                affinity::find(backend, token).filter(|i| !tried.contains(i))
            }
            (Pinning::Hash(key), Some(h)) => {
                hash::choose(backend, h, key.subset, client, policy, tried)
            }
            _ => None,
        };
        let pinned = pinned.filter(|&i| policy.admits(&backend.backend.targets[i], client));
        match pinned {
            Some(index) => Some(backend.pick_index(index, client, policy)),
            None => backend.pick(client, policy, tried),
        }
    }

    /// The `Set-Cookie` to send when the request was served by target `served`: when the request
    /// named no live target, or (with `change-on-failure`) another than the one that served.
    pub fn set_cookie(
        &self,
        backend: &LiveBackend,
        served: usize,
        https: bool,
    ) -> Option<HeaderValue> {
        let Pinning::Cookie(cookie) = self.pinning else {
            return None;
        };
        let token = affinity::token(backend, served);
        let set = match self.value.and_then(|named| affinity::find(backend, named)) {
            Some(named) => named != served && cookie.change_on_failure,
            None => true,
        };
        set.then(|| affinity::set_cookie(cookie, token, https))
            .flatten()
    }
}

/// The `Host` the route sends upstream in place of the client's, if it sets one.
pub fn upstream_host(action: &RouteAction) -> Option<HeaderValue> {
    let host = action.choice.as_deref()?.upstream_host.as_deref()?;
    HeaderValue::from_str(host).ok()
}

/// A 64-bit hash that is the same in every duet process and version (FNV-1a over the parts, a
/// zero byte between them, then the MurmurHash3 finaliser for avalanche).
pub fn stable_hash(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (k, part) in parts.iter().enumerate() {
        if k > 0 {
            h = (h ^ 0xff).wrapping_mul(0x0100_0000_01b3);
        }
        for &b in *part {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    mix(h)
}

/// MurmurHash3's 64-bit finaliser.
pub fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The value of the first cookie called `name` in the request's `Cookie` headers.
pub fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| k.trim() == name)
        .map(|(_, v)| v.trim().trim_matches('"'))
}

/// [`steer`] for a request as the proxy holds it: `host` as received, `client` the peer.
pub fn steer_request<'a>(
    action: &'a RouteAction,
    headers: &HeaderMap,
    target: &Uri,
    host: &str,
    client: IpAddr,
    backends: &Backends,
) -> Steered<'a> {
    if action.choice.is_none() {
        return steer(action, &empty_view(target), backends);
    }
    let lower = crate::table::strip_port(host).to_ascii_lowercase();
    let view = RequestView {
        headers,
        target,
        host: &lower,
        client: client.to_canonical(),
    };
    steer(action, &view, backends)
}

fn empty_view(target: &Uri) -> RequestView<'_> {
    static EMPTY: std::sync::OnceLock<HeaderMap> = std::sync::OnceLock::new();
    RequestView {
        headers: EMPTY.get_or_init(HeaderMap::new),
        target,
        host: "",
        client: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
    }
}

/// Replaces the upstream request's `Host` when the route sets one (`upstream-vhost`).
pub fn set_upstream_host(action: &RouteAction, headers: &mut HeaderMap) {
    if let Some(host) = upstream_host(action) {
        headers.insert(http::header::HOST, host);
    }
}

/// Adds the affinity cookie and the CORS headers to a response, if due.
pub fn respond(headers: &mut HeaderMap, cookie: Option<HeaderValue>, cors: Option<&HeaderMap>) {
    if let Some(cookie) = cookie {
        headers.append(http::header::SET_COOKIE, cookie);
    }
    if let Some(cors) = cors {
        cors::add_to(headers, cors);
    }
}

/// The CORS headers a request gets on its route, if any.
pub fn cors_for(action: &RouteAction, request: &HeaderMap) -> Option<HeaderMap> {
    let cors = action.choice.as_deref()?.cors.as_deref()?;
    cors::headers_for(cors, request)
}

/// The `204` duet answers a CORS preflight with (`Content-Type: text/plain charset=UTF-8`, as
/// ingress-nginx), if the request is one: `cors` are the headers [`cors_for`] gave it. With
/// Gateway API's CORS every preflight is answered, an origin not allowed without CORS headers.
pub fn preflight(
    action: &RouteAction,
    method: &http::Method,
    request: &HeaderMap,
    cors: Option<&HeaderMap>,
) -> Option<HeaderMap> {
    let gateway = action
        .choice
        .as_deref()
        .and_then(|c| c.cors.as_deref())
        .is_some_and(|c| c.gateway);
    let answered = |c: &&HeaderMap| {
        cors::is_preflight(method, c) || (gateway && cors::is_any_preflight(method, request))
    };
    let mut headers = cors.filter(answered)?.clone();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain charset=UTF-8"),
    );
    Some(headers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route_policy::{Choice, HashKey, KeyPart};
    use crate::table::{Origin, UpstreamTimeouts};
    use std::sync::Arc;

    fn action(parts: Vec<KeyPart>) -> RouteAction {
        RouteAction {
            backend: "ns/svc:80".parse::<BackendId>().unwrap(),
            policy: FamilyPolicy::default(),
            origin: Origin {
                kind: Default::default(),
                namespace: "ns".into(),
                name: "i".into(),
                created: 0,
            }
            .into(),
            redirect_https: false,
            max_body_bytes: 0,
            upstream_tls: None,
            timeouts: UpstreamTimeouts::default().into(),
            protocol: None,
            redirect: None,
            source_ranges: None,
            rewrite: None,
            access: None,
            filters: None,
            choice: Some(Arc::new(Choice {
                primary: Pinning::Hash(Arc::new(HashKey {
                    written: "$remote_addr".into(),
                    parts,
                    subset: None,
                })),
                ..Choice::default()
            })),
            client_auth: None,
        }
    }

    fn key_of(a: &RouteAction, client: &str) -> Option<u64> {
        let target: Uri = "/x?y=1".parse().unwrap();
        let s = steer_request(
            a,
            &HeaderMap::new(),
            &target,
            "Example.com:80",
            client.parse().unwrap(),
            &Backends::default(),
        );
        s.value
    }

    #[test]
    fn an_ipv4_mapped_peer_hashes_as_its_ipv4_address() {
        let a = action(vec![KeyPart::RemoteAddr]);
        assert_eq!(key_of(&a, "::ffff:192.0.2.7"), key_of(&a, "192.0.2.7"));
        assert_ne!(key_of(&a, "2001:db8::7"), key_of(&a, "2001:db8::8"));
        assert_eq!(
            key_of(&a, "2001:db8::7"),
            Some(stable_hash(&[b"2001:db8::7"])),
            "the full IPv6 address"
        );
        let host = action(vec![KeyPart::Host, KeyPart::RequestUri]);
        assert_eq!(
            key_of(&host, "::1"),
            Some(stable_hash(&[b"example.com/x?y=1"]))
        );
    }

    #[test]
    fn the_stable_hash_does_not_change() {
        // Cookies written by one duet are read by every other, of any version: pin the values.
        assert_eq!(
            format!("{:016x}", stable_hash(&[b"ns/svc:http", b"uid-1"])),
            "7866a0979d79e7aa"
        );
        assert_ne!(stable_hash(&[b"ab", b"c"]), stable_hash(&[b"a", b"bc"]));
    }
}
