//! The ExternalName resolver: a controller task looking up the A and AAAA records of the names
//! the routes use (hickory-resolver, configured from `--resolv-conf`, the pod's
//! `/etc/resolv.conf` by default: the cluster's DNS with its search list and `ndots`).
//!
//! Each name is looked up again when the shorter TTL of its two answers runs out (at least
//! [`MIN_REFRESH`] apart, at most [`MAX_REFRESH`]). A lookup that fails (timeout, SERVFAIL,
//! refused) keeps the last good answer and is retried after [`RETRY`]; an authoritative NXDOMAIN
//! or an answer without records replaces it. The answers go to the control loop as a whole map
//! on a watch channel; the loop rebuilds the backends (an endpoint-only change), so translation
//! stays pure.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hickory_resolver::config::ResolverOpts;
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::NetError;
use hickory_resolver::proto::rr::RData;
use hickory_resolver::TokioResolver;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::translate::{Resolution, Resolved};

/// The shortest time between two lookups of a name (a TTL of 0 does not make a busy loop).
pub const MIN_REFRESH: Duration = Duration::from_secs(1);
/// The longest time an answer is kept without asking again.
pub const MAX_REFRESH: Duration = Duration::from_secs(300);
/// How long after a failed lookup it is tried again.
pub const RETRY: Duration = Duration::from_secs(5);

/// Why the resolver cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The resolv.conf file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The resolv.conf file names no usable name server.
    #[error("{path}: {source}")]
    Config {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: NetError,
    },
}

/// The control loop's end of the resolver task.
#[derive(Debug)]
pub struct NameResolver {
    /// The names the routes use now.
    pub wanted: watch::Sender<BTreeSet<Arc<str>>>,
    /// The latest answers.
    pub answers: watch::Receiver<Arc<Resolved>>,
}

/// Builds a resolver from the resolv.conf at `path`.
pub fn resolver(path: &Path) -> Result<TokioResolver, ResolveError> {
    let shown = path.display().to_string();
    let data = std::fs::read(path).map_err(|source| ResolveError::Read {
        path: shown.clone(),
        source,
    })?;
    let (config, options) =
        hickory_resolver::system_conf::parse_resolv_conf(data).map_err(|source| {
            ResolveError::Config {
                path: shown.clone(),
                source,
            }
        })?;
    let mut options: ResolverOpts = options;
    // duet asks again when a TTL runs out: hickory's cache must not answer instead.
    options.cache_size = 0;
    TokioResolver::builder_with_config(config, TokioRuntimeProvider::default())
        .with_options(options)
        .build()
        .map_err(|source| ResolveError::Config {
            path: shown,
            source,
        })
}

/// Starts the resolver task on `resolver`; it ends when the control loop drops its end.
pub fn spawn(resolver: TokioResolver) -> NameResolver {
    let (wanted, wanted_rx) = watch::channel(BTreeSet::new());
    let (answers_tx, answers) = watch::channel(Arc::new(Resolved::new()));
    tokio::spawn(run(resolver, wanted_rx, answers_tx));
    NameResolver { wanted, answers }
}

/// Starts the resolver task from the resolv.conf at `path`; when it cannot be read, every name
/// is reported unresolved (with the reason) and duet serves everything else.
pub fn start(path: &Path) -> NameResolver {
    match resolver(path) {
        Ok(resolver) => spawn(resolver),
        Err(error) => {
            tracing::warn!(%error, "ExternalName Services cannot be resolved");
            spawn_without(error.to_string())
        }
    }
}

/// A resolver end answering every name with `why` and no address.
fn spawn_without(why: String) -> NameResolver {
    let (wanted, mut wanted_rx) = watch::channel(BTreeSet::<Arc<str>>::new());
    let (answers_tx, answers) = watch::channel(Arc::new(Resolved::new()));
    tokio::spawn(async move {
        while wanted_rx.changed().await.is_ok() {
            let problem = Some(format!("no resolver ({why}); no target"));
            let names = wanted_rx.borrow_and_update().clone();
            let all = names.into_iter().map(|name| {
                let answer = Resolution {
                    problem: problem.clone(),
                    ..Resolution::default()
                };
                (name, answer)
            });
            answers_tx.send_replace(Arc::new(all.collect()));
        }
    });
    NameResolver { wanted, answers }
}

/// One name's state: its answer and when to ask again.
struct Entry {
    answer: Resolution,
    due: Instant,
}

