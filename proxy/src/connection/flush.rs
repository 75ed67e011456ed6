//! Resolving a batch: one pipelined submit per node, then replies written
//! in request order.
//!
//! Two passes. The *publish* pass finishes every fetch this client leads
//! (fill the L1, publish to coalesced readers) as soon as upstream answered,
//! before anything waits on another client: a client never waits on a
//! flight while holding one that others wait on, so coalescing cannot
//! deadlock. The *reply* pass then writes each reply in order, following
//! cluster redirects and merging split commands.

use std::sync::atomic::Ordering;

use bytes::{BufMut, Bytes, BytesMut};
use sidecache_pool::{Lane, Proto};
use sidecache_resp::encode::{self, put_header};
use sidecache_resp::frame::{self, Value};

use super::{Client, Fetch, MgetItem, Pending};
use crate::cmd::merge;
use crate::state::flight::{self, Fetched};

mod absorb;
mod combined;
use combined::rewrite_scan;

impl Client {
    /// Sends the batch's upstream work, waits for it, and writes every
    /// pending reply to `wbuf` in request order. Then BCAST tracking
    /// clients get the keys the batch changed (`Tracked::release`).
    pub(super) async fn flush(&mut self) {
        self.flush_batch().await;
        self.shared.tracked.release(self.st.id);
    }

    async fn flush_batch(&mut self) {
        if self.pending.is_empty() {
            if self.tx.is_some() {
                self.flush_open_tx().await;
                self.scratch.clear();
            }
            return;
        }
        // A forwarded command gets a clear error after --upstream-timeout,
        // never a hang behind a stalled upstream.
        let deadline = self.batch_deadline();
        self.deadline = deadline;
        self.submit(deadline).await;
        self.receive().await;
        if self
            .builders
            .iter()
            .chain(&self.fills)
            .any(|b| matches!(b.result, Some(Err(_))))
        {
            self.absorb(deadline).await;
        }
        self.note_failures();
        let mut pending = std::mem::take(&mut self.pending);
        self.publish(&mut pending).await;
        let (largest, errors) = self.reply_all(&mut pending).await;
        self.metrics.resolved();
        self.pending = pending;
        // A MULTI still open: what it collected so far goes to a held
        // connection, answered after everything before it.
        if self.tx.is_some() {
            self.flush_open_tx().await;
        }
        self.end_batch(largest, errors);
        if !self.tracked_reads.is_empty() || !self.fill_reads.is_empty() {
            self.end_tracked_reads();
        }
    }

    /// When a forwarded command of a batch starting now gets its clear
    /// error (`--upstream-timeout`), never a hang behind a stalled upstream.
    pub(super) fn batch_deadline(&self) -> Option<tokio::time::Instant> {
        self.shared
            .upstream
            .command_timeout()
            .map(|t| tokio::time::Instant::now() + t)
    }

