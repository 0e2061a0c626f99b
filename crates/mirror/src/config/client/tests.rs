//! Unit tests of `client`, kept apart so the module reads on its own.

use super::super::diagnostics::Origin;
use super::super::values::Setting;
use super::*;
use kmirror_kafka::{KeyMaterial, TrustMaterial};
use std::sync::Arc;

fn map(pairs: &[(&str, &str)]) -> SettingMap {
    pairs
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                Setting {
                    value: v.to_string(),
                    origin: Origin {
                        file: Arc::from("c.properties"),
                        line: 1,
                        key: format!("A.{k}"),
                    },
                },
            )
        })
        .collect()
}

fn conn(pairs: &[(&str, &str)]) -> (Option<ClientSettings>, Vec<String>) {
    let mut d = Diagnostics::default();
    let c = connection(&map(pairs), "cluster A", "A.bootstrap.servers", &mut d);
    (c, d.items.iter().map(|x| x.to_string()).collect())
}

const JAAS_PLAIN: &str = r#"org.apache.kafka.common.security.plain.PlainLoginModule required username="mm2" password="p@ss;w\"rd";"#;

#[test]
fn plaintext_and_bootstrap_lists() {
    let (c, e) = conn(&[("bootstrap.servers", "a1:9092, a2:9093,[::1]:9094")]);
    assert!(e.is_empty(), "{e:?}");
    let c = c.unwrap();
    assert_eq!(c.security_protocol, SecurityProtocol::Plaintext);
    let addrs: Vec<String> = c.bootstrap.iter().map(|b| b.to_string()).collect();
    assert_eq!(addrs, ["a1:9092", "a2:9093", "[::1]:9094"]);
    for (bad, needle) in [
        ("a1", "is not host:port"),
        ("a1:0", "invalid port"),
        ("a1:x", "invalid port"),
        (":9092", "is not host:port"),
    ] {
        let (c, e) = conn(&[("bootstrap.servers", bad)]);
        assert!(c.is_none());
        assert!(e[0].contains(needle), "{bad}: {e:?}");
    }
    let (_, e) = conn(&[]);
    assert_eq!(
        e,
        ["error: cluster A has no bootstrap servers: set A.bootstrap.servers"]
    );
    let (_, e) = conn(&[("bootstrap.servers", " ")]);
    assert!(e[0].contains("empty bootstrap server list"), "{e:?}");
}

#[test]
fn sasl_plain_and_scram() {
    let (c, e) = conn(&[
        ("bootstrap.servers", "b:9092"),
        ("security.protocol", "SASL_PLAINTEXT"),
        ("sasl.mechanism", "PLAIN"),
        ("sasl.jaas.config", JAAS_PLAIN),
    ]);
    assert!(e.is_empty(), "{e:?}");
    let sasl = c.unwrap().sasl.unwrap();
    assert_eq!(sasl.username, "mm2");
    assert_eq!(sasl.password.expose(), "p@ss;w\"rd");
    let scram = parse_jaas(
        "org.apache.kafka.common.security.scram.ScramLoginModule required\n  username=alice\n  password=\"a b\";",
        SaslMechanism::ScramSha512,
    )
    .unwrap();
    assert_eq!(scram.username, "alice");
    assert_eq!(scram.password.expose(), "a b");
}

#[test]
fn jaas_errors_never_show_the_password() {
    let cases = [
        (
            r#"org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="hunter2""#,
            "missing ';'",
        ),
        (
            r#"org.apache.kafka.common.security.plain.PlainLoginModule username="u" password="hunter2";"#,
            "control flag",
        ),
        (
            r#"org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="hunter2;"#,
            "unterminated",
        ),
        (
            r#"org.apache.kafka.common.security.plain.PlainLoginModule required password="hunter2";"#,
            "no username",
        ),
        (
            r#"org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="hunter2";"#,
            "does not match sasl.mechanism=PLAIN",
        ),
        (
            r#"com.sun.security.auth.module.Krb5LoginModule required password="hunter2";"#,
            "unsupported login module",
        ),
    ];
    for (jaas, needle) in cases {
        let err = parse_jaas(jaas, SaslMechanism::Plain).unwrap_err();
        assert!(err.contains(needle), "{jaas}: {err}");
        assert!(!err.contains("hunter2"), "{err}");
        let (_, e) = conn(&[
            ("bootstrap.servers", "b:9092"),
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "PLAIN"),
            ("sasl.jaas.config", jaas),
        ]);
        assert!(e.iter().all(|m| !m.contains("hunter2")), "{e:?}");
    }
}

