//! A client's outbox: the messages and MONITOR lines queued for it, and
//! the output limit that disconnects a client that does not read them.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Notify};

use super::{Delivery, Hub, HubStats, OUTBOX_MESSAGES};

/// A client output limit, as Redis's `client-output-buffer-limit`: over
/// `hard` bytes, or over `soft` bytes for longer than `soft_time`, the
/// client is disconnected. 0 turns a limit off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputLimit {
    /// Bytes at once.
    pub hard: u64,
    /// Bytes for longer than `soft_time`.
    pub soft: u64,
    /// How long over `soft` is tolerated.
    pub soft_time: Duration,
}

impl OutputLimit {
    /// Redis's default for the pubsub class: 32mb 8mb 60.
    pub const PUBSUB_DEFAULT: OutputLimit = OutputLimit {
        hard: 32 << 20,
        soft: 8 << 20,
        soft_time: Duration::from_secs(60),
    };
}

/// One client's queue of messages and MONITOR lines, filled by the hub
/// and drained by the client's task.
#[derive(Debug)]
pub struct Outbox {
    tx: mpsc::Sender<Delivery>,
    /// Bytes queued and not yet written to the client.
    queued: AtomicUsize,
    /// When the queue went over the soft limit (ms since `epoch`, plus 1);
    /// 0 while under it.
    soft_since: AtomicU64,
    doomed: AtomicBool,
    /// Woken when the client is to be disconnected.
    pub doom: Notify,
    limit: OutputLimit,
    epoch: Instant,
    stats: Arc<HubStats>,
}

impl Outbox {
    /// An outbox and the receiver its client drains.
    pub fn new(hub: &Hub) -> (Arc<Outbox>, mpsc::Receiver<Delivery>) {
        let (tx, rx) = mpsc::channel(OUTBOX_MESSAGES);
        let o = Outbox {
            tx,
            queued: AtomicUsize::new(0),
            soft_since: AtomicU64::new(0),
            doomed: AtomicBool::new(false),
            doom: Notify::new(),
            limit: hub.limit,
            epoch: hub.epoch,
            stats: Arc::clone(&hub.stats),
        };
        (Arc::new(o), rx)
    }

    /// Whether the client is to be disconnected (its limit passed).
    pub fn doomed(&self) -> bool {
        self.doomed.load(Ordering::Acquire)
    }

    /// Queues `d` unless the client is doomed or `d` takes it past its
    /// limit (which dooms it).
    pub fn push(&self, d: Delivery) {
        if self.doomed() {
            return;
        }
        let w = d.weight();
        let q = (self.queued.fetch_add(w, Ordering::AcqRel) + w) as u64;
        if self.limit.hard > 0 && q > self.limit.hard {
            self.kill();
            return;
        }
        if self.limit.soft > 0 && q > self.limit.soft {
            let now = self.epoch.elapsed().as_millis() as u64 + 1;
            match self
                .soft_since
                .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {}
                Err(since) if now - since > self.limit.soft_time.as_millis() as u64 => {
                    self.kill();
                    return;
                }
                Err(_) => {}
            }
        }
        match self.tx.try_send(d) {
            Ok(()) => {
                self.stats.messages_out.fetch_add(1, Ordering::Relaxed);
            }
            // More messages than even tiny ones could fill the byte limit
            // with (or the limit is off): the same verdict.
            Err(mpsc::error::TrySendError::Full(_)) => self.kill(),
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    /// `bytes` of what was queued have been written to the client.
    pub fn written(&self, bytes: usize) {
        let q = self.queued.fetch_sub(bytes, Ordering::AcqRel) - bytes;
        if (q as u64) <= self.limit.soft {
            self.soft_since.store(0, Ordering::Release);
        }
    }

    fn kill(&self) {
        if !self.doomed.swap(true, Ordering::AcqRel) {
            self.stats
                .output_limit_disconnects
                .fetch_add(1, Ordering::Relaxed);
            self.doom.notify_one();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn hub(hard: u64, soft: u64, secs: u64) -> Hub {
        Hub::new(
            OutputLimit {
                hard,
                soft,
                soft_time: Duration::from_secs(secs),
            },
            Duration::from_secs(1),
        )
    }

    fn msg(n: usize) -> Delivery {
        Delivery::Monitor(Bytes::from(vec![b'x'; n]))
    }

    #[test]
    fn hard_limit_dooms_and_stops_queueing() {
        let h = hub(1000, 0, 0);
        let (o, mut rx) = Outbox::new(&h);
        o.push(msg(600));
        assert!(!o.doomed());
        o.push(msg(600));
        assert!(o.doomed());
        o.push(msg(10));
        assert!(rx.try_recv().is_ok());
        assert!(rx.try_recv().is_err(), "nothing queued past the limit");
        assert_eq!(h.stats.output_limit_disconnects.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn written_bytes_free_room() {
        let h = hub(1000, 0, 0);
        let (o, _rx) = Outbox::new(&h);
        for _ in 0..10 {
            o.push(msg(600));
            o.written(600);
        }
        assert!(!o.doomed());
    }

    #[test]
    fn soft_limit_needs_its_time() {
        let h = hub(0, 100, 3600);
        let (o, _rx) = Outbox::new(&h);
        o.push(msg(200));
        o.push(msg(200));
        assert!(!o.doomed(), "over soft, but not for an hour");
        let h = hub(0, 100, 0);
        let (o, _rx) = Outbox::new(&h);
        o.push(msg(200));
        std::thread::sleep(Duration::from_millis(5));
        o.push(msg(200));
        assert!(o.doomed());
    }
}
