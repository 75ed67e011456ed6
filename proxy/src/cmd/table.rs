//! The command table, loaded from upstream `COMMAND` at start-up: arity,
//! flags and key positions (legacy first/last/step and Redis 7 key specs).
//! Routing, (later) caching and invalidation all read this one table.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use sidecache_resp::frame::Value;

/// Command (or subcommand) names to their entries. Hashed with foldhash,
/// not SipHash: every forwarded command is looked up here, SipHash took
/// about 180 instructions of it (callgrind), and the names are the fixed
/// set upstream's `COMMAND` listed (a client only looks up, it inserts
/// nothing), so a seeded fast hash is enough.
pub type Names = HashMap<Vec<u8>, Arc<CommandInfo>, foldhash::fast::RandomState>;

pub use super::flags::Flags;
use super::handling::{self, Handling, Invalidation};

/// Where a key search begins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BeginSearch {
    /// At a fixed argument index.
    Index(usize),
    /// After a keyword, searched from `startfrom` (negative: from the end).
    Keyword {
        /// The keyword, upper case.
        keyword: Vec<u8>,
        /// Start index.
        startfrom: i64,
    },
    /// Not expressible.
    Unknown,
}

/// How keys are found once the search began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FindKeys {
    /// A range of arguments.
    Range {
        /// Last key relative to the first (negative: from the end).
        lastkey: i64,
        /// Step between keys.
        keystep: i64,
        /// When `lastkey == -1`, only `1/limit` of the remaining arguments.
        limit: i64,
    },
    /// A count argument, then that many keys.
    Keynum {
        /// Index of the count relative to the begin position.
        keynumidx: i64,
        /// First key relative to the begin position.
        firstkey: i64,
        /// Step between keys.
        keystep: i64,
    },
    /// Not expressible.
    Unknown,
}

/// One Redis 7 key specification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpec {
    /// Where to start.
    pub begin: BeginSearch,
    /// How to find keys from there.
    pub find: FindKeys,
    /// The keys may be changed (spec flags RW, OW, RM, INSERT, DELETE or
    /// UPDATE): PFCOUNT is a `readonly` command whose key is RW.
    pub writes: bool,
}

/// Everything known of one command (or subcommand).
#[derive(Debug)]
pub struct CommandInfo {
    /// Lower-case name, `container|sub` for subcommands.
    pub name: String,
    /// Redis arity (negative: at least).
    pub arity: i64,
    /// Flags.
    pub flags: Flags,
    /// Legacy key positions.
    pub first: i64,
    /// Legacy last key (negative: from the end).
    pub last: i64,
    /// Legacy step.
    pub step: i64,
    /// Key specs (Redis 7).
    pub specs: Vec<KeySpec>,
    /// Subcommands by lower-case subcommand name.
    pub subcommands: Names,
    /// How the proxy handles it.
    pub handling: Handling,
    /// What it makes the L1 drop.
    pub invalidation: Invalidation,
    /// Whether it may be acknowledged from memory (write-behind).
    pub write_behind: bool,
    /// A read the L1 caches (`--l1-commands`), and how.
    pub read: Option<super::reads::ReadRule>,
    /// Index of the top-level command in [`CommandTable::names`] (shared by
    /// its subcommands): per-command metrics are an array indexed by it.
    pub id: u16,
    /// Index of this entry's own name (`client|list` for a subcommand) in
    /// [`CommandTable::full_name`]: what CLIENT LIST shows as `cmd=`.
    pub name_id: u16,
    /// Where a script's body is among its arguments (EVAL, SCRIPT LOAD):
    /// the scripts that declare `no-writes` are remembered by SHA for
    /// CLIENT PAUSE WRITE (`crate::state::pause`).
    pub script_body: Option<usize>,
}

/// Why keys could not be extracted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeysError {
    /// The arguments do not fit the spec (wrong arity, bad numkeys); the
    /// server will reply with the precise error.
    Invalid,
    /// The spec cannot express this command's keys.
    Unknown,
}

impl CommandInfo {
    /// Whether `argc` arguments satisfy the arity.
    pub fn arity_ok(&self, argc: usize) -> bool {
        let argc = argc as i64;
        if self.arity >= 0 {
            argc == self.arity
        } else {
            argc >= self.arity.saturating_neg()
        }
    }

    /// Appends the indexes of the key arguments in `args` to `out`.
    /// Returns `Ok(false)` when some key spec cannot be expressed (e.g. SORT's
    /// STORE target): the keys found are right but may not be all of them.
    ///
    /// # Errors
    /// [`KeysError`] when the keys cannot be determined.
    pub fn keys(&self, args: &[Bytes], out: &mut Vec<usize>) -> Result<bool, KeysError> {
        self.keys_where(args, out, false)
    }

