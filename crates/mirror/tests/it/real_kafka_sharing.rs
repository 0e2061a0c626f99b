//! Several kmirror processes serving one flow share its partitions through the flow's group on
//! the target (docs/sharing.md). Four engines (each as a separate process would run it, with its
//! own clients, producer id and metrics) join one after another and one leaves, while records
//! are written to 24 partitions all along: each engine serves a share, exactly one leads, and in
//! the end every remote partition holds exactly its source's records, in order: a partition
//! handed from one engine to another is neither skipped nor copied twice, since its old owner
//! stores its position before the new one starts from it.

use bytes::Bytes;
use kmirror_kafka::admin::CommittedOffset;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic, LATEST};
use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
use kmirror_kafka::IsolationLevel;
use kmirror_mirror::config::mm2;
use kmirror_mirror::config::model::MirrorConfig as Config;
use kmirror_mirror::config::properties::Properties;
use kmirror_mirror::config::providers::SystemEnvironment;
use kmirror_mirror::engine::{self, EngineError, Shutdown};
use kmirror_mirror::metrics::Metrics;
use kmirror_mirror::wire::internal::Checkpoint;
use kmirror_testkit::{eventually, read_partition, Cluster, Security};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

const PARTITIONS: i32 = 24;

struct Engine {
    shutdown: Shutdown,
    metrics: Arc<Metrics>,
    task: JoinHandle<Result<(), EngineError>>,
}

impl Engine {
    fn start(config: &Config) -> Engine {
        let shutdown = Shutdown::default();
        let metrics = Arc::new(Metrics::new());
        let task = {
            let (config, shutdown, metrics) = (config.clone(), shutdown.clone(), metrics.clone());
            tokio::spawn(async move { engine::run(&config, shutdown, metrics).await })
        };
        Engine {
            shutdown,
            metrics,
            task,
        }
    }

    fn assigned(&self) -> i64 {
        self.metrics.sum("kmirror_assigned_partitions", &[]) as i64
    }

    fn counter(&self, name: &str) -> i64 {
        self.metrics.sum(name, &[("source", "A")]) as i64
    }

    /// Whether this engine copied records into the remote partition `p`.
    fn copied_into(&self, p: i32) -> bool {
        let p = p.to_string();
        self.metrics.sum(
            "kmirror_record_count_total",
            &[("topic", "A.shared"), ("partition", p.as_str())],
        ) > 0.0
    }

    fn leads(&self) -> bool {
        self.metrics.sum("kmirror_group_leader", &[("source", "A")]) == 1.0
    }

    async fn stop(self) {
        self.shutdown.trigger();
        self.task.await.unwrap().unwrap();
    }
}

fn config(a: &Cluster, b: &Cluster, extra: &str) -> Config {
    let text = format!(
        "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\nA->B.topics = shared\n\
         replication.factor = 1\noffset.storage.replication.factor = 1\nheartbeats.topic.replication.factor = 1\n\
         checkpoints.topic.replication.factor = 1\noffset-syncs.topic.replication.factor = 1\n\
         refresh.topics.interval.seconds = 1\nkmirror.sharing.session.timeout.ms = 6000\n{extra}",
        a.bootstrap(),
        b.bootstrap()
    );
    mm2::load(
        &Properties::parse(&text, "mm2.properties").unwrap(),
        &[],
        &SystemEnvironment,
    )
    .unwrap()
}

/// Writes a 10-record batch to every partition, round after round, until told to stop.
fn writer(
    a: Arc<KafkaCluster>,
    stop: Arc<AtomicBool>,
    written: Arc<AtomicUsize>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64;
            for p in 0..PARTITIONS {
                let records: Vec<Record> = (0..10)
                    .map(|k| Record {
                        offset: k,
                        timestamp: now,
                        key: Some(Bytes::from(format!("k{}", i + k))),
                        value: Some(Bytes::from(format!("p{p}-{:08}", i + k))),
                        headers: vec![],
                    })
                    .collect();
                let batch = encode_batch(&records, &BatchOptions::default()).unwrap();
                a.produce("shared", p, &batch).await.unwrap();
                written.fetch_add(10, Ordering::Relaxed);
            }
            i += 10;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}

