//! The loop guard's verdicts (docs/topologies.md, "Identity names both ways"): which producer
//! ids of a cluster are kmirror's own copies from another cluster, and which batches of a
//! fetch a flow leaves out because of them. A batch filter of the copy core, pure: the reading
//! of `kmirror-producers.internal` that feeds it is `engine::loop_guard`.

use crate::wire::producers::ProducerEntry;
use kmirror_kafka::batch::RawBatch;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Producer ids known not to be kmirror's, kept up to this many (each costs one read of the
/// topic when first seen; past the bound they are forgotten and read about again).
const MAX_OTHERS: usize = 1_000_000;

/// A cluster as registry entries name it: the alias of the flow that wrote the entry, and the
/// cluster's id when known. Ids decide when both sides have one (processes may use other
/// aliases); aliases otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClusterName {
    pub(crate) alias: Arc<str>,
    pub(crate) id: Option<Arc<str>>,
}

impl ClusterName {
    pub(crate) fn new(alias: &str, id: Option<&str>) -> ClusterName {
        ClusterName {
            alias: Arc::from(alias),
            id: id.map(Arc::from),
        }
    }

    fn same(&self, other: &ClusterName) -> bool {
        match (&self.id, &other.id) {
            (Some(a), Some(b)) => a == b,
            _ => self.alias == other.alias,
        }
    }
}

/// What a reader knows of one cluster's producer ids: pure, so the rules are unit-tested.
#[derive(Debug, Default)]
pub(crate) struct Origins {
    /// kmirror's producer ids on this cluster, and the cluster each copies from.
    kmirror: HashMap<i64, ClusterName>,
    /// Ids found absent after a read of the topic that began after they were seen.
    others: HashSet<i64>,
}

/// What to do with a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Copy,
    /// kmirror copied it here from the cluster the flow writes to.
    Skip,
    /// Not known yet: read the topic again.
    Unknown,
}

impl Origins {
    pub(crate) fn learn(&mut self, e: &ProducerEntry) {
        self.others.remove(&e.producer_id);
        self.kmirror.insert(
            e.producer_id,
            ClusterName::new(&e.source, e.source_cluster_id.as_deref()),
        );
    }

    /// The verdict for a batch of `producer_id` read by a flow that writes into `target`.
    pub(crate) fn verdict(&self, producer_id: i64, target: &ClusterName) -> Verdict {
        // Producers that are not idempotent write no id; kmirror always writes with one.
        if producer_id < 0 || self.others.contains(&producer_id) {
            return Verdict::Copy;
        }
        match self.kmirror.get(&producer_id) {
            Some(source) if source.same(target) => Verdict::Skip,
            Some(_) => Verdict::Copy,
            None => Verdict::Unknown,
        }
    }

    /// After a read of the whole topic that began after `producer_id` was seen.
    pub(crate) fn settle(&mut self, producer_id: i64) {
        if producer_id >= 0 && !self.kmirror.contains_key(&producer_id) {
            if self.others.len() >= MAX_OTHERS {
                self.others.clear();
            }
            self.others.insert(producer_id);
        }
    }

    /// Whether some flow copies into this cluster from `source`.
    pub(crate) fn copies_from(&self, source: &ClusterName) -> bool {
        self.kmirror.values().any(|s| s.same(source))
    }
}

impl Origins {
    /// The producer ids among `batches` whose origin is not known yet.
    pub(crate) fn unknown(&self, batches: &[&RawBatch], from: &ClusterName) -> Vec<i64> {
        batches
            .iter()
            .map(|b| b.producer_id())
            .filter(|&p| self.verdict(p, from) == Verdict::Unknown)
            .collect()
    }

