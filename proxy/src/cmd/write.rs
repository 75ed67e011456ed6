//! Which writes may be acknowledged from memory (write-behind), and their
//! rewriting: relative expiries become absolute `PXAT` at acknowledgement,
//! so queueing delay never lengthens a key's life. Pure functions.
//!
//! Anything unusual — conditions (NX/XX/GET), repeated or conflicting
//! options, numbers Redis would refuse — is *not* planned: it is forwarded
//! synchronously, so upstream gives its exact reply.

use bytes::{Bytes, BytesMut};
use sidecache_resp::encode;
use sidecache_resp::int::parse_i64;

/// The expiry a write sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// No expiry (the key becomes persistent).
    Persist,
    /// Absolute expiry, Unix time in milliseconds.
    At(i64),
    /// SET … KEEPTTL: the key keeps whatever TTL it had.
    KeepTtl,
}

/// A write to acknowledge from memory: (key, value) argument indexes and
/// the expiry they get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WritePlan {
    /// Indexes into the arguments: (key, value).
    pub pairs: Pairs,
    /// The expiry of every pair.
    pub expiry: Expiry,
    /// `MSET` (one command per slot group) rather than `SET`.
    pub mset: bool,
}

/// (key, value) argument indexes: one inline (SET), more for MSET.
pub type Pairs = smallvec::SmallVec<[(usize, usize); 1]>;

/// Plans `args` (command name lower-cased in `name`) as a write-behind
/// write, as of `now_ms` (Unix milliseconds); `None`: forward it.
pub fn plan(name: &str, args: &[Bytes], now_ms: i64) -> Option<WritePlan> {
    match name {
        "set" if args.len() >= 3 => {
            let expiry = set_options(&args[3..], now_ms)?;
            Some(WritePlan {
                pairs: smallvec::smallvec![(1, 2)],
                expiry,
                mset: false,
            })
        }
        "setex" | "psetex" if args.len() == 4 => {
            let n = parse_i64(&args[2])?;
            let ms = if name == "setex" {
                seconds_to_ms(n)?
            } else {
                n
            };
            if n <= 0 {
                return None;
            }
            Some(WritePlan {
                pairs: smallvec::smallvec![(1, 3)],
                expiry: Expiry::At(now_ms.checked_add(ms)?),
                mset: false,
            })
        }
        "mset" if args.len() >= 3 && args.len() % 2 == 1 => Some(WritePlan {
            pairs: (1..args.len()).step_by(2).map(|i| (i, i + 1)).collect(),
            expiry: Expiry::Persist,
            mset: true,
        }),
        _ => None,
    }
}

/// When the key of a write that gives it a time to live (`args[1]`) is
/// due to expire, in Unix milliseconds: SET with EX/PX/EXAT/PXAT (NX, XX
/// and GET alike), SETEX, PSETEX, GETEX, EXPIRE, PEXPIRE, EXPIREAT and
/// PEXPIREAT (`name` lower-cased). `None` for any other write, for a time
/// already past (the write deletes the key), and for what Redis would
/// refuse.
pub fn expires_at(name: &str, args: &[Bytes], now_ms: i64) -> Option<i64> {
    let at = |unit: &[u8], n: &Bytes| -> Option<i64> {
        let n = parse_i64(n)?;
        let at = if unit.eq_ignore_ascii_case(b"ex") {
            now_ms.checked_add(seconds_to_ms(n)?)?
        } else if unit.eq_ignore_ascii_case(b"px") {
            now_ms.checked_add(n)?
        } else if unit.eq_ignore_ascii_case(b"exat") {
            seconds_to_ms(n)?
        } else if unit.eq_ignore_ascii_case(b"pxat") {
            n
        } else {
            return None;
        };
        (n > 0 && at > now_ms).then_some(at)
    };
    let from = |opts: &[Bytes]| opts.windows(2).find_map(|w| at(&w[0], &w[1]));
    match name {
        "set" if args.len() >= 5 => from(&args[3..]),
        "getex" if args.len() >= 4 => from(&args[2..]),
        "setex" if args.len() == 4 => at(b"ex", &args[2]),
        "psetex" if args.len() == 4 => at(b"px", &args[2]),
        "expire" | "pexpire" | "expireat" | "pexpireat" if args.len() >= 3 => {
            let unit: &[u8] = match name {
                "expire" => b"ex",
                "pexpire" => b"px",
                "expireat" => b"exat",
                _ => b"pxat",
            };
            at(unit, &args[2])
        }
        _ => None,
    }
}

