//! Messages before a tracking client's replies: Redis puts a change's
//! message in the client's output buffer when the change happens, so a
//! key evicted while the client's command runs is told of before that
//! command's reply (`unit/tracking`, "Tracking invalidation message of
//! eviction keys should be before response").
//!
//! sidecache writes a batch's replies, then what its outbox holds. A
//! message that arrived while the batch ran may go before the replies
//! still to be written, when none of them can carry a value of its keys:
//! the batch named none of them (read or wrote), and named every key it
//! touched (no script, no SORT, nothing that writes everything, no
//! transaction, whose commands were named in earlier batches). Anything
//! else keeps its place after the replies, so a value read before a
//! change never reaches the client after that change's message, and a
//! client's own write is told of after its reply, as on Redis.

use bytes::Bytes;
use sidecache_resp::request::Request;

use super::super::Client;
use crate::cmd::handling::Invalidation;
use crate::cmd::table::CommandInfo;
use crate::pubsub::Delivery;

/// What a tracking client's batch touched.
#[derive(Debug, Default)]
pub(in crate::connection) struct Early {
    /// The keys its commands named.
    keys: Vec<Bytes>,
    /// A command may reach keys it does not name: nothing goes early.
    opaque: bool,
}

impl Early {
    /// The batch is over (its replies and messages are out).
    pub(in crate::connection) fn clear(&mut self) {
        self.keys.clear();
        self.opaque = false;
    }

    /// Tracking went on while the batch ran: what it touched before was
    /// not noted, so nothing goes early.
    pub(in crate::connection) fn started(&mut self) {
        self.opaque = true;
    }

    /// Whether `d` may go before the batch's replies.
    fn before(&self, d: &Delivery) -> bool {
        match d {
            Delivery::Invalidate(Some(keys)) => {
                !self.opaque && keys.iter().all(|k| !self.keys.contains(k))
            }
            _ => false,
        }
    }
}

impl Client {
    /// A tracking client's command (`info`: its table entry), before its
    /// dispatch: what it touches.
    pub(in crate::connection) fn note_early(&mut self, req: &Request, info: Option<&CommandInfo>) {
        if self.early.opaque {
            return;
        }
        // Inside a transaction (its EXEC too): what runs at EXEC was named
        // in earlier batches.
        if self.tx.is_some() {
            self.early.opaque = true;
            return;
        }
        let Some(info) = info else {
            self.early.opaque = true;
            return;
        };
        let hidden = info.script_body.is_some()
            || matches!(
                info.name.as_str(),
                "evalsha" | "evalsha_ro" | "fcall" | "fcall_ro" | "sort" | "sort_ro"
            )
            || info.invalidation == Invalidation::All;
        let mut at = Vec::new();
        if hidden || info.keys(&req.args, &mut at).is_err() {
            self.early.opaque = true;
            return;
        }
        self.early
            .keys
            .extend(at.into_iter().map(|i| req.args[i].clone()));
    }

    /// The outbox's messages from `first` on, at the end of a batch: those
    /// that may go before its replies still in `wbuf` are put there, then
    /// the replies, then the rest. The outbox bytes written, or `None`
    /// when the client must be closed.
    pub(in crate::connection) fn take_early(&mut self, first: Delivery) -> Option<usize> {
        let early = std::mem::take(&mut self.early);
        if !early.before(&first) {
            self.early = early;
            return self.take_deliveries(first);
        }
        let replies = self.wbuf.split();
        let mut weight = 0;
        let mut next = Some(first);
        while let Some(d) = next.take() {
            if !early.before(&d) {
                next = Some(d);
                break;
            }
            weight += d.weight();
            if let Delivery::Invalidate(keys) = d {
                self.put_invalidation(keys.as_deref());
            }
            next = self.next_delivery();
        }
        self.wbuf.extend_from_slice(&replies);
        self.early = early;
        match next {
            Some(d) => self.take_deliveries(d).map(|w| w + weight),
            None => Some(weight),
        }
    }
}
