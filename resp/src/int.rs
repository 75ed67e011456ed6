//! The one integer parser, for requests and replies alike.

/// Parses a Redis integer (`string2ll`): optional `-`, digits, no leading
/// `+`, no spaces, no leading zeros except `0` itself.
#[inline]
pub fn parse_i64(s: &[u8]) -> Option<i64> {
    // The common case, a length or count: a few digits, no sign. Up to 18
    // digits cannot overflow, so no checked arithmetic (callgrind: about
    // a third of the instructions; four such numbers frame every SET).
    if let [first @ b'1'..=b'9', rest @ ..] = s {
        if rest.len() < 18 {
            let mut v = i64::from(first - b'0');
            for &c in rest {
                if !c.is_ascii_digit() {
                    return None;
                }
                v = v * 10 + i64::from(c - b'0');
            }
            return Some(v);
        }
    }
    parse_i64_slow(s)
}

fn parse_i64_slow(s: &[u8]) -> Option<i64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    if s == b"0" {
        return Some(0);
    }
    let (neg, d) = if s[0] == b'-' {
        (true, &s[1..])
    } else {
        (false, s)
    };
    if d.is_empty() || d[0] == b'0' {
        return None;
    }
    let mut v: i64 = 0;
    for &c in d {
        if !c.is_ascii_digit() {
            return None;
        }
        let digit = i64::from(c - b'0');
        v = if neg {
            v.checked_mul(10)?.checked_sub(digit)?
        } else {
            v.checked_mul(10)?.checked_add(digit)?
        };
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::parse_i64;

    #[test]
    fn parses_as_redis_does() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-5"), Some(-5));
        assert_eq!(parse_i64(b"007"), None);
        assert_eq!(parse_i64(b"+1"), None);
        assert_eq!(parse_i64(b"-0"), None);
        assert_eq!(parse_i64(b"-"), None);
        assert_eq!(parse_i64(b""), None);
        assert_eq!(parse_i64(b"1 "), None);
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"9223372036854775808"), None);
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_i64(b"-9223372036854775809"), None);
        assert_eq!(
            parse_i64(b"999999999999999999"),
            Some(999_999_999_999_999_999)
        );
        assert_eq!(
            parse_i64(b"1000000000000000000"),
            Some(1_000_000_000_000_000_000)
        );
        assert_eq!(parse_i64(b"12a"), None);
        assert_eq!(parse_i64(b"1-"), None);
    }

    proptest::proptest! {
        /// The fast path agrees with the checked parser everywhere.
        #[test]
        fn fast_path_agrees(s in proptest::collection::vec(proptest::prop_oneof![proptest::strategy::Just(b'-'), b'0'..=b'9', proptest::prelude::any::<u8>()], 0..22)) {
            proptest::prop_assert_eq!(parse_i64(&s), super::parse_i64_slow(&s));
        }
    }
}
