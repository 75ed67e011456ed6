//! The write journal (`--write-journal`): every write-behind write is
//! appended to a local file before its client is answered, so that a crash
//! of sidecache itself (SIGKILL, OOM kill, panic, power loss with
//! `always`) loses no acknowledged write. The next start replays what the
//! journal still holds.
//!
//! ```text
//!  WriteQueue::push ──append (seq, under the queue lock)──▶ chunks ──▶ writer thread ──write(2)──▶ segment file
//!        │                                                                 │  fdatasync (always: each group;
//!        ▼                                                                 │             everysec: once a second)
//!  always: client's +OK waits for Durable(seq) ◀──── progress (seq) ◀──────┘
//!  batch settled upstream ──settled(seqs)──▶ a segment with no write left unsettled is deleted
//! ```
//!
//! **Order.** A write's record is appended under its queue's lock, so the
//! records of one queue are in the journal in queue order (the order Redis
//! applies them); a key's writes share a queue (or, after a slot moved,
//! wait for the old queue first), so replaying the journal in file order
//! keeps every key's order.
//!
//! **Acknowledgement.** With `always`, the client's `+OK` waits until its
//! record is written and `fdatasync`ed; one writer thread serves every
//! connection, so one `write` and one `fdatasync` cover every record that
//! arrived while the previous ones ran (group commit), and it never blocks
//! the runtime's threads. With `everysec` and `no` the write is
//! acknowledged once its record is appended in memory: the writer (woken
//! if idle) writes it to the file within moments and syncs once a second
//! (`everysec`) or never (`no`), so a crash loses at most what it had not
//! written or synced yet, about a second at worst, as the settings say.
//!
//! **Size.** Segments are rotated at [`JournalConfig::segment_bytes`]; a
//! segment is deleted once it is closed and every write in it was settled
//! upstream (flushed, or failed for good). The journal therefore holds the
//! queued writes plus the settled ones that share a segment with them.
//!
//! **Failure.** If the file cannot be written or synced, the journal stops:
//! writes waiting for it and every later one are answered `-MISCONF`
//! (as Redis does when its AOF cannot be written). Writes already queued
//! still reach upstream.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;

pub mod record;
mod writer;

pub use crate::error::JournalError;
pub use record::Record;

/// When the journal's file is synced to disk (as Redis's `appendfsync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fsync {
    /// After every group of records, before their writes are acknowledged.
    Always,
    /// Once a second: an OS crash or power loss may lose about one second.
    #[default]
    EverySec,
    /// Never by sidecache (the kernel writes back when it likes).
    No,
}

impl std::fmt::Display for Fsync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Fsync::Always => "always",
            Fsync::EverySec => "everysec",
            Fsync::No => "no",
        })
    }
}

/// Where and how the journal is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalConfig {
    /// The journal's directory (created if missing).
    pub path: PathBuf,
    /// When it is synced.
    pub fsync: Fsync,
    /// Bytes after which a new segment file is started.
    pub segment_bytes: usize,
}

/// The segment size for a write queue of `queue_max_bytes`: an eighth of
/// it, between 64 KB and 16 MB (so the journal stays near the queue bound).
pub fn segment_bytes_for(queue_max_bytes: usize) -> usize {
    (queue_max_bytes / 8).clamp(64 << 10, 16 << 20)
}

/// Bounds of the fsync latency buckets, in microseconds.
pub const FSYNC_BUCKETS_US: [u64; 10] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 50_000, 250_000,
];

/// Counters of the journal.
#[derive(Debug, Default)]
pub struct JournalStats {
    /// Records appended since start.
    pub appended: AtomicU64,
    /// Bytes in the segment files now (written, not yet deleted).
    pub bytes: AtomicU64,
    /// Segment files now.
    pub segments: AtomicU64,
    /// fdatasync calls, by [`FSYNC_BUCKETS_US`] (then above the last).
    pub fsync_buckets: [AtomicU64; FSYNC_BUCKETS_US.len() + 1],
    /// Sum of fsync latencies, microseconds.
    pub fsync_us_sum: AtomicU64,
    /// Records replayed at start.
    pub replayed: AtomicU64,
    /// Bytes of torn or corrupt records dropped at start.
    pub dropped_bytes: AtomicU64,
    /// Write or sync failures.
    pub errors: AtomicU64,
}

