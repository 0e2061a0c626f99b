//! Hostile source data fed to a running `kmirror run` on real brokers: decompression
//! bombs that the source broker accepted (gzip, zstd and lz4 batches of one 128 MiB record of
//! zeros, a few hundred KB each on the wire) and malformed batches with a valid CRC-32C, written
//! into a segment file of the cleanly stopped source broker (a record count of 2^31-1, record
//! offsets out of order, a snappy section declaring 4 GiB, a negative last offset delta).
//!
//! 1. Default MM2 mode (batches forwarded as they are): the bombs are copied intact, never
//!    inflated: the process's peak RSS stays far below one bomb's decompressed size. Malformed
//!    batches stop their partition at the bad batch (by kmirror's framing checks, or the target
//!    broker's refusal), except the one brokers accept, which is copied as the source holds it.
//! 2. Record mode (a transform, so every record is decoded): each bomb and each malformed batch
//!    stops its own partition with an error naming topic, partition and offset, after the good
//!    batch before it was copied; every other partition, and the clean topic, is copied whole.
//!    The peak RSS stays within the decompression bound.

use bytes::Bytes;
use kmirror_kafka::batch::{Codec, RawBatch};
use kmirror_kafka::cluster::{KafkaCluster, NewTopic, LATEST};
use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
use kmirror_kafka::IsolationLevel;
use kmirror_testkit::{Cluster, KillOnDrop, Security};
use std::path::Path;
use std::process::Command;

const PER_BATCH: i64 = 10;
const BOMB: usize = 128 << 20;
const BOMB_CODECS: [Codec; 3] = [Codec::Gzip, Codec::Zstd, Codec::Lz4];
/// The malformed batches, one per partition of `malformed`, as (what, edit of the batch bytes).
const MALFORMED: [&str; 4] = [
    "record count 2^31-1",
    "offset deltas out of order",
    "snappy section declaring 4 GiB",
    "last offset delta -1",
];

/// The malformed batch that Kafka's brokers accept (they do not check the order of offset
/// deltas in an uncompressed batch): batch mode forwards it as the source holds it, since
/// kmirror does not decode what it forwards; record mode refuses it.
const ACCEPTED_BY_BROKERS: usize = 1;

fn records(first: i64, count: i64, value: impl Fn(i64) -> Bytes) -> Vec<Record> {
    (0..count)
        .map(|i| Record {
            offset: i,
            timestamp: 1_764_800_000_000 + first + i,
            key: Some(Bytes::from(format!("k{}", first + i))),
            value: Some(value(first + i)),
            headers: vec![],
        })
        .collect()
}

fn small(first: i64) -> RawBatch {
    encode_batch(
        &records(first, PER_BATCH, |i| Bytes::from(format!("value-{i}"))),
        &BatchOptions::default(),
    )
    .unwrap()
}

fn bomb(codec: Codec, zeros: &Bytes) -> RawBatch {
    encode_batch(
        &records(PER_BATCH, 1, |_| zeros.clone()),
        &BatchOptions {
            codec,
            ..BatchOptions::default()
        },
    )
    .unwrap()
}

/// Edits an uncompressed batch of [`PER_BATCH`] records in place (same length, so the segment
/// and its index stay consistent) and seals it with a valid CRC-32C.
fn make_malformed(kind: usize, b: &mut [u8]) {
    const ATTRIBUTES: usize = 21;
    const LAST_OFFSET_DELTA: usize = 23;
    const COUNT: usize = 57;
    const RECORDS: usize = 61;
    match kind {
        0 => b[COUNT..RECORDS].copy_from_slice(&i32::MAX.to_be_bytes()),
        1 => {
            // The second record's offset delta (after its length, attributes and one-byte
            // timestamp delta) from 1 to 0: zig-zag 2 becomes 0.
            let first_len = (b[RECORDS] >> 1) as usize;
            let at = RECORDS + 1 + first_len + 3;
            assert_eq!(b[at], 2, "the second record's offset delta");
            b[at] = 0;
        }
        2 => {
            b[ATTRIBUTES + 1] = (b[ATTRIBUTES + 1] & !0x07) | Codec::Snappy.bits() as u8;
            let section = &mut b[RECORDS..];
            section.fill(0);
            // Raw snappy: the varint of the uncompressed length, 2^32 - 1.
            section[..5].copy_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
        }
        3 => b[LAST_OFFSET_DELTA..LAST_OFFSET_DELTA + 4].copy_from_slice(&(-1i32).to_be_bytes()),
        _ => unreachable!(),
    }
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
}

async fn end(k: &KafkaCluster, topic: &str, partition: i32) -> i64 {
    k.list_offset(topic, partition, LATEST, IsolationLevel::ReadCommitted)
        .await
        .unwrap_or(-1)
}

/// The process's peak resident set (VmHWM), in MiB.
fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kb / 1024.0
}

