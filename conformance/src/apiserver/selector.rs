//! Label and field selectors as the Kubernetes API parses them from `labelSelector` and
//! `fieldSelector` query parameters.

use serde_json::Value;

use super::registry::Resource;

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
enum LabelReq {
    /// `k=v` or `k==v`.
    Eq(String, String),
    /// `k!=v` (also true when `k` is absent).
    Ne(String, String),
    /// `k`.
    Exists(String),
    /// `!k`.
    NotExists(String),
    /// `k in (a,b)`.
    In(String, Vec<String>),
    /// `k notin (a,b)` (also true when `k` is absent).
    NotIn(String, Vec<String>),
}

/// A parsed label selector: every requirement must hold (comma = AND).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<LabelReq>);

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn set_values(rest: &str) -> Option<Vec<String>> {
    let inner = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(
        inner
            .split(',')
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .collect(),
    )
}

impl LabelSelector {
    /// Parses `labelSelector`; the error is the message of a 400 answer.
    pub fn parse(s: &str) -> Result<LabelSelector, String> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(LabelSelector(reqs));
        }
        for part in split_top(s) {
            let part = part.trim();
            let bad = || format!("unable to parse requirement: {part:?}");
            let req = if let Some((k, v)) = part.split_once("!=") {
                LabelReq::Ne(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some((k, v)) = part.split_once("==") {
                LabelReq::Eq(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some((k, v)) = part.split_once('=') {
                LabelReq::Eq(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some(k) = part.strip_prefix('!') {
                LabelReq::NotExists(k.trim().to_owned())
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                LabelReq::NotIn(k.trim().to_owned(), set_values(rest).ok_or_else(bad)?)
            } else if let Some((k, rest)) = part.split_once(" in ") {
                LabelReq::In(k.trim().to_owned(), set_values(rest).ok_or_else(bad)?)
            } else {
                LabelReq::Exists(part.to_owned())
            };
            let key = match &req {
                LabelReq::Eq(k, _)
                | LabelReq::Ne(k, _)
                | LabelReq::Exists(k)
                | LabelReq::NotExists(k)
                | LabelReq::In(k, _)
                | LabelReq::NotIn(k, _) => k,
            };
            if !valid_key(key) {
                return Err(bad());
            }
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether the object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|req| match req {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::Ne(k, v) => get(k) != Some(v.as_str()),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => !get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
        })
    }
}

/// A parsed field selector: `field=value`, `field==value`, `field!=value`, comma = AND.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parses `fieldSelector` for `resource`; an unknown field is an error (a 400 answer, as the
    /// real API server gives).
    pub fn parse(s: &str, resource: &Resource) -> Result<FieldSelector, String> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(FieldSelector(reqs));
        }
        for part in s.split(',') {
            let part = part.trim();
            let (field, equal, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, true, v)
            } else {
                return Err(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                ));
            };
            let field = field.trim();
            let pointer = match field {
                "metadata.name" => "/metadata/name".to_owned(),
                "metadata.namespace" => "/metadata/namespace".to_owned(),
                _ => match resource.fields.iter().find(|(f, _)| f == field) {
                    Some((_, p)) => p.clone(),
                    None => return Err(format!("field label not supported: {field}")),
                },
            };
            reqs.push((pointer, equal, value.trim().to_owned()));
        }
        Ok(FieldSelector(reqs))
    }

    /// Whether the object's fields satisfy every requirement (an absent field reads as "").
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(pointer, equal, value)| {
            let actual = match obj.pointer(pointer) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            (actual == *value) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}, "type": "kubernetes.io/tls"})
    }

    #[test]
    fn label_selectors_match_like_kubernetes() {
        let o = obj(json!({"app": "web", "tier": "front"}));
        let cases = [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app=api", false),
            ("app!=api", true),
            ("app!=web", false),
            ("missing!=x", true),
            ("app", true),
            ("missing", false),
            ("!missing", true),
            ("!app", false),
            ("app=web,tier=front", true),
            ("app=web,tier=back", false),
            ("app in (api, web)", true),
            ("app in (api)", false),
            ("app notin (api)", true),
            ("missing notin (api)", true),
            ("app notin (web,api),tier", false),
        ];
        for (sel, want) in cases {
            let parsed = LabelSelector::parse(sel).unwrap();
            assert_eq!(parsed.matches(&o), want, "{sel}");
        }
        assert!(LabelSelector::parse("app in web").is_err());
        assert!(LabelSelector::parse("a b").is_err());
    }

    #[test]
    fn field_selectors_know_their_fields() {
        let secrets = super::super::registry::defaults()
            .into_iter()
            .find(|r| r.plural == "secrets")
            .unwrap();
        let o = obj(json!({}));
        let ok = |s: &str| FieldSelector::parse(s, &secrets).unwrap().matches(&o);
        assert!(ok("metadata.name=a"));
        assert!(ok("metadata.namespace==ns,type=kubernetes.io/tls"));
        assert!(!ok("type!=kubernetes.io/tls"));
        assert!(!ok("metadata.name=b"));
        assert!(FieldSelector::parse("spec.foo=1", &secrets).is_err());
        assert!(FieldSelector::parse("nonsense", &secrets).is_err());
    }
}
