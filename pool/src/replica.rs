//! Reads from replicas (`--read-from`): which node a read may go to, and
//! why no client reads older than its own acknowledged writes.
//!
//! # Layout
//! - [`stamps`]: per slot, the write-behind writes not yet landed and when
//!   this sidecache's last write of the slot landed on its master.
//! - [`ReplicaState`] (kept with each node's connections): per replica,
//!   what the last probes said (healthy, its availability zone, up to
//!   which instant it holds all its master had).
//! - [`info`]: parsing `INFO replication` and `HELLO`'s availability zone.
//! - [`choose`] (below): the pure choice of a read's target.
//! - The probes themselves run in `upstream/replicas.rs`.
//!
//! # Read-your-writes: the race argument
//! A replica applies its master's writes some time after the master did.
//! A read may go to replica `r` of master `m` only when `r` holds every
//! write this sidecache made to the read's slot, and every write the
//! reading client made, that had its reply before the read was
//! dispatched. Three facts make that checkable without a round trip per
//! read:
//!
//! 1. **Caught-up instants.** Every `--replica-check-interval` a probe
//!    takes the instant `T`, *then* sends `INFO replication` to `m` and
//!    reads `master_repl_offset` `M`; `m` executes the INFO after every
//!    command whose reply reached sidecache before `T`, so `M` covers
//!    them. A later `INFO replication` on `r` that shows
//!    `slave_repl_offset ≥ M` (with `master_link_status:up`) proves `r`
//!    has applied all of them: `r`'s *caught-up instant* becomes `T`
//!    (the latest such `T` of the last [`HISTORY`] rounds, so a replica
//!    that is steadily a little behind still advances).
//! 2. **Landing instants.** A write-behind write is stamped in its slot
//!    when it is queued, before the client's `+OK` ([`stamps::Stamps::queued`]),
//!    and its landing (its reply read by the batcher) is stamped with the
//!    instant the reply arrived, *before* its value leaves the L1 and before
//!    later commands waiting on the queue are released. A forwarded write
//!    (INCR, DEL, a transaction's or script's keys, FLUSHALL: every
//!    invalidation the proxy applies) stamps its slots again when its reply
//!    is applied, before that second invalidation.
//! 3. **The rule** ([`choose`]): a read of slot `s` goes to `r` only if no
//!    write of `s` is queued or in flight (every queued stamp of `s` has
//!    landed), the last landing of `s` and the client's last write are
//!    both *before* `r`'s caught-up instant, and no command of the same
//!    client batch before it may write. Otherwise it goes to the master,
//!    which `Upstream::submit` holds behind the queued writes
//!    as today.
//!
//! So a write acknowledged to a client is either still queued (the read
//! goes to the master, after the write), or landed at `L`; a replica is
//! used only once a probe that began after `L` proved it has everything
//! the master had then. The comparisons are between instants of one
//! monotonic clock, each taken on the side that makes the rule
//! conservative: `T` before the master's INFO is sent, `L` after the
//! write's reply was read.
//!
//! **The shared L1.** A value read from a replica and cached would be
//! served to every client. The fill is made as on a master: on the
//! replica's own tracking connection, which registers it (Redis
//! and Valkey replicas send invalidations for keys the replication
//! stream changes), with the same epoch guard and the replica's channel
//! as the gate (`Node::coherent`), so no value is kept past a
//! later change the replica applies. The rule above keeps a replica's
//! older value out of the L1 while this sidecache's own write is not on
//! it: a fill from `r` that began before a write's landing stamp was
//! taken had its epoch bumped by the write's invalidation (write-behind:
//! at the acknowledgement; forwarded: at dispatch and again at the
//! reply), so it is discarded or dropped; one that began after reads the
//! stamp and goes to the master.
//!
//! What is given up: after a write lands, its slot is read from the
//! master for up to one check interval (plus the probes' round trips).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::config::NodeAddr;
pub use crate::config::{ReadConfig, ReadFrom};

pub mod info;
pub mod stamps;
mod state;

pub use state::ReplicaState;

/// Probe rounds whose (instant, master offset) are kept per master.
pub const HISTORY: usize = 32;

