//! Schema ids in records (docs/schemas.md, "Ids in records"): when a flow translates ids, the
//! key and the value of every record in the Confluent wire format get the target registry's id
//! of the source's schema. Pure: the map is asked, never guessed; what it lacks holds the batch
//! back (the send gate waits for the schema to reach the target), so no record is written with
//! a wrong id.

use super::batches::{Outgoing, PlanError};
use bytes::Bytes;
use kmirror_kafka::batch::Codec;
use kmirror_kafka::records::{
    decode_batch_within, encode_within, BatchOptions, DecodeError, Record,
};
use kmirror_registry::{wire, SchemaId};
use std::collections::BTreeSet;

/// What the id map says of a source id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The target registry's id of the same schema (possibly the same number).
    Id(SchemaId),
    /// The source registry has no schema with this id: the payload only looks like the wire
    /// format (a first byte of zero, then anything), and passes as it is, counted.
    NoSchema,
    /// Not on the target yet: the batch waits.
    Pending,
}

/// What became of a batch's records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Translated {
    /// No id changes (none in the wire format, or each maps to the same number): the batch goes
    /// as it was planned, untouched.
    AsIs { passed: u64 },
    /// Each id replaced; offsets, timestamps, headers and everything after the id unchanged.
    Rewritten { translated: u64, passed: u64 },
    /// Source ids the target does not have yet: nothing was changed.
    Waiting(BTreeSet<SchemaId>),
}

/// Translates the ids of `records` in place through `target`, or changes nothing when an id is
/// not on the target yet.
pub fn translate(records: &mut [Record], target: &dyn Fn(SchemaId) -> Target) -> Translated {
    let mut waiting = BTreeSet::new();
    let mut passed = 0u64;
    let mut changes = 0usize;
    for r in records.iter() {
        for payload in [&r.key, &r.value].into_iter().flatten() {
            let Some(from) = wire::schema_id(payload) else {
                continue;
            };
            match target(from) {
                Target::Id(to) if to == from => {}
                Target::Id(_) => changes += 1,
                Target::NoSchema => passed += 1,
                Target::Pending => {
                    waiting.insert(from);
                }
            }
        }
    }
    if !waiting.is_empty() {
        return Translated::Waiting(waiting);
    }
    if changes == 0 {
        return Translated::AsIs { passed };
    }
    let mut translated = 0u64;
    for r in records.iter_mut() {
        for payload in [&mut r.key, &mut r.value] {
            let Some(bytes) = payload.as_ref() else {
                continue;
            };
            let Some(from) = wire::schema_id(bytes) else {
                continue;
            };
            if let Target::Id(to) = target(from) {
                if to != from {
                    if let Some(rewritten) = wire::with_schema_id(bytes, to) {
                        *payload = Some(Bytes::from(rewritten));
                        translated += 1;
                    }
                }
            }
        }
    }
    Translated::Rewritten { translated, passed }
}

/// What became of one planned batch.
#[derive(Debug)]
pub enum Rewrite {
    /// Send it as it was planned (no id changes): `passed` payloads named ids the source does
    /// not know.
    AsIs { passed: u64 },
    /// Send these instead: the records with their ids rewritten, encoded with the batch's own
    /// codec (as many batches as `max.request.size` needs), with their source offsets and tags.
    Rewritten {
        sends: Vec<Outgoing>,
        translated: u64,
        passed: u64,
    },
    /// Hold it: these ids are not on the target yet.
    Waiting(BTreeSet<SchemaId>),
}

