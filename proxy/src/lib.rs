//! sidecache: a Redis-protocol caching sidecar proxy.
//!
//! # Layout
//! Layers, bottom to top; a module imports only layers below its own
//! (ARCHITECTURE.md, "Layers of proxy/src", and the architecture test):
//! - [`credentials`]: where a rotating upstream secret comes from: an
//!   ElastiCache IAM token from the AWS credential chain, or a password file.
//! - [`pubsub`]: shared upstream subscriptions fanned out to local
//!   subscribers' bounded outboxes, and the MONITOR feed.
//! - [`tracking`]: CLIENT TRACKING served to sidecache's own clients: each
//!   client's tracking state and Redis's replies ([`tracking::command`]),
//!   and the tracking table with its messages ([`tracking::table`]), sent
//!   through [`pubsub`]'s outboxes.
//! - [`cmd`]: the command table from upstream `COMMAND`, how each command is
//!   handled, which commands are answered locally ([`cmd::local::Local`]),
//!   and merging split replies.
//! - [`config`]: flags, env vars and TOML file merged into a validated
//!   [`config::Config`], with the bounds it checks.
//! - [`metrics`]: counters kept off the hot path: per-command metrics, the
//!   proxy's own [`metrics::stats`], hot keys and per-prefix figures.
//! - [`state`]: what all connections share (upstream, table, L1 and its
//!   fetches in flight ([`state::flight`]), counters, the client registry
//!   ([`state::clients`])); [`state::users`], the connection pools of the ACL
//!   users clients authenticated as; [`state::stale`], what lost channels
//!   leave served (`--l1-stale-if-error`); [`state::pause`], CLIENT PAUSE.
//! - [`answer`]: the commands sidecache answers itself (PING, HELLO, AUTH,
//!   CLIENT …, SIDECACHE), run against the shared state.
//! - [`report`]: what an operator reads: the Prometheus exporter reading
//!   every counter at scrape time ([`report::export`]), the `/metrics`,
//!   `/healthz`, `/readyz` endpoint ([`report::http`]), the proxy's own INFO
//!   sections ([`report::info`]), and once-a-second warnings
//!   ([`report::watch`]: topology changes, retries, tracking loss).
//! - [`connection`]: one client: parse, dispatch, pipeline upstream, reply in
//!   order; its `tx` part runs transactions (MULTI blocks, WATCH on a held
//!   connection), its `flush::absorb` part sends again what a failure took
//!   that a cluster client would absorb.
//! - [`server`]: TCP and Unix listeners, client limit, graceful shutdown.
//! - [`top`]: `sidecache top`, a client of that endpoint: a terminal view of
//!   a running sidecache, refreshed every second.
//!
//! Upstream work (routing, connections, redirects) lives in `sidecache-pool`;
//! the wire format (request parser, reply framing, encoders) in
//! `sidecache-resp`; the cache in `sidecache-l1`; what is cacheable and when it is invalidated
//! is decided here, in [`connection`]. This crate is the only one that sees clients.

pub mod answer;
pub mod cmd;
pub mod config;
pub mod connection;
pub mod credentials;
pub mod metrics;
pub mod pubsub;
pub mod report;
pub mod server;
pub mod state;
pub mod top;
pub mod tracking;

use std::sync::Arc;

use sidecache_pool::{Session, Target, Upstream};

pub use config::{Config, Options};
pub use server::{run, Listeners};
use sidecache_resp::frame::Value;
pub use state::Shared;

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// Upstream unreachable or unusable.
    #[error(transparent)]
    Upstream(#[from] sidecache_pool::Error),
    /// The upstream's COMMAND reply could not be used.
    #[error("reading the upstream command table: {0}")]
    CommandTable(String),
}

/// The runtime the proxy runs on: `threads` workers, every driver, and
/// tasks run in the order they were woken. Tokio's LIFO slot (off here
/// with `tokio_unstable`, set by .cargo/config.toml) runs the task woken
/// last first: two clients whose commands arrived together were read
/// newest first, and clients blocked on one key were served out of the
/// order they blocked (`crate::state::turns`).
///
/// One thread (the default on two CPUs) is tokio's current-thread
/// runtime, which has no LIFO slot: every task, the accept loops
/// included, on the thread that calls `block_on`, with no cross-thread
/// wake-ups and none of the work-stealing scheduler's bookkeeping
/// (`bench/callgrind.sh`: a `-P 1` GET hit 6,560 → 5,766 instructions,
/// bench/results/history/2026-12-07-write-path.md).
///
/// # Errors
/// The runtime's, when its threads or driver cannot start.
pub fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    if threads <= 1 {
        return tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(threads).enable_all();
    #[cfg(tokio_unstable)]
    builder.disable_lifo_slot();
    builder.build()
}

/// Connects to upstream and loads the command table.
///
/// # Errors
/// [`StartError`] when upstream is unreachable or unusable.
pub async fn prepare(config: Config) -> Result<Arc<Shared>, StartError> {
    let upstream = Upstream::connect(config.upstream.clone()).await?;
    let mut cmd = bytes::BytesMut::new();
    sidecache_resp::encode::encode_command(&mut cmd, &[b"COMMAND"]);
    let reply = upstream
        .execute(Session::default(), 0, Target::Any, cmd.freeze())
        .await?;
    if let Some(e) = sidecache_resp::frame::error_text(&reply) {
        return Err(StartError::CommandTable(
            String::from_utf8_lossy(e).into_owned(),
        ));
    }
    let value = Value::decode(&reply).map_err(|e| StartError::CommandTable(e.to_string()))?;
    let mut table =
        cmd::table::CommandTable::from_command_reply(value).map_err(StartError::CommandTable)?;
    table.allow_reads(&config.l1_commands);
    let topo = upstream.topology();
    let masters: Vec<String> = topo.nodes().iter().map(|n| n.addr().to_string()).collect();
    tracing::info!(
        commands = table.len(),
        mode = if upstream.is_cluster() { "cluster" } else { "standalone" },
        engine = upstream.server_info().engine(),
        version = upstream.server_info().engine_version(),
        masters = ?masters,
        slots_uncovered = report::export::uncovered_slots(&topo),
        "upstream ready"
    );
    let shared = Arc::new(Shared::new(upstream, table, config));
    shared
        .upstream
        .write_behind()
        .set_listener(Arc::new(state::InvalidateOnFailure(Arc::downgrade(
            &shared,
        ))));
    shared
        .upstream
        .set_coherence_listener(Arc::new(state::FollowInvalidations(Arc::downgrade(
            &shared,
        ))));
    tokio::spawn(tracking::Tracked::report_expiries(
        Arc::downgrade(&shared),
        |s: &Shared| &s.tracked,
    ));
    Ok(shared)
}
