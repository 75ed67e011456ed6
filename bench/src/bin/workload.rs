//! `workload`: a mixed read/write load with a skewed key popularity, for
//! `bench/workload.sh`; and, with `--staleness`, how long a write made
//! directly to Redis takes to reach readers through a cache.
//!
//! This binary parses the flags and calls the library's
//! `sidecache_bench::workload` (its `# Layout` lists the parts), which owns
//! the key choice (a Zipf or uniform draw over `--keys` keys: a table of
//! cumulative weights searched by bisection, so 10^6 keys cost 8 MB and a
//! draw ~20 comparisons; splitmix64 for the randomness), the command mix
//! and the figures printed; the servers, the metrics and Redis's view of
//! the load are the script's.
//!
//! The load: `--conns` connections (tokio tasks, each its own TCP or Unix
//! socket connection), each sending `--pipeline` operations per round trip
//! until `--ops` operations were sent in all (or for `--secs`). An
//! operation is a write with probability `--write-pct` % (`SET key value`,
//! or `HSET key f0 v … f9 v` with `--type hash`: ten fields of
//! `--value-size`/10 bytes), a read otherwise (`GET key` / `HGETALL key`).
//! Keys are `PREFIX%08d` (`wl:` for strings, `wlh:` for hashes), the key of
//! rank 0 the most popular. `--populate` first writes every key (pipelined
//! batches of `--populate-batch`, the key range split over the
//! connections), so every read finds its key; with `--ops 0` and no
//! `--secs` it stops there.
//!
//! `--check-values`: every value written starts `CCCC:VVVV…:` (the writing
//! connection, a version increasing per key); each key has one writer (a
//! write drawn for a key goes to the key of the same popularity group of
//! `--conns` × `--procs` keys that its connection owns), and each
//! connection counts the reads that returned an older version than one it
//! had already seen or written for that key (`backwards`: read-your-writes
//! and monotonic reads, per connection).
//!
//! Prints one line of `key=value`: `ops secs ops_per_s p50_us p99_us
//! p999_us mean_us max_us reads writes errors nils backwards`. Latencies are
//! per round trip (one per `--pipeline` operations), in the 1 µs histogram
//! of `sidecache_bench::hist`.
//!
//! N client processes: run N `workload`s at once with `--procs N
//! --proc-index I` (their connections numbered apart, so key draws differ
//! and each `--check-values` key keeps one writer), `--start-at UNIX_MS`
//! (each sends its first operation then, once connected) and `--hist-out
//! FILE` (the figures with every histogram bucket, and the start on the
//! wall clock); then `workload --merge FILE…` prints the same line for all
//! of them: counts added up, percentiles from the merged buckets (exact,
//! not averaged), `secs` from the earliest start to the latest end, so
//! `ops_per_s` is over the wall time of the whole run.
//!
//! `--staleness`: one writer connection (`--writer`, typically Redis
//! itself) writes `--hot-keys` keys in turn, `--writes` times, each value
//! holding a sequence number; `--readers` connections to the target poll,
//! in a tight loop (`GET`, one at a time), the key being written. After each
//! acknowledgement the writer waits until every reader has seen the new
//! value (at most `--max-wait-ms`), then pauses `--pause-ms`. Propagation,
//! per write and reader: from the writer's acknowledgement to the end of
//! the reader's first read that returned the new value (0 when the reader
//! saw it before the writer's acknowledgement arrived). A stale read: a
//! read that started after a later write of its key had been acknowledged,
//! yet returned an older sequence number; `stale_late` counts those that
//! started more than `--deadline-ms` after that acknowledgement. Writer and
//! readers are OS threads with blocking sockets (timestamps taken as the
//! reply arrives, not when a runtime gets to it). Prints one `key=value`
//! line: `writes readers samples p50_us p99_us p999_us max_us mean_us
//! unseen timeouts before_ack reads stale_reads stale_late deadline_ms
//! backwards nils write_p50_us read_p50_us read_p99_us read_p999_us secs`
//! (`unseen`: write × reader pairs never seen, `timeouts`: writes not seen
//! by every reader within `--max-wait-ms`; `read_*`: the readers' GET round
//! trips, the harness's own noise).

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;
use sidecache_bench::workload::{load, report, staleness, Common};

#[derive(Parser, Debug)]
#[command(
    about = "Mixed GET/SET (or HGETALL/HSET) load with Zipf or uniform keys; or --staleness. Prints one key=value line"
)]
struct Args {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    load: load::Options,
    /// Runtime threads (1: one thread for all connections).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Measure how long writes take to reach readers (see the top of the file).
    #[arg(long)]
    staleness: bool,
    #[command(flatten)]
    stale: staleness::Options,
    /// Only print the line of these --hist-out files merged (percentiles
    /// from the merged buckets; secs from the first start to the last end).
    #[arg(long, num_args = 1.., value_name = "FILE", conflicts_with = "staleness")]
    merge: Vec<PathBuf>,
}

fn main() -> Result<()> {
    let a = Args::parse();
    if !a.merge.is_empty() {
        println!("{}", report::merge_files(&a.merge)?);
        return Ok(());
    }
    if a.staleness {
        return staleness::run(&a.common, &a.stale);
    }
    a.load.validate()?;
    let rt = if a.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(a.threads)
            .enable_all()
            .build()?
    };
    rt.block_on(load::run(&a.common, &a.load))
}