/// Looks at the ids in one planned batch (decoding at most `max_decompressed` bytes) and
/// rewrites them through `target` when they differ. A batch that does not decode cannot be
/// checked, so it is refused rather than sent with ids nobody looked at.
pub fn rewrite(
    (batch, ups, tag): &Outgoing,
    target: &dyn Fn(SchemaId) -> Target,
    max_decompressed: usize,
    max_request: usize,
) -> Result<Rewrite, PlanError> {
    // A merged or re-encoded batch numbers its records from 0: the source offsets are the
    // planned ones, by position.
    let at = ups.bounds().map_or(batch.base_offset(), |(first, _)| first);
    let mut records = decode_batch_within(batch, max_decompressed).map_err(|e| match e {
        DecodeError::TooLarge { .. } => PlanError::Refused {
            offset: at,
            message: format!("{e}; schema ids are checked in every batch: raise kmirror.batch.max.decompressed.bytes if batches this large are expected"),
        },
        DecodeError::Malformed(e) => PlanError::Corrupt {
            offset: at,
            message: format!("{e} (schema ids cannot be checked)"),
        },
    })?;
    if records.len() as i64 != ups.len() {
        return Err(PlanError::Corrupt {
            offset: at,
            message: format!(
                "the batch holds {} records where {} were planned (schema ids cannot be checked)",
                records.len(),
                ups.len()
            ),
        });
    }
    match translate(&mut records, target) {
        Translated::AsIs { passed } => Ok(Rewrite::AsIs { passed }),
        Translated::Waiting(ids) => Ok(Rewrite::Waiting(ids)),
        Translated::Rewritten { translated, passed } => {
            let options = BatchOptions {
                codec: batch.codec().unwrap_or(Codec::None),
                ..BatchOptions::default()
            };
            let encoded =
                encode_within(&records, &options, max_request).map_err(|e| PlanError::Refused {
                    offset: at,
                    message: e.to_string(),
                })?;
            let mut sends = Vec::with_capacity(encoded.len());
            for (b, range) in encoded {
                let Some(part) = ups.slice(range) else {
                    continue;
                };
                let Some((_, last)) = part.bounds() else {
                    continue;
                };
                sends.push((b, part, last));
            }
            // The planned tag may pass records compaction removed at the batch's end.
            if let Some(l) = sends.last_mut() {
                l.2 = *tag;
            }
            Ok(Rewrite::Rewritten {
                sends,
                translated,
                passed,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offsets::sync_rules::SourceOffsets;
    use kmirror_kafka::batch::RawBatch;

    fn framed(id: i32, body: &[u8]) -> Bytes {
        let mut v = vec![0];
        v.extend_from_slice(&id.to_be_bytes());
        v.extend_from_slice(body);
        Bytes::from(v)
    }

    fn record(offset: i64, key: Option<Bytes>, value: Option<Bytes>) -> Record {
        Record {
            offset,
            timestamp: 1_700_000_000_000 + offset,
            key,
            value,
            headers: vec![(Bytes::from_static(b"h"), Some(Bytes::from_static(b"v")))],
        }
    }

    /// Source 1 -> target 11, 2 -> 2 (the same number), 3 has no schema, 4 not there yet.
    fn map(id: SchemaId) -> Target {
        match id.0 {
            1 => Target::Id(SchemaId(11)),
            2 => Target::Id(SchemaId(2)),
            4 => Target::Pending,
            _ => Target::NoSchema,
        }
    }

    #[test]
    fn keys_and_values_get_the_targets_id_and_nothing_else_changes() {
        // A Protobuf value: its message indexes (here one zero byte) follow the id unchanged.
        let records = vec![
            record(7, Some(framed(1, b"k")), Some(framed(1, b"\x00\x02hi"))),
            record(
                8,
                Some(Bytes::from_static(b"plain key")),
                Some(framed(2, b"v")),
            ),
            record(10, None, None),
        ];
        let mut out = records.clone();
        let Translated::Rewritten { translated, passed } = translate(&mut out, &map) else {
            panic!("expected a rewrite")
        };
        assert_eq!((translated, passed), (2, 0));
        assert_eq!(out[0].key, Some(framed(11, b"k")));
        assert_eq!(out[0].value, Some(framed(11, b"\x00\x02hi")));
        assert_eq!(out[1], records[1], "id 2 maps to 2: untouched");
        assert_eq!(out[2], records[2]);
        for (a, b) in out.iter().zip(&records) {
            assert_eq!(
                (a.offset, a.timestamp, &a.headers),
                (b.offset, b.timestamp, &b.headers)
            );
        }
    }

    #[test]
    fn a_batch_with_nothing_to_change_goes_as_it_is() {
        let records = vec![
            record(0, None, Some(framed(2, b"same number"))),
            record(
                1,
                Some(Bytes::from_static(b"\x00\x00")),
                Some(Bytes::from_static(b"{}")),
            ),
            record(2, None, Some(framed(3, b"not a schema of the source"))),
        ];
        let mut out = records.clone();
        assert_eq!(translate(&mut out, &map), Translated::AsIs { passed: 1 });
        assert_eq!(out, records);
    }

    #[test]
    fn an_id_not_on_the_target_yet_holds_the_whole_batch() {
        let records = vec![
            record(0, None, Some(framed(1, b"a"))),
            record(1, Some(framed(4, b"k")), Some(framed(4, b"b"))),
            record(2, None, Some(framed(3, b"c"))),
        ];
        let mut out = records.clone();
        assert_eq!(
            translate(&mut out, &map),
            Translated::Waiting(BTreeSet::from([SchemaId(4)]))
        );
        assert_eq!(out, records, "nothing changed while waiting");
    }

    fn encoded(records: &[Record], codec: Codec) -> RawBatch {
        let options = BatchOptions {
            codec,
            ..BatchOptions::default()
        };
        kmirror_kafka::records::encode_batch(records, &options).unwrap()
    }

    #[test]
    fn a_planned_batch_is_rewritten_with_its_own_codec_and_keeps_its_offsets_and_tag() {
        // Numbered from 0, as a merged or re-encoded batch is; the plan knows the source offsets.
        let records: Vec<Record> = (0..3)
            .map(|i| record(i, None, Some(framed(1, b"payload"))))
            .collect();
        let batch = encoded(&records, Codec::Lz4);
        let planned = (
            batch,
            SourceOffsets::Contiguous {
                first: 40,
                count: 3,
            },
            45,
        );
        let Ok(Rewrite::Rewritten {
            sends,
            translated,
            passed,
        }) = rewrite(&planned, &map, 1 << 20, 1 << 20)
        else {
            panic!("expected a rewrite")
        };
        assert_eq!((translated, passed), (3, 0));
        assert_eq!(sends.len(), 1);
        let (b, ups, tag) = &sends[0];
        assert_eq!(b.codec(), Some(Codec::Lz4));
        assert_eq!(
            *ups,
            SourceOffsets::Contiguous {
                first: 40,
                count: 3
            }
        );
        assert_eq!(*tag, 45, "the planned tag, past what compaction removed");
        let back = decode_batch_within(b, 1 << 20).unwrap();
        assert!(back.iter().all(|r| r.value == Some(framed(11, b"payload"))));
        assert_eq!(
            back.iter().map(|r| r.timestamp).collect::<Vec<_>>(),
            records.iter().map(|r| r.timestamp).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_rewrite_split_by_max_request_size_keeps_each_parts_planned_offsets() {
        let records: Vec<Record> = (0..6)
            .map(|i| record(i, None, Some(framed(1, &[b'x'; 300]))))
            .collect();
        let planned = (
            encoded(&records, Codec::None),
            SourceOffsets::Listed(vec![100, 101, 103, 104, 107, 108]),
            110,
        );
        let Ok(Rewrite::Rewritten { sends, .. }) = rewrite(&planned, &map, 1 << 20, 1000) else {
            panic!("expected a rewrite")
        };
        assert!(sends.len() > 1, "split: {}", sends.len());
        let mut all = Vec::new();
        for (i, (b, ups, tag)) in sends.iter().enumerate() {
            let SourceOffsets::Listed(v) = ups else {
                panic!("{ups:?}")
            };
            assert_eq!(v.len() as i32, b.record_count());
            let last = if i + 1 == sends.len() {
                110
            } else {
                *v.last().unwrap()
            };
            assert_eq!(*tag, last);
            all.extend(v.iter().copied());
        }
        assert_eq!(all, vec![100, 101, 103, 104, 107, 108]);
    }

    #[test]
    fn a_planned_batch_without_changes_or_with_missing_schemas_is_not_re_encoded() {
        let same = encoded(&[record(0, None, Some(framed(2, b"x")))], Codec::Gzip);
        let planned = (same, SourceOffsets::Listed(vec![0]), 0);
        assert!(matches!(
            rewrite(&planned, &map, 1 << 20, 1 << 20),
            Ok(Rewrite::AsIs { passed: 0 })
        ));
        let waiting = encoded(&[record(0, None, Some(framed(4, b"x")))], Codec::None);
        let planned = (waiting, SourceOffsets::Listed(vec![0]), 0);
        assert!(matches!(
            rewrite(&planned, &map, 1 << 20, 1 << 20),
            Ok(Rewrite::Waiting(ids)) if ids == BTreeSet::from([SchemaId(4)])
        ));
    }

    #[test]
    fn a_batch_too_large_to_check_is_refused_at_its_offset() {
        let records: Vec<Record> = (0..50)
            .map(|i| record(i, None, Some(framed(1, &[7u8; 1000]))))
            .collect();
        let planned = (
            encoded(&records, Codec::Zstd),
            SourceOffsets::Contiguous {
                first: 0,
                count: 50,
            },
            49,
        );
        match rewrite(&planned, &map, 10_000, 1 << 20) {
            Err(PlanError::Refused { offset, message }) => {
                assert_eq!(offset, 0);
                assert!(
                    message.contains("kmirror.batch.max.decompressed.bytes"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
