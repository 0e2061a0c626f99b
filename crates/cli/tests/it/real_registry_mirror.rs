//! Schemas migrate with their topics (docs/schemas.md), between two real clusters and two real
//! registries (Apicurio's Confluent API), with records written and read by Confluent's own
//! Python serializers:
//! - translate: the target registry holds other schemas first, so its ids differ; a consumer on
//!   the target decodes every copied key and value through the target registry, and the subject
//!   is there under the flow's name with every version;
//! - live: a version registered while kmirror runs reaches the target, with its records, within
//!   the refresh interval;
//! - restart: nothing is registered again;
//! - a target registry hung for 30 s holds back the records that need it, not a topic without
//!   schemas, and `status` shows the wait; one restarted empty is noticed and filled again; a
//!   value that only looks like the wire format passes as it is;
//! - keep against a registry that assigns its own ids: exit 3 naming the key, the target
//!   registry as it was;
//! - MM1 mode, the registries named in its consumer and producer files: the same translation;
//! - Protobuf with an imported file and JSON Schema with a `$ref` to another subject, two
//!   versions each and a compatibility change: the referenced subjects registered first, every
//!   record decoded on the target with the writer's schema the target registry gives for its
//!   rewritten id; `verify` agrees, and fails once a version is deleted on the target; the
//!   registries' credentials show nowhere (log, `plan`, `/status`, `/metrics`).

use bytes::Bytes;
use kmirror_kafka::cluster::KafkaCluster;
use kmirror_kafka::records::{decode_batch_within, encode_batch, BatchOptions, Record};
use kmirror_kafka::IsolationLevel;
use kmirror_registry::{Auth, RegistryClient, RegistrySettings, Schema, SchemaType};
use kmirror_registry::{Compatibility, Reference, SchemaId};
use kmirror_testkit::{
    eventually, logged_metrics_address, scrape_metrics, AvroRecords, Cluster, KillOnDrop, Registry,
    Security, TypedRecords,
};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const KEY: &str = r#"{"type":"record","name":"OrderKey","namespace":"demo","fields":[{"name":"id","type":"long"}]}"#;