/// Where reads went and how replicas looked (the metrics).
#[derive(Debug, Default)]
pub struct ReadStats {
    /// Reads sent to a master.
    pub primary: AtomicU64,
    /// Reads sent to a replica in sidecache's AZ.
    pub replica_same_az: AtomicU64,
    /// Reads sent to a replica in another (or an unknown) AZ.
    pub replica_other_az: AtomicU64,
    /// Reads that could have gone to a replica and went to the master for
    /// read-your-writes (a write of the slot or of the client not yet on
    /// every usable replica).
    pub own_write_primary: AtomicU64,
    /// Reads sent to a replica that failed there (connection lost, timed
    /// out) and were sent again to the master.
    pub fallbacks: AtomicU64,
    /// Reads to a master because no replica was usable (down, loading,
    /// link down, past `--replica-max-lag`).
    pub no_replica: AtomicU64,
}

/// The state replica reads share: settings, the monotonic clock all
/// stamps use, the slot stamps, the counters.
#[derive(Debug)]
pub struct ReplicaReads {
    /// The settings.
    pub cfg: ReadConfig,
    base: Instant,
    /// Per-slot write stamps.
    pub stamps: std::sync::Arc<stamps::Stamps>,
    /// The counters.
    pub stats: ReadStats,
}

impl ReplicaReads {
    /// The shared state for `cfg` (`None` for `--read-from primary`).
    pub fn new(cfg: ReadConfig) -> Option<ReplicaReads> {
        if cfg.read_from == ReadFrom::Primary {
            return None;
        }
        let base = Instant::now();
        Some(ReplicaReads {
            cfg,
            base,
            stamps: std::sync::Arc::new(stamps::Stamps::new(base)),
            stats: ReadStats::default(),
        })
    }

    /// Now, on the stamps' clock (nanoseconds since start, at least 1).
    pub fn now(&self) -> u64 {
        stamps::clock(self.base)
    }

    /// The instant `ns` on the stamps' clock stands for.
    pub fn instant(&self, ns: u64) -> Instant {
        self.base + Duration::from_nanos(ns)
    }

    /// Whether `az` is sidecache's own zone.
    pub fn same_az(&self, az: Option<&str>) -> bool {
        matches!((self.cfg.az.as_deref(), az), (Some(a), Some(b)) if a == b)
    }

    /// The configured zone of `addr` (`--replica-az`).
    pub fn configured_az(&self, addr: &NodeAddr) -> Option<&str> {
        self.cfg
            .node_az
            .iter()
            .find(|(a, _)| a == addr)
            .map(|(_, z)| z.as_str())
    }
}

/// A replica as [`choose`] sees it.
#[derive(Debug, Clone, Copy)]
pub struct Candidate {
    /// Last probe answered, link up, not loading, within `--replica-max-lag`.
    pub usable: bool,
    /// In sidecache's AZ.
    pub same_az: bool,
    /// Up to when it holds all its master had (stamps' clock; 0: never).
    pub caught_up: u64,
}

/// What [`choose`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// The master: no replica usable.
    Primary,
    /// The master, for read-your-writes (some replica was usable).
    PrimaryOwnWrite,
    /// The master, because it is in sidecache's AZ and no same-AZ replica
    /// is usable (`az-affinity-replicas-and-primary`).
    PrimarySameAz,
    /// Replica `i` of the candidates.
    Replica(usize),
}

/// The target of one read. `fresh_after`: the latest instant (stamps'
/// clock) a write the read must see landed (the slot's last landing, the
/// client's last write); `None` when a write of the slot is still queued
/// or in flight. `master_same_az`: the master is in sidecache's AZ.
/// `spread`: picks among equally good replicas (the client's hint).
pub fn choose(
    mode: ReadFrom,
    replicas: &[Candidate],
    fresh_after: Option<u64>,
    master_same_az: bool,
    spread: usize,
) -> Choice {
    if mode == ReadFrom::Primary || replicas.is_empty() {
        return Choice::Primary;
    }
    let fresh = |c: &Candidate| fresh_after.is_some_and(|f| f < c.caught_up);
    let pick = |want_same: Option<bool>| -> Option<usize> {
        let ok = |c: &Candidate| c.usable && fresh(c) && want_same.is_none_or(|s| c.same_az == s);
        let n = replicas.iter().filter(|c| ok(c)).count();
        if n == 0 {
            return None;
        }
        let k = spread % n;
        replicas
            .iter()
            .enumerate()
            .filter(|(_, c)| ok(c))
            .nth(k)
            .map(|(i, _)| i)
    };
    let any_usable = replicas.iter().any(|c| c.usable);
    let chosen = match mode {
        ReadFrom::Primary => None,
        ReadFrom::Replica => pick(None),
        ReadFrom::AzAffinity => pick(Some(true)).or_else(|| pick(None)),
        ReadFrom::AzAffinityReplicasAndPrimary => {
            let same = pick(Some(true));
            if same.is_none() && master_same_az {
                return Choice::PrimarySameAz;
            }
            same.or_else(|| pick(None))
        }
    };
    match chosen {
        Some(i) => Choice::Replica(i),
        None if any_usable => Choice::PrimaryOwnWrite,
        None => Choice::Primary,
    }
}

