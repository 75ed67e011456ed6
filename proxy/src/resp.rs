//! The client-facing RESP codec: requests in ([`request`]), locally built
//! replies out ([`reply`]). Upstream replies are passed through as received.

pub mod reply;
pub mod request;
