use super::*;

fn l1(max: u64) -> L1 {
    L1::new(L1Config {
        max_bytes: max,
        ..L1Config::default()
    })
}

/// An L1 that caches every written value (no read marks, as under
/// bcast): for what happens to written values themselves. Under optin a
/// key written again with no read between is not cached at all
/// (`a_write_reports_whether_…`).
fn l1_writes(max: u64) -> L1 {
    L1::new(L1Config {
        max_bytes: max,
        read_marks: false,
        ..L1Config::default()
    })
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

#[test]
fn fill_then_hit() {
    let c = l1(1 << 20);
    assert_eq!(c.get(0, &b("k")), Lookup::Miss);
    let t = c.begin_fill(0, b"k");
    assert!(c.complete_fill(t, 0, b("k"), Some(b("v")), -1));
    assert_eq!(c.get(0, &b("k")), Lookup::Hit(Some(b("v"))));
    // Databases are separate.
    assert_eq!(c.get(1, &b("k")), Lookup::Miss);
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.fills, s.entries), (1, 2, 1, 1));
}

#[test]
fn invalidation_during_fill_discards_it() {
    let c = l1(1 << 20);
    let t = c.begin_fill(0, b"k");
    c.invalidate(0, &b("k"));
    assert!(!c.complete_fill(t, 0, b("k"), Some(b("old")), -1));
    assert_eq!(c.get(0, &b("k")), Lookup::Miss);
    assert_eq!(c.stats().fills_discarded, 1);
    // A clear also discards fills in flight.
    let t = c.begin_fill(0, b"k");
    c.clear();
    assert!(!c.complete_fill(t, 0, b("k"), Some(b("old")), -1));
}

#[test]
fn overwrites_replace_in_place_without_touching_values_readers_hold() {
    let c = l1_writes(1 << 20);
    let later = Instant::now() + Duration::from_secs(5);
    assert!(
        c.insert_written(0, &b("k"), &b("one"), later, Instant::now())
            .cached
    );
    // A reader holds the old value while the key is overwritten with
    // one of the same length: the reader's bytes do not change.
    let Lookup::Hit(Some(held)) = c.get(0, &b("k")) else {
        panic!("written value not served");
    };
    assert!(
        c.insert_written(0, &b("k"), &b("two"), later, Instant::now())
            .cached
    );
    assert_eq!(held, b("one"));
    assert_eq!(c.get(0, &b("k")), Lookup::Hit(Some(b("two"))));
    drop(held);
    // Same length, no reader: the buffer is reused.
    assert!(
        c.insert_written(0, &b("k"), &b("six"), later, Instant::now())
            .cached
    );
    assert_eq!(c.get(0, &b("k")), Lookup::Hit(Some(b("six"))));
    // Another length; then a shorter deadline, which is kept.
    assert!(
        c.insert_written(0, &b("k"), &b("longer"), later, Instant::now())
            .cached
    );
    assert_eq!(c.get(0, &b("k")), Lookup::Hit(Some(b("longer"))));
    let soon = Instant::now() + Duration::from_millis(30);
    assert!(
        c.insert_written(0, &b("k"), &b("brief"), soon, Instant::now())
            .cached
    );
    assert_eq!(c.get(0, &b("k")), Lookup::Hit(Some(b("brief"))));
    std::thread::sleep(Duration::from_millis(40));
    assert_eq!(c.get(0, &b("k")), Lookup::Miss);
    // Overwrites are not evictions, and the weight follows the value.
    let s = c.stats();
    assert_eq!((s.evictions, s.writes, s.entries), (0, 5, 0));
    assert!(
        c.insert_written(
            0,
            &b("k"),
            &[b'x'; 1000].as_slice().into(),
            later,
            Instant::now()
        )
        .cached
    );
    let heavy = c.stats().bytes;
    assert!(
        c.insert_written(0, &b("k"), &b("x"), later, Instant::now())
            .cached
    );
    assert_eq!(c.stats().bytes, heavy - (heap_bytes(1000) - heap_bytes(1)));
}

