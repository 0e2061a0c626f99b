//! The engine between two 3-broker clusters while leaders move under it: on the source (a
//! preferred-leader move, a crashed broker) the fetcher must follow each partition to its new
//! leader without losing its position; on the target (a move, a crash) the produce senders
//! must send each partition's batches to its new leader, in order, and recover from the log
//! what a lost connection left unanswered. Records are written all along. In the end every
//! remote partition holds exactly its source's records, in order: nothing lost, nothing twice.

use bytes::Bytes;
use kmirror_kafka::batch::RawBatch;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic, LATEST};
use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
use kmirror_kafka::IsolationLevel;
use kmirror_mirror::config::mm2;
use kmirror_mirror::config::properties::Properties;
use kmirror_mirror::config::providers::SystemEnvironment;
use kmirror_mirror::engine::{self, Shutdown};
use kmirror_mirror::metrics::Metrics;
use kmirror_testkit::{eventually, read_partition, Cluster, Security};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const PARTITIONS: i32 = 6;

fn batch(partition: i32, from: usize, n: usize) -> RawBatch {
    // Now: brokers refuse timestamps more than an hour ahead (log.message.timestamp.after.max.ms).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let records: Vec<Record> = (from..from + n)
        .map(|i| Record {
            offset: (i - from) as i64,
            timestamp: now + (i - from) as i64,
            key: Some(Bytes::from(format!("k{i}"))),
            value: Some(Bytes::from(format!("p{partition}-{i:08}-").repeat(8))),
            headers: vec![],
        })
        .collect();
    encode_batch(&records, &BatchOptions::default()).unwrap()
}

/// Writes 20-record batches round the partitions until told to stop. A produce that fails
/// (its leader moved or crashed) is tried again: that may write a batch twice on the source,
/// which the comparison at the end takes as it comes, since it compares logs.
fn writer(
    a: Arc<KafkaCluster>,
    stop: Arc<AtomicBool>,
    written: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) {
            for p in 0..PARTITIONS {
                let b = batch(p, i, 20);
                let mut attempts = 0;
                while let Err(e) = a.produce("moving", p, &b).await {
                    attempts += 1;
                    assert!(
                        attempts < 120,
                        "the source refused moving-{p} for a minute: {e}"
                    );
                    let _ = a.refresh_metadata(None).await;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                written.fetch_add(20, Ordering::Relaxed);
            }
            i += 20;
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    })
}

/// Runs a harness command (it blocks on a Kafka tool) off the runtime's workers.
async fn harness<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

