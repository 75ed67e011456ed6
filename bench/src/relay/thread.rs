//! What the relay thread asks Linux of itself: its id, its timer slack,
//! and its CPU time.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::RelayStats;

impl RelayStats {
    /// CPU time the relay thread has used so far (`/proc/self/task/TID/
    /// schedstat`, ns on CPU): what relaying costs, apart from the
    /// processes it relays for. `None` where it cannot be read (not Linux,
    /// or the thread not started).
    pub fn cpu_time(&self) -> Option<Duration> {
        let tid = self.tid.load(Ordering::Relaxed);
        if tid == 0 {
            return None;
        }
        let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
        let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
        Some(Duration::from_nanos(ns))
    }
}

/// This thread's id, from `/proc/thread-self` (Linux only).
pub fn thread_id() -> Option<u64> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

/// Sets thread `tid`'s timer slack to 1 ns (`/proc/TID/timerslack_ns`; a
/// thread's own `/proc/thread-self` directory has no `timerslack_ns`).
/// `false` where it fails.
pub fn set_timer_slack_1ns(tid: u64) -> bool {
    std::fs::write(format!("/proc/{tid}/timerslack_ns"), "1").is_ok()
}
