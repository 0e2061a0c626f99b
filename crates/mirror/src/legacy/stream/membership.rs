//! One MM1 stream's side of the source consumer group: joins with the range assignor over the
//! matching topics, keeps the member alive with heartbeats, rejoins on rebalances or when the
//! matching topics change, and before each rejoin asks the copy task to flush and commit with the
//! generation it still holds (a Java consumer's revocation).

use super::{Assigned, Control, Shared, TopicSet};
use crate::copy::lease::Lease;
use crate::legacy::ledger::Key;
use crate::legacy::LegacyError;
use kmirror_kafka::group::consumer_protocol::{parse_assignment, RangeAssignor};
use kmirror_kafka::group::{GroupConfig, GroupMember};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};

pub(super) fn assignor(shared: &Shared, topics: &TopicSet) -> Arc<RangeAssignor> {
    // The leader assigns every member's topics, not only ours (a Java consumer may share the
    // group): counts of all source topics.
    let mut counts: BTreeMap<String, i32> = shared
        .source
        .metadata()
        .topics
        .iter()
        .map(|(t, m)| (t.clone(), m.partitions.len() as i32))
        .collect();
    counts.extend(topics.iter().map(|(t, n)| (t.clone(), *n)));
    Arc::new(RangeAssignor {
        topics: topics.keys().cloned().collect(),
        partition_counts: counts,
    })
}

pub(super) async fn membership(
    shared: &Shared,
    index: u32,
    tx: mpsc::Sender<Control>,
    lease: &Mutex<Lease>,
    revoking: &super::Revoking,
) -> Result<(), LegacyError> {
    let renewed = |sent: Instant| {
        lease
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .renewed(sent)
    };
    let cfg = &shared.cfg;
    let group = || cfg.group_id.clone();
    let mut topics_rx = shared.topics.clone();
    let mut subscribed = topics_rx.borrow_and_update().clone();
    let config = GroupConfig {
        group_id: cfg.group_id.clone(),
        protocol_type: "consumer".into(),
        session_timeout: cfg.session_timeout,
        rebalance_timeout: cfg.rebalance_timeout,
        instance_id: None,
    };
    let mut attempt = 0u32;
    let mut member = loop {
        let sent = Instant::now();
        match GroupMember::join(
            shared.source.clone(),
            config.clone(),
            assignor(shared, &subscribed),
        )
        .await
        {
            Ok(m) => {
                renewed(sent);
                break m;
            }
            Err(e) if e.is_retriable() || e.is_stale_metadata() => {
                tracing::warn!(stream = index, group = %cfg.group_id, error = %e, "joining the group failed; retrying");
                if shared.shutdown.retry_after(&mut attempt).await {
                    return Ok(());
                }
            }
            Err(source) => {
                shared.shutdown.trigger();
                return Err(LegacyError::Group {
                    group: group(),
                    source,
                });
            }
        }
    };
    loop {
        let partitions: Vec<Key> = parse_assignment(member.assignment())
            .map_err(|source| LegacyError::Group {
                group: group(),
                source,
            })?
            .into_iter()
            .flat_map(|(t, ps)| ps.into_iter().map(move |p| (t.clone(), p)))
            .collect();
        tracing::info!(stream = index, group = %cfg.group_id, generation = member.generation(), leader = member.is_leader(), partitions = partitions.len(), "partitions assigned");
        shared.record_share(index, &partitions);
        let assigned = Assigned {
            generation: member.generation(),
            member_id: member.member_id().to_string(),
            partitions,
        };
        if tx.send(Control::Assigned(assigned)).await.is_err() {
            break; // the copy task stopped (a send failure)
        }
        loop {
            tokio::select! {
                _ = shared.shutdown.wait() => break,
                changed = topics_rx.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let now = topics_rx.borrow_and_update().clone();
                    if now != subscribed {
                        tracing::info!(stream = index, topics = now.len(), "matching topics changed; rejoining");
                        subscribed = now;
                        break;
                    }
                }
                _ = tokio::time::sleep(cfg.heartbeat_interval) => match (Instant::now(), member.heartbeat().await) {
                    (sent, Ok(false)) => renewed(sent),
                    (sent, Ok(true)) => {
                        renewed(sent);
                        tracing::info!(stream = index, group = %cfg.group_id, "group rebalancing");
                        break;
                    }
                    (_, Err(e)) => {
                        tracing::warn!(stream = index, group = %cfg.group_id, error = %e, "heartbeat failed; rejoining");
                        break;
                    }
                },
            }
        }
        let (ack, done) = oneshot::channel();
        // Raised before the revocation is sent, so it is lowered (on answering) after: a chunk
        // waiting for a schema gives way.
        revoking.raise();
        if tx.send(Control::Revoke(ack)).await.is_ok() {
            let _ = done.await;
        }
        if shared.shutdown.is_triggered() {
            break;
        }
        member.set_assignor(assignor(shared, &subscribed));
        let mut attempt = 0u32;
        loop {
            let sent = Instant::now();
            match member.rejoin().await {
                Ok(()) => {
                    renewed(sent);
                    break;
                }
                Err(e) => {
                    tracing::warn!(stream = index, group = %cfg.group_id, error = %e, "rejoining the group failed; retrying");
                    if shared.shutdown.retry_after(&mut attempt).await {
                        return Ok(());
                    }
                }
            }
        }
    }
    drop(tx);
    if let Err(e) = member.leave().await {
        tracing::debug!(error = %e, "leaving the group failed (the session timeout will remove the member)");
    }
    Ok(())
}
