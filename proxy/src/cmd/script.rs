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

fn skip_space(s: &[u8]) -> &[u8] {
    let n = s.iter().take_while(|c| c.is_ascii_whitespace()).count();
    &s[n..]
}

#[cfg(test)]
mod tests;
