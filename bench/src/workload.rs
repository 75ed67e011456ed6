//! The mixed workload behind the `workload` binary and `bench/workload.sh`:
//! a read/write load with a skewed key popularity (and the populating of
//! its keys), the `--staleness` probe, and their figures, merged across
//! processes. The binary only parses flags and calls [`load::run`],
//! [`staleness::run`] or [`report::merge_files`]; the servers, the metrics
//! and Redis's view of the load are the script's.
//!
//! # Layout
//! - `keys`: splitmix64 and the key draw (Zipf or uniform).
//! - `command`: how reads and writes are spelled (`GET`/`SET`,
//!   `HGETALL`/`HSET`), key names, versioned values.
//! - `conn`: client connections, async (the load) and blocking
//!   (staleness), and reply framing.
//! - `populate`: every key written before the load.
//! - `load`: the connections' operation sources, the shared budget, the run.
//! - `report`: the tally, the printed line, the `--hist-out` file and
//!   `--merge`.
//! - `staleness`: how long a write to Redis takes to reach readers.

mod command;
mod conn;
mod keys;
pub mod load;
mod populate;
pub mod report;
pub mod staleness;

pub use command::Kind;
pub use keys::Dist;

/// Flags of every mode: where to connect and what values look like.
#[derive(clap::Args, Debug, Clone)]
pub struct Common {
    /// host:port to load (or `unix:PATH`).
    #[arg(long, default_value = "127.0.0.1:6379")]
    pub target: String,
    /// A Unix socket to load instead of --target.
    #[arg(long)]
    pub unix: Option<String>,
    /// Value bytes (a hash: --value-size/10 per field, at least 1).
    #[arg(long, default_value_t = 64)]
    pub value_size: usize,
    /// Key prefix [default: `wl:` for strings, `wlh:` for hashes].
    #[arg(long)]
    pub prefix: Option<String>,
}
