//! Redis's report of this connection's own write-behind writes.
//!
//! Under optin the tracking connection carries the write-behind batches
//! of the start database, without `NOLOOP` (see
//! `crate::coherence::tracking`). A write of a key the connection follows
//! therefore comes back as an invalidation push, right after the write's
//! reply: Redis holds the invalidations a command causes for its own
//! connection until its reply is written. That report tells nothing new:
//! the write was acknowledged from memory, and everything that needed to
//! hear of it (the L1, tracking clients, peers) did then. Passed on, it
//! would reach a tracking client that read the key after the
//! acknowledgement as a change it never saw.
//!
//! Which push is such an echo: one naming key `k` that arrives after the
//! reply of our write of `k` and before the next reply. It cannot be
//! another writer's: Redis sends one invalidation per registration and
//! drops the registration with it, our write took it, and only a read on
//! this connection (a later command, whose reply would come first)
//! registers `k` again. An earlier writer's push came before our write's
//! reply. So such keys are not passed on to tracking clients (the L1
//! still forgets them: Redis no longer follows them on this connection,
//! in any database); the other keys in the push are applied as usual.
//! Under BCAST (`NOLOOP`, no echo) every change is reported whoever made
//! it, so this holds for optin only.
//!
//! # Echoes elsewhere
//! A key registered on another connection than its write travelled on
//! (the other fill connection; writes of other databases, and forwarded
//! writes, which travel on connections of their own) is reported there,
//! where position tells nothing. For those, the hub keeps the keys this
//! proxy is writing (`Hub::expect_echoes`: at a write-behind write's
//! acknowledgement and at a forwarded write's dispatch, once a client of
//! the proxy tracks keys; always before the write is sent, never after
//! it ran: see below), and takes the next report of
//! each on each tracking connection of its node for its echo, unless a
//! read of the key is answered first on that same connection
//! (`Channel::answered`, for every reply of a request that is not a
//! write-behind batch; a script or function ends every wait there). The
//! waits are per connection because registrations are: a read answered
//! on one fill connection registers the key there, while a registration
//! on the other, made before our write, still reports our write (one
//! wait for all connections passed that echo on as news: a message too
//! many, seen by `tests/tracking.rs`
//! `own_writes_are_not_reported_again_in_any_database` in 5 of 24 runs
//! against Valkey 8 under load). Why such a report tells no tracking
//! client anything new:
//! - A registration made before the write is taken by the first write of
//!   the key after it, ours or another's. If ours: the echo. If another's,
//!   `F`, before ours: ours runs after `F`, so whatever a reader of this
//!   proxy gets after our write's acknowledgement includes `F` (or, for a
//!   write-behind SET, replaces it), and a reader that read before is
//!   told at that acknowledgement. Either way that registration makes
//!   exactly one report.
//! - Any other registration comes from a read whose reply is read after
//!   the wait began, and Redis writes a read's reply before any report
//!   of the registration it made, on the same connection: the reply ends
//!   that connection's wait first, so a later change is passed on.
//! - Marking a key only after its write ran (at a forwarded write's
//!   acknowledgement, say) would break the second point: a read answered
//!   between the write and the mark registers the key, and the next other
//!   writer's report would then be taken. So keys are marked before their
//!   write is sent, and never for a write that failed.
//!
//! The keys are kept as seeded 64-bit hashes (no copy, no allocation per
//! write): another key sharing one's hash, one chance in 2^64 per pair,
//! would have its report taken for an echo, the only exception to what
//! follows.
//!
//! So a report is never taken for an echo wrongly; what is missed (a read
//! answered between a registration and the echo) is one message too many,
//! as before. The set is bounded ([`crate::coherence::tracking::ECHOES_DUE_MAX`]):
//! forgetting a wait costs at most such a message.

use bytes::Bytes;
use sidecache_resp::frame::{Scanner, Value};
use smallvec::SmallVec;

use super::Inflight;
use crate::coherence::tracking::Channel;
use crate::config::TrackingMode;
use crate::write_behind::keys::written_keys;

/// What one connection's reader knows of the echoes of our writes.
pub(super) struct Echoes<'a> {
    /// The connection's tracking channel.
    channel: Option<&'a Channel>,
    /// Optin: under BCAST every change is reported, whoever made it, so
    /// where a push comes says nothing.
    optin: bool,
    echo: Echo,
    /// The last request answered, when a write-behind batch: its payload
    /// and the index of its last command.
    last_done: Option<(Bytes, usize)>,
}

