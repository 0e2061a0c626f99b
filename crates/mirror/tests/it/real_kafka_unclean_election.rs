//! The engine writing to a target partition whose leader is replaced by an unclean election:
//! the new leader is a replica that missed the last records, so the target loses records it had
//! acknowledged, and the new leader knows kmirror's producer only up to an older sequence
//! number. kmirror's next batches are then refused as OUT_OF_ORDER_SEQUENCE_NUMBER however often
//! they are resent. It must start over under a new producer id within seconds (not after the
//! two-minute delivery timeout), report the loss (`kmirror_target_truncated_offsets_total`), and
//! copy everything written afterwards exactly once.

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
use std::sync::Arc;
use std::time::{Duration, Instant};

const REMOTE: &str = "A.lossy";
/// Records written in each of the three phases.
const PHASE: usize = 300;

fn batch(from: usize, n: usize) -> RawBatch {
    // Now: brokers refuse timestamps more than an hour ahead, and retention would delete
    // records an hour old under the test.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let records: Vec<Record> = (from..from + n)
        .map(|i| Record {
            offset: (i - from) as i64,
            timestamp: now,
            key: Some(Bytes::from(format!("k{i}"))),
            value: Some(Bytes::from(format!("record-{i:06}"))),
            headers: vec![],
        })
        .collect();
    encode_batch(&records, &BatchOptions::default()).unwrap()
}

async fn write_phase(a: &KafkaCluster, phase: usize) {
    for from in (phase * PHASE..(phase + 1) * PHASE).step_by(20) {
        a.produce("lossy", 0, &batch(from, 20)).await.unwrap();
    }
}

async fn remote_end(b: &KafkaCluster) -> Option<i64> {
    let _ = b.refresh_metadata(Some(&[REMOTE])).await;
    b.list_offset(REMOTE, 0, LATEST, IsolationLevel::ReadUncommitted)
        .await
        .ok()
}

/// Runs a harness command (it blocks on a Kafka tool) off the runtime's workers.
async fn harness<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unclean_election_on_the_target_is_reported_and_copying_goes_on() {
    kmirror_testkit::init_logging();
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("unclean-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start_nodes("unclean-b", Security::Plaintext, 3, &[]).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    let cb = Arc::new(cb);
    // The remote topic on brokers 1 (leader) and 2 only, so that with both down, broker 3 alone
    // keeps the cluster's controller quorum once 2 is back; acknowledged with one replica in
    // sync, and open to unclean elections: the settings that let a target lose records.
    cb.tool(
        "topics",
        &[
            "--bootstrap-server",
            cb.tools_bootstrap(),
            "--command-config",
            cb.client_config(None).to_str().unwrap(),
            "--create",
            "--topic",
            REMOTE,
            "--replica-assignment",
            "1:2",
            "--config",
            "min.insync.replicas=1",
            "--config",
            "unclean.leader.election.enable=true",
        ],
        None,
    )
    .unwrap();
    // Sharing off: with two of the three target brokers down, the flow's group coordinator may
    // be gone too, and a process that loses its membership restarts its partitions on fresh
    // lanes, which know nothing of what the old leader acknowledged. This test is about the
    // lane that keeps writing through the election.
    let text = format!(
        "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\nA->B.topics = lossy\n\
         sync.topic.configs.enabled = false\nrefresh.topics.interval.seconds = 1\n\
         kmirror.sharing.enabled = false\n\
         offset-syncs.topic.replication.factor = 1\n",
        ca.bootstrap(),
        cb.bootstrap()
    );
    let config = mm2::load(
        &Properties::parse(&text, "mm2.properties").unwrap(),
        &[],
        &SystemEnvironment,
    )
    .unwrap();
    let a = KafkaCluster::connect(config.flows[0].clients.source_admin.clone())
        .await
        .unwrap();
    let b = KafkaCluster::connect(config.flows[0].clients.target_admin.clone())
        .await
        .unwrap();
    for (_, e) in a
        .create_topics(
            &[NewTopic {
                name: "lossy".into(),
                partitions: 1,
                replication_factor: 1,
                configs: vec![],
            }],
            false,
        )
        .await
        .unwrap()
    {
        assert!(e.is_none(), "{e:?}");
    }

    write_phase(&a, 0).await;
    let shutdown = Shutdown::default();
    let metrics = Arc::new(Metrics::new());
    let running = {
        let (config, shutdown, metrics) = (config.clone(), shutdown.clone(), metrics.clone());
        tokio::spawn(async move { engine::run(&config, shutdown, metrics).await })
    };
    let phase_copied = |n: i64| {
        let b = &b;
        move || async move { remote_end(b).await.is_some_and(|e| e >= n) }
    };
    eventually(90, "the first phase copied", phase_copied(PHASE as i64)).await;

    // Broker 2 crashes: the controller takes it out of the ISR, and the second phase is
    // acknowledged by broker 1 alone.
    let c = cb.clone();
    harness(move || c.kill_node(2).unwrap()).await;
    let t0 = Instant::now();
    loop {
        let c = cb.clone();
        let state = harness(move || c.partition_state(REMOTE, 0).unwrap()).await;
        if state.isr == [1] {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "broker 2 still in the ISR after 60 s: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    write_phase(&a, 1).await;
    eventually(
        90,
        "the second phase copied",
        phase_copied(2 * PHASE as i64),
    )
    .await;

    // Broker 1 crashes too, and broker 2 comes back without the second phase and is elected
    // although it is out of sync.
    let c = cb.clone();
    harness(move || c.kill_node(1).unwrap()).await;
    let c = cb.clone();
    harness(move || c.start_node(2).unwrap()).await;
    let c = cb.clone();
    harness(move || c.elect_unclean(REMOTE, 0, 2).unwrap()).await;
    eventually(
        30,
        "the remote log truncated to the first phase",
        || async { remote_end(&b).await == Some(PHASE as i64) },
    )
    .await;

    let t0 = Instant::now();
    write_phase(&a, 2).await;
    eventually(90, "the third phase copied", phase_copied(2 * PHASE as i64)).await;
    let resumed = t0.elapsed();
    shutdown.trigger();
    running.await.unwrap().unwrap();

    let new_ids = metrics.sum("kmirror_producer_new_ids_total", &[]);
    let truncated = metrics.sum("kmirror_target_truncated_offsets_total", &[]);
    eprintln!(
        "after the unclean election: the third phase copied {:.1} s after it was written; \
         {new_ids} new producer ids, {truncated} offsets reported lost",
        resumed.as_secs_f64()
    );
    // The delivery timeout is 120 s: resending the refused sequences until then is the fault.
    assert!(
        resumed < Duration::from_secs(30),
        "copying resumed {resumed:?} after the election"
    );
    assert!(new_ids >= 1.0, "a new producer id was taken: {new_ids}");
    assert_eq!(
        truncated, PHASE as f64,
        "the records the target lost were reported"
    );
    // The target holds the first and the third phase, each record once and in order; the
    // second is what the unclean election lost.
    let source = read_partition(&a, "lossy", 0).await;
    let remote = read_partition(&b, REMOTE, 0).await;
    let want: Vec<_> = source[..PHASE]
        .iter()
        .chain(&source[2 * PHASE..])
        .map(|(_, r)| (r.key.clone(), r.value.clone()))
        .collect();
    let got: Vec<_> = remote
        .iter()
        .map(|(_, r)| (r.key.clone(), r.value.clone()))
        .collect();
    assert_eq!(got.len(), want.len(), "records on the target");
    assert!(got == want, "the target holds phases 1 and 3 exactly");
}
