use super::*;

fn args(s: &str) -> Vec<Bytes> {
    s.split(' ')
        .map(|a| Bytes::copy_from_slice(a.as_bytes()))
        .collect()
}

fn info(arity: i64, first: i64, last: i64, step: i64, specs: Vec<KeySpec>) -> CommandInfo {
    CommandInfo {
        name: "x".into(),
        arity,
        flags: Flags::default(),
        first,
        last,
        step,
        specs,
        subcommands: Names::default(),
        handling: Handling::Forward,
        invalidation: super::handling::Invalidation::None,
        write_behind: false,
        read: None,
        id: 0,
        name_id: 0,
        script_body: None,
    }
}

fn keys(c: &CommandInfo, a: &str) -> Result<Vec<usize>, KeysError> {
    let mut out = Vec::new();
    c.keys(&args(a), &mut out).map(|_| out)
}

fn complete(c: &CommandInfo, a: &str) -> bool {
    let mut out = Vec::new();
    c.keys(&args(a), &mut out).expect("keys")
}

fn range(begin: usize, lastkey: i64, keystep: i64, limit: i64) -> KeySpec {
    KeySpec {
        writes: false,
        begin: BeginSearch::Index(begin),
        find: FindKeys::Range {
            lastkey,
            keystep,
            limit,
        },
    }
}

#[test]
fn single_and_range_keys() {
    let get = info(2, 1, 1, 1, vec![range(1, 0, 1, 0)]);
    assert_eq!(keys(&get, "GET k"), Ok(vec![1]));
    assert_eq!(keys(&get, "GET"), Err(KeysError::Invalid));
    let mset = info(-3, 1, -1, 2, vec![range(1, -1, 2, 0)]);
    assert_eq!(keys(&mset, "MSET a 1 b 2"), Ok(vec![1, 3]));
    let del = info(-2, 1, -1, 1, vec![range(1, -1, 1, 0)]);
    assert_eq!(keys(&del, "DEL a b c"), Ok(vec![1, 2, 3]));
}

#[test]
fn keynum_and_keyword() {
    // EVAL script numkeys key... arg...
    let eval = info(
        -3,
        0,
        0,
        0,
        vec![KeySpec {
            writes: false,
            begin: BeginSearch::Index(2),
            find: FindKeys::Keynum {
                keynumidx: 0,
                firstkey: 1,
                keystep: 1,
            },
        }],
    );
    assert_eq!(keys(&eval, "EVAL s 2 a b x"), Ok(vec![3, 4]));
    assert_eq!(keys(&eval, "EVAL s 0"), Ok(vec![]));
    assert_eq!(keys(&eval, "EVAL s x"), Err(KeysError::Invalid));
    // Found by fuzz/command_keys: a huge numkeys spun for ~10^12 iterations
    // (and i64::MAX overflowed).
    assert_eq!(keys(&eval, "EVAL s 1000000000000"), Ok(vec![]));
    assert_eq!(keys(&eval, "EVAL s 9223372036854775807 a"), Ok(vec![3]));
    // XREAD ... STREAMS k1 k2 id1 id2
    let xread = info(
        -4,
        0,
        0,
        0,
        vec![KeySpec {
            writes: false,
            begin: BeginSearch::Keyword {
                keyword: b"STREAMS".to_vec(),
                startfrom: 1,
            },
            find: FindKeys::Range {
                lastkey: -1,
                keystep: 1,
                limit: 2,
            },
        }],
    );
    assert_eq!(
        keys(&xread, "XREAD COUNT 2 streams a b 0 0"),
        Ok(vec![4, 5])
    );
    // ZUNIONSTORE dest numkeys k1 k2: two specs.
    let zu = info(
        -4,
        0,
        0,
        0,
        vec![
            range(1, 0, 1, 0),
            KeySpec {
                writes: false,
                begin: BeginSearch::Index(2),
                find: FindKeys::Keynum {
                    keynumidx: 0,
                    firstkey: 1,
                    keystep: 1,
                },
            },
        ],
    );
    assert_eq!(
        keys(&zu, "ZUNIONSTORE d 2 a b WEIGHTS 1 2"),
        Ok(vec![1, 3, 4])
    );
    // SORT: the first key is expressible, the STORE target is not.
    let unknown = KeySpec {
        writes: false,
        begin: BeginSearch::Unknown,
        find: FindKeys::Unknown,
    };
    let mut sort = info(-2, 1, 1, 1, vec![range(1, 0, 1, 0), unknown.clone()]);
    sort.flags.movablekeys = true;
    assert_eq!(keys(&sort, "SORT k STORE d"), Ok(vec![1]));
    assert!(!complete(&sort, "SORT k STORE d"));
    assert!(complete(&zu, "ZUNIONSTORE d 2 a b"));
    // Nothing expressible and movable: unknown.
    let mut opaque = info(-2, 0, 0, 0, vec![unknown]);
    opaque.flags.movablekeys = true;
    assert_eq!(keys(&opaque, "X a"), Err(KeysError::Unknown));
}

