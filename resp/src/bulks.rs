//! The bulk strings of an encoded array (`*N` then `$len` bulks), walked in
//! place: each as a slice of the buffer, with no decode and no allocation.
//! Framed as Redis reads a request ([`crate::header::read_header`]); a
//! bulk's two trailing bytes must be there and are skipped unread.

use crate::header::read_header;

/// The bulks of one encoded array, in order; ends early (`None`) at the
/// first one that is not whole.
#[derive(Debug, Clone)]
pub struct Bulks<'a> {
    rest: &'a [u8],
    left: usize,
}

impl<'a> Bulks<'a> {
    /// None at all.
    pub const EMPTY: Bulks<'static> = Bulks { rest: &[], left: 0 };

    /// The bulks of the array at the start of `buf`; `None` when it does
    /// not start with an array header (a null array's `-1` included).
    pub fn new(buf: &'a [u8]) -> Option<Bulks<'a>> {
        let (left, at) = read_header(buf, b'*')?;
        Some(Bulks {
            rest: buf.get(at..)?,
            left,
        })
    }

    /// Bulks not yet read, as the array's header counts them.
    pub fn left(&self) -> usize {
        self.left
    }

    /// What follows the bulks read so far.
    pub fn rest(&self) -> &'a [u8] {
        self.rest
    }
}

impl<'a> Iterator for Bulks<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.left == 0 {
            return None;
        }
        let (len, at) = read_header(self.rest, b'$')?;
        let data = self.rest.get(at..at.checked_add(len)?)?;
        self.rest = self.rest.get(at + len + 2..)?;
        self.left -= 1;
        Some(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walks_the_bulks_and_stops_at_a_cut_one() {
        let cmd = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nv1\r\n";
        let mut b = Bulks::new(cmd).expect("an array");
        assert_eq!(b.left(), 3);
        assert_eq!(b.by_ref().collect::<Vec<_>>(), [&b"SET"[..], b"k", b"v1"]);
        assert!(b.rest().is_empty());
        assert_eq!(
            Bulks::new(&cmd[..cmd.len() - 1]).map(Iterator::count),
            Some(2)
        );
        assert!(Bulks::new(b"$3\r\nSET\r\n").is_none());
        assert!(Bulks::new(b"*-1\r\n").is_none());
    }
}
