//! SASL/OAUTHBEARER from the lines a Java client takes (KIP-255, KIP-768), docs/configuration.md
//! "OAUTHBEARER":
//! - no `sasl.login.callback.handler.class`: Kafka's unsecured JWS, built from the JAAS line's
//!   `unsecuredLogin*` options (test and development setups);
//! - `sasl.login.callback.handler.class` = `OAuthBearerLoginCallbackHandler` (current or the
//!   older `secured` package): client credentials at `sasl.oauthbearer.token.endpoint.url`, with
//!   `clientId`, `clientSecret`, `scope` and `ssl.*` (TLS to the endpoint) in the JAAS line.
//!
//! Error messages never carry a JAAS option's value.

use super::values::{Reader, Setting, SettingMap};
use kmirror_kafka::settings::{ClientCredentials, OAuthBearer, TokenRefresh, TokenSource};
use kmirror_kafka::{SaslCredentials, SaslMechanism, Secret};
use std::time::Duration;

pub const MODULE: &str = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule";
const MSK_HANDLER: &str = "software.amazon.msk.auth.iam.IAMOAuthBearerLoginCallbackHandler";
const HANDLERS: [&str; 2] = [
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
    "org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerLoginCallbackHandler",
];

pub(super) fn credentials(r: &mut Reader<'_>, jaas: &Setting) -> Option<SaslCredentials> {
    let bad_jaas = |r: &mut Reader<'_>, why: String| {
        r.diags.error(Some(&jaas.origin), Some(&jaas.value), why);
        None
    };
    let (module, options) = match super::jaas::jaas_options(&jaas.value) {
        Ok(p) => p,
        Err(why) => {
            return bad_jaas(
                r,
                format!("malformed JAAS configuration ({why}); expected: {MODULE} required ...;"),
            )
        }
    };
    if module != MODULE {
        return bad_jaas(
            r,
            format!(
                "login module {module} does not match sasl.mechanism=OAUTHBEARER: use {MODULE}"
            ),
        );
    }
    let option = |name: &str| super::jaas::jaas_option(&options, name);
    let refresh = refresh(r);
    let handler = r.get("sasl.login.callback.handler.class").cloned();
    let (source, extensions, principal) = match handler {
        None => {
            let principal_claim =
                option("unsecuredLoginPrincipalClaimName").unwrap_or_else(|| "sub".into());
            let Some(principal) = option(&format!("unsecuredLoginStringClaim_{principal_claim}"))
            else {
                return bad_jaas(
                    r,
                    format!("the unsecured OAUTHBEARER login needs unsecuredLoginStringClaim_{principal_claim}=\"<principal>\" in the JAAS line (or set sasl.login.callback.handler.class to {} and sasl.oauthbearer.token.endpoint.url for OIDC)", HANDLERS[0]),
                );
            };
            let Some(lifetime_secs) = positive_seconds(option("unsecuredLoginLifetimeSeconds"))
            else {
                return bad_jaas(
                    r,
                    "unsecuredLoginLifetimeSeconds must be a positive number of seconds".into(),
                );
            };
            let scope_claim =
                option("unsecuredLoginScopeClaimName").unwrap_or_else(|| "scope".into());
            // Kafka's list claims start with their separator: `,a,b`.
            let scope = option(&format!("unsecuredLoginListClaim_{scope_claim}"))
                .map(|v| list_claim(&v))
                .unwrap_or_default();
            let extensions = prefixed(&options, "unsecuredLoginExtension_");
            (
                TokenSource::Unsecured {
                    principal_claim,
                    principal: principal.clone(),
                    lifetime_secs,
                    scope_claim,
                    scope,
                },
                extensions,
                principal,
            )
        }
        Some(h) if h.value.trim() == MSK_HANDLER => {
            let aws = super::aws_iam::settings(&options);
            let profile = aws.profile.clone();
            (
                TokenSource::AwsMskIam { aws },
                vec![],
                profile.unwrap_or_else(|| "(default AWS credentials)".into()),
            )
        }
        Some(h) if HANDLERS.contains(&h.value.trim()) => {
            let Some(endpoint) = r.get("sasl.oauthbearer.token.endpoint.url").cloned() else {
                r.diags.error(
                    Some(&h.origin),
                    None,
                    "OIDC client credentials need sasl.oauthbearer.token.endpoint.url (the identity provider's token endpoint)",
                );
                return None;
            };
            let url = endpoint.value.trim().to_string();
            if !(url.starts_with("https://") || url.starts_with("http://")) {
                r.diags.error(
                    Some(&endpoint.origin),
                    Some(&endpoint.value),
                    "expected an http:// or https:// URL (kmirror does not read tokens from files)",
                );
                return None;
            }
            let (Some(client_id), Some(client_secret)) =
                (option("clientId"), option("clientSecret"))
            else {
                return bad_jaas(
                    r,
                    format!("OIDC client credentials need clientId=\"...\" and clientSecret=\"...\" in the JAAS line: {MODULE} required clientId=\"...\" clientSecret=\"...\" scope=\"...\";"),
                );
            };
            let tls = if url.starts_with("https://") {
                endpoint_tls(r, jaas, &options)?
            } else {
                None
            };
            let source = TokenSource::ClientCredentials(ClientCredentials {
                endpoint: url,
                client_id: client_id.clone(),
                client_secret: Secret::new(client_secret),
                scope: option("scope"),
                tls,
                connect_timeout: r.millis("sasl.login.connect.timeout.ms", 10_000),
                read_timeout: r.millis("sasl.login.read.timeout.ms", 10_000),
                retry_backoff: r.millis("sasl.login.retry.backoff.ms", 100),
                retry_backoff_max: r.millis("sasl.login.retry.backoff.max.ms", 10_000),
            });
            (source, prefixed(&options, "extension_"), client_id)
        }
        Some(h) => {
            r.diags.error(
                Some(&h.origin),
                Some(&h.value),
                format!(
                    "unsupported login callback handler: kmirror supports {} (OIDC client credentials), {MSK_HANDLER} (Amazon MSK IAM) or none (the unsecured JWS)",
                    HANDLERS[0]
                ),
            );
            return None;
        }
    };
    if let Some(k) = bad_extension(&extensions) {
        return bad_jaas(
            r,
            format!("SASL extension '{k}': names are letters only (not 'auth') and values printable ASCII"),
        );
    }
    Some(SaslCredentials {
        mechanism: SaslMechanism::OAuthBearer,
        username: principal,
        password: Secret::default(),
        aws: None,
        kerberos: None,
        oauth: Some(OAuthBearer {
            source,
            extensions,
            refresh,
            cache: Default::default(),
        }),
    })
}

