//! The client registry's entries: what CLIENT LIST, CLIENT INFO and CLIENT
//! KILL see of each client, and the line Redis prints for one.
//!
//! An entry is a snapshot, published again on the rare events that change
//! it (SETNAME, SELECT, HELLO, a subscription). What changes with every
//! batch (idle time, traffic, the last command) lives in its [`Activity`],
//! which the connection updates without locks and every clone shares.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::cmd::table::CommandTable;

/// What the connection updates as it goes (single writer, relaxed):
/// CLIENT LIST's `idle`, `cmd`, `tot-net-in`, `tot-net-out` and `tot-cmds`.
#[derive(Debug)]
pub struct Activity {
    /// Seconds from the connect to the client's latest read.
    read_at: AtomicU64,
    /// Bytes read from the client.
    net_in: AtomicU64,
    /// Bytes written to the client.
    net_out: AtomicU64,
    /// Commands of the batches answered.
    cmds: AtomicU64,
    /// The last command of the latest batch ([`CommandTable::full_name`]'s
    /// index; [`NO_COMMAND`] before the first, or for an unknown one).
    last: AtomicU32,
}

/// [`Activity`]'s last command before any (Redis's `cmd=NULL`).
pub const NO_COMMAND: u32 = u32::MAX;

impl Default for Activity {
    fn default() -> Activity {
        Activity {
            read_at: AtomicU64::new(0),
            net_in: AtomicU64::new(0),
            net_out: AtomicU64::new(0),
            cmds: AtomicU64::new(0),
            last: AtomicU32::new(NO_COMMAND),
        }
    }
}

/// Adds to a counter only its connection writes: a load and a store, no
/// locked read-modify-write.
#[inline]
fn add(counter: &AtomicU64, n: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(n),
        Ordering::Relaxed,
    );
}

impl Activity {
    /// `n` bytes written to the client.
    #[inline]
    pub fn wrote(&self, n: usize) {
        add(&self.net_out, n as u64);
    }

    /// A batch answered: the commands it ran and the client's last
    /// command (`NO_COMMAND` after an unknown one, as on Redis).
    #[inline]
    pub fn answered(&self, commands: u64, last: u32) {
        add(&self.cmds, commands);
        self.last.store(last, Ordering::Relaxed);
    }
}

/// What CLIENT LIST shows of a client; updated only on rare events.
#[derive(Debug, Clone)]
pub struct ClientEntry {
    /// Peer address.
    pub addr: String,
    /// Local address.
    pub laddr: String,
    /// Name set by CLIENT SETNAME / HELLO SETNAME.
    pub name: String,
    /// Selected database.
    pub db: u16,
    /// Protocol version.
    pub resp: u8,
    /// Connect time.
    pub created: Instant,
    /// CLIENT SETINFO lib-name.
    pub lib_name: String,
    /// CLIENT SETINFO lib-ver.
    pub lib_ver: String,
    /// Channels, patterns and shard channels subscribed to.
    pub subs: [usize; 3],
    /// The ACL user it authenticated as, when not the `--upstream` one
    /// (`None`: shown as `default`).
    pub user: Option<String>,
    /// Idle time, traffic and last command; shared by the entry's clones,
    /// so the registry's copy sees the connection's updates.
    pub activity: Arc<Activity>,
    /// Cancelled to close the connection (CLIENT KILL; shutdown cancels
    /// every client's).
    pub kill: crate::state::kill::Kill,
}

impl ClientEntry {
    /// The client sent `n` bytes at `now` (the metrics' read time, so no
    /// clock read of its own while metrics are on): `idle` counts from
    /// there. Once per socket read, not per command; the time is stored
    /// only when the second changed.
    #[inline]
    pub fn touch(&self, now: Option<Instant>, n: usize) {
        let a = &self.activity;
        add(&a.net_in, n as u64);
        let now = now.unwrap_or_else(Instant::now);
        let s = now.saturating_duration_since(self.created).as_secs();
        if a.read_at.load(Ordering::Relaxed) != s {
            a.read_at.store(s, Ordering::Relaxed);
        }
    }

    /// Whether it is a pubsub client (subscribed to something).
    pub fn subscribed(&self) -> bool {
        self.subs.iter().any(|&n| n > 0)
    }

    /// The CLIENT INFO / CLIENT LIST line of client `id`, as the upstream's
    /// version formats it (`how`).
    pub fn line(&self, id: u64, how: &Line<'_>) -> String {
        let age = self.created.elapsed().as_secs();
        let a = &self.activity;
        let idle = age.saturating_sub(a.read_at.load(Ordering::Relaxed));
        let flags = if how.blocked(id) {
            "b"
        } else if self.subscribed() {
            "P"
        } else {
            "N"
        };
        let running = how.current.is_some_and(|(me, _)| me == id);
        let qbuf = if running && !how.fields.shared_qbuf {
            how.qbuf
        } else {
            0
        };
        let cmd = match how.current {
            Some((me, name)) if me == id => name,
            _ => u16::try_from(a.last.load(Ordering::Relaxed))
                .ok()
                .and_then(|n| how.table.full_name(n))
                .unwrap_or("NULL"),
        };
        let f = how.fields;
        let mut s = String::with_capacity(384);
        // Writing to a String cannot fail.
        let _ = write!(
            s,
            "id={id} addr={} laddr={} fd=-1 name={} age={age} idle={idle} flags={flags}",
            self.addr, self.laddr, self.name
        );
        if f.capa {
            s.push_str(" capa=");
        }
        let _ = write!(
            s,
            " db={} sub={} psub={} ssub={} multi=-1",
            self.db, self.subs[0], self.subs[1], self.subs[2]
        );
        if f.watch {
            s.push_str(" watch=0");
        }
        let _ = write!(
            s,
            " qbuf={qbuf} qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=0 tot-mem=0 events=r cmd={cmd} user={} redir=-1 resp={}",
            self.user.as_deref().unwrap_or("default"),
            self.resp
        );
        if f.lib {
            let _ = write!(s, " lib-name={} lib-ver={}", self.lib_name, self.lib_ver);
        }
        if f.io_thread {
            s.push_str(" io-thread=0");
        }
        if f.traffic {
            let _ = write!(
                s,
                " tot-net-in={} tot-net-out={} tot-cmds={}",
                a.net_in.load(Ordering::Relaxed),
                a.net_out.load(Ordering::Relaxed),
                a.cmds.load(Ordering::Relaxed)
            );
        }
        s.push('\n');
        s
    }
}

