//! Reading a partition back in tests: what a read_committed consumer sees, and every record with
//! the codec of its batch.

use std::time::Duration;

/// The records a read_committed consumer sees in one partition, in order, from its start to
/// its last stable offset (aborted transactions and control records left out). Empty if the
/// partition cannot be read (yet).
pub async fn read_committed(
    k: &kmirror_kafka::cluster::KafkaCluster,
    topic: &str,
    partition: i32,
) -> Vec<kmirror_kafka::records::Record> {
    let mut out = Vec::new();
    let mut offset = 0;
    for _ in 0..100_000 {
        let Ok(f) = k
            .fetch(
                topic,
                partition,
                offset,
                1 << 20,
                Duration::from_millis(20),
                kmirror_kafka::IsolationLevel::ReadCommitted,
            )
            .await
        else {
            return Vec::new();
        };
        for b in f.committed_batches() {
            out.extend(kmirror_kafka::records::decode_batch(b).expect("decodable"));
        }
        match f.batches.last() {
            Some(last) if last.last_offset() + 1 < f.last_stable_offset => {
                offset = last.last_offset() + 1
            }
            _ => break,
        }
    }
    out
}

/// Every record of a partition (control batches left out), with the codec of its batch.
pub async fn read_partition(
    k: &kmirror_kafka::cluster::KafkaCluster,
    topic: &str,
    partition: i32,
) -> Vec<(kmirror_kafka::batch::Codec, kmirror_kafka::records::Record)> {
    use kmirror_kafka::cluster::{EARLIEST, LATEST};
    use kmirror_kafka::IsolationLevel::ReadUncommitted;
    let end = k
        .list_offset(topic, partition, LATEST, ReadUncommitted)
        .await
        .expect("end offset");
    let mut offset = k
        .list_offset(topic, partition, EARLIEST, ReadUncommitted)
        .await
        .expect("start offset");
    let mut out = Vec::new();
    while offset < end {
        let f = k
            .fetch(
                topic,
                partition,
                offset,
                1 << 20,
                Duration::from_millis(100),
                ReadUncommitted,
            )
            .await
            .expect("fetch");
        for b in f.batches {
            offset = b.last_offset() + 1;
            if !b.is_control() {
                let codec = b.codec().expect("a known codec");
                out.extend(
                    kmirror_kafka::records::decode_batch(&b)
                        .expect("decodable")
                        .into_iter()
                        .map(|r| (codec, r)),
                );
            }
        }
    }
    out
}
