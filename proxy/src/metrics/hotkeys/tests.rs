use super::*;

/// splitmix64: a fixed-seed generator for the test streams.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[test]
fn exact_when_keys_fit() {
    let hot = HotKeys::new(9, 1);
    let mut s = Sampler::new(&hot, 7);
    for (i, key) in ["a", "b", "c", "d", "e", "f", "g", "h"].iter().enumerate() {
        for _ in 0..(i + 1) * 10 {
            assert!(s.read(), "sample 1 counts every read");
            hot.note(Dimension::Reads, 0, key.as_bytes());
        }
    }
    hot.note(Dimension::Reads, 3, b"a");
    let top = hot.top(Dimension::Reads, Some(0), 100);
    assert_eq!(top.len(), 8);
    assert_eq!(
        top[0],
        HotKey {
            db: 0,
            key: b"h".to_vec(),
            count: 80
        }
    );
    assert_eq!(top[1].count, 70);
    assert_eq!(
        top[7],
        HotKey {
            db: 0,
            key: b"a".to_vec(),
            count: 10
        }
    );
    // Database 3's "a" is another key.
    assert!(hot.top(Dimension::Misses, None, 10).is_empty());
    assert_eq!(hot.top(Dimension::Reads, None, 2).len(), 2);
    assert_eq!(
        hot.top(Dimension::Reads, Some(3), 5),
        vec![HotKey {
            db: 3,
            key: b"a".to_vec(),
            count: 1
        }]
    );
}

#[test]
fn exact_counts_sketch() {
    let mut s = SpaceSaving::new(4);
    for (k, n) in [(b"x", 5), (b"y", 3), (b"z", 9)] {
        for _ in 0..n {
            s.add(k);
        }
    }
    assert_eq!(
        s.top(10),
        vec![(b"z".to_vec(), 9), (b"x".to_vec(), 5), (b"y".to_vec(), 3)]
    );
    // A fifth key replaces the smallest and inherits its count.
    s.add(b"w");
    s.add(b"v");
    assert_eq!(s.len(), 4);
    assert_eq!(s.top(1), vec![(b"z".to_vec(), 9)]);
    assert!(s.heap_ok());
}

/// The heap and the index stay consistent under a random stream, and
/// counts never undercount (space-saving's guarantee for tracked ids).
#[test]
fn heap_stays_ordered() {
    let mut rng = Rng(9);
    let mut s = SpaceSaving::new(16);
    let mut truth = std::collections::HashMap::new();
    for _ in 0..20_000 {
        let k = if rng.next().is_multiple_of(4) {
            0
        } else {
            rng.next() % 64
        };
        let id = format!("k{k}");
        *truth.entry(id.clone()).or_insert(0u64) += 1;
        s.add(id.as_bytes());
    }
    assert!(s.heap_ok());
    assert_eq!(s.len(), 16);
    for (id, c) in s.top(16) {
        let t = truth[&String::from_utf8(id).expect("utf8")];
        assert!(c >= t, "{c} < {t}");
    }
    assert_eq!(s.top(1)[0].0, b"k0");
}

#[test]
fn off_counts_nothing() {
    let hot = HotKeys::new(0, 16);
    assert!(!hot.enabled());
    let mut s = Sampler::new(&hot, 1);
    assert!((0..1000).all(|_| !s.read() && !s.write()));
    hot.note(Dimension::Writes, 0, b"k");
    assert!(hot.top(Dimension::Writes, None, 10).is_empty());
}

#[test]
fn sampling_rate_is_about_one_in_n() {
    let hot = HotKeys::new(4, 16);
    let mut s = Sampler::new(&hot, 42);
    let n = (0..160_000).filter(|_| s.read()).count();
    assert!((9_000..11_000).contains(&n), "{n} samples of 160000");
}

/// A Zipf stream (s = 1.1) of 1,000,000 draws over 1,000,000 keys, by
/// inverse CDF with a fixed seed; the default sketch (256 counters, one
/// read in 16, several connections' samplers) finds most of the true top
/// 20.
#[test]
fn zipf_top20() {
    const KEYS: usize = 1_000_000;
    const DRAWS: usize = 1_000_000;
    let mut cdf = Vec::with_capacity(KEYS);
    let mut acc = 0.0f64;
    for i in 1..=KEYS {
        acc += (i as f64).powf(-1.1);
        cdf.push(acc);
    }
    let mut rng = Rng(0x5eed);
    let hot = HotKeys::new(DEFAULT_CAPACITY, DEFAULT_SAMPLE);
    let mut samplers: Vec<Sampler> = (0..50).map(|c| Sampler::new(&hot, c)).collect();
    let mut truth = vec![0u32; KEYS];
    for d in 0..DRAWS {
        let u = rng.unit() * acc;
        let rank = cdf.partition_point(|&c| c < u).min(KEYS - 1);
        truth[rank] += 1;
        if samplers[d % 50].read() {
            hot.note(Dimension::Reads, 0, format!("key:{rank}").as_bytes());
        }
    }
    let mut order: Vec<usize> = (0..KEYS).collect();
    order.sort_unstable_by(|&a, &b| truth[b].cmp(&truth[a]).then(a.cmp(&b)));
    let want: Vec<String> = order[..20].iter().map(|r| format!("key:{r}")).collect();
    let got: Vec<String> = hot
        .top(Dimension::Reads, None, 20)
        .into_iter()
        .map(|k| String::from_utf8_lossy(&k.key).into_owned())
        .collect();
    let found = want.iter().filter(|k| got.contains(k)).count();
    println!("zipf s=1.1: {found} of the true top 20 found");
    assert!(found >= 18, "{found} of the top 20: {got:?} vs {want:?}");
}

#[test]
fn keys_are_escaped() {
    assert_eq!(escape_key(b"user:1"), "user:1");
    assert_eq!(escape_key(b"a\\b"), "a\\x5cb");
    assert_eq!(escape_key(b"\xff\n\xc3\xa9"), "\\xff\\x0a\u{e9}");
    let json = to_json(
        Dimension::Reads,
        16,
        &[HotKey {
            db: 1,
            key: b"q\"\xff".to_vec(),
            count: 32,
        }],
    );
    assert_eq!(
        json,
        "{\"by\":\"reads\",\"sample\":16,\"keys\":[{\"db\":1,\"key\":\"q\\\"\\\\xff\",\"count\":32}]}\n"
    );
}

#[test]
fn watching_every_read_keeps_the_samples() {
    let hot = HotKeys::new(4, 16);
    let mut plain = Sampler::new(&hot, 9);
    let mut every = Sampler::new(&hot, 9).watch_every_read();
    for i in 0..10_000 {
        // Every read is due when watched; the samples are the same reads.
        assert!(every.read_due(), "read {i}");
        let sampled = plain.read_due() && plain.read_sampled();
        assert_eq!(every.read_sampled(), sampled, "read {i}");
    }
    // Off: due only after 2^32 - 1 reads, never sampled.
    let off = HotKeys::new(0, 16);
    let mut s = Sampler::new(&off, 3).watch_every_read();
    assert!((0..1000).all(|_| s.read_due() && !s.read_sampled()));
    let mut s = Sampler::new(&off, 3);
    assert!((0..1000).all(|_| !s.read_due()));
}

#[test]
fn samples_one_in_one() {
    let hot = HotKeys::new(4, 1);
    let mut s = Sampler::new(&hot, 5);
    assert!((0..100).all(|_| s.read() && s.write()));
}
