//! The connections to each broker, opened on demand and shared: channel 0 for metadata, admin
//! and the like, data channels for fetches and produces, and dedicated ones for requests a broker
//! holds.

use super::KafkaCluster;
use crate::conn::Connection;
use crate::error::{KafkaError, Result};
use std::sync::Arc;

/// The shared connection to one broker, opened on first use.
pub(super) type BrokerSlot = Arc<tokio::sync::Mutex<Option<Arc<Connection>>>>;

/// How long a broker that let a request time out is asked last.
pub(crate) const SILENT_FOR: std::time::Duration = std::time::Duration::from_secs(60);

/// Connections per broker for partition data, besides channel 0.
pub const DATA_CHANNELS: usize = 4;

/// The data channel of a partition: fixed, so its requests stay in order on one connection.
pub fn data_channel(topic: &str, partition: i32) -> usize {
    // FNV-1a: stable across runs and processes, unlike the std hasher's random keys.
    let mut h: u32 = 0x811c_9dc5;
    for b in topic.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    1 + (h.wrapping_add(partition as u32) as usize) % DATA_CHANNELS
}

impl KafkaCluster {
    /// The connection to broker `id`, opened (or reopened) on demand.
    pub async fn broker(&self, id: i32) -> Result<Arc<Connection>> {
        self.broker_channel(id, 0).await
    }

