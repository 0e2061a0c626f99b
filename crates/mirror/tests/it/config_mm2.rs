//! MM2 dedicated-mode configuration: precedence, client-key copying, `--clusters`, and every
//! validation error (no brokers needed).
//!
//! Why one file of this size: a catalogue of the form's rules and errors, one short test each,
//! sharing the `load` helpers at the top.

use kmirror_kafka::{
    AutoOffsetReset, Compression, IsolationLevel, SaslMechanism, SecurityProtocol,
};
use kmirror_mirror::config::diagnostics::ConfigError;
use kmirror_mirror::config::mm2;
use kmirror_mirror::config::model::{MirrorConfig, Side};
use kmirror_mirror::config::properties::Properties;
use kmirror_mirror::config::providers::SystemEnvironment;
use kmirror_mirror::names::ClusterAlias;
use kmirror_mirror::policy::PolicyKind;
use std::path::Path;

fn fixture(name: &str) -> Properties {
    Properties::load(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name),
    )
    .unwrap()
}

fn parse(text: &str) -> Result<MirrorConfig, ConfigError> {
    parse_served(text, &[])
}

fn parse_served(text: &str, served: &[&str]) -> Result<MirrorConfig, ConfigError> {
    let props = Properties::parse(text, "mm2.properties").unwrap();
    let served: Vec<String> = served.iter().map(|s| s.to_string()).collect();
    mm2::load(&props, &served, &SystemEnvironment)
}

fn ok(text: &str) -> MirrorConfig {
    parse(text).unwrap_or_else(|e| panic!("{e}"))
}

fn errors(text: &str) -> Vec<String> {
    match parse(text) {
        Ok(_) => panic!("expected errors for:\n{text}"),
        Err(e) => e.0.errors().map(|d| d.to_string()).collect(),
    }
}

const AB: &str = "clusters = A, B\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n";

#[test]
fn basic_fixture_gives_one_replicating_flow_and_a_heartbeat_flow() {
    let c = mm2::load(&fixture("mm2-basic.properties"), &[], &SystemEnvironment).unwrap();
    let ids: Vec<String> = c
        .flows
        .iter()
        .map(|f| format!("{}:{}", f.id, f.replication))
        .collect();
    // MM2 builds a herder for B->A too, only to emit heartbeats (mm2-compatibility §1.1).
    assert_eq!(ids, ["A->B:true", "B->A:false"]);
    let f = &c.flows[0];
    assert_eq!(f.replication_factor, 1);
    assert_eq!(f.internal.checkpoints_replication_factor, 1);
    assert_eq!(f.policy.kind, PolicyKind::Default);
    assert_eq!(
        f.policy
            .format_remote_topic(&ClusterAlias::new("A"), "orders"),
        "A.orders"
    );
    assert!(f.topics.accepts("orders"));
    assert!(!f.topics.accepts("mm2-offsets.B.internal"));
    assert_eq!(f.clients.source_consumer.bootstrap.len(), 2);
    assert_eq!(
        f.clients.target_producer.bootstrap[0].to_string(),
        "b1.example:9092"
    );
    // MM2 defaults.
    assert_eq!(f.emit_heartbeats.interval.as_secs(), 1);
    assert_eq!(f.emit_checkpoints.interval.as_secs(), 60);
    assert!(!f.sync_group_offsets.enabled);
    assert_eq!(f.refresh_topics.interval.as_secs(), 600);
    assert_eq!(f.internal.offset_syncs_location, Side::Source);
    assert_eq!(f.offset_lag_max, 100);
    assert_eq!(
        f.clients.consumer_tuning.auto_offset_reset,
        AutoOffsetReset::Earliest
    );
    assert_eq!(
        f.clients.consumer_tuning.isolation_level,
        IsolationLevel::ReadCommitted
    );
    // Worker storage settings are reported as ignored, not dropped silently.
    let ignored: Vec<&str> = c.ignored.iter().map(|i| i.origin.key.as_str()).collect();
    assert!(
        ignored.contains(&"status.storage.replication.factor"),
        "{ignored:?}"
    );
    assert!(ignored.contains(&"config.storage.replication.factor"));
    // ...but the offset storage holds kmirror's positions, in MM2's topic.
    assert!(!ignored.contains(&"offset.storage.replication.factor"));
    assert_eq!(f.internal.positions_topic, "mm2-offsets.A.internal");
    assert_eq!(f.internal.positions_replication_factor, 1);
    assert_eq!(f.internal.positions_partitions, 25);
}

