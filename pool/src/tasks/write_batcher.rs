//! The write-behind batcher of one (node, database) queue: batches sent
//! in queue order, answers settled in send order, a broken connection's
//! batch and every later one sent again, writes of a node that left the
//! slot map re-routed by slot, redirects and retryable errors followed
//! (see the diagram in [`crate::write_behind`], which owns the queues;
//! this task sends them, reaching the upstream only through [`Dispatch`]).

use std::collections::VecDeque;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use sidecache_resp::frame;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tracing::error;

use crate::backoff::Backoff;
use crate::cluster::redirect::{self, Action};
use crate::coherence::refill::{self, Rereads};
use crate::config::{NodeAddr, Proto, Session};
use crate::conn::mux::{MuxConn, Replies, GATHER_TURNS};
use crate::dispatch::{Dispatch, Target};
use crate::error::Result;
use crate::write_behind::keys::keys_of;
use crate::write_behind::{QueueEnd, Queued, Write, WriteQueue};

struct Batcher<U> {
    up: U,
    /// The node whose queue this is; its writes go elsewhere once it is no
    /// longer a master of the slot map.
    addr: NodeAddr,
    conn: MuxConn,
    /// Optin tracking: Redis does not track what this proxy writes, so
    /// each written value leaves the L1 once its write landed (see
    /// [`crate::coherence::tracking`], "Own writes").
    release: bool,
    /// Optin, on the invalidation channel's connection: writes of keys
    /// being read are followed by re-reads that keep them cached
    /// ([`crate::coherence::refill`]).
    reread: bool,
    db: u16,
    rx: mpsc::Receiver<Queued>,
    full: Arc<Notify>,
    flushed: watch::Sender<u64>,
    done: u64,
}

/// Starts the batcher of one (node, database); its queue.
/// `conn`: the connection to flush on (the node's tracking connection);
/// `None` for a dedicated one.
pub(crate) fn spawn<U: Dispatch>(
    up: U,
    addr: NodeAddr,
    db: u16,
    conn: Option<MuxConn>,
) -> WriteQueue {
    let wb = up.write_behind();
    let (q, QueueEnd { rx, full, flushed }) = WriteQueue::open(wb.config());
    let release = up.optin_tracking();
    let reread = release && conn.is_some();
    wb.batcher_started();
    tokio::spawn(async move {
        let conn = conn.unwrap_or_else(|| {
            up.dedicated_conn(
                &addr,
                Session {
                    db,
                    proto: Proto::Resp2,
                },
            )
        });
        let mut b = Batcher {
            up,
            addr,
            conn,
            release,
            reread,
            db,
            rx,
            full,
            flushed,
            done: 0,
        };
        b.run().await;
        b.up.write_behind().batcher_stopped();
    });
    q
}

/// A batch sent and not yet settled.
struct Sent {
    batch: Vec<Queued>,
    payload: Bytes,
    /// Commands in `payload`: the writes, then the re-reads' triples.
    count: usize,
    /// The keys re-read after the writes, and when the batch was sent.
    rereads: Rereads,
    sent: Instant,
    /// `None`: the connection task was gone.
    replies: Option<oneshot::Receiver<Result<Replies>>>,
}

impl Sent {
    /// Its answers; `None` if they are not all there (connection trouble)
    /// or the node answered READONLY (demoted: its connection reconnects,
    /// and batches sent after this one may land on the new primary first,
    /// so they all go again in order, as after a connection loss).
    async fn answers(&mut self) -> Option<Replies> {
        let rx = self.replies.as_mut()?;
        match rx.await {
            Ok(Ok(r)) => answers(r, self.count),
            _ => None,
        }
    }
}

/// The per-write replies of a batch of `n`.
fn answers(r: Replies, n: usize) -> Option<Replies> {
    if r.len() != n || r.iter().any(|f| f.starts_with(b"-READONLY")) {
        return None;
    }
    Some(r)
}

/// Longest pause between two retries of a write: with the slot map
/// refreshed as often, writes follow a promotion within a few hundred ms.
const RETRY_BACKOFF_MAX: Duration = Duration::from_millis(250);