    /// Whether any key of this command may be changed by it.
    pub fn writes_keys(&self) -> bool {
        self.flags.write || self.specs.iter().any(|s| s.writes)
    }

    /// Like [`CommandInfo::keys`], but with `written_only` only the keys the
    /// command may change (by key-spec flags; every key for a `write`
    /// command without specs).
    ///
    /// # Errors
    /// As [`CommandInfo::keys`].
    pub fn keys_where(
        &self,
        args: &[Bytes],
        out: &mut Vec<usize>,
        written_only: bool,
    ) -> Result<bool, KeysError> {
        if !self.arity_ok(args.len()) {
            return Err(KeysError::Invalid);
        }
        if self.specs.is_empty() {
            return self.legacy_keys(args.len(), out).map(|()| true);
        }
        let argc = args.len() as i64;
        let start = out.len();
        let mut complete = true;
        for spec in &self.specs {
            if written_only && !spec.writes {
                continue;
            }
            let first = match &spec.begin {
                BeginSearch::Index(i) => *i as i64,
                BeginSearch::Keyword { keyword, startfrom } => {
                    let (start, end) = if *startfrom > 0 {
                        (*startfrom, argc - 1)
                    } else {
                        (argc + startfrom, 0)
                    };
                    let mut i = start;
                    let mut found = 0;
                    while i != end {
                        if i >= argc || i < 1 {
                            break;
                        }
                        if args[i as usize].eq_ignore_ascii_case(keyword) {
                            found = i + 1;
                            break;
                        }
                        i = if start <= end { i + 1 } else { i - 1 };
                    }
                    if found == 0 {
                        continue;
                    }
                    found
                }
                BeginSearch::Unknown => {
                    complete = false;
                    continue;
                }
            };
            let (first, last, step) = match &spec.find {
                FindKeys::Range {
                    lastkey,
                    keystep,
                    limit,
                } => {
                    let last = if *lastkey >= 0 {
                        first.saturating_add(*lastkey)
                    } else if *limit == 0 {
                        argc.saturating_add(*lastkey)
                    } else {
                        first.saturating_add(((argc - first) / limit).saturating_add(*lastkey))
                    };
                    (first, last, *keystep)
                }
                FindKeys::Keynum {
                    keynumidx,
                    firstkey,
                    keystep,
                } => {
                    // Saturating: the spec's numbers come from upstream.
                    let idx = first.saturating_add(*keynumidx);
                    if idx >= argc || idx < 0 {
                        return Err(KeysError::Invalid);
                    }
                    let n = sidecache_resp::int::parse_i64(&args[idx as usize])
                        .ok_or(KeysError::Invalid)?;
                    if n < 0 {
                        return Err(KeysError::Invalid);
                    }
                    let first = first.saturating_add(*firstkey);
                    (first, first.saturating_add(n - 1), *keystep)
                }
                FindKeys::Unknown => {
                    complete = false;
                    continue;
                }
            };
            if step <= 0 {
                return Err(KeysError::Unknown);
            }
            let mut i = first;
            while i <= last {
                if i < 0 {
                    return Err(KeysError::Unknown);
                }
                if i >= argc {
                    // Past the arguments every later position is too: stop
                    // (a client's `EVAL s 1000000000000` used to spin here).
                    if self.arity < 0 {
                        break;
                    }
                    return Err(KeysError::Invalid);
                }
                out.push(i as usize);
                let Some(next) = i.checked_add(step) else {
                    break;
                };
                i = next;
            }
        }
        if !complete && out.len() == start {
            // Nothing expressible found: fall back to the legacy positions
            // when they are trustworthy. Not for `written_only`: they do not
            // say which keys are written, and where read specs did find keys
            // they need not agree with them (a malformed table made the
            // written keys more than the keys; found by fuzz/command_keys).
            // `Ok(false)` with nothing found: the caller assumes the worst.
            if self.flags.movablekeys || self.first <= 0 {
                return Err(KeysError::Unknown);
            }
            if !written_only {
                self.legacy_keys(args.len(), out)?;
            }
        }
        Ok(complete)
    }

    fn legacy_keys(&self, argc: usize, out: &mut Vec<usize>) -> Result<(), KeysError> {
        if self.first <= 0 {
            return if self.flags.movablekeys {
                Err(KeysError::Unknown)
            } else {
                Ok(())
            };
        }
        let argc = argc as i64;
        let last = if self.last < 0 {
            argc + self.last
        } else {
            self.last
        };
        let step = self.step.max(1);
        let mut i = self.first;
        while i <= last && i < argc {
            out.push(i as usize);
            // Checked: the step comes from upstream's `COMMAND` reply.
            let Some(next) = i.checked_add(step) else {
                break;
            };
            i = next;
        }
        Ok(())
    }
}

