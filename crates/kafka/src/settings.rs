//! Typed client settings: what the configuration layer hands to the client.
//!
//! The configuration crate maps Java client properties (`bootstrap.servers`, `security.protocol`,
//! `sasl.jaas.config`, `ssl.truststore.location`, ...) onto these types after validating them, so
//! the client never sees a raw string it would have to parse again.

use crate::Secret;
use serde::Serialize;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// `host:port` of one bootstrap broker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BrokerAddress {
    pub host: String,
    pub port: u16,
}

impl fmt::Display for BrokerAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Kafka's `security.protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    /// All protocols kmirror supports, as Kafka spells them.
    pub const NAMES: [&'static str; 4] = ["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"];

    /// Parses Kafka's spelling (case-insensitive, as the Java client is).
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_uppercase().as_str() {
            "PLAINTEXT" => Some(Self::Plaintext),
            "SSL" => Some(Self::Ssl),
            "SASL_PLAINTEXT" => Some(Self::SaslPlaintext),
            "SASL_SSL" => Some(Self::SaslSsl),
            _ => None,
        }
    }

    pub fn uses_tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }

    pub fn uses_sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Plaintext => "PLAINTEXT",
            Self::Ssl => "SSL",
            Self::SaslPlaintext => "SASL_PLAINTEXT",
            Self::SaslSsl => "SASL_SSL",
        }
    }
}

/// Kafka's `sasl.mechanism`, limited to the mechanisms kmirror implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SaslMechanism {
    #[serde(rename = "PLAIN")]
    Plain,
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
    #[serde(rename = "OAUTHBEARER")]
    OAuthBearer,
    #[serde(rename = "AWS_MSK_IAM")]
    AwsMskIam,
    #[serde(rename = "GSSAPI")]
    Gssapi,
}

impl SaslMechanism {
    pub const NAMES: [&'static str; 6] = [
        "PLAIN",
        "SCRAM-SHA-256",
        "SCRAM-SHA-512",
        "OAUTHBEARER",
        "AWS_MSK_IAM",
        "GSSAPI",
    ];

    /// Parses the mechanism name; Kafka compares these case-sensitively.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "PLAIN" => Some(Self::Plain),
            "SCRAM-SHA-256" => Some(Self::ScramSha256),
            "SCRAM-SHA-512" => Some(Self::ScramSha512),
            "OAUTHBEARER" => Some(Self::OAuthBearer),
            "AWS_MSK_IAM" => Some(Self::AwsMskIam),
            "GSSAPI" => Some(Self::Gssapi),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Plain => "PLAIN",
            Self::ScramSha256 => "SCRAM-SHA-256",
            Self::ScramSha512 => "SCRAM-SHA-512",
            Self::OAuthBearer => "OAUTHBEARER",
            Self::AwsMskIam => "AWS_MSK_IAM",
            Self::Gssapi => "GSSAPI",
        }
    }
}

/// Username and password for PLAIN or SCRAM; for OAUTHBEARER, where tokens come from (the
/// username then names the principal or client id, for messages; the password is empty).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SaslCredentials {
    pub mechanism: SaslMechanism,
    pub username: String,
    pub password: Secret,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oauth: Option<OAuthBearer>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aws: Option<AwsIam>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kerberos: Option<Kerberos>,
}

/// SASL/GSSAPI (Kerberos): who logs in, with which keytab, through which KDCs
/// (`crate::kerberos`). The keytab's keys are read when logging in, never kept here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Kerberos {
    /// `sasl.kerberos.service.name` (or `serviceName` in the JAAS line): the first part of the
    /// brokers' principals, `<service>/<broker host>@<realm>`.
    pub service_name: String,
    /// The JAAS line's `principal`, with its realm (`name@REALM`).
    pub principal: String,
    /// The JAAS line's `keyTab`.
    pub keytab: std::path::PathBuf,
    /// The krb5.conf that names the realm's KDCs.
    pub krb5_conf: std::path::PathBuf,
}

/// SASL/AWS_MSK_IAM: where the AWS credentials come from (`crate::aws::iam`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AwsIam {
    /// `awsProfileName` in the JAAS line: that shared-file profile only.
    pub profile: Option<String>,
    /// `awsRoleArn` in the JAAS line: the role those credentials assume (`crate::aws::assume_role`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<AwsRole>,
}

/// The role of `awsRoleArn`, with the JAAS line's `awsRoleSessionName`, `awsRoleExternalId`
/// and `awsStsRegion`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AwsRole {
    pub arn: String,
    pub session_name: String,
    pub external_id: Option<Secret>,
    pub sts_region: Option<String>,
}

