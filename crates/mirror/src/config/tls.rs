//! TLS settings from Java client properties: host-name verification, the trust store and the
//! client's key store (PEM or PKCS12, as files or inline values; JKS refused with the
//! `keytool` line that converts it).

use super::values::Reader;
use kmirror_kafka::{KeyMaterial, Secret, TlsSettings, TrustMaterial};
use std::path::PathBuf;

/// `ssl.*` of one client; `None` when an error was recorded.
pub(super) fn tls(r: &mut Reader<'_>) -> Option<TlsSettings> {
    let verify_hostname = match r.get("ssl.endpoint.identification.algorithm") {
        None => true,
        Some(s) => match s.value.trim().to_ascii_lowercase().as_str() {
            "https" => true,
            "" => false,
            _ => {
                r.diags.error(
                    Some(&s.origin),
                    Some(&s.value),
                    "expected 'https' (verify the broker's host name, the default) or an empty value (do not verify)",
                );
                true
            }
        },
    };
    let trust = trust_material(r)?;
    let identity = key_material(r)?;
    Some(TlsSettings {
        trust,
        identity,
        verify_hostname,
    })
}

#[derive(PartialEq)]
enum StoreType {
    Pem,
    Pkcs12,
}

/// `ssl.<store>.type`, or a guess from the file name (Java's default type is JKS; a `.p12` file
/// loads in Java under that default too).
fn store_type(r: &mut Reader<'_>, store: &str) -> Option<StoreType> {
    let type_key = format!("ssl.{store}.type");
    let location_key = format!("ssl.{store}.location");
    let location = r
        .get(&location_key)
        .map(|s| s.value.trim().to_string())
        .unwrap_or_default();
    let (declared, origin, value) = match r.get(&type_key) {
        Some(s) => (
            s.value.trim().to_ascii_uppercase(),
            Some(s.origin.clone()),
            s.value.clone(),
        ),
        None => {
            let lower = location.to_ascii_lowercase();
            let guess = if lower.ends_with(".p12")
                || lower.ends_with(".pfx")
                || lower.ends_with(".pkcs12")
            {
                "PKCS12"
            } else if lower.ends_with(".pem") || lower.ends_with(".crt") || lower.ends_with(".cer")
            {
                "PEM"
            } else {
                "JKS"
            };
            (
                guess.to_string(),
                r.get(&location_key).map(|s| s.origin.clone()),
                location.clone(),
            )
        }
    };
    match declared.as_str() {
        "PEM" => Some(StoreType::Pem),
        "PKCS12" => Some(StoreType::Pkcs12),
        "JKS" => {
            let p12 = format!("{}.p12", location.trim_end_matches(".jks"));
            r.diags.error(
                origin.as_ref(),
                Some(&value),
                format!(
                    "JKS stores cannot be read by kmirror; convert to PKCS12 with \
                     `keytool -importkeystore -srckeystore {location} -srcstoretype JKS -destkeystore {p12} -deststoretype PKCS12` \
                     and set ssl.{store}.location={p12} and ssl.{store}.type=PKCS12 (or use PEM files with ssl.{store}.type=PEM)"
                ),
            );
            None
        }
        _ => {
            r.diags.error(
                origin.as_ref(),
                Some(&value),
                format!("unsupported {type_key}: expected PKCS12 or PEM"),
            );
            None
        }
    }
}

/// Kafka trims PASSWORD values like every other typed value.
fn secret(r: &Reader<'_>, key: &str) -> Option<Secret> {
    r.get(key).map(|s| Secret::new(s.value.trim()))
}

fn trust_material(r: &mut Reader<'_>) -> Option<TrustMaterial> {
    if let Some(s) = r.get("ssl.truststore.certificates") {
        return Some(TrustMaterial::PemInline {
            pem: Secret::new(s.value.clone()),
        });
    }
    let Some(loc) = r.get("ssl.truststore.location") else {
        return Some(TrustMaterial::SystemRoots);
    };
    let path = PathBuf::from(loc.value.trim());
    match store_type(r, "truststore")? {
        StoreType::Pem => Some(TrustMaterial::PemFile { path }),
        StoreType::Pkcs12 => Some(TrustMaterial::Pkcs12File {
            path,
            password: secret(r, "ssl.truststore.password"),
        }),
    }
}

fn key_material(r: &mut Reader<'_>) -> Option<Option<KeyMaterial>> {
    let key_password = secret(r, "ssl.key.password");
    if let Some(chain) = r.get("ssl.keystore.certificate.chain") {
        let Some(key) = r.get("ssl.keystore.key") else {
            r.diags.error(
                Some(&chain.origin),
                None,
                "ssl.keystore.certificate.chain needs ssl.keystore.key (the PEM private key)",
            );
            return None;
        };
        return Some(Some(KeyMaterial::PemInline {
            certificate_chain: Secret::new(chain.value.clone()),
            key: Secret::new(key.value.clone()),
            key_password,
        }));
    }
    let Some(loc) = r.get("ssl.keystore.location") else {
        return Some(None);
    };
    let path = PathBuf::from(loc.value.trim());
    Some(Some(match store_type(r, "keystore")? {
        StoreType::Pem => KeyMaterial::PemFile { path, key_password },
        StoreType::Pkcs12 => KeyMaterial::Pkcs12File {
            path,
            password: secret(r, "ssl.keystore.password"),
            key_password,
        },
    }))
}
