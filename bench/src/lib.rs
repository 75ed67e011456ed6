//! Load tools for the side-by-side benchmarks under `bench/`.
//!
//! # Layout
//! - `txbench` (binary): pipelined transactions (`MULTI; SET; INCR; EXEC`)
//!   from many connections, for `bench/tx.sh`.
