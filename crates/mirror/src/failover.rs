//! Failover tooling (what Java users do with RemoteClusterUtils.translateOffsets, mm2-spec §7):
//! a group's translated offsets on the target, read from the checkpoints topic there (written by
//! kmirror or by MM2), and committing them for a group with no active members.

use crate::config::model::FlowConfig;
use crate::engine::read_to_end;
use crate::wire::internal::Checkpoint;
use kmirror_kafka::admin::CommittedOffset;
use kmirror_kafka::cluster::KafkaCluster;
use kmirror_kafka::KafkaError;
use serde::Serialize;
use std::collections::BTreeMap;

/// One partition of a group on the target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    /// The target-side topic.
    pub topic: String,
    pub partition: i32,
    /// The group's committed offset on the source when the checkpoint was taken.
    pub upstream_offset: i64,
    /// Where the group resumes on the target.
    pub translated_offset: i64,
    /// The group's committed offset on the target now, if any.
    pub target_offset: Option<i64>,
    /// What `apply` does: `set`, `same` or `keep` (the target is already past the translation;
    /// never rewound).
    pub action: &'static str,
}

#[derive(Debug, thiserror::Error)]
pub enum FailoverError {
    #[error("{0}")]
    Kafka(#[from] KafkaError),
    #[error("no checkpoints for group '{group}' in {topic} on {target}: the group has not committed offsets for replicated topics on {from}, or checkpoints are not emitted (emit.checkpoints.enabled)")]
    NoCheckpoints {
        group: String,
        topic: String,
        from: String,
        target: String,
    },
    #[error("group '{group}' has {members} active member(s) on {target} (state {state}); stop its consumers before applying offsets")]
    Active {
        group: String,
        members: usize,
        state: String,
        target: String,
    },
}

/// The group's translated offsets, from the newest checkpoint per partition.
pub async fn translate(
    flow: &FlowConfig,
    target: &KafkaCluster,
    group: &str,
) -> Result<Vec<Row>, FailoverError> {
    let topic = flow.policy.checkpoints_topic(&flow.id.source);
    let no_checkpoints = || FailoverError::NoCheckpoints {
        group: group.into(),
        topic: topic.clone(),
        from: flow.id.source.to_string(),
        target: flow.id.target.to_string(),
    };
    if !target.metadata().topics.contains_key(&topic) {
        target.refresh_metadata(Some(&[&topic])).await?;
        if !target.metadata().topics.contains_key(&topic) {
            return Err(no_checkpoints());
        }
    }
    let (records, _) = read_to_end(target, &topic, 0, None).await?;
    let mut newest: BTreeMap<(String, i32), Checkpoint> = BTreeMap::new();
    for r in records {
        // Tombstones and undecodable records are skipped, as MirrorClient does.
        if let (Some(k), Some(v)) = (r.key.as_deref(), r.value.as_deref()) {
            if let Ok(c) = Checkpoint::decode(k, v) {
                if c.group == group {
                    newest.insert((c.topic.clone(), c.partition), c);
                }
            }
        }
    }
    if newest.is_empty() {
        return Err(no_checkpoints());
    }
    let current = target.fetch_group_offsets(group).await?;
    Ok(newest
        .into_values()
        .map(|c| {
            let have = current
                .get(&c.topic)
                .and_then(|m| m.get(&c.partition))
                .map(|o| o.offset);
            let action = match have {
                Some(h) if h == c.downstream_offset => "same",
                Some(h) if h > c.downstream_offset => "keep",
                _ => "set",
            };
            Row {
                topic: c.topic,
                partition: c.partition,
                upstream_offset: c.upstream_offset,
                translated_offset: c.downstream_offset,
                target_offset: have,
                action,
            }
        })
        .collect())
}

/// Commits the rows marked `set` for a group with no active members on the target.
pub async fn apply(
    flow: &FlowConfig,
    target: &KafkaCluster,
    group: &str,
    rows: &[Row],
) -> Result<usize, FailoverError> {
    let desc = target.describe_group(group).await?;
    if desc.members > 0 {
        return Err(FailoverError::Active {
            group: group.into(),
            members: desc.members,
            state: desc.state,
            target: flow.id.target.to_string(),
        });
    }
    let mut commit: BTreeMap<String, BTreeMap<i32, CommittedOffset>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.action == "set") {
        commit.entry(r.topic.clone()).or_default().insert(
            r.partition,
            CommittedOffset {
                offset: r.translated_offset,
                leader_epoch: -1,
                metadata: String::new(),
            },
        );
    }
    let n = commit.values().map(|m| m.len()).sum();
    if n > 0 {
        target.commit_group_offsets(group, &commit).await?;
    }
    Ok(n)
}

/// A plain table of rows.
pub fn render(rows: &[Row]) -> String {
    let width = rows.iter().map(|r| r.topic.len()).max().unwrap_or(5).max(5);
    let mut out = format!(
        "{:<width$}  {:>9}  {:>12}  {:>12}  {:>12}  action\n",
        "topic", "partition", "source", "translated", "target now"
    );
    for r in rows {
        out.push_str(&format!(
            "{:<width$}  {:>9}  {:>12}  {:>12}  {:>12}  {}\n",
            r.topic,
            r.partition,
            r.upstream_offset,
            r.translated_offset,
            r.target_offset.map_or("-".to_string(), |o| o.to_string()),
            r.action
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_table() {
        let rows = vec![Row {
            topic: "A.orders".into(),
            partition: 0,
            upstream_offset: 120,
            translated_offset: 118,
            target_offset: None,
            action: "set",
        }];
        let t = render(&rows);
        assert!(t.starts_with("topic     partition"), "{t}");
        assert!(
            t.contains("A.orders          0           120           118             -  set"),
            "{t}"
        );
    }
}
