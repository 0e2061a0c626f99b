//! SASL/GSSAPI from the lines a Java client takes (docs/configuration.md, "Kerberos (GSSAPI)"):
//! `sasl.kerberos.service.name` (or `serviceName` in the JAAS line) and
//! `com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true keyTab="..."
//! principal="...";`. The krb5.conf is, in this order: the cluster's
//! `sasl.kerberos.krb5.conf` (kmirror's own key), `-Djava.security.krb5.conf=` in `KAFKA_OPTS`
//! (where MM2 deployments set it), `KRB5_CONFIG`, `/etc/krb5.conf`.

use super::values::{Reader, Setting};
use kmirror_kafka::kerberos::krb5_conf::Krb5Conf;
use kmirror_kafka::settings::Kerberos;
use kmirror_kafka::{SaslCredentials, SaslMechanism, Secret};
use std::path::PathBuf;

pub const MODULE: &str = "com.sun.security.auth.module.Krb5LoginModule";
pub const KRB5_CONF_KEY: &str = "sasl.kerberos.krb5.conf";

pub(super) fn credentials(r: &mut Reader<'_>, jaas: &Setting) -> Option<SaslCredentials> {
    let bad = |r: &mut Reader<'_>, why: String| {
        r.diags.error(Some(&jaas.origin), Some(&jaas.value), why);
        None
    };
    let (module, options) = match super::jaas::jaas_options(&jaas.value) {
        Ok(p) => p,
        Err(why) => {
            return bad(
                r,
                format!(
                    "malformed JAAS configuration ({why}); expected: {MODULE} required \
                     useKeyTab=true keyTab=\"...\" principal=\"...\";"
                ),
            )
        }
    };
    if module != MODULE {
        let why = if r.get("sasl.mechanism").is_none() {
            format!(
                "login module {module} needs sasl.mechanism set: it is not, so Kafka's default \
                 GSSAPI applies, which takes {MODULE}"
            )
        } else {
            format!("login module {module} does not match sasl.mechanism=GSSAPI: use {MODULE}")
        };
        return bad(r, why);
    }
    let option = |name: &str| super::jaas::jaas_option(&options, name);
    let yes = |name: &str| option(name).is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if !yes("useKeyTab") {
        let why = if yes("useTicketCache") {
            "the ticket-cache form (useTicketCache=true) is not supported: kmirror logs in \
             with a keytab (useKeyTab=true keyTab=\"...\" principal=\"...\")"
        } else {
            "kmirror logs in with a keytab: set useKeyTab=true keyTab=\"...\" principal=\"...\""
        };
        return bad(r, why.to_string());
    }
    let Some(keytab) = option("keyTab").filter(|k| !k.is_empty()) else {
        return bad(r, "useKeyTab=true needs keyTab=\"<path>\"".into());
    };
    let Some(principal) = option("principal").filter(|p| !p.is_empty()) else {
        return bad(
            r,
            "useKeyTab=true needs principal=\"<name>@<REALM>\"".into(),
        );
    };
    let service_name = match (r.get("sasl.kerberos.service.name"), option("serviceName")) {
        (Some(s), _) if !s.value.trim().is_empty() => s.value.trim().to_string(),
        (_, Some(s)) if !s.is_empty() => s,
        _ => {
            return bad(
                r,
                "GSSAPI needs the brokers' service name: set sasl.kerberos.service.name \
                 (usually kafka) or serviceName in the JAAS line"
                    .into(),
            )
        }
    };
    let (krb5_conf, conf_origin) = krb5_conf_path(r);
    let conf = match Krb5Conf::load(&krb5_conf) {
        Ok(c) => c,
        Err(why) => {
            r.diags.error(
                conf_origin.as_ref(),
                None,
                format!("{why} ({})", from_where(&conf_origin)),
            );
            return None;
        }
    };
    let principal = if principal.contains('@') {
        principal
    } else if let Some(realm) = &conf.default_realm {
        format!("{principal}@{realm}")
    } else {
        return bad(
            r,
            format!(
                "principal has no realm and {} sets no default_realm: write principal=\"<name>@<REALM>\"",
                krb5_conf.display()
            ),
        );
    };
    if principal.split('@').next().is_some_and(|n| n.contains('/')) {
        return bad(
            r,
            format!(
                "principal {principal}: kmirror logs in as a one-part principal (name@REALM), \
                 not a service/host principal"
            ),
        );
    }
    let realm = kmirror_kafka::kerberos::realm_of(&principal).to_string();
    if let Err(why) = conf.kdcs_of(&realm) {
        r.diags.error(
            conf_origin.as_ref(),
            None,
            format!(
                "krb5.conf {} {why} ({})",
                krb5_conf.display(),
                from_where(&conf_origin)
            ),
        );
        return None;
    }
    let keytab = PathBuf::from(keytab);
    if let Err(e) = std::fs::metadata(&keytab) {
        return bad(r, format!("cannot read keyTab {}: {e}", keytab.display()));
    }
    Some(SaslCredentials {
        mechanism: SaslMechanism::Gssapi,
        username: principal.clone(),
        password: Secret::default(),
        oauth: None,
        aws: None,
        kerberos: Some(Kerberos {
            service_name,
            principal,
            keytab,
            krb5_conf,
        }),
    })
}

