//! Write-behind: acknowledged writes queued per (node, database) and sent
//! upstream in pipelined batches on a connection of their own.
//! This module owns the queues (bounds, journal, barriers, drain); the
//! batcher that sends each one, drawn below, is `tasks::write_batcher`,
//! a layer up since it needs connections and the router.
//!
//! ```text
//!  proxy ──Write──▶ [permit: --write-queue-max] ──▶ queue(node, db) ──▶ batcher ──≤200 cmds/pipeline──▶ upstream
//!                    enqueued += 1 (under the queue lock)                 │
//!                                                                         ├─ OK ───────────────▶ flushed += n
//!                                                                         ├─ MOVED/ASK ─────────▶ followed, in order
//!                                                                         ├─ READONLY/LOADING/… ▶ retried (backoff, re-routed)
//!                                                                         ├─ connection lost ───▶ whole batch resent (SETs are idempotent)
//!                                                                         └─ other error ───────▶ failed: counted, logged, listener told
//! ```
//!
//! One batcher per (node, database) sends batches in queue order on one
//! connection, so writes to one key reach upstream in the order they were
//! queued. A batch is sent as soon as there is a write (no artificial wait
//! when idle: no timer; when fewer than a quarter of `--write-batch` are
//! waiting, the batcher first lets the runtime serve its ready connections
//! up to twice, so writes already read join this batch instead of waiting
//! a round trip for the next); while it is out, the queue fills and the
//! next batch grows to `--write-batch`. With `--write-pipeline N` (default
//! 1), when a whole batch more is already waiting (sustained load) it is
//! sent before the answers of the earlier ones are in, up to N batches out
//! at once, so the flush rate is not one batch per round trip (at the price
//! of up to N × `--write-batch` commands outstanding on the connection).
//! A batch goes to the connection as gathered: the connection's writer does
//! not wait for other requests to join it.
//!
//! Answers are settled in send order. If a batch's connection broke, that
//! batch and every batch sent after it are sent again, one at a time, in
//! order, whatever their own outcome was (a later one may have landed on a
//! new connection before the resend of an earlier one: sending it again
//! puts its values back on top; SETs with absolute expiries are idempotent).
//!
//! # Race window
//! `enqueued` is incremented under the same lock as the channel send, so
//! the first `enqueued` items of the channel are exactly the writes counted.
//! `flushed` counts writes with a final outcome. A command that must see
//! every write queued so far waits for `flushed >= enqueued` as read before
//! it is sent ([`WriteQueue::barrier`]): all earlier writes have reached
//! upstream (or failed for good) by then.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, watch, Notify, Semaphore, SemaphorePermit};

use crate::config::WriteConfig;
use crate::error::{Error, Result};
use crate::slot::Slot;

pub mod journal;
pub(crate) mod keys;

use journal::Journal;

/// One acknowledged write.
#[derive(Debug, Clone)]
pub struct Write {
    /// Database it applies to.
    pub db: u16,
    /// Slot of its keys (cluster), for re-routing after a redirect.
    pub slot: Option<Slot>,
    /// The encoded command (`SET key …`, `MSET key value …`).
    pub cmd: Bytes,
    /// Optin tracking: its keys were read lately (within the L1's TTL cap), so the
    /// batch that carries it registers them again and reads them back
    /// (see [`crate::coherence::refill`]): they stay cached once it lands.
    pub refill: bool,
    /// Optin tracking: some key's written value is in the L1, to be
    /// released once the write lands ([`WriteListener::landed`]). A write
    /// whose keys were not cached (predicted unread) releases nothing:
    /// its landing costs no lookup.
    pub cached: bool,
}

/// The keys of one write (one, except for MSET): inline, no allocation.
pub type Keys = smallvec::SmallVec<[Bytes; 1]>;

impl Write {
    /// Its keys (for a failure report, or the peer channel), read back
    /// from the command: a queued write holds no other copy of them, nor a
    /// reference into the client's read buffer.
    pub fn keys(&self) -> Keys {
        keys::keys_of(&self.cmd)
            .map(|k| self.cmd.slice_ref(k))
            .collect()
    }
}