impl JournalStats {
    fn fsynced(&self, took: Duration) {
        let us = took.as_micros() as u64;
        let b = FSYNC_BUCKETS_US.partition_point(|&le| le < us);
        self.fsync_buckets[b].fetch_add(1, Ordering::Relaxed);
        self.fsync_us_sum.fetch_add(us, Ordering::Relaxed);
    }
}

/// How far the writer got: every record up to `seq` has the promise of
/// the fsync setting, unless `failed`.
#[derive(Debug, Clone, Default)]
struct Progress {
    seq: u64,
    failed: Option<Arc<str>>,
}

/// One segment file, live or being written.
#[derive(Debug)]
struct Segment {
    id: u64,
    /// Its first record's sequence number.
    first_seq: u64,
    /// Its writes not yet settled upstream.
    unsettled: u64,
    /// No more records go to it.
    closed: bool,
    /// The writer has written all of it and closed its file.
    written: bool,
}

/// Records appended and not yet written, for one segment.
#[derive(Debug)]
struct Chunk {
    segment: u64,
    buf: Vec<u8>,
    last_seq: u64,
}

#[derive(Debug)]
struct State {
    next_seq: u64,
    /// Bytes appended to the newest segment.
    newest_bytes: usize,
    next_segment: u64,
    segments: VecDeque<Segment>,
    chunks: VecDeque<Chunk>,
    spare: Vec<Vec<u8>>,
    /// Segment files to delete.
    delete: Vec<u64>,
    /// Writes settled upstream, by segment, not yet recorded as settled.
    marks: Vec<(u64, u64)>,
    /// The writer waits for work (tell it).
    writer_idle: bool,
    stop: bool,
    failed: Option<Arc<str>>,
}

impl State {
    /// Moves every closed, written and settled segment to `delete`.
    fn reap(&mut self) -> bool {
        let before = self.delete.len();
        let delete = &mut self.delete;
        self.segments.retain(|s| {
            let done = s.closed && s.written && s.unsettled == 0;
            if done {
                delete.push(s.id);
            }
            !done
        });
        self.delete.len() > before
    }
}

struct Inner {
    cfg: JournalConfig,
    state: Mutex<State>,
    wake: Condvar,
    progress: watch::Sender<Progress>,
    stats: JournalStats,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn segment_path(&self, id: u64) -> PathBuf {
        segment_path(&self.cfg.path, id)
    }
}

/// The journal of one sidecache (see the module's documentation).
pub struct Journal {
    inner: Arc<Inner>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Held for the life of the journal: the lock on `lock`.
    _lock: File,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("cfg", &self.inner.cfg)
            .finish()
    }
}

/// What a previous run left in the journal: its whole records, in order,
/// to replay before serving; then [`Leftover::finish`] deletes their files.
#[derive(Debug, Default)]
pub struct Leftover {
    /// The records, in journal order.
    pub records: Vec<Record>,
    /// Bytes of torn or corrupt records that were dropped.
    pub dropped_bytes: usize,
    /// Writes recorded as settled upstream (not replayed).
    pub settled: usize,
    files: Vec<PathBuf>,
}

impl Leftover {
    /// Deletes the previous run's segment files (once their writes landed).
    ///
    /// # Errors
    /// The first file that could not be removed.
    pub fn finish(self) -> Result<(), JournalError> {
        for f in &self.files {
            match std::fs::remove_file(f) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(open_error(f, &e)),
            }
        }
        Ok(())
    }
}

fn open_error(path: &Path, e: &std::io::Error) -> JournalError {
    JournalError::Open {
        path: path.to_owned(),
        message: e.to_string(),
    }
}

fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("journal-{id:020}.seg"))
}

fn segment_id(name: &str) -> Option<u64> {
    name.strip_prefix("journal-")?
        .strip_suffix(".seg")?
        .parse()
        .ok()
}

