//! Finding the end of a line: the one byte search every RESP reader here
//! does, once per header line.
//!
//! Header lines (`*3`, `$16`, `+OK`, `:1`) are a few bytes long. For them
//! `memchr`'s set-up (alignment, vector loads, a call through its dispatch)
//! costs more than the search: callgrind counted about 130 instructions a
//! call, four calls to parse one `SET`. A byte loop over the first
//! 16 bytes finds such a line in a handful; a longer one (an inline
//! request, a long status or error) goes on with `memchr`.

/// How many bytes the byte loop looks at before handing over to `memchr`.
const SHORT: usize = 16;

/// Position of the first `needle` in `hay`.
#[inline]
pub fn byte(needle: u8, hay: &[u8]) -> Option<usize> {
    let head = &hay[..hay.len().min(SHORT)];
    if let Some(i) = head.iter().position(|&b| b == needle) {
        return Some(i);
    }
    if hay.len() <= SHORT {
        return None;
    }
    memchr::memchr(needle, &hay[SHORT..]).map(|i| SHORT + i)
}

#[cfg(test)]
mod tests {
    use super::byte;
    use proptest::prelude::*;

    #[test]
    fn finds_in_the_head_in_the_tail_and_not_at_all() {
        assert_eq!(byte(b'\r', b"*3\r\n"), Some(2));
        assert_eq!(byte(b'\r', b""), None);
        assert_eq!(byte(b'\r', b"0123456789abcdef"), None);
        assert_eq!(byte(b'\r', b"0123456789abcdef\r"), Some(16));
        assert_eq!(byte(b'\r', b"0123456789abcde\r"), Some(15));
        let long = [b"x".repeat(100).as_slice(), b"\r\n"].concat();
        assert_eq!(byte(b'\r', &long), Some(100));
    }

    proptest! {
        #[test]
        fn agrees_with_memchr(hay in proptest::collection::vec(prop_oneof![Just(b'\r'), Just(b'\n'), any::<u8>()], 0..80), needle in prop_oneof![Just(b'\r'), Just(b'\n')]) {
            prop_assert_eq!(byte(needle, &hay), memchr::memchr(needle, &hay));
        }
    }
}
