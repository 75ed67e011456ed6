//! Whether a script may run a read: Redis tracks the keys a script
//! declares for a tracking client only when the script calls a read-only
//! command (`unit/tracking`, "Tracking only occurs for scripts when a
//! command calls a read-only command").
//!
//! sidecache cannot run the script to see, so it reads the script's text:
//! every `redis.call` / `redis.pcall` (or `server.…`) must name its
//! command with a plain string literal, and none may name a read-only
//! command. Anything else (a name in a variable, `redis.call` passed
//! around, an unknown command, a command with subcommands, a function or
//! a script known only by its SHA) counts as a read: a read wrongly
//! assumed only costs a message Redis would not send.
//!
//! Redis 7.2 and Valkey track only the keys the script's reads read, not
//! every key it declares: [`read_keys`] finds them, when the script's text
//! shows them (`KEYS[n]` or a string literal at a key's place of a
//! read-only command); otherwise every declared key counts, as above.

use super::table::CommandTable;

/// The ways a script reaches Redis's commands.
const CALLS: &[&[u8]] = &[
    b"redis.call",
    b"redis.pcall",
    b"server.call",
    b"server.pcall",
];

/// Whether `script` (a Lua body, as EVAL takes it) may call a read-only
/// command of `table`.
pub fn may_read(script: &[u8], table: &CommandTable) -> bool {
    let mut i = 0;
    while i < script.len() {
        let Some(at) = next_call(script, i) else {
            return false;
        };
        let (start, len) = at;
        let rest = &script[start + len..];
        let Some(name) = literal_name(rest) else {
            return true;
        };
        let args = [bytes::Bytes::copy_from_slice(name)];
        match table.lookup(&args) {
            Some(info) if info.subcommands.is_empty() => {
                if info.flags.readonly {
                    return true;
                }
            }
            _ => return true,
        }
        i = start + len;
    }
    false
}

/// The next of [`CALLS`] at or after `from`: its start and length.
fn next_call(script: &[u8], from: usize) -> Option<(usize, usize)> {
    CALLS
        .iter()
        .filter_map(|c| {
            script[from..]
                .windows(c.len())
                .position(|w| w == *c)
                .map(|p| (from + p, c.len()))
        })
        .min()
}

/// After a call: `(` then a quoted command name with no escapes.
fn literal_name(rest: &[u8]) -> Option<&[u8]> {
    let rest = skip_space(rest);
    let rest = skip_space(rest.strip_prefix(b"(")?);
    let quote = *rest.first()?;
    if quote != b'\'' && quote != b'"' {
        return None;
    }
    let body = &rest[1..];
    let end = body.iter().position(|&c| c == quote || c == b'\\')?;
    (body[end] == quote).then(|| &body[..end])
}

/// The keys of `declared` (EVAL's keys, in order) that `script`'s
/// read-only calls read, as indexes into `declared`; `None` when the text
/// does not show them (a command name or a key not written out, a command
/// whose keys have no fixed places).
pub fn read_keys(script: &[u8], table: &CommandTable, declared: &[&[u8]]) -> Option<Vec<usize>> {
    let mut read = Vec::new();
    let mut i = 0;
    while let Some((start, len)) = next_call(script, i) {
        i = start + len;
        let rest = &script[start + len..];
        let name = literal_name(rest)?;
        let info = table.lookup(&[bytes::Bytes::copy_from_slice(name)])?;
        if !info.subcommands.is_empty() || info.flags.movablekeys {
            return None;
        }
        if !info.flags.readonly {
            continue;
        }
        let args = call_args(rest)?;
        for (at, arg) in args.iter().enumerate() {
            // The command's own argument position (its name is 0).
            let pos = at as i64 + 1;
            let last = if info.last < 0 {
                args.len() as i64 + 1 + info.last
            } else {
                info.last
            };
            let is_key = info.first > 0
                && pos >= info.first
                && pos <= last
                && (pos - info.first) % info.step.max(1) == 0;
            if !is_key {
                continue;
            }
            let index = match arg {
                Arg::Keys(n) => n.checked_sub(1),
                Arg::Literal(k) => declared.iter().position(|d| d == k),
                Arg::Other => return None,
            };
            if let Some(n) = index.filter(|&n| n < declared.len()) {
                if !read.contains(&n) {
                    read.push(n);
                }
            }
        }
    }
    Some(read)
}

/// An argument of a call, as far as the text shows it.
#[derive(Debug, PartialEq, Eq)]
enum Arg<'a> {
    /// `KEYS[n]`.
    Keys(usize),
    /// A string literal without escapes.
    Literal(&'a [u8]),
    /// Anything else.
    Other,
}

/// The arguments after the command name of a call whose text starts at
/// `rest` (`(` name `,` arg …`)`); `None` when the call does not close
/// where the reader can see.
fn call_args(rest: &[u8]) -> Option<Vec<Arg<'_>>> {
    let rest = skip_space(rest).strip_prefix(b"(")?;
    let rest = skip_space(rest);
    let quote = *rest.first()?;
    let end = rest[1..].iter().position(|&c| c == quote)? + 2;
    let mut rest = skip_space(&rest[end..]);
    let mut args = Vec::new();
    loop {
        if rest.first() == Some(&b')') {
            return Some(args);
        }
        rest = skip_space(rest.strip_prefix(b",")?);
        let (arg, used) = one_arg(rest);
        args.push(arg);
        rest = skip_space(&rest[used..]);
    }
}

/// One argument at the start of `s`, and the bytes it takes (up to the
/// next `,` or `)` at this level for one the reader does not know).
fn one_arg(s: &[u8]) -> (Arg<'_>, usize) {
    if let Some(&q) = s.first().filter(|&&q| q == b'\'' || q == b'"') {
        if let Some(end) = s[1..].iter().position(|&c| c == q || c == b'\\') {
            if s[1 + end] == q {
                return (Arg::Literal(&s[1..1 + end]), end + 2);
            }
        }
    }
    if let Some(inner) = s.strip_prefix(b"KEYS[") {
        let digits = inner.iter().take_while(|c| c.is_ascii_digit()).count();
        if digits > 0 && inner.get(digits) == Some(&b']') {
            if let Some(n) = std::str::from_utf8(&inner[..digits])
                .ok()
                .and_then(|d| d.parse().ok())
            {
                return (Arg::Keys(n), 5 + digits + 1);
            }
        }
    }
    // Skip to the next `,` or `)` outside brackets and strings.
    let mut depth = 0usize;
    let mut quote = None;
    for (i, &c) in s.iter().enumerate() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, b'\'' | b'"') => quote = Some(c),
            (None, b'(' | b'[' | b'{') => depth += 1,
            (None, b')' | b']' | b'}') if depth > 0 => depth -= 1,
            (None, b',' | b')') if depth == 0 => return (Arg::Other, i),
            _ => {}
        }
    }
    (Arg::Other, s.len())
}

fn skip_space(s: &[u8]) -> &[u8] {
    let n = s.iter().take_while(|c| c.is_ascii_whitespace()).count();
    &s[n..]
}

#[cfg(test)]
mod tests;
