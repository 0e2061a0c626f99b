//! Record batches (format v2) as raw bytes: header fields read in place, fetch responses split
//! into whole batches, and the header rewrite that lets a fetched batch be produced again without
//! touching its (compressed) records.
//!
//! Layout (Kafka's DefaultRecordBatch): baseOffset i64 | batchLength i32 | partitionLeaderEpoch
//! i32 | magic i8 | crc u32 | attributes i16 | lastOffsetDelta i32 | baseTimestamp i64 |
//! maxTimestamp i64 | producerId i64 | producerEpoch i16 | baseSequence i32 | recordCount i32 |
//! records. The CRC-32C covers everything from `attributes` to the end.

use bytes::{Bytes, BytesMut};

/// Size of the v2 batch header.
pub const HEADER_LEN: usize = 61;
/// Offset of the fields that `batchLength` does not count (baseOffset + batchLength).
pub const LOG_OVERHEAD: usize = 12;

const MAGIC: usize = 16;
const CRC: usize = 17;
const ATTRIBUTES: usize = 21;
const LAST_OFFSET_DELTA: usize = 23;
const BASE_TIMESTAMP: usize = 27;
const MAX_TIMESTAMP: usize = 35;
const PRODUCER_ID: usize = 43;
const PRODUCER_EPOCH: usize = 51;
const BASE_SEQUENCE: usize = 53;
const RECORD_COUNT: usize = 57;

/// Below this many record bytes, recomputing a rewritten batch's CRC (hardware CRC-32C, well
/// over 10 GB/s) costs less than carrying the header's difference over the records.
const CARRY_MIN: usize = 4096;

const COMPRESSION_MASK: i16 = 0x07;
const TIMESTAMP_TYPE_BIT: i16 = 0x08;
const TRANSACTIONAL_BIT: i16 = 0x10;
const CONTROL_BIT: i16 = 0x20;

/// The codec of a batch's records (attributes bits 0–2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl Codec {
    pub fn from_attributes(attributes: i16) -> Option<Self> {
        match attributes & COMPRESSION_MASK {
            0 => Some(Codec::None),
            1 => Some(Codec::Gzip),
            2 => Some(Codec::Snappy),
            3 => Some(Codec::Lz4),
            4 => Some(Codec::Zstd),
            _ => None,
        }
    }

    pub fn bits(self) -> i16 {
        match self {
            Codec::None => 0,
            Codec::Gzip => 1,
            Codec::Snappy => 2,
            Codec::Lz4 => 3,
            Codec::Zstd => 4,
        }
    }
}

impl From<crate::settings::Compression> for Codec {
    fn from(c: crate::settings::Compression) -> Self {
        use crate::settings::Compression as C;
        match c {
            C::None => Codec::None,
            C::Gzip => Codec::Gzip,
            C::Snappy => Codec::Snappy,
            C::Lz4 => Codec::Lz4,
            C::Zstd => Codec::Zstd,
        }
    }
}

/// A malformed batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad record batch at byte {position}: {message}")]
pub struct BatchError {
    pub position: usize,
    pub message: String,
}

/// One whole record batch, as bytes.
#[derive(Clone)]
pub struct RawBatch {
    bytes: Bytes,
    /// Whether the stored CRC-32C was checked against the bytes ([`RawBatch::check_crc`]): a
    /// header rewrite then derives the new CRC from it instead of reading the records again.
    crc_checked: bool,
}

impl PartialEq for RawBatch {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for RawBatch {}

impl std::fmt::Debug for RawBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawBatch")
            .field("base_offset", &self.base_offset())
            .field("last_offset", &self.last_offset())
            .field("records", &self.record_count())
            .field("codec", &self.codec())
            .field("len", &self.bytes.len())
            .finish()
    }
}

fn i16_at(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}
fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn i64_at(b: &[u8], at: usize) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    i64::from_be_bytes(a)
}

