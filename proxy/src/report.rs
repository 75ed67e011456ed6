//! What the proxy shows of itself, read from the shared state at the
//! moment it is asked: the Prometheus families and readiness ([`export`]),
//! the HTTP endpoint that serves them ([`http`]), its own `INFO` sections
//! ([`info`]), and the once-a-second warnings ([`watch`]).
//!
//! The counters themselves live below, where they are updated
//! ([`crate::metrics`], [`crate::state`], the L1's and the pool's stats);
//! nothing here runs per command.

pub mod export;
pub mod http;
pub mod info;
pub mod watch;
