//! [`BackendMap`]: backends by id, split into copy-on-write shards, so that a snapshot built from
//! the previous one by replacing a few backends (an EndpointSlice change) copies those backends'
//! shards only, not the whole map: at 10,000 backends a clone is [`SHARDS`] reference counts and
//! one insert copies about 10,000 / [`SHARDS`] entries, where a `HashMap` clone counted 10,000
//! references and dropping the replaced one as many again.

use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::{Arc, LazyLock};

use super::BackendId;

/// How many shards a map has (a power of two).
pub const SHARDS: usize = 64;

/// The hasher of every shard (foldhash, seeded once per process: ids come from Kubernetes
/// objects, and a seed no one knows keeps one shard from holding them all).
type Hasher = foldhash::fast::RandomState;

/// One shard: the ids whose hash falls into it.
type Shard<V> = HashMap<BackendId, V, Hasher>;

/// The process's id digester: an id's digest (and so its shard) does not change while it runs.
static DIGESTER: LazyLock<Hasher> = LazyLock::new(Hasher::default);

/// The digest of the id `id`, which a [`BackendId`] keeps: it is hashed by it and falls into
/// the shard of its top bits, into which foldhash mixes every byte of the id.
pub(super) fn digest_of(id: &str) -> u64 {
    DIGESTER.hash_one(id)
}

/// The shard of an id of digest `digest`.
pub(super) fn shard_of(digest: u64) -> usize {
    (digest >> (u64::BITS - SHARDS.trailing_zeros())) as usize
}

/// A map from [`BackendId`] to `V` in [`SHARDS`] shards shared between clones: a clone shares
/// every shard; [`insert`](Self::insert) and [`remove`](Self::remove) copy the one shard they
/// change when a clone still shares it (`V: Clone`, an `Arc` in every use).
pub struct BackendMap<V> {
    shards: Box<[Arc<Shard<V>>]>,
    len: usize,
}

impl<V> BackendMap<V> {
    /// An empty map.
    pub fn new() -> BackendMap<V> {
        let hasher = Hasher::default();
        BackendMap {
            shards: (0..SHARDS)
                .map(|_| Arc::new(HashMap::with_hasher(hasher.clone())))
                .collect(),
            len: 0,
        }
    }

    /// An empty map with room for `capacity` entries, spread over the shards as the ids will be.
    pub fn with_capacity(capacity: usize) -> BackendMap<V>
    where
        V: Clone,
    {
        let mut map = BackendMap::new();
        map.reserve(capacity);
        map
    }

    fn shard_of(id: &BackendId) -> usize {
        id.shard()
    }

    /// How many backends the map holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the map holds no backend.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The value of `id`.
    pub fn get(&self, id: &BackendId) -> Option<&V> {
        self.shards[Self::shard_of(id)].get(id)
    }

    /// The entry of `id`: the map's own id beside its value.
    pub fn get_key_value(&self, id: &BackendId) -> Option<(&BackendId, &V)> {
        self.shards[Self::shard_of(id)].get_key_value(id)
    }

    /// Whether `id` has a value.
    pub fn contains_key(&self, id: &BackendId) -> bool {
        self.get(id).is_some()
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&BackendId, &V)> + '_ {
        self.shards.iter().flat_map(|shard| shard.iter())
    }

    /// Every id, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &BackendId> + '_ {
        self.iter().map(|(id, _)| id)
    }

    /// Every value, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.iter().map(|(_, v)| v)
    }

    /// How many of the shards `self` and `other` share (the same allocation): what a clone
    /// followed by a few inserts left in common.
    pub fn shared_shards(&self, other: &BackendMap<V>) -> usize {
        self.shards
            .iter()
            .zip(other.shards.iter())
            .filter(|(a, b)| Arc::ptr_eq(a, b))
            .count()
    }
}