impl<U: Dispatch> Batcher<U> {
    async fn run(&mut self) {
        let up = self.up.clone();
        let wb = up.write_behind();
        let max = wb.config().batch.max(1);
        let depth = wb.config().pipeline.max(1);
        let mut out: VecDeque<Sent> = VecDeque::with_capacity(depth);
        let mut spare: Vec<Vec<Queued>> = Vec::new();
        // The queue's sender lives as long as the node, so this runs for
        // the life of the process; a drain just waits for the queue to empty.
        loop {
            if out.is_empty() {
                let Some(first) = self.rx.recv().await else {
                    return;
                };
                let mut batch = spare.pop().unwrap_or_else(|| Vec::with_capacity(max));
                batch.push(first);
                let linger = wb.config().flush_interval;
                if !linger.is_zero() {
                    let until = tokio::time::Instant::now() + linger;
                    while batch.len() < max {
                        match tokio::time::timeout_at(until, self.rx.recv()).await {
                            Ok(Some(q)) => batch.push(q),
                            _ => break,
                        }
                    }
                } else {
                    // A small batch: let the runtime go round its ready
                    // connections first (as the connection writer does), so
                    // the writes of requests already read join this batch
                    // rather than waiting a round trip for the next. No
                    // timer: idle, this costs a few scheduler passes.
                    // Measured with `bench/ab.sh`: 6% more SETs per second
                    // at `-P 1`, with fewer, fuller batches upstream.
                    for _ in 0..GATHER_TURNS {
                        if self.rx.len() >= max / 4 {
                            break;
                        }
                        tokio::task::yield_now().await;
                    }
                }
                self.take_queued(&mut batch, max).await;
                out.push_back(self.submit(batch).await);
                continue;
            }
            // Batches are out: another goes ahead of their answers only
            // when a whole one is waiting.
            if out.len() < depth && self.rx.len() >= max {
                wb.stats.ahead.fetch_add(1, Ordering::Relaxed);
                let mut batch = spare.pop().unwrap_or_else(|| Vec::with_capacity(max));
                self.take_queued(&mut batch, max).await;
                out.push_back(self.submit(batch).await);
                continue;
            }
            let room = out.len() < depth;
            let answers = {
                let Some(oldest) = out.front_mut() else {
                    continue;
                };
                if room {
                    tokio::select! {
                        biased;
                        a = oldest.answers() => Some(a),
                        () = self.full.notified() => None,
                    }
                } else {
                    Some(oldest.answers().await)
                }
            };
            let Some(answers) = answers else {
                continue;
            };
            let Some(mut oldest) = out.pop_front() else {
                continue;
            };
            match answers {
                Some(a) => {
                    self.settle_batch(&mut oldest.batch, a, &oldest.rereads, oldest.sent)
                        .await;
                }
                None => {
                    // This batch and all sent after it go again, in order,
                    // once none of them is still on its way.
                    let mut again = vec![oldest];
                    while let Some(mut later) = out.pop_front() {
                        let _ = later.answers().await;
                        again.push(later);
                    }
                    for mut s in again {
                        let a = self.resend(&s.batch, s.payload, s.count).await;
                        self.settle_batch(&mut s.batch, a, &s.rereads, s.sent).await;
                        spare.push(s.batch);
                    }
                    continue;
                }
            }
            spare.push(oldest.batch);
        }
    }

    /// Adds writes already queued to `batch`, up to `max`. In one
    /// `recv_many`, which gives the channel its room back in one release
    /// (a `try_recv` each took the channel semaphore's lock per write:
    /// about 100 instructions of every write, callgrind). It does not wait
    /// for writes: the queue has one receiver, so what `is_empty` saw is
    /// still there (only the task budget may make it yield first).
    async fn take_queued(&mut self, batch: &mut Vec<Queued>, max: usize) {
        let room = max.saturating_sub(batch.len());
        if room > 0 && !self.rx.is_empty() {
            self.rx.recv_many(batch, room).await;
        }
    }

    /// Sends one batch as one pipeline; its answers come later.
    async fn submit(&mut self, batch: Vec<Queued>) -> Sent {
        let wb = self.up.write_behind();
        let n = batch.len();
        wb.stats.batches.fetch_add(1, Ordering::Relaxed);
        let bucket = wb.config().batch_size_bucket(n);
        wb.stats.batch_sizes[bucket].fetch_add(1, Ordering::Relaxed);
        let serves = self.up.serves(&self.addr);
        // The keys of every write are read only for a batch with a re-read.
        let rereads = if self.reread && batch.iter().any(|q| q.write.refill) {
            refill::plan(
                batch
                    .iter()
                    .map(|q| (q.write.refill, q.write.slot, q.write.keys())),
            )
        } else {
            Rereads::default()
        };
        let payload = if n == 1 && rereads.is_empty() {
            batch[0].write.cmd.clone()
        } else {
            let mut payload =
                BytesMut::with_capacity(batch.iter().map(|q| q.write.cmd.len()).sum());
            for q in &batch {
                payload.extend_from_slice(&q.write.cmd);
            }
            rereads.encode(&mut payload);
            payload.freeze()
        };
        let count = n + rereads.commands();
        if !rereads.is_empty() {
            if let Some(st) = self.up.coherence_stats() {
                st.registered_reads
                    .fetch_add(rereads.len() as u64, Ordering::Relaxed);
            }
        }
        let sent = Instant::now();
        tracing::debug!(db = self.db, n, bytes = payload.len(), "batch send");
        // A node that left the slot map gets nothing more: the batch goes
        // the resend way, to its slots' owners.
        let replies = if serves {
            self.conn.submit_gathered(payload.clone(), count).await.ok()
        } else {
            None
        };
        Sent {
            batch,
            payload,
            count,
            rereads,
            sent,
            replies,
        }
    }

