//! ingress-nginx compatibility: reads the `nginx.ingress.kubernetes.io/` annotations of one
//! Ingress into the settings duet applies, and reports every key with what duet does with it
//! (`honoured`, `honoured-with-difference`, `ignored-unsupported`, `ignored-unknown` with the
//! nearest known key within two edits, `ignored-removed-upstream`, `invalid-value`). Pure.
//!
//! Values follow ingress-nginx's parsers: booleans as Go's `strconv.ParseBool`, timeouts as whole
//! seconds without a unit, sizes in nginx syntax (`512`, `8k`, `10m`, `1g`; `0` unlimited). An
//! invalid value leaves the setting at duet's default. Where a `duet.dev/` annotation sets the
//! same thing, the `duet.dev/` one wins.

pub mod access;
mod buffering;
mod catalogue;
pub mod client_tls;
pub mod cors;
pub mod passthrough;
pub mod routing;
pub mod traffic;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use std::sync::Arc;

use dataplane::forwarded::Cidr;
use dataplane::table::{Redirect, Rewrite, SourceRanges, UpstreamProtocol};
use serde::Serialize;

pub use catalogue::{Key, Support, ALIASES, CONFIGMAP_ONLY, KEYS, REMOVED, SNIPPET_NOTE};

use super::annotation::AnnotationMap;
use super::diagnostic::{Diagnostic, Reason};
use crate::object::ObjectKey;

/// The annotation prefix of ingress-nginx.
pub const PREFIX: &str = "nginx.ingress.kubernetes.io/";

/// The prefix without its slash.
const DOMAIN: &str = "nginx.ingress.kubernetes.io";

/// What duet does with one annotation of one Ingress.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Applied with ingress-nginx's semantics.
    Honoured,
    /// Applied, with a difference the detail names.
    HonouredWithDifference,
    /// An ingress-nginx key duet does not apply (snippets included).
    IgnoredUnsupported,
    /// Not a key ingress-nginx reads (typos, ConfigMap options); the detail names the nearest.
    IgnoredUnknown,
    /// A key ingress-nginx itself removed.
    IgnoredRemovedUpstream,
    /// A value that does not parse; the default applies.
    InvalidValue,
}

impl Status {
    /// Every status, in declaration order.
    pub const ALL: [Status; 6] = [
        Status::Honoured,
        Status::HonouredWithDifference,
        Status::IgnoredUnsupported,
        Status::IgnoredUnknown,
        Status::IgnoredRemovedUpstream,
        Status::InvalidValue,
    ];