    /// Sends each node's pipeline as one [`Upstream::submit`] (which first
    /// waits for the write-behind writes it must not overtake); a pipeline
    /// that cannot go gets its error as its result.
    ///
    /// [`Upstream::submit`]: sidecache_pool::Upstream::submit
    async fn submit(&mut self, deadline: Option<tokio::time::Instant>) {
        let session = self.session();
        let hint = self.hint();
        // The client's connections, then (optin tracking) the fill
        // connections: each node's fills go as one pipeline too.
        let start = self.shared.upstream.default_db();
        let per_node = self.fill_lanes;
        for fill in [false, true] {
            let len = if fill {
                self.fills.len()
            } else {
                self.builders.len()
            };
            for idx in 0..len {
                let b = if fill {
                    &mut self.fills[idx]
                } else {
                    &mut self.builders[idx]
                };
                if b.count == 0 {
                    continue;
                }
                let lane = if fill {
                    // Back to the start database (see `Lane::Fill`).
                    if b.selected.take().is_some_and(|d| d != start) {
                        let mut n = itoa::Buffer::new();
                        encode::encode_command(
                            &mut b.buf,
                            &[b"SELECT".as_slice(), n.format(start).as_bytes()],
                        );
                        b.count += 1;
                    }
                    Lane::Fill {
                        lane: idx % per_node,
                        reads: std::mem::take(&mut b.reads),
                    }
                } else {
                    Lane::Client { session, hint }
                };
                // A fill lane's node.
                let i = if fill { idx / per_node } else { idx };
                let payload = b.buf.split().freeze();
                let count = std::mem::take(&mut b.count);
                // Kept to be sent again: a replica's to its master
                // (`fall_back`), a master's when a failure is absorbed
                // (`absorb`).
                b.sent = Some((payload.clone(), count));
                let Some(node) = self.topo.node(i).cloned() else {
                    b.result = Some(Err(sidecache_pool::Error::SlotUnassigned(0)));
                    continue;
                };
                let sent = self.send_lane(&node, lane, payload, count, deadline).await;
                if let Some(c) = self.metrics.shard(&self.shared.metrics, &self.topo, i) {
                    c.commands.fetch_add(count as u64, Ordering::Relaxed);
                    if sent.waited {
                        c.write_waits.fetch_add(1, Ordering::Relaxed);
                    }
                }
                let b = if fill {
                    &mut self.fills[idx]
                } else {
                    &mut self.builders[idx]
                };
                match sent.replies {
                    Ok(rx) => b.rx = Some(rx),
                    Err(e) => b.result = Some(Err(e)),
                }
            }
        }
    }

    /// Waits for every submitted pipeline's replies (until the deadline
    /// they were submitted with).
    async fn receive(&mut self) {
        for lanes in [&mut self.builders, &mut self.fills] {
            for b in lanes.iter_mut() {
                if let Some(rx) = b.rx.take() {
                    b.result = Some(rx.replies().await);
                }
            }
        }
        if self.replica_reads {
            self.fall_back().await;
        }
    }