impl RawBatch {
    /// Wraps one batch, checking its framing (not its CRC; see [`RawBatch::crc_valid`]).
    pub fn new(bytes: Bytes) -> Result<Self, BatchError> {
        if bytes.len() < HEADER_LEN {
            return Err(BatchError {
                position: 0,
                message: format!("{} bytes is shorter than a batch header", bytes.len()),
            });
        }
        let len = i32_at(&bytes, 8);
        if len < 0 || LOG_OVERHEAD + len as usize != bytes.len() {
            return Err(BatchError {
                position: 8,
                message: format!("batch length {len} does not match {} bytes", bytes.len()),
            });
        }
        if bytes[MAGIC] != 2 {
            return Err(BatchError {
                position: MAGIC,
                message: format!(
                    "record format v{} (only v2 batches are supported here)",
                    bytes[MAGIC]
                ),
            });
        }
        let b = RawBatch {
            bytes,
            crc_checked: false,
        };
        // From the network: offsets that would wrap past i64::MAX (a wrap is silent in release
        // builds) or run backwards are refused here, so `last_offset() + 1`, the next offset
        // callers resume from, is plain arithmetic.
        if b.base_offset() < 0
            || b.last_offset_delta() < 0
            || b.base_offset()
                .checked_add(b.last_offset_delta() as i64 + 1)
                .is_none()
        {
            return Err(BatchError {
                position: 0,
                message: format!(
                    "base offset {} with last offset delta {} is out of range",
                    b.base_offset(),
                    b.last_offset_delta()
                ),
            });
        }
        Ok(b)
    }

    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }

    pub fn base_offset(&self) -> i64 {
        i64_at(&self.bytes, 0)
    }
    pub fn partition_leader_epoch(&self) -> i32 {
        i32_at(&self.bytes, 12)
    }
    pub fn crc(&self) -> u32 {
        i32_at(&self.bytes, CRC) as u32
    }
    pub fn attributes(&self) -> i16 {
        i16_at(&self.bytes, ATTRIBUTES)
    }
    pub fn last_offset_delta(&self) -> i32 {
        i32_at(&self.bytes, LAST_OFFSET_DELTA)
    }
    /// Offset of the batch's last record (compaction may have removed it, but not this number).
    pub fn last_offset(&self) -> i64 {
        self.base_offset() + self.last_offset_delta() as i64
    }
    pub fn base_timestamp(&self) -> i64 {
        i64_at(&self.bytes, BASE_TIMESTAMP)
    }
    pub fn max_timestamp(&self) -> i64 {
        i64_at(&self.bytes, MAX_TIMESTAMP)
    }
    pub fn producer_id(&self) -> i64 {
        i64_at(&self.bytes, PRODUCER_ID)
    }
    pub fn producer_epoch(&self) -> i16 {
        i16_at(&self.bytes, PRODUCER_EPOCH)
    }
    pub fn base_sequence(&self) -> i32 {
        i32_at(&self.bytes, BASE_SEQUENCE)
    }
    pub fn record_count(&self) -> i32 {
        i32_at(&self.bytes, RECORD_COUNT)
    }
    pub fn codec(&self) -> Option<Codec> {
        Codec::from_attributes(self.attributes())
    }
    pub fn is_transactional(&self) -> bool {
        self.attributes() & TRANSACTIONAL_BIT != 0
    }
    pub fn is_control(&self) -> bool {
        self.attributes() & CONTROL_BIT != 0
    }
    /// Whether timestamps are the broker's append time (`message.timestamp.type=LogAppendTime`).
    pub fn is_log_append_time(&self) -> bool {
        self.attributes() & TIMESTAMP_TYPE_BIT != 0
    }
    /// Whether the records' offsets run from 0 to `record_count - 1` without gaps, which is what
    /// a broker requires to keep a produced batch as is. Compacted batches have gaps.
    pub fn offsets_contiguous(&self) -> bool {
        self.last_offset_delta() as i64 + 1 == self.record_count() as i64
    }

    /// Whether the stored CRC-32C matches the content.
    pub fn crc_valid(&self) -> bool {
        crc32c::crc32c(&self.bytes[ATTRIBUTES..]) == self.crc()
    }

    /// Checks the stored CRC-32C against the content (what Java's consumer does with
    /// `check.crcs=true`), so corrupt source bytes are not sent on under a fresh checksum.
    pub fn check_crc(&mut self) -> Result<(), BatchError> {
        let computed = crc32c::crc32c(&self.bytes[ATTRIBUTES..]);
        if computed != self.crc() {
            return Err(BatchError {
                position: CRC,
                message: format!(
                    "CRC-32C mismatch: the batch stores {:#010x}, its bytes give {computed:#010x}",
                    self.crc()
                ),
            });
        }
        self.crc_checked = true;
        Ok(())
    }

    /// The same records with a new producer identity, ready to be produced: producer id, epoch
    /// and base sequence replaced, the transactional bit set as asked (a copy is transactional only
    /// when the replicator writes it in its own transaction), `LogAppendTime` turned into
    /// `CreateTime` (brokers refuse produced LogAppendTime batches; the max timestamp keeps the
    /// source's append time), the base offset and leader epoch reset, and the CRC recomputed.
    /// The (compressed) records are not touched.
    pub fn rewrite_for_produce(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        base_sequence: i32,
        transactional: bool,
    ) -> RawBatch {
        let mut b = BytesMut::from(&self.bytes[..]);
        b[0..8].copy_from_slice(&0i64.to_be_bytes());
        b[12..16].copy_from_slice(&(-1i32).to_be_bytes());
        let mut attributes = self.attributes() & !TRANSACTIONAL_BIT & !TIMESTAMP_TYPE_BIT;
        if transactional {
            attributes |= TRANSACTIONAL_BIT;
        }
        b[ATTRIBUTES..ATTRIBUTES + 2].copy_from_slice(&attributes.to_be_bytes());
        b[PRODUCER_ID..PRODUCER_ID + 8].copy_from_slice(&producer_id.to_be_bytes());
        b[PRODUCER_EPOCH..PRODUCER_EPOCH + 2].copy_from_slice(&producer_epoch.to_be_bytes());
        b[BASE_SEQUENCE..BASE_SEQUENCE + 4].copy_from_slice(&base_sequence.to_be_bytes());
        let records = b.len() - HEADER_LEN;
        let crc = if self.crc_checked && records >= CARRY_MIN {
            let old = crc32c::crc32c(&self.bytes[ATTRIBUTES..HEADER_LEN]);
            let new = crc32c::crc32c(&b[ATTRIBUTES..HEADER_LEN]);
            self.crc() ^ super::crc::carry(old ^ new, records)
        } else {
            crc32c::crc32c(&b[ATTRIBUTES..])
        };
        b[CRC..CRC + 4].copy_from_slice(&crc.to_be_bytes());
        RawBatch {
            bytes: b.freeze(),
            crc_checked: true,
        }
    }
}

