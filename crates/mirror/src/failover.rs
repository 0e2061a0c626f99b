//! Failover tooling (what Java users do with RemoteClusterUtils.translateOffsets, mm2-compatibility §7):
//! a group's translated offsets on the target, read from the checkpoints topic there (written by
//! kmirror or by MM2), and committing them for a group with no active members.

use crate::config::model::FlowConfig;
use crate::engine::read_to_end;
use crate::filter::PatternList;
use crate::wire::internal::Checkpoint;
use kmirror_kafka::admin::CommittedOffset;
use kmirror_kafka::cluster::KafkaCluster;
use kmirror_kafka::KafkaError;
use serde::Serialize;
use std::collections::BTreeMap;

/// One partition of a group on the target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    pub group: String,
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

/// Which groups move: those named, and those with checkpoints whose id matches the patterns
/// (MM2's `groups` syntax: a comma-separated list of regular expressions, each matching whole
/// ids). A failover moves hundreds of groups at once (MM2 4.3 added a batch translation for
/// this, KIP-1239); the checkpoints topic is read once for all of them.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub named: Vec<String>,
    pub matching: Option<PatternList>,
}

impl Selection {
    pub fn named<I: IntoIterator<Item = S>, S: Into<String>>(groups: I) -> Selection {
        Selection {
            named: groups.into_iter().map(Into::into).collect(),
            matching: None,
        }
    }

