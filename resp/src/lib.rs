//! The RESP2/RESP3 wire format, as both sides of sidecache speak it.
//!
//! A leaf crate: it knows nothing of clients, upstreams or the cache, and
//! `sidecache-pool` and `sidecache` both build on it.
//!
//! # Layout
//! - [`request`]: client requests in (multibulk and inline), with Redis's
//!   limits and error texts.
//! - [`frame`]: reply frames: where one ends ([`frame::Scanner`], no
//!   allocation, resumable) and what it holds ([`frame::Value`]).
//! - [`encode`]: writing RESP: commands, headers and bulks, and
//!   [`encode::Reply`] for replies built locally in the client's protocol.
//! - [`header`]: `<kind><n>\r\n` header lines, for both of the above,
//!   and read back in place.
//! - [`bulks`]: an encoded array's bulk strings walked in place (a queued
//!   write's keys, an invalidation's keys).
//! - [`shape`]: a cached read's reply written in the other protocol.
//! - [`find`]: where a line ends (a byte loop for short header lines).
//! - [`int`]: the one integer parser, Redis's `string2ll`.
//! - [`Proto`]: RESP2 or RESP3.

pub mod bulks;
pub mod encode;
pub mod find;
pub mod frame;
pub mod header;
pub mod int;
pub mod request;
pub mod shape;

/// The RESP version spoken on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Proto {
    /// RESP2 (the default of every Redis connection).
    Resp2,
    /// RESP3 (after `HELLO 3`).
    Resp3,
}
