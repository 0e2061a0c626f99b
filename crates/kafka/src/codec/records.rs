//! Records (format v2): encode a batch from records and decode a batch into records.
//!
//! Written here rather than taken from `kafka_protocol::records` because a replicator must keep
//! every header: Kafka allows the same header key more than once, in order, and
//! `kafka_protocol`'s record type stores headers in a map. The codecs are in `compression`.

use super::compression::{compress, decompress, DecompressError};
use crate::batch::{BatchError, Codec, RawBatch, HEADER_LEN};
use bytes::{Buf, BufMut, Bytes, BytesMut};

/// One record. `None` and an empty value are different things and stay different.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Absolute offset when decoded; the position within the batch when encoding (0, 1, ...).
    pub offset: i64,
    pub timestamp: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    /// Header keys are Java strings on the wire; kept as bytes so nothing is re-encoded.
    pub headers: Vec<(Bytes, Option<Bytes>)>,
}

/// How to build a batch.
#[derive(Debug, Clone)]
pub struct BatchOptions {
    pub codec: Codec,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub transactional: bool,
}

impl Default for BatchOptions {
    fn default() -> Self {
        BatchOptions {
            codec: Codec::None,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            transactional: false,
        }
    }
}

fn put_varint(buf: &mut BytesMut, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    loop {
        if z < 0x80 {
            buf.put_u8(z as u8);
            return;
        }
        buf.put_u8((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
}

fn put_bytes(buf: &mut BytesMut, b: Option<&Bytes>) {
    match b {
        None => put_varint(buf, -1),
        Some(b) => {
            put_varint(buf, b.len() as i64);
            buf.put_slice(b);
        }
    }
}

fn encode_record(out: &mut BytesMut, r: &Record, base_timestamp: i64) {
    let mut body = BytesMut::with_capacity(
        32 + r.key.as_ref().map_or(0, |k| k.len()) + r.value.as_ref().map_or(0, |v| v.len()),
    );
    body.put_i8(0);
    put_varint(&mut body, r.timestamp - base_timestamp);
    put_varint(&mut body, r.offset);
    put_bytes(&mut body, r.key.as_ref());
    put_bytes(&mut body, r.value.as_ref());
    put_varint(&mut body, r.headers.len() as i64);
    for (k, v) in &r.headers {
        put_bytes(&mut body, Some(k));
        put_bytes(&mut body, v.as_ref());
    }
    put_varint(out, body.len() as i64);
    out.put_slice(&body);
}

/// Encodes `records` (in order; their offsets are renumbered from 0 in each batch) as one batch,
/// or as several when one would be over `limit` bytes: halved until each fits or holds a single
/// record (a compressed source batch may not fit once re-encoded with another codec). Returns
/// each batch with the range of `records` it holds, in order.
pub fn encode_within(
    records: &[Record],
    options: &BatchOptions,
    limit: usize,
) -> Result<Vec<(RawBatch, std::ops::Range<usize>)>, BatchError> {
    let mut out = Vec::new();
    // Ranges still to encode, the next one on top.
    let mut pending = Vec::new();
    pending.push(0..records.len());
    while let Some(range) = pending.pop() {
        if range.is_empty() {
            continue;
        }
        let renumbered: Vec<Record> = records[range.clone()]
            .iter()
            .enumerate()
            .map(|(i, r)| Record {
                offset: i as i64,
                ..r.clone()
            })
            .collect();
        let batch = encode_batch(&renumbered, options)?;
        if batch.bytes().len() > limit && range.len() > 1 {
            let mid = range.start + range.len() / 2;
            pending.push(mid..range.end);
            pending.push(range.start..mid);
            continue;
        }
        out.push((batch, range));
    }
    Ok(out)
}

/// Encodes records (offsets 0..n, in order) into one batch.
pub fn encode_batch(records: &[Record], options: &BatchOptions) -> Result<RawBatch, BatchError> {
    encode_with(records, options, 0)
}

/// A control batch of `producer_id` holding `records` (for tests: brokers write the real ones).
pub(crate) fn encode_control(
    records: &[Record],
    producer_id: i64,
    producer_epoch: i16,
) -> Result<RawBatch, BatchError> {
    let options = BatchOptions {
        producer_id,
        producer_epoch,
        transactional: true,
        ..BatchOptions::default()
    };
    encode_with(records, &options, CONTROL)
}

/// A transaction marker as a transaction coordinator writes it: key (version 0, type), value
/// (version 0, coordinator epoch). For tests: a broker refuses control batches from clients.
pub fn encode_marker(
    marker: crate::committed::Marker,
    producer_id: i64,
    producer_epoch: i16,
    coordinator_epoch: i32,
) -> Result<RawBatch, BatchError> {
    let kind: i16 = match marker {
        crate::committed::Marker::Abort => 0,
        crate::committed::Marker::Commit => 1,
    };
    let mut key = Vec::with_capacity(4);
    key.extend_from_slice(&0i16.to_be_bytes());
    key.extend_from_slice(&kind.to_be_bytes());
    let mut value = Vec::with_capacity(6);
    value.extend_from_slice(&0i16.to_be_bytes());
    value.extend_from_slice(&coordinator_epoch.to_be_bytes());
    let record = Record {
        offset: 0,
        timestamp: 0,
        key: Some(Bytes::from(key)),
        value: Some(Bytes::from(value)),
        headers: vec![],
    };
    encode_control(&[record], producer_id, producer_epoch)
}

/// The control bit of a batch's attributes.
const CONTROL: i16 = 0x20;

fn encode_with(
    records: &[Record],
    options: &BatchOptions,
    extra_attributes: i16,
) -> Result<RawBatch, BatchError> {
    let err = |message: String| BatchError {
        position: 0,
        message,
    };
    if records.is_empty() {
        return Err(err("a batch needs at least one record".into()));
    }
    let base_timestamp = records[0].timestamp;
    let max_timestamp = records
        .iter()
        .map(|r| r.timestamp)
        .max()
        .unwrap_or(base_timestamp);
    let last_offset_delta = records.last().map_or(0, |r| r.offset) as i32;
    let mut raw = BytesMut::new();
    for r in records {
        encode_record(&mut raw, r, base_timestamp);
    }
    let mut out = BytesMut::with_capacity(HEADER_LEN + raw.len());
    out.put_i64(0);
    out.put_i32(0); // length, set below
    out.put_i32(-1);
    out.put_i8(2);
    out.put_u32(0); // crc, set below
    let attributes =
        options.codec.bits() | if options.transactional { 0x10 } else { 0 } | extra_attributes;
    out.put_i16(attributes);
    out.put_i32(last_offset_delta);
    out.put_i64(base_timestamp);
    out.put_i64(max_timestamp);
    out.put_i64(options.producer_id);
    out.put_i16(options.producer_epoch);
    out.put_i32(options.base_sequence);
    out.put_i32(records.len() as i32);
    compress(options.codec, &raw, &mut out)
        .map_err(|e| err(format!("{:?} compression failed: {e}", options.codec)))?;
    let len = (out.len() - 12) as i32;
    out[8..12].copy_from_slice(&len.to_be_bytes());
    let crc = crc32c::crc32c(&out[21..]);
    out[17..21].copy_from_slice(&crc.to_be_bytes());
    RawBatch::new(out.freeze())
}

/// The smallest encoded record: its length, attributes, timestamp and offset deltas, key and
/// value lengths and header count, one byte each.
const MIN_RECORD_LEN: usize = 7;

struct Reader {
    buf: Bytes,
    position: usize,
}

impl Reader {
    fn fail<T>(&self, what: &str) -> Result<T, BatchError> {
        Err(BatchError {
            position: self.position,
            message: format!("truncated or malformed record ({what})"),
        })
    }

    fn varint(&mut self) -> Result<i64, BatchError> {
        let mut z: u64 = 0;
        let mut shift = 0;
        loop {
            if !self.buf.has_remaining() || shift > 63 {
                return self.fail("varint");
            }
            let b = self.buf.get_u8();
            self.position += 1;
            z |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(((z >> 1) as i64) ^ -((z & 1) as i64));
            }
            shift += 7;
        }
    }

    fn bytes(&mut self, what: &str) -> Result<Option<Bytes>, BatchError> {
        let len = self.varint()?;
        if len < 0 {
            return Ok(None);
        }
        if self.buf.remaining() < len as usize {
            return self.fail(what);
        }
        self.position += len as usize;
        Ok(Some(self.buf.split_to(len as usize)))
    }
}

/// The bound on a batch's decompressed records when the caller has none of its own: internal
/// topics and verification, whose batches come from the same brokers as the data.
pub const DEFAULT_MAX_DECOMPRESSED: usize = 64 << 20;

/// Why a batch's records could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error(transparent)]
    Malformed(#[from] BatchError),
    /// The records decompress to more than the caller allows (a decompression bomb, or a batch
    /// larger than the bound).
    #[error(
        "the records of the batch at offset {base_offset} decompress to more than {limit} bytes"
    )]
    TooLarge { base_offset: i64, limit: usize },
}

