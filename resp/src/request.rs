//! Request parsing: RESP arrays of bulk strings and inline commands, as
//! Redis's `processMultibulkBuffer` / `processInlineBuffer` accept them, with
//! the same error texts.
//!
//! Lengths are checked against limits before anything is reserved, and the
//! buffer only grows with bytes that actually arrived. Parsing a large
//! request that arrives in many reads resumes where it stopped instead of
//! rescanning from the start.

use std::ops::Range;

use crate::encode::encode_command;
use crate::int::parse_i64;
use bytes::{Bytes, BytesMut};

/// Longest inline request or length line (Redis's `PROTO_INLINE_MAX_SIZE`).
pub const INLINE_MAX: usize = 64 * 1024;

/// A malformed request; the text follows `-ERR ` in the reply, after which
/// the connection is closed (as Redis does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// Inline line without newline past [`INLINE_MAX`].
    #[error("Protocol error: too big inline request")]
    TooBigInline,
    /// Inline command with an unterminated quote.
    #[error("Protocol error: unbalanced quotes in request")]
    UnbalancedQuotes,
    /// `*` line without newline past [`INLINE_MAX`].
    #[error("Protocol error: too big mbulk count string")]
    TooBigMbulkCount,
    /// `*n` not a number, or above the limit.
    #[error("Protocol error: invalid multibulk length")]
    InvalidMultibulkLength,
    /// Too many elements before AUTH.
    #[error("Protocol error: unauthenticated multibulk length")]
    UnauthenticatedMultibulk,
    /// An element not starting with `$`.
    #[error("Protocol error: expected '$', got '{}'", *.0 as char)]
    ExpectedDollar(u8),
    /// `$` line without newline past [`INLINE_MAX`].
    #[error("Protocol error: too big bulk count string")]
    TooBigBulkCount,
    /// `$n` not a number, negative, or above `proto-max-bulk-len`.
    #[error("Protocol error: invalid bulk length")]
    InvalidBulkLength,
    /// A bulk above 16 KiB before AUTH.
    #[error("Protocol error: unauthenticated bulk length")]
    UnauthenticatedBulk,
}

/// Limits applied while parsing.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest bulk string.
    pub max_bulk: u64,
    /// Largest element count.
    pub max_multibulk: u64,
    /// How quotes in inline commands end (the server's rule).
    pub inline_quotes: InlineQuotes,
}

/// Where a quoted part of an inline command ends: the servers differ, and
/// sidecache splits inline commands as the server it fronts does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InlineQuotes {
    /// Redis, and Valkey before 9: a closing quote must be followed by a
    /// space or the end of the line (`"a b"c` is a protocol error).
    #[default]
    Strict,
    /// Valkey 9: text right after a closing quote continues the argument,
    /// as in a shell (`"a b"c` is `a bc`; only a space ends an argument).
    Joined,
}

/// One parsed request: the RESP encoding to forward upstream and its
/// arguments as zero-copy slices of it.
#[derive(Debug, Default)]
pub struct Request {
    /// The request as a RESP array (inline requests are re-encoded).
    pub raw: Bytes,
    /// Arguments; `args[0]` is the command name.
    pub args: Vec<Bytes>,
}

/// Incremental parser state for one connection.
#[derive(Debug)]
pub struct Parser {
    limits: Limits,
    /// Whether the stricter pre-AUTH limits apply.
    pub unauthenticated: bool,
    /// Progress inside a multibulk: offset of the next unparsed byte.
    pos: usize,
    /// Elements still expected (0 = not inside a multibulk).
    remaining: u64,
    /// Argument ranges parsed so far.
    ranges: Vec<Range<usize>>,
    /// Bytes the current bulk needs (payload + CRLF), once its header is read.
    bulk: Option<usize>,
}

impl Parser {
    /// A parser with the given limits.
    pub fn new(limits: Limits) -> Parser {
        Parser {
            limits,
            unauthenticated: false,
            pos: 0,
            remaining: 0,
            ranges: Vec::new(),
            bulk: None,
        }
    }

    /// Bytes the parser still needs for the request in progress, if known;
    /// used to size the next read.
    pub fn wanted(&self) -> Option<usize> {
        self.bulk.map(|b| self.pos + b)
    }

