//! Reads one partition of an internal topic (positions, offset syncs, checkpoints) from an offset
//! to its current end, as a read_committed reader would see it: control batches and the records
//! of aborted transactions left out (MirrorMaker 2 with exactly-once writes its positions in
//! transactions), without waiting behind a transaction left open (docs/engine.md, "Transactions
//! in the internal topics").

use kmirror_kafka::batch::RawBatch;
use kmirror_kafka::cluster::{KafkaCluster, EARLIEST, LATEST};
use kmirror_kafka::committed::{marker, CommittedView};
use kmirror_kafka::records::{decode_batch, Record};
use kmirror_kafka::{IsolationLevel, KafkaError};

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

/// Records at most held in memory behind a transaction still open (about 100 bytes each in a
/// positions topic); past that a read fails, naming the transaction, rather than growing.
const MAX_HELD: usize = 1_000_000;

/// Like [`read_to_end`], handing each record on as its batch is decoded, so a large log (a
/// positions topic not compacted yet) is read in the memory of one fetch. Records written after
/// a transaction still open wait for it in memory, and are handed on at the end; the offset
/// returned is then where that transaction began, so a later read sees them again.
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
    let from = from.unwrap_or(start).max(start);
    let mut view = CommittedView::new(MAX_HELD);
    let offset = k
        .read_until(topic, partition, from..end, iso, |f| {
            f.batches
                .iter()
                .try_for_each(|b| show(&mut view, b, topic, partition, &mut visit))
        })
        .await?;
    Ok(view
        .finish(&mut visit)
        .map_or(offset, |open| open.min(offset)))
}

/// Shows one batch of a log read uncommitted to `view`: a marker ends its transaction, a data
/// batch's records are handed on (or held behind an open transaction). More held than the
/// view's limit is `OpenTransaction`.
pub(crate) fn show(
    view: &mut CommittedView<Record>,
    b: &RawBatch,
    topic: &str,
    partition: i32,
    visit: &mut impl FnMut(Record),
) -> Result<(), KafkaError> {
    let corrupt = |message: String| KafkaError::CorruptBatch {
        topic: topic.to_string(),
        partition,
        offset: b.base_offset(),
        message,
    };
    if b.is_control() {
        if let Some(m) = marker(b).map_err(|e| corrupt(e.to_string()))? {
            view.marker(b.producer_id(), m, visit);
        }
        return Ok(());
    }
    let records = decode_batch(b).map_err(|e| corrupt(e.to_string()))?;
    view.data(b, records, visit)
        .map_err(|h| KafkaError::OpenTransaction {
            topic: topic.to_string(),
            partition,
            producer_id: h.producer_id,
            offset: h.offset,
            limit: h.limit,
        })
}
