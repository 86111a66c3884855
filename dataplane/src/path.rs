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
    let (resolving, encoded) = scan(path.as_bytes());
    let (path, encoded) = if resolving {
        let resolved = resolve(path);
        let encoded = resolved.contains(['%', '\\']);
        (Cow::Owned(resolved), encoded)
    } else {
        (Cow::Borrowed(path), encoded)
    };
    if encoded {
        check_encoded(&path)?;
    }
    Ok(path)
}

/// One pass over a path: whether it needs resolving (it has `//`, or a `.` or `..` segment)
/// and whether it has a `%` or `\` (then [`check_encoded`] reads it). Every request's path goes
/// through it, mostly short: a byte loop, no substring searcher.
fn scan(path: &[u8]) -> (bool, bool) {
    let (mut resolving, mut encoded) = (false, false);
    let mut start = 0;
    for (i, &b) in path.iter().enumerate() {
        match b {
            b'/' => {
                let segment = &path[start..i];
                let repeated = i > 0 && path[i - 1] == b'/';
                resolving |= repeated || segment == b"." || segment == b"..";
                start = i + 1;
            }
            b'%' | b'\\' => encoded = true,
            _ => {}
        }
    }
    let last = &path[start..];
    resolving |= last == b"." || last == b"..";
    (resolving, encoded)
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

    /// Whether a path needs resolving and reading for encodings, as written before [`scan`].
    fn scan_by_search(path: &str) -> (bool, bool) {
        let resolving = path.contains("//")
            || path
                .split('/')
                .any(|segment| segment == "." || segment == "..");
        (resolving, path.contains('%') || path.contains('\\'))
    }

    #[test]
    fn the_one_pass_scan_agrees_on_the_listed_paths() {
        for path in [
            "/",
            "//",
            "/a//",
            "/.",
            "/..",
            "/a/.b",
            "/a/..",
            "/a/../",
            "/./",
            "/%2e",
            "/a\\b",
            "/a/..b/c.",
        ] {
            assert_eq!(scan(path.as_bytes()), scan_by_search(path), "{path}");
        }
    }

    proptest::proptest! {
        #[test]
        fn the_one_pass_scan_agrees_with_the_searches(path in "/[a./%\\\\]{0,24}") {
            proptest::prop_assert_eq!(scan(path.as_bytes()), scan_by_search(&path), "{}", path);
            let normalized = normalize(&path).map(|p| p.into_owned());
            let resolved = if scan_by_search(&path).0 { resolve(&path) } else { path.clone() };
            let want = if resolved.contains('%') || resolved.contains('\\') {
                check_encoded(&resolved).map(|()| resolved)
            } else {
                Ok(resolved)
            };
            proptest::prop_assert_eq!(normalized, want);
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
