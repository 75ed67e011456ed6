//! Optin tracking: a batch that registers what it writes.
//!
//! In Redis's default tracking mode a write to a key forgets every
//! registration of it, ours included, and `NOLOOP` only keeps Redis from
//! telling us about our own write. A value this sidecache wrote and keeps
//! in its L1 must be tracked again, and with no gap: a foreign write
//! between our `SET` and a later read that registers the key would be
//! seen by no one. So the batch goes as one transaction that ends with a
//! read of every key it wrote:
//!
//! ```text
//! CLIENT CACHING YES          the next command (MULTI: the whole transaction) is tracked
//! MULTI
//! EXISTS k1 k2 …              (channel connection only) every key tracked before it is written
//! SET k1 … / MSET …           the batch, as queued
//! EXISTS k1 k2 …              registers the written keys for this connection
//! EXEC                        atomically: no foreign command runs in between
//! ```
//!
//! Any other connection's write to one of these keys after the `EXEC` is
//! then invalidated. Our own writes are too, since no `NOLOOP` is used
//! (see [`crate::coherence::tracking`]): on the channel's own connection, Redis sends
//! the invalidations of a command's own writes right after its reply,
//! before anything else; the leading `EXISTS` makes them exactly one per
//! distinct key written, in the order first written, and the connection
//! skips them ([`crate::conn::mux::MuxConn::submit_own`]). On another database's
//! fill connection they arrive on the channel like any other: the value
//! leaves the L1 (a lost hit, never a stale one).
//!
//! [`unwrap`] turns the replies back into one per write and says whether
//! the registration held; when it did not (the transaction was refused or
//! aborted, a queue-time error), the writes are retried one by one and
//! their keys dropped from the L1 afterwards.

use bytes::{Bytes, BytesMut};
use sidecache_resp::encode;
use sidecache_resp::frame;

use super::keys::keys_of;
use super::Queued;

use crate::conn::mux::{OwnTx, Replies};

/// What a retried write of an aborted transaction is answered meanwhile:
/// retryable, so the batcher sends it again on its own.
const ABORTED: &[u8] = b"-TRYAGAIN sidecache: write-behind transaction aborted\r\n";

/// How a batch is wrapped: one transaction per run of writes to one slot
/// (Redis Cluster refuses a transaction, or an `EXISTS`, across slots; a
/// standalone batch is one run).
#[derive(Debug, Clone)]
pub(super) struct Layout {
    /// On the channel's own connection: with the leading `EXISTS`, and its
    /// own invalidations expected.
    own: bool,
    /// Writes per transaction, in order.
    groups: Vec<usize>,
}

impl Layout {
    /// Commands one transaction adds to its writes.
    fn per_tx(&self) -> usize {
        4 + usize::from(self.own)
    }

    /// Commands the wrapping adds to the writes.
    pub(super) fn extra(&self) -> usize {
        self.groups.len() * self.per_tx()
    }
}

/// Runs of consecutive writes to one slot: their lengths.
fn runs(batch: &[Queued]) -> Vec<usize> {
    let mut groups: Vec<usize> = Vec::new();
    let mut last = None;
    for q in batch {
        match groups.last_mut() {
            Some(n) if last == Some(q.write.slot) => *n += 1,
            _ => groups.push(1),
        }
        last = Some(q.write.slot);
    }
    groups
}

/// The payload of a wrapped batch, its command count, its layout, and
/// (`own`) what each transaction writes: its own invalidations, expected
/// after its reply.
pub(super) fn wrap(batch: &[Queued], own: bool) -> (Bytes, usize, Layout, Option<Vec<OwnTx>>) {
    let layout = Layout {
        own,
        groups: runs(batch),
    };
    let size: usize = batch.iter().map(|q| q.write.cmd.len()).sum();
    let mut out = BytesMut::with_capacity(3 * size + 96 * layout.groups.len());
    let mut txs = Vec::with_capacity(if own { layout.groups.len() } else { 0 });
    let mut at = 0usize;
    // Replies so far.
    let mut replies = 0usize;
    let mut keys: Vec<&[u8]> = Vec::new();
    for &g in &layout.groups {
        let writes = &batch[at..at + g];
        at += g;
        keys.clear();
        keys.push(b"EXISTS");
        for q in writes {
            keys.extend(keys_of(&q.write.cmd));
        }
        encode::encode_command(&mut out, &[b"CLIENT".as_slice(), b"CACHING", b"YES"]);
        encode::encode_command(&mut out, &[b"MULTI"]);
        if own {
            encode::encode_command(&mut out, &keys);
        }
        for q in writes {
            out.extend_from_slice(&q.write.cmd);
        }
        encode::encode_command(&mut out, &keys);
        encode::encode_command(&mut out, &[b"EXEC"]);
        let caching = replies;
        replies += g + layout.per_tx();
        if own {
            let mut seen = std::collections::HashSet::with_capacity(keys.len());
            let mut distinct = Vec::with_capacity(keys.len());
            for q in writes {
                let mut ks = Vec::new();
                ks.extend(keys_of(&q.write.cmd));
                for k in ks {
                    if seen.insert(k) {
                        distinct.push(q.write.cmd.slice_ref(k));
                    }
                }
            }
            txs.push(OwnTx {
                caching,
                exec: replies - 1,
                keys: distinct,
            });
        }
    }
    let count = batch.len() + layout.extra();
    (out.freeze(), count, layout, own.then_some(txs))
}

