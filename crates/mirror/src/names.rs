//! Newtypes for the names kmirror passes around, so a cluster alias is never mistaken for a
//! topic.

use serde::Serialize;
use std::fmt;

/// A cluster alias from `clusters = A, B` (or a connector's `source.cluster.alias`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct ClusterAlias(String);

impl ClusterAlias {
    pub fn new(alias: impl Into<String>) -> Self {
        ClusterAlias(alias.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ClusterAlias {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A replication flow `source->target`, spelled as in MM2's `A->B.*` keys.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct FlowId {
    pub source: ClusterAlias,
    pub target: ClusterAlias,
}

impl FlowId {
    pub fn new(source: ClusterAlias, target: ClusterAlias) -> Self {
        FlowId { source, target }
    }

    /// Parses `A->B` (MM2 trims neither side; neither may be empty).
    pub fn parse(s: &str) -> Option<Self> {
        let (a, b) = s.split_once("->")?;
        if a.is_empty() || b.is_empty() || b.contains("->") {
            return None;
        }
        Some(FlowId::new(ClusterAlias::new(a), ClusterAlias::new(b)))
    }
}

impl fmt::Display for FlowId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}->{}", self.source, self.target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_ids_parse_and_print() {
        let f = FlowId::parse("A->B").unwrap();
        assert_eq!(f.source.as_str(), "A");
        assert_eq!(f.target.as_str(), "B");
        assert_eq!(f.to_string(), "A->B");
        assert_eq!(FlowId::parse("A->"), None);
        assert_eq!(FlowId::parse("->B"), None);
        assert_eq!(FlowId::parse("A-B"), None);
        assert_eq!(FlowId::parse("A->B->C"), None);
    }
}
