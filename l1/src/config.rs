//! L1 configuration, validated by the binary.

use std::time::Duration;

/// Default capacity: 256 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 256 * 1024 * 1024;
/// Default largest cached value: 1 MiB.
pub const DEFAULT_MAX_VALUE_BYTES: u64 = 1024 * 1024;
/// Default longest life of an entry while client tracking reports other
/// writers' changes: a safety net behind the invalidations, long enough
/// that under a steady load the byte bound, not age, decides what stays
/// (`bench/workload.sh curve`: YCSB B over 10^6 keys, 60 s kept 0.57 of
/// reads, longer caps 0.75).
pub const DEFAULT_TTL_CAP: Duration = Duration::from_secs(600);
/// Default longest life of an entry when the cap is what bounds other
/// writers' changes: tracking off, or an upstream that refuses it (the
/// peer channel reports only other sidecaches' writes).
pub const UNTRACKED_TTL_CAP: Duration = Duration::from_secs(60);

/// What the L1 caches and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct L1Config {
    /// Byte capacity (keys + values + per-entry overhead); 0 turns the L1 off.
    pub max_bytes: u64,
    /// Values larger than this are never cached.
    pub max_value_bytes: u64,
    /// The longest any entry lives, whatever the upstream TTL.
    pub ttl_cap: Duration,
    /// Cache nil replies for this long (`None`: never).
    pub cache_nil: Option<Duration>,
    /// Only keys starting with one of these are cached (empty: all keys).
    pub include_prefixes: Vec<Vec<u8>>,
    /// Keys starting with one of these are never cached.
    pub exclude_prefixes: Vec<Vec<u8>>,
    /// Keep read marks (optin tracking): whether a key was read within the
    /// TTL cap ([`crate::Written::reread`]). 1 MiB (and 64 KiB of marks of
    /// released unread writes), and a hash per hit on a
    /// written or re-read value; off, every write reports no read.
    pub read_marks: bool,
}

impl Default for L1Config {
    fn default() -> Self {
        L1Config {
            max_bytes: DEFAULT_MAX_BYTES,
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
            ttl_cap: DEFAULT_TTL_CAP,
            cache_nil: None,
            include_prefixes: Vec::new(),
            exclude_prefixes: Vec::new(),
            read_marks: true,
        }
    }
}

impl L1Config {
    /// Whether `key` passes the include/exclude filters.
    pub fn key_allowed(&self, key: &[u8]) -> bool {
        if self.exclude_prefixes.iter().any(|p| key.starts_with(p)) {
            return false;
        }
        self.include_prefixes.is_empty() || self.include_prefixes.iter().any(|p| key.starts_with(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters() {
        let mut c = L1Config::default();
        assert!(c.key_allowed(b"anything"));
        c.include_prefixes = vec![b"user:".to_vec(), b"item:".to_vec()];
        c.exclude_prefixes = vec![b"user:secret".to_vec()];
        assert!(c.key_allowed(b"user:1"));
        assert!(c.key_allowed(b"item:1"));
        assert!(!c.key_allowed(b"session:1"));
        assert!(!c.key_allowed(b"user:secret:1"));
    }
}
