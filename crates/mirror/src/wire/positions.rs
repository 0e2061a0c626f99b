//! Source positions in MM2's own format: the Connect offset records in
//! `mm2-offsets.<source>.internal` (mm2-compatibility §0 item 11, §2). Connect finds offsets by comparing
//! the serialized key *bytes*, so the JSON must be exactly what Java's JsonConverter writes:
//! compact, and the map keys in the order Java's HashMap iterates them.

use kmirror_kafka::cluster::{parse_topic_id, topic_id_text, TopicId};
use serde_json::Value;
use std::collections::BTreeMap;

/// Where a source partition has been copied up to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourcePosition {
    pub cluster: String,
    pub topic: String,
    pub partition: i32,
    /// The last source offset copied; copying resumes at `offset + 1`.
    pub offset: i64,
}

fn json_str(s: &str) -> String {
    // JSON text of a string value (Value's Display cannot fail).
    serde_json::Value::from(s).to_string()
}

/// `["MirrorSourceConnector",{"cluster":"A","partition":0,"topic":"t"}]`
pub fn source_key(cluster: &str, topic: &str, partition: i32) -> Vec<u8> {
    format!(
        "[\"MirrorSourceConnector\",{{\"cluster\":{},\"partition\":{partition},\"topic\":{}}}]",
        json_str(cluster),
        json_str(topic)
    )
    .into_bytes()
}

/// `["MirrorCheckpointConnector",{"partition":P,"topic":"<target topic>","group":"<g>"}]`
pub fn checkpoint_key(group: &str, topic: &str, partition: i32) -> Vec<u8> {
    format!(
        "[\"MirrorCheckpointConnector\",{{\"partition\":{partition},\"topic\":{},\"group\":{}}}]",
        json_str(topic),
        json_str(group)
    )
    .into_bytes()
}

/// `["MirrorHeartbeatConnector",{"sourceClusterAlias":"<s>","targetClusterAlias":"<t>"}]`
pub fn heartbeat_key(source: &str, target: &str) -> Vec<u8> {
    format!(
        "[\"MirrorHeartbeatConnector\",{{\"sourceClusterAlias\":{},\"targetClusterAlias\":{}}}]",
        json_str(source),
        json_str(target)
    )
    .into_bytes()
}

/// `{"offset":N}`
pub fn offset_value(offset: i64) -> Vec<u8> {
    format!("{{\"offset\":{offset}}}").into_bytes()
}

impl SourcePosition {
    pub fn key(&self) -> Vec<u8> {
        source_key(&self.cluster, &self.topic, self.partition)
    }

    pub fn value(&self) -> Vec<u8> {
        offset_value(self.offset)
    }

    /// Reads a position record; `None` for other connectors' records, tombstones and anything
    /// that does not parse (Connect skips those too). Field order is not required when reading.
    pub fn decode(key: &[u8], value: Option<&[u8]>) -> Option<SourcePosition> {
        let key: Value = serde_json::from_slice(key).ok()?;
        let arr = key.as_array()?;
        if arr.len() != 2 || arr[0].as_str()? != "MirrorSourceConnector" {
            return None;
        }
        let m = arr[1].as_object()?;
        let value: Value = serde_json::from_slice(value?).ok()?;
        Some(SourcePosition {
            cluster: m.get("cluster")?.as_str()?.to_string(),
            topic: m.get("topic")?.as_str()?.to_string(),
            partition: i32::try_from(m.get("partition")?.as_i64()?).ok()?,
            offset: value.get("offset")?.as_i64()?,
        })
    }
}

/// kmirror's own record in the positions topic: which log of a source topic (its topic id,
/// KIP-516) the stored positions of that topic belong to, so a topic deleted and re-created
/// while kmirror was stopped is recognised (docs/engine.md, "Re-created topics"). A separate
/// key leaves MM2's position records byte-for-byte as MM2 writes them; Connect keeps this key
/// as the partition of a connector named `kmirror-source-log` that MM2 never asks for.
///
/// `["kmirror-source-log",{"cluster":"A","topic":"t"}]`
pub fn source_log_key(cluster: &str, topic: &str) -> Vec<u8> {
    format!(
        "[\"{SOURCE_LOG}\",{{\"cluster\":{},\"topic\":{}}}]",
        json_str(cluster),
        json_str(topic)
    )
    .into_bytes()
}

const SOURCE_LOG: &str = "kmirror-source-log";

/// `{"topic_id":"<id as Kafka's tools print it>"}`
pub fn source_log_value(id: &TopicId) -> Vec<u8> {
    format!("{{\"topic_id\":{}}}", json_str(&topic_id_text(id))).into_bytes()
}

/// kmirror's own record in the positions topic: the runs of offsets one process copied one for
/// one (docs/sharing.md, "Exact checkpoints"), so the flow's leader translates the groups of
/// partitions other processes copy exactly. One record per process and source cluster, under a
/// key MM2 never asks for (like [`source_log_key`]).
///
/// `["kmirror-runs",{"cluster":"A","member":"<host>:<pid>/<random>"}]`
pub fn runs_key(cluster: &str, member: &str) -> Vec<u8> {
    format!(
        "[\"{RUNS}\",{{\"cluster\":{},\"member\":{}}}]",
        json_str(cluster),
        json_str(member)
    )
    .into_bytes()
}

