//! FindCoordinator: which broker coordinates a consumer group (key type 0) or a transactional id
//! (key type 1). Used by the admin calls on groups, group membership and transactions.

use crate::cluster::KafkaCluster;
use crate::conn::Connection;
use crate::error::{KafkaError, Result};
use kafka_protocol::error::ParseResponseErrorCode;
use kafka_protocol::messages::{ApiKey, FindCoordinatorRequest};
use kafka_protocol::protocol::StrBytes;
use std::sync::Arc;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// FindCoordinator for a group (key type 0) or a transactional id (key type 1).
pub(crate) async fn find_coordinator(
    cluster: &KafkaCluster,
    key: &str,
    key_type: i8,
) -> Result<Arc<Connection>> {
    let node = find_coordinator_node(cluster, key, key_type).await?;
    cluster.broker(node).await
}

/// The broker id of the coordinator of a group (key type 0) or a transactional id (key type 1).
pub async fn find_coordinator_node(cluster: &KafkaCluster, key: &str, key_type: i8) -> Result<i32> {
    let conn = cluster.any_broker().await?;
    let version = conn.version::<FindCoordinatorRequest>()?;
    let mut req = FindCoordinatorRequest::default().with_key_type(key_type);
    req = if version >= 4 {
        req.with_coordinator_keys(vec![s(key)])
    } else {
        req.with_key(s(key))
    };
    let resp = conn.submit(&req, version).await?.wait().await?;
    let (node, code) = if version >= 4 {
        let c = resp
            .coordinators
            .first()
            .ok_or_else(|| KafkaError::Protocol {
                broker: conn.broker().into(),
                api: ApiKey::FindCoordinator,
                message: "no coordinator".into(),
            })?;
        (c.node_id.0, c.error_code)
    } else {
        (resp.node_id.0, resp.error_code)
    };
    if let Some(error) = code.err() {
        return Err(KafkaError::Broker {
            broker: conn.broker().into(),
            api: ApiKey::FindCoordinator,
            error,
            message: None,
        });
    }
    Ok(node)
}
