//! The records a read_committed reader keeps, worked out from a log read uncommitted (its batches
//! in offset order, transaction markers included): the records of aborted transactions are
//! dropped, those of transactions still open at the end are left out, and everything else is
//! handed on in offset order.
//!
//! kmirror reads its internal topics this way rather than with read_committed fetches, which
//! stop at the last stable offset: one transaction left open (a MirrorMaker 2 task killed in the
//! middle of one keeps it open until its `transaction.timeout.ms`) would hide every record written
//! after it, kmirror's own newest positions among them (docs/engine.md, "Transactions in the
//! internal topics").

use crate::batch::{BatchError, RawBatch};
use crate::records::decode_batch;
use std::collections::{HashMap, VecDeque};

/// What a transaction marker (a control batch) says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    Abort,
    Commit,
}

/// The marker a control batch holds; `None` for control records of other kinds. The control
/// record's key is a version (i16) and a type (i16): 0 ABORT, 1 COMMIT.
pub fn marker(b: &RawBatch) -> Result<Option<Marker>, BatchError> {
    let bad = |message: &str| BatchError {
        position: 0,
        message: message.into(),
    };
    let record = decode_batch(b)?
        .into_iter()
        .next()
        .ok_or_else(|| bad("a control batch without a record"))?;
    let key = record
        .key
        .ok_or_else(|| bad("a control record without a key"))?;
    if key.len() < 4 {
        return Err(bad("a control record key shorter than 4 bytes"));
    }
    Ok(match i16::from_be_bytes([key[2], key[3]]) {
        0 => Some(Marker::Abort),
        1 => Some(Marker::Commit),
        _ => None,
    })
}

/// More records wait behind an open transaction than a [`CommittedView`] holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldBack {
    pub producer_id: i64,
    /// Where the open transaction began.
    pub offset: i64,
    pub limit: usize,
}

#[derive(Debug)]
struct Held<T> {
    /// The producer whose open transaction the item belongs to; `None` once it may be handed on.
    producer: Option<i64>,
    item: T,
}

/// Hands on, in offset order, the items of the batches it is shown that a read_committed reader
/// would see. Items behind an open transaction wait (in memory, up to `limit`) until it ends.
#[derive(Debug)]
pub struct CommittedView<T> {
    held: VecDeque<Held<T>>,
    /// Producers with a transaction open, and the offset where it began.
    open: HashMap<i64, i64>,
    limit: usize,
}

impl<T> CommittedView<T> {
    pub fn new(limit: usize) -> CommittedView<T> {
        CommittedView {
            held: VecDeque::new(),
            open: HashMap::new(),
            limit,
        }
    }

    /// A data batch (not a control batch) and its items.
    pub fn data(
        &mut self,
        b: &RawBatch,
        items: impl IntoIterator<Item = T>,
        emit: &mut impl FnMut(T),
    ) -> Result<(), HeldBack> {
        let producer = if b.is_transactional() {
            self.open.entry(b.producer_id()).or_insert(b.base_offset());
            Some(b.producer_id())
        } else {
            None
        };
        for item in items {
            if producer.is_none() && self.held.is_empty() {
                emit(item);
            } else {
                self.held.push_back(Held { producer, item });
            }
        }
        if self.held.len() > self.limit {
            let (producer_id, offset) = self
                .open
                .iter()
                .min_by_key(|(_, o)| **o)
                .map_or((-1, -1), |(p, o)| (*p, *o));
            return Err(HeldBack {
                producer_id,
                offset,
                limit: self.limit,
            });
        }
        Ok(())
    }

    /// A transaction marker of `producer_id`. A marker for a transaction this view did not see
    /// begin (it began before the first batch shown) changes nothing.
    pub fn marker(&mut self, producer_id: i64, marker: Marker, emit: &mut impl FnMut(T)) {
        if self.open.remove(&producer_id).is_none() {
            return;
        }
        match marker {
            Marker::Abort => self.held.retain(|h| h.producer != Some(producer_id)),
            Marker::Commit => self
                .held
                .iter_mut()
                .filter(|h| h.producer == Some(producer_id))
                .for_each(|h| h.producer = None),
        }
        while self.held.front().is_some_and(|h| h.producer.is_none()) {
            if let Some(h) = self.held.pop_front() {
                emit(h.item);
            }
        }
    }