#[test]
fn sasl_fixture() {
    let c = mm2::load(&fixture("mm2-sasl.properties"), &[], &SystemEnvironment).unwrap();
    let f = c
        .flows
        .iter()
        .find(|f| f.id.to_string() == "source->target")
        .unwrap();
    assert!(f.replication);
    assert_eq!(f.policy.kind, PolicyKind::Identity);
    assert_eq!(
        f.policy
            .format_remote_topic(&ClusterAlias::new("source"), "projects.x"),
        "projects.x"
    );
    assert!(f.topics.accepts("projects.alpha"));
    assert!(!f.topics.accepts("other"));
    assert!(f.groups.accepts("billing"));
    assert!(!f.groups.accepts("console-consumer-123"));
    assert!(
        f.sync_topic_configs.enabled && f.sync_topic_acls.enabled && f.sync_group_offsets.enabled
    );
    assert_eq!(f.emit_heartbeats.interval.as_secs(), 5);
    assert_eq!(f.refresh_topics.interval.as_secs(), 60);
    assert_eq!(f.refresh_groups.interval.as_secs(), 60);
    for client in [
        &f.clients.source_consumer,
        &f.clients.source_admin,
        &f.clients.target_producer,
        &f.clients.target_admin,
    ] {
        assert_eq!(client.security_protocol, SecurityProtocol::SaslPlaintext);
        let sasl = client.sasl.as_ref().unwrap();
        assert_eq!(sasl.mechanism, SaslMechanism::Plain);
        assert_eq!(sasl.username, "mm2");
        assert_eq!(sasl.password.expose(), "mm2-secret");
    }
    // target->source is disabled but still emits heartbeats, as in MM2.
    let back = c
        .flows
        .iter()
        .find(|f| f.id.to_string() == "target->source")
        .unwrap();
    assert!(!back.replication && back.emit_heartbeats.enabled);
    let tasks = c
        .ignored
        .iter()
        .find(|i| i.origin.key == "tasks.max")
        .unwrap();
    assert!(tasks.reason.contains("every source partition"));
    // The password never shows in Debug output.
    assert!(!format!("{c:?}").contains("mm2-secret"));
    assert!(!serde_json::to_string(&c).unwrap().contains("mm2-secret"));
}

#[test]
fn precedence_top_level_then_cluster_then_flow() {
    let c = ok(&format!(
        "{AB}A->B.enabled = true\n\
         replication.factor = 1\n\
         topics = top.*\n\
         A->B.topics = flow.*\n\
         sync.group.offsets.enabled = true\n\
         emit.checkpoints.interval.seconds = 30\n\
         A->B.emit.checkpoints.interval.seconds = 10\n\
         security.protocol = PLAINTEXT\n\
         A.consumer.fetch.max.bytes = 1000\n\
         A->B.consumer.fetch.max.bytes = 2000\n\
         B.producer.compression.type = lz4\n\
         A->B.producer.override.linger.ms = 40\n\
         B.producer.linger.ms = 20\n\
         A->B.replication.policy.separator = _\n"
    ));
    let f = &c.flows[0];
    assert_eq!(f.replication_factor, 1, "top-level connector key applies");
    assert!(
        f.topics.accepts("flow.x") && !f.topics.accepts("top.x"),
        "flow key wins"
    );
    assert!(f.sync_group_offsets.enabled);
    assert_eq!(f.emit_checkpoints.interval.as_secs(), 10);
    // source.consumer.* (from A.consumer.*) wins over the flow-wide consumer.* (mm2-compatibility §1.2).
    assert_eq!(f.clients.consumer_tuning.fetch_max_bytes, 1000);
    assert_eq!(f.clients.producer_tuning.compression, Compression::Lz4);
    assert_eq!(
        f.clients.producer_tuning.linger.as_millis(),
        40,
        "producer.override wins"
    );
    assert_eq!(
        f.policy.format_remote_topic(&ClusterAlias::new("A"), "t"),
        "A_t"
    );
    assert_eq!(
        f.policy.checkpoints_topic(&ClusterAlias::new("A")),
        "A_checkpoints_internal"
    );
}

#[test]
fn client_keys_are_copied_into_every_role_and_top_level_is_the_default() {
    let c = ok("clusters = A, B\n\
         bootstrap.servers = shared:9092\n\
         security.protocol = SASL_PLAINTEXT\n\
         sasl.mechanism = PLAIN\n\
         sasl.jaas.config = org.apache.kafka.common.security.plain.PlainLoginModule required username=\"top\" password=\"t\";\n\
         A.bootstrap.servers = a:9092\n\
         A.sasl.jaas.config = org.apache.kafka.common.security.plain.PlainLoginModule required username=\"a-user\" password=\"a\";\n\
         A.admin.sasl.jaas.config = org.apache.kafka.common.security.plain.PlainLoginModule required username=\"a-admin\" password=\"x\";\n\
         A->B.enabled = true\n");
    let f = c.flows.iter().find(|f| f.id.to_string() == "A->B").unwrap();
    assert_eq!(f.clients.source_consumer.bootstrap[0].to_string(), "a:9092");
    assert_eq!(
        f.clients.source_consumer.sasl.as_ref().unwrap().username,
        "a-user"
    );
    assert_eq!(
        f.clients.source_admin.sasl.as_ref().unwrap().username,
        "a-admin"
    );
    // B has no settings of its own: the top-level ones are its defaults.
    assert_eq!(
        f.clients.target_producer.bootstrap[0].to_string(),
        "shared:9092"
    );
    assert_eq!(
        f.clients.target_producer.sasl.as_ref().unwrap().username,
        "top"
    );
}

#[test]
fn clusters_flag_selects_flows_by_target() {
    let text = format!("clusters = A, B, C\n{}C.bootstrap.servers = c:9092\nA->B.enabled = true\nA->C.enabled = true\nemit.heartbeats.enabled = false\n", &AB[16..]);
    let c = parse_served(&text, &["C"]).unwrap();
    let served: Vec<String> = c.served_flows().map(|f| f.id.to_string()).collect();
    assert_eq!(served, ["A->C"]);
    assert_eq!(c.flows.len(), 2);
    let all = parse_served(&text, &[]).unwrap();
    assert_eq!(all.served_flows().count(), 2);
    let e = parse_served(&text, &["D"]).unwrap_err().to_string();
    assert!(
        e.contains("--clusters names 'D', which is not in 'clusters' (A, B, C)"),
        "{e}"
    );
    let e = parse_served(
        &format!("{AB}A->B.enabled = true\nemit.heartbeats.enabled = false\n"),
        &["A"],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("No source->target replication flows"), "{e}");
}