/// `unsecuredLoginLifetimeSeconds`: an hour when absent, None when not a positive number.
fn positive_seconds(v: Option<String>) -> Option<u64> {
    match v {
        None => Some(3600),
        Some(v) => v.trim().parse::<u64>().ok().filter(|s| *s > 0),
    }
}

/// A Kafka list claim's items: the value starts with its separator (`,a,b`).
fn list_claim(v: &str) -> Vec<String> {
    let mut chars = v.chars();
    match chars.next() {
        Some(sep) => chars
            .as_str()
            .split(sep)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
        None => vec![],
    }
}

/// The first SASL extension RFC 7628 §3.1 refuses (key ALPHA+, value printable; `auth` is the
/// token's own key).
fn bad_extension(extensions: &[(String, String)]) -> Option<&str> {
    extensions
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .find_map(|(k, v)| {
            let key_ok = !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphabetic()) && k != "auth";
            let value_ok = !v.is_empty()
                && v.bytes()
                    .all(|b| (0x21..=0x7e).contains(&b) || b" \t\r\n".contains(&b));
            (!key_ok || !value_ok).then_some(k)
        })
}

fn prefixed(options: &[(String, String)], prefix: &str) -> Vec<(String, String)> {
    options
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(prefix)?.to_string(), v.clone())))
        .collect()
}

