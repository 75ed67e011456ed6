//! Micro-benchmarks of the L1: hits, and the write-behind insert
//! (`insert_written`, replacing an existing entry): `cargo bench -p sidecache-l1`.
#![allow(missing_docs, clippy::unwrap_used)]

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sidecache_l1::{L1Config, L1};

fn hits(c: &mut Criterion) {
    let l1 = L1::new(L1Config::default());
    let keys: Vec<Bytes> = (0..100_000)
        .map(|i| Bytes::from(format!("key:{i:012}")))
        .collect();
    let value = Bytes::from(vec![b'x'; 64]);
    for k in &keys {
        let t = l1.begin_fill(0, k);
        assert!(l1.complete_fill(t, 0, k.clone(), Some(value.clone()), -1));
    }
    let mut g = c.benchmark_group("l1");
    g.throughput(Throughput::Elements(keys.len() as u64));
    g.bench_function("get_hit_100k", |b| {
        b.iter(|| {
            let mut n = 0;
            for k in &keys {
                if let sidecache_l1::Lookup::Hit(Some(v)) = l1.get(0, k) {
                    n += v.len();
                }
            }
            n
        })
    });
    g.bench_function("insert_written_100k", |b| {
        b.iter(|| {
            let now = std::time::Instant::now();
            let deadline = now + std::time::Duration::from_secs(60);
            let mut n = 0;
            for k in &keys {
                n += usize::from(l1.insert_written(0, k, &value, deadline, now).cached);
            }
            n
        })
    });
    g.finish();
}

criterion_group!(benches, hits);
criterion_main!(benches);
