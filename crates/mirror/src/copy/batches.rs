//! MM2 mode's batch planner: how fetched source batches go to the same partition of the remote
//! topic. A batch is forwarded as fetched when nothing about it must change (no transforms, its
//! offsets contiguous, CreateTime, within `max.request.size`, not starting before the
//! position); small back-to-back batches are merged, each record re-encoded with its source
//! codec; anything else goes through record mode (decoded, filtered and transformed, re-encoded
//! with the producer's codec). Each planned batch carries its records' source offsets, so
//! translation stays exact, and a tag: the source offset the position may move to once the
//! target acknowledged it. Pure.

use crate::offsets::sync_rules::SourceOffsets;
use crate::transform::Chain;
use kmirror_kafka::batch::{Codec, RawBatch};
use kmirror_kafka::records::{
    decode_batch_within, encode_within, BatchOptions, DecodeError, Record,
};

/// Source batches smaller than this that follow each other in a response are merged into one
/// target batch. A producer with `linger.ms=0` at a moderate rate writes a batch per record or
/// two, and the target takes one produce request per batch and partition (at most five in
/// flight): forwarded one by one they would cap a partition at a few thousand records per
/// second. Large batches are always forwarded untouched.
const SMALL_BATCH: usize = 16 * 1024;

/// A merged run stays below this (and below half of `max.request.size`).
const MERGED_MAX: usize = 256 * 1024;

/// The most a run of small batches may decompress to and still be merged: legitimate
/// runs of at most [`MERGED_MAX`] compressed bytes stay far below it, and a decompression bomb
/// costs no more than this before the run is forwarded as it is.
const MERGE_DECODE_MAX: usize = 16 << 20;

/// How a source batch reached the target (the `mode` label of `kmirror_batches_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forwarded as fetched.
    Batch,
    /// Small batches merged, records re-encoded with their codec.
    Merged,
    /// Decoded, filtered or transformed, re-encoded with the producer's codec.
    Record,
}

/// A batch to send, its records' source offsets, and its tag (the source offset the position
/// may move to once the target acknowledged it).
pub type Outgoing = (RawBatch, SourceOffsets, i64);

/// What the planner made of the first batches it was given.
#[derive(Debug)]
pub struct Planned {
    /// How many of the given batches this covers.
    pub covers: usize,
    pub sends: Vec<Outgoing>,
    pub mode: Mode,
}

/// Why a batch cannot go to the target; the partition stops at `offset`.
#[derive(Debug, PartialEq, Eq)]
pub enum PlanError {
    /// The batch does not decode (its CRC passed, so the source broker accepted it).
    Corrupt { offset: i64, message: String },
    /// It cannot be written within the configured limits.
    Refused { offset: i64, message: String },
}

/// The flow's settings that decide how batches go.
pub struct BatchPlanner<'a> {
    /// `kmirror.batch.mode` (forward as fetched when nothing must change).
    pub batch_mode: bool,
    /// `kmirror.batch.merge.small`.
    pub merge_small: bool,
    /// The target producer's `max.request.size`.
    pub max_request: usize,
    /// `kmirror.batch.max.decompressed.bytes`.
    pub max_decompressed: usize,
    /// The producer's codec (record mode).
    pub codec: Codec,
    /// The source topic (what transforms see) and the flow's transforms.
    pub topic: &'a str,
    pub transforms: &'a Chain,
}

impl std::fmt::Debug for BatchPlanner<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchPlanner")
            .field("batch_mode", &self.batch_mode)
            .field("merge_small", &self.merge_small)
            .field("max_request", &self.max_request)
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

