//! What the manifest-folder source keeps between scans, laid out for 40,000 files: the files by
//! path ([`PathMap`]) and the objects last emitted ([`Emitted`]), each a sorted `Vec` searched by
//! binary search. Both are built once by a full scan, in order, and change by a few entries per
//! file event. As `BTreeMap`s they cost about 300 bytes an object (half-full 1 KiB nodes after
//! in-order inserts, and the two `String`s of each `ObjectKey`); here an emitted object is its
//! `Object` and its file's `Arc` (32 bytes), its key read from the object itself.

use std::cmp::Ordering;
use std::path::Path;
use std::sync::Arc;

use crate::index::Object;
use crate::object::ObjectKey;

/// Values by file path, sorted by path (the order of a `BTreeMap<Arc<Path>, V>`).
#[derive(Debug)]
pub(super) struct PathMap<V>(Vec<(Arc<Path>, V)>);

impl<V> Default for PathMap<V> {
    fn default() -> Self {
        PathMap(Vec::new())
    }
}

impl<V> PathMap<V> {
    fn find(&self, path: &Path) -> Result<usize, usize> {
        // A full scan looks each file up and inserts it in path order: past the last path, one
        // comparison instead of a binary search's 16 (at 40,001 files; `Path`s compare by
        // component: 2 % of the start's CPU on the thread that records the reads).
        match self.0.last() {
            None => Err(0),
            Some((last, _)) if **last < *path => Err(self.0.len()),
            Some(_) => self.0.binary_search_by(|(p, _)| (**p).cmp(path)),
        }
    }

    /// The value of `path`.
    pub(super) fn get(&self, path: &Path) -> Option<&V> {
        self.find(path).ok().map(|at| &self.0[at].1)
    }

    /// The same, to change.
    pub(super) fn get_mut(&mut self, path: &Path) -> Option<&mut V> {
        self.find(path).ok().map(|at| &mut self.0[at].1)
    }

    /// The stored path (shared with the objects of the file) and the value.
    pub(super) fn get_key_value(&self, path: &Path) -> Option<(&Arc<Path>, &V)> {
        self.find(path)
            .ok()
            .map(|at| (&self.0[at].0, &self.0[at].1))
    }

    /// Whether `path` has a value.
    pub(super) fn contains_key(&self, path: &Path) -> bool {
        self.find(path).is_ok()
    }

    /// Sets the value of `path` (a scan inserts in path order: at the end, without moving any).
    pub(super) fn insert(&mut self, path: Arc<Path>, value: V) {
        match self.find(&path) {
            Ok(at) => self.0[at] = (path, value),
            Err(at) => self.0.insert(at, (path, value)),
        }
    }

    /// Removes the value of `path`.
    pub(super) fn remove(&mut self, path: &Path) -> Option<V> {
        self.find(path).ok().map(|at| self.0.remove(at).1)
    }

    /// Keeps the entries `keep` says yes to.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&Arc<Path>, &mut V) -> bool) {
        self.0.retain_mut(|(path, value)| keep(path, value));
    }

    /// Gives back the spare capacity (after a full scan).
    pub(super) fn shrink_to_fit(&mut self) {
        self.0.shrink_to_fit();
    }

    /// The number of paths.
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// The entries in path order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&Arc<Path>, &V)> {
        self.0.iter().map(|(path, value)| (path, value))
    }
}

/// The objects of one file: one inline (the usual manifest), or several.
#[derive(Clone, Debug)]
pub(super) enum Objects {
    /// One object, no allocation of its own.
    One(Object),
    /// None, or more than one.
    Many(Box<[Object]>),
}

impl Objects {
    /// The objects, in file order.
    pub(super) fn as_slice(&self) -> &[Object] {
        match self {
            Objects::One(object) => std::slice::from_ref(object),
            Objects::Many(objects) => objects,
        }
    }

    /// The objects, in file order.
    pub(super) fn iter(&self) -> std::slice::Iter<'_, Object> {
        self.as_slice().iter()
    }
}

impl From<Vec<Object>> for Objects {
    fn from(mut objects: Vec<Object>) -> Objects {
        match objects.pop() {
            Some(only) if objects.is_empty() => Objects::One(only),
            Some(last) => {
                objects.push(last);
                Objects::Many(objects.into_boxed_slice())
            }
            None => Objects::Many(Box::default()),
        }
    }
}

/// Objects with the file each came from, sorted by key (kind, namespace, name), one per key.
#[derive(Debug, Default)]
pub(super) struct Emitted(Vec<(Object, Arc<Path>)>);

impl Emitted {
    fn find(&self, key: &ObjectKey) -> Result<usize, usize> {
        self.0.binary_search_by(|(object, _)| object.cmp_key(key))
    }