/// Told about writes that could not be applied upstream, so the proxy can
/// stop serving values upstream never got.
pub trait WriteListener: Send + Sync {
    /// `error` is the upstream's reply or our failure.
    fn failed(&self, db: u16, keys: &[Bytes], error: &str);

    /// Optin tracking: these writes of database `db` landed upstream
    /// (each key with the instant its write was acknowledged, as given to
    /// [`crate::Upstream::queue_write`]). Redis does not track keys for
    /// the proxy that wrote them, so the L1 must not keep serving these
    /// values unless a later write replaced them.
    fn landed(&self, db: u16, written: &mut dyn Iterator<Item = (&[u8], Instant)>) {
        let _ = (db, written);
    }

    /// Optin tracking: the write of `key` in database `db`, acknowledged
    /// at `written`, landed and was followed in its pipeline by a read
    /// that registered the key again (sent at `sent`): it returned
    /// `value` (`None`: nil) and `pttl` (see [`crate::coherence::refill`]).
    /// Called before [`WriteListener::landed`] for the batch; returns
    /// whether the value stays cached.
    fn refilled(
        &self,
        db: u16,
        key: &Bytes,
        written: Instant,
        value: Option<&Bytes>,
        pttl: i64,
        sent: Instant,
    ) -> bool {
        let _ = (db, key, written, value, pttl, sent);
        false
    }
}

/// Counters of the write-behind path.
#[derive(Debug, Default)]
pub struct WriteStats {
    /// Writes queued since start.
    pub queued: AtomicU64,
    /// Writes flushed (acknowledged upstream).
    pub flushed: AtomicU64,
    /// Writes that failed for good.
    pub failed: AtomicU64,
    /// Batches sent.
    pub batches: AtomicU64,
    /// Batch sizes, by the buckets of [`WriteConfig::batch_size_bounds`]
    /// then full batches (with the default 200: 1, 2–10, 11–50, 51–199,
    /// 200).
    pub batch_sizes: [AtomicU64; 5],
    /// Re-sends after connection loss or retryable errors.
    pub retries: AtomicU64,
    /// Batches sent while earlier ones were still unanswered.
    pub ahead: AtomicU64,
    /// Sum of flush latencies (queue to acknowledgement), microseconds.
    pub latency_us_sum: AtomicU64,
    /// Largest flush latency, microseconds.
    pub latency_us_max: AtomicU64,
    /// Writes refused because the queue stayed full.
    pub refused: AtomicU64,
    /// Writes that had to wait for room in the queue (backpressure: their
    /// client was not read meanwhile).
    pub waits: AtomicU64,
    /// Writes sent to another master than the one they were queued for
    /// (their node left the slot map: failover, resharding).
    pub rerouted: AtomicU64,
}

/// Bytes a queued write is charged beyond its encoded command: its entry
/// in the queue (the command handle, its database and slot, its time).
pub const QUEUED_OVERHEAD: usize = 64;

/// Room in the write-behind queues (one write, and its bytes), taken by
/// [`WriteBehind::reserve`] and given to [`WriteQueue::push`]. Dropped
/// unused, the room is freed.
#[derive(Debug)]
pub struct Reservation<'a> {
    count: SemaphorePermit<'a>,
    bytes: SemaphorePermit<'a>,
}

/// Shared write-behind state (one per upstream).
pub struct WriteBehind {
    cfg: WriteConfig,
    /// One permit per write that may be queued; a queued write's permit is
    /// given back when its batch is settled (one release per batch).
    permits: Semaphore,
    /// One permit per byte that may be queued (`--write-queue-max-bytes`),
    /// given back the same way.
    byte_permits: Semaphore,
    /// Bytes charged to queued writes.
    bytes: AtomicUsize,
    depth: AtomicUsize,
    /// Counters.
    pub stats: WriteStats,
    listener: Mutex<Option<Arc<dyn WriteListener>>>,
    closing: AtomicBool,
    live: AtomicUsize,
    idle: Notify,
    /// `--write-journal`: every queued write is recorded there first.
    journal: OnceLock<Arc<Journal>>,
    /// Replica reads: the slot stamps ([`crate::replica::stamps`]).
    stamps: OnceLock<Arc<crate::replica::stamps::Stamps>>,
}

