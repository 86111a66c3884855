//! The manifest-folder source: every `*.yaml` / `*.yml` file directly in a folder (not recursive;
//! hidden files are ignored), multi-document files allowed, reloaded live on change.
//!
//! Read: `networking.k8s.io/v1` Ingress and IngressClass, `v1` Service and Secret,
//! `discovery.k8s.io/v1` EndpointSlice (and `v1` List of those). Objects without a namespace are in
//! `default`. The folder (not each file) is watched with inotify, so editors that save by writing
//! a new file and renaming it over the old one work. An event rereads the manifest files it names
//! (the folder is rescanned whole when it names a folder or a symlink, such as a ConfigMap
//! volume's `..data`, when the watch reports an error or an overflow, and when an object is
//! defined in two files); only files whose content changed are parsed again, and only those log
//! problems: once per change.
//!
//! A bad file never costs other routes: a file that does not parse keeps its last good objects;
//! a document that does not decode keeps its last good version (matched by kind, namespace and
//! name) when there is one; documents of unknown kinds are skipped with a warning.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt as _, StreamExt as _};
use inotify::{EventMask, Inotify, WatchMask};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::file_maps::{Emitted, Objects, PathMap};
use super::SourceEvent;
use crate::compact::Slice;
use crate::index::{Change, Object};
use crate::object::{Kind, ObjectKey};
use crate::stored::StoredIngress;

/// How long to wait after a file event for more events before rescanning (an editor's save is
/// often several events).
const SETTLE: Duration = Duration::from_millis(20);

/// A folder that cannot be read or watched.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    /// The folder cannot be listed.
    #[error("cannot read manifest folder {}: {source}", dir.display())]
    ReadDir {
        /// The folder.
        dir: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// The folder cannot be watched.
    #[error("cannot watch manifest folder {}: {source}", dir.display())]
    Watch {
        /// The folder.
        dir: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
}

/// One thing wrong in a manifest file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The object concerned (`Deployment default/web`, `document 3`), or `None` for the file as a
    /// whole.
    pub object: Option<String>,
    /// What is wrong and what was done about it.
    pub error: String,
}

/// What parsing one file produced.
#[derive(Clone, Debug, Default)]
pub struct Parsed {
    /// The objects to serve from the file.
    pub objects: Vec<Object>,
    /// What was wrong.
    pub problems: Vec<Problem>,
}

/// Parses one manifest file's text. `previous` holds the objects the file had at its last parse:
/// they are kept when the file does not parse at all, and per object when a document does not
/// decode.
pub fn parse(text: &str, previous: &[Object]) -> Parsed {
    let options = serde_saphyr::options! {
        with_snippet: false,
        budget: Some(super::yaml_fast::budget_for(text)),
    };
    // The plainest manifests are read without the parser's tokens and events (yaml_lite), the
    // rest by the parser (yaml_fast), and what that leaves by serde-saphyr itself.
    let read = match super::yaml_lite::documents(text).or_else(|| super::yaml_fast::documents(text))
    {
        Some(docs) => Ok(docs),
        None => serde_saphyr::from_multiple_with_options(text, options),
    };
    let documents: Vec<Value> = match read {
        Ok(docs) => docs,
        Err(error) => {
            return Parsed {
                objects: previous.to_vec(),
                problems: vec![Problem {
                    object: None,
                    error: format!(
                        "not valid YAML ({}); keeping the file's last good objects",
                        one_line(&error.to_string())
                    ),
                }],
            };
        }
    };
    let mut parsed = Parsed::default();
    let mut items = Vec::new();
    for (n, doc) in documents.into_iter().enumerate() {
        let is_list = doc.get("apiVersion").and_then(Value::as_str) == Some("v1")
            && doc.get("kind").and_then(Value::as_str) == Some("List");
        if is_list {
            let mut doc = doc;
            match doc.get_mut("items").map(Value::take) {
                Some(Value::Array(list)) => items.extend(list.into_iter().map(|i| (n + 1, i))),
                _ => parsed.problems.push(Problem {
                    object: Some(format!("document {}", n + 1)),
                    error: "a List without items; skipped".to_owned(),
                }),
            }
        } else if !doc.is_null() {
            items.push((n + 1, doc));
        }
    }
    // The keys seen, for the duplicate check (a scan of the objects so far made a List of
    // 20,000 EndpointSlices 200 million comparisons).
    let mut seen = std::collections::HashSet::with_capacity(items.len());
    // Decoded from a reference, the tree freed whole at the end: see `decode`.
    for (n, doc) in &mut items {
        let n = *n;
        match decode(doc) {
            Ok(object) => {
                let key = object.key();
                if !seen.insert(key.clone()) {
                    parsed.problems.push(Problem {
                        object: Some(key.to_string()),
                        error: "defined twice in this file; the first definition is used"
                            .to_owned(),
                    });
                } else {
                    parsed.objects.push(object);
                }
            }
            Err(failure) => keep_or_skip(&mut parsed, failure, previous, n),
        }
    }
    let documents = items.len();
    drop(items);
    if documents > 1 {
        parsed.objects = parsed.objects.iter().map(reallocated).collect();
    }
    parsed
}

/// A copy of `object` in memory of its own (not shared with the original's `Arc`). A file's
/// tree is allocated in the holes the kept objects of the files before it left, and the
/// objects decoded amid it hold its pages once it is freed; copied after, they fill the oldest
/// free slots together and its pages go back to the kernel (RSS 106 -> 97 MiB for 50 files of
/// 800 documents).
fn reallocated(object: &Object) -> Object {
    fn copy<T: Clone>(object: &Arc<T>) -> Arc<T> {
        Arc::new(T::clone(object))
    }
    match object {
        Object::Ingress(o) => Object::Ingress(copy(o)),
        Object::IngressClass(o) => Object::IngressClass(copy(o)),
        Object::Service(o) => Object::Service(copy(o)),
        Object::EndpointSlice(o) => Object::EndpointSlice(copy(o)),
        Object::Secret(o) => Object::Secret(copy(o)),
        Object::Namespace(o) => Object::Namespace(copy(o)),
        Object::GatewayClass(o) => Object::GatewayClass(copy(o)),
        Object::Gateway(o) => Object::Gateway(copy(o)),
        Object::HttpRoute(o) => Object::HttpRoute(copy(o)),
        Object::GrpcRoute(o) => Object::GrpcRoute(copy(o)),
        Object::TlsRoute(o) => Object::TlsRoute(copy(o)),
        Object::ReferenceGrant(o) => Object::ReferenceGrant(copy(o)),
        Object::ListenerSet(o) => Object::ListenerSet(copy(o)),
        Object::BackendTlsPolicy(o) => Object::BackendTlsPolicy(copy(o)),
        Object::ConfigMap(o) => Object::ConfigMap(copy(o)),
    }
}

