//! The route handles of a snapshot whose table shares most host entries with the previous one
//! (an Ingress change rebuilds only the hosts it touches): the previous index with the handles of
//! the changed entries replaced, instead of a walk over every route. The result equals what
//! [`LiveMetrics::build`] makes from scratch.

use std::collections::HashSet;
use std::sync::Arc;

use super::{LiveMetrics, RouteIndex, RouteKey, RouteMetrics};
use crate::metrics::services::FastState;
use crate::metrics::Metrics;

type FastSet<T> = HashSet<T, FastState>;
use crate::ptr_key::addr_of;
use crate::table::{HostRules, RouteAction, RouteTable, Snapshot};

/// At most this share (in 1/8) of the host entries may have changed for an update to be worth it.
const MAX_CHANGED_EIGHTHS: usize = 2;

/// The handles of `snapshot` from `previous`'s, when the Gateway listeners are the same and few
/// host entries changed; `None`: build them all.
pub(super) fn update(
    metrics: &Arc<Metrics>,
    snapshot: &Snapshot,
    previous: &LiveMetrics,
) -> Option<LiveMetrics> {
    let old_table = previous.index.table.as_ref()?;
    let old_gateways = previous.index.gateways.as_ref()?;
    if !Arc::ptr_eq(old_gateways, &snapshot.gateways) {
        return None;
    }
    let new_table = &snapshot.routes;
    let (gone, added) = changed_entries(old_table, new_table)?;
    let mut index = RouteIndex {
        by_action: previous.index.by_action.clone(),
        by_key: previous.index.by_key.clone(),
        table: Some(new_table.clone()),
        gateways: Some(snapshot.gateways.clone()),
    };
    // The default backend lives in the table itself: its address changes with every table.
    let old_actions = entry_actions(&gone).chain(default_action(old_table));
    let mut candidates: FastSet<RouteKey> = FastSet::default();
    for (host, action) in old_actions {
        index.by_action.remove(&addr_of(action));
        candidates.insert(key_of(host, action));
    }
    let mut used: FastSet<RouteKey> = FastSet::default();
    for (host, action) in entry_actions(&added).chain(default_action(new_table)) {
        let key = key_of(host, action);
        let handles = index
            .by_key
            .entry(key.clone())
            .or_insert_with(|| {
                Arc::new(RouteMetrics::new(
                    metrics.clone(),
                    key.clone(),
                    Some(key.service.clone()),
                ))
            })
            .clone();
        index.by_action.insert(addr_of(action), handles);
        used.insert(key);
    }
    // Host-less rules and the default backend share the label "": an unchanged host-less entry
    // still uses its keys.
    if candidates.iter().any(|k| k.host.is_empty()) {
        let any = &new_table.any_host;
        used.extend(any.rules.iter().map(|r| key_of(&any.host, &r.action)));
    }
    forget_unused(metrics, &mut index, candidates, &used);
    Some(LiveMetrics {
        index: Arc::new(index),
    })
}

/// The entries of `old` not shared with `new` and those of `new` not shared with `old` (by
/// pointer); `None` when too many changed.
#[allow(clippy::type_complexity)]
fn changed_entries<'a>(
    old: &'a RouteTable,
    new: &'a RouteTable,
) -> Option<(Vec<&'a HostRules>, Vec<&'a HostRules>)> {
    let mut gone = Vec::new();
    let mut added = Vec::new();
    for (old_map, new_map) in [(&old.exact, &new.exact), (&old.wildcard, &new.wildcard)] {
        for (host, entry) in new_map {
            match old_map.get(host) {
                Some(o) if o.same(entry) => {}
                Some(o) => {
                    gone.push(o);
                    added.push(entry);
                }
                None => added.push(entry),
            }
        }
        gone.extend(
            old_map
                .iter()
                .filter(|(host, _)| !new_map.contains_key(*host))
                .map(|(_, entry)| entry),
        );
    }
    if !old.any_host.same(&new.any_host) {
        gone.push(&old.any_host);
        added.push(&new.any_host);
    }
    let hosts = new.exact.len() + new.wildcard.len() + 1;
    (gone.len().max(added.len()) <= hosts * MAX_CHANGED_EIGHTHS / 8).then_some((gone, added))
}

fn entry_actions<'a>(
    entries: &'a [&'a HostRules],
) -> impl Iterator<Item = (&'a Arc<str>, &'a RouteAction)> {
    entries
        .iter()
        .flat_map(|e| e.rules.iter().map(move |r| (&e.host, &r.action)))
}

fn default_action(table: &RouteTable) -> impl Iterator<Item = (&Arc<str>, &RouteAction)> {
    static NO_HOST: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
    let empty = NO_HOST.get_or_init(|| Arc::from(""));
    table.default_backend.iter().map(move |a| (empty, a))
}

