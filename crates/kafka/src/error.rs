//! The client's error type: every error names the broker and the API it concerns, and says
//! whether retrying can help. Credentials never appear in it.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::ApiKey;
use std::time::Duration;

/// Result alias for the client.
pub type Result<T, E = KafkaError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// Could not connect, or the connection broke.
    #[error("broker {broker}: {context}: {source}")]
    Io {
        broker: String,
        context: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The TLS configuration or handshake failed.
    #[error("broker {broker}: TLS: {message}")]
    Tls { broker: String, message: String },
    /// The broker rejected the credentials (or the exchange failed).
    #[error("broker {broker}: SASL/{mechanism} authentication failed: {message}")]
    Authentication {
        broker: String,
        mechanism: &'static str,
        message: String,
    },
    /// No OAuth token could be had from the token endpoint (KIP-768). Never holds the client
    /// secret or a token.
    #[error("OAuth token endpoint {endpoint}: {message}")]
    Token {
        endpoint: String,
        message: String,
        /// The endpoint could not be reached or answered 5xx/429: asking again may help.
        retriable: bool,
    },
    /// No Kerberos ticket could be had for a broker (SASL/GSSAPI). Never holds key material.
    #[error("Kerberos login as {principal}: {message}")]
    Kerberos {
        principal: String,
        message: String,
        /// The KDC could not be reached: asking again may help.
        retriable: bool,
    },
    /// No answer in time.
    #[error("broker {broker}: {api:?} timed out after {after:?}")]
    Timeout {
        broker: String,
        api: ApiKey,
        after: Duration,
    },
    /// The broker supports no version of an API this client speaks.
    #[error("broker {broker}: does not support {api:?} in any version kmirror speaks ({ours})")]
    UnsupportedVersion {
        broker: String,
        api: ApiKey,
        ours: String,
    },
    /// A response could not be decoded, or broke the protocol.
    #[error("broker {broker}: {api:?}: protocol error: {message}")]
    Protocol {
        broker: String,
        api: ApiKey,
        message: String,
    },
    /// The broker answered with a Kafka error code.
    #[error("broker {broker}: {api:?} failed: {error:?}{}", message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Broker {
        broker: String,
        api: ApiKey,
        error: ResponseError,
        message: Option<String>,
    },
    /// The connection was closed (by us or by the broker) while requests were pending.
    #[error("broker {broker}: connection closed")]
    Disconnected { broker: String },
    /// A fetch position outside the partition's log (retention removed it, or the topic was
    /// re-created).
    #[error("{topic}-{partition}: offset {requested} is out of range (the log holds {log_start}..{log_end})")]
    OffsetOutOfRange {
        topic: String,
        partition: i32,
        requested: i64,
        log_start: i64,
        log_end: i64,
    },
    /// A fetched batch failed its checks (CRC, framing, records): retrying reads the same bytes.
    #[error("{topic}-{partition}: the batch at offset {offset} is corrupt: {message}")]
    CorruptBatch {
        topic: String,
        partition: i32,
        offset: i64,
        message: String,
    },
    /// A batch larger than the producer may ever send.
    #[error("{topic}-{partition}: a batch of {size} bytes exceeds max.request.size ({limit} bytes) and can never be sent")]
    BatchTooLarge {
        topic: String,
        partition: i32,
        size: usize,
        limit: usize,
    },
    /// The metadata names a broker (a partition's leader, the controller) that is not in its
    /// broker list: it left, or was fenced, after the metadata was loaded. Stale metadata.
    #[error("broker {id} is not in the cluster metadata (it left or was fenced since the metadata was loaded)")]
    UnknownBroker { id: i32 },
    /// Another producer with the same transactional id took over; this one must stop.
    #[error("transactional producer '{transactional_id}' was fenced by a newer instance with the same transactional.id")]
    Fenced { transactional_id: String },
    /// A transactional lane of an earlier epoch of this process's own producer (its
    /// transaction was aborted and the id re-initialised): the lane must be made again.
    #[error("a lane of an earlier epoch of transactional producer '{transactional_id}' (its transaction was aborted)")]
    StaleProducer { transactional_id: String },
    /// A transaction of this transactional id stayed open on a partition after its coordinator
    /// completed it (the marker was dropped); it is settled before the partition is written
    /// again.
    #[error("{topic}-{partition}: a transaction of producer id {producer_id} stayed open from offset {offset} after its coordinator completed it; it is settled before the partition is written again")]
    HangingTransaction {
        topic: String,
        partition: i32,
        producer_id: i64,
        offset: i64,
    },
    /// Reading a log as read_committed, more records wait behind a transaction still open than
    /// the reader holds in memory (see `committed::CommittedView`).
    #[error("{topic}-{partition}: a transaction of producer id {producer_id}, open since offset {offset}, holds back more than {limit} records; it ends at its producer's transaction.timeout.ms, or abort it with kafka-transactions.sh")]
    OpenTransaction {
        topic: String,
        partition: i32,
        producer_id: i64,
        offset: i64,
        limit: usize,
    },
    /// The client was configured in a way it cannot work with.
    #[error("configuration: {0}")]
    Config(String),
}

