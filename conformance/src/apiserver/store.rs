//! Storage of the test API server: objects as JSON by resource, namespace and name, one global
//! resourceVersion counter, the event history watches resume from, and the open watches.
//!
//! Every write goes through [`Store::commit`], which bumps the resourceVersion, stamps it on the
//! object, records the event and hands it to every open watch of that resource while the store's
//! lock is held, so a watch sees events exactly once and in order.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::registry::{self, Resource};
use super::selector::{FieldSelector, LabelSelector};

/// An API error, answered as a JSON `Status` with the matching HTTP code.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// 404 `NotFound`: no such object, namespace or path.
    #[error("{0}")]
    NotFound(String),
    /// 409 `AlreadyExists`: create of a name that exists.
    #[error("{0}")]
    AlreadyExists(String),
    /// 409 `Conflict`: a write carried a stale `metadata.resourceVersion` (or uid precondition).
    #[error("{0}")]
    Conflict(String),
    /// 400 `BadRequest`: unparsable body, selector, or mismatched kind/namespace/name.
    #[error("{0}")]
    BadRequest(String),
    /// 422 `Invalid`: the object is missing something required (a name).
    #[error("{0}")]
    Invalid(String),
    /// 410 `Expired`: a resourceVersion or continue token older than the kept history.
    #[error("{0}")]
    Expired(String),
    /// 405 `MethodNotAllowed`.
    #[error("{0}")]
    MethodNotAllowed(String),
    /// 415 `UnsupportedMediaType`: a patch type the server does not implement.
    #[error("{0}")]
    UnsupportedMediaType(String),
}

impl ApiError {
    /// The HTTP status code.
    pub fn code(&self) -> u16 {
        match self {
            ApiError::NotFound(_) => 404,
            ApiError::AlreadyExists(_) | ApiError::Conflict(_) => 409,
            ApiError::BadRequest(_) => 400,
            ApiError::Invalid(_) => 422,
            ApiError::Expired(_) => 410,
            ApiError::MethodNotAllowed(_) => 405,
            ApiError::UnsupportedMediaType(_) => 415,
        }
    }

    /// The `reason` of the `Status`.
    pub fn reason(&self) -> &'static str {
        match self {
            ApiError::NotFound(_) => "NotFound",
            ApiError::AlreadyExists(_) => "AlreadyExists",
            ApiError::Conflict(_) => "Conflict",
            ApiError::BadRequest(_) => "BadRequest",
            ApiError::Invalid(_) => "Invalid",
            ApiError::Expired(_) => "Expired",
            ApiError::MethodNotAllowed(_) => "MethodNotAllowed",
            ApiError::UnsupportedMediaType(_) => "UnsupportedMediaType",
        }
    }

    /// The `Status` object the API server answers with.
    pub fn status(&self) -> Value {
        status_json(self.code(), self.reason(), &self.to_string())
    }
}

/// A failure `Status` object.
pub fn status_json(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

/// What happened to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// Created.
    Added,
    /// Changed.
    Modified,
    /// Removed.
    Deleted,
}

/// One change, as kept in the history and sent to watches.
#[derive(Clone, Debug)]
pub struct Event {
    /// The resourceVersion the change produced.
    pub rv: u64,
    /// Index of the resource in the registry.
    pub resource: usize,
    /// What happened.
    pub kind: EventKind,
    /// The object after the change (for a delete: the last state, with the delete's RV).
    pub object: Value,
    /// The object before a modification, so a filtered watch can turn a change that moves an
    /// object into or out of its selector into ADDED or DELETED, as the real server does.
    pub previous: Option<Value>,
}

/// Which objects a watch or list wants.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Only this namespace (None: all).
    pub namespace: Option<String>,
    /// The label selector.
    pub labels: LabelSelector,
    /// The field selector.
    pub fields: FieldSelector,
}

impl Filter {
    /// Whether the object passes.
    pub fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace {
            if obj.pointer("/metadata/namespace").and_then(Value::as_str) != Some(ns) {
                return false;
            }
        }
        self.labels.matches(obj) && self.fields.matches(obj)
    }

    /// The watch event type and object this filter turns an event into, if any.
    pub fn translate<'e>(&self, ev: &'e Event) -> Option<(&'static str, &'e Value)> {
        let now = self.matches(&ev.object);
        let before = ev.previous.as_ref().is_some_and(|p| self.matches(p));
        let kind = match (ev.kind, before, now) {
            (EventKind::Added, _, true) => "ADDED",
            (EventKind::Deleted, _, true) => "DELETED",
            (EventKind::Modified, true, true) => "MODIFIED",
            (EventKind::Modified, false, true) => "ADDED",
            (EventKind::Modified, true, false) => "DELETED",
            _ => return None,
        };
        Some((kind, &ev.object))
    }
}

