//! The journal's on-disk format: segment files of checksummed records.
//!
//! ```text
//!  segment  = HEADER record*
//!  record   = len:u32le crc:u32le payload        (crc: CRC-32 of payload)
//!  payload  = 1:u8 seq:u64le db:u16le command     a write
//!           | 2:u8 seq:u64le*                     writes of this segment settled upstream
//! ```
//!
//! A record is whole when its length fits in what the file holds and its
//! checksum matches. Reading stops at the first record that is not: a
//! record cut in half (power lost mid-write) or a flipped byte drops that
//! record and everything after it in the segment, never half of one.
//!
//! A *settled* record names writes of its own segment that reached
//! upstream (appended to that segment's file, after the writes it names);
//! they are not replayed, so a restart does not write again what already
//! landed (and may have been overwritten since by another client).

use bytes::Bytes;

/// First bytes of every segment file (format version 1).
pub const HEADER: &[u8; 16] = b"SIDECACHE-JRNL1\n";

/// Bytes a write's record adds to its command.
pub const OVERHEAD: usize = 4 + 4 + 1 + 8 + 2;

const WRITE: u8 = 1;
const SETTLED: u8 = 2;

/// Largest command a record may hold (a write-behind write is bounded by
/// `--write-queue-max-bytes`, at most 1 TB; this only rejects garbage).
const MAX_PAYLOAD: usize = u32::MAX as usize;

/// One journalled write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Its sequence number (increasing in the order writes were queued).
    pub seq: u64,
    /// The database it applies to.
    pub db: u16,
    /// The command as sent upstream.
    pub cmd: Bytes,
}

/// Bytes the record of `cmd` takes.
pub fn encoded_len(cmd: &[u8]) -> usize {
    OVERHEAD + cmd.len()
}

/// Appends the record of one write to `out`.
pub fn encode(out: &mut Vec<u8>, seq: u64, db: u16, cmd: &[u8]) {
    frame(out, |out| {
        out.push(WRITE);
        out.extend_from_slice(&seq.to_le_bytes());
        out.extend_from_slice(&db.to_le_bytes());
        out.extend_from_slice(cmd);
    });
}

/// Appends a record naming writes (of the same segment) that settled.
pub fn encode_settled(out: &mut Vec<u8>, seqs: &[u64]) {
    frame(out, |out| {
        out.push(SETTLED);
        for s in seqs {
            out.extend_from_slice(&s.to_le_bytes());
        }
    });
}

