//! The fallback when the upstream refuses `CLIENT TRACKING`: sidecache
//! instances tell each other which keys they wrote, on a pub/sub channel
//! (`--peer-invalidation-channel`).
//!
//! Every write a sidecache applies upstream (a flushed write-behind batch,
//! or a forwarded write once answered) is followed by a `PUBLISH` naming
//! its keys; every sidecache subscribes and drops those keys from its L1,
//! ignoring its own messages. Writes made by anything other than a
//! sidecache are bounded by the L1 TTL cap alone.
//!
//! The publication is sent after the write was applied, so the argument of
//! [`crate::coherence::tracking`] holds unchanged: a fill that read the old value began
//! before the message was received, and is discarded or removed by it.
//! The subscription is one connection (classic pub/sub reaches every node
//! of a cluster); while it is down, fills are not cached and the whole L1
//! was cleared when it went down. This file holds the channel's state and
//! protocol; the task that keeps the subscription open is
//! `tasks::peer_subscriber`, a layer up (it needs a connection).
//!
//! Message payload: `sc1:<instance id, 16 hex>:` then `F` (flush: drop
//! everything) or `K` followed by `<length>:<key bytes>` per key.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use sidecache_resp::encode;
use sidecache_resp::frame::Value;

use crate::coherence::tracking::Channel;

/// What a peer message says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// These keys were written.
    Keys(Vec<Bytes>),
    /// Everything may have changed (FLUSHALL, FLUSHDB, SWAPDB …).
    Flush,
}

/// This instance's side of the peer channel.
#[derive(Debug)]
pub struct Peer {
    name: Bytes,
    id: u64,
    gate: Arc<Channel>,
    /// Messages published by this instance.
    pub published: AtomicU64,
    /// Messages from other instances applied.
    pub received: AtomicU64,
}

impl Peer {
    pub(crate) fn new(name: Vec<u8>, gate: Arc<Channel>) -> Peer {
        Peer {
            name: Bytes::from(name),
            id: instance_id(),
            gate,
            published: AtomicU64::new(0),
            received: AtomicU64::new(0),
        }
    }

    /// The channel name.
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// The gate every node shares in peer mode.
    pub(crate) fn gate(&self) -> &Arc<Channel> {
        &self.gate
    }

    /// Whether the subscription is up (fills may be cached).
    pub fn is_up(&self) -> bool {
        self.gate.is_up()
    }

    /// `PUBLISH <channel> <payload>` for `msg`.
    pub fn publish_cmd(&self, msg: &Message) -> Bytes {
        let payload = encode(self.id, msg);
        let mut out = BytesMut::with_capacity(payload.len() + self.name.len() + 40);
        encode::encode_command(&mut out, &[b"PUBLISH".as_slice(), &self.name, &payload]);
        self.published.fetch_add(1, Ordering::Relaxed);
        out.freeze()
    }

    /// What a frame pushed on the subscription means: the confirmation of
    /// `SUBSCRIBE` puts the gate up; another instance's message is counted
    /// and returned, to be applied to the L1. Anything else, this
    /// instance's own messages included, is `None`.
    pub(crate) fn on_push(&self, frame: &Bytes) -> Option<Message> {
        let Ok(Value::Push(items)) = Value::decode(frame) else {
            return None;
        };
        let kind = items.first().and_then(Value::as_bytes);
        if kind.is_some_and(|k| k.eq_ignore_ascii_case(b"subscribe")) {
            self.gate.set_up();
            return None;
        }
        if !kind.is_some_and(|k| k.eq_ignore_ascii_case(b"message")) {
            return None;
        }
        let (id, msg) = items.get(2).and_then(Value::as_bytes).and_then(decode)?;
        if id == self.id {
            return None;
        }
        self.received.fetch_add(1, Ordering::Relaxed);
        Some(msg)
    }
}

/// A random-enough id telling this process's messages from others'.
fn instance_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// Encodes a message from instance `id`.
pub fn encode(id: u64, msg: &Message) -> Bytes {
    let mut out = BytesMut::new();
    out.extend_from_slice(format!("sc1:{id:016x}:").as_bytes());
    match msg {
        Message::Flush => out.extend_from_slice(b"F"),
        Message::Keys(keys) => {
            out.extend_from_slice(b"K");
            let mut b = itoa::Buffer::new();
            for k in keys {
                out.extend_from_slice(b.format(k.len()).as_bytes());
                out.extend_from_slice(b":");
                out.extend_from_slice(k);
            }
        }
    }
    out.freeze()
}

/// Decodes a payload: the sender's id and the message; `None` if malformed.
pub fn decode(p: &Bytes) -> Option<(u64, Message)> {
    let rest = p.strip_prefix(b"sc1:")?;
    let id = u64::from_str_radix(std::str::from_utf8(rest.get(..16)?).ok()?, 16).ok()?;
    let mut pos = 4 + 16;
    if p.get(pos) != Some(&b':') {
        return None;
    }
    pos += 1;
    match p.get(pos)? {
        b'F' => Some((id, Message::Flush)),
        b'K' => {
            pos += 1;
            let mut keys = Vec::new();
            while pos < p.len() {
                let colon = pos + p[pos..].iter().position(|&c| c == b':')?;
                let len: usize = std::str::from_utf8(&p[pos..colon]).ok()?.parse().ok()?;
                let start = colon + 1;
                let end = start.checked_add(len)?;
                if end > p.len() {
                    return None;
                }
                keys.push(p.slice(start..end));
                pos = end;
            }
            Some((id, Message::Keys(keys)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let keys = vec![
            Bytes::from_static(b"a"),
            Bytes::from_static(b""),
            Bytes::from_static(b"k:1:2\r\n"),
        ];
        let p = encode(0xdead_beef, &Message::Keys(keys.clone()));
        assert_eq!(decode(&p), Some((0xdead_beef, Message::Keys(keys))));
        let p = encode(7, &Message::Flush);
        assert_eq!(decode(&p), Some((7, Message::Flush)));
        assert_eq!(decode(&Bytes::from_static(b"hello")), None);
        assert_eq!(
            decode(&Bytes::from_static(b"sc1:0000000000000001:K5:ab")),
            None,
            "truncated key"
        );
    }
}
