//! A source batch larger than the target producer's `max.request.size`: a source
//! topic with `max.message.bytes` of 8 MiB holds a 3.6 MB batch, which kmirror's producer (1 MiB
//! by default, as Java's) cannot send as it is. It used to stop the partition ("exceeds
//! max.request.size") where MirrorMaker 2 copies it; now it is split into batches under the
//! limit, and every record arrives, in order, at its own offset. Then the topic is deleted
//! (its tasks stop), and re-created while kmirror is stopped (copied from the new log's start).

use bytes::Bytes;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic, LATEST};
use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
use kmirror_kafka::IsolationLevel;
use kmirror_mirror::config::mm2;
use kmirror_mirror::config::properties::Properties;
use kmirror_mirror::config::providers::SystemEnvironment;
use kmirror_mirror::engine::{self, Shutdown};
use kmirror_mirror::metrics::Metrics;
use kmirror_testkit::{eventually, read_partition, Cluster, Security};
use std::sync::Arc;

const RECORDS: i64 = 36;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_batch_is_split_and_a_deleted_topic_stops_its_tasks() {
    kmirror_testkit::init_logging();
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("changes-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("changes-b", Security::Plaintext).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    let a = KafkaCluster::connect(ca.client_settings(None))
        .await
        .unwrap();
    let topic = NewTopic {
        name: "wide".into(),
        partitions: 1,
        replication_factor: 1,
        configs: vec![("max.message.bytes".into(), (8 << 20).to_string())],
    };
    for (_, e) in a.create_topics(&[topic], false).await.unwrap() {
        assert!(e.is_none(), "{e:?}");
    }
    let records: Vec<Record> = (0..RECORDS)
        .map(|i| Record {
            offset: i,
            timestamp: 1_764_800_000_000 + i,
            key: Some(Bytes::from(format!("k{i}"))),
            // Not compressible: the batch stays 3.6 MB whatever the codec.
            value: Some(Bytes::from(
                (0..100_000u32)
                    .map(|j| (j.wrapping_mul(2_654_435_761).wrapping_add(i as u32) >> 13) as u8)
                    .collect::<Vec<u8>>(),
            )),
            headers: vec![],
        })
        .collect();
    let big = encode_batch(&records, &BatchOptions::default()).unwrap();
    assert!(big.bytes().len() > 3_500_000, "{}", big.bytes().len());
    a.produce("wide", 0, &big).await.unwrap();
    a.produce(
        "wide",
        0,
        &encode_batch(&records[..2], &BatchOptions::default()).unwrap(),
    )
    .await
    .unwrap();

    let text = format!(
        "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\n\
         A->B.topics = wide\nreplication.factor = 1\noffset.storage.replication.factor = 1\n\
         offset-syncs.topic.replication.factor = 1\nemit.heartbeats.enabled = false\n\
         emit.checkpoints.enabled = false\nrefresh.topics.interval.seconds = 1\n",
        ca.bootstrap(),
        cb.bootstrap()
    );
    let config = mm2::load(
        &Properties::parse(&text, "mm2.properties").unwrap(),
        &[],
        &SystemEnvironment,
    )
    .unwrap();
    let shutdown = Shutdown::default();
    let metrics = Arc::new(Metrics::new());
    let running = {
        let (config, shutdown, metrics) = (config.clone(), shutdown.clone(), metrics.clone());
        tokio::spawn(async move { engine::run(&config, shutdown, metrics).await })
    };
    let b = KafkaCluster::connect(cb.client_settings(None))
        .await
        .unwrap();
    eventually(60, "every record copied", || async {
        let _ = b.refresh_metadata(None).await;
        b.list_offset("A.wide", 0, LATEST, IsolationLevel::ReadCommitted)
            .await
            .is_ok_and(|e| e == RECORDS + 2)
    })
    .await;
    assert_eq!(
        metrics.sum("kmirror_partition_stopped", &[]),
        0.0,
        "nothing stopped"
    );
    let split = metrics.sum("kmirror_batches_total", &[("mode", "record")]);
    assert!(split >= 4.0, "3.6 MB in batches of at most 1 MiB: {split}");
    let s = read_partition(&a, "wide", 0).await;
    let d = read_partition(&b, "A.wide", 0).await;
    assert_eq!(s.len(), d.len());
    for ((_, x), (_, y)) in s.iter().zip(&d) {
        assert_eq!(
            (&x.key, &x.value, x.timestamp),
            (&y.key, &y.value, y.timestamp)
        );
    }
    println!(
        "a {} byte batch copied in {split} batches",
        big.bytes().len()
    );

    // The positions topic kmirror created compacts beyond its active segment within 16 MiB
    // or an hour, whichever comes first (docs/operating.md).
    let configs = b
        .describe_topic_configs("mm2-offsets.A.internal")
        .await
        .unwrap();
    let value = |k: &str| {
        configs
            .iter()
            .find(|e| e.name == k)
            .and_then(|e| e.value.clone())
    };
    assert_eq!(value("cleanup.policy").as_deref(), Some("compact"));
    assert_eq!(value("segment.bytes").as_deref(), Some("16777216"));
    assert_eq!(value("segment.ms").as_deref(), Some("3600000"));

    // 2. The source topic goes away.
    a.delete_topics(&["wide"]).await.unwrap();
    eventually(60, "the deleted topic's tasks stopped", || async {
        metrics.sum("kmirror_errors_total", &[("kind", "topic_deleted")]) == 1.0
    })
    .await;
    // Stopped means quiet: no more fetch errors for the deleted partition.
    let errors = || metrics.sum("kmirror_errors_total", &[("kind", "fetch")]);
    let before = errors();
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    assert_eq!(
        errors(),
        before,
        "nothing asks for the deleted topic any more"
    );
    assert_eq!(
        b.list_offset("A.wide", 0, LATEST, IsolationLevel::ReadCommitted)
            .await
            .unwrap(),
        RECORDS + 2,
        "the remote topic keeps what was copied"
    );
    let t = std::time::Instant::now();
    shutdown.trigger();
    running.await.unwrap().unwrap();
    assert!(t.elapsed() < std::time::Duration::from_secs(10));

    // 3. Re-created while kmirror is stopped, with fewer records than the old log held: the
    // stored position (37) belongs to the old log. Resumed there, the new log's 20 records
    // (offsets 0 to 19) were skipped; the recorded topic id tells the logs apart.
    let topic = NewTopic {
        name: "wide".into(),
        partitions: 1,
        replication_factor: 1,
        configs: vec![],
    };
    eventually(60, "the topic is created again", || async {
        a.create_topics(std::slice::from_ref(&topic), false)
            .await
            .is_ok_and(|r| r.iter().all(|(_, e)| e.is_none()))
    })
    .await;
    let _ = a.refresh_metadata(None).await;
    let fresh: Vec<Record> = (0..20)
        .map(|i| Record {
            offset: i,
            timestamp: 1_764_900_000_000 + i,
            key: Some(Bytes::from(format!("new{i}"))),
            value: Some(Bytes::from(format!("second life {i}"))),
            headers: vec![],
        })
        .collect();
    a.produce(
        "wide",
        0,
        &encode_batch(&fresh, &BatchOptions::default()).unwrap(),
    )
    .await
    .unwrap();
    let run = |metrics: Arc<Metrics>| {
        let (config, shutdown) = (config.clone(), Shutdown::default());
        let task = {
            let shutdown = shutdown.clone();
            tokio::spawn(async move { engine::run(&config, shutdown, metrics).await })
        };
        (shutdown, task)
    };
    let metrics = Arc::new(Metrics::new());
    let (shutdown, running) = run(metrics.clone());
    eventually(60, "the new log copied from its start", || async {
        b.list_offset("A.wide", 0, LATEST, IsolationLevel::ReadCommitted)
            .await
            .is_ok_and(|e| e == RECORDS + 2 + 20)
    })
    .await;
    assert_eq!(
        metrics.sum("kmirror_errors_total", &[("kind", "topic_recreated")]),
        1.0,
        "the re-creation is reported"
    );
    let d = read_partition(&b, "A.wide", 0).await;
    let copied: Vec<_> = d[(RECORDS + 2) as usize..]
        .iter()
        .map(|(_, r)| r.value.clone())
        .collect();
    let sent: Vec<_> = fresh.iter().map(|r| r.value.clone()).collect();
    assert_eq!(copied, sent, "every record of the new log, in order");
    shutdown.trigger();
    running.await.unwrap().unwrap();

    // 4. Started once more: the new log is now the recorded one, so nothing is reported and
    // nothing is copied again.
    let metrics = Arc::new(Metrics::new());
    let (shutdown, running) = run(metrics.clone());
    eventually(60, "the flow is running", || async {
        metrics.sum("kmirror_partitions", &[]) >= 1.0
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(
        metrics.sum("kmirror_errors_total", &[("kind", "topic_recreated")]),
        0.0
    );
    assert_eq!(
        b.list_offset("A.wide", 0, LATEST, IsolationLevel::ReadCommitted)
            .await
            .unwrap(),
        RECORDS + 2 + 20,
        "nothing copied twice"
    );
    shutdown.trigger();
    running.await.unwrap().unwrap();
}