/// A patch body type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchKind {
    /// `application/merge-patch+json` (RFC 7386).
    Merge,
    /// `application/strategic-merge-patch+json`, applied as a merge patch (lists are replaced,
    /// not merged by key).
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply), applied as a merge patch that may
    /// create the object; managedFields and list-map merging are not modelled.
    Apply,
}

struct Subscriber {
    resource: usize,
    tx: mpsc::UnboundedSender<Arc<Event>>,
}

/// Where a new watch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchStart {
    /// After this resourceVersion: replay the kept history past it, then live events.
    After(u64),
    /// From the current state: an ADDED event for every object, then live events (the
    /// behaviour of `resourceVersion=0`/unset and of `sendInitialEvents=true`).
    Current,
}

/// An opened watch: events to send first, then the live feed.
#[derive(Debug)]
pub struct Opened {
    /// Replayed history or synthetic ADDED events, in order.
    pub backlog: Vec<Arc<Event>>,
    /// The resourceVersion the backlog brings the watch to.
    pub rv: u64,
    /// Live events; closed when the server drops its watches.
    pub live: mpsc::UnboundedReceiver<Arc<Event>>,
}

/// Key of an object inside its resource: (namespace or "", name).
type Key = (String, String);

/// The whole state of the test API server. Tests reach it through
/// [`ApiServer::with_store`](super::ApiServer::with_store) to make several changes atomically
/// (no client can observe or reconnect in between).
pub struct Store {
    resources: Vec<Resource>,
    objects: Vec<BTreeMap<Key, Value>>,
    rv: u64,
    history: VecDeque<Arc<Event>>,
    history_limit: usize,
    compacted: u64,
    subscribers: Vec<Subscriber>,
    require_namespaces: bool,
    random: RandomState,
    counter: u64,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("resources", &self.resources.len())
            .field("rv", &self.rv)
            .field("compacted", &self.compacted)
            .field("watches", &self.subscribers.len())
            .finish()
    }
}

