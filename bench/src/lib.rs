//! Load tools for the side-by-side benchmarks under `bench/`.
//!
//! # Layout
//! - `relay` (module and binary): a TCP relay adding a one-way delay each
//!   way, timed by a thread of its own, for `bench/net.sh`; `relay
//!   --self-test` measures the delay it adds and what it carries.
//! - `echo`: echo servers (TCP, Unix socket) for the relay's self-test and
//!   tests.
//! - `hist`: a latency histogram with 1 µs buckets, and its text form.
//! - `latbench` (binary): one load (GET hit/miss, SET, INCR, MGET,
//!   pipelined) from one or many connections, TCP or Unix socket; prints
//!   requests/s and p50/p99 in µs, for `bench/net.sh`.
//! - `txbench` (binary): pipelined transactions (`MULTI; SET; INCR; EXEC`)
//!   from many connections, for `bench/tx.sh`.
//! - `soak` (binary): a normal GET/SET workload alone and beside an abuse
//!   mix (idle connections, slow readers, garbage, connect churn), for
//!   `bench/soak.sh`.
//! - `workload` (module and binary): a mixed read/write load with Zipf or
//!   uniform key popularity, over N connections (and, with `--hist-out` /
//!   `--merge`, N processes), and a staleness probe, for
//!   `bench/workload.sh`. Its parts:
//!   - `workload::keys`: splitmix64, the Zipf and uniform key draws;
//!   - `workload::command`: the RESP of reads and writes, versioned values;
//!   - `workload::conn`: async and blocking client connections;
//!   - `workload::populate`: every key written first;
//!   - `workload::load`: the load's connections, budget and run;
//!   - `workload::report`: the tally, the printed line, the histogram file
//!     and the merge of several;
//!   - `workload::staleness`: how long a write to Redis takes to reach
//!     readers through a cache.

pub mod echo;
pub mod hist;
pub mod relay;
pub mod workload;
