//! Reads one partition of an internal topic (positions, offset syncs, checkpoints) from an offset
//! to its current end, control batches left out.

use kmirror_kafka::cluster::{KafkaCluster, EARLIEST, LATEST};
use kmirror_kafka::records::{decode_batch, Record};
use kmirror_kafka::{IsolationLevel, KafkaError};
use std::time::Duration;

/// The records from `from` (None: the log start) to the end as of now, and the offset to
/// continue from next time.
pub(crate) async fn read_to_end(
    k: &KafkaCluster,
    topic: &str,
    partition: i32,
    from: Option<i64>,
) -> Result<(Vec<Record>, i64), KafkaError> {
    let mut out = Vec::new();
    let next = visit_to_end(k, topic, partition, from, |r| out.push(r)).await?;
    Ok((out, next))
}

/// Like [`read_to_end`], handing each record to `visit` as its batch is decoded, so a large
/// log (a positions topic not compacted yet) is read in the memory of one fetch.
pub(crate) async fn visit_to_end(
    k: &KafkaCluster,
    topic: &str,
    partition: i32,
    from: Option<i64>,
    mut visit: impl FnMut(Record),
) -> Result<i64, KafkaError> {
    let iso = IsolationLevel::ReadUncommitted;
    let end = k.list_offset(topic, partition, LATEST, iso).await?;
    let start = k.list_offset(topic, partition, EARLIEST, iso).await?;
    // Compaction or retention may have removed what we would read next.
    let mut offset = from.unwrap_or(start).max(start);
    while offset < end {
        let f = k
            .fetch(topic, partition, offset, 1 << 20, Duration::ZERO, iso)
            .await?;
        if f.batches.is_empty() {
            break;
        }
        for b in &f.batches {
            offset = b.last_offset() + 1;
            if b.is_control() {
                continue;
            }
            decode_batch(b)
                .map_err(|e| KafkaError::Config(format!("{topic}-{partition}: {e}")))?
                .into_iter()
                .for_each(&mut visit);
        }
    }
    Ok(offset)
}
