//! Reading an `invalidate` push: in place for the shape Redis and Valkey
//! send (a key array), by the general decode for any other.

use bytes::Bytes;
use sidecache_resp::bulks::Bulks;
use sidecache_resp::frame::Value;
use smallvec::SmallVec;

/// What an `invalidate` push names: its keys, or `None` for a null (a
/// flush).
pub(super) type Invalidated = Option<SmallVec<[Bytes; 2]>>;

/// How Redis and Valkey frame an invalidation of keys, up to its count.
const INVALIDATE_KEYS: &[u8] = b">2\r\n$10\r\ninvalidate\r\n";

/// The keys of an `invalidate` push framed as Redis frames it
/// (`>2 $10 invalidate *N $len key …`), as slices of the frame: no decode
/// of a general value, no allocation for one or two keys. `None` for any
/// other shape, which [`decode_invalidation`] reads.
pub(super) fn invalidated_keys(frame: &Bytes) -> Option<SmallVec<[Bytes; 2]>> {
    let rest = frame.strip_prefix(INVALIDATE_KEYS)?;
    let mut bulks = Bulks::new(rest)?;
    let mut keys = SmallVec::new();
    for _ in 0..bulks.left() {
        keys.push(frame.slice_ref(bulks.next()?));
    }
    bulks.rest().is_empty().then_some(keys)
}

/// Any `invalidate` push, read by the general decode: `None` when it is
/// not one.
pub(super) fn decode_invalidation(frame: &Bytes) -> Option<Invalidated> {
    let Ok(Value::Push(items)) = Value::decode(frame) else {
        return None;
    };
    let mut items = items.into_iter();
    let is_invalidate = items
        .next()
        .as_ref()
        .and_then(Value::as_bytes)
        .is_some_and(|k| k.eq_ignore_ascii_case(b"invalidate"));
    if !is_invalidate {
        return None;
    }
    match items.next() {
        Some(Value::Array(keys)) | Some(Value::Set(keys)) => Some(Some(
            keys.into_iter()
                .filter_map(|k| match k {
                    Value::Bulk(b) | Value::Status(b) => Some(b),
                    _ => None,
                })
                .collect(),
        )),
        _ => Some(None),
    }
}
