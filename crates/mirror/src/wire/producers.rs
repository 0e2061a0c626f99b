//! kmirror's own record format for loop prevention (docs/topologies.md, "Identity names both
//! ways"): `kmirror-producers.internal` on a cluster lists the producer ids kmirror's flows write
//! into that cluster with, and the cluster each flow copies from. A flow reading the cluster
//! back skips the batches of those producer ids that came from its own target, so batches are
//! still forwarded as they are (no header to add, nothing re-encoded).
//!
//! Key: the producer id in decimal (compaction keeps one record per id). Value: compact JSON,
//! `{"version":1,"source":"A","target":"B","flow":"A->B","registered_ms":1700000000000,
//! "source_cluster_id":"..."}` (the id when the source reported one).
//! Readers ignore fields they do not know, so later versions may add some.

use serde::{Deserialize, Serialize};

/// The topic, on every cluster a flow with loop prevention writes into. Its `.internal` suffix
/// keeps it out of MM2's and kmirror's default topic filters.
pub const PRODUCERS_TOPIC: &str = "kmirror-producers.internal";

/// One producer id a flow writes into its target with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerEntry {
    #[serde(skip)]
    pub producer_id: i64,
    pub version: u32,
    /// The flow's source: batches of this producer id came from there.
    pub source: String,
    /// The cluster the entry lives on.
    pub target: String,
    pub flow: String,
    pub registered_ms: i64,
    /// The source cluster's id (Kafka's `cluster.id`), when known: flows in other processes may
    /// name the cluster by another alias.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_cluster_id: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProducerEntryError {
    #[error("key is not a producer id (a non-negative decimal number)")]
    Key,
    #[error("value is not a producer entry: {0}")]
    Value(String),
}

impl ProducerEntry {
    pub fn key(&self) -> Vec<u8> {
        self.producer_id.to_string().into_bytes()
    }

    pub fn value(&self) -> Vec<u8> {
        // Serialising plain strings and numbers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads an entry back; bytes from the network, so anything unexpected is an error.
    pub fn decode(key: &[u8], value: &[u8]) -> Result<ProducerEntry, ProducerEntryError> {
        let producer_id = std::str::from_utf8(key)
            .ok()
            .filter(|k| !k.is_empty() && k.len() <= 19 && k.bytes().all(|c| c.is_ascii_digit()))
            .and_then(|k| k.parse::<i64>().ok())
            .ok_or(ProducerEntryError::Key)?;
        let mut entry: ProducerEntry =
            serde_json::from_slice(value).map_err(|e| ProducerEntryError::Value(e.to_string()))?;
        if entry.source.is_empty() {
            return Err(ProducerEntryError::Value("empty source".into()));
        }
        entry.producer_id = producer_id;
        Ok(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> ProducerEntry {
        ProducerEntry {
            producer_id: 4007,
            version: 1,
            source: "A".into(),
            target: "B".into(),
            flow: "A->B".into(),
            registered_ms: 1_700_000_000_000,
            source_cluster_id: None,
        }
    }

    #[test]
    fn an_entry_reads_back_as_written() {
        let e = entry();
        assert_eq!(e.key(), b"4007");
        assert_eq!(
            String::from_utf8(e.value()).unwrap(),
            r#"{"version":1,"source":"A","target":"B","flow":"A->B","registered_ms":1700000000000}"#
        );
        assert_eq!(ProducerEntry::decode(&e.key(), &e.value()), Ok(e.clone()));
        let with_id = ProducerEntry {
            source_cluster_id: Some("MkU3OEVBNTcwNTJENDM2Qk".into()),
            ..e
        };
        assert!(String::from_utf8(with_id.value())
            .unwrap()
            .ends_with(r#","source_cluster_id":"MkU3OEVBNTcwNTJENDM2Qk"}"#));
        assert_eq!(
            ProducerEntry::decode(&with_id.key(), &with_id.value()),
            Ok(with_id)
        );
    }

    #[test]
    fn later_fields_are_ignored_and_bad_bytes_refused() {
        let v = br#"{"version":2,"source":"A","target":"B","flow":"A->B","registered_ms":1,"extra":[1]}"#;
        assert_eq!(ProducerEntry::decode(b"12", v).unwrap().producer_id, 12);
        for key in [&b""[..], b"-1", b"1e3", b"99999999999999999999", b"\xff"] {
            assert_eq!(
                ProducerEntry::decode(key, &entry().value()),
                Err(ProducerEntryError::Key),
                "{key:?}"
            );
        }
        assert!(ProducerEntry::decode(b"1", b"{").is_err());
        assert!(ProducerEntry::decode(b"1", br#"{"version":1}"#).is_err());
        let empty = br#"{"version":1,"source":"","target":"B","flow":"x","registered_ms":1}"#;
        assert!(ProducerEntry::decode(b"1", empty).is_err());
    }
}