#[test]
fn heartbeats_off_removes_heartbeat_only_flows() {
    let c = ok(&format!(
        "{AB}A->B.enabled = true\nB->A.emit.heartbeats.enabled = false\n"
    ));
    assert_eq!(c.flows.len(), 1);
}

#[test]
fn validation_errors_name_file_line_key_value() {
    let cases: Vec<(String, &str)> = vec![
        ("A.bootstrap.servers = a:9092\n".into(), "'clusters' is not set"),
        ("clusters = A, B\nA.bootstrap.servers = a:9092\nA->B.enabled = true\n".into(), "cluster B has no bootstrap servers: set B.bootstrap.servers"),
        (format!("{AB}A->B.enabled = yes\n"), "mm2.properties:4: A->B.enabled = 'yes': expected true or false"),
        (format!("{AB}A->A.enabled = true\n"), "mm2.properties:4: A->A.enabled = 'true': a flow from a cluster to itself"),
        (format!("{AB}A->C.enabled = true\n"), "mm2.properties:4: A->C.enabled = 'true': flow key names an unknown cluster alias"),
        ("clusters = A, B\nA.bootstrap.servers = x:1\nB.bootstrap.servers = x:1\nA->B.enabled = true\n".into(), "source and target share the address x:1"),
        (format!("{AB}A->B.enabled = true\nA->B.topics = orders, pay(?<=x)\n"), "mm2.properties:5: A->B.topics = 'orders, pay(?<=x)': invalid regex: pattern 'pay(?<=x)' at position 3: look-around"),
        (format!("{AB}A->B.enabled = true\nreplication.factor = two\n"), "mm2.properties:5: replication.factor = 'two': expected a whole number"),
        (format!("{AB}A->B.enabled = true\nemit.heartbeats.interval.seconds = 1.5\n"), "emit.heartbeats.interval.seconds = '1.5': expected a whole number"),
        (format!("{AB}A->B.enabled = true\nA.security.protocol = SASL_PLAIN\n"), "A.security.protocol = 'SASL_PLAIN': unsupported security protocol"),
        (format!("{AB}A->B.enabled = true\nA.security.protocol = SASL_SSL\nA.sasl.mechanism = SCRAM-SHA-1\nA.sasl.jaas.config = x\n"), "A.sasl.mechanism = 'SCRAM-SHA-1': unknown SASL mechanism"),
        (format!("{AB}A->B.enabled = true\nA.security.protocol = SASL_SSL\nA.sasl.mechanism = PLAIN\nA.sasl.jaas.config = PlainLoginModule required username=\"u\" password=\"hunter2\";\n"), "A.sasl.jaas.config = '[hidden]': unsupported login module"),
        (format!("{AB}A->B.enabled = true\nB.exactly.once.source.support = enabled\nA.consumer.isolation.level = read_uncommitted\n"), "exactly-once replication cannot read uncommitted data"),
        (format!("{AB}A->B.enabled = true\nA->B.exactly.once.support = required\n"), "exactly-once is required but the target does not enable it: set B.exactly.once.source.support = enabled"),
        (format!("{AB}A->B.enabled = true\nB.exactly.once.source.support = enabled\nA->B.transaction.boundary = connector\n"), "mm2.properties:6: A->B.transaction.boundary = 'connector': transaction.boundary = connector needs a connector that defines its own transaction boundaries"),
        (format!("{AB}A->B.enabled = true\nB.exactly.once.source.support = enabled\nA->B.transaction.boundary = interval\nA->B.transaction.boundary.interval.ms = 30000\n"), "the exactly-once commit interval (30000 ms) must be at most a third of the producer's transaction.timeout.ms (60000 ms)"),
        (format!("{AB}A->B.enabled = true\ntasks.max = 0\n"), "tasks.max = '0': expected a whole number between 1 and 1000"),
        (format!("{AB}A->B.enabled = true\nA->B.kmirror.start.position = yesterday\n"), "mm2.properties:5: A->B.kmirror.start.position = 'yesterday': expected earliest, latest, a time with its offset"),
        (format!("{AB}A->B.enabled = true\nA->B.kmirror.start.position = 2026-12-05T10:00:00\n"), "expected earliest, latest, a time with its offset (2026-12-05T10:00:00Z, RFC 3339)"),
        (format!("{AB}A->B.enabled = true\nemit.offset-syncs.enabled = false\n"), "checkpoints need offset syncs"),
        (format!("{AB}A->B.enabled = true\nsync.group.offsets.enabled = true\nemit.checkpoints.enabled = false\n"), "group offset sync translates offsets through checkpoints"),
        (format!("{AB}A->B.enabled = true\nreplication.policy.class = com.acme.CustomReplicationPolicy\n"), "custom replication policies cannot be loaded by kmirror; use DefaultReplicationPolicy"),
        (format!("{AB}A->B.enabled = true\nreplication.policy.separator =\n"), "the separator must not be empty"),
        (format!("{AB}A->B.enabled = true\ntransforms = dropHeaders\n"), "transforms.dropHeaders.type is required"),
        (format!("{AB}A->B.enabled = true\ntransforms = x\ntransforms.x.type = com.acme.Smt\n"), "kmirror cannot load Java transform classes"),
        (format!("{AB}A->B.enabled = true\nA->B.transforms = r\nA->B.transforms.r.type = RegexRouter\nA->B.transforms.r.regex = (.*)\nA->B.transforms.r.replacement = x.$1\n"), "RegexRouter (r) cannot rename topics in MM2 mode"),
        (format!("{AB}A->B.enabled = true\ntopic.filter.class = com.acme.MyFilter\n"), "custom Java classes cannot be loaded"),
        ("clusters = A, A\nA.bootstrap.servers = a:1\n".into(), "cluster alias 'A' is listed twice"),
        ("clusters =\n".into(), "no cluster aliases"),
        (format!("{AB}A->B.enabled = true\nB.ssl.truststore.location = /etc/t.jks\nB.security.protocol = SSL\n"), "JKS stores cannot be read by kmirror"),
    ];
    for (text, needle) in cases {
        let errs = errors(&text);
        assert!(
            errs.iter().any(|e| e.contains(needle)),
            "expected '{needle}' in {errs:#?}\nfor:\n{text}"
        );
        assert!(errs.iter().all(|e| !e.contains("hunter2")));
    }
}