/// `sasl.login.refresh.*` within Java's bounds.
fn refresh(r: &mut Reader<'_>) -> TokenRefresh {
    let d = TokenRefresh::default();
    let permille = |r: &mut Reader<'_>, key: &str, default: u16, min: f64, max: f64| -> u16 {
        let Some(s) = r.get(key) else {
            return default;
        };
        match s.value.trim().parse::<f64>() {
            Ok(v) if (min..=max).contains(&v) => (v * 1000.0).round() as u16,
            _ => {
                r.diags.error(
                    Some(&s.origin),
                    Some(&s.value),
                    format!("expected a number from {min} to {max}"),
                );
                default
            }
        }
    };
    TokenRefresh {
        window_factor_permille: permille(
            r,
            "sasl.login.refresh.window.factor",
            d.window_factor_permille,
            0.5,
            1.0,
        ),
        window_jitter_permille: permille(
            r,
            "sasl.login.refresh.window.jitter",
            d.window_jitter_permille,
            0.0,
            0.25,
        ),
        min_period: Duration::from_secs(
            r.int("sasl.login.refresh.min.period.seconds", 60, 0, 900) as u64
        ),
        buffer: Duration::from_secs(r.int("sasl.login.refresh.buffer.seconds", 300, 0, 3600) as u64),
    }
}

