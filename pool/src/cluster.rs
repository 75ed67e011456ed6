//! The cluster's shape: the slot → node map and the pure decision of what
//! a redirect reply means. Hash slots themselves live a layer down
//! ([`crate::slot`], re-exported here as `cluster::slot`), since the
//! write-behind queues, the replica stamps and the re-reads use them too.

pub mod redirect;
pub use crate::slot;
pub mod topology;