#[test]
fn heavier_overwrites_stay_within_max_bytes() {
    let max = 64 * 1024;
    let c = l1_writes(max);
    let later = Instant::now() + Duration::from_secs(5);
    for i in 0..100 {
        assert!(
            c.insert_written(0, &b(&format!("k{i}")), &b("x"), later, Instant::now())
                .cached
        );
    }
    let big: Bytes = vec![b'v'; 4096].into();
    for i in 0..100 {
        c.insert_written(0, &b(&format!("k{i}")), &big, later, Instant::now());
    }
    let s = c.stats();
    assert!(
        s.bytes <= max,
        "{} bytes cached with max_bytes {max}",
        s.bytes
    );
    assert!(s.evictions > 0);
    // The last write of each key is served or the key is gone: never
    // the old value.
    for i in 0..100 {
        match c.get(0, &b(&format!("k{i}"))) {
            Lookup::Hit(v) => assert_eq!(v, Some(big.clone())),
            Lookup::Miss => {}
            Lookup::Bypass => panic!("bypass"),
        }
    }
}

#[test]
fn written_values_are_served_and_discard_fills() {
    let c = l1(1 << 20);
    let t = c.begin_fill(0, b"k");
    assert!(
        c.insert_written(
            0,
            &b("k"),
            &b("new"),
            Instant::now() + Duration::from_secs(5),
            Instant::now()
        )
        .cached
    );
    assert!(
        !c.complete_fill(t, 0, b("k"), Some(b("old")), -1),
        "fill raced the write"
    );
    assert_eq!(c.get(0, &b("k")), Lookup::Hit(Some(b("new"))));
    // Already expired: not cached, and the old entry is gone.
    assert!(
        !c.insert_written(0, &b("k"), &b("x"), Instant::now(), Instant::now())
            .cached
    );
    assert_eq!(c.get(0, &b("k")), Lookup::Miss);
}

#[test]
fn invalidations_without_a_database_reach_every_used_one() {
    let c = l1(1 << 20);
    for db in [0u16, 3, 70] {
        let t = c.begin_fill(db, b"k");
        assert!(c.complete_fill(t, db, b("k"), Some(b("v")), -1));
    }
    let t = c.begin_fill(5, b"other");
    assert!(c.complete_fill(t, 5, b("other"), Some(b("v")), -1));
    let mut seen = Vec::new();
    c.for_used_dbs(|db| seen.push(db));
    assert!(seen.contains(&0) && seen.contains(&3) && seen.contains(&5) && seen.contains(&70));
    assert!(!seen.contains(&1));
    c.invalidate_any_db(&b("k"));
    for db in [0u16, 3, 70] {
        assert_eq!(c.get(db, &b("k")), Lookup::Miss, "db {db}");
    }
    assert_eq!(c.get(5, &b("other")), Lookup::Hit(Some(b("v"))));
}

#[test]
fn invalidate_where_drops_matching_keys_and_fills_in_flight() {
    let c = l1(1 << 20);
    for k in ["a:1", "a:2", "b:1"] {
        let t = c.begin_fill(0, k.as_bytes());
        assert!(c.complete_fill(t, 0, b(k), Some(b("v")), -1));
    }
    let t = c.begin_fill(0, b"b:2");
    c.invalidate_where(|_, k| k.starts_with(b"a:"));
    assert_eq!(c.get(0, &b("a:1")), Lookup::Miss);
    assert_eq!(c.get(0, &b("a:2")), Lookup::Miss);
    assert_eq!(c.get(0, &b("b:1")), Lookup::Hit(Some(b("v"))));
    assert!(
        !c.complete_fill(t, 0, b("b:2"), Some(b("v")), -1),
        "a fill begun before is discarded"
    );
}

#[test]
fn invalidate_removes() {
    let c = l1(1 << 20);
    let t = c.begin_fill(0, b"k");
    assert!(c.complete_fill(t, 0, b("k"), Some(b("v")), -1));
    c.invalidate(0, &b("k"));
    assert_eq!(c.get(0, &b("k")), Lookup::Miss);
}

