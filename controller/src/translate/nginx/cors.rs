//! ingress-nginx's CORS keys (`enable-cors`, `cors-allow-origin`, `-methods`, `-headers`,
//! `-credentials`, `-max-age`, `-expose-headers`) read into [`dataplane::route_policy::Cors`],
//! with ingress-nginx's defaults (credentials `true`, max age 1728000). Pure.

use std::sync::Arc;

use dataplane::route_policy::{Cors, OriginPattern};

/// The default `cors-allow-methods`.
pub const METHODS: &str = "GET, PUT, POST, DELETE, PATCH, OPTIONS";
/// The default `cors-allow-headers`.
pub const HEADERS: &str = "DNT,Keep-Alive,User-Agent,X-Requested-With,If-Modified-Since,Cache-Control,Content-Type,Range,Authorization";

/// Every key this module reads.
pub const KEYS: [&str; 7] = [
    "enable-cors",
    "cors-allow-origin",
    "cors-allow-methods",
    "cors-allow-headers",
    "cors-allow-credentials",
    "cors-max-age",
    "cors-expose-headers",
];

/// The CORS keys of one Ingress.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CorsKeys {
    enabled: bool,
    origins: Option<Option<Vec<OriginPattern>>>,
    methods: Option<String>,
    headers: Option<String>,
    credentials: Option<bool>,
    max_age: Option<u64>,
    expose: Option<String>,
}

impl CorsKeys {
    /// Applies one key, or says why its value does not parse (the default applies, except for
    /// `cors-allow-origin`, whose valid entries still apply).
    pub fn apply(&mut self, name: &str, value: &str) -> Result<(), String> {
        let v = value.trim();
        match name {
            "enable-cors" => self.enabled = super::parse_bool(v)?,
            "cors-allow-origin" => return self.origins(v),
            "cors-allow-methods" => self.methods = Some(list(v, |b| b.is_ascii_alphabetic())?),
            "cors-allow-headers" => self.headers = Some(list(v, header_byte)?),
            "cors-expose-headers" => self.expose = Some(list(v, |b| header_byte(b) || b == b'*')?),
            "cors-allow-credentials" => self.credentials = Some(super::parse_bool(v)?),
            "cors-max-age" => {
                let n = v
                    .parse::<u64>()
                    .ok()
                    .filter(|_| v.bytes().all(|b| b.is_ascii_digit()));
                self.max_age = Some(n.ok_or_else(|| {
                    format!("{v:?} is not a whole number of seconds; 1728000 applies")
                })?);
            }
            _ => return Err(format!("{name} has no parser")),
        }
        Ok(())
    }

    fn origins(&mut self, v: &str) -> Result<(), String> {
        let entries: Vec<&str> = v
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .collect();
        if entries.is_empty() || entries.contains(&"*") {
            self.origins = Some(None);
            return Ok(());
        }
        let (good, bad): (Vec<_>, Vec<_>) = entries
            .iter()
            .map(|e| (e, OriginPattern::parse(e)))
            .partition(|(_, p)| p.is_some());
        self.origins = Some(Some(good.into_iter().filter_map(|(_, p)| p).collect()));
        if bad.is_empty() {
            return Ok(());
        }
        let bad: Vec<&str> = bad.iter().map(|(e, _)| **e).collect();
        Err(format!(
            "{bad:?} are not origins like https://app.example.com, https://*.example.com or null; skipped, the other entries apply (as in ingress-nginx)"
        ))
    }

    /// The route's CORS, when `enable-cors` is true.
    pub fn cors(&self) -> Option<Arc<Cors>> {
        self.enabled.then(|| {
            Arc::new(Cors {
                origins: self.origins.clone().unwrap_or(None),
                methods: self.methods.as_deref().unwrap_or(METHODS).into(),
                headers: self.headers.as_deref().unwrap_or(HEADERS).into(),
                expose: self.expose.as_deref().map(Arc::from),
                credentials: self.credentials.unwrap_or(true),
                max_age: self.max_age.unwrap_or(1_728_000),
                gateway: false,
            })
        })
    }

    /// Whether `enable-cors` is true.
    pub fn enabled(&self) -> bool {
        self.enabled
    }
}

fn header_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

/// A comma list of words made of `allowed` bytes (spaces after commas kept as written).
fn list(v: &str, allowed: impl Fn(u8) -> bool) -> Result<String, String> {
    let ok = !v.is_empty()
        && v.split(',').all(|w| {
            let w = w.trim();
            !w.is_empty() && w.bytes().all(&allowed)
        });
    ok.then(|| v.to_owned())
        .ok_or_else(|| format!("{v:?} is not a comma-separated list of names; the default applies"))
}