/// SASL/OAUTHBEARER (KIP-255, KIP-768): where the tokens come from and when to renew them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OAuthBearer {
    pub source: TokenSource,
    /// SASL extensions sent with the token (`unsecuredLoginExtension_<name>` or
    /// `extension_<name>` in the JAAS line).
    pub extensions: Vec<(String, String)>,
    pub refresh: TokenRefresh,
    /// The current token, shared by every clone of these settings (not configuration).
    #[serde(skip)]
    pub cache: crate::token_cache::TokenCache,
}

/// Where OAUTHBEARER tokens come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TokenSource {
    /// `OAuthBearerLoginModule` with no login callback handler: an unsecured JWS (`alg` none)
    /// that Kafka's default validator accepts; for test and development setups only.
    Unsecured {
        principal_claim: String,
        principal: String,
        lifetime_secs: u64,
        scope_claim: String,
        scope: Vec<String>,
    },
    /// Amazon MSK's IAM token (`IAMOAuthBearerLoginCallbackHandler`): a SigV4-presigned URL for
    /// `kafka.<region>.amazonaws.com`, base64url-encoded (`crate::aws::iam`).
    AwsMskIam { aws: AwsIam },
    /// OIDC client credentials (see [`ClientCredentials`]).
    ClientCredentials(ClientCredentials),
}

/// OIDC client credentials at `sasl.oauthbearer.token.endpoint.url` (KIP-768).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClientCredentials {
    /// Shown (plan's JSON) without user information or query, which may carry credentials.
    #[serde(serialize_with = "crate::secret::serialize_redacted_url")]
    pub endpoint: String,
    pub client_id: String,
    pub client_secret: Secret,
    pub scope: Option<String>,
    /// TLS to an `https` endpoint: the `ssl.*` options of the JAAS line, as Java reads them.
    pub tls: Option<TlsSettings>,
    #[serde(with = "millis")]
    pub connect_timeout: Duration,
    #[serde(with = "millis")]
    pub read_timeout: Duration,
    #[serde(with = "millis")]
    pub retry_backoff: Duration,
    #[serde(with = "millis")]
    pub retry_backoff_max: Duration,
}

/// `sasl.login.refresh.*`: when a token is renewed (Java's defaults: between 80 % and 85 % of
/// its lifetime, at least 60 s after it was had, at least 300 s before it expires, as far as
/// the lifetime allows).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TokenRefresh {
    pub window_factor_permille: u16,
    pub window_jitter_permille: u16,
    #[serde(with = "millis")]
    pub min_period: Duration,
    #[serde(with = "millis")]
    pub buffer: Duration,
}

impl Default for TokenRefresh {
    fn default() -> Self {
        TokenRefresh {
            window_factor_permille: 800,
            window_jitter_permille: 50,
            min_period: Duration::from_secs(60),
            buffer: Duration::from_secs(300),
        }
    }
}

/// Where the certificates that the client trusts come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TrustMaterial {
    /// The platform's root certificates (no `ssl.truststore.*` given).
    SystemRoots,
    /// A PEM file with one or more CA certificates.
    PemFile { path: PathBuf },
    /// PEM certificates given inline (`ssl.truststore.certificates`).
    PemInline { pem: Secret },
    /// A PKCS#12 file (`ssl.truststore.type=PKCS12`).
    Pkcs12File {
        path: PathBuf,
        password: Option<Secret>,
    },
}

/// The client's own certificate and key, for mutual TLS.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum KeyMaterial {
    /// A PEM file holding the certificate chain and the private key.
    PemFile {
        path: PathBuf,
        key_password: Option<Secret>,
    },
    /// Inline PEM (`ssl.keystore.certificate.chain` + `ssl.keystore.key`).
    PemInline {
        certificate_chain: Secret,
        key: Secret,
        key_password: Option<Secret>,
    },
    /// A PKCS#12 keystore.
    Pkcs12File {
        path: PathBuf,
        password: Option<Secret>,
        key_password: Option<Secret>,
    },
}

/// TLS settings for `SSL` and `SASL_SSL`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TlsSettings {
    pub trust: TrustMaterial,
    pub identity: Option<KeyMaterial>,
    /// `ssl.endpoint.identification.algorithm=https` (Kafka's default since 2.0); an empty value
    /// turns host name verification off.
    pub verify_hostname: bool,
}

/// How to reach and authenticate to one cluster, for one client role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClientSettings {
    pub bootstrap: Vec<BrokerAddress>,
    pub security_protocol: SecurityProtocol,
    pub sasl: Option<SaslCredentials>,
    pub tls: Option<TlsSettings>,
    pub client_id: Option<String>,
    #[serde(with = "millis")]
    pub request_timeout: Duration,
}