    /// Tells the upstream (health, slot-map refresh) and the node's
    /// metrics about every pipeline that failed.
    fn note_failures(&mut self) {
        for fill in [false, true] {
            let lane = if fill { &self.fills } else { &self.builders };
            for (i, b) in lane.iter().enumerate() {
                if let Some(Err(e)) = &b.result {
                    self.shared.upstream.note_failure(e);
                    // The client's ACL user no longer authenticates
                    // (deleted, disabled): it is disconnected, as Redis
                    // disconnects the clients of a deleted user.
                    if self.st.user.is_some() && e.refuses_credentials() {
                        self.user_gone = true;
                    }
                    let i = if fill { i / self.fill_lanes } else { i };
                    if let Some(c) = self.metrics.shard(&self.shared.metrics, &self.topo, i) {
                        c.pipeline_failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }

    /// The publish pass: finishes every fetch this client leads (see the
    /// module's documentation).
    async fn publish(&mut self, pending: &mut [Pending]) {
        for p in pending.iter_mut() {
            match p {
                Pending::Fetch(f) => self.finish_fetch(f).await,
                Pending::ReadFetch(f) => self.finish_read(f).await,
                Pending::Mget(items) => {
                    for item in items.iter_mut() {
                        if let MgetItem::Fetch(f) = item {
                            self.finish_fetch(f).await;
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// The reply pass: writes each pending reply in order (dropping those
    /// CLIENT REPLY OFF/SKIP silenced), emptying `pending`. Returns the
    /// largest reply's size and the count of upstream failures answered.
    async fn reply_all(&mut self, pending: &mut Vec<Pending>) -> (usize, u64) {
        let mut largest = 0usize;
        let mut errors = 0u64;
        let proto = self.st.proto;
        let silent = std::mem::take(&mut self.silent);
        let mut silent_at = silent.iter().peekable();
        for (i, p) in pending.drain(..).enumerate() {
            let path = p.path();
            let mark = self.wbuf.len();
            // CLIENT REPLY OFF/SKIP: resolved as any, then not written.
            while silent_at.peek().is_some_and(|r| r.end <= i) {
                silent_at.next();
            }
            let drop_reply = silent_at.peek().is_some_and(|r| r.contains(&i));
            // Entries answered from memory are written here, without the
            // future of `reply` (one per entry would cost an L1 hit ~7%
            // more instructions; bench/callgrind.sh).
            let failed = match self.reply_ready(p, proto) {
                Ok(failed) => failed,
                Err(p) => self.reply(p, proto).await,
            };
            if failed {
                errors += 1;
            }
            if let Some(path) = path {
                self.metrics.replied(path, &self.wbuf[mark..]);
            }
            largest = largest.max(self.wbuf.len() - mark);
            if drop_reply {
                self.wbuf.truncate(mark);
            }
        }
        let mut silent = silent;
        silent.clear();
        self.silent = silent;
        (largest, errors)
    }

    /// Writes the reply of an entry that needs no waiting (a local reply,
    /// an L1 hit, a fetch already answered, an MGET, a forwarded command
    /// whose reply is no redirect to follow, an invalidation with no peer
    /// to tell): `Ok(failed)`, or the entry back for [`Client::reply`].
    #[inline]
    fn reply_ready(&mut self, p: Pending, proto: Proto) -> Result<bool, Pending> {
        match p {
            Pending::Local(r) => self.wbuf.put_slice(&self.scratch[r]),
            Pending::Value(v) => write_value(&mut self.wbuf, proto, v.as_ref()),
            Pending::Fetch(f) => write_fetched(&mut self.wbuf, proto, f.result.as_ref()),
            Pending::Read { reply, from, shape } => {
                super::cache::reads::write_read(&mut self.wbuf, &reply, shape, from, proto);
            }
            Pending::ReadFetch(f) => match f.result {
                Some(Ok(r)) => self.wbuf.put_slice(&r),
                Some(Err(e)) => {
                    e.write_reply(&mut self.wbuf);
                    return Ok(true);
                }
                None => self
                    .wbuf
                    .put_slice(b"-ERR upstream fetch was abandoned\r\n"),
            },
            Pending::Mget(items) => return Ok(self.reply_mget(items, proto)),
            // What `reply_of` does when there is nothing to follow (and a
            // result that failed is answered as there).
            Pending::Up { node, idx, .. } if !self.may_follow(node, idx) => {
                match self.take_frame(node, idx) {
                    Ok(f) => self.wbuf.put_slice(&f),
                    Err(e) => {
                        e.write_reply(&mut self.wbuf);
                        return Ok(true);
                    }
                }
            }
            Pending::Invalidate(inval) if self.shared.upstream.peer().is_none() => {
                self.apply(&inval);
            }
            other => return Err(other),
        }
        Ok(false)
    }

    /// Whether the reply at (`node`, `idx`) on the client's connections may
    /// be one [`Client::reply_of`] follows (see [`Client::followed`]).
    fn may_follow(&self, node: u32, idx: u32) -> bool {
        self.builders
            .get(node as usize)
            .and_then(|b| b.result.as_ref())
            .and_then(|r| r.as_ref().ok())
            .and_then(|frames| frames.get(idx as usize))
            .is_some_and(|f| self.followed(f))
    }

    /// Whether a reply is followed (`Upstream::follow_via`) before the
    /// client gets it: on a cluster, any error reply (a redirect, or a
    /// passing error to wait out); standalone, `LOADING` (a restarted node
    /// loading its data).
    pub(in crate::connection) fn followed(&self, frame: &[u8]) -> bool {
        if self.topo.is_cluster() {
            frame::error_text(frame).is_some()
        } else {
            frame.starts_with(b"-LOADING")
        }
    }

    /// Writes one pending entry's reply to `wbuf`, waiting for what it
    /// needs. Returns whether it is an upstream failure (counted in
    /// `upstream_errors`).
    async fn reply(&mut self, p: Pending, proto: Proto) -> bool {
        match p {
            Pending::Local(_)
            | Pending::Value(_)
            | Pending::Fetch(_)
            | Pending::Read { .. }
            | Pending::ReadFetch(_)
            | Pending::Mget(_) => {
                return self.reply_ready(p, proto).unwrap_or_default();
            }
            Pending::Join(rx) => {
                let r = flight::wait(rx).await;
                write_fetched(&mut self.wbuf, proto, r.as_ref());
            }
            Pending::Journalled(seq) => {
                if let Err(e) = self.journalled(seq).await {
                    let text = format!("-MISCONF {e}");
                    self.wbuf
                        .put_slice(text.replace(['\r', '\n'], " ").as_bytes());
                    self.wbuf.put_slice(b"\r\n");
                    return true;
                }
                self.wbuf.put_slice(b"+OK\r\n");
            }
            Pending::Tx(t) => self.reply_tx(*t).await,
            Pending::LaneRead(lr) => return self.reply_lane_read(*lr).await,
            Pending::Invalidate(inval) => self.invalidated(inval).await,
            Pending::TxFollow(f) => self.tx_followed(*f),
            Pending::TxInvalidate(t) => {
                let (inval, reread) = *t;
                self.tx_invalidated(inval, reread).await;
            }
            Pending::Settle => self.shared.upstream.settle_tracking().await,
            Pending::Up {
                node,
                idx,
                slot,
                cmd,
            } => match self.reply_of(node, idx, slot, &cmd).await {
                Ok(f) => self.wbuf.put_slice(&f),
                Err(e) => {
                    e.write_reply(&mut self.wbuf);
                    return true;
                }
            },
            Pending::Merge { kind, parts, nkeys } => {
                return self.reply_merge(kind, parts, nkeys).await
            }
            Pending::Receivers(r) => match self.reply_of(r.node, r.idx, r.slot, &r.cmd).await {
                Ok(f) => self.adjust_receivers(&f, &r.adjust),
                Err(e) => {
                    e.write_reply(&mut self.wbuf);
                    return true;
                }
            },
            Pending::Control(cmd) => match self.shared.upstream.control_first_troubled(cmd).await {
                Ok(f) => self.wbuf.put_slice(&f),
                Err(e) => {
                    e.write_reply(&mut self.wbuf);
                    return true;
                }
            },
            Pending::Kill(cmd) => {
                let parts = self.shared.upstream.kill(cmd).await;
                merge::kill(&parts, &mut self.wbuf);
                return parts.iter().all(|p| p.is_err());
            }
            Pending::Scan {
                node,
                idx,
                cmd,
                shard,
                nshards,
            } => match self.reply_of(node, idx, None, &cmd).await {
                Ok(f) => rewrite_scan(&f, shard, nshards, &mut self.wbuf),
                Err(e) => {
                    e.write_reply(&mut self.wbuf);
                    return true;
                }
            },
            Pending::Info { upstream, proxy } => self.reply_info(upstream, proxy, proto).await,
        }
        false
    }

    /// An MGET's reply from its hits and fetches. Returns whether it failed.
    fn reply_mget(&mut self, items: Vec<MgetItem>, proto: Proto) -> bool {
        // MGET answers nil for a key of another type (where GET
        // says WRONGTYPE); any other failure fails the whole MGET.
        let failed = items.iter().find_map(|i| match i {
            MgetItem::Fetch(f) => match &f.result {
                Some(Fetched::Error(e)) if !e.starts_with(b"-WRONGTYPE") => Some(e.clone()),
                None => Some(Bytes::from_static(b"-ERR upstream fetch failed\r\n")),
                _ => None,
            },
            MgetItem::Hit(_) => None,
        });
        if let Some(e) = failed {
            self.wbuf.put_slice(&e);
            return true;
        }
        put_header(&mut self.wbuf, b'*', items.len() as i64);
        for i in items {
            match i {
                MgetItem::Hit(v) => write_value(&mut self.wbuf, proto, v.as_ref()),
                MgetItem::Fetch(f) => match &f.result {
                    Some(Fetched::Error(_)) => write_value(&mut self.wbuf, proto, None),
                    r => write_fetched(&mut self.wbuf, proto, r.as_ref()),
                },
            }
        }
        false
    }

    /// A write was acknowledged upstream: its invalidation applied again,
    /// and published to the peers (peer channel).
    pub(super) async fn invalidated(&mut self, inval: super::Inval) {
        self.invalidated_sparing(inval, false).await;
    }

    /// [`Client::invalidated`], sparing this client (see
    /// [`Client::apply_sparing`]).
    pub(super) async fn invalidated_sparing(&mut self, inval: super::Inval, spare: bool) {
        self.apply_sparing(&inval, spare);
        if self.shared.upstream.peer().is_some() {
            let keys = match &inval {
                super::Inval::Keys(k) => Some(&k[..]),
                super::Inval::All => None,
            };
            self.shared.upstream.publish_written(keys).await;
        }
    }

    /// The commands run since the last call reach CLIENT LIST (`tot-cmds`,
    /// `cmd`) and INFO: at the end of a batch, and when a blocking
    /// command's reply is in (counted then, as Valkey counts it).
    pub(super) fn publish_commands(&mut self) {
        self.st
            .entry
            .activity
            .answered(self.commands, self.last_cmd);
        self.shared
            .stats
            .commands
            .fetch_add(std::mem::take(&mut self.commands), Ordering::Relaxed);
    }

    /// The per-batch reset once every reply is written: counters added to
    /// the shared stats, the next batch's output estimate, and the topology
    /// picked up afresh.
    fn end_batch(&mut self, largest: usize, errors: u64) {
        self.answered += 1;
        self.scratch.clear();
        for b in self.builders.iter_mut().chain(self.fills.iter_mut()) {
            b.result = None;
            b.sent = None;
        }
        self.forwarded_write = false;
        self.publish_commands();
        if errors > 0 {
            let stats = &self.shared.stats;
            stats.upstream_errors.fetch_add(errors, Ordering::Relaxed);
        }
        self.batch_bytes = 0;
        // The largest reply of this batch: the next batch's estimate per
        // reply of unknown size (the largest rather than the mean, so a
        // few small replies do not let through a batch of large ones).
        self.out_known = 0;
        if largest > 0 {
            self.reply_estimate = largest.max(16);
        }
        self.batch_writes = false;
        self.now = None;
        // Pick up topology changes between batches.
        self.topo = self.shared.upstream.topology();
    }

    /// Takes a fetch's GET and PTTL replies, fills the L1 when allowed, and
    /// publishes the result to coalesced readers.
    async fn finish_fetch(&mut self, f: &mut Fetch) {
        let (got, pttl) = self.take_fetched(f.fill, f.node, f.idx);
        let result = match got {
            Err(e) => Fetched::Error(e.reply()),
            Ok(frame) if self.followed(&frame) => {
                self.shared.metrics.note_redirect(&frame);
                // A redirect (or another error): follow it for the GET alone
                // and do not fill; the next read will.
                let mut cmd = BytesMut::new();
                encode::encode_command(&mut cmd, &[b"GET".as_slice(), &f.key]);
                match self
                    .shared
                    .upstream
                    .follow_via(
                        self.via(),
                        self.session(),
                        f.slot,
                        &cmd.freeze(),
                        frame,
                        self.deadline,
                    )
                    .await
                {
                    Ok(frame) => fetched(&frame),
                    Err(e) => Fetched::Error(e.reply()),
                }
            }
            Ok(frame) => {
                let r = fetched(&frame);
                if let (Fetched::Value(v), Some(ticket), Some(pttl)) = (&r, f.ticket, pttl) {
                    self.shared.l1.complete_fill(
                        ticket,
                        self.st.db,
                        f.key.clone(),
                        v.clone(),
                        pttl,
                    );
                }
                r
            }
        };
        if let Some(flight) = f.flight.take() {
            flight.publish(result.clone());
            self.shared.flights.land(self.st.db, &f.key, &flight);
        }
        f.result = Some(result);
    }

    /// A fetch's two replies (the read's and its PTTL, as an integer), at
    /// `idx` of its builder, or (`fill`) of its node's fill lane.
    pub(super) fn take_fetched(
        &mut self,
        fill: bool,
        node: u32,
        idx: u32,
    ) -> (sidecache_pool::Result<Bytes>, Option<i64>) {
        let first = idx;
        let got = self.take_lane_frame(fill, node, first);
        let pttl =
            self.take_lane_frame(fill, node, first + 1)
                .ok()
                .and_then(|p| match Value::decode(&p) {
                    Ok(Value::Int(n)) => Some(n),
                    _ => None,
                });
        (got, pttl)
    }

    /// Takes one reply frame out of a node's results.
    pub(super) fn take_frame(&mut self, node: u32, idx: u32) -> sidecache_pool::Result<Bytes> {
        self.take_lane_frame(false, node, idx)
    }

    /// Takes one reply frame out of a node's results on the client's
    /// connection, or (`fill`) on the node's fill connection.
    pub(super) fn take_lane_frame(
        &mut self,
        fill: bool,
        node: u32,
        idx: u32,
    ) -> sidecache_pool::Result<Bytes> {
        let lane = if fill {
            &mut self.fills
        } else {
            &mut self.builders
        };
        let frame = match lane.get_mut(node as usize).and_then(|b| b.result.as_mut()) {
            Some(Ok(frames)) => frames
                .get_mut(idx as usize)
                .map(std::mem::take)
                .unwrap_or_default(),
            Some(Err(e)) => return Err(e.clone()),
            None => return Err(sidecache_pool::Error::Closed),
        };
        if frame.is_empty() {
            return Err(sidecache_pool::Error::Closed);
        }
        Ok(frame)
    }

    /// The final reply of one queued command, following cluster redirects.
    async fn reply_of(
        &mut self,
        node: u32,
        idx: u32,
        slot: Option<sidecache_pool::Slot>,
        cmd: &Bytes,
    ) -> sidecache_pool::Result<Bytes> {
        let frame = self.take_frame(node, idx)?;
        if !self.followed(&frame) || cmd.is_empty() {
            return Ok(frame);
        }
        self.shared.metrics.note_redirect(&frame);
        self.shared
            .upstream
            .follow_via(self.via(), self.session(), slot, cmd, frame, self.deadline)
            .await
    }
}

/// A GET reply as a protocol-independent result.
fn fetched(frame: &Bytes) -> Fetched {
    match Value::decode(frame) {
        Ok(Value::Bulk(b)) => Fetched::Value(Some(b)),
        Ok(Value::Nil) => Fetched::Value(None),
        _ => Fetched::Error(frame.clone()),
    }
}

fn write_value(out: &mut BytesMut, proto: Proto, v: Option<&Bytes>) {
    match v {
        Some(b) => encode::put_bulk(out, b),
        None if proto == Proto::Resp3 => out.put_slice(b"_\r\n"),
        None => out.put_slice(b"$-1\r\n"),
    }
}

fn write_fetched(out: &mut BytesMut, proto: Proto, r: Option<&Fetched>) {
    match r {
        Some(Fetched::Value(v)) => write_value(out, proto, v.as_ref()),
        Some(Fetched::Error(e)) => out.put_slice(e),
        None => out.put_slice(b"-ERR upstream fetch was abandoned\r\n"),
    }
}
