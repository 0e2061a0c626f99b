//! Switching between MirrorMaker 2 and kmirror without re-copying: real MM2 (the harness's jars)
//! replicates part of a topic and is stopped; kmirror continues from the position MM2 stored in
//! `mm2-offsets.A.internal` with no gap and no record copied twice; then MM2 continues after
//! kmirror the same way. Both read the same mm2.properties. kmirror's failover tooling reads the
//! checkpoints MM2 wrote.
//!
//! Only what kmirror does is asserted: that it resumes exactly at the positions MM2
//! stored, whatever MM2 managed to copy and store in its time; that it stores its own positions
//! where MM2 finds them; and that MM2, if it copies anything after kmirror, starts at kmirror's
//! next record. How long MM2 took, and whether its own copy was exact, are printed figures: a
//! slow MM2 on a loaded machine is not a kmirror failure. The bytes of a stored position are
//! proven equal to Connect's without MM2 running, in `java_interop.rs`.

use kmirror_kafka::admin::CommittedOffset;
use kmirror_kafka::cluster::{KafkaCluster, LATEST};
use kmirror_kafka::IsolationLevel;
use kmirror_mirror::config::mm2;
use kmirror_mirror::config::model::FlowConfig;
use kmirror_mirror::config::properties::Properties;
use kmirror_mirror::config::providers::SystemEnvironment;
use kmirror_mirror::engine::{self, Shutdown};
use kmirror_mirror::failover;
use kmirror_mirror::metrics::Metrics;
use kmirror_testkit::{read_committed, read_partition, Cluster, Mm2, Security};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 2;
/// How long MM2 gets for each step before the test moves on and reports it as a figure.
const MM2_BOUND: Duration = Duration::from_secs(120);

type Kv = (Option<bytes::Bytes>, Option<bytes::Bytes>);

fn produce(c: &Cluster, from: usize, to: usize) {
    let input: String = (from..to).map(|i| format!("k{i}:ledger-{i}\n")).collect();
    let cfg = c.client_config(None);
    c.tool(
        "console-producer",
        &[
            "--bootstrap-server",
            c.bootstrap(),
            "--producer.config",
            cfg.to_str().unwrap(),
            "--topic",
            "ledger",
            "--property",
            "parse.key=true",
            "--property",
            "key.separator=:",
        ],
        Some(input.as_bytes()),
    )
    .unwrap();
}

/// Every record of each partition of `topic` (none for a topic that does not exist yet).
async fn records(k: &KafkaCluster, topic: &str) -> BTreeMap<i32, Vec<Kv>> {
    records_as(k, topic, false).await
}

/// The records of each partition of `topic` a read_committed (or, if not `committed`,
/// read_uncommitted) consumer sees.
async fn records_as(k: &KafkaCluster, topic: &str, committed: bool) -> BTreeMap<i32, Vec<Kv>> {
    let exists = k
        .refresh_metadata(None)
        .await
        .is_ok_and(|m| m.topics.contains_key(topic));
    let mut out = BTreeMap::new();
    for p in 0..PARTITIONS {
        let rs = match (exists, committed) {
            (false, _) => Vec::new(),
            (true, false) => read_partition(k, topic, p)
                .await
                .into_iter()
                .map(|(_, r)| (r.key, r.value))
                .collect(),
            (true, true) => read_committed(k, topic, p)
                .await
                .into_iter()
                .map(|r| (r.key, r.value))
                .collect(),
        };
        out.insert(p, rs);
    }
    out
}

async fn end_offsets(k: &KafkaCluster, topic: &str) -> BTreeMap<i32, i64> {
    let _ = k.refresh_metadata(None).await;
    let mut out = BTreeMap::new();
    for p in 0..PARTITIONS {
        let end = k
            .list_offset(topic, p, LATEST, IsolationLevel::ReadCommitted)
            .await
            .unwrap_or(0);
        out.insert(p, end);
    }
    out
}

/// The next source offset to copy per partition of `ledger`, as stored in the positions topic
/// (read the way kmirror reads it at start; 0 where nothing is stored).
async fn stored_next(flow: &FlowConfig, b: &KafkaCluster) -> BTreeMap<i32, i64> {
    let _ = b.refresh_metadata(None).await;
    let stored = engine::load_positions(b, &flow.internal.positions_topic, flow.id.source.as_str())
        .await
        .unwrap_or_default();
    (0..PARTITIONS)
        .map(|p| {
            let next = stored
                .positions
                .get(&("ledger".to_string(), p))
                .map_or(0, |o| o + 1);
            (p, next)
        })
        .collect()
}

