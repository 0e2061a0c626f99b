//! The harness's schema registry (Apicurio, its Confluent-compatible API): it starts empty,
//! answers, stops answering while paused and again once resumed, and its port is free once the
//! handle is dropped. Needs Java 21+ (fails loudly without one).

use kmirror_testkit::Registry;
use std::time::Duration;

#[test]
fn a_registry_starts_empty_answers_freezes_and_stops() {
    let r = Registry::start("registry-harness").unwrap();
    assert!(
        r.url().starts_with("http://127.0.0.1:") && r.url().ends_with("/apis/ccompat/v7"),
        "{}",
        r.url()
    );
    let (status, body) = r.get("/subjects", Duration::from_secs(10)).unwrap();
    assert_eq!((status, body.trim()), (200, "[]"));
    let (status, body) = r.get("/mode", Duration::from_secs(10)).unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("READWRITE"), "{body}");
    let (status, body) = r.get("/schemas/ids/1", Duration::from_secs(10)).unwrap();
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("40403"), "{body}");

    r.pause().unwrap();
    assert!(
        r.get("/subjects", Duration::from_secs(2)).is_err(),
        "a paused registry answered"
    );
    r.resume().unwrap();
    let (status, _) = r.get("/subjects", Duration::from_secs(10)).unwrap();
    assert_eq!(status, 200);

    let url = r.url().to_string();
    let port: u16 = url
        .trim_start_matches("http://127.0.0.1:")
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    drop(r);
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the registry still listens on {port} after it was dropped"
    );
}

/// Confluent's own serializers write Avro records through the registry (registering the
/// schemas, as a producer does) and read them back decoded, with the ids the registry gave.
#[test]
fn a_real_serializer_writes_and_reads_avro_records_through_the_registry() {
    use kmirror_testkit::{AvroRecords, Cluster, Security};
    let (c, r) = std::thread::scope(|s| {
        let c = s.spawn(|| Cluster::start("serde-kafka", Security::Plaintext).unwrap());
        let r = s.spawn(|| Registry::start("serde-registry").unwrap());
        (c.join().unwrap(), r.join().unwrap())
    });
    c.create_topic("orders", 2).unwrap();
    let avro = AvroRecords {
        bootstrap: c.bootstrap(),
        registry: r.url(),
        topic: "orders",
    };
    let value = r#"{"type":"record","name":"Order","namespace":"demo","fields":[{"name":"id","type":"long"},{"name":"name","type":"string"}]}"#;
    let key = r#"{"type":"record","name":"OrderKey","namespace":"demo","fields":[{"name":"id","type":"long"}]}"#;
    avro.produce(value, Some(key), 0, 20, 2).unwrap();
    let read = avro.consume(20, Duration::from_secs(60)).unwrap();
    assert_eq!(read.len(), 20);
    let id_of = |subject: &str| -> u64 {
        let (status, body) = r
            .get(
                &format!("/subjects/{subject}/versions/1"),
                Duration::from_secs(10),
            )
            .unwrap();
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["id"].as_u64().unwrap()
    };
    let (value_id, key_id) = (id_of("orders-value"), id_of("orders-key"));
    let mut ids: Vec<u64> = read
        .iter()
        .map(|r| {
            let i = r["value"]["id"].as_u64().unwrap();
            assert_eq!(r["value"]["name"], format!("record-{i}"));
            assert_eq!(r["key"]["id"].as_u64(), Some(i));
            assert_eq!(r["partition"].as_u64(), Some(i % 2));
            assert_eq!(r["value_schema_id"].as_u64(), Some(value_id));
            assert_eq!(r["key_schema_id"].as_u64(), Some(key_id));
            i
        })
        .collect();
    ids.sort();
    assert_eq!(ids, (0..20).collect::<Vec<u64>>());
}
