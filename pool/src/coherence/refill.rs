//! Optin: keeping what this proxy writes cached and followed, for the keys
//! that are being read (re-registration in the write's own pipeline).
//!
//! # Why
//! Under default-mode tracking Redis follows a key for a connection from
//! a read the connection made until the key's next change,
//! *whoever* makes it: a write forgets every registration of its key, the
//! writer's too. So a value this proxy writes behind is not followed once
//! its write has landed, and was dropped from the L1 then
//! (`L1::release_written`): the next read of the key missed. Applications
//! read what they write (sessions, carts, counters), and a read-write
//! workload lost 20–30 points of hit ratio against BCAST for it (71%
//! against 90% at 20% writes, Zipf 0.99 over 10,000 keys).
//!
//! # What
//! A write-behind write whose keys are being read (`Write::refill`: the
//! L1's read marks, set by a fill and by a hit on a written or re-read
//! value, say whether the key was read within `--l1-ttl-cap`, which no
//! filled entry outlives, and fewer than 64 writes of it ago) is
//! followed, in the same batch on the invalidation channel's connection,
//! by a *re-read* of each of its keys:
//!
//! ```text
//!  SET k v · SET j w · … (the batch's writes, in queue order)
//!  MGET k j … · PTTL k · PTTL j · …
//!      the keys written last in the batch with `refill`; one MGET per
//!      slot in a cluster (standalone: one for the batch)
//! ```
//!
//! The `MGET` registers each key again for the connection and returns its
//! value once it ran; with its `PTTL`, that is a fill of the key made
//! after the write, and the written entry becomes that fill (`L1::refill_written`)
//! if it still holds this write's value when the batch's replies are all
//! in. Keys nobody read within the cap are not re-read while the proxy's
//! unread writes are not read later either: their writes cost Redis what
//! they cost before (an untracked `SET` and a lookup in the tracking
//! table), and their values leave the L1 once landed, as before. When
//! enough of them are read later (measured on a sample of keys that keeps
//! this rule: `sidecache_l1`'s read marks, "Unread writes"), first writes
//! of such keys are re-read too: a miss costs Redis a round trip of its
//! own, a re-read its part of the batch. A key written twice in one batch
//! is re-read once, after its last write.
//!
//! Why a window and a count, and not "read since the last write": a key
//! being read is often written twice with no read between (half the time
//! at 50% writes); dropping it at the second write cost a miss each time
//! (`bench/workload.sh matrix` at 50% writes: 0.73× of BCAST's hit ratio
//! with that rule on 2026-12-05, 0.68–0.76× again on 2026-12-07; 0.94×
//! with the window alone). Why not the window alone: a key written again
//! and again with no read between (a counter, a rate limit, a write-only
//! load) was re-read after every write, each write then also reported back
//! as an echo: 2.6–3.2× Redis's instructions per SET (issue #57). So a key
//! is re-read for 64 unread writes at most (four measured 0.93–0.94× of
//! BCAST's hit ratio at 50% writes, eight halved it at 90% writes of hot
//! keys: `sidecache_l1`'s marks); from the 65th its writes
//! are not cached at all (`sidecache_l1`'s `Fate::Unread`: no insert, no
//! release, no re-read, and no echo, the last registration being taken by
//! the write after it), until a read.
//!
//! # Why no other writer's change is missed
//! Let our write `W` of `k` (acknowledged at `A`, its value in the L1 with
//! stamp `A`) run upstream at `L`, the re-read's `MGET` (`GET` below: one
//! command, run at once) at `G` and its `PTTL` at `P` (`L < G < P`: one
//! connection, in order), and let the
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
//! Per batch (per slot in a cluster) with re-reads: one `MGET`; per
//! re-read key: its part of the `MGET`, a `PTTL`, a tracking-table entry
//! while the key is cached, and the report of its next write. A miss of
//! the key would cost two commands (`GET`, `PTTL`) and a round trip; this is paid in the write's
//! batch, and only for keys being read. Measured with
//! `bench/workload.sh`: bench/results/history/2026-12-05-read-write-workloads.md.

