//! Commands the proxy answers itself: connection and session commands that
//! must not reach a shared upstream connection (PING, ECHO, QUIT, SELECT,
//! HELLO, AUTH, CLIENT …, RESET), with Redis's replies and error texts; and
//! the proxy's own, `SIDECACHE HOTKEYS` (`sidecache` below).

use bytes::{Bytes, BytesMut};
use sidecache_pool::Proto;
use sidecache_resp::encode::Reply;
use sidecache_resp::int::parse_i64;

use crate::state::clients::{ClientEntry, Fields, Line};
use crate::state::users::{self, Login};
use crate::state::Shared;
use crate::tracking::command as tracking;

mod kill;
mod sidecache;
pub use crate::cmd::local::Local;
pub use kill::named_users;

/// Per-connection session state.
#[derive(Debug)]
pub struct ClientState {
    /// Client id (CLIENT ID).
    pub id: u64,
    /// Selected database.
    pub db: u16,
    /// Protocol version.
    pub proto: Proto,
    /// Whether AUTH succeeded (always true without `--requirepass`).
    pub authenticated: bool,
    /// Registry entry (CLIENT LIST).
    pub entry: ClientEntry,
    /// CLIENT REPLY: replies are written (`On`), dropped (`Off`), or
    /// dropped for this many more commands (`Skip`).
    pub reply: ReplyMode,
    /// CLIENT TRACKING.
    pub tracking: tracking::Tracking,
    /// The ACL user this client authenticated as, when not the
    /// `--upstream` one: its commands run on that user's connections
    /// (`None`: the shared ones, the L1 and write-behind).
    pub user: Option<Login>,
}

/// The upstream's verdict on credentials only it can check
/// ([`users::Check::Upstream`]), taken before the AUTH or HELLO runs.
#[derive(Debug)]
pub enum Verified {
    /// Accepted: the user is the `--upstream` one (`None`) or another.
    Accepted(Option<Login>),
    /// Refused: the error reply's text (`WRONGPASS …`).
    Refused(String),
}

/// The state CLIENT REPLY sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplyMode {
    /// Every reply is written (the default).
    #[default]
    On,
    /// No reply is written until CLIENT REPLY ON.
    Off,
    /// The replies of the next this many commands (this one included) are
    /// dropped.
    Skip(u8),
}

/// What the connection does after a local command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Go on reading.
    Continue,
    /// Close after the replies so far are written.
    Close,
}

/// `-ERR wrong number of arguments for '<name>' command`.
pub fn arity_error(r: &mut Reply<'_>, name: &str) {
    r.error(&format!(
        "ERR wrong number of arguments for '{name}' command"
    ));
}

/// Whether `args` are a CLIENT KILL.
pub fn is_kill(args: &[Bytes]) -> bool {
    args.get(1).is_some_and(|s| s.eq_ignore_ascii_case(b"kill"))
}

/// CLIENT KILL, its `USER` filters also matching `upstream_users` (users
/// the upstream said it has; see [`kill::named_users`]).
pub fn client_kill(
    args: &[Bytes],
    st: &ClientState,
    shared: &Shared,
    out: &mut BytesMut,
    upstream_users: &[Bytes],
) -> Outcome {
    let mut r = Reply {
        out,
        proto: st.proto,
    };
    kill::kill(args, st, shared, &mut r, upstream_users)
}

/// Runs a local command, writing its reply to `out`.
pub fn run(
    cmd: Local,
    args: &[Bytes],
    st: &mut ClientState,
    shared: &Shared,
    out: &mut BytesMut,
    verified: Option<Verified>,
) -> Outcome {
    let mut r = Reply {
        out,
        proto: st.proto,
    };
    match cmd {
        Local::Ping => match args.len() {
            1 => r.status("PONG"),
            2 => r.bulk(&args[1]),
            _ => arity_error(&mut r, "ping"),
        },
        Local::Echo => match args.len() {
            2 => r.bulk(&args[1]),
            _ => arity_error(&mut r, "echo"),
        },
        Local::Quit => {
            r.ok();
            return Outcome::Close;
        }
        Local::Select => select(args, st, shared, &mut r),
        Local::Auth => auth(args, st, shared, &mut r, verified),
        Local::Hello => hello(args, st, shared, out, verified),
        Local::Client if is_kill(args) => {
            return kill::kill(args, st, shared, &mut r, &[]);
        }
        Local::Client => client(args, st, shared, &mut r),
        Local::Reset => {
            st.db = 0;
            st.proto = Proto::Resp2;
            st.authenticated = shared.config.requirepass.is_none();
            // Back to the default user: the shared connections.
            st.user = None;
            st.entry.name.clear();
            st.entry.db = 0;
            st.entry.resp = 2;
            st.tracking = tracking::Tracking::default();
            publish(st, shared);
            Reply {
                out,
                proto: st.proto,
            }
            .status("RESET");
        }
        Local::ClusterDisabled => r.error("ERR This instance has cluster support disabled"),
        Local::Sidecache => sidecache::run(args, st.db, shared, &mut r),
    }
    Outcome::Continue
}

