//! The Secrets duet reads from the API, and no others: every `kubernetes.io/tls` Secret (field
//! selector `type=kubernetes.io/tls`: the certificates Ingresses and `--default-tls-secret` may
//! name), and, by name, each CA Secret an Ingress names in `duet.dev/backend-ca-secret` and each
//! htpasswd Secret in `nginx.ingress.kubernetes.io/auth-secret` (field
//! selector `metadata.name=NAME,type!=kubernetes.io/tls`, one watch per named Secret, started
//! when the first Ingress names it and stopped when the last one stops naming it). Other Secrets
//! (`Opaque` tokens, passwords, ...) are never listed, watched or cached.
//!
//! Every (re)list of any of these watches, and every stopped named watch, replaces the Secret
//! kind with the union of all their stores. The Secrets are synced once every TLS watch has
//! listed, the Ingresses have listed (they say which CA and htpasswd Secrets are named) and every
//! named watch started then has listed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures_util::stream::{AbortHandle, BoxStream, SelectAll};
use futures_util::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};

use super::watch::{seen, trim, Seen, Stores, SyncCountdown, Task, WatchBackoff};
use super::SourceEvent;
use crate::index::{Change, Object};
use crate::namespaces;
use crate::object::{is_dns_subdomain, Kind, NsName};
use crate::translate::nginx::access::AUTH_SECRET_ANNOTATION;
use crate::translate::nginx::client_tls::AUTH_TLS_SECRET_ANNOTATION;
use crate::translate::BACKEND_CA_SECRET_ANNOTATION;

/// The field selector of the certificate watch.
pub const TLS_SELECTOR: &str = "type=kubernetes.io/tls";

/// The field selector of the watch of one named CA or htpasswd Secret (TLS Secrets come from the
/// other).
pub fn named_selector(name: &str) -> String {
    format!("metadata.name={name},type!=kubernetes.io/tls")
}

/// Which watch an event comes from.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum WatchOf {
    /// The certificate watch of one namespace (index into the namespaces).
    Tls(usize),
    /// The watch of one named CA or htpasswd Secret.
    Named(NsName),
}

type Events = BoxStream<'static, (WatchOf, Result<watcher::Event<Secret>, watcher::Error>)>;

/// The CA Secrets and basic-auth Secrets the cached Ingresses name (invalid names are skipped:
/// no Secret has them).
pub fn named_secrets(ingresses: &Stores) -> BTreeSet<NsName> {
    ingresses
        .ingresses()
        .iter()
        .flat_map(|ingress| {
            let namespace = ingress.metadata.namespace.as_deref();
            let annotations = ingress.metadata.annotations.as_ref();
            // The CA Secret and the htpasswd Secret of basic auth (same namespace).
            [
                BACKEND_CA_SECRET_ANNOTATION,
                AUTH_SECRET_ANNOTATION,
                AUTH_TLS_SECRET_ANNOTATION,
            ]
            .into_iter()
            .filter_map(|key| {
                let namespace = namespace?;
                let value = annotations?.get(key)?.trim();
                let name = value
                    .strip_prefix(&format!("{namespace}/"))
                    .unwrap_or(value);
                is_dns_subdomain(name).then(|| NsName::new(namespace, name))
            })
            .collect::<Vec<_>>()
        })
        .collect()
}

fn events(api: Api<Secret>, config: watcher::Config, from: WatchOf) -> (Store<Secret>, Events) {
    let (reader, writer) = reflector::store();
    let stream = watcher(api, config)
        .backoff(WatchBackoff::default())
        .modify(trim::<Secret>)
        .reflect(writer)
        .map(move |event| (from.clone(), event))
        .boxed();
    (reader, stream)
}

/// The Secret watches and what they hold.
struct Watches {
    client: Client,
    stores: BTreeMap<WatchOf, Store<Secret>>,
    listed: BTreeSet<WatchOf>,
    named: BTreeMap<NsName, AbortHandle>,
    all: SelectAll<Events>,
}