impl std::fmt::Debug for WriteBehind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteBehind")
            .field("cfg", &self.cfg)
            .finish()
    }
}

/// What a drain achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainReport {
    /// Writes flushed during the whole run.
    pub flushed: u64,
    /// Writes that failed for good during the whole run.
    pub failed: u64,
    /// Writes still queued when the drain gave up.
    pub unflushed: u64,
}

impl WriteBehind {
    /// Write-behind state with `cfg`.
    pub fn new(cfg: WriteConfig) -> WriteBehind {
        WriteBehind {
            permits: Semaphore::new(cfg.queue_max.max(1)),
            byte_permits: Semaphore::new(cfg.queue_max_bytes.clamp(1, Semaphore::MAX_PERMITS)),
            bytes: AtomicUsize::new(0),
            cfg,
            depth: AtomicUsize::new(0),
            stats: WriteStats::default(),
            listener: Mutex::new(None),
            closing: AtomicBool::new(false),
            live: AtomicUsize::new(0),
            idle: Notify::new(),
            journal: OnceLock::new(),
            stamps: OnceLock::new(),
        }
    }

    /// Replica reads: every queued write is stamped in its slot, and its
    /// landing too (see [`crate::replica`]). Set once, before any write.
    pub(crate) fn set_stamps(&self, stamps: Arc<crate::replica::stamps::Stamps>) {
        let _ = self.stamps.set(stamps);
    }

    /// The slot stamps, with replica reads on.
    pub(crate) fn stamps(&self) -> Option<&crate::replica::stamps::Stamps> {
        self.stamps.get().map(|s| &**s)
    }

    /// The configuration.
    pub fn config(&self) -> &WriteConfig {
        &self.cfg
    }

    /// Writes queued and not yet flushed or failed.
    pub fn depth(&self) -> usize {
        self.depth.load(Ordering::Relaxed)
    }

    /// Bytes charged to the writes queued (see [`QUEUED_OVERHEAD`]).
    pub fn queued_bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Sets who is told about failed writes.
    pub fn set_listener(&self, l: Arc<dyn WriteListener>) {
        *self.listener.lock().unwrap_or_else(|p| p.into_inner()) = Some(l);
    }

    /// Records every write queued from now on in `journal` before it is
    /// queued (set once, before clients are served).
    pub fn set_journal(&self, journal: Arc<Journal>) {
        let _ = self.journal.set(journal);
    }

    /// The write journal, if any.
    pub fn journal(&self) -> Option<&Arc<Journal>> {
        self.journal.get()
    }