/// Checks each batch's CRC-32C in order and keeps the batches before the first that fails. The
/// error (with that batch's base offset) comes only when the very first batch fails: a reader
/// delivers the good batches before a damaged one and fails at it on its next read.
pub fn keep_until_corrupt(batches: &mut Vec<RawBatch>) -> Result<(), (i64, BatchError)> {
    for i in 0..batches.len() {
        if let Err(e) = batches[i].check_crc() {
            if i == 0 {
                return Err((batches[0].base_offset(), e));
            }
            batches.truncate(i);
            break;
        }
    }
    Ok(())
}

/// Splits a fetched record set into whole v2 batches. A partial batch at the end (the broker cuts
/// responses at the byte limit) is dropped and reported with `truncated = true`.
pub fn split_batches(data: Bytes) -> Result<(Vec<RawBatch>, bool), BatchError> {
    let (batches, rest) = split_until_bad(data);
    rest.map(|truncated| (batches, truncated))
        .map_err(|bad| bad.error)
}

/// A batch [`split_until_bad`] could not frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadBatch {
    /// The base offset its header claims (hostile bytes: only a hint for the error message).
    pub claimed_offset: i64,
    pub error: BatchError,
}

/// [`split_batches`] that keeps the whole batches before one that does not frame: a reader
/// delivers those and fails at the bad one on its next read, as with a CRC mismatch.
pub fn split_until_bad(mut data: Bytes) -> (Vec<RawBatch>, Result<bool, BadBatch>) {
    let mut out = Vec::new();
    let mut position = 0;
    while !data.is_empty() {
        if data.len() < LOG_OVERHEAD + 5 {
            return (out, Ok(true));
        }
        let claimed_offset = i64::from_be_bytes(data[..8].try_into().unwrap_or_default());
        let len = i32_at(&data, 8);
        if len < 0 {
            let error = BatchError {
                position: position + 8,
                message: format!("negative batch length {len}"),
            };
            return (
                out,
                Err(BadBatch {
                    claimed_offset,
                    error,
                }),
            );
        }
        let total = LOG_OVERHEAD + len as usize;
        if data.len() < total {
            return (out, Ok(true));
        }
        match RawBatch::new(data.split_to(total)) {
            Ok(b) => out.push(b),
            Err(e) => {
                let error = BatchError {
                    position: position + e.position,
                    message: e.message,
                };
                return (
                    out,
                    Err(BadBatch {
                        claimed_offset,
                        error,
                    }),
                );
            }
        }
        position += total;
    }
    (out, Ok(false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{encode_batch, BatchOptions, Record};

    fn sample(codec: Codec, n: usize) -> RawBatch {
        let records: Vec<Record> = (0..n)
            .map(|i| Record {
                offset: i as i64,
                timestamp: 1_700_000_000_000 + i as i64,
                key: Some(Bytes::from(format!("k{i}"))),
                value: Some(Bytes::from(vec![b'x'; 100])),
                headers: vec![],
            })
            .collect();
        encode_batch(
            &records,
            &BatchOptions {
                codec,
                ..BatchOptions::default()
            },
        )
        .unwrap()
    }

    #[test]
    fn header_fields_are_read_in_place() {
        let b = sample(Codec::Lz4, 5);
        assert_eq!(b.base_offset(), 0);
        assert_eq!(b.last_offset_delta(), 4);
        assert_eq!(b.record_count(), 5);
        assert_eq!(b.codec(), Some(Codec::Lz4));
        assert_eq!(b.base_timestamp(), 1_700_000_000_000);
        assert_eq!(b.max_timestamp(), 1_700_000_000_004);
        assert_eq!(b.producer_id(), -1);
        assert!(b.offsets_contiguous());
        assert!(b.crc_valid());
        assert!(!b.is_transactional() && !b.is_control() && !b.is_log_append_time());
    }

    #[test]
    fn rewrite_changes_only_the_header_and_keeps_a_valid_crc() {
        for codec in [
            Codec::None,
            Codec::Gzip,
            Codec::Snappy,
            Codec::Lz4,
            Codec::Zstd,
        ] {
            let b = sample(codec, 3);
            // Make it look like a transactional LogAppendTime batch from another producer.
            let mut m = BytesMut::from(&b.bytes()[..]);
            let attrs = b.attributes() | TRANSACTIONAL_BIT | TIMESTAMP_TYPE_BIT;
            m[ATTRIBUTES..ATTRIBUTES + 2].copy_from_slice(&attrs.to_be_bytes());
            m[0..8].copy_from_slice(&500i64.to_be_bytes());
            let src = RawBatch::new(m.freeze()).unwrap();
            let out = src.rewrite_for_produce(7, 2, 40, false);
            assert!(out.crc_valid(), "{codec:?}");
            assert_eq!(
                (out.producer_id(), out.producer_epoch(), out.base_sequence()),
                (7, 2, 40)
            );
            assert!(!out.is_transactional() && !out.is_log_append_time());
            assert_eq!(out.codec(), Some(codec));
            assert_eq!(out.base_offset(), 0);
            assert_eq!(out.max_timestamp(), src.max_timestamp());
            // The records section is byte-identical.
            assert_eq!(&out.bytes()[HEADER_LEN..], &src.bytes()[HEADER_LEN..]);
            let decoded = crate::records::decode_batch(&out).unwrap();
            assert_eq!(decoded.len(), 3);
            assert_eq!(decoded[2].key.as_deref(), Some(&b"k2"[..]));
        }
    }

    #[test]
    fn split_drops_a_partial_trailing_batch() {
        let a = sample(Codec::None, 2);
        let b = sample(Codec::Gzip, 3);
        let mut all = BytesMut::new();
        all.extend_from_slice(a.bytes());
        all.extend_from_slice(b.bytes());
        let full = all.clone().freeze();
        let (batches, truncated) = split_batches(full.clone()).unwrap();
        assert_eq!((batches.len(), truncated), (2, false));
        for cut in [1, 12, 20, b.bytes().len() - 1] {
            let (batches, truncated) = split_batches(full.slice(..full.len() - cut)).unwrap();
            assert_eq!((batches.len(), truncated), (1, true), "cut {cut}");
        }
        let (none, _) = split_batches(Bytes::new()).unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn split_keeps_the_batches_before_one_that_does_not_frame() {
        let a = sample(Codec::None, 2);
        let mut bad = BytesMut::from(&sample(Codec::None, 3).bytes()[..]);
        bad[..8].copy_from_slice(&2i64.to_be_bytes());
        // A negative last offset delta: the batch would end before it starts.
        bad[23..27].copy_from_slice(&(-1i32).to_be_bytes());
        let mut all = BytesMut::new();
        all.extend_from_slice(a.bytes());
        all.extend_from_slice(&bad);
        all.extend_from_slice(sample(Codec::None, 1).bytes());
        let (good, rest) = split_until_bad(all.clone().freeze());
        assert_eq!(good.len(), 1);
        let bad = rest.unwrap_err();
        assert_eq!(bad.claimed_offset, 2);
        assert!(
            bad.error.message.contains("last offset delta -1"),
            "{}",
            bad.error
        );
        assert!(split_batches(all.freeze()).is_err());
    }

    #[test]
    fn malformed_batches_are_errors() {
        assert!(RawBatch::new(Bytes::from_static(&[0; 10])).is_err());
        let mut m = BytesMut::from(&sample(Codec::None, 1).bytes()[..]);
        m[MAGIC] = 1;
        let e = RawBatch::new(m.freeze()).unwrap_err();
        assert!(e.message.contains("v1"), "{e}");
    }

    #[test]
    fn a_checked_batch_rewrites_to_the_same_crc_as_a_full_recompute() {
        for codec in [Codec::None, Codec::Zstd] {
            for n in [0, 1, 40, 200] {
                let unchecked = if n == 0 {
                    // A header alone: a records section of no bytes.
                    let mut m = BytesMut::from(&sample(codec, 1).bytes()[..HEADER_LEN]);
                    m[8..12].copy_from_slice(&((HEADER_LEN - LOG_OVERHEAD) as i32).to_be_bytes());
                    m[LAST_OFFSET_DELTA..LAST_OFFSET_DELTA + 4]
                        .copy_from_slice(&0i32.to_be_bytes());
                    let crc = crc32c::crc32c(&m[ATTRIBUTES..]);
                    m[CRC..CRC + 4].copy_from_slice(&crc.to_be_bytes());
                    RawBatch::new(m.freeze()).unwrap()
                } else {
                    sample(codec, n)
                };
                let mut checked = unchecked.clone();
                checked.check_crc().unwrap();
                let a = unchecked.rewrite_for_produce(9, 1, 5, true);
                let b = checked.rewrite_for_produce(9, 1, 5, true);
                assert_eq!(a.crc(), b.crc(), "{codec:?} {n}");
                assert!(b.crc_valid());
            }
        }
    }

    #[test]
    fn one_flipped_byte_anywhere_after_the_crc_fails_the_check() {
        let b = sample(Codec::Gzip, 3);
        for at in ATTRIBUTES..b.bytes().len() {
            let mut m = BytesMut::from(&b.bytes()[..]);
            m[at] ^= 0x10;
            // A flip that breaks the framing is refused earlier, which is fine too.
            if let Ok(mut bad) = RawBatch::new(m.freeze()) {
                let e = bad.check_crc().unwrap_err();
                assert!(e.message.contains("CRC-32C mismatch"), "{at}: {e}");
            }
        }
        let mut good = b.clone();
        assert!(good.check_crc().is_ok());
    }

    #[test]
    fn batches_before_a_damaged_one_are_kept_and_a_damaged_first_is_an_error() {
        let at = |base: i64| {
            let mut m = BytesMut::from(&sample(Codec::Snappy, 4).bytes()[..]);
            m[0..8].copy_from_slice(&base.to_be_bytes());
            RawBatch::new(m.freeze()).unwrap()
        };
        let damaged = |base: i64| {
            let mut m = BytesMut::from(&at(base).bytes()[..]);
            let last = m.len() - 1;
            m[last] ^= 1;
            RawBatch::new(m.freeze()).unwrap()
        };
        let mut all = vec![at(0), at(4), damaged(8), at(12)];
        keep_until_corrupt(&mut all).unwrap();
        assert_eq!(
            all.iter().map(RawBatch::base_offset).collect::<Vec<_>>(),
            [0, 4]
        );
        let mut first_bad = vec![damaged(8), at(12)];
        let (offset, e) = keep_until_corrupt(&mut first_bad).unwrap_err();
        assert_eq!(offset, 8);
        assert!(e.message.contains("CRC-32C"), "{e}");
        let mut none: Vec<RawBatch> = vec![];
        keep_until_corrupt(&mut none).unwrap();
    }
}
