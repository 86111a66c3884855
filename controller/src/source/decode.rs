//! Manifest documents decoded from YAML straight into the stored objects, without building a
//! `serde_json::Value` of each document first: the same objects as decoding through `Value` (what
//! [`super::files::parse`] falls back to), in about half the time.
//!
//! Every YAML node is read with `deserialize_any`, as `Value`'s visitor reads it, and handed to the
//! target type as `Value` would hand it: scalars go through a real `Value` (so numbers, nulls,
//! non-finite floats and strings mean exactly what they meant), sequences and mappings are
//! streamed with `Value`'s rules (every element consumed, keys read as strings). Anything this
//! path does not mirror (a duplicate key, a type error, a document that is not a mapping, an
//! unsupported kind's object, a missing name) makes it give up on the whole file: the caller then
//! parses it through `Value`, and every diagnostic comes from there, unchanged.

use std::hash::Hasher as _;
use std::sync::Arc;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Number, Value};

use crate::index::Object;
use crate::object::Kind;

/// Every `deserialize_*` method but `deserialize_ignored_any`, as `$as(hint, self.0, visitor)`.
macro_rules! by_hint {
    ($as:path) => {
        by_hint!(@ $as;
            deserialize_any => Hint::Any,
            deserialize_bool => Hint::Bool,
            deserialize_i8 => Hint::Number,
            deserialize_i16 => Hint::Number,
            deserialize_i32 => Hint::Number,
            deserialize_i64 => Hint::Number,
            deserialize_i128 => Hint::Number,
            deserialize_u8 => Hint::Number,
            deserialize_u16 => Hint::Number,
            deserialize_u32 => Hint::Number,
            deserialize_u64 => Hint::Number,
            deserialize_u128 => Hint::Number,
            deserialize_f32 => Hint::Number,
            deserialize_f64 => Hint::Number,
            deserialize_char => Hint::String,
            deserialize_str => Hint::String,
            deserialize_string => Hint::String,
            deserialize_identifier => Hint::String,
            deserialize_bytes => Hint::Bytes,
            deserialize_byte_buf => Hint::Bytes,
            deserialize_option => Hint::Option,
            deserialize_unit => Hint::Unit,
            deserialize_seq => Hint::Seq,
            deserialize_map => Hint::Map,
        );

        fn deserialize_unit_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            visitor: V,
        ) -> Result<V::Value, Self::Error> {
            $as(Hint::Unit, self.0, visitor)
        }

        fn deserialize_newtype_struct<V: Visitor<'de>>(
            self,
            name: &'static str,
            visitor: V,
        ) -> Result<V::Value, Self::Error> {
            $as(Hint::NewtypeStruct(name), self.0, visitor)
        }

        fn deserialize_tuple<V: Visitor<'de>>(
            self,
            _: usize,
            visitor: V,
        ) -> Result<V::Value, Self::Error> {
            $as(Hint::Seq, self.0, visitor)
        }

        fn deserialize_tuple_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            _: usize,
            visitor: V,
        ) -> Result<V::Value, Self::Error> {
            $as(Hint::Seq, self.0, visitor)
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            _: &'static [&'static str],
            visitor: V,
        ) -> Result<V::Value, Self::Error> {
            $as(Hint::Struct, self.0, visitor)
        }

        fn deserialize_enum<V: Visitor<'de>>(
            self,
            name: &'static str,
            variants: &'static [&'static str],
            visitor: V,
        ) -> Result<V::Value, Self::Error> {
            $as(Hint::Enum(name, variants), self.0, visitor)
        }
    };
    (@ $as:path; $($method:ident => $hint:expr),* $(,)?) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
                $as($hint, self.0, visitor)
            }
        )*
    };
}

/// One document of a manifest file as the fast path read it.
#[derive(Debug)]
pub(super) enum Doc {
    /// An object of a kind duet reads, decoded and named.
    Object(Object),
    /// Anything else (a `List`, an unknown kind, a mapping without `apiVersion`), as the `Value`
    /// path would have read it.
    Value(Value),
}

/// The documents of `text` decoded straight into objects, or `None` when the file needs the
/// `Value` path (bad YAML, an object that does not decode, anything not mirrored here).
pub(super) fn documents(text: &str) -> Option<Vec<Doc>> {
    let options = serde_saphyr::options! { with_snippet: false };
    serde_saphyr::from_multiple_with_options::<Doc>(text, options).ok()
}