#[test]
fn every_error_is_reported_in_one_run() {
    let errs = errors(&format!(
        "{AB}A->B.enabled = true\nreplication.factor = x\nA->B.topics = (\n"
    ));
    assert_eq!(errs.len(), 2, "{errs:#?}");
}

#[test]
fn ignored_keys_and_typo_hints() {
    let c = ok(&format!(
        "{AB}A->B.enabled = true\n\
         A->B.topics.exlude = foo\n\
         sync.group.offset.enabled = true\n\
         A.fetch.max.bytes = 10\n\
         A.consumer.max.poll.records = 5\n\
         consumer.fetch.max.bytes = 7\n\
         key.converter = org.apache.kafka.connect.converters.ByteArrayConverter\n"
    ));
    let find = |k: &str| {
        c.ignored
            .iter()
            .find(|i| i.origin.key == k)
            .unwrap_or_else(|| panic!("{k} not reported: {:?}", c.ignored))
    };
    assert_eq!(
        find("A->B.topics.exlude").did_you_mean.as_deref(),
        Some("A->B.topics.exclude")
    );
    assert_eq!(
        find("sync.group.offset.enabled").did_you_mean.as_deref(),
        Some("sync.group.offsets.enabled")
    );
    assert_eq!(
        find("A.fetch.max.bytes").did_you_mean.as_deref(),
        Some("A.consumer.fetch.max.bytes")
    );
    assert!(find("A.consumer.max.poll.records")
        .reason
        .contains("does not use"));
    assert!(find("consumer.fetch.max.bytes")
        .reason
        .contains("MM2 ignores top-level consumer"));
    assert!(find("key.converter")
        .reason
        .contains("copies record bytes unchanged"));
    assert_eq!(c.ignored.len(), 6, "{:?}", c.ignored);
}

#[test]
fn deprecated_blacklist_keys_are_honoured_with_a_warning() {
    let c = ok(&format!(
        "{AB}A->B.enabled = true\ntopics.blacklist = secret.*\ngroups.blacklist = g1\n"
    ));
    let f = &c.flows[0];
    assert!(!f.topics.accepts("secret.x") && f.topics.accepts("orders"));
    assert!(!f.groups.accepts("g1"));
    let warnings: Vec<String> = c.diagnostics.warnings().map(|w| w.to_string()).collect();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("'topics.blacklist' is deprecated")),
        "{warnings:?}"
    );
    let c = ok(&format!(
        "{AB}A->B.enabled = true\ntopics.blacklist = secret.*\ntopics.exclude = other\n"
    ));
    assert!(c.flows[0].topics.accepts("secret.x"));
    assert!(c
        .diagnostics
        .warnings()
        .any(|w| w.message.contains("ignored because 'topics.exclude'")));
}

#[test]
fn duplicate_keys_warn_and_the_later_wins() {
    let c = ok(&format!(
        "{AB}A->B.enabled = true\nreplication.factor = 1\nreplication.factor = 3\n"
    ));
    assert_eq!(c.flows[0].replication_factor, 3);
    let w: Vec<String> = c.diagnostics.warnings().map(|w| w.to_string()).collect();
    assert!(
        w.iter()
            .any(|w| w.contains("mm2.properties:5: replication.factor: set again on line 6")),
        "{w:?}"
    );
}

#[test]
fn config_providers_resolve_secrets_from_files() {
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("creds.properties");
    std::fs::write(&creds, "pw=from-file-secret\n").unwrap();
    let c = ok(&format!(
        "{AB}A->B.enabled = true\n\
         config.providers = file\n\
         config.providers.file.class = org.apache.kafka.common.config.provider.FileConfigProvider\n\
         A.security.protocol = SASL_PLAINTEXT\n\
         A.sasl.mechanism = SCRAM-SHA-512\n\
         A.sasl.jaas.config = org.apache.kafka.common.security.scram.ScramLoginModule required username=\"u\" password=\"${{file:{}:pw}}\";\n",
        creds.display()
    ));
    let sasl = c.flows[0].clients.source_consumer.sasl.as_ref().unwrap();
    assert_eq!(sasl.password.expose(), "from-file-secret");
    assert_eq!(sasl.mechanism, SaslMechanism::ScramSha512);
    let errs = errors(&format!(
        "{AB}A->B.enabled = true\nconfig.providers = env\nconfig.providers.env.class = org.apache.kafka.common.config.provider.EnvVarConfigProvider\nA.ssl.truststore.password = ${{env:KMIRROR_TEST_SURELY_UNSET_VAR}}\n"
    ));
    assert!(errs[0].contains("A.ssl.truststore.password: cannot resolve '${env:KMIRROR_TEST_SURELY_UNSET_VAR}': environment variable KMIRROR_TEST_SURELY_UNSET_VAR is not set"), "{errs:?}");
}

