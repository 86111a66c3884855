//! Session affinity by cookie (ingress-nginx's `affinity: cookie`): the cookie names the TARGET
//! (the pod), not an address, so a dual-stack pod keeps its sessions when the client switches
//! family. The value is an opaque token, 16 hex digits of a stable hash of the backend and the
//! target's identity (the pod uid): no address appears in it, and every duet replica computes the
//! same token for the same pod.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue};

use crate::balance::LiveBackend;
use crate::route_policy::{AffinityCookie, Choice, Pinning};
use crate::table::BackendId;

/// The token the request's affinity cookie carries, if it is one duet could have written.
pub fn named(headers: &HeaderMap, name: &str) -> Option<u64> {
    let value = super::cookie(headers, name)?;
    if value.len() != 16 {
        return None;
    }
    u64::from_str_radix(value, 16).ok()
}

/// The token of a backend's target.
pub fn token(backend: &LiveBackend, index: usize) -> u64 {
    let id = &backend.backend.targets[index].id.0;
    super::stable_hash(&[backend.backend.id.as_str().as_bytes(), id.as_bytes()])
}

/// The target a token names, if the backend still has it.
pub fn find(backend: &LiveBackend, token_value: u64) -> Option<usize> {
    (0..backend.backend.targets.len()).find(|&i| token(backend, i) == token_value)
}

/// The arm whose backend the request's affinity cookie names a pod of, when the route has
/// alternatives (ingress-nginx's sticky canary behaviour).
pub fn sticky_arm(
    choice: &Choice<BackendId>,
    primary: &BackendId,
    headers: &HeaderMap,
    backends: &super::Backends,
) -> Option<usize> {
    if choice.alternatives.is_empty() {
        return None;
    }
    let arms = std::iter::once((primary, &choice.primary))
        .chain(choice.alternatives.iter().map(|a| (&a.backend, &a.pinning)));
    arms.enumerate().find_map(|(k, (id, pinning))| {
        let Pinning::Cookie(cookie) = pinning else {
            return None;
        };
        let named = named(headers, &cookie.name)?;
        find(backends.get(id)?, named).map(|_| k)
    })
}

/// The `Set-Cookie` naming a token: `HttpOnly` always, `Secure` over HTTPS or when configured,
/// then the configured `Path`, `Domain`, `Expires`, `Max-Age` and `SameSite`.
pub fn set_cookie(cookie: &AffinityCookie, token_value: u64, https: bool) -> Option<HeaderValue> {
    set_cookie_at(cookie, token_value, https, SystemTime::now())
}

/// [`set_cookie`] at a given time (for `Expires`).
pub fn set_cookie_at(
    cookie: &AffinityCookie,
    token_value: u64,
    https: bool,
    now: SystemTime,
) -> Option<HeaderValue> {
    let mut out = format!("{}={token_value:016x}; Path={}", cookie.name, cookie.path);
    if let Some(seconds) = cookie.expires {
        let at = now + Duration::from_secs(seconds.min(1 << 32));
        let at = jiff::Timestamp::try_from(at).ok()?;
        out.push_str(
            &at.strftime("; Expires=%a, %d %b %Y %H:%M:%S GMT")
                .to_string(),
        );
    }
    if let Some(seconds) = cookie.max_age {
        out.push_str(&format!("; Max-Age={seconds}"));
    }
    if let Some(domain) = &cookie.domain {
        out.push_str(&format!("; Domain={domain}"));
    }
    out.push_str("; HttpOnly");
    if https || cookie.secure {
        out.push_str("; Secure");
    }
    if let Some(same_site) = &cookie.same_site {
        out.push_str(&format!("; SameSite={same_site}"));
    }
    HeaderValue::from_str(&out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use crate::table::{Backend, BackendId, LbPolicy, Target, TargetId, UpstreamProtocol};

    fn live(ids: &[&str]) -> LiveBackend {
        let targets: Vec<Target> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| Target {
                id: TargetId((*id).into()),
                v4: Some(format!("10.0.0.{}:80", i + 1).parse().unwrap()),
                v6: Some(format!("[fd00::{}]:80", i + 1).parse().unwrap()),
                zone: None,
            })
            .collect();
        let backend = Backend {
            id: "ns/svc:80".parse::<BackendId>().unwrap(),
            targets: targets.into(),
            lb: LbPolicy::P2c,
            protocol: UpstreamProtocol::Http1,
        };
        LiveBackend::new(Arc::new(backend), None)
    }

    fn cookie() -> AffinityCookie {
        AffinityCookie {
            name: "INGRESSCOOKIE".into(),
            path: "/".into(),
            domain: None,
            same_site: None,
            secure: false,
            max_age: None,
            expires: None,
            change_on_failure: false,
        }
    }

    #[test]
    fn the_cookie_names_the_pod_without_its_addresses() {
        let b = live(&["uid-a", "uid-b", "10.0.0.3:80"]);
        for i in 0..3 {
            let value = set_cookie(&cookie(), token(&b, i), false).unwrap();
            let text = value.to_str().unwrap();
            let v = text["INGRESSCOOKIE=".len()..].split(';').next().unwrap();
            assert_eq!(v.len(), 16, "{text}");
            assert!(!text.contains("10.0.0") && !text.contains("fd00"), "{text}");
            let mut h = HeaderMap::new();
            h.insert(
                "cookie",
                HeaderValue::from_str(&format!("x=1; INGRESSCOOKIE={v}")).unwrap(),
            );
            assert_eq!(
                named(&h, "INGRESSCOOKIE").and_then(|t| find(&b, t)),
                Some(i)
            );
        }
        // The same pod in another order (a new snapshot) keeps its token.
        let reordered = live(&["uid-b", "uid-a"]);
        assert_eq!(token(&reordered, 1), token(&b, 0));
    }

    #[test]
    fn attributes_follow_the_annotations() {
        let c = AffinityCookie {
            path: "/app".into(),
            domain: Some("example.com".into()),
            same_site: Some("Strict".into()),
            max_age: Some(3600),
            expires: Some(60),
            ..cookie()
        };
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let v = set_cookie_at(&c, 0xab, true, at).unwrap();
        assert_eq!(
            v.to_str().unwrap(),
            "INGRESSCOOKIE=00000000000000ab; Path=/app; Expires=Tue, 14 Nov 2023 22:14:20 GMT; Max-Age=3600; Domain=example.com; HttpOnly; Secure; SameSite=Strict"
        );
        let plain = set_cookie_at(&cookie(), 1, false, at).unwrap();
        assert_eq!(
            plain.to_str().unwrap(),
            "INGRESSCOOKIE=0000000000000001; Path=/; HttpOnly"
        );
    }
}
