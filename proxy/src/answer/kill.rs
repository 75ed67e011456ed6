//! `CLIENT KILL`, over sidecache's own clients, as Redis 7.0 and Valkey 9
//! answer it: the old form `CLIENT KILL addr:port` (`+OK`, or `-ERR No
//! such client`; a client may kill itself), and filters `ID`, `TYPE`,
//! `USER`, `ADDR`, `LADDR`, `SKIPME`, and where the upstream has them
//! `MAXAGE` and several ids after `ID` (the count killed), with the
//! upstream's own errors (Redis 7.0, Valkey 8.0 and 9 differ).
//!
//! A killed client's connection is closed as it next waits (for its
//! socket, or in a blocking command: its command is unblocked upstream);
//! closing releases what it held (a subscription, a transaction's or
//! WATCH's connection). Redis's own replication clients are not
//! sidecache's: `TYPE master` and `TYPE replica` match none. A `USER` is
//! known when it is `default`, some client of this sidecache
//! authenticated as it, or the upstream has it (`upstream_users`, which
//! the connection asks the upstream for with `ACL GETUSER`: see
//! [`named_users`]); any other answers `No such user`, as Redis does for
//! a user it lacks.

use bytes::Bytes;
use sidecache_resp::encode::Reply;
use sidecache_resp::int::parse_i64;

use super::{ClientState, Outcome};
use crate::state::clients::ClientEntry;
use crate::state::Shared;

/// What selects the clients to kill.
#[derive(Debug, Default)]
struct Filter {
    addr: Option<String>,
    laddr: Option<String>,
    /// Empty: any.
    ids: Vec<u64>,
    /// `Some(true)`: pubsub clients; `Some(false)`: normal ones; `None`
    /// with `none` set: a type no client of sidecache has.
    pubsub: Option<bool>,
    none: bool,
    user: Option<String>,
    max_age: Option<u64>,
    skip_me: bool,
}

impl Filter {
    fn matches(&self, id: u64, e: &ClientEntry, me: u64) -> bool {
        !self.none
            && self.addr.as_ref().is_none_or(|a| *a == e.addr)
            && self.laddr.as_ref().is_none_or(|a| *a == e.laddr)
            && (self.ids.is_empty() || self.ids.contains(&id))
            && self.pubsub.is_none_or(|p| p == e.subscribed())
            && self
                .user
                .as_ref()
                .is_none_or(|u| u == e.user.as_deref().unwrap_or("default"))
            && self
                .max_age
                .is_none_or(|m| e.created.elapsed().as_secs() > m)
            && !(self.skip_me && id == me)
    }
}

/// Where the upstream's CLIENT KILL differs from Redis 7.0's.
#[derive(Debug, Clone, Copy, Default)]
struct Dialect {
    /// `ID` takes one id or more (Valkey 8.1+), and the filters are not
    /// counted in pairs.
    many_ids: bool,
    /// `MAXAGE` is a filter (Redis 7.4+, Valkey 8+).
    max_age: bool,
}

impl Dialect {
    fn of(shared: &Shared) -> Dialect {
        let info = shared.upstream.server_info();
        Dialect {
            many_ids: info.is_at_least("valkey", 8, 1),
            max_age: info.is_at_least("valkey", 8, 0) || info.is_at_least("redis", 7, 4),
        }
    }
}

