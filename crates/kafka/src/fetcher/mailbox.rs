//! The events waiting for one subscription: at most [`CAPACITY`], taken in order.
//!
//! A tokio mpsc channel would do, but it allocates a block of 32 slots when it is created: 32
//! events of 96 bytes, about 3 KB per partition, 30 MB at 10,000 partitions, for queues that never
//! hold more than two events. Here the queue allocates on its first event, room for two.

use super::FetchEvent;
use std::collections::VecDeque;
use std::sync::Mutex;
use tokio::sync::Notify;

/// Two responses per partition may wait for the consumer: the partition stays in the session
/// while its consumer works on the previous one.
pub(super) const CAPACITY: usize = 2;

/// (generation, event): the generation of the subscription's position the event belongs to.
type Item = (u64, FetchEvent);

#[derive(Debug, Default)]
pub(super) struct Mailbox {
    queue: Mutex<Queue>,
    /// A permit after each event put in (kept by `Notify` when nobody waits).
    ready: Notify,
}

/// The events, and whether the subscription is gone (then nothing more is accepted), under one
/// lock so that a send and a close cannot interleave.
#[derive(Debug, Default)]
struct Queue {
    items: VecDeque<Item>,
    closed: bool,
}

/// What became of an event offered with [`Mailbox::try_send`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sent {
    Queued,
    /// Two events wait already; the event was dropped.
    Full,
    /// The subscription is gone; the event was dropped.
    Closed,
}

impl Mailbox {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts an event in, unless the mailbox is full or closed.
    pub(super) fn try_send(&self, item: Item) -> Sent {
        {
            let mut q = self.queue();
            if q.closed {
                return Sent::Closed;
            }
            if q.items.len() >= CAPACITY {
                return Sent::Full;
            }
            if q.items.capacity() == 0 {
                q.items.reserve_exact(CAPACITY);
            }
            q.items.push_back(item);
        }
        self.ready.notify_one();
        Sent::Queued
    }

    pub(super) fn is_full(&self) -> bool {
        self.queue().items.len() >= CAPACITY
    }

    /// The oldest event, waiting for one. Cancel-safe: an event is only taken by a call that
    /// returns it.
    pub(super) async fn recv(&self) -> Item {
        loop {
            if let Some(item) = self.queue().items.pop_front() {
                return item;
            }
            self.ready.notified().await;
        }
    }

    /// No more events; those waiting are dropped now, releasing their share of the buffer.
    pub(super) fn close(&self) {
        let dropped = {
            let mut q = self.queue();
            q.closed = true;
            std::mem::take(&mut q.items)
        };
        drop(dropped);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::KafkaError;
    use std::time::Duration;

    fn event(n: u64) -> Item {
        (
            n,
            FetchEvent::Failed(KafkaError::Config(format!("event {n}"))),
        )
    }

    #[tokio::test]
    async fn holds_two_in_order_refuses_a_third_and_wakes_a_waiting_receiver() {
        let m = std::sync::Arc::new(Mailbox::default());
        assert!(!m.is_full());
        assert_eq!(m.try_send(event(1)), Sent::Queued);
        assert_eq!(m.try_send(event(2)), Sent::Queued);
        assert!(m.is_full());
        assert_eq!(m.try_send(event(3)), Sent::Full, "at most two wait");
        assert_eq!(m.recv().await.0, 1);
        assert_eq!(m.recv().await.0, 2);
        let waiting = tokio::spawn({
            let m = m.clone();
            async move { m.recv().await.0 }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "nothing to take yet");
        assert_eq!(m.try_send(event(4)), Sent::Queued);
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(5), waiting)
                .await
                .expect("woken by the event")
                .unwrap(),
            4
        );
    }

    #[tokio::test]
    async fn a_cancelled_receive_loses_nothing_and_a_closed_mailbox_takes_nothing() {
        let m = Mailbox::default();
        // Cancelled while waiting; the permit of the next event must still reach a receiver.
        assert!(tokio::time::timeout(Duration::from_millis(10), m.recv())
            .await
            .is_err());
        assert_eq!(m.try_send(event(7)), Sent::Queued);
        assert_eq!(m.recv().await.0, 7);
        assert_eq!(m.try_send(event(8)), Sent::Queued);
        m.close();
        assert_eq!(m.try_send(event(9)), Sent::Closed);
        assert!(!m.is_full());
        assert!(
            tokio::time::timeout(Duration::from_millis(10), m.recv())
                .await
                .is_err(),
            "what waited was dropped at close"
        );
    }
}