async fn copied(a: &KafkaCluster, b: &KafkaCluster) -> bool {
    let _ = b.refresh_metadata(None).await;
    for p in 0..PARTITIONS {
        let want = a
            .list_offset("moving", p, LATEST, IsolationLevel::ReadUncommitted)
            .await;
        let got = b
            .list_offset("A.moving", p, LATEST, IsolationLevel::ReadUncommitted)
            .await;
        match (want, got) {
            (Ok(w), Ok(g)) if g >= w => {}
            _ => return false,
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_exactly_while_leaders_move_and_brokers_crash_on_both_sides() {
    kmirror_testkit::init_logging();
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start_nodes("moves-a", Security::Plaintext, 3, &[]).unwrap());
        let b = s.spawn(|| Cluster::start_nodes("moves-b", Security::Plaintext, 3, &[]).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    let (ca, cb) = (Arc::new(ca), Arc::new(cb));
    let text = format!(
        "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\nA->B.topics = moving\n\
         replication.factor = 3\noffset.storage.replication.factor = 3\nheartbeats.topic.replication.factor = 3\n\
         checkpoints.topic.replication.factor = 3\noffset-syncs.topic.replication.factor = 3\n\
         refresh.topics.interval.seconds = 1\n",
        ca.bootstrap(),
        cb.bootstrap()
    );
    let config = mm2::load(
        &Properties::parse(&text, "mm2.properties").unwrap(),
        &[],
        &SystemEnvironment,
    )
    .unwrap();
    let a = Arc::new(
        KafkaCluster::connect(config.flows[0].clients.source_admin.clone())
            .await
            .unwrap(),
    );
    let b = KafkaCluster::connect(config.flows[0].clients.target_admin.clone())
        .await
        .unwrap();
    for (_, e) in a
        .create_topics(
            &[NewTopic {
                name: "moving".into(),
                partitions: PARTITIONS,
                replication_factor: 3,
                configs: vec![],
            }],
            false,
        )
        .await
        .unwrap()
    {
        assert!(e.is_none(), "{e:?}");
    }

    let stop_writing = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicUsize::new(0));
    let writing = writer(a.clone(), stop_writing.clone(), written.clone());
    eventually(60, "the first records written", || async {
        written.load(Ordering::Relaxed) >= 1000
    })
    .await;

    let shutdown = Shutdown::default();
    let metrics = Arc::new(Metrics::new());
    let running = {
        let (config, shutdown, metrics) = (config.clone(), shutdown.clone(), metrics.clone());
        tokio::spawn(async move { engine::run(&config, shutdown, metrics).await })
    };
    eventually(90, "the remote topic holds records", || async {
        let _ = b.refresh_metadata(None).await;
        b.list_offset("A.moving", 0, LATEST, IsolationLevel::ReadUncommitted)
            .await
            .is_ok_and(|o| o > 0)
    })
    .await;

    // Source: partition 0's leader moves; the broker leading partition 1 crashes.
    let leader = |c: &Arc<Cluster>, t: &'static str, p: i32| {
        let c = c.clone();
        harness(move || c.describe_partition(t, p).unwrap().0)
    };
    let (a0, a1) = (
        leader(&ca, "moving", 0).await,
        leader(&ca, "moving", 1).await,
    );
    // Not to the broker about to crash, when there is a choice: a move and a crash are two cases.
    let to = (1..=3)
        .find(|n| *n != a0 && *n != a1)
        .or((1..=3).find(|n| *n != a0))
        .unwrap();
    let c = ca.clone();
    harness(move || c.move_leader("moving", 0, to).unwrap()).await;
    let c = ca.clone();
    harness(move || c.kill_node(a1 as u16).unwrap()).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Target: A.moving-2's leader moves; the broker leading A.moving-3 crashes.
    let (b2, b3) = (
        leader(&cb, "A.moving", 2).await,
        leader(&cb, "A.moving", 3).await,
    );
    let to = (1..=3)
        .find(|n| *n != b2 && *n != b3)
        .or((1..=3).find(|n| *n != b2))
        .unwrap();
    let c = cb.clone();
    harness(move || c.move_leader("A.moving", 2, to).unwrap()).await;
    let c = cb.clone();
    harness(move || c.kill_node(b3 as u16).unwrap()).await;
    let before = written.load(Ordering::Relaxed);
    eventually(90, "records written with both brokers down", || async {
        assert!(
            !writing.is_finished(),
            "the writer stopped (see its panic above)"
        );
        written.load(Ordering::Relaxed) >= before + 2000
    })
    .await;
    let c = ca.clone();
    harness(move || c.start_node(a1 as u16).unwrap()).await;
    let c = cb.clone();
    harness(move || c.start_node(b3 as u16).unwrap()).await;
    let before = written.load(Ordering::Relaxed);
    eventually(60, "records written after the restarts", || async {
        assert!(
            !writing.is_finished(),
            "the writer stopped (see its panic above)"
        );
        written.load(Ordering::Relaxed) >= before + 1000
    })
    .await;
    stop_writing.store(true, Ordering::Relaxed);
    writing.await.unwrap();
    eventually(120, "every record copied", || copied(&a, &b)).await;
    shutdown.trigger();
    running.await.unwrap().unwrap();

    let mut total = 0;
    for p in 0..PARTITIONS {
        let s = read_partition(&a, "moving", p).await;
        let d = read_partition(&b, "A.moving", p).await;
        assert_eq!(
            s.len(),
            d.len(),
            "moving-{p}: source and remote hold as many records"
        );
        for (i, ((_, sr), (_, dr))) in s.iter().zip(&d).enumerate() {
            assert_eq!(
                (&sr.key, &sr.value, sr.timestamp),
                (&dr.key, &dr.value, dr.timestamp),
                "moving-{p}, record {i}"
            );
        }
        total += s.len();
    }
    let m = &metrics;
    let requests = m.sum("kmirror_produce_requests_total", &[]);
    let batches = m.sum("kmirror_produce_batches_total", &[]);
    let fetch_errors = m.sum("kmirror_errors_total", &[("kind", "fetch")]);
    let produce_errors = m.sum("kmirror_errors_total", &[("kind", "produce")]);
    eprintln!(
        "{total} records copied through 2 leader moves and 2 crashes: {requests} produce requests for {batches} batches, \
         {fetch_errors} fetch errors, {produce_errors} produce errors"
    );
    assert!(
        batches > requests,
        "produce requests carried several partitions: {batches} batches in {requests} requests"
    );
    // The move and the crash were noticed by the fetcher (that it followed them, and the
    // produce senders too, is what the comparison of the logs above proves).
    assert!(
        fetch_errors > 0.0,
        "the source's leader changes were seen by the fetcher"
    );
}
