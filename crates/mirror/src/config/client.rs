//! Java client properties → kmirror client settings: bootstrap list, security protocol, SASL
//! (PLAIN and SCRAM through `sasl.jaas.config`), TLS (`tls.rs`), and the consumer/producer tuning
//! keys that matter for replication.

use super::diagnostics::Diagnostics;
use super::jaas::{jaas_option, jaas_options};
use super::values::{Reader, SettingMap};
use kmirror_kafka::{
    Acks, AutoOffsetReset, BrokerAddress, ClientSettings, Compression, ConsumerTuning,
    IsolationLevel, ProducerTuning, SaslCredentials, SaslMechanism, Secret, SecurityProtocol,
};

/// Connection settings for one client role (`what` names it in messages, e.g. "cluster A").
/// Returns `None` when an error was recorded.
pub fn connection(
    map: &SettingMap,
    what: &str,
    hint_key: &str,
    diags: &mut Diagnostics,
) -> Option<ClientSettings> {
    let errors_before = diags.errors().count();
    let mut r = Reader::new(map, diags);
    let bootstrap = match r.get("bootstrap.servers") {
        None => {
            r.diags.error(
                None,
                None,
                format!("{what} has no bootstrap servers: set {hint_key}"),
            );
            Vec::new()
        }
        Some(s) => {
            let (list, bad) = parse_bootstrap(&s.value);
            if let Some(bad) = bad {
                r.diags.error(Some(&s.origin), Some(&s.value), bad);
            } else if list.is_empty() {
                r.diags.error(
                    Some(&s.origin),
                    Some(&s.value),
                    format!("{what} has an empty bootstrap server list: expected host:port[,host:port...]"),
                );
            }
            list
        }
    };
    let protocol = match r.get("security.protocol") {
        None => SecurityProtocol::Plaintext,
        Some(s) => SecurityProtocol::parse(&s.value).unwrap_or_else(|| {
            r.diags.error(
                Some(&s.origin),
                Some(&s.value),
                format!(
                    "unsupported security protocol: expected one of {}",
                    SecurityProtocol::NAMES.join(", ")
                ),
            );
            SecurityProtocol::Plaintext
        }),
    };
    let sasl = if protocol.uses_sasl() {
        sasl(&mut r, what)
    } else {
        None
    };
    let tls = if protocol.uses_tls() {
        super::tls::tls(&mut r)
    } else {
        None
    };
    let client_id = r.get("client.id").map(|s| s.value.trim().to_string());
    let request_timeout = r.millis("request.timeout.ms", 30_000);
    if diags.errors().count() > errors_before {
        return None;
    }
    Some(ClientSettings {
        bootstrap,
        security_protocol: protocol,
        sasl,
        tls,
        client_id,
        request_timeout,
    })
}

/// Parses `host:port[,host:port...]`; the second value is an error message for a bad entry.
pub fn parse_bootstrap(value: &str) -> (Vec<BrokerAddress>, Option<String>) {
    let mut out = Vec::new();
    for item in crate::filter::split_list(value) {
        if item.is_empty() {
            continue;
        }
        let parsed = if let Some(rest) = item.strip_prefix('[') {
            rest.split_once("]:").map(|(h, p)| (h.to_string(), p))
        } else {
            item.rsplit_once(':').map(|(h, p)| (h.to_string(), p))
        };
        match parsed {
            Some((host, port)) if !host.is_empty() => match port.parse::<u16>() {
                Ok(port) if port > 0 => out.push(BrokerAddress { host, port }),
                _ => return (out, Some(format!("'{item}' has an invalid port: expected host:port with a port from 1 to 65535"))),
            },
            _ => return (out, Some(format!("'{item}' is not host:port"))),
        }
    }
    (out, None)
}

