//! CLIENT TRACKING on the connection's side: a tracking client's reads are
//! registered before they are dispatched, and after the batch's replies
//! each read of a key sidecache does not follow upstream is invalidated at
//! once (the argument is in `crate::pubsub::tracking`).

use bytes::Bytes;
use sidecache_pool::Proto;
use sidecache_resp::request::Request;

use super::Client;
use crate::pubsub::tracking::Sink;

impl Client {
    /// The shared table learns this client's tracking state (after CLIENT
    /// TRACKING, RESET or HELLO); a RESP3 client gets an outbox, so it can
    /// be another client's REDIRECT target.
    pub(super) fn tracking_changed(&mut self) {
        let t = &self.st.tracking;
        if t.on {
            let sink = Sink {
                bcast: t.bcast,
                noloop: t.noloop,
                redirect: t.redirect,
                prefixes: t.prefixes.clone(),
                quiet: false,
            };
            self.subs_mut();
            self.shared.tracked.enable(self.st.id, sink);
        } else {
            self.shared.tracked.disable(self.st.id);
            self.tracked_reads.clear();
            self.fill_reads.clear();
            if self.st.proto == Proto::Resp3 {
                self.subs_mut();
            }
        }
    }

    /// Before a tracking client's command: if it is a read the client
    /// tracks (CLIENT CACHING for OPTIN/OPTOUT), its keys are registered
    /// (default mode; BCAST clients hear of every key) and kept for
    /// [`Client::end_tracked_reads`]. As on Redis, a CLIENT CACHING applies
    /// to the one command after it, or to the whole transaction when that
    /// command is MULTI (rueidis sends `CLIENT CACHING YES`, `MULTI`,
    /// `PTTL k`, the read, `EXEC`); one queued inside a MULTI applies to
    /// the commands queued after it. Reads inside a transaction are
    /// registered when they are queued, and again when EXEC is sent
    /// ([`Client::renew_tracked_reads`]), before Redis runs them.
    pub(super) fn track_read(&mut self, req: &Request) {
        let caching = req.args.len() >= 2
            && req.args[0].eq_ignore_ascii_case(b"client")
            && req.args[1].eq_ignore_ascii_case(b"caching");
        let in_tx = self.tx.is_some();
        if !in_tx {
            self.tx_caching = None;
            if std::mem::take(&mut self.caching_used) {
                self.st.tracking.caching = None;
            }
        }
        if caching {
            if in_tx && req.args.len() == 3 {
                // Only what CLIENT CACHING would accept at EXEC (its
                // errors are the EXEC's then, as Redis's).
                let t = &self.st.tracking;
                if req.args[2].eq_ignore_ascii_case(b"yes") && t.optin {
                    self.tx_caching = Some(true);
                } else if req.args[2].eq_ignore_ascii_case(b"no") && t.optout {
                    self.tx_caching = Some(false);
                }
            }
            return;
        }
        self.caching_used = true;
        let caching = if in_tx {
            self.tx_caching.or(self.st.tracking.caching)
        } else {
            self.st.tracking.caching
        };
        if !self.st.tracking.tracks_reads_with(caching) {
            return;
        }
        let shared = std::sync::Arc::clone(&self.shared);
        let Some(info) = shared.table.lookup(&req.args) else {
            return;
        };
        if !info.flags.readonly || info.writes_keys() {
            return;
        }
        self.keys.clear();
        if info.keys(&req.args, &mut self.keys).is_err() {
            return;
        }
        let bcast = self.st.tracking.bcast;
        if bcast && !self.keys.is_empty() {
            shared.tracked.touch(self.st.id);
        }
        for &i in &self.keys {
            let key = req.args[i].clone();
            if !bcast {
                shared.tracked.register(self.st.id, &key);
            }
            // Followed now, after the registration: every later change
            // reaches sidecache, so this client, whatever its read returns.
            let followed = self.follows(self.st.db, &key);
            self.tracked_reads.push((self.st.db, key, followed));
        }
    }

    /// EXEC is sent: the transaction's reads run now, not when they were
    /// queued, so they are registered again (a change told of meanwhile
    /// took a default-mode registration, and reached the client before
    /// EXEC's reply), BCAST records start again, and whether sidecache
    /// follows each key is decided anew (what it followed at queue time
    /// it may have stopped following since).
    pub(super) fn renew_tracked_reads(&mut self) {
        if self.tracked_reads.is_empty() {
            return;
        }
        let shared = std::sync::Arc::clone(&self.shared);
        let id = self.st.id;
        if self.st.tracking.bcast {
            shared.tracked.touch(id);
        }
        let mut reads = std::mem::take(&mut self.tracked_reads);
        for (db, key, followed) in &mut reads {
            if !self.st.tracking.bcast {
                shared.tracked.register(id, key);
            }
            *followed = self.follows(*db, key);
        }
        self.tracked_reads = reads;
    }

    /// After a batch's replies: the tracked reads of keys sidecache did
    /// not follow upstream when they were registered get their
    /// invalidation now, behind the replies. (Followed only later, a change
    /// made between the read and then would have gone unheard.) A key read
    /// on a fill lane in this batch is followed, value or not: Redis tracks
    /// what that connection read with `CLIENT CACHING YES` until its next
    /// change (or until the lane's channel is lost, which tells every
    /// tracking client to drop everything). Inside an open MULTI nothing is
    /// decided yet: the reads' replies come with EXEC's, and a message must
    /// not come before the reply it applies to.
    pub(super) fn end_tracked_reads(&mut self) {
        if self.tx.is_some() {
            return;
        }
        let mut reads = std::mem::take(&mut self.tracked_reads);
        let answered = !reads.is_empty();
        let fill_reads = std::mem::take(&mut self.fill_reads);
        let mut lost: Vec<Bytes> = reads
            .drain(..)
            .filter(|(db, key, followed)| {
                !followed && !fill_reads.iter().any(|(d, k)| d == db && k == key)
            })
            .map(|(_, key, _)| key)
            .collect();
        // One message per key (`PTTL k` and `GET k` read it twice).
        lost.sort_unstable();
        lost.dedup();
        if !lost.is_empty() {
            // For a BCAST client, also the touch below.
            self.shared.tracked.forget(self.st.id, &lost);
        } else if self.st.tracking.bcast && answered {
            // Answered: what it was told of while they were in flight may
            // be cached from them now (`Tracked::invalidate_learned`).
            self.shared.tracked.touch(self.st.id);
        }
        self.tracked_reads = reads;
    }

    /// Whether a change of `key` reaches sidecache: its node's
    /// invalidation channel (or the peer channel) is up and the L1 holds
    /// something filled for it (so the channel follows it).
    fn follows(&self, db: u16, key: &[u8]) -> bool {
        let up = match self.route_key(key) {
            Ok((node, _)) => self
                .topo
                .nodes()
                .get(node)
                .and_then(|n| n.tracking_up())
                .unwrap_or_else(|| self.shared.upstream.peer().is_some_and(|p| p.is_up())),
            Err(_) => false,
        };
        // BCAST upstream: Redis reports every change of the keys the L1
        // admits (its include prefixes are the BCAST prefixes), read or not.
        up && if self.optin {
            self.shared.l1.followed(db, key, false)
        } else {
            self.shared.l1.enabled() && self.shared.l1.config().key_allowed(key)
        }
    }
}
