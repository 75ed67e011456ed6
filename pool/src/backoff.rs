//! The doubling wait between tries of something that failed: reconnects,
//! held requests, write-behind resends.

use std::time::Duration;

/// Waits of `first`, doubled after each, at most `max`; [`Backoff::reset`]
/// starts again from `first` (after a success).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Waits from `first` up to `max`.
    pub(crate) const fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            max,
            next: first,
        }
    }

    /// The wait to make now; the one after it is twice as long, up to the
    /// maximum.
    pub(crate) fn next_wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = wait.saturating_mul(2).min(self.max);
        wait
    }

    /// After a success: the next wait is the first again.
    pub(crate) fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_its_maximum_and_starts_over_when_reset() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(20), ms(250));
        let waits: Vec<_> = (0..6).map(|_| b.next_wait()).collect();
        assert_eq!(waits, [ms(20), ms(40), ms(80), ms(160), ms(250), ms(250)]);
        b.reset();
        assert_eq!(b.next_wait(), ms(20));
    }
}
