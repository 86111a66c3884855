//! Maps keyed by the address of an item of a published snapshot (a route's action, its upstream
//! TLS settings): the snapshot keeps the item alive and in place, so its address is a stable,
//! unique key that costs one multiply to hash on the request path.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes a `usize` key (an address) with one multiply; keys are distinct pointers.
#[derive(Debug, Default)]
pub struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(20);
    }
}

/// A map keyed by the address of a snapshot item.
pub type AddrMap<V> = HashMap<usize, V, BuildHasherDefault<AddrHasher>>;

/// The key of an item in an [`AddrMap`]: its address.
pub fn addr_of<T>(item: &T) -> usize {
    std::ptr::from_ref(item) as usize
}