#[test]
fn ttl_and_limits() {
    let c = L1::new(L1Config {
        max_bytes: 1 << 20,
        max_value_bytes: 4,
        ..L1Config::default()
    });
    let t = c.begin_fill(0, b"big");
    assert!(
        !c.complete_fill(t, 0, b("big"), Some(b("12345")), -1),
        "too large"
    );
    let t = c.begin_fill(0, b"nil");
    assert!(
        !c.complete_fill(t, 0, b("nil"), None, -2),
        "nil not cached by default"
    );
    let t = c.begin_fill(0, b"gone");
    assert!(
        !c.complete_fill(t, 0, b("gone"), Some(b("v")), -2),
        "expired between GET and PTTL"
    );
    let t = c.begin_fill(0, b"short");
    assert!(c.complete_fill(t, 0, b("short"), Some(b("v")), 30));
    std::thread::sleep(Duration::from_millis(60));
    assert_eq!(c.get(0, &b("short")), Lookup::Miss, "expired with upstream");
    let c = L1::new(L1Config {
        max_bytes: 1 << 20,
        cache_nil: Some(Duration::from_secs(5)),
        ..L1Config::default()
    });
    let t = c.begin_fill(0, b"nil");
    assert!(c.complete_fill(t, 0, b("nil"), None, -2));
    assert_eq!(c.get(0, &b("nil")), Lookup::Hit(None));
}

#[test]
fn cap_bounds_life() {
    let c = L1::new(L1Config {
        max_bytes: 1 << 20,
        ttl_cap: Duration::from_millis(30),
        ..L1Config::default()
    });
    let t = c.begin_fill(0, b"k");
    assert!(c.complete_fill(t, 0, b("k"), Some(b("v")), -1));
    std::thread::sleep(Duration::from_millis(60));
    assert_eq!(c.get(0, &b("k")), Lookup::Miss);
}

#[test]
fn bytes_stay_bounded() {
    let c = l1(64 * 1024);
    let v = Bytes::from(vec![b'x'; 1000]);
    for i in 0..1000 {
        let k = Bytes::from(format!("key:{i}"));
        let t = c.begin_fill(0, &k);
        c.complete_fill(t, 0, k, Some(v.clone()), -1);
    }
    let s = c.stats();
    assert!(s.bytes <= 64 * 1024, "{s:?}");
    assert!(s.evictions > 0);
}

#[test]
fn off_and_filtered() {
    let c = l1(0);
    assert_eq!(c.get(0, &b("k")), Lookup::Bypass);
    let c = L1::new(L1Config {
        exclude_prefixes: vec![b"tmp:".to_vec()],
        ..L1Config::default()
    });
    assert_eq!(c.get(0, &b("tmp:1")), Lookup::Bypass);
    assert_eq!(c.get(0, &b("k")), Lookup::Miss);
}

#[test]
fn a_landed_write_releases_only_its_own_value() {
    let c = l1_writes(1 << 20);
    let t0 = Instant::now();
    let far = t0 + Duration::from_secs(60);
    let (w1, w2) = (t0, t0 + Duration::from_micros(1));
    // W1 lands while its value is still there: released.
    assert!(c.insert_written(0, &b("k"), &b("one"), far, w1).cached);
    assert!(c.release_written(0, b"k", w1));
    assert_eq!(c.get_at(0, &b("k"), w2), Lookup::Miss);
    // W2 replaced W1's value before W1 landed: W1's landing keeps it, W2's
    // releases it.
    assert!(c.insert_written(0, &b("k"), &b("one"), far, w1).cached);
    assert!(c.insert_written(0, &b("k"), &b("two"), far, w2).cached);
    assert!(!c.release_written(0, b"k", w1));
    assert_eq!(c.get_at(0, &b("k"), w2), Lookup::Hit(Some(b("two"))));
    assert!(c.release_written(0, b"k", w2));
    assert_eq!(c.get_at(0, &b("k"), w2), Lookup::Miss);
    // A fill's value (read after the write landed, tracked) is kept, and
    // another database's entry is not touched.
    let t = c.begin_fill(0, b"k");
    assert!(c.complete_fill(t, 0, b("k"), Some(b("read")), -1));
    assert!(c.insert_written(1, &b("k"), &b("db1"), far, w1).cached);
    assert!(!c.release_written(0, b"k", w1));
    assert_eq!(c.get_at(0, &b("k"), w2), Lookup::Hit(Some(b("read"))));
    assert_eq!(c.get_at(1, &b("k"), w2), Lookup::Hit(Some(b("db1"))));
    // A key no longer there: nothing to release.
    assert!(!c.release_written(0, b"gone", w1));
    assert_eq!(c.stats().released, 2);
}

