//! RESP2/RESP3 reply frames, as upstreams send them.
//!
//! Replies are passed to clients as the exact bytes the server sent, so the
//! hot path only needs to know where a frame ends: [`Scanner`] finds that
//! without allocating and without recursion (it counts outstanding elements
//! instead of keeping a stack), and resumes where it stopped when a frame
//! arrives in pieces. [`Value`] is the decoded form, used only where the proxy
//! must look inside a reply (merging split commands, topology, COMMAND).

use bytes::{BufMut, Bytes, BytesMut};

use crate::header::put_header;
use crate::int::parse_i64;

/// Deepest nesting [`Value::decode`] accepts; deeper replies are passed
/// through untouched but cannot be inspected.
pub const MAX_DECODE_DEPTH: usize = 512;

/// Longest header line (type byte, length, CRLF) accepted from upstream.
const MAX_LINE: usize = 64 * 1024;

/// Malformed upstream bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// An unknown type byte.
    #[error("unexpected reply type byte {0:#04x}")]
    BadType(u8),
    /// A length or integer that does not parse.
    #[error("invalid length or number in reply")]
    BadNumber,
    /// A header line longer than any valid one.
    #[error("reply header line too long")]
    LineTooLong,
    /// A bulk payload not followed by CRLF.
    #[error("missing CRLF after bulk payload")]
    MissingCrlf,
    /// Nesting deeper than [`MAX_DECODE_DEPTH`] where a decode was asked for.
    #[error("reply nested too deeply")]
    TooDeep,
}

/// Finds the end of one complete RESP frame, resumable across reads.
#[derive(Debug, Default, Clone)]
pub struct Scanner {
    pos: usize,
    remaining: u64,
}

impl Scanner {
    /// A scanner at the start of a frame.
    pub fn new() -> Scanner {
        Scanner::default()
    }

    /// Scans `buf` (which must start at the frame's first byte and only grow
    /// between calls) and returns the frame's length once it is complete.
    /// After `Some`, the scanner is reset for the next frame.
    ///
    /// # Errors
    /// [`ProtocolError`] when the bytes are not RESP.
    pub fn scan(&mut self, buf: &[u8]) -> Result<Option<usize>, ProtocolError> {
        if self.pos == 0 {
            // The most common reply (every write-behind write, every
            // forwarded SET) is complete as it is: no line search.
            if buf.starts_with(b"+OK\r\n") {
                return Ok(Some(5));
            }
            self.remaining = 1;
        }
        while self.remaining > 0 {
            let Some((header, line_end)) = line(buf, self.pos)? else {
                return Ok(None);
            };
            let kind = buf[self.pos];
            let mut next = line_end;
            let add: u64 = match kind {
                b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => 0,
                b'$' | b'=' | b'!' => {
                    let n = parse_int(header)?;
                    if n >= 0 {
                        let n = usize::try_from(n).map_err(|_| ProtocolError::BadNumber)?;
                        let end = line_end + n + 2;
                        if buf.len() < end {
                            return Ok(None);
                        }
                        if &buf[end - 2..end] != b"\r\n" {
                            return Err(ProtocolError::MissingCrlf);
                        }
                        next = end;
                    }
                    0
                }
                b'*' | b'~' | b'>' => aggregate_len(header, 1)?,
                b'%' => aggregate_len(header, 2)?,
                // An attribute is followed by the value it annotates.
                b'|' => aggregate_len(header, 2)? + 1,
                other => return Err(ProtocolError::BadType(other)),
            };
            self.pos = next;
            self.remaining = self.remaining - 1 + add;
        }
        let len = self.pos;
        self.pos = 0;
        Ok(Some(len))
    }
}

fn aggregate_len(header: &[u8], per: u64) -> Result<u64, ProtocolError> {
    let n = parse_int(header)?;
    Ok(if n < 0 { 0 } else { n as u64 * per })
}