/// A broker's refusal named for the decision it drives. The client classifies protocol error
/// codes here, so that nothing outside it matches them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The cluster has no authorizer (SECURITY_DISABLED): there are no ACLs to read or write.
    NoAuthorizer,
    /// Creating a topic that exists (another process, or a race).
    TopicExists,
    /// Creating a topic is not permitted, or the broker is too old to create topics this way;
    /// MM2 takes either to mean the operator made the topic (KAFKA-15465).
    CannotCreateTopics,
    /// A configuration value or request the broker does not accept (INVALID_CONFIG,
    /// INVALID_REQUEST).
    Invalid,
    /// A fetch or lookup position outside the partition's log.
    OffsetOutOfRange,
    /// The principal may not use the consumer group.
    GroupNotAuthorized,
    /// Another client uses the group id with a group protocol this one does not speak.
    OtherGroupProtocol,
    /// Another member took this one's `group.instance.id` (KIP-345).
    FencedInstance,
    /// The broker speaks no version of JoinGroup this client does (static membership needs
    /// KIP-345).
    NoStaticMembership,
    /// The group or transaction coordinator moved, is starting, or cannot be reached for now.
    CoordinatorMoved,
}

impl KafkaError {
    /// What this error says, if it is a refusal a caller decides on.
    pub fn refusal(&self) -> Option<Refusal> {
        use ResponseError as R;
        match self {
            KafkaError::OffsetOutOfRange { .. } => Some(Refusal::OffsetOutOfRange),
            KafkaError::UnsupportedVersion {
                api: ApiKey::JoinGroup,
                ..
            } => Some(Refusal::NoStaticMembership),
            KafkaError::UnsupportedVersion {
                api: ApiKey::CreateTopics,
                ..
            } => Some(Refusal::CannotCreateTopics),
            KafkaError::Broker {
                api: ApiKey::CreateTopics,
                error:
                    R::TopicAuthorizationFailed | R::ClusterAuthorizationFailed | R::UnsupportedVersion,
                ..
            } => Some(Refusal::CannotCreateTopics),
            KafkaError::Broker { error, .. } => match error {
                R::SecurityDisabled => Some(Refusal::NoAuthorizer),
                R::TopicAlreadyExists => Some(Refusal::TopicExists),
                R::InvalidConfig | R::InvalidRequest => Some(Refusal::Invalid),
                R::OffsetOutOfRange => Some(Refusal::OffsetOutOfRange),
                R::GroupAuthorizationFailed => Some(Refusal::GroupNotAuthorized),
                R::InconsistentGroupProtocol => Some(Refusal::OtherGroupProtocol),
                R::FencedInstanceId => Some(Refusal::FencedInstance),
                R::NotCoordinator | R::CoordinatorNotAvailable | R::CoordinatorLoadInProgress => {
                    Some(Refusal::CoordinatorMoved)
                }
                _ => None,
            },
            _ => None,
        }
    }

    /// Whether `refusal` is what this error says.
    pub fn is(&self, refusal: Refusal) -> bool {
        self.refusal() == Some(refusal)
    }

    /// A transactional producer's error after which its transaction can only be aborted: it
    /// was fenced or superseded, the broker lost its state, or a marker went missing (the next
    /// transaction settles the range left open before its first add, docs/engine.md).
    pub fn ends_transaction(&self) -> bool {
        use ResponseError as R;
        matches!(
            self,
            KafkaError::Fenced { .. }
                | KafkaError::StaleProducer { .. }
                | KafkaError::HangingTransaction { .. }
        ) || matches!(
            self,
            KafkaError::Broker {
                error: R::UnknownProducerId
                    | R::InvalidProducerEpoch
                    | R::ProducerFenced
                    | R::OutOfOrderSequenceNumber
                    | R::InvalidTxnState
                    | R::TransactionCoordinatorFenced
                    | R::ConcurrentTransactions,
                ..
            }
        )
    }