#[test]
fn review_fixes_loops_flags_and_producers() {
    // Identity naming both ways loops forever (mm2-compatibility §4).
    let errs = errors(&format!(
        "{AB}A->B.enabled = true\nB->A.enabled = true\nreplication.policy.class = org.apache.kafka.connect.mirror.IdentityReplicationPolicy\n"
    ));
    assert!(
        errs.iter()
            .any(|e| e.contains("both replicate with IdentityReplicationPolicy")),
        "{errs:?}"
    );
    // The default policy is fine both ways.
    assert_eq!(
        ok(&format!("{AB}A->B.enabled = true\nB->A.enabled = true\n"))
            .flows
            .len(),
        2
    );
    // Aliases with dots: a self flow is still found.
    let errs = errors("clusters = x.y, z\nx.y.bootstrap.servers = a:1\nz.bootstrap.servers = b:1\nx.y->x.y.enabled = true\nx.y->z.enabled = true\n");
    assert!(
        errs.iter()
            .any(|e| e.contains("x.y->x.y.enabled = 'true': a flow from a cluster to itself")),
        "{errs:?}"
    );
    // A bad flag is reported even when the flow would be skipped.
    let errs = errors(&format!(
        "{AB}A->B.enabled = yes\nemit.heartbeats.enabled = false\n"
    ));
    assert!(
        errs.iter()
            .any(|e| e.contains("A->B.enabled = 'yes': expected true or false")),
        "{errs:?}"
    );
    // No flow at all is an error, as in MM2.
    let errs = errors(&format!("{AB}emit.heartbeats.enabled = false\n"));
    assert!(
        errs.iter()
            .any(|e| e.contains("No source->target replication flows")),
        "{errs:?}"
    );
    // A zero interval is refused (MM2's scheduler would throw); negative disables.
    let errs = errors(&format!(
        "{AB}A->B.enabled = true\nemit.checkpoints.interval.seconds = 0\n"
    ));
    assert!(
        errs.iter()
            .any(|e| e.contains("expected at least 1 second")),
        "{errs:?}"
    );
    let c = ok(&format!(
        "{AB}A->B.enabled = true\nsync.topic.acls.interval.seconds = -1\n"
    ));
    assert!(!c.flows[0].sync_topic_acls.enabled);
    // A flow's producer.* configures the offset-syncs producer, not the data producer (as MM2).
    let c = ok(&format!("{AB}A->B.enabled = true\nA->B.producer.linger.ms = 99\nA.producer.client.id = syncs\nB.producer.linger.ms = 7\n"));
    let f = c.flows.iter().find(|f| f.replication).unwrap();
    assert_eq!(f.clients.producer_tuning.linger.as_millis(), 7);
    // Read, and of no effect in MM2 mode (batches are forwarded as fetched): `plan` lists
    // both by their keys, with the reason.
    for key in ["A->B.producer.linger.ms", "B.producer.linger.ms"] {
        let i = c
            .ignored
            .iter()
            .find(|i| i.origin.key == key)
            .unwrap_or_else(|| panic!("{key} not listed as ignored: {:?}", c.ignored));
        assert!(i.reason.contains("batches as fetched"), "{i:?}");
    }
    assert_eq!(
        f.clients.offset_syncs_producer.bootstrap[0].to_string(),
        "a:9092",
        "offset syncs go to the source by default"
    );
    assert_eq!(
        f.clients.offset_syncs_producer.client_id.as_deref(),
        Some("syncs")
    );
    // TLS/SASL typos get hints; unused TLS tuning is reported, not dropped.
    let c = ok(&format!("{AB}A->B.enabled = true\nB.ssl.truststore.locaton = /x.pem\nB.ssl.enabled.protocols = TLSv1.3\nA->B.replication.policy.seperator = _\n"));
    let find = |k: &str| {
        c.ignored
            .iter()
            .find(|i| i.origin.key == k)
            .unwrap_or_else(|| panic!("{k}: {:?}", c.ignored))
    };
    assert_eq!(
        find("B.ssl.truststore.locaton").did_you_mean.as_deref(),
        Some("B.ssl.truststore.location")
    );
    assert!(find("B.ssl.enabled.protocols").reason.contains("rustls"));
    assert_eq!(
        find("A->B.replication.policy.seperator")
            .did_you_mean
            .as_deref(),
        Some("A->B.replication.policy.separator")
    );
    // An empty groups list matches no group, not even "".
    let c = ok(&format!("{AB}A->B.enabled = true\nA->B.groups =\n"));
    assert!(!c.flows[0].groups.accepts(""));
    // (?i) is flagged: Java folds only ASCII letters.
    let c = ok(&format!(
        "{AB}A->B.enabled = true\nA->B.groups = (?i)billing.*\n"
    ));
    assert!(c
        .diagnostics
        .warnings()
        .any(|w| w.message.contains("folds non-ASCII letters")));
}

