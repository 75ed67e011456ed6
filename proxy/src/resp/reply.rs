//! Writers for replies the proxy builds itself, in the client's protocol.

use bytes::{BufMut, BytesMut};
use sidecache_pool::resp::{put_bulk, put_header};
use sidecache_pool::Proto;

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
}