#[test]
fn sasl_settings_errors() {
    let (_, e) = conn(&[
        ("bootstrap.servers", "b:1"),
        ("security.protocol", "SASL_PLAINTEXT"),
    ]);
    // Java's default mechanism, GSSAPI, then wants its JAAS line.
    assert!(
        e[0].contains("uses SASL/GSSAPI (sasl.mechanism is not set, so Kafka's default applies) but sasl.jaas.config is not set")
            && e[0].contains("c.properties:"),
        "{e:?}"
    );
    let (_, e) = conn(&[
        ("bootstrap.servers", "b:1"),
        ("security.protocol", "SASL_PLAINTEXT"),
        ("sasl.mechanism", "PLAIN"),
    ]);
    assert!(e[0].contains("sasl.jaas.config is not set"), "{e:?}");
    let (_, e) = conn(&[
        ("bootstrap.servers", "b:1"),
        ("security.protocol", "KERBEROS"),
    ]);
    assert_eq!(e, ["error: c.properties:1: A.security.protocol = 'KERBEROS': unsupported security protocol: expected one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"]);
}

#[test]
fn tls_stores() {
    let (c, e) = conn(&[
        ("bootstrap.servers", "b:9093"),
        ("security.protocol", "SSL"),
        ("ssl.truststore.location", "/etc/k/ca.pem"),
        ("ssl.keystore.location", "/etc/k/client.p12"),
        ("ssl.keystore.password", "ks"),
        ("ssl.endpoint.identification.algorithm", ""),
    ]);
    assert!(e.is_empty(), "{e:?}");
    let tls = c.unwrap().tls.unwrap();
    assert!(!tls.verify_hostname);
    assert_eq!(
        tls.trust,
        TrustMaterial::PemFile {
            path: "/etc/k/ca.pem".into()
        }
    );
    assert!(matches!(tls.identity, Some(KeyMaterial::Pkcs12File { .. })));
    let (c, _) = conn(&[
        ("bootstrap.servers", "b:9093"),
        ("security.protocol", "SSL"),
    ]);
    let tls = c.unwrap().tls.unwrap();
    assert_eq!(tls.trust, TrustMaterial::SystemRoots);
    assert!(tls.verify_hostname);
    let (_, e) = conn(&[
        ("bootstrap.servers", "b:9093"),
        ("security.protocol", "SSL"),
        ("ssl.truststore.location", "/etc/k/truststore.jks"),
        ("ssl.truststore.password", "changeit"),
    ]);
    assert!(e[0].contains("JKS stores cannot be read by kmirror; convert to PKCS12 with `keytool -importkeystore -srckeystore /etc/k/truststore.jks"), "{e:?}");
    assert!(
        e[0].contains("-destkeystore /etc/k/truststore.p12"),
        "{e:?}"
    );
    let (_, e) = conn(&[
        ("bootstrap.servers", "b:9093"),
        ("security.protocol", "SSL"),
        ("ssl.truststore.location", "/etc/k/store"),
        ("ssl.truststore.type", "BCFKS"),
    ]);
    assert!(e[0].contains("expected PKCS12 or PEM"), "{e:?}");
    let (_, e) = conn(&[
        ("bootstrap.servers", "b:9093"),
        ("security.protocol", "SSL"),
        ("ssl.endpoint.identification.algorithm", "http"),
    ]);
    assert!(e[0].contains("expected 'https'"), "{e:?}");
}

#[test]
fn tuning_defaults_and_overrides() {
    let mut d = Diagnostics::default();
    let c = consumer_tuning(&map(&[]), &mut d);
    assert_eq!(c, ConsumerTuning::default());
    assert_eq!(c.isolation_level, IsolationLevel::ReadCommitted);
    let c = consumer_tuning(
        &map(&[
            ("fetch.max.bytes", "1000"),
            ("isolation.level", "read_uncommitted"),
            ("auto.offset.reset", "latest"),
        ]),
        &mut d,
    );
    assert_eq!(
        (c.fetch_max_bytes, c.isolation_level, c.auto_offset_reset),
        (
            1000,
            IsolationLevel::ReadUncommitted,
            AutoOffsetReset::Latest
        )
    );
    let p = producer_tuning(
        &map(&[
            ("compression.type", "zstd"),
            ("linger.ms", "50"),
            ("acks", "-1"),
            ("buffer.memory", "8388608"),
        ]),
        &mut d,
    );
    assert_eq!(
        (p.compression, p.linger.as_millis(), p.acks, p.buffer_memory),
        (Compression::Zstd, 50, Acks::All, 8_388_608)
    );
    assert_eq!(
        producer_tuning(&map(&[]), &mut d).buffer_memory,
        33_554_432,
        "the Java producer's default"
    );
    assert!(d.items.is_empty(), "{:?}", d.items);
    let _ = producer_tuning(
        &map(&[("compression.type", "brotli"), ("acks", "1")]),
        &mut d,
    );
    let msgs: Vec<String> = d.items.iter().map(|x| x.to_string()).collect();
    assert!(
        msgs[0].contains("expected one of: none, gzip, snappy, lz4, zstd"),
        "{msgs:?}"
    );
    assert!(
        msgs[1].starts_with("warning:") && msgs[1].contains("acks=all"),
        "{msgs:?}"
    );
}