impl<'de> Deserialize<'de> for Doc {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Doc, D::Error> {
        deserializer.deserialize_any(DocVisitor)
    }
}

fn give_up<E: de::Error>(why: &str) -> E {
    E::custom(format_args!("manifest fast path: {why}"))
}

/// Reads a document's top-level mapping: its entries as `Value`s until `apiVersion` and `kind`
/// name a kind duet reads, then the rest streamed into that kind's type.
struct DocVisitor;

impl<'de> Visitor<'de> for DocVisitor {
    type Value = Doc;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Doc, A::Error> {
        let mut seen = Seen::default();
        let mut entries: Vec<(String, Value)> = Vec::new();
        while let Some(key) = next_key_string(&mut map, entries.is_empty())? {
            seen.insert(&key)?;
            let value: Value = map.next_value()?;
            entries.push((key, value));
            if let Some(kind) = known_kind(&entries) {
                return decode_object(kind, entries, map, seen).map(Doc::Object);
            }
        }
        Ok(Doc::Value(Value::Object(entries.into_iter().collect())))
    }
}

/// The kind `apiVersion` and `kind` name among `entries`, when duet reads it.
fn known_kind(entries: &[(String, Value)]) -> Option<Kind> {
    let field = |name: &str| {
        entries
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_str())
    };
    Kind::from_type(field("apiVersion")?, field("kind")?)
}

/// A map key as `Value`'s visitor reads it: the first with `deserialize_str`, the others with
/// `deserialize_string`.
fn next_key_string<'de, A: MapAccess<'de>>(
    map: &mut A,
    first: bool,
) -> Result<Option<String>, A::Error> {
    if first {
        map.next_key_seed(StrKey)
    } else {
        map.next_key::<String>()
    }
}

struct StrKey;

impl<'de> DeserializeSeed<'de> for StrKey {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for StrKey {
    type Value = String;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<String, E> {
        Ok(s.to_owned())
    }