fn sasl(r: &mut Reader<'_>, what: &str) -> Option<SaslCredentials> {
    let mechanism = match r.get("sasl.mechanism") {
        // Java's default, so that a Kerberos setup that never names its mechanism reads as it
        // does for MM2.
        None => SaslMechanism::Gssapi,
        Some(s) => match SaslMechanism::parse(&s.value) {
            Some(m) => m,
            None => {
                let why = format!(
                    "unknown SASL mechanism: expected one of {}",
                    SaslMechanism::NAMES.join(", ")
                );
                r.diags.error(Some(&s.origin), Some(&s.value), why);
                return None;
            }
        },
    };
    let Some(jaas) = r.get("sasl.jaas.config") else {
        let defaulted = if r.get("sasl.mechanism").is_none() {
            " (sasl.mechanism is not set, so Kafka's default applies)"
        } else {
            ""
        };
        r.diags.error(
            r.get("sasl.mechanism")
                .or_else(|| r.get("security.protocol"))
                .map(|s| &s.origin),
            None,
            format!(
                "{what} uses SASL/{}{defaulted} but sasl.jaas.config is not set (kmirror does \
                 not read JAAS files named by -Djava.security.auth.login.config)",
                mechanism.as_str()
            ),
        );
        return None;
    };
    if mechanism == SaslMechanism::OAuthBearer {
        return super::oauth::credentials(r, jaas);
    }
    if mechanism == SaslMechanism::AwsMskIam {
        return super::aws_iam::credentials(r, jaas);
    }
    if mechanism == SaslMechanism::Gssapi {
        return super::kerberos::credentials(r, jaas);
    }
    match parse_jaas(&jaas.value, mechanism) {
        Ok(c) => Some(c),
        Err(why) => {
            // The JAAS text holds the password: never echo it.
            r.diags.error(Some(&jaas.origin), Some(&jaas.value), why);
            None
        }
    }
}

const PLAIN_MODULE: &str = "org.apache.kafka.common.security.plain.PlainLoginModule";
const SCRAM_MODULE: &str = "org.apache.kafka.common.security.scram.ScramLoginModule";

/// Parses `<LoginModule> <flag> username="..." password="...";`. Error messages never contain
/// the option values.
pub fn parse_jaas(text: &str, mechanism: SaslMechanism) -> Result<SaslCredentials, String> {
    let expected_module = match mechanism {
        SaslMechanism::Plain => PLAIN_MODULE,
        SaslMechanism::ScramSha256 | SaslMechanism::ScramSha512 => SCRAM_MODULE,
        SaslMechanism::OAuthBearer => super::oauth::MODULE,
        SaslMechanism::AwsMskIam => super::aws_iam::MODULE,
        SaslMechanism::Gssapi => super::kerberos::MODULE,
    };
    let malformed = |why: &str| {
        format!(
            "malformed JAAS configuration ({why}); expected: {expected_module} required username=\"...\" password=\"...\";"
        )
    };
    let (module, options) = jaas_options(text).map_err(|why| malformed(&why))?;
    let option = |name: &str| jaas_option(&options, name);
    let (username, password) = (option("username"), option("password"));
    if module != expected_module {
        let known = module == PLAIN_MODULE || module == SCRAM_MODULE;
        return Err(if known {
            format!(
                "login module {module} does not match sasl.mechanism={}: use {expected_module}",
                mechanism.as_str()
            )
        } else {
            format!(
                "unsupported login module {module}: kmirror supports {PLAIN_MODULE} and {SCRAM_MODULE}"
            )
        });
    }
    let username = username
        .filter(|u| !u.is_empty())
        .ok_or_else(|| malformed("no username"))?;
    let password = password.ok_or_else(|| malformed("no password"))?;
    Ok(SaslCredentials {
        mechanism,
        username,
        password: Secret::new(password),
        oauth: None,
        aws: None,
        kerberos: None,
    })
}