    /// The status's name: `honoured`, `ignored-unknown`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Honoured => "honoured",
            Status::HonouredWithDifference => "honoured-with-difference",
            Status::IgnoredUnsupported => "ignored-unsupported",
            Status::IgnoredUnknown => "ignored-unknown",
            Status::IgnoredRemovedUpstream => "ignored-removed-upstream",
            Status::InvalidValue => "invalid-value",
        }
    }

    /// Whether the annotation takes effect.
    pub fn is_honoured(self) -> bool {
        matches!(self, Status::Honoured | Status::HonouredWithDifference)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One annotation of an Ingress and what duet does with it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Finding {
    /// The annotation as written.
    pub key: String,
    /// What duet does with it.
    pub status: Status,
    /// The difference, the reason, or the nearest known key.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// The settings an Ingress's ingress-nginx annotations give; `None` leaves duet's own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// `ssl-redirect`: `Some(false)` turns the HTTPS redirect of TLS hosts off.
    pub ssl_redirect: Option<bool>,
    /// `force-ssl-redirect`: redirect plain HTTP even for hosts without TLS.
    pub force_ssl_redirect: bool,
    /// `proxy-body-size` in bytes (0: unlimited).
    pub body_size: Option<u64>,
    /// `proxy-connect-timeout`.
    pub connect_timeout: Option<Duration>,
    /// `proxy-read-timeout`.
    pub read_timeout: Option<Duration>,
    /// `backend-protocol`: the protocol to the pods, in place of the Service port's
    /// `appProtocol`.
    pub backend_protocol: Option<UpstreamProtocol>,
    /// `permanent-redirect` and its `-code` (301 unless given).
    pub permanent_redirect: Option<(Option<u16>, String)>,
    /// `temporal-redirect` and its `-code` (302 unless given); wins over `permanent-redirect`.
    pub temporal_redirect: Option<(Option<u16>, String)>,
    /// `app-root`: `/` redirects here with 302.
    pub app_root: Option<String>,
    /// `allowlist-source-range` (or its alias): only these clients are admitted.
    pub allow_source: Option<Vec<Cidr>>,
    /// `denylist-source-range`: these clients are refused.
    pub deny_source: Option<Vec<Cidr>>,
    /// A source-range list did not parse: the Ingress's routes answer 503 (fail closed).
    pub source_ranges_invalid: bool,
    /// The snippet annotations present (never interpreted).
    pub snippets: Vec<String>,
    /// `use-regex`: the paths of every Ingress of the host are case-insensitive regex prefixes.
    pub use_regex: bool,
    /// `rewrite-target`: the upstream path of the Ingress's paths (with `$1`..`$9`), or a full
    /// URL to redirect to with 302.
    pub rewrite_target: Option<String>,
    /// `x-forwarded-prefix`: sent upstream with rewritten requests.
    pub forwarded_prefix: Option<String>,
    /// The auth and limit annotations (see [`access`]).
    pub access: access::Annotations,
    /// Canaries, affinity, hashing, `upstream-vhost`, `from-to-www-redirect`,
    /// `service-upstream` ([`traffic`]).
    pub traffic: traffic::Traffic,
    /// The client-certificate annotations (see [`client_tls`]).
    pub client_tls: client_tls::Annotations,
    /// The buffering keys (see [`buffering`]): reported, nothing to apply (duet streams).
    pub buffering: buffering::Annotations,
    /// `ssl-passthrough` (see [`passthrough`]): the hosts' HTTPS connections are relayed
    /// unterminated, under `--enable-ssl-passthrough`.
    pub ssl_passthrough: bool,
}

impl Settings {
    /// The route's source ranges, if the annotations set any.
    pub fn source_ranges(&self) -> Option<Arc<SourceRanges>> {
        let ranges = SourceRanges {
            deny: self.deny_source.clone().unwrap_or_default(),
            allow: self.allow_source.clone(),
            invalid: self.source_ranges_invalid,
        };
        (ranges != SourceRanges::default()).then(|| Arc::new(ranges))
    }

    /// The route's redirects, if the annotations set any.
    pub fn redirect(&self) -> Option<Arc<Redirect>> {
        let url = |r: &Option<(Option<u16>, String)>, default: u16| {
            r.as_ref()
                .filter(|(_, url)| !url.is_empty())
                .map(|(code, url)| (code.unwrap_or(default), Arc::<str>::from(url.as_str())))
        };
        let redirect = Redirect {
            always: url(&self.temporal_redirect, 302)
                .or_else(|| url(&self.permanent_redirect, 301)),
            app_root: self.app_root.as_deref().map(Arc::from),
            to_host: None,
        };
        (redirect != Redirect::default()).then(|| Arc::new(redirect))
    }

    /// Whether a path of this Ingress turns every path of its host into a regex (ingress-nginx's
    /// `enforceRegexModifier`): `use-regex`, or a `rewrite-target` other than the path.
    pub fn forces_regex(&self, path: &str) -> bool {
        self.use_regex || self.rewrite_for(path).is_some()
    }

    /// The rewrite of a path of this Ingress: none when the target equals the path.
    pub fn rewrite_for(&self, path: &str) -> Option<Arc<Rewrite>> {
        let target = self.rewrite_target.as_deref().filter(|t| *t != path)?;
        Some(Arc::new(Rewrite {
            target: target.into(),
            forwarded_prefix: self.forwarded_prefix.as_deref().map(Arc::from),
        }))
    }

    /// Whether plain-HTTP requests of a rule redirect, given duet's own decision for its host.
    pub fn redirects(&self, tls_host_redirects: bool) -> bool {
        self.force_ssl_redirect || (tls_host_redirects && self.ssl_redirect != Some(false))
    }
}

/// What the annotations of one Ingress say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Read {
    /// What duet applies.
    pub settings: Settings,
    /// One finding per ingress-nginx annotation (and per near-miss of its prefix), sorted.
    pub findings: Vec<Finding>,
}

