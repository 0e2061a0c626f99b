//! The per-broker fetcher against real brokers: one request carries many partitions, fetch
//! sessions go incremental (epochs past 1) and fall back to full requests when the broker loses
//! them (a restart), a memory budget takes partitions out of the session until released, a
//! position past the end is reported with the log's bounds, and on a 3-broker cluster partitions
//! follow their leader from one broker's fetcher to another's. Every record arrives once, in
//! order.

use bytes::Bytes;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic};
use kmirror_kafka::fetcher::{FetchEvent, Fetcher, FetcherConfig, Subscription};
use kmirror_kafka::records::{decode_batch, encode_batch, BatchOptions, Record};
use kmirror_testkit::{Cluster, Security};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

fn batch(from: usize, n: usize, value_bytes: usize) -> kmirror_kafka::batch::RawBatch {
    let records: Vec<Record> = (from..from + n)
        .map(|i| Record {
            offset: (i - from) as i64,
            timestamp: kmirror_testkit::recent_ms() + i as i64,
            key: Some(Bytes::from(format!("k{i}"))),
            value: Some(Bytes::from(format!("{i:08}").repeat(value_bytes / 8 + 1))),
            headers: vec![],
        })
        .collect();
    encode_batch(&records, &BatchOptions::default()).unwrap()
}

/// Produces, retrying for 60 s: right after a broker restart or crash the client's cached
/// connection is dead and its metadata may name a leader that is gone.
async fn produce(
    k: &KafkaCluster,
    topic: &str,
    partition: i32,
    b: &kmirror_kafka::batch::RawBatch,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match k.produce(topic, partition, b).await {
            Ok(_) => return,
            Err(e) if tokio::time::Instant::now() < deadline => {
                eprintln!("produce {topic}-{partition}: {e}; retrying");
                let _ = k.refresh_metadata(None).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("produce {topic}-{partition}: {e}"),
        }
    }
}