    /// Counts a batcher (`tasks::write_batcher`) started.
    pub(crate) fn batcher_started(&self) {
        self.live.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a batcher ended, and wakes a drain to look again.
    pub(crate) fn batcher_stopped(&self) {
        self.live.fetch_sub(1, Ordering::Relaxed);
        self.idle.notify_waiters();
    }

    /// Gives a settled batch's room back, in one release: `n` writes
    /// charged `charged` bytes in all.
    pub(crate) fn release(&self, n: usize, charged: usize) {
        self.permits.add_permits(n);
        self.byte_permits.add_permits(charged);
        self.bytes.fetch_sub(charged, Ordering::Relaxed);
        self.depth.fetch_sub(n, Ordering::Relaxed);
    }

    /// Wakes a drain once no write is queued.
    pub(crate) fn notify_if_idle(&self) {
        if self.depth() == 0 {
            self.idle.notify_waiters();
        }
    }

    /// Who is told about landed and failed writes, once set.
    pub(crate) fn listener(&self) -> Option<Arc<dyn WriteListener>> {
        self.listener
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits for room for one write of `size` bytes (its encoded command;
    /// [`QUEUED_OVERHEAD`] is added), bounded by `--write-queue-timeout`.
    ///
    /// # Errors
    /// [`Error::QueueFull`] / [`Error::QueueBytesFull`] when no room freed
    /// up in time; [`Error::TooLargeToQueue`] when the write alone exceeds
    /// the byte bound (send it through instead); [`Error::Closed`] when
    /// shutting down.
    pub async fn reserve(&self, size: usize) -> Result<Reservation<'_>> {
        self.reserve_within(self.cfg.queue_timeout, size).await
    }

    /// Like [`WriteBehind::reserve`], waiting at most `wait` (zero: only
    /// if room is free now).
    ///
    /// # Errors
    /// As [`WriteBehind::reserve`].
    pub async fn reserve_within(&self, wait: Duration, size: usize) -> Result<Reservation<'_>> {
        if self.closing.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let charge = size.saturating_add(QUEUED_OVERHEAD);
        let max_bytes = self.cfg.queue_max_bytes.clamp(1, Semaphore::MAX_PERMITS);
        let Ok(charge) = u32::try_from(charge).map_err(drop).and_then(|c| {
            if c as usize > max_bytes {
                Err(())
            } else {
                Ok(c)
            }
        }) else {
            return Err(Error::TooLargeToQueue {
                size,
                max_bytes: self.cfg.queue_max_bytes,
            });
        };
        if let (Ok(count), Ok(bytes)) = (
            self.permits.try_acquire(),
            self.byte_permits.try_acquire_many(charge),
        ) {
            return Ok(Reservation { count, bytes });
        }
        // The fast path may have taken one of the two; it is given back on
        // drop here, and the waits below take both in order.
        self.stats.waits.fetch_add(1, Ordering::Relaxed);
        let deadline = tokio::time::Instant::now() + wait;
        let count = match tokio::time::timeout_at(deadline, self.permits.acquire()).await {
            Ok(Ok(p)) => p,
            Ok(Err(_)) => return Err(Error::Closed),
            Err(_) => {
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
                return Err(Error::QueueFull {
                    max: self.cfg.queue_max,
                    waited: self.cfg.queue_timeout,
                });
            }
        };
        match tokio::time::timeout_at(deadline, self.byte_permits.acquire_many(charge)).await {
            Ok(Ok(bytes)) => Ok(Reservation { count, bytes }),
            Ok(Err(_)) => Err(Error::Closed),
            Err(_) => {
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
                Err(Error::QueueBytesFull {
                    max_bytes: self.cfg.queue_max_bytes,
                    waited: self.cfg.queue_timeout,
                })
            }
        }
    }

    /// Stops accepting writes and waits (up to `timeout`) until every
    /// queued write has been flushed or has failed.
    pub async fn drain(&self, timeout: Duration) -> DrainReport {
        self.closing.store(true, Ordering::Release);
        let deadline = Instant::now() + timeout;
        while self.depth() > 0 && Instant::now() < deadline {
            let idle = self.idle.notified();
            let _ = tokio::time::timeout(Duration::from_millis(50), idle).await;
        }
        DrainReport {
            flushed: self.stats.flushed.load(Ordering::Relaxed),
            failed: self.stats.failed.load(Ordering::Relaxed),
            unflushed: self.depth() as u64,
        }
    }
}

/// A queued write. Its queue permit was forgotten when it was queued and
/// is given back with its batch's (the batcher's `settle_batch`, through
/// [`WriteBehind::release`]).
pub(crate) struct Queued {
    pub(crate) write: Write,
    pub(crate) at: Instant,
    /// Its journal record's sequence number (0: not journalled).
    pub(crate) seq: u64,
    /// Its slot stamp's sequence number (replica reads; else 0).
    pub(crate) stamp: u64,
    /// Bytes charged to it (its command and [`QUEUED_OVERHEAD`]).
    pub(crate) charge: u32,
}

/// The batcher's end of one queue (`tasks::write_batcher`): the writes
/// queued, the signal that a whole batch is waiting, and the count of
/// writes with a final outcome, which the queue's barriers watch.
pub(crate) struct QueueEnd {
    pub(crate) rx: mpsc::Receiver<Queued>,
    pub(crate) full: Arc<Notify>,
    pub(crate) flushed: watch::Sender<u64>,
}

/// The queue of one (node, database).
#[derive(Debug)]
pub struct WriteQueue {
    tx: Mutex<mpsc::Sender<Queued>>,
    enqueued: AtomicU64,
    flushed: watch::Sender<u64>,
    /// Told when a whole batch is waiting (the batcher may send it ahead).
    full: Arc<Notify>,
    /// Writes waiting that make a whole batch; `None` with
    /// `--write-pipeline 1` (nothing is sent ahead, nobody to tell).
    ahead_at: Option<usize>,
}

/// Waits until the writes queued before it was taken have been flushed.
#[derive(Debug, Clone)]
pub struct Barrier {
    rx: watch::Receiver<u64>,
    target: u64,
}

impl Barrier {
    /// Whether every counted write is flushed already.
    pub fn is_done(&self) -> bool {
        *self.rx.borrow() >= self.target
    }