/// The header of the line starting at `pos` (without type byte and CRLF) and
/// the offset just past its CRLF.
fn line(buf: &[u8], pos: usize) -> Result<Option<(&[u8], usize)>, ProtocolError> {
    if pos >= buf.len() {
        return Ok(None);
    }
    match crate::find::byte(b'\n', &buf[pos..]) {
        Some(i) => {
            let end = pos + i;
            // `end < pos + 2`: "\n" or "\r\n" with no type byte before it.
            if end < pos + 2 || buf[end - 1] != b'\r' {
                return Err(ProtocolError::MissingCrlf);
            }
            Ok(Some((&buf[pos + 1..end - 1], end + 1)))
        }
        None if buf.len() - pos > MAX_LINE => Err(ProtocolError::LineTooLong),
        None => Ok(None),
    }
}

/// A length or integer in a reply header, as Redis writes it.
fn parse_int(s: &[u8]) -> Result<i64, ProtocolError> {
    parse_i64(s).ok_or(ProtocolError::BadNumber)
}

/// A decoded reply.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum Value {
    Nil,
    Status(Bytes),
    Error(Bytes),
    Int(i64),
    Bulk(Bytes),
    Array(Vec<Value>),
    Map(Vec<(Value, Value)>),
    Set(Vec<Value>),
    Push(Vec<Value>),
    Double(Bytes),
    Bool(bool),
    BigNumber(Bytes),
    Verbatim(Bytes),
}

impl Value {
    /// Decodes one complete frame (as found by [`Scanner`]).
    ///
    /// # Errors
    /// [`ProtocolError`] for malformed or too deeply nested input.
    pub fn decode(frame: &Bytes) -> Result<Value, ProtocolError> {
        let mut pos = 0;
        let v = decode_at(frame, &mut pos, 0)?;
        Ok(v)
    }

    /// Appends the value as RESP (RESP3 types as RESP3; an error holding
    /// CR or LF as a blob error), so that decoding it gives it back.
    pub fn encode(&self, out: &mut BytesMut) {
        let line = |out: &mut BytesMut, kind: u8, b: &[u8]| {
            out.put_u8(kind);
            out.put_slice(b);
            out.put_slice(b"\r\n");
        };
        let blob = |out: &mut BytesMut, kind: u8, b: &[u8]| {
            put_header(out, kind, b.len() as i64);
            out.put_slice(b);
            out.put_slice(b"\r\n");
        };
        match self {
            Value::Nil => out.put_slice(b"_\r\n"),
            Value::Status(b) => line(out, b'+', b),
            Value::Error(b) if b.contains(&b'\r') || b.contains(&b'\n') => blob(out, b'!', b),
            Value::Error(b) => line(out, b'-', b),
            Value::Int(i) => line(out, b':', itoa::Buffer::new().format(*i).as_bytes()),
            Value::Bulk(b) => blob(out, b'$', b),
            Value::Double(b) => line(out, b',', b),
            Value::BigNumber(b) => line(out, b'(', b),
            Value::Bool(t) => out.put_slice(if *t { b"#t\r\n" } else { b"#f\r\n" }),
            Value::Verbatim(b) => blob(out, b'=', b),
            Value::Array(items) | Value::Set(items) | Value::Push(items) => {
                let kind = match self {
                    Value::Array(_) => b'*',
                    Value::Set(_) => b'~',
                    _ => b'>',
                };
                put_header(out, kind, items.len() as i64);
                for i in items {
                    i.encode(out);
                }
            }
            Value::Map(kv) => {
                put_header(out, b'%', kv.len() as i64);
                for (k, v) in kv {
                    k.encode(out);
                    v.encode(out);
                }
            }
        }
    }

    /// The bytes of a bulk, status or verbatim string.
    pub fn as_bytes(&self) -> Option<&Bytes> {
        match self {
            Value::Bulk(b) | Value::Status(b) | Value::Verbatim(b) => Some(b),
            _ => None,
        }
    }

