//! Watched objects decoded without `metadata.managedFields` ([`Lean`]). The API server sends
//! every object with its field-ownership records: one entry per writer, whose `fieldsV1` names
//! every field that writer set. k8s-openapi decodes it into a `serde_json::Value` tree (a map per
//! field, a string per key), so a list page of 500 EndpointSlices of 10 endpoints decoded about
//! as many allocations for it as for the slices themselves, all dropped by [`trim`] right
//! after. Here the decoder skips that value in the JSON text instead, without allocating.
//!
//! Only `managedFields` directly under the object's own `metadata` is skipped; a label,
//! annotation or field of that name anywhere else is decoded as before.
//!
//! [`trim`]: super::watch::trim

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::{
    self, DeserializeSeed, Deserializer, IgnoredAny, IntoDeserializer as _, MapAccess, Visitor,
};
use serde::Deserialize;

/// The key skipped in the object's `metadata`.
const MANAGED_FIELDS: &str = "managedFields";

/// An API object `W` as the watchers decode it: without `metadata.managedFields`.
#[derive(Clone, Debug, PartialEq)]
pub struct Lean<W>(pub W);

impl<W: Resource> Resource for Lean<W> {
    type DynamicType = W::DynamicType;
    type Scope = W::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        W::kind(dt)
    }

    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        W::group(dt)
    }

    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        W::version(dt)
    }

    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        W::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        self.0.meta()
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.0.meta_mut()
    }
}

impl<'de, W: Deserialize<'de>> Deserialize<'de> for Lean<W> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        W::deserialize(Object(deserializer)).map(Lean)
    }
}

/// A map key: borrowed from the text when it holds no escapes.
enum Key<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl Key<'_> {
    fn as_str(&self) -> &str {
        match self {
            Key::Borrowed(s) => s,
            Key::Owned(s) => s,
        }
    }
}

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key::Borrowed(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key::Owned(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key::Owned(v))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

impl<'de> Key<'de> {
    /// Hands the key to the caller's seed (the API type's field identifier).
    fn give<S: DeserializeSeed<'de>, E: de::Error>(self, seed: S) -> Result<S::Value, E> {
        match self {
            Key::Borrowed(s) => seed.deserialize(de::value::BorrowedStrDeserializer::new(s)),
            Key::Owned(s) => seed.deserialize(s.into_deserializer()),
        }
    }
}

/// Where in the object a deserializer is: the object itself, or its `metadata`.
trait Level {
    /// Whether this map's entry of `key` is skipped.
    fn skips(key: &str) -> bool;
    /// Whether the value of `key` is the object's `metadata`.
    fn metadata(key: &str) -> bool;
}

/// The object.
struct Top;
/// The object's `metadata`.
struct Meta;

impl Level for Top {
    fn skips(_: &str) -> bool {
        false
    }
    fn metadata(key: &str) -> bool {
        key == "metadata"
    }
}

impl Level for Meta {
    fn skips(key: &str) -> bool {
        key == MANAGED_FIELDS
    }
    fn metadata(_: &str) -> bool {
        false
    }
}

/// The object's deserializer.
struct Object<D>(D);

/// The `metadata` value's deserializer (an `Option<ObjectMeta>` asks for an option first).
struct Metadata<D>(D);

/// A visitor of the map at level `L`.
struct MapVisitor<V, L>(V, PhantomData<L>);

/// The map at level `L`, skipping what `L` skips and marking the metadata's value.
struct Entries<A, L> {
    map: A,
    metadata_next: bool,
    level: PhantomData<L>,
}

/// The metadata's value as a seed.
struct MetadataSeed<S>(S);

/// An option's visitor whose `Some` is the metadata.
struct OptionVisitor<V>(V);

impl<'de, V: Visitor<'de>, L: Level> Visitor<'de> for MapVisitor<V, L> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.0.visit_map(Entries::<A, L> {
            map,
            metadata_next: false,
            level: PhantomData,
        })
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.0.visit_seq(seq)
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_unit()
    }
}