/// CLIENT KILL: kills the matching clients and answers as Redis does;
/// `Outcome::Close` when the caller killed itself (closed after the reply).
pub(super) fn kill(
    args: &[Bytes],
    st: &ClientState,
    shared: &Shared,
    r: &mut Reply<'_>,
    upstream_users: &[Bytes],
) -> Outcome {
    let argc = args.len();
    if argc < 3 {
        super::arity_error(r, "client|kill");
        return Outcome::Continue;
    }
    let old = argc == 3;
    let dialect = Dialect::of(shared);
    let filter = if old {
        Filter {
            addr: Some(String::from_utf8_lossy(&args[2]).into_owned()),
            ..Filter::default()
        }
    } else if dialect.many_ids || argc.is_multiple_of(2) {
        match parse(&args[2..], shared, dialect, upstream_users) {
            Ok(f) => f,
            Err(e) => {
                r.error(&e);
                return Outcome::Continue;
            }
        }
    } else {
        r.error("ERR syntax error");
        return Outcome::Continue;
    };
    let me = st.id;
    let (killed, myself) = shared.with_clients(|c| {
        let mut killed = 0i64;
        let mut myself = false;
        for (&id, e) in c.iter().filter(|(&id, e)| filter.matches(id, e, me)) {
            if id == me {
                myself = true;
            } else {
                e.kill.cancel();
            }
            killed += 1;
        }
        (killed, myself)
    });
    match (old, killed) {
        (true, 0) => r.error("ERR No such client"),
        (true, _) => r.ok(),
        (false, n) => r.int(n),
    }
    if myself {
        Outcome::Close
    } else {
        Outcome::Continue
    }
}

/// Whether a client of this sidecache authenticated as `user`.
fn local_user(shared: &Shared, user: &str) -> bool {
    shared.with_clients(|c| c.values().any(|e| e.user.as_deref() == Some(user)))
}

/// The users a CLIENT KILL's `USER` filters name that only the upstream
/// can say it has: not `default`, with no client of this sidecache.
pub fn named_users(args: &[Bytes], shared: &Shared) -> Vec<Bytes> {
    args.windows(2)
        .skip(2)
        .filter(|w| w[0].eq_ignore_ascii_case(b"user"))
        .map(|w| w[1].clone())
        .filter(|u| &u[..] != b"default" && !local_user(shared, &String::from_utf8_lossy(u)))
        .collect()
}

/// The new form's filters, with the upstream's errors.
fn parse(
    args: &[Bytes],
    shared: &Shared,
    dialect: Dialect,
    upstream_users: &[Bytes],
) -> Result<Filter, String> {
    let syntax = || "ERR syntax error".to_owned();
    let mut f = Filter {
        skip_me: true,
        ..Filter::default()
    };
    let mut i = 0;
    while i < args.len() {
        let Some(v) = args.get(i + 1) else {
            return Err(syntax());
        };
        let text = || String::from_utf8_lossy(v).into_owned();
        i += 2;
        match &args[i - 2].to_ascii_lowercase()[..] {
            // Redis 7.0 gives one error for 0 and for what is no integer;
            // Valkey 8.1+ takes every integer that follows.
            b"id" if dialect.many_ids => {
                i -= 1;
                while let Some(n) = args.get(i).and_then(|a| parse_i64(a)) {
                    if n < 1 {
                        return Err("ERR client-id should be greater than 0".into());
                    }
                    f.ids.push(n as u64);
                    i += 1;
                }
                if f.ids.is_empty() {
                    return Err(syntax());
                }
            }
            b"id" => match parse_i64(v) {
                Some(n) if n >= 1 => f.ids.push(n as u64),
                _ => return Err("ERR client-id should be greater than 0".into()),
            },
            b"type" => match &v.to_ascii_lowercase()[..] {
                b"normal" => f.pubsub = Some(false),
                b"pubsub" => f.pubsub = Some(true),
                b"master" | b"replica" | b"slave" => f.none = true,
                _ => return Err(format!("ERR Unknown client type '{}'", text())),
            },
            b"addr" => f.addr = Some(text()),
            b"laddr" => f.laddr = Some(text()),
            b"user" => {
                let user = text();
                let known = user == "default"
                    || local_user(shared, &user)
                    || upstream_users.iter().any(|u| u == v);
                if !known {
                    return Err(format!("ERR No such user '{user}'"));
                }
                f.user = Some(user);
            }
            b"skipme" => match &v.to_ascii_lowercase()[..] {
                b"yes" => f.skip_me = true,
                b"no" => f.skip_me = false,
                _ => return Err(syntax()),
            },
            b"maxage" if dialect.max_age => match parse_i64(v) {
                Some(n) if n > 0 => f.max_age = Some(n as u64),
                Some(_) => return Err("ERR maxage should be greater than 0".into()),
                None => return Err("ERR maxage is not an integer or out of range".into()),
            },
            _ => return Err(syntax()),
        }
    }
    Ok(f)
}