    fn visit_string<E: de::Error>(self, s: String) -> Result<String, E> {
        Ok(s)
    }
}

/// The keys of one mapping so far, as hashes: a key seen twice gives up (a hash collision only
/// costs the slower path).
#[derive(Default)]
struct Seen(Vec<u64>);

impl Seen {
    fn insert<E: de::Error>(&mut self, key: &str) -> Result<(), E> {
        let mut hasher = std::hash::DefaultHasher::new();
        hasher.write(key.as_bytes());
        let hash = hasher.finish();
        if self.0.contains(&hash) {
            return Err(give_up("a key twice in one mapping"));
        }
        self.0.push(hash);
        Ok(())
    }
}

/// Decodes the rest of a document of `kind` whose first `entries` were read as `Value`s.
fn decode_object<'de, A: MapAccess<'de>>(
    kind: Kind,
    entries: Vec<(String, Value)>,
    map: A,
    seen: Seen,
) -> Result<Object, A::Error> {
    let mut access = ObjectMap {
        kind,
        read: entries.into_iter(),
        rest: map,
        seen,
        pending: None,
        named: false,
    };
    let object = decode_kind(kind, &mut access)?;
    if !access.named {
        return Err(give_up("metadata.name missing"));
    }
    Ok(object)
}

fn decode_kind<'de, A: MapAccess<'de>>(
    kind: Kind,
    access: &mut ObjectMap<A>,
) -> Result<Object, A::Error> {
    let de = ObjectDe(access);
    Ok(match kind {
        Kind::Ingress => Object::Ingress(Arc::new(Deserialize::deserialize(de)?)),
        Kind::IngressClass => Object::IngressClass(Arc::new(Deserialize::deserialize(de)?)),
        Kind::Service => Object::Service(Arc::new(Deserialize::deserialize(de)?)),
        Kind::EndpointSlice => Object::EndpointSlice(Arc::new(Deserialize::deserialize(de)?)),
        Kind::Secret => Object::Secret(Arc::new(Deserialize::deserialize(de)?)),
        Kind::Namespace => Object::Namespace(Arc::new(Deserialize::deserialize(de)?)),
        Kind::GatewayClass => Object::GatewayClass(Arc::new(Deserialize::deserialize(de)?)),
        Kind::Gateway => Object::Gateway(Arc::new(Deserialize::deserialize(de)?)),
        Kind::HttpRoute => Object::HttpRoute(Arc::new(Deserialize::deserialize(de)?)),
        Kind::GrpcRoute => Object::GrpcRoute(Arc::new(Deserialize::deserialize(de)?)),
        Kind::ReferenceGrant => Object::ReferenceGrant(Arc::new(Deserialize::deserialize(de)?)),
    })
}

/// `metadata` as the `Value` path leaves it before decoding: the namespace set (`default` when
/// absent or not a string) for namespaced kinds, removed for the others. Whether it has a
/// non-empty string name (the `Value` path's requirement).
pub(super) fn settle_metadata(kind: Kind, meta: &mut Value) -> bool {
    let named = meta
        .get("name")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    let namespace = meta
        .get("namespace")
        .and_then(Value::as_str)
        .unwrap_or("default")
        .to_owned();
    if let Some(meta) = meta.as_object_mut() {
        if kind.namespaced() {
            meta.insert("namespace".to_owned(), Value::String(namespace));
        } else {
            meta.remove("namespace");
        }
    }
    named
}

/// The top-level mapping of an object: the entries already read (as `Value`s), then the rest
/// streamed; `metadata` is read as a `Value` and settled first.
struct ObjectMap<A> {
    kind: Kind,
    read: std::vec::IntoIter<(String, Value)>,
    rest: A,
    seen: Seen,
    /// The value of the key last returned, when it was read as a `Value`.
    pending: Option<Value>,
    /// Whether `metadata` came with a name.
    named: bool,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for ObjectMap<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        let (key, value) = match self.read.next() {
            Some((key, value)) => (key, Some(value)),
            None => match self.rest.next_key::<String>()? {
                Some(key) => {
                    self.seen.insert(&key)?;
                    let value = if key == "metadata" {
                        Some(self.rest.next_value::<Value>()?)
                    } else {
                        None
                    };
                    (key, value)
                }
                None => return Ok(None),
            },
        };
        self.pending = value.map(|mut value| {
            if key == "metadata" {
                self.named = settle_metadata(self.kind, &mut value);
            }
            value
        });
        seed.deserialize(Value::String(key))
            .map(Some)
            .map_err(de::Error::custom)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        match self.pending.take() {
            Some(value) => seed.deserialize(value).map_err(de::Error::custom),
            None => self.rest.next_value_seed(Shim(seed)),
        }
    }
}

/// An object's top-level mapping as a deserializer (`Value::Object`'s rules).
struct ObjectDe<'a, A>(&'a mut ObjectMap<A>);

impl<'de, A: MapAccess<'de>> Deserializer<'de> for ObjectDe<'_, A> {
    type Error = A::Error;

    by_hint!(object_as);

    fn deserialize_ignored_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, A::Error> {
        Err(give_up("an object ignored"))
    }
}

/// What `Value::Object`'s deserializer does with an object's mapping for `hint`.
fn object_as<'de, A: MapAccess<'de>, V: Visitor<'de>>(
    hint: Hint,
    access: &mut ObjectMap<A>,
    visitor: V,
) -> Result<V::Value, A::Error> {
    if !matches!(hint, Hint::Any | Hint::Map | Hint::Struct) {
        return Err(give_up("an object as something else than a mapping"));
    }
    let value = visitor.visit_map(&mut *access)?;
    if access.read.len() != 0 || access.rest.next_key::<IgnoredAny>()?.is_some() {
        return Err(give_up("entries left in a mapping"));
    }
    Ok(value)
}

