//! Property tests of the upstream reply codec: any reply encodes, scans and
//! decodes back to itself, and a stream of replies split anywhere scans into
//! the same frames as the whole stream. (The cargo-fuzz targets in `fuzz/`
//! check the same properties on arbitrary bytes.)

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use sidecache_resp::frame::{Scanner, Value};

fn text() -> impl Strategy<Value = Bytes> {
    // Simple-string payloads: anything but CR and LF.
    prop::collection::vec(
        any::<u8>().prop_filter("no CR/LF", |c| *c != b'\r' && *c != b'\n'),
        0..12,
    )
    .prop_map(Bytes::from)
}

fn blob() -> impl Strategy<Value = Bytes> {
    prop::collection::vec(any::<u8>(), 0..40).prop_map(Bytes::from)
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Nil),
        text().prop_map(Value::Status),
        text().prop_map(Value::Error),
        blob().prop_map(Value::Error),
        any::<i64>().prop_map(Value::Int),
        blob().prop_map(Value::Bulk),
        text().prop_map(Value::Double),
        any::<bool>().prop_map(Value::Bool),
        text().prop_map(Value::BigNumber),
        blob().prop_map(Value::Verbatim),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Set),
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Push),
            prop::collection::vec((inner.clone(), inner), 0..4).prop_map(Value::Map),
        ]
    })
}

/// Frame lengths found scanning `stream` as it arrives in pieces ending at
/// `cuts` (taken modulo the length).
fn scan_in_pieces(stream: &[u8], cuts: &[usize]) -> Vec<usize> {
    let mut ends: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
    ends.push(stream.len());
    ends.sort_unstable();
    let mut sc = Scanner::new();
    let mut frames = Vec::new();
    let mut start = 0;
    for end in ends {
        while let Some(len) = sc.scan(&stream[start..end]).expect("valid stream") {
            frames.push(len);
            start += len;
        }
    }
    frames
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// encode → scan finds the whole frame → decode = identity.
    #[test]
    fn reply_round_trip(v in value()) {
        let mut b = BytesMut::new();
        v.encode(&mut b);
        let frame = b.freeze();
        prop_assert_eq!(Scanner::new().scan(&frame), Ok(Some(frame.len())));
        prop_assert_eq!(Value::decode(&frame), Ok(v));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// A stream of replies cut anywhere scans into the same frames, each of
    /// which decodes to the value it was encoded from.
    #[test]
    fn reply_stream_in_pieces(
        vs in prop::collection::vec(value(), 1..8),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        let mut b = BytesMut::new();
        let mut lens = Vec::new();
        for v in &vs {
            let before = b.len();
            v.encode(&mut b);
            lens.push(b.len() - before);
        }
        let stream = b.freeze();
        prop_assert_eq!(&scan_in_pieces(&stream, &[]), &lens);
        prop_assert_eq!(&scan_in_pieces(&stream, &cuts), &lens);
        let mut at = 0;
        for (v, len) in vs.iter().zip(&lens) {
            prop_assert_eq!(&Value::decode(&stream.slice(at..at + len)).expect("decodes"), v);
            at += len;
        }
    }
}
