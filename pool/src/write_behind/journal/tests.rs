use std::sync::atomic::AtomicUsize;

use std::time::Instant;

use super::writer::MARK_DELAY;
use super::*;

/// A fresh directory under the system's temp dir, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new() -> Dir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "sidecache-journal-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        Dir(p)
    }

    fn segments(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(&self.0)
            .map(|d| {
                d.filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "seg"))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn cfg(dir: &Dir, fsync: Fsync, segment_bytes: usize) -> JournalConfig {
    JournalConfig {
        path: dir.0.clone(),
        fsync,
        segment_bytes,
    }
}

fn cmd(i: u64) -> Vec<u8> {
    let k = format!("key:{i}");
    let v = format!("value:{i}");
    format!(
        "*3\r\n$3\r\nSET\r\n${}\r\n{k}\r\n${}\r\n{v}\r\n",
        k.len(),
        v.len()
    )
    .into_bytes()
}

async fn append_n(j: &Journal, range: std::ops::Range<u64>) -> u64 {
    let mut last = 0;
    for i in range {
        last = j.append((i % 3) as u16, &cmd(i)).expect("append");
    }
    j.durable().wait(last).await.expect("durable");
    last
}

#[tokio::test]
async fn a_crash_leaves_every_acknowledged_record_in_order() {
    for fsync in [Fsync::Always, Fsync::EverySec, Fsync::No] {
        let dir = Dir::new();
        let (j, left) = Journal::open(cfg(&dir, fsync, 1 << 20)).expect("open");
        assert!(left.records.is_empty());
        let last = append_n(&j, 0..500).await;
        assert_eq!(last, 500);
        // Half of them landed upstream: recorded as settled (within
        // MARK_DELAY), so a restart does not send them again.
        j.settled(1..=250);
        tokio::time::sleep(MARK_DELAY * 3).await;
        let on_disk = dir
            .segments()
            .iter()
            .map(|p| record::read(&Bytes::from(std::fs::read(p).expect("read"))).settled)
            .sum::<usize>();
        assert_eq!(on_disk, 250, "settled records written while running");
        // A crash: the process goes without closing (the lock goes with it).
        drop(j);
        std::thread::sleep(Duration::from_millis(50));
        let (j2, left) = Journal::open(cfg(&dir, fsync, 1 << 20)).expect("reopen");
        assert_eq!(left.records.len(), 250, "{fsync}");
        for (i, r) in (250..).zip(&left.records) {
            assert_eq!(r.seq, i + 1);
            assert_eq!(r.db, (i % 3) as u16);
            assert_eq!(r.cmd.as_ref(), cmd(i).as_slice());
        }
        assert_eq!(left.dropped_bytes, 0);
        left.finish().expect("finish");
        j2.close(true);
        assert!(dir.segments().is_empty(), "{:?}", dir.segments());
    }
}

#[tokio::test]
async fn settled_segments_are_deleted_and_the_size_stays_bounded() {
    let dir = Dir::new();
    // About 40 bytes a record: a segment every ~25 records.
    let (j, _) = Journal::open(cfg(&dir, Fsync::No, 1000)).expect("open");
    let (mut next, mut settled_to) = (0, 0);
    for _ in 0..20 {
        let last = append_n(&j, next..next + 100).await;
        next += 100;
        // Every write but the newest 10 landed.
        j.settled(settled_to + 1..=last - 10);
        settled_to = last - 10;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Let the writer delete what it was told to.
    let deadline = Instant::now() + Duration::from_secs(5);
    while dir.segments().len() > 2 && Instant::now() < deadline {
        j.settled(std::iter::empty());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let segs = dir.segments();
    assert!(
        segs.len() <= 2,
        "2,000 records, all but 10 settled: {} segments left",
        segs.len()
    );
    let bytes: u64 = segs
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    assert_eq!(j.stats().bytes.load(Ordering::Relaxed), bytes);
    assert!(bytes <= 2 * 1100, "{bytes} bytes left");
    // The unsettled ones are still there for a restart.
    drop(j);
    std::thread::sleep(Duration::from_millis(50));
    let (_j, left) = Journal::open(cfg(&dir, Fsync::No, 1000)).expect("reopen");
    let seqs: Vec<u64> = left.records.iter().map(|r| r.seq).collect();
    for s in 1991..=2000 {
        assert!(seqs.contains(&s), "unsettled record {s} kept");
    }
}

#[test]
fn one_journal_one_sidecache() {
    let dir = Dir::new();
    let (_j, _) = Journal::open(cfg(&dir, Fsync::EverySec, 1 << 20)).expect("open");
    match Journal::open(cfg(&dir, Fsync::EverySec, 1 << 20)) {
        Err(e @ JournalError::Locked { .. }) => {
            assert!(e.to_string().contains("in use by another sidecache"), "{e}")
        }
        other => panic!("second open: {other:?}"),
    }
}

#[tokio::test]
async fn a_torn_tail_is_dropped_and_the_rest_replayed() {
    let dir = Dir::new();
    let (j, _) = Journal::open(cfg(&dir, Fsync::Always, 1 << 20)).expect("open");
    append_n(&j, 0..10).await;
    drop(j);
    std::thread::sleep(Duration::from_millis(50));
    let seg = dir.segments().pop().expect("a segment");
    let data = std::fs::read(&seg).expect("read");
    std::fs::write(&seg, &data[..data.len() - 7]).expect("cut");
    let (j, left) = Journal::open(cfg(&dir, Fsync::Always, 1 << 20)).expect("reopen");
    assert_eq!(left.records.len(), 9);
    assert_eq!(left.dropped_bytes, record::encoded_len(&cmd(9)) - 7);
    assert_eq!(
        j.stats().dropped_bytes.load(Ordering::Relaxed),
        left.dropped_bytes as u64
    );
    // New records go to a new segment, after the old ones.
    append_n(&j, 100..101).await;
    let segs = dir.segments();
    assert_eq!(segs.len(), 2);
    assert_eq!(segs[0], seg);
}

#[tokio::test]
async fn a_failed_journal_refuses_writes() {
    let dir = Dir::new();
    let (j, _) = Journal::open(cfg(&dir, Fsync::Always, 1 << 20)).expect("open");
    append_n(&j, 0..1).await;
    // The next segment cannot be created: its name is taken by a directory.
    {
        let st = j.inner.lock();
        let next = st.next_segment;
        drop(st);
        std::fs::create_dir_all(segment_path(&dir.0, next)).expect("block the name");
    }
    let big = vec![b'x'; 2 << 20];
    let seq = j.append(0, &big).expect("append");
    match j.durable().wait(seq).await {
        Err(JournalError::Failed(text)) => assert!(!text.is_empty()),
        other => panic!("wait after a failed write: {other:?}"),
    }
    assert!(matches!(j.append(0, &cmd(1)), Err(JournalError::Failed(_))));
    assert_eq!(j.stats().errors.load(Ordering::Relaxed), 1);
}

#[test]
fn segment_size_follows_the_queue_bound() {
    assert_eq!(segment_bytes_for(64 << 20), 8 << 20);
    assert_eq!(segment_bytes_for(1 << 40), 16 << 20);
    assert_eq!(segment_bytes_for(1024), 64 << 10);
}
