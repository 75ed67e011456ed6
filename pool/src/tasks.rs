//! The long-running tasks the router starts and that reach it back only
//! through [`crate::dispatch::Dispatch`]: the write-behind batcher of each
//! (node, database) queue ([`write_batcher`]) and the peer invalidation
//! channel's subscriber ([`peer_subscriber`]). What they work on sits
//! below them: the queues in [`crate::write_behind`], the peer channel's
//! state and messages in [`crate::coherence::peer`]. This module owns the
//! I/O loops, not the state.

pub(crate) mod peer_subscriber;
pub(crate) mod write_batcher;