/// A durable acknowledgement to wait for.
#[derive(Debug)]
pub struct Durable {
    rx: watch::Receiver<Progress>,
}

impl Durable {
    /// Resolves once every record up to `seq` has the promise of the fsync
    /// setting.
    ///
    /// # Errors
    /// [`JournalError::Failed`] when the journal could not write it.
    pub async fn wait(&mut self, seq: u64) -> Result<(), JournalError> {
        let p = self
            .rx
            .wait_for(|p| p.seq >= seq || p.failed.is_some())
            .await
            .map_err(|_| JournalError::Failed("the journal writer stopped".into()))?;
        if p.seq >= seq {
            return Ok(());
        }
        Err(JournalError::Failed(
            p.failed.clone().unwrap_or_else(|| "unknown".into()),
        ))
    }
}

impl Journal {
    /// Opens the journal at `cfg.path`: takes its lock file, reads what a
    /// previous run left (dropping a torn or corrupt tail of each segment,
    /// with a log line), and starts the writer thread.
    ///
    /// # Errors
    /// [`JournalError::Locked`] when another sidecache uses it;
    /// [`JournalError::Open`] when it cannot be created or read.
    pub fn open(cfg: JournalConfig) -> Result<(Journal, Leftover), JournalError> {
        let dir = cfg.path.clone();
        std::fs::create_dir_all(&dir).map_err(|e| open_error(&dir, &e))?;
        let lock_path = dir.join("lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| open_error(&lock_path, &e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(JournalError::Locked {
                    path: dir,
                    lock: lock_path,
                })
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(open_error(&lock_path, &e)),
        }
        let leftover = read_leftover(&dir)?;
        let next_segment = leftover
            .files
            .iter()
            .filter_map(|f| segment_id(f.file_name()?.to_str()?))
            .max()
            .map_or(1, |m| m + 1);
        let (progress, _) = watch::channel(Progress::default());
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                next_seq: 1,
                newest_bytes: 0,
                next_segment: next_segment + 1,
                segments: VecDeque::from([Segment {
                    id: next_segment,
                    first_seq: 1,
                    unsettled: 0,
                    closed: false,
                    written: false,
                }]),
                chunks: VecDeque::new(),
                spare: Vec::new(),
                delete: Vec::new(),
                marks: Vec::new(),
                writer_idle: false,
                stop: false,
                failed: None,
            }),
            wake: Condvar::new(),
            progress,
            stats: JournalStats::default(),
            cfg,
        });
        inner
            .stats
            .dropped_bytes
            .store(leftover.dropped_bytes as u64, Ordering::Relaxed);
        let writer = std::thread::Builder::new()
            .name("sidecache-journal".into())
            .spawn({
                let inner = Arc::clone(&inner);
                move || writer::write_loop(&inner)
            })
            .map_err(|e| open_error(&dir, &e))?;
        Ok((
            Journal {
                inner,
                writer: Mutex::new(Some(writer)),
                _lock: lock,
            },
            leftover,
        ))
    }

    /// The configuration.
    pub fn config(&self) -> &JournalConfig {
        &self.inner.cfg
    }

    /// Counters.
    pub fn stats(&self) -> &JournalStats {
        &self.inner.stats
    }

    /// Appends the record of one write; its sequence number. Called under
    /// the write's queue lock (see "Order").
    ///
    /// # Errors
    /// [`JournalError::Failed`] once the journal could not be written.
    pub(crate) fn append(&self, db: u16, cmd: &[u8]) -> Result<u64, JournalError> {
        let mut st = self.inner.lock();
        if let Some(f) = &st.failed {
            return Err(JournalError::Failed(Arc::clone(f)));
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        let len = record::encoded_len(cmd);
        if st.newest_bytes > 0 && st.newest_bytes + len > self.inner.cfg.segment_bytes {
            let id = st.next_segment;
            st.next_segment += 1;
            if let Some(s) = st.segments.back_mut() {
                s.closed = true;
            }
            st.segments.push_back(Segment {
                id,
                first_seq: seq,
                unsettled: 0,
                closed: false,
                written: false,
            });
            st.newest_bytes = 0;
        }
        st.newest_bytes += len;
        let Some(newest) = st.segments.back_mut() else {
            return Err(JournalError::Failed("no segment".into()));
        };
        newest.unsettled += 1;
        let segment = newest.id;
        if st.chunks.back().is_none_or(|c| c.segment != segment) {
            let buf = st.spare.pop().unwrap_or_default();
            st.chunks.push_back(Chunk {
                segment,
                buf,
                last_seq: seq,
            });
        }
        if let Some(c) = st.chunks.back_mut() {
            record::encode(&mut c.buf, seq, db, cmd);
            c.last_seq = seq;
        }
        if std::mem::take(&mut st.writer_idle) {
            self.inner.wake.notify_one();
        }
        drop(st);
        self.inner.stats.appended.fetch_add(1, Ordering::Relaxed);
        Ok(seq)
    }

    /// Forgets the records `seqs` (0s are skipped): their writes were
    /// settled upstream. A segment left with none unsettled is deleted
    /// once closed.
    pub(crate) fn settled(&self, seqs: impl Iterator<Item = u64>) {
        let mut st = self.inner.lock();
        let mut emptied = false;
        let st = &mut *st;
        let first_marks = st.marks.is_empty();
        for seq in seqs.filter(|&s| s > 0) {
            let at = st.segments.partition_point(|s| s.first_seq <= seq);
            if let Some(s) = at.checked_sub(1).and_then(|i| st.segments.get_mut(i)) {
                s.unsettled = s.unsettled.saturating_sub(1);
                emptied |= s.unsettled == 0 && s.closed;
                // Recorded by the writer within MARK_DELAY (woken once
                // per batch of them: nobody waits for these).
                st.marks.push((s.id, seq));
            }
        }
        let wake = (emptied && st.reap()) || (first_marks && !st.marks.is_empty());
        if wake && std::mem::take(&mut st.writer_idle) {
            self.inner.wake.notify_one();
        }
    }

    /// A handle to wait for records to become durable.
    pub fn durable(&self) -> Durable {
        Durable {
            rx: self.inner.progress.subscribe(),
        }
    }

    /// Stops the writer (after it wrote and synced what it has). With
    /// `settled_all` (the shutdown drain flushed every write), the journal's
    /// files are deleted: nothing is left to replay.
    pub fn close(&self, settled_all: bool) {
        {
            let mut st = self.inner.lock();
            st.stop = true;
            self.inner.wake.notify_one();
        }
        let handle = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
        let st = self.inner.lock();
        if settled_all && st.failed.is_none() && st.segments.iter().all(|s| s.unsettled == 0) {
            for s in &st.segments {
                let _ = std::fs::remove_file(self.inner.segment_path(s.id));
            }
            self.inner.stats.bytes.store(0, Ordering::Relaxed);
            self.inner.stats.segments.store(0, Ordering::Relaxed);
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        let mut st = self.inner.lock();
        st.stop = true;
        self.inner.wake.notify_one();
    }
}

/// Reads every segment a previous run left in `dir`, in order.
fn read_leftover(dir: &Path) -> Result<Leftover, JournalError> {
    let mut ids: Vec<u64> = std::fs::read_dir(dir)
        .map_err(|e| open_error(dir, &e))?
        .filter_map(|e| {
            let e = e.ok()?;
            // Only files (anything else is not ours to read or delete).
            e.file_type().ok()?.is_file().then_some(())?;
            segment_id(e.file_name().to_str()?)
        })
        .collect();
    ids.sort_unstable();
    let mut out = Leftover::default();
    for id in ids {
        let path = segment_path(dir, id);
        let data = Bytes::from(std::fs::read(&path).map_err(|e| open_error(&path, &e))?);
        let read = record::read(&data);
        if let Some((offset, why)) = read.bad_tail {
            tracing::warn!(
                segment = %path.display(),
                offset,
                dropped_bytes = read.dropped_bytes,
                reason = why,
                "write journal: dropping a torn or corrupt tail (every whole record before it is replayed)"
            );
        }
        out.dropped_bytes += read.dropped_bytes;
        out.settled += read.settled;
        out.records.extend(read.records);
        out.files.push(path);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