    /// The objects in file order (files by name), each with its file: the first file defining a
    /// key wins. Calls `duplicate(key, file, first)` for each later definition of a key, in key
    /// order.
    pub(super) fn first_of<'a>(
        files: impl Iterator<Item = (&'a Arc<Path>, &'a [Object])>,
        mut duplicate: impl FnMut(&ObjectKey, &Arc<Path>, &Arc<Path>),
    ) -> Emitted {
        let mut all: Vec<(Object, Arc<Path>)> = files
            .flat_map(|(path, objects)| objects.iter().map(|o| (o.clone(), path.clone())))
            .collect();
        // Stable: among equal keys the first file's stays first.
        all.sort_by(|(a, _), (b, _)| a.cmp_object_key(b));
        let mut winners: Vec<(Object, Arc<Path>)> = Vec::with_capacity(all.len());
        for (object, file) in all {
            match winners.last() {
                Some((first, first_file)) if first.cmp_object_key(&object) == Ordering::Equal => {
                    duplicate(&object.key(), &file, first_file);
                }
                _ => winners.push((object, file)),
            }
        }
        winners.shrink_to_fit();
        Emitted(winners)
    }

    /// The object of `key` and its file.
    pub(super) fn get(&self, key: &ObjectKey) -> Option<&(Object, Arc<Path>)> {
        self.find(key).ok().map(|at| &self.0[at])
    }

    /// The object with the key of `object`, and its file.
    pub(super) fn get_same_key(&self, object: &Object) -> Option<&(Object, Arc<Path>)> {
        let at = self.0.binary_search_by(|(o, _)| o.cmp_object_key(object));
        at.ok().map(|at| &self.0[at])
    }

    /// Sets the object of its key.
    pub(super) fn insert(&mut self, object: Object, file: Arc<Path>) {
        match self.find(&object.key()) {
            Ok(at) => self.0[at] = (object, file),
            Err(at) => self.0.insert(at, (object, file)),
        }
    }

    /// Removes the object of `key`.
    pub(super) fn remove(&mut self, key: &ObjectKey) -> Option<(Object, Arc<Path>)> {
        self.find(key).ok().map(|at| self.0.remove(at))
    }

    /// The number of objects.
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// The objects and their files, by key.
    pub(super) fn iter(&self) -> impl Iterator<Item = &(Object, Arc<Path>)> {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(namespace: &str, name: &str) -> Object {
        let yaml = format!("metadata: {{name: {name}, namespace: {namespace}}}\n");
        Object::Service(Arc::new(serde_saphyr::from_str(&yaml).expect("a Service")))
    }

    fn path(name: &str) -> Arc<Path> {
        Arc::from(Path::new(name))
    }

    #[test]
    fn path_map_keeps_path_order() {
        let mut map = PathMap::default();
        for name in ["/m/b.yaml", "/m/a.yaml", "/m/c.yaml", "/m/a.yaml"] {
            map.insert(path(name), name.len());
        }
        let order: Vec<&Path> = map.iter().map(|(p, _)| &**p).collect();
        assert_eq!(
            order,
            [
                Path::new("/m/a.yaml"),
                Path::new("/m/b.yaml"),
                Path::new("/m/c.yaml")
            ]
        );
        assert_eq!(map.remove(Path::new("/m/b.yaml")), Some(9));
        assert!(!map.contains_key(Path::new("/m/b.yaml")));
        map.retain(|p, _| !p.ends_with("c.yaml"));
        assert_eq!(map.len(), 1);
        assert!(map.get(Path::new("/m/a.yaml")).is_some());
    }

    #[test]
    fn the_first_file_defining_a_key_wins() {
        let (a, b) = (path("/m/a.yaml"), path("/m/b.yaml"));
        let in_a = [service("ns", "web"), service("ns", "api")];
        let in_b = [service("ns", "web"), service("default", "web")];
        let mut duplicates = Vec::new();
        let emitted = Emitted::first_of(
            [(&a, &in_a[..]), (&b, &in_b[..])].into_iter(),
            |key, file, first| duplicates.push((key.to_string(), file.clone(), first.clone())),
        );
        let keys: Vec<(String, &Path)> = emitted
            .iter()
            .map(|(o, f)| (o.key().to_string(), &**f))
            .collect();
        assert_eq!(
            keys,
            [
                ("Service default/web".to_owned(), &*b),
                ("Service ns/api".to_owned(), &*a),
                ("Service ns/web".to_owned(), &*a),
            ]
        );
        assert_eq!(
            duplicates,
            [("Service ns/web".to_owned(), b.clone(), a.clone())]
        );
        let key = ObjectKey::new(crate::object::Kind::Service, "ns", "web");
        assert!(emitted.get(&key).is_some_and(|(_, f)| *f == a));
    }

    #[test]
    fn emitted_objects_stay_sorted_by_key() {
        let file = path("/m/a.yaml");
        let mut emitted = Emitted::default();
        for name in ["b", "c", "a", "b"] {
            emitted.insert(service("ns", name), file.clone());
        }
        let names = |e: &Emitted| -> Vec<String> { e.iter().map(|(o, _)| o.key().name).collect() };
        assert_eq!(names(&emitted), ["a", "b", "c"]);
        let key = ObjectKey::new(crate::object::Kind::Service, "ns", "b");
        assert!(emitted.remove(&key).is_some());
        assert!(emitted.get(&key).is_none());
        assert_eq!(names(&emitted), ["a", "c"]);
    }
}