impl Store {
    /// A store with the default resources and the namespaces every cluster has (`default`,
    /// `kube-system`, `kube-public`, `kube-node-lease`).
    pub fn new(history_limit: usize, require_namespaces: bool) -> Store {
        let resources = registry::defaults();
        let mut store = Store {
            objects: resources.iter().map(|_| BTreeMap::new()).collect(),
            resources,
            rv: 0,
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            compacted: 0,
            subscribers: Vec::new(),
            require_namespaces,
            random: RandomState::new(),
            counter: 0,
        };
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            store
                .create(namespace_object(ns))
                .expect("fresh store accepts the default namespaces");
        }
        store
    }

    /// A copy of the state without the open watches, for `dryRun` writes that must not persist
    /// or notify anyone.
    pub fn scratch(&self) -> Store {
        Store {
            resources: self.resources.clone(),
            objects: self.objects.clone(),
            rv: self.rv,
            history: VecDeque::new(),
            history_limit: self.history_limit,
            compacted: self.rv,
            subscribers: Vec::new(),
            require_namespaces: self.require_namespaces,
            random: self.random.clone(),
            counter: self.counter + 1_000_000,
        }
    }

    /// Registers another resource (or replaces one with the same group, version and plural).
    pub fn register(&mut self, resource: Resource) {
        match self.resources.iter().position(|r| {
            r.group == resource.group
                && r.version == resource.version
                && r.plural == resource.plural
        }) {
            Some(i) => self.resources[i] = resource,
            None => {
                self.resources.push(resource);
                self.objects.push(BTreeMap::new());
            }
        }
    }

    /// The registered resources, by index.
    pub fn resources(&self) -> &[Resource] {
        &self.resources
    }

    /// The current (latest) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// The oldest resourceVersion a watch may still start after.
    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    /// The resource served at `group`/`version`/`plural`.
    pub fn by_path(&self, group: &str, version: &str, plural: &str) -> Option<usize> {
        self.resources
            .iter()
            .position(|r| r.group == group && r.version == version && r.plural == plural)
    }

    /// The resource of objects with this `apiVersion` and `kind`.
    pub fn by_kind(&self, api_version: &str, kind: &str) -> Option<usize> {
        self.resources
            .iter()
            .position(|r| r.api_version() == api_version && r.kind == kind)
    }

    fn by_object(&self, obj: &Value) -> Result<usize, ApiError> {
        let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
        self.by_kind(api_version, kind).ok_or_else(|| {
            ApiError::NotFound(format!("no resource registered for {api_version} {kind}"))
        })
    }

    fn key(&self, res: usize, ns: Option<&str>, name: &str) -> Key {
        let ns = if self.resources[res].namespaced {
            ns.unwrap_or("")
        } else {
            ""
        };
        (ns.to_owned(), name.to_owned())
    }

    fn not_found(&self, res: usize, name: &str) -> ApiError {
        ApiError::NotFound(format!(
            "{} \"{name}\" not found",
            self.resources[res].qualified()
        ))
    }

    fn conflict(&self, res: usize, name: &str) -> ApiError {
        ApiError::Conflict(format!(
            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
            self.resources[res].qualified()
        ))
    }

    fn random_u64(&mut self) -> u64 {
        self.counter += 1;
        let mut h = self.random.build_hasher();
        h.write_u64(self.counter);
        h.write_u128(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.finish()
    }

    fn uid(&mut self) -> String {
        let (a, b) = (self.random_u64(), self.random_u64());
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            0x8000 | ((b >> 48) & 0x3fff),
            b & 0xffff_ffff_ffff
        )
    }

    /// One object.
    pub fn get(&self, res: usize, ns: Option<&str>, name: &str) -> Result<Value, ApiError> {
        let key = self.key(res, ns, name);
        self.objects[res]
            .get(&key)
            .cloned()
            .ok_or_else(|| self.not_found(res, name))
    }

    /// Every object of a resource passing the filter, in (namespace, name) order, after the key
    /// `after` (for `continue`).
    pub fn list(
        &self,
        res: usize,
        filter: &Filter,
        after: Option<&(String, String)>,
    ) -> Vec<(Key, Value)> {
        self.objects[res]
            .iter()
            .filter(|(k, _)| after.is_none_or(|a| *k > a))
            .filter(|(_, v)| filter.matches(v))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Stamps `apiVersion`/`kind` (or rejects a mismatch) and the namespace from the path.
    fn check_identity(
        &self,
        res: usize,
        ns: Option<&str>,
        obj: &mut Value,
    ) -> Result<(), ApiError> {
        let r = &self.resources[res];
        let Some(map) = obj.as_object_mut() else {
            return Err(ApiError::BadRequest(
                "the body must be a JSON object".into(),
            ));
        };
        let api_version = r.api_version();
        match map.get("apiVersion").and_then(Value::as_str) {
            None | Some("") => {
                map.insert("apiVersion".into(), api_version.clone().into());
            }
            Some(v) if v == api_version => {}
            Some(v) => {
                return Err(ApiError::BadRequest(format!(
                    "the API version in the data ({v}) does not match the expected API version ({api_version})"
                )))
            }
        }
        match map.get("kind").and_then(Value::as_str) {
            None | Some("") => {
                map.insert("kind".into(), r.kind.clone().into());
            }
            Some(k) if k == r.kind => {}
            Some(k) => {
                return Err(ApiError::BadRequest(format!(
                    "the kind in the data ({k}) does not match the expected kind ({})",
                    r.kind
                )))
            }
        }
        let meta = map.entry("metadata").or_insert_with(|| json!({}));
        let Some(meta) = meta.as_object_mut() else {
            return Err(ApiError::BadRequest("metadata must be an object".into()));
        };
        if r.namespaced {
            let path_ns = ns.unwrap_or("");
            match meta.get("namespace").and_then(Value::as_str) {
                None | Some("") => {
                    if path_ns.is_empty() {
                        return Err(ApiError::BadRequest("a namespace is required".into()));
                    }
                    meta.insert("namespace".into(), path_ns.into());
                }
                Some(body_ns) if path_ns.is_empty() || body_ns == path_ns => {}
                Some(_) => {
                    return Err(ApiError::BadRequest(
                        "the namespace of the provided object does not match the namespace sent on the request".into(),
                    ))
                }
            }
        } else {
            meta.remove("namespace");
        }
        Ok(())
    }

    /// Creates an object of resource `res` (POST): assigns uid, creationTimestamp, generation
    /// and resourceVersion, drops `.status` of kinds with a status subresource, emits ADDED.
    pub fn create_in(
        &mut self,
        res: usize,
        ns: Option<&str>,
        mut obj: Value,
    ) -> Result<Value, ApiError> {
        self.check_identity(res, ns, &mut obj)?;
        let r = self.resources[res].clone();
        let uid = self.uid();
        let suffix = self.random_u64();
        let meta = obj["metadata"].as_object_mut().expect("checked above");
        if meta
            .get("resourceVersion")
            .and_then(Value::as_str)
            .is_some_and(|v| !v.is_empty())
        {
            return Err(ApiError::BadRequest(
                "resourceVersion should not be set on objects to be created".into(),
            ));
        }
        let mut name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        if name.is_empty() {
            let prefix = meta
                .get("generateName")
                .and_then(Value::as_str)
                .unwrap_or("");
            if prefix.is_empty() {
                return Err(ApiError::Invalid(format!(
                    "{} \"\" is invalid: metadata.name: Required value: name or generateName is required",
                    r.kind
                )));
            }
            const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
            let tail: String = (0..5)
                .map(|i| ALPHABET[((suffix >> (i * 8)) % ALPHABET.len() as u64) as usize] as char)
                .collect();
            name = format!("{prefix}{tail}");
            meta.insert("name".into(), name.clone().into());
        }
        let ns_name = meta
            .get("namespace")
            .and_then(Value::as_str)
            .map(str::to_owned);
        if r.namespaced && self.require_namespaces {
            let ns_res = self
                .by_kind("v1", "Namespace")
                .expect("namespaces are registered");
            let ns_name = ns_name.clone().unwrap_or_default();
            if !self.objects[ns_res].contains_key(&(String::new(), ns_name.clone())) {
                return Err(ApiError::NotFound(format!(
                    "namespaces \"{ns_name}\" not found"
                )));
            }
        }
        let key = self.key(res, ns_name.as_deref(), &name);
        if self.objects[res].contains_key(&key) {
            return Err(ApiError::AlreadyExists(format!(
                "{} \"{name}\" already exists",
                r.qualified()
            )));
        }
        let meta = obj["metadata"].as_object_mut().expect("checked above");
        meta.insert("uid".into(), uid.into());
        meta.insert("creationTimestamp".into(), now_rfc3339().into());
        meta.insert("generation".into(), 1.into());
        meta.remove("deletionTimestamp");
        meta.remove("resourceVersion");
        if r.status {
            obj.as_object_mut().expect("object").remove("status");
        }
        if r.group.is_empty() && r.kind == "Namespace" {
            obj["status"] = json!({"phase": "Active"});
        }
        Ok(self.commit(res, key, EventKind::Added, obj, None))
    }

    /// Creates an object whose `apiVersion` and `kind` name its resource.
    pub fn create(&mut self, obj: Value) -> Result<Value, ApiError> {
        let res = self.by_object(&obj)?;
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .map(str::to_owned);
        self.create_in(res, ns.as_deref(), obj)
    }

    /// Creates the object, or replaces it unconditionally when it exists (like `kubectl apply`
    /// without a three-way merge), creating its namespace first when missing.
    pub fn apply(&mut self, mut obj: Value) -> Result<Value, ApiError> {
        let res = self.by_object(&obj)?;
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("resourceVersion");
        }
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        if self.resources[res].namespaced {
            if let Some(ns) = &ns {
                let ns_res = self
                    .by_kind("v1", "Namespace")
                    .expect("namespaces are registered");
                if self.get(ns_res, None, ns).is_err() {
                    self.create(namespace_object(ns))?;
                }
            }
        }
        match self.get(res, ns.as_deref(), &name) {
            Ok(_) if !name.is_empty() => {
                let status = obj.get("status").cloned();
                let mut out = self.update(res, ns.as_deref(), &name, obj, false)?;
                if self.resources[res].status {
                    if let Some(status) = status {
                        let mut with_status = out.clone();
                        with_status["status"] = status;
                        out = self.update(res, ns.as_deref(), &name, with_status, true)?;
                    }
                }
                Ok(out)
            }
            _ => {
                let status = obj.get("status").cloned();
                let mut out = self.create_in(res, ns.as_deref(), obj)?;
                if let Some(status) = status.filter(|_| self.resources[res].status) {
                    out["status"] = status;
                    out = self.update(res, ns.as_deref(), &name_of(&out), out, true)?;
                }
                Ok(out)
            }
        }
    }

    /// Replaces an object (PUT), on the main resource or its `status` subresource. A non-empty
    /// `metadata.resourceVersion` must equal the stored one, else 409 Conflict.
    pub fn update(
        &mut self,
        res: usize,
        ns: Option<&str>,
        name: &str,
        mut obj: Value,
        status: bool,
    ) -> Result<Value, ApiError> {
        self.check_identity(res, ns, &mut obj)?;
        if let Some(body_name) = obj.pointer("/metadata/name").and_then(Value::as_str) {
            if !body_name.is_empty() && body_name != name {
                return Err(ApiError::BadRequest(format!(
                    "the name of the object ({body_name}) does not match the name on the URL ({name})"
                )));
            }
        }
        let old = self.get(res, ns, name)?;
        check_rv(&old, &obj).map_err(|()| self.conflict(res, name))?;
        let new = if status {
            let mut new = old.clone();
            new["status"] = obj.get("status").cloned().unwrap_or(Value::Null);
            new
        } else {
            if self.resources[res].status {
                match old.get("status") {
                    Some(s) => obj["status"] = s.clone(),
                    None => {
                        obj.as_object_mut().expect("object").remove("status");
                    }
                }
            }
            obj
        };
        self.finish_update(res, old, new)
    }

    /// Patches an object (PATCH), on the main resource or its `status` subresource. An apply
    /// patch of a missing object creates it.
    pub fn patch(
        &mut self,
        res: usize,
        ns: Option<&str>,
        name: &str,
        kind: PatchKind,
        patch: Value,
        status: bool,
    ) -> Result<Value, ApiError> {
        if !patch.is_object() {
            return Err(ApiError::BadRequest(
                "the patch must be a JSON object".into(),
            ));
        }
        let old = match self.get(res, ns, name) {
            Ok(old) => old,
            Err(e) if kind == PatchKind::Apply && !status => {
                let _ = e;
                let mut obj = patch;
                obj["metadata"]["name"] = name.into();
                if let Some(ns) = ns {
                    obj["metadata"]["namespace"] = ns.into();
                }
                return self.create_in(res, ns, obj);
            }
            Err(e) => return Err(e),
        };
        if kind == PatchKind::Apply {
            let mut probe = patch.clone();
            self.check_identity(res, ns, &mut probe)?;
        }
        check_rv(&old, &patch).map_err(|()| self.conflict(res, name))?;
        let mut patched = old.clone();
        merge_patch(&mut patched, &patch);
        let new = if status {
            let mut new = old.clone();
            new["status"] = patched.get("status").cloned().unwrap_or(Value::Null);
            new
        } else {
            if self.resources[res].status {
                match old.get("status") {
                    Some(s) => patched["status"] = s.clone(),
                    None => {
                        patched.as_object_mut().expect("object").remove("status");
                    }
                }
            }
            patched
        };
        self.finish_update(res, old, new)
    }

    /// Keeps what clients may not change, bumps `generation` on a spec change, skips no-op
    /// writes (no new resourceVersion, no event) and completes a pending deletion once the last
    /// finalizer is gone.
    fn finish_update(&mut self, res: usize, old: Value, mut new: Value) -> Result<Value, ApiError> {
        if let Some(map) = new.as_object_mut() {
            if map.get("status").is_some_and(Value::is_null) {
                map.remove("status");
            }
        }
        let old_meta = old["metadata"].clone();
        let meta = new["metadata"]
            .as_object_mut()
            .ok_or_else(|| ApiError::BadRequest("metadata must be an object".into()))?;
        for field in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "namespace",
            "name",
            "resourceVersion",
            "generation",
        ] {
            match old_meta.get(field) {
                Some(v) => {
                    meta.insert(field.into(), v.clone());
                }
                None => {
                    meta.remove(field);
                }
            }
        }
        if old.get("spec") != new.get("spec") {
            let generation = old_meta
                .get("generation")
                .and_then(Value::as_i64)
                .unwrap_or(0)
                + 1;
            new["metadata"]["generation"] = generation.into();
        }
        if new == old {
            return Ok(old);
        }
        let name = name_of(&old);
        let ns = old
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let key = self.key(res, ns.as_deref(), &name);
        let deleting = new.pointer("/metadata/deletionTimestamp").is_some();
        let finalizers = new
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        if deleting && !finalizers {
            return Ok(self.commit(res, key, EventKind::Deleted, new, None));
        }
        Ok(self.commit(res, key, EventKind::Modified, new, Some(old)))
    }

    /// Deletes an object (DELETE). With finalizers it only gets a `deletionTimestamp`. Deleting
    /// a Namespace deletes every object in it first. `precondition` is (uid, resourceVersion).
    pub fn delete(
        &mut self,
        res: usize,
        ns: Option<&str>,
        name: &str,
        precondition: (Option<String>, Option<String>),
    ) -> Result<Value, ApiError> {
        let old = self.get(res, ns, name)?;
        let (uid, rv) = precondition;
        if uid.is_some_and(|u| {
            old.pointer("/metadata/uid").and_then(Value::as_str) != Some(u.as_str())
        }) {
            return Err(ApiError::Conflict(format!(
                "Precondition failed: UID in precondition does not match the UID of {} \"{name}\"",
                self.resources[res].qualified()
            )));
        }
        if rv.is_some_and(|v| {
            old.pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                != Some(v.as_str())
        }) {
            return Err(self.conflict(res, name));
        }
        let finalizers = old
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        let key = self.key(res, ns, name);
        if finalizers {
            if old.pointer("/metadata/deletionTimestamp").is_some() {
                return Ok(old);
            }
            let mut new = old.clone();
            new["metadata"]["deletionTimestamp"] = now_rfc3339().into();
            return Ok(self.commit(res, key, EventKind::Modified, new, Some(old)));
        }
        let r = &self.resources[res];
        if r.group.is_empty() && r.kind == "Namespace" {
            for other in 0..self.resources.len() {
                if !self.resources[other].namespaced {
                    continue;
                }
                let doomed: Vec<Key> = self.objects[other]
                    .keys()
                    .filter(|(n, _)| n == name)
                    .cloned()
                    .collect();
                for key in doomed {
                    let obj = self.objects[other][&key].clone();
                    self.commit(other, key, EventKind::Deleted, obj, None);
                }
            }
        }
        Ok(self.commit(res, key, EventKind::Deleted, old, None))
    }

    /// Deletes an object named by `apiVersion`, `kind`, namespace and name.
    pub fn delete_object(
        &mut self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        let res = self.by_kind(api_version, kind).ok_or_else(|| {
            ApiError::NotFound(format!("no resource registered for {api_version} {kind}"))
        })?;
        self.delete(res, ns, name, (None, None))
    }

    /// One object named by `apiVersion`, `kind`, namespace and name.
    pub fn get_object(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let res = self.by_kind(api_version, kind)?;
        self.get(res, ns, name).ok()
    }

    /// Every object of a kind, in (namespace, name) order.
    pub fn list_objects(&self, api_version: &str, kind: &str) -> Vec<Value> {
        match self.by_kind(api_version, kind) {
            Some(res) => self
                .list(res, &Filter::default(), None)
                .into_iter()
                .map(|(_, v)| v)
                .collect(),
            None => Vec::new(),
        }
    }

    /// Records a change: new resourceVersion, stored state, history, open watches.
    fn commit(
        &mut self,
        res: usize,
        key: Key,
        kind: EventKind,
        mut obj: Value,
        previous: Option<Value>,
    ) -> Value {
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = self.rv.to_string().into();
        match kind {
            EventKind::Deleted => {
                self.objects[res].remove(&key);
            }
            EventKind::Added | EventKind::Modified => {
                self.objects[res].insert(key, obj.clone());
            }
        }
        let event = Arc::new(Event {
            rv: self.rv,
            resource: res,
            kind,
            object: obj.clone(),
            previous,
        });
        self.history.push_back(event.clone());
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.rv;
            }
        }
        self.subscribers
            .retain(|s| s.resource != res || s.tx.send(event.clone()).is_ok());
        obj
    }

    /// Opens a watch on resource `res`. A start older than the kept history is `Expired` (which
    /// the HTTP layer answers with a 200 and one ERROR event, as the real server does).
    pub fn watch(&mut self, res: usize, start: WatchStart) -> Result<Opened, ApiError> {
        let backlog = match start {
            WatchStart::After(rv) if rv < self.compacted => {
                return Err(ApiError::Expired(format!(
                    "too old resource version: {rv} ({})",
                    self.compacted + 1
                )))
            }
            WatchStart::After(rv) => self
                .history
                .iter()
                .filter(|e| e.resource == res && e.rv > rv)
                .cloned()
                .collect(),
            WatchStart::Current => self.objects[res]
                .values()
                .map(|obj| {
                    Arc::new(Event {
                        rv: obj
                            .pointer("/metadata/resourceVersion")
                            .and_then(Value::as_str)
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(self.rv),
                        resource: res,
                        kind: EventKind::Added,
                        object: obj.clone(),
                        previous: None,
                    })
                })
                .collect(),
        };
        let (tx, live) = mpsc::unbounded_channel();
        self.subscribers.push(Subscriber { resource: res, tx });
        Ok(Opened {
            backlog,
            rv: self.rv,
            live,
        })
    }

    /// Events of resource `res` already queued for a watch, drained while the lock is held so a
    /// BOOKMARK sent after them cannot overtake one (used for bookmarks).
    pub fn drain(&self, live: &mut mpsc::UnboundedReceiver<Arc<Event>>) -> (Vec<Arc<Event>>, u64) {
        let mut out = Vec::new();
        while let Ok(ev) = live.try_recv() {
            out.push(ev);
        }
        (out, self.rv)
    }

    /// Ends every open watch (their responses end cleanly; clients resume from their last RV).
    pub fn drop_watches(&mut self) {
        self.subscribers.clear();
    }

    /// Open watches on the resource with this plural (any group), or on all resources.
    pub fn open_watches(&mut self, plural: Option<&str>) -> usize {
        self.subscribers.retain(|s| !s.tx.is_closed());
        self.subscribers
            .iter()
            .filter(|s| plural.is_none_or(|p| self.resources[s.resource].plural == p))
            .count()
    }

    /// Forgets the history: a watch starting from any resourceVersion older than the current one
    /// now gets a 410 Expired ERROR event, and a `continue` token from before gets HTTP 410.
    pub fn expire_history(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }
}

