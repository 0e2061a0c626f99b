//! Micro-benchmark of kmirror's Kafka client against a local broker, next to Java's
//! kafka-producer-perf-test and kafka-consumer-perf-test on the same broker in the same run.
//!
//! Run: `scripts/bench-client.sh` (or `cargo run --release -p kmirror-kafka --example client_bench
//! -- [records] [record_bytes]`). Prints records/s and MB/s for produce and fetch.

use bytes::Bytes;
use kmirror_kafka::batch::Codec;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic};
use kmirror_kafka::producer::IdempotentProducer;
use kmirror_kafka::records::{decode_batch, encode_batch, BatchOptions, Record};
use kmirror_kafka::IsolationLevel;
use kmirror_testkit::{Cluster, Security};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 4;
const RECORDS_PER_BATCH: usize = 128;

fn mb(bytes: f64) -> f64 {
    bytes / 1_048_576.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let total: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let size: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1024);
    let c = Cluster::start("bench", Security::Plaintext).expect("start a broker");
    let settings = c.client_settings(None);
    let k = Arc::new(KafkaCluster::connect(settings).await.unwrap());
    let topics: Vec<NewTopic> = ["bench-rust", "bench-java"]
        .iter()
        .map(|t| NewTopic {
            name: t.to_string(),
            partitions: PARTITIONS,
            replication_factor: 1,
            configs: vec![],
        })
        .collect();
    k.create_topics(&topics, false).await.unwrap();
    println!("kmirror client micro-benchmark: {total} records of {size} bytes, {PARTITIONS} partitions, acks=all, no compression, one local broker");

    // --- kmirror produce: idempotent, 5 in flight per partition, 128-record batches.
    let value = Bytes::from(vec![b'x'; size]);
    let producer = IdempotentProducer::new(k.clone()).await.unwrap();
    let per_partition = total / PARTITIONS as usize;
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..PARTITIONS {
        let producer = producer.clone();
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            let mut lane = producer.lane("bench-rust", p);
            let mut sent = 0usize;
            let mut tag = 0;
            while sent < per_partition {
                let n = RECORDS_PER_BATCH.min(per_partition - sent);
                let records: Vec<Record> = (0..n)
                    .map(|i| Record {
                        offset: i as i64,
                        timestamp: 1_700_000_000_000,
                        key: None,
                        value: Some(value.clone()),
                        headers: vec![],
                    })
                    .collect();
                let batch = encode_batch(
                    &records,
                    &BatchOptions {
                        codec: Codec::None,
                        ..BatchOptions::default()
                    },
                )
                .unwrap();
                lane.send(tag, batch).await.unwrap();
                tag += 1;
                sent += n;
            }
            lane.flush().await.unwrap();
            sent
        }));
    }
    let mut produced = 0;
    for t in tasks {
        produced += t.await.unwrap();
    }
    let secs = t0.elapsed().as_secs_f64();
    let produce_rate = produced as f64 / secs;
    println!(
        "kmirror produce : {:>10.0} records/s {:>8.1} MB/s ({produced} records in {secs:.2} s)",
        produce_rate,
        mb(produced as f64 * size as f64) / secs
    );

    // --- kmirror fetch: raw batches decoded into records, partitions in parallel.
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..PARTITIONS {
        let k = k.clone();
        tasks.push(tokio::spawn(async move {
            let mut offset = 0;
            let mut records = 0usize;
            let mut bytes = 0usize;
            loop {
                let f = k
                    .fetch(
                        "bench-rust",
                        p,
                        offset,
                        4 << 20,
                        Duration::from_millis(100),
                        IsolationLevel::ReadCommitted,
                    )
                    .await
                    .unwrap();
                for b in &f.batches {
                    let rs = decode_batch(b).unwrap();
                    records += rs.len();
                    bytes += rs
                        .iter()
                        .map(|r| r.value.as_ref().map_or(0, |v| v.len()))
                        .sum::<usize>();
                    offset = b.last_offset() + 1;
                }
                if offset >= f.high_watermark {
                    return (records, bytes);
                }
            }
        }));
    }
    let (mut fetched, mut bytes) = (0, 0);
    for t in tasks {
        let (r, b) = t.await.unwrap();
        fetched += r;
        bytes += b;
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "kmirror fetch   : {:>10.0} records/s {:>8.1} MB/s ({fetched} records in {secs:.2} s)",
        fetched as f64 / secs,
        mb(bytes as f64) / secs
    );
    assert_eq!(fetched, produced);

    java_side(&c, total, size);
}

/// Java's producer-perf-test and consumer-perf-test, same broker, same sizes.
fn java_side(c: &Cluster, total: usize, size: usize) {
    let out = c
        .tool(
            "producer-perf-test",
            &[
                "--topic",
                "bench-java",
                "--num-records",
                &total.to_string(),
                "--record-size",
                &size.to_string(),
                "--throughput",
                "-1",
                "--producer-props",
                &format!("bootstrap.servers={}", c.bootstrap()),
                "acks=all",
                "enable.idempotence=true",
                "linger.ms=5",
                &format!("batch.size={}", RECORDS_PER_BATCH * (size + 20)),
            ],
            None,
        )
        .expect("producer-perf-test");
    let summary = out
        .lines()
        .rfind(|l| l.contains("records sent"))
        .unwrap_or_default();
    println!("java produce    : {summary}");
    let out = c
        .tool(
            "consumer-perf-test",
            &[
                "--bootstrap-server",
                c.bootstrap(),
                "--topic",
                "bench-java",
                "--messages",
                &total.to_string(),
                "--timeout",
                "60000",
            ],
            None,
        )
        .expect("consumer-perf-test");
    let lines: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
    let at = lines
        .iter()
        .position(|l| l.trim_start().starts_with("start.time"))
        .unwrap_or_else(|| panic!("unexpected consumer-perf-test output:\n{out}"));
    let header = lines[at];
    let row = lines.get(at + 1).copied().unwrap_or_default();
    // Columns: start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, ...
    let cols: Vec<&str> = row.split(',').map(str::trim).collect();
    let names: Vec<&str> = header.split(',').map(str::trim).collect();
    let get = |name: &str| {
        names
            .iter()
            .position(|n| *n == name)
            .and_then(|i| cols.get(i))
            .copied()
            .unwrap_or("?")
    };
    println!(
        "java fetch      : {:>10} records/s {:>8} MB/s (kafka-consumer-perf-test; fetch-only: {} records/s, {} MB/s)",
        get("nMsg.sec"),
        get("MB.sec"),
        get("fetch.nMsg.sec"),
        get("fetch.MB.sec")
    );
}