/// The krb5.conf to read and the setting that named it (none: the environment or the default).
fn krb5_conf_path(r: &mut Reader<'_>) -> (PathBuf, Option<super::diagnostics::Origin>) {
    if let Some(s) = r.get(KRB5_CONF_KEY) {
        return (PathBuf::from(s.value.trim()), Some(s.origin.clone()));
    }
    let from_opts = std::env::var("KAFKA_OPTS").ok().and_then(|opts| {
        opts.split_whitespace().rev().find_map(|o| {
            o.strip_prefix("-Djava.security.krb5.conf=")
                .map(PathBuf::from)
        })
    });
    if let Some(p) = from_opts {
        return (p, None);
    }
    match std::env::var("KRB5_CONFIG") {
        // MIT takes a list; the first file holds the realms in every setup seen.
        Ok(list) if !list.trim().is_empty() => (
            PathBuf::from(list.split(':').next().unwrap_or("").trim()),
            None,
        ),
        _ => (PathBuf::from("/etc/krb5.conf"), None),
    }
}

fn from_where(origin: &Option<super::diagnostics::Origin>) -> String {
    match origin {
        Some(_) => format!("named by {KRB5_CONF_KEY}"),
        None => format!(
            "found through {KRB5_CONF_KEY}, -Djava.security.krb5.conf in KAFKA_OPTS, KRB5_CONFIG or /etc/krb5.conf"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<SaslCredentials, Vec<String>> {
        crate::config::client::parse_sasl_for_test(pairs, credentials)
    }

    #[test]
    fn the_java_keytab_lines_are_read_and_the_realm_added() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("krb5.conf");
        std::fs::write(
            &conf,
            "[libdefaults]\ndefault_realm = R.TEST\n[realms]\nR.TEST = {\nkdc = 127.0.0.1:88\n}\n",
        )
        .unwrap();
        let kt = dir.path().join("kmirror.keytab");
        std::fs::write(&kt, [5, 2]).unwrap();
        let conf_s = conf.display().to_string();
        let jaas = format!(
            "{MODULE} required useKeyTab=true storeKey=true keyTab=\"{}\" principal=\"kmirror\";",
            kt.display()
        );
        let c = parse(&[
            ("sasl.jaas.config", &jaas),
            ("sasl.kerberos.service.name", "kafka"),
            (KRB5_CONF_KEY, &conf_s),
        ])
        .unwrap();
        let k = c.kerberos.unwrap();
        assert_eq!(k.principal, "kmirror@R.TEST");
        assert_eq!(
            (k.service_name.as_str(), k.keytab.as_path()),
            ("kafka", kt.as_path())
        );
        // serviceName in the JAAS line serves when the key is absent.
        let jaas2 = jaas.replace("storeKey=true", "serviceName=\"kfk\"");
        let c = parse(&[("sasl.jaas.config", &jaas2), (KRB5_CONF_KEY, &conf_s)]).unwrap();
        assert_eq!(c.kerberos.unwrap().service_name, "kfk");

        let e = parse(&[("sasl.jaas.config", &jaas), (KRB5_CONF_KEY, &conf_s)]).unwrap_err();
        assert!(e[0].contains("sasl.kerberos.service.name"), "{e:?}");
        let cache = format!("{MODULE} required useTicketCache=true;");
        let e = parse(&[
            ("sasl.jaas.config", &cache),
            ("sasl.kerberos.service.name", "kafka"),
        ])
        .unwrap_err();
        assert!(e[0].contains("ticket-cache form"), "{e:?}");
        let host = jaas.replace("principal=\"kmirror\"", "principal=\"svc/h@R.TEST\"");
        let e = parse(&[
            ("sasl.jaas.config", &host),
            ("sasl.kerberos.service.name", "kafka"),
            (KRB5_CONF_KEY, &conf_s),
        ])
        .unwrap_err();
        assert!(e[0].contains("one-part principal"), "{e:?}");
        let other = jaas.replace("principal=\"kmirror\"", "principal=\"k@OTHER.TEST\"");
        let e = parse(&[
            ("sasl.jaas.config", &other),
            ("sasl.kerberos.service.name", "kafka"),
            (KRB5_CONF_KEY, &conf_s),
        ])
        .unwrap_err();
        assert!(e[0].contains("no kdc for realm OTHER.TEST"), "{e:?}");
        let missing = jaas.replace("kmirror.keytab", "absent.keytab");
        let e = parse(&[
            ("sasl.jaas.config", &missing),
            ("sasl.kerberos.service.name", "kafka"),
            (KRB5_CONF_KEY, &conf_s),
        ])
        .unwrap_err();
        assert!(
            e[0].contains("cannot read keyTab") && e[0].contains("absent.keytab"),
            "{e:?}"
        );
        let e = parse(&[
            ("sasl.jaas.config", &jaas),
            ("sasl.kerberos.service.name", "kafka"),
            (KRB5_CONF_KEY, "/nonexistent/krb5.conf"),
        ])
        .unwrap_err();
        assert!(
            e[0].contains("/nonexistent/krb5.conf") && e[0].contains(KRB5_CONF_KEY),
            "{e:?}"
        );
    }
}
