//! Conditions on a request beyond its host and path, a leaf of the snapshot contract: Gateway API
//! matches (HTTPRoute `matches[]`: headers, query parameters, method; GRPCRoute's method as a
//! whole-path regex). One [`RequestMatch`] is the AND of its conditions; a Gateway rule with
//! several matches is several path rules (their OR). A rule's condition is optional
//! ([`crate::table::PathRule::when`]): Ingress rules have none and pay nothing for it.
//!
//! Evaluation reads the request in place ([`RequestView`]) and allocates nothing, except when a
//! header a condition names is repeated in the request (its values are joined with `,`, as
//! RFC 9110 §5.3 combines them) or a query value is percent-encoded (it is decoded first).

use std::cmp::Ordering;
use std::sync::Arc;

use http::HeaderMap;
use serde::{Serialize, Serializer};

/// The `http` types conditions and filters are made of, for the controller's translation.
pub use http::{HeaderName, HeaderValue, Method};

/// `text` as a regex matching it literally.
pub fn escape(text: &str) -> String {
    regex::escape(text)
}

/// What a condition may look at: the request's method, headers, normalised path and raw query.
#[derive(Clone, Copy, Debug)]
pub struct RequestView<'a> {
    /// The method; `None` when the caller has no request (then a method condition fails).
    pub method: Option<&'a Method>,
    /// The headers as received; `None` as for the method.
    pub headers: Option<&'a HeaderMap>,
    /// The normalised path (no query).
    pub path: &'a str,
    /// The query string as received, without `?`.
    pub query: Option<&'a str>,
}

impl<'a> RequestView<'a> {
    /// A view of a path alone (lookups without a request: tools, tests): only rules without
    /// method, header or query conditions match it.
    pub fn path(path: &'a str) -> RequestView<'a> {
        RequestView {
            method: None,
            headers: None,
            path,
            query: None,
        }
    }
}

/// The conditions of one Gateway API match, all of which must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RequestMatch {
    /// The request method must be this one.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "method_str")]
    pub method: Option<Method>,
    /// Headers (at most one condition per name, case-insensitive: the caller keeps the first).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HeaderCondition>,
    /// Query parameters (at most one condition per name, case-sensitive).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub query: Vec<QueryCondition>,
    /// The whole path must match this regex (Gateway API `RegularExpression` paths, GRPCRoute
    /// method regexes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<FullRegex>,
}

fn method_str<S: Serializer>(m: &Option<Method>, s: S) -> Result<S::Ok, S::Error> {
    match m {
        Some(m) => s.serialize_str(m.as_str()),
        None => s.serialize_none(),
    }
}

/// A header condition: the header's value (its lines joined with `,` when repeated) matches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HeaderCondition {
    /// The header name (lower case, as `http` keeps names).
    #[serde(serialize_with = "header_name_str")]
    pub name: HeaderName,
    /// How its value must match.
    pub value: TextMatch,
}

fn header_name_str<S: Serializer>(n: &HeaderName, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(n.as_str())
}

/// A query parameter condition: the first parameter of that name (case-sensitive), its value
/// percent-decoded (`+` is a space), matches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueryCondition {
    /// The parameter name, as written.
    pub name: Arc<str>,
    /// How its value must match.
    pub value: TextMatch,
}

/// How a value matches: exactly, or a regex over the whole value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TextMatch {
    /// Equal, byte for byte.
    Exact(Arc<str>),
    /// The regex matches the whole value.
    Regex(FullRegex),
}

impl TextMatch {
    /// Whether a value matches.
    pub fn matches(&self, value: &[u8]) -> bool {
        match self {
            TextMatch::Exact(want) => value == want.as_bytes(),
            TextMatch::Regex(r) => std::str::from_utf8(value).is_ok_and(|v| r.is_match(v)),
        }
    }
}

/// A regex matching whole values (`^(?:pattern)$`), compared and serialised by its pattern.
#[derive(Clone, Debug)]
pub struct FullRegex {
    pattern: Arc<str>,
    regex: regex::Regex,
}

/// Bounds on a compiled regex: the pattern comes from a route object (hostile input).
const REGEX_SIZE_LIMIT: usize = 1 << 20;

