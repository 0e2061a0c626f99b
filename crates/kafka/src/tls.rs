//! rustls client configuration from [`TlsSettings`]: trust anchors from the system, PEM or
//! PKCS#12, an optional client certificate for mutual TLS, and host-name verification that can be
//! turned off explicitly (Kafka's `ssl.endpoint.identification.algorithm=`), never silently.

use crate::settings::{KeyMaterial, TlsSettings, TrustMaterial};
use p12_keystore::{KeyStore, KeyStoreEntry, Pkcs12ImportPolicy};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use std::path::Path;
use std::sync::Arc;

/// Builds the client configuration. Errors name the file or setting at fault.
pub fn client_config(tls: &TlsSettings) -> Result<Arc<ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    match &tls.trust {
        TrustMaterial::SystemRoots => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(
                    "no system root certificates found; set ssl.truststore.location".into(),
                );
            }
        }
        TrustMaterial::PemFile { path } => add_all(
            &mut roots,
            pem_certs(&read(path)?, &path.display().to_string())?,
            path,
        )?,
        TrustMaterial::PemInline { pem } => add_all(
            &mut roots,
            pem_certs(pem.expose().as_bytes(), "ssl.truststore.certificates")?,
            Path::new("ssl.truststore.certificates"),
        )?,
        TrustMaterial::Pkcs12File { path, password } => {
            let store = pkcs12(path, password.as_ref().map(|p| p.expose()).unwrap_or(""))?;
            let mut certs = Vec::new();
            for (_, entry) in store.entries() {
                match entry {
                    KeyStoreEntry::Certificate(c) => {
                        certs.push(CertificateDer::from(c.as_der().to_vec()))
                    }
                    KeyStoreEntry::PrivateKeyChain(chain) => certs.extend(
                        chain
                            .certs()
                            .iter()
                            .map(|c| CertificateDer::from(c.as_der().to_vec())),
                    ),
                    KeyStoreEntry::Secret(_) => {}
                }
            }
            add_all(&mut roots, certs, path)?;
        }
    }
    let roots = Arc::new(roots);
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = if tls.verify_hostname {
        builder.with_root_certificates(roots)
    } else {
        let inner = WebPkiServerVerifier::builder_with_provider(roots, provider)
            .build()
            .map_err(|e| e.to_string())?;
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoHostnameVerifier { inner }))
    };
    let config = match &tls.identity {
        None => builder.with_no_client_auth(),
        Some(identity) => {
            let (chain, key) = identity_material(identity)?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("client certificate: {e}"))?
        }
    };
    Ok(Arc::new(config))
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

fn pem_certs(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(pem).collect();
    let certs = certs.map_err(|e| format!("{what}: not valid PEM: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{what}: no CERTIFICATE block found"));
    }
    Ok(certs)
}

fn add_all(
    roots: &mut RootCertStore,
    certs: Vec<CertificateDer<'static>>,
    from: &Path,
) -> Result<(), String> {
    let (added, _ignored) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(format!("{}: no usable CA certificate", from.display()));
    }
    Ok(())
}

fn pkcs12(path: &Path, password: &str) -> Result<KeyStore, String> {
    KeyStore::from_pkcs12(&read(path)?, password, Pkcs12ImportPolicy::Relaxed).map_err(|e| {
        format!(
            "{}: cannot open the PKCS#12 store (wrong password?): {e:?}",
            path.display()
        )
    })
}

type Identity = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

fn identity_material(identity: &KeyMaterial) -> Result<Identity, String> {
    match identity {
        KeyMaterial::PemFile { path, key_password } => {
            if key_password.is_some() {
                return Err(format!("{}: encrypted PEM private keys are not supported; store the key unencrypted (PKCS#8) or use a PKCS12 keystore", path.display()));
            }
            let data = read(path)?;
            let chain = pem_certs(&data, &path.display().to_string())?;
            let key = PrivateKeyDer::from_pem_slice(&data)
                .map_err(|e| format!("{}: no private key: {e}", path.display()))?;
            Ok((chain, key))
        }
        KeyMaterial::PemInline {
            certificate_chain,
            key,
            key_password,
        } => {
            if key_password.is_some() {
                return Err(
                    "ssl.keystore.key: encrypted PEM private keys are not supported".into(),
                );
            }
            let chain = pem_certs(
                certificate_chain.expose().as_bytes(),
                "ssl.keystore.certificate.chain",
            )?;
            let key = PrivateKeyDer::from_pem_slice(key.expose().as_bytes())
                .map_err(|e| format!("ssl.keystore.key: {e}"))?;
            Ok((chain, key))
        }
        KeyMaterial::Pkcs12File { path, password, .. } => {
            let store = pkcs12(path, password.as_ref().map(|p| p.expose()).unwrap_or(""))?;
            let (_, chain) = store.private_key_chain().ok_or_else(|| {
                format!(
                    "{}: the keystore holds no private key with a certificate",
                    path.display()
                )
            })?;
            let certs = chain
                .certs()
                .iter()
                .map(|c| CertificateDer::from(c.as_der().to_vec()))
                .collect();
            let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(chain.key().as_der().to_vec()));
            Ok((certs, key))
        }
    }
}

/// The server name to verify: an IP address or a DNS name.
pub fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(host.to_string())
        .map_err(|e| format!("'{host}' is not a valid TLS server name: {e}"))
}

/// Verifies the chain and signatures as usual, but accepts a certificate issued for another name
/// (only when the user set `ssl.endpoint.identification.algorithm` empty).
#[derive(Debug)]
struct NoHostnameVerifier {
    inner: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for NoHostnameVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(CertificateError::NotValidForName))
            | Err(rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
                ..
            })) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(m, c, d)
    }

    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(m, c, d)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