    /// Resolves once every counted write is flushed (or failed for good).
    pub async fn wait(mut self) {
        let target = self.target;
        let _ = self.rx.wait_for(|f| *f >= target).await;
    }
}

impl WriteQueue {
    /// A queue of one (node, database) with `cfg`'s bounds, and the end
    /// its batcher drains.
    pub(crate) fn open(cfg: &WriteConfig) -> (WriteQueue, QueueEnd) {
        // Capacity: the permits bound the total, so a push never finds the
        // channel full.
        let (tx, rx) = mpsc::channel(cfg.queue_max.max(1));
        let (flushed, _) = watch::channel(0u64);
        let full = Arc::new(Notify::new());
        let q = WriteQueue {
            tx: Mutex::new(tx),
            enqueued: AtomicU64::new(0),
            flushed,
            full: Arc::clone(&full),
            ahead_at: (cfg.pipeline > 1).then(|| cfg.batch.max(1)),
        };
        let end = QueueEnd {
            rx,
            full,
            flushed: q.flushed.clone(),
        };
        (q, end)
    }

    /// A barrier on the writes queued so far; `None` when none is pending.
    pub fn barrier(&self) -> Option<Barrier> {
        let target = self.enqueued.load(Ordering::Acquire);
        if *self.flushed.borrow() >= target {
            return None;
        }
        Some(Barrier {
            rx: self.flushed.subscribe(),
            target,
        })
    }

    /// Queues a write (the room came from [`WriteBehind::reserve`]; `at`
    /// is when it was acknowledged, for the flush latency). With a
    /// journal, its record is appended first, under the queue's lock (so
    /// the journal holds each queue's writes in queue order); returns the
    /// record's sequence number (0 without a journal), which the write's
    /// acknowledgement waits for ([`journal::Durable`]).
    ///
    /// # Errors
    /// [`Error::Closed`] if the batcher is gone (the room is freed);
    /// [`Error::Journal`] if the journal failed.
    pub fn push(
        &self,
        wb: &WriteBehind,
        write: Write,
        room: Reservation<'_>,
        at: Instant,
    ) -> Result<u64> {
        let charge = room.bytes.num_permits() as u32;
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        let seq = match wb.journal.get() {
            Some(j) => j.append(write.db, &write.cmd)?,
            None => 0,
        };
        // Before the acknowledgement: a read after it sees the slot dirty.
        let stamp = wb.stamps().map_or(0, |s| s.queued(write.slot));
        let item = Queued {
            write,
            at,
            seq,
            stamp,
            charge,
        };
        if tx.try_send(item).is_err() {
            // Shutting down (the batcher is gone): the record is let go
            // as settled, and the write refused.
            if let Some(j) = wb.journal.get() {
                j.settled(std::iter::once(seq));
            }
            return Err(Error::Closed);
        }
        room.count.forget();
        room.bytes.forget();
        self.enqueued.fetch_add(1, Ordering::AcqRel);
        let whole = self
            .ahead_at
            .is_some_and(|at| tx.max_capacity() - tx.capacity() >= at);
        drop(tx);
        if whole {
            self.full.notify_one();
        }
        wb.depth.fetch_add(1, Ordering::Relaxed);
        wb.bytes.fetch_add(charge as usize, Ordering::Relaxed);
        wb.stats.queued.fetch_add(1, Ordering::Relaxed);
        Ok(seq)
    }
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use sidecache_resp::encode::encode_command;

