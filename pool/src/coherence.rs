//! Keeping the L1 coherent with other writers: Redis client tracking (one
//! invalidation channel per master), and the peer pub/sub channel used when
//! the upstream refuses tracking.

pub mod peer;
pub mod tracking;
