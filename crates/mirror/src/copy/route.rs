//! Where MM1 mode writes each record: the target partition that Java's default partitioner
//! would pick (murmur2 of the key modulo the target's partition count, so keyed data lands
//! where Java producers put it even when the target has fewer or more partitions), and for
//! records without a key one partition per chunk and topic, moving on with each chunk (Java's
//! sticky partitioning, which also spreads keyless records batch by batch). Then the records of
//! each target partition are encoded into batches of `batch.size`, split further to fit
//! `max.request.size`. Pure.

use kmirror_kafka::batch::{Codec, RawBatch};
use kmirror_kafka::partitioner::partition_for_key;
use kmirror_kafka::records::{encode_within, BatchOptions, Record};
use std::collections::{BTreeMap, HashMap};

/// Records grouped by target (topic, partition), in source order within each group.
pub(crate) type Routed = BTreeMap<(String, i32), Vec<Record>>;

/// Groups `records` (already transformed, with their target topic) by target partition.
/// `counts` holds the partition count of every target topic named; `sticky` picks the keyless
/// partition and is advanced by the caller once per chunk.
pub(crate) fn route(
    records: Vec<(String, Record)>,
    counts: &HashMap<String, i32>,
    sticky: u32,
) -> Routed {
    let mut out: Routed = BTreeMap::new();
    for (topic, r) in records {
        let n = counts.get(&topic).copied().unwrap_or(1).max(1);
        let p = match &r.key {
            Some(k) => partition_for_key(k, n),
            None => (sticky % n as u32) as i32,
        };
        out.entry((topic, p)).or_default().push(r);
    }
    out
}

/// Rough size of a record in a batch (Java compares `batch.size` with its estimate too).
fn size(r: &Record) -> usize {
    16 + r.key.as_ref().map_or(0, |k| k.len())
        + r.value.as_ref().map_or(0, |v| v.len())
        + r.headers
            .iter()
            .map(|(k, v)| 8 + k.len() + v.as_ref().map_or(0, |v| v.len()))
            .sum::<usize>()
}

/// Encodes records into batches of about `batch_size` bytes (at least one record each), each
/// within `max_request_size` when a single record allows it.
pub(crate) fn encode(
    records: &[Record],
    codec: Codec,
    batch_size: usize,
    max_request_size: usize,
) -> Result<Vec<RawBatch>, String> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < records.len() {
        let mut end = start;
        let mut bytes = 0;
        while end < records.len() && (end == start || bytes + size(&records[end]) <= batch_size) {
            bytes += size(&records[end]);
            end += 1;
        }
        let options = BatchOptions {
            codec,
            ..BatchOptions::default()
        };
        out.extend(
            encode_within(&records[start..end], &options, max_request_size)
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(|(b, _)| b),
        );
        start = end;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use kmirror_kafka::records::decode_batch;

    fn rec(key: Option<&str>, value: &str) -> Record {
        Record {
            offset: 0,
            timestamp: 1_700_000_000_000,
            key: key.map(|k| Bytes::from(k.to_string())),
            value: Some(Bytes::from(value.to_string())),
            headers: vec![(Bytes::from_static(b"h"), Some(Bytes::from_static(b"v")))],
        }
    }

    #[test]
    fn keyed_records_go_where_javas_partitioner_puts_them() {
        let counts: HashMap<String, i32> = [("t".to_string(), 50)].into();
        let records: Vec<(String, Record)> = ["21", "foobar", "abc"]
            .iter()
            .map(|k| ("t".to_string(), rec(Some(k), k)))
            .collect();
        let routed = route(records, &counts, 0);
        // toPositive(murmur2(k)) % 50 with Kafka's murmur2 test values.
        let expect = |h: i32| (h & 0x7fff_ffff) % 50;
        for (key, hash) in [
            ("21", -973_932_308),
            ("foobar", -790_332_482),
            ("abc", 479_470_107),
        ] {
            let recs = &routed[&("t".to_string(), expect(hash))];
            assert!(recs
                .iter()
                .any(|r| r.key.as_deref() == Some(key.as_bytes())));
        }
    }

    #[test]
    fn keyless_records_of_a_chunk_stick_to_one_partition_and_order_is_kept() {
        let counts: HashMap<String, i32> = [("t".to_string(), 4), ("u".to_string(), 3)].into();
        let records: Vec<(String, Record)> = (0..10)
            .map(|i| {
                (
                    if i % 2 == 0 { "t" } else { "u" }.to_string(),
                    rec(None, &i.to_string()),
                )
            })
            .collect();
        let routed = route(records, &counts, 5);
        assert_eq!(routed.len(), 2);
        let t = &routed[&("t".to_string(), 1)];
        let values: Vec<&[u8]> = t.iter().map(|r| r.value.as_deref().unwrap()).collect();
        assert_eq!(values, [b"0", b"2", b"4", b"6", b"8"]);
        assert!(routed.contains_key(&("u".to_string(), 2)));
    }

    #[test]
    fn batches_follow_batch_size_and_max_request_size_and_keep_records() {
        let records: Vec<Record> = (0..100)
            .map(|i| rec(Some(&format!("k{i}")), &"x".repeat(100)))
            .collect();
        let batches = encode(&records, Codec::None, 1_000, 1 << 20).unwrap();
        assert!(batches.len() >= 10, "{}", batches.len());
        let decoded: Vec<Record> = batches
            .iter()
            .flat_map(|b| decode_batch(b).unwrap())
            .collect();
        assert_eq!(decoded.len(), 100);
        for (d, r) in decoded.iter().zip(&records) {
            assert_eq!(
                (&d.key, &d.value, &d.headers),
                (&r.key, &r.value, &r.headers)
            );
            assert_eq!(d.timestamp, r.timestamp);
        }
        // A huge batch.size still splits to fit the request limit.
        let fitted = encode(&records, Codec::None, usize::MAX, 4_000).unwrap();
        assert!(fitted.iter().all(|b| b.bytes().len() <= 4_000));
        assert_eq!(fitted.iter().map(|b| b.record_count()).sum::<i32>(), 100);
        assert!(encode(&[], Codec::Lz4, 16_384, 1 << 20).unwrap().is_empty());
    }
}