/// Whether `patch_or_body` carries a resourceVersion that differs from the stored one.
fn check_rv(old: &Value, body: &Value) -> Result<(), ()> {
    match body
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
    {
        Some(rv)
            if !rv.is_empty()
                && Some(rv)
                    != old
                        .pointer("/metadata/resourceVersion")
                        .and_then(Value::as_str) =>
        {
            Err(())
        }
        _ => Ok(()),
    }
}

fn name_of(obj: &Value) -> String {
    obj.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

/// A Namespace object.
pub fn namespace_object(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            let t = target.as_object_mut().expect("made an object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// The current time as Kubernetes writes `metav1.Time`: RFC 3339, UTC, whole seconds.
pub fn now_rfc3339() -> String {
    format!("{:.0}", jiff::Timestamp::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut t = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        merge_patch(&mut t, &json!({"a": "z", "c": {"f": null}, "l": [3]}));
        assert_eq!(t, json!({"a": "z", "c": {"d": "e"}, "l": [3]}));
    }

    #[test]
    fn timestamps_are_rfc_3339_utc() {
        let t = now_rfc3339();
        assert_eq!(t.len(), 20, "{t}");
        assert!(t.ends_with('Z') && t.as_bytes()[10] == b'T', "{t}");
        assert!(t.as_str() > "2024-01-01T00:00:00Z", "{t}");
    }

    #[test]
    fn history_limit_compacts_and_old_watches_expire() {
        let mut s = Store::new(3, true);
        let cm = |n: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": n, "namespace": "default"}});
        let first = s.create(cm("a")).unwrap();
        let rv: u64 = first["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        for n in ["b", "c", "d"] {
            s.create(cm(n)).unwrap();
        }
        let res = s.by_kind("v1", "ConfigMap").unwrap();
        assert!(matches!(
            s.watch(res, WatchStart::After(rv - 1)),
            Err(ApiError::Expired(_))
        ));
        let opened = s.watch(res, WatchStart::After(rv + 1)).unwrap();
        assert_eq!(opened.backlog.len(), 2);
    }
}
