//! Writing RESP: commands sent upstream, and the replies sidecache builds
//! itself, in the client's protocol.

use bytes::{BufMut, BytesMut};

use crate::frame::Value;
use crate::Proto;

/// Appends a command as a RESP array of bulk strings.
pub fn encode_command<A: AsRef<[u8]>>(out: &mut BytesMut, args: &[A]) {
    put_header(out, b'*', args.len() as i64);
    for a in args {
        put_bulk(out, a.as_ref());
    }
}

pub use crate::header::put_header;

/// Appends a bulk string.
pub fn put_bulk(out: &mut BytesMut, data: &[u8]) {
    put_header(out, b'$', data.len() as i64);
    out.reserve(data.len() + 2);
    out.put_slice(data);
    out.put_slice(b"\r\n");
}

/// Appends replies to a buffer in one protocol version.
#[derive(Debug)]
pub struct Reply<'a> {
    /// Destination.
    pub out: &'a mut BytesMut,
    /// RESP2 or RESP3.
    pub proto: Proto,
}

impl Reply<'_> {
    /// `+text`.
    pub fn status(&mut self, text: &str) {
        self.out.put_u8(b'+');
        self.out.put_slice(text.as_bytes());
        self.out.put_slice(b"\r\n");
    }

    /// A `HELP` reply: an array of status lines, as Redis's `addReplyHelp`.
    pub fn help(&mut self, lines: &[&str]) {
        self.array(lines.len());
        for l in lines {
            self.status(l);
        }
    }

    /// `+OK`.
    pub fn ok(&mut self) {
        self.out.put_slice(b"+OK\r\n");
    }

    /// `-text`; CR/LF in the text become spaces (as Redis does). `text`
    /// includes the code, e.g. `ERR unknown command`.
    pub fn error(&mut self, text: &str) {
        self.out.put_u8(b'-');
        for b in text.bytes() {
            self.out
                .put_u8(if b == b'\r' || b == b'\n' { b' ' } else { b });
        }
        self.out.put_slice(b"\r\n");
    }

    /// `:n`.
    pub fn int(&mut self, n: i64) {
        put_header(self.out, b':', n);
    }

    /// A bulk string.
    pub fn bulk(&mut self, data: &[u8]) {
        put_bulk(self.out, data);
    }

    /// Nil bulk (`$-1` / `_`).
    pub fn nil(&mut self) {
        match self.proto {
            Proto::Resp2 => self.out.put_slice(b"$-1\r\n"),
            Proto::Resp3 => self.out.put_slice(b"_\r\n"),
        }
    }

    /// Array header.
    pub fn array(&mut self, n: usize) {
        put_header(self.out, b'*', n as i64);
    }

    /// Set header (`~n`, or an array in RESP2).
    pub fn set(&mut self, n: usize) {
        match self.proto {
            Proto::Resp2 => put_header(self.out, b'*', n as i64),
            Proto::Resp3 => put_header(self.out, b'~', n as i64),
        }
    }

    /// Map header (`%n`, or an array of 2n in RESP2).
    pub fn map(&mut self, n: usize) {
        match self.proto {
            Proto::Resp2 => put_header(self.out, b'*', 2 * n as i64),
            Proto::Resp3 => put_header(self.out, b'%', n as i64),
        }
    }

    /// A decoded value (e.g. a RESP3 reply sidecache keeps), written in
    /// this reply's protocol: for RESP2 as Redis shows RESP3 types there
    /// (map: flat array; set and push: array; double and big number: bulk;
    /// boolean: 1 or 0; verbatim: bulk of the text; nil: `$-1`).
    pub fn value(&mut self, v: &Value) {
        let line = |out: &mut BytesMut, kind: u8, b: &[u8]| {
            out.put_u8(kind);
            out.put_slice(b);
            out.put_slice(b"\r\n");
        };
        let resp3 = self.proto == Proto::Resp3;
        match v {
            Value::Nil => self.nil(),
            Value::Status(b) => line(self.out, b'+', b),
            Value::Error(b) => line(self.out, b'-', b),
            Value::Int(i) => self.int(*i),
            Value::Bulk(b) => self.bulk(b),
            Value::Double(b) if resp3 => line(self.out, b',', b),
            Value::BigNumber(b) if resp3 => line(self.out, b'(', b),
            Value::Double(b) | Value::BigNumber(b) => self.bulk(b),
            Value::Bool(t) if resp3 => self.out.put_slice(if *t { b"#t\r\n" } else { b"#f\r\n" }),
            Value::Bool(t) => self.int(i64::from(*t)),
            Value::Verbatim(b) if resp3 => {
                put_header(self.out, b'=', b.len() as i64);
                self.out.put_slice(b);
                self.out.put_slice(b"\r\n");
            }
            // "txt:" (the format) and the text.
            Value::Verbatim(b) => self.bulk(b.get(4..).unwrap_or_default()),
            Value::Array(items) | Value::Set(items) | Value::Push(items) => {
                match v {
                    Value::Set(_) if resp3 => put_header(self.out, b'~', items.len() as i64),
                    Value::Push(_) if resp3 => put_header(self.out, b'>', items.len() as i64),
                    _ => self.array(items.len()),
                }
                for i in items {
                    self.value(i);
                }
            }
            Value::Map(kv) => {
                self.map(kv.len());
                for (k, v) in kv {
                    self.value(k);
                    self.value(v);
                }
            }
        }
    }

    /// A text reply that Redis sends as a verbatim string in RESP3 (INFO,
    /// CLIENT INFO/LIST).
    pub fn verbatim(&mut self, text: &[u8]) {
        match self.proto {
            Proto::Resp2 => put_bulk(self.out, text),
            Proto::Resp3 => {
                put_header(self.out, b'=', text.len() as i64 + 4);
                self.out.put_slice(b"txt:");
                self.out.put_slice(text);
                self.out.put_slice(b"\r\n");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_bytes() {
        let mut b = BytesMut::new();
        let mut r = Reply {
            out: &mut b,
            proto: Proto::Resp2,
        };
        r.ok();
        r.error("ERR a\r\nb");
        r.int(-3);
        r.bulk(b"");
        r.nil();
        r.map(1);
        assert_eq!(
            &b[..],
            b"+OK\r\n-ERR a  b\r\n:-3\r\n$0\r\n\r\n$-1\r\n*2\r\n"
        );
        let mut b = BytesMut::new();
        let mut r = Reply {
            out: &mut b,
            proto: Proto::Resp3,
        };
        r.nil();
        r.map(2);
        r.verbatim(b"x");
        assert_eq!(&b[..], b"_\r\n%2\r\n=5\r\ntxt:x\r\n");
    }

    #[test]
    fn values_in_either_protocol() {
        let v = Value::decode(&bytes::Bytes::from_static(
            b"%2\r\n$7\r\nmodules\r\n*1\r\n%1\r\n$4\r\nname\r\n$3\r\nlua\r\n$1\r\nx\r\n~2\r\n#t\r\n,1.5\r\n",
        ))
        .expect("a valid frame");
        let write = |proto| {
            let mut b = BytesMut::new();
            Reply { out: &mut b, proto }.value(&v);
            String::from_utf8(b.to_vec()).expect("ASCII")
        };
        assert_eq!(
            write(Proto::Resp3),
            "%2\r\n$7\r\nmodules\r\n*1\r\n%1\r\n$4\r\nname\r\n$3\r\nlua\r\n$1\r\nx\r\n~2\r\n#t\r\n,1.5\r\n"
        );
        assert_eq!(
            write(Proto::Resp2),
            "*4\r\n$7\r\nmodules\r\n*1\r\n*2\r\n$4\r\nname\r\n$3\r\nlua\r\n$1\r\nx\r\n*2\r\n:1\r\n$3\r\n1.5\r\n"
        );
    }

    #[test]
    fn encodes_commands() {
        let mut b = BytesMut::new();
        encode_command(&mut b, &["GET", "k"]);
        assert_eq!(&b[..], b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
    }
}