/// The value schema's versions: each adds a field with a default (BACKWARD compatible).
fn order(version: usize) -> String {
    let extra: String = (1..version)
        .map(|v| format!(r#",{{"name":"note{v}","type":"string","default":""}}"#))
        .collect();
    format!(
        r#"{{"type":"record","name":"Order","namespace":"demo","fields":[{{"name":"id","type":"long"}},{{"name":"name","type":"string"}}{extra}]}}"#
    )
}

fn client(r: &Registry) -> RegistryClient {
    RegistryClient::new(&RegistrySettings {
        url: r.url().into(),
        auth: Auth::None,
        tls: None,
        timeout: Duration::from_secs(10),
    })
    .unwrap()
}

fn config(
    dir: &Path,
    a: &Cluster,
    b: &Cluster,
    ra: &Registry,
    rb: &Registry,
    ids: &str,
) -> std::path::PathBuf {
    let path = dir.join(format!("mm2-{ids}.properties"));
    std::fs::write(
        &path,
        format!(
            "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\n\
             A.schema.registry.url = {}\nB.schema.registry.url = {}\n\
             A->B.enabled = true\nA->B.topics = orders, payments, raw, plain, events, profiles\nA->B.kmirror.schemas.ids = {ids}\n\
             kmirror.schemas.refresh.interval.seconds = 3\nrefresh.topics.interval.seconds = 2\n\
             replication.factor = 1\noffset.storage.replication.factor = 1\nemit.heartbeats.enabled = false\n\
             checkpoints.topic.replication.factor = 1\noffset-syncs.topic.replication.factor = 1\n",
            a.bootstrap(),
            b.bootstrap(),
            ra.url(),
            rb.url()
        ),
    )
    .unwrap();
    path
}

fn run(config: &Path, log: &Path) -> (KillOnDrop, String) {
    let p = KillOnDrop::spawn(
        Command::new(env!("CARGO_BIN_EXE_kmirror"))
            .arg("run")
            .arg(config)
            .args(["--metrics-address", "127.0.0.1:0", "--log-format", "json"]),
        log,
    );
    (p, logged_metrics_address(log))
}

fn metric(address: &str, name: &str) -> f64 {
    metric_with(address, name, &[])
}

fn metric_with(address: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    scrape_metrics(address).map_or(-1.0, |body| {
        kmirror_mirror::metrics::sum_samples(&body, name, labels)
    })
}

/// Every record read on the target decodes to the source's key and value; returns the value
/// schema ids seen.
fn check_decoded(records: &[serde_json::Value], count: u64) -> std::collections::BTreeSet<i64> {
    assert_eq!(records.len() as u64, count);
    let mut ids: Vec<i64> = records
        .iter()
        .map(|r| r["value"]["id"].as_i64().unwrap_or(-1))
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..count as i64).collect::<Vec<_>>());
    for r in records {
        let id = r["value"]["id"].as_i64().unwrap();
        assert_eq!(r["value"]["name"], format!("record-{id}"), "{r}");
        assert_eq!(r["key"]["id"], id, "{r}");
    }
    records
        .iter()
        .filter_map(|r| r["value_schema_id"].as_i64())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_topics_arrive_decodable_through_the_target_registry_with_ids_translated() {
    let (ca, cb, ra, rb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("sr-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("sr-b", Security::Plaintext).unwrap());
        let ra = s.spawn(|| Registry::start("sr-src").unwrap());
        let rb = s.spawn(|| Registry::start("sr-dst").unwrap());
        (
            a.join().unwrap(),
            b.join().unwrap(),
            ra.join().unwrap(),
            rb.join().unwrap(),
        )
    });
    let target = client(&rb);
    // Schemas of the target's own first: its ids run ahead of the source's.
    for i in 0..7 {
        let local = Schema {
            schema_type: SchemaType::Avro,
            schema: format!(
                r#"{{"type":"record","name":"Local{i}","namespace":"local","fields":[{{"name":"x","type":"int"}}]}}"#
            ),
            references: vec![],
        };
        target.register("local-value", &local, None).await.unwrap();
    }
    ca.create_topic("orders", 2).unwrap();
    let source_records = AvroRecords {
        bootstrap: ca.bootstrap(),
        registry: ra.url(),
        topic: "orders",
    };
    source_records
        .produce(&order(1), Some(KEY), 0, 30, 2)
        .unwrap();
    source_records
        .produce(&order(2), Some(KEY), 30, 30, 2)
        .unwrap();
    let source_ids = check_decoded(
        &source_records.consume(60, Duration::from_secs(60)).unwrap(),
        60,
    );
    assert_eq!(source_ids.len(), 2, "two value schemas on the source");

    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &ca, &cb, &ra, &rb, "translate");
    let log = dir.path().join("kmirror.log");
    let (kmirror, address) = run(&cfg, &log);
    let on_target = AvroRecords {
        bootstrap: cb.bootstrap(),
        registry: rb.url(),
        topic: "A.orders",
    };
    eventually(90, "60 records on the target", || async {
        metric(&address, "kmirror_record_count_total") >= 60.0
    })
    .await;
    let target_ids = check_decoded(&on_target.consume(60, Duration::from_secs(60)).unwrap(), 60);
    assert_eq!(target_ids.len(), 2);
    assert!(
        target_ids.is_disjoint(&source_ids),
        "the target's ids differ: {source_ids:?} -> {target_ids:?}"
    );
    assert_eq!(
        target.versions("A.orders-value", false).await.unwrap(),
        vec![1, 2]
    );
    assert_eq!(
        target.versions("A.orders-key", false).await.unwrap(),
        vec![1]
    );
    // Keys and values: 60 records, each id rewritten.
    assert_eq!(
        metric(&address, "kmirror_schema_ids_translated_total"),
        120.0
    );
    assert_eq!(metric(&address, "kmirror_records_waiting_for_schema"), 0.0);
    assert_eq!(metric(&address, "kmirror_schema_registrations_total"), 3.0);

    // Live: a third version registered by a producer while kmirror runs.
    let t0 = Instant::now();
    source_records
        .produce(&order(3), Some(KEY), 60, 20, 2)
        .unwrap();
    eventually(
        30,
        "the third version and its records on the target",
        || async { metric(&address, "kmirror_record_count_total") >= 80.0 },
    )
    .await;
    let live = t0.elapsed();
    assert!(live < Duration::from_secs(20), "took {live:?}");
    assert_eq!(
        target.versions("A.orders-value", false).await.unwrap(),
        vec![1, 2, 3]
    );
    let all = check_decoded(&on_target.consume(80, Duration::from_secs(60)).unwrap(), 80);
    assert_eq!(all.len(), 3);
    println!("a new schema version and its records crossed in {live:?}");

    // Restart: nothing registered again, new records still translated.
    assert!(kmirror.terminate().success());
    let log2 = dir.path().join("kmirror-2.log");
    let (_kmirror, address) = run(&cfg, &log2);
    source_records
        .produce(&order(3), Some(KEY), 80, 10, 2)
        .unwrap();
    eventually(60, "records after the restart", || async {
        metric(&address, "kmirror_schema_ids_translated_total") >= 20.0
    })
    .await;
    check_decoded(&on_target.consume(90, Duration::from_secs(60)).unwrap(), 90);
    assert_eq!(metric(&address, "kmirror_schema_registrations_total"), 0.0);
    let status = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .args(["status", "--address", &address])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains("schemas: 0 versions registered, 20 ids translated"),
        "{text}"
    );

    // The target registry hangs for 30 s in the middle of the copy: records naming a new version
    // wait and none of them is written, a topic without schemas goes on, and `status` shows the
    // wait. It answers again: they go.
    ca.create_topic("plain", 1).unwrap();
    rb.pause().unwrap();
    let paused = Instant::now();
    let before = metric(&address, "kmirror_record_count_total");
    source_records
        .produce(&order(4), Some(KEY), 90, 10, 2)
        .unwrap();
    eventually(30, "records waiting for their schema", || async {
        metric(&address, "kmirror_records_waiting_for_schema") > 0.0
    })
    .await;
    let lines: Vec<String> = (0..50).map(|i| format!("plain-{i}")).collect();
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    assert!(ca
        .produce_lines("plain", &lines, None)
        .unwrap()
        .status
        .success());
    eventually(
        30,
        "the topic without schemas copied while the registry hangs",
        || async { metric(&address, "kmirror_record_count_total") >= before + 50.0 },
    )
    .await;
    let status = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .args(["status", "--address", &address])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("records WAITING for a schema"), "{text}");
    std::thread::sleep(Duration::from_secs(30).saturating_sub(paused.elapsed()));
    assert_eq!(
        metric(&address, "kmirror_record_count_total"),
        before + 50.0,
        "nothing naming the new version was written while the registry hung"
    );
    rb.resume().unwrap();
    eventually(
        60,
        "the waiting records after the registry answered",
        || async { metric(&address, "kmirror_record_count_total") >= before + 60.0 },
    )
    .await;
    assert_eq!(metric(&address, "kmirror_records_waiting_for_schema"), 0.0);
    check_decoded(
        &on_target.consume(100, Duration::from_secs(60)).unwrap(),
        100,
    );

    // The target registry restarts empty: noticed, everything registered again before records
    // that name known schemas go on (a new topic whose value schema the source already has
    // under the same id).
    rb.restart_empty().unwrap();
    eventually(
        30,
        "the empty target registry noticed and filled again",
        || async {
            let lost = [("kind", "target_lost")];
            metric_with(&address, "kmirror_schema_registry_errors_total", &lost) >= 1.0
                && target
                    .versions("A.orders-value", false)
                    .await
                    .map_or(0, |v| v.len())
                    == 4
        },
    )
    .await;
    let before = metric(&address, "kmirror_record_count_total");
    ca.create_topic("payments", 1).unwrap();
    AvroRecords {
        bootstrap: ca.bootstrap(),
        registry: ra.url(),
        topic: "payments",
    }
    .produce(&order(4), Some(KEY), 0, 10, 1)
    .unwrap();
    let payments = AvroRecords {
        bootstrap: cb.bootstrap(),
        registry: rb.url(),
        topic: "A.payments",
    };
    eventually(60, "A.payments copied", || async {
        metric(&address, "kmirror_record_count_total") >= before + 10.0
    })
    .await;
    check_decoded(&payments.consume(10, Duration::from_secs(60)).unwrap(), 10);

    // A value that only looks like the wire format (a zero byte, then an id the source registry
    // does not know) passes as it is, counted, next to a plain one.
    ca.create_topic("raw", 1).unwrap();
    let lookalike = Bytes::from_static(b"\x00\x7f\xff\xff\x00not avro");
    let values = [lookalike.clone(), Bytes::from_static(b"{\"plain\": true}")];
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Record {
            offset: i as i64,
            timestamp: 1_765_000_000_000,
            key: None,
            value: Some(v.clone()),
            headers: vec![],
        })
        .collect();
    let batch = encode_batch(&records, &BatchOptions::default()).unwrap();
    let a = KafkaCluster::connect(ca.client_settings(None))
        .await
        .unwrap();
    a.produce("raw", 0, &batch).await.unwrap();
    eventually(60, "the look-alike counted", || async {
        metric(&address, "kmirror_schema_ids_unknown_total") >= 1.0
    })
    .await;
    let b = KafkaCluster::connect(cb.client_settings(None))
        .await
        .unwrap();
    let mut copied = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while copied.len() < 2 && Instant::now() < deadline {
        let _ = b.refresh_metadata(None).await;
        if let Ok(f) = b
            .fetch(
                "A.raw",
                0,
                0,
                1 << 20,
                Duration::from_millis(500),
                IsolationLevel::ReadCommitted,
            )
            .await
        {
            copied = f
                .batches
                .iter()
                .flat_map(|b| decode_batch_within(b, 1 << 20).unwrap())
                .filter_map(|r| r.value)
                .collect();
        }
    }
    assert_eq!(copied, values.to_vec());
    assert_eq!(metric(&address, "kmirror_schema_ids_unknown_total"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_against_a_registry_that_assigns_its_own_ids_exits_3_and_mm1_mode_translates() {
    let (ca, cb, ra, rb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("keep-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("keep-b", Security::Plaintext).unwrap());
        let ra = s.spawn(|| Registry::start("keep-src").unwrap());
        let rb = s.spawn(|| Registry::start("keep-dst").unwrap());
        (
            a.join().unwrap(),
            b.join().unwrap(),
            ra.join().unwrap(),
            rb.join().unwrap(),
        )
    });
    ca.create_topic("orders", 1).unwrap();
    AvroRecords {
        bootstrap: ca.bootstrap(),
        registry: ra.url(),
        topic: "orders",
    }
    .produce(&order(1), None, 0, 5, 1)
    .unwrap();
    let target = client(&rb);
    let before = (
        target.subjects(true).await.unwrap(),
        target.mode(None).await.unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &ca, &cb, &ra, &rb, "keep");
    let out = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .arg("run")
        .arg(&cfg)
        .args(["--metrics-address", "127.0.0.1:0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("kmirror.schemas.ids = translate"),
        "{stderr}"
    );
    let after = (
        target.subjects(true).await.unwrap(),
        target.mode(None).await.unwrap(),
    );
    assert_eq!(before, after);
    // Nothing written: the remote topic was never created.
    let topics = cb
        .tool(
            "topics",
            &["--bootstrap-server", cb.bootstrap(), "--list"],
            None,
        )
        .unwrap();
    assert!(topics.lines().all(|t| t.trim() != "A.orders"), "{topics}");

    // MM1 mode, same clusters: the registries named in its two client files, ids translated.
    for i in 0..3 {
        let local = Schema {
            schema_type: SchemaType::Avro,
            schema: format!(
                r#"{{"type":"record","name":"Mm1Local{i}","fields":[{{"name":"x","type":"int"}}]}}"#
            ),
            references: vec![],
        };
        target.register("local-value", &local, None).await.unwrap();
    }
    let consumer = dir.path().join("consumer.properties");
    std::fs::write(
        &consumer,
        format!(
            "bootstrap.servers={}\ngroup.id=mm1-schemas\nauto.offset.reset=earliest\nschema.registry.url={}\nkmirror.schemas.ids=translate\n",
            ca.bootstrap(),
            ra.url()
        ),
    )
    .unwrap();
    let producer = dir.path().join("producer.properties");
    std::fs::write(
        &producer,
        format!(
            "bootstrap.servers={}\nschema.registry.url={}\n",
            cb.bootstrap(),
            rb.url()
        ),
    )
    .unwrap();
    let args = [
        "--consumer.config",
        consumer.to_str().unwrap(),
        "--producer.config",
        producer.to_str().unwrap(),
        "--whitelist",
        "orders",
    ];
    let plan = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .arg("legacy")
        .args(args)
        .arg("--plan")
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&plan.stdout);
    assert!(
        shown.contains("ids translated in every record") && !shown.contains("ignored"),
        "{shown}"
    );
    let log = dir.path().join("legacy.log");
    let _mm1 = KillOnDrop::spawn(
        Command::new(env!("CARGO_BIN_EXE_kmirror"))
            .arg("legacy")
            .args(args),
        &log,
    );
    let copied = AvroRecords {
        bootstrap: cb.bootstrap(),
        registry: rb.url(),
        topic: "orders",
    }
    .consume(5, Duration::from_secs(90))
    .unwrap_or_else(|e| panic!("{e}\n{}", std::fs::read_to_string(&log).unwrap_or_default()));
    let mut ids: Vec<i64> = copied
        .iter()
        .map(|r| r["value"]["id"].as_i64().unwrap())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![0, 1, 2, 3, 4]);
    for r in &copied {
        let id = r["value"]["id"].as_i64().unwrap();
        assert_eq!(r["value"]["name"], format!("record-{id}"));
    }
    let source_id = client(&ra).subjects_of(kmirror_registry::SchemaId(1)).await;
    assert!(source_id.is_ok(), "the source's schema has id 1");
    assert!(
        copied
            .iter()
            .all(|r| r["value_schema_id"].as_i64() != Some(1)),
        "ids translated: {copied:?}"
    );
    assert_eq!(
        target.versions("orders-value", false).await.unwrap(),
        vec![1]
    );
}

const SECRET: &str = "registry-pass-4417";
const TOKEN: &str = "registry-token-8812";

const CUSTOMER_PROTO: &str =
    "syntax = \"proto3\";\npackage demo;\n\nmessage Customer {\n  int32 id = 1;\n  string name = 2;\n}\n";

/// The Protobuf value's versions, importing `customer.proto`: the second adds a field.
fn event_proto(dir: &Path, version: usize) -> std::path::PathBuf {
    let dir = dir.join(format!("proto-v{version}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("customer.proto"), CUSTOMER_PROTO).unwrap();
    let note = if version > 1 {
        "  string note = 4;\n"
    } else {
        ""
    };
    std::fs::write(
        dir.join("event.proto"),
        format!(
            "syntax = \"proto3\";\npackage demo;\n\nimport \"customer.proto\";\n\nmessage Event {{\n  int32 id = 1;\n  string name = 2;\n  demo.Customer customer = 3;\n{note}}}\n"
        ),
    )
    .unwrap();
    dir.join("event.proto")
}

const CUSTOMER_JSON: &str = r#"{"$schema":"http://json-schema.org/draft-07/schema#","title":"Customer","type":"object","properties":{"id":{"type":"integer"},"name":{"type":"string"}},"required":["id","name"]}"#;

/// The JSON Schema value's versions, with a `$ref` to the `customer` subject: the second adds
/// a property.
fn profile_json(dir: &Path, version: usize) -> std::path::PathBuf {
    let note = if version > 1 {
        r#","note":{"type":"string"}"#
    } else {
        ""
    };
    let path = dir.join(format!("profile-v{version}.json"));
    std::fs::write(
        &path,
        format!(
            r#"{{"$schema":"http://json-schema.org/draft-07/schema#","title":"Profile","type":"object","properties":{{"id":{{"type":"integer"}},"name":{{"type":"string"}},"customer":{{"$ref":"customer.json"}}{note}}},"required":["id","name","customer"]}}"#
        ),
    )
    .unwrap();
    path
}

/// Every record decodes to its id, name and referenced `customer`; returns the value schema ids.
fn check_typed(records: &[serde_json::Value], count: u64) -> std::collections::BTreeSet<i64> {
    let mut ids: Vec<i64> = records
        .iter()
        .map(|r| r["value"]["id"].as_i64().unwrap_or(-1))
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..count as i64).collect::<Vec<_>>());
    for r in records {
        let id = r["value"]["id"].as_i64().unwrap();
        assert_eq!(r["value"]["name"], format!("record-{id}"), "{r}");
        assert_eq!(r["value"]["customer"]["id"], id, "{r}");
        assert_eq!(
            r["value"]["customer"]["name"],
            format!("customer-{id}"),
            "{r}"
        );
        assert_eq!(r["key"], id.to_string(), "{r}");
    }
    records
        .iter()
        .filter_map(|r| r["value_schema_id"].as_i64())
        .collect()
}

/// Each reference of the target's schema `id` names a subject version the target has.
async fn references_resolve(target: &RegistryClient, id: i64) -> Vec<Reference> {
    let schema = target.schema(SchemaId(id as i32)).await.unwrap();
    for r in &schema.references {
        assert!(
            target.version(&r.subject, r.version, false).await.is_ok(),
            "schema {id}: reference {r:?} not on the target"
        );
    }
    schema.references
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_and_json_schema_with_references_arrive_decodable_through_the_target_registry() {
    let (ca, cb, ra, rb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("typed-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("typed-b", Security::Plaintext).unwrap());
        let ra = s.spawn(|| Registry::start("typed-src").unwrap());
        let rb = s.spawn(|| Registry::start("typed-dst").unwrap());
        (
            a.join().unwrap(),
            b.join().unwrap(),
            ra.join().unwrap(),
            rb.join().unwrap(),
        )
    });
    let (source, target) = (client(&ra), client(&rb));
    // Schemas of the target's own first: its ids run ahead of the source's.
    for i in 0..5 {
        let local = Schema {
            schema_type: SchemaType::Avro,
            schema: format!(
                r#"{{"type":"record","name":"Local{i}","namespace":"local","fields":[{{"name":"x","type":"int"}}]}}"#
            ),
            references: vec![],
        };
        target.register("local-value", &local, None).await.unwrap();
    }
    let customer = Schema {
        schema_type: SchemaType::Json,
        schema: CUSTOMER_JSON.into(),
        references: vec![],
    };
    source.register("customer", &customer, None).await.unwrap();
    ca.create_topic("events", 2).unwrap();
    ca.create_topic("profiles", 2).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let json_ref = ["customer.json=customer:1"];
    for version in 1..=2 {
        let start = (version as u64 - 1) * 20;
        TypedRecords {
            bootstrap: ca.bootstrap(),
            registry: ra.url(),
            topic: "events",
            format: "protobuf",
            schema: &event_proto(dir.path(), version),
        }
        .produce(&[], start, 20, 2)
        .unwrap();
        TypedRecords {
            bootstrap: ca.bootstrap(),
            registry: ra.url(),
            topic: "profiles",
            format: "json",
            schema: &profile_json(dir.path(), version),
        }
        .produce(&json_ref, start, 20, 2)
        .unwrap();
        if version == 1 {
            // The compatibility change: each subject gets a level of its own.
            source
                .set_compatibility(Some("events-value"), Compatibility::Backward)
                .await
                .unwrap();
            source
                .set_compatibility(Some("profiles-value"), Compatibility::None)
                .await
                .unwrap();
        }
    }
    let on_source = TypedRecords {
        bootstrap: ca.bootstrap(),
        registry: ra.url(),
        topic: "events",
        format: "protobuf",
        schema: &event_proto(dir.path(), 2),
    };
    check_typed(&on_source.consume(40, Duration::from_secs(60)).unwrap(), 40);
    let source_subjects = source.subjects(false).await.unwrap();
    println!("source subjects: {source_subjects:?}");
    assert!(
        source_subjects.iter().any(|s| s.ends_with(".proto")),
        "the serializer registered the import as a subject: {source_subjects:?}"
    );

    // Credentials for both registries (Apicurio without auth ignores them): they must show
    // nowhere an operator looks.
    let cfg = config(dir.path(), &ca, &cb, &ra, &rb, "translate");
    let mut props = std::fs::read_to_string(&cfg).unwrap();
    props.push_str(&format!(
        "A.basic.auth.credentials.source = USER_INFO\nA.basic.auth.user.info = mirror:{SECRET}\n\
         B.bearer.auth.credentials.source = STATIC_TOKEN\nB.bearer.auth.token = {TOKEN}\n"
    ));
    std::fs::write(&cfg, props).unwrap();
    let log = dir.path().join("kmirror.log");
    let (kmirror, address) = run(&cfg, &log);
    eventually(90, "80 records on the target", || async {
        metric(&address, "kmirror_record_count_total") >= 80.0
    })
    .await;
    let events = TypedRecords {
        bootstrap: cb.bootstrap(),
        registry: rb.url(),
        topic: "A.events",
        format: "protobuf",
        schema: &event_proto(dir.path(), 2),
    };
    let profiles = TypedRecords {
        bootstrap: cb.bootstrap(),
        registry: rb.url(),
        topic: "A.profiles",
        format: "json",
        schema: &profile_json(dir.path(), 2),
    };
    let event_ids = check_typed(&events.consume(40, Duration::from_secs(60)).unwrap(), 40);
    let profile_ids = check_typed(&profiles.consume(40, Duration::from_secs(60)).unwrap(), 40);
    assert_eq!((event_ids.len(), profile_ids.len()), (2, 2));
    for (subject, ids) in [
        ("A.events-value", &event_ids),
        ("A.profiles-value", &profile_ids),
    ] {
        assert_eq!(target.versions(subject, false).await.unwrap(), vec![1, 2]);
        for id in ids {
            let refs = references_resolve(&target, *id).await;
            assert_eq!(refs.len(), 1, "{subject} id {id}: {refs:?}");
        }
    }
    assert_eq!(
        target.compatibility(Some("A.events-value")).await.unwrap(),
        Some(Compatibility::Backward)
    );
    assert_eq!(
        target
            .compatibility(Some("A.profiles-value"))
            .await
            .unwrap(),
        Some(Compatibility::None)
    );
    // Keys are plain strings: only the values' ids are rewritten.
    assert_eq!(
        metric(&address, "kmirror_schema_ids_translated_total"),
        80.0
    );
    let plan = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .arg("plan")
        .arg(&cfg)
        .output()
        .unwrap();
    let plan =
        String::from_utf8_lossy(&plan.stdout).to_string() + &String::from_utf8_lossy(&plan.stderr);
    assert!(
        plan.contains("basic"),
        "plan names the kind of auth:\n{plan}"
    );
    for (what, body) in [
        ("plan", Some(plan)),
        ("/status", kmirror_testkit::http_body(&address, "/status")),
        ("/metrics", kmirror_testkit::http_body(&address, "/metrics")),
        ("log", std::fs::read_to_string(&log).ok()),
    ] {
        let body = body.unwrap_or_default();
        assert!(body.len() > 100, "{what}: {body}");
        assert!(
            !body.contains(SECRET) && !body.contains(TOKEN),
            "{what} shows a registry credential:\n{body}"
        );
    }

    // verify: subjects, versions, references, levels and the last records (ids aside) agree.
    let verify = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_kmirror"))
            .arg("verify")
            .arg(&cfg)
            .args(args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        (out.status.code(), text)
    };
    let (code, text) = verify(&["--deep", "5", "--all"]);
    assert_eq!(code, Some(0), "{text}");
    println!("{text}");
    for row in [
        "subject    events-value  2 version(s) as A.events-value, ids ",
        "subject    profiles-value  2 version(s) as A.profiles-value",
        "subject    customer  1 version(s) as customer",
        "settings   profiles-value  compatibility NONE",
        "settings   events-value  compatibility BACKWARD",
        "deep       events-0",
    ] {
        assert!(text.contains(row), "{row}:\n{text}");
    }
    // A version deleted on the target: exit 5, naming it.
    drop(kmirror);
    target
        .delete_version("A.profiles-value", 2, false)
        .await
        .unwrap();
    let (code, text) = verify(&[]);
    assert_eq!(code, Some(5), "{text}");
    println!("{text}");
    assert!(
        text.contains("FAILED   A->B     subject    profiles-value  version 2 (id "),
        "{text}"
    );
}