#[test]
fn connector_and_mm1_forms_refuse_loops_too() {
    use kmirror_mirror::config::{connector, legacy};
    let src = Properties::parse(
        "connector.class=MirrorSourceConnector\nsource.cluster.alias=A\ntarget.cluster.alias=B\nsource.cluster.bootstrap.servers=h:1\ntarget.cluster.bootstrap.servers=h:1\nenabled=maybe\n",
        "c.properties",
    )
    .unwrap();
    let e = connector::load(&[src], None, &SystemEnvironment)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("c.properties:6: enabled = 'maybe': expected true or false"),
        "{e}"
    );
    let src = Properties::parse(
        "connector.class=MirrorSourceConnector\nsource.cluster.alias=A\ntarget.cluster.alias=B\nsource.cluster.bootstrap.servers=h:1\ntarget.cluster.bootstrap.servers=h:1\n",
        "c.properties",
    )
    .unwrap();
    let e = connector::load(&[src], None, &SystemEnvironment)
        .unwrap_err()
        .to_string();
    assert!(e.contains("share the address h:1"), "{e}");
    let c =
        Properties::parse("bootstrap.servers=h:1\ngroup.id=g\n", "consumer.properties").unwrap();
    let p = Properties::parse("bootstrap.servers=h:1\n", "producer.properties").unwrap();
    let args = legacy::LegacyArgs {
        include: Some("x".into()),
        ..Default::default()
    };
    let e = legacy::load(&c, &p, &args, &SystemEnvironment)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the consumer and the producer share the address h:1"),
        "{e}"
    );
}

#[test]
fn batch_mode_and_buffer_memory_are_read_per_flow() {
    let c = ok(&format!(
        "{AB}A->B.enabled = true\n\
         B->A.enabled = true\n\
         B.producer.buffer.memory = 8388608\n\
         A->B.kmirror.batch.mode.enabled = false\n\
         B->A.kmirror.batch.merge.enabled = false\n"
    ));
    let ab = c.flows.iter().find(|f| f.id.to_string() == "A->B").unwrap();
    let ba = c.flows.iter().find(|f| f.id.to_string() == "B->A").unwrap();
    assert!(!ab.batch_mode, "the flow key turns batch mode off");
    assert!(ba.batch_mode, "batch mode is the default");
    assert!(ab.merge_small_batches, "merging is the default");
    assert!(!ba.merge_small_batches, "the flow key turns merging off");
    assert_eq!(ab.clients.producer_tuning.buffer_memory, 8_388_608);
    assert_eq!(
        ba.clients.producer_tuning.buffer_memory, 33_554_432,
        "A's producer keeps Java's default"
    );
    let e = errors(&format!(
        "{AB}A->B.enabled = true\nkmirror.batch.mode.enabled = sometimes\n"
    ));
    assert!(
        e.iter()
            .any(|m| m.contains("kmirror.batch.mode.enabled") && m.contains("sometimes")),
        "{e:?}"
    );
}

#[test]
fn exactly_once_slots_ids_and_commits_are_named_as_connect_names_them() {
    // MM2's dedicated mode: worker group <source>-mm2, connector MirrorSourceConnector.
    let c = ok(&format!(
        "{AB}A->B.enabled = true\nB.exactly.once.source.support = enabled\n"
    ));
    let t = &c.flows[0].transactions;
    assert_eq!(t.support, "enabled");
    assert_eq!((t.slots, t.slots_from_tasks_max), (12, false));
    assert_eq!(t.transactional_id_prefix, "A-mm2-MirrorSourceConnector-");
    assert_eq!(
        t.id_range(),
        "A-mm2-MirrorSourceConnector-0 .. A-mm2-MirrorSourceConnector-11"
    );
    assert_eq!(t.interval.as_millis(), 500);
    assert_eq!(t.timeout.as_secs(), 60);
    // tasks.max, the target's group.id, an interval boundary and the producer's timeout.
    let c = ok(&format!(
        "{AB}A->B.enabled = true\nB.exactly.once.source.support = enabled\ntasks.max = 4\nB.group.id = dr\n\
         A->B.transaction.boundary = interval\nA->B.transaction.boundary.interval.ms = 2000\n\
         B.producer.transaction.timeout.ms = 90000\n"
    ));
    let t = &c.flows[0].transactions;
    assert_eq!((t.slots, t.slots_from_tasks_max), (4, true));
    assert_eq!(
        t.id_range(),
        "dr-MirrorSourceConnector-0 .. dr-MirrorSourceConnector-3"
    );
    assert_eq!(t.interval.as_millis(), 2000);
    assert_eq!(t.timeout.as_millis(), 90000);
    let ignored: Vec<&str> = c.ignored.iter().map(|i| i.origin.key.as_str()).collect();
    for key in ["B.group.id", "B.producer.transaction.timeout.ms"] {
        assert!(
            !ignored.contains(&key),
            "{key} is used, not ignored: {ignored:?}"
        );
    }
    let tasks = c
        .ignored
        .iter()
        .find(|i| i.origin.key == "tasks.max")
        .unwrap();
    assert!(
        tasks.reason.contains("number of transactional slots"),
        "{}",
        tasks.reason
    );
}

#[test]
fn start_positions_from_kmirror_start_position_or_auto_offset_reset() {
    use kmirror_mirror::config::model::StartPosition;
    let start = |extra: &str| ok(&format!("{AB}A->B.enabled = true\n{extra}")).flows[0].start;
    assert_eq!(start(""), StartPosition::Earliest);
    assert_eq!(
        start("A.consumer.auto.offset.reset = latest\n"),
        StartPosition::Latest
    );
    assert_eq!(
        start("A.consumer.auto.offset.reset = none\n"),
        StartPosition::Fail
    );
    assert_eq!(
        start("A->B.kmirror.start.position = 2026-12-05T10:00:00+01:00\n"),
        StartPosition::Timestamp(1_796_461_200_000)
    );
    assert_eq!(
        start("kmirror.start.position = 1796461200123\n"),
        StartPosition::Timestamp(1_796_461_200_123)
    );
    // The flow's key wins over the consumer's auto.offset.reset.
    assert_eq!(
        start("A.consumer.auto.offset.reset = latest\nA->B.kmirror.start.position = EARLIEST\n"),
        StartPosition::Earliest
    );
}

