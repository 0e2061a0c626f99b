//! How far a source partition is copied. Fetched data goes out as chunks: a chunk covers the
//! source offsets up to its `through` and is written as one or more target batches, each
//! acknowledged on its own. The position moves past a chunk only once it and every chunk before
//! it are done, whatever order the acknowledgements come in: MM2 mode sends one batch per chunk
//! on one lane (in order), MM1 mode fans a chunk out to many target partitions, each lane
//! answering at its own pace. A chunk with nothing to send (every record filtered out, or only
//! transaction markers and aborted data: the skipped tail) is done as soon as those before it
//! are, so the position passes it without passing anything unacknowledged.
//!
//! With exactly-once, what is done is held ([`Held`]) until the transaction that carries it
//! commits; an abort drops it, and the partition copies again from its last commit.

use std::collections::VecDeque;

/// A chunk's name, chosen by the shell (its lanes carry it to the acknowledgement as their
/// tag): MM2 mode names a chunk by its last source offset, MM1 mode by a counter of its own.
/// Acknowledgements go to the oldest chunk of that name still waiting for one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkId(pub i64);

#[derive(Debug)]
struct Chunk<P> {
    id: ChunkId,
    /// The last source offset the chunk covers.
    through: i64,
    /// Sends not yet acknowledged (or given up).
    outstanding: u32,
    /// What the caller keeps with the chunk until it is done (source offsets, memory shares).
    payload: Option<P>,
}

/// What moved since the last [`Progress::take_done`]: the position and, in source order, the
/// payloads of the chunks now done.
#[derive(Debug, PartialEq, Eq)]
pub struct Done<P> {
    /// The last source offset copied, when it moved.
    pub through: Option<i64>,
    pub payloads: Vec<P>,
}

/// One source partition's chunks in flight and its position. Pure: no I/O, no clock.
#[derive(Debug)]
pub struct Progress<P> {
    chunks: VecDeque<Chunk<P>>,
    /// The last source offset done; None before the first.
    through: Option<i64>,
    /// `through` moved since the last `take_done`.
    moved: bool,
    done: Vec<P>,
}

impl<P> Default for Progress<P> {
    fn default() -> Self {
        Progress {
            chunks: VecDeque::new(),
            through: None,
            moved: false,
            done: Vec::new(),
        }
    }
}

impl<P> Progress<P> {
    /// A partition whose position already passed `through` (None: nothing copied yet).
    pub fn starting_after(through: Option<i64>) -> Self {
        Progress {
            through,
            ..Progress::default()
        }
    }

    /// Registers chunk `id`, covering the source offsets up to `through`, written as `sends`
    /// target batches. A chunk with no sends is done once the chunks before it are.
    pub fn open(&mut self, id: ChunkId, through: i64, sends: u32, payload: P) {
        self.push(id, through, sends, Some(payload));
    }

    /// The skipped tail: the position passes `through` once everything opened before is done.
    pub fn skip(&mut self, through: i64) {
        self.push(ChunkId(through), through, 0, None);
    }

    fn push(&mut self, id: ChunkId, through: i64, sends: u32, payload: Option<P>) {
        self.chunks.push_back(Chunk {
            id,
            through,
            outstanding: sends,
            payload,
        });
        self.advance();
    }

    /// One send of chunk `id` was acknowledged (or given up). Returns the chunk's payload, for
    /// the caller to note what the acknowledgement said; None for a chunk already done or
    /// unknown (a late duplicate changes nothing).
    pub fn ack(&mut self, id: ChunkId) -> Option<&mut P> {
        let i = self
            .chunks
            .iter()
            .position(|c| c.id == id && c.outstanding > 0)?;
        let c = &mut self.chunks[i];
        c.outstanding -= 1;
        if i == 0 && c.outstanding == 0 {
            // Done: its payload is the first that `advance` hands to `done`.
            let at = self.done.len();
            self.advance();
            return self.done.get_mut(at);
        }
        self.chunks[i].payload.as_mut()
    }

    fn advance(&mut self) {
        while self.chunks.front().is_some_and(|c| c.outstanding == 0) {
            let Some(c) = self.chunks.pop_front() else {
                break;
            };
            if self.through.is_none_or(|t| t < c.through) {
                self.through = Some(c.through);
                self.moved = true;
            }
            self.done.extend(c.payload);
        }
        if self.chunks.is_empty() && self.chunks.capacity() > 0 {
            // Idle partitions hold no queue (thousands of them, docs/benchmarks.md).
            self.chunks = VecDeque::new();
        }
    }

    /// What became done since the last call.
    pub fn take_done(&mut self) -> Done<P> {
        let through = std::mem::take(&mut self.moved)
            .then_some(self.through)
            .flatten();
        Done {
            through,
            payloads: std::mem::take(&mut self.done),
        }
    }

    /// The last source offset done.
    pub fn through(&self) -> Option<i64> {
        self.through
    }

    /// Where copying starts again after a lane failed: after the last offset done, since
    /// nothing after it is known to be on the target.
    pub fn resume_from(&self, start: i64) -> i64 {
        self.through.map_or(start, |t| (t + 1).max(start))
    }

    /// Nothing is waiting for an acknowledgement.
    pub fn is_idle(&self) -> bool {
        self.chunks.is_empty()
    }

    /// The payload of the newest chunk still in flight (to attach what its acknowledgement
    /// releases, such as a fetched response's share of the memory budget).
    pub fn newest_pending(&mut self) -> Option<&mut P> {
        self.chunks
            .iter_mut()
            .rev()
            .find_map(|c| c.payload.as_mut())
    }