/// A document that did not decode: its problem, and the object's last good version kept when
/// the failure allows it (a known object whose content is invalid).
fn keep_or_skip(parsed: &mut Parsed, failure: DecodeFailure, previous: &[Object], n: usize) {
    let kept = failure
        .key
        .as_ref()
        .and_then(|k| previous.iter().find(|o| &o.key() == k))
        .filter(|_| failure.keep_previous);
    let what = failure
        .key
        .as_ref()
        .map(ObjectKey::to_string)
        .or(failure.described)
        .unwrap_or_else(|| format!("document {n}"));
    let error = match kept {
        Some(old) => {
            parsed.objects.push(old.clone());
            format!("{}; keeping its last good version", failure.error)
        }
        None => format!("{}; skipped", failure.error),
    };
    parsed.problems.push(Problem {
        object: Some(what),
        error,
    });
}

struct DecodeFailure {
    key: Option<ObjectKey>,
    described: Option<String>,
    keep_previous: bool,
    error: String,
}

/// The kind and key of a document: `apiVersion`, `kind` and `metadata.name` required,
/// `metadata.namespace` defaulting to `default` for namespaced kinds (and written back so the
/// typed object has it) and dropped for cluster-wide ones.
fn identify(doc: &mut Value) -> Result<(Kind, ObjectKey), DecodeFailure> {
    let api_version = doc
        .get("apiVersion")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let kind_name = doc.get("kind").and_then(Value::as_str).map(str::to_owned);
    // `get` twice, not `pointer`: it unescapes each segment into two new strings (320,000 of
    // them for the 10k-Ingress scale folder).
    let metadata = |field: &str| doc.get("metadata")?.get(field)?.as_str();
    let name = metadata("name").map(str::to_owned);
    let namespace = metadata("namespace").unwrap_or("default").to_owned();
    let (Some(api_version), Some(kind_name)) = (api_version, kind_name) else {
        return Err(DecodeFailure {
            key: None,
            described: None,
            keep_previous: false,
            error: "not a Kubernetes object (apiVersion and kind are required)".to_owned(),
        });
    };
    let Some(kind) = Kind::from_type(&api_version, &kind_name) else {
        return Err(DecodeFailure {
            key: None,
            described: Some(match &name {
                Some(name) => format!("{kind_name} {namespace}/{name}"),
                None => kind_name.clone(),
            }),
            keep_previous: false,
            error: format!("unsupported kind {kind_name} of {api_version}"),
        });
    };
    let Some(name) = name.filter(|n| !n.is_empty()) else {
        return Err(DecodeFailure {
            key: None,
            described: Some(kind.to_string()),
            keep_previous: false,
            error: "metadata.name is missing".to_owned(),
        });
    };
    let key = ObjectKey::new(
        kind,
        if kind.namespaced() {
            namespace.as_str()
        } else {
            ""
        },
        name,
    );
    if let Some(meta) = doc.get_mut("metadata").and_then(Value::as_object_mut) {
        if kind.namespaced() {
            meta.insert("namespace".to_owned(), Value::String(namespace));
        } else {
            meta.remove("namespace");
        }
    }
    Ok((kind, key))
}

/// Annotations translation never reads that exported manifests carry on every object: kubectl's
/// copy of what was applied, a JSON text about as long as the object itself (a sixth of the
/// memory 10,000 exported Ingresses were kept in).
const UNREAD_ANNOTATIONS: &[&str] = &["kubectl.kubernetes.io/last-applied-configuration"];

/// Decodes one document; its `metadata` is amended in place. Borrowed, not taken: decoding the
/// items of a `List` out of its tree by value freed the tree item by item, and the objects kept
/// landed in its holes, scattered over its pages (a `List` of 20,000 EndpointSlices, a 76 MB
/// file, left 266 MiB resident); [`parse`] frees the tree whole after the last item.
fn decode(doc: &mut Value) -> Result<Object, DecodeFailure> {
    let (kind, key) = identify(doc)?;
    if let Some(annotations) = doc
        .get_mut("metadata")
        .and_then(|m| m.get_mut("annotations"))
        .and_then(Value::as_object_mut)
    {
        for name in UNREAD_ANNOTATIONS {
            annotations.remove(*name);
        }
    }
    let failed = |e: serde_json::Error| DecodeFailure {
        key: Some(key.clone()),
        described: None,
        keep_previous: true,
        error: format!("invalid {kind}: {e}"),
    };
    Ok(match kind {
        Kind::Ingress => Object::Ingress(Arc::new(from::<StoredIngress>(doc).map_err(failed)?)),
        Kind::IngressClass => Object::IngressClass(Arc::new(from(doc).map_err(failed)?)),
        Kind::Service => Object::Service(Arc::new(from(doc).map_err(failed)?)),
        Kind::EndpointSlice => Object::EndpointSlice(Arc::new(from::<Slice>(doc).map_err(failed)?)),
        Kind::Secret => Object::Secret(Arc::new(from(doc).map_err(failed)?)),
        Kind::Namespace => Object::Namespace(Arc::new(from(doc).map_err(failed)?)),
        Kind::GatewayClass => Object::GatewayClass(Arc::new(from(doc).map_err(failed)?)),
        Kind::Gateway => Object::Gateway(Arc::new(from(doc).map_err(failed)?)),
        Kind::HttpRoute => Object::HttpRoute(Arc::new(from(doc).map_err(failed)?)),
        Kind::GrpcRoute => Object::GrpcRoute(Arc::new(from(doc).map_err(failed)?)),
        Kind::TlsRoute => Object::TlsRoute(Arc::new(from(doc).map_err(failed)?)),
        Kind::ReferenceGrant => Object::ReferenceGrant(Arc::new(from(doc).map_err(failed)?)),
        Kind::ListenerSet => Object::ListenerSet(Arc::new(from(doc).map_err(failed)?)),
        Kind::BackendTlsPolicy => Object::BackendTlsPolicy(Arc::new(from(doc).map_err(failed)?)),
        Kind::ConfigMap => Object::ConfigMap(Arc::new(from(doc).map_err(failed)?)),
    })
}

/// The typed object of a document, its strings copied out of the tree.
fn from<T: serde::de::DeserializeOwned>(doc: &Value) -> Result<T, serde_json::Error> {
    T::deserialize(doc)
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether a file name is a manifest: `*.yaml` or `*.yml`, not hidden.
pub fn is_manifest(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    !name.starts_with('.')
        && path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e == "yaml" || e == "yml")
}