#[test]
fn a_static_instance_id_is_checked_and_left_out_of_what_members_compare() {
    let c = ok(&format!(
        "{AB}A->B.enabled = true\nkmirror.sharing.instance.id = kmirror-0\n"
    ));
    assert_eq!(c.flows[0].sharing.instance_id.as_deref(), Some("kmirror-0"));
    let other = ok(&format!(
        "{AB}A->B.enabled = true\nkmirror.sharing.instance.id = kmirror-1\n"
    ));
    let unset = ok(&format!("{AB}A->B.enabled = true\n"));
    assert_eq!(unset.flows[0].sharing.instance_id, None);
    // Each process has its own: members with different ids are not refused as differing.
    let digest = |c: &MirrorConfig| {
        kmirror_mirror::engine::sharing::assign::settings_digest(
            &serde_json::to_value(&c.flows[0]).unwrap(),
        )
    };
    assert_eq!(digest(&c), digest(&other));
    assert_eq!(digest(&c), digest(&unset));
    for bad in ["two words", "a/b", "..", &"x".repeat(250)] {
        let e = errors(&format!(
            "{AB}A->B.enabled = true\nkmirror.sharing.instance.id = {bad}\n"
        ));
        assert!(
            e.iter()
                .any(|m| m.contains("kmirror.sharing.instance.id") && m.contains("249 characters")),
            "{bad}: {e:?}"
        );
    }
}

#[test]
fn renames_are_pairs_of_topic_names_each_side_once() {
    let c = ok(&format!(
        "{AB}A->B.enabled = true\nA->B.kmirror.topics.rename = orders:orders-a , pay.ments:pay_a\n"
    ));
    assert_eq!(
        c.flows[0].renames,
        std::collections::BTreeMap::from([
            ("orders".to_string(), "orders-a".to_string()),
            ("pay.ments".to_string(), "pay_a".to_string())
        ])
    );
    // Part of what members compare (the names written depend on it), absent when empty.
    let json = serde_json::to_value(&c.flows[0]).unwrap();
    assert!(json.get("renames").is_some());
    let plain = ok(&format!("{AB}A->B.enabled = true\n"));
    assert!(serde_json::to_value(&plain.flows[0])
        .unwrap()
        .get("renames")
        .is_none());
    for (bad, why) in [
        ("orders", "expected source:remote"),
        ("orders:", "expected source:remote"),
        ("or ders:x", "expected source:remote"),
        ("a:x, a:y", "a is renamed twice"),
        ("a:x, b:x", "two topics would be renamed to x"),
    ] {
        let e = errors(&format!(
            "{AB}A->B.enabled = true\nkmirror.topics.rename = {bad}\n"
        ));
        assert!(
            e.iter()
                .any(|m| m.contains("kmirror.topics.rename") && m.contains(why)),
            "{bad}: {e:?}"
        );
    }
}

#[test]
fn identity_both_ways_needs_loop_prevention_on_both_flows_and_rings_are_refused() {
    const ID: &str =
        "replication.policy.class = org.apache.kafka.connect.mirror.IdentityReplicationPolicy\n";
    // On for both: accepted, and each flow carries it.
    let c = ok(&format!(
        "{AB}A->B.enabled = true\nB->A.enabled = true\n{ID}kmirror.loop.prevention.enabled = true\n"
    ));
    assert!(c.flows.iter().all(|f| f.loop_prevention));
    // Off for one of them: refused, naming the key.
    let errs = errors(&format!(
        "{AB}A->B.enabled = true\nB->A.enabled = true\n{ID}A->B.kmirror.loop.prevention.enabled = true\n"
    ));
    assert!(
        errs.iter().any(
            |e| e.contains("both replicate with IdentityReplicationPolicy")
                && e.contains("set kmirror.loop.prevention.enabled = true (for both flows)")
        ),
        "{errs:?}"
    );
    // Default off, and not a boolean: refused by name.
    assert!(!ok(&format!("{AB}A->B.enabled = true\n")).flows[0].loop_prevention);
    let errs = errors(&format!(
        "{AB}A->B.enabled = true\nkmirror.loop.prevention.enabled = maybe\n"
    ));
    assert!(
        errs.iter()
            .any(|e| e.contains("kmirror.loop.prevention.enabled")),
        "{errs:?}"
    );
    // A ring of three would go round for ever where its filters overlap: warned.
    let abc = "clusters = A, B, C\nA.bootstrap.servers = a:1\nB.bootstrap.servers = b:1\nC.bootstrap.servers = c:1\n";
    let c = ok(&format!(
        "{abc}A->B.enabled = true\nB->C.enabled = true\nC->A.enabled = true\n{ID}kmirror.loop.prevention.enabled = true\n"
    ));
    let warnings: Vec<String> = c.diagnostics.warnings().map(|w| w.to_string()).collect();
    assert!(
        warnings
            .iter()
            .any(|w| w
                .contains("flows A->B->C->A replicate with IdentityReplicationPolicy in a ring")),
        "{warnings:?}"
    );
    // A star of pairs is fine.
    let c = ok(&format!(
        "{abc}A->B.enabled = true\nB->A.enabled = true\nA->C.enabled = true\nC->A.enabled = true\n{ID}kmirror.loop.prevention.enabled = true\n"
    ));
    assert_eq!(c.flows.iter().filter(|f| f.replication).count(), 4);
}