/// Which of CLIENT LIST's fields past Redis 7.0's the upstream's version
/// shows, in its order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fields {
    /// `lib-name` and `lib-ver` (Redis 7.2+, Valkey).
    pub lib: bool,
    /// `watch` (Redis 7.4+, Valkey 8+).
    pub watch: bool,
    /// `capa` (Valkey 9+).
    pub capa: bool,
    /// `io-thread` (Redis 8+).
    pub io_thread: bool,
    /// `tot-net-in`, `tot-net-out` and `tot-cmds` (Valkey 8+).
    pub traffic: bool,
    /// The running client's `qbuf` reads 0 (Valkey 8+, whose clients
    /// read into a shared query buffer).
    pub shared_qbuf: bool,
}

impl Fields {
    /// The fields of the upstream's engine and version.
    pub fn of(info: &sidecache_pool::ServerInfo) -> Fields {
        let valkey = |major, minor| info.is_at_least("valkey", major, minor);
        let redis = |major, minor| info.is_at_least("redis", major, minor);
        Fields {
            lib: valkey(7, 2) || redis(7, 2),
            watch: valkey(8, 0) || redis(7, 4),
            capa: valkey(9, 0),
            io_thread: redis(8, 0),
            traffic: valkey(8, 0),
            shared_qbuf: valkey(8, 0),
        }
    }
}

/// How to print lines: the fields, the names of commands, the clients
/// blocked now, and the asking client's own command (Redis shows the
/// command running, `client|list`, for the client that runs it).
#[derive(Debug)]
pub struct Line<'a> {
    /// The upstream's fields.
    pub fields: Fields,
    /// Names the last commands.
    pub table: &'a CommandTable,
    /// Clients blocked now (`flags=b`).
    pub blocked: &'a [u64],
    /// The asking client's id and its command's name.
    pub current: Option<(u64, &'a str)>,
    /// The asking client's query buffer: its command's size, as RESP
    /// (Redis's `qbuf` while the command runs).
    pub qbuf: usize,
}

impl Line<'_> {
    fn blocked(&self, id: u64) -> bool {
        self.blocked.contains(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> ClientEntry {
        ClientEntry {
            addr: "127.0.0.1:5000".into(),
            laddr: "127.0.0.1:6380".into(),
            name: "n".into(),
            db: 2,
            resp: 3,
            created: Instant::now(),
            lib_name: "lib".into(),
            lib_ver: "1".into(),
            subs: [0; 3],
            user: None,
            activity: Arc::default(),
            kill: Default::default(),
        }
    }

    fn fields(line: &str) -> Vec<&str> {
        line.trim_end()
            .split(' ')
            .map(|f| f.split('=').next().unwrap_or(""))
            .collect()
    }

    #[test]
    fn fields_follow_the_version_in_its_order() {
        let table = CommandTable::default();
        let e = entry();
        let redis70 = e.line(
            7,
            &Line {
                fields: Fields::default(),
                table: &table,
                blocked: &[],
                current: None,
                qbuf: 26,
            },
        );
        assert_eq!(
            fields(&redis70).join(" "),
            "id addr laddr fd name age idle flags db sub psub ssub multi qbuf qbuf-free argv-mem multi-mem rbs rbp obl oll omem tot-mem events cmd user redir resp"
        );
        assert!(redis70.contains(" cmd=NULL "), "{redis70}");
        // Another client's query buffer is empty between its commands.
        assert!(redis70.contains(" qbuf=0 "), "{redis70}");
        let running70 = e.line(
            7,
            &Line {
                fields: Fields::default(),
                table: &table,
                blocked: &[],
                current: Some((7, "client|info")),
                qbuf: 26,
            },
        );
        assert!(running70.contains(" qbuf=26 "), "{running70}");
        let all = Fields {
            lib: true,
            watch: true,
            capa: true,
            io_thread: false,
            traffic: true,
            shared_qbuf: true,
        };
        e.touch(None, 26);
        e.activity.wrote(4);
        e.activity.answered(1, NO_COMMAND);
        let valkey9 = e.line(
            7,
            &Line {
                fields: all,
                table: &table,
                blocked: &[7],
                current: Some((7, "client|info")),
                qbuf: 26,
            },
        );
        assert_eq!(
            fields(&valkey9).join(" "),
            "id addr laddr fd name age idle flags capa db sub psub ssub multi watch qbuf qbuf-free argv-mem multi-mem rbs rbp obl oll omem tot-mem events cmd user redir resp lib-name lib-ver tot-net-in tot-net-out tot-cmds"
        );
        assert!(valkey9.contains(" flags=b "), "{valkey9}");
        assert!(valkey9.contains(" cmd=client|info "), "{valkey9}");
        assert!(valkey9.contains(" qbuf=0 "), "{valkey9}");
        assert!(
            valkey9.ends_with(" tot-net-in=26 tot-net-out=4 tot-cmds=1\n"),
            "{valkey9}"
        );
    }
}