    /// Sends `batch` (encoded as `payload`, `n` commands with its
    /// re-reads) again until every write has an answer: on the queue's own
    /// connection while its node is a master, else to the masters that own
    /// the writes' slots now (without the re-reads). Retries follow the
    /// slot map, refreshed every 100–250 ms while they fail.
    async fn resend(&mut self, batch: &[Queued], payload: Bytes, n: usize) -> Replies {
        let wb = self.up.write_behind();
        let mut backoff = Backoff::new(Duration::from_millis(20), RETRY_BACKOFF_MAX);
        let mut first = true;
        loop {
            let serves = self.up.serves(&self.addr);
            // Connection lost mid-batch: some writes may have run; resending
            // is safe (SET/MSET with absolute expiry are idempotent) and
            // keeps the order. A node that left the map is not waited for.
            if serves || !first {
                wb.stats.retries.fetch_add(1, Ordering::Relaxed);
                self.up.request_refresh();
                tokio::time::sleep(backoff.next_wait()).await;
            }
            first = false;
            if self.up.serves(&self.addr) {
                // READONLY here is settled write by write (retried).
                if let Ok(r) = self.conn.call(payload.clone(), n).await {
                    if r.len() == n {
                        return r;
                    }
                }
            } else if let Some(r) = self.reroute(batch).await {
                return r;
            }
        }
    }

    /// Sends each write of `batch` to the master that owns its slot in the
    /// current map: one pipeline per master, in batch order (a key's writes
    /// share a slot, so they stay in order). `None` if any master did not
    /// answer them all.
    async fn reroute(&self, batch: &[Queued]) -> Option<Replies> {
        let topo = self.up.topology();
        let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
        for (i, q) in batch.iter().enumerate() {
            let idx = match q.write.slot {
                Some(s) => topo.node_index(s).ok()?,
                None => 0,
            };
            match groups.iter_mut().find(|g| g.0 == idx) {
                Some(g) => g.1.push(i),
                None => groups.push((idx, vec![i])),
            }
        }
        let session = Session {
            db: self.db,
            proto: Proto::Resp2,
        };
        let mut waiting = Vec::with_capacity(groups.len());
        for (idx, members) in &groups {
            let node = topo.nodes().get(*idx)?;
            let mut payload = BytesMut::new();
            for &m in members {
                payload.extend_from_slice(&batch[m].write.cmd);
            }
            // The new owner's tracking connection where it carries this
            // database's writes, so its invalidation channel (NOLOOP) does
            // not echo them back.
            let conn = node
                .write_conn(self.db)
                .or_else(|| node.conn(session, 0).cloned())?;
            waiting.push(
                conn.submit_gathered(payload.freeze(), members.len())
                    .await
                    .ok()?,
            );
        }
        let mut replies = vec![Bytes::new(); batch.len()];
        for ((_, members), rx) in groups.iter().zip(waiting) {
            let r = rx.await.ok()?.ok()?;
            if r.len() != members.len() {
                return None;
            }
            for (&m, frame) in members.iter().zip(r) {
                replies[m] = frame;
            }
        }
        self.up
            .write_behind()
            .stats
            .rerouted
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        Some(replies)
    }