use bytes::{Bytes, BytesMut};
use sidecache_resp::encode;
use sidecache_resp::frame::Value;

use crate::slot::Slot;

/// One key to re-read after the writes of a batch.
#[derive(Debug)]
pub(crate) struct Reread {
    /// The index, in the batch, of its last write.
    pub(crate) write: usize,
    /// The key (a slice of that write's command).
    pub(crate) key: Bytes,
    /// Its slot (cluster): one `MGET` per slot.
    slot: Option<Slot>,
}

/// The re-reads of a batch, grouped by slot (one `MGET` each), in the
/// order their replies come.
#[derive(Debug, Default)]
pub(crate) struct Rereads {
    keys: Vec<Reread>,
    /// The length of each slot's run in `keys`.
    groups: Vec<usize>,
}

impl Rereads {
    /// Whether there are none.
    pub(crate) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// How many keys are re-read.
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// The commands they add to the batch.
    pub(crate) fn commands(&self) -> usize {
        self.groups.len() + self.keys.len()
    }

    /// Appends their commands to a batch's encoded writes.
    pub(crate) fn encode(&self, out: &mut BytesMut) {
        let mut at = 0;
        for &n in &self.groups {
            let group = &self.keys[at..at + n];
            let mut args: Vec<&[u8]> = Vec::with_capacity(n + 1);
            args.push(b"MGET");
            args.extend(group.iter().map(|r| &r.key[..]));
            encode::encode_command(out, &args);
            for r in group {
                encode::encode_command(out, &[b"PTTL".as_slice(), &r.key]);
            }
            at += n;
        }
    }

    /// Each re-read key with what its replies say (see [`outcome`]), given
    /// the replies of their commands (`None` for all if the count is
    /// wrong).
    pub(crate) fn outcomes<'a>(
        &'a self,
        replies: &'a [Bytes],
    ) -> impl Iterator<Item = (&'a Reread, Option<Outcome>)> + 'a {
        let whole = replies.len() == self.commands();
        let mut at = 0usize;
        let mut reply_at = 0usize;
        self.groups.iter().flat_map(move |&n| {
            let group = &self.keys[at..at + n];
            let frames = if whole {
                replies.get(reply_at..reply_at + 1 + n)
            } else {
                None
            };
            at += n;
            reply_at += 1 + n;
            let values = frames.and_then(|f| values(&f[0], n));
            group.iter().enumerate().map(move |(i, r)| {
                let got = match (&values, frames) {
                    (Some(v), Some(f)) => outcome(v.get(i).cloned().flatten(), f.get(1 + i)),
                    _ => None,
                };
                (r, got)
            })
        })
    }
}

/// The keys a batch re-reads: each key of a write marked `refill`, unless
/// a later write of the batch writes it too (only the last write of a key
/// can stay cached). `writes` yields each write's `refill` flag, slot and
/// keys, in batch order; the caller calls it only for a batch with some
/// `refill` (it reads every write's keys).
pub(crate) fn plan<W>(writes: W) -> Rereads
where
    W: DoubleEndedIterator<Item = (bool, Option<Slot>, smallvec::SmallVec<[Bytes; 1]>)>
        + ExactSizeIterator,
{
    let mut seen: std::collections::HashSet<Bytes, foldhash::fast::RandomState> =
        std::collections::HashSet::with_capacity_and_hasher(writes.len(), Default::default());
    let mut keys = Vec::new();
    for (i, (refill, slot, ks)) in writes.enumerate().rev() {
        for k in ks.into_iter().rev() {
            if seen.insert(k.clone()) && refill {
                keys.push(Reread {
                    write: i,
                    key: k,
                    slot,
                });
            }
        }
    }
    keys.reverse();
    // One run per slot (sorted by slot, stable: a slot's keys keep their
    // order).
    keys.sort_by_key(|r| r.slot.map(Slot::get));
    let mut groups: Vec<usize> = Vec::new();
    let mut last = None;
    for r in &keys {
        match groups.last_mut() {
            Some(n) if last == Some(r.slot) => *n += 1,
            _ => groups.push(1),
        }
        last = Some(r.slot);
    }
    Rereads { keys, groups }
}