const RUNS: &str = "kmirror-runs";

#[derive(serde::Serialize, serde::Deserialize)]
struct RunsValue {
    topics: BTreeMap<String, TopicRuns>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct TopicRuns {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    topic_id: Option<String>,
    partitions: BTreeMap<i32, PartitionRuns>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct PartitionRuns {
    from: i64,
    runs: Vec<[i64; 3]>,
}

/// One partition's runs as an owner publishes them (docs/sharing.md, "Exact checkpoints"):
/// `runs` are `[first source offset, first target offset, count]`, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exported {
    pub topic: String,
    pub partition: i32,
    pub from: i64,
    pub runs: Vec<[i64; 3]>,
}

/// What one owner publishes: its partitions' runs, and the log (topic id text) of each topic
/// where known.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Publication {
    pub logs: BTreeMap<String, Option<String>>,
    pub partitions: Vec<Exported>,
}

/// `{"topics":{"t":{"topic_id":"<id>","partitions":{"0":{"from":F,"runs":[[u,d,n],...]}}}}}`
pub fn runs_value(p: &Publication) -> Vec<u8> {
    let mut topics: BTreeMap<String, TopicRuns> = BTreeMap::new();
    for x in &p.partitions {
        topics
            .entry(x.topic.clone())
            .or_insert_with(|| TopicRuns {
                topic_id: p.logs.get(&x.topic).cloned().flatten(),
                partitions: BTreeMap::new(),
            })
            .partitions
            .insert(
                x.partition,
                PartitionRuns {
                    from: x.from,
                    runs: x.runs.clone(),
                },
            );
    }
    serde_json::to_vec(&RunsValue { topics }).unwrap_or_default()
}

fn decode_runs(value: &[u8]) -> Option<Publication> {
    let v: RunsValue = serde_json::from_slice(value).ok()?;
    let mut out = Publication::default();
    for (topic, t) in v.topics {
        out.logs.insert(topic.clone(), t.topic_id);
        for (partition, r) in t.partitions {
            out.partitions.push(Exported {
                topic: topic.clone(),
                partition,
                from: r.from,
                runs: r.runs,
            });
        }
    }
    Some(out)
}

/// One record of the positions topic, as far as a flow reading it cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoredRecord {
    Position(SourcePosition),
    /// A tombstone for a position: that partition starts over (its topic was re-created).
    Forgotten {
        cluster: String,
        topic: String,
        partition: i32,
    },
    /// Which log the positions of `topic` belong to (`None`: a tombstone or an id that does
    /// not parse, so nothing is known).
    Log {
        cluster: String,
        topic: String,
        id: Option<TopicId>,
    },
    /// A process's published runs (`None`: its tombstone, or a value that does not parse).
    Runs {
        cluster: String,
        member: String,
        publication: Option<Publication>,
    },
}

impl StoredRecord {
    /// Reads a record of the positions topic; `None` for other connectors' records and
    /// anything that does not parse.
    pub fn decode(key: &[u8], value: Option<&[u8]>) -> Option<StoredRecord> {
        let parsed: Value = serde_json::from_slice(key).ok()?;
        let arr = parsed.as_array()?;
        if arr.len() != 2 {
            return None;
        }
        let m = arr[1].as_object()?;
        let cluster = m.get("cluster")?.as_str()?.to_string();
        if arr[0].as_str()? == RUNS {
            return Some(StoredRecord::Runs {
                cluster,
                member: m.get("member")?.as_str()?.to_string(),
                publication: value.and_then(decode_runs),
            });
        }
        let topic = m.get("topic")?.as_str()?.to_string();
        match arr[0].as_str()? {
            "MirrorSourceConnector" => match value {
                Some(_) => SourcePosition::decode(key, value).map(StoredRecord::Position),
                None => Some(StoredRecord::Forgotten {
                    cluster,
                    topic,
                    partition: i32::try_from(m.get("partition")?.as_i64()?).ok()?,
                }),
            },
            SOURCE_LOG => {
                let id = value
                    .and_then(|v| serde_json::from_slice::<Value>(v).ok())
                    .and_then(|v| v.get("topic_id")?.as_str().and_then(parse_topic_id));
                Some(StoredRecord::Log { cluster, topic, id })
            }
            _ => None,
        }
    }
}

