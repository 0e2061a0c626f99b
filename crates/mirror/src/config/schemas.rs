//! A flow's schema sync (docs/schemas.md, "Configuration"): each cluster's registry, named as
//! the Confluent clients name it (`A.schema.registry.url`, `A.basic.auth.*`, `A.bearer.auth.*`,
//! `A.schema.registry.ssl.*`), and the flow's `kmirror.schemas.*` keys. A flow syncs schemas
//! when both of its clusters name a registry, unless `kmirror.schemas.enabled = false`.

use super::diagnostics::Diagnostics;
use super::model::{IdsMode, RegistryAt, SchemaSync};
use super::values::{Reader, SettingMap};
use crate::filter::PatternList;
use crate::names::FlowId;
use kmirror_kafka::Secret;
use kmirror_registry::{Auth, RegistrySettings};
use std::time::Duration;

/// The keys of one cluster's registry, after `source.cluster.` / `target.cluster.`.
pub const REGISTRY_KEYS: &[&str] = &[
    "schema.registry.url",
    "basic.auth.credentials.source",
    "basic.auth.user.info",
    "bearer.auth.credentials.source",
    "bearer.auth.token",
];

/// Whether `key` (after a cluster prefix) is one of a registry's keys kmirror reads.
pub fn is_registry_key(key: &str) -> bool {
    REGISTRY_KEYS.contains(&key)
        || key
            .strip_prefix("schema.registry.")
            .is_some_and(|ssl| super::keys::SECURITY_KEYS.contains(&ssl) && ssl.starts_with("ssl."))
}

/// The flow's schema sync, or None when it is off. A registry named on the source only is a
/// warning (records would reach the target with ids its consumers cannot resolve).
pub fn build(id: &FlowId, p: &SettingMap, diags: &mut Diagnostics) -> Option<SchemaSync> {
    let hint = format!("{}.schema.registry.url", id.target);
    build_with(&id.to_string(), &hint, p, diags)
}

/// The flow's keys in `kmirror.schemas.*`.
pub const FLOW_KEYS: [&str; 4] = [
    "kmirror.schemas.enabled",
    "kmirror.schemas.ids",
    "kmirror.schemas.subjects",
    "kmirror.schemas.refresh.interval.seconds",
];

/// [`build`] for a flow named `flow`, whose target registry is set with `target_hint`.
pub fn build_with(
    flow: &str,
    target_hint: &str,
    p: &SettingMap,
    diags: &mut Diagnostics,
) -> Option<SchemaSync> {
    let mut r = Reader::new(p, diags);
    let enabled = r.bool("kmirror.schemas.enabled", true);
    let ids = match r.choice("kmirror.schemas.ids", "keep", &["keep", "translate"]) {
        "translate" => IdsMode::Translate,
        _ => IdsMode::Keep,
    };
    let subjects = match r.get("kmirror.schemas.subjects") {
        Some(_) => r.patterns("kmirror.schemas.subjects", ""),
        None => PatternList::parse("").unwrap_or_else(|_| unreachable!("an empty list parses")),
    };
    let refresh = Duration::from_secs(r.int(
        "kmirror.schemas.refresh.interval.seconds",
        30,
        1,
        i32::MAX as i64,
    ) as u64);
    let source = registry(p, "source.cluster.", "the source", diags);
    let target = registry(p, "target.cluster.", "the target", diags);
    match (source, target) {
        (Some(source), Some(target)) if enabled => Some(SchemaSync {
            source,
            target,
            ids,
            subjects,
            refresh,
        }),
        (Some(_), None) if enabled => {
            let origin = p
                .get("source.cluster.schema.registry.url")
                .map(|s| &s.origin);
            diags.warning(
                origin,
                None,
                format!(
                    "{flow}: only the source names a schema registry, so its schemas are not copied and the target's consumers cannot resolve the schema ids in copied records: set {target_hint}, or kmirror.schemas.enabled = false"
                ),
            );
            None
        }
        _ => None,
    }
}

/// One cluster's registry (`prefix` is `source.cluster.` or `target.cluster.`), None without a
/// URL or with an error recorded.
fn registry(
    p: &SettingMap,
    prefix: &str,
    alias: &str,
    diags: &mut Diagnostics,
) -> Option<RegistryAt> {
    let own: SettingMap = p
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(prefix)?.to_string(), v.clone())))
        .collect();
    let url = own.get("schema.registry.url")?.clone();
    let errors_before = diags.errors().count();
    let mut r = Reader::new(&own, diags);
    let value = url.value.trim().to_string();
    if !(value.starts_with("http://") || value.starts_with("https://")) || value.contains(',') {
        // Not shown: without a scheme, credentials in it would not be recognised and masked.
        r.diags.error(
            Some(&url.origin),
            None,
            "expected one http:// or https:// URL (kmirror asks one registry address per cluster)",
        );
    }
    let in_url = value
        .split_once("://")
        .map(|(_, rest)| rest.split('/').next().unwrap_or_default().contains('@'))
        .unwrap_or(false);
    let auth = auth(&mut r, alias, in_url);
    // `schema.registry.ssl.*` read as the Kafka keys are.
    let ssl: SettingMap = own
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("schema.registry.")?.to_string(), v.clone())))
        .filter(|(k, _)| k.starts_with("ssl."))
        .collect();
    let tls = if ssl.is_empty() {
        None
    } else {
        Some(super::tls::tls(&mut Reader::new(&ssl, diags))?)
    };
    if diags.errors().count() > errors_before {
        return None;
    }
    Some(RegistryAt(RegistrySettings {
        url: value,
        auth,
        tls,
        timeout: Duration::from_secs(30),
    }))
}