/// Decodes every record of a batch, with absolute offsets; for a `LogAppendTime` batch every
/// record gets the batch's max timestamp, as Java consumers see it. Decompressed records are
/// bounded by [`DEFAULT_MAX_DECOMPRESSED`].
pub fn decode_batch(batch: &RawBatch) -> Result<Vec<Record>, BatchError> {
    decode_batch_within(batch, DEFAULT_MAX_DECOMPRESSED).map_err(|e| match e {
        DecodeError::Malformed(e) => e,
        too_large @ DecodeError::TooLarge { .. } => BatchError {
            position: HEADER_LEN,
            message: too_large.to_string(),
        },
    })
}

/// [`decode_batch`] with the caller's bound on the decompressed records (a few
/// compressed bytes can declare gigabytes).
pub fn decode_batch_within(batch: &RawBatch, limit: usize) -> Result<Vec<Record>, DecodeError> {
    let section = batch.bytes().slice(HEADER_LEN..);
    let codec = batch.codec().ok_or(BatchError {
        position: 21,
        message: format!(
            "unknown compression codec in attributes {}",
            batch.attributes()
        ),
    })?;
    let plain = decompress(codec, section, limit).map_err(|e| match e {
        DecompressError::TooLarge { limit } => DecodeError::TooLarge {
            base_offset: batch.base_offset(),
            limit,
        },
        DecompressError::Corrupt(e) => BatchError {
            position: HEADER_LEN,
            message: format!("{codec:?} decompression failed: {e}"),
        }
        .into(),
    })?;
    Ok(decode_records(batch, plain)?)
}

