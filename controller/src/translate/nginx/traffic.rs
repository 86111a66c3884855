//! The ingress-nginx keys that steer traffic: canaries (`canary`, `canary-by-header`(`-value`,
//! `-pattern`), `canary-by-cookie`, `canary-weight`(`-total`)), session affinity (`affinity:
//! cookie`, `affinity-mode`, `session-cookie-*`), `upstream-hash-by` (+`-subset`, `-subset-size`),
//! `upstream-vhost`, `from-to-www-redirect` and `service-upstream`. Values are parsed as
//! ingress-nginx parses them into the route model of [`dataplane::route_policy`]. Pure.

use std::sync::Arc;

use dataplane::route_policy::{
    AffinityCookie, Alternative, Choice, Condition, HashKey, Pinning, Step, ValueMatch, ValueRegex,
};
use dataplane::BackendId;

use super::{Finding, Read, Status, PREFIX};

/// Every key this module reads.
pub const KEYS: [&str; 25] = [
    "proxy-send-timeout",
    "canary",
    "affinity-canary-behavior",
    "canary-by-header",
    "canary-by-header-value",
    "canary-by-header-pattern",
    "canary-by-cookie",
    "canary-weight",
    "canary-weight-total",
    "affinity",
    "affinity-mode",
    "session-cookie-name",
    "session-cookie-path",
    "session-cookie-domain",
    "session-cookie-samesite",
    "session-cookie-secure",
    "session-cookie-max-age",
    "session-cookie-expires",
    "session-cookie-change-on-failure",
    "upstream-hash-by",
    "upstream-hash-by-subset",
    "upstream-hash-by-subset-size",
    "upstream-vhost",
    "from-to-www-redirect",
    "service-upstream",
];

/// The traffic settings of one Ingress.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// `canary: "true"`: the Ingress's rules are alternatives of the main Ingress's.
    pub canary: bool,
    /// `canary-by-header`.
    pub canary_header: Option<String>,
    /// `canary-by-header-value`.
    pub canary_header_value: Option<String>,
    /// `canary-by-header-pattern`.
    pub canary_header_pattern: Option<ValueRegex>,
    /// `canary-by-cookie`.
    pub canary_cookie: Option<String>,
    /// `canary-weight`.
    pub canary_weight: u32,
    /// `canary-weight-total` (100 unless given).
    pub canary_weight_total: Option<u32>,
    /// `affinity: cookie`.
    pub affinity: bool,
    /// `session-cookie-name`.
    pub cookie_name: Option<String>,
    /// `session-cookie-path`.
    pub cookie_path: Option<String>,
    /// `session-cookie-domain`.
    pub cookie_domain: Option<String>,
    /// `session-cookie-samesite`, capitalised.
    pub cookie_same_site: Option<String>,
    /// `session-cookie-secure`.
    pub cookie_secure: bool,
    /// `session-cookie-max-age`.
    pub cookie_max_age: Option<u64>,
    /// `session-cookie-expires`.
    pub cookie_expires: Option<u64>,
    /// `session-cookie-change-on-failure`.
    pub change_on_failure: bool,
    /// `upstream-hash-by`, parsed.
    pub hash_by: Option<(String, Vec<dataplane::route_policy::KeyPart>)>,
    /// `upstream-hash-by-subset`.
    pub hash_subset: bool,
    /// `upstream-hash-by-subset-size` (3 unless given).
    pub hash_subset_size: Option<u32>,
    /// `upstream-vhost`.
    pub upstream_vhost: Option<String>,
    /// `from-to-www-redirect`.
    pub www_redirect: bool,
    /// `service-upstream`.
    pub service_upstream: bool,
    /// `enable-cors` and the `cors-*` keys.
    pub cors: super::cors::CorsKeys,
    /// `proxy-send-timeout`.
    pub send_timeout: Option<std::time::Duration>,
}

/// Whether this module reads the key.
pub fn handles(name: &str) -> bool {
    KEYS.contains(&name) || super::cors::KEYS.contains(&name)
}

