//! Consistent hashing of a request key onto a backend's targets (ingress-nginx's
//! `upstream-hash-by`): rendezvous hashing, where each target scores `hash(key, target id)` and
//! the highest score serves. A target's leaving moves only its own keys; the key's value comes
//! from nginx variables (`$remote_addr`, `$request_uri`, `$http_x_user`, `$cookie_x`, ...).
//! `$remote_addr` of an IPv6 client is its full address; an IPv4-mapped peer (`::ffff:a.b.c.d`,
//! from a dual-stack socket) counts as the IPv4 address, as nginx's separate IPv4 listener sees it.

use crate::balance::LiveBackend;
use crate::route_policy::{HashKey, KeyPart};
use crate::table::{Family, FamilyPolicy};

use super::RequestView;

/// Parses an `upstream-hash-by` value: nginx variables and literal text (`$host$request_uri`,
/// `${cookie_x}`). An unknown variable is an error.
pub fn parse_key(written: &str) -> Result<Vec<KeyPart>, String> {
    let mut parts = Vec::new();
    let mut rest = written;
    while !rest.is_empty() {
        let Some(at) = rest.find('$') else {
            parts.push(KeyPart::Literal(rest.into()));
            break;
        };
        if at > 0 {
            parts.push(KeyPart::Literal(rest[..at].into()));
        }
        let after = &rest[at + 1..];
        let (name, next) = match after.strip_prefix('{') {
            Some(braced) => {
                let end = braced.find('}').ok_or("an unclosed ${ in the key")?;
                (&braced[..end], &braced[end + 1..])
            }
            None => {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], &after[end..])
            }
        };
        parts.push(variable(name)?);
        rest = next;
    }
    Ok(parts)
}

fn variable(name: &str) -> Result<KeyPart, String> {
    let lower = name.to_ascii_lowercase();
    Ok(match lower.as_str() {
        "remote_addr" | "binary_remote_addr" => KeyPart::RemoteAddr,
        "request_uri" => KeyPart::RequestUri,
        "uri" | "document_uri" => KeyPart::Uri,
        "host" | "http_host" => KeyPart::Host,
        _ => {
            if let Some(h) = lower.strip_prefix("http_").filter(|h| !h.is_empty()) {
                KeyPart::Header(h.replace('_', "-").into())
            } else if let Some(c) = name.strip_prefix("cookie_").filter(|c| !c.is_empty()) {
                KeyPart::Cookie(c.into())
            } else if let Some(a) = name.strip_prefix("arg_").filter(|a| !a.is_empty()) {
                KeyPart::Arg(a.into())
            } else {
                return Err(format!(
                    "${name} is not a variable duet can hash on ($remote_addr, $binary_remote_addr, $request_uri, $uri, $host, $http_NAME, $cookie_NAME, $arg_NAME)"
                ));
            }
        }
    })
}

/// The hash of a request's key.
pub fn key_hash(key: &HashKey, view: &RequestView<'_>) -> u64 {
    let mut text = String::new();
    for part in &key.parts {
        match part {
            KeyPart::Literal(l) => text.push_str(l),
            KeyPart::RemoteAddr => text.push_str(&view.client.to_canonical().to_string()),
            KeyPart::RequestUri => {
                text.push_str(view.target.path_and_query().map_or("/", |pq| pq.as_str()))
            }
            KeyPart::Uri => text.push_str(view.target.path()),
            KeyPart::Host => text.push_str(view.host),
            KeyPart::Header(name) => {
                let values = view.headers.get_all(&**name);
                let joined: Vec<&str> = values.iter().filter_map(|v| v.to_str().ok()).collect();
                text.push_str(&joined.join(", "));
            }
            KeyPart::Cookie(name) => text.push_str(super::cookie(view.headers, name).unwrap_or("")),
            KeyPart::Arg(name) => text.push_str(arg(view.target.query(), name).unwrap_or("")),
        }
    }
    super::stable_hash(&[text.as_bytes()])
}

/// The first `name=value` of a query, as received.
fn arg<'q>(query: Option<&'q str>, name: &str) -> Option<&'q str> {
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// The target a key hash chooses among those the family policy admits and not yet tried: the
/// highest rendezvous score (healthy targets first); with a subset size, a random one of the
/// `subset` highest-scoring targets.
pub fn choose(
    backend: &LiveBackend,
    key: u64,
    subset: Option<u32>,
    client: Family,
    policy: FamilyPolicy,
    tried: &[usize],
) -> Option<usize> {
    let targets = &backend.backend.targets;
    let admitted = (0..targets.len()).filter(|&i| policy.admits(&targets[i], client));
    let scored = admitted.map(|i| (score(key, targets[i].id.0.as_bytes()), i));
    let open = |i: &usize| !tried.contains(i);
    if let Some(size) = subset {
        let mut ranked: Vec<(u64, usize)> = scored.collect();
        ranked.sort_unstable_by(|a, b| b.cmp(a));
        let group: Vec<usize> = ranked
            .iter()
            .take(size.max(1) as usize)
            .map(|(_, i)| *i)
            .filter(open)
            .filter(|&i| backend.is_usable(i, client, policy))
            .collect();
        if !group.is_empty() {
            return Some(group[fastrand::usize(..group.len())]);
        }
        return best(ranked.into_iter(), backend, client, policy, tried);
    }
    best(scored, backend, client, policy, tried)
}