/// The `duet.dev/` annotation that wins over an ingress-nginx key, if any.
fn duet_override(name: &str) -> Option<&'static str> {
    Some(match name {
        "ssl-redirect" | "force-ssl-redirect" => super::SSL_REDIRECT_ANNOTATION,
        "proxy-body-size" => super::BODY_SIZE_ANNOTATION,
        "proxy-connect-timeout" => super::CONNECT_TIMEOUT_ANNOTATION,
        "proxy-read-timeout" => super::READ_TIMEOUT_ANNOTATION,
        _ => return None,
    })
}

/// Reads the ingress-nginx annotations of an Ingress.
pub fn read(annotations: &dyn AnnotationMap) -> Read {
    let mut read = Read::default();
    for (key, value) in annotations.pairs() {
        if let Some(name) = key.strip_prefix(PREFIX) {
            let (status, detail) = classify(name, value, annotations, &mut read.settings);
            if matches!(find_support(name), Some(Support::Snippet)) {
                read.settings.snippets.push(key.to_owned());
            }
            read.findings.push(Finding {
                key: key.to_owned(),
                status,
                detail,
            });
        } else if let Some(finding) = prefix_typo(key).or_else(|| other_prefix(key)) {
            read.findings.push(finding);
        }
    }
    codes_need_their_redirect(&mut read);
    prefix_needs_a_rewrite(&mut read);
    access::settle(&mut read);
    client_tls::settle(&mut read);
    buffering::settle(&mut read);
    traffic::finish(&mut read);
    read.findings.sort();
    read
}

/// A redirect code without its redirect has no effect (as in ingress-nginx): not honoured.
fn codes_need_their_redirect(read: &mut Read) {
    // Most Ingresses have no annotation: nothing to check, no key to write out.
    if read.findings.is_empty() {
        return;
    }
    let without =
        |r: &Option<(Option<u16>, String)>| r.as_ref().is_none_or(|(_, url)| url.is_empty());
    let missing = [
        (
            "permanent-redirect-code",
            "permanent-redirect",
            without(&read.settings.permanent_redirect),
        ),
        (
            "temporal-redirect-code",
            "temporal-redirect",
            without(&read.settings.temporal_redirect),
        ),
    ];
    for (code, url, absent) in missing {
        let key = format!("{PREFIX}{code}");
        for f in read
            .findings
            .iter_mut()
            .filter(|f| absent && f.key == key && f.status.is_honoured())
        {
            f.status = Status::IgnoredUnsupported;
            f.detail = format!("no effect without a valid {url} (as in ingress-nginx)");
        }
    }
}

/// `x-forwarded-prefix` is only sent where a rewrite happens (as in ingress-nginx).
fn prefix_needs_a_rewrite(read: &mut Read) {
    if read.settings.rewrite_target.is_some() || read.findings.is_empty() {
        return;
    }
    let key = format!("{PREFIX}x-forwarded-prefix");
    for f in read
        .findings
        .iter_mut()
        .filter(|f| f.key == key && f.status.is_honoured())
    {
        f.status = Status::IgnoredUnsupported;
        f.detail = "no effect without a valid rewrite-target (as in ingress-nginx)".to_owned();
    }
}