impl<V: Send + Sync> BackendMap<V> {
    /// A map of the same ids, the value of each `f(id, value)`, made on up to `threads` threads
    /// (scoped; this one among them), each making a run of whole shards: an entry goes into its
    /// shard's copy, sized once, and no id is looked up in another shard.
    pub fn map_on<W: Send + Sync>(
        &self,
        threads: usize,
        f: impl Fn(&BackendId, &V) -> W + Sync,
    ) -> BackendMap<W> {
        let hasher = self.shards[0].hasher().clone();
        let map_shard = |shard: &Arc<Shard<V>>| {
            let mut out = Shard::with_capacity_and_hasher(shard.len(), hasher.clone());
            out.extend(shard.iter().map(|(id, value)| (id.clone(), f(id, value))));
            Arc::new(out)
        };
        let map_run = |run: &[Arc<Shard<V>>]| run.iter().map(map_shard).collect::<Vec<_>>();
        let per_thread = SHARDS.div_ceil(threads.clamp(1, SHARDS));
        let mut runs = self.shards.chunks(per_thread);
        let first = runs.next().unwrap_or_default();
        let shards = std::thread::scope(|scope| {
            let others: Vec<_> = runs.map(|run| scope.spawn(move || map_run(run))).collect();
            let mut shards = map_run(first);
            for other in others {
                shards.extend(other.join().expect("a run of shards"));
            }
            shards
        });
        BackendMap {
            shards: shards.into(),
            len: self.len,
        }
    }
}

impl<V: Clone> BackendMap<V> {
    /// Sets the value of `id`, returning the one it replaced; copies the shard first if a clone
    /// shares it.
    pub fn insert(&mut self, id: BackendId, value: V) -> Option<V> {
        let shard = Arc::make_mut(&mut self.shards[Self::shard_of(&id)]);
        let old = shard.insert(id, value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// Makes room for `additional` more entries, spread over the shards as the ids will be.
    pub fn reserve(&mut self, additional: usize) {
        let each = additional.div_ceil(SHARDS);
        for shard in self.shards.iter_mut() {
            Arc::make_mut(shard).reserve(each);
        }
    }

    /// Removes `id`, returning its value; copies the shard first if a clone shares it (and
    /// `id` is in it).
    pub fn remove(&mut self, id: &BackendId) -> Option<V> {
        let index = Self::shard_of(id);
        if !self.shards[index].contains_key(id) {
            return None;
        }
        let old = Arc::make_mut(&mut self.shards[index]).remove(id);
        if old.is_some() {
            self.len -= 1;
        }
        old
    }
}

impl<V> Clone for BackendMap<V> {
    /// Shares every shard: [`SHARDS`] reference counts, whatever the size.
    fn clone(&self) -> BackendMap<V> {
        BackendMap {
            shards: self.shards.clone(),
            len: self.len,
        }
    }
}

impl<V> Default for BackendMap<V> {
    fn default() -> BackendMap<V> {
        BackendMap::new()
    }
}

impl<V: fmt::Debug> fmt::Debug for BackendMap<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<V: PartialEq> PartialEq for BackendMap<V> {
    fn eq(&self, other: &BackendMap<V>) -> bool {
        self.len == other.len
            && self
                .iter()
                .all(|(id, v)| other.get(id).is_some_and(|o| o == v))
    }
}

impl<V: Eq> Eq for BackendMap<V> {}

impl<V: Clone> Extend<(BackendId, V)> for BackendMap<V> {
    fn extend<I: IntoIterator<Item = (BackendId, V)>>(&mut self, entries: I) {
        for (id, value) in entries {
            self.insert(id, value);
        }
    }
}

impl<V: Clone> FromIterator<(BackendId, V)> for BackendMap<V> {
    fn from_iter<I: IntoIterator<Item = (BackendId, V)>>(entries: I) -> BackendMap<V> {
        let entries = entries.into_iter();
        let mut map = BackendMap::with_capacity(entries.size_hint().0);
        map.extend(entries);
        map
    }
}

impl<V: Clone, const N: usize> From<[(BackendId, V); N]> for BackendMap<V> {
    fn from(entries: [(BackendId, V); N]) -> BackendMap<V> {
        entries.into_iter().collect()
    }
}

impl<V> std::ops::Index<&BackendId> for BackendMap<V> {
    type Output = V;

    /// The value of `id`; panics when there is none (as `HashMap`'s index does).
    fn index(&self, id: &BackendId) -> &V {
        self.get(id).expect("no entry for this backend id")
    }
}

impl<V: Clone + 'static> IntoIterator for BackendMap<V> {
    type Item = (BackendId, V);
    type IntoIter = Box<dyn Iterator<Item = (BackendId, V)>>;

    /// The entries, moved out of the shards no clone shares and copied from the others.
    fn into_iter(self) -> Self::IntoIter {
        Box::new(
            self.shards
                .into_vec()
                .into_iter()
                .flat_map(|shard| Arc::unwrap_or_clone(shard).into_iter()),
        )
    }
}

impl<'a, V> IntoIterator for &'a BackendMap<V> {
    type Item = (&'a BackendId, &'a V);
    type IntoIter = Box<dyn Iterator<Item = (&'a BackendId, &'a V)> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: usize) -> BackendId {
        format!("ns-{}/svc-{n}:80", n % 7).parse().unwrap()
    }