/// The values an `MGET` of `n` keys returned (`mget`: its reply); `None`
/// if it is not what a registered read returns (an error such as `MOVED`
/// or `CROSSSLOT`).
fn values(mget: &Bytes, n: usize) -> Option<Vec<Option<Option<Bytes>>>> {
    let Value::Array(items) = Value::decode(mget).ok()? else {
        return None;
    };
    if items.len() != n {
        return None;
    }
    Some(
        items
            .into_iter()
            .map(|v| match v {
                Value::Bulk(b) => Some(Some(b)),
                Value::Nil => Some(None),
                _ => None,
            })
            .collect(),
    )
}

/// What one re-read key's replies say: the value (`None`: nil) and PTTL to
/// cache.
pub(crate) type Outcome = (Option<Bytes>, i64);

/// One re-read key's value (`None`: not a value; `Some(None)`: nil) and
/// its `PTTL` reply, as the value and PTTL to cache, if both are what a
/// registered read returns.
fn outcome(value: Option<Option<Bytes>>, pttl: Option<&Bytes>) -> Option<Outcome> {
    let value = value?;
    let pttl = Value::decode(pttl?).ok()?.as_int()?;
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
            (true, None, smallvec![b("a")]),
            (true, None, smallvec![b("b")]),
            (false, None, smallvec![b("a")]),
            (true, None, smallvec![b("c"), b("b")]),
            (false, None, smallvec![b("d")]),
        ];
        let r = plan(writes.into_iter());
        let got: Vec<(usize, Bytes)> = r.keys.iter().map(|r| (r.write, r.key.clone())).collect();
        // a: its last write is not marked; c and b: the MSET at 3, in its
        // order; d: not marked.
        assert_eq!(got, vec![(3, b("c")), (3, b("b"))]);
        assert_eq!((r.groups.clone(), r.commands()), (vec![2], 3));
        assert!(plan(vec![(false, None, smallvec![b("x")])].into_iter()).is_empty());
        assert!(plan(Vec::new().into_iter()).is_empty());
    }

    #[test]
    fn one_mget_per_slot_and_their_replies() {
        let s = |n: u16| Slot::new(n);
        let writes = vec![
            (true, s(7), smallvec![b("x")]),
            (true, s(3), smallvec![b("y")]),
            (true, s(7), smallvec![b("z")]),
        ];
        let r = plan(writes.into_iter());
        let mut out = BytesMut::new();
        r.encode(&mut out);
        let cmd = |args: &[&str]| {
            let mut o = BytesMut::new();
            encode::encode_command(&mut o, args);
            String::from_utf8_lossy(&o).into_owned()
        };
        let want = [
            cmd(&["MGET", "y"]),
            cmd(&["PTTL", "y"]),
            cmd(&["MGET", "x", "z"]),
            cmd(&["PTTL", "x"]),
            cmd(&["PTTL", "z"]),
        ]
        .concat();
        assert_eq!(String::from_utf8_lossy(&out), want);
        assert_eq!(r.commands(), 5);
        let replies = vec![
            b("*1\r\n$1\r\n1\r\n"),
            b(":-1\r\n"),
            b("*2\r\n_\r\n$2\r\nzz\r\n"),
            b(":-2\r\n"),
            b("-ERR no\r\n"),
        ];
        let got: Vec<(String, Option<Outcome>)> = r
            .outcomes(&replies)
            .map(|(r, o)| (String::from_utf8_lossy(&r.key).into_owned(), o))
            .collect();
        assert_eq!(
            got,
            vec![
                ("y".into(), Some((Some(b("1")), -1))),
                ("x".into(), Some((None, -2))),
                ("z".into(), None),
            ]
        );
        // A redirected MGET (its group only), a short reply: nothing.
        let mut moved = replies.clone();
        moved[2] = b("-MOVED 1 127.0.0.1:1\r\n");
        let got: Vec<bool> = r.outcomes(&moved).map(|(_, o)| o.is_some()).collect();
        assert_eq!(got, vec![true, false, false]);
        assert!(r.outcomes(&replies[..4]).all(|(_, o)| o.is_none()));
    }
}