    /// Parses one request from the front of `buf`, removing its bytes.
    /// `Ok(None)`: need more bytes. Empty requests (`*0`, blank inline lines)
    /// are consumed silently, as Redis does.
    ///
    /// # Errors
    /// [`ProtocolError`]: reply `-ERR <error>` and close the connection.
    pub fn parse(
        &mut self,
        buf: &mut BytesMut,
        out: &mut Request,
    ) -> Result<Option<()>, ProtocolError> {
        loop {
            if buf.is_empty() {
                return Ok(None);
            }
            let r = if self.remaining > 0 || buf[0] == b'*' {
                self.multibulk(buf, out)?
            } else {
                inline(buf, out, self.limits.inline_quotes)?
            };
            match r {
                Step::Done => return Ok(Some(())),
                Step::Empty => continue,
                Step::More => return Ok(None),
            }
        }
    }

    fn multibulk(&mut self, buf: &mut BytesMut, out: &mut Request) -> Result<Step, ProtocolError> {
        if self.remaining == 0 {
            let Some(nl) = find_cr(buf, 0) else {
                if buf.len() > INLINE_MAX {
                    return Err(ProtocolError::TooBigMbulkCount);
                }
                return Ok(Step::More);
            };
            let n = parse_i64(&buf[1..nl]).ok_or(ProtocolError::InvalidMultibulkLength)?;
            if n > i64::from(i32::MAX) || n > self.limits.max_multibulk as i64 {
                return Err(ProtocolError::InvalidMultibulkLength);
            }
            if self.unauthenticated && n > 10 {
                return Err(ProtocolError::UnauthenticatedMultibulk);
            }
            if n <= 0 {
                let _ = buf.split_to(nl + 2);
                return Ok(Step::Empty);
            }
            self.pos = nl + 2;
            self.remaining = n as u64;
            self.ranges.clear();
            self.ranges.reserve((n as usize).min(1024));
        }
        while self.remaining > 0 {
            let need = match self.bulk {
                Some(need) => need,
                None => {
                    if self.pos >= buf.len() {
                        return Ok(Step::More);
                    }
                    let Some(nl) = find_cr(buf, self.pos) else {
                        if buf.len() - self.pos > INLINE_MAX {
                            return Err(ProtocolError::TooBigBulkCount);
                        }
                        return Ok(Step::More);
                    };
                    if buf[self.pos] != b'$' {
                        return Err(ProtocolError::ExpectedDollar(buf[self.pos]));
                    }
                    let n = parse_i64(&buf[self.pos + 1..nl])
                        .ok_or(ProtocolError::InvalidBulkLength)?;
                    if n < 0 || n as u64 > self.limits.max_bulk {
                        return Err(ProtocolError::InvalidBulkLength);
                    }
                    if self.unauthenticated && n > 16384 {
                        return Err(ProtocolError::UnauthenticatedBulk);
                    }
                    self.pos = nl + 2;
                    let need = n as usize + 2;
                    self.bulk = Some(need);
                    need
                }
            };
            if buf.len() < self.pos + need {
                return Ok(Step::More);
            }
            self.ranges.push(self.pos..self.pos + need - 2);
            self.pos += need;
            self.bulk = None;
            self.remaining -= 1;
        }
        let raw = buf.split_to(self.pos).freeze();
        self.pos = 0;
        out.args.clear();
        out.args.extend(self.ranges.drain(..).map(|r| raw.slice(r)));
        out.raw = raw;
        Ok(Step::Done)
    }
}

enum Step {
    Done,
    Empty,
    More,
}

/// Position of the `\r` ending the line that starts at `from`, once its
/// `\n` has arrived too (Redis looks for `\r` and skips two bytes).
fn find_cr(buf: &[u8], from: usize) -> Option<usize> {
    let i = from + crate::find::byte(b'\r', &buf[from..])?;
    (i + 1 < buf.len()).then_some(i)
}

fn inline(
    buf: &mut BytesMut,
    out: &mut Request,
    quotes: InlineQuotes,
) -> Result<Step, ProtocolError> {
    let Some(nl) = memchr::memchr(b'\n', buf) else {
        if buf.len() > INLINE_MAX {
            return Err(ProtocolError::TooBigInline);
        }
        return Ok(Step::More);
    };
    let line = buf.split_to(nl + 1);
    let mut text = &line[..nl];
    if text.last() == Some(&b'\r') {
        text = &text[..text.len() - 1];
    }
    let args = split_args_with(text, quotes).ok_or(ProtocolError::UnbalancedQuotes)?;
    if args.is_empty() {
        return Ok(Step::Empty);
    }
    let mut raw = BytesMut::with_capacity(text.len() + 16 * args.len());
    encode_command(&mut raw, &args);
    let raw = raw.freeze();
    out.args.clear();
    // Re-slice the arguments out of the encoded form (zero-copy from here on).
    let mut pos = 0;
    let header_end =
        |b: &[u8], from: usize| from + memchr::memchr(b'\n', &b[from..]).unwrap_or(0) + 1;
    pos = header_end(&raw, pos);
    for a in &args {
        pos = header_end(&raw, pos);
        out.args.push(raw.slice(pos..pos + a.len()));
        pos += a.len() + 2;
    }
    out.raw = raw;
    Ok(Step::Done)
}