async fn copied(a: &KafkaCluster, b: &KafkaCluster) -> bool {
    let _ = b.refresh_metadata(None).await;
    for p in 0..PARTITIONS {
        let want = a
            .list_offset("shared", p, LATEST, IsolationLevel::ReadUncommitted)
            .await;
        let got = b
            .list_offset("A.shared", p, LATEST, IsolationLevel::ReadUncommitted)
            .await;
        match (want, got) {
            (Ok(w), Ok(g)) if g >= w => {}
            _ => return false,
        }
    }
    true
}

/// Waits until the running engines serve every partition between them, in shares as even as
/// they can be, with exactly one leader. The flow's partitions are `shared`'s and the one of
/// `heartbeats` (MM2 replicates heartbeats topics whatever the topic filter).
async fn balanced(engines: &[&Engine], what: &str) {
    balanced_over(engines, PARTITIONS as i64 + 1, what).await
}

async fn balanced_over(engines: &[&Engine], total: i64, what: &str) {
    let n = engines.len() as i64;
    eventually(90, what, || async {
        let shares: Vec<i64> = engines.iter().map(|e| e.assigned()).collect();
        let leaders = engines.iter().filter(|e| e.leads()).count();
        shares.iter().sum::<i64>() == total
            && shares
                .iter()
                .all(|s| *s == total / n || *s == total / n + 1)
            && leaders == 1
    })
    .await;
    let shares: Vec<i64> = engines.iter().map(|e| e.assigned()).collect();
    eprintln!("{what}: shares {shares:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_share_a_flow_and_hand_partitions_over_without_loss_or_duplicates() {
    kmirror_testkit::init_logging();
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("share-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("share-b", Security::Plaintext).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    // Checkpoints and group listing every second, for the exact checkpoints at the end.
    let config = config(
        &ca,
        &cb,
        "emit.checkpoints.interval.seconds = 1\nrefresh.groups.interval.seconds = 1\n",
    );
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
                name: "shared".into(),
                partitions: PARTITIONS,
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
    let stop_writing = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicUsize::new(0));
    let writing = writer(a.clone(), stop_writing.clone(), written.clone());

    let e1 = Engine::start(&config);
    balanced(&[&e1], "one engine serves every partition").await;
    let e2 = Engine::start(&config);
    balanced(&[&e1, &e2], "two engines").await;
    let e3 = Engine::start(&config);
    balanced(&[&e1, &e2, &e3], "three engines").await;
    // Every engine's status shows the whole group as the leader assigned it.
    let mut shares: Vec<i64> = [&e1, &e2, &e3].iter().map(|e| e.assigned()).collect();
    shares.sort_unstable();
    for (i, e) in [&e1, &e2, &e3].iter().enumerate() {
        eventually(30, &format!("engine {} shows the group", i + 1), || async {
            let status = kmirror_mirror::status::Sampler::default().status(&e.metrics);
            let Some(flow) = status.flows.iter().find(|f| f.flow == "A->B") else {
                return false;
            };
            let mut seen: Vec<i64> = flow.members.iter().map(|m| m.partitions as i64).collect();
            seen.sort_unstable();
            seen == shares && flow.members.iter().filter(|m| m.leader).count() == 1
        })
        .await;
    }
    // Each engine copies: its share of the remote partitions grows (the producer's counters
    // reach the metrics once a second).
    for (i, e) in [&e1, &e2, &e3].iter().enumerate() {
        eventually(60, &format!("engine {} writes batches", i + 1), || async {
            e.metrics.sum("kmirror_produce_batches_total", &[]) > 0.0
        })
        .await;
    }

    // A fourth engine joins mid-stream. Sticky and cooperative: the three others give up only
    // what the newcomer takes, are given nothing, and the partitions that stay put keep
    // flowing; how long each remote partition went without growing is sampled meanwhile.
    let old = [&e1, &e2, &e3];
    let counts = |name: &'static str| -> Vec<i64> { old.iter().map(|e| e.counter(name)).collect() };
    let (added_before, revoked_before) = (
        counts("kmirror_partitions_added_total"),
        counts("kmirror_partitions_revoked_total"),
    );
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (b, sampling) = (
            KafkaCluster::connect(config.flows[0].clients.target_admin.clone())
                .await
                .unwrap(),
            sampling.clone(),
        );
        tokio::spawn(async move {
            // Per partition: the longest time its remote end did not move.
            let mut last: Vec<(i64, std::time::Instant)> =
                vec![(-1, std::time::Instant::now()); PARTITIONS as usize];
            let mut longest = vec![Duration::ZERO; PARTITIONS as usize];
            while sampling.load(Ordering::Relaxed) {
                for p in 0..PARTITIONS {
                    let Ok(end) = b
                        .list_offset("A.shared", p, LATEST, IsolationLevel::ReadUncommitted)
                        .await
                    else {
                        continue;
                    };
                    let (seen, since) = &mut last[p as usize];
                    if end != *seen {
                        *seen = end;
                        *since = std::time::Instant::now();
                    }
                    let i = p as usize;
                    longest[i] = longest[i].max(since.elapsed());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            longest
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let e4 = Engine::start(&config);
    balanced(&[&e1, &e2, &e3, &e4], "four engines").await;
    let more = written.load(Ordering::Relaxed);
    eventually(60, "records written after the fourth joined", || async {
        written.load(Ordering::Relaxed) >= more + 1200
    })
    .await;
    sampling.store(false, Ordering::Relaxed);
    let stalls = sampler.await.unwrap();
    let share = e4.assigned();
    let given: i64 = counts("kmirror_partitions_added_total")
        .iter()
        .zip(&added_before)
        .map(|(a, b)| a - b)
        .sum();
    let gave_up: i64 = counts("kmirror_partitions_revoked_total")
        .iter()
        .zip(&revoked_before)
        .map(|(a, b)| a - b)
        .sum();
    assert_eq!(given, 0, "no partition was moved between the three others");
    assert_eq!(
        gave_up, share,
        "the three others gave up exactly the newcomer's share"
    );
    assert_eq!(e4.counter("kmirror_partitions_added_total"), share);
    let (mut moved, mut stayed): (Vec<Duration>, Vec<Duration>) = (Vec::new(), Vec::new());
    for p in 0..PARTITIONS {
        let stall = stalls[p as usize];
        if e4.copied_into(p) {
            moved.push(stall);
        } else {
            stayed.push(stall);
        }
    }
    moved.sort();
    stayed.sort();
    let ms = |d: &Duration| d.as_millis();
    eprintln!(
        "a fourth engine joined: {} partitions moved (longest time without growth: median {} ms, max {} ms); {} stayed put (median {} ms, max {} ms); the source grows every partition every 50 ms",
        moved.len(),
        moved.get(moved.len() / 2).map_or(0, ms),
        moved.last().map_or(0, ms),
        stayed.len(),
        stayed.get(stayed.len() / 2).map_or(0, ms),
        stayed.last().map_or(0, ms),
    );

    // The first engine (the group's leader so far) leaves: its partitions and the leadership
    // go to the others.
    e1.stop().await;
    balanced(&[&e2, &e3, &e4], "three engines after one left").await;
    let before = written.load(Ordering::Relaxed);
    eventually(60, "records written after it left", || async {
        written.load(Ordering::Relaxed) >= before + 2400
    })
    .await;
    stop_writing.store(true, Ordering::Relaxed);
    writing.await.unwrap();
    eventually(120, "every record copied", || copied(&a, &b)).await;

    // Exact checkpoints for every partition, whichever engine copies it: a group committed in
    // the middle of a batch on each partition is checkpointed to the target offset of its next
    // record, by the leader, from its own runs and from those the others published.
    let mut committed = std::collections::BTreeMap::new();
    for p in 0..PARTITIONS {
        let end = a
            .list_offset("shared", p, LATEST, IsolationLevel::ReadUncommitted)
            .await
            .unwrap();
        let offset = CommittedOffset {
            offset: end - 5,
            leader_epoch: -1,
            metadata: String::new(),
        };
        committed.insert(p, offset);
    }
    a.commit_group_offsets(
        "exact",
        &std::collections::BTreeMap::from([("shared".to_string(), committed.clone())]),
    )
    .await
    .unwrap();
    let source: Vec<Vec<(kmirror_kafka::batch::Codec, Record)>> = {
        let mut v = Vec::new();
        for p in 0..PARTITIONS {
            v.push(read_partition(&a, "shared", p).await);
        }
        v
    };
    let value_at = |v: &[(kmirror_kafka::batch::Codec, Record)], o: i64| {
        v.iter()
            .find(|(_, r)| r.offset == o)
            .and_then(|(_, r)| r.value.clone())
    };
    // What the last look found per partition (shown if the wait fails).
    let seen = std::sync::Mutex::new(String::new());
    let waited = tokio::time::timeout(Duration::from_secs(90), async {
        loop {
            let records = read_partition(&b, "A.checkpoints.internal", 0).await;
            let mut latest = std::collections::BTreeMap::new();
            for (_, r) in records {
                if let Some(c) = r
                    .key
                    .as_deref()
                    .zip(r.value.as_deref())
                    .and_then(|(k, v)| Checkpoint::decode(k, v).ok())
                    .filter(|c| c.group == "exact" && c.topic == "A.shared")
                {
                    latest.insert(c.partition, c);
                }
            }
            let mut exact = 0;
            let mut found = String::new();
            for p in 0..PARTITIONS {
                let Some(c) = latest.get(&p) else {
                    found += &format!(" {p}:none");
                    continue;
                };
                assert_eq!(c.upstream_offset, committed[&p].offset);
                let target = read_partition(&b, "A.shared", p).await;
                let want = value_at(&source[p as usize], c.upstream_offset);
                let position = target
                    .iter()
                    .position(|(_, r)| r.value == want)
                    .map_or(-1, |i| target[i].1.offset);
                if value_at(&target, c.downstream_offset) == want {
                    exact += 1;
                } else {
                    found += &format!(
                        " {p}:{}->{} (exact {position})",
                        c.upstream_offset, c.downstream_offset
                    );
                }
            }
            *seen.lock().unwrap() = found;
            if exact == PARTITIONS {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    let via = |e: &Engine, how: &str| {
        e.metrics
            .sum("kmirror_checkpoint_translations_total", &[("via", how)])
    };
    for (i, e) in [&e2, &e3, &e4].iter().enumerate() {
        eprintln!(
            "engine {}: leader {}, checkpoint translations: runs {}, published runs {}, syncs {}",
            i + 2,
            e.leads(),
            via(e, "runs"),
            via(e, "published_runs"),
            via(e, "syncs")
        );
    }
    assert!(
        waited.is_ok(),
        "an exact checkpoint for every partition within 90 s; not exact:{}",
        seen.lock().unwrap()
    );
    let leader = [&e2, &e3, &e4]
        .into_iter()
        .find(|e| e.leads())
        .expect("a leader");
    assert!(
        via(leader, "published_runs") > 0.0,
        "the others' partitions were translated from their published runs"
    );

    e2.stop().await;
    e3.stop().await;
    e4.stop().await;

    let mut total = 0;
    for p in 0..PARTITIONS {
        let s = read_partition(&a, "shared", p).await;
        let d = read_partition(&b, "A.shared", p).await;
        let values = |v: &[(_, Record)]| -> Vec<Option<Bytes>> {
            v.iter().map(|(_, r)| r.value.clone()).collect()
        };
        assert_eq!(
            values(&d),
            values(&s),
            "shared-{p}: the remote partition holds the source's records, each once, in order"
        );
        total += s.len();
    }
    eprintln!("{total} records copied by four engines sharing the flow, none twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_with_other_flow_settings_is_refused_naming_them() {
    kmirror_testkit::init_logging();
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("refuse-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("refuse-b", Security::Plaintext).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    let first = Engine::start(&config(&ca, &cb, ""));
    // Only the heartbeats topic to copy here.
    balanced_over(&[&first], 1, "the first engine leads").await;
    let odd = Engine::start(&config(&ca, &cb, "A->B.topics.exclude = nothing.*\n"));
    let result = tokio::time::timeout(Duration::from_secs(60), odd.task)
        .await
        .expect("the odd engine stops by itself")
        .unwrap();
    let message = result.expect_err("refused").to_string();
    assert!(
        message.contains("differ") && message.contains("topics"),
        "the error names the setting: {message}"
    );
    assert!(first.leads(), "the first engine still leads");
    first.stop().await;
}
