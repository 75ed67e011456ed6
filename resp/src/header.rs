//! Header lines, `<kind><n>\r\n`: what [`crate::encode`] writes before an
//! array, a bulk or a map, and what [`crate::frame`] writes when it
//! re-encodes a value (their one shared piece, kept here so that neither
//! of the two depends on the other for it).

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