/// The regex a path becomes on a host whose paths are regexes: as written, except that a
/// `Prefix` path of an Ingress not asking for regexes itself loses its trailing slash
/// (ingress-nginx adds an exact location without it, which becomes the wider regex).
pub fn regex_pattern<'a>(written: &'a str, path_type: &str, own_regex: bool) -> &'a str {
    if path_type != "Prefix" || own_regex {
        return written;
    }
    match written.trim_end_matches('/') {
        "" => "/",
        trimmed => trimmed,
    }
}

/// Records that a path of an Ingress does not compile as a regex: its `use-regex` and
/// `rewrite-target` findings become `invalid-value`, naming the path (which is skipped).
pub fn regex_failed(findings: &mut [Finding], path: &str, error: &str) {
    let keys = [
        format!("{PREFIX}use-regex"),
        format!("{PREFIX}rewrite-target"),
    ];
    for f in findings
        .iter_mut()
        .filter(|f| keys.contains(&f.key) && f.status.is_honoured())
    {
        f.status = Status::InvalidValue;
        f.detail = format!(
            "path {path:?} is not a regex duet can compile (Rust's regex crate: no lookaround, no backreferences): {error}; that path is skipped, the others are served"
        );
    }
}

/// The one-line reason a path regex does not compile, if it does not.
pub fn regex_error(pattern: &str) -> Option<String> {
    dataplane::table::RegexPath::new(pattern).err().map(|e| {
        let text = e.to_string();
        let last = text.lines().last().unwrap_or_default().trim();
        last.trim_start_matches("error: ").to_owned()
    })
}

/// The support of a key or of the key an alias stands for.
fn find_support(name: &str) -> Option<Support> {
    let canonical = catalogue::alias(name).unwrap_or(name);
    catalogue::find(canonical).map(|k| k.support)
}

/// The status of one key under the prefix, applying it to `settings` when honoured.
fn classify(
    name: &str,
    value: &str,
    all: &dyn AnnotationMap,
    settings: &mut Settings,
) -> (Status, String) {
    if let Some(canonical) = catalogue::alias(name) {
        if all.value(&format!("{PREFIX}{canonical}")).is_some() {
            return (
                Status::IgnoredUnsupported,
                format!("alias of {canonical}, which is set too and wins"),
            );
        }
        let (status, detail) = classify(canonical, value, all, settings);
        return (status, format!("alias of {canonical}: {detail}"));
    }
    let Some(entry) = catalogue::find(name) else {
        return unlisted(name);
    };
    match entry.support {
        Support::Unsupported(note) => (Status::IgnoredUnsupported, note.to_owned()),
        Support::Snippet => (
            Status::IgnoredUnsupported,
            catalogue::SNIPPET_NOTE.to_owned(),
        ),
        Support::Honoured | Support::Different(_) => {
            if let Some(duet) = duet_override(name).filter(|d| all.value(d).is_some()) {
                return (
                    Status::HonouredWithDifference,
                    format!("{duet} is set too and wins"),
                );
            }
            match apply(name, value, settings) {
                Err(error) => (Status::InvalidValue, error),
                Ok(()) => match entry.support {
                    Support::Different(difference) => {
                        (Status::HonouredWithDifference, difference.to_owned())
                    }
                    _ => (Status::Honoured, String::new()),
                },
            }
        }
    }
}

/// A key under the prefix that ingress-nginx does not define (any more).
fn unlisted(name: &str) -> (Status, String) {
    if let Some(note) = catalogue::removed(name) {
        return (Status::IgnoredRemovedUpstream, note.to_owned());
    }
    if let Some(note) = catalogue::configmap_only(name) {
        return (Status::IgnoredUnknown, note.to_owned());
    }
    let detail = match nearest(name) {
        Some(known) => format!("not an ingress-nginx annotation; did you mean {PREFIX}{known}?"),
        None => "not an ingress-nginx annotation".to_owned(),
    };
    (Status::IgnoredUnknown, detail)
}

