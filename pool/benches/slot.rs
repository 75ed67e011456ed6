//! Micro-benchmark of routing: CRC16 hash slot of a key (with and without a
//! hash tag) and the slot → master lookup: `cargo bench -p sidecache-pool`.
#![allow(missing_docs, clippy::unwrap_used)]

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sidecache_pool::Slot;

fn slots(c: &mut Criterion) {
    let keys: Vec<Vec<u8>> = (0..10_000)
        .map(|i| format!("key:{i:012}").into_bytes())
        .collect();
    let tagged: Vec<Vec<u8>> = (0..10_000)
        .map(|i| format!("{{user:{}}}:cart:{i}", i % 100).into_bytes())
        .collect();
    // Three masters, redis-cli's split; a lookup is an index into this table.
    let owner: Vec<u16> = (0..16384u32).map(|s| (s * 3 / 16384) as u16).collect();
    let mut g = c.benchmark_group("slot");
    g.throughput(Throughput::Elements(keys.len() as u64));
    g.bench_function("crc16_10k_keys", |b| {
        b.iter(|| {
            keys.iter()
                .map(|k| u32::from(Slot::for_key(k).get()))
                .sum::<u32>()
        })
    });
    g.bench_function("crc16_hash_tag_10k_keys", |b| {
        b.iter(|| {
            tagged
                .iter()
                .map(|k| u32::from(Slot::for_key(k).get()))
                .sum::<u32>()
        })
    });
    g.bench_function("slot_to_master_10k_keys", |b| {
        b.iter(|| {
            keys.iter()
                .map(|k| u32::from(owner[usize::from(Slot::for_key(k).get())]))
                .sum::<u32>()
        })
    });
    g.finish();
}

criterion_group!(benches, slots);
criterion_main!(benches);
