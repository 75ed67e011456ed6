//! When the upstream writer takes its gather turns (see the parent
//! module): skipped while they bring nothing, as with one client.

/// Writes in a row whose gather turns brought no request, after which the
/// writer stops taking them (see [`Gather`]).
const GATHER_IDLE: u32 = 8;
/// While it does not take them, every this many-th write with few
/// commands still does (a probe), so gathering resumes when clients do.
const GATHER_PROBE: u32 = 16;

/// Whether the writer takes its gather turns before a write with few
/// commands. A turn costs a pass of the runtime (an `epoll_wait` when
/// nothing else is ready): with one client at a time there is nobody to
/// gather, and the turns were 2 of the 9 system calls sidecache made per
/// forwarded command (`bench/results/forward-hop.md`). So after
/// [`GATHER_IDLE`] writes in a row whose turns brought nothing, only every
/// [`GATHER_PROBE`]-th write takes them, until one brings a request or a
/// write finds several requests queued. This decides only how requests
/// are grouped into writes: their order, and what is written, are the same.
#[derive(Debug, Default)]
pub(super) struct Gather {
    /// Writes in a row whose turns brought no request.
    fruitless: u32,
    /// Writes with few commands since the last probe.
    skipped: u32,
}

impl Gather {
    /// Whether this write (few commands in hand, `requests` requests)
    /// takes its turns.
    pub(super) fn turns(&mut self, requests: usize) -> bool {
        if requests > 1 {
            // Several were queued already: other clients are active.
            self.fruitless = 0;
        }
        if self.fruitless < GATHER_IDLE {
            return true;
        }
        self.skipped += 1;
        if self.skipped < GATHER_PROBE {
            return false;
        }
        self.skipped = 0;
        true
    }

    /// After a write that took its turns: whether they brought a request.
    pub(super) fn brought(&mut self, any: bool) {
        if any {
            self.fruitless = 0;
            self.skipped = 0;
        } else {
            self.fruitless = self.fruitless.saturating_add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Gather, GATHER_IDLE, GATHER_PROBE};

    /// How many of `writes` one-request writes take their turns, when no
    /// turn ever brings anything (one client).
    fn taking(g: &mut Gather, writes: u32) -> u32 {
        let mut n = 0;
        for _ in 0..writes {
            if g.turns(1) {
                n += 1;
                g.brought(false);
            }
        }
        n
    }

    #[test]
    fn one_client_stops_taking_turns_but_probes() {
        let mut g = Gather::default();
        assert_eq!(taking(&mut g, GATHER_IDLE), GATHER_IDLE);
        // Then one write in GATHER_PROBE.
        assert_eq!(taking(&mut g, 10 * GATHER_PROBE), 10);
    }

    #[test]
    fn turns_that_bring_requests_keep_them() {
        let mut g = Gather::default();
        for _ in 0..1000 {
            assert!(g.turns(1));
            g.brought(true);
        }
    }

    #[test]
    fn a_probe_that_brings_resumes_gathering() {
        let mut g = Gather::default();
        taking(&mut g, GATHER_IDLE);
        let mut skipped = 0;
        while !g.turns(1) {
            skipped += 1;
        }
        assert_eq!(skipped, GATHER_PROBE - 1);
        g.brought(true);
        for _ in 0..GATHER_IDLE {
            assert!(g.turns(1));
            g.brought(false);
        }
        assert!(!g.turns(1));
    }

    #[test]
    fn several_requests_queued_resume_gathering() {
        let mut g = Gather::default();
        taking(&mut g, GATHER_IDLE);
        assert!(!g.turns(1));
        assert!(g.turns(2));
    }
}