/// What is remembered of a file between scans: not its text (at 40,000 files that is tens of
/// megabytes), only what tells whether it changed, and its objects. (Its path is the key of
/// [`FileSource::files`], shared with every object it defines.)
#[derive(Debug)]
struct FileState {
    /// Its metadata at the last read, when old enough to be trusted (see [`Stamp::of`]).
    stamp: Option<Stamp>,
    /// Its length and a keyed hash of its content.
    digest: (usize, u64),
    objects: Objects,
}

/// A digest of a file's inode, size, modification and change times: when it is as at the last
/// read, the file is not read again. 8 bytes kept per file, where the four are 48 (2 MB at
/// 40,000 files); two different stamps have the same digest once in 2^63 (as two different
/// contents have the same content digest).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp(std::num::NonZeroU64);

impl Stamp {
    /// The stamp of `meta`, or `None` when the file was modified less than [`RACY`] before
    /// `scan_started`: a write in the same clock tick could leave the times as they are, so such a
    /// file is read (and its content compared) again at the next scan.
    fn of(meta: &std::fs::Metadata, scan_started: std::time::SystemTime) -> Option<Stamp> {
        use std::hash::{Hash as _, Hasher as _};
        use std::os::unix::fs::MetadataExt as _;
        let modified = meta.modified().ok()?;
        if modified + RACY > scan_started {
            return None;
        }
        let mut digest = std::hash::DefaultHasher::new();
        (meta.ino(), meta.len(), modified).hash(&mut digest);
        (meta.ctime(), meta.ctime_nsec()).hash(&mut digest);
        let digest = std::num::NonZeroU64::new(digest.finish() | 1);
        Some(Stamp(digest.unwrap_or(std::num::NonZeroU64::MIN)))
    }
}

/// How much older than a scan a file's modification time must be for its stamp to be trusted.
const RACY: Duration = Duration::from_secs(2);

/// The state of a manifest folder between scans.
#[derive(Debug)]
pub struct FileSource {
    dir: PathBuf,
    files: PathMap<FileState>,
    emitted: Emitted,
    /// Whether the last full union found an object defined in two files: a rescan of some paths
    /// then redoes the whole union (which file wins depends on every file).
    duplicates: bool,
    /// Keys the content digests (random per process: a file cannot be crafted to collide).
    hasher: std::hash::RandomState,
}

impl FileSource {
    /// A source over a folder; nothing is read until [`FileSource::scan`].
    pub fn new(dir: impl Into<PathBuf>) -> FileSource {
        FileSource {
            dir: dir.into(),
            files: PathMap::default(),
            emitted: Emitted::default(),
            duplicates: false,
            hasher: std::hash::RandomState::new(),
        }
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reads the folder again and returns the changes since the last scan. Files whose inode,
    /// size and times are unchanged are not read, files whose content is unchanged are not
    /// parsed; problems in changed files are logged (warn), once.
    pub fn scan(&mut self) -> Result<Vec<Change>, FilesError> {
        let started = std::time::SystemTime::now();
        let present = self.list()?;
        let before = self.files.len();
        self.files.retain(|path, _| {
            // `present` is sorted: a linear `contains` here made a rescan quadratic (77 s at
            // 40,000 files, benches/load/scale.sh).
            let keep = present.binary_search_by(|p| p.as_path().cmp(path)).is_ok();
            if !keep {
                tracing::info!(file = %path.display(), "Manifest removed");
            }
            keep
        });
        let removed = self.files.len() != before;
        // Each file's `stat` (is it as at the last read?) is made by the thread that reads it:
        // on the first scan of a large folder, 40,001 of them do not wait in one thread before
        // the reads start.
        let (files, hasher) = (&self.files, &self.hasher);
        let reads = in_parallel(present.len(), |n| {
            read_if_stale(&present[n], files.get(&present[n]), hasher, started)
        });
        let mut changed = Vec::new();
        for (path, (stamp, read)) in present.iter().zip(reads) {
            if self.record(path, stamp, read) {
                changed.push(path.to_owned());
            }
        }
        if changed.is_empty() && !removed {
            return Ok(Vec::new());
        }
        let wanted = self.union(&changed);
        Ok(self.changes_to(wanted))
    }

    /// Reads again only `paths` (those of watch events) and returns the changes since the last
    /// scan, as [`FileSource::scan`] would; a full scan when a path may stand for more than one
    /// file (a folder, a symlink such as a ConfigMap volume's `..data`, a path outside the
    /// folder) or when an object is defined in two files.
    pub fn scan_paths(&mut self, paths: &[PathBuf]) -> Result<Vec<Change>, FilesError> {
        let mut manifests: Vec<&Path> = Vec::new();
        for path in paths {
            match self.event_path(path) {
                EventPath::Manifest => manifests.push(path),
                EventPath::Ignored => {}
                EventPath::Rescan => return self.scan(),
            }
        }
        manifests.sort();
        manifests.dedup();
        let started = std::time::SystemTime::now();
        let mut touched: Vec<(PathBuf, Vec<ObjectKey>)> = Vec::new();
        let mut stale: Vec<(&Path, Option<Stamp>)> = Vec::new();
        for path in manifests {
            let old_keys = self
                .files
                .get(path)
                .map(|f| f.objects.iter().map(Object::key).collect());
            if !path.is_file() {
                if self.files.remove(path).is_some() {
                    tracing::info!(file = %path.display(), "Manifest removed");
                    touched.push((path.to_owned(), old_keys.unwrap_or_default()));
                }
                continue;
            }
            if let Some(entry) = self.stale(path, started) {
                stale.push(entry);
                touched.push((path.to_owned(), old_keys.unwrap_or_default()));
            }
        }
        let (files, hasher) = (&self.files, &self.hasher);
        let reads = in_parallel(stale.len(), |n| {
            read_one(stale[n].0, files.get(stale[n].0), hasher)
        });
        let mut changed = Vec::new();
        for ((path, stamp), read) in stale.into_iter().zip(reads) {
            let gone = matches!(read, Read::Gone);
            if self.record(path, stamp, read) || gone {
                changed.push(path.to_owned());
            }
        }
        touched
            .retain(|(path, _)| changed.contains(path) || !self.files.contains_key(path.as_path()));
        if touched.is_empty() {
            return Ok(Vec::new());
        }
        if self.duplicates {
            let changed: Vec<PathBuf> = touched.into_iter().map(|(p, _)| p).collect();
            let wanted = self.union(&changed);
            return Ok(self.changes_to(wanted));
        }
        match self.changes_of(&touched) {
            Some(changes) => Ok(changes),
            None => {
                let changed: Vec<PathBuf> = touched.into_iter().map(|(p, _)| p).collect();
                let wanted = self.union(&changed);
                Ok(self.changes_to(wanted))
            }
        }
    }

    /// What a watch event's path means for [`FileSource::scan_paths`].
    fn event_path(&self, path: &Path) -> EventPath {
        if path.parent() != Some(self.dir.as_path()) {
            return EventPath::Rescan;
        }
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("..");
        let link_or_dir =
            std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink() || m.is_dir());
        if name.starts_with("..") || link_or_dir {
            return EventPath::Rescan;
        }
        if is_manifest(path) {
            EventPath::Manifest
        } else {
            EventPath::Ignored
        }
    }

