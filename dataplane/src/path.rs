//! Request path normalisation, like Envoy's `normalize_path` and `merge_slashes`: `.` and `..`
//! segments are resolved (RFC 3986 §5.2.4) and repeated slashes merged before routing, and the
//! upstream gets the resolved path. Percent-encoded `/`, `\` and `.` (`%2F`, `%5C`, `%2E`) are
//! not decoded, but a path that would climb once they are (`%2e%2e`, `.%2E`, `..%2F`) is refused.

use std::borrow::Cow;

/// A path that climbs through percent-encoded dots or separators (400).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("path climbs through percent-encoded dots or slashes")]
pub struct EncodedTraversal;

/// The normalised path (the query is not part of `path`). Paths that do not start with `/`
/// (`*` of `OPTIONS *`) are returned as they are.
pub fn normalize(path: &str) -> Result<Cow<'_, str>, EncodedTraversal> {
    if !path.starts_with('/') {
        return Ok(Cow::Borrowed(path));
    }
    let path = if needs_resolving(path) {
        Cow::Owned(resolve(path))
    } else {
        Cow::Borrowed(path)
    };
    if path.contains('%') || path.contains('\\') {
        check_encoded(&path)?;
    }
    Ok(path)
}

/// Whether the path has `//`, or a `.` or `..` segment.
fn needs_resolving(path: &str) -> bool {
    path.contains("//")
        || path
            .split('/')
            .any(|segment| segment == "." || segment == "..")
}

/// Merges slashes and resolves dot segments; `..` above the root stays at the root. A trailing
/// `/`, `/.` or `/..` leaves a trailing slash.
fn resolve(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path[1..].split('/').collect();
    let last = segments.len() - 1;
    let mut trailing = false;
    for (i, segment) in segments.into_iter().enumerate() {
        trailing = i == last;
        match segment {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => {
                out.push(s);
                trailing = false;
            }
        }
    }
    let mut resolved = String::with_capacity(path.len());
    for segment in &out {
        resolved.push('/');
        resolved.push_str(segment);
    }
    if trailing || out.is_empty() {
        resolved.push('/');
    }
    resolved
}

/// Refuses a path whose segments, once `%2E`, `%2F` and `%5C` are decoded and `\` counts as a
/// separator, include `..`.
fn check_encoded(path: &str) -> Result<(), EncodedTraversal> {
    let mut decoded = String::with_capacity(path.len());
    let mut rest = path;
    while let Some(i) = rest.find('%') {
        decoded.push_str(&rest[..i]);
        let code = rest.get(i + 1..i + 3).map(str::to_ascii_uppercase);
        match code.as_deref() {
            Some("2E") => decoded.push('.'),
            Some("2F") | Some("5C") => decoded.push('/'),
            _ => {
                decoded.push('%');
                rest = &rest[i + 1..];
                continue;
            }
        }
        rest = &rest[i + 3..];
    }
    decoded.push_str(rest);
    if decoded.split(['/', '\\']).any(|segment| segment == "..") {
        return Err(EncodedTraversal);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_segments_and_slashes_resolve() {
        for (given, want) in [
            ("/", "/"),
            ("/a/b", "/a/b"),
            ("/a/b/", "/a/b/"),
            ("//a///b", "/a/b"),
            ("/a/./b", "/a/b"),
            ("/a/../b", "/b"),
            ("/public/../admin", "/admin"),
            ("/../../etc/passwd", "/etc/passwd"),
            ("/a/b/..", "/a/"),
            ("/a/b/.", "/a/b/"),
            ("/..", "/"),
            ("/.", "/"),
            ("//", "/"),
            ("/a//", "/a/"),
            ("/a/..b/c.", "/a/..b/c."),
            ("/a%2Fb", "/a%2Fb"),
            ("/a/%2e", "/a/%2e"),
            ("/%41%2e%2ex", "/%41%2e%2ex"),
            ("*", "*"),
        ] {
            assert_eq!(normalize(given).as_deref(), Ok(want), "{given}");
        }
    }

    #[test]
    fn unchanged_paths_are_borrowed() {
        assert!(matches!(normalize("/a/b.c/d?"), Ok(Cow::Borrowed(_))));
    }

    #[test]
    fn climbing_through_encodings_is_refused() {
        for bad in [
            "/%2e%2e/admin",
            "/public/%2E%2E/admin",
            "/public/.%2e/admin",
            "/public/%2e./admin",
            "/public/..%2Fadmin",
            "/public/..%5cadmin",
            "/public%2F..%2Fadmin",
            "/public/%2e%2e",
            "/a\\..\\b",
        ] {
            assert_eq!(normalize(bad), Err(EncodedTraversal), "{bad}");
        }
    }
}