#[test]
fn legacy_positions_without_specs() {
    let c = info(-2, 1, -1, 1, vec![]);
    assert_eq!(keys(&c, "X a b"), Ok(vec![1, 2]));
    let keyless = info(-1, 0, 0, 0, vec![]);
    assert_eq!(keys(&keyless, "PING"), Ok(vec![]));
}

#[test]
fn lowercase_is_bounded() {
    let mut b = [0u8; MAX_NAME];
    assert_eq!(lowercase(b"GeT", &mut b), Some(&b"get"[..]));
    assert_eq!(lowercase(&[b'a'; 65], &mut b), None);
}

#[test]
fn written_keys_follow_spec_flags() {
    // ZUNIONSTORE dest numkeys src...: only the destination is written.
    let mut dest = range(1, 0, 1, 0);
    dest.writes = true;
    let zu = info(
        -4,
        0,
        0,
        0,
        vec![
            dest,
            KeySpec {
                writes: false,
                begin: BeginSearch::Index(2),
                find: FindKeys::Keynum {
                    keynumidx: 0,
                    firstkey: 1,
                    keystep: 1,
                },
            },
        ],
    );
    assert!(zu.writes_keys());
    let mut out = Vec::new();
    zu.keys_where(&args("ZUNIONSTORE d 2 a b"), &mut out, true)
        .expect("keys");
    assert_eq!(out, vec![1]);
    // PFCOUNT: a readonly command with an RW key.
    let mut rw = range(1, -1, 1, 0);
    rw.writes = true;
    let pfcount = info(-2, 1, -1, 1, vec![rw]);
    assert!(!pfcount.flags.write && pfcount.writes_keys());
}

#[test]
fn extreme_spec_numbers_do_not_overflow() {
    // Found by fuzz/command_keys: a key spec from a broken upstream with
    // keynumidx = i64::MAX overflowed `first + keynumidx`.
    for (keynumidx, firstkey) in [(i64::MAX, 1), (0, i64::MAX), (i64::MIN, 0)] {
        let c = info(
            -2,
            0,
            0,
            0,
            vec![KeySpec {
                writes: false,
                begin: BeginSearch::Index(1),
                find: FindKeys::Keynum {
                    keynumidx,
                    firstkey,
                    keystep: 1,
                },
            }],
        );
        let mut out = Vec::new();
        let _ = c.keys(&args("X 1 a"), &mut out);
        assert!(out.iter().all(|&k| k < 3));
    }
    // And arity = i64::MIN overflowed `-arity`.
    assert!(!info(i64::MIN, 0, 0, 0, vec![]).arity_ok(3));
    let c = info(-2, 0, 0, 0, vec![range(1, i64::MAX, 1, 0)]);
    assert_eq!(keys(&c, "X a b"), Ok(vec![1, 2]));
}

#[test]
fn legacy_step_max_does_not_overflow() {
    // Found by fuzz/command_keys (seed `regress-legacy-step-max`): a
    // `COMMAND` entry without key specs whose legacy step is i64::MAX
    // overflowed `i += step` after the first key (in release the wrapped
    // position became a key index far past the arguments).
    let c = info(5, 3, 3, i64::MAX, vec![]);
    assert_eq!(keys(&c, "X a b c d"), Ok(vec![3]));
    let c = info(-2, 1, -1, i64::MAX, vec![]);
    assert_eq!(keys(&c, "X a b c"), Ok(vec![1]));
    let c = info(-2, i64::MAX, i64::MAX, i64::MAX, vec![]);
    assert_eq!(keys(&c, "X a"), Ok(vec![]));
}

#[test]
fn written_keys_are_keys_when_the_write_spec_is_unknown() {
    // Found by fuzz/command_keys (seed `regress-written-not-key`): with a
    // read spec finding keys 1, 3, 5 and the only write spec unknown, the
    // written-only search fell back to the legacy positions 1..=3 and
    // reported 2, which is not a key, as written.
    let c = info(
        -1,
        1,
        3,
        1,
        vec![
            range(1, 4, 2, 0),
            KeySpec {
                writes: true,
                begin: BeginSearch::Unknown,
                find: FindKeys::Range {
                    lastkey: 0,
                    keystep: 1,
                    limit: 0,
                },
            },
        ],
    );
    let a = args("X a b c d e");
    let mut all = Vec::new();
    assert_eq!(c.keys(&a, &mut all), Ok(false));
    assert_eq!(all, vec![1, 3, 5]);
    let mut written = Vec::new();
    assert_eq!(c.keys_where(&a, &mut written, true), Ok(false));
    assert!(written.iter().all(|k| all.contains(k)), "{written:?}");
    // With no spec expressible at all, the legacy positions still serve.
    let c = info(
        -1,
        1,
        3,
        1,
        vec![KeySpec {
            writes: true,
            begin: BeginSearch::Unknown,
            find: FindKeys::Unknown,
        }],
    );
    let mut out = Vec::new();
    assert_eq!(c.keys(&a, &mut out), Ok(false));
    assert_eq!(out, vec![1, 2, 3]);
}