/// Tests of a mechanism's settings: `pairs` as one client's keys (`A.` in messages) through
/// `parse`, with the JAAS line under `sasl.jaas.config`.
#[cfg(test)]
pub(super) fn parse_sasl_for_test(
    pairs: &[(&str, &str)],
    parse: fn(&mut Reader<'_>, &super::values::Setting) -> Option<SaslCredentials>,
) -> Result<SaslCredentials, Vec<String>> {
    use super::diagnostics::Origin;
    use super::values::Setting;
    let m: SettingMap = pairs
        .iter()
        .map(|(k, v)| {
            let origin = Origin {
                file: std::sync::Arc::from("f.properties"),
                line: 1,
                key: format!("A.{k}"),
            };
            (
                k.to_string(),
                Setting {
                    value: v.to_string(),
                    origin,
                },
            )
        })
        .collect();
    let mut d = Diagnostics::default();
    let mut r = Reader::new(&m, &mut d);
    let jaas = m["sasl.jaas.config"].clone();
    match parse(&mut r, &jaas) {
        Some(c) if d.errors().count() == 0 => Ok(c),
        _ => Err(d.errors().map(|e| e.to_string()).collect()),
    }
}

/// Consumer tuning with the Java defaults, except `isolation.level`, which defaults to
/// `read_committed` for a replicator (aborted transactions must not be copied), and
/// `auto.offset.reset`, which MM2 defaults to `earliest`.
pub fn consumer_tuning(map: &SettingMap, diags: &mut Diagnostics) -> ConsumerTuning {
    let mut r = Reader::new(map, diags);
    let d = ConsumerTuning::default();
    ConsumerTuning {
        fetch_max_bytes: r.int(
            "fetch.max.bytes",
            d.fetch_max_bytes as i64,
            0,
            i32::MAX as i64,
        ) as i32,
        max_partition_fetch_bytes: r.int(
            "max.partition.fetch.bytes",
            d.max_partition_fetch_bytes as i64,
            0,
            i32::MAX as i64,
        ) as i32,
        fetch_min_bytes: r.int(
            "fetch.min.bytes",
            d.fetch_min_bytes as i64,
            0,
            i32::MAX as i64,
        ) as i32,
        fetch_max_wait: r.millis("fetch.max.wait.ms", d.fetch_max_wait.as_millis() as i64),
        isolation_level: match r.choice(
            "isolation.level",
            "read_committed",
            &["read_committed", "read_uncommitted"],
        ) {
            "read_uncommitted" => IsolationLevel::ReadUncommitted,
            _ => IsolationLevel::ReadCommitted,
        },
        auto_offset_reset: match r.choice(
            "auto.offset.reset",
            "earliest",
            &["earliest", "latest", "none"],
        ) {
            "latest" => AutoOffsetReset::Latest,
            "none" => AutoOffsetReset::None,
            _ => AutoOffsetReset::Earliest,
        },
        group_id: r.get("group.id").map(|s| s.value.trim().to_string()),
        check_crcs: r.bool("check.crcs", d.check_crcs),
    }
}

/// Producer tuning with the Java producer's defaults.
pub fn producer_tuning(map: &SettingMap, diags: &mut Diagnostics) -> ProducerTuning {
    let mut r = Reader::new(map, diags);
    let d = ProducerTuning::default();
    let compression = match r.get("compression.type") {
        None => d.compression,
        Some(s) => Compression::parse(&s.value).unwrap_or_else(|| {
            r.diags.error(
                Some(&s.origin),
                Some(&s.value),
                format!("expected one of: {}", Compression::NAMES.join(", ")),
            );
            d.compression
        }),
    };
    let acks = match r.choice("acks", "all", &["all", "-1", "1", "0"]) {
        "1" => Acks::Leader,
        "0" => Acks::None,
        _ => Acks::All,
    };
    if acks != Acks::All {
        if let Some(s) = r.get("acks") {
            r.diags.warning(
                Some(&s.origin),
                Some(&s.value),
                "acks other than all can lose acknowledged records when a target broker fails; kmirror's no-loss guarantee assumes acks=all",
            );
        }
    }
    ProducerTuning {
        batch_size: r.int("batch.size", d.batch_size as i64, 0, i32::MAX as i64) as i32,
        linger: r.millis("linger.ms", d.linger.as_millis() as i64),
        transaction_timeout: std::time::Duration::from_millis(r.int(
            "transaction.timeout.ms",
            d.transaction_timeout.as_millis() as i64,
            1,
            i32::MAX as i64,
        ) as u64),
        compression,
        acks,
        max_request_size: r.int(
            "max.request.size",
            d.max_request_size as i64,
            1,
            i32::MAX as i64,
        ) as i32,
        buffer_memory: r.int("buffer.memory", d.buffer_memory, 0, i64::MAX),
    }
}

#[cfg(test)]
mod tests;