    /// Chunks waiting for acknowledgements.
    pub fn pending(&self) -> usize {
        self.chunks.len()
    }
}

/// Exactly-once: what was done since the last commit, counted as copied only once the
/// transaction that carries it commits.
#[derive(Debug)]
pub struct Held<T> {
    pub through: Option<i64>,
    pub done: Vec<T>,
}

impl<T> Default for Held<T> {
    fn default() -> Self {
        Held {
            through: None,
            done: Vec::new(),
        }
    }
}

impl<T> Held<T> {
    /// Adds what became done; the position only moves forward.
    pub fn add(&mut self, through: Option<i64>, done: impl IntoIterator<Item = T>) {
        if let Some(t) = through {
            if self.through.is_none_or(|h| h < t) {
                self.through = Some(t);
            }
        }
        self.done.extend(done);
    }

    /// The position moved past `committed` (the last committed offset): the open transaction
    /// must store it even when no record of it was sent.
    pub fn moved_past(&self, committed: Option<i64>) -> bool {
        self.through
            .is_some_and(|t| committed.is_none_or(|c| t > c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acknowledgements_out_of_order_move_the_position_only_past_a_done_prefix() {
        let mut p: Progress<&str> = Progress::default();
        let (a, b, c) = (ChunkId(0), ChunkId(1), ChunkId(2));
        p.open(a, 9, 2, "a");
        p.open(b, 19, 1, "b");
        p.open(c, 29, 1, "c");
        assert_eq!(p.ack(c), Some(&mut "c"));
        assert_eq!(p.ack(b), Some(&mut "b"));
        assert_eq!(
            p.take_done(),
            Done {
                through: None,
                payloads: vec![]
            }
        );
        p.ack(a);
        assert_eq!(p.through(), None, "a has one send left");
        p.ack(a);
        assert_eq!(
            p.take_done(),
            Done {
                through: Some(29),
                payloads: vec!["a", "b", "c"]
            }
        );
        assert!(p.is_idle());
        assert_eq!(
            p.take_done(),
            Done {
                through: None,
                payloads: vec![]
            },
            "taken once"
        );
    }

    #[test]
    fn late_duplicate_and_unknown_acknowledgements_change_nothing() {
        let mut p: Progress<u8> = Progress::default();
        let a = ChunkId(4);
        p.open(a, 4, 1, 1);
        assert!(p.ack(a).is_some());
        assert_eq!(p.ack(a), None);
        assert_eq!(p.ack(ChunkId(99)), None);
        // Names may repeat: an acknowledgement goes to the oldest chunk still waiting.
        p.open(ChunkId(5), 5, 1, 2);
        p.open(ChunkId(5), 6, 1, 3);
        assert_eq!(p.ack(ChunkId(5)), Some(&mut 2));
        assert_eq!(p.through(), Some(5));
        assert_eq!(p.take_done().payloads, vec![1, 2]);
    }

    #[test]
    fn the_skipped_tail_is_passed_only_once_everything_before_it_is_acknowledged() {
        let mut p: Progress<()> = Progress::default();
        let a = ChunkId(10);
        p.open(a, 10, 1, ());
        p.skip(14);
        assert_eq!(p.take_done().through, None, "batch at 10 still in flight");
        p.ack(a);
        assert_eq!(p.take_done().through, Some(14));
        // With nothing in flight, a skipped tail is passed at once.
        p.skip(20);
        assert_eq!(p.take_done().through, Some(20));
        // A tail behind the position never moves it back.
        p.skip(3);
        assert_eq!(p.take_done().through, None);
        assert_eq!(p.through(), Some(20));
    }

    #[test]
    fn a_lane_error_mid_chunk_resumes_after_the_last_done_offset() {
        let mut p: Progress<()> = Progress::default();
        assert_eq!(p.resume_from(100), 100, "nothing done: from the start");
        let (a, b) = (ChunkId(109), ChunkId(119));
        p.open(a, 109, 1, ());
        p.open(b, 119, 3, ());
        p.open(ChunkId(129), 129, 1, ());
        p.ack(a);
        p.ack(b); // one of b's three sends, then the lane fails
        assert_eq!(p.resume_from(100), 110, "b is not all on the target");
        assert_eq!(p.pending(), 2);
    }

    #[test]
    fn the_newest_pending_payload_takes_what_its_acknowledgement_releases() {
        let mut p: Progress<Vec<u8>> = Progress::default();
        assert!(p.newest_pending().is_none());
        p.open(ChunkId(1), 1, 1, vec![]);
        let b = ChunkId(2);
        p.open(b, 2, 1, vec![]);
        p.skip(5);
        p.newest_pending().expect("b in flight").push(7);
        p.ack(ChunkId(1));
        assert_eq!(p.ack(b), Some(&mut vec![7]));
        assert_eq!(p.take_done().payloads, vec![vec![], vec![7]]);
    }

    #[test]
    fn a_held_transaction_keeps_the_furthest_position_and_everything_done_in_order() {
        let mut h: Held<u8> = Held::default();
        assert!(!h.moved_past(None));
        h.add(Some(7), [1, 2]);
        h.add(None, [3]);
        h.add(Some(5), []);
        assert_eq!(h.through, Some(7), "never back");
        assert_eq!(h.done, vec![1, 2, 3]);
        assert!(h.moved_past(Some(6)));
        assert!(!h.moved_past(Some(7)));
        // What an aborted transaction held is dropped with it: a fresh hold starts empty.
        let h = Held::<u8>::default();
        assert!(h.done.is_empty() && h.through.is_none());
    }
}