impl Traffic {
    /// Applies one key's value, or says why it does not parse.
    pub fn apply(&mut self, name: &str, value: &str) -> Result<(), String> {
        let v = value.trim();
        match name {
            "proxy-send-timeout" => self.send_timeout = Some(super::parse_seconds(v)?),
            "canary" => self.canary = super::parse_bool(v)?,
            "canary-by-header" => self.canary_header = Some(header_name(v)?),
            "canary-by-header-value" => self.canary_header_value = Some(text(v)?),
            "canary-by-header-pattern" => {
                let regex = ValueRegex::new(v).map_err(|e| {
                    let last = e.to_string().lines().last().unwrap_or_default().to_owned();
                    format!("{v:?} is not a regex duet can compile (Rust's regex crate, not PCRE): {last}; no header value matches it")
                })?;
                self.canary_header_pattern = Some(regex);
            }
            "canary-by-cookie" => self.canary_cookie = Some(cookie_name(v)?),
            "canary-weight" => self.canary_weight = whole(v)?,
            "canary-weight-total" => self.canary_weight_total = Some(whole(v)?.max(1)),
            "affinity" => match v {
                "cookie" => self.affinity = true,
                _ => {
                    return Err(format!(
                        "{v:?} is not \"cookie\" (the only affinity type); no affinity"
                    ))
                }
            },
            "affinity-canary-behavior" => match v {
                "sticky" => {}
                "legacy" => return Err("legacy is not implemented: sticky (the default) applies, a request whose affinity cookie names a pod of the main or the canary backend stays there".to_owned()),
                _ => return Err(format!("{v:?} is not sticky or legacy; sticky applies")),
            },
            "affinity-mode" => match v {
                "balanced" | "persistent" => {}
                _ => {
                    return Err(format!(
                        "{v:?} is not balanced or persistent; balanced applies"
                    ))
                }
            },
            "session-cookie-name" => self.cookie_name = Some(cookie_name(v)?),
            "session-cookie-path" => self.cookie_path = Some(cookie_path(v)?),
            "session-cookie-domain" => self.cookie_domain = Some(domain(v)?),
            "session-cookie-samesite" => self.cookie_same_site = Some(same_site(v)?),
            "session-cookie-secure" => self.cookie_secure = super::parse_bool(v)?,
            "session-cookie-max-age" => self.cookie_max_age = Some(whole(v)?.into()),
            "session-cookie-expires" => self.cookie_expires = Some(whole(v)?.into()),
            "session-cookie-change-on-failure" => self.change_on_failure = super::parse_bool(v)?,
            "upstream-hash-by" => {
                let parts = dataplane::policy::hash::parse_key(v)
                    .map_err(|e| format!("{e}; requests are balanced by --lb"))?;
                self.hash_by = Some((v.to_owned(), parts));
            }
            "upstream-hash-by-subset" => self.hash_subset = super::parse_bool(v)?,
            "upstream-hash-by-subset-size" => self.hash_subset_size = Some(whole(v)?.max(1)),
            "upstream-vhost" => self.upstream_vhost = Some(vhost(v)?),
            "from-to-www-redirect" => self.www_redirect = super::parse_bool(v)?,
            "service-upstream" => self.service_upstream = super::parse_bool(v)?,
            cors => return self.cors.apply(cors, value),
        }
        Ok(())
    }

    /// How a target of this Ingress's backend is chosen on a rule of path `path`: the affinity
    /// cookie (which wins over the hash, as in ingress-nginx), the hash, or the balancer.
    /// `service-upstream` leaves one target (the Service), so nothing to pin.
    pub fn pinning(&self, path: &str) -> Pinning {
        if self.service_upstream {
            return Pinning::None;
        }
        if self.affinity {
            let path = self
                .cookie_path
                .clone()
                .unwrap_or_else(|| default_cookie_path(path));
            return Pinning::Cookie(Arc::new(AffinityCookie {
                name: self
                    .cookie_name
                    .as_deref()
                    .unwrap_or("INGRESSCOOKIE")
                    .into(),
                path: path.into(),
                domain: self.cookie_domain.as_deref().map(Arc::from),
                same_site: self.cookie_same_site.as_deref().map(Arc::from),
                secure: self.cookie_secure,
                max_age: self.cookie_max_age,
                expires: self.cookie_expires,
                change_on_failure: self.change_on_failure,
            }));
        }
        match &self.hash_by {
            Some((written, parts)) => Pinning::Hash(Arc::new(HashKey {
                written: written.as_str().into(),
                parts: parts.clone(),
                subset: self.hash_subset.then(|| self.hash_subset_size.unwrap_or(3)),
            })),
            None => Pinning::None,
        }
    }

    /// The choice of a rule of this (main) Ingress, if it needs one.
    pub fn choice(&self, path: &str) -> Option<Choice<BackendId>> {
        let choice = Choice {
            primary: self.pinning(path),
            upstream_host: self.upstream_vhost.as_deref().map(Arc::from),
            cors: self.cors.cors(),
            ..Choice::default()
        };
        (choice != Choice::default()).then_some(choice)
    }