impl<'a> Echoes<'a> {
    pub(super) fn new(channel: Option<&'a Channel>) -> Echoes<'a> {
        Echoes {
            channel,
            optin: channel.is_some_and(|c| c.mode() == TrackingMode::Optin),
            echo: Echo::default(),
            last_done: None,
        }
    }

    /// The keys a push arriving now would echo: those of the write whose
    /// reply came just before it (of the batch being answered, `current`,
    /// or of the last one answered).
    pub(super) fn own(&mut self, current: Option<&Inflight>) -> SmallVec<[Bytes; 2]> {
        let before = match current {
            Some(c) if !c.frames.is_empty() && c.writes => {
                c.payload.as_ref().map(|p| (p, c.frames.len() - 1))
            }
            Some(c) if !c.frames.is_empty() => None,
            _ => self.last_done.as_ref().map(|(p, n)| (p, *n)),
        };
        match before {
            Some((p, n)) => self.echo.written(p, n),
            None => SmallVec::new(),
        }
    }

    /// A reply of `cur` was read: a read answered may have registered
    /// keys whose echo was awaited ("Echoes elsewhere").
    pub(super) fn replied(&mut self, cur: &Inflight) {
        let (Some(ch), Some(p)) = (self.channel, &cur.payload) else {
            return;
        };
        if !ch.awaits_echoes() {
            return;
        }
        let args = self.echo.args(p, cur.frames.len() - 1);
        // In a write-behind batch, what is not one of its writes reads
        // (the re-reads, `crate::coherence::refill`, whichever commands
        // they use); its writes end no wait.
        let reads = !cur.writes || args.first().is_some_and(|name| !is_write(name));
        if reads {
            ch.answered(&args);
        }
    }

    /// `cur` is answered in full.
    pub(super) fn done(&mut self, cur: &mut Inflight) {
        if self.optin {
            self.last_done = cur
                .payload
                .take()
                .filter(|_| cur.writes)
                .map(|p| (p, cur.count - 1));
        }
    }
}

/// Finds the keys of one command of a write-behind batch; remembers where
/// its scan of the batch stopped, as pushes come in command order.
#[derive(Debug, Default)]
pub(super) struct Echo {
    /// The batch scanned (its start and length), the command the scan
    /// stopped at, and where.
    cursor: (usize, usize, usize, usize),
}

impl Echo {
    /// Command `n` of `payload`, framed; `None` past its end.
    fn command<'p>(&mut self, payload: &'p Bytes, n: usize) -> Option<&'p [u8]> {
        let id = (payload.as_ptr() as usize, payload.len());
        let (mut at, mut offset) = if (self.cursor.0, self.cursor.1) == id && self.cursor.2 <= n {
            (self.cursor.2, self.cursor.3)
        } else {
            (0, 0)
        };
        while at < n {
            match Scanner::new().scan(&payload[offset..]) {
                Ok(Some(len)) => offset += len,
                _ => return None,
            }
            at += 1;
        }
        self.cursor = (id.0, id.1, at, offset);
        let Ok(Some(len)) = Scanner::new().scan(&payload[offset..]) else {
            return None;
        };
        payload.get(offset..offset + len)
    }

    /// The arguments of command `n` of `payload` (name first); empty past
    /// its end.
    pub(super) fn args(&mut self, payload: &Bytes, n: usize) -> SmallVec<[Bytes; 4]> {
        let Some(cmd) = self.command(payload, n) else {
            return SmallVec::new();
        };
        let Ok(Value::Array(items)) = Value::decode(&payload.slice_ref(cmd)) else {
            return SmallVec::new();
        };
        items
            .into_iter()
            .filter_map(|v| match v {
                Value::Bulk(b) => Some(b),
                _ => None,
            })
            .collect()
    }

    /// The keys command `n` of `payload` wrote (SET, MSET: what
    /// write-behind sends, [`written_keys`]); none for anything else. Read in
    /// place, as the batcher reads a landed write's keys: no decode of the
    /// command's value, one slice per key.
    pub(super) fn written(&mut self, payload: &Bytes, n: usize) -> SmallVec<[Bytes; 2]> {
        let Some(cmd) = self.command(payload, n) else {
            return SmallVec::new();
        };
        written_keys(cmd).map(|k| payload.slice_ref(k)).collect()
    }
}

/// Whether `name` is one of the writes write-behind sends.
fn is_write(name: &[u8]) -> bool {
    [&b"set"[..], b"setex", b"psetex", b"mset"]
        .iter()
        .any(|c| name.eq_ignore_ascii_case(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(args: &[&str]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
        out
    }

    #[test]
    fn the_keys_of_the_write_just_answered() {
        let mut payload = Vec::new();
        payload.extend(cmd(&["SET", "a", "1"]));
        payload.extend(cmd(&["MSET", "b", "2", "c", "3"]));
        payload.extend(cmd(&["SET", "d", "4", "PXAT", "10"]));
        payload.extend(cmd(&["PING"]));
        payload.extend(cmd(&["MGET", "a", "d"]));
        payload.extend(cmd(&["PTTL", "d"]));
        let p = Bytes::from(payload);
        let mut e = Echo::default();
        let mut keys = |p: &Bytes, n: usize| -> Vec<String> {
            e.written(p, n)
                .iter()
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect()
        };
        assert_eq!(keys(&p, 0), ["a"]);
        assert_eq!(keys(&p, 1), ["b", "c"]);
        assert_eq!(keys(&p, 1), ["b", "c"]);
        assert_eq!(keys(&p, 2), ["d"]);
        assert!(keys(&p, 3).is_empty());
        // A re-read names keys it does not write.
        assert!(keys(&p, 4).is_empty());
        assert!(keys(&p, 5).is_empty());
        // Past the end: nothing.
        assert!(keys(&p, 9).is_empty());
        // Back to an earlier command, and another batch: scanned afresh.
        assert_eq!(keys(&p, 0), ["a"]);
        let q = Bytes::from(cmd(&["SET", "z", "9"]));
        assert_eq!(keys(&q, 0), ["z"]);
    }
}
