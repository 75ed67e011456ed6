//! Property tests of the client request parser: any command encoded as a
//! multibulk, or written inline (plain or quoted), parses back to its
//! arguments; a stream of requests cut anywhere parses into the same
//! requests as the whole stream. (The cargo-fuzz targets in `fuzz/` check
//! the same properties on arbitrary bytes.)

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use sidecache_resp::encode::encode_command;
use sidecache_resp::request::{InlineQuotes, Limits, Parser, Request};

const LIMITS: Limits = Limits {
    max_bulk: 512 * 1024 * 1024,
    max_multibulk: i32::MAX as u64,
    inline_quotes: InlineQuotes::Strict,
};

/// How one command is written on the wire.
#[derive(Debug, Clone)]
enum Wire {
    Multibulk,
    /// Unquoted words separated by spaces.
    Inline,
    /// Every argument in double quotes with `\xHH` escapes.
    Quoted,
}

fn args(max_len: usize) -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(prop::collection::vec(any::<u8>(), 0..max_len), 1..8)
}

/// Words an inline request can carry unquoted.
fn words() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let c = any::<u8>().prop_filter("plain", |c| {
        !c.is_ascii_whitespace() && !matches!(c, b'"' | b'\'' | 0 | 0x0b)
    });
    // (A line starting with `*` is a multibulk.)
    prop::collection::vec(prop::collection::vec(c, 1..10), 1..8)
        .prop_filter("not a multibulk", |w| w[0][0] != b'*')
}

fn command() -> impl Strategy<Value = (Wire, Vec<Vec<u8>>)> {
    prop_oneof![
        args(40).prop_map(|a| (Wire::Multibulk, a)),
        words().prop_map(|a| (Wire::Inline, a)),
        args(20).prop_map(|a| (Wire::Quoted, a)),
    ]
}

fn write(out: &mut Vec<u8>, wire: &Wire, args: &[Vec<u8>]) {
    match wire {
        Wire::Multibulk => {
            let mut b = BytesMut::new();
            encode_command(&mut b, args);
            out.extend_from_slice(&b);
        }
        Wire::Inline => {
            out.extend_from_slice(&args.join(&b' '));
            out.extend_from_slice(b"\r\n");
        }
        Wire::Quoted => {
            let quoted: Vec<Vec<u8>> = args
                .iter()
                .map(|a| {
                    let mut q = b"\"".to_vec();
                    for c in a {
                        q.extend_from_slice(format!("\\x{c:02x}").as_bytes());
                    }
                    q.push(b'"');
                    q
                })
                .collect();
            out.extend_from_slice(&quoted.join(&b' '));
            out.push(b'\n');
        }
    }
}

/// The requests parsed from `stream` arriving in pieces ending at `cuts`
/// (taken modulo the length), and the bytes left over.
fn parse_in_pieces(stream: &[u8], cuts: &[usize]) -> (Vec<(Bytes, Vec<Bytes>)>, usize) {
    let mut ends: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
    ends.push(stream.len());
    ends.sort_unstable();
    let mut p = Parser::new(LIMITS);
    let mut buf = BytesMut::new();
    let mut req = Request::default();
    let mut out = Vec::new();
    let mut fed = 0;
    for end in ends {
        buf.extend_from_slice(&stream[fed..end]);
        fed = end;
        while p
            .parse(&mut buf, &mut req)
            .expect("valid requests")
            .is_some()
        {
            out.push((req.raw.clone(), req.args.clone()));
        }
    }
    (out, buf.len())
}

fn encoded(args: &[Vec<u8>]) -> Bytes {
    let mut b = BytesMut::new();
    encode_command(&mut b, args);
    b.freeze()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// encode → parse = identity, for each way of writing a command; the
    /// request's `raw` is the multibulk encoding of its arguments.
    #[test]
    fn request_round_trip((wire, args) in command()) {
        let mut stream = Vec::new();
        write(&mut stream, &wire, &args);
        let (reqs, left) = parse_in_pieces(&stream, &[]);
        prop_assert_eq!(left, 0);
        prop_assert_eq!(reqs.len(), 1);
        let (raw, got) = &reqs[0];
        prop_assert_eq!(got, &args);
        prop_assert_eq!(raw, &encoded(&args));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// A pipeline of mixed multibulk and inline requests, with empty ones
    /// (`*0`, blank lines) between them, cut anywhere (inside a length
    /// header, between CR and LF), parses like the whole pipeline.
    #[test]
    fn request_stream_in_pieces(
        cmds in prop::collection::vec((command(), 0..4u8), 1..10),
        cuts in prop::collection::vec(any::<usize>(), 0..16),
    ) {
        let mut stream = Vec::new();
        for ((wire, args), empty) in &cmds {
            match empty {
                1 => stream.extend_from_slice(b"*0\r\n"),
                2 => stream.extend_from_slice(b" \r\n"),
                _ => {}
            }
            write(&mut stream, wire, args);
        }
        let whole = parse_in_pieces(&stream, &[]);
        prop_assert_eq!(whole.1, 0);
        prop_assert_eq!(whole.0.len(), cmds.len());
        for ((raw, got), ((_, args), _)) in whole.0.iter().zip(&cmds) {
            prop_assert_eq!(got, args);
            prop_assert_eq!(raw, &encoded(args));
        }
        prop_assert_eq!(parse_in_pieces(&stream, &cuts), whole);
    }
}