fn seconds_to_ms(n: i64) -> Option<i64> {
    if n > i64::MAX / 1000 {
        return None;
    }
    Some(n.saturating_mul(1000))
}

/// SET's options after the value, as Redis 7 parses them; only the
/// unconditional forms are planned.
fn set_options(opts: &[Bytes], now_ms: i64) -> Option<Expiry> {
    let mut expiry = Expiry::Persist;
    let mut seen = false;
    let mut i = 0;
    while i < opts.len() {
        let o = &opts[i];
        let eq = |s: &str| o.eq_ignore_ascii_case(s.as_bytes());
        if eq("keepttl") && !seen {
            expiry = Expiry::KeepTtl;
            seen = true;
            i += 1;
            continue;
        }
        let unit = if eq("ex") {
            1000
        } else if eq("px") {
            1
        } else if eq("exat") {
            -1000
        } else if eq("pxat") {
            -1
        } else {
            // NX, XX, GET (reply-bearing or conditional), or a syntax error.
            return None;
        };
        if seen || i + 1 >= opts.len() {
            return None;
        }
        let n = parse_i64(&opts[i + 1])?;
        if n <= 0 {
            return None;
        }
        let at = match unit {
            1000 => now_ms.checked_add(seconds_to_ms(n)?)?,
            1 => now_ms.checked_add(n)?,
            -1000 => seconds_to_ms(n)?,
            _ => n,
        };
        expiry = Expiry::At(at);
        seen = true;
        i += 2;
    }
    Some(expiry)
}

/// At most how many bytes [`encode()`] writes for `pairs`: headers and
/// lengths take at most 32 bytes per argument, with up to 4 more arguments.
pub fn encoded_bound(args: &[Bytes], pairs: &[(usize, usize)]) -> usize {
    pairs
        .iter()
        .map(|&(k, v)| args[k].len() + args[v].len())
        .sum::<usize>()
        + 32 * (2 * pairs.len() + 4)
}

/// Commands at least this large get an allocation of their own rather
/// than a share of the connection's buffer.
const OWN_ALLOCATION: usize = 2 * 1024;
/// The connection buffer's chunk, shared by the small commands in it.
const SHARED_CHUNK: usize = 8 * 1024;

/// Encodes the upstream command for some of a plan's pairs; `need` is
/// their [`encoded_bound`], `raw` the request as the client sent it (a
/// plain `SET k v` goes upstream as it came: a copy, not an encoding).
/// Small commands are encoded into `buf` (a per-connection buffer: the
/// commands of many writes share its allocations) and split off; a large
/// one gets an allocation of exactly its size. A queued command keeps its
/// whole allocation alive, so a large write sharing an 8 KB chunk would pin
/// up to twice the bytes `--write-queue-max-bytes` charges it (measured with
/// `bench/stall.sh`: 4 KB values doubled the queue's real memory).
pub fn encode(
    plan: &WritePlan,
    args: &[Bytes],
    raw: &[u8],
    pairs: &[(usize, usize)],
    need: usize,
    buf: &mut BytesMut,
) -> Bytes {
    let raw = verbatim(plan, args).then_some(raw);
    if need >= OWN_ALLOCATION {
        let mut own = BytesMut::with_capacity(need);
        encode_into(plan, args, raw, pairs, &mut own);
        return own.freeze();
    }
    if buf.capacity() - buf.len() < need {
        buf.reserve(need.max(SHARED_CHUNK));
    }
    encode_into(plan, args, raw, pairs, buf);
    buf.split().freeze()
}

/// Whether the request itself is the upstream command: a `SET k v` with
/// no option (no expiry to rewrite, one pair). It is queued as the client
/// framed it, which Redis accepts and the queue reads keys back from
/// alike (`Write::keys`).
fn verbatim(plan: &WritePlan, args: &[Bytes]) -> bool {
    !plan.mset && plan.expiry == Expiry::Persist && args.len() == 3
}