    /// One of several connections to broker `id` (`channel` 0 is [`broker`](Self::broker)'s).
    /// A broker handles one request per connection at a time, so produces and fetches for
    /// different partitions spread over [`DATA_CHANNELS`] connections are validated and
    /// appended in parallel instead of queueing behind each other. A partition always uses
    /// the same channel ([`data_channel`]), which keeps its requests in order.
    pub async fn broker_channel(&self, id: i32, channel: usize) -> Result<Arc<Connection>> {
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            slots.entry((id, channel)).or_default().clone()
        };
        let mut guard = slot.lock().await;
        if let Some(c) = guard.as_ref() {
            if !c.is_closed() {
                return Ok(c.clone());
            }
            if c.went_silent() {
                self.mark_silent(id);
            }
        }
        let conn = match self.dedicated_connection(id).await {
            Ok(c) => c,
            Err(e) => {
                // A stopped process's port still accepts TCP connections (the kernel queues
                // them): the handshake's request is what times out.
                if matches!(e, KafkaError::Timeout { .. }) {
                    self.mark_silent(id);
                }
                return Err(e);
            }
        };
        *guard = Some(conn.clone());
        Ok(conn)
    }

    /// Remembers that broker `id` let a request time out: for [`SILENT_FOR`], metadata and admin
    /// requests go to other brokers first.
    pub(crate) fn mark_silent(&self, id: i32) {
        let mut silent = self.silent.lock().unwrap_or_else(|p| p.into_inner());
        if silent.insert(id, std::time::Instant::now()).is_none() {
            tracing::warn!(
                broker = id,
                "broker did not answer in time; asking other brokers first"
            );
        }
    }

    /// The known brokers in the order to ask them for metadata and cluster-wide requests: those
    /// that answered lately by id, then those that recently went silent (Java clients'
    /// `leastLoadedNode` likewise avoids a node whose requests are stuck).
    pub(crate) fn brokers_to_ask(&self) -> Vec<i32> {
        // A produce or fetch that timed out on a data channel says as much about its broker
        // as a metadata request would: look at every open slot (a few per broker).
        // Each such connection is counted once: it is closed, so it leaves its slot here.
        let went_silent: Vec<i32> = {
            let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            slots
                .iter()
                .filter(|(_, slot)| {
                    slot.try_lock().is_ok_and(|mut c| {
                        let silent = c.as_ref().is_some_and(|c| c.went_silent());
                        if silent {
                            *c = None;
                        }
                        silent
                    })
                })
                .map(|((id, _), _)| *id)
                .collect()
        };
        for id in went_silent {
            self.mark_silent(id);
        }
        let mut silent = self.silent.lock().unwrap_or_else(|p| p.into_inner());
        silent.retain(|_, at| at.elapsed() < SILENT_FOR);
        let ids: Vec<i32> = self.metadata().brokers.keys().copied().collect();
        let (quiet, answering): (Vec<i32>, Vec<i32>) =
            ids.into_iter().partition(|id| silent.contains_key(id));
        answering.into_iter().chain(quiet).collect()
    }

    /// A new connection to broker `id` that nobody else uses: for requests the broker holds (a
    /// JoinGroup waits for the whole rebalance, and a broker answers one request per connection
    /// at a time, so it would stall everything else sharing the connection).
    pub async fn dedicated_connection(&self, id: i32) -> Result<Arc<Connection>> {
        // Not a configuration error: the broker left or was fenced after the metadata was
        // loaded, and a refresh names the partition's new leader (this used to stop
        // the partition).
        let addr = self
            .metadata()
            .brokers
            .get(&id)
            .cloned()
            .ok_or(KafkaError::UnknownBroker { id })?;
        Ok(Arc::new(
            Connection::connect(
                &addr.host,
                addr.port,
                format!("{id}@{addr}"),
                &self.settings,
            )
            .await?,
        ))
    }

    /// Some live broker (for metadata and cluster-wide requests), preferring those that did not
    /// go silent lately ([`KafkaCluster::brokers_to_ask`]).
    pub async fn any_broker(&self) -> Result<Arc<Connection>> {
        let mut last = None;
        for id in self.brokers_to_ask() {
            match self.broker(id).await {
                Ok(c) => return Ok(c),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| KafkaError::Config("no broker known".into())))
    }

    pub(super) async fn controller_or_any(&self) -> Result<Arc<Connection>> {
        // KRaft brokers forward admin requests to the controller; any broker will do.
        let controller = self.metadata().controller_id;
        match self.broker(controller).await {
            Ok(c) => Ok(c),
            Err(_) => self.any_broker().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::metadata::Metadata;
    use crate::settings::{BrokerAddress, ClientSettings, SecurityProtocol};
    use std::collections::HashMap;
    use std::sync::{Mutex, RwLock};

    /// A cluster object that knows brokers 1, 2 and 3 and never connected.
    fn offline() -> KafkaCluster {
        let address = |port| BrokerAddress {
            host: "127.0.0.1".into(),
            port,
        };
        let mut metadata = Metadata::default();
        for id in 1..=3 {
            metadata.brokers.insert(id, address(1 + id as u16));
        }
        KafkaCluster {
            settings: ClientSettings {
                bootstrap: vec![address(2)],
                security_protocol: SecurityProtocol::Plaintext,
                sasl: None,
                tls: None,
                client_id: None,
                request_timeout: std::time::Duration::from_millis(100),
            },
            metadata: RwLock::new(Arc::new(metadata)),
            slots: Mutex::new(HashMap::new()),
            lookups: Default::default(),
            lookup_retries: Default::default(),
            fetches: Default::default(),
            refreshes: Default::default(),
            silent: Mutex::new(HashMap::new()),
            producer_ids: Mutex::new(None),
        }
    }

    #[test]
    fn brokers_that_went_silent_are_asked_last() {
        let c = offline();
        assert_eq!(c.brokers_to_ask(), vec![1, 2, 3]);
        c.mark_silent(1);
        assert_eq!(c.brokers_to_ask(), vec![2, 3, 1]);
        c.mark_silent(3);
        assert_eq!(c.brokers_to_ask(), vec![2, 1, 3]);
        // Forgotten after SILENT_FOR.
        let long_ago = std::time::Instant::now() - SILENT_FOR - std::time::Duration::from_secs(1);
        c.silent.lock().unwrap().insert(1, long_ago);
        assert_eq!(c.brokers_to_ask(), vec![1, 2, 3]);
    }

    #[tokio::test]
    async fn a_broker_missing_from_the_metadata_is_stale_metadata_not_a_configuration_error() {
        let e = offline().dedicated_connection(7).await.unwrap_err();
        assert!(matches!(e, KafkaError::UnknownBroker { id: 7 }), "{e}");
        assert!(e.is_stale_metadata(), "a refresh and a retry help");
    }

    #[test]
    fn a_partition_keeps_its_data_channel_and_partitions_spread_over_all() {
        let mut used = std::collections::BTreeSet::new();
        for p in 0..16 {
            let c = data_channel("orders", p);
            assert!((1..=DATA_CHANNELS).contains(&c), "{c}");
            assert_eq!(c, data_channel("orders", p), "stable");
            used.insert(c);
        }
        assert_eq!(
            used.len(),
            DATA_CHANNELS,
            "never channel 0, every data channel used"
        );
        // FNV-1a's offset basis for the empty name: the hash does not depend on the process.
        assert_eq!(data_channel("", 0), 1 + 0x811c_9dc5 % DATA_CHANNELS);
    }
}
