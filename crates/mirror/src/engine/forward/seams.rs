//! The copy loop's I/O seams: where a partition's data comes from (the fetcher's subscription)
//! and where it goes (the producer's lane for the remote partition). Tests put scripted fakes
//! behind them, so the loop's decisions are unit-tested without brokers.

use kmirror_kafka::batch::RawBatch;
use kmirror_kafka::fetcher::{FetchEvent, Subscription};
use kmirror_kafka::producer::{Acked, PartitionLane};
use kmirror_kafka::KafkaError;

/// Where a partition's data comes from: the fetcher's subscription.
pub(crate) trait Feed: Send {
    /// The next event; `None` once the fetcher stopped. Cancel-safe.
    fn recv(&mut self) -> impl std::future::Future<Output = Option<FetchEvent>> + Send;
    /// Bytes the flow holds fetched and not yet acknowledged (for the metric).
    fn buffered(&self) -> usize;
}

/// Where it goes: the producer's lane for the remote partition, acknowledging in order.
pub(crate) trait Sink: Send {
    fn send(
        &mut self,
        tag: i64,
        batch: RawBatch,
    ) -> impl std::future::Future<Output = Result<Vec<Acked>, KafkaError>> + Send;
    fn flush(&mut self)
        -> impl std::future::Future<Output = Result<Vec<Acked>, KafkaError>> + Send;
    /// Ready once the oldest batch in flight has its answer; pending while nothing is in
    /// flight. Cancel-safe.
    fn answered(&mut self) -> impl std::future::Future<Output = ()> + Send;
    /// The acknowledgements whose answers are there, in order.
    fn take_answered(
        &mut self,
    ) -> impl std::future::Future<Output = Result<Vec<Acked>, KafkaError>> + Send;
}

impl Feed for Subscription {
    fn recv(&mut self) -> impl std::future::Future<Output = Option<FetchEvent>> + Send {
        Subscription::recv(self)
    }
    fn buffered(&self) -> usize {
        Subscription::buffered(self)
    }
}

impl Sink for PartitionLane {
    fn send(
        &mut self,
        tag: i64,
        batch: RawBatch,
    ) -> impl std::future::Future<Output = Result<Vec<Acked>, KafkaError>> + Send {
        PartitionLane::send(self, tag, batch)
    }
    fn flush(
        &mut self,
    ) -> impl std::future::Future<Output = Result<Vec<Acked>, KafkaError>> + Send {
        PartitionLane::flush(self)
    }
    fn answered(&mut self) -> impl std::future::Future<Output = ()> + Send {
        PartitionLane::answered(self)
    }
    fn take_answered(
        &mut self,
    ) -> impl std::future::Future<Output = Result<Vec<Acked>, KafkaError>> + Send {
        PartitionLane::take_answered(self)
    }
}