impl FullRegex {
    /// Compiles a pattern (Rust's `regex` syntax, which is RE2's: no lookaround, no
    /// backreferences) anchored at both ends, case-sensitive, of bounded size.
    pub fn new(pattern: &str) -> Result<FullRegex, regex::Error> {
        let regex = regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
            .size_limit(REGEX_SIZE_LIMIT)
            .dfa_size_limit(REGEX_SIZE_LIMIT)
            .build()?;
        Ok(FullRegex {
            pattern: pattern.into(),
            regex,
        })
    }

    /// The pattern as written.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// Whether the whole value matches.
    pub fn is_match(&self, value: &str) -> bool {
        self.regex.is_match(value)
    }
}

impl PartialEq for FullRegex {
    fn eq(&self, other: &FullRegex) -> bool {
        self.pattern == other.pattern
    }
}

impl Eq for FullRegex {}

impl Serialize for FullRegex {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.pattern)
    }
}

impl RequestMatch {
    /// Whether every condition holds for the request.
    pub fn matches(&self, req: &RequestView<'_>) -> bool {
        if let Some(method) = &self.method {
            if req.method != Some(method) {
                return false;
            }
        }
        if let Some(path) = &self.path {
            if !path.is_match(req.path) {
                return false;
            }
        }
        self.headers.iter().all(|c| header_holds(c, req.headers))
            && self.query.iter().all(|c| query_holds(c, req.query))
    }

    /// Gateway API precedence after the path: a method condition first, then more header
    /// conditions, then more query conditions. `Less` means "wins".
    pub fn precedence(&self, other: &RequestMatch) -> Ordering {
        let rank = |m: &RequestMatch| {
            (
                m.method.is_none(),
                usize::MAX - m.headers.len(),
                usize::MAX - m.query.len(),
            )
        };
        rank(self).cmp(&rank(other))
    }

    /// Whether there is no condition at all.
    pub fn is_empty(&self) -> bool {
        self.method.is_none()
            && self.headers.is_empty()
            && self.query.is_empty()
            && self.path.is_none()
    }
}

/// Precedence between two optional conditions (none is the least specific).
pub fn precedence(a: Option<&RequestMatch>, b: Option<&RequestMatch>) -> Ordering {
    let none = RequestMatch::default();
    a.unwrap_or(&none).precedence(b.unwrap_or(&none))
}

fn header_holds(c: &HeaderCondition, headers: Option<&HeaderMap>) -> bool {
    let Some(headers) = headers else {
        return false;
    };
    let mut values = headers.get_all(&c.name).iter();
    let Some(first) = values.next() else {
        return false;
    };
    let Some(second) = values.next() else {
        return c.value.matches(first.as_bytes());
    };
    // A repeated header: its lines joined, as one field value (RFC 9110 §5.3).
    let mut joined = Vec::with_capacity(first.len() + second.len() + 1);
    joined.extend_from_slice(first.as_bytes());
    for v in std::iter::once(second).chain(values) {
        joined.push(b',');
        joined.extend_from_slice(v.as_bytes());
    }
    c.value.matches(&joined)
}

fn query_holds(c: &QueryCondition, query: Option<&str>) -> bool {
    let Some(query) = query else {
        return false;
    };
    let found = query.split('&').find_map(|pair| {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        (decoded(name).as_deref() == Some(&*c.name)).then_some(value)
    });
    match found {
        Some(value) if needs_decoding(value) => {
            percent_decode(value).is_some_and(|v| c.value.matches(&v))
        }
        Some(value) => c.value.matches(value.as_bytes()),
        None => false,
    }
}

fn needs_decoding(s: &str) -> bool {
    s.bytes().any(|b| b == b'%' || b == b'+')
}

/// A query name, decoded only when it needs it (borrowed otherwise); `None` when it is not valid
/// UTF-8 once decoded.
fn decoded(s: &str) -> Option<std::borrow::Cow<'_, str>> {
    if !needs_decoding(s) {
        return Some(std::borrow::Cow::Borrowed(s));
    }
    let bytes = percent_decode(s)?;
    String::from_utf8(bytes).ok().map(std::borrow::Cow::Owned)
}