    fn wants(&self, group: &str) -> bool {
        self.named.iter().any(|g| g == group)
            || self.matching.as_ref().is_some_and(|p| p.matches(group))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FailoverError {
    #[error("{0}")]
    Kafka(#[from] KafkaError),
    #[error("no checkpoints for group(s) {} in {topic} on {target}: the group has not committed offsets for replicated topics on {from}, or checkpoints are not emitted (emit.checkpoints.enabled)", quoted(.groups))]
    NoCheckpoints {
        groups: Vec<String>,
        topic: String,
        from: String,
        target: String,
    },
    #[error("no group with checkpoints in {topic} on {target} matches {patterns}")]
    NoneMatching {
        patterns: String,
        topic: String,
        target: String,
    },
    #[error("{} on {target}: stop their consumers before applying offsets (nothing was committed, for any group)", .active.iter().map(|(g, members, state)| format!("group '{g}' has {members} active member(s) (state {state})")).collect::<Vec<_>>().join("; "))]
    Active {
        /// Group, members, state.
        active: Vec<(String, usize, String)>,
        target: String,
    },
    #[error("committing group '{group}' failed: {source}; committed before it: {}; not committed: '{group}' and the groups after it", if .committed.is_empty() { "none".to_string() } else { quoted(.committed) })]
    Partial {
        group: String,
        committed: Vec<String>,
        source: KafkaError,
    },
}

fn quoted(groups: &[String]) -> String {
    groups
        .iter()
        .map(|g| format!("'{g}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One group's translated offsets, from the newest checkpoint per partition.
pub async fn translate(
    flow: &FlowConfig,
    target: &KafkaCluster,
    group: &str,
) -> Result<Vec<Row>, FailoverError> {
    translate_groups(flow, target, &Selection::named([group])).await
}

/// The selected groups' translated offsets (ordered by group, topic, partition), from the newest
/// checkpoint per partition. A group named but without checkpoints is an error, as is a
/// selection that finds no group at all.
pub async fn translate_groups(
    flow: &FlowConfig,
    target: &KafkaCluster,
    select: &Selection,
) -> Result<Vec<Row>, FailoverError> {
    let topic = flow.checkpoints_topic();
    let no_checkpoints = |groups: Vec<String>| FailoverError::NoCheckpoints {
        groups,
        topic: topic.clone(),
        from: flow.id.source.to_string(),
        target: flow.id.target.to_string(),
    };
    let none_matching = || FailoverError::NoneMatching {
        patterns: select
            .matching
            .as_ref()
            .map(|p| p.items().join(", "))
            .unwrap_or_default(),
        topic: topic.clone(),
        target: flow.id.target.to_string(),
    };
    if !target.metadata().topics.contains_key(&topic) {
        target.refresh_metadata(Some(&[&topic])).await?;
        if !target.metadata().topics.contains_key(&topic) {
            return Err(if select.named.is_empty() {
                none_matching()
            } else {
                no_checkpoints(select.named.clone())
            });
        }
    }
    let (records, _) = read_to_end(target, &topic, 0, None).await?;
    let newest = newest_checkpoints(
        records
            .iter()
            .filter_map(|r| Some((r.key.as_deref()?, r.value.as_deref()?))),
        select,
    );
    let missing: Vec<String> = select
        .named
        .iter()
        .filter(|g| !newest.contains_key(g.as_str()))
        .cloned()
        .collect();
    if !missing.is_empty() {
        return Err(no_checkpoints(missing));
    }
    if newest.is_empty() {
        return Err(none_matching());
    }
    let mut rows = Vec::new();
    for (group, checkpoints) in newest {
        let current = target.fetch_group_offsets(&group).await?;
        rows.extend(checkpoints.into_values().map(|c| {
            let have = current
                .get(&c.topic)
                .and_then(|m| m.get(&c.partition))
                .map(|o| o.offset);
            row(c, have)
        }));
    }
    Ok(rows)
}

/// The newest checkpoint per partition of each selected group. Tombstones and undecodable
/// records are skipped, as MirrorClient does.
fn newest_checkpoints<'a>(
    records: impl Iterator<Item = (&'a [u8], &'a [u8])>,
    select: &Selection,
) -> BTreeMap<String, BTreeMap<(String, i32), Checkpoint>> {
    let mut newest: BTreeMap<String, BTreeMap<(String, i32), Checkpoint>> = BTreeMap::new();
    for (k, v) in records {
        if let Ok(c) = Checkpoint::decode(k, v) {
            if select.wants(&c.group) {
                newest
                    .entry(c.group.clone())
                    .or_default()
                    .insert((c.topic.clone(), c.partition), c);
            }
        }
    }
    newest
}

fn row(c: Checkpoint, have: Option<i64>) -> Row {
    let action = match have {
        Some(h) if h == c.downstream_offset => "same",
        Some(h) if h > c.downstream_offset => "keep",
        _ => "set",
    };
    Row {
        group: c.group,
        topic: c.topic,
        partition: c.partition,
        upstream_offset: c.upstream_offset,
        translated_offset: c.downstream_offset,
        target_offset: have,
        action,
    }
}

/// Commits the rows marked `set` for a group with no active members on the target.
pub async fn apply(
    flow: &FlowConfig,
    target: &KafkaCluster,
    group: &str,
    rows: &[Row],
) -> Result<usize, FailoverError> {
    let rows: Vec<Row> = rows.iter().filter(|r| r.group == group).cloned().collect();
    Ok(apply_groups(flow, target, &rows).await?.values().sum())
}

/// Commits the rows marked `set`, group by group, once none of the groups with something to
/// commit has active members on the target: one active group refuses them all, so a failover is
/// not left half done. (A group with nothing to set is not asked: its consumers may be running
/// on the target already.) Returns the partitions committed per group; a commit failing part
/// way says which groups were committed before it.
pub async fn apply_groups(
    flow: &FlowConfig,
    target: &KafkaCluster,
    rows: &[Row],
) -> Result<BTreeMap<String, usize>, FailoverError> {
    apply_groups_with(flow, target, rows, false)
        .await
        .map(|o| o.committed)
}

/// What [`apply_groups_with`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Applied {
    /// Partitions committed per group (0: the group was already at or past its translation).
    pub committed: BTreeMap<String, usize>,
    /// Groups left alone because they have active members on the target: group, members, state.
    pub refused: Vec<(String, usize, String)>,
}

/// As [`apply_groups`]; with `skip_active`, groups with active members on the target are left
/// alone and listed, and every other group is committed (a fleet failover goes on past the
/// consumers that already moved).
pub async fn apply_groups_with(
    flow: &FlowConfig,
    target: &KafkaCluster,
    rows: &[Row],
    skip_active: bool,
) -> Result<Applied, FailoverError> {
    let mut commits: BTreeMap<&str, BTreeMap<String, BTreeMap<i32, CommittedOffset>>> =
        BTreeMap::new();
    for r in rows {
        let group = commits.entry(r.group.as_str()).or_default();
        if r.action == "set" {
            group.entry(r.topic.clone()).or_default().insert(
                r.partition,
                CommittedOffset {
                    offset: r.translated_offset,
                    leader_epoch: -1,
                    metadata: String::new(),
                },
            );
        }
    }
    let mut active = Vec::new();
    for (group, commit) in &commits {
        if commit.is_empty() {
            continue;
        }
        let desc = target.describe_group(group).await?;
        if desc.members > 0 {
            active.push((group.to_string(), desc.members, desc.state));
        }
    }
    if !active.is_empty() && !skip_active {
        return Err(FailoverError::Active {
            active,
            target: flow.id.target.to_string(),
        });
    }
    let mut done = BTreeMap::new();
    for (group, commit) in commits {
        if active.iter().any(|(g, _, _)| g == group) {
            continue;
        }
        let n = commit.values().map(|m| m.len()).sum();
        if n > 0 {
            if let Err(source) = target.commit_group_offsets(group, &commit).await {
                return Err(FailoverError::Partial {
                    group: group.to_string(),
                    committed: done
                        .iter()
                        .filter(|(_, n)| **n > 0)
                        .map(|(g, _): (&String, _)| g.clone())
                        .collect(),
                    source,
                });
            }
        }
        done.insert(group.to_string(), n);
    }
    Ok(Applied {
        committed: done,
        refused: active,
    })
}

/// A plain table of rows.
pub fn render(rows: &[Row]) -> String {
    let width = rows.iter().map(|r| r.topic.len()).max().unwrap_or(5).max(5);
    let gwidth = rows.iter().map(|r| r.group.len()).max().unwrap_or(5).max(5);
    let mut out = format!(
        "{:<gwidth$}  {:<width$}  {:>9}  {:>12}  {:>12}  {:>12}  action\n",
        "group", "topic", "partition", "source", "translated", "target now"
    );
    for r in rows {
        out.push_str(&format!(
            "{:<gwidth$}  {:<width$}  {:>9}  {:>12}  {:>12}  {:>12}  {}\n",
            r.group,
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
            group: "billing".into(),
            topic: "A.orders".into(),
            partition: 0,
            upstream_offset: 120,
            translated_offset: 118,
            target_offset: None,
            action: "set",
        }];
        let t = render(&rows);
        assert!(t.starts_with("group    topic     partition"), "{t}");
        assert!(
            t.contains(
                "billing  A.orders          0           120           118             -  set"
            ),
            "{t}"
        );
    }

    fn cp(group: &str, partition: i32, down: i64) -> (Vec<u8>, Vec<u8>) {
        let c = Checkpoint {
            group: group.into(),
            topic: "A.orders".into(),
            partition,
            upstream_offset: down + 2,
            downstream_offset: down,
            metadata: String::new(),
        };
        (c.key().unwrap(), c.value().unwrap())
    }

    #[test]
    fn the_selection_takes_named_and_matching_groups_newest_checkpoint_first() {
        let log = [
            cp("billing", 0, 10),
            cp("audit-1", 0, 5),
            cp("billing", 0, 20),
            cp("other", 0, 7),
            (b"not a key".to_vec(), b"x".to_vec()),
            cp("audit-2", 1, 9),
            cp("audit", 0, 1),
        ];
        let select = Selection {
            named: vec!["billing".into()],
            matching: Some(PatternList::parse("audit-.*").unwrap()),
        };
        let newest = newest_checkpoints(
            log.iter().map(|(k, v)| (k.as_slice(), v.as_slice())),
            &select,
        );
        let groups: Vec<&str> = newest.keys().map(String::as_str).collect();
        assert_eq!(groups, ["audit-1", "audit-2", "billing"], "whole ids match");
        let billing = &newest["billing"][&("A.orders".to_string(), 0)];
        assert_eq!(billing.downstream_offset, 20, "the newest checkpoint wins");
    }

    #[test]
    fn a_translation_never_rewinds_the_target() {
        let c = |down| Checkpoint::decode(&cp("g", 0, down).0, &cp("g", 0, down).1).unwrap();
        assert_eq!(row(c(10), None).action, "set");
        assert_eq!(row(c(10), Some(4)).action, "set");
        assert_eq!(row(c(10), Some(10)).action, "same");
        assert_eq!(row(c(10), Some(12)).action, "keep");
    }

    #[test]
    fn an_active_group_is_named_and_nothing_is_committed() {
        let e = FailoverError::Active {
            active: vec![
                ("audit".into(), 1, "Stable".into()),
                ("billing".into(), 2, "Stable".into()),
            ],
            target: "B".into(),
        };
        let m = e.to_string();
        assert!(
            m.contains(
                "group 'audit' has 1 active member(s) (state Stable); group 'billing' has 2"
            ),
            "{m}"
        );
        assert!(m.contains("nothing was committed, for any group"), "{m}");
        let e = FailoverError::Partial {
            group: "c".into(),
            committed: vec!["a".into(), "b".into()],
            source: KafkaError::Disconnected { broker: "1".into() },
        };
        assert!(
            e.to_string().contains(
                "committed before it: 'a', 'b'; not committed: 'c' and the groups after it"
            ),
            "{e}"
        );
        let e = FailoverError::NoCheckpoints {
            groups: vec!["a".into(), "b".into()],
            topic: "A.checkpoints.internal".into(),
            from: "A".into(),
            target: "B".into(),
        };
        assert!(
            e.to_string()
                .starts_with("no checkpoints for group(s) 'a', 'b' in A.checkpoints.internal on B"),
            "{e}"
        );
    }
}
