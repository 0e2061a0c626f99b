//! Delivery for an MM1 stream: the stream's producer, one lane per target partition, sends and
//! their acknowledgements into the ledger, `--abort.on.send.failure` (stop, or give a refused
//! batch up and send the later ones again on a fresh lane), flushing, and committing to the
//! source group only what the target acknowledged.

use super::{Copier, LaneState};
use crate::events::legacy::{CommitRefused, RecordsSkipped, SendFailed};
use crate::events::Event as _;
use crate::legacy::ledger::Key;
use crate::legacy::LegacyError;
use kmirror_kafka::admin::CommittedOffset;
use kmirror_kafka::batch::RawBatch;
use kmirror_kafka::producer::{Acked, IdempotentProducer};
use kmirror_kafka::KafkaError;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

impl Copier {
    /// The stream's producer; None when the process stops before the target answers.
    pub(super) async fn producer(
        &mut self,
    ) -> Result<Option<Arc<IdempotentProducer>>, LegacyError> {
        if let Some(p) = &self.producer {
            return Ok(Some(p.clone()));
        }
        let mut attempt = 0u32;
        loop {
            match IdempotentProducer::new(self.sh.target.clone()).await {
                Ok(p) => {
                    self.producer = Some(p.clone());
                    return Ok(Some(p));
                }
                Err(e) if e.is_retriable() || e.is_stale_metadata() => {
                    tracing::warn!(error = %e, "initialising the producer failed; retrying");
                    if self.sh.shutdown.retry_after(&mut attempt).await {
                        return Ok(None);
                    }
                }
                Err(source) => {
                    return Err(LegacyError::Send {
                        topic: "(producer)".into(),
                        partition: -1,
                        source,
                    })
                }
            }
        }
    }

    /// Sends a batch; with `--abort.on.send.failure false`, a batch the target refuses is given
    /// up and the batches sent after it go again on a fresh lane.
    pub(super) async fn send(
        &mut self,
        key: Key,
        tag: i64,
        batch: RawBatch,
    ) -> Result<(), LegacyError> {
        let mut queue: VecDeque<(i64, RawBatch)> = VecDeque::from([(tag, batch)]);
        while let Some((tag, batch)) = queue.pop_front() {
            // Stopping with no producer: the batch is not acknowledged, so its chunk's position
            // is not committed and it is copied again after a restart.
            let Some(producer) = self.producer().await? else {
                self.stopping = true;
                return Ok(());
            };
            let max = self.sh.cfg.producer_tuning.max_request_size as usize;
            let st = self.lanes.entry(key.clone()).or_insert_with(|| LaneState {
                lane: producer.lane(&key.0, key.1).with_limits(max, 4 << 20),
                unacked: VecDeque::new(),
            });
            st.unacked.push_back((tag, batch.clone()));
            match st.lane.send(tag, batch).await {
                Ok(acked) => self.acked(&key, acked),
                Err(e) => {
                    let again = self.send_failed(&key, e)?;
                    queue = again.into_iter().chain(queue).collect();
                }
            }
        }
        Ok(())
    }

    pub(super) fn acked(&mut self, key: &Key, acked: Vec<Acked>) {
        if let Some(st) = self.lanes.get_mut(key) {
            for a in acked {
                st.unacked.pop_front();
                self.ledger.ack(a.tag);
            }
        }
    }

    /// A batch the target refused, or did not acknowledge within the delivery timeout. Stops
    /// the stream (`--abort.on.send.failure true`), or gives that batch up, logged and counted,
    /// and returns the later unacknowledged batches to send again.
    pub(super) fn send_failed(
        &mut self,
        key: &Key,
        e: KafkaError,
    ) -> Result<Vec<(i64, RawBatch)>, LegacyError> {
        SendFailed {
            topic: &key.0,
            partition: key.1,
            error: &e,
        }
        .emit(self.emitter());
        if self.sh.cfg.abort_on_send_failure {
            return Err(LegacyError::Send {
                topic: key.0.clone(),
                partition: key.1,
                source: e,
            });
        }
        let reason = e.to_string();
        let (failed, again) = match e {
            // Refused before sending: the batch just queued; the lane itself is fine.
            KafkaError::BatchTooLarge { .. } => {
                let failed = self.lanes.get_mut(key).and_then(|st| st.unacked.pop_back());
                (failed, Vec::new())
            }
            // The oldest unacknowledged batch failed, and the lane gave up: the broker wrote
            // none of the later ones (their sequence numbers follow the refused batch), so they
            // go again under a new producer id.
            _ => {
                let mut unacked = self
                    .lanes
                    .remove(key)
                    .map(|s| s.unacked)
                    .unwrap_or_default();
                self.producer = None;
                (unacked.pop_front(), unacked.into_iter().collect())
            }
        };
        if let Some((tag, batch)) = failed {
            self.ledger.ack(tag);
            RecordsSkipped {
                topic: &key.0,
                partition: key.1,
                records: batch.record_count(),
                error: &reason,
            }
            .emit(self.emitter());
        }
        Ok(again)
    }