    /// An integer reply (or a bulk string holding one).
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bulk(b) | Value::Status(b) => parse_int(b).ok(),
            _ => None,
        }
    }

    /// The elements of an array, set or push reply; a RESP3 map flattened.
    pub fn into_items(self) -> Option<Vec<Value>> {
        match self {
            Value::Array(v) | Value::Set(v) | Value::Push(v) => Some(v),
            Value::Map(kv) => Some(kv.into_iter().flat_map(|(k, v)| [k, v]).collect()),
            _ => None,
        }
    }
}

fn decode_at(buf: &Bytes, pos: &mut usize, depth: usize) -> Result<Value, ProtocolError> {
    if depth > MAX_DECODE_DEPTH {
        return Err(ProtocolError::TooDeep);
    }
    let (header, end) = line(buf, *pos)?.ok_or(ProtocolError::MissingCrlf)?;
    let kind = buf[*pos];
    let hs = *pos + 1;
    let header_bytes = buf.slice(hs..hs + header.len());
    *pos = end;
    let items = |pos: &mut usize, n: i64| -> Result<Vec<Value>, ProtocolError> {
        let mut v = Vec::with_capacity(n.clamp(0, 1024) as usize);
        for _ in 0..n.max(0) {
            v.push(decode_at(buf, pos, depth + 1)?);
        }
        Ok(v)
    };
    Ok(match kind {
        b'+' => Value::Status(header_bytes),
        b'-' => Value::Error(header_bytes),
        b':' => Value::Int(parse_int(header)?),
        b'_' => Value::Nil,
        b',' => Value::Double(header_bytes),
        b'(' => Value::BigNumber(header_bytes),
        b'#' => Value::Bool(header == b"t"),
        b'$' | b'=' | b'!' => {
            let n = parse_int(header)?;
            if n < 0 {
                return Ok(Value::Nil);
            }
            let n = n as usize;
            if buf.len() < end + n + 2 {
                return Err(ProtocolError::MissingCrlf);
            }
            *pos = end + n + 2;
            let data = buf.slice(end..end + n);
            match kind {
                b'$' => Value::Bulk(data),
                b'=' => Value::Verbatim(data),
                _ => Value::Error(data),
            }
        }
        b'*' => {
            let n = parse_int(header)?;
            if n < 0 {
                Value::Nil
            } else {
                Value::Array(items(pos, n)?)
            }
        }
        b'~' => Value::Set(items(pos, parse_int(header)?)?),
        b'>' => Value::Push(items(pos, parse_int(header)?)?),
        b'%' => {
            let flat = items(pos, parse_int(header)?.saturating_mul(2))?;
            let mut kv = Vec::with_capacity(flat.len() / 2);
            let mut it = flat.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                kv.push((k, v));
            }
            Value::Map(kv)
        }
        b'|' => {
            // Skip the attribute map, return the value it annotates.
            let _ = items(pos, parse_int(header)?.saturating_mul(2))?;
            decode_at(buf, pos, depth + 1)?
        }
        other => return Err(ProtocolError::BadType(other)),
    })
}

/// If `frame` is an error reply, its text (without `-` and CRLF).
pub fn error_text(frame: &[u8]) -> Option<&[u8]> {
    match frame.first() {
        Some(b'-') => Some(frame[1..].strip_suffix(b"\r\n").unwrap_or(&frame[1..])),
        Some(b'!') => {
            let nl = memchr::memchr(b'\n', frame)?;
            Some(
                frame[nl + 1..]
                    .strip_suffix(b"\r\n")
                    .unwrap_or(&frame[nl + 1..]),
            )
        }
        _ => None,
    }
}

