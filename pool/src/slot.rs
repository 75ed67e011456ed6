//! Cluster hash slots: CRC16 (XMODEM) of the key, or of its `{hash tag}`.
//! At the bottom of the crate (it imports nothing of it): the queues, the
//! stamps, the re-reads and the slot map all speak in slots.

/// Number of hash slots in a Redis Cluster.
pub const SLOT_COUNT: u16 = 16384;

/// A Redis Cluster hash slot, always `< 16384`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slot(u16);

impl Slot {
    /// A slot from its number; `None` when out of range.
    pub fn new(n: u16) -> Option<Slot> {
        (n < SLOT_COUNT).then_some(Slot(n))
    }

    /// The slot a key hashes to, honouring `{hash tags}` as Redis does: the
    /// tag is the text between the first `{` and the next `}`, used only when
    /// non-empty.
    pub fn for_key(key: &[u8]) -> Slot {
        Slot(crc16::State::<crc16::XMODEM>::calculate(hash_tag(key)) % SLOT_COUNT)
    }

    /// The slot number.
    pub fn get(self) -> u16 {
        self.0
    }
}

/// The part of a key that is hashed.
fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = memchr::memchr(b'{', key) {
        if let Some(len) = memchr::memchr(b'}', &key[open + 1..]) {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_reference_vector() {
        assert_eq!(
            crc16::State::<crc16::XMODEM>::calculate(b"123456789"),
            0x31C3
        );
        assert_eq!(Slot::for_key(b"123456789").get(), 0x31C3 % SLOT_COUNT);
    }

    #[test]
    fn known_slots() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.
        assert_eq!(Slot::for_key(b"foo").get(), 12182);
        assert_eq!(Slot::for_key(b"bar").get(), 5061);
        assert_eq!(Slot::for_key(b"").get(), 0);
    }

    #[test]
    fn hash_tags() {
        assert_eq!(
            Slot::for_key(b"{user1000}.following"),
            Slot::for_key(b"{user1000}.followers")
        );
        assert_eq!(Slot::for_key(b"{user1000}.x"), Slot::for_key(b"user1000"));
        // Empty tag: the whole key is hashed.
        assert_eq!(hash_tag(b"foo{}{bar}"), b"foo{}{bar}");
        // Only the first `{` counts.
        assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hash_tag(b"foo{bar}{zap}"), b"bar");
        assert_eq!(hash_tag(b"foo{bar"), b"foo{bar");
    }

    #[test]
    fn range() {
        assert!(Slot::new(16383).is_some());
        assert!(Slot::new(16384).is_none());
    }
}
