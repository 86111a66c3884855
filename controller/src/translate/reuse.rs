//! Reuse by pointer across route builds: each host's rules of a new route table that are equal
//! to the previous table's take the previous `Arc`, so an Ingress change leaves every host it
//! does not touch the same object (the dataplane then keeps what it derived from them: metric
//! handles, upstream TLS configurations), and the whole table is the previous one when nothing
//! changed.

use std::collections::HashMap;

use dataplane::table::HostRules;
use dataplane::RouteTable;

/// Makes `table`'s host entries equal to `previous`'s share their rules with them; returns
/// whether every entry now does (and the default backend is equal), so `previous` can be kept
/// whole.
pub fn reuse_hosts(table: &mut RouteTable, previous: &RouteTable) -> bool {
    let exact = reuse_map(&mut table.exact, &previous.exact);
    let wildcard = reuse_map(&mut table.wildcard, &previous.wildcard);
    let any = reuse_entry(&mut table.any_host, &previous.any_host);
    exact && wildcard && any && table.default_backend == previous.default_backend
}

fn reuse_map(
    hosts: &mut HashMap<Box<str>, HostRules>,
    previous: &HashMap<Box<str>, HostRules>,
) -> bool {
    let mut all = hosts.len() == previous.len();
    for (host, entry) in hosts.iter_mut() {
        all &= match previous.get(host) {
            Some(old) => reuse_entry(entry, old),
            None => false,
        };
    }
    all
}

/// `entry` becomes `old` (sharing its rules) when equal by value.
fn reuse_entry(entry: &mut HostRules, old: &HostRules) -> bool {
    if !same_rules(entry, old) {
        return false;
    }
    if !entry.same(old) {
        *entry = old.clone();
    }
    true
}

/// Whether two host entries are the same rules: shared, or else equal by value.
pub(super) fn same_rules(entry: &HostRules, old: &HostRules) -> bool {
    entry.same(old) || entry == old
}

/// Whether two tables share every host entry by pointer (and have the same default backend).
pub fn same_hosts(a: &RouteTable, b: &RouteTable) -> bool {
    let same_map = |x: &HashMap<Box<str>, HostRules>, y: &HashMap<Box<str>, HostRules>| {
        x.len() == y.len() && x.iter().all(|(h, e)| y.get(h).is_some_and(|o| e.same(o)))
    };
    same_map(&a.exact, &b.exact)
        && same_map(&a.wildcard, &b.wildcard)
        && a.any_host.same(&b.any_host)
        && a.default_backend == b.default_backend
}