/// The table.
#[derive(Debug, Default)]
pub struct CommandTable {
    commands: Names,
    names: Vec<String>,
    /// Every entry's name, subcommands after the top-level commands
    /// (indexed by [`CommandInfo::name_id`]).
    full_names: Vec<String>,
    /// SET's entry, resolved once: the write-behind hot path takes it
    /// without hashing the name (see [`CommandTable::set`]).
    set: Option<Arc<CommandInfo>>,
}

/// Longest command name looked up (longer names are unknown commands).
const MAX_NAME: usize = 64;

impl CommandTable {
    /// Builds the table from a decoded `COMMAND` reply.
    ///
    /// # Errors
    /// A message when the reply is not a command list.
    pub fn from_command_reply(reply: Value) -> Result<CommandTable, String> {
        let items = reply.into_items().ok_or("COMMAND reply is not an array")?;
        let mut commands = Names::with_capacity_and_hasher(items.len(), Default::default());
        let mut names = Vec::with_capacity(items.len());
        for item in items {
            let Ok(id) = u16::try_from(names.len()) else {
                break;
            };
            if let Some(info) = parse_entry(item, None, id) {
                names.push(info.name.clone());
                commands.insert(info.name.as_bytes().to_vec(), Arc::new(info));
            }
        }
        if commands.is_empty() {
            return Err("COMMAND reply lists no commands".into());
        }
        // Subcommands' names follow the top-level ones; entries are not
        // shared yet, so each is numbered in place.
        let mut full_names = names.clone();
        for info in commands.values_mut() {
            let Some(info) = Arc::get_mut(info) else {
                continue;
            };
            for sub in info.subcommands.values_mut() {
                let (Some(sub), Ok(id)) = (Arc::get_mut(sub), u16::try_from(full_names.len()))
                else {
                    continue;
                };
                sub.name_id = id;
                full_names.push(sub.name.clone());
            }
        }
        let set = commands.get(&b"set"[..]).cloned();
        Ok(CommandTable {
            commands,
            names,
            full_names,
            set,
        })
    }

    /// Top-level command names, indexed by [`CommandInfo::id`].
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The name of the entry numbered `name_id` ([`CommandInfo::name_id`]),
    /// as Redis shows it in CLIENT LIST (`get`, `client|list`).
    pub fn full_name(&self, name_id: u16) -> Option<&str> {
        self.full_names
            .get(usize::from(name_id))
            .map(String::as_str)
    }

    /// Number of top-level commands.
    pub fn len(&self) -> usize {
        self.commands.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.commands.is_empty()
    }

    /// SET's entry (what [`CommandTable::lookup`] finds for it), without a
    /// lookup: SET has no subcommands.
    pub fn set(&self) -> Option<&Arc<CommandInfo>> {
        self.set.as_ref()
    }

    /// Keeps the L1's reads to those `allowed` (lower-case names; the
    /// others are forwarded uncached). Call before the table is shared.
    pub fn allow_reads(&mut self, allowed: &[String]) {
        for info in self.commands.values_mut() {
            if let Some(info) = Arc::get_mut(info) {
                if !allowed.contains(&info.name) {
                    info.read = None;
                }
            }
        }
    }

    /// Looks up a command by its arguments (resolving subcommands).
    pub fn lookup(&self, args: &[Bytes]) -> Option<&Arc<CommandInfo>> {
        let name = args.first()?;
        let mut lower = [0u8; MAX_NAME];
        let lname = lowercase(name, &mut lower)?;
        let info = self.commands.get(lname)?;
        if !info.subcommands.is_empty() {
            if let Some(sub) = args.get(1) {
                let mut lsub = [0u8; MAX_NAME];
                if let Some(s) = lowercase(sub, &mut lsub).and_then(|s| info.subcommands.get(s)) {
                    return Some(s);
                }
            }
        }
        Some(info)
    }
}

/// Lower-cases `s` into `buf` without allocating; `None` if too long.
pub fn lowercase<'a>(s: &[u8], buf: &'a mut [u8; MAX_NAME]) -> Option<&'a [u8]> {
    if s.len() > MAX_NAME {
        return None;
    }
    for (d, c) in buf.iter_mut().zip(s) {
        *d = c.to_ascii_lowercase();
    }
    Some(&buf[..s.len()])
}

fn kv(v: Value) -> HashMap<String, Value> {
    let mut out = HashMap::new();
    let items = v.into_items().unwrap_or_default();
    let mut it = items.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        if let Some(k) = k.as_bytes() {
            out.insert(String::from_utf8_lossy(k).to_ascii_lowercase(), v);
        }
    }
    out
}

fn int(m: &HashMap<String, Value>, k: &str) -> i64 {
    m.get(k).and_then(Value::as_int).unwrap_or(0)
}