fn key_of(host: &Arc<str>, action: &RouteAction) -> RouteKey {
    RouteKey {
        namespace: action.origin.namespace.clone(),
        ingress: action.origin.name.clone(),
        service: action.backend.service().clone(),
        host: host.clone(),
    }
}

/// Forgets the series of the `candidates` no route uses any more, and of their Services when no
/// route uses those either (as a full build does).
fn forget_unused(
    metrics: &Metrics,
    index: &mut RouteIndex,
    candidates: FastSet<RouteKey>,
    used: &FastSet<RouteKey>,
) {
    let mut services: Vec<Arc<str>> = Vec::new();
    for key in candidates.into_iter().filter(|k| !used.contains(k)) {
        if let Some(handles) = index.by_key.remove(&key) {
            handles.forget();
            services.push(key.service);
        }
    }
    if services.is_empty() {
        return;
    }
    let in_use: FastSet<&Arc<str>> = index.by_key.keys().map(|k| &k.service).collect();
    let gone: FastSet<&Arc<str>> = services.iter().filter(|s| !in_use.contains(s)).collect();
    for service in gone {
        metrics.forget_service(service);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::table::{PathMatch, PathRule};

    fn action(ingress: &str, service: &str) -> RouteAction {
        let mut action = RouteAction::to(&format!("shop/{service}:80"));
        let origin = std::sync::Arc::make_mut(&mut action.origin);
        origin.namespace = "shop".into();
        origin.name = ingress.into();
        action
    }

    fn entry(host: &str, routes: &[(&str, &str, &str)]) -> HostRules {
        let rules = routes
            .iter()
            .map(|(path, ingress, service)| {
                PathRule::new(PathMatch::prefix(path), action(ingress, service))
            })
            .collect();
        HostRules::new(host, rules).0
    }

    /// Every route's handle labels, by host and path, and the labels with handles.
    fn labels(
        live: &LiveMetrics,
        table: &RouteTable,
    ) -> (BTreeMap<String, String>, BTreeSet<String>) {
        let describe =
            |k: &RouteKey| format!("{}/{} {} {}", k.namespace, k.ingress, k.service, k.host);
        let routes = table
            .actions()
            .map(|(host, a)| {
                let handles = live.route(a).expect("every route has handles");
                (format!("{host} {}", a.backend), describe(&handles.key))
            })
            .collect();
        (routes, live.index.by_key.keys().map(describe).collect())
    }

    #[test]
    fn an_update_equals_a_build_from_scratch() {
        let metrics = Metrics::register(&mut prometheus_client::registry::Registry::default());
        let mut table = RouteTable::default();
        for h in 0..20 {
            let host = format!("h{h}.test");
            let e = entry(&host, &[("/", "web", "a"), ("/b", "web", "b")]);
            table.exact.insert(host.into(), e);
        }
        table.any_host = entry("", &[("/any", "any", "a")]);
        table.default_backend = Some(action("fallback", "c"));
        let mut snapshot = Snapshot {
            routes: Arc::new(table.clone()),
            ..Snapshot::default()
        };
        let mut live = LiveMetrics::build(&metrics, &snapshot, &LiveMetrics::default());
        let edits: [&dyn Fn(&mut RouteTable); 5] = [
            &|t| {
                t.exact
                    .insert("h1.test".into(), entry("h1.test", &[("/", "web", "c")]));
            },
            &|t| {
                t.exact.remove("h2.test");
                t.exact
                    .insert("new.test".into(), entry("new.test", &[("/", "new", "d")]));
            },
            &|t| t.default_backend = Some(action("any", "a")),
            // The host-less rules still use the key the default backend gave up.
            &|t| t.default_backend = Some(action("fallback", "c")),
            &|t| t.any_host = entry("", &[]),
        ];
        for edit in edits {
            edit(&mut table);
            let mut next = snapshot.clone();
            next.routes = Arc::new(table.clone());
            // The unchanged entries share their rules, as after an incremental route phase.
            let next_table = Arc::make_mut(&mut next.routes);
            for (host, e) in next_table.exact.iter_mut() {
                if let Some(old) = snapshot.routes.exact.get(host).filter(|o| **o == *e) {
                    *e = old.clone();
                }
            }
            let updated = update(&metrics, &next, &live).expect("few entries changed");
            let scratch = LiveMetrics::build(
                &Metrics::register(&mut Default::default()),
                &next,
                &LiveMetrics::default(),
            );
            assert_eq!(
                labels(&updated, &next.routes),
                labels(&scratch, &next.routes)
            );
            live = updated;
            snapshot = next;
        }
    }
}