fn run(config: &Path, log: &Path) -> KillOnDrop {
    KillOnDrop::spawn(
        Command::new(env!("CARGO_BIN_EXE_kmirror"))
            .arg("run")
            .arg(config)
            .args(["--metrics-address", "off"])
            // RUST_LOG of the test run reaches kmirror (e.g. kmirror_kafka=debug).
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            ),
        log,
    )
}

/// The "partition stopped" log line of source `topic`-`partition`, if there is one.
fn stopped_line(log: &Path, topic: &str, partition: i32) -> Option<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .find(|l| {
            l.contains("partition stopped")
                && l.contains(&format!("topic={topic} "))
                && l.contains(&format!("partition={partition} "))
        })
        .map(str::to_string)
}

/// Polls `check` every 300 ms; after `secs` seconds fails with the tail of kmirror's log.
async fn until<F, Fut>(secs: u64, what: &str, log: &Path, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !check().await {
        if std::time::Instant::now() > deadline {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(60).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!(
                "timed out after {secs} s: {what}; kmirror's log ends:\n{}",
                tail.join("\n")
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bombs_and_malformed_batches_stop_only_their_partition_within_the_memory_bound() {
    kmirror_testkit::init_logging();
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("hostile-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("hostile-b", Security::Plaintext).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    let a = KafkaCluster::connect(ca.client_settings(None))
        .await
        .unwrap();
    let topic = |name: &str, partitions: i32, configs: Vec<(String, String)>| NewTopic {
        name: name.into(),
        partitions,
        replication_factor: 1,
        configs,
    };
    let topics = [
        topic(
            "bombs",
            BOMB_CODECS.len() as i32,
            vec![("max.message.bytes".into(), (8 << 20).to_string())],
        ),
        topic("malformed", MALFORMED.len() as i32, vec![]),
        topic("clean", 2, vec![]),
    ];
    for (name, err) in a.create_topics(&topics, false).await.unwrap() {
        assert!(err.is_none(), "{name}: {err:?}");
    }
    {
        let zeros = Bytes::from(vec![0u8; BOMB]);
        for (p, codec) in BOMB_CODECS.iter().enumerate() {
            let p = p as i32;
            assert_eq!(a.produce("bombs", p, &small(0)).await.unwrap(), 0);
            let b = bomb(*codec, &zeros);
            println!("{codec:?} bomb: {} bytes on the wire", b.bytes().len());
            assert_eq!(a.produce("bombs", p, &b).await.unwrap(), PER_BATCH);
            assert_eq!(
                a.produce("bombs", p, &small(PER_BATCH + 1)).await.unwrap(),
                PER_BATCH + 1
            );
        }
    }
    for p in 0..MALFORMED.len() as i32 {
        for n in 0..3 {
            assert_eq!(
                a.produce("malformed", p, &small(n * PER_BATCH))
                    .await
                    .unwrap(),
                n * PER_BATCH
            );
        }
    }
    for p in 0..2 {
        for n in 0..5 {
            a.produce("clean", p, &small(n * PER_BATCH)).await.unwrap();
        }
    }
    drop(a);

    // The second batch of each `malformed` partition edited in the segment of the stopped broker.
    ca.pause().unwrap();
    let sizes: Vec<usize> = (0..3).map(|n| small(n * PER_BATCH).bytes().len()).collect();
    for kind in 0..MALFORMED.len() {
        let segment = ca
            .dir()
            .join(format!("data/malformed-{kind}/00000000000000000000.log"));
        let mut log =
            std::fs::read(&segment).unwrap_or_else(|e| panic!("{}: {e}", segment.display()));
        assert_eq!(
            log.len(),
            sizes.iter().sum::<usize>(),
            "{}",
            segment.display()
        );
        make_malformed(kind, &mut log[sizes[0]..sizes[0] + sizes[1]]);
        std::fs::write(&segment, &log).unwrap();
    }
    ca.restart().unwrap();

    let dir = tempfile::tempdir().unwrap();
    let b = KafkaCluster::connect(cb.client_settings(None))
        .await
        .unwrap();

    // 1. Default MM2 mode: bombs and clean data copied as they are, nothing inflated.
    let config = dir.path().join("forward.properties");
    std::fs::write(
        &config,
        format!(
            "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\n\
             A->B.topics = bombs, malformed, clean\nreplication.factor = 1\noffset.storage.replication.factor = 1\n\
             offset-syncs.topic.replication.factor = 1\n\
             emit.heartbeats.enabled = false\nemit.checkpoints.enabled = false\n",
            ca.bootstrap(),
            cb.bootstrap()
        ),
    )
    .unwrap();
    let log = dir.path().join("forward.log");
    let kmirror = run(&config, &log);
    until(
        120,
        "bombs and clean copied, malformed stopped",
        &log,
        || async {
            let _ = b.refresh_metadata(None).await;
            let mut done = true;
            for p in 0..BOMB_CODECS.len() as i32 {
                done &= end(&b, "A.bombs", p).await == 2 * PER_BATCH + 1;
            }
            for p in 0..2 {
                done &= end(&b, "A.clean", p).await == 5 * PER_BATCH;
            }
            for p in 0..MALFORMED.len() as i32 {
                done &= if p as usize == ACCEPTED_BY_BROKERS {
                    end(&b, "A.malformed", p).await == 3 * PER_BATCH
                } else {
                    stopped_line(&log, "malformed", p).is_some()
                };
            }
            done
        },
    )
    .await;
    let forward_peak = peak_rss_mib(kmirror.0.id());
    println!("malformed batches forwarded as they are (the target broker judges them):");
    for (p, what) in MALFORMED.iter().enumerate() {
        if p == ACCEPTED_BY_BROKERS {
            assert!(stopped_line(&log, "malformed", p as i32).is_none());
            println!("  {what}: copied as it is, accepted by the target broker");
            continue;
        }
        let line = stopped_line(&log, "malformed", p as i32).unwrap();
        println!("  {what}: {}", line.split("error=").nth(1).unwrap_or(&line));
        assert!(line.contains("offset 10"), "{what}: {line}");
        assert_eq!(end(&b, "A.malformed", p as i32).await, PER_BATCH, "{what}");
    }
    assert!(
        kmirror.terminate().success(),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    println!(
        "forwarded 3 bombs of {} MiB each: peak RSS {forward_peak:.0} MiB",
        BOMB >> 20
    );
    assert!(
        forward_peak < (BOMB >> 20) as f64,
        "peak RSS {forward_peak:.0} MiB: a bomb was inflated"
    );

    // 2. Record mode (a transform decodes every record), under another source alias so that it
    //    writes its own remote topics. The decompression bound is lowered to 16 MiB: the three
    //    bombs' partitions decode at once, each up to the bound, and with the default (50 MiB)
    //    the peak could reach the bombs' own size (CI once measured 128 MiB).
    let config = dir.path().join("records.properties");
    std::fs::write(
        &config,
        format!(
            "clusters = S, B\nS.bootstrap.servers = {}\nB.bootstrap.servers = {}\nS->B.enabled = true\n\
             S->B.topics = bombs, malformed, clean\nreplication.factor = 1\n\
             offset.storage.replication.factor = 1\noffset-syncs.topic.replication.factor = 1\n\
             emit.heartbeats.enabled = false\n\
             emit.checkpoints.enabled = false\ntransforms = strip\n\
             transforms.strip.type = DropHeaders\ntransforms.strip.headers = trace-id\n\
             kmirror.batch.max.decompressed.bytes = 16777216\n",
            ca.bootstrap(),
            cb.bootstrap()
        ),
    )
    .unwrap();
    let log = dir.path().join("records.log");
    let kmirror = run(&config, &log);
    let hostile: Vec<(&str, i32, String)> = BOMB_CODECS
        .iter()
        .enumerate()
        .map(|(p, c)| ("bombs", p as i32, format!("{c:?} bomb of 128 MiB")))
        .chain(
            MALFORMED
                .iter()
                .enumerate()
                .map(|(p, what)| ("malformed", p as i32, what.to_string())),
        )
        .collect();
    until(
        120,
        "every hostile partition stopped, clean copied",
        &log,
        || async {
            let _ = b.refresh_metadata(None).await;
            let mut done = hostile
                .iter()
                .all(|(t, p, _)| stopped_line(&log, t, *p).is_some());
            for p in 0..2 {
                done &= end(&b, "S.clean", p).await == 5 * PER_BATCH;
            }
            done
        },
    )
    .await;
    let records_peak = peak_rss_mib(kmirror.0.id());
    println!("hostile inputs, record mode (peak RSS {records_peak:.0} MiB):");
    for (topic, p, what) in &hostile {
        let line = stopped_line(&log, topic, *p).unwrap();
        let error = line.split("error=").nth(1).unwrap_or(&line);
        println!("  {what}: {error}");
        assert!(
            line.contains("offset 10") || line.contains("offset=10"),
            "{what}: the error names the offset of the bad batch: {line}"
        );
        assert_eq!(
            end(&b, &format!("S.{topic}"), *p).await,
            PER_BATCH,
            "{what}: the good batch before it was copied, nothing after it"
        );
    }
    for (p, _) in BOMB_CODECS.iter().enumerate() {
        let line = stopped_line(&log, "bombs", p as i32).unwrap();
        assert!(
            line.contains("kmirror.batch.max.decompressed.bytes"),
            "a bomb's error names the key that bounds it: {line}"
        );
    }
    assert!(
        records_peak < (BOMB >> 20) as f64,
        "peak RSS {records_peak:.0} MiB: beyond the decompression bound"
    );
    assert!(
        kmirror.terminate().success(),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
}