fn publish(st: &ClientState, shared: &Shared) {
    shared.with_clients(|c| {
        c.insert(st.id, st.entry.clone());
    });
}

fn select(args: &[Bytes], st: &mut ClientState, shared: &Shared, r: &mut Reply<'_>) {
    if args.len() != 2 {
        return arity_error(r, "select");
    }
    let Some(db) = parse_i64(&args[1]) else {
        return r.error("ERR value is not an integer or out of range");
    };
    let info = shared.upstream.server_info();
    // Valkey 9 numbers a cluster's databases (`cluster-databases`, 1 by
    // default) and answers a SELECT past them as out of range; Redis and
    // older Valkey refuse any database but 0 in cluster mode.
    if info.cluster && db != 0 && !info.is_at_least("valkey", 9, 0) {
        return r.error("ERR SELECT is not allowed in cluster mode");
    }
    let dbs = i64::from(info.databases);
    if db < 0 || db >= dbs || db > i64::from(u16::MAX) {
        return r.error("ERR DB index is out of range");
    }
    st.db = db as u16;
    st.entry.db = st.db;
    publish(st, shared);
    r.ok();
}

/// Checks credentials: against `--requirepass` as Redis's default user,
/// or by the upstream's verdict, `verified` (see [`users::check`]). On
/// success, the user to run as (`None`: the shared connections).
fn check_auth(
    user: Option<&[u8]>,
    pass: &[u8],
    shared: &Shared,
    verified: Option<Verified>,
) -> Result<Option<Login>, String> {
    let requirepass = shared.config.requirepass.as_deref();
    match users::check(user, pass, requirepass, shared.users.enabled()) {
        users::Check::Local(r) => r.map(|()| None).map_err(str::to_owned),
        users::Check::Upstream => match verified {
            Some(Verified::Accepted(login)) => Ok(login),
            Some(Verified::Refused(e)) => Err(e),
            None => Err("ERR sidecache: credentials were not checked upstream".into()),
        },
    }
}

/// The credentials of an AUTH or HELLO … AUTH, if it has them (for the
/// upstream check that comes before it runs).
pub fn credentials(cmd: Local, args: &[Bytes]) -> Option<(Option<&Bytes>, &Bytes)> {
    match cmd {
        Local::Auth if args.len() == 2 => Some((None, &args[1])),
        Local::Auth if args.len() == 3 => Some((Some(&args[1]), &args[2])),
        Local::Hello => {
            // The last AUTH option wins, as in `hello`.
            let mut found = None;
            let mut i = 2;
            while i < args.len() {
                if args[i].eq_ignore_ascii_case(b"AUTH") && i + 2 < args.len() {
                    found = Some((Some(&args[i + 1]), &args[i + 2]));
                    i += 3;
                } else {
                    i += 2;
                }
            }
            found
        }
        _ => None,
    }
}

fn auth(
    args: &[Bytes],
    st: &mut ClientState,
    shared: &Shared,
    r: &mut Reply<'_>,
    verified: Option<Verified>,
) {
    let result = match args.len() {
        2 => check_auth(None, &args[1], shared, verified),
        3 => check_auth(Some(&args[1]), &args[2], shared, verified),
        0 | 1 => return arity_error(r, "auth"),
        _ => return r.error("ERR syntax error"),
    };
    match result {
        Ok(login) => {
            st.authenticated = true;
            st.user = login;
            r.ok();
        }
        Err(e) => r.error(&e),
    }
}