/// A read of `key` named `sig`, looked up now.
fn read(c: &L1, key: &str, sig: &str) -> ReadLookup {
    c.read_at(0, key.as_bytes(), |s| s == sig.as_bytes(), Instant::now())
}

fn fill_read(c: &L1, key: &str, sig: &str, reply: &str) -> bool {
    let t = c.begin_fill(0, key.as_bytes());
    c.complete_read(t, 0, &b(key), b(sig), reply.as_bytes(), 2, -1)
}

#[test]
fn reads_are_cached_by_signature_beside_get() {
    let c = l1(1 << 20);
    assert_eq!(read(&c, "h", "hgetall"), ReadLookup::Miss);
    assert!(fill_read(&c, "h", "hgetall", "%0\r\n"));
    assert!(fill_read(&c, "h", "hlen", ":0\r\n"));
    assert_eq!(read(&c, "h", "hgetall"), ReadLookup::Hit(b("%0\r\n"), 2));
    assert_eq!(read(&c, "h", "hlen"), ReadLookup::Hit(b(":0\r\n"), 2));
    assert_eq!(read(&c, "h", "hkeys"), ReadLookup::Miss);
    // GET is not cached by other reads, and its fill keeps them.
    assert_eq!(c.get(0, &b("h")), Lookup::Miss);
    let t = c.begin_fill(0, b"h");
    assert!(c.complete_fill(t, 0, b("h"), Some(b("v")), -1));
    assert_eq!(c.get(0, &b("h")), Lookup::Hit(Some(b("v"))));
    assert_eq!(read(&c, "h", "hlen"), ReadLookup::Hit(b(":0\r\n"), 2));
    // A fill of the same read replaces it.
    assert!(fill_read(&c, "h", "hlen", ":1\r\n"));
    assert_eq!(read(&c, "h", "hlen"), ReadLookup::Hit(b(":1\r\n"), 2));
    let s = c.stats();
    assert_eq!((s.read_hits, s.read_fills, s.entries), (4, 3, 1));
}

#[test]
fn any_invalidation_of_a_key_drops_all_its_reads() {
    let c = l1(1 << 20);
    assert!(fill_read(&c, "h", "hgetall", "%0\r\n"));
    c.invalidate(0, &b("h"));
    assert_eq!(read(&c, "h", "hgetall"), ReadLookup::Miss);
    // A write-behind write of the key drops its other reads.
    assert!(fill_read(&c, "s", "strlen", ":1\r\n"));
    let later = Instant::now() + Duration::from_secs(5);
    assert!(
        c.insert_written(0, &b("s"), &b("x"), later, Instant::now())
            .cached
    );
    assert_eq!(read(&c, "s", "strlen"), ReadLookup::Miss);
    assert_eq!(c.get(0, &b("s")), Lookup::Hit(Some(b("x"))));
    // Also when the written value replaces a cached one in place.
    assert!(fill_read(&c, "s", "strlen", ":1\r\n"));
    assert!(
        c.insert_written(0, &b("s"), &b("y"), later, Instant::now())
            .cached
    );
    assert_eq!(read(&c, "s", "strlen"), ReadLookup::Miss);
    // FLUSH*.
    assert!(fill_read(&c, "h", "hgetall", "%0\r\n"));
    c.clear();
    assert_eq!(read(&c, "h", "hgetall"), ReadLookup::Miss);
}

