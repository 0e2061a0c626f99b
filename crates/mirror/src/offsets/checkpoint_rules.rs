//! When a checkpoint is written (mm2-compatibility §6.4 step 5): the first for a group's partition; when
//! the group was rewound upstream; or when the translated offset moved forward. So checkpoints
//! never repeat and never move back for the same upstream position.

use crate::wire::internal::Checkpoint;
use std::collections::HashMap;

/// The last checkpoint written per (group, target topic, partition): (upstream, downstream).
#[derive(Debug, Default, Clone)]
pub struct CheckpointRules {
    last: HashMap<(String, String, i32), (i64, i64)>,
}

impl CheckpointRules {
    /// Remembers a checkpoint read back from the checkpoints topic at start.
    pub fn seen(&mut self, c: &Checkpoint) {
        self.last.insert(
            (c.group.clone(), c.topic.clone(), c.partition),
            (c.upstream_offset, c.downstream_offset),
        );
    }

    /// Whether to write a new checkpoint; when true it is remembered.
    pub fn should_emit(
        &mut self,
        group: &str,
        topic: &str,
        partition: i32,
        upstream: i64,
        downstream: i64,
    ) -> bool {
        let key = (group.to_string(), topic.to_string(), partition);
        let emit = match self.last.get(&key) {
            None => true,
            Some(&(up, down)) => upstream < up || downstream > down,
        };
        if emit {
            self.last.insert(key, (upstream, downstream));
        }
        emit
    }

    /// Forgets a checkpoint that could not be written (it is emitted again next time). A
    /// checkpoint read back at start is then forgotten too, which only allows one repeat.
    pub fn forget(&mut self, group: &str, topic: &str, partition: i32) {
        self.last
            .remove(&(group.to_string(), topic.to_string(), partition));
    }

    /// The last checkpoint per partition of a group: (target topic, partition) → downstream.
    pub fn group(&self, group: &str) -> Vec<(String, i32, i64)> {
        let mut v: Vec<_> = self
            .last
            .iter()
            .filter(|((g, _, _), _)| g == group)
            .map(|((_, t, p), &(_, d))| (t.clone(), *p, d))
            .collect();
        v.sort();
        v
    }

    pub fn groups(&self) -> Vec<String> {
        let mut v: Vec<String> = self.last.keys().map(|(g, _, _)| g.clone()).collect();
        v.sort();
        v.dedup();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emits_first_forward_and_rewinds_only() {
        let mut r = CheckpointRules::default();
        assert!(r.should_emit("g", "A.t", 0, 100, 90));
        assert!(!r.should_emit("g", "A.t", 0, 100, 90), "a repeat");
        assert!(
            !r.should_emit("g", "A.t", 0, 120, 90),
            "translation did not move"
        );
        assert!(r.should_emit("g", "A.t", 0, 130, 121), "moved forward");
        assert!(
            !r.should_emit("g", "A.t", 0, 140, 100),
            "never backwards for a later upstream offset"
        );
        assert!(
            r.should_emit("g", "A.t", 0, 10, 5),
            "the group was rewound upstream"
        );
        assert!(r.should_emit("g", "A.t", 1, 10, 5), "another partition");
        r.seen(&Checkpoint {
            group: "h".into(),
            topic: "A.t".into(),
            partition: 0,
            upstream_offset: 50,
            downstream_offset: 40,
            metadata: String::new(),
        });
        assert!(!r.should_emit("h", "A.t", 0, 50, 40), "read back at start");
        assert_eq!(
            r.group("g"),
            vec![("A.t".into(), 0, 5), ("A.t".into(), 1, 5)]
        );
        assert_eq!(r.groups(), vec!["g".to_string(), "h".to_string()]);
    }
}
