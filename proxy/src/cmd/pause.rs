//! What `CLIENT PAUSE WRITE` holds, as Redis 7 decides it: a command that
//! may change data, by its flags, its script's declared flags, or (EXEC)
//! the commands it runs.
//!
//! Redis hides one of the flags it decides by, `may_replicate`, from
//! `COMMAND`: [`super::flags::MAY_REPLICATE`] names its commands. A script that
//! declares its flags (`#!lua flags=no-writes`) is held only if it may
//! write; one that declares none (EVAL's compatibility mode) always is.

use bytes::Bytes;
use sidecache_resp::frame::Value;

use super::table::CommandInfo;

/// The script flags Redis accepts in a shebang line.
const SCRIPT_FLAGS: &[&[u8]] = &[
    b"no-writes",
    b"allow-oom",
    b"allow-stale",
    b"no-cluster",
    b"allow-cross-slot-keys",
];

/// Whether `info` called with `args` may change data, as `CLIENT PAUSE
/// WRITE` judges it; `ro_script`: whether a SHA names a script known to
/// declare `no-writes`. EXEC is the caller's (it depends on what was
/// queued) and FCALL's function flags too (they live upstream).
pub fn may_change_data(
    info: &CommandInfo,
    args: &[Bytes],
    ro_script: impl Fn(&[u8]) -> bool,
) -> bool {
    let by_flags = info.flags.write || info.flags.may_replicate;
    match info.name.as_str() {
        "eval" | "eval_ro" => match args.get(1).and_then(|b| declares_no_writes(b)) {
            Some(no_writes) => !no_writes,
            None => by_flags,
        },
        "evalsha" | "evalsha_ro" if args.get(1).is_some_and(|s| ro_script(s)) => false,
        _ => by_flags,
    }
}

/// The flags a script declares on its first line (`#!lua flags=a,b`):
/// `Some(true)` when they include `no-writes`; `None` without a shebang
/// (compatibility mode) or with one Redis refuses (it then judges the
/// command by its own flags).
pub fn declares_no_writes(body: &[u8]) -> Option<bool> {
    let rest = body.strip_prefix(b"#!")?;
    let line = rest.split(|&b| b == b'\n').next().unwrap_or(rest);
    let mut words = line
        .split(|b| b.is_ascii_whitespace())
        .filter(|w| !w.is_empty());
    if words.next()? != b"lua" {
        return None;
    }
    let mut no_writes = false;
    for w in words {
        let list = w.strip_prefix(b"flags=")?;
        for flag in list.split(|&b| b == b',').filter(|f| !f.is_empty()) {
            if !SCRIPT_FLAGS.contains(&flag) {
                return None;
            }
            no_writes |= flag == b"no-writes";
        }
    }
    Some(no_writes)
}

/// In a `FUNCTION LIST` reply (RESP2 or RESP3), whether the function
/// `name` declares `no-writes`; `None` when the reply has no such
/// function.
pub fn function_no_writes(list: Value, name: &[u8]) -> Option<bool> {
    for library in list.into_items()? {
        let Some(functions) = field(library, b"functions").and_then(Value::into_items) else {
            continue;
        };
        for f in functions {
            let items = f.into_items().unwrap_or_default();
            let named = |key: &[u8]| {
                items
                    .chunks_exact(2)
                    .find(|kv| {
                        kv[0]
                            .as_bytes()
                            .is_some_and(|k| k.eq_ignore_ascii_case(key))
                    })
                    .map(|kv| &kv[1])
            };
            if named(b"name").and_then(Value::as_bytes).map(|b| &b[..]) == Some(name) {
                let no_writes = match named(b"flags") {
                    Some(Value::Array(v) | Value::Set(v)) => v
                        .iter()
                        .any(|f| f.as_bytes().is_some_and(|b| b == "no-writes")),
                    _ => false,
                };
                return Some(no_writes);
            }
        }
    }
    None
}

/// A field of a RESP3 map or of RESP2's flat key-value array.
fn field(v: Value, key: &[u8]) -> Option<Value> {
    let mut items = v.into_items()?.into_iter();
    while let (Some(k), Some(v)) = (items.next(), items.next()) {
        if k.as_bytes().is_some_and(|k| k.eq_ignore_ascii_case(key)) {
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shebang_flags_as_redis_reads_them() {
        assert_eq!(declares_no_writes(b"return 1"), None);
        assert_eq!(declares_no_writes(b"#!lua\nreturn 1"), Some(false));
        assert_eq!(
            declares_no_writes(b"#!lua flags=no-writes\nreturn 1"),
            Some(true)
        );
        assert_eq!(
            declares_no_writes(b"#!lua flags=allow-oom,no-writes\nreturn 1"),
            Some(true)
        );
        assert_eq!(
            declares_no_writes(b"#!lua flags=allow-oom\nreturn 1"),
            Some(false)
        );
        assert_eq!(declares_no_writes(b"#!lua flags=\nreturn 1"), Some(false));
        // What Redis refuses is judged by the command's own flags.
        assert_eq!(declares_no_writes(b"#!lua flags=bogus\nreturn 1"), None);
        assert_eq!(declares_no_writes(b"#!js flags=no-writes\n"), None);
        assert_eq!(declares_no_writes(b"#!lua other=1\n"), None);
    }

    #[test]
    fn function_flags_from_either_protocol() {
        let b = |s: &str| Value::Bulk(Bytes::copy_from_slice(s.as_bytes()));
        let f = |name: &str, flags: &[&str]| {
            Value::Array(vec![
                b("name"),
                b(name),
                b("description"),
                Value::Nil,
                b("flags"),
                Value::Array(flags.iter().map(|s| b(s)).collect()),
            ])
        };
        let resp2 = Value::Array(vec![Value::Array(vec![
            b("library_name"),
            b("lib"),
            b("engine"),
            b("LUA"),
            b("functions"),
            Value::Array(vec![f("ro", &["no-writes"]), f("rw", &[])]),
        ])]);
        assert_eq!(function_no_writes(resp2.clone(), b"ro"), Some(true));
        assert_eq!(function_no_writes(resp2.clone(), b"rw"), Some(false));
        assert_eq!(function_no_writes(resp2, b"none"), None);
    }
}