impl Watches {
    /// Starts and stops named watches so that exactly `wanted` are watched; returns whether a
    /// stopped one held a Secret (the kind must then be replaced).
    fn follow(&mut self, wanted: &BTreeSet<NsName>) -> bool {
        let mut dropped = false;
        let gone: Vec<NsName> = self
            .named
            .keys()
            .filter(|n| !wanted.contains(*n))
            .cloned()
            .collect();
        for name in gone {
            if let Some(handle) = self.named.remove(&name) {
                handle.abort();
            }
            let from = WatchOf::Named(name.clone());
            self.listed.remove(&from);
            if let Some(store) = self.stores.remove(&from) {
                dropped |= !store.state().is_empty();
            }
            tracing::info!(secret = %name, "No Ingress names this CA Secret; watch stopped");
        }
        for name in wanted {
            if self.named.contains_key(name) {
                continue;
            }
            let api = Api::<Secret>::namespaced(self.client.clone(), &name.namespace);
            let config = watcher::Config::default().fields(&named_selector(&name.name));
            let from = WatchOf::Named(name.clone());
            let (store, stream) = events(api, config, from.clone());
            let (stream, handle) = futures_util::stream::abortable(stream);
            self.all.push(stream.boxed());
            self.stores.insert(from, store);
            self.named.insert(name.clone(), handle);
            tracing::info!(secret = %name, "An Ingress names this CA Secret; watching it");
        }
        dropped
    }

    /// Every Secret of every watch.
    fn replace(&self) -> Change {
        Change::Replace {
            kind: Kind::Secret,
            objects: self
                .stores
                .values()
                .flat_map(|s| s.state())
                .map(|o| (Object::Secret(o), None))
                .collect(),
        }
    }

    fn all_listed(&self) -> bool {
        self.stores.keys().all(|from| self.listed.contains(from))
    }
}

/// The Secret watches in `namespaces` (all when empty), following the CA and htpasswd Secrets the
/// Ingresses of `ingresses` name: one watcher to run.
pub(super) fn watch(
    client: Client,
    namespaces: &[String],
    ingresses: Stores,
    tx: mpsc::Sender<SourceEvent>,
    countdown: Arc<SyncCountdown>,
) -> Task {
    let mut watches = Watches {
        client: client.clone(),
        stores: BTreeMap::new(),
        listed: BTreeSet::new(),
        named: BTreeMap::new(),
        all: SelectAll::new(),
    };
    for (i, api) in namespaces::apis::<Secret>(&client, namespaces)
        .into_iter()
        .enumerate()
    {
        let config = watcher::Config::default().fields(TLS_SELECTOR);
        let (store, stream) = events(api, config, WatchOf::Tls(i));
        watches.stores.insert(WatchOf::Tls(i), store);
        watches.all.push(stream);
    }
    run(watches, ingresses, tx, countdown).boxed()
}

async fn run(
    mut watches: Watches,
    ingresses: Stores,
    tx: mpsc::Sender<SourceEvent>,
    countdown: Arc<SyncCountdown>,
) {
    let mut changes: watch::Receiver<u64> = ingresses.ingress_changes.clone();
    let mut changes_open = true;
    let listed = ingresses.clone();
    let mut ingresses_ready = std::pin::pin!(async move { listed.wait_until_listed().await });
    let mut ingresses_listed = false;
    let mut synced = false;
    loop {
        let change = tokio::select! {
            Some((from, event)) = watches.all.next() => handle(&mut watches, from, event),
            () = &mut ingresses_ready, if !ingresses_listed => {
                ingresses_listed = true;
                watches.follow(&named_secrets(&ingresses)).then(|| watches.replace())
            }
            changed = changes.changed(), if changes_open && ingresses_listed => {
                changes_open = changed.is_ok();
                watches.follow(&named_secrets(&ingresses)).then(|| watches.replace())
            }
        };
        if let Some(change) = change {
            if tx.send(SourceEvent::Changes(vec![change])).await.is_err() {
                return;
            }
        }
        if !synced && ingresses_listed && watches.all_listed() {
            synced = true;
            tracing::info!(kind = %Kind::Secret, "Watch synced");
            if countdown.listed(&tx).await.is_err() {
                return;
            }
        }
    }
}

/// One watch event: the change it makes to the Secret kind, if any.
fn handle(
    watches: &mut Watches,
    from: WatchOf,
    event: Result<watcher::Event<Secret>, watcher::Error>,
) -> Option<Change> {
    let Some(store) = watches.stores.get(&from) else {
        return None; // a stopped named watch
    };
    match event {
        Ok(event) => match seen(store, event) {
            Seen::Change(change) => Some(change),
            Seen::Nothing => None,
            Seen::Listed => {
                watches.listed.insert(from);
                Some(watches.replace())
            }
        },
        Err(error) => {
            tracing::warn!(kind = %Kind::Secret, watch = ?from, %error, "Watch failed; retrying with backoff");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_watches_exclude_tls_secrets_which_the_other_watch_has() {
        assert_eq!(
            named_selector("grpc-ca"),
            "metadata.name=grpc-ca,type!=kubernetes.io/tls"
        );
    }
}
