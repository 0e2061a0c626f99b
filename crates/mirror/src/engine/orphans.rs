//! Orphan transactional ids of an exactly-once flow (docs/engine.md, "Exactly-once"): ids
//! with the flow's prefix and a number at or above its slot count, which no process holds any
//! more (the slot count was lowered; MirrorMaker 2 ran with a larger `tasks.max` and was
//! killed). An open transaction of such an id holds back every read_committed reader of the
//! partitions it wrote until `transaction.timeout.ms` passes; the flow's leader fences it at
//! once instead (InitProducerId, which aborts it), when it takes the lead and every minute after.

use super::Shutdown;
use crate::metrics::{FlowLabels, Metrics};
use kmirror_kafka::cluster::KafkaCluster;
use kmirror_kafka::producer::IdempotentProducer;
use std::sync::Arc;
use std::time::Duration;

const EVERY: Duration = Duration::from_secs(60);

/// The slot number of `id` if it is one of the flow's ids and no slot has it.
pub(super) fn orphan_slot(id: &str, prefix: &str, slots: u32) -> Option<u32> {
    let n = id.strip_prefix(prefix)?;
    // Only the exact form `<prefix><n>`: `-01` or `+1` name another id.
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) || (n.len() > 1 && n.starts_with('0'))
    {
        return None;
    }
    n.parse::<u32>().ok().filter(|n| *n >= slots)
}

#[derive(Clone)]
pub(super) struct Orphans {
    pub(super) flow: String,
    pub(super) target: Arc<KafkaCluster>,
    pub(super) prefix: String,
    pub(super) slots: u32,
    pub(super) timeout: Duration,
    pub(super) metrics: Arc<Metrics>,
    pub(super) labels: FlowLabels,
}

impl Orphans {
    pub(super) async fn run(self, stop: Shutdown) {
        let mut warned = false;
        loop {
            match self.target.list_transactions(&["Ongoing"]).await {
                Ok(open) => {
                    for (id, _, _) in open {
                        if orphan_slot(&id, &self.prefix, self.slots).is_some() {
                            self.fence(&id).await;
                        }
                    }
                }
                Err(e) if !warned => {
                    // Not fatal: an orphan's transaction still ends at its timeout.
                    warned = true;
                    tracing::warn!(flow = %self.flow, error = %e, "cannot list the target's open transactions (Kafka 3.0+, DESCRIBE on the transactional ids); transactions left open by ids above the slot count end only at their timeout");
                }
                Err(e) => {
                    tracing::debug!(flow = %self.flow, error = %e, "listing open transactions failed")
                }
            }
            if stop.sleep(EVERY).await {
                return;
            }
        }
    }

    async fn fence(&self, id: &str) {
        match IdempotentProducer::transactional(self.target.clone(), id, self.timeout).await {
            Ok(_) => {
                tracing::warn!(flow = %self.flow, transactional_id = %id, slots = self.slots, "aborted the open transaction of a transactional id no slot has (left by a process with more slots: tasks.max lowered, or MirrorMaker 2 with a larger tasks.max)");
                self.metrics
                    .orphans_fenced
                    .get_or_create(&self.labels)
                    .inc();
            }
            Err(e) => {
                tracing::warn!(flow = %self.flow, transactional_id = %id, error = %e, "cannot fence a transactional id no slot has; its open transaction ends at its timeout")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_flow_s_ids_above_the_slot_count_are_orphans() {
        let p = "A-mm2-MirrorSourceConnector-";
        assert_eq!(
            orphan_slot("A-mm2-MirrorSourceConnector-12", p, 12),
            Some(12)
        );
        assert_eq!(
            orphan_slot("A-mm2-MirrorSourceConnector-30", p, 12),
            Some(30)
        );
        assert_eq!(orphan_slot("A-mm2-MirrorSourceConnector-11", p, 12), None);
        assert_eq!(orphan_slot("A-mm2-MirrorSourceConnector-0", p, 12), None);
        for other in [
            "A-mm2-MirrorSourceConnector-012",
            "A-mm2-MirrorSourceConnector-+13",
            "A-mm2-MirrorSourceConnector-",
            "A-mm2-MirrorSourceConnector-13x",
            "A-mm2-MirrorCheckpointConnector-13",
            "B-mm2-MirrorSourceConnector-13",
            "A-mm2-MirrorSourceConnector-99999999999",
        ] {
            assert_eq!(orphan_slot(other, p, 12), None, "{other}");
        }
    }
}