/// What the target type asked a node for (the `deserialize_*` method called), as far as
/// `Value`'s deserializer tells them apart.
#[derive(Clone, Copy)]
enum Hint {
    Any,
    Bool,
    Number,
    String,
    Bytes,
    Option,
    Unit,
    Seq,
    Map,
    Struct,
    NewtypeStruct(&'static str),
    Enum(&'static str, &'static [&'static str]),
}

/// What `Value`'s deserializer does with `value` when asked for `hint`.
fn value_as<'de, V: Visitor<'de>>(
    hint: Hint,
    value: Value,
    visitor: V,
) -> Result<V::Value, serde_json::Error> {
    match hint {
        Hint::Any => value.deserialize_any(visitor),
        Hint::Bool => value.deserialize_bool(visitor),
        // `Value` treats every number method alike (no `arbitrary_precision`).
        Hint::Number => value.deserialize_i64(visitor),
        Hint::String => value.deserialize_string(visitor),
        Hint::Bytes => value.deserialize_byte_buf(visitor),
        Hint::Option => value.deserialize_option(visitor),
        Hint::Unit => value.deserialize_unit(visitor),
        Hint::Seq => value.deserialize_seq(visitor),
        Hint::Map => value.deserialize_map(visitor),
        Hint::Struct => value.deserialize_struct("", &[], visitor),
        Hint::NewtypeStruct(name) => value.deserialize_newtype_struct(name, visitor),
        Hint::Enum(name, variants) => value.deserialize_enum(name, variants, visitor),
    }
}

/// A YAML node that reads as `Value` would, then behaves as `Value`'s deserializer.
struct Shim<D>(D);

/// A seed given a [`Shim`] instead of the YAML deserializer.
impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Shim<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(Shim(deserializer))
    }
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Shim<D> {
    type Error = D::Error;

    by_hint!(node_as);

    /// `Value` reads a skipped node whole (a number out of range fails there too), then drops it.
    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        Value::deserialize(self.0)?;
        visitor.visit_unit()
    }
}

/// A YAML node read as `Value`'s visitor reads it, handed on for `hint`.
fn node_as<'de, D: Deserializer<'de>, V: Visitor<'de>>(
    hint: Hint,
    node: D,
    visitor: V,
) -> Result<V::Value, D::Error> {
    node.deserialize_any(Emulate { hint, visitor })
}

/// Receives a node's `deserialize_any` calls as `Value`'s visitor would, and hands the node to
/// `visitor` as `Value`'s deserializer would for `hint`.
struct Emulate<V> {
    hint: Hint,
    visitor: V,
}

