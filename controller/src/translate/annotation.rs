//! One way to read a per-object annotation: read it, parse it, else diagnose and fall back.
//! Every `duet.dev/` annotation translation reads goes through [`annotation`], so an invalid value
//! is always an `InvalidAnnotation` diagnostic `NAME: WHAT IS WRONG; WHAT APPLIES INSTEAD` and the
//! object is still served.

use std::collections::BTreeMap;
use std::fmt::Display;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::diagnostic::{Diagnostic, Reason};
use crate::object::ObjectKey;

/// An object's annotations, with the key its diagnostics name.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Annotated<'a> {
    /// The object.
    pub(crate) key: &'a ObjectKey,
    annotations: Option<&'a BTreeMap<String, String>>,
}

impl<'a> Annotated<'a> {
    /// The annotations of the object with `key` and `meta`.
    pub(crate) fn new(key: &'a ObjectKey, meta: &'a ObjectMeta) -> Annotated<'a> {
        Annotated {
            key,
            annotations: meta.annotations.as_ref(),
        }
    }

    /// The value of one annotation as written, if present.
    pub(crate) fn get(&self, name: &str) -> Option<&'a str> {
        self.annotations?.get(name).map(String::as_str)
    }
}

/// The annotation `name` of `obj` parsed by `parse` (given the value as written); `fallback`'s
/// value when the annotation is absent. A value `parse` refuses is an `InvalidAnnotation`
/// diagnostic `"{name}: {error}; {fallback's words}"`, and the fallback applies.
pub(crate) fn annotation<T>(
    obj: &Annotated<'_>,
    name: &str,
    parse: impl FnOnce(&str) -> Result<T, String>,
    (fallback, instead): (T, impl Display),
    diagnostics: &mut Vec<Diagnostic>,
) -> T {
    let Some(value) = obj.get(name) else {
        return fallback;
    };
    match parse(value) {
        Ok(parsed) => parsed,
        Err(error) => {
            diagnostics.push(Diagnostic::new(
                obj.key.clone(),
                Reason::InvalidAnnotation,
                format!("{name}: {error}; {instead}"),
            ));
            fallback
        }
    }
}

/// `"true"` or `"false"` (after trimming), exactly.
pub(crate) fn parse_true_false(value: &str) -> Result<bool, String> {
    match value.trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(format!("{other:?} is not \"true\" or \"false\"")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::Kind;

    #[test]
    fn absent_parsed_or_diagnosed_and_fallen_back() {
        let key = ObjectKey::new(Kind::Ingress, "ns", "web");
        let meta = ObjectMeta {
            annotations: Some(
                [("a/good", "7"), ("a/bad", "x")]
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .into(),
            ),
            ..Default::default()
        };
        let obj = Annotated::new(&key, &meta);
        let parse = |v: &str| {
            v.parse::<u8>()
                .map_err(|_| format!("{v:?} is not a number"))
        };
        let mut diagnostics = Vec::new();
        let mut read = |name| annotation(&obj, name, parse, (1, "using 1"), &mut diagnostics);
        assert_eq!([read("a/good"), read("a/absent"), read("a/bad")], [7, 1, 1]);
        assert_eq!(
            diagnostics,
            [Diagnostic::new(
                key.clone(),
                Reason::InvalidAnnotation,
                "a/bad: \"x\" is not a number; using 1"
            )]
        );
    }
}
