//! The remote topics the flows of this process write, per target cluster. Two flows into one
//! target must not write one remote topic: with `IdentityReplicationPolicy`, `orders` of A and
//! `orders` of B would both be C's `orders`, mixing the two sources' records, and each flow's
//! positions and offset syncs would describe a log the other also writes (docs/topologies.md).
//! The first flow to claim a name keeps it; the other skips that topic and says why. Within
//! one flow, two source topics cannot take one name either (a rename onto another topic's
//! remote name). The flow's checkpoints and ACL sync respect the claims too, so the flow that
//! lost a name never writes checkpoints, group offsets or ACLs for the other's topic.

use std::collections::HashMap;
use std::sync::Mutex;

/// Who writes a remote topic: the flow and its source topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Claim {
    pub(crate) flow: String,
    pub(crate) source_topic: String,
}

#[derive(Debug, Default)]
pub(crate) struct RemoteClaims(Mutex<HashMap<(String, String), Claim>>);

impl RemoteClaims {
    /// Claims `remote` on `target` for `flow`'s topic `source_topic`; the claim held by another
    /// flow, if any. Claiming again what one holds is allowed (every topic refresh does).
    pub(crate) fn claim(
        &self,
        target: &str,
        remote: &str,
        flow: &str,
        source_topic: &str,
    ) -> Result<(), Claim> {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let held = m
            .entry((target.to_string(), remote.to_string()))
            .or_insert_with(|| Claim {
                flow: flow.to_string(),
                source_topic: source_topic.to_string(),
            });
        if held.flow == flow && held.source_topic == source_topic {
            Ok(())
        } else {
            Err(held.clone())
        }
    }

    /// Whether another flow holds `remote` on `target`.
    pub(crate) fn taken_by_other(&self, target: &str, remote: &str, flow: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(target.to_string(), remote.to_string()))
            .is_some_and(|c| c.flow != flow)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_flow_keeps_a_remote_name_on_its_target() {
        let c = RemoteClaims::default();
        assert_eq!(c.claim("C", "orders", "A->C", "orders"), Ok(()));
        assert_eq!(c.claim("C", "orders", "A->C", "orders"), Ok(()), "again");
        assert_eq!(
            c.claim("C", "orders", "B->C", "orders"),
            Err(Claim {
                flow: "A->C".into(),
                source_topic: "orders".into()
            })
        );
        // Another target, or another name: no conflict.
        assert_eq!(c.claim("D", "orders", "B->D", "orders"), Ok(()));
        assert_eq!(c.claim("C", "B.orders", "B->C", "orders"), Ok(()));
        // One flow, two source topics onto one name (a rename onto another's remote name).
        assert!(c.claim("C", "B.orders", "B->C", "payments").is_err());
        assert!(c.taken_by_other("C", "orders", "B->C"));
        assert!(!c.taken_by_other("C", "orders", "A->C"));
        assert!(!c.taken_by_other("C", "nobody", "A->C"));
    }
}
