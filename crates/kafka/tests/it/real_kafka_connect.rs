//! Connections against real brokers: every security variant authenticates and then answers a
//! Metadata request; wrong credentials fail fast with an error naming the mechanism.

use kafka_protocol::messages::MetadataRequest;
use kmirror_kafka::conn::Connection;
use kmirror_kafka::{
    BrokerAddress, ClientSettings, KafkaError, KeyMaterial, SaslCredentials, SaslMechanism, Secret,
    SecurityProtocol, TlsSettings, TrustMaterial,
};
use kmirror_testkit::{Cluster, Security};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn settings(c: &Cluster, protocol: SecurityProtocol) -> ClientSettings {
    let (host, port) = c.bootstrap().rsplit_once(':').unwrap();
    ClientSettings {
        bootstrap: vec![BrokerAddress {
            host: host.into(),
            port: port.parse().unwrap(),
        }],
        security_protocol: protocol,
        sasl: None,
        tls: None,
        client_id: Some("kmirror-test".into()),
        request_timeout: Duration::from_secs(10),
    }
}

fn sasl(mechanism: SaslMechanism, user: &str, password: &str) -> Option<SaslCredentials> {
    Some(SaslCredentials {
        mechanism,
        username: user.into(),
        password: Secret::new(password),
        oauth: None,
        aws: None,
        kerberos: None,
    })
}

fn tls(c: &Cluster, client_cert: Option<KeyMaterial>) -> Option<TlsSettings> {
    Some(TlsSettings {
        trust: TrustMaterial::PemFile {
            path: PathBuf::from(c.env("SSL_CA_PEM").expect("SSL_CA_PEM")),
        },
        identity: client_cert,
        verify_hostname: true,
    })
}

async fn connect(s: &ClientSettings) -> Result<Connection, KafkaError> {
    let b = &s.bootstrap[0];
    Connection::connect(&b.host, b.port, b.to_string(), s).await
}

/// Connects and checks a real request works: the cluster id and the one broker come back.
async fn assert_metadata(s: &ClientSettings, c: &Cluster) {
    let conn = connect(s)
        .await
        .unwrap_or_else(|e| panic!("{:?} to {}: {e}", s.security_protocol, c.name));
    let md = conn
        .send(&MetadataRequest::default().with_topics(None))
        .await
        .unwrap();
    assert_eq!(
        md.cluster_id.as_ref().map(|s| s.to_string()).as_deref(),
        c.env("CLUSTER_ID")
    );
    assert_eq!(md.brokers.len(), 1);
    assert_eq!(md.brokers[0].port.to_string(), c.env("PORT").unwrap());
    conn.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_security_variant_connects_and_bad_credentials_fail_fast() {
    let (plain, scram, mtls) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("conn-plain", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("conn-scram", Security::Scram).unwrap());
        let c = s.spawn(|| Cluster::start("conn-mtls", Security::Mtls).unwrap());
        (a.join().unwrap(), b.join().unwrap(), c.join().unwrap())
    });

    assert_metadata(&settings(&plain, SecurityProtocol::Plaintext), &plain).await;

    for (mechanism, user, pw) in [
        (SaslMechanism::Plain, "alice", "alice-secret"),
        (SaslMechanism::ScramSha256, "alice", "alice-secret"),
        (SaslMechanism::ScramSha512, "bob", "bob-secret"),
    ] {
        let mut s = settings(&scram, SecurityProtocol::SaslPlaintext);
        s.sasl = sasl(mechanism, user, pw);
        assert_metadata(&s, &scram).await;
        // A wrong password: an authentication error naming the mechanism, quickly, never a hang.
        s.sasl = sasl(mechanism, user, "wrong-password");
        let t0 = Instant::now();
        let err = connect(&s).await.expect_err("wrong password accepted");
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "took {:?}",
            t0.elapsed()
        );
        let msg = err.to_string();
        assert!(matches!(err, KafkaError::Authentication { .. }), "{msg}");
        assert!(
            msg.contains(&format!(
                "SASL/{} authentication failed",
                mechanism.as_str()
            )),
            "{msg}"
        );
        assert!(!msg.contains("wrong-password"), "{msg}");
    }

    // mTLS with a PEM certificate and key, and with the PKCS#12 keystore.
    let key = std::fs::read_to_string(mtls.env("SSL_CLIENT_KEY_PEM").unwrap()).unwrap();
    let cert = std::fs::read_to_string(mtls.env("SSL_CLIENT_CERT_PEM").unwrap()).unwrap();
    // Removed with `dir` (it holds a private key).
    let dir = tempfile::tempdir().unwrap();
    let combined = dir.path().join("client-combined.pem");
    std::fs::write(&combined, format!("{cert}\n{key}")).unwrap();
    let mut s = settings(&mtls, SecurityProtocol::Ssl);
    s.tls = tls(
        &mtls,
        Some(KeyMaterial::PemFile {
            path: combined,
            key_password: None,
        }),
    );
    assert_metadata(&s, &mtls).await;
    s.tls = tls(
        &mtls,
        Some(KeyMaterial::Pkcs12File {
            path: PathBuf::from(mtls.env("SSL_KEYSTORE_P12").unwrap()),
            password: Some(Secret::new(mtls.env("SSL_STORE_PASSWORD").unwrap())),
            key_password: None,
        }),
    );
    assert_metadata(&s, &mtls).await;
    // Without a client certificate the broker refuses the connection.
    s.tls = tls(&mtls, None);
    let refused = async { connect(&s).await?.send(&MetadataRequest::default()).await };
    assert!(
        refused.await.is_err(),
        "mTLS broker accepted a client without a certificate"
    );
}
