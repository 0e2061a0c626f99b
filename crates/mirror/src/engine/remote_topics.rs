//! Remote topics on the target: created before any data with the source's partition count,
//! `replication.factor` and the source's topic configs (mm2-compatibility §5.3–§5.4); grown when the
//! source gains partitions; differences that cannot be fixed are reported, never "fixed" by
//! deleting anything.

use crate::config::model::{FlowConfig, Side};
use crate::filter::PatternList;
use kmirror_kafka::admin::ConfigEntry;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic};
use kmirror_kafka::{KafkaError, Refusal};

/// Kafka's ConfigSource for a value from the broker's static `server.properties`.
const STATIC_BROKER_CONFIG: i8 = 4;

/// The configs a remote topic is created with (MM2's non-incremental filter, mm2-compatibility §5.3):
/// the source's non-default entries (defaults too with `use.defaults.from=source`), minus
/// read-only, sensitive, static-broker and `config.properties.exclude` keys.
pub fn creation_configs(flow: &FlowConfig, source: &[ConfigEntry]) -> Vec<(String, String)> {
    copied_configs(
        flow.use_defaults_from == Side::Source,
        &flow.config_properties_exclude,
        source,
    )
}

/// [`creation_configs`] without a flow (MM1 mode uses MM2's default exclude list).
pub fn copied_configs(
    with_defaults: bool,
    exclude: &PatternList,
    source: &[ConfigEntry],
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = source
        .iter()
        .filter(|e| !e.read_only && !e.sensitive && e.source != STATIC_BROKER_CONFIG)
        .filter(|e| !e.is_default() || with_defaults)
        .filter(|e| !exclude.matches(&e.name))
        .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
        .collect();
    out.sort();
    out
}

/// What `ensure` found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ensured {
    Created {
        configs: usize,
    },
    Grown {
        from: i32,
        to: i32,
    },
    Exists,
    /// The remote topic has more partitions than the source: records keep their partition
    /// numbers, the extra partitions stay empty.
    MorePartitions {
        remote: i32,
    },
}

/// Creates `remote` on the target unless it exists, growing it to `partitions`.
pub async fn ensure(
    flow: &FlowConfig,
    source: &KafkaCluster,
    target: &KafkaCluster,
    topic: &str,
    remote: &str,
    partitions: i32,
) -> Result<Ensured, KafkaError> {
    if let Some(t) = target.metadata().topics.get(remote) {
        let have = t.partitions.len() as i32;
        return Ok(if have < partitions {
            target.create_partitions(remote, partitions, false).await?;
            target.refresh_metadata(Some(&[remote])).await?;
            Ensured::Grown {
                from: have,
                to: partitions,
            }
        } else if have > partitions {
            Ensured::MorePartitions { remote: have }
        } else {
            Ensured::Exists
        });
    }
    let configs = creation_configs(flow, &source.describe_topic_configs(topic).await?);
    let n = configs.len();
    let new = NewTopic {
        name: remote.into(),
        partitions,
        replication_factor: flow.replication_factor,
        configs,
    };
    let created = create(target, new).await?;
    target.refresh_metadata(Some(&[remote])).await?;
    Ok(if created {
        Ensured::Created { configs: n }
    } else {
        Ensured::Exists
    })
}

