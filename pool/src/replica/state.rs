//! What the probes last said of one node as a replica (see the `replica`
//! module): read lock-free by every routed read, written by the probe
//! task. Each `conn::node::Node` holds one, so it sits here, below `conn`.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

/// Zone unknown.
const AZ_UNKNOWN: u8 = 0;
/// In sidecache's zone.
const AZ_SAME: u8 = 1;
/// In another zone.
const AZ_OTHER: u8 = 2;

/// One node's replica state.
#[derive(Debug, Default)]
pub struct ReplicaState {
    /// Last probe answered with the link up and not loading.
    healthy: AtomicBool,
    /// Up to when (stamps' clock) it holds all its master had; 0: never.
    caught_up: AtomicU64,
    /// [`AZ_UNKNOWN`], [`AZ_SAME`] or [`AZ_OTHER`].
    zone: AtomicU8,
    /// Its zone's name, once known (for the metrics).
    az: Mutex<Option<String>>,
    /// Whether the zone was asked of the node itself (`HELLO`).
    pub(crate) az_asked: AtomicBool,
    /// Its replication offset at the last probe.
    pub offset: AtomicU64,
    /// Nanoseconds it was behind at the last probe (now − caught-up).
    pub lag_ns: AtomicU64,
}

impl ReplicaState {
    /// Whether the last probe found it usable.
    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }

    /// Up to when (stamps' clock) it is proven to hold its master's writes.
    pub fn caught_up(&self) -> u64 {
        self.caught_up.load(Ordering::Acquire)
    }

    /// Whether it is known to be in sidecache's zone.
    pub fn same_az(&self) -> bool {
        self.zone.load(Ordering::Relaxed) == AZ_SAME
    }

    /// Its zone's name, if known.
    pub fn az(&self) -> Option<String> {
        self.az.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn set_az(&self, az: &str, same: bool) {
        *self.az.lock().unwrap_or_else(|p| p.into_inner()) = Some(az.to_owned());
        self.zone
            .store(if same { AZ_SAME } else { AZ_OTHER }, Ordering::Relaxed);
    }

    /// Whether its zone is known.
    pub(crate) fn az_known(&self) -> bool {
        self.zone.load(Ordering::Relaxed) != AZ_UNKNOWN
    }

    pub(crate) fn set_healthy(&self, up: bool) {
        self.healthy.store(up, Ordering::Release);
    }

    pub(crate) fn advance(&self, to: u64) {
        self.caught_up.fetch_max(to, Ordering::AcqRel);
    }
}