fn encode_into(
    plan: &WritePlan,
    args: &[Bytes],
    raw: Option<&[u8]>,
    pairs: &[(usize, usize)],
    out: &mut BytesMut,
) {
    if let Some(raw) = raw {
        out.extend_from_slice(raw);
        return;
    }
    if plan.mset {
        encode::put_header(out, b'*', 1 + 2 * pairs.len() as i64);
        encode::put_bulk(out, b"MSET");
        for &(k, v) in pairs {
            encode::put_bulk(out, &args[k]);
            encode::put_bulk(out, &args[v]);
        }
        return;
    }
    let (k, v) = pairs[0];
    match plan.expiry {
        Expiry::Persist => encode::encode_command(out, &[b"SET".as_slice(), &args[k], &args[v]]),
        Expiry::KeepTtl => {
            encode::encode_command(out, &[b"SET".as_slice(), &args[k], &args[v], b"KEEPTTL"])
        }
        Expiry::At(ms) => {
            let mut b = itoa::Buffer::new();
            encode::encode_command(
                out,
                &[
                    b"SET".as_slice(),
                    &args[k],
                    &args[v],
                    b"PXAT",
                    b.format(ms).as_bytes(),
                ],
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<Bytes> {
        s.split(' ')
            .map(|a| Bytes::copy_from_slice(a.as_bytes()))
            .collect()
    }

    const NOW: i64 = 1_700_000_000_000;

    fn p(s: &str) -> Option<WritePlan> {
        let a = args(s);
        let name = String::from_utf8_lossy(&a[0]).to_ascii_lowercase();
        plan(&name, &a, NOW)
    }

    #[test]
    fn unconditional_sets_are_planned() {
        assert_eq!(p("SET k v").map(|p| p.expiry), Some(Expiry::Persist));
        assert_eq!(
            p("SET k v EX 10").map(|p| p.expiry),
            Some(Expiry::At(NOW + 10_000))
        );
        assert_eq!(
            p("SET k v px 5").map(|p| p.expiry),
            Some(Expiry::At(NOW + 5))
        );
        assert_eq!(
            p("SET k v EXAT 2000000000").map(|p| p.expiry),
            Some(Expiry::At(2_000_000_000_000))
        );
        assert_eq!(
            p("SET k v PXAT 123").map(|p| p.expiry),
            Some(Expiry::At(123))
        );
        assert_eq!(
            p("SET k v KEEPTTL").map(|p| p.expiry),
            Some(Expiry::KeepTtl)
        );
        assert_eq!(
            p("SETEX k 10 v").map(|p| (p.pairs.to_vec(), p.expiry)),
            Some((vec![(1, 3)], Expiry::At(NOW + 10_000)))
        );
        assert_eq!(
            p("PSETEX k 10 v").map(|p| p.expiry),
            Some(Expiry::At(NOW + 10))
        );
        assert_eq!(
            p("MSET a 1 b 2").map(|p| p.pairs.to_vec()),
            Some(vec![(1, 2), (3, 4)])
        );
    }

    #[test]
    fn everything_else_is_forwarded() {
        for s in [
            "SET k v NX",
            "SET k v XX",
            "SET k v GET",
            "SET k v EX 10 NX",
            "SET k v EX 0",
            "SET k v EX -1",
            "SET k v EX x",
            "SET k v EX",
            "SET k v EX 1 PX 1",
            "SET k v KEEPTTL EX 1",
            "SET k v BOGUS",
            "SET k v EX 9223372036854775807",
            "SETEX k 0 v",
            "SETEX k x v",
            "PSETEX k -5 v",
            "MSET a 1 b",
            "MSET a",
            "SETNX k v",
            "GETSET k v",
            "MSETNX a 1",
            "SET k",
        ] {
            assert_eq!(p(s), None, "{s}");
        }
    }

    #[test]
    fn rewrites_to_absolute_expiry() {
        let a = args("SET k v EX 10");
        let plan = p("SET k v EX 10").expect("planned");
        let cmd = encode(
            &plan,
            &a,
            b"(not used)",
            &plan.pairs,
            encoded_bound(&a, &plan.pairs),
            &mut BytesMut::new(),
        );
        assert_eq!(
            &cmd[..],
            format!(
                "*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$4\r\nPXAT\r\n$13\r\n{}\r\n",
                NOW + 10_000
            )
            .as_bytes()
        );
        let a = args("MSET a 1 b 2");
        let plan = p("MSET a 1 b 2").expect("planned");
        let cmd = encode(
            &plan,
            &a,
            b"(not used)",
            &plan.pairs[1..],
            encoded_bound(&a, &plan.pairs[1..]),
            &mut BytesMut::new(),
        );
        assert_eq!(&cmd[..], b"*3\r\n$4\r\nMSET\r\n$1\r\nb\r\n$1\r\n2\r\n");
    }

    /// The request as the parser gives it: its arguments are slices of it.
    fn parsed(wire: &[u8]) -> sidecache_resp::request::Request {
        let mut parser = sidecache_resp::request::Parser::new(sidecache_resp::request::Limits {
            max_bulk: 1 << 20,
            max_multibulk: 1024,
            inline_quotes: sidecache_resp::request::InlineQuotes::Strict,
        });
        let mut req = sidecache_resp::request::Request::default();
        let mut buf = BytesMut::from(wire);
        assert_eq!(parser.parse(&mut buf, &mut req), Ok(Some(())));
        req
    }

    fn encoded(wire: &[u8]) -> Bytes {
        let req = parsed(wire);
        let name = String::from_utf8_lossy(&req.args[0]).to_ascii_lowercase();
        let plan = plan(&name, &req.args, NOW).expect("planned");
        let need = encoded_bound(&req.args, &plan.pairs);
        encode(
            &plan,
            &req.args,
            &req.raw,
            &plan.pairs,
            need,
            &mut BytesMut::new(),
        )
    }

    #[test]
    fn a_plain_set_goes_upstream_as_sent() {
        let raw = b"*3\r\n$3\r\nset\r\n$1\r\nk\r\n$2\r\nvv\r\n";
        assert_eq!(&encoded(raw)[..], raw);
        // Lines ended by `\r` and any byte, as Redis reads them, go as
        // sent too, and the queue reads the same key back from them.
        for odd in [
            b"*3\r\n$3\rXset\r\n$1\r\nk\r\n$2\r\nvv\r\n".as_slice(),
            b"*3\r\n$3\r\nset\r\n$1\r\nk\r\n$2\r\nvvXY",
        ] {
            let cmd = encoded(odd);
            assert_eq!(&cmd[..], odd);
            let queued = sidecache_pool::Write {
                db: 0,
                slot: None,
                cmd,
                refill: false,
                cached: false,
            };
            assert_eq!(queued.keys().into_vec(), vec![Bytes::from("k")]);
        }
        // Anything with an option is rewritten, not copied.
        assert_eq!(
            &encoded(b"*4\r\n$3\r\nset\r\n$1\r\nk\r\n$1\r\nv\r\n$7\r\nkeepttl\r\n")[..],
            b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$7\r\nKEEPTTL\r\n"
        );
    }

    #[test]
    fn expiry_of_writes_with_a_time_to_live() {
        let a = |line: &str| -> Vec<Bytes> {
            line.split(' ')
                .map(|w| Bytes::copy_from_slice(w.as_bytes()))
                .collect()
        };
        let now = 1_000_000;
        assert_eq!(expires_at("set", &a("SET k v px 1"), now), Some(now + 1));
        assert_eq!(
            expires_at("set", &a("SET k v NX EX 2 GET"), now),
            Some(now + 2000)
        );
        assert_eq!(
            expires_at("set", &a("SET k v PXAT 1000500"), now),
            Some(1_000_500)
        );
        assert_eq!(expires_at("set", &a("SET k v EXAT 999"), now), None);
        assert_eq!(expires_at("set", &a("SET k v"), now), None);
        assert_eq!(expires_at("set", &a("SET k v KEEPTTL"), now), None);
        assert_eq!(
            expires_at("setex", &a("SETEX k 3 v"), now),
            Some(now + 3000)
        );
        assert_eq!(expires_at("psetex", &a("PSETEX k 0 v"), now), None);
        assert_eq!(expires_at("getex", &a("GETEX k PX 5"), now), Some(now + 5));
        assert_eq!(expires_at("getex", &a("GETEX k PERSIST"), now), None);
        assert_eq!(
            expires_at("expire", &a("EXPIRE k 10 NX"), now),
            Some(now + 10_000)
        );
        assert_eq!(expires_at("pexpire", &a("PEXPIRE k -1"), now), None);
        assert_eq!(
            expires_at("pexpireat", &a("PEXPIREAT k 2000000"), now),
            Some(2_000_000)
        );
        assert_eq!(expires_at("expire", &a("EXPIRE k x"), now), None);
        assert_eq!(expires_at("incr", &a("INCR k"), now), None);
    }
}