async fn run(
    resolver: TokioResolver,
    mut wanted: watch::Receiver<BTreeSet<Arc<str>>>,
    answers: watch::Sender<Arc<Resolved>>,
) {
    let mut entries: BTreeMap<Arc<str>, Entry> = BTreeMap::new();
    loop {
        let names = wanted.borrow_and_update().clone();
        entries.retain(|name, _| names.contains(name));
        let now = Instant::now();
        let mut changed = false;
        for name in &names {
            let due = entries.get(&**name).is_none_or(|e| e.due <= now);
            if due {
                let previous = entries.get(&**name).map(|e| &e.answer);
                let (answer, next) = lookup(&resolver, name, previous).await;
                changed |= previous != Some(&answer);
                entries.insert(name.clone(), Entry { answer, due: next });
            }
        }
        let current: Resolved = entries
            .iter()
            .map(|(n, e)| (n.clone(), e.answer.clone()))
            .collect();
        if changed || current.len() != answers.borrow().len() {
            answers.send_replace(Arc::new(current));
        }
        let next = entries.values().map(|e| e.due).min();
        tokio::select! {
            result = wanted.changed() => if result.is_err() { return },
            () = sleep_until(next) => {}
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// What one family's lookup gave.
enum Family<T> {
    /// Records, valid until then.
    Records(Vec<T>, Instant),
    /// An authoritative answer without records of this type (`nx`: the name does not exist).
    None { nx: bool },
    /// The lookup failed.
    Failed(String),
}

/// Looks `name` up (A and AAAA at once) and returns its new answer, given the previous one, and
/// when to ask again.
async fn lookup(
    resolver: &TokioResolver,
    name: &str,
    previous: Option<&Resolution>,
) -> (Resolution, Instant) {
    let (v4, v6) = tokio::join!(resolver.ipv4_lookup(name), resolver.ipv6_lookup(name));
    let v4 = family(v4, |r| match r {
        RData::A(a) => Some(a.0),
        _ => None,
    });
    let v6 = family(v6, |r| match r {
        RData::AAAA(a) => Some(a.0),
        _ => None,
    });
    let now = Instant::now();
    let nx = matches!(v4, Family::None { nx: true }) || matches!(v6, Family::None { nx: true });
    let mut round = Round {
        now,
        due: now + MAX_REFRESH,
        problems: Vec::new(),
    };
    let answer = Resolution {
        v4: round.take(v4, previous.map(|p| &p.v4), "A"),
        v6: round.take(v6, previous.map(|p| &p.v6), "AAAA"),
        problem: None,
    };
    let empty = answer.v4.is_empty() && answer.v6.is_empty();
    let problem = round.problem(nx, empty);
    if problem.is_some() && empty {
        round.due = round.due.min(now + RETRY);
    }
    if let Some(problem) = &problem {
        tracing::debug!(name, problem, "ExternalName lookup");
    }
    (Resolution { problem, ..answer }, round.due)
}

/// One lookup of a name's two families: when to ask again and what went wrong.
struct Round {
    now: Instant,
    due: Instant,
    problems: Vec<String>,
}

impl Round {
    /// The addresses of one family: the fresh ones (asking again when their TTL runs out, within
    /// [`MIN_REFRESH`] and [`MAX_REFRESH`]), none, or after a failure the previous ones (asking
    /// again after [`RETRY`]).
    fn take<T: Clone>(
        &mut self,
        found: Family<T>,
        previous: Option<&Vec<T>>,
        kind: &str,
    ) -> Vec<T> {
        match found {
            Family::Records(ips, until) => {
                let until = until.clamp(self.now + MIN_REFRESH, self.now + MAX_REFRESH);
                self.due = self.due.min(until);
                ips
            }
            Family::None { .. } => Vec::new(),
            Family::Failed(why) => {
                self.problems.push(format!("{kind} lookup failed ({why})"));
                self.due = self.due.min(self.now + RETRY);
                previous.cloned().unwrap_or_default()
            }
        }
    }

    /// What the diagnostic says, if anything.
    fn problem(&self, nx: bool, empty: bool) -> Option<String> {
        if !self.problems.is_empty() {
            let kept = if empty {
                "no address to serve"
            } else {
                "serving the last good answer"
            };
            Some(format!("{}; {kept}", self.problems.join(", ")))
        } else if nx {
            Some("the name does not exist (NXDOMAIN); no target".to_owned())
        } else if empty {
            Some("the name has no A or AAAA records; no target".to_owned())
        } else {
            None
        }
    }
}

/// Sorts out one family's lookup result; `pick` takes the family's addresses from the records.
fn family<T: Ord>(
    result: Result<hickory_resolver::lookup::Lookup, NetError>,
    pick: impl Fn(&RData) -> Option<T>,
) -> Family<T> {
    match result {
        Ok(lookup) => {
            let mut ips: Vec<T> = lookup
                .answers()
                .iter()
                .filter_map(|r| pick(&r.data))
                .collect();
            ips.sort();
            ips.dedup();
            if ips.is_empty() {
                Family::None { nx: false }
            } else {
                Family::Records(ips, Instant::from_std(lookup.valid_until()))
            }
        }
        Err(e) if e.is_nx_domain() => Family::None { nx: true },
        Err(e) if e.is_no_records_found() => Family::None { nx: false },
        Err(e) => Family::Failed(e.as_metrics_label().to_owned()),
    }
}
