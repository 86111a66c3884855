//! [`TargetKey`]: the text of a target's identity, kept inline when it is at most 38 bytes (a
//! pod uid is 36) instead of in an allocation of its own (an `Arc<str>` of a uid is 16 bytes
//! plus a 64-byte block: at 100,000 pods, 6.4 MB and 100,000 allocations per snapshot build).
//! It reads, compares, hashes, orders, prints and serialises as its text.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::Arc;

use serde::{Serialize, Serializer};

/// The longest text kept inline.
const INLINE: usize = 38;

/// A target identity's text (see the module documentation). 40 bytes.
#[derive(Clone)]
pub struct TargetKey(Repr);

#[derive(Clone)]
enum Repr {
    /// `bytes[..len]` is the text (valid UTF-8: copied from a `str`).
    Inline { len: u8, bytes: [u8; INLINE] },
    /// Longer texts.
    Shared(Arc<str>),
}

impl TargetKey {
    /// The key of `text`.
    pub fn new(text: &str) -> TargetKey {
        TargetKey::inline(text.as_bytes()).unwrap_or_else(|| TargetKey(Repr::Shared(text.into())))
    }

    /// The key of an ASCII text given as bytes (a pod uid as the endpoint index keeps it): no
    /// UTF-8 validation, only the cheaper ASCII check; `None` when a byte is not ASCII.
    pub fn from_ascii(text: &[u8]) -> Option<TargetKey> {
        if !text.is_ascii() {
            return None;
        }
        // ASCII is UTF-8: a longer text is shared as `new` shares it.
        TargetKey::inline(text).or_else(|| std::str::from_utf8(text).ok().map(TargetKey::new))
    }

    /// `text` kept inline, if it fits; the caller vouches that it is UTF-8.
    fn inline(text: &[u8]) -> Option<TargetKey> {
        let len = u8::try_from(text.len())
            .ok()
            .filter(|_| text.len() <= INLINE)?;
        let mut bytes = [0; INLINE];
        bytes[..text.len()].copy_from_slice(text);
        Some(TargetKey(Repr::Inline { len, bytes }))
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            // Always valid: the bytes were copied from a `str` whole.
            Repr::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default()
            }
            Repr::Shared(text) => text,
        }
    }

    /// The text's bytes, without checking them again (comparisons: UTF-8 orders bytewise as
    /// `str` orders, so a key compares as its text without a `from_utf8` per comparison).
    fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Repr::Shared(text) => text.as_bytes(),
        }
    }

    /// Whether the text is kept inline (no allocation of its own).
    pub fn is_inline(&self) -> bool {
        matches!(self.0, Repr::Inline { .. })
    }
}

impl Deref for TargetKey {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for TargetKey {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for TargetKey {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for TargetKey {
    fn from(text: &str) -> TargetKey {
        TargetKey::new(text)
    }
}

impl From<String> for TargetKey {
    fn from(text: String) -> TargetKey {
        TargetKey::new(&text)
    }
}

impl From<Arc<str>> for TargetKey {
    fn from(text: Arc<str>) -> TargetKey {
        if text.len() <= INLINE {
            TargetKey::new(&text)
        } else {
            TargetKey(Repr::Shared(text))
        }
    }
}

impl PartialEq for TargetKey {
    fn eq(&self, other: &TargetKey) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for TargetKey {}

impl PartialOrd for TargetKey {
    fn partial_cmp(&self, other: &TargetKey) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for TargetKey {
    fn cmp(&self, other: &TargetKey) -> Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl Hash for TargetKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl fmt::Debug for TargetKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for TargetKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for TargetKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::hash_map::DefaultHasher;

    fn hash_of<T: Hash + ?Sized>(value: &T) -> u64 {
        let mut h = DefaultHasher::new();
        value.hash(&mut h);
        h.finish()
    }

    #[test]
    fn a_key_reads_compares_hashes_and_prints_as_its_text() {
        let uid = "6b1c1d2e-0000-4000-8000-000000000001";
        let long = "Pod/a-namespace-with-a-long-name/a-pod-with-a-long-name-too";
        let texts = [
            "",
            "a",
            uid,
            long,
            "ünïcødé/под/名前",
            "x".repeat(38).leak(),
            "y".repeat(39).leak(),
            "é".repeat(19).leak(),
            "é".repeat(20).leak(),
        ];
        for text in texts {
            for key in [
                TargetKey::from(text),
                TargetKey::from(text.to_owned()),
                TargetKey::from(Arc::<str>::from(text)),
            ]
            .into_iter()
            .chain(TargetKey::from_ascii(text.as_bytes()))
            {
                assert_eq!(key.as_str(), text);
                assert_eq!(&*key, text);
                assert_eq!(key.to_string(), text);
                assert_eq!(format!("{key:?}"), format!("{text:?}"));
                assert_eq!(hash_of(&key), hash_of(text));
                assert_eq!(
                    serde_json::to_string(&key).unwrap(),
                    serde_json::to_string(text).unwrap()
                );
                assert_eq!(key.is_inline(), text.len() <= INLINE, "{text}");
            }
        }
        for text in texts {
            let ascii = TargetKey::from_ascii(text.as_bytes());
            assert_eq!(ascii.is_some(), text.is_ascii(), "{text}");
        }
        let mut keys: Vec<TargetKey> = texts.iter().map(|t| TargetKey::from(*t)).collect();
        let mut sorted: Vec<&str> = texts.to_vec();
        keys.sort();
        sorted.sort();
        assert_eq!(keys.iter().map(|k| k.as_str()).collect::<Vec<_>>(), sorted);
        assert_ne!(TargetKey::from(uid), TargetKey::from(long));
        assert_ne!(TargetKey::from("a"), TargetKey::from("a\0"));
    }

    #[test]
    fn a_pod_uid_key_is_inline_and_small() {
        let key = TargetKey::from("6b1c1d2e-0000-4000-8000-000000000001");
        assert!(key.is_inline());
        assert!(
            std::mem::size_of::<TargetKey>() <= 40,
            "{}",
            std::mem::size_of::<TargetKey>()
        );
    }
}