    /// Splits `batches` by whether kmirror copied them from `from`: keeps the copies when
    /// `copies`, the others otherwise; also returns how many records were left out. Ids not
    /// settled yet count as not copied.
    pub(crate) fn keep<'b>(
        &self,
        batches: Vec<&'b RawBatch>,
        from: &ClusterName,
        copies: bool,
    ) -> (Vec<&'b RawBatch>, u64) {
        let mut skipped = 0;
        let kept = batches
            .into_iter()
            .filter(|b| {
                let copy = self.verdict(b.producer_id(), from) == Verdict::Skip;
                if copy != copies {
                    skipped += b.record_count().max(0) as u64;
                }
                copy == copies
            })
            .collect();
        (kept, skipped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: i64, source: &str) -> ProducerEntry {
        ProducerEntry {
            producer_id: id,
            version: 1,
            source: source.into(),
            target: "A".into(),
            flow: format!("{source}->A"),
            registered_ms: 0,
            source_cluster_id: None,
        }
    }

    fn name(alias: &str) -> ClusterName {
        ClusterName::new(alias, None)
    }

    #[test]
    fn cluster_ids_decide_when_both_sides_know_them() {
        let mut o = Origins::default();
        o.learn(&ProducerEntry {
            source_cluster_id: Some("id-b".into()),
            ..entry(1, "B")
        });
        // Another process calls B "dr".
        assert_eq!(
            o.verdict(1, &ClusterName::new("dr", Some("id-b"))),
            Verdict::Skip
        );
        // Another cluster that is also called B.
        assert_eq!(
            o.verdict(1, &ClusterName::new("B", Some("id-x"))),
            Verdict::Copy
        );
        // No id on the reader's side: the alias decides.
        assert_eq!(o.verdict(1, &name("B")), Verdict::Skip);
        assert!(o.copies_from(&ClusterName::new("dr", Some("id-b"))));
    }

    #[test]
    fn only_batches_copied_from_the_flows_target_are_skipped() {
        let mut o = Origins::default();
        o.learn(&entry(7, "B"));
        o.learn(&entry(8, "C"));
        // Flow A->B reading A.
        assert_eq!(o.verdict(7, &name("B")), Verdict::Skip);
        // Copied from C: B has not seen them (a star of pairs stays loop-free).
        assert_eq!(o.verdict(8, &name("B")), Verdict::Copy);
        // Producers without idempotence write no id.
        assert_eq!(o.verdict(-1, &name("B")), Verdict::Copy);
        assert_eq!(o.verdict(9, &name("B")), Verdict::Unknown);
        o.settle(9);
        assert_eq!(o.verdict(9, &name("B")), Verdict::Copy);
        // Settling a known id changes nothing.
        o.settle(7);
        assert_eq!(o.verdict(7, &name("B")), Verdict::Skip);
        assert!(
            o.copies_from(&name("B")) && o.copies_from(&name("C")) && !o.copies_from(&name("D"))
        );
    }

    #[test]
    fn an_id_registered_after_it_was_settled_is_still_learnt() {
        // Cannot happen with brokers that never reuse ids, but a registry entry always wins.
        let mut o = Origins::default();
        o.settle(5);
        o.learn(&entry(5, "B"));
        assert_eq!(o.verdict(5, &name("B")), Verdict::Skip);
    }

    fn written_by(producer_id: i64, records: usize) -> RawBatch {
        let records: Vec<kmirror_kafka::records::Record> = (0..records)
            .map(|i| kmirror_kafka::records::Record {
                offset: i as i64,
                timestamp: 0,
                key: None,
                value: Some(bytes::Bytes::from_static(b"v")),
                headers: vec![],
            })
            .collect();
        let options = kmirror_kafka::records::BatchOptions {
            producer_id,
            producer_epoch: 0,
            base_sequence: 0,
            ..Default::default()
        };
        kmirror_kafka::records::encode_batch(&records, &options).unwrap()
    }

    #[test]
    fn the_filter_leaves_out_copies_from_the_target_and_counts_their_records() {
        let mut o = Origins::default();
        o.learn(&entry(7, "B"));
        let (ours, theirs, new) = (written_by(7, 3), written_by(8, 2), written_by(9, 1));
        let batches = vec![&ours, &theirs, &new];
        assert_eq!(o.unknown(&batches, &name("B")), vec![8, 9]);
        o.settle(8);
        o.settle(9);
        assert!(o.unknown(&batches, &name("B")).is_empty());
        let (kept, skipped) = o.keep(batches.clone(), &name("B"), false);
        assert_eq!(
            kept.iter().map(|b| b.producer_id()).collect::<Vec<_>>(),
            vec![8, 9]
        );
        assert_eq!(skipped, 3);
        // The target's own guard picks out exactly the copies (the resume walk).
        let (kept, skipped) = o.keep(batches, &name("B"), true);
        assert_eq!(
            kept.iter().map(|b| b.producer_id()).collect::<Vec<_>>(),
            vec![7]
        );
        assert_eq!(skipped, 3);
    }
}
