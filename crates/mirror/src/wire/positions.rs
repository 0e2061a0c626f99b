//! Source positions in MM2's own format: the Connect offset records in
//! `mm2-offsets.<source>.internal` (mm2-spec §0 item 11, §2). Connect finds offsets by comparing
//! the serialized key *bytes*, so the JSON must be exactly what Java's JsonConverter writes:
//! compact, and the map keys in the order Java's HashMap iterates them.

use serde_json::Value;

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
    fn positions_partition_is_stable_and_in_range() {
        let k = source_key("A", "orders", 0);
        let p = positions_partition(&k, 25);
        assert!((0..25).contains(&p));
        assert_eq!(p, positions_partition(&k, 25));
    }
}