    /// The end of what was shown: items of transactions still open are left out, the others
    /// handed on. Returns where the earliest open transaction began (a reader continuing later
    /// starts there, and sees the items after it once more).
    pub fn finish(self, emit: &mut impl FnMut(T)) -> Option<i64> {
        self.held
            .into_iter()
            .filter(|h| h.producer.is_none())
            .for_each(|h| emit(h.item));
        self.open.values().min().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{encode_batch, encode_marker, BatchOptions, Record};
    use bytes::{Bytes, BytesMut};

    fn at(offset: i64, b: RawBatch) -> RawBatch {
        let mut bytes = BytesMut::from(b.bytes().as_ref());
        bytes[0..8].copy_from_slice(&offset.to_be_bytes());
        RawBatch::new(bytes.freeze()).unwrap()
    }

    fn data(offset: i64, producer: Option<i64>, values: &[&str]) -> RawBatch {
        let records: Vec<Record> = values
            .iter()
            .enumerate()
            .map(|(i, v)| Record {
                offset: i as i64,
                timestamp: 0,
                key: None,
                value: Some(Bytes::from(v.to_string())),
                headers: vec![],
            })
            .collect();
        let options = BatchOptions {
            producer_id: producer.unwrap_or(-1),
            producer_epoch: 0,
            base_sequence: 0,
            transactional: producer.is_some(),
            ..BatchOptions::default()
        };
        at(offset, encode_batch(&records, &options).unwrap())
    }

    /// Shows a log to a view, as the internal-topic reader does; what it hands on, and the
    /// offset a later read would start from.
    fn read(log: &[RawBatch], limit: usize) -> Result<(Vec<String>, Option<i64>), HeldBack> {
        let mut view = CommittedView::new(limit);
        let mut out = Vec::new();
        let mut emit = |v: String| out.push(v);
        for b in log {
            if b.is_control() {
                if let Some(m) = marker(b).unwrap() {
                    view.marker(b.producer_id(), m, &mut emit);
                }
                continue;
            }
            let values = decode_batch(b)
                .unwrap()
                .into_iter()
                .map(|r| String::from_utf8(r.value.unwrap().to_vec()).unwrap());
            view.data(b, values, &mut emit)?;
        }
        let resume = view.finish(&mut emit);
        Ok((out, resume))
    }

    #[test]
    fn markers_are_read_from_control_batches() {
        let commit = encode_marker(Marker::Commit, 7, 1, 0).unwrap();
        let abort = encode_marker(Marker::Abort, 7, 1, 0).unwrap();
        assert!(commit.is_control() && commit.is_transactional());
        assert_eq!(marker(&commit).unwrap(), Some(Marker::Commit));
        assert_eq!(marker(&abort).unwrap(), Some(Marker::Abort));
        assert_eq!(commit.producer_id(), 7);
    }

    #[test]
    fn aborted_and_open_transactions_are_left_out_and_order_is_kept() {
        let (a, b) = (Some(10), Some(20));
        let log = [
            data(0, None, &["n0"]),
            data(1, a, &["a1", "a2"]),
            data(3, None, &["n3"]),
            data(4, b, &["b4"]),
            at(5, encode_marker(Marker::Abort, 20, 0, 0).unwrap()),
            data(6, None, &["n6"]),
            at(7, encode_marker(Marker::Commit, 10, 0, 0).unwrap()),
            // A second transaction of the first producer, still open at the end.
            data(8, a, &["a8"]),
            data(9, None, &["n9"]),
        ];
        let (out, resume) = read(&log, 100).unwrap();
        // Committed records keep their place before the records written after them: a reader
        // applying "the last record per key wins" must see them in offset order.
        assert_eq!(out, ["n0", "a1", "a2", "n3", "n6", "n9"]);
        assert_eq!(
            resume,
            Some(8),
            "a later read starts at the open transaction"
        );
    }

    #[test]
    fn a_marker_of_a_transaction_begun_before_the_read_changes_nothing() {
        let log = [
            data(5, None, &["n5"]),
            at(6, encode_marker(Marker::Abort, 10, 0, 0).unwrap()),
            data(7, Some(10), &["a7"]),
            at(8, encode_marker(Marker::Commit, 10, 0, 0).unwrap()),
        ];
        let (out, resume) = read(&log, 100).unwrap();
        assert_eq!(out, ["n5", "a7"]);
        assert_eq!(resume, None);
    }

    #[test]
    fn what_waits_behind_an_open_transaction_is_bounded() {
        let mut log = vec![data(0, Some(3), &["t0"])];
        log.extend((1..=5).map(|o| data(o, None, &["n"])));
        assert_eq!(
            read(&log, 4).unwrap_err(),
            HeldBack {
                producer_id: 3,
                offset: 0,
                limit: 4
            }
        );
        assert_eq!(read(&log, 6).unwrap().0.len(), 5, "within the bound");
    }

    #[test]
    fn a_malformed_control_record_is_an_error() {
        let records = [Record {
            offset: 0,
            timestamp: 0,
            key: Some(Bytes::from_static(&[0, 0])),
            value: None,
            headers: vec![],
        }];
        let b = crate::records::encode_control(&records, 1, 0).unwrap();
        assert!(marker(&b).is_err());
    }
}
