//! Checks made before anything connects: the files TLS settings name exist (the clusters' and
//! the schema registries'). A missing truststore
//! found here is one clear configuration error naming the flow and the path, instead of a TLS
//! failure per connection attempt later.

use super::diagnostics::{ConfigError, Diagnostics};
use super::model::MirrorConfig;
use kmirror_kafka::{KeyMaterial, TrustMaterial};
use std::path::PathBuf;

/// Every TLS file of every flow's clients that is missing, as one error listing them all.
pub fn tls_files(cfg: &MirrorConfig) -> Result<(), ConfigError> {
    let mut missing = Vec::new();
    for f in &cfg.flows {
        let c = &f.clients;
        let registries = f
            .schemas
            .iter()
            .flat_map(|s| [&s.source.0.tls, &s.target.0.tls]);
        let clients = [
            &c.source_consumer,
            &c.source_admin,
            &c.target_producer,
            &c.target_admin,
        ]
        .into_iter()
        .map(|c| &c.tls);
        for tls in clients.chain(registries) {
            let Some(tls) = tls else { continue };
            let mut paths: Vec<PathBuf> = Vec::new();
            match &tls.trust {
                TrustMaterial::PemFile { path } | TrustMaterial::Pkcs12File { path, .. } => {
                    paths.push(path.clone())
                }
                _ => {}
            }
            match &tls.identity {
                Some(KeyMaterial::PemFile { path, .. })
                | Some(KeyMaterial::Pkcs12File { path, .. }) => paths.push(path.clone()),
                _ => {}
            }
            for p in paths {
                if !p.is_file() {
                    let line = format!(
                        "flow {}: TLS file {} does not exist or is not a file",
                        f.id,
                        p.display()
                    );
                    if !missing.contains(&line) {
                        missing.push(line);
                    }
                }
            }
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let mut d = Diagnostics::default();
    for m in missing {
        d.error(None, None, m);
    }
    Err(ConfigError(d))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::mm2;
    use crate::config::properties::Properties;
    use crate::config::providers::SystemEnvironment;

    fn config(truststore: &str) -> MirrorConfig {
        let text = format!(
            "clusters = A, B\nA.bootstrap.servers = a:9093\nB.bootstrap.servers = b:9092\n\
             A->B.enabled = true\nA.security.protocol = SSL\n\
             A.ssl.truststore.type = PEM\nA.ssl.truststore.location = {truststore}\n"
        );
        let props = Properties::parse(&text, "mm2.properties").unwrap();
        mm2::load(&props, &[], &SystemEnvironment).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_missing_truststore_is_named_once_with_its_flow() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nowhere.pem");
        let e = tls_files(&config(missing.to_str().unwrap()))
            .unwrap_err()
            .to_string();
        let line = format!(
            "flow A->B: TLS file {} does not exist or is not a file",
            missing.display()
        );
        assert_eq!(e.matches(&line).count(), 1, "{e}");

        let present = dir.path().join("ca.pem");
        std::fs::write(&present, "not checked here").unwrap();
        assert!(tls_files(&config(present.to_str().unwrap())).is_ok());
    }

    #[test]
    fn a_missing_registry_truststore_is_named_too() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("registry-ca.pem");
        let text = format!(
            "clusters = A, B\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\nA->B.enabled = true\n\
             A.schema.registry.url = https://sr-a:8081\nB.schema.registry.url = http://sr-b:8081\n\
             A.schema.registry.ssl.truststore.type = PEM\nA.schema.registry.ssl.truststore.location = {}\n",
            missing.display()
        );
        let props = Properties::parse(&text, "mm2.properties").unwrap();
        let cfg = mm2::load(&props, &[], &SystemEnvironment).unwrap();
        let e = tls_files(&cfg).unwrap_err().to_string();
        assert!(e.contains(&missing.display().to_string()), "{e}");
    }
}