/// The records of `batch`, from its decompressed records section.
fn decode_records(batch: &RawBatch, plain: Bytes) -> Result<Vec<Record>, BatchError> {
    let mut r = Reader {
        buf: plain,
        position: 0,
    };
    let Ok(count) = usize::try_from(batch.record_count()) else {
        return Err(BatchError {
            position: HEADER_LEN,
            message: format!("negative record count {}", batch.record_count()),
        });
    };
    // The count comes from the network: a record takes at least MIN_RECORD_LEN bytes, so a
    // count the records section cannot hold is refused before anything is allocated for it.
    if count > r.buf.remaining() / MIN_RECORD_LEN {
        return Err(BatchError {
            position: HEADER_LEN,
            message: format!(
                "record count {count} cannot fit in {} bytes of records",
                r.buf.remaining()
            ),
        });
    }
    let mut out = Vec::with_capacity(count);
    let mut previous_delta = -1i64;
    for _ in 0..count {
        let len = r.varint()?;
        if len < 0 || r.buf.remaining() < len as usize {
            return r.fail("record length");
        }
        let end = r.buf.remaining() - len as usize;
        if !r.buf.has_remaining() {
            return r.fail("attributes");
        }
        r.buf.advance(1);
        r.position += 1;
        let ts_delta = r.varint()?;
        let offset_delta = r.varint()?;
        let key = r.bytes("key")?;
        let value = r.bytes("value")?;
        let n_headers = r.varint()?;
        if n_headers < 0 {
            return r.fail("header count");
        }
        let mut headers = Vec::with_capacity(n_headers.min(64) as usize);
        for _ in 0..n_headers {
            let k = r.bytes("header key")?.unwrap_or_default();
            let v = r.bytes("header value")?;
            headers.push((k, v));
        }
        if r.buf.remaining() != end {
            return r.fail("record length mismatch");
        }
        let timestamp = if batch.is_log_append_time() {
            batch.max_timestamp()
        } else {
            match batch.base_timestamp().checked_add(ts_delta) {
                Some(t) => t,
                None => return r.fail("timestamp delta"),
            }
        };
        // Deltas run upwards within 0..=lastOffsetDelta (compaction leaves gaps, never a step
        // back); anything else would give copied records offsets the batch does not cover.
        if offset_delta <= previous_delta || offset_delta > batch.last_offset_delta() as i64 {
            return r.fail(&format!(
                "offset delta {offset_delta} (after {previous_delta}, last {})",
                batch.last_offset_delta()
            ));
        }
        previous_delta = offset_delta;
        let offset = batch.base_offset() + offset_delta;
        out.push(Record {
            offset,
            timestamp,
            key,
            value,
            headers,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rec(
        i: i64,
        key: Option<&str>,
        value: Option<&str>,
        headers: &[(&str, Option<&str>)],
    ) -> Record {
        Record {
            offset: i,
            timestamp: 1_000 + i * 3,
            key: key.map(|k| Bytes::copy_from_slice(k.as_bytes())),
            value: value.map(|v| Bytes::copy_from_slice(v.as_bytes())),
            headers: headers
                .iter()
                .map(|(k, v)| {
                    (
                        Bytes::copy_from_slice(k.as_bytes()),
                        v.map(|v| Bytes::copy_from_slice(v.as_bytes())),
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn null_empty_and_duplicate_headers_survive_every_codec() {
        let records = vec![
            rec(0, None, Some(""), &[]),
            rec(
                1,
                Some(""),
                None,
                &[("h", None), ("h", Some("")), ("h", Some("2"))],
            ),
            rec(2, Some("key"), Some("value"), &[("trace", Some("abc"))]),
        ];
        for codec in [
            Codec::None,
            Codec::Gzip,
            Codec::Snappy,
            Codec::Lz4,
            Codec::Zstd,
        ] {
            let b = encode_batch(
                &records,
                &BatchOptions {
                    codec,
                    ..BatchOptions::default()
                },
            )
            .unwrap();
            assert!(b.crc_valid());
            assert_eq!(decode_batch(&b).unwrap(), records, "{codec:?}");
        }
    }

    #[test]
    fn batches_match_kafka_protocols_encoder() {
        // Cross-check our encoding against the kafka-protocol crate's decoder.
        let records = vec![
            rec(0, Some("a"), Some("1"), &[("x", Some("y"))]),
            rec(1, None, Some("2"), &[]),
        ];
        let b = encode_batch(
            &records,
            &BatchOptions {
                codec: Codec::Lz4,
                ..BatchOptions::default()
            },
        )
        .unwrap();
        let mut bytes = b.bytes().clone();
        let set = kafka_protocol::records::RecordBatchDecoder::decode(&mut bytes).unwrap();
        assert_eq!(set.records.len(), 2);
        assert_eq!(set.records[0].key.as_deref(), Some(&b"a"[..]));
        assert_eq!(set.records[1].key, None);
        assert_eq!(set.records[1].timestamp, 1_003);
    }

    #[test]
    fn corrupt_records_are_errors_not_panics() {
        let b = encode_batch(
            &[rec(0, Some("k"), Some("v"), &[])],
            &BatchOptions::default(),
        )
        .unwrap();
        let mut m = BytesMut::from(&b.bytes()[..]);
        let last = m.len() - 1;
        m.truncate(last);
        let len = (m.len() - 12) as i32;
        m[8..12].copy_from_slice(&len.to_be_bytes());
        let cut = RawBatch::new(m.freeze()).unwrap();
        assert!(decode_batch(&cut).is_err());
    }

    #[test]
    fn offsets_and_timestamps_that_would_wrap_are_errors() {
        let b = encode_batch(
            &[
                rec(0, Some("k"), Some("v"), &[]),
                rec(1, None, Some("w"), &[]),
            ],
            &BatchOptions::default(),
        )
        .unwrap();
        // A base offset near i64::MAX: base + last delta wraps, or the next offset after it.
        for base in [i64::MAX, i64::MAX - 1] {
            let mut m = BytesMut::from(&b.bytes()[..]);
            m[0..8].copy_from_slice(&base.to_be_bytes());
            let e = RawBatch::new(m.freeze()).unwrap_err();
            assert!(e.message.contains("out of range"), "{e:?}");
        }
        let mut m = BytesMut::from(&b.bytes()[..]);
        m[0..8].copy_from_slice(&(i64::MAX - 2).to_be_bytes());
        assert_eq!(
            RawBatch::new(m.freeze()).unwrap().last_offset(),
            i64::MAX - 1
        );
        // A negative base offset.
        let mut m = BytesMut::from(&b.bytes()[..]);
        m[0..8].copy_from_slice(&(-5i64).to_be_bytes());
        assert!(RawBatch::new(m.freeze()).is_err());
        // A base timestamp near i64::MAX with a positive record delta.
        let late = encode_batch(
            &[
                Record {
                    timestamp: 0,
                    ..rec(0, None, Some("v"), &[])
                },
                Record {
                    timestamp: 10,
                    ..rec(1, None, Some("v"), &[])
                },
            ],
            &BatchOptions::default(),
        )
        .unwrap();
        let mut m = BytesMut::from(&late.bytes()[..]);
        m[27..35].copy_from_slice(&(i64::MAX - 3).to_be_bytes());
        let forged = RawBatch::new(m.freeze()).unwrap();
        let e = decode_batch(&forged).unwrap_err();
        assert!(e.message.contains("timestamp delta"), "{e:?}");
    }

    #[test]
    fn a_record_count_the_batch_cannot_hold_is_refused_before_allocating() {
        for codec in [Codec::None, Codec::Zstd] {
            let b = encode_batch(
                &[rec(0, Some("k"), Some("v"), &[])],
                &BatchOptions {
                    codec,
                    ..BatchOptions::default()
                },
            )
            .unwrap();
            let mut m = BytesMut::from(&b.bytes()[..]);
            // 2^31 - 1 records claimed by a batch of a few dozen bytes (a corrupt or hostile
            // header): `Vec::with_capacity` of that many records would abort the process.
            m[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
            let forged = RawBatch::new(m.freeze()).unwrap();
            assert_eq!(forged.record_count(), i32::MAX);
            let e = decode_batch(&forged).unwrap_err();
            assert!(e.message.contains("record count 2147483647"), "{e:?}");
        }
    }

    proptest! {
        #[test]
        fn encode_decode_round_trip(
            values in proptest::collection::vec(
                (proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
                 proptest::option::of(proptest::collection::vec(any::<u8>(), 0..200)),
                 proptest::collection::vec(("[a-z]{0,4}", proptest::option::of(proptest::collection::vec(any::<u8>(), 0..8))), 0..4),
                 0i64..100_000),
                1..20),
            codec in proptest::sample::select(vec![Codec::None, Codec::Gzip, Codec::Snappy, Codec::Lz4, Codec::Zstd]),
        ) {
            let records: Vec<Record> = values.into_iter().enumerate().map(|(i, (k, v, h, ts))| Record {
                offset: i as i64,
                timestamp: 1_600_000_000_000 + ts,
                key: k.map(Bytes::from),
                value: v.map(Bytes::from),
                headers: h.into_iter().map(|(hk, hv)| (Bytes::from(hk), hv.map(Bytes::from))).collect(),
            }).collect();
            let b = encode_batch(&records, &BatchOptions { codec, ..BatchOptions::default() }).unwrap();
            prop_assert!(b.crc_valid());
            prop_assert_eq!(decode_batch(&b).unwrap(), records);
        }
    }
}
