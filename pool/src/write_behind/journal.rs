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
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::watch;

pub mod record;

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

/// What can go wrong with the journal.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// Another process holds the journal's lock file.
    #[error("--write-journal {path}: in use by another sidecache (its lock file {lock} is held); each sidecache needs a journal of its own")]
    Locked {
        /// The journal directory.
        path: PathBuf,
        /// The lock file.
        lock: PathBuf,
    },
    /// Opening or reading the journal failed.
    #[error("--write-journal {path}: {message}")]
    Open {
        /// The file or directory.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// Writing or syncing the journal failed; it accepts no more writes.
    #[error("Errors writing to the write journal (--write-journal): {0}")]
    Failed(Arc<str>),
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
                move || write_loop(&inner)
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

/// With `everysec` and `no`, how long the writer lets records gather
/// after a write (the most a SIGKILL loses, beyond the write in hand).
const GATHER: Duration = Duration::from_millis(1);

/// Longest a settled record waits to be written (it is not needed for
/// any acknowledgement: it only spares a restart from writing again what
/// already landed).
const MARK_DELAY: Duration = Duration::from_millis(50);

/// Segment files the writer keeps open at most (the newest, and older
/// ones that get settled records).
const OPEN_FILES: usize = 8;

/// The writer thread's files.
struct Files {
    /// Open segment files, newest last.
    open: Vec<(u64, File)>,
    /// The segment appended to last.
    current: Option<u64>,
}

impl Files {
    /// The open file of segment `id`, opened (created, for a new newest
    /// segment) if need be.
    fn get(&mut self, inner: &Inner, id: u64, create: bool) -> std::io::Result<&mut File> {
        if let Some(i) = self.open.iter().position(|f| f.0 == id) {
            return Ok(&mut self.open[i].1);
        }
        let path = inner.segment_path(id);
        let f = if create {
            let mut f = OpenOptions::new()
                .create_new(true)
                .append(true)
                .open(&path)?;
            f.write_all(record::HEADER)?;
            if inner.cfg.fsync != Fsync::No {
                // The new file's name, too, must survive a power loss.
                File::open(&inner.cfg.path)?.sync_all()?;
            }
            inner.stats.segments.fetch_add(1, Ordering::Relaxed);
            inner
                .stats
                .bytes
                .fetch_add(record::HEADER.len() as u64, Ordering::Relaxed);
            f
        } else {
            OpenOptions::new().append(true).open(&path)?
        };
        if self.open.len() >= OPEN_FILES {
            // The oldest that is not the newest segment's.
            if let Some(i) = self.open.iter().position(|o| Some(o.0) != self.current) {
                self.open.remove(i);
            }
        }
        self.open.push((id, f));
        let last = self.open.len() - 1;
        Ok(&mut self.open[last].1)
    }

    fn close(&mut self, id: u64) {
        self.open.retain(|f| f.0 != id);
    }

    fn current_file(&self) -> Option<&File> {
        let id = self.current?;
        self.open.iter().find(|f| f.0 == id).map(|f| &f.1)
    }
}

/// The writer thread: writes appended records to their segment files,
/// syncs as configured, publishes progress, writes settled records and
/// deletes settled segments.
fn write_loop(inner: &Inner) {
    let fsync = inner.cfg.fsync;
    let mut files = Files {
        open: Vec::new(),
        current: None,
    };
    let mut dirty = false;
    let mut last_sync = Instant::now();
    let mut written_seq = 0u64;
    let mut done: Vec<Vec<u8>> = Vec::new();
    let mut marks_buf: Vec<u8> = Vec::new();
    let mut marks_since: Option<Instant> = None;
    let mut chunks: VecDeque<Chunk> = VecDeque::new();
    let mut marks: Vec<(u64, u64)> = Vec::new();
    let mut delete: Vec<u64> = Vec::new();
    let mut seqs: Vec<u64> = Vec::new();
    loop {
        // Swapped with the shared ones, so their capacity is kept and
        // reused turn after turn (no allocation per group).
        let stop = {
            let mut st = inner.lock();
            st.spare.append(&mut done);
            loop {
                if !st.chunks.is_empty() || !st.delete.is_empty() || st.stop {
                    break;
                }
                if !st.marks.is_empty() && marks_since.is_none() {
                    marks_since = Some(Instant::now());
                }
                let mut wait: Option<Duration> = None;
                if let Some(since) = marks_since {
                    wait = Some(MARK_DELAY.saturating_sub(since.elapsed()));
                }
                if fsync == Fsync::EverySec && dirty {
                    let left = Duration::from_secs(1).saturating_sub(last_sync.elapsed());
                    wait = Some(wait.map_or(left, |w| w.min(left)));
                }
                if wait.is_some_and(|w| w.is_zero()) {
                    break;
                }
                st.writer_idle = true;
                st = match wait {
                    Some(w) => {
                        inner
                            .wake
                            .wait_timeout(st, w)
                            .unwrap_or_else(|p| p.into_inner())
                            .0
                    }
                    None => inner.wake.wait(st).unwrap_or_else(|p| p.into_inner()),
                };
            }
            st.writer_idle = false;
            let marks_due = st.stop
                || marks_since.is_some_and(|t| t.elapsed() >= MARK_DELAY)
                || st.marks.len() >= 4096;
            std::mem::swap(&mut st.chunks, &mut chunks);
            if marks_due {
                std::mem::swap(&mut st.marks, &mut marks);
            }
            std::mem::swap(&mut st.delete, &mut delete);
            st.stop
        };
        if !marks.is_empty() {
            marks_since = None;
        }
        let seq_before = written_seq;
        let result = write_chunks(inner, &mut chunks, &mut files, &mut done, &mut written_seq)
            .and_then(|wrote| {
                dirty |= wrote;
                let due = match fsync {
                    Fsync::Always => wrote,
                    Fsync::EverySec => {
                        dirty && (last_sync.elapsed() >= Duration::from_secs(1) || stop)
                    }
                    Fsync::No => false,
                };
                if let (true, Some(f)) = (due, files.current_file()) {
                    let t = Instant::now();
                    f.sync_data()?;
                    inner.stats.fsynced(t.elapsed());
                    last_sync = Instant::now();
                    dirty = false;
                }
                Ok(())
            });
        match result {
            Ok(()) => {
                inner.progress.send_if_modified(|p| {
                    let moved = p.seq < written_seq;
                    p.seq = written_seq;
                    moved
                });
            }
            Err(e) => {
                inner.stats.errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(journal = %inner.cfg.path.display(), error = %e, "write journal failed; writes are refused (-MISCONF) until sidecache restarts");
                let text: Arc<str> = e.to_string().into();
                inner.lock().failed = Some(Arc::clone(&text));
                inner.progress.send_modify(|p| p.failed = Some(text));
                return;
            }
        }
        for id in delete.drain(..) {
            files.close(id);
            let path = inner.segment_path(id);
            match std::fs::metadata(&path).map(|m| m.len()) {
                Ok(len) => {
                    if let Err(e) = std::fs::remove_file(&path) {
                        tracing::warn!(segment = %path.display(), error = %e, "write journal: cannot delete a settled segment");
                        continue;
                    }
                    inner.stats.bytes.fetch_sub(len, Ordering::Relaxed);
                    inner.stats.segments.fetch_sub(1, Ordering::Relaxed);
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(segment = %path.display(), error = %e, "write journal: cannot delete a settled segment")
                }
            }
        }
        // Settled records, one per segment, each in its own segment's file
        // (after the writes it names: those were appended before they
        // were sent, so before they could settle). Not synced: losing one
        // only means writing again what landed.
        marks.sort_unstable();
        let mut at = 0;
        while at < marks.len() {
            let id = marks[at].0;
            let end = at + marks[at..].partition_point(|m| m.0 == id);
            seqs.clear();
            seqs.extend(marks[at..end].iter().map(|m| m.1));
            at = end;
            let live = inner.lock().segments.iter().any(|s| s.id == id);
            if !live {
                continue;
            }
            marks_buf.clear();
            record::encode_settled(&mut marks_buf, &seqs);
            let wrote = files
                .get(inner, id, false)
                .and_then(|f| f.write_all(&marks_buf));
            match wrote {
                Ok(()) => {
                    inner
                        .stats
                        .bytes
                        .fetch_add(marks_buf.len() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::warn!(segment = id, error = %e, "write journal: cannot record settled writes (a restart may write them again)")
                }
            }
        }
        marks.clear();
        if written_seq != seq_before && fsync != Fsync::Always && !stop {
            // Nobody waits for these writes: let the next ones gather for
            // a moment (appends meanwhile do not wake the writer), so a
            // busy journal takes one write a millisecond, not one per
            // record. A crash loses at most this moment's records.
            std::thread::sleep(GATHER);
        }
        if stop {
            let mut st = inner.lock();
            if st.chunks.is_empty() && st.marks.is_empty() {
                if let Some(f) = files.current_file() {
                    let _ = f.sync_data();
                }
                if let Some(id) = files.current {
                    if let Some(s) = st.segments.iter_mut().find(|s| s.id == id) {
                        s.written = true;
                    }
                }
                return;
            }
        }
    }
}

/// Writes `chunks` to their segment files (creating the next segment's
/// file, and syncing the one before, as they change). Whether anything
/// was written.
fn write_chunks(
    inner: &Inner,
    chunks: &mut VecDeque<Chunk>,
    files: &mut Files,
    done: &mut Vec<Vec<u8>>,
    written_seq: &mut u64,
) -> std::io::Result<bool> {
    let mut wrote = false;
    for mut c in chunks.drain(..) {
        if files.current != Some(c.segment) {
            if let Some(id) = files.current.take() {
                if inner.cfg.fsync != Fsync::No {
                    if let Some(i) = files.open.iter().position(|f| f.0 == id) {
                        let t = Instant::now();
                        files.open[i].1.sync_data()?;
                        inner.stats.fsynced(t.elapsed());
                    }
                }
                let mut st = inner.lock();
                if let Some(s) = st.segments.iter_mut().find(|s| s.id == id) {
                    s.written = true;
                }
                // Deleted on the next turn of the loop.
                st.reap();
            }
            files.get(inner, c.segment, true)?;
            files.current = Some(c.segment);
        }
        files.get(inner, c.segment, false)?.write_all(&c.buf)?;
        inner
            .stats
            .bytes
            .fetch_add(c.buf.len() as u64, Ordering::Relaxed);
        wrote = true;
        *written_seq = c.last_seq;
        c.buf.clear();
        // Keep a few buffers for reuse; drop any that grew very large.
        if c.buf.capacity() <= 1 << 20 && done.len() < 8 {
            done.push(c.buf);
        }
    }
    Ok(wrote)
}

#[cfg(test)]
mod tests;
