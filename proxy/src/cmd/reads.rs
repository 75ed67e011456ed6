//! The reads the L1 caches beyond GET and MGET (`--l1-commands`), and the
//! shape of each one's reply.
//!
//! Each is a read-only command of one key whose reply depends on nothing
//! but that key's value and its own arguments: no randomness (SRANDMEMBER,
//! HRANDFIELD are left out), no clock, no other key. So a cached reply is
//! right until the key changes, and every change of the key reaches the L1
//! as an invalidation of the key (Redis's tracking, sidecache's own
//! writes, expiry, FLUSH*), which drops all of the key's cached reads at
//! once (`sidecache_l1::cache` keeps them in the key's entry).

use bytes::Bytes;
use sidecache_resp::shape::Shape;

/// One cacheable read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRule {
    /// Its reply's shape.
    shape: Shape,
    /// Whether a `WITHSCORES` argument (from the 4th on) makes the reply
    /// scored pairs.
    scores: bool,
    /// Exactly this many arguments (EXISTS: one key only), or any.
    argc: Option<usize>,
}

impl ReadRule {
    /// The shape of this call's reply, or `None` when this call is not
    /// cached (EXISTS of several keys).
    pub fn shape(&self, args: &[Bytes]) -> Option<Shape> {
        if self.argc.is_some_and(|n| n != args.len()) || args.len() < 2 {
            return None;
        }
        if self.scores
            && args
                .iter()
                .skip(4)
                .any(|a| a.eq_ignore_ascii_case(b"WITHSCORES"))
        {
            return Some(Shape::Scored);
        }
        Some(self.shape)
    }
}

const fn rule(shape: Shape) -> ReadRule {
    ReadRule {
        shape,
        scores: false,
        argc: None,
    }
}

const fn range() -> ReadRule {
    ReadRule {
        shape: Shape::Plain,
        scores: true,
        argc: None,
    }
}

/// Every read the L1 can cache besides GET and MGET, by lower-case name.
pub const READS: &[(&str, ReadRule)] = &[
    ("getrange", rule(Shape::Plain)),
    ("substr", rule(Shape::Plain)),
    ("strlen", rule(Shape::Plain)),
    (
        "exists",
        ReadRule {
            shape: Shape::Plain,
            scores: false,
            argc: Some(2),
        },
    ),
    ("type", rule(Shape::Plain)),
    ("hget", rule(Shape::Plain)),
    ("hmget", rule(Shape::Plain)),
    ("hgetall", rule(Shape::Map)),
    ("hexists", rule(Shape::Plain)),
    ("hlen", rule(Shape::Plain)),
    ("hkeys", rule(Shape::Plain)),
    ("hvals", rule(Shape::Plain)),
    ("hstrlen", rule(Shape::Plain)),
    ("smembers", rule(Shape::Set)),
    ("sismember", rule(Shape::Plain)),
    ("smismember", rule(Shape::Plain)),
    ("scard", rule(Shape::Plain)),
    ("zrange", range()),
    ("zrevrange", range()),
    ("zrangebyscore", range()),
    ("zrevrangebyscore", range()),
    ("zrangebylex", rule(Shape::Plain)),
    ("zrevrangebylex", rule(Shape::Plain)),
    ("zscore", rule(Shape::Double)),
    ("zmscore", rule(Shape::Doubles)),
    ("zcard", rule(Shape::Plain)),
    ("zcount", rule(Shape::Plain)),
    ("zlexcount", rule(Shape::Plain)),
    ("lrange", rule(Shape::Plain)),
    ("llen", rule(Shape::Plain)),
    ("lindex", rule(Shape::Plain)),
];

/// Reads the L1 does not cache whose RESP3 reply shows in RESP2 as Redis
/// shows it there without knowing the command (integers, strings and
/// arrays of them, nils of strings): a RESP2 tracking client's read of one
/// may take a RESP3 fill lane. Left out: replies with pairs (`HRANDFIELD
/// … WITHVALUES`, `ZRANDMEMBER … WITHSCORES`), a nil array in RESP2
/// (`GEOPOS`, `ZRANK … WITHSCORE`), or maps shown otherwise (`XREAD`).
const PLAIN_READS: &[&str] = &[
    "bitcount",
    "bitfield_ro",
    "bitpos",
    "dump",
    "expiretime",
    "geohash",
    "getbit",
    "lcs",
    "lpos",
    "object|encoding",
    "object|freq",
    "object|idletime",
    "object|refcount",
    "pexpiretime",
    "pttl",
    "sintercard",
    "sort_ro",
    "srandmember",
    "ttl",
    "xlen",
    "xrange",
    "xrevrange",
    "zintercard",
];

/// The shape of a read's reply (`name`, lower-case, as the command table
/// names it), when sidecache can show its RESP3 reply in RESP2 exactly as
/// Redis would: a cacheable read, GET, MGET, or one of [`PLAIN_READS`].
pub fn resp2_shape(name: &str, args: &[Bytes]) -> Option<Shape> {
    match name {
        "get" | "mget" | "exists" => Some(Shape::Plain),
        _ if PLAIN_READS.contains(&name) => Some(Shape::Plain),
        _ => rule_for(name).and_then(|r| r.shape(args)),
    }
}

/// The rule of a cacheable read.
pub fn rule_for(name: &str) -> Option<ReadRule> {
    READS.iter().find(|(n, _)| *n == name).map(|&(_, r)| r)
}

