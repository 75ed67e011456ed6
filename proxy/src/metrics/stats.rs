//! The proxy's own counters that INFO and the metrics read: connections,
//! commands, errors, transactions and blocking commands. Relaxed atomics,
//! added to once per batch.

use std::sync::atomic::AtomicU64;

/// Counters, updated without locks (relaxed atomics, once per batch).
#[derive(Debug, Default)]
pub struct Stats {
    /// Connections accepted.
    pub connections_received: AtomicU64,
    /// Connections refused by `--maxclients`.
    pub rejected_connections: AtomicU64,
    /// Commands processed.
    pub commands: AtomicU64,
    /// Commands answered with an upstream error.
    pub upstream_errors: AtomicU64,
    /// Requests that could not be parsed (the client is disconnected).
    pub protocol_errors: AtomicU64,
    /// Transactions.
    pub tx: TxStats,
    /// Blocking commands.
    pub blocking: BlockingStats,
    /// Client tasks that panicked (each closed its client alone).
    pub client_panics: AtomicU64,
}

/// Blocking-command counters.
#[derive(Debug, Default)]
pub struct BlockingStats {
    /// Clients blocked now.
    pub blocked: std::sync::atomic::AtomicUsize,
    /// Blocked commands unblocked upstream because their client left.
    pub unblocked_gone: AtomicU64,
}

/// Transaction counters (EXEC and DISCARD outcomes).
#[derive(Debug, Default)]
pub struct TxStats {
    /// EXECs that ran (an array reply).
    pub executed: AtomicU64,
    /// EXECs aborted by a queue-time error (`-EXECABORT`) or failed.
    pub aborted: AtomicU64,
    /// EXECs that ran nothing because a WATCHed key changed (nil reply).
    pub watch_failed: AtomicU64,
    /// Transactions ended with DISCARD.
    pub discarded: AtomicU64,
}
