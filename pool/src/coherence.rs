//! Keeping the L1 coherent with other writers: Redis client tracking (one
//! invalidation channel per master), and the peer pub/sub channel used when
//! the upstream refuses tracking; and, under optin, the re-reads that keep
//! what this proxy writes cached (`refill`).

pub mod peer;
pub mod refill;
pub mod tracking;