impl<'de, A: MapAccess<'de>, L: Level> MapAccess<'de> for Entries<A, L> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        loop {
            let Some(key) = self.map.next_key::<Key<'de>>()? else {
                return Ok(None);
            };
            if L::skips(key.as_str()) {
                self.map.next_value::<IgnoredAny>()?;
                continue;
            }
            self.metadata_next = L::metadata(key.as_str());
            return key.give(seed).map(Some);
        }
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        if std::mem::take(&mut self.metadata_next) {
            self.map.next_value_seed(MetadataSeed(seed))
        } else {
            self.map.next_value_seed(seed)
        }
    }

    fn size_hint(&self) -> Option<usize> {
        self.map.size_hint()
    }
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for MetadataSeed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(Metadata(deserializer))
    }
}

impl<'de, V: Visitor<'de>> Visitor<'de> for OptionVisitor<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        self.0.visit_some(Metadata(deserializer))
    }
}

/// The deserializer methods that pass through unchanged.
macro_rules! forward {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
            self.0.$method(visitor)
        }
    )*};
}

/// A deserializer whose maps (struct or map) are read at level `$level`; `$option` is how it
/// reads an option.
macro_rules! level_deserializer {
    ($name:ident, $level:ty, |$self:ident, $visitor:ident| $option:expr) => {
        impl<'de, D: Deserializer<'de>> Deserializer<'de> for $name<D> {
            type Error = D::Error;

            fn deserialize_struct<V: Visitor<'de>>(
                self,
                name: &'static str,
                fields: &'static [&'static str],
                visitor: V,
            ) -> Result<V::Value, D::Error> {
                self.0
                    .deserialize_struct(name, fields, MapVisitor::<V, $level>(visitor, PhantomData))
            }

            fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
                self.0
                    .deserialize_map(MapVisitor::<V, $level>(visitor, PhantomData))
            }

            fn deserialize_option<V: Visitor<'de>>(
                $self,
                $visitor: V,
            ) -> Result<V::Value, D::Error> {
                $option
            }

            fn deserialize_unit_struct<V: Visitor<'de>>(
                self,
                name: &'static str,
                visitor: V,
            ) -> Result<V::Value, D::Error> {
                self.0.deserialize_unit_struct(name, visitor)
            }

            fn deserialize_newtype_struct<V: Visitor<'de>>(
                self,
                name: &'static str,
                visitor: V,
            ) -> Result<V::Value, D::Error> {
                self.0.deserialize_newtype_struct(name, visitor)
            }

            fn deserialize_tuple<V: Visitor<'de>>(
                self,
                len: usize,
                visitor: V,
            ) -> Result<V::Value, D::Error> {
                self.0.deserialize_tuple(len, visitor)
            }

            fn deserialize_tuple_struct<V: Visitor<'de>>(
                self,
                name: &'static str,
                len: usize,
                visitor: V,
            ) -> Result<V::Value, D::Error> {
                self.0.deserialize_tuple_struct(name, len, visitor)
            }

            fn deserialize_enum<V: Visitor<'de>>(
                self,
                name: &'static str,
                variants: &'static [&'static str],
                visitor: V,
            ) -> Result<V::Value, D::Error> {
                self.0.deserialize_enum(name, variants, visitor)
            }

            fn is_human_readable(&self) -> bool {
                self.0.is_human_readable()
            }

            forward! {
                deserialize_any deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32
                deserialize_i64 deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32
                deserialize_u64 deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char
                deserialize_str deserialize_string deserialize_bytes deserialize_byte_buf
                deserialize_unit deserialize_seq deserialize_identifier deserialize_ignored_any
            }
        }
    };
}

level_deserializer!(Object, Top, |self, visitor| self
    .0
    .deserialize_option(visitor));