/// The highest-scoring target not tried, a usable one first (one pass, no sort).
fn best(
    scored: impl Iterator<Item = (u64, usize)>,
    backend: &LiveBackend,
    client: Family,
    policy: FamilyPolicy,
    tried: &[usize],
) -> Option<usize> {
    let mut usable: Option<(u64, usize)> = None;
    let mut any: Option<(u64, usize)> = None;
    for (s, i) in scored.filter(|(_, i)| !tried.contains(i)) {
        if any.is_none_or(|a| (s, i) > a) {
            any = Some((s, i));
        }
        if usable.is_none_or(|u| (s, i) > u) && backend.is_usable(i, client, policy) {
            usable = Some((s, i));
        }
    }
    usable.or(any).map(|(_, i)| i)
}

/// A target's rendezvous score for a key.
pub fn score(key: u64, target_id: &[u8]) -> u64 {
    super::mix(key ^ super::stable_hash(&[target_id]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use crate::table::{Backend, BackendId, LbPolicy, Target, TargetId, UpstreamProtocol};

    fn live(n: usize) -> LiveBackend {
        let targets: Vec<Target> = (0..n)
            .map(|i| Target {
                id: TargetId(format!("uid-{i}").into()),
                v4: Some(format!("10.0.0.{}:80", i + 1).parse().unwrap()),
                v6: Some(format!("[fd00::{:x}]:80", i + 1).parse().unwrap()),
                zone: None,
            })
            .collect();
        LiveBackend::new(
            Arc::new(Backend {
                id: "ns/svc:80".parse::<BackendId>().unwrap(),
                targets: targets.into(),
                lb: LbPolicy::P2c,
                protocol: UpstreamProtocol::Http1,
            }),
            None,
        )
    }

    fn pick(b: &LiveBackend, key: &str) -> usize {
        let h = crate::policy::stable_hash(&[key.as_bytes()]);
        choose(b, h, None, Family::V4, FamilyPolicy::PreferSameFamily, &[]).unwrap()
    }

    #[test]
    fn keys_parse_into_variables_and_text() {
        let parts = parse_key("$host-${cookie_sess}$http_X_User$arg_WOPISrc").unwrap();
        assert_eq!(
            parts,
            vec![
                KeyPart::Host,
                KeyPart::Literal("-".into()),
                KeyPart::Cookie("sess".into()),
                KeyPart::Header("x-user".into()),
                KeyPart::Arg("WOPISrc".into()),
            ]
        );
        assert!(parse_key("$server_name").is_err());
        assert!(parse_key("${remote_addr").is_err());
        assert_eq!(arg(Some("a=1&WOPISrc=x%2Fy&b"), "WOPISrc"), Some("x%2Fy"));
    }

    #[test]
    fn a_key_sticks_and_a_leaving_pod_moves_only_its_keys() {
        let five = live(5);
        let four = live(4); // uid-4 left
        let mut moved = 0;
        for k in 0..2000 {
            let key = format!("user-{k}");
            let before = pick(&five, &key);
            assert_eq!(pick(&five, &key), before, "deterministic");
            let after = pick(&four, &key);
            if before == 4 {
                moved += 1;
            } else {
                assert_eq!(after, before, "{key} moved though its pod stayed");
            }
        }
        // Each of 5 pods holds about a fifth of 2000 keys: binomial(2000, 0.2), mean 400,
        // sd 17.9; 6 sd either side.
        assert!((293..=507).contains(&moved), "{moved}");
    }

    #[test]
    fn a_tried_pod_gives_way_to_the_next_score() {
        let b = live(3);
        let h = crate::policy::stable_hash(&[b"k"]);
        let first = choose(&b, h, None, Family::V6, FamilyPolicy::PreferSameFamily, &[]).unwrap();
        let second = choose(
            &b,
            h,
            None,
            Family::V6,
            FamilyPolicy::PreferSameFamily,
            &[first],
        )
        .unwrap();
        assert_ne!(first, second);
    }

    #[test]
    fn an_ejected_pod_gives_way_until_nothing_else_is_left() {
        let b = live(3);
        let h = crate::policy::stable_hash(&[b"k"]);
        let any = |b: &LiveBackend| {
            choose(b, h, None, Family::V4, FamilyPolicy::PreferSameFamily, &[]).unwrap()
        };
        let first = any(&b);
        for family in Family::BOTH {
            for _ in 0..crate::balance::EJECT_AFTER_FAILURES {
                b.states[first].record_failure(family);
            }
        }
        let second = any(&b);
        assert_ne!(second, first);
        // With the others tried, the ejected pod still serves (a last resort).
        let others: Vec<usize> = (0..3).filter(|&i| i != first).collect();
        let last = choose(
            &b,
            h,
            None,
            Family::V4,
            FamilyPolicy::PreferSameFamily,
            &others,
        );
        assert_eq!(last, Some(first));
    }

    #[test]
    fn a_subset_spreads_one_key_over_its_group_only() {
        let b = live(10);
        let h = crate::policy::stable_hash(&[b"k"]);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..300 {
            seen.insert(
                choose(
                    &b,
                    h,
                    Some(3),
                    Family::V4,
                    FamilyPolicy::PreferSameFamily,
                    &[],
                )
                .unwrap(),
            );
        }
        // Each of 300 draws misses a given group member with probability (2/3)^300 < 1e-52.
        assert_eq!(seen.len(), 3, "{seen:?}");
    }
}