/// Counts a choice (`same_az`: the chosen replica's zone is sidecache's).
pub(crate) fn count(stats: &ReadStats, choice: Choice, same_az: bool) {
    let r = Ordering::Relaxed;
    match choice {
        Choice::Replica(_) if same_az => stats.replica_same_az.fetch_add(1, r),
        Choice::Replica(_) => stats.replica_other_az.fetch_add(1, r),
        Choice::Primary => {
            stats.no_replica.fetch_add(1, r);
            stats.primary.fetch_add(1, r)
        }
        Choice::PrimaryOwnWrite => {
            stats.own_write_primary.fetch_add(1, r);
            stats.primary.fetch_add(1, r)
        }
        Choice::PrimarySameAz => stats.primary.fetch_add(1, r),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(usable: bool, same_az: bool, caught_up: u64) -> Candidate {
        Candidate {
            usable,
            same_az,
            caught_up,
        }
    }

    #[test]
    fn primary_never_reads_replicas() {
        let r = [c(true, true, 100)];
        assert_eq!(
            choose(ReadFrom::Primary, &r, Some(1), false, 0),
            Choice::Primary
        );
    }

    #[test]
    fn az_affinity_prefers_same_zone_then_any() {
        let r = [c(true, false, 100), c(true, true, 100), c(true, true, 100)];
        for spread in 0..10 {
            match choose(ReadFrom::AzAffinity, &r, Some(1), false, spread) {
                Choice::Replica(i) => assert!(i == 1 || i == 2),
                other => panic!("{other:?}"),
            }
        }
        let r = [c(true, false, 100), c(false, true, 100)];
        assert_eq!(
            choose(ReadFrom::AzAffinity, &r, Some(1), false, 3),
            Choice::Replica(0)
        );
        let r = [c(false, false, 100), c(false, true, 100)];
        assert_eq!(
            choose(ReadFrom::AzAffinity, &r, Some(1), false, 3),
            Choice::Primary
        );
    }

    #[test]
    fn replicas_and_primary_takes_a_same_zone_master_before_another_zone() {
        let r = [c(true, false, 100)];
        let m = ReadFrom::AzAffinityReplicasAndPrimary;
        assert_eq!(choose(m, &r, Some(1), true, 0), Choice::PrimarySameAz);
        assert_eq!(choose(m, &r, Some(1), false, 0), Choice::Replica(0));
    }

    #[test]
    fn own_writes_not_on_the_replica_read_the_master() {
        let r = [c(true, true, 100)];
        // A write still queued.
        assert_eq!(
            choose(ReadFrom::Replica, &r, None, false, 0),
            Choice::PrimaryOwnWrite
        );
        // Landed at 100: the replica is proven caught up to 100 only, not after.
        assert_eq!(
            choose(ReadFrom::Replica, &r, Some(100), false, 0),
            Choice::PrimaryOwnWrite
        );
        assert_eq!(
            choose(ReadFrom::Replica, &r, Some(99), false, 0),
            Choice::Replica(0)
        );
        // Never proven caught up.
        let r = [c(true, true, 0)];
        assert_eq!(
            choose(ReadFrom::Replica, &r, Some(0), false, 0),
            Choice::PrimaryOwnWrite
        );
    }

    #[test]
    fn parses_the_flag() {
        for m in [
            ReadFrom::Primary,
            ReadFrom::Replica,
            ReadFrom::AzAffinity,
            ReadFrom::AzAffinityReplicasAndPrimary,
        ] {
            assert_eq!(m.as_str().parse::<ReadFrom>(), Ok(m));
        }
        assert!("replicas".parse::<ReadFrom>().is_err());
    }
}