/// Polls `done` every 500 ms for up to `bound`; the seconds it took, or `None`.
async fn within<F, Fut>(bound: Duration, mut done: F) -> Option<f64>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let t0 = Instant::now();
    loop {
        if done().await {
            return Some(t0.elapsed().as_secs_f64());
        }
        if t0.elapsed() >= bound {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn secs(s: Option<f64>) -> String {
    s.map_or(format!("not within {} s", MM2_BOUND.as_secs()), |s| {
        format!("{s:.1} s")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mm2_and_kmirror_take_over_from_each_other() {
    let _alone = crate::ALONE.lock().await;
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("take-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("take-b", Security::Plaintext).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    ca.create_topic("ledger", PARTITIONS as u32).unwrap();
    produce(&ca, 0, 1000);
    // One file for both. The storage and flush keys are Connect worker settings MM2 needs here
    // (single-broker clusters, offsets flushed every second); kmirror ignores them.
    let text = format!(
        "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\nA->B.topics = ledger\n\
         B->A.enabled = false\nemit.heartbeats.enabled = false\nemit.checkpoints.interval.seconds = 1\n\
         sync.topic.acls.enabled = false\n\
         replication.factor = 1\noffset.storage.replication.factor = 1\nconfig.storage.replication.factor = 1\n\
         status.storage.replication.factor = 1\ncheckpoints.topic.replication.factor = 1\n\
         heartbeats.topic.replication.factor = 1\noffset-syncs.topic.replication.factor = 1\n\
         offset.flush.interval.ms = 1000\n",
        ca.bootstrap(),
        cb.bootstrap()
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mm2.properties");
    std::fs::write(&path, &text).unwrap();
    let config = mm2::load(
        &Properties::parse(&text, "mm2.properties").unwrap(),
        &[],
        &SystemEnvironment,
    )
    .unwrap();
    let a = KafkaCluster::connect(ca.client_settings(None))
        .await
        .unwrap();
    let b = KafkaCluster::connect(cb.client_settings(None))
        .await
        .unwrap();

    // A consumer group on A that read everything so far.
    let mut ends = BTreeMap::new();
    for p in 0..PARTITIONS {
        let end = a
            .list_offset("ledger", p, LATEST, IsolationLevel::ReadCommitted)
            .await
            .unwrap();
        ends.insert(
            p,
            CommittedOffset {
                offset: end,
                leader_epoch: -1,
                metadata: String::new(),
            },
        );
    }
    a.commit_group_offsets("ledger-app", &[("ledger".to_string(), ends.clone())].into())
        .await
        .unwrap();

    let flow = config
        .flows
        .iter()
        .find(|f| f.id.to_string() == "A->B")
        .unwrap();

    // 1. MM2 copies the first 1000 records, checkpoints the group, stores its positions and
    // stops. Each step gets MM2_BOUND; what MM2 did not do in time is reported, and kmirror
    // continues from whatever MM2 left.
    let mm2 = Mm2::start("mm2-first", &path).unwrap();
    let copy_secs = within(MM2_BOUND, || async {
        let (want, got) = (
            end_offsets(&a, "ledger").await,
            end_offsets(&b, "A.ledger").await,
        );
        want.iter().all(|(p, e)| got[p] >= *e)
    })
    .await;
    let checkpoint_secs = within(MM2_BOUND, || async {
        failover::translate(flow, &b, "ledger-app")
            .await
            .is_ok_and(|rows| rows.len() == PARTITIONS as usize)
    })
    .await;
    let want: BTreeMap<i32, i64> = ends.iter().map(|(p, c)| (*p, c.offset)).collect();
    // Connect commits its tasks' positions as they stop (MM2 flushes every 60 s otherwise).
    mm2.stop();
    let by_mm2 = records(&b, "A.ledger").await;
    let next = stored_next(flow, &b).await;
    let source = records(&a, "ledger").await;
    let mm2_exact = (0..PARTITIONS).all(|p| by_mm2[&p] == source[&p]);
    // kmirror's failover tooling reads MM2's checkpoints, if MM2 wrote them in time.
    let rows = failover::translate(flow, &b, "ledger-app")
        .await
        .unwrap_or_default();
    for r in &rows {
        assert_eq!(r.topic, "A.ledger", "{r:?}");
        assert!((0..PARTITIONS).contains(&r.partition), "{r:?}");
    }
    let mm2_redelivered: i64 = rows
        .iter()
        .map(|r| r.upstream_offset - r.translated_offset)
        .sum();
    eprintln!(
        "MM2 alone: copied 1000 records in {}, checkpointed the group in {}; copy exact: \
         {mm2_exact}; stored next offsets after its stop {next:?} of {want:?}; its checkpoints \
         make the group read {mm2_redelivered} records again",
        secs(copy_secs),
        secs(checkpoint_secs)
    );

    // 2. kmirror continues from MM2's positions: it copies exactly the records from each
    // stored position on, after what MM2 wrote, and nothing else.
    produce(&ca, 1000, 1500);
    let source_end = end_offsets(&a, "ledger").await;
    let expected: i64 = (0..PARTITIONS).map(|p| source_end[&p] - next[&p]).sum();
    let shutdown = Shutdown::default();
    let metrics = Arc::new(Metrics::new());
    let task = {
        let (c, s, m) = (config.clone(), shutdown.clone(), metrics.clone());
        tokio::spawn(async move { engine::run(&c, s, m).await })
    };
    let t0 = Instant::now();
    loop {
        let got = end_offsets(&b, "A.ledger").await;
        let copied =
            (0..PARTITIONS).all(|p| got[&p] >= by_mm2[&p].len() as i64 + source_end[&p] - next[&p]);
        if copied && metrics.sum("kmirror_record_count_total", &[]) >= expected as f64 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "kmirror did not catch up from MM2's positions {next:?}: B has {got:?}\n{}",
            metrics.render()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Where the group's next record (offset `want` on A) landed on B: after MM2's copy,
    // shifted by what kmirror copied before it.
    let landed: BTreeMap<i32, i64> = (0..PARTITIONS)
        .map(|p| {
            let at = by_mm2[&p].len() as i64 + want[&p] - next[&p];
            (p, at)
        })
        .collect();
    // kmirror's first sync of each partition is at MM2's stored position, so when that is the
    // group's position the translation is exact; otherwise it lies between syncs and may only
    // be conservative (never past the record).
    let exact = next == want;
    let t0 = Instant::now();
    let translated = loop {
        let translated: BTreeMap<i32, i64> = failover::translate(flow, &b, "ledger-app")
            .await
            .unwrap_or_default()
            .into_iter()
            .map(|r| (r.partition, r.translated_offset))
            .collect();
        let done = if exact {
            translated == landed
        } else {
            translated.len() == landed.len() && translated.iter().all(|(p, t)| *t <= landed[p])
        };
        if done {
            break translated;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "kmirror's checkpoints translate the group to {translated:?}, expected {landed:?} \
             (exactly: {exact}; MM2 stored {next:?})"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    shutdown.trigger();
    task.await.unwrap().unwrap();
    assert_eq!(
        metrics.sum("kmirror_record_count_total", &[]),
        expected as f64,
        "kmirror copied only what MM2 had not stored as copied"
    );
    let source = records(&a, "ledger").await;
    let after_kmirror = records(&b, "A.ledger").await;
    for p in 0..PARTITIONS {
        let mut want_p = by_mm2[&p].clone();
        want_p.extend_from_slice(&source[&p][next[&p] as usize..]);
        assert_eq!(
            after_kmirror[&p].len(),
            want_p.len(),
            "kmirror after MM2: ledger-{p} record count"
        );
        assert!(
            after_kmirror[&p] == want_p,
            "kmirror after MM2: ledger-{p} is not MM2's copy followed by ledger from offset {}",
            next[&p]
        );
    }
    // What MM2 reads when it starts: kmirror's positions, at the end of what it copied.
    assert_eq!(
        stored_next(flow, &b).await,
        source_end,
        "kmirror's stored positions"
    );
    let kmirror_redelivered: i64 = (0..PARTITIONS).map(|p| landed[&p] - translated[&p]).sum();
    eprintln!(
        "group at the end of ledger: MM2's checkpoints re-deliver {mm2_redelivered} records, \
         kmirror's {kmirror_redelivered}"
    );

    // 3. MM2 continues after kmirror from kmirror's positions: the first record it copies is
    // the next one, not one kmirror copied already.
    produce(&ca, 1500, 1800);
    let new_end = end_offsets(&a, "ledger").await;
    let mm2 = Mm2::start("mm2-second", &path).unwrap();
    let copy_secs = within(MM2_BOUND, || async {
        let got = end_offsets(&b, "A.ledger").await;
        (0..PARTITIONS)
            .all(|p| got[&p] - after_kmirror[&p].len() as i64 >= new_end[&p] - source_end[&p])
    })
    .await;
    mm2.stop();
    let source = records(&a, "ledger").await;
    let after_mm2 = records(&b, "A.ledger").await;
    let mut exact = true;
    let mut copied = 0;
    for p in 0..PARTITIONS {
        let added = &after_mm2[&p][after_kmirror[&p].len()..];
        let fresh = &source[&p][source_end[&p] as usize..];
        if let Some(first) = added.first() {
            assert!(
                Some(first) == fresh.first(),
                "MM2 after kmirror: ledger-{p} resumed at another record than offset {} \
                 (kmirror's stored position was not what MM2 read)",
                source_end[&p]
            );
        }
        copied += added.len();
        exact &= added == fresh;
    }
    eprintln!(
        "MM2 after kmirror: copied {copied} of 300 new records in {}; exact continuation: {exact}",
        secs(copy_secs)
    );
}

/// Both exactly-once: kmirror copies and stops; MirrorMaker 2, with the same file
/// and its exactly-once switch on, continues from the positions kmirror committed and is killed
/// with SIGKILL, perhaps with transactions open; kmirror starts again, fences the ids (MM2's
/// task ids are kmirror's slot ids), and continues from what MM2 committed. A read_committed
/// reader of the target sees MM2's committed copy followed by the source from MM2's committed
/// positions on: asserted, as that is kmirror's part. Whether MM2's own copy was exact, how long
/// it took and what it left open are printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mm2_and_kmirror_take_over_from_each_other_exactly_once() {
    let _alone = crate::ALONE.lock().await;
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("eos-take-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("eos-take-b", Security::Plaintext).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    ca.create_topic("ledger", PARTITIONS as u32).unwrap();
    produce(&ca, 0, 1000);
    // MM2's exactly-once needs its internal REST server in dedicated mode (KIP-710), on a port
    // of its own; kmirror ignores both keys. tasks.max = 2: MM2's task ids are kmirror's slots.
    // Topic refreshes off: kmirror (sharing the flow, as by default) must still be assigned its
    // slots (a shared flow with refreshes off used to wait without serving its group).
    let rest = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let text = format!(
        "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\nA->B.topics = ledger\n\
         B->A.enabled = false\nemit.heartbeats.enabled = false\nemit.checkpoints.enabled = false\n\
         sync.topic.acls.enabled = false\n\
         replication.factor = 1\noffset.storage.replication.factor = 1\nconfig.storage.replication.factor = 1\n\
         status.storage.replication.factor = 1\ncheckpoints.topic.replication.factor = 1\n\
         heartbeats.topic.replication.factor = 1\noffset-syncs.topic.replication.factor = 1\n\
         offset.flush.interval.ms = 1000\nB.exactly.once.source.support = enabled\ntasks.max = 2\n\
         dedicated.mode.enable.internal.rest = true\nlisteners = http://127.0.0.1:{rest}\n\
         refresh.topics.enabled = false\n",
        ca.bootstrap(),
        cb.bootstrap()
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mm2.properties");
    std::fs::write(&path, &text).unwrap();
    let config = mm2::load(
        &Properties::parse(&text, "mm2.properties").unwrap(),
        &[],
        &SystemEnvironment,
    )
    .unwrap();
    let flow = config
        .flows
        .iter()
        .find(|f| f.id.to_string() == "A->B")
        .unwrap();
    assert_eq!(flow.transactions.slots, 2);
    let a = KafkaCluster::connect(ca.client_settings(None))
        .await
        .unwrap();
    let b = KafkaCluster::connect(cb.client_settings(None))
        .await
        .unwrap();
    let kmirror = |what: &'static str| {
        let (c, a, b) = (config.clone(), &a, &b);
        async move {
            let source_end = end_offsets(a, "ledger").await;
            let shutdown = Shutdown::default();
            let task = {
                let (c, s) = (c.clone(), shutdown.clone());
                tokio::spawn(async move { engine::run(&c, s, Arc::new(Metrics::new())).await })
            };
            let secs = within(Duration::from_secs(120), || async {
                stored_next(&c.flows[0], b).await == source_end
            })
            .await;
            shutdown.trigger();
            task.await.unwrap().unwrap();
            assert!(secs.is_some(), "{what}: kmirror did not commit positions at the source's end {source_end:?} within 120 s");
            // The commit is decided before its markers are written: read once every
            // transaction of the remote topic is resolved (last stable offset = end).
            let resolved = within(Duration::from_secs(15), || async {
                let _ = b.refresh_metadata(None).await;
                let mut all = true;
                for p in 0..PARTITIONS {
                    let stable = b
                        .list_offset("A.ledger", p, LATEST, IsolationLevel::ReadCommitted)
                        .await;
                    let end = b
                        .list_offset("A.ledger", p, LATEST, IsolationLevel::ReadUncommitted)
                        .await;
                    all &= matches!((stable, end), (Ok(s), Ok(e)) if s == e);
                }
                all
            })
            .await;
            assert!(
                resolved.is_some(),
                "{what}: transactions of A.ledger still open after kmirror stopped"
            );
        }
    };

    // 1. kmirror copies the first 1000 records in transactions and stops.
    kmirror("first").await;
    let source = records(&a, "ledger").await;
    let first = records_as(&b, "A.ledger", true).await;
    assert_eq!(first, source, "kmirror's exactly-once copy");

    // 2. MM2 continues from kmirror's committed positions and is killed.
    produce(&ca, 1000, 1500);
    let mid = end_offsets(&a, "ledger").await;
    let mm2 = Mm2::start("mm2-eos", &path).unwrap();
    let copy_secs = within(MM2_BOUND, || async {
        let got = records_as(&b, "A.ledger", true).await;
        (0..PARTITIONS).all(|p| got[&p].len() as i64 >= mid[&p])
    })
    .await;
    // The test means something only if MM2's tasks wrote with kmirror's transactional ids.
    let log = mm2.log();
    assert!(
        log.contains(
            "transactionalId=A-mm2-MirrorSourceConnector-0] Instantiated a transactional producer"
        ),
        "MM2 did not run its tasks exactly-once: no transactional id in its log"
    );
    // Killed while records stream in, so that it likely has transactions open.
    for i in 0..100 {
        let n = 1500 + 3 * i;
        let records: Vec<kmirror_kafka::records::Record> = (0..3)
            .map(|j| kmirror_kafka::records::Record {
                offset: j,
                timestamp: 0,
                key: Some(format!("k{}", n + j).into()),
                value: Some(format!("ledger-{}", n + j).into()),
                headers: vec![],
            })
            .collect();
        let batch = kmirror_kafka::records::encode_batch(
            &records,
            &kmirror_kafka::records::BatchOptions::default(),
        )
        .unwrap();
        a.produce("ledger", (i % 2) as i32, &batch).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        if i == 60 {
            mm2.kill_9();
        }
    }
    drop(mm2);
    // Its last commits' markers are written by the coordinator after the commit is decided,
    // on their own; nothing new is committed once MM2 is dead.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let by_mm2 = records_as(&b, "A.ledger", true).await;
    let next = stored_next(flow, &b).await;
    let source = records(&a, "ledger").await;
    for p in 0..PARTITIONS {
        // If MM2 copied anything, it started at kmirror's next record.
        if let Some(first_new) = by_mm2[&p].get(first[&p].len()) {
            assert!(
                Some(first_new) == source[&p].get(first[&p].len()),
                "MM2 after kmirror: ledger-{p} did not resume at kmirror's committed position"
            );
        }
    }
    let mm2_exact = (0..PARTITIONS)
        .all(|p| by_mm2[&p].as_slice() == &source[&p][..by_mm2[&p].len().min(source[&p].len())]);
    let raw = records(&b, "A.ledger").await;
    let open: usize = (0..PARTITIONS)
        .map(|p| raw[&p].len() - by_mm2[&p].len())
        .sum();
    eprintln!(
        "MM2 exactly-once after kmirror: copied 500 records in {}, then killed with SIGKILL while records streamed in; its committed copy is exact: \
         {mm2_exact}; committed next offsets {next:?}; {open} records in the log beyond what \
         read_committed sees (open or aborted transactions) when it was killed",
        secs(copy_secs)
    );

    // 3. kmirror again: it fences MM2's task ids and continues from what MM2 committed.
    kmirror("after MM2").await;
    let after = records_as(&b, "A.ledger", true).await;
    for p in 0..PARTITIONS {
        let committed_by_mm2 = by_mm2[&p].len();
        let mut want = by_mm2[&p].clone();
        want.extend_from_slice(&source[&p][next[&p] as usize..]);
        assert_eq!(
            after[&p].len(),
            want.len(),
            "kmirror after MM2: ledger-{p} read_committed count (MM2 committed {committed_by_mm2}, its positions say {})",
            next[&p]
        );
        assert!(
            after[&p] == want,
            "kmirror after MM2: ledger-{p} is not MM2's committed copy followed by ledger from offset {}",
            next[&p]
        );
    }
}