    use super::*;

    fn write(args: &[&str]) -> Write {
        let mut out = BytesMut::new();
        encode_command(&mut out, args);
        Write {
            db: 0,
            slot: None,
            cmd: out.freeze(),
            refill: false,
            cached: false,
        }
    }

    #[test]
    fn keys_are_read_back_from_the_command() {
        let k = |w: &Write| -> Vec<Bytes> { w.keys().into_vec() };
        assert_eq!(k(&write(&["SET", "a", "1"])), vec![Bytes::from("a")]);
        assert_eq!(
            k(&write(&["SET", "a b\r\n", "1", "PXAT", "123"])),
            vec![Bytes::from("a b\r\n")]
        );
        assert_eq!(
            k(&write(&["MSET", "a", "1", "b", "", "c", "3"])),
            vec![Bytes::from("a"), Bytes::from("b"), Bytes::from("c")]
        );
        assert_eq!(k(&write(&["mset", "x", "y"])), vec![Bytes::from("x")]);
        assert_eq!(k(&write(&["SET", "", "v"])), vec![Bytes::new()]);
        let junk = Write {
            db: 0,
            slot: None,
            cmd: Bytes::from_static(b"+OK\r\n"),
            refill: false,
            cached: false,
        };
        assert!(junk.keys().is_empty());
        // Framed as Redis reads it: a line ends at `\r` and any byte, and
        // a bulk's two trailing bytes are not checked.
        let odd = Write {
            db: 0,
            slot: None,
            cmd: Bytes::from_static(b"*3\r\n$3\rXset\r\n$1\rXk\r\n$2\r\nvvXY"),
            refill: false,
            cached: false,
        };
        assert_eq!(k(&odd), vec![Bytes::from("k")]);
    }

    #[tokio::test]
    async fn bytes_bound_the_queue_too() {
        let wb = WriteBehind::new(WriteConfig {
            queue_max: 100,
            queue_max_bytes: 3 * (1000 + QUEUED_OVERHEAD),
            ..WriteConfig::default()
        });
        let held = reserve_n(&wb, 3).await;
        assert!(matches!(
            wb.reserve_within(Duration::from_millis(10), 1000).await,
            Err(Error::QueueBytesFull { .. })
        ));
        // The count permit the refused write took is back.
        assert_eq!(wb.permits.available_permits(), 97);
        assert!(matches!(
            wb.reserve_within(Duration::ZERO, 4 * 1000).await,
            Err(Error::TooLargeToQueue { size: 4000, .. })
        ));
        drop(held);
        assert_eq!(
            wb.byte_permits.available_permits(),
            3 * (1000 + QUEUED_OVERHEAD)
        );
        let _r = wb
            .reserve_within(Duration::ZERO, 1000)
            .await
            .expect("room again");
    }

    async fn reserve_n(wb: &WriteBehind, n: usize) -> Vec<Reservation<'_>> {
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(wb.reserve_within(Duration::ZERO, 1000).await.expect("room"));
        }
        v
    }

    #[tokio::test]
    async fn room_comes_back_when_unused() {
        let wb = WriteBehind::new(WriteConfig {
            queue_max: 2,
            ..WriteConfig::default()
        });
        let a = wb.reserve_within(Duration::ZERO, 10).await.expect("room");
        let b = wb.reserve_within(Duration::ZERO, 10).await.expect("room");
        assert!(matches!(
            wb.reserve_within(Duration::ZERO, 10).await,
            Err(Error::QueueFull { max: 2, .. })
        ));
        drop(a);
        let _c = wb
            .reserve_within(Duration::ZERO, 10)
            .await
            .expect("freed room");
        drop(b);
    }
}
