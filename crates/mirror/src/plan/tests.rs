//! Unit tests of `plan`, kept apart so the module reads on its own.

use super::*;
use crate::config::mm2;
use crate::config::properties::Properties;
use crate::config::providers::SystemEnvironment;

fn plan(text: &str, served: &[&str]) -> Plan {
    let props = Properties::parse(text, "mm2.properties").unwrap();
    let served: Vec<String> = served.iter().map(|s| s.to_string()).collect();
    Plan::new(&mm2::load(&props, &served, &SystemEnvironment).unwrap())
}

const SASL: &str = "clusters = A, B\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n\
    B.security.protocol = SASL_PLAINTEXT\nB.sasl.mechanism = PLAIN\n\
    B.sasl.jaas.config = org.apache.kafka.common.security.plain.PlainLoginModule required username=\"mm2\" password=\"topsecret\";\n\
    A->B.enabled = true\ntasks.max = 3\n";

#[test]
fn text_plan_explains_flows_names_and_internal_topics() {
    let text = plan(SASL, &[]).render_text();
    for needle in [
        "kmirror plan for mm2.properties (MirrorMaker 2 dedicated mode)",
        "B  b:9092  SASL_PLAINTEXT PLAIN user=mm2 password=[hidden]",
        "Flow A->B  [replicate]  served by this process",
        "'orders' on A becomes 'A.orders' on B",
        "mm2-offset-syncs.B.internal",
        "A.checkpoints.internal",
        "mm2-offsets.A.internal",
        "Flow B->A  [heartbeats only]",
        "group offsets   off",
        "checkpoints     every 60 s",
        "mm2.properties:8: tasks.max: kmirror has no Connect tasks",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    assert!(!text.contains("topsecret"));
}

#[test]
fn json_plan_masks_secrets_and_marks_served_flows() {
    let p = plan(SASL, &["A"]);
    let json = serde_json::to_value(&p).unwrap();
    assert!(!json.to_string().contains("topsecret"));
    let flows = json["flows"].as_array().unwrap();
    let served: Vec<(&str, bool)> = flows
        .iter()
        .map(|f| (f["flow"].as_str().unwrap(), f["served"].as_bool().unwrap()))
        .collect();
    assert_eq!(served, [("A->B", false), ("B->A", true)]);
    assert_eq!(json["served_targets"][0], "A");
    assert_eq!(flows[0]["config"]["topics"]["include"][0], ".*");
}