#[test]
fn a_read_fill_raced_by_an_invalidation_is_discarded() {
    let c = l1(1 << 20);
    let t = c.begin_fill(0, b"h");
    c.invalidate(0, &b("h"));
    assert!(!c.complete_read(t, 0, &b("h"), b("hgetall"), b"%0\r\n", 2, -1));
    assert_eq!(read(&c, "h", "hgetall"), ReadLookup::Miss);
    // A GET fill begun before an invalidation does not bring back reads
    // cached before it either.
    assert!(fill_read(&c, "h", "hlen", ":0\r\n"));
    let t = c.begin_fill(0, b"h");
    c.invalidate(0, &b("h"));
    assert!(!c.complete_fill(t, 0, b("h"), Some(b("v")), -1));
    assert_eq!(read(&c, "h", "hlen"), ReadLookup::Miss);
}

#[test]
fn reads_respect_ttl_size_nil_and_count_bounds() {
    let c = L1::new(L1Config {
        max_bytes: 1 << 20,
        max_value_bytes: 8,
        ..L1Config::default()
    });
    let t = c.begin_fill(0, b"k");
    assert!(!c.complete_read(t, 0, &b("k"), b("big"), b"123456789", 2, -1));
    // A missing key's read is not cached unless nils are.
    let t = c.begin_fill(0, b"k");
    assert!(!c.complete_read(t, 0, &b("k"), b("exists"), b":0\r\n", 2, -2));
    // It expires with the key.
    let t = c.begin_fill(0, b"k");
    assert!(c.complete_read(t, 0, &b("k"), b("strlen"), b":1\r\n", 2, 30));
    assert_ne!(read(&c, "k", "strlen"), ReadLookup::Miss);
    std::thread::sleep(Duration::from_millis(40));
    assert_eq!(read(&c, "k", "strlen"), ReadLookup::Miss);
    // At most MAX_READS_PER_KEY per key, the oldest dropped first.
    for i in 0..reads::MAX_READS_PER_KEY + 2 {
        assert!(fill_read(&c, "z", &format!("r{i}"), ":1\r\n"));
    }
    assert_eq!(read(&c, "z", "r0"), ReadLookup::Miss);
    assert_eq!(read(&c, "z", "r1"), ReadLookup::Miss);
    assert_ne!(read(&c, "z", "r2"), ReadLookup::Miss);
    // Reads weigh in the one byte budget.
    let w = c.stats().bytes;
    assert!(fill_read(&c, "y", "x", ":1\r\n"));
    assert!(c.stats().bytes > w);
}

#[test]
fn read_bytes_stay_bounded() {
    let c = l1(64 * 1024);
    let reply = "x".repeat(500);
    for i in 0..2000 {
        fill_read(&c, &format!("k{i}"), "hgetall", &reply);
        fill_read(&c, &format!("k{i}"), "hvals", &reply);
    }
    assert!(c.stats().bytes <= 64 * 1024, "{}", c.stats().bytes);
}

#[test]
fn an_entry_without_other_reads_grows_by_one_pointer() {
    // value (32) + deadline (16) + written (16) + reads (8): the reads
    // beyond GET cost a key that has none 8 bytes.
    assert_eq!(std::mem::size_of::<Entry>(), 72);
}

