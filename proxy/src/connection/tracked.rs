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
    /// [`Client::end_tracked_reads`]. A CLIENT CACHING applies to the one
    /// command after it.
    pub(super) fn track_read(&mut self, req: &Request) {
        let caching = req.args.len() >= 2
            && req.args[0].eq_ignore_ascii_case(b"client")
            && req.args[1].eq_ignore_ascii_case(b"caching");
        if std::mem::take(&mut self.caching_used) {
            self.st.tracking.caching = None;
        }
        if caching {
            return;
        }
        self.caching_used = true;
        if !self.st.tracking.tracks_reads() {
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
            self.tracked_reads.push((self.st.db, key));
        }
    }

    /// After a batch's replies: the tracked reads of keys sidecache does
    /// not follow upstream get their invalidation now, behind the replies.
    /// A key read on a fill lane in this batch is followed, value or not:
    /// Redis tracks what that connection read with `CLIENT CACHING YES`
    /// until its next change (or until the lane's channel is lost, which
    /// tells every tracking client to drop everything).
    pub(super) fn end_tracked_reads(&mut self) {
        let mut reads = std::mem::take(&mut self.tracked_reads);
        let fill_reads = std::mem::take(&mut self.fill_reads);
        let lost: Vec<Bytes> = reads
            .drain(..)
            .filter(|(db, key)| {
                !fill_reads.iter().any(|(d, k)| d == db && k == key) && !self.follows(*db, key)
            })
            .map(|(_, key)| key)
            .collect();
        if !lost.is_empty() {
            self.shared.tracked.forget(self.st.id, &lost);
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
        up && self.shared.l1.followed(db, key, !self.optin)
    }
}
