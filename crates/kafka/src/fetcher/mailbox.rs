//! The events waiting for one subscription: at most [`CAPACITY`], taken in order.
//!
//! A tokio mpsc channel would do, but it allocates a block of 32 slots when it is created: 32
//! events of 96 bytes, about 3 KB per partition, 30 MB at 10,000 partitions, for queues that never
//! hold more than two events. Here the queue allocates on its first event, room for two.

use super::FetchEvent;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use tokio::sync::Notify;

/// Two responses per partition may wait for the consumer: the partition stays in the session
/// while its consumer works on the previous one.
pub(super) const CAPACITY: usize = 2;

/// (generation, event): the generation of the subscription's position the event belongs to.
type Item = (u64, FetchEvent);

#[derive(Debug, Default)]
pub(super) struct Mailbox {
    queue: Mutex<VecDeque<Item>>,
    /// A permit after each event put in (kept by `Notify` when nobody waits).
    ready: Notify,
    /// The subscription is gone: nothing more is accepted.
    closed: AtomicBool,
}

impl Mailbox {
    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Item>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts an event in; false (and the event dropped) when full or closed.
    pub(super) fn try_send(&self, item: Item) -> bool {
        if self.closed.load(Ordering::SeqCst) {
            return false;
        }
        {
            let mut q = self.queue();
            if q.len() >= CAPACITY {
                return false;
            }
            if q.capacity() == 0 {
                q.reserve_exact(CAPACITY);
            }
            q.push_back(item);
        }
        self.ready.notify_one();
        true
    }

    pub(super) fn is_full(&self) -> bool {
        self.queue().len() >= CAPACITY
    }

    /// The oldest event, waiting for one. Cancel-safe: an event is only taken by a call that
    /// returns it.
    pub(super) async fn recv(&self) -> Item {
        loop {
            if let Some(item) = self.queue().pop_front() {
                return item;
            }
            self.ready.notified().await;
        }
    }

    /// No more events; those waiting are dropped now, releasing their share of the buffer.
    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let dropped = std::mem::take(&mut *self.queue());
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
        assert!(m.try_send(event(1)) && m.try_send(event(2)));
        assert!(m.is_full() && !m.try_send(event(3)), "at most two wait");
        assert_eq!(m.recv().await.0, 1);
        assert_eq!(m.recv().await.0, 2);
        let waiting = tokio::spawn({
            let m = m.clone();
            async move { m.recv().await.0 }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "nothing to take yet");
        assert!(m.try_send(event(4)));
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
        assert!(m.try_send(event(7)));
        assert_eq!(m.recv().await.0, 7);
        assert!(m.try_send(event(8)));
        m.close();
        assert!(!m.try_send(event(9)), "closed");
        assert!(!m.is_full());
        assert!(
            tokio::time::timeout(Duration::from_millis(10), m.recv())
                .await
                .is_err(),
            "what waited was dropped at close"
        );
    }
}