    /// Attaches this canary Ingress's backend to a main rule's choice, in ingress-nginx's
    /// precedence: by header, then by cookie, then by weight.
    pub fn attach_canary(&self, choice: &mut Choice<BackendId>, backend: BackendId, path: &str) {
        choice.alternatives.push(Alternative {
            backend,
            weight: self.canary_weight,
            pinning: self.pinning(path),
        });
        let arm = choice.alternatives.len();
        choice.weight_total = self.canary_weight_total.unwrap_or(100);
        let exact = |v: &str| ValueMatch::Exact(v.into());
        if let Some(name) = &self.canary_header {
            let name: Arc<str> = name.to_ascii_lowercase().into();
            let header = |value| Condition::Header {
                name: name.clone(),
                value,
            };
            if let Some(value) = &self.canary_header_value {
                choice.steps.push(Step {
                    when: header(exact(value)),
                    arm,
                });
            } else if let Some(pattern) = &self.canary_header_pattern {
                let when = header(ValueMatch::Regex(pattern.clone()));
                choice.steps.push(Step { when, arm });
            } else {
                choice.steps.push(Step {
                    when: header(exact("always")),
                    arm,
                });
                choice.steps.push(Step {
                    when: header(exact("never")),
                    arm: 0,
                });
            }
        }
        if let Some(name) = &self.canary_cookie {
            let cookie = |value| Condition::Cookie {
                name: name.as_str().into(),
                value,
            };
            choice.steps.push(Step {
                when: cookie(exact("always")),
                arm,
            });
            choice.steps.push(Step {
                when: cookie(exact("never")),
                arm: 0,
            });
        }
    }
}

/// The affinity cookie's default `Path`: the rule's path, `/` when it is a regex or has
/// characters a cookie path cannot hold.
fn default_cookie_path(path: &str) -> String {
    let plain = path
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/-._~".contains(&b));
    if plain && path.starts_with('/') {
        path.to_owned()
    } else {
        "/".to_owned()
    }
}

/// Post-processing of an Ingress's findings: canary keys without `canary: "true"` have no
/// effect, and on a canary Ingress the keys other than canary, affinity and hashing are the
/// main Ingress's business (as in ingress-nginx).
pub fn finish(read: &mut Read) {
    if read.findings.is_empty() {
        return;
    }
    let canary = read.settings.traffic.canary;
    for f in read.findings.iter_mut().filter(|f| f.status.is_honoured()) {
        let Some(name) = f.key.strip_prefix(PREFIX).map(str::to_owned) else {
            continue;
        };
        if name == "canary" {
            continue;
        }
        if !canary && name.starts_with("canary-") {
            ignore(
                f,
                "no effect without canary: \"true\" (as in ingress-nginx)",
            );
        }
        let kept = name.starts_with("canary")
            || name.starts_with("affinity")
            || name.starts_with("session-cookie-")
            || name.starts_with("upstream-hash-by")
            || name == "load-balance";
        if canary && !kept {
            ignore(f, "on a canary Ingress ingress-nginx ignores it: the main Ingress's annotations apply to the canary's requests");
        }
    }
    let affinity = read.settings.traffic.affinity;
    let hash_key = format!("{PREFIX}upstream-hash-by");
    for f in read.findings.iter_mut().filter(|f| f.status.is_honoured()) {
        if affinity && f.key.starts_with(&hash_key) {
            ignore(
                f,
                "affinity: cookie is set too and wins (as in ingress-nginx)",
            );
        }
        if read.settings.traffic.service_upstream
            && (f.key.starts_with(&hash_key)
                || f.key.starts_with(&format!("{PREFIX}affinity"))
                || f.key.starts_with(&format!("{PREFIX}session-cookie-")))
        {
            ignore(f, "service-upstream leaves one target, the Service (stickiness is lost, as in ingress-nginx)");
        }
    }
}

fn ignore(f: &mut Finding, why: &str) {
    f.status = Status::IgnoredUnsupported;
    f.detail = why.to_owned();
}

/// A whole non-negative number, as `strconv.Atoi` reads it (no sign, no unit).
fn whole(v: &str) -> Result<u32, String> {
    match v.parse::<u32>() {
        Ok(n) if v.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
        _ => Err(format!("{v:?} is not a whole number; the default applies")),
    }
}

/// An HTTP header name (a token).
fn header_name(v: &str) -> Result<String, String> {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if !v.is_empty() && v.bytes().all(token) {
        Ok(v.to_owned())
    } else {
        Err(format!("{v:?} is not a header name; ignored"))
    }
}

/// Printable ASCII text, not empty.
fn text(v: &str) -> Result<String, String> {
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
        Ok(v.to_owned())
    } else {
        Err(format!("{v:?} is not printable text; ignored"))
    }
}

/// A cookie name: letters, digits and `-._~` (ingress-nginx's validator without `/` and `:`,
/// which a cookie name cannot hold).
fn cookie_name(v: &str) -> Result<String, String> {
    if !v.is_empty()
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
    {
        Ok(v.to_owned())
    } else {
        Err(format!(
            "{v:?} is not a cookie name (letters, digits, -._~); the default applies"
        ))
    }
}

