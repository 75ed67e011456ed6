//! Writing RESP: commands sent upstream, and the replies sidecache builds
//! itself, in the client's protocol.

use bytes::{BufMut, BytesMut};

use crate::Proto;

/// Appends a command as a RESP array of bulk strings.
pub fn encode_command<A: AsRef<[u8]>>(out: &mut BytesMut, args: &[A]) {
    put_header(out, b'*', args.len() as i64);
    for a in args {
        put_bulk(out, a.as_ref());
    }
}

/// Appends `<kind><n>\r\n`.
pub fn put_header(out: &mut BytesMut, kind: u8, n: i64) {
    let mut b = itoa::Buffer::new();
    let s = b.format(n);
    out.reserve(s.len() + 3);
    out.put_u8(kind);
    out.put_slice(s.as_bytes());
    out.put_slice(b"\r\n");
}

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

    /// Map header (`%n`, or an array of 2n in RESP2).
    pub fn map(&mut self, n: usize) {
        match self.proto {
            Proto::Resp2 => put_header(self.out, b'*', 2 * n as i64),
            Proto::Resp3 => put_header(self.out, b'%', n as i64),
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
    fn encodes_commands() {
        let mut b = BytesMut::new();
        encode_command(&mut b, &["GET", "k"]);
        assert_eq!(&b[..], b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
    }
}