fn hello(
    args: &[Bytes],
    st: &mut ClientState,
    shared: &Shared,
    out: &mut BytesMut,
    verified: Option<Verified>,
) {
    let mut r = Reply {
        out,
        proto: st.proto,
    };
    let mut proto = st.proto;
    let mut i = 1;
    if args.len() >= 2 {
        match parse_i64(&args[1]) {
            Some(2) => proto = Proto::Resp2,
            Some(3) => proto = Proto::Resp3,
            Some(_) => return r.error("NOPROTO unsupported protocol version"),
            None => return r.error("ERR Protocol version is not an integer or out of range"),
        }
        i = 2;
    }
    let mut creds = None;
    let mut name = None;
    while i < args.len() {
        let more = args.len() - i - 1;
        if args[i].eq_ignore_ascii_case(b"AUTH") && more >= 2 {
            creds = Some((args[i + 1].clone(), args[i + 2].clone()));
            i += 3;
        } else if args[i].eq_ignore_ascii_case(b"SETNAME") && more >= 1 {
            name = Some(args[i + 1].clone());
            i += 2;
        } else {
            return r.error(&format!(
                "ERR Syntax error in HELLO option '{}'",
                String::from_utf8_lossy(&args[i])
            ));
        }
    }
    if let Some((u, p)) = &creds {
        match check_auth(Some(u), p, shared, verified) {
            Ok(login) => {
                st.authenticated = true;
                st.user = login;
            }
            Err(e) => return r.error(&e),
        }
    }
    if !st.authenticated {
        return r.error("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time");
    }
    if let Some(n) = &name {
        if !valid_name(n) {
            return r
                .error("ERR Client names cannot contain spaces, newlines or special characters.");
        }
        st.entry.name = String::from_utf8_lossy(n).into_owned();
    }
    st.proto = proto;
    st.entry.resp = if proto == Proto::Resp3 { 3 } else { 2 };
    publish(st, shared);
    let mut r = Reply { out, proto };
    let info = shared.upstream.server_info();
    if info.hello.is_empty() {
        // A seed without HELLO (Redis before 6): Redis's fields.
        r.map(7);
        r.bulk(b"server");
        r.bulk(b"redis");
        r.bulk(b"version");
        r.bulk(info.version.as_bytes());
        hello_own_fields(&mut r, st.id, proto);
        r.bulk(b"modules");
        r.array(0);
        return;
    }
    // The upstream's own fields in its order (`server` and `version` as
    // the engine names itself, e.g. `valkey` `9.1.2`; its modules;
    // Valkey's `availability_zone`), with the connection's own fields in
    // the place of the upstream's.
    let own = |f: &[u8]| matches!(f, b"proto" | b"id" | b"mode" | b"role");
    let theirs = info.hello.iter().filter(|(f, _)| !own(f)).count();
    r.map(theirs + 4);
    let mut own_written = false;
    for (field, value) in &info.hello {
        if !own(field) {
            r.bulk(field);
            r.value(value);
        } else if !own_written {
            hello_own_fields(&mut r, st.id, proto);
            own_written = true;
        }
    }
    if !own_written {
        hello_own_fields(&mut r, st.id, proto);
    }
}

/// HELLO's `proto`, `id`, `mode` and `role`: this connection's, and
/// sidecache shows itself as a standalone master whatever it fronts.
fn hello_own_fields(r: &mut Reply<'_>, id: u64, proto: Proto) {
    r.bulk(b"proto");
    r.int(if proto == Proto::Resp3 { 3 } else { 2 });
    r.bulk(b"id");
    r.int(id as i64);
    r.bulk(b"mode");
    r.bulk(b"standalone");
    r.bulk(b"role");
    r.bulk(b"master");
}

fn valid_name(n: &[u8]) -> bool {
    n.iter().all(|&c| (b'!'..=b'~').contains(&c))
}

