//! Header lines, `<kind><n>\r\n`: what [`crate::encode`] writes before an
//! array, a bulk or a map, and what [`crate::frame`] writes when it
//! re-encodes a value (their one shared piece, kept here so that neither
//! of the two depends on the other for it); and [`read_header`], which
//! reads one back in place.

use bytes::{BufMut, BytesMut};

/// Appends `<kind><n>\r\n`.
pub fn put_header(out: &mut BytesMut, kind: u8, n: i64) {
    let mut b = itoa::Buffer::new();
    let s = b.format(n);
    out.reserve(s.len() + 3);
    out.put_u8(kind);
    out.put_slice(s.as_bytes());
    out.put_slice(b"\r\n");
}

/// `<kind><n>\r\n` at the start of `buf`, read as Redis reads a request's
/// header (the line ends at `\r`, the byte after it is skipped unread):
/// `n`, not negative, and where what follows starts. `None` for another
/// kind, a line not yet whole or a number that is not one.
pub fn read_header(buf: &[u8], kind: u8) -> Option<(usize, usize)> {
    if buf.first() != Some(&kind) {
        return None;
    }
    let end = crate::find::byte(b'\r', buf)?;
    let n = crate::int::parse_i64(buf.get(1..end)?)?;
    Some((usize::try_from(n).ok()?, end + 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_read_back_as_written() {
        let mut out = BytesMut::new();
        put_header(&mut out, b'*', 12);
        out.extend_from_slice(b"$3");
        assert_eq!(read_header(&out, b'*'), Some((12, 5)));
        assert_eq!(read_header(&out[5..], b'$'), None, "no \\r yet");
        assert_eq!(read_header(b"*-1\r\n", b'*'), None);
        assert_eq!(read_header(b"$x\r\n", b'$'), None);
        assert_eq!(read_header(b"$3\r\n", b'*'), None);
    }
}