/// `basic.auth.*` or `bearer.auth.*`, with the credential sources the Confluent clients name
/// (the others need code kmirror does not run: an SASL inheritance or a custom provider).
fn auth(r: &mut Reader<'_>, alias: &str, in_url: bool) -> Auth {
    let basic = r.get("basic.auth.user.info");
    let bearer = r.get("bearer.auth.token");
    let basic_source = r.choice(
        "basic.auth.credentials.source",
        "USER_INFO",
        &["USER_INFO", "URL"],
    );
    let bearer_source = r.choice(
        "bearer.auth.credentials.source",
        "STATIC_TOKEN",
        &["STATIC_TOKEN"],
    );
    if let (Some(s), true) = (basic.or(bearer), in_url) {
        r.diags.error(
            Some(&s.origin),
            None,
            format!("{alias} registry has credentials in its URL and in this key: give them once (basic.auth.credentials.source = URL for the URL's)"),
        );
        return Auth::None;
    }
    if let (Some(s), "URL") = (basic, basic_source) {
        r.diags.error(
            Some(&s.origin),
            None,
            "not used with basic.auth.credentials.source = URL (the credentials come from the URL): remove it, or set USER_INFO",
        );
        return Auth::None;
    }
    match (basic, bearer) {
        (Some(_), Some(s)) => {
            r.diags.error(
                Some(&s.origin),
                None,
                format!("{alias} registry has both basic.auth.user.info and bearer.auth.token: a registry takes one kind of credentials"),
            );
            Auth::None
        }
        (Some(s), None) if basic_source == "USER_INFO" => match s.value.split_once(':') {
            Some((user, password)) if !user.trim().is_empty() => Auth::Basic {
                user: user.trim().to_string(),
                password: Secret::new(password),
            },
            _ => {
                r.diags
                    .error(Some(&s.origin), None, "expected user:password");
                Auth::None
            }
        },
        // Credentials in the URL (`https://user:password@host`) go with the URL itself.
        (_, None) => Auth::None,
        (None, Some(s)) if bearer_source == "STATIC_TOKEN" && !s.value.trim().is_empty() => {
            Auth::Bearer(Secret::new(s.value.trim()))
        }
        (None, Some(s)) => {
            r.diags.error(Some(&s.origin), None, "expected a token");
            Auth::None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(lines: &[(&str, &str)]) -> SettingMap {
        lines
            .iter()
            .map(|(k, v)| (k.to_string(), crate::config::flow::synthetic(v, &origin(k))))
            .collect()
    }

    fn origin(k: &str) -> crate::config::diagnostics::Origin {
        crate::config::diagnostics::Origin::new(&std::sync::Arc::from("mm2.properties"), 1, k)
    }

    fn id() -> FlowId {
        FlowId::new(
            crate::names::ClusterAlias::new("A"),
            crate::names::ClusterAlias::new("B"),
        )
    }

    fn build_from(lines: &[(&str, &str)]) -> (Option<SchemaSync>, Diagnostics) {
        let mut d = Diagnostics::default();
        let s = build(&id(), &map(lines), &mut d);
        (s, d)
    }

    #[test]
    fn both_registries_turn_sync_on_with_its_defaults() {
        let (s, d) = build_from(&[
            (
                "source.cluster.schema.registry.url",
                "http://127.0.0.1:8081",
            ),
            (
                "target.cluster.schema.registry.url",
                "https://127.0.0.1:8082/apis/ccompat/v7",
            ),
            ("target.cluster.basic.auth.user.info", "kmirror:s3cret:x"),
        ]);
        assert!(d.items.is_empty(), "{:?}", d.items);
        let s = s.expect("sync on");
        assert_eq!(s.ids, IdsMode::Keep);
        assert_eq!(s.refresh, Duration::from_secs(30));
        assert!(s.subjects.items().is_empty());
        assert_eq!(s.source.0.auth, Auth::None);
        match &s.target.0.auth {
            Auth::Basic { user, password } => {
                assert_eq!(user, "kmirror");
                assert_eq!(password.expose(), "s3cret:x");
            }
            other => panic!("{other:?}"),
        }
        let shown = serde_json::to_string(&s).unwrap();
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("basic"), "{shown}");
    }

    #[test]
    fn flow_keys_choose_translation_subjects_and_the_interval() {
        let (s, d) = build_from(&[
            ("source.cluster.schema.registry.url", "http://a:1"),
            ("target.cluster.schema.registry.url", "http://b:2"),
            ("target.cluster.bearer.auth.token", "tok"),
            ("kmirror.schemas.ids", "TRANSLATE"),
            ("kmirror.schemas.subjects", "common\\..*, shared"),
            ("kmirror.schemas.refresh.interval.seconds", "5"),
        ]);
        assert!(d.items.is_empty(), "{:?}", d.items);
        let s = s.unwrap();
        assert_eq!(s.ids, IdsMode::Translate);
        assert_eq!(s.refresh, Duration::from_secs(5));
        assert!(s.subjects.matches("common.money") && s.subjects.matches("shared"));
        assert!(matches!(&s.target.0.auth, Auth::Bearer(t) if t.expose() == "tok"));
    }

    #[test]
    fn a_registry_on_the_source_only_warns_and_disabled_sync_stays_quiet() {
        let (s, d) = build_from(&[("source.cluster.schema.registry.url", "http://a:1")]);
        assert!(s.is_none());
        let w: Vec<String> = d.warnings().map(|w| w.to_string()).collect();
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("B.schema.registry.url"), "{w:?}");
        let (s, d) = build_from(&[
            ("source.cluster.schema.registry.url", "http://a:1"),
            ("kmirror.schemas.enabled", "false"),
        ]);
        assert!(s.is_none() && d.items.is_empty());
        let (s, d) = build_from(&[
            ("source.cluster.schema.registry.url", "http://a:1"),
            ("target.cluster.schema.registry.url", "http://b:2"),
            ("kmirror.schemas.enabled", "false"),
        ]);
        assert!(s.is_none() && d.items.is_empty());
    }

    #[test]
    fn bad_values_name_their_key_and_never_show_a_secret() {
        for (lines, expected) in [
            (
                vec![("source.cluster.schema.registry.url", "registry:8081")],
                "http:// or https://",
            ),
            (
                vec![(
                    "source.cluster.schema.registry.url",
                    "http://a:1,http://b:1",
                )],
                "one http:// or https:// URL",
            ),
            (
                vec![("source.cluster.basic.auth.user.info", "no-colon-s3cret")],
                "user:password",
            ),
            (
                vec![
                    ("source.cluster.basic.auth.user.info", "u:s3cret"),
                    ("source.cluster.bearer.auth.token", "s3cret"),
                ],
                "one kind of credentials",
            ),
            (
                vec![(
                    "source.cluster.schema.registry.url",
                    "u:s3cret@registry:8081",
                )],
                "one http:// or https:// URL",
            ),
            (
                vec![
                    ("source.cluster.schema.registry.url", "http://u:s3cret@a:1"),
                    ("source.cluster.basic.auth.user.info", "u:s3cret"),
                ],
                "give them once",
            ),
            (
                vec![
                    ("source.cluster.basic.auth.credentials.source", "URL"),
                    ("source.cluster.basic.auth.user.info", "u:s3cret"),
                ],
                "not used with basic.auth.credentials.source = URL",
            ),
            (vec![("kmirror.schemas.ids", "copy")], "keep, translate"),
            (
                vec![("kmirror.schemas.refresh.interval.seconds", "0")],
                "between 1",
            ),
            (
                vec![(
                    "source.cluster.bearer.auth.credentials.source",
                    "SASL_INHERIT",
                )],
                "STATIC_TOKEN",
            ),
        ] {
            let mut all = vec![
                ("source.cluster.schema.registry.url", "http://a:1"),
                ("target.cluster.schema.registry.url", "http://b:2"),
            ];
            all.retain(|(k, _)| !lines.iter().any(|(l, _)| l == k));
            all.extend(lines);
            let (_, d) = build_from(&all);
            let errors: Vec<String> = d.errors().map(|e| e.to_string()).collect();
            assert_eq!(errors.len(), 1, "{all:?}: {errors:?}");
            assert!(errors[0].contains(expected), "{errors:?}");
            assert!(!errors[0].contains("s3cret"), "{errors:?}");
        }
    }

    #[test]
    fn registry_keys_are_recognised() {
        for k in [
            "schema.registry.url",
            "basic.auth.user.info",
            "bearer.auth.token",
            "schema.registry.ssl.truststore.location",
            "schema.registry.ssl.keystore.password",
        ] {
            assert!(is_registry_key(k), "{k}");
        }
        for k in [
            "schema.registry.ssl.protocol",
            "schema.registry.urls",
            "ssl.truststore.location",
        ] {
            assert!(!is_registry_key(k), "{k}");
        }
    }
}