async fn create(k: &KafkaCluster, topics: &[&str], partitions: i32) {
    let new: Vec<NewTopic> = topics
        .iter()
        .map(|t| NewTopic {
            name: t.to_string(),
            partitions,
            replication_factor: -1,
            configs: vec![],
        })
        .collect();
    for (t, e) in k.create_topics(&new, false).await.unwrap() {
        assert!(e.is_none(), "create {t}: {e:?}");
    }
    // New topics have leaders a moment after they are created.
    for _ in 0..100 {
        let md = k.refresh_metadata(None).await.unwrap();
        if topics.iter().all(|t| {
            md.topics
                .get(*t)
                .is_some_and(|m| m.partitions.iter().all(|p| p.leader >= 0))
        }) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("topics {topics:?} have no leaders");
}

/// Takes events until every subscription reached `want[i]`, each in a task of its own (as the
/// engine's partition tasks consume independently, so one slow partition's buffered data never
/// waits for another's to be read); the offsets seen per subscription, in order. Fails after
/// `secs`.
async fn drain(subs: &mut Vec<Subscription>, want: &[i64], secs: u64) -> Vec<Vec<i64>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    let tasks: Vec<_> = std::mem::take(subs)
        .into_iter()
        .zip(want.iter().copied())
        .enumerate()
        .map(|(i, (mut sub, want))| {
            tokio::spawn(async move {
                let mut seen: Vec<i64> = Vec::new();
                while seen.last().map_or(0, |o| o + 1) < want {
                    let ev = match tokio::time::timeout_at(deadline, sub.recv()).await {
                        Ok(ev) => ev.expect("the fetcher is running"),
                        Err(_) => panic!(
                            "subscription {i}: {} of {want} records after {secs} s",
                            seen.len()
                        ),
                    };
                    match ev {
                        FetchEvent::Data { data, share } => {
                            for b in &data.batches {
                                for r in decode_batch(b).unwrap() {
                                    seen.push(r.offset);
                                }
                            }
                            drop(share);
                        }
                        other => panic!("subscription {i}: {other:?}"),
                    }
                }
                (sub, seen)
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        let (sub, seen) = t.await.unwrap();
        subs.push(sub);
        out.push(seen);
    }
    out
}

fn assert_contiguous(seen: &[Vec<i64>], from: &[i64], what: &str) {
    for (i, s) in seen.iter().enumerate() {
        let want: Vec<i64> = (from[i]..from[i] + s.len() as i64).collect();
        assert_eq!(
            s, &want,
            "{what}: subscription {i} read every offset once, in order"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_session_per_broker_carries_many_partitions_and_survives_a_restart() {
    let c = Cluster::start("fetcher", Security::Plaintext).unwrap();
    let k = Arc::new(
        KafkaCluster::connect(c.client_settings(None))
            .await
            .unwrap(),
    );
    let names: Vec<String> = (0..20).map(|t| format!("many-{t}")).collect();
    let topics: Vec<&str> = names.iter().map(String::as_str).collect();
    create(&k, &topics, 10).await;
    for t in &topics {
        for p in 0..10 {
            produce(&k, t, p, &batch(0, 5, 100)).await;
        }
    }
    let fetcher = Fetcher::start(k.clone(), FetcherConfig::default());
    let mut subs: Vec<Subscription> = Vec::new();
    for t in &topics {
        for p in 0..10 {
            subs.push(fetcher.subscribe(t, p, 0).unwrap());
        }
    }
    let seen = drain(&mut subs, &vec![5; 200], 60).await;
    assert_contiguous(&seen, &vec![0; 200], "backlog");
    let s = fetcher.stats();
    eprintln!("200 partitions, 5 records each: {s:?}");
    assert!(
        s.max_partitions_per_request >= 100,
        "one request carries many partitions: {s:?}"
    );
    assert!(s.requests < 50, "not one request per partition: {s:?}");

    // Idle partitions cost a long poll; a record on one of them arrives at once, and the
    // requests since the first are incremental.
    let i = 7 * 10 + 3;
    for n in 0..3 {
        produce(&k, "many-7", 3, &batch(5 + n, 1, 100)).await;
        let mut one = vec![subs.remove(i)];
        let seen = drain(&mut one, &[6 + n as i64], 20).await;
        subs.insert(i, one.pop().unwrap());
        assert_eq!(seen[0], vec![5 + n as i64]);
    }
    let s = fetcher.stats();
    assert!(s.session.incremental_requests > 0, "{s:?}");
    assert!(s.session.max_epoch > 1, "{s:?}");

    // A broker restart ends the session: a full request opens another, and nothing is lost or
    // read twice.
    let before = s.session.full_requests;
    c.restart().unwrap();
    for p in 0..10 {
        produce(&k, "many-0", p, &batch(5, 3, 100)).await;
    }
    let mut first: Vec<Subscription> = subs.drain(0..10).collect();
    let seen = drain(&mut first, &[8; 10], 90).await;
    assert_contiguous(&seen, &[5; 10], "after the restart");
    subs.splice(0..0, first);
    let s = fetcher.stats();
    eprintln!("after a broker restart: {s:?}");
    assert!(s.session.full_requests > before, "a new session: {s:?}");
    produce(&k, "many-1", 0, &batch(5, 1, 100)).await;
    let mut one = vec![subs.remove(10)];
    assert_eq!(drain(&mut one, &[6], 20).await[0], vec![5]);
    assert!(
        fetcher.stats().session.incremental_requests > s.session.incremental_requests,
        "incremental again in the new session"
    );

    // A position past the end is reported with the log's bounds, and a seek resumes.
    let mut sub = vec![fetcher.subscribe("many-2", 0, 100).unwrap()];
    match tokio::time::timeout(Duration::from_secs(30), sub[0].recv()).await {
        Ok(Some(FetchEvent::OutOfRange {
            requested,
            log_start,
            log_end,
        })) => assert_eq!((requested, log_start, log_end), (100, 0, 5)),
        other => panic!("expected out of range, got {other:?}"),
    }
    sub[0].seek(2);
    let seen = drain(&mut sub, &[5], 20).await;
    // Whole batches: the one holding offset 2 starts at 0 (the consumer skips what lies before
    // its position, as Java's does).
    assert_eq!(seen[0], vec![0, 1, 2, 3, 4]);
    drop((subs, one, sub));
    fetcher.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_consumers_and_a_full_buffer_hold_partitions_back() {
    let c = Cluster::start("fetcher-budget", Security::Plaintext).unwrap();
    let k = Arc::new(
        KafkaCluster::connect(c.client_settings(None))
            .await
            .unwrap(),
    );
    create(&k, &["big"], 8).await;
    // Batches of about 5 KB, well below the 16 KiB partition maximum used here: a batch larger
    // than that comes whole only for the first partition of an answer (KIP-74).
    for p in 0..8 {
        for b in 0..16 {
            produce(&k, "big", p, &batch(b * 5, 5, 1000)).await;
        }
    }

    // A consumer that does not take its data: its partition leaves the session while the
    // other partition is read to its end, then comes back where it stopped.
    let config = FetcherConfig {
        partition_max_bytes: 16 << 10,
        ..FetcherConfig::default()
    };
    let fetcher = Fetcher::start(k.clone(), config);
    let mut read = vec![fetcher.subscribe("big", 0, 0).unwrap()];
    let mut idle = vec![fetcher.subscribe("big", 1, 0).unwrap()];
    let seen = drain(&mut read, &[80], 60).await;
    assert_contiguous(&seen, &[0], "the partition read");
    let s = fetcher.stats();
    assert!(
        s.session.forgotten > 0,
        "the unread partition left the session: {s:?}"
    );
    let seen = drain(&mut idle, &[80], 60).await;
    assert_contiguous(&seen, &[0], "the partition read later");
    drop((read, idle));
    fetcher.shutdown().await;

    // A 64 KiB buffer: with nothing released the fetcher stops asking near the limit.
    let config = FetcherConfig {
        buffer_bytes: 64 << 10,
        partition_max_bytes: 16 << 10,
        ..FetcherConfig::default()
    };
    let fetcher = Fetcher::start(k.clone(), config);
    let mut subs: Vec<Subscription> = (0..8)
        .map(|p| fetcher.subscribe("big", p, 0).unwrap())
        .collect();
    let mut peak = 0;
    for _ in 0..30 {
        peak = peak.max(fetcher.buffered());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let requests = fetcher.stats().requests;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        fetcher.stats().requests,
        requests,
        "no requests while the buffer is full"
    );
    // One answer may pass the limit by a batch (KIP-74: the first batch always comes whole).
    assert!(
        peak > 0 && peak <= (64 << 10) + 25_000,
        "buffered {peak} B with a 64 KiB buffer"
    );
    let seen = drain(&mut subs, &[80; 8], 60).await;
    assert_contiguous(&seen, &[0; 8], "everything once released");
    assert_eq!(fetcher.buffered(), 0, "everything released");
    drop(subs);
    fetcher.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_follow_their_leader_between_brokers() {
    let c = Cluster::start_nodes("fetcher-trio", Security::Plaintext, 3, &[]).unwrap();
    let k = Arc::new(
        KafkaCluster::connect(c.client_settings(None))
            .await
            .unwrap(),
    );
    create(&k, &["moving"], 6).await;
    for p in 0..6 {
        produce(&k, "moving", p, &batch(0, 10, 100)).await;
    }
    let fetcher = Fetcher::start(k.clone(), FetcherConfig::default());
    let mut subs: Vec<Subscription> = (0..6)
        .map(|p| fetcher.subscribe("moving", p, 0).unwrap())
        .collect();
    let seen = drain(&mut subs, &[10; 6], 60).await;
    assert_contiguous(&seen, &[0; 6], "before the moves");
    let leaders: BTreeMap<i32, i32> = (0..6)
        .map(|p| (p, c.describe_partition("moving", p).unwrap().0))
        .collect();

    // Move partition 0's leader elsewhere, and crash the broker leading partition 1.
    let to = (1..=3).find(|b| *b != leaders[&0]).unwrap();
    c.move_leader("moving", 0, to).unwrap();
    let crashed = leaders[&1];
    c.kill_node(crashed as u16).unwrap();
    for p in 0..6 {
        produce(&k, "moving", p, &batch(10, 5, 100)).await;
    }
    let seen = drain(&mut subs, &[15; 6], 120).await;
    assert_contiguous(&seen, &[10; 6], "after the leader moves");
    let s = fetcher.stats();
    eprintln!("leader moved and a broker killed: {s:?}");
    assert!(s.rerouted >= 2, "partitions changed fetchers: {s:?}");
    c.start_node(crashed as u16).unwrap();
    drop(subs);
    fetcher.shutdown().await;
}

/// Idle partitions cost nothing and wake at once: with every partition at its end, the broker
/// holds each request for `fetch.max.wait.ms` (so a second of idling takes a handful of
/// requests, not one per partition per tick), and a record for one of them is delivered as soon
/// as it is written, not when the wait ends. (It replaces the engine's former idle watch.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_partitions_wait_on_the_broker_and_wake_on_a_record() {
    let c = Cluster::start("fetcher-idle", Security::Plaintext).unwrap();
    let k = Arc::new(
        KafkaCluster::connect(c.client_settings(None))
            .await
            .unwrap(),
    );
    create(&k, &["quiet"], 20).await;
    let fetcher = Fetcher::start(
        k.clone(),
        FetcherConfig {
            max_wait: Duration::from_secs(2),
            ..FetcherConfig::default()
        },
    );
    let mut subs: Vec<Subscription> = (0..20)
        .map(|p| fetcher.subscribe("quiet", p, 0).unwrap())
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = fetcher.stats().requests;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle_requests = fetcher.stats().requests - before;
    assert!(
        idle_requests <= 3,
        "3 s of 20 idle partitions took {idle_requests} requests; the broker's 2 s wait should hold each"
    );
    // Written while a long poll waits: delivered well before the poll's 2 s are over.
    let t = tokio::time::Instant::now();
    produce(&k, "quiet", 13, &batch(0, 3, 10)).await;
    let ev = tokio::time::timeout(Duration::from_secs(10), subs[13].recv())
        .await
        .expect("the record arrives")
        .expect("the fetcher is running");
    let waited = t.elapsed();
    match ev {
        FetchEvent::Data { data, .. } => assert_eq!(data.batches[0].record_count(), 3),
        other => panic!("{other:?}"),
    }
    assert!(
        waited < Duration::from_millis(1500),
        "the long poll answered when the record was written, not at its end: {waited:?}"
    );
    eprintln!("idle: {idle_requests} requests in 3 s for 20 partitions; a record arrived after {waited:?}");
    subs.clear();
    fetcher.shutdown().await;
}