    /// The changes from the files `touched` (each with the keys it defined before), read again
    /// and defining no object another file defines; `None` when one does (the caller then
    /// redoes the whole union).
    fn changes_of(&mut self, touched: &[(PathBuf, Vec<ObjectKey>)]) -> Option<Vec<Change>> {
        let mut wanted: BTreeMap<ObjectKey, (Object, Arc<Path>)> = BTreeMap::new();
        for (path, _) in touched {
            let Some((file, state)) = self.files.get_key_value(path.as_path()) else {
                continue;
            };
            for object in state.objects.iter() {
                let key = object.key();
                let elsewhere = self.emitted.get(&key).is_some_and(|(_, f)| {
                    **f != **path && !touched.iter().any(|(t, _)| **f == **t)
                });
                if elsewhere || wanted.contains_key(&key) {
                    return None;
                }
                wanted.insert(key, (object.clone(), file.clone()));
            }
        }
        let mut changes = Vec::new();
        for (_, old_keys) in touched {
            for key in old_keys {
                if !wanted.contains_key(key) && self.emitted.remove(key).is_some() {
                    changes.push(Change::Delete(key.clone()));
                }
            }
        }
        for (key, (object, file)) in wanted {
            let same = self
                .emitted
                .get(&key)
                .is_some_and(|(o, f)| *f == file && (o.same_arc(&object) || *o == object));
            if !same {
                changes.push(Change::Apply {
                    object: object.clone(),
                    file: Some(file.clone()),
                });
                self.emitted.insert(object, file);
            }
        }
        Some(changes)
    }

    /// The manifest files in the folder, sorted.
    fn list(&self) -> Result<Vec<PathBuf>, FilesError> {
        let read_dir = |source| FilesError::ReadDir {
            dir: self.dir.clone(),
            source,
        };
        let mut present: Vec<PathBuf> = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(read_dir)? {
            let entry = entry.map_err(read_dir)?;
            let path = entry.path();
            // Follows symlinks (ConfigMap volumes are symlinks to a hidden folder); a regular
            // file is known from the listing itself, without a `stat` (40,001 at the 10k-Ingress
            // size, before the reads start).
            let is_file = match entry.file_type() {
                Ok(kind) if kind.is_file() => true,
                Ok(kind) if !kind.is_symlink() => false,
                _ => path.is_file(),
            };
            if is_manifest(&path) && is_file {
                present.push(path);
            }
        }
        // All in one folder (`dir/name`): sorted by the whole path's bytes, which orders as the
        // names do. Not by `Path` (its comparison goes component by component) nor by
        // `file_name()` (which parses the path from its end at every comparison: 3 % of the
        // start's instructions at the 10k-Ingress size, on the thread before the reads begin).
        present.sort_unstable_by(|a, b| a.as_os_str().cmp(b.as_os_str()));
        Ok(present)
    }

    /// `path` with its current [`Stamp`], unless the stamp is as at the last read (the file is
    /// then not read again).
    fn stale<'p>(
        &self,
        path: &'p Path,
        scan_started: std::time::SystemTime,
    ) -> Option<(&'p Path, Option<Stamp>)> {
        let meta = std::fs::metadata(path).ok();
        let stamp = meta.as_ref().and_then(|m| Stamp::of(m, scan_started));
        if let (Some(state), Some(stamp)) = (self.files.get(path), stamp) {
            if state.stamp == Some(stamp) {
                return None;
            }
        }
        Some((path, stamp))
    }

    /// Records what reading `path` gave; whether its objects changed.
    fn record(&mut self, path: &Path, stamp: Option<Stamp>, read: Read) -> bool {
        let (digest, parsed) = match read {
            Read::Gone => {
                // Gone between listing and reading: the next event rescans.
                self.files.remove(path);
                return false;
            }
            Read::Failed(error) => {
                if self.files.get(path).is_none_or(|f| f.digest.0 != 0) {
                    tracing::warn!(file = %path.display(), %error, "Cannot read manifest; keeping its last good objects");
                }
                return false;
            }
            Read::Unchanged => return false,
            Read::Same => {
                if let Some(state) = self.files.get_mut(path) {
                    state.stamp = stamp;
                }
                return false;
            }
            Read::Parsed(digest, parsed) => (digest, parsed),
        };
        log_problems(path, &parsed.problems);
        tracing::debug!(file = %path.display(), objects = parsed.objects.len(), "Manifest read");
        let shared = match self.files.get_key_value(path) {
            Some((file, _)) => file.clone(),
            None => Arc::from(path),
        };
        self.files.insert(
            shared,
            FileState {
                stamp,
                digest,
                objects: parsed.objects.into(),
            },
        );
        true
    }

    /// The union over files; the first file (by name) defining an object wins. A second
    /// definition is logged when either file is among the `changed` ones.
    fn union(&mut self, changed: &[PathBuf]) -> Emitted {
        let mut duplicates = false;
        let files = self
            .files
            .iter()
            .map(|(path, state)| (path, state.objects.as_slice()));
        let wanted = Emitted::first_of(files, |key, path, first| {
            duplicates = true;
            if changed.iter().any(|c| **c == **path || **c == **first) {
                tracing::warn!(
                    file = %path.display(),
                    object = %key,
                    first = %first.display(),
                    "Object defined in two manifests; the first file's definition is used"
                );
            }
        });
        self.duplicates = duplicates;
        wanted
    }

    /// The changes from what was last emitted to `wanted`, which is emitted from now on.
    fn changes_to(&mut self, wanted: Emitted) -> Vec<Change> {
        let mut changes = Vec::new();
        for (object, _) in self.emitted.iter() {
            if wanted.get_same_key(object).is_none() {
                changes.push(Change::Delete(object.key()));
            }
        }
        for (object, file) in wanted.iter() {
            // Objects of files not parsed again are the same `Arc`s: compared by pointer first.
            let same = self
                .emitted
                .get_same_key(object)
                .is_some_and(|(o, f)| f == file && (o.same_arc(object) || o == object));
            if !same {
                changes.push(Change::Apply {
                    object: object.clone(),
                    file: Some(file.clone()),
                });
            }
        }
        self.emitted = wanted;
        // A full scan grew the files map one insert at a time (up to twice the space it needs).
        self.files.shrink_to_fit();
        changes
    }
}

