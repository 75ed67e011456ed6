//! `SIDECACHE …`: commands about the proxy itself, answered by it.
//!
//! `SIDECACHE HOTKEYS [READS|MISSES|WRITES] [COUNT n] [DB n]`: the hottest
//! keys of a database (default: the connection's) as an array of
//! `[key, estimated count]` pairs, hottest first; the same shape in RESP2
//! and RESP3 (an array of two-element arrays, not a map, so the order is
//! kept by every client library). Default ranking `READS`, default `COUNT`
//! 10. `SIDECACHE HELP` lists them.

use bytes::Bytes;
use sidecache_resp::encode::Reply;
use sidecache_resp::int::parse_i64;

use super::arity_error;
use crate::metrics::hotkeys::Dimension;
use crate::state::Shared;

/// Default `COUNT` of SIDECACHE HOTKEYS.
const DEFAULT_COUNT: usize = 10;

/// What SIDECACHE HOTKEYS asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HotkeysQuery {
    pub by: Dimension,
    pub count: usize,
    pub db: u16,
}

/// Parses the arguments after `HOTKEYS` (pure; the error is the reply's
/// text).
pub(crate) fn parse_hotkeys(args: &[Bytes], db: u16) -> Result<HotkeysQuery, String> {
    let mut q = HotkeysQuery {
        by: Dimension::Reads,
        count: DEFAULT_COUNT,
        db,
    };
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if let Some(d) = Dimension::parse(a) {
            q.by = d;
            i += 1;
        } else if a.eq_ignore_ascii_case(b"count") || a.eq_ignore_ascii_case(b"db") {
            let Some(v) = args.get(i + 1) else {
                return Err("ERR syntax error".into());
            };
            let Some(n) = parse_i64(v) else {
                return Err("ERR value is not an integer or out of range".into());
            };
            if a.eq_ignore_ascii_case(b"count") {
                if n <= 0 {
                    return Err("ERR COUNT must be positive".into());
                }
                q.count = usize::try_from(n).unwrap_or(usize::MAX);
            } else {
                q.db = u16::try_from(n).map_err(|_| "ERR DB index is out of range".to_owned())?;
            }
            i += 2;
        } else {
            return Err("ERR syntax error".into());
        }
    }
    Ok(q)
}

/// Runs `SIDECACHE …` (`db`: the connection's database).
pub(super) fn run(args: &[Bytes], db: u16, shared: &Shared, r: &mut Reply<'_>) {
    let Some(sub) = args.get(1) else {
        return arity_error(r, "sidecache");
    };
    if sub.eq_ignore_ascii_case(b"hotkeys") {
        if !shared.hotkeys.enabled() {
            return r.error("ERR hot keys are off (--hotkeys-capacity 0)");
        }
        let q = match parse_hotkeys(&args[2..], db) {
            Ok(q) => q,
            Err(e) => return r.error(&e),
        };
        let top = shared.hotkeys.top(q.by, Some(q.db), q.count);
        r.array(top.len());
        for k in &top {
            r.array(2);
            r.bulk(&k.key);
            r.int(i64::try_from(k.count).unwrap_or(i64::MAX));
        }
    } else if sub.eq_ignore_ascii_case(b"help") {
        let lines = [
            "SIDECACHE <subcommand> [<arg> ...]. Subcommands are:",
            "HOTKEYS [READS|MISSES|WRITES] [COUNT <n>] [DB <db>]",
            "    The hottest keys by L1 lookups, L1 misses or writes, as [key, estimated count] pairs.",
            "HELP",
            "    Print this help.",
        ];
        r.help(&lines);
    } else {
        r.error(&format!(
            "ERR unknown subcommand '{}'. Try SIDECACHE HELP.",
            String::from_utf8_lossy(sub)
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<Bytes> {
        s.split_whitespace()
            .map(|a| Bytes::copy_from_slice(a.as_bytes()))
            .collect()
    }

    #[test]
    fn hotkeys_arguments() {
        let q = parse_hotkeys(&args(""), 2).expect("defaults");
        assert_eq!(
            q,
            HotkeysQuery {
                by: Dimension::Reads,
                count: 10,
                db: 2
            }
        );
        let q = parse_hotkeys(&args("misses COUNT 3"), 0).expect("valid");
        assert_eq!((q.by, q.count), (Dimension::Misses, 3));
        let q = parse_hotkeys(&args("count 5 WRITES db 1"), 0).expect("valid");
        assert_eq!((q.by, q.count, q.db), (Dimension::Writes, 5, 1));
        for (bad, why) in [
            ("sizes", "ERR syntax error"),
            ("COUNT", "ERR syntax error"),
            ("COUNT x", "ERR value is not an integer or out of range"),
            ("COUNT 0", "ERR COUNT must be positive"),
            ("DB -1", "ERR DB index is out of range"),
        ] {
            assert_eq!(parse_hotkeys(&args(bad), 0).expect_err(bad), why, "{bad}");
        }
    }
}
