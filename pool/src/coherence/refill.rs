//! Optin: keeping what this proxy writes cached and followed, for the keys
//! that are being read (re-registration in the write's own pipeline).
//!
//! # Why
//! Under `CLIENT TRACKING ON OPTIN` Redis follows a key for a connection
//! from a read made after `CLIENT CACHING YES` until the key's next change,
//! *whoever* makes it: a write forgets every registration of its key, the
//! writer's too. So a value this proxy writes behind is not followed once
//! its write has landed, and was dropped from the L1 then
//! (`L1::release_written`): the next read of the key missed. Applications
//! read what they write (sessions, carts, counters), and a read-write
//! workload lost 20–30 points of hit ratio against BCAST for it (71%
//! against 90% at 20% writes, Zipf 0.99 over 10,000 keys).
//!
//! # What
//! A write-behind write whose keys were read lately (`Write::refill`: the
//! L1's read marks, set by a fill and by a hit on a written or re-read
//! value, say whether the key was read within `--l1-ttl-cap`, which no
//! filled entry outlives) is followed, in the same batch on the invalidation
//! channel's connection, by a *re-read* of each of its keys:
//!
//! ```text
//!  SET k v · SET j w · … (the batch's writes, in queue order)
//!  CLIENT CACHING YES · GET k · PTTL k      one triple per key written last
//!                                           in the batch with `refill`
//! ```
//!
//! The `GET` registers `k` again for the connection and returns `k`'s
//! value once it ran; with the `PTTL`, that is a fill of `k` made after the
//! write, and the written entry becomes that fill (`L1::refill_written`)
//! if it still holds this write's value when the batch's replies are all
//! in. Keys nobody read within the cap are not re-read: their writes cost
//! Redis what they cost before (an untracked `SET` and a lookup in the
//! tracking table), and their values leave the L1 once landed, as before.
//! A key written twice in one batch is re-read once, after its last write.
//!
//! Why a window and not "read since the last write": a key being read is
//! often written twice with no read between (half the time at 50%
//! writes); dropping it at the second write cost a miss each time
//! (`bench/workload.sh matrix`: 0.72× of BCAST's hit ratio at 50% writes
//! with that rule, 0.95–1.0× with the window).
//!
//! # Why no other writer's change is missed
//! Let our write `W` of `k` (acknowledged at `A`, its value in the L1 with
//! stamp `A`) run upstream at `L`, the re-read's `GET` at `G` and its
//! `PTTL` at `P` (`L < G < P`: one connection, in order), and let the
//! batch's last reply be read at `R`. Another client changes `k` at `F`:
//! - `F < L`: `W` overwrites it. If `k` was registered for us then, its
//!   report arrives before `W`'s reply and is applied: the entry goes, and
//!   the re-read finds no entry with stamp `A` (a lost hit, never a stale
//!   one).
//! - `L < F < G`: nothing reports it (`W` took our registration), but the
//!   `GET` runs after it: the value cached is `F`'s or a later one. Between
//!   `L` and `R` the entry held `v`, which `F` made old: served at most
//!   `R − F`, the same bound as a written value's before it is released
//!   (`crate::coherence::tracking`, "Own writes").
//! - `G < F < P`: the `GET` registered `k`, so Redis reports `F`, after the
//!   `GET`'s reply and before the `PTTL`'s, on this connection: the reader
//!   applies it before the batch is answered, the entry goes, and the
//!   re-read is not applied (a value and a TTL from either side of `F` are
//!   never paired).
//! - `F > P`: reported after the `GET`'s reply, like any change of a
//!   filled key: applied before the re-read (the entry is gone: not
//!   applied) or after it (the re-read value is dropped).
//!
//! The re-read replaces the entry only if it still holds `W`'s stamp,
//! checked under the L1 shard's lock: any invalidation since `A` removed
//! it, any later write of ours replaced the stamp (and re-reads in turn),
//! a lost channel cleared it. It is applied before `W` is counted as
//! landed, so the release that follows finds a filled entry and keeps it,
//! and a read that waited for the write finds the value cached.
//!
//! # The write's own report
//! When `k` was registered for this connection before `W` (by the re-read
//! of its previous write, say), `W` takes that registration and Redis
//! reports it right after `W`'s reply (`crate::conn::mux`'s `echo`:
//! placed there, it cannot be another writer's). Applied as any report,
//! it would drop the entry and the re-read with it. It tells nothing new
//! about the write's database: whatever the L1 holds there for `k` is
//! `W`'s value, a later write's, or a fill sent after `W` landed. So the
//! echo spares the database the connection writes (`Channel::db`) and
//! drops `k` from the others, whose entries Redis no longer follows for
//! this connection (Redis's registrations name keys, not databases).
//!
//! # Cost
//! Per re-read key: three commands more in the batch (`CLIENT CACHING`,
//! `GET`, `PTTL`), a tracking-table entry while the key is cached, and the
//! report of its next write. That is what a miss of the key would cost
//! (the same three commands), paid once per write instead of once per
//! write *and* read, and only for keys being read. Measured with
//! `bench/workload.sh`: docs/benchmarks.md ("Read-write workloads").