/// What a watch event's path means.
enum EventPath {
    /// A manifest file directly in the folder: read it again.
    Manifest,
    /// Not a manifest (a hidden temporary file, a README): nothing to read.
    Ignored,
    /// A folder, a symlink or a path elsewhere: rescan the whole folder.
    Rescan,
}

/// What reading one file gave.
enum Read {
    /// The file is gone.
    Gone,
    /// It cannot be read.
    Failed(io::Error),
    /// Its stamp is as at the last read: not read again.
    Unchanged,
    /// Its content is as at the last read.
    Same,
    /// Its new content's digest and what it parsed to.
    Parsed((usize, u64), Parsed),
}

/// `work(n)` for every `n` below `count`, on as many threads as there are cores (from
/// [`MIN_FILES_PER_THREAD`] items per thread); the results in the order of `n`. Each thread takes
/// the next [`CHUNK`] items when it is done with its last ones, so a thread the machine delays
/// (or one given the larger files) leaves the rest to the others instead of finishing alone.
fn in_parallel<T: Send>(count: usize, work: impl Fn(usize) -> T + Sync) -> Vec<T> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let threads = std::thread::available_parallelism()
        .map_or(1, std::num::NonZero::get)
        .min(count.div_ceil(MIN_FILES_PER_THREAD));
    if threads <= 1 {
        return (0..count).map(work).collect();
    }
    let taken = AtomicUsize::new(0);
    let mut all: Vec<(usize, T)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let (work, taken) = (&work, &taken);
                scope.spawn(move || {
                    let mut done = Vec::with_capacity(count / threads + CHUNK);
                    loop {
                        let from = taken.fetch_add(CHUNK, Ordering::Relaxed);
                        if from >= count {
                            return done;
                        }
                        done.extend((from..count.min(from + CHUNK)).map(|n| (n, work(n))));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    all.sort_unstable_by_key(|(n, _)| *n);
    all.into_iter().map(|(_, item)| item).collect()
}

/// How many items a thread of [`in_parallel`] takes at a time.
const CHUNK: usize = 16;

/// Below this many files per thread, a scan reads on one thread.
const MIN_FILES_PER_THREAD: usize = 64;

/// `path`'s current [`Stamp`] and, unless the stamp is as at the last read ([`Read::Unchanged`]:
/// not read again), what reading it gives (see [`FileSource::stale`], the same test for one path).
fn read_if_stale(
    path: &Path,
    known: Option<&FileState>,
    hasher: &std::hash::RandomState,
    scan_started: std::time::SystemTime,
) -> (Option<Stamp>, Read) {
    let meta = std::fs::metadata(path).ok();
    let stamp = meta.as_ref().and_then(|m| Stamp::of(m, scan_started));
    if let (Some(state), Some(stamp)) = (known, stamp) {
        if state.stamp == Some(stamp) {
            return (Some(stamp), Read::Unchanged);
        }
    }
    (stamp, read_one(path, known, hasher))
}

/// Reads one file; parses it when its content differs from `known`'s.
fn read_one(path: &Path, known: Option<&FileState>, hasher: &std::hash::RandomState) -> Read {
    let content = match std::fs::read(path) {
        Ok(content) => content,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Read::Gone,
        Err(error) => return Read::Failed(error),
    };
    let digest = (
        content.len(),
        std::hash::BuildHasher::hash_one(hasher, &content),
    );
    if known.is_some_and(|state| state.digest == digest) {
        return Read::Same;
    }
    let previous = known.map(|f| f.objects.as_slice()).unwrap_or_default();
    let parsed = match std::str::from_utf8(&content) {
        Ok(text) => parse(text, previous),
        Err(_) => Parsed {
            objects: previous.to_vec(),
            problems: vec![Problem {
                object: None,
                error: "not UTF-8 text; keeping the file's last good objects".to_owned(),
            }],
        },
    };
    Read::Parsed(digest, parsed)
}

/// Logs the problems of one manifest file (warn).
fn log_problems(path: &Path, problems: &[Problem]) {
    for problem in problems {
        match &problem.object {
            Some(object) => tracing::warn!(
                file = %path.display(),
                object = %object,
                error = %problem.error,
                "Manifest object skipped"
            ),
            None => tracing::warn!(
                file = %path.display(),
                error = %problem.error,
                "Manifest skipped"
            ),
        }
    }
}

/// What the folder's watch asks for: only the events a change makes. Opening, reading and
/// closing a file unwritten are left out: with `IN_OPEN` watched too, each of duet's own 40,001
/// opens at the 10k-Ingress size would wake its thread with an event to drop, about 10 % of the
/// start's CPU.
const WATCH_MASK: WatchMask = WatchMask::ATTRIB
    .union(WatchMask::CREATE)
    .union(WatchMask::DELETE)
    .union(WatchMask::CLOSE_WRITE)
    .union(WatchMask::MODIFY)
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::DELETE_SELF)
    .union(WatchMask::MOVE_SELF);

/// What the events read so far ask for: the paths they name, or `None`: rescan the whole
/// folder (an event on the folder itself, the kernel's queue overflowed, a read error).
type Touched = Option<Vec<PathBuf>>;

/// An inotify watch of one folder, read on the Tokio reactor (no thread of its own).
struct FolderWatch {
    events: inotify::EventStream<Box<[u8]>>,
    dir: PathBuf,
}

impl FolderWatch {
    /// Watches `dir`; events from now on are queued by the kernel until read. Must be called
    /// within a Tokio runtime.
    fn new(dir: &Path) -> io::Result<FolderWatch> {
        let inotify = Inotify::init()?;
        inotify.watches().add(dir, WATCH_MASK)?;
        Ok(FolderWatch {
            // Room for many events (each is 16 bytes and its name, at most 256).
            events: inotify.into_event_stream(vec![0; 16 * 1024].into_boxed_slice())?,
            dir: dir.to_owned(),
        })
    }

    /// Waits for an event and returns what it asks for; `None` when the watch has ended.
    async fn next(&mut self) -> Option<Touched> {
        let mut touched = Some(Vec::new());
        let event = self.events.next().await?;
        self.add(event, &mut touched);
        Some(touched)
    }

    /// Adds what the events queued now ask for to `touched`, without waiting.
    fn more(&mut self, touched: &mut Touched) {
        while let Some(Some(event)) = self.events.next().now_or_never() {
            self.add(event, touched);
        }
    }

    fn add(&self, event: io::Result<inotify::EventOwned>, touched: &mut Touched) {
        match (event, touched.as_mut()) {
            (Ok(event), Some(paths)) if !event.mask.contains(EventMask::Q_OVERFLOW) => {
                match event.name {
                    Some(name) => paths.push(self.dir.join(name)),
                    // An event on the folder itself (moved, deleted).
                    None => *touched = None,
                }
            }
            (Ok(_), _) => *touched = None,
            (Err(error), _) => {
                tracing::warn!(%error, "Manifest folder watch error; rescanning");
                *touched = None;
            }
        }
    }
}

/// Starts the folder source: scans the folder, sends its objects and [`SourceEvent::Synced`],
/// then watches the folder and sends the changes of every rescan. Fails when the folder cannot
/// be read or watched at start; later read errors are logged and the last state kept. The task
/// ends when the receiver is dropped. Must be called within a Tokio runtime.
pub fn spawn(dir: PathBuf, tx: mpsc::Sender<SourceEvent>) -> Result<JoinHandle<()>, FilesError> {
    // Watch first, then scan: nothing written in between is missed (the kernel queues its
    // events; duet's own reads make none).
    let mut watch = FolderWatch::new(&dir).map_err(|source| FilesError::Watch {
        dir: dir.clone(),
        source,
    })?;
    let mut source = FileSource::new(dir);
    let initial = source.scan()?;
    tracing::info!(dir = %source.dir().display(), objects = source.emitted.len(), "Manifest folder read");
    Ok(tokio::spawn(async move {
        if tx.send(SourceEvent::Changes(initial)).await.is_err()
            || tx.send(SourceEvent::Synced).await.is_err()
        {
            return;
        }
        loop {
            let Some(mut touched) = watch.next().await else {
                tracing::warn!("Manifest folder watch ended; no more live changes");
                return;
            };
            tokio::time::sleep(SETTLE).await;
            watch.more(&mut touched);
            let scanned;
            (source, scanned) = match scan_off_runtime(source, touched).await {
                Ok(done) => done,
                Err(error) => {
                    tracing::error!(%error, "Manifest folder rescan failed; no more live changes");
                    return;
                }
            };
            match scanned {
                Ok(changes) if changes.is_empty() => {}
                Ok(changes) => {
                    if tx.send(SourceEvent::Changes(changes)).await.is_err() {
                        return;
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "Cannot rescan manifest folder; keeping the last state");
                }
            }
        }
    }))
}

/// Rescans what `touched` names (the whole folder when `None`) on Tokio's blocking threads: a
/// large file takes seconds to parse, which on a runtime worker would stall the requests it
/// serves. Gives the source back with the result.
async fn scan_off_runtime(
    mut source: FileSource,
    touched: Touched,
) -> Result<(FileSource, Result<Vec<Change>, FilesError>), tokio::task::JoinError> {
    tokio::task::spawn_blocking(move || {
        let scanned = match &touched {
            Some(paths) => source.scan_paths(paths),
            None => source.scan(),
        };
        (source, scanned)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = r#"
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  ports:
    - port: 80
      name: http
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: duet
  namespace: ignored
spec:
  controller: duet.dev/ingress-controller
"#;

    #[test]
    fn multi_document_with_defaults() {
        let parsed = parse(TWO, &[]);
        assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
        let keys: Vec<String> = parsed.objects.iter().map(|o| o.key().to_string()).collect();
        assert_eq!(keys, ["Service default/web", "IngressClass duet"]);
    }

    #[test]
    fn unknown_kind_is_skipped_with_a_problem() {
        let text =
            format!("{TWO}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: api\n");
        let parsed = parse(&text, &[]);
        assert_eq!(parsed.objects.len(), 2);
        assert_eq!(parsed.problems.len(), 1);
        assert_eq!(
            parsed.problems[0].object.as_deref(),
            Some("Deployment default/api")
        );
        assert!(parsed.problems[0]
            .error
            .contains("unsupported kind Deployment"));
    }

    #[test]
    fn broken_yaml_keeps_previous_objects() {
        let good = parse(TWO, &[]).objects;
        let parsed = parse("apiVersion: v1\nkind: [unclosed\n", &good);
        assert_eq!(parsed.objects, good);
        assert_eq!(parsed.problems.len(), 1);
        assert!(parsed.problems[0].object.is_none());
        assert!(!parsed.problems[0].error.contains('\n'));
    }

    #[test]
    fn undecodable_object_keeps_its_last_good_version() {
        let good = parse(TWO, &[]).objects;
        let broken = TWO.replace("- port: 80", "- port: eighty");
        let parsed = parse(&broken, &good);
        assert_eq!(parsed.objects.len(), 2);
        assert_eq!(parsed.objects[0], good[0]);
        assert_eq!(parsed.problems.len(), 1);
        assert_eq!(
            parsed.problems[0].object.as_deref(),
            Some("Service default/web")
        );
        assert!(parsed.problems[0].error.contains("last good version"));
        // Without a previous version it is skipped.
        let fresh = parse(&broken, &[]);
        assert_eq!(fresh.objects.len(), 1);
    }

    #[test]
    fn lists_are_flattened() {
        let text = r#"
apiVersion: v1
kind: List
items:
  - apiVersion: v1
    kind: Secret
    metadata: {name: a, namespace: x}
  - apiVersion: v1
    kind: Secret
    metadata: {name: b}
"#;
        let parsed = parse(text, &[]);
        let keys: Vec<String> = parsed.objects.iter().map(|o| o.key().to_string()).collect();
        assert_eq!(keys, ["Secret x/a", "Secret default/b"]);
    }

    /// What `kubectl get endpointslices -A -o yaml > slices.yaml` gives for a large cluster: one
    /// `List` document of 300,000 YAML nodes (serde-saphyr's default budget allows 250,000) and
    /// a second document of 1,500 more (its default allows 1,024 documents).
    #[test]
    fn a_large_exported_list_and_many_documents_are_read_whole() {
        let endpoint = "  - addresses:\n    - 10.1.2.3\n    conditions:\n      ready: true\n      serving: true\n    nodeName: node-1\n";
        let items: String = (0..2_000)
            .map(|i| {
                format!(
                    "- apiVersion: discovery.k8s.io/v1\n  kind: EndpointSlice\n  metadata:\n    name: web-{i}\n    namespace: shop\n    labels:\n      kubernetes.io/service-name: web\n  addressType: IPv4\n  ports:\n  - name: http\n    port: 8080\n  endpoints:\n{}",
                    endpoint.repeat(15)
                )
            })
            .collect();
        let list = format!("apiVersion: v1\nkind: List\nitems:\n{items}");
        let many: Vec<String> = (0..1_500).map(|i| secret(&format!("s{i}"), "")).collect();
        let text = format!("{list}---\n{}", many.join("---\n"));
        let parsed = parse(&text, &[]);
        assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
        assert_eq!(parsed.objects.len(), 3_500);
        let Object::EndpointSlice(last) = &parsed.objects[1_999] else {
            panic!("not a slice: {:?}", parsed.objects[1_999].key());
        };
        assert_eq!(
            parsed.objects[1_999].key().to_string(),
            "EndpointSlice shop/web-1999"
        );
        let mut endpoints = 0;
        crate::compact::SliceView::for_each_endpoint(&**last, &mut |_| endpoints += 1);
        assert_eq!(endpoints, 15);
    }

    #[test]
    fn an_object_defined_twice_in_a_list_keeps_the_first() {
        let text = format!(
            "apiVersion: v1\nkind: List\nitems:\n{}",
            [secret("a", "1"), secret("b", "2"), secret("a", "3")]
                .iter()
                .map(|s| format!("- {}", s.trim_end().replace('\n', "\n  ")))
                .collect::<Vec<_>>()
                .join("\n")
        );
        let parsed = parse(&text, &[]);
        let keys: Vec<String> = parsed.objects.iter().map(|o| o.key().to_string()).collect();
        assert_eq!(keys, ["Secret default/a", "Secret default/b"]);
        assert_eq!(parsed.problems.len(), 1);
        assert!(parsed.problems[0].error.contains("defined twice"));
    }

    #[test]
    fn kubectls_copy_of_the_applied_object_is_not_kept() {
        let text = r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: web
  annotations:
    kubectl.kubernetes.io/last-applied-configuration: |
      {"apiVersion":"networking.k8s.io/v1","kind":"Ingress","metadata":{"name":"web"}}
    duet.dev/proxy-body-size: 8m
spec:
  defaultBackend: {service: {name: web, port: {number: 80}}}
"#;
        let parsed = parse(text, &[]);
        assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
        let Object::Ingress(ingress) = &parsed.objects[0] else {
            panic!("not an Ingress");
        };
        let annotations = ingress.metadata.annotations.as_ref().expect("annotations");
        let names: Vec<&str> = annotations.iter().map(|(name, _)| name).collect();
        assert_eq!(names, ["duet.dev/proxy-body-size"]);
    }

    fn secret(name: &str, note: &str) -> String {
        format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, annotations: {{note: \"n{note}\"}}}}\n")
    }

    fn keys(changes: &[Change]) -> Vec<String> {
        changes
            .iter()
            .map(|c| match c {
                Change::Apply { object, .. } => format!("apply {}", object.key()),
                Change::Delete(key) => format!("delete {key}"),
                Change::Replace { kind, .. } => format!("replace {kind:?}"),
            })
            .collect()
    }

    #[test]
    fn an_event_rereads_only_the_files_it_names_and_rescans_when_it_must() {
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        for name in ["a", "b", "c"] {
            std::fs::write(path(&format!("{name}.yaml")), secret(name, "1")).unwrap();
        }
        let mut source = FileSource::new(dir.path());
        assert_eq!(source.scan().unwrap().len(), 3);

        // An editor's save: a hidden temporary file renamed over a.yaml. b.yaml changes too but
        // no event names it: only a.yaml is read again.
        std::fs::write(path(".a.tmp"), secret("a", "2")).unwrap();
        std::fs::rename(path(".a.tmp"), path("a.yaml")).unwrap();
        std::fs::write(
            path("b.yaml"),
            format!("{}---\n{}", secret("b", "2"), secret("b2", "1")),
        )
        .unwrap();
        let changes = source
            .scan_paths(&[path(".a.tmp"), path("a.yaml")])
            .unwrap();
        assert_eq!(keys(&changes), ["apply Secret default/a"]);

        // A removed file's objects go; a new one's come.
        std::fs::remove_file(path("c.yaml")).unwrap();
        std::fs::write(path("d.yaml"), secret("d", "1")).unwrap();
        let changes = source
            .scan_paths(&[path("c.yaml"), path("d.yaml"), path("notes.txt")])
            .unwrap();
        assert_eq!(
            keys(&changes),
            ["delete Secret default/c", "apply Secret default/d"]
        );

        // An object another file defines too: the first file by name wins, as in a full scan.
        std::fs::write(path("0-first.yaml"), secret("d", "0")).unwrap();
        let changes = source.scan_paths(&[path("0-first.yaml")]).unwrap();
        assert_eq!(keys(&changes), ["apply Secret default/d"]);
        std::fs::remove_file(path("0-first.yaml")).unwrap();
        let changes = source.scan_paths(&[path("0-first.yaml")]).unwrap();
        assert_eq!(
            keys(&changes),
            ["apply Secret default/d"],
            "d.yaml's definition is back"
        );

        // A symlink (a ConfigMap volume's `..data`) rescans the whole folder: b.yaml's change is
        // found now.
        std::os::unix::fs::symlink(dir.path(), path("..data")).unwrap();
        let changes = source.scan_paths(&[path("..data")]).unwrap();
        assert_eq!(
            keys(&changes),
            ["apply Secret default/b", "apply Secret default/b2"]
        );
        assert!(
            source.scan().unwrap().is_empty(),
            "the same state as a full scan"
        );
    }

    /// Every event the watch yields until one names `until` (at most 5 s): `None` when one asked
    /// for a rescan of the whole folder.
    async fn events_until(watch: &mut FolderWatch, until: &Path) -> Touched {
        let mut all = Some(Vec::new());
        loop {
            let touched = tokio::time::timeout(Duration::from_secs(5), watch.next())
                .await
                .expect("an event within 5 s")
                .expect("the watch goes on");
            let done = touched
                .as_ref()
                .is_none_or(|t| t.iter().any(|p| p == until));
            match (touched, all.as_mut()) {
                (Some(paths), Some(all)) => all.extend(paths),
                _ => all = None,
            }
            if done {
                watch.more(&mut all);
                return all;
            }
        }
    }

    #[tokio::test]
    async fn the_watch_names_changed_files_and_not_read_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        std::fs::write(path("a.yaml"), secret("a", "1")).unwrap();
        std::fs::write(path("c.yaml"), secret("c", "1")).unwrap();
        let mut watch = FolderWatch::new(dir.path()).unwrap();

        // duet's own reads (a scan, a file read again) are no events: at 40,001 files each
        // open woke the watch (notify 8 asked for `IN_OPEN`). The next event is the write.
        let mut source = FileSource::new(dir.path());
        assert_eq!(source.scan().unwrap().len(), 2);
        std::fs::read(path("a.yaml")).unwrap();
        std::fs::write(path("b.yaml"), secret("b", "1")).unwrap();
        let touched = events_until(&mut watch, &path("b.yaml")).await.unwrap();
        assert!(touched.iter().all(|p| *p == path("b.yaml")), "{touched:?}");

        // An editor's save (a temporary file renamed over the old one), a removal, an attribute
        // change: each names its file.
        std::fs::write(path(".a.tmp"), secret("a", "2")).unwrap();
        std::fs::rename(path(".a.tmp"), path("a.yaml")).unwrap();
        let touched = events_until(&mut watch, &path("a.yaml")).await.unwrap();
        assert!(touched.contains(&path(".a.tmp")), "{touched:?}");
        std::fs::remove_file(path("c.yaml")).unwrap();
        let touched = events_until(&mut watch, &path("c.yaml")).await.unwrap();
        assert_eq!(touched, [path("c.yaml")]);
        let file = std::fs::File::open(path("b.yaml")).unwrap();
        file.set_modified(std::time::SystemTime::UNIX_EPOCH)
            .unwrap();
        drop(file);
        let touched = events_until(&mut watch, &path("b.yaml")).await.unwrap();
        assert_eq!(touched, [path("b.yaml")]);

        // A folder made inside, and the watched folder itself moved away: whole rescans.
        std::fs::create_dir(path("sub")).unwrap();
        let touched = events_until(&mut watch, &path("sub")).await.unwrap();
        assert!(matches!(source.event_path(&touched[0]), EventPath::Rescan));
        let moved = tempfile::tempdir().unwrap();
        std::fs::rename(dir.path(), moved.path().join("away")).unwrap();
        assert_eq!(events_until(&mut watch, &path("none")).await, None);
    }

    /// A file that takes long (or a reading thread the machine delays) does not hold back the
    /// files after it: the other threads take them all. With fixed shares (every other file per
    /// thread, as before) the slow thread's share waited for it.
    #[test]
    fn a_slow_file_leaves_the_rest_to_the_other_threads() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        if cores < 2 {
            return;
        }
        let count = 4 * MIN_FILES_PER_THREAD;
        let done = AtomicUsize::new(0);
        let results = in_parallel(count, |n| {
            let others_done = if n == 0 {
                // The slow file: it waits (up to 10 s) for every file but those its thread took
                // with it to be read.
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while done.load(Ordering::SeqCst) < count - CHUNK
                    && std::time::Instant::now() < deadline
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
                done.load(Ordering::SeqCst)
            } else {
                done.fetch_add(1, Ordering::SeqCst);
                0
            };
            (n, others_done)
        });
        assert_eq!(
            results.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            (0..count).collect::<Vec<_>>(),
            "in order"
        );
        assert_eq!(
            results[0].1,
            count - CHUNK,
            "the other files were read meanwhile"
        );
    }

    #[test]
    fn a_scan_on_several_threads_reads_every_file_in_order() {
        let dir = std::env::temp_dir().join(format!("duet-files-threads-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = 3 * MIN_FILES_PER_THREAD;
        for n in 0..files {
            let text = format!(
                "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: s{n:03}, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv6\nendpoints: [{{addresses: [\"2001:db8::{n:x}\"]}}]\n"
            );
            std::fs::write(dir.join(format!("s{n:03}.yaml")), text).unwrap();
        }
        // The same name twice: the first file by name wins, whichever thread read it.
        std::fs::write(dir.join("s000-again.yaml"), "apiVersion: v1\nkind: Secret\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: a}\n").unwrap();
        let mut source = FileSource::new(&dir);
        let changes = source.scan().unwrap();
        let keys: Vec<String> = changes
            .iter()
            .map(|c| match c {
                Change::Apply { object, .. } => object.key().to_string(),
                other => panic!("{other:?}"),
            })
            .collect();
        let mut expected: Vec<String> = (0..files)
            .map(|n| format!("EndpointSlice default/s{n:03}"))
            .collect();
        expected.push("Secret default/a".to_owned());
        expected.sort();
        assert_eq!(keys, expected);
        assert!(source.scan().unwrap().is_empty(), "nothing changed");
        std::fs::write(dir.join("s007.yaml"), "not: [valid").unwrap();
        std::fs::remove_file(dir.join("s008.yaml")).unwrap();
        let changes = source.scan().unwrap();
        assert_eq!(
            changes,
            [Change::Delete(ObjectKey::new(
                Kind::EndpointSlice,
                "default",
                "s008"
            ))],
            "the broken file keeps its objects, the removed one loses them"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_scan_reads_symlinked_manifests_and_skips_folders_and_dangling_links() {
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        // A ConfigMap volume's layout: each file a symlink into a hidden folder.
        std::fs::create_dir(path("..2026_12_02")).unwrap();
        std::fs::write(path("..2026_12_02/a.yaml"), secret("a", "1")).unwrap();
        std::os::unix::fs::symlink("..2026_12_02/a.yaml", path("a.yaml")).unwrap();
        std::fs::write(path("b.yaml"), secret("b", "1")).unwrap();
        std::fs::create_dir(path("c.yaml")).unwrap();
        std::os::unix::fs::symlink("gone.yaml", path("d.yaml")).unwrap();
        std::os::unix::fs::symlink("c.yaml", path("e.yaml")).unwrap();
        let mut source = FileSource::new(dir.path());
        assert_eq!(
            keys(&source.scan().unwrap()),
            ["apply Secret default/a", "apply Secret default/b"]
        );
    }

    #[test]
    fn manifest_names() {
        assert!(is_manifest(Path::new("/m/web.yaml")));
        assert!(is_manifest(Path::new("/m/web.yml")));
        assert!(!is_manifest(Path::new("/m/.web.yaml")));
        assert!(!is_manifest(Path::new("/m/web.yaml~")));
        assert!(!is_manifest(Path::new("/m/web.yaml.swp")));
        assert!(!is_manifest(Path::new("/m/web.json")));
    }
}
