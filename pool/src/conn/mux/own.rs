//! The invalidations of the channel connection's own writes (optin): which
//! are expected after a transaction's reply, and skipping them.
//!
//! # Race window
//! Redis 7 sends the invalidations of a command's own writes right after
//! its reply, before it runs any other client's command, so the pushes
//! directly after an `EXEC` reply start with exactly those the batch made
//! (one per distinct key, in the order first written: the batch tracked
//! every key before writing it). A foreign write's invalidation can only
//! come after them. So skipping, in order, only pushes that name the next
//! expected key, and ending at the first mismatch or the next reply, never
//! skips a foreign one; a mismatch at worst applies one of ours (a lost
//! hit).

use bytes::Bytes;

/// One transaction of a request on the channel's own connection that
/// writes keys this connection tracks (see
/// [`super::MuxConn::submit_own`]).
#[derive(Debug)]
pub(crate) struct OwnTx {
    /// Index, among the request's replies, of its `CLIENT CACHING YES`.
    pub(crate) caching: usize,
    /// Index of its `EXEC`.
    pub(crate) exec: usize,
    /// The distinct keys it writes, in the order first written.
    pub(crate) keys: Vec<Bytes>,
}

/// The own invalidations expected next on one connection.
#[derive(Debug, Default)]
pub(super) struct Expected {
    keys: Vec<Bytes>,
    at: usize,
}

impl Expected {
    /// Whether the push `frame` is the next own invalidation (then it is
    /// consumed); otherwise nothing more is expected.
    pub(super) fn skips(&mut self, frame: &Bytes) -> bool {
        match self.keys.get(self.at) {
            Some(k) if crate::coherence::tracking::invalidates_only(frame, k) => {
                self.at += 1;
                true
            }
            _ => {
                self.end();
                false
            }
        }
    }

    /// A reply arrived: nothing more is expected.
    pub(super) fn end(&mut self) {
        self.keys.clear();
        self.at = 0;
    }

    /// After a reply was added to `frames` (a request's replies so far):
    /// if it is the `EXEC` of the request's next transaction in `txs`
    /// (last first), that committed (an array) after an accepted
    /// `CLIENT CACHING YES` on a `registered` connection, its keys are
    /// expected next.
    pub(super) fn arm(&mut self, txs: &mut Option<Vec<OwnTx>>, frames: &[Bytes], registered: bool) {
        let Some(txs) = txs else { return };
        if !txs.last().is_some_and(|t| t.exec + 1 == frames.len()) {
            return;
        }
        let Some(t) = txs.pop() else { return };
        let is = |i: usize, kind: u8| frames.get(i).is_some_and(|f| f.first() == Some(&kind));
        if registered && is(t.caching, b'+') && is(t.exec, b'*') {
            self.keys = t.keys;
            self.at = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(key: &str) -> Bytes {
        Bytes::from(format!(
            ">2\r\n$10\r\ninvalidate\r\n*1\r\n${}\r\n{key}\r\n",
            key.len()
        ))
    }

    #[test]
    fn skips_only_the_expected_in_order() {
        let mut e = Expected::default();
        let mut txs = Some(vec![OwnTx {
            caching: 0,
            exec: 2,
            keys: vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")],
        }]);
        let ok = Bytes::from_static(b"+OK\r\n");
        let exec = Bytes::from_static(b"*1\r\n+OK\r\n");
        e.arm(&mut txs, &[ok.clone(), ok.clone()], true);
        assert!(!e.skips(&push("a")), "not armed before the EXEC");
        e.arm(&mut txs, &[ok.clone(), ok.clone(), exec.clone()], true);
        assert!(e.skips(&push("a")));
        assert!(!e.skips(&push("c")), "a foreign one ends the skipping");
        assert!(!e.skips(&push("b")));
        // An aborted EXEC arms nothing; neither does an unregistered one.
        let mut txs = Some(vec![OwnTx {
            caching: 0,
            exec: 1,
            keys: vec![Bytes::from_static(b"a")],
        }]);
        e.arm(
            &mut txs,
            &[ok.clone(), Bytes::from_static(b"-EXECABORT x\r\n")],
            true,
        );
        assert!(!e.skips(&push("a")));
        let mut txs = Some(vec![OwnTx {
            caching: 0,
            exec: 1,
            keys: vec![Bytes::from_static(b"a")],
        }]);
        e.arm(&mut txs, &[ok, exec], false);
        assert!(!e.skips(&push("a")));
    }
}
