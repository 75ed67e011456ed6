//! Redis's glob-style pattern matching (`stringmatchlen` in Redis's
//! `util.c`), used to count the pattern subscriptions a `PUBLISH` reached
//! through this proxy: `*`, `?`, `[abc]`, `[^a-z]`, and `\` escapes.

/// Whether `s` matches the pattern `p`, as Redis's `PSUBSCRIBE` decides.
pub fn matches(p: &[u8], s: &[u8]) -> bool {
    // Nesting of `*` is bounded the way Redis bounds it (no exponential
    // blow-up): one level of backtracking to the last star is enough.
    let (mut pi, mut si) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    loop {
        if pi < p.len() {
            match p[pi] {
                b'*' => {
                    while pi + 1 < p.len() && p[pi + 1] == b'*' {
                        pi += 1;
                    }
                    star = Some((pi, si));
                    pi += 1;
                    continue;
                }
                b'?' if si < s.len() => {
                    pi += 1;
                    si += 1;
                    continue;
                }
                b'[' if si < s.len() => {
                    if let Some((hit, next)) = class(p, pi, s[si]) {
                        if hit {
                            pi = next;
                            si += 1;
                            continue;
                        }
                    }
                }
                b'\\' if pi + 1 < p.len() && si < s.len() && p[pi + 1] == s[si] => {
                    pi += 2;
                    si += 1;
                    continue;
                }
                c if si < s.len() && c == s[si] && c != b'?' && c != b'[' => {
                    pi += 1;
                    si += 1;
                    continue;
                }
                _ => {}
            }
        } else if si == s.len() {
            return true;
        }
        // Mismatch: let the last star swallow one more byte.
        match star {
            Some((sp, ss)) if ss < s.len() => {
                star = Some((sp, ss + 1));
                pi = sp + 1;
                si = ss + 1;
            }
            _ => return false,
        }
    }
}

/// Matches `c` against the class opening at `p[open] == b'['`: whether it
/// matched and where the pattern continues. An unterminated class runs to
/// the end of the pattern, as in Redis.
fn class(p: &[u8], open: usize, c: u8) -> Option<(bool, usize)> {
    let mut i = open + 1;
    let not = p.get(i) == Some(&b'^');
    if not {
        i += 1;
    }
    let mut hit = false;
    loop {
        match p.get(i) {
            None => {
                // Redis: an unterminated class ends the pattern; the
                // pattern index rests on its last byte.
                return Some((hit != not, p.len()));
            }
            Some(b']') => {
                i += 1;
                break;
            }
            Some(b'\\') if i + 1 < p.len() => {
                if p[i + 1] == c {
                    hit = true;
                }
                i += 2;
            }
            Some(&lo) if i + 2 < p.len() && p[i + 1] == b'-' => {
                let hi = p[i + 2];
                let (lo, hi) = if lo > hi { (hi, lo) } else { (lo, hi) };
                if (lo..=hi).contains(&c) {
                    hit = true;
                }
                i += 3;
            }
            Some(&x) => {
                if x == c {
                    hit = true;
                }
                i += 1;
            }
        }
    }
    Some((hit != not, i))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::matches;

    #[test]
    fn redis_globs() {
        for (p, s, want) in [
            ("*", "", true),
            ("*", "anything", true),
            ("foo*", "foo", true),
            ("foo*", "foobar", true),
            ("foo*", "fo", false),
            ("*bar", "foobar", true),
            ("f*b*r", "foobar", true),
            ("f?o", "foo", true),
            ("f?o", "fo", false),
            ("h[ae]llo", "hello", true),
            ("h[ae]llo", "hillo", false),
            ("h[^e]llo", "hallo", true),
            ("h[^e]llo", "hello", false),
            ("h[a-b]llo", "hbllo", true),
            ("h[b-a]llo", "hallo", true),
            ("h[a-b]llo", "hcllo", false),
            ("h\\*llo", "h*llo", true),
            ("h\\*llo", "hello", false),
            ("__keyspace@0__:*", "__keyspace@0__:mykey", true),
            ("__key*__:*", "__keyevent@0__:set", true),
            ("a*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaac", false),
            ("news.*", "news.art.figurative", true),
            ("ab", "abc", false),
        ] {
            assert_eq!(matches(p.as_bytes(), s.as_bytes()), want, "{p} vs {s}");
        }
    }
}