/// A key whose prefix is within two edits of ingress-nginx's (`nignx.ingress.kubernetes.io/`).
fn prefix_typo(key: &str) -> Option<Finding> {
    let (domain, name) = key.rsplit_once('/')?;
    if domain == DOMAIN || edit_distance(domain, DOMAIN) > 2 {
        return None;
    }
    Some(Finding {
        key: key.to_owned(),
        status: Status::IgnoredUnknown,
        detail: format!("the prefix {domain}/ is not {PREFIX}; did you mean {PREFIX}{name}?"),
    })
}

/// A key of NGINX Inc's controller (`nginx.org/`), or an ingress-nginx key under the pre-0.9
/// prefix `ingress.kubernetes.io/`: neither was ever read by ingress-nginx's defaults.
fn other_prefix(key: &str) -> Option<Finding> {
    if key.starts_with("nginx.org/") {
        return Some(Finding {
            key: key.to_owned(),
            status: Status::IgnoredUnknown,
            detail:
                "an annotation of NGINX Inc's controller (nginx.org/), never read by ingress-nginx"
                    .to_owned(),
        });
    }
    let name = key.strip_prefix("ingress.kubernetes.io/")?;
    let known = catalogue::known_names().any(|k| k == name) || catalogue::removed(name).is_some();
    known.then(|| Finding {
        key: key.to_owned(),
        status: Status::IgnoredRemovedUpstream,
        detail: format!("the prefix of ingress-nginx before 0.9 (read since only with --annotations-prefix ingress.kubernetes.io); did you mean {PREFIX}{name}?"),
    })
}

/// The known key nearest to `name` within two edits (ties: alphabetical first).
pub fn nearest(name: &str) -> Option<&'static str> {
    catalogue::known_names()
        .map(|k| (edit_distance(name, k), k))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, k)| k)
}

/// The Damerau-Levenshtein distance (optimal string alignment: insertions, deletions,
/// substitutions and transpositions of adjacent characters).
pub fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let width = b.len() + 1;
    let mut d = vec![0usize; (a.len() + 1) * width];
    for i in 0..=a.len() {
        d[i * width] = i;
    }
    for (j, cell) in d.iter_mut().enumerate().take(width) {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[(i - 1) * width + j] + 1)
                .min(d[i * width + j - 1] + 1)
                .min(d[(i - 1) * width + j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[(i - 2) * width + j - 2] + 1);
            }
            d[i * width + j] = best;
        }
    }
    d[a.len() * width + b.len()]
}

/// Applies an honoured key's value, or says why it does not parse.
fn apply(name: &str, value: &str, settings: &mut Settings) -> Result<(), String> {
    match name {
        "ssl-redirect" => settings.ssl_redirect = Some(parse_bool(value)?),
        "force-ssl-redirect" => settings.force_ssl_redirect = parse_bool(value)?,
        "proxy-body-size" => settings.body_size = Some(parse_size(value)?),
        "proxy-connect-timeout" => settings.connect_timeout = Some(parse_seconds(value)?),
        "proxy-read-timeout" => settings.read_timeout = Some(parse_seconds(value)?),
        "backend-protocol" => settings.backend_protocol = Some(parse_protocol(value)?),
        "permanent-redirect" => redirect_of(&mut settings.permanent_redirect).1 = parse_url(value)?,
        "temporal-redirect" => redirect_of(&mut settings.temporal_redirect).1 = parse_url(value)?,
        "permanent-redirect-code" => {
            redirect_of(&mut settings.permanent_redirect).0 = Some(parse_code(value, 308, 301)?);
        }
        "temporal-redirect-code" => {
            redirect_of(&mut settings.temporal_redirect).0 = Some(parse_code(value, 307, 302)?);
        }
        "app-root" => settings.app_root = Some(parse_app_root(value)?),
        "use-regex" => settings.use_regex = parse_bool(value)?,
        "rewrite-target" => settings.rewrite_target = parse_rewrite_target(value)?,
        "x-forwarded-prefix" => settings.forwarded_prefix = Some(parse_forwarded_prefix(value)?),
        "allowlist-source-range" | "denylist-source-range" => {
            let ranges =
                parse_ranges(value).inspect_err(|_| settings.source_ranges_invalid = true)?;
            if name == "allowlist-source-range" {
                settings.allow_source = Some(ranges);
            } else {
                settings.deny_source = Some(ranges);
            }
        }
        name if access::reads(name) => access::apply(name, value, &mut settings.access)?,
        name if traffic::handles(name) => settings.traffic.apply(name, value)?,
        name if client_tls::reads(name) => {
            client_tls::apply(name, value, &mut settings.client_tls)?
        }
        name if buffering::reads(name) => buffering::apply(name, value, &mut settings.buffering)?,
        name if passthrough::reads(name) => {
            passthrough::apply(value, &mut settings.ssl_passthrough)?
        }
        _ => return Err(format!("{name} has no parser")),
    }
    Ok(())
}

