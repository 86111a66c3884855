//! What every watcher of the Kubernetes API source shares: the [`Watched`] kinds, objects
//! trimmed before caching ([`trim`]), the retry delays ([`WatchBackoff`]), what one watch event
//! means ([`seen`]), the Ingresses other tasks read ([`Stores`]) and the count of watchers
//! still to list ([`SyncCountdown`]). One API per watched namespace: [`crate::namespaces`].

use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use futures_util::future::BoxFuture;
use k8s_openapi::api::networking::v1::Ingress;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::Resource;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};

use super::SourceEvent;
use crate::index::{Change, Stored};
use crate::stored::StoredIngress;
use crate::units::Doubling;

/// The annotation `kubectl apply` leaves on objects: a full copy of the object, dropped.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what duet never reads and what makes objects large: `managedFields` and the
/// last-applied annotation (EndpointSlices are decoded into their compact form,
/// [`compact`](crate::compact), which keeps neither).
pub fn trim<K: Resource + 'static>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED_ANNOTATION);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

/// Gives back the spare capacity of an Ingress's lists. The JSON decoder cannot know a list's
/// length before its end, so each list grows by doubling from 4: an Ingress of one rule with
/// two paths kept room for four of each (768 and 192 bytes in jemalloc's classes where 384 and
/// 48 hold them: 5 MiB at 10,000 Ingresses), for as long as the Ingress is stored.
pub fn fit(ingress: &mut Ingress) {
    if let Some(spec) = ingress.spec.as_mut() {
        for tls in spec.tls.iter_mut().flatten() {
            shrink(&mut tls.hosts);
        }
        shrink(&mut spec.tls);
        for rule in spec.rules.iter_mut().flatten() {
            if let Some(http) = rule.http.as_mut() {
                http.paths.shrink_to_fit();
            }
        }
        shrink(&mut spec.rules);
    }
    let balancer = ingress
        .status
        .as_mut()
        .and_then(|s| s.load_balancer.as_mut());
    if let Some(balancer) = balancer {
        for entry in balancer.ingress.iter_mut().flatten() {
            shrink(&mut entry.ports);
        }
        shrink(&mut balancer.ingress);
    }
}

fn shrink<T>(list: &mut Option<Vec<T>>) {
    if let Some(list) = list {
        list.shrink_to_fit();
    }
}

/// The retry delays of a failing watch: 0.5 s doubling up to 5 s, each with up to 25 % jitter,
/// back to 0.5 s after a good event. Shorter than kube-runtime's default (up to 30 s), so routes
/// catch up within seconds once the API server is back; five watches at most every 5 s are
/// still gentle on a struggling API server.
#[derive(Clone, Debug)]
pub struct WatchBackoff(Doubling);

impl WatchBackoff {
    /// The first delay.
    pub const MIN: Duration = Duration::from_millis(500);
    /// The longest delay (before jitter).
    pub const MAX: Duration = Duration::from_secs(5);
}

impl Default for WatchBackoff {
    fn default() -> Self {
        WatchBackoff(Doubling::new(Self::MIN, Self::MAX))
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let delay = self.0.next_delay();
        Some(delay + delay.mul_f64(fastrand::f64() * 0.25))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.0.reset();
    }
}

/// A kind the source watches: a stored kind that kube-runtime can watch.
pub(super) trait Watched:
    Stored + Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug
{
}

impl<K> Watched for K where K: Stored + Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug
{}

/// A watcher built but not yet running.
pub(super) type Task = BoxFuture<'static, ()>;

/// What one watch event means for the index.
pub(super) enum Seen {
    /// An object changed or went away.
    Change(Change),
    /// A (re)list ended: the caller replaces the kind with its stores' state.
    Listed,
    /// Nothing (the start of a list, or an object of it: the end of the list carries them all).
    Nothing,
}

/// What a watch event of `K` means, sharing the object `store` (the event's reflector store)
/// already holds.
pub(super) fn seen<K: Watched>(store: &Store<K>, event: watcher::Event<K>) -> Seen {
    match event {
        watcher::Event::Apply(object) => {
            let key = ObjectRef::from_obj(&object);
            let shared = store.get(&key).unwrap_or_else(|| Arc::new(object));
            Seen::Change(Change::Apply {
                object: K::wrap(shared),
                file: None,
            })
        }
        watcher::Event::Delete(object) => {
            Seen::Change(Change::Delete(K::wrap(Arc::new(object)).key()))
        }
        watcher::Event::Init | watcher::Event::InitApply(_) => Seen::Nothing,
        watcher::Event::InitDone => Seen::Listed,
    }
}