/// One reply per write, and whether every written key is tracked now.
#[derive(Debug)]
pub(super) struct Unwrapped {
    pub(super) replies: Replies,
    pub(super) tracked: bool,
}

/// The replies of a batch of `n` writes wrapped by [`wrap`]; `None` when
/// they are not all there.
pub(super) fn unwrap(frames: Replies, n: usize, layout: &Layout) -> Option<Unwrapped> {
    if frames.len() != n + layout.extra() {
        return None;
    }
    let mut replies = Vec::with_capacity(n);
    let mut tracked = true;
    let mut at = 0usize;
    for &g in &layout.groups {
        let len = g + layout.per_tx();
        let u = unwrap_tx(&frames[at..at + len], g, layout.own);
        at += len;
        tracked &= u.tracked;
        replies.extend(u.replies);
    }
    Some(Unwrapped { replies, tracked })
}

/// The replies of one transaction of `n` writes.
fn unwrap_tx(frames: &[Bytes], n: usize, own: bool) -> Unwrapped {
    let lead = usize::from(own);
    let caching_ok = frame::error_text(&frames[0]).is_none();
    let multi_ok = frame::error_text(&frames[1]).is_none();
    let exec = &frames[frames.len() - 1];
    let queued = &frames[2 + lead..2 + lead + n];
    if !multi_ok {
        // No transaction: the writes ran (or failed) as they came, and the
        // EXISTS after them left a gap.
        return Unwrapped {
            replies: queued.to_vec(),
            tracked: false,
        };
    }
    if let Ok(Some(mut els)) = frame::array_elements(exec) {
        if els.len() == n + 1 + lead {
            let exists_ok = els.pop().is_some_and(|f| f.first() == Some(&b':'));
            return Unwrapped {
                replies: els.split_off(lead),
                tracked: caching_ok && exists_ok,
            };
        }
    }
    // Aborted (EXECABORT after a queue-time error, or EXEC refused):
    // nothing ran. A write refused at queue time keeps its error (MOVED,
    // OOM, …); the others are retried.
    let replies = queued
        .iter()
        .map(|q| {
            if frame::error_text(q).is_some() {
                q.clone()
            } else {
                Bytes::from_static(ABORTED)
            }
        })
        .collect();
    Unwrapped {
        replies,
        tracked: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(args: &[&str]) -> Bytes {
        let mut out = BytesMut::new();
        encode::encode_command(&mut out, args);
        out.freeze()
    }

    fn keys(cmd: &Bytes) -> Vec<&[u8]> {
        keys_of(cmd).collect()
    }

    fn q(slot: Option<u16>, args: &[&str]) -> Queued {
        Queued {
            write: super::super::Write {
                db: 0,
                slot: slot.and_then(crate::cluster::slot::Slot::new),
                cmd: enc(args),
            },
            at: std::time::Instant::now(),
            charge: 0,
        }
    }

    fn frames(f: &[&'static str]) -> Replies {
        f.iter().map(|s| Bytes::from_static(s.as_bytes())).collect()
    }

    fn layout(own: bool, groups: &[usize]) -> Layout {
        Layout {
            own,
            groups: groups.to_vec(),
        }
    }

    #[test]
    fn keys_are_read_without_decoding() {
        let set = enc(&["SET", "a\r\nb", "v", "PXAT", "1"]);
        assert_eq!(keys(&set), vec![b"a\r\nb".as_slice()]);
        let mset = enc(&["MSET", "x", "1", "y", "", "z", "3"]);
        assert_eq!(
            keys(&mset),
            vec![b"x".as_slice(), b"y".as_slice(), b"z".as_slice()]
        );
        assert!(keys(&Bytes::from_static(b"+OK\r\n")).is_empty());
        assert!(keys(&Bytes::from_static(b"*2\r\n$3\r\nSET\r\n$9\r\nshort\r\n")).is_empty());
    }

    #[test]
    fn own_keys_are_distinct_in_first_written_order() {
        let batch = [
            q(None, &["SET", "b", "1"]),
            q(None, &["MSET", "a", "1", "b", "2", "c", "3"]),
            q(None, &["SET", "a", "2"]),
        ];
        let (payload, count, layout, own) = wrap(&batch, true);
        assert_eq!((count, layout.groups), (3 + 5, vec![3]));
        let own = own.unwrap_or_default();
        assert_eq!((own.len(), own[0].caching, own[0].exec), (1, 0, 7));
        let keys: Vec<&[u8]> = own[0].keys.iter().map(|k| &k[..]).collect();
        assert_eq!(keys, vec![b"b".as_slice(), b"a", b"c"]);
        let text = String::from_utf8_lossy(&payload);
        assert_eq!(text.matches("EXISTS").count(), 2);
        assert!(text.starts_with("*3\r\n$6\r\nCLIENT\r\n$7\r\nCACHING\r\n$3\r\nYES\r\n*1\r\n$5\r\nMULTI\r\n*6\r\n$6\r\nEXISTS\r\n"));
        assert!(text.ends_with("*1\r\n$4\r\nEXEC\r\n"));
        let (_, count, _, own) = wrap(&batch, false);
        assert_eq!(count, 3 + 4);
        assert!(own.is_none());
    }

    #[test]
    fn one_transaction_per_run_of_one_slot() {
        let batch = [
            q(Some(1), &["SET", "a", "1"]),
            q(Some(1), &["SET", "b", "1"]),
            q(Some(2), &["SET", "c", "1"]),
            q(Some(1), &["SET", "d", "1"]),
        ];
        let (_, count, layout, own) = wrap(&batch, true);
        assert_eq!(layout.groups, vec![2, 1, 1]);
        assert_eq!(count, 4 + 3 * 5);
        let own = own.unwrap_or_default();
        let at: Vec<(usize, usize)> = own.iter().map(|t| (t.caching, t.exec)).collect();
        assert_eq!(at, vec![(0, 6), (7, 12), (13, 18)]);
        let tx2 = [
            "+OK\r\n",
            "+OK\r\n",
            "+QUEUED\r\n",
            "+QUEUED\r\n",
            "+QUEUED\r\n",
            "+QUEUED\r\n",
            "*4\r\n:0\r\n+OK\r\n+OK\r\n:2\r\n",
        ];
        let tx1 = [
            "+OK\r\n",
            "+OK\r\n",
            "+QUEUED\r\n",
            "+QUEUED\r\n",
            "+QUEUED\r\n",
            "*3\r\n:0\r\n+OK\r\n:1\r\n",
        ];
        let mut all: Vec<&'static str> = tx2.to_vec();
        all.extend(tx1);
        all.extend(tx1);
        let u = unwrap(frames(&all), 4, &layout).expect("complete");
        assert!(u.tracked);
        assert_eq!(u.replies, frames(&["+OK\r\n"; 4]));
    }

    #[test]
    fn a_committed_batch_is_tracked() {
        let r = frames(&[
            "+OK\r\n",
            "+OK\r\n",
            "+QUEUED\r\n",
            "+QUEUED\r\n",
            "+QUEUED\r\n",
            "*3\r\n+OK\r\n+OK\r\n:2\r\n",
        ]);
        let u = unwrap(r, 2, &layout(false, &[2])).expect("complete");
        assert!(u.tracked);
        assert_eq!(u.replies, frames(&["+OK\r\n", "+OK\r\n"]));
        assert!(unwrap(frames(&["+OK\r\n"]), 2, &layout(false, &[2])).is_none());
    }

    #[test]
    fn an_aborted_batch_is_retried_untracked() {
        let l = layout(false, &[2]);
        let r = frames(&[
            "+OK\r\n",
            "+OK\r\n",
            "-MOVED 1 127.0.0.1:7001\r\n",
            "+QUEUED\r\n",
            "+QUEUED\r\n",
            "-EXECABORT Transaction discarded\r\n",
        ]);
        let u = unwrap(r, 2, &l).expect("complete");
        assert!(!u.tracked);
        assert_eq!(
            u.replies[0],
            Bytes::from_static(b"-MOVED 1 127.0.0.1:7001\r\n")
        );
        assert_eq!(u.replies[1], Bytes::from_static(ABORTED));
        // MULTI refused: the writes ran on their own.
        let r = frames(&[
            "+OK\r\n",
            "-LOADING\r\n",
            "+OK\r\n",
            "-LOADING\r\n",
            ":1\r\n",
            "-ERR EXEC without MULTI\r\n",
        ]);
        let u = unwrap(r, 2, &l).expect("complete");
        assert!(!u.tracked);
        assert_eq!(u.replies, frames(&["+OK\r\n", "-LOADING\r\n"]));
        // CACHING refused (tracking is not on): applied, untracked.
        let r = frames(&[
            "-ERR CLIENT CACHING …\r\n",
            "+OK\r\n",
            "+QUEUED\r\n",
            "+QUEUED\r\n",
            "*2\r\n+OK\r\n:1\r\n",
        ]);
        assert!(
            !unwrap(r, 1, &layout(false, &[1]))
                .expect("complete")
                .tracked
        );
    }
}