/// The partition of the positions topic a key goes to: Connect's producer uses Kafka's default
/// partitioner on the key bytes.
pub fn positions_partition(key: &[u8], partitions: i32) -> i32 {
    kmirror_kafka::partitioner::partition_for_key(key, partitions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_byte_exact() {
        assert_eq!(
            source_key("A", "orders", 0),
            br#"["MirrorSourceConnector",{"cluster":"A","partition":0,"topic":"orders"}]"#.to_vec()
        );
        assert_eq!(
            checkpoint_key("g", "A.orders", 3),
            br#"["MirrorCheckpointConnector",{"partition":3,"topic":"A.orders","group":"g"}]"#
                .to_vec()
        );
        assert_eq!(
            heartbeat_key("A", "B"),
            br#"["MirrorHeartbeatConnector",{"sourceClusterAlias":"A","targetClusterAlias":"B"}]"#
                .to_vec()
        );
        assert_eq!(offset_value(41), br#"{"offset":41}"#.to_vec());
        // Escaping as JSON requires.
        assert_eq!(
            source_key("a\"b", "t", 1),
            br#"["MirrorSourceConnector",{"cluster":"a\"b","partition":1,"topic":"t"}]"#.to_vec()
        );
    }

    #[test]
    fn positions_round_trip_and_reject_other_records() {
        let p = SourcePosition {
            cluster: "A".into(),
            topic: "orders".into(),
            partition: 2,
            offset: 99,
        };
        assert_eq!(
            SourcePosition::decode(&p.key(), Some(&p.value())),
            Some(p.clone())
        );
        // Field order does not matter when reading.
        let reordered =
            br#"["MirrorSourceConnector",{"topic":"orders","partition":2,"cluster":"A"}]"#;
        assert_eq!(SourcePosition::decode(reordered, Some(&p.value())), Some(p));
        assert_eq!(
            SourcePosition::decode(&checkpoint_key("g", "t", 0), Some(br#"{"offset":0}"#)),
            None
        );
        assert_eq!(SourcePosition::decode(&source_key("A", "t", 0), None), None);
        assert_eq!(SourcePosition::decode(b"not json", Some(b"{}")), None);
    }

    #[test]
    fn source_logs_and_tombstones_are_read_back() {
        let id = TopicId::from_u128(7);
        let key = source_log_key("A", "orders");
        assert_eq!(
            key,
            br#"["kmirror-source-log",{"cluster":"A","topic":"orders"}]"#.to_vec()
        );
        assert_eq!(
            source_log_value(&id),
            br#"{"topic_id":"AAAAAAAAAAAAAAAAAAAABw"}"#.to_vec()
        );
        let log = |id| StoredRecord::Log {
            cluster: "A".into(),
            topic: "orders".into(),
            id,
        };
        assert_eq!(
            StoredRecord::decode(&key, Some(&source_log_value(&id))),
            Some(log(Some(id)))
        );
        assert_eq!(StoredRecord::decode(&key, None), Some(log(None)));
        assert_eq!(
            StoredRecord::decode(&key, Some(br#"{"topic_id":"??"}"#)),
            Some(log(None))
        );
        assert_eq!(
            StoredRecord::decode(&source_key("A", "orders", 3), None),
            Some(StoredRecord::Forgotten {
                cluster: "A".into(),
                topic: "orders".into(),
                partition: 3
            })
        );
        assert_eq!(
            StoredRecord::decode(&source_key("A", "orders", 3), Some(br#"{"offset":5}"#)),
            Some(StoredRecord::Position(SourcePosition {
                cluster: "A".into(),
                topic: "orders".into(),
                partition: 3,
                offset: 5
            }))
        );
        assert_eq!(
            StoredRecord::decode(&checkpoint_key("g", "t", 0), Some(br#"{"offset":0}"#)),
            None
        );
        assert_eq!(StoredRecord::decode(b"[1,2]", None), None);
    }

    #[test]
    fn positions_partition_is_stable_and_in_range() {
        let k = source_key("A", "orders", 0);
        let p = positions_partition(&k, 25);
        assert!((0..25).contains(&p));
        assert_eq!(p, positions_partition(&k, 25));
    }

    #[test]
    fn published_runs_round_trip_and_a_bad_value_is_no_publication() {
        let key = runs_key("A", "host-1:42");
        assert_eq!(
            key,
            br#"["kmirror-runs",{"cluster":"A","member":"host-1:42"}]"#.to_vec()
        );
        let p = Publication {
            logs: BTreeMap::from([("t".to_string(), Some("AAAAAAAAAAAAAAAAAAAABw".to_string()))]),
            partitions: vec![
                Exported {
                    topic: "t".into(),
                    partition: 0,
                    from: 5,
                    runs: vec![[5, 0, 10], [16, 10, 3]],
                },
                Exported {
                    topic: "t".into(),
                    partition: 11,
                    from: 0,
                    runs: vec![[0, 0, 1]],
                },
            ],
        };
        let value = runs_value(&p);
        assert_eq!(
            value,
            br#"{"topics":{"t":{"topic_id":"AAAAAAAAAAAAAAAAAAAABw","partitions":{"0":{"from":5,"runs":[[5,0,10],[16,10,3]]},"11":{"from":0,"runs":[[0,0,1]]}}}}}"#.to_vec()
        );
        let runs = |publication| StoredRecord::Runs {
            cluster: "A".into(),
            member: "host-1:42".into(),
            publication,
        };
        assert_eq!(
            StoredRecord::decode(&key, Some(&value)),
            Some(runs(Some(p)))
        );
        assert_eq!(StoredRecord::decode(&key, None), Some(runs(None)));
        assert_eq!(
            StoredRecord::decode(&key, Some(br#"{"topics":{"t":{"partitions":{"x":{}}}}}"#)),
            Some(runs(None))
        );
    }
}