    #[test]
    fn a_map_mapped_on_several_threads_holds_every_id_with_its_new_value() {
        let map: BackendMap<usize> = (0..1000).map(|n| (id(n), n)).collect();
        for threads in [1, 2, 3, SHARDS + 5] {
            let doubled = map.map_on(threads, |id, n| (id.as_str().len(), 2 * n));
            assert_eq!(doubled.len(), map.len(), "{threads} threads");
            for n in 0..1000 {
                let want = (id(n).as_str().len(), 2 * n);
                assert_eq!(doubled.get(&id(n)), Some(&want), "{threads} threads: {n}");
            }
            assert_eq!(doubled.get(&id(1000)), None);
            assert_eq!(doubled.iter().count(), 1000);
        }
    }

    #[test]
    fn behaves_as_a_hash_map() {
        let mut map = BackendMap::new();
        let mut oracle = HashMap::new();
        for n in 0..1000 {
            assert_eq!(map.insert(id(n), n), oracle.insert(id(n), n));
        }
        for n in (0..1000).step_by(3) {
            assert_eq!(map.insert(id(n), n + 1), oracle.insert(id(n), n + 1));
        }
        for n in (0..1200).step_by(5) {
            assert_eq!(map.remove(&id(n)), oracle.remove(&id(n)));
        }
        assert_eq!(map.len(), oracle.len());
        for n in 0..1200 {
            assert_eq!(map.get(&id(n)), oracle.get(&id(n)));
            assert_eq!(map.contains_key(&id(n)), oracle.contains_key(&id(n)));
        }
        let mut entries: Vec<_> = map.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let mut expected: Vec<_> = oracle.into_iter().collect();
        entries.sort();
        expected.sort();
        assert_eq!(entries, expected);
    }

    #[test]
    fn a_change_to_a_clone_copies_one_shard_and_leaves_the_original_as_it_was() {
        let original: BackendMap<Arc<usize>> = (0..10_000).map(|n| (id(n), Arc::new(n))).collect();
        let mut next = original.clone();
        assert_eq!(next.shared_shards(&original), SHARDS);
        next.insert(id(42), Arc::new(0));
        assert_eq!(next.shared_shards(&original), SHARDS - 1);
        assert_eq!(**original.get(&id(42)).unwrap(), 42);
        assert_eq!(**next.get(&id(42)).unwrap(), 0);
        // The other entries of the copied shard are the original's values, not copies of them.
        for n in (0..10_000).filter(|&n| n != 42) {
            assert!(Arc::ptr_eq(
                original.get(&id(n)).unwrap(),
                next.get(&id(n)).unwrap()
            ));
        }
        next.remove(&id(7));
        assert!(original.contains_key(&id(7)));
        assert_eq!((original.len(), next.len()), (10_000, 9_999));
        assert!(next.shared_shards(&original) >= SHARDS - 2);
        assert_ne!(original, next);
    }

    #[test]
    fn ids_spread_over_the_shards() {
        let map: BackendMap<()> = (0..10_000).map(|n| (id(n), ())).collect();
        let largest = map.shards.iter().map(|s| s.len()).max().unwrap();
        // 156 on average; a shard with twice that would mean the chooser does not mix.
        assert!(largest < 2 * 10_000 / SHARDS, "largest shard: {largest}");
    }
}
