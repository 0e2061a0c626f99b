//! The names `plan` shows for the test corpus's configurations, against a fixed table. The engine
//! takes the same names from the same `FlowConfig` methods, so a change that renames an internal
//! topic (and would strand MM2's tooling or a running MM2 on the other side) fails here first.

use kmirror_mirror::config::model::MirrorConfig;
use kmirror_mirror::config::properties::Properties;
use kmirror_mirror::config::providers::SystemEnvironment;
use kmirror_mirror::config::{connector, mm2};
use kmirror_mirror::plan::Plan;
use std::path::Path;

fn fixture(name: &str) -> Properties {
    Properties::load(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name),
    )
    .unwrap()
}

fn mm2_text(text: &str) -> MirrorConfig {
    let props = Properties::parse(text, "mm2.properties").unwrap();
    mm2::load(&props, &[], &SystemEnvironment).unwrap_or_else(|e| panic!("{e}"))
}

/// `flow | topic on cluster (partitions)`, one line per internal topic, plus the naming line's
/// example remote name.
fn names(c: &MirrorConfig) -> Vec<String> {
    let plan = Plan::new(c);
    let mut out = Vec::new();
    for f in &plan.flows {
        for t in &f.internal_topics {
            out.push(format!(
                "{} | {} on {} ({})",
                f.flow, t.topic, t.cluster, t.partitions
            ));
        }
    }
    out
}

const AB: &str = "clusters = A, B\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n";

#[test]
fn internal_topic_names_of_the_corpus_are_as_fixed() {
    let connector_files = [
        fixture("connector-source.properties"),
        fixture("connector-checkpoint.properties"),
    ];
    let cases: Vec<(&str, MirrorConfig, Vec<&str>)> = vec![
        (
            "fixtures/mm2-basic.properties",
            mm2::load(&fixture("mm2-basic.properties"), &[], &SystemEnvironment).unwrap(),
            vec![
                "A->B | mm2-offset-syncs.B.internal on A (1)",
                "A->B | A.checkpoints.internal on B (1)",
                "A->B | mm2-offsets.A.internal on B (25)",
                "A->B | heartbeats on B (1)",
                "B->A | heartbeats on A (1)",
            ],
        ),
        (
            "fixtures/connector-*.properties",
            connector::load(&connector_files, None, &SystemEnvironment).unwrap(),
            vec![
                "A->B | mm2-offset-syncs.B.internal on A (1)",
                "A->B | A.checkpoints.internal on B (1)",
                "A->B | mm2-offsets.A.internal on B (25)",
            ],
        ),
        (
            "custom separator, offset syncs on the target",
            mm2_text(&format!(
                "{AB}A->B.enabled = true\nreplication.policy.separator = _\n\
                 offset-syncs.topic.location = target\n"
            )),
            vec![
                "A->B | mm2-offset-syncs_A_internal on B (1)",
                "A->B | A_checkpoints_internal on B (1)",
                "A->B | mm2-offsets.A.internal on B (25)",
                "A->B | heartbeats on B (1)",
                "B->A | heartbeats on A (1)",
            ],
        ),
        (
            "custom separator, internal topics keep '.'",
            mm2_text(&format!(
                "{AB}A->B.enabled = true\nreplication.policy.separator = _\n\
                 replication.policy.internal.topic.separator.enabled = false\n\
                 B->A.emit.heartbeats.enabled = false\n"
            )),
            vec![
                "A->B | mm2-offset-syncs.B.internal on A (1)",
                "A->B | A.checkpoints.internal on B (1)",
                "A->B | mm2-offsets.A.internal on B (25)",
                "A->B | heartbeats on B (1)",
            ],
        ),
        (
            "identity policy, loop prevention, both ways",
            mm2_text(&format!(
                "{AB}A->B.enabled = true\nB->A.enabled = true\n\
                 replication.policy.class = org.apache.kafka.connect.mirror.IdentityReplicationPolicy\n\
                 kmirror.loop.prevention.enabled = true\nemit.checkpoints.enabled = false\n"
            )),
            vec![
                "A->B | mm2-offset-syncs.B.internal on A (1)",
                "A->B | kmirror-producers.internal on B (1)",
                "A->B | mm2-offsets.A.internal on B (25)",
                "A->B | heartbeats on B (1)",
                "B->A | mm2-offset-syncs.A.internal on B (1)",
                "B->A | kmirror-producers.internal on A (1)",
                "B->A | mm2-offsets.B.internal on A (25)",
                "B->A | heartbeats on A (1)",
            ],
        ),
    ];
    for (name, config, expected) in cases {
        assert_eq!(names(&config), expected, "{name}");
    }
}

/// The engine reads the opposite flow's offset syncs (for failback) from where that flow writes
/// them: the same name the opposite flow's plan shows.
#[test]
fn the_opposite_flows_syncs_topic_is_where_that_flow_writes_it() {
    for location in ["source", "target"] {
        let c = mm2_text(&format!(
            "{AB}A->B.enabled = true\nB->A.enabled = true\noffset-syncs.topic.location = {location}\n"
        ));
        let ab = c.flows.iter().find(|f| f.id.to_string() == "A->B").unwrap();
        let ba = c.flows.iter().find(|f| f.id.to_string() == "B->A").unwrap();
        let (opposite, side) = ab.opposite_offset_syncs_topic();
        let (written, written_side) = ba.offset_syncs_topic();
        assert_eq!(opposite, written, "{location}");
        // B->A's source is A->B's target.
        assert_ne!(side, written_side, "{location}");
    }
}