/// `application/x-www-form-urlencoded` decoding of one query component; `None` for a bad escape.
fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn header(name: &str, value: TextMatch) -> HeaderCondition {
        HeaderCondition {
            name: HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value,
        }
    }

    fn exact(v: &str) -> TextMatch {
        TextMatch::Exact(v.into())
    }

    fn view<'a>(
        headers: &'a HeaderMap,
        method: &'a Method,
        query: Option<&'a str>,
    ) -> RequestView<'a> {
        RequestView {
            method: Some(method),
            headers: Some(headers),
            path: "/",
            query,
        }
    }

    #[test]
    fn headers_are_anded_names_case_insensitive_repeated_values_joined() {
        let m = RequestMatch {
            headers: vec![
                header("version", exact("two")),
                header("color", TextMatch::Regex(FullRegex::new("or.*e").unwrap())),
            ],
            ..RequestMatch::default()
        };
        let mut h = HeaderMap::new();
        h.insert("Version", HeaderValue::from_static("two"));
        h.insert("COLOR", HeaderValue::from_static("orange"));
        let get = Method::GET;
        assert!(m.matches(&view(&h, &get, None)));
        h.insert("color", HeaderValue::from_static("xorange"));
        assert!(!m.matches(&view(&h, &get, None)), "regex is anchored");
        h.remove("color");
        assert!(!m.matches(&view(&h, &get, None)), "missing header");
        let joined = RequestMatch {
            headers: vec![header("x", exact("a,b"))],
            ..RequestMatch::default()
        };
        h.append("x", HeaderValue::from_static("a"));
        assert!(!joined.matches(&view(&h, &get, None)));
        h.append("x", HeaderValue::from_static("b"));
        assert!(joined.matches(&view(&h, &get, None)));
        assert!(!joined.matches(&RequestView::path("/")));
    }

    #[test]
    fn query_names_are_case_sensitive_first_one_counts_values_decoded() {
        let m = RequestMatch {
            query: vec![QueryCondition {
                name: "animal".into(),
                value: exact("blue whale"),
            }],
            ..RequestMatch::default()
        };
        let (h, get) = (HeaderMap::new(), Method::GET);
        let holds = |q: &str| m.matches(&view(&h, &get, Some(q)));
        assert!(holds("animal=blue%20whale"));
        assert!(holds("x=1&animal=blue+whale&animal=dog"));
        assert!(!holds("animal=dog&animal=blue+whale"));
        assert!(!holds("ANIMAL=blue+whale"));
        assert!(!holds("animal=blue%2"), "bad escape");
        assert!(!holds("animal"));
        assert!(!m.matches(&view(&h, &get, None)));
    }

    #[test]
    fn method_and_path_regex() {
        let m = RequestMatch {
            method: Some(Method::POST),
            path: Some(FullRegex::new(r"/foo\.[^/]+/Bar").unwrap()),
            ..RequestMatch::default()
        };
        let h = HeaderMap::new();
        let (post, get) = (Method::POST, Method::GET);
        let at = |method: &Method, path: &'static str| {
            m.matches(&RequestView {
                path,
                ..view(&h, method, None)
            })
        };
        assert!(at(&post, "/foo.v1/Bar"));
        assert!(!at(&get, "/foo.v1/Bar"));
        assert!(!at(&post, "/foo.v1/Bar/x"));
        assert!(!at(&post, "/foo.v1/bar"));
        // Alternation stays inside the anchors.
        let alt = FullRegex::new("/a|/b").unwrap();
        assert!(alt.is_match("/b") && !alt.is_match("/bx"));
        assert!(FullRegex::new("(?!x)").is_err());
    }

    #[test]
    fn precedence_is_method_then_headers_then_query() {
        let with = |method: bool, headers: usize, query: usize| RequestMatch {
            method: method.then_some(Method::GET),
            headers: (0..headers)
                .map(|i| header(&format!("h{i}"), exact("v")))
                .collect(),
            query: (0..query)
                .map(|i| QueryCondition {
                    name: format!("q{i}").into(),
                    value: exact("v"),
                })
                .collect(),
            path: None,
        };
        let mut list = [
            with(false, 0, 3),
            with(false, 2, 0),
            with(true, 0, 0),
            with(false, 2, 1),
        ];
        list.sort_by(|a, b| a.precedence(b));
        let ranks: Vec<_> = list
            .iter()
            .map(|m| (m.method.is_some(), m.headers.len(), m.query.len()))
            .collect();
        assert_eq!(
            ranks,
            [(true, 0, 0), (false, 2, 1), (false, 2, 0), (false, 0, 3)]
        );
        assert_eq!(
            precedence(None, Some(&with(false, 0, 1))),
            Ordering::Greater
        );
    }
}
