//! Fixtures shared by the unit tests of several modules.

use crate::config::mm2;
use crate::config::model::FlowConfig;
use crate::config::properties::Properties;
use crate::config::providers::SystemEnvironment;
use kmirror_kafka::admin::ConfigEntry;

/// The replicating flow A->B of a minimal MM2 file, plus `extra` lines.
pub(crate) fn flow(extra: &str) -> FlowConfig {
    let text = format!("clusters = A, B\nA.bootstrap.servers = a:1\nB.bootstrap.servers = b:1\nA->B.enabled = true\n{extra}");
    let c = mm2::load(
        &Properties::parse(&text, "t").unwrap(),
        &[],
        &SystemEnvironment,
    )
    .unwrap();
    c.flows.into_iter().find(|f| f.replication).unwrap()
}

/// A topic config entry with Kafka's ConfigSource `source`.
pub(crate) fn entry(name: &str, value: &str, source: i8) -> ConfigEntry {
    ConfigEntry {
        name: name.into(),
        value: Some(value.into()),
        source,
        read_only: false,
        sensitive: false,
    }
}