level_deserializer!(Metadata, Meta, |self, visitor| self
    .0
    .deserialize_option(OptionVisitor(visitor)));

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use k8s_openapi::api::networking::v1::Ingress;

    /// An Ingress as the API server sends it: managedFields with a fieldsV1 tree, and a label
    /// and an annotation named like it.
    const INGRESS: &str = r#"{
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {
            "name": "web", "namespace": "shop", "uid": "00000000-0000-4000-8000-000000000001",
            "resourceVersion": "42", "creationTimestamp": "2026-12-02T06:00:00Z",
            "labels": {"managedFields": "kept"},
            "annotations": {"managedFields": "kept too", "duet.dev/upstream-family": "PreferIPv6"},
            "managedFields": [{"manager": "kubectl", "operation": "Update",
                "apiVersion": "networking.k8s.io/v1", "time": "2026-12-02T06:00:00Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {"f:rules": {}, "f:ingressClassName": {}}}}]
        },
        "spec": {"ingressClassName": "duet", "rules": [{"host": "a.example", "http": {"paths": [
            {"path": "/", "pathType": "Prefix",
             "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]},
        "status": {"loadBalancer": {}}
    }"#;

    #[test]
    fn managed_fields_are_skipped_and_everything_else_decoded() {
        let lean: Lean<Ingress> = serde_json::from_str(INGRESS).unwrap();
        let mut full: Ingress = serde_json::from_str(INGRESS).unwrap();
        assert!(full.metadata.managed_fields.is_some());
        full.metadata.managed_fields = None;
        assert_eq!(lean.0, full);
        let labels = lean.0.metadata.labels.as_ref().unwrap();
        assert_eq!(labels.get(MANAGED_FIELDS).map(String::as_str), Some("kept"));
        let annotations = lean.0.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations.len(), 2);
    }

    #[test]
    fn a_list_and_a_watch_event_of_lean_objects_decode() {
        let slice = r#"{"metadata": {"name": "web-1", "namespace": "shop",
            "managedFields": [{"manager": "m", "fieldsV1": {"f:endpoints": {}}}],
            "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true}}]}"#;
        let list = format!(
            r#"{{"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList",
                "metadata": {{"resourceVersion": "7"}}, "items": [{slice}, {slice}]}}"#
        );
        let decoded: kube::core::ObjectList<Lean<EndpointSlice>> =
            serde_json::from_str(&list).unwrap();
        assert_eq!(decoded.items.len(), 2);
        let item = &decoded.items[0].0;
        assert_eq!(item.metadata.managed_fields, None);
        assert_eq!(item.endpoints.as_ref().unwrap()[0].addresses, ["10.0.0.1"]);
        let event = format!(r#"{{"type": "MODIFIED", "object": {slice}}}"#);
        let decoded: kube::core::WatchEvent<Lean<EndpointSlice>> =
            serde_json::from_str(&event).unwrap();
        let kube::core::WatchEvent::Modified(item) = decoded else {
            panic!("a MODIFIED event");
        };
        assert_eq!(item.0.metadata.name.as_deref(), Some("web-1"));
        assert_eq!(item.0.metadata.managed_fields, None);
    }

    #[test]
    fn keys_with_escapes_and_bad_input_are_handled() {
        // An escaped key is not borrowed from the text; it still names the field.
        let text = r#"{"metadata": {"na\u006de": "web", "managedFields": "not even a list"}}"#;
        let lean: Lean<Ingress> = serde_json::from_str(text).unwrap();
        assert_eq!(lean.0.metadata.name.as_deref(), Some("web"));
        // Errors are the API type's own.
        assert!(serde_json::from_str::<Lean<Ingress>>(r#"{"metadata": 3}"#).is_err());
        assert!(serde_json::from_str::<Lean<Ingress>>(r#"[1]"#).is_err());
        assert!(serde_json::from_str::<Lean<Ingress>>(r#"{"metadata": {"name": 1}}"#).is_err());
        let null_meta: Lean<Ingress> = serde_json::from_str(r#"{"metadata": null}"#).unwrap();
        assert_eq!(null_meta.0.metadata, ObjectMeta::default());
    }
}
