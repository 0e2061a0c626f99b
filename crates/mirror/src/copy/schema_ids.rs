//! Schema ids in records (docs/schemas.md, "Ids in records"): when a flow translates ids, the
//! key and the value of every record in the Confluent wire format get the target registry's id
//! of the source's schema. Pure: the map is asked, never guessed; what it lacks holds the batch
//! back (the send gate waits for the schema to reach the target), so no record is written with
//! a wrong id.

use bytes::Bytes;
use kmirror_kafka::records::Record;
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
    /// The records, each id replaced; offsets, timestamps, headers and everything after the id
    /// unchanged.
    Rewritten {
        records: Vec<Record>,
        translated: u64,
        passed: u64,
    },
    /// Source ids the target does not have yet.
    Waiting(BTreeSet<SchemaId>),
}

/// Translates the ids of `records` through `target`.
pub fn translate(records: Vec<Record>, target: &dyn Fn(SchemaId) -> Target) -> Translated {
    let mut waiting = BTreeSet::new();
    let (mut translated, mut passed) = (0u64, 0u64);
    let mut out = Vec::with_capacity(records.len());
    for mut r in records {
        for payload in [&mut r.key, &mut r.value] {
            let Some(bytes) = payload.as_ref() else {
                continue;
            };
            let Some(from) = wire::schema_id(bytes) else {
                continue;
            };
            match target(from) {
                Target::Id(to) if to == from => {}
                Target::Id(to) => {
                    if let Some(rewritten) = wire::with_schema_id(bytes, to) {
                        *payload = Some(Bytes::from(rewritten));
                        translated += 1;
                    }
                }
                Target::NoSchema => passed += 1,
                Target::Pending => {
                    waiting.insert(from);
                }
            }
        }
        out.push(r);
    }
    if !waiting.is_empty() {
        Translated::Waiting(waiting)
    } else if translated == 0 {
        Translated::AsIs { passed }
    } else {
        Translated::Rewritten {
            records: out,
            translated,
            passed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let Translated::Rewritten {
            records: out,
            translated,
            passed,
        } = translate(records.clone(), &map)
        else {
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
        assert_eq!(translate(records, &map), Translated::AsIs { passed: 1 });
    }

    #[test]
    fn an_id_not_on_the_target_yet_holds_the_whole_batch() {
        let records = vec![
            record(0, None, Some(framed(1, b"a"))),
            record(1, Some(framed(4, b"k")), Some(framed(4, b"b"))),
            record(2, None, Some(framed(3, b"c"))),
        ];
        assert_eq!(
            translate(records, &map),
            Translated::Waiting(BTreeSet::from([SchemaId(4)]))
        );
    }
}