#[test]
fn a_write_reports_whether_its_key_is_read_between_its_writes_within_the_ttl_cap() {
    let c = L1::new(L1Config {
        ttl_cap: Duration::from_secs(1),
        ..L1Config::default()
    });
    let later = Instant::now() + Duration::from_secs(60);
    // A key outside the unread-write sample (1 hash in 16, the hasher
    // seeded per L1), which keeps its own rule (every unread write cached).
    let k = (0..)
        .map(|i| format!("k{i}"))
        .find(|k| !super::marks::sampled(c.hash(0, k.as_bytes())))
        .expect("15 in 16 keys are outside the sample");
    // Never read: no re-read wanted.
    let w = c.insert_written(0, &b(&k), &b("1"), later, Instant::now());
    assert_eq!(
        w,
        Written {
            cached: true,
            reread: false
        }
    );
    // Written again, not read between: not cached (the first write's
    // value goes with it: never served in place of the second).
    assert_eq!(
        c.insert_written(0, &b(&k), &b("2"), later, Instant::now()),
        Written {
            cached: false,
            reread: false
        }
    );
    assert_eq!(c.get(0, &b(&k)), Lookup::Miss);
    // Read (a fill, after the write landed): the next writes want a
    // re-read while the read is within the cap, up to 64 with no read
    // between; the one after them is not even cached (per key).
    let t = c.begin_fill(0, k.as_bytes());
    assert!(c.complete_fill(t, 0, b(&k), Some(b("2")), -1));
    assert_eq!(c.get(0, &b(&k)), Lookup::Hit(Some(b("2"))));
    for n in 0..64 {
        let v = format!("3.{n}");
        assert_eq!(
            c.insert_written(0, &b(&k), &b(&v), later, Instant::now()),
            Written {
                cached: true,
                reread: true
            },
            "{v}"
        );
    }
    assert_eq!(
        c.insert_written(0, &b(&k), &b("4"), later, Instant::now()),
        Written {
            cached: false,
            reread: false
        }
    );
    assert_eq!(c.get(0, &b(&k)), Lookup::Miss);
    assert_eq!(c.stats().uncached, 2);
    // A fill is a read too.
    let t = c.begin_fill(0, b"j");
    assert!(c.complete_fill(t, 0, b("j"), Some(b("v")), -1));
    assert!(
        c.insert_written(0, &b("j"), &b("w"), later, Instant::now())
            .reread
    );
    // Another database is another key.
    assert!(
        !c.insert_written(1, &b(&k), &b("w"), later, Instant::now())
            .reread
    );
    // Past the cap (1 s; marks count whole seconds): no longer read.
    let t = Instant::now() + Duration::from_millis(2_100);
    assert!(
        !c.insert_written(0, &b(&k), &b("5"), later + Duration::from_secs(3), t)
            .reread
    );
    // Off (bcast): never a read.
    let off = L1::new(L1Config {
        read_marks: false,
        ..L1Config::default()
    });
    off.insert_written(0, &b(&k), &b("1"), later, Instant::now());
    assert_eq!(off.get(0, &b(&k)), Lookup::Hit(Some(b("1"))));
    assert!(
        !off.insert_written(0, &b(&k), &b("2"), later, Instant::now())
            .reread
    );
}

#[test]
fn a_reread_keeps_only_its_own_writes_value() {
    let c = l1_writes(1 << 20);
    let later = Instant::now() + Duration::from_secs(60);
    let w1 = Instant::now();
    c.insert_written(0, &b("k"), &b("one"), later, w1);
    let sent = Instant::now();
    // What the re-read returned replaces the written value: followed from
    // now on (a fill), so the landing releases nothing.
    assert!(c.refill_written(0, &b("k"), w1, Some(&b("one")), 5_000, sent));
    assert!(!c.release_written(0, b"k", w1));
    assert!(c.followed(0, b"k", false));
    assert_eq!(c.get(0, &b("k")), Lookup::Hit(Some(b("one"))));
    // Its deadline is the PTTL read back, from when it was sent.
    let w2 = Instant::now();
    c.insert_written(0, &b("k"), &b("two"), later, w2);
    assert!(c.refill_written(0, &b("k"), w2, Some(&b("two")), 30, Instant::now()));
    std::thread::sleep(Duration::from_millis(60));
    assert_eq!(c.get(0, &b("k")), Lookup::Miss);
    // A later write of ours replaced the value: the earlier re-read is
    // not applied, the later value stays until its own landing.
    let (w3, w4) = (Instant::now(), Instant::now() + Duration::from_nanos(1));
    c.insert_written(0, &b("k"), &b("three"), later, w3);
    c.insert_written(0, &b("k"), &b("four!"), later, w4);
    assert!(!c.refill_written(0, &b("k"), w3, Some(&b("three")), -1, Instant::now()));
    assert!(!c.release_written(0, b"k", w3));
    assert_eq!(c.get(0, &b("k")), Lookup::Hit(Some(b("four!"))));
    // An invalidation since the write removed it: nothing comes back.
    let w5 = Instant::now();
    c.insert_written(0, &b("k"), &b("five"), later, w5);
    c.invalidate(0, &b("k"));
    assert!(!c.refill_written(0, &b("k"), w5, Some(&b("five")), -1, Instant::now()));
    assert_eq!(c.get(0, &b("k")), Lookup::Miss);
    // Another client's value of another length, or a nil, read back: left
    // to the release (a miss, never the written value kept).
    let w6 = Instant::now();
    c.insert_written(0, &b("k"), &b("six"), later, w6);
    assert!(!c.refill_written(0, &b("k"), w6, Some(&b("theirs")), -1, Instant::now()));
    assert!(!c.refill_written(0, &b("k"), w6, None, -2, Instant::now()));
    assert!(c.release_written(0, b"k", w6));
    assert_eq!(c.get(0, &b("k")), Lookup::Miss);
    // Another client's value of the same length is what is cached.
    let w7 = Instant::now();
    c.insert_written(0, &b("k"), &b("mine"), later, w7);
    assert!(c.refill_written(0, &b("k"), w7, Some(&b("them")), -1, Instant::now()));
    assert_eq!(c.get(0, &b("k")), Lookup::Hit(Some(b("them"))));
    assert_eq!(c.stats().refills, 3);
}