/// What `--l1-commands` allows: every name lower-case and known.
///
/// # Errors
/// The first name that is neither `all`, `get`, `mget` nor a cacheable
/// read, with the list of those.
pub fn parse_allowed(list: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let lower = name.to_ascii_lowercase();
        if lower == "all" {
            out.extend(READS.iter().map(|(n, _)| (*n).to_owned()));
        } else if lower == "get" || lower == "mget" {
            // Always cached while the L1 is on.
        } else if rule_for(&lower).is_some() {
            out.push(lower);
        } else {
            let known: Vec<&str> = READS.iter().map(|(n, _)| *n).collect();
            return Err(format!(
                "{name} is not a read the L1 can cache (all, get, mget, {})",
                known.join(", ")
            ));
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// A read's signature: the command's table id and its arguments after
/// the key, each after its length. Built on a miss only.
pub fn signature(id: u16, args: &[Bytes]) -> Bytes {
    let rest = args.get(2..).unwrap_or_default();
    let mut sig = Vec::with_capacity(2 + rest.iter().map(|a| 4 + a.len()).sum::<usize>());
    sig.extend_from_slice(&id.to_le_bytes());
    for a in rest {
        sig.extend_from_slice(&(a.len() as u32).to_le_bytes());
        sig.extend_from_slice(a);
    }
    sig.into()
}

/// Whether `sig` is the signature of (`id`, `args`): compared in place,
/// with no allocation (the hit path).
pub fn matches(sig: &[u8], id: u16, args: &[Bytes]) -> bool {
    let Some((head, mut rest)) = sig.split_first_chunk::<2>() else {
        return false;
    };
    if u16::from_le_bytes(*head) != id {
        return false;
    }
    for a in args.get(2..).unwrap_or_default() {
        let Some((len, tail)) = rest.split_first_chunk::<4>() else {
            return false;
        };
        let len = u32::from_le_bytes(*len) as usize;
        if len != a.len() || tail.get(..len) != Some(&a[..]) {
            return false;
        }
        rest = &tail[len..];
    }
    rest.is_empty()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<Bytes> {
        line.split(' ')
            .map(|s| Bytes::copy_from_slice(s.as_bytes()))
            .collect()
    }

    #[test]
    fn signatures_match_their_own_call_only() {
        let a = args("HMGET h f1 f2");
        let sig = signature(7, &a);
        assert!(matches(&sig, 7, &a));
        assert!(!matches(&sig, 8, &a));
        assert!(!matches(&sig, 7, &args("HMGET h f1")));
        assert!(!matches(&sig, 7, &args("HMGET h f1 f2 f3")));
        assert!(!matches(&sig, 7, &args("HMGET h f1 f3")));
        // Lengths keep arguments apart: "a b" is not "ab".
        assert!(!matches(
            &signature(1, &args("X k ab")),
            1,
            &args("X k a b")
        ));
        assert!(matches(&signature(1, &args("X k")), 1, &args("X k")));
        assert!(!matches(b"", 1, &args("X k")));
    }

    #[test]
    fn resp2_shapes_are_known_or_refused() {
        assert_eq!(
            resp2_shape("getbit", &args("GETBIT k 1")),
            Some(Shape::Plain)
        );
        assert_eq!(
            resp2_shape("exists", &args("EXISTS k j")),
            Some(Shape::Plain)
        );
        assert_eq!(resp2_shape("hgetall", &args("HGETALL h")), Some(Shape::Map));
        assert_eq!(
            resp2_shape("zrange", &args("ZRANGE z 0 -1 WITHSCORES")),
            Some(Shape::Scored)
        );
        assert_eq!(resp2_shape("geopos", &args("GEOPOS g m")), None);
        assert_eq!(
            resp2_shape("zrandmember", &args("ZRANDMEMBER z 2 WITHSCORES")),
            None
        );
        assert_eq!(resp2_shape("xread", &args("XREAD STREAMS s 0")), None);
    }

    #[test]
    fn shapes_follow_the_arguments() {
        let z = rule_for("zrange").unwrap();
        assert_eq!(z.shape(&args("ZRANGE z 0 -1")), Some(Shape::Plain));
        assert_eq!(
            z.shape(&args("ZRANGE z 0 -1 withscores")),
            Some(Shape::Scored)
        );
        assert_eq!(
            z.shape(&args("ZRANGE z 0 10 BYSCORE REV LIMIT 0 1 WITHSCORES")),
            Some(Shape::Scored)
        );
        let e = rule_for("exists").unwrap();
        assert_eq!(e.shape(&args("EXISTS k")), Some(Shape::Plain));
        assert_eq!(e.shape(&args("EXISTS k j")), None);
        assert_eq!(
            rule_for("hgetall").unwrap().shape(&args("HGETALL h")),
            Some(Shape::Map)
        );
        assert!(rule_for("srandmember").is_none());
    }

    #[test]
    fn the_allow_list_is_checked() {
        assert_eq!(parse_allowed("all").unwrap().len(), READS.len());
        assert_eq!(
            parse_allowed("GET, HGETALL,hgetall").unwrap(),
            vec!["hgetall"]
        );
        assert!(parse_allowed("get").unwrap().is_empty());
        let e = parse_allowed("hgetall,srandmember").unwrap_err();
        assert!(e.contains("srandmember is not a read"), "{e}");
    }
}