fn client(args: &[Bytes], st: &mut ClientState, shared: &Shared, r: &mut Reply<'_>) {
    if args.len() < 2 {
        return arity_error(r, "client");
    }
    let sub = args[1].to_ascii_lowercase();
    let argc = args.len();
    let wrong =
        |r: &mut Reply<'_>| arity_error(r, &format!("client|{}", String::from_utf8_lossy(&sub)));
    match &sub[..] {
        b"id" if argc == 2 => r.int(st.id as i64),
        b"getname" if argc == 2 => {
            if st.entry.name.is_empty() {
                r.nil();
            } else {
                r.bulk(st.entry.name.as_bytes());
            }
        }
        b"setname" if argc == 3 => {
            if !valid_name(&args[2]) {
                return r.error(
                    "ERR Client names cannot contain spaces, newlines or special characters.",
                );
            }
            st.entry.name = String::from_utf8_lossy(&args[2]).into_owned();
            publish(st, shared);
            r.ok();
        }
        b"setinfo" if argc == 4 => {
            let attr = args[2].to_ascii_lowercase();
            let field = match &attr[..] {
                b"lib-name" => &mut st.entry.lib_name,
                b"lib-ver" => &mut st.entry.lib_ver,
                _ => {
                    return r.error(&format!(
                        "ERR Unrecognized option '{}'",
                        String::from_utf8_lossy(&args[2])
                    ))
                }
            };
            if !valid_name(&args[3]) && !args[3].is_empty() {
                return r.error(&format!(
                    "ERR {} cannot contain spaces, newlines or special characters.",
                    String::from_utf8_lossy(&attr)
                ));
            }
            *field = String::from_utf8_lossy(&args[3]).into_owned();
            publish(st, shared);
            r.ok();
        }
        b"info" if argc == 2 => {
            let how = Line {
                fields: Fields::of(shared.upstream.server_info()),
                table: &shared.table,
                blocked: &[],
                current: Some((st.id, "client|info")),
                qbuf: resp_len(args),
            };
            r.verbatim(st.entry.line(st.id, &how).as_bytes());
        }
        b"list" => {
            // CLIENT LIST [TYPE normal] [ID id …]: a blocked client shows
            // flags=b, as on Redis.
            let mut ids: Option<Vec<u64>> = None;
            // TYPE pubsub (true) or normal (false).
            let mut kind: Option<bool> = None;
            let mut i = 2;
            while i < argc {
                let opt = args[i].to_ascii_lowercase();
                if opt == b"id" && i + 1 < argc {
                    let mut v = Vec::new();
                    for a in &args[i + 1..] {
                        match std::str::from_utf8(a)
                            .ok()
                            .and_then(|a| a.parse::<u64>().ok())
                        {
                            Some(id) if id > 0 => v.push(id),
                            _ => return r.error("ERR Invalid client ID"),
                        }
                    }
                    ids = Some(v);
                    break;
                } else if opt == b"type" && i + 1 < argc {
                    let t = args[i + 1].to_ascii_lowercase();
                    if !matches!(
                        &t[..],
                        b"normal" | b"master" | b"replica" | b"slave" | b"pubsub"
                    ) {
                        return r.error(&format!(
                            "ERR Unknown client type '{}'",
                            String::from_utf8_lossy(&args[i + 1])
                        ));
                    }
                    kind = Some(t == b"pubsub");
                    if t != b"normal" && t != b"pubsub" {
                        ids = Some(Vec::new());
                    }
                    i += 2;
                } else {
                    return r.error("ERR syntax error");
                }
            }
            let blocked: Vec<u64> = shared
                .blocked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .keys()
                .copied()
                .collect();
            let how = Line {
                fields: Fields::of(shared.upstream.server_info()),
                table: &shared.table,
                blocked: &blocked,
                current: Some((st.id, "client|list")),
                qbuf: resp_len(args),
            };
            let text = shared.with_clients(|c| {
                c.iter()
                    .filter(|(id, _)| ids.as_ref().is_none_or(|v| v.contains(id)))
                    .filter(|(_, e)| kind.is_none_or(|k| k == e.subscribed()))
                    .map(|(id, e)| e.line(*id, &how))
                    .collect::<String>()
            });
            r.verbatim(text.as_bytes());
        }
        b"no-evict" | b"no-touch" if argc == 3 => {
            if args[2].eq_ignore_ascii_case(b"on") || args[2].eq_ignore_ascii_case(b"off") {
                r.ok();
            } else {
                r.error("ERR syntax error");
            }
        }
        b"reply" if argc == 3 => {
            let mode = &args[2];
            if mode.eq_ignore_ascii_case(b"on") {
                st.reply = ReplyMode::On;
                r.ok();
            } else if mode.eq_ignore_ascii_case(b"off") {
                // Its own reply is dropped too.
                st.reply = ReplyMode::Off;
                r.ok();
            } else if mode.eq_ignore_ascii_case(b"skip") {
                // This command's reply and the next one's.
                if st.reply == ReplyMode::On {
                    st.reply = ReplyMode::Skip(2);
                }
                r.ok();
            } else {
                r.error("ERR syntax error");
            }
        }
        // Test hook for panic isolation (tests/hardening.rs): only when the
        // process was started with SIDECACHE_TEST_PANIC=1.
        b"sidecache-test-panic" if shared.test_panic => {
            panic!("CLIENT SIDECACHE-TEST-PANIC (SIDECACHE_TEST_PANIC=1)");
        }
        b"help" => {
            let lines: [&str; 8] = [
                "CLIENT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "ID",
                "GETNAME",
                "SETNAME <name>",
                "SETINFO <LIB-NAME|LIB-VER> <value>",
                "INFO",
                "LIST",
                "(answered by sidecache)",
            ];
            r.help(&lines);
        }
        b"id" | b"getname" | b"setname" | b"setinfo" | b"info" | b"no-evict" | b"no-touch" => {
            wrong(r)
        }
        b"tracking" => {
            let exists = |id: u64| shared.with_clients(|c| c.contains_key(&id));
            tracking::tracking(args, &mut st.tracking, exists, r);
        }
        b"caching" => tracking::caching(args, &mut st.tracking, r),
        b"getredir" if argc == 2 => tracking::getredir(&st.tracking, r),
        b"trackinginfo" if argc == 2 => {
            let redirect = st.tracking.redirect;
            let gone = redirect != 0 && !shared.with_clients(|c| c.contains_key(&redirect));
            tracking::trackinginfo(&st.tracking, gone, r);
        }
        b"getredir" | b"trackinginfo" => wrong(r),
        // CLIENT PAUSE timeout [WRITE|ALL] over sidecache's own clients
        // (`crate::state::pause`).
        b"pause" if argc == 3 || argc == 4 => {
            let all = match args.get(3).map(|m| m.to_ascii_lowercase()) {
                None => true,
                Some(m) if m == b"all" => true,
                Some(m) if m == b"write" => false,
                Some(_) => return r.error("ERR CLIENT PAUSE mode must be WRITE or ALL"),
            };
            match parse_i64(&args[2]) {
                Some(ms) if ms >= 0 => {
                    // Redis takes any length; past 2^40 ms (35 years) it is
                    // for ever here, and an Instant can hold its end.
                    let ms = ms.min(1 << 40) as u64;
                    shared
                        .pause
                        .pause(std::time::Duration::from_millis(ms), all);
                    r.ok();
                }
                Some(_) => r.error("ERR timeout is negative"),
                None => r.error("ERR timeout is not an integer or out of range"),
            }
        }
        b"pause" if argc == 2 => wrong(r),
        b"unpause" if argc == 2 => {
            shared.pause.unpause();
            r.ok();
        }
        b"unpause" => wrong(r),
        b"pause" => r.error(&format!(
            "ERR unknown subcommand or wrong number of arguments for '{}'. Try CLIENT HELP.",
            String::from_utf8_lossy(&args[1])
        )),
        b"unblock" => r.error(&format!(
            "ERR CLIENT {} is not supported by sidecache",
            String::from_utf8_lossy(&args[1]).to_ascii_uppercase()
        )),
        _ => r.error(&format!(
            "ERR unknown subcommand '{}'. Try CLIENT HELP.",
            String::from_utf8_lossy(&args[1])
        )),
    }
}

/// The size of `args` as one RESP command (`*2\r\n$6\r\nclient\r\n…`):
/// the running client's `qbuf` in CLIENT LIST.
fn resp_len(args: &[Bytes]) -> usize {
    let mut out = BytesMut::new();
    sidecache_resp::encode::encode_command(&mut out, args);
    out.len()
}