/// A boolean as Go's `strconv.ParseBool` reads it.
fn parse_bool(value: &str) -> Result<bool, String> {
    match value.trim() {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        other => Err(format!(
            "{other:?} is not a boolean (\"true\" or \"false\"); the default applies"
        )),
    }
}

/// A size in nginx syntax: bytes, or a number with `k`, `m` or `g` (powers of 1024); `0` unlimited.
fn parse_size(value: &str) -> Result<u64, String> {
    crate::units::parse_size(value).ok_or_else(|| {
        format!("{value:?} is not a size like 512, 8k, 10m or 1g; the default applies")
    })
}

/// Whole seconds without a unit, as ingress-nginx reads timeouts (`"60s"` is invalid there too).
fn parse_seconds(value: &str) -> Result<Duration, String> {
    let v = value.trim();
    match v.parse::<u64>() {
        Ok(n) if n > 0 && v.bytes().all(|b| b.is_ascii_digit()) => Ok(Duration::from_secs(n)),
        _ => Err(format!(
            "{value:?} is not a whole number of seconds of at least 1 (ingress-nginx takes no unit); the default applies"
        )),
    }
}

/// A comma-separated list of IPv4 and IPv6 CIDRs or addresses; any bad entry spoils the list.
fn parse_ranges(value: &str) -> Result<Vec<Cidr>, String> {
    value
        .split(',')
        .map(|entry| entry.trim().parse::<Cidr>())
        .collect::<Result<Vec<Cidr>, _>>()
        .map_err(|error| {
            format!("{error}; the Ingress's routes answer 503 to everyone (fail closed, as ingress-nginx)")
        })
}

/// The redirect a `*-redirect` or `*-redirect-code` key fills in.
fn redirect_of(slot: &mut Option<(Option<u16>, String)>) -> &mut (Option<u16>, String) {
    slot.get_or_insert_with(|| (None, String::new()))
}

/// An absolute `http://` or `https://` URL (IPv6 literals in brackets welcome), printable ASCII.
fn parse_url(value: &str) -> Result<String, String> {
    let v = value.trim();
    let rest = v
        .strip_prefix("https://")
        .or_else(|| v.strip_prefix("http://"))
        .filter(|rest| !rest.is_empty() && !rest.starts_with('/'));
    match rest {
        Some(_) if v.bytes().all(|b| b.is_ascii_graphic()) => Ok(v.to_owned()),
        _ => Err(format!(
            "{value:?} is not an http:// or https:// URL; requests are proxied"
        )),
    }
}