    /// Gives every write of a batch its final outcome, in order, and
    /// counts the batch as done. `replies` holds the re-reads' replies
    /// after the writes' when they were sent with them (`rereads`, sent at
    /// `sent`).
    async fn settle_batch(
        &mut self,
        batch: &mut Vec<Queued>,
        mut replies: Replies,
        rereads: &Rereads,
        sent: Instant,
    ) {
        let up = self.up.clone();
        let wb = up.write_behind();
        let n = batch.len();
        let reread_replies = if !rereads.is_empty() && replies.len() == n + rereads.commands() {
            replies.split_off(n)
        } else {
            Vec::new()
        };
        // Optin: the keys re-read after their writes (each written `+OK`)
        // become fills of what the re-read returned
        // (`crate::coherence::refill`), before the writes' values are
        // released below and before `flushed` moves, so a read that waited
        // for these writes finds them cached.
        if let (false, Some(l)) = (reread_replies.is_empty(), wb.listener()) {
            for (r, outcome) in rereads.outcomes(&reread_replies) {
                let landed = replies
                    .get(r.write)
                    .is_some_and(|f| f.first() == Some(&b'+'));
                if let (true, Some((value, pttl)), Some(q)) = (landed, outcome, batch.get(r.write))
                {
                    l.refilled(self.db, &r.key, q.at, value.as_ref(), pttl, sent);
                }
            }
        }
        let mut ok = 0u64;
        for (q, reply) in batch.iter().zip(replies) {
            // The common answer, `+OK`, needs no redirect or error check.
            if reply.first() == Some(&b'+') {
                ok += 1;
            } else {
                self.settle(&q.write, reply).await;
            }
        }
        wb.stats.flushed.fetch_add(ok, Ordering::Relaxed);
        // Replica reads: the batch landed now, stamped before its values
        // leave the L1 and before `flushed` moves (see `crate::replica`).
        if let Some(st) = wb.stamps() {
            let now = st.now();
            for q in batch.iter() {
                st.landed(q.write.slot, q.stamp, now);
            }
        }
        // Optin: every write of the batch has landed (or failed for good,
        // which already dropped its keys); their values leave the L1 unless
        // a later write or a re-read replaced them. Before `flushed` moves,
        // so a read that waited for these writes finds them released.
        if let (true, Some(l)) = (self.release, wb.listener()) {
            let mut written = batch
                .iter()
                .filter(|q| q.write.cached)
                .flat_map(|q| keys_of(&q.write.cmd).map(move |k| (k, q.at)));
            l.landed(self.db, &mut written);
        }
        if up.has_peer() {
            let keys: Vec<Bytes> = batch.iter().flat_map(|q| q.write.keys()).collect();
            up.publish_written(Some(&keys)).await;
        }
        // Their journal records are let go (a segment left with none is
        // deleted).
        if let Some(j) = wb.journal() {
            j.settled(batch.iter().map(|q| q.seq));
        }
        let now = Instant::now();
        let (mut sum, mut max) = (0u64, 0u64);
        let mut charged = 0usize;
        for q in batch.drain(..) {
            charged += q.charge as usize;
            let us = now.duration_since(q.at).as_micros() as u64;
            sum += us;
            max = max.max(us);
        }
        wb.stats.latency_us_sum.fetch_add(sum, Ordering::Relaxed);
        wb.stats.latency_us_max.fetch_max(max, Ordering::Relaxed);
        // The batch's room in the queues, in one release.
        wb.release(n, charged);
        self.done += n as u64;
        tracing::debug!(db = self.db, done = self.done, "batch done");
        self.flushed.send_replace(self.done);
        wb.notify_if_idle();
    }

    /// Follows redirects and retries one write until its final outcome.
    async fn settle(&self, w: &Write, reply: Bytes) {
        let wb = self.up.write_behind();
        let session = Session {
            db: self.db,
            proto: Proto::Resp2,
        };
        let mut backoff = Backoff::new(Duration::from_millis(20), RETRY_BACKOFF_MAX);
        let mut reply: Result<Bytes> = Ok(reply);
        loop {
            if let Ok(frame) = &reply {
                if matches!(
                    redirect::decide(frame, 0),
                    Action::Moved { .. } | Action::Ask { .. }
                ) {
                    reply = self
                        .up
                        .follow(session, 0, w.slot, &w.cmd, frame.clone())
                        .await;
                }
            }
            // A failure to reach the node (or no answer), and a redirect
            // still unresolved after following it (maps changing during a
            // failover), are sent again after a refresh.
            let failed = match &reply {
                Ok(frame) => match frame::error_text(frame) {
                    None => {
                        wb.stats.flushed.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    Some(text) if redirect::retry_write(text) => None,
                    Some(text) => Some(String::from_utf8_lossy(text).into_owned()),
                },
                Err(_) => None,
            };
            let Some(text) = failed else {
                wb.stats.retries.fetch_add(1, Ordering::Relaxed);
                self.up.request_refresh();
                tokio::time::sleep(backoff.next_wait()).await;
                let target = w.slot.map_or(Target::Any, Target::Slot);
                reply = self.up.execute(session, 0, target, w.cmd.clone()).await;
                continue;
            };
            wb.stats.failed.fetch_add(1, Ordering::Relaxed);
            let keys = w.keys();
            let names: Vec<String> = keys
                .iter()
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect();
            error!(db = w.db, keys = ?names, error = %text, "write-behind write failed for good");
            if let Some(l) = wb.listener() {
                l.failed(w.db, &keys, &text);
            }
            return;
        }
    }
}