/// Splits an inline line like Redis's `sdssplitargs`: spaces separate
/// arguments; `"…"` allows `\n \r \t \b \a \\ \"` and `\xHH`; `'…'` allows
/// `\'`; a closing quote must be followed by a space or the end.
pub fn split_args(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    split_args_with(line, InlineQuotes::Strict)
}

/// [`split_args`] with the given rule for what may follow a closing quote.
pub fn split_args_with(line: &[u8], quotes: InlineQuotes) -> Option<Vec<Vec<u8>>> {
    let joined = quotes == InlineQuotes::Joined;
    let mut args = Vec::new();
    let mut i = 0;
    let n = line.len();
    loop {
        while i < n && line[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= n {
            return Some(args);
        }
        let mut cur = Vec::new();
        let mut inq = false;
        let mut insq = false;
        loop {
            if inq {
                if i >= n {
                    return None;
                }
                if line[i] == b'\\'
                    && i + 3 < n
                    && line[i + 1] == b'x'
                    && line[i + 2].is_ascii_hexdigit()
                    && line[i + 3].is_ascii_hexdigit()
                {
                    let hex = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
                    cur.push(hex(line[i + 2]) * 16 + hex(line[i + 3]));
                    i += 3;
                } else if line[i] == b'\\' && i + 1 < n {
                    i += 1;
                    cur.push(match line[i] {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => 8,
                        b'a' => 7,
                        c => c,
                    });
                } else if line[i] == b'"' {
                    if joined {
                        inq = false;
                    } else {
                        if i + 1 < n && !line[i + 1].is_ascii_whitespace() {
                            return None;
                        }
                        i += 1;
                        break;
                    }
                } else {
                    cur.push(line[i]);
                }
            } else if insq {
                if i >= n {
                    return None;
                }
                if line[i] == b'\\' && i + 1 < n && line[i + 1] == b'\'' {
                    i += 1;
                    cur.push(b'\'');
                } else if line[i] == b'\'' {
                    if joined {
                        insq = false;
                    } else {
                        if i + 1 < n && !line[i + 1].is_ascii_whitespace() {
                            return None;
                        }
                        i += 1;
                        break;
                    }
                } else {
                    cur.push(line[i]);
                }
            } else {
                if i >= n {
                    break;
                }
                match line[i] {
                    b' ' | b'\n' | b'\r' | b'\t' | 0 => {
                        i += 1;
                        break;
                    }
                    b'"' => inq = true,
                    b'\'' => insq = true,
                    c => cur.push(c),
                }
            }
            i += 1;
        }
        args.push(cur);
    }
}

/// The name of command `n` (0-based) of a pipeline of RESP-encoded
/// commands (as sent upstream); `None` if the pipeline is shorter or not
/// RESP arrays of bulk strings. Walks the commands before it: for the rare
/// reply whose command must be known, not for every one.
pub fn command_name(pipeline: &[u8], n: usize) -> Option<&[u8]> {
    /// The number on the line at `at` after its type byte `t`, and where
    /// the next line starts.
    fn line(b: &[u8], at: usize, t: u8) -> Option<(usize, usize)> {
        if b.get(at) != Some(&t) {
            return None;
        }
        let end = at + memchr::memchr(b'\r', b.get(at..)?)?;
        let v = std::str::from_utf8(&b[at + 1..end]).ok()?.parse().ok()?;
        Some((v, end + 2))
    }
    let mut at = 0;
    for i in 0..=n {
        let (args, mut next) = line(pipeline, at, b'*')?;
        let mut name = None;
        for a in 0..args {
            let (len, start) = line(pipeline, next, b'$')?;
            if a == 0 {
                name = pipeline.get(start..start + len);
            }
            next = start + len + 2;
        }
        if i == n {
            return name;
        }
        at = next;
    }
    None
}

#[cfg(test)]
mod tests;