/// A cookie `Path`: absolute, no `;`, printable.
fn cookie_path(v: &str) -> Result<String, String> {
    if v.starts_with('/') && v.bytes().all(|b| b.is_ascii_graphic() && b != b';') {
        Ok(v.to_owned())
    } else {
        Err(format!(
            "{v:?} is not a cookie path like /app; the rule's path applies"
        ))
    }
}

/// A cookie `Domain`.
fn domain(v: &str) -> Result<String, String> {
    let ok = !v.is_empty()
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    ok.then(|| v.to_owned())
        .ok_or_else(|| format!("{v:?} is not a domain; no Domain attribute"))
}

/// `None`, `Lax` or `Strict`, case-insensitive (as ingress-nginx since 1.9.5).
fn same_site(v: &str) -> Result<String, String> {
    match v.to_ascii_lowercase().as_str() {
        "none" => Ok("None".into()),
        "lax" => Ok("Lax".into()),
        "strict" => Ok("Strict".into()),
        _ => Err(format!(
            "{v:?} is not None, Lax or Strict; no SameSite attribute"
        )),
    }
}

/// An `upstream-vhost`: a host (IPv6 literals in brackets, a port) without nginx variables.
fn vhost(v: &str) -> Result<String, String> {
    let ok = !v.is_empty()
        && !v.contains('$')
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b));
    ok.then(|| v.to_owned()).ok_or_else(|| {
        format!("{v:?} is not a host like api.example.com or [2001:db8::1]:8080 (nginx variables are not expanded); the client's Host is sent")
    })
}

/// The other spelling of a host for `from-to-www-redirect`: with `www.` removed or added.
pub fn www_twin(host: &str) -> Option<String> {
    www_twin_parts(host).map(|(prefix, rest)| format!("{prefix}{rest}"))
}

/// [`www_twin`] unwritten: the prefix to put before the rest (`""` and the bare host, or `www.`
/// and the host), for callers that only hash it.
pub fn www_twin_parts(host: &str) -> Option<(&'static str, &str)> {
    if host.starts_with("*.") || host.is_empty() {
        return None;
    }
    match host.strip_prefix("www.") {
        Some(bare) if bare.contains('.') => Some(("", bare)),
        Some(_) => None,
        None => Some(("www.", host)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traffic(pairs: &[(&str, &str)]) -> Traffic {
        let mut t = Traffic::default();
        for (k, v) in pairs {
            t.apply(k, v).unwrap();
        }
        t
    }

    #[test]
    fn a_header_value_replaces_always_and_never() {
        let t = traffic(&[
            ("canary", "true"),
            ("canary-by-header", "X-Canary"),
            ("canary-by-header-value", "yes"),
        ]);
        let mut c = Choice::default();
        t.attach_canary(&mut c, "ns/canary:80".parse::<BackendId>().unwrap(), "/");
        assert_eq!(c.steps.len(), 1);
        assert_eq!(
            c.steps[0].when,
            Condition::Header {
                name: "x-canary".into(),
                value: ValueMatch::Exact("yes".into())
            }
        );
        let t = traffic(&[
            ("canary-by-header", "x-c"),
            ("canary-by-cookie", "c"),
            ("canary-weight", "10"),
            ("canary-weight-total", "1000"),
        ]);
        let mut c = Choice::default();
        t.attach_canary(&mut c, "ns/canary:80".parse::<BackendId>().unwrap(), "/");
        let arms: Vec<usize> = c.steps.iter().map(|s| s.arm).collect();
        assert_eq!(arms, [1, 0, 1, 0]);
        assert_eq!((c.alternatives[0].weight, c.weight_total), (10, 1000));
    }

    #[test]
    fn values_parse_as_ingress_nginx_reads_them() {
        let mut t = Traffic::default();
        assert!(t.apply("canary-weight", "-5").is_err());
        assert!(t.apply("canary-weight", "10%").is_err());
        assert!(t.apply("affinity", "ip").is_err());
        assert!(t.apply("session-cookie-samesite", "lax").is_ok());
        assert_eq!(t.cookie_same_site.as_deref(), Some("Lax"));
        assert!(t.apply("upstream-vhost", "$host").is_err());
        assert!(t.apply("upstream-vhost", "[2001:db8::1]:8080").is_ok());
        assert!(t.apply("upstream-hash-by", "$request_id").is_err());
        assert!(t.apply("canary-by-header-pattern", "(?!x)").is_err());
        assert!(t.apply("session-cookie-name", "a;b").is_err());
    }

    #[test]
    fn twins_add_or_drop_www() {
        assert_eq!(www_twin("example.com").as_deref(), Some("www.example.com"));
        assert_eq!(www_twin("www.example.com").as_deref(), Some("example.com"));
        assert_eq!(www_twin("www.com"), None);
        assert_eq!(www_twin("*.example.com"), None);
    }
}
