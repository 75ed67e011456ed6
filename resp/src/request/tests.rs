use super::*;

fn limits() -> Limits {
    Limits {
        max_bulk: 512 * 1024 * 1024,
        max_multibulk: 1024 * 1024,
        inline_quotes: InlineQuotes::Strict,
    }
}

fn parse_all(input: &[u8]) -> Result<Vec<Vec<Vec<u8>>>, ProtocolError> {
    let mut p = Parser::new(limits());
    let mut buf = BytesMut::from(input);
    let mut req = Request::default();
    let mut out = Vec::new();
    while p.parse(&mut buf, &mut req)?.is_some() {
        out.push(req.args.iter().map(|a| a.to_vec()).collect());
    }
    Ok(out)
}

#[test]
fn multibulk_and_inline() {
    let r = parse_all(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\nPING\r\n*0\r\n\r\nset a \"b c\"\n")
        .expect("valid");
    assert_eq!(
        r,
        vec![
            vec![b"GET".to_vec(), b"k".to_vec()],
            vec![b"PING".to_vec()],
            vec![b"set".to_vec(), b"a".to_vec(), b"b c".to_vec()]
        ]
    );
}

#[test]
fn inline_is_reencoded() {
    let mut p = Parser::new(limits());
    let mut buf = BytesMut::from(&b"PING_INLINE x\r\n"[..]);
    let mut req = Request::default();
    assert!(p.parse(&mut buf, &mut req).expect("valid").is_some());
    assert_eq!(&req.raw[..], b"*2\r\n$11\r\nPING_INLINE\r\n$1\r\nx\r\n");
    assert_eq!(&req.args[1][..], b"x");
}

#[test]
fn every_split_point() {
    let input = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n";
    for cut in 0..input.len() {
        let mut p = Parser::new(limits());
        let mut buf = BytesMut::from(&input[..cut]);
        let mut req = Request::default();
        assert_eq!(
            p.parse(&mut buf, &mut req).expect("valid"),
            None,
            "cut {cut}"
        );
        buf.extend_from_slice(&input[cut..]);
        assert!(p.parse(&mut buf, &mut req).expect("valid").is_some());
        assert_eq!(&req.args[2][..], b"hello");
        assert_eq!(&req.raw[..], &input[..]);
        assert!(buf.is_empty());
    }
}

#[test]
fn binary_and_empty_values() {
    let r = parse_all(b"*3\r\n$3\r\nSET\r\n$0\r\n\r\n$4\r\n\r\n\x00\xff\r\n").expect("valid");
    assert_eq!(r[0][1], b"");
    assert_eq!(r[0][2], b"\r\n\x00\xff");
}

#[test]
fn redis_error_texts() {
    let e = |b: &[u8]| parse_all(b).expect_err("invalid").to_string();
    assert_eq!(
        e(b"*3000000000\r\n"),
        "Protocol error: invalid multibulk length"
    );
    assert_eq!(e(b"*abc\r\n"), "Protocol error: invalid multibulk length");
    assert_eq!(
        e(b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\nfooz\r\n"),
        "Protocol error: expected '$', got 'f'"
    );
    assert_eq!(
        e(b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$-10\r\n"),
        "Protocol error: invalid bulk length"
    );
    assert_eq!(
        e(b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$2000000000\r\n"),
        "Protocol error: invalid bulk length"
    );
    assert_eq!(
        e(b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$blabla\r\n"),
        "Protocol error: invalid bulk length"
    );
    assert_eq!(e(b"*1\r\nfoo\r\n"), "Protocol error: expected '$', got 'f'");
    assert_eq!(
        e(b"set \"a b\"c\r\n"),
        "Protocol error: unbalanced quotes in request"
    );
    assert_eq!(
        e(b"set \"abc\r\n"),
        "Protocol error: unbalanced quotes in request"
    );
    assert_eq!(
        e(&vec![b'a'; INLINE_MAX + 1]),
        "Protocol error: too big inline request"
    );
    let mut big = b"*".to_vec();
    big.extend(vec![b'1'; INLINE_MAX + 1]);
    assert_eq!(e(&big), "Protocol error: too big mbulk count string");
}

#[test]
fn bogus_lengths_do_not_allocate() {
    // A 512 MiB claim with a few bytes behind it waits for more and holds
    // only what arrived.
    let mut p = Parser::new(limits());
    let mut buf = BytesMut::from(&b"*2\r\n$3\r\nGET\r\n$536870912\r\nabc"[..]);
    let mut req = Request::default();
    assert_eq!(p.parse(&mut buf, &mut req).expect("valid"), None);
    assert!(buf.capacity() < 1024);
    let mut p = Parser::new(Limits {
        max_bulk: 1024 * 1024,
        max_multibulk: 100,
        inline_quotes: InlineQuotes::Strict,
    });
    let mut buf = BytesMut::from(&b"*101\r\n"[..]);
    assert_eq!(
        p.parse(&mut buf, &mut req),
        Err(ProtocolError::InvalidMultibulkLength)
    );
}

#[test]
fn inline_quoting() {
    assert_eq!(
        split_args(b"a 'b c' \"d\\x41\\n\""),
        Some(vec![b"a".to_vec(), b"b c".to_vec(), b"dA\n".to_vec()])
    );
    assert_eq!(split_args(b"   "), Some(vec![]));
    // Valkey 9: a closing quote does not end the argument, a space does.
    let joined = |l: &[u8]| split_args_with(l, InlineQuotes::Joined);
    let strs = |v: &[&str]| Some(v.iter().map(|s| s.as_bytes().to_vec()).collect());
    assert_eq!(split_args(b"set \"a b\"c"), None);
    assert_eq!(joined(b"set \"a b\"c v"), strs(&["set", "a bc", "v"]));
    assert_eq!(joined(b"\"a\"'b'c \"d\""), strs(&["abc", "d"]));
    assert_eq!(
        joined(b"'a\\'b'c \"\\x41\"B x\"\""),
        strs(&["a'bc", "AB", "x"])
    );
    assert_eq!(joined(b"''''"), strs(&[""]));
    assert_eq!(joined(b"\"a\"b\""), None);
    assert_eq!(joined(b"\"ab"), None);
    assert_eq!(split_args(b"'it\\'s'"), Some(vec![b"it's".to_vec()]));
}

#[test]
fn command_names_in_a_pipeline() {
    let p = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*3\r\n$4\r\nEVAL\r\n$8\r\nreturn 1\r\n$1\r\n0\r\n";
    assert_eq!(command_name(p, 0), Some(&b"GET"[..]));
    assert_eq!(command_name(p, 1), Some(&b"EVAL"[..]));
    assert_eq!(command_name(p, 2), None);
    assert_eq!(command_name(b"*1\r\n$4\r\nEV", 0), None);
    assert_eq!(command_name(b"", 0), None);
}