use bytes::{Bytes, BytesMut};
use sidecache_resp::encode;
use sidecache_resp::frame::Value;

/// `CLIENT CACHING YES`: the next command's keys are tracked (optin).
const CACHING_YES: &[u8] = b"*3\r\n$6\r\nCLIENT\r\n$7\r\nCACHING\r\n$3\r\nYES\r\n";

/// Commands each re-read adds to its batch.
pub(crate) const COMMANDS: usize = 3;

/// One key to re-read after the writes of a batch.
#[derive(Debug)]
pub(crate) struct Reread {
    /// The index, in the batch, of its last write.
    pub(crate) write: usize,
    /// The key (a slice of that write's command).
    pub(crate) key: Bytes,
}

/// The keys a batch re-reads: each key of a write marked `refill`, unless
/// a later write of the batch writes it too (only the last write of a key
/// can stay cached). `writes` yields each write's `refill` flag and keys,
/// in batch order.
pub(crate) fn plan(
    writes: impl Iterator<Item = (bool, smallvec::SmallVec<[Bytes; 1]>)>,
) -> Vec<Reread> {
    let writes: Vec<_> = writes.collect();
    if !writes.iter().any(|(refill, _)| *refill) {
        return Vec::new();
    }
    let mut seen: std::collections::HashSet<Bytes, foldhash::fast::RandomState> =
        std::collections::HashSet::with_capacity_and_hasher(writes.len(), Default::default());
    let mut out = Vec::new();
    for (i, (refill, keys)) in writes.into_iter().enumerate().rev() {
        for k in keys.into_iter().rev() {
            if seen.insert(k.clone()) && refill {
                out.push(Reread { write: i, key: k });
            }
        }
    }
    out.reverse();
    out
}

/// Appends the re-reads' commands to a batch's encoded writes.
pub(crate) fn encode(out: &mut BytesMut, rereads: &[Reread]) {
    for r in rereads {
        out.extend_from_slice(CACHING_YES);
        encode::encode_command(out, &[b"GET".as_slice(), &r.key]);
        encode::encode_command(out, &[b"PTTL".as_slice(), &r.key]);
    }
}

/// What one re-read's replies say: the value (`None`: nil) and its PTTL,
/// or `None` if any of them is not what a registered read returns (an
/// error such as `MOVED`, or `CLIENT CACHING` refused).
pub(crate) fn outcome(replies: &[Bytes]) -> Option<(Option<Bytes>, i64)> {
    let [caching, get, pttl] = replies else {
        return None;
    };
    if !caching.starts_with(b"+") {
        return None;
    }
    let value = match Value::decode(get).ok()? {
        Value::Bulk(b) => Some(b),
        Value::Nil => None,
        _ => return None,
    };
    let pttl = Value::decode(pttl).ok()?.as_int()?;
    Some((value, pttl))
}

#[cfg(test)]
mod tests {
    use super::*;
    use smallvec::smallvec;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn only_the_last_write_of_a_read_key_is_reread() {
        let writes = vec![
            (true, smallvec![b("a")]),
            (true, smallvec![b("b")]),
            (false, smallvec![b("a")]),
            (true, smallvec![b("c"), b("b")]),
            (false, smallvec![b("d")]),
        ];
        let got: Vec<(usize, Bytes)> = plan(writes.into_iter())
            .into_iter()
            .map(|r| (r.write, r.key))
            .collect();
        // a: its last write is not marked; c and b: the MSET at 3, in its
        // order; d: not marked.
        assert_eq!(got, vec![(3, b("c")), (3, b("b"))]);
        assert!(plan(vec![(false, smallvec![b("x")])].into_iter()).is_empty());
    }

    #[test]
    fn the_triples_and_their_replies() {
        let mut out = BytesMut::new();
        encode(
            &mut out,
            &[Reread {
                write: 0,
                key: b("k"),
            }],
        );
        assert_eq!(
            &out[..],
            b"*3\r\n$6\r\nCLIENT\r\n$7\r\nCACHING\r\n$3\r\nYES\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*2\r\n$4\r\nPTTL\r\n$1\r\nk\r\n"
        );
        let ok = b("+OK\r\n");
        assert_eq!(
            outcome(&[ok.clone(), b("$1\r\nv\r\n"), b(":-1\r\n")]),
            Some((Some(b("v")), -1))
        );
        assert_eq!(
            outcome(&[ok.clone(), b("_\r\n"), b(":-2\r\n")]),
            Some((None, -2))
        );
        assert_eq!(
            outcome(&[ok.clone(), b("-MOVED 1 127.0.0.1:1\r\n"), b(":5\r\n")]),
            None
        );
        assert_eq!(
            outcome(&[b("-ERR no\r\n"), b("$1\r\nv\r\n"), b(":5\r\n")]),
            None
        );
        assert_eq!(outcome(&[ok]), None);
    }
}