/// `isolation.level` of a consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IsolationLevel {
    ReadUncommitted,
    ReadCommitted,
}

/// `auto.offset.reset`: where to start without a stored position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AutoOffsetReset {
    Earliest,
    Latest,
    /// Fail instead of guessing.
    None,
}

/// Consumer-side tuning that the replicator honours.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConsumerTuning {
    pub fetch_max_bytes: i32,
    pub max_partition_fetch_bytes: i32,
    pub fetch_min_bytes: i32,
    #[serde(with = "millis")]
    pub fetch_max_wait: Duration,
    pub isolation_level: IsolationLevel,
    pub auto_offset_reset: AutoOffsetReset,
    pub group_id: Option<String>,
    /// `check.crcs`: fetched batches' CRC-32C is checked (Java's default).
    pub check_crcs: bool,
}

impl ConsumerTuning {
    /// The bound on one batch's decompressed records when none is configured: as much as one
    /// fetch may return, so decoding a hostile batch costs at most what fetching one may.
    pub fn default_max_decompressed(&self) -> usize {
        self.fetch_max_bytes
            .max(self.max_partition_fetch_bytes)
            .max(1 << 20) as usize
    }
}

impl Default for ConsumerTuning {
    /// The Java consumer's defaults, except that a replicator reads committed data only
    /// (aborted transactions must not reach the target).
    fn default() -> Self {
        ConsumerTuning {
            fetch_max_bytes: 52_428_800,
            max_partition_fetch_bytes: 1_048_576,
            fetch_min_bytes: 1,
            fetch_max_wait: Duration::from_millis(500),
            isolation_level: IsolationLevel::ReadCommitted,
            auto_offset_reset: AutoOffsetReset::Earliest,
            group_id: None,
            check_crcs: true,
        }
    }
}

/// `compression.type` of a producer (record mode only: batch mode keeps the source's codec).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl Compression {
    pub const NAMES: [&'static str; 5] = ["none", "gzip", "snappy", "lz4", "zstd"];

    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" | "uncompressed" => Some(Self::None),
            "gzip" => Some(Self::Gzip),
            "snappy" => Some(Self::Snappy),
            "lz4" => Some(Self::Lz4),
            "zstd" => Some(Self::Zstd),
            _ => None,
        }
    }
}

/// `acks` of a producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Acks {
    None,
    Leader,
    All,
}

/// Producer-side tuning that the replicator honours.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProducerTuning {
    pub batch_size: i32,
    #[serde(with = "millis")]
    pub linger: Duration,
    pub compression: Compression,
    pub acks: Acks,
    pub max_request_size: i32,
    /// `buffer.memory`: the replicator's bound on bytes fetched and not yet acknowledged.
    pub buffer_memory: i64,
    /// `transaction.timeout.ms`: how long the transaction coordinator lets a transaction stay
    /// open before it aborts it (exactly-once).
    #[serde(with = "millis")]
    pub transaction_timeout: Duration,
}

impl Default for ProducerTuning {
    /// The Java producer's defaults (Kafka 4.x: linger.ms=5).
    fn default() -> Self {
        ProducerTuning {
            batch_size: 16_384,
            linger: Duration::from_millis(5),
            compression: Compression::None,
            acks: Acks::All,
            max_request_size: 1_048_576,
            buffer_memory: 33_554_432,
            transaction_timeout: Duration::from_secs(60),
        }
    }
}

mod millis {
    use std::time::Duration;

    pub(crate) fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocols_parse_case_insensitively_and_round_trip() {
        for name in SecurityProtocol::NAMES {
            let p = SecurityProtocol::parse(&name.to_ascii_lowercase()).unwrap();
            assert_eq!(p.as_str(), name);
        }
        assert_eq!(SecurityProtocol::parse("SASL"), None);
    }

    #[test]
    fn mechanisms_are_case_sensitive_like_kafka() {
        assert_eq!(SaslMechanism::parse("PLAIN"), Some(SaslMechanism::Plain));
        assert_eq!(SaslMechanism::parse("plain"), None);
        for name in SaslMechanism::NAMES {
            assert_eq!(SaslMechanism::parse(name).unwrap().as_str(), name);
        }
    }

    #[test]
    fn broker_address_brackets_ipv6() {
        let a = BrokerAddress {
            host: "::1".into(),
            port: 9092,
        };
        assert_eq!(a.to_string(), "[::1]:9092");
    }
}
