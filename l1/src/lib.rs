//! The in-process L1 cache of sidecache.
//!
//! A cache of the upstream, never a second database: values enter only
//! through a *fill* (a read that missed) that no write raced, leave on any
//! write the proxy sees, and never outlive the upstream's TTL or the
//! configured cap. This crate knows nothing of networking: the proxy decides
//! what is cacheable and fetches misses; the cache keeps entries, bounds
//! their bytes and guards fills against invalidations.
//!
//! # Layout
//! - [`config`]: [`L1Config`] (capacity, value size limit, TTL cap, key filters).
//! - [`cache`]: [`L1`], the byte-bounded store with per-entry deadlines and the fill guard;
//!   `cache/reads`: reads other than GET (HGETALL, STRLEN, …) kept in their key's entry.
//! - [`stats`]: lock-free counters and their snapshot.

pub mod cache;
pub mod config;
pub mod stats;

pub use cache::{FillTicket, Lookup, ReadLookup, Written, L1};
pub use config::L1Config;
pub use stats::StatsSnapshot;
