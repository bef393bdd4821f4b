//! A hasher for integer keys (handles, ids, addresses): one folded multiply
//! instead of SipHash, which dominated the replay loops. The maps that use
//! it are looked up and updated by key; one that is iterated must not let
//! the order decide a result.

/// Folded multiply: mixes high and low bits, so keys that differ only in
/// high bits (addresses aligned to 512 B or 2 MiB) still spread.
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        let p = ((self.0 ^ n) as u128).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = (p as u64) ^ ((p >> 64) as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A `HashMap` keyed by integers, hashed with [`IdHasher`].
pub type IdMap<K, V> = std::collections::HashMap<K, V, std::hash::BuildHasherDefault<IdHasher>>;