/// TLS to an https token endpoint from the JAAS line's `ssl.*` options, read as the client's
/// own `ssl.*` keys are (Java's `JaasOptionsUtils` does the same); none given: the platform's
/// roots with host name verification.
fn endpoint_tls(
    r: &mut Reader<'_>,
    jaas: &Setting,
    options: &[(String, String)],
) -> Option<Option<kmirror_kafka::TlsSettings>> {
    let map: SettingMap = options
        .iter()
        .filter(|(k, _)| k.starts_with("ssl."))
        .map(|(k, v)| {
            let mut origin = jaas.origin.clone();
            // Named as the JAAS key, so a message about it masks the value.
            origin.key = format!("{} ({k})", jaas.origin.key);
            (
                k.clone(),
                Setting {
                    value: v.clone(),
                    origin,
                },
            )
        })
        .collect();
    let before = r.diags.errors().count();
    let mut inner = Reader::new(&map, r.diags);
    let tls = super::tls::tls(&mut inner);
    if r.diags.errors().count() > before {
        return None;
    }
    Some(tls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<SaslCredentials, Vec<String>> {
        crate::config::client::parse_sasl_for_test(pairs, credentials)
    }

    #[test]
    fn the_unsecured_login_reads_kafkas_options() {
        let c = parse(&[(
            "sasl.jaas.config",
            &format!("{MODULE} required unsecuredLoginStringClaim_sub=\"alice\" unsecuredLoginLifetimeSeconds=\"30\" unsecuredLoginListClaim_scope=\",a,b\" unsecuredLoginExtension_traceId=\"x1\";"),
        )])
        .unwrap();
        let o = c.oauth.unwrap();
        assert_eq!(
            o.source,
            TokenSource::Unsecured {
                principal_claim: "sub".into(),
                principal: "alice".into(),
                lifetime_secs: 30,
                scope_claim: "scope".into(),
                scope: vec!["a".into(), "b".into()],
            }
        );
        assert_eq!(o.extensions, vec![("traceId".into(), "x1".into())]);
        assert_eq!(o.refresh, TokenRefresh::default());
    }

    #[test]
    fn client_credentials_need_the_endpoint_id_and_secret_and_never_show_the_secret() {
        let jaas = format!(
            "{MODULE} required clientId=\"kmirror\" clientSecret=\"s3cr3t-value\" scope=\"kafka\" ssl.endpoint.identification.algorithm=\"\";"
        );
        let c = parse(&[
            ("sasl.jaas.config", &jaas),
            ("sasl.login.callback.handler.class", HANDLERS[1]),
            (
                "sasl.oauthbearer.token.endpoint.url",
                "https://idp.example/token",
            ),
            ("sasl.login.refresh.window.factor", "0.9"),
            ("sasl.login.connect.timeout.ms", "2500"),
        ])
        .unwrap();
        let o = c.oauth.clone().unwrap();
        let TokenSource::ClientCredentials(ClientCredentials {
            endpoint,
            client_id,
            scope,
            tls,
            connect_timeout,
            ..
        }) = &o.source
        else {
            panic!("client credentials")
        };
        assert_eq!(endpoint, "https://idp.example/token");
        assert_eq!(client_id, "kmirror");
        assert_eq!(scope.as_deref(), Some("kafka"));
        assert!(!tls.as_ref().unwrap().verify_hostname);
        assert_eq!(*connect_timeout, Duration::from_millis(2500));
        assert_eq!(o.refresh.window_factor_permille, 900);
        for shown in [format!("{c:?}"), serde_json::to_string(&c).unwrap()] {
            assert!(!shown.contains("s3cr3t"), "{shown}");
        }

        let e = parse(&[
            ("sasl.jaas.config", &jaas),
            ("sasl.login.callback.handler.class", HANDLERS[0]),
        ])
        .unwrap_err();
        assert!(
            e[0].contains("sasl.oauthbearer.token.endpoint.url"),
            "{e:?}"
        );
        let e = parse(&[
            (
                "sasl.jaas.config",
                &format!("{MODULE} required clientSecret=\"s3cr3t-value\";"),
            ),
            ("sasl.login.callback.handler.class", HANDLERS[0]),
            (
                "sasl.oauthbearer.token.endpoint.url",
                "http://127.0.0.1:1/t",
            ),
        ])
        .unwrap_err();
        assert!(e[0].contains("clientId"), "{e:?}");
        assert!(!e[0].contains("s3cr3t"), "{e:?}");
        let e = parse(&[
            ("sasl.jaas.config", &jaas),
            ("sasl.login.callback.handler.class", HANDLERS[0]),
            ("sasl.oauthbearer.token.endpoint.url", "file:///tmp/token"),
        ])
        .unwrap_err();
        assert!(e[0].contains("http:// or https://"), "{e:?}");
    }

    #[test]
    fn the_msk_iam_handler_takes_aws_credentials() {
        let c = parse(&[
            (
                "sasl.jaas.config",
                &format!("{MODULE} required awsProfileName=\"ops\";"),
            ),
            ("sasl.login.callback.handler.class", MSK_HANDLER),
        ])
        .unwrap();
        assert_eq!(
            c.oauth.unwrap().source,
            TokenSource::AwsMskIam {
                aws: kmirror_kafka::settings::AwsIam {
                    profile: Some("ops".into()),
                    role: None,
                }
            }
        );
        // The library's role options, as its login module takes them.
        let c = parse(&[
            (
                "sasl.jaas.config",
                &format!("{MODULE} required awsRoleArn=\"arn:aws:iam::1:role/r\" awsRoleSessionName=\"s\";"),
            ),
            ("sasl.login.callback.handler.class", MSK_HANDLER),
        ])
        .unwrap();
        let TokenSource::AwsMskIam { aws } = c.oauth.unwrap().source else {
            panic!("not the MSK token source")
        };
        let role = aws.role.unwrap();
        assert_eq!(
            (role.arn.as_str(), role.session_name.as_str()),
            ("arn:aws:iam::1:role/r", "s")
        );
    }

    #[test]
    fn wrong_modules_handlers_and_extensions_are_named() {
        let e = parse(&[(
            "sasl.jaas.config",
            "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"u\" password=\"p\";",
        )])
        .unwrap_err();
        assert!(
            e[0].contains("does not match sasl.mechanism=OAUTHBEARER"),
            "{e:?}"
        );
        let e = parse(&[
            ("sasl.jaas.config", &format!("{MODULE} required;")),
            ("sasl.login.callback.handler.class", "com.example.Mine"),
        ])
        .unwrap_err();
        assert!(e[0].contains("unsupported login callback handler"), "{e:?}");
        let e = parse(&[("sasl.jaas.config", &format!("{MODULE} required;"))]).unwrap_err();
        assert!(e[0].contains("unsecuredLoginStringClaim_sub"), "{e:?}");
        let e = parse(&[(
            "sasl.jaas.config",
            &format!("{MODULE} required unsecuredLoginStringClaim_sub=\"a\" unsecuredLoginExtension_auth=\"x\";"),
        )])
        .unwrap_err();
        assert!(e[0].contains("SASL extension 'auth'"), "{e:?}");
        let e = parse(&[
            (
                "sasl.jaas.config",
                &format!("{MODULE} required unsecuredLoginStringClaim_sub=\"a\";"),
            ),
            ("sasl.login.refresh.window.factor", "2"),
        ])
        .unwrap_err();
        assert!(e[0].contains("from 0.5 to 1"), "{e:?}");
    }
}