    pub(super) async fn flush_all(&mut self) -> Result<(), LegacyError> {
        loop {
            let keys: Vec<Key> = self
                .lanes
                .iter()
                .filter(|(_, s)| !s.unacked.is_empty())
                .map(|(k, _)| k.clone())
                .collect();
            if keys.is_empty() {
                return Ok(());
            }
            let mut progress = false;
            for key in keys {
                let Some(st) = self.lanes.get_mut(&key) else {
                    continue;
                };
                match st.lane.flush().await {
                    Ok(acked) => {
                        progress |= !acked.is_empty();
                        self.acked(&key, acked)
                    }
                    Err(e) => {
                        progress = true;
                        for (tag, batch) in self.send_failed(&key, e)? {
                            self.send(key.clone(), tag, batch).await?;
                        }
                    }
                }
            }
            // A batch this stream recorded but its lane never took (a send cut short by the
            // stop): it will not be acknowledged, so its chunk is not committed. Never loop on it.
            if !progress {
                tracing::debug!(
                    stream = self.index,
                    "batches left unacknowledged at the flush"
                );
                return Ok(());
            }
        }
    }

    /// Commits the offsets whose records the target acknowledged, as this member.
    pub(super) async fn commit(&mut self) {
        let Some((generation, member_id)) = self.generation.clone() else {
            return;
        };
        let ready = self.ledger.take_commits();
        if ready.is_empty() {
            return;
        }
        let offsets: BTreeMap<String, BTreeMap<i32, CommittedOffset>> = ready
            .iter()
            .map(|(t, ps)| {
                (
                    t.clone(),
                    ps.iter()
                        .map(|(p, o)| {
                            (
                                *p,
                                CommittedOffset {
                                    offset: *o,
                                    leader_epoch: -1,
                                    metadata: String::new(),
                                },
                            )
                        })
                        .collect(),
                )
            })
            .collect();
        match self
            .sh
            .source
            .commit_member_offsets(&self.sh.cfg.group_id, generation, &member_id, &offsets)
            .await
        {
            Ok(()) => {
                self.sh
                    .metrics
                    .positions_stored
                    .get_or_create(&self.sh.labels)
                    .inc();
                tracing::debug!(
                    stream = self.index,
                    partitions = offsets.values().map(BTreeMap::len).sum::<usize>(),
                    "offsets committed"
                );
            }
            Err(e) => {
                CommitRefused {
                    stream: self.index,
                    error: &e,
                }
                .emit(self.emitter());
                self.ledger.restore(ready);
            }
        }
    }

    /// Flushes and commits everything, then forgets the assignment.
    pub(super) async fn finish(&mut self) -> Result<(), LegacyError> {
        // When the process stops, the target gets one request timeout to acknowledge what is in
        // flight (a target that is down would otherwise hold the exit for the whole delivery
        // timeout); what it did not acknowledge is not committed.
        let flushed = if self.cancelled {
            self.lanes.clear();
            Ok(())
        } else if self.sh.shutdown.is_triggered() {
            let bound = self.sh.target.settings().request_timeout;
            match tokio::time::timeout(bound, self.flush_all()).await {
                Ok(flushed) => flushed,
                Err(_) => {
                    tracing::warn!(stream = self.index, "stopping before the target acknowledged every batch; the records after the last commit are copied again after a restart");
                    Ok(())
                }
            }
        } else {
            self.flush_all().await
        };
        self.commit().await;
        self.ledger.clear();
        self.positions.clear();
        flushed
    }
}