/// Creates every remote topic of `wanted` (source topic, remote topic, partitions) that the
/// target does not have yet, in one DescribeConfigs (source) and one CreateTopics request per
/// 100 topics, then refreshes the target's metadata once. Returns the remote topics created,
/// with how many configs each got. One topic at a time, a source with hundreds of topics
/// waited seconds per topic before its last partitions started copying. A topic the target
/// refuses is left out here; [`ensure`] tries it again on its own and reports why.
pub async fn create_missing(
    flow: &FlowConfig,
    source: &KafkaCluster,
    target: &KafkaCluster,
    wanted: &[(String, String, i32)],
) -> Result<std::collections::BTreeMap<String, usize>, KafkaError> {
    let md = target.metadata();
    let missing: Vec<&(String, String, i32)> = wanted
        .iter()
        .filter(|(_, remote, _)| !md.topics.contains_key(remote))
        .collect();
    let mut created = std::collections::BTreeMap::new();
    if missing.len() < 2 {
        return Ok(created); // nothing to batch: `ensure` does it
    }
    let names: Vec<String> = missing.iter().map(|(t, _, _)| t.clone()).collect();
    let configs = source.describe_topics_configs(&names).await?;
    let new: Vec<NewTopic> = missing
        .iter()
        .filter_map(|(topic, remote, partitions)| {
            let entries = configs.get(topic)?.as_ref().ok()?;
            Some(NewTopic {
                name: remote.clone(),
                partitions: *partitions,
                replication_factor: flow.replication_factor,
                configs: creation_configs(flow, entries),
            })
        })
        .collect();
    for chunk in creation_batches(&new) {
        for (name, err) in target.create_topics(chunk, false).await? {
            if err.is_none() {
                let n = chunk
                    .iter()
                    .find(|t| t.name == name)
                    .map_or(0, |t| t.configs.len());
                created.insert(name, n);
            }
        }
    }
    if !created.is_empty() {
        let names: Vec<&str> = created.keys().map(String::as_str).collect();
        target.refresh_metadata(Some(&names)).await?;
    }
    Ok(created)
}

/// A KRaft controller refuses a CreateTopics that makes more than 10,000 metadata records
/// ("Unable to perform excessively large batch operation", `MAX_RECORDS_PER_USER_OP`): one per
/// topic, per partition and per config. Requests stay at 100 topics and about half that limit.
const MAX_RECORDS_PER_CREATE: usize = 5_000;

/// Consecutive runs of `new` that one CreateTopics request may carry.
fn creation_batches(new: &[NewTopic]) -> Vec<&[NewTopic]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut records = 0;
    for (i, t) in new.iter().enumerate() {
        let n = 1 + t.partitions.max(0) as usize + t.configs.len();
        if i > start && (i - start >= 100 || records + n > MAX_RECORDS_PER_CREATE) {
            out.push(&new[start..i]);
            start = i;
            records = 0;
        }
        records += n;
    }
    if start < new.len() {
        out.push(&new[start..]);
    }
    out
}

/// The `cleanup.policy` of a source topic and of its existing remote topic, when they differ
/// (a compacted source copied into a `delete` topic loses keys to retention, and the reverse
/// keeps only the last record per key).
pub async fn cleanup_policy_mismatch(
    source: &KafkaCluster,
    target: &KafkaCluster,
    topic: &str,
    remote: &str,
) -> Result<Option<(String, String)>, KafkaError> {
    let policy = |entries: Vec<ConfigEntry>| {
        entries
            .into_iter()
            .find(|e| e.name == "cleanup.policy")
            .and_then(|e| e.value)
            .unwrap_or_else(|| "delete".into())
    };
    let s = policy(source.describe_topic_configs(topic).await?);
    let t = policy(target.describe_topic_configs(remote).await?);
    Ok((s != t).then_some((s, t)))
}

/// Creates one of kmirror's (MM2's) internal topics and loads its metadata, so it can be
/// written at once. As MM2 does (KAFKA-15465, mm2-compatibility §2), a refusal for lack of permission or
/// an old broker is taken to mean the operator created the topic: later reads and writes tell
/// if it is really missing.
pub async fn create_internal(k: &KafkaCluster, topic: NewTopic) -> Result<bool, KafkaError> {
    let name = topic.name.clone();
    let created = match create(k, topic).await {
        Err(e) if e.is(Refusal::CannotCreateTopics) => {
            tracing::debug!(topic = %name, error = %e, "cannot create internal topic; assuming it exists");
            false
        }
        Err(KafkaError::UnsupportedVersion { .. }) => false,
        other => other?,
    };
    k.refresh_metadata(Some(&[name.as_str()])).await?;
    Ok(created)
}