/// A redirect status from 300 to `max`.
fn parse_code(value: &str, max: u16, default: u16) -> Result<u16, String> {
    match value.trim().parse::<u16>() {
        Ok(code) if (300..=max).contains(&code) => Ok(code),
        _ => Err(format!(
            "{value:?} is not a redirect status from 300 to {max}; {default} applies"
        )),
    }
}

/// An absolute path (not a URL), printable ASCII.
fn parse_app_root(value: &str) -> Result<String, String> {
    let v = value.trim();
    if v.starts_with('/') && !v.starts_with("//") && v.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(v.to_owned())
    } else {
        Err(format!(
            "{value:?} is not an absolute path like /app; / is not redirected"
        ))
    }
}

/// A `rewrite-target` as ingress-nginx validates it (`^/?[A-Za-z0-9\-._~/:$]*$`): `$1`..`$9` and
/// full `http(s)://` URLs pass, `?`, `&`, `=`, `{}` and spaces do not. Empty: no rewrite.
fn parse_rewrite_target(value: &str) -> Result<Option<String>, String> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"-._~/:$".contains(&b);
    if value.bytes().all(allowed) {
        Ok((!value.is_empty()).then(|| value.to_owned()))
    } else {
        Err(format!(
            "{value:?} has characters outside A-Z a-z 0-9 - . _ ~ / : $ (as ingress-nginx checks); the Ingress is served without rewrite"
        ))
    }
}

/// An `X-Forwarded-Prefix` value: printable ASCII, no spaces.
fn parse_forwarded_prefix(value: &str) -> Result<String, String> {
    let v = value.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(v.to_owned())
    } else {
        Err(format!(
            "{value:?} is not a prefix like /app; X-Forwarded-Prefix is not sent"
        ))
    }
}

/// `backend-protocol`, case-insensitive: `HTTP`, `HTTPS`, `GRPC` (HTTP/2 cleartext), `GRPCS`
/// (HTTP/2 over TLS), and duet's `H2C`.
fn parse_protocol(value: &str) -> Result<UpstreamProtocol, String> {
    Ok(match value.trim().to_ascii_uppercase().as_str() {
        "HTTP" => UpstreamProtocol::Http1,
        "HTTPS" => UpstreamProtocol::Https,
        "GRPC" | "H2C" => UpstreamProtocol::H2c,
        "GRPCS" => UpstreamProtocol::H2,
        other @ ("AUTO_HTTP" | "FCGI" | "AJP") => {
            return Err(format!(
                "{other} is not supported by duet; the Service port's appProtocol applies"
            ))
        }
        _ => {
            return Err(format!(
                "{value:?} is not HTTP, HTTPS, GRPC, GRPCS or H2C; the Service port's appProtocol applies"
            ))
        }
    })
}

/// The diagnostics of an Ingress's findings: one per key duet does not honour.
pub fn diagnostics(object: &ObjectKey, findings: &[Finding]) -> Vec<Diagnostic> {
    findings
        .iter()
        .filter(|f| !f.status.is_honoured())
        .map(|f| {
            let snippet = f
                .key
                .strip_prefix(PREFIX)
                .and_then(find_support)
                .is_some_and(|s| s == Support::Snippet);
            let reason = match f.status {
                Status::InvalidValue => Reason::InvalidAnnotation,
                _ if snippet => Reason::SnippetAnnotation,
                _ => Reason::IgnoredAnnotation,
            };
            Diagnostic::new(
                object.clone(),
                reason,
                format!("{}: {}: {}", f.key, f.status, f.detail),
            )
        })
        .collect()
}

/// Counts of findings by status, every status listed.
pub fn count_by_status<'a>(
    findings: impl IntoIterator<Item = &'a Finding>,
) -> BTreeMap<Status, usize> {
    let mut counts: BTreeMap<Status, usize> = Status::ALL.iter().map(|s| (*s, 0)).collect();
    for f in findings {
        *counts.entry(f.status).or_default() += 1;
    }
    counts
}

#[cfg(test)]
mod tests;