/// One watch's current objects, for the kinds no other task reads (all but Ingresses): what a
/// relist replaces the kind with, kept as the objects' `Arc`s (shared with the index), sorted by
/// namespace and name. A reflector store would key each object by four strings of its own (name,
/// namespace, resource version, uid) in a hash map beside the index: about 200 bytes an object,
/// 6 MB at 30,000 Services and EndpointSlices. Events change it as they change a reflector
/// store: an object listed twice keeps its last version.
#[derive(Debug)]
pub(super) struct Listed<K> {
    objects: Vec<Arc<K>>,
    /// The objects of a list under way (from `Init` to `InitDone`).
    listing: Option<Vec<Arc<K>>>,
}

impl<K> Default for Listed<K> {
    fn default() -> Self {
        Listed {
            objects: Vec::new(),
            listing: None,
        }
    }
}

/// The namespace and name of a stored object, as its watch's listing orders them.
fn listed_key<K: Stored>(object: &K) -> (&str, &str) {
    let (namespace, name) = object.names();
    (namespace.unwrap_or_default(), name.unwrap_or_default())
}

impl<K: Stored> Listed<K> {
    /// What a watch event means, recording it.
    pub(super) fn seen(&mut self, event: watcher::Event<K>) -> Seen {
        match event {
            watcher::Event::Apply(object) => {
                let shared = Arc::new(object);
                match self.find(&shared) {
                    Ok(at) => self.objects[at] = shared.clone(),
                    Err(at) => self.objects.insert(at, shared.clone()),
                }
                Seen::Change(Change::Apply {
                    object: K::wrap(shared),
                    file: None,
                })
            }
            watcher::Event::Delete(object) => {
                if let Ok(at) = self.find(&object) {
                    self.objects.remove(at);
                }
                Seen::Change(Change::Delete(K::wrap(Arc::new(object)).key()))
            }
            watcher::Event::Init => {
                self.listing = Some(Vec::new());
                Seen::Nothing
            }
            watcher::Event::InitApply(object) => {
                self.listing.get_or_insert_default().push(Arc::new(object));
                Seen::Nothing
            }
            watcher::Event::InitDone => {
                let mut listed = self.listing.take().unwrap_or_default();
                // Stable: of an object listed twice, the later version is kept.
                listed.sort_by(|a, b| listed_key(&**a).cmp(&listed_key(&**b)));
                listed.dedup_by(|later, kept| {
                    let same = listed_key(&**later) == listed_key(&**kept);
                    if same {
                        std::mem::swap(later, kept);
                    }
                    same
                });
                listed.shrink_to_fit();
                self.objects = listed;
                Seen::Listed
            }
        }
    }

    /// The watch's objects.
    pub(super) fn objects(&self) -> &[Arc<K>] {
        &self.objects
    }

    fn find(&self, object: &K) -> Result<usize, usize> {
        let key = listed_key(object);
        self.objects
            .binary_search_by(|o| listed_key(&**o).cmp(&key))
    }

    /// The object of `namespace` and `name`.
    pub(super) fn get(&self, namespace: &str, name: &str) -> Option<&Arc<K>> {
        let at = self
            .objects
            .binary_search_by(|o| listed_key(&**o).cmp(&(namespace, name)))
            .ok()?;
        self.objects.get(at)
    }
}

/// The Ingress watches' objects, shared by the Ingress watcher (which changes them) with the
/// readers outside the control loop (the status writer, the Secret watcher): one [`Listed`] per
/// watch, the same `Arc`s as the index's. Kept in place of kube-runtime reflector stores, which
/// key each object by four strings of their own in a hash map (about 200 bytes an Ingress).
#[derive(Clone, Default)]
pub(super) struct SharedIngresses(Arc<RwLock<Vec<Listed<StoredIngress>>>>);

impl SharedIngresses {
    /// One empty [`Listed`] per watch.
    pub(super) fn new(watches: usize) -> SharedIngresses {
        let listed = (0..watches).map(|_| Listed::default()).collect();
        SharedIngresses(Arc::new(RwLock::new(listed)))
    }