/// A non-default value for each key kmirror honours in a flow, for the audit below.
fn sample(key: &str) -> &'static str {
    match key {
        "enabled"
        | "emit.heartbeats.enabled"
        | "emit.checkpoints.enabled"
        | "refresh.topics.enabled"
        | "refresh.groups.enabled"
        | "sync.topic.configs.enabled"
        | "sync.topic.acls.enabled"
        | "emit.offset-syncs.enabled"
        | "heartbeats.replication.enabled"
        | "kmirror.batch.mode.enabled"
        | "kmirror.batch.merge.enabled"
        | "kmirror.resume.from.target.enabled"
        | "kmirror.sharing.enabled" => "false",
        "sync.group.offsets.enabled"
        | "kmirror.loop.prevention.enabled"
        | "kmirror.sync.group.acls.enabled" => "true",
        "replication.policy.internal.topic.separator.enabled" => "false",
        k if k.ends_with(".seconds") => "7",
        k if k.ends_with("replication.factor") => "1",
        "topics" | "groups" => "only-this",
        "topics.exclude" | "topics.blacklist" | "groups.exclude" | "groups.blacklist" => "skip-.*",
        "config.properties.exclude" | "config.properties.blacklist" => "retention\\..*",
        "offset.lag.max" => "7",
        "offset-syncs.topic.location" => "target",
        "exactly.once.support" => "required",
        "tasks.max" => "3",
        "transaction.boundary" => "interval",
        "transaction.boundary.interval.ms" => "7000",
        "admin.timeout.ms" => "7000",
        "kmirror.source.truncation" => "fail",
        "kmirror.start.position" => "latest",
        "kmirror.rate.limit.bytes.per.second" | "kmirror.process.rate.limit.bytes.per.second" => {
            "7000000"
        }
        "kmirror.positions.interval.ms" => "7000",
        "kmirror.exactly.once.transaction.max.bytes" => "7000000",
        "kmirror.sharing.group.id" => "other-group",
        "kmirror.sharing.session.timeout.ms" => "7000",
        "kmirror.sharing.rebalance.timeout.ms" => "70000",
        "kmirror.sharing.instance.id" => "pod-7",
        "kmirror.topics.rename" => "a:b",
        "kmirror.batch.max.decompressed.bytes" => "7000000",
        "replication.policy.class" => "org.apache.kafka.connect.mirror.IdentityReplicationPolicy",
        "replication.policy.separator" => "_",
        "name" => "other-name",
        "connector.class" => "org.apache.kafka.connect.mirror.MirrorHeartbeatConnector",
        "source.cluster.alias" => "X",
        "target.cluster.alias" => "Y",
        "use.defaults.from" => "A",
        "transforms" => "drop",
        "predicates" => "p",
        "topic.filter.class"
        | "group.filter.class"
        | "config.property.filter.class"
        | "forwarding.admin.class" => "com.example.Custom",
        _ => "7",
    }
}

/// Every key kmirror accepts in a flow either changes the validated configuration or is listed
/// as ignored with a reason (`plan` shows it, `plan --check` exits 4): nothing a user sets is
/// dropped without a word. A key added to the catalogue without either fails here.
#[test]
fn every_accepted_key_acts_or_is_listed_as_ignored() {
    use kmirror_mirror::config::keys;
    let base_text = format!("{AB}A->B.enabled = true\n");
    let base = serde_json::to_value(&ok(&base_text).flows).unwrap();
    let mut silent = Vec::new();
    let mut check = |key: String, value: &str| {
        let text = format!("{base_text}{key} = {value}\n");
        let Ok(c) = parse(&text) else {
            // Refused with an error naming the key: not silent either.
            return;
        };
        if let Some(i) = c.ignored.iter().find(|i| i.origin.key == key) {
            assert!(!i.reason.is_empty(), "{key}: ignored without a reason");
            return;
        }
        if serde_json::to_value(&c.flows).unwrap() == base {
            silent.push(format!("{key} = {value}"));
        }
    };
    for k in keys::CONNECTOR_KEYS {
        // Declares predicate aliases for transforms; every `predicates.<alias>.*` key is
        // checked by the transform tests.
        if *k == "predicates" {
            continue;
        }
        check(format!("A->B.{k}"), sample(k));
    }
    for k in keys::CONSUMER_KEYS {
        check(format!("A.consumer.{k}"), client_sample(k));
    }
    for k in keys::PRODUCER_KEYS {
        check(format!("B.producer.{k}"), client_sample(k));
    }
    for k in keys::ADMIN_KEYS {
        check(format!("B.admin.{k}"), client_sample(k));
    }
    assert!(
        silent.is_empty(),
        "accepted without effect and not listed: {silent:?}"
    );
    // A key another key makes moot is listed too.
    let c = ok(&format!(
        "{base_text}A->B.transaction.boundary.interval.ms = 7000\n"
    ));
    assert!(
        c.ignored
            .iter()
            .any(|i| i.origin.key == "A->B.transaction.boundary.interval.ms"
                && i.reason.contains("transaction.boundary = interval")),
        "{:?}",
        c.ignored
    );
}

fn client_sample(key: &str) -> &'static str {
    match key {
        "isolation.level" => "read_uncommitted",
        "auto.offset.reset" => "latest",
        "check.crcs" => "false",
        "group.id" | "client.id" => "seven",
        "compression.type" => "zstd",
        "acks" => "1",
        _ => "7777",
    }
}
