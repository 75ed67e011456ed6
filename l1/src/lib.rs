//! The in-process L1 cache of sidecache.
//!
//! A skeleton until the L1 issue lands (TODO(#3)): the proxy's dispatch
//! already has the place where GET hits and misses will be decided.
//!
//! # Layout
//! - `lib.rs`: the crate's configuration type.

/// L1 configuration; `max_bytes == 0` turns the L1 off.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct L1Config {
    /// Byte capacity of the cache.
    pub max_bytes: u64,
}