/// The complete element frames of an array (or set/push) frame, as zero-copy
/// slices. `None` if `frame` is not an aggregate of that kind (e.g. nil or an
/// error).
///
/// # Errors
/// [`ProtocolError`] for malformed input.
pub fn array_elements(frame: &Bytes) -> Result<Option<Vec<Bytes>>, ProtocolError> {
    if !matches!(frame.first(), Some(b'*' | b'~' | b'>')) {
        return Ok(None);
    }
    let (header, mut pos) = line(frame, 0)?.ok_or(ProtocolError::MissingCrlf)?;
    let n = parse_int(header)?;
    if n < 0 {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(n.min(4096) as usize);
    for _ in 0..n {
        let mut sc = Scanner::new();
        let len = sc.scan(&frame[pos..])?.ok_or(ProtocolError::MissingCrlf)?;
        out.push(frame.slice(pos..pos + len));
        pos += len;
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_all(b: &[u8]) -> Option<usize> {
        Scanner::new().scan(b).expect("valid")
    }

    #[test]
    fn scans_simple_types() {
        assert_eq!(scan_all(b"+OK\r\n"), Some(5));
        assert_eq!(scan_all(b"-ERR x\r\n+OK\r\n"), Some(8));
        assert_eq!(scan_all(b":12\r\n"), Some(5));
        assert_eq!(scan_all(b"$3\r\nfoo\r\n"), Some(9));
        assert_eq!(scan_all(b"$-1\r\n"), Some(5));
        assert_eq!(scan_all(b"*-1\r\n"), Some(5));
        assert_eq!(scan_all(b"_\r\n"), Some(3));
        assert_eq!(scan_all(b"%1\r\n+a\r\n:1\r\n"), Some(12));
        assert_eq!(scan_all(b"|1\r\n+a\r\n:1\r\n+v\r\n"), Some(16));
    }

    #[test]
    fn nested_and_partial() {
        let full = b"*2\r\n*1\r\n$1\r\na\r\n:5\r\n";
        for cut in 0..full.len() {
            let mut sc = Scanner::new();
            assert_eq!(sc.scan(&full[..cut]).expect("valid"), None, "cut {cut}");
            assert_eq!(sc.scan(full).expect("valid"), Some(full.len()));
        }
    }

    #[test]
    fn deep_nesting_does_not_recurse() {
        let mut v = Vec::new();
        for _ in 0..100_000 {
            v.extend_from_slice(b"*1\r\n");
        }
        v.extend_from_slice(b":1\r\n");
        assert_eq!(scan_all(&v), Some(v.len()));
        let frame = Bytes::from(v);
        assert_eq!(Value::decode(&frame), Err(ProtocolError::TooDeep));
    }

    #[test]
    fn crlf_without_type_byte_is_an_error() {
        // Found by fuzz/reply_scanner: "\r\n" as a frame sliced [1..0].
        assert_eq!(
            Scanner::new().scan(b"\r\n"),
            Err(ProtocolError::MissingCrlf)
        );
        assert_eq!(
            Scanner::new().scan(b"*1\r\n\r\n"),
            Err(ProtocolError::MissingCrlf)
        );
        let f = Bytes::from_static(b"\r\n");
        assert_eq!(Value::decode(&f), Err(ProtocolError::MissingCrlf));
    }

    #[test]
    fn rejects_garbage() {
        assert!(Scanner::new().scan(b"?x\r\n").is_err());
        assert!(Scanner::new().scan(b"$3\r\nfooXX").is_err());
        assert!(Scanner::new().scan(b":1x\r\n").is_ok()); // ints are not validated by the scanner
    }

    #[test]
    fn decode_and_elements() {
        let f = Bytes::from_static(b"*3\r\n$1\r\na\r\n$-1\r\n:7\r\n");
        assert_eq!(
            Value::decode(&f).expect("valid"),
            Value::Array(vec![
                Value::Bulk(Bytes::from_static(b"a")),
                Value::Nil,
                Value::Int(7)
            ])
        );
        let els = array_elements(&f).expect("valid").expect("array");
        assert_eq!(els[0], &b"$1\r\na\r\n"[..]);
        assert_eq!(els[1], &b"$-1\r\n"[..]);
        assert_eq!(els[2], &b":7\r\n"[..]);
        assert_eq!(error_text(b"-MOVED 1 h:1\r\n"), Some(&b"MOVED 1 h:1"[..]));
    }
}