impl BatchPlanner<'_> {
    fn too_large(&self, b: &RawBatch) -> bool {
        b.bytes().len() > self.max_request
    }

    /// The batch goes to the target as it was fetched.
    fn forwardable(&self, b: &RawBatch, next: i64) -> bool {
        self.batch_mode
            && self.transforms.is_empty()
            && b.base_offset() >= next
            && b.offsets_contiguous()
            && !b.is_log_append_time()
            && !self.too_large(b)
    }

    /// The most bytes a run of merged batches may hold.
    fn merge_limit(&self) -> usize {
        MERGED_MAX.min(self.max_request / 2)
    }

    /// Plans the first of `batches` (and the small ones after it, when they merge), given that
    /// the partition's position is `next`. `batches` must not be empty.
    pub fn plan(&self, batches: &[&RawBatch], next: i64) -> Result<Planned, PlanError> {
        let b = batches[0];
        let as_is = self.forwardable(b, next);
        let run = if as_is && self.merge_small {
            small_run(batches, &|b| self.forwardable(b, next), self.merge_limit())
        } else {
            1
        };
        let (sends, mode) = if run > 1 {
            match self.merge(&batches[..run])? {
                Some(merged) => (merged, Mode::Merged),
                // Too large to merge once decompressed: each goes as it is.
                None => (
                    batches[..run].iter().map(|b| as_it_is(b)).collect(),
                    Mode::Batch,
                ),
            }
        } else if as_is {
            (vec![as_it_is(b)], Mode::Batch)
        } else {
            // A batch larger than max.request.size is split, with its own codec unless
            // transforms ask for the producer's: the source topic's max.message.bytes may be
            // larger than the target producer's limit, and MM2 copies such batches record by
            // record. One record above the limit stays an error.
            let codec = match b.codec() {
                Some(own) if self.too_large(b) && self.transforms.is_empty() => own,
                _ => self.codec,
            };
            (self.reencode(b, next, codec)?, Mode::Record)
        };
        Ok(Planned {
            covers: run,
            sends,
            mode,
        })
    }

    /// Record mode: decode, keep the records at or after `next`, re-encode with `codec`, in as
    /// many batches as `max.request.size` needs (a compressed source batch may not fit once
    /// re-encoded with another codec). The last batch carries the source batch's last offset as
    /// its tag, so the position passes records compaction removed at its end.
    fn reencode(&self, b: &RawBatch, next: i64, codec: Codec) -> Result<Vec<Outgoing>, PlanError> {
        let refused = |message: String| PlanError::Refused {
            offset: b.base_offset(),
            message,
        };
        let kept: Vec<Record> = decode_batch_within(b, self.max_decompressed)
            .map_err(|e| match e {
                DecodeError::TooLarge { .. } => refused(format!(
                    "{e}; raise kmirror.batch.max.decompressed.bytes if batches this large are expected"
                )),
                DecodeError::Malformed(e) => PlanError::Corrupt {
                    offset: b.base_offset(),
                    message: e.to_string(),
                },
            })?
            .into_iter()
            .filter(|r| r.offset >= next)
            // MM2 mode refuses renaming transforms, so the topic stays the remote one.
            .filter_map(|r| self.transforms.apply(self.topic, r).map(|(_, r)| r))
            .collect();
        let options = BatchOptions {
            codec,
            ..BatchOptions::default()
        };
        let mut out = Vec::new();
        for (batch, range) in
            encode_within(&kept, &options, self.max_request).map_err(|e| refused(e.to_string()))?
        {
            let ups: Vec<i64> = kept[range].iter().map(|r| r.offset).collect();
            let Some(&tag) = ups.last() else { continue };
            out.push((batch, SourceOffsets::Listed(ups), tag));
        }
        if let Some(last) = out.last_mut() {
            last.2 = b.last_offset();
        }
        Ok(out)
    }

    /// Merges a run of small consecutive batches (see [`small_run`]) into as few target batches
    /// as `max.request.size` allows, each record re-encoded with its source codec and its own
    /// timestamp. The offsets stay contiguous, so translation stays exact. None when the run
    /// decompresses to more than [`MERGE_DECODE_MAX`] or does not decode: merging is only an
    /// optimisation, so such a run (or a decompression bomb) is forwarded as it is, and the
    /// target broker judges it.
    fn merge(&self, run: &[&RawBatch]) -> Result<Option<Vec<Outgoing>>, PlanError> {
        let first = run[0];
        let mut records: Vec<Record> = Vec::new();
        let mut room = MERGE_DECODE_MAX.min(self.max_decompressed);
        for b in run {
            let decoded = match decode_batch_within(b, room) {
                Ok(d) => d,
                Err(DecodeError::TooLarge { .. }) => return Ok(None),
                // Its CRC passed and the source broker accepted it: records kmirror's decoder
                // refuses are still the source's bytes, and the target broker judges them.
                Err(DecodeError::Malformed(e)) => {
                    tracing::debug!(topic = self.topic, offset = b.base_offset(), error = %e, "not merged: forwarded as it is");
                    return Ok(None);
                }
            };
            room = room.saturating_sub(decoded.iter().map(record_size).sum());
            records.extend(decoded);
        }
        let options = BatchOptions {
            codec: first.codec().unwrap_or(Codec::None),
            ..BatchOptions::default()
        };
        let mut out = Vec::new();
        for (batch, range) in
            encode_within(&records, &options, self.max_request).map_err(|e| PlanError::Refused {
                offset: first.base_offset(),
                message: e.to_string(),
            })?
        {
            let Some(r) = records.get(range.start) else {
                continue;
            };
            let count = range.len() as i64;
            let ups = SourceOffsets::Contiguous {
                first: r.offset,
                count,
            };
            out.push((batch, ups, r.offset + count - 1));
        }
        Ok(Some(out))
    }
}

/// A batch as it is, with its records' source offsets and its last offset as the tag.
fn as_it_is(b: &RawBatch) -> Outgoing {
    let ups = SourceOffsets::Contiguous {
        first: b.base_offset(),
        count: b.record_count() as i64,
    };
    (b.clone(), ups, b.last_offset())
}

/// The bytes a decoded record holds (its payloads), to keep a run's decoding within its bound.
fn record_size(r: &Record) -> usize {
    r.key.as_ref().map_or(0, |k| k.len())
        + r.value.as_ref().map_or(0, |v| v.len())
        + r.headers
            .iter()
            .map(|(k, v)| k.len() + v.as_ref().map_or(0, |v| v.len()))
            .sum::<usize>()
}

/// How many batches from the start of `batches` form a run to merge: consecutive, each
/// forwardable as is, small, with the same codec, with no offset gap between them, and
/// together within `limit` bytes. 1 when there is nothing to merge.
fn small_run(
    batches: &[&RawBatch],
    forwardable: &dyn Fn(&RawBatch) -> bool,
    limit: usize,
) -> usize {
    let Some(first) = batches.first() else {
        return 0;
    };
    let mut total = 0;
    let mut n = 0;
    let mut prev_end = first.base_offset();
    for b in batches {
        let size = b.bytes().len();
        if size >= SMALL_BATCH
            || total + size > limit
            || b.record_count() <= 0
            || b.codec() != first.codec()
            || b.base_offset() != prev_end
            || !forwardable(b)
        {
            break;
        }
        total += size;
        prev_end = b.last_offset() + 1;
        n += 1;
    }
    n.max(1)
}