/// Frames the payload `body` writes: length, checksum, payload.
fn frame(out: &mut Vec<u8>, body: impl FnOnce(&mut Vec<u8>)) {
    let len_at = out.len();
    out.extend_from_slice(&[0; 8]);
    let start = out.len();
    body(out);
    let len = (out.len() - start) as u32;
    let crc = crc32fast::hash(&out[start..]);
    out[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
    out[len_at + 4..len_at + 8].copy_from_slice(&crc.to_le_bytes());
}

/// What reading a segment found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Read {
    /// The whole records of writes not named settled, in file order.
    pub records: Vec<Record>,
    /// Writes named settled (not to replay).
    pub settled: usize,
    /// Why reading stopped before the end of the file, if it did, and at
    /// which byte offset.
    pub bad_tail: Option<(usize, &'static str)>,
    /// Bytes from the bad record to the end of the file (dropped).
    pub dropped_bytes: usize,
}

/// One whole record's payload.
enum Payload<'a> {
    Write { seq: u64, db: u16, cmd_at: usize },
    Settled(&'a [u8]),
}

/// Reads the records of one segment file's contents.
pub fn read(file: &Bytes) -> Read {
    let mut out = Read::default();
    let Some(body) = file.strip_prefix(HEADER.as_slice()) else {
        if !file.is_empty() {
            out.bad_tail = Some((0, "not a journal segment (bad header)"));
            out.dropped_bytes = file.len();
        }
        return out;
    };
    let mut settled = std::collections::HashSet::new();
    let mut at = HEADER.len();
    let mut rest = body;
    while !rest.is_empty() {
        match parse_one(rest) {
            Ok((len, payload)) => {
                match payload {
                    Payload::Write { seq, db, cmd_at } => out.records.push(Record {
                        seq,
                        db,
                        cmd: file.slice(at + cmd_at..at + 8 + len),
                    }),
                    Payload::Settled(seqs) => settled.extend(
                        seqs.chunks_exact(8)
                            .filter_map(|c| c.try_into().ok().map(u64::from_le_bytes)),
                    ),
                }
                rest = &rest[8 + len..];
                at += 8 + len;
            }
            Err(why) => {
                out.bad_tail = Some((at, why));
                out.dropped_bytes = rest.len();
                break;
            }
        }
    }
    let before = out.records.len();
    out.records.retain(|r| !settled.contains(&r.seq));
    out.settled = before - out.records.len();
    out
}

/// The payload length and payload of the record at the start of `buf`,
/// if it is whole.
fn parse_one(buf: &[u8]) -> Result<(usize, Payload<'_>), &'static str> {
    let Some((len, rest)) = buf.split_first_chunk::<4>() else {
        return Err("record header cut short");
    };
    let len = u32::from_le_bytes(*len) as usize;
    if !(1..=MAX_PAYLOAD).contains(&len) {
        return Err("record length out of range");
    }
    let Some((crc, rest)) = rest.split_first_chunk::<4>() else {
        return Err("record header cut short");
    };
    let Some(payload) = rest.get(..len) else {
        return Err("record cut short");
    };
    if crc32fast::hash(payload) != u32::from_le_bytes(*crc) {
        return Err("checksum mismatch");
    }
    match payload.split_first() {
        Some((&WRITE, p)) if p.len() >= 10 => {
            let seq = p[..8].try_into().map(u64::from_le_bytes);
            let db = p[8..10].try_into().map(u16::from_le_bytes);
            match (seq, db) {
                (Ok(seq), Ok(db)) => Ok((
                    len,
                    Payload::Write {
                        seq,
                        db,
                        cmd_at: 8 + 1 + 10,
                    },
                )),
                _ => Err("bad write record"),
            }
        }
        Some((&SETTLED, p)) if p.len() % 8 == 0 => Ok((len, Payload::Settled(p))),
        _ => Err("unknown record kind"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(records: &[(u64, u16, &[u8])]) -> Vec<u8> {
        let mut out = HEADER.to_vec();
        for &(seq, db, cmd) in records {
            encode(&mut out, seq, db, cmd);
        }
        out
    }

    const CMDS: [(u64, u16, &[u8]); 3] = [
        (1, 0, b"*3\r\n$3\r\nSET\r\n$1\r\na\r\n$1\r\n1\r\n"),
        (2, 3, b"*3\r\n$3\r\nSET\r\n$1\r\nb\r\n$1\r\n2\r\n"),
        (3, 0, b"*3\r\n$3\r\nSET\r\n$1\r\nc\r\n$1\r\n3\r\n"),
    ];

    fn whole(n: usize) -> Vec<Record> {
        CMDS[..n]
            .iter()
            .map(|&(seq, db, cmd)| Record {
                seq,
                db,
                cmd: Bytes::copy_from_slice(cmd),
            })
            .collect()
    }

    #[test]
    fn whole_records_read_back() {
        let file = Bytes::from(segment(&CMDS));
        let r = read(&file);
        assert_eq!(r.records, whole(3));
        assert_eq!(r.bad_tail, None);
        assert_eq!(
            file.len(),
            HEADER.len() + CMDS.iter().map(|c| encoded_len(c.2)).sum::<usize>()
        );
        assert_eq!(read(&Bytes::from(HEADER.to_vec())), Read::default());
        assert_eq!(read(&Bytes::new()), Read::default());
    }

    #[test]
    fn a_record_cut_anywhere_drops_it_and_keeps_the_rest() {
        let full = segment(&CMDS);
        let last = encoded_len(CMDS[2].2);
        for cut in 1..last {
            let file = Bytes::from(full[..full.len() - cut].to_vec());
            let r = read(&file);
            assert_eq!(r.records, whole(2), "cut {cut}");
            assert_eq!(r.bad_tail.map(|b| b.0), Some(full.len() - last));
            assert_eq!(r.dropped_bytes, last - cut);
        }
    }

    #[test]
    fn a_flipped_byte_drops_its_record_and_what_follows() {
        let full = segment(&CMDS);
        let second = HEADER.len() + encoded_len(CMDS[0].2);
        // Any byte of the second record: its length, checksum or payload.
        for at in second..second + encoded_len(CMDS[1].2) {
            let mut bad = full.clone();
            bad[at] ^= 0x40;
            let r = read(&Bytes::from(bad));
            assert_eq!(r.records, whole(1), "flipped byte {at}");
            assert!(r.bad_tail.is_some());
        }
    }

    #[test]
    fn settled_writes_are_not_replayed() {
        let mut file = segment(&CMDS);
        encode_settled(&mut file, &[1, 3, 99]);
        let r = read(&Bytes::from(file.clone()));
        assert_eq!(r.records, vec![whole(2)[1].clone()]);
        assert_eq!(r.settled, 2);
        // A settled record cut short: the writes it named are replayed.
        file.truncate(file.len() - 3);
        let r = read(&Bytes::from(file));
        assert_eq!(r.records, whole(3));
        assert!(r.bad_tail.is_some());
    }

    #[test]
    fn a_foreign_file_is_not_read() {
        let r = read(&Bytes::from_static(b"hello world"));
        assert!(r.records.is_empty());
        assert_eq!(r.dropped_bytes, 11);
    }
}
