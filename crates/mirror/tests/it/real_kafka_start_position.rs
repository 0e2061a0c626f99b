//! Where a flow without stored positions starts (`kmirror.start.position`): at a time, the copy
//! holds exactly the source records from the first one at or after it; at `latest`, exactly the
//! records written after the partition started; and a consumer group committed before the
//! start gets no checkpoint (nothing before the start was copied, as MM2 does for a group
//! older than its first offset sync).

use bytes::Bytes;
use kmirror_kafka::cluster::{KafkaCluster, LATEST};
use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
use kmirror_kafka::IsolationLevel;
use kmirror_mirror::config::mm2;
use kmirror_mirror::config::model::MirrorConfig;
use kmirror_mirror::config::properties::Properties;
use kmirror_mirror::config::providers::SystemEnvironment;
use kmirror_mirror::engine::{self, Shutdown};
use kmirror_mirror::metrics::Metrics;
use kmirror_mirror::wire::internal::Checkpoint;
use kmirror_testkit::{eventually, read_partition, Cluster, Security};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

fn load(text: &str) -> MirrorConfig {
    mm2::load(
        &Properties::parse(text, "mm2.properties").unwrap(),
        &[],
        &SystemEnvironment,
    )
    .unwrap()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Writes records `first..first+n` of `topic`, one per batch, the i-th with timestamp
/// `base + i * 1000` (recent: retention must not delete them).
async fn produce(k: &KafkaCluster, topic: &str, first: i64, n: i64, base: i64) {
    for i in first..first + n {
        let r = Record {
            offset: 0,
            timestamp: base + i * 1000,
            key: None,
            value: Some(Bytes::from(format!("{topic}-{i}"))),
            headers: vec![],
        };
        k.produce(
            topic,
            0,
            &encode_batch(&[r], &BatchOptions::default()).unwrap(),
        )
        .await
        .unwrap();
    }
}

/// Commits `group`'s offset on partition 0 of `topic`, as a consumer that read up to it would.
async fn commit(k: &KafkaCluster, group: &str, topic: &str, offset: i64) {
    let committed = kmirror_kafka::admin::CommittedOffset {
        offset,
        leader_epoch: -1,
        metadata: String::new(),
    };
    let offsets = BTreeMap::from([(topic.to_string(), BTreeMap::from([(0, committed)]))]);
    k.commit_group_offsets(group, &offsets).await.unwrap();
}

async fn end(k: &KafkaCluster, topic: &str) -> i64 {
    k.list_offset(topic, 0, LATEST, IsolationLevel::ReadCommitted)
        .await
        .unwrap_or(-1)
}

async fn values(k: &KafkaCluster, topic: &str) -> Vec<String> {
    read_partition(k, topic, 0)
        .await
        .into_iter()
        .map(|(_, r)| String::from_utf8_lossy(&r.value.unwrap()).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flow_starts_at_a_time_or_at_the_end_and_copies_exactly_from_there() {
    kmirror_testkit::init_logging();
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("start-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("start-b", Security::Plaintext).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    ca.create_topic("timed", 1).unwrap();
    ca.create_topic("live", 1).unwrap();
    let base = now_ms() - 600_000;
    let common = format!(
        "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\n\
         replication.factor = 1\noffset.storage.replication.factor = 1\nheartbeats.topic.replication.factor = 1\n\
         checkpoints.topic.replication.factor = 1\noffset-syncs.topic.replication.factor = 1\n\
         emit.checkpoints.interval.seconds = 1\nrefresh.groups.interval.seconds = 1\n",
        ca.bootstrap(),
        cb.bootstrap()
    );
    let a = KafkaCluster::connect(load(&common).flows[0].clients.source_admin.clone())
        .await
        .unwrap();
    let b = KafkaCluster::connect(load(&common).flows[0].clients.target_admin.clone())
        .await
        .unwrap();
    produce(&a, "timed", 0, 100, base).await;
    // A group that read 20 records, before the start.
    commit(&a, "early", "timed", 20).await;

    // At a time: record 60's timestamp, written as RFC 3339 (with an offset, as a user would).
    let at = base + 60_000;
    let when = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(at) * 1_000_000)
        .unwrap()
        .to_offset(time::UtcOffset::from_hms(2, 0, 0).unwrap())
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let config = load(&format!(
        "{common}A->B.topics = timed\nA->B.kmirror.start.position = {when}\n"
    ));
    let shutdown = Shutdown::default();
    let metrics = Arc::new(Metrics::new());
    let task = {
        let (config, shutdown, metrics) = (config.clone(), shutdown.clone(), metrics.clone());
        tokio::spawn(async move { engine::run(&config, shutdown, metrics).await })
    };
    eventually(60, "the records from the start copied", || async {
        end(&b, "A.timed").await == 40
    })
    .await;
    let want: Vec<String> = (60..100).map(|i| format!("timed-{i}")).collect();
    assert_eq!(values(&b, "A.timed").await, want, "exactly records 60..99");
    // The group's offset lies before the start: no checkpoint for it, while a group inside
    // the copied range gets one.
    commit(&a, "inside", "timed", 70).await;
    let checkpoints = || async {
        let _ = b.refresh_metadata(None).await;
        if end(&b, "A.checkpoints.internal").await <= 0 {
            return vec![];
        }
        read_partition(&b, "A.checkpoints.internal", 0)
            .await
            .into_iter()
            .filter_map(|(_, r)| Checkpoint::decode(r.key.as_deref()?, r.value.as_deref()?).ok())
            .collect::<Vec<_>>()
    };
    eventually(60, "a checkpoint for the group inside the copy", || async {
        checkpoints().await.iter().any(|c| c.group == "inside")
    })
    .await;
    let written = checkpoints().await;
    let inside = written.iter().find(|c| c.group == "inside").unwrap();
    assert_eq!(
        (inside.upstream_offset, inside.downstream_offset),
        (70, 10),
        "record 70 is the remote's 11th"
    );
    assert!(
        !written.iter().any(|c| c.group == "early"),
        "a group before the start is not checkpointed: {written:?}"
    );
    shutdown.trigger();
    task.await.unwrap().unwrap();

    // At the end: only what is written after the partition started.
    produce(&a, "live", 0, 30, now_ms() - 30_000).await;
    let config = load(&format!(
        "{common}A->B.topics = live\nA->B.kmirror.start.position = latest\nemit.checkpoints.enabled = false\n"
    ));
    let shutdown = Shutdown::default();
    let task = {
        let (config, shutdown) = (config.clone(), shutdown.clone());
        let metrics = Arc::new(Metrics::new());
        tokio::spawn(async move { engine::run(&config, shutdown, metrics).await })
    };
    eventually(60, "the remote topic created", || async {
        let _ = b.refresh_metadata(None).await;
        b.metadata().topics.contains_key("A.live")
    })
    .await;
    // The partition looks its start up as soon as its remote topic exists.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        end(&b, "A.live").await,
        0,
        "nothing written before the start"
    );
    produce(&a, "live", 30, 20, now_ms()).await;
    eventually(60, "the later records copied", || async {
        end(&b, "A.live").await == 20
    })
    .await;
    let want: Vec<String> = (30..50).map(|i| format!("live-{i}")).collect();
    assert_eq!(values(&b, "A.live").await, want, "exactly records 30..49");
    shutdown.trigger();
    task.await.unwrap().unwrap();
}