#[test]
fn unread_writes_are_reread_once_reads_of_them_are_seen() {
    let c = L1::new(L1Config::default());
    let later = Instant::now() + Duration::from_secs(60);
    let fresh = |c: &L1, from: usize| {
        (from..from + 200)
            .filter(|i| {
                c.insert_written(0, &b(&format!("fresh:{i}")), &b("v"), later, Instant::now())
                    .reread
            })
            .count()
    };
    assert_eq!(fresh(&c, 0), 0, "nothing measured yet: the read-mark rule");
    // Keys written once, released unread, and (`read`) read back at once
    // (a fill each): about 1 in 16 is in the sample, so 8,192 of them
    // make a period (64 sampled) or more.
    let round = |c: &L1, tag: &str, read: bool| {
        for i in 0..8192 {
            let k = b(&format!("{tag}:{i}"));
            let at = Instant::now();
            // (Once on, writes outside the sample ask for a re-read; none
            // is made here, so all are released.)
            c.insert_written(0, &k, &b("v"), later, at);
            c.release_written(0, &k, at);
            if read {
                let t = c.begin_fill(0, &k);
                assert!(c.complete_fill(t, 0, k, Some(b("v")), -1));
            }
        }
    };
    round(&c, "read", true);
    assert!(c.rereads_unread_writes());
    // Outside the sample (15 in 16 keys) a first write is now re-read.
    let n = fresh(&c, 1000);
    assert!((150..200).contains(&n), "{n} of 200 re-read");
    // Writes nobody reads turn it off again.
    round(&c, "unread", false);
    round(&c, "unread2", false);
    assert!(!c.rereads_unread_writes());
    // (A few share a read mark with one of the 8,192 keys read.)
    let n = fresh(&c, 2000);
    assert!(n < 20, "{n} of 200 re-read");
}

#[test]
fn an_entry_is_charged_what_malloc_takes_and_its_slot() {
    assert_eq!(heap_bytes(0), 0);
    assert_eq!(heap_bytes(1), 32);
    assert_eq!(heap_bytes(64), 80);
    assert_eq!(heap_bytes(1024), 1040);
    assert_eq!(heap_bytes(200 * 1024), 200 * 1024 + 4096);
    let c = l1(1 << 20);
    c.complete_fill(
        c.begin_fill(0, b"k"),
        0,
        b("k"),
        Some(vec![b'v'; 64].into()),
        -1,
    );
    // A 1-byte key is inline: the slot and the value's allocation.
    assert_eq!(c.stats().bytes, ENTRY_OVERHEAD + 80);
    // A key too long to be inline is a copy of its own.
    let long = b(&"k".repeat(100));
    c.complete_fill(c.begin_fill(0, &long), 0, long.clone(), Some(b("v")), -1);
    assert_eq!(
        c.stats().bytes,
        2 * ENTRY_OVERHEAD + 80 + heap_bytes(100) + 32
    );
    // The eviction history's slots are held out of the bound.
    assert!(c.history_bytes() > 0 && c.history_bytes() < (1 << 20) / 4);
}
