//! A once-a-second look at what operators must hear about without
//! scraping: the set of masters changing, hash slots left unserved,
//! write-behind writes being retried, the invalidation channel lost.
//! Each is logged as a warning once per change (or once per second while
//! it goes on), never per command.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::report::export::uncovered_slots;
use crate::state::Shared;

/// How often the watch looks.
pub const PERIOD: Duration = Duration::from_secs(1);

/// What the previous look saw.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Seen {
    masters: Vec<String>,
    uncovered: usize,
    retries: u64,
    tracking: Vec<(String, bool)>,
}

/// Runs until `stop` is cancelled.
pub async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let mut seen = look(&shared);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(PERIOD) => {}
        }
        let now = look(&shared);
        report(&shared, &seen, &now);
        seen = now;
    }
}

fn look(s: &Shared) -> Seen {
    let topo = s.upstream.topology();
    Seen {
        masters: topo.nodes().iter().map(|n| n.addr().to_string()).collect(),
        uncovered: uncovered_slots(&topo),
        retries: s
            .upstream
            .write_behind()
            .stats
            .retries
            .load(Ordering::Relaxed),
        tracking: s.tracking_shards(),
    }
}

fn report(s: &Shared, was: &Seen, now: &Seen) {
    if was.masters != now.masters {
        s.metrics.topology_changes.fetch_add(1, Ordering::Relaxed);
        warn!(before = ?was.masters, after = ?now.masters, "upstream masters changed");
    }
    if now.uncovered != was.uncovered {
        if now.uncovered > 0 {
            warn!(
                uncovered = now.uncovered,
                "hash slots served by no master: not ready"
            );
        } else {
            info!("every hash slot is served again");
        }
    }
    if now.retries > was.retries {
        warn!(
            retries = now.retries - was.retries,
            queue_depth = s.upstream.write_behind().depth(),
            "write-behind writes retried in the last second"
        );
    }
    for (shard, up) in &now.tracking {
        let before = was.tracking.iter().find(|t| &t.0 == shard).map(|t| t.1);
        match (before, up) {
            (Some(true), false) => {
                warn!(%shard, "invalidation channel lost (client tracking)")
            }
            (Some(false), true) => info!(%shard, "invalidation channel up again"),
            _ => {}
        }
    }
}
