//! The cluster's shape and how a key finds its node: hash slots, the slot
//! → node map, and the pure decision of what a redirect reply means.

pub mod redirect;
pub mod slot;
pub mod topology;