    /// The same error again, for each of several waiters on one request (a produce's partitions,
    /// a DescribeProducers' partitions): every variant and field kept, so that each copy is
    /// classified (`is_retriable`, `is_stale_metadata`, ...) as the original is. An I/O error
    /// keeps its kind and text.
    pub fn duplicate(&self) -> KafkaError {
        use KafkaError as E;
        match self {
            E::Io {
                broker,
                context,
                source,
            } => E::Io {
                broker: broker.clone(),
                context,
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            E::Tls { broker, message } => E::Tls {
                broker: broker.clone(),
                message: message.clone(),
            },
            E::Authentication {
                broker,
                mechanism,
                message,
            } => E::Authentication {
                broker: broker.clone(),
                mechanism,
                message: message.clone(),
            },
            E::Token {
                endpoint,
                message,
                retriable,
            } => E::Token {
                endpoint: endpoint.clone(),
                message: message.clone(),
                retriable: *retriable,
            },
            E::Kerberos {
                principal,
                message,
                retriable,
            } => E::Kerberos {
                principal: principal.clone(),
                message: message.clone(),
                retriable: *retriable,
            },
            E::Timeout { broker, api, after } => E::Timeout {
                broker: broker.clone(),
                api: *api,
                after: *after,
            },
            E::UnsupportedVersion { broker, api, ours } => E::UnsupportedVersion {
                broker: broker.clone(),
                api: *api,
                ours: ours.clone(),
            },
            E::Protocol {
                broker,
                api,
                message,
            } => E::Protocol {
                broker: broker.clone(),
                api: *api,
                message: message.clone(),
            },
            E::Broker {
                broker,
                api,
                error,
                message,
            } => E::Broker {
                broker: broker.clone(),
                api: *api,
                error: *error,
                message: message.clone(),
            },
            E::Disconnected { broker } => E::Disconnected {
                broker: broker.clone(),
            },
            E::OffsetOutOfRange {
                topic,
                partition,
                requested,
                log_start,
                log_end,
            } => E::OffsetOutOfRange {
                topic: topic.clone(),
                partition: *partition,
                requested: *requested,
                log_start: *log_start,
                log_end: *log_end,
            },
            E::CorruptBatch {
                topic,
                partition,
                offset,
                message,
            } => E::CorruptBatch {
                topic: topic.clone(),
                partition: *partition,
                offset: *offset,
                message: message.clone(),
            },
            E::BatchTooLarge {
                topic,
                partition,
                size,
                limit,
            } => E::BatchTooLarge {
                topic: topic.clone(),
                partition: *partition,
                size: *size,
                limit: *limit,
            },
            E::UnknownBroker { id } => E::UnknownBroker { id: *id },
            E::Fenced { transactional_id } => E::Fenced {
                transactional_id: transactional_id.clone(),
            },
            E::StaleProducer { transactional_id } => E::StaleProducer {
                transactional_id: transactional_id.clone(),
            },
            E::HangingTransaction {
                topic,
                partition,
                producer_id,
                offset,
            } => E::HangingTransaction {
                topic: topic.clone(),
                partition: *partition,
                producer_id: *producer_id,
                offset: *offset,
            },
            E::OpenTransaction {
                topic,
                partition,
                producer_id,
                offset,
                limit,
            } => E::OpenTransaction {
                topic: topic.clone(),
                partition: *partition,
                producer_id: *producer_id,
                offset: *offset,
                limit: *limit,
            },
            E::Config(message) => E::Config(message.clone()),
        }
    }

    /// Whether the error means our idea of partition leadership is stale, so a metadata refresh
    /// and a retry will help. Such errors are returned before anything was written.
    pub fn is_stale_metadata(&self) -> bool {
        matches!(self, KafkaError::UnknownBroker { .. })
            || matches!(
                self,
                KafkaError::Broker {
                    error: ResponseError::NotLeaderOrFollower
                        | ResponseError::UnknownTopicOrPartition
                        | ResponseError::LeaderNotAvailable
                        | ResponseError::FencedLeaderEpoch
                        | ResponseError::UnknownLeaderEpoch
                        | ResponseError::UnknownTopicId
                        | ResponseError::InconsistentTopicId,
                    ..
                }
            )
    }

    /// Whether retrying the same operation (after a reconnect or a metadata refresh) can succeed.
    pub fn is_retriable(&self) -> bool {
        match self {
            KafkaError::Io { .. }
            | KafkaError::Timeout { .. }
            | KafkaError::Disconnected { .. } => true,
            KafkaError::Token { retriable, .. } | KafkaError::Kerberos { retriable, .. } => {
                *retriable
            }
            // CONCURRENT_TRANSACTIONS: the previous transaction is still completing; the Java
            // producer retries it too.
            // CORRUPT_MESSAGE is retriable for Kafka (the bytes may have been damaged on the
            // way), but kmirror sends and reads the same bytes again: a produce or a fetch that
            // met it stops its partition with the error rather than retrying it forever.
            KafkaError::Broker { error, .. } => {
                (error.is_retriable() && *error != ResponseError::CorruptMessage)
                    || *error == ResponseError::ConcurrentTransactions
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn broker(api: ApiKey, error: ResponseError) -> KafkaError {
        KafkaError::Broker {
            broker: "1".into(),
            api,
            error,
            message: None,
        }
    }

    #[test]
    fn refusals_are_named_for_the_decision_they_drive() {
        use ResponseError as R;
        let cases = [
            (
                broker(ApiKey::DescribeAcls, R::SecurityDisabled),
                Some(Refusal::NoAuthorizer),
            ),
            (
                broker(ApiKey::CreateTopics, R::TopicAlreadyExists),
                Some(Refusal::TopicExists),
            ),
            (
                broker(ApiKey::CreateTopics, R::TopicAuthorizationFailed),
                Some(Refusal::CannotCreateTopics),
            ),
            // Not permitted to write a topic is no reason to take it as created.
            (broker(ApiKey::Produce, R::TopicAuthorizationFailed), None),
            (
                broker(ApiKey::AlterConfigs, R::InvalidConfig),
                Some(Refusal::Invalid),
            ),
            (
                broker(ApiKey::Fetch, R::OffsetOutOfRange),
                Some(Refusal::OffsetOutOfRange),
            ),
            (
                KafkaError::OffsetOutOfRange {
                    topic: "t".into(),
                    partition: 0,
                    requested: 5,
                    log_start: 9,
                    log_end: 12,
                },
                Some(Refusal::OffsetOutOfRange),
            ),
            (
                broker(ApiKey::JoinGroup, R::GroupAuthorizationFailed),
                Some(Refusal::GroupNotAuthorized),
            ),
            (
                broker(ApiKey::JoinGroup, R::InconsistentGroupProtocol),
                Some(Refusal::OtherGroupProtocol),
            ),
            (
                broker(ApiKey::SyncGroup, R::FencedInstanceId),
                Some(Refusal::FencedInstance),
            ),
            (
                KafkaError::UnsupportedVersion {
                    broker: "1".into(),
                    api: ApiKey::JoinGroup,
                    ours: "v5-v9".into(),
                },
                Some(Refusal::NoStaticMembership),
            ),
            (
                broker(ApiKey::EndTxn, R::NotCoordinator),
                Some(Refusal::CoordinatorMoved),
            ),
            (broker(ApiKey::Produce, R::NotLeaderOrFollower), None),
            (KafkaError::Disconnected { broker: "1".into() }, None),
        ];
        for (e, want) in cases {
            assert_eq!(e.refusal(), want, "{e:?}");
        }
    }

    #[test]
    fn a_fenced_or_stateless_producer_ends_its_transaction_and_a_moved_leader_does_not() {
        use ResponseError as R;
        for code in [
            R::ProducerFenced,
            R::InvalidProducerEpoch,
            R::UnknownProducerId,
            R::InvalidTxnState,
        ] {
            assert!(broker(ApiKey::Produce, code).ends_transaction(), "{code:?}");
        }
        assert!(KafkaError::Fenced {
            transactional_id: "x".into()
        }
        .ends_transaction());
        assert!(!broker(ApiKey::Produce, R::NotLeaderOrFollower).ends_transaction());
        assert!(!KafkaError::Disconnected { broker: "1".into() }.ends_transaction());
    }

    /// Each copy is classified as its original: what a lane does with a failure (refresh,
    /// retry, stop) must not depend on how many partitions shared the request.
    #[test]
    fn a_duplicate_is_classified_as_the_original() {
        let errors = [
            KafkaError::UnknownBroker { id: 3 },
            KafkaError::Io {
                broker: "1".into(),
                context: "read",
                source: std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset"),
            },
            KafkaError::Token {
                endpoint: "https://127.0.0.1/token".into(),
                message: "503".into(),
                retriable: true,
            },
            KafkaError::Broker {
                broker: "1".into(),
                api: ApiKey::Produce,
                error: ResponseError::NotLeaderOrFollower,
                message: None,
            },
            KafkaError::Broker {
                broker: "1".into(),
                api: ApiKey::Produce,
                error: ResponseError::CorruptMessage,
                message: Some("crc".into()),
            },
            KafkaError::Protocol {
                broker: "1".into(),
                api: ApiKey::Produce,
                message: "short frame".into(),
            },
        ];
        for e in &errors {
            let d = e.duplicate();
            assert_eq!(d.is_retriable(), e.is_retriable(), "{e:?}");
            assert_eq!(d.is_stale_metadata(), e.is_stale_metadata(), "{e:?}");
            assert_eq!(d.to_string(), e.to_string());
            assert_eq!(
                std::mem::discriminant(&d),
                std::mem::discriminant(e),
                "{e:?}"
            );
        }
    }
}