impl<V> Emulate<V> {
    fn scalar<'de, E: de::Error>(self, value: Value) -> Result<V::Value, E>
    where
        V: Visitor<'de>,
    {
        value_as(self.hint, value, self.visitor).map_err(E::custom)
    }
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Emulate<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        self.visitor.expecting(f)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<V::Value, E> {
        self.scalar(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<V::Value, E> {
        self.scalar(Value::Number(v.into()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<V::Value, E> {
        self.scalar(Value::Number(v.into()))
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<V::Value, E> {
        let number = Number::deserialize(de::value::I128Deserializer::<E>::new(v))?;
        self.scalar(Value::Number(number))
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<V::Value, E> {
        let number = Number::deserialize(de::value::U128Deserializer::<E>::new(v))?;
        self.scalar(Value::Number(number))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<V::Value, E> {
        self.scalar(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<V::Value, E> {
        self.scalar(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<V::Value, E> {
        self.scalar(Value::String(v))
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.scalar(Value::Null)
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.scalar(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        seq_as(self.hint, seq, self.visitor)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        map_as(self.hint, map, self.visitor)
    }
}

/// What `Value::Array`'s deserializer does for `hint`; gives up where it would not call the
/// visitor with the elements.
fn seq_as<'de, A: SeqAccess<'de>, V: Visitor<'de>>(
    hint: Hint,
    seq: A,
    visitor: V,
) -> Result<V::Value, A::Error> {
    match hint {
        Hint::Any | Hint::Bytes | Hint::Seq | Hint::Struct => {
            let mut elements = ShimSeq(seq);
            let value = visitor.visit_seq(&mut elements)?;
            if elements.0.next_element::<IgnoredAny>()?.is_some() {
                return Err(give_up("elements left in a sequence"));
            }
            Ok(value)
        }
        Hint::Option => visitor.visit_some(SeqNode(seq)),
        Hint::NewtypeStruct(_) => visitor.visit_newtype_struct(SeqNode(seq)),
        _ => Err(give_up("a sequence where it does not go")),
    }
}

/// What `Value::Object`'s deserializer does for `hint`; gives up where it would not call the
/// visitor with the entries (an enum as a one-entry mapping included).
fn map_as<'de, A: MapAccess<'de>, V: Visitor<'de>>(
    hint: Hint,
    map: A,
    visitor: V,
) -> Result<V::Value, A::Error> {
    match hint {
        Hint::Any | Hint::Map | Hint::Struct => {
            let mut entries = ShimMap {
                inner: map,
                seen: Seen::default(),
                first: true,
            };
            let value = visitor.visit_map(&mut entries)?;
            if entries.inner.next_key::<IgnoredAny>()?.is_some() {
                return Err(give_up("entries left in a mapping"));
            }
            Ok(value)
        }
        Hint::Option => visitor.visit_some(MapNode(map)),
        Hint::NewtypeStruct(_) => visitor.visit_newtype_struct(MapNode(map)),
        _ => Err(give_up("a mapping where it does not go")),
    }
}

/// A sequence already begun, asked again (inside an `Option` or a newtype).
struct SeqNode<A>(A);

impl<'de, A: SeqAccess<'de>> Deserializer<'de> for SeqNode<A> {
    type Error = A::Error;

    by_hint!(seq_as);

    fn deserialize_ignored_any<V: Visitor<'de>>(
        mut self,
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        while self.0.next_element::<Value>()?.is_some() {}
        visitor.visit_unit()
    }
}

/// A mapping already begun, asked again (inside an `Option` or a newtype).
struct MapNode<A>(A);

impl<'de, A: MapAccess<'de>> Deserializer<'de> for MapNode<A> {
    type Error = A::Error;

    by_hint!(map_as);

    fn deserialize_ignored_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, A::Error> {
        Err(give_up("a mapping ignored"))
    }
}

/// A sequence's elements, each read through a [`Shim`].
struct ShimSeq<A>(A);

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for ShimSeq<A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, A::Error> {
        self.0.next_element_seed(Shim(seed))
    }
}

/// A mapping's entries: keys read as strings (as `Value`'s visitor does) and handed on as
/// `Value::String`s, values through a [`Shim`]; a key seen twice gives up.
struct ShimMap<A> {
    inner: A,
    seen: Seen,
    first: bool,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for ShimMap<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        let first = std::mem::take(&mut self.first);
        let Some(key) = next_key_string(&mut self.inner, first)? else {
            return Ok(None);
        };
        self.seen.insert(&key)?;
        seed.deserialize(Value::String(key))
            .map(Some)
            .map_err(de::Error::custom)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.inner.next_value_seed(Shim(seed))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::files::{parse, parse_through_values, Parsed};
    use super::*;

    /// Parses `text` both ways (with `previous` from the `Value` path's parse of `base`) and
    /// asserts the same objects and problems; whether the direct path took the whole file.
    fn same_both_ways(text: &str, base: &str) -> bool {
        let previous = parse_through_values(base, &[]).objects;
        let direct: Parsed = parse(text, &previous);
        let through_values = parse_through_values(text, &previous);
        assert_eq!(direct.objects, through_values.objects, "objects of\n{text}");
        assert_eq!(
            direct.problems, through_values.problems,
            "problems of\n{text}"
        );
        documents(text).is_some()
    }

    const SERVICE: &str = "apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop, labels: {app: web}}
spec:
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  ports: [{name: http, port: 80, targetPort: http}, {name: alt, port: 8080, targetPort: 9090}]
";

    const SLICE: &str = "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-v6
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv6
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
  - addresses: [\"2001:db8::1\"]
    conditions: {ready: true}
    zone: a
    targetRef: {kind: Pod, namespace: shop, name: web-0, uid: 00000000-0000-4000-8000-000000000000}
  - addresses: [\"2001:db8::2\"]
    conditions: {ready: false, terminating: true}
";

    const INGRESS: &str = "apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: web
  namespace: shop
  annotations: {nginx.ingress.kubernetes.io/rewrite-target: /, duet.dev/x: \"1\"}
spec:
  ingressClassName: duet
  tls: [{hosts: [web.example], secretName: web-tls}]
  defaultBackend: {service: {name: web, port: {number: 80}}}
  rules:
    - host: web.example
      http:
        paths:
          - {path: /api, pathType: Prefix, backend: {service: {name: web, port: {name: http}}}}
          - {path: /x, pathType: Exact, backend: {resource: {apiGroup: a, kind: B, name: c}}}
status: {loadBalancer: {ingress: [{ip: 192.0.2.1}]}}
";

    const CLASS: &str = "apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: duet, annotations: {ingressclass.kubernetes.io/is-default-class: \"true\"}}
spec: {controller: duet.dev/ingress-controller}
";

    const SECRET: &str = "apiVersion: v1
kind: Secret
type: kubernetes.io/tls
metadata: {name: web-tls}
data: {tls.crt: aGVsbG8=, tls.key: d29ybGQ=}
stringData: {note: plain}
";

    /// Every manifest in the repository's test fixtures and examples decodes the same both ways,
    /// and nearly all of them directly.
    #[test]
    fn the_fixtures_decode_the_same_both_ways() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        for dir in ["controller/tests/fixtures", "examples"] {
            collect_yaml(&root.join(dir), &mut files);
        }
        assert!(files.len() > 50, "{} fixtures", files.len());
        let mut direct = 0;
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            if same_both_ways(&text, "") {
                direct += 1;
            }
        }
        assert!(
            direct * 10 >= files.len() * 8,
            "{direct} of {} fixtures decoded directly",
            files.len()
        );
    }

    fn collect_yaml(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                collect_yaml(&path, files);
            } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                files.push(path);
            }
        }
    }

    /// The stored kinds as `gen-scale.py` and users write them, one per file and together, take
    /// the direct path and give what the `Value` path gives.
    #[test]
    fn ordinary_objects_decode_directly_and_the_same() {
        for text in [SERVICE, SLICE, INGRESS, CLASS, SECRET] {
            assert!(same_both_ways(text, ""), "fell back on\n{text}");
        }
        let all = [SERVICE, SLICE, INGRESS, CLASS, SECRET].join("---\n");
        assert!(same_both_ways(&all, ""));
        assert_eq!(parse(&all, &[]).objects.len(), 5);
        let odd_orders = [
            // kind and apiVersion after the rest, metadata last.
            "spec: {controller: c}\nmetadata: {name: a}\nkind: IngressClass\napiVersion: networking.k8s.io/v1\n",
            "kind: Service\nspec: {ports: [{port: 1}]}\napiVersion: v1\nmetadata: {name: a}\n",
            "apiVersion: v1\nkind: Service\nspec: {ports: [{port: 1}]}\nmetadata: {name: a, namespace: n}\n",
        ];
        for text in odd_orders {
            assert!(same_both_ways(text, ""), "fell back on\n{text}");
        }
    }

    /// Odd and hostile YAML: whichever path a file takes, objects and problems are those of the
    /// `Value` path (with last good versions from a previous parse of the ordinary objects).
    #[test]
    fn hostile_and_odd_yaml_gives_what_the_value_path_gives() {
        let base = [SERVICE, SLICE, INGRESS, CLASS, SECRET].join("---\n");
        let mut cases: Vec<String> = Vec::new();
        let edits: &[(&str, &str)] = &[
            ("port: 80,", "port: 99999999999999999999999,"),
            ("port: 80,", "port: -99999999999999999999999,"),
            ("port: 80,", "port: .inf,"),
            ("port: 80,", "port: .nan,"),
            ("port: 80,", "port: 0x50,"),
            ("port: 80,", "port: 0o120,"),
            ("port: 80,", "port: +80,"),
            ("port: 80,", "port: 80.0,"),
            ("port: 80,", "port: \"80\","),
            ("port: 80,", "port: !!str 80,"),
            ("port: 80,", "port: ~,"),
            ("port: 80,", "port: [80],"),
            ("port: 80,", "port: 80, port: 81,"),
            ("targetPort: 9090", "targetPort: 9090.5"),
            ("targetPort: 9090", "targetPort: \"9090\""),
            ("targetPort: 9090", "targetPort: {a: 1}"),
            ("targetPort: 9090", "targetPort: -1"),
            ("{app: web}", "{app: web, app: web2}"),
            ("{app: web}", "{80: web, true: x, ~: y}"),
            ("{app: web}", "{app: 80}"),
            ("{app: web}", "[app]"),
            ("{app: web}", "~"),
            ("{app: web}", "{app: web, huge: 123456789012345678901234567890}"),
            ("ipFamilies: [IPv4, IPv6]", "ipFamilies: [IPv4, IPv6]\n  unknown: 123456789012345678901234567890"),
            ("ipFamilies: [IPv4, IPv6]", "ipFamilies: [IPv4, IPv6]\n  unknown: [.inf, .nan, -.inf]"),
            ("ipFamilies: [IPv4, IPv6]", "ipFamilies: [IPv4, IPv6]\n  unknown: !custom {a: 1}"),
            ("ipFamilies: [IPv4, IPv6]", "ipFamilies: [IPv4, IPv6]\n  unknown: !!int 99999999999999999999999999999999999999999"),
            ("ipFamilies: [IPv4, IPv6]", "ipFamilies: [IPv4, IPv6]\n  unknown: !!binary aGVsbG8="),
            ("ipFamilies: [IPv4, IPv6]", "ipFamilies: {a: 1}"),
            ("ipFamilies: [IPv4, IPv6]", "ipFamilies: [IPv4, 6]"),
            ("namespace: shop, labels", "namespace: ~, labels"),
            ("namespace: shop, labels", "namespace: 5, labels"),
            ("namespace: shop, labels", "namespace: \"\", labels"),
            ("namespace: shop, labels", "namespace: [a], labels"),
            ("{name: web, namespace: shop,", "{name: 123, namespace: shop,"),
            ("{name: web, namespace: shop,", "{name: \"\", namespace: shop,"),
            ("{name: web, namespace: shop,", "{namespace: shop,"),
            ("metadata: {name: web, namespace: shop, labels: {app: web}}", "metadata: [web]"),
            ("metadata: {name: web, namespace: shop, labels: {app: web}}", "metadata: ~"),
            ("metadata: {name: web, namespace: shop, labels: {app: web}}", ""),
            ("metadata: {name: duet,", "metadata: {name: duet, namespace: x,"),
            ("metadata: {name: duet,", "metadata: {name: duet, namespace: [1],"),
            ("kind: Service", "kind: Service\nkind: Service"),
            ("kind: Service", "kind: Servic"),
            ("kind: Service", "kind: 5"),
            ("apiVersion: v1\nkind: Service", "kind: Service"),
            ("ready: true}", "ready: yes}"),
            ("ready: true}", "ready: \"true\"}"),
            ("ready: true}", "ready: True}"),
            ("ready: true}", "ready: 1}"),
            ("ready: false, terminating: true", "ready: ~, terminating: ~"),
            ("conditions: {ready: true}", "conditions: ~"),
            ("addresses: [\"2001:db8::1\"]", "addresses: []"),
            ("addresses: [\"2001:db8::1\"]", "addresses: [\"2001:db8::1\", \"bad\"]"),
            ("addresses: [\"2001:db8::1\"]", "addresses: [\"fe80::1%eth0\"]"),
            ("addressType: IPv6", "addressType: IPv5"),
            ("uid: 00000000-0000-4000-8000-000000000000", "uid: 0"),
            ("tls.crt: aGVsbG8=", "tls.crt: not base64!"),
            ("tls.crt: aGVsbG8=", "tls.crt: !!binary aGVsbG8="),
            ("tls.crt: aGVsbG8=", "tls.crt: 12"),
            ("stringData: {note: plain}", "stringData: {note: plain, note: again}"),
            ("pathType: Prefix", "pathType: Prefx"),
            ("pathType: Prefix", "pathType: ~"),
            ("status: {", "status: 5\nx: {"),
            ("spec:\n  ingressClassName: duet", "spec: ~\nx:\n  ingressClassName: duet"),
            ("spec:\n  ingressClassName: duet", "spec: []\nx:\n  ingressClassName: duet"),
            ("spec: {controller: duet.dev/ingress-controller}", "spec: {controller: [a]}"),
            ("type: kubernetes.io/tls", "type: 5"),
            ("- host: web.example", "- host: &h web.example\n      x: *h"),
            ("{name: web, namespace: shop,", "&m {name: web, namespace: shop,"),
            ("kind: Secret", "kind: Secret\nextra: {<<: {a: 1}, b: 2}"),
            ("ports: [{name: http, port: 8080, protocol: TCP}]", "base: &p [{name: http, port: 8080, protocol: TCP}]\nports: *p"),
            ("ports: [{name: http, port: 8080, protocol: TCP}]", "ports: [{<<: {name: http, port: 8080}, protocol: TCP}]"),
            ("ports: [{name: http, port: 8080, protocol: TCP}]", "ports: [{<<: {name: http, port: 8080}, port: 8081}]"),
            ("zone: a", "zone: \"\\u00e9\\x00\""),
            ("zone: a", "zone: |\n      multi\n      line"),
            ("zone: a", "zone: >-\n      folded\n      line"),
            ("rewrite-target: /", "rewrite-target: \"\\ud800\""),
            ("kind: Ingress", "kind: [unclosed"),
            ("kind: Ingress", "kind: Ingress\n\t bad: tab"),
            ("apiVersion: v1\nkind: Service", "%YAML 1.2\n---\napiVersion: v1\nkind: Service"),
            ("kind: IngressClass", "kind: IngressClass\n...\n---\n"),
        ];
        for (from, to) in edits {
            assert!(base.contains(from), "{from}");
            cases.push(base.replacen(from, to, 1));
        }
        let whole_documents = [
            "",
            "---\n",
            "--- ~\n",
            "--- !!null\n",
            "hello\n",
            "- a\n- b\n",
            "42\n",
            "{}\n",
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: api}\n",
            "apiVersion: v1\nkind: List\nitems:\n  - {apiVersion: v1, kind: Secret, metadata: {name: a, namespace: x}}\n  - {apiVersion: v1, kind: Secret, metadata: {name: b}}\n",
            "apiVersion: v1\nkind: List\n",
            "apiVersion: v1\nkind: List\nitems: [{apiVersion: v1, kind: Service, metadata: {name: s}, spec: {ports: [{port: x}]}}, 5]\n",
            "kind: List\napiVersion: v1\nitems: []\n",
            "apiVersion: v1\nkind: Secret\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: a}\n",
            "apiVersion: v1\nkind: Secret\nmetadata: {name: a}\napiVersion: v1\n",
            "? [complex, key]\n: value\napiVersion: v1\nkind: Secret\nmetadata: {name: a}\n",
            "apiVersion: v1\nkind: Secret\nmetadata: {name: a}\n? [complex, key]\n: value\n",
            "apiVersion: v1\nkind: Secret\nmetadata: {name: a, labels: {[x]: y}}\n",
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: team, labels: {a: b}}\n",
            "a: &a [*a]\n",
            "apiVersion: v1\nkind: Secret\nmetadata: {name: a}\ndata: {k: !!binary aGVsbG8=}\n",
            "apiVersion: !!str v1\nkind: !!str Secret\nmetadata: {name: !!str 12}\n",
            "apiVersion: v1\nkind: Secret\nmetadata: {name: !!int \"12\"}\n",
        ];
        cases.extend(whole_documents.iter().map(|s| (*s).to_owned()));
        for gateway in GATEWAY {
            cases.push((*gateway).to_owned());
        }
        let mut direct = 0;
        for text in &cases {
            if same_both_ways(text, &base) {
                direct += 1;
            }
        }
        // Most edits still decode directly (a changed value, an odd order, an alias): the
        // comparison above covers the direct path, not only the fallback.
        assert!(
            direct >= cases.len() / 3,
            "{direct} of {} direct",
            cases.len()
        );
    }

    const GATEWAY: &[&str] = &[
        "apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: shop}
spec:
  parentRefs: [{name: gw, sectionName: http, port: 80}]
  hostnames: [web.example]
  rules:
    - matches: [{path: {type: PathPrefix, value: /a}, headers: [{name: x, value: y}], method: GET}]
      filters: [{type: RequestHeaderModifier, requestHeaderModifier: {add: [{name: a, value: b}]}}]
      backendRefs: [{name: web, port: 80, weight: 3}]
",
        "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw}
spec:
  gatewayClassName: duet
  listeners: [{name: http, protocol: HTTP, port: 80, allowedRoutes: {namespaces: {from: All}}}]
",
        "apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r}
spec:
  rules: [{matches: [{path: {type: Regex, value: 5}}]}]
",
    ];

    /// What the direct path mirrors of `Value`: a number too large for `Value` fails in a field
    /// duet skips too, and `.inf` is a null.
    #[test]
    fn the_direct_path_reads_numbers_and_skipped_fields_as_value_does() {
        let huge = "apiVersion: v1\nkind: Secret\nmetadata: {name: a}\nunknown: 123456789012345678901234567890\n";
        assert_eq!(
            documents(huge).is_some(),
            serde_saphyr::from_str::<Value>(huge).is_ok()
        );
        let inf = "apiVersion: v1\nkind: Secret\nmetadata: {name: a}\ntype: .inf\n";
        let parsed = parse(inf, &[]);
        let reference = parse_through_values(inf, &[]);
        assert_eq!(parsed.objects, reference.objects);
        assert_eq!(parsed.problems, reference.problems);
    }
}