fn parse_spec(v: Value) -> KeySpec {
    let mut m = kv(v);
    let writes = m
        .get("flags")
        .cloned()
        .and_then(Value::into_items)
        .unwrap_or_default()
        .iter()
        .filter_map(|f| f.as_bytes())
        .any(|f| {
            matches!(
                &f.to_ascii_uppercase()[..],
                b"RW" | b"OW" | b"RM" | b"INSERT" | b"DELETE" | b"UPDATE"
            )
        });
    let begin = m.remove("begin_search").map(kv).unwrap_or_default();
    let find = m.remove("find_keys").map(kv).unwrap_or_default();
    let ty = |m: &HashMap<String, Value>| {
        m.get("type")
            .and_then(|t| t.as_bytes().cloned())
            .unwrap_or_default()
    };
    let bspec = begin.get("spec").cloned().map(kv).unwrap_or_default();
    let fspec = find.get("spec").cloned().map(kv).unwrap_or_default();
    let begin = match &ty(&begin)[..] {
        b"index" => BeginSearch::Index(int(&bspec, "index").max(0) as usize),
        b"keyword" => BeginSearch::Keyword {
            keyword: bspec
                .get("keyword")
                .and_then(|k| k.as_bytes().map(|b| b.to_ascii_uppercase()))
                .unwrap_or_default(),
            startfrom: int(&bspec, "startfrom"),
        },
        _ => BeginSearch::Unknown,
    };
    let find = match &ty(&find)[..] {
        b"range" => FindKeys::Range {
            lastkey: int(&fspec, "lastkey"),
            keystep: int(&fspec, "keystep"),
            limit: int(&fspec, "limit"),
        },
        b"keynum" => FindKeys::Keynum {
            keynumidx: int(&fspec, "keynumidx"),
            firstkey: int(&fspec, "firstkey"),
            keystep: int(&fspec, "keystep"),
        },
        _ => FindKeys::Unknown,
    };
    KeySpec {
        begin,
        find,
        writes,
    }
}

fn parse_entry(v: Value, container: Option<&str>, id: u16) -> Option<CommandInfo> {
    let mut items = v.into_items()?.into_iter();
    let name = String::from_utf8_lossy(items.next()?.as_bytes()?).to_ascii_lowercase();
    let arity = items.next()?.as_int()?;
    let mut flags = Flags::default();
    for f in items.next()?.into_items().unwrap_or_default() {
        match f.as_bytes().map(|b| b.to_ascii_lowercase()).as_deref() {
            Some(b"write") => flags.write = true,
            Some(b"readonly") => flags.readonly = true,
            Some(b"blocking") => flags.blocking = true,
            Some(b"movablekeys") => flags.movablekeys = true,
            Some(b"pubsub") => flags.pubsub = true,
            Some(b"admin") => flags.no_monitor = true,
            Some(b"may_replicate") => flags.may_replicate = true,
            _ => {}
        }
    }
    // A flag Redis hides from COMMAND (CLIENT PAUSE WRITE holds these).
    if container.is_none() && super::flags::MAY_REPLICATE.contains(&name.as_str()) {
        flags.may_replicate = true;
    }
    let first = items.next().and_then(|v| v.as_int()).unwrap_or(0);
    let last = items.next().and_then(|v| v.as_int()).unwrap_or(0);
    let step = items.next().and_then(|v| v.as_int()).unwrap_or(0);
    let _acl = items.next();
    let _tips = items.next();
    let specs: Vec<KeySpec> = items
        .next()
        .and_then(Value::into_items)
        .unwrap_or_default()
        .into_iter()
        .map(parse_spec)
        .collect();
    let mut subcommands = Names::default();
    for sub in items.next().and_then(Value::into_items).unwrap_or_default() {
        if let Some(s) = parse_entry(sub, Some(&name), id) {
            let short = s
                .name
                .rsplit('|')
                .next()
                .unwrap_or(&s.name)
                .as_bytes()
                .to_vec();
            subcommands.insert(short, Arc::new(s));
        }
    }
    let handling = handling::for_command(&name, container, flags);
    let write_behind = container.is_none() && handling::write_behind(&name);
    let script_body = match name.as_str() {
        "eval" | "eval_ro" => Some(1),
        "script|load" => Some(2),
        _ => None,
    };
    let mut info = CommandInfo {
        name,
        arity,
        flags,
        first,
        last,
        step,
        specs,
        subcommands,
        handling,
        invalidation: Invalidation::None,
        write_behind,
        read: None,
        id,
        name_id: id,
        script_body,
    };
    // Read-only by upstream's flags too: a server whose command differs
    // from Redis's is not cached.
    if container.is_none() && flags.readonly && !flags.write {
        info.read = super::reads::rule_for(&info.name);
    }
    let spec_writes = info.specs.iter().any(|s| s.writes);
    info.invalidation = handling::invalidation(&info.name, info.writes_keys(), spec_writes);
    Some(info)
}

#[cfg(test)]
mod tests;