    /// Reads the watches' objects (a poisoned lock is read as it was left: events are
    /// recorded whole or not at all).
    pub(super) fn read(&self) -> RwLockReadGuard<'_, Vec<Listed<StoredIngress>>> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Changes them.
    pub(super) fn write(&self) -> RwLockWriteGuard<'_, Vec<Listed<StoredIngress>>> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The Ingresses of the running source, for readers outside the control loop (the status
/// writer reads them).
#[derive(Clone)]
pub struct Stores {
    /// Every watch's Ingresses.
    pub(super) ingresses: SharedIngresses,
    /// Bumped after every Ingress event.
    pub ingress_changes: watch::Receiver<u64>,
    /// True once every Ingress watch has listed.
    pub(super) ingresses_listed: watch::Receiver<bool>,
}

impl Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores")
            .field("ingresses", &self.ingresses.read().len())
            .finish()
    }
}

impl Stores {
    /// Every cached Ingress.
    pub fn ingresses(&self) -> Vec<Arc<StoredIngress>> {
        let watches = self.ingresses.read();
        watches.iter().flat_map(Listed::objects).cloned().collect()
    }

    /// One cached Ingress.
    pub fn ingress(&self, namespace: &str, name: &str) -> Option<Arc<StoredIngress>> {
        let watches = self.ingresses.read();
        watches.iter().find_map(|w| w.get(namespace, name).cloned())
    }

    /// Waits until every Ingress watch has listed (forever if the watcher is gone first).
    pub(super) async fn wait_until_listed(&self) {
        let mut listed = self.ingresses_listed.clone();
        if listed.wait_for(|l| *l).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Counts down the watchers still to list; the last one sends [`SourceEvent::Synced`]. Set to
/// the number of watchers once they are all built and before any runs, so that the count comes
/// from the list of watchers, never from a number kept equal to it by hand.
#[derive(Debug, Default)]
pub(super) struct SyncCountdown(AtomicUsize);

impl SyncCountdown {
    /// Sets how many watchers must list (before any of them runs).
    pub(super) fn expect(&self, watchers: usize) {
        self.0.store(watchers, Ordering::Release);
    }

    /// One watcher has listed: sends [`SourceEvent::Synced`] when it was the last. `Err` when the
    /// receiver is gone.
    pub(super) async fn listed(&self, tx: &mpsc::Sender<SourceEvent>) -> Result<(), ()> {
        if self.0.fetch_sub(1, Ordering::AcqRel) == 1 {
            tx.send(SourceEvent::Synced).await.map_err(|_| ())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};

    #[test]
    fn trim_drops_managed_fields_and_last_applied() {
        let mut ingress = Ingress {
            metadata: ObjectMeta {
                name: Some("web".to_owned()),
                managed_fields: Some(vec![ManagedFieldsEntry::default()]),
                annotations: Some(
                    [
                        (LAST_APPLIED_ANNOTATION.to_owned(), "{...}".to_owned()),
                        (
                            "duet.dev/upstream-family".to_owned(),
                            "PreferIPv6".to_owned(),
                        ),
                    ]
                    .into_iter()
                    .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        trim(&mut ingress);
        assert_eq!(ingress.metadata.managed_fields, None);
        let annotations = ingress.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations.len(), 1);
        assert!(annotations.contains_key("duet.dev/upstream-family"));

        let mut only_last_applied = Service {
            metadata: ObjectMeta {
                annotations: Some(
                    [(LAST_APPLIED_ANNOTATION.to_owned(), "{}".to_owned())]
                        .into_iter()
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        trim(&mut only_last_applied);
        assert_eq!(only_last_applied.metadata.annotations, None);
    }

    #[test]
    fn backoff_doubles_to_five_seconds_with_jitter_and_resets() {
        use kube::runtime::utils::Backoff as _;
        let mut b = WatchBackoff::default();
        let delays: Vec<Duration> = b.by_ref().take(6).collect();
        let bases = [500, 1000, 2000, 4000, 5000, 5000].map(Duration::from_millis);
        for (delay, base) in delays.iter().zip(bases) {
            assert!(
                *delay >= base && *delay <= base.mul_f64(1.25),
                "{delay:?} vs {base:?}"
            );
        }
        b.reset();
        assert!(b.next().unwrap() < Duration::from_millis(700));
    }

    #[tokio::test]
    async fn synced_once_every_expected_watcher_has_listed() {
        let (tx, mut rx) = mpsc::channel(4);
        let countdown = SyncCountdown::default();
        countdown.expect(2);
        countdown.listed(&tx).await.unwrap();
        assert!(rx.try_recv().is_err(), "synced after one of two watchers");
        countdown.listed(&tx).await.unwrap();
        assert_eq!(rx.try_recv(), Ok(SourceEvent::Synced));
    }
}