/// Writes one record (acks=all) to partition `partition` of an internal topic: a heartbeat, a
/// registration, a tombstone.
pub(crate) async fn write_record(
    k: &KafkaCluster,
    topic: &str,
    partition: i32,
    timestamp: i64,
    key: Vec<u8>,
    value: Option<Vec<u8>>,
) -> Result<(), KafkaError> {
    let record = kmirror_kafka::records::Record {
        offset: 0,
        timestamp,
        key: Some(bytes::Bytes::from(key)),
        value: value.map(bytes::Bytes::from),
        headers: vec![],
    };
    let batch = kmirror_kafka::records::encode_batch(
        &[record],
        &kmirror_kafka::records::BatchOptions::default(),
    )
    .map_err(|e| KafkaError::Config(e.to_string()))?;
    k.produce(topic, partition, &batch).await?;
    Ok(())
}

/// Creates a topic; false if it already existed (another process or a race).
pub async fn create(k: &KafkaCluster, topic: NewTopic) -> Result<bool, KafkaError> {
    let result = k.create_topics(&[topic], false).await?.into_iter().next();
    match result.and_then(|(_, err)| err) {
        None => Ok(true),
        Some(e) if e.is(Refusal::TopicExists) => Ok(false),
        Some(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{entry, flow};

    #[test]
    fn creation_requests_stay_under_the_controllers_record_limit() {
        let topic = |partitions| NewTopic {
            name: "t".into(),
            partitions,
            replication_factor: -1,
            configs: vec![("retention.ms".into(), "1".into())],
        };
        // 100 topics of 100 partitions: 10,200 records in one request would be refused.
        let many: Vec<NewTopic> = (0..100).map(|_| topic(100)).collect();
        let batches = creation_batches(&many);
        assert!(batches.len() >= 3, "{}", batches.len());
        assert_eq!(batches.iter().map(|b| b.len()).sum::<usize>(), 100);
        for b in &batches {
            let records: usize = b.iter().map(|t| 2 + t.partitions as usize).sum();
            assert!(records <= MAX_RECORDS_PER_CREATE, "{records}");
        }
        // Small topics: 100 per request.
        let small: Vec<NewTopic> = (0..250).map(|_| topic(1)).collect();
        let sizes: Vec<usize> = creation_batches(&small).iter().map(|b| b.len()).collect();
        assert_eq!(sizes, vec![100, 100, 50]);
        // One topic over the limit still goes (alone): the broker says why it refuses it.
        let huge = vec![topic(1), topic(20_000), topic(1)];
        let sizes: Vec<usize> = creation_batches(&huge).iter().map(|b| b.len()).collect();
        assert_eq!(sizes, vec![1, 1, 1]);
        assert!(creation_batches(&[]).is_empty());
    }

    #[test]
    fn copies_non_default_entries_minus_excluded_static_read_only_and_sensitive() {
        let mut ro = entry("message.format.version", "3.0", 1);
        ro.read_only = true;
        let mut secret = entry("some.password", "x", 1);
        secret.sensitive = true;
        let source = vec![
            entry("retention.ms", "3600000", 1),
            entry("cleanup.policy", "compact", 1),
            entry("segment.bytes", "1048576", 2), // dynamic broker config: copied
            entry("max.message.bytes", "1048588", 5), // default: not copied
            entry("log.retention.hours", "168", STATIC_BROKER_CONFIG),
            entry("min.insync.replicas", "2", 1), // excluded by MM2's default list
            entry("message.timestamp.type", "LogAppendTime", 1), // excluded too
            ro,
            secret,
        ];
        assert_eq!(
            creation_configs(&flow(""), &source),
            vec![
                ("cleanup.policy".into(), "compact".into()),
                ("retention.ms".into(), "3600000".into()),
                ("segment.bytes".into(), "1048576".into()),
            ]
        );
        // use.defaults.from=source also copies the source's defaults.
        let with_defaults = creation_configs(&flow("use.defaults.from = source\n"), &source);
        assert!(with_defaults.contains(&("max.message.bytes".into(), "1048588".into())));
        // A custom exclude list replaces MM2's.
        let custom = creation_configs(
            &flow("config.properties.exclude = retention\\..*\n"),
            &source,
        );
        assert!(custom.contains(&("min.insync.replicas".into(), "2".into())));
        assert!(!custom.iter().any(|(k, _)| k == "retention.ms"));
    }
}
