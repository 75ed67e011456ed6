//! The journal's writer thread: it writes what connections appended to
//! the segment files, syncs as `--write-journal-fsync` says, publishes how
//! far it got, records settled writes and deletes settled segments (see
//! the parent's documentation).

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{record, Chunk, Fsync, Inner};

/// With `everysec` and `no`, how long the writer lets records gather
/// after a write (the most a SIGKILL loses, beyond the write in hand).
const GATHER: Duration = Duration::from_millis(1);

/// Longest a settled record waits to be written (it is not needed for
/// any acknowledgement: it only spares a restart from writing again what
/// already landed).
pub(super) const MARK_DELAY: Duration = Duration::from_millis(50);

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
pub(super) fn write_loop(inner: &Inner) {
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
