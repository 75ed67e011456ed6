//! The keys whose echo is awaited elsewhere (`crate::conn::mux`'s
//! `echo`, "Echoes elsewhere"), per tracking connection of their node.

use std::collections::HashMap;
use std::hash::BuildHasher;

/// Keys whose echo is awaited, as seeded 64-bit hashes: nothing is copied
/// or allocated per write (a key another one shares its hash with, one
/// chance in 2^64 per pair, would have its report taken for an echo: the
/// L1 still forgets it). Each wait is per connection of the key's node: a
/// key's registrations, and so its reports, are per connection, and a
/// read answered on one says nothing of the others (a registration there
/// made before the write still reports the write). Beside each hash, the
/// node's connections whose wait ended (a bit per connection, by its
/// place among the node's tracking connections): by the echo, or by a
/// read answered there. The key is dropped when every wait ended.
#[derive(Default)]
pub(super) struct Due {
    seed: foldhash::fast::RandomState,
    pub(super) hashes: HashMap<u64, u64, foldhash::fast::RandomState>,
}

impl Due {
    fn hash(&self, key: &[u8]) -> u64 {
        self.seed.hash_one(key)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// A write of `key` is about to be sent: its echo is awaited on every
    /// connection.
    pub(super) fn insert(&mut self, key: &[u8]) {
        let h = self.hash(key);
        self.hashes.insert(h, 0);
    }

    /// Ends `key`'s wait on the connection with bit `bit` (of `all`, the
    /// node's); whether it was still awaited there.
    pub(super) fn end(&mut self, key: &[u8], bit: u64, all: u64) -> bool {
        let h = self.hash(key);
        let Some(ended) = self.hashes.get_mut(&h) else {
            return false;
        };
        let awaited = *ended & bit == 0;
        *ended |= bit;
        if *ended & all == all {
            self.hashes.remove(&h);
        }
        awaited
    }

    /// Ends every wait on the connection with bit `bit`.
    pub(super) fn end_all(&mut self, bit: u64, all: u64) {
        self.hashes.retain(|_, ended| {
            *ended |= bit;
            *ended & all != all
        });
    }
}
