//! One client's kill switch: CLIENT KILL and shutdown set it, and the
//! client's connection task, the one task that waits on it, wakes and
//! closes the connection.
//!
//! A flag and one waker slot rather than a `CancellationToken`: the
//! connection's read loop waits on it at every read, and a token's wait
//! takes the token's lock on each poll (340 instructions of a `-P 1` GET
//! hit with a new wait per read, 300 with one kept across reads, by
//! `bench/callgrind.sh`); this wait is two atomic loads and a waker
//! store. Only one task may wait: a second waiter would take the slot.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use atomic_waker::AtomicWaker;

/// Shared by the client's registry entry (which kills) and its
/// connection task (which waits).
#[derive(Clone, Debug, Default)]
pub struct Kill(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    killed: AtomicBool,
    waker: AtomicWaker,
}

impl Kill {
    /// Kills the client: its connection task wakes and closes.
    pub fn cancel(&self) {
        self.0.killed.store(true, Ordering::Release);
        self.0.waker.wake();
    }

    /// Whether the client was killed.
    pub fn is_cancelled(&self) -> bool {
        self.0.killed.load(Ordering::Acquire)
    }

    /// Ready once the client is killed. Polled only by the client's own
    /// connection task.
    pub fn cancelled(&self) -> Killed<'_> {
        Killed(self)
    }
}

/// The wait for [`Kill::cancel`]; may be kept and polled again.
#[derive(Debug)]
pub struct Killed<'a>(&'a Kill);

impl Future for Killed<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0.is_cancelled() {
            return Poll::Ready(());
        }
        self.0 .0.waker.register(cx.waker());
        // A kill between the check and the registration woke nobody.
        if self.0.is_cancelled() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_kill_wakes_the_waiting_task() {
        let kill = Kill::default();
        let waiter = tokio::spawn({
            let kill = kill.clone();
            async move {
                let killed = kill.cancelled();
                tokio::pin!(killed);
                // Polled (and pending) more than once before the kill, as
                // the read loop polls it at every read.
                for _ in 0..3 {
                    tokio::select! {
                        biased;
                        () = &mut killed => return true,
                        () = tokio::task::yield_now() => {}
                    }
                }
                killed.await;
                true
            }
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!kill.is_cancelled());
        kill.cancel();
        let woke = tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("the waiting task woke")
            .expect("the task ran");
        assert!(woke);
        assert!(kill.is_cancelled());
    }

    #[tokio::test]
    async fn a_kill_before_the_wait_is_seen_at_once() {
        let kill = Kill::default();
        kill.cancel();
        tokio::time::timeout(std::time::Duration::from_secs(1), kill.cancelled())
            .await
            .expect("ready at once");
    }
}
