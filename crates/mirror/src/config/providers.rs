//! Kafka config providers: `${env:VAR}`, `${file:/path/x.properties:key}` and
//! `${dir:/path:file}` references in values, resolved as Kafka's `ConfigTransformer` does.
//!
//! Providers must be declared (`config.providers = file,env` and
//! `config.providers.file.class = org.apache.kafka.common.config.provider.FileConfigProvider`), as
//! in MM2. A reference to an undeclared provider is left as written (MM2 does the same) with a
//! warning; a reference to a missing variable, file or key is an error, since it is almost
//! always a secret that did not arrive.

use super::diagnostics::{Diagnostics, Origin};
use super::properties::Properties;
use regex::Regex;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

/// The outside world a provider reads: the process environment and files. A trait so that tests
/// and `plan` can resolve without touching the real machine.
pub trait Environment {
    fn var(&self, name: &str) -> Option<String>;
    fn read_file(&self, path: &Path) -> std::io::Result<String>;
}

/// The real environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemEnvironment;

impl Environment for SystemEnvironment {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }

    fn read_file(&self, path: &Path) -> std::io::Result<String> {
        std::fs::read_to_string(path)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    File,
    Env,
    Directory,
}

impl ProviderKind {
    pub fn from_class(class: &str) -> Option<Self> {
        match class.trim().rsplit('.').next().unwrap_or("") {
            "FileConfigProvider" => Some(Self::File),
            "EnvVarConfigProvider" => Some(Self::Env),
            "DirectoryConfigProvider" => Some(Self::Directory),
            _ => None,
        }
    }
}

/// The declared providers, by the name used in `${name:...}`.
#[derive(Debug, Clone, Default)]
pub struct Providers {
    declared: BTreeMap<String, ProviderKind>,
}

fn reference_pattern() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    // Kafka's ConfigTransformer pattern: ${provider:[path:]key}, lazy parts.
    RE.get_or_init(|| {
        Regex::new(r"\$\{([^}]*?):(?:([^}]*?):)?([^}]*?)\}").expect("static provider pattern")
    })
}

impl Providers {
    /// Reads `config.providers` and `config.providers.<name>.class` through `get`.
    pub fn declare(
        get: impl Fn(&str) -> Option<(String, Origin)>,
        diags: &mut Diagnostics,
    ) -> Self {
        let mut declared = BTreeMap::new();
        let Some((list, origin)) = get("config.providers") else {
            return Providers { declared };
        };
        for name in crate::filter::split_list(&list) {
            if name.is_empty() {
                continue;
            }
            let class_key = format!("config.providers.{name}.class");
            match get(&class_key) {
                None => diags.error(
                    Some(&origin),
                    Some(&list),
                    format!("provider '{name}' is declared but '{class_key}' is not set"),
                ),
                Some((class, class_origin)) => match ProviderKind::from_class(&class) {
                    Some(kind) => {
                        declared.insert(name, kind);
                    }
                    None => diags.error(
                        Some(&class_origin),
                        Some(&class),
                        "unsupported config provider class; kmirror has FileConfigProvider, \
                         EnvVarConfigProvider and DirectoryConfigProvider \
                         (org.apache.kafka.common.config.provider.*)",
                    ),
                },
            }
        }
        Providers { declared }
    }

    /// Whether a value holds a `${...}` reference.
    pub fn has_reference(value: &str) -> bool {
        reference_pattern().is_match(value)
    }

    /// Replaces every reference in `value`. Returns `None` (after recording an error) when a
    /// reference cannot be resolved.
    pub fn resolve(
        &self,
        value: &str,
        origin: &Origin,
        env: &dyn Environment,
        diags: &mut Diagnostics,
    ) -> Option<String> {
        let mut out = String::with_capacity(value.len());
        let mut last = 0;
        let mut ok = true;
        for caps in reference_pattern().captures_iter(value) {
            let whole = caps.get(0).expect("match");
            out.push_str(&value[last..whole.start()]);
            last = whole.end();
            let name = &caps[1];
            let path = caps.get(2).map(|m| m.as_str());
            let key = &caps[3];
            let Some(kind) = self.declared.get(name) else {
                diags.warning(
                    Some(origin),
                    None,
                    format!(
                        "'{}' names config provider '{name}', which is not declared in \
                         config.providers; the text is used as written (as MM2 does)",
                        whole.as_str()
                    ),
                );
                out.push_str(whole.as_str());
                continue;
            };
            match lookup(*kind, path, key, env) {
                Ok(v) => out.push_str(&v),
                Err(why) => {
                    ok = false;
                    diags.error(
                        Some(origin),
                        None,
                        format!("cannot resolve '{}': {why}", whole.as_str()),
                    );
                }
            }
        }
        out.push_str(&value[last..]);
        ok.then_some(out)
    }
}

fn lookup(
    kind: ProviderKind,
    path: Option<&str>,
    key: &str,
    env: &dyn Environment,
) -> Result<String, String> {
    match kind {
        ProviderKind::Env => {
            if path.is_some_and(|p| !p.is_empty()) {
                return Err("the env provider takes no path: write ${env:VARIABLE}".into());
            }
            env.var(key)
                .ok_or_else(|| format!("environment variable {key} is not set"))
        }
        ProviderKind::File => {
            let path = path.filter(|p| !p.is_empty()).ok_or(
                "the file provider needs a path: write ${file:/path/to/file.properties:key}",
            )?;
            let text = env
                .read_file(Path::new(path))
                .map_err(|e| format!("cannot read {path}: {e}"))?;
            // The parse error's detail could quote part of a secret: name only the file.
            let props = Properties::parse(&text, path).map_err(|_| {
                format!("{path} is not a valid properties file (malformed \\u escape)")
            })?;
            props
                .get(key)
                .map(|p| p.value.clone())
                .ok_or_else(|| format!("{path} has no key '{key}'"))
        }
        ProviderKind::Directory => {
            let dir = path
                .filter(|p| !p.is_empty())
                .ok_or("the directory provider needs a path: write ${dir:/path/to/dir:file}")?;
            if key.contains('/') || key == ".." {
                return Err(format!("'{key}' must be a file name inside {dir}"));
            }
            let file = Path::new(dir).join(key);
            env.read_file(&file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Arc;

    #[derive(Default)]
    struct FakeEnv {
        vars: HashMap<String, String>,
        files: HashMap<String, String>,
    }

    impl Environment for FakeEnv {
        fn var(&self, name: &str) -> Option<String> {
            self.vars.get(name).cloned()
        }
        fn read_file(&self, path: &Path) -> std::io::Result<String> {
            self.files
                .get(path.to_str().unwrap())
                .cloned()
                .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "No such file"))
        }
    }

    fn origin() -> Origin {
        Origin {
            file: Arc::from("mm2.properties"),
            line: 3,
            key: "A.sasl.jaas.config".into(),
        }
    }

    fn providers(pairs: &[(&str, &str)]) -> (Providers, Diagnostics) {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut d = Diagnostics::default();
        let p = Providers::declare(
            |k| {
                map.get(k).map(|v| {
                    (
                        v.clone(),
                        Origin {
                            key: k.into(),
                            ..origin()
                        },
                    )
                })
            },
            &mut d,
        );
        (p, d)
    }

    fn all() -> Providers {
        providers(&[
            ("config.providers", "env, file,dir"),
            (
                "config.providers.env.class",
                "org.apache.kafka.common.config.provider.EnvVarConfigProvider",
            ),
            (
                "config.providers.file.class",
                "org.apache.kafka.common.config.provider.FileConfigProvider",
            ),
            (
                "config.providers.dir.class",
                "org.apache.kafka.common.config.provider.DirectoryConfigProvider",
            ),
        ])
        .0
    }

    fn env() -> FakeEnv {
        let mut e = FakeEnv::default();
        e.vars.insert("KPASS".into(), "s3cret".into());
        e.files.insert(
            "/etc/k/creds.properties".into(),
            "user=alice\npass=from-file\n".into(),
        );
        e.files
            .insert("/run/secrets/pw".into(), "dir-secret".into());
        e
    }

    #[test]
    fn resolves_env_file_and_directory_references() {
        let p = all();
        let mut d = Diagnostics::default();
        let v = p
            .resolve(
                "u=\"${file:/etc/k/creds.properties:user}\" p=\"${env:KPASS}\" q=${dir:/run/secrets:pw};",
                &origin(),
                &env(),
                &mut d,
            )
            .unwrap();
        assert_eq!(v, "u=\"alice\" p=\"s3cret\" q=dir-secret;");
        assert!(d.items.is_empty());
    }

    #[test]
    fn missing_values_are_errors_naming_the_reference() {
        let p = all();
        let cases = [
            ("${env:NOPE}", "environment variable NOPE is not set"),
            (
                "${file:/etc/k/creds.properties:nokey}",
                "has no key 'nokey'",
            ),
            (
                "${file:/missing.properties:k}",
                "cannot read /missing.properties",
            ),
            ("${dir:/run/secrets:../x}", "must be a file name"),
            ("${env:/x:Y}", "takes no path"),
        ];
        for (value, needle) in cases {
            let mut d = Diagnostics::default();
            assert_eq!(p.resolve(value, &origin(), &env(), &mut d), None, "{value}");
            let msg = d.items[0].to_string();
            assert!(msg.contains(needle), "{value}: {msg}");
            assert!(
                msg.starts_with("error: mm2.properties:3: A.sasl.jaas.config"),
                "{msg}"
            );
            assert!(!msg.contains("s3cret"));
        }
    }

    #[test]
    fn undeclared_providers_are_left_as_written_with_a_warning() {
        let (p, _) = providers(&[]);
        let mut d = Diagnostics::default();
        assert_eq!(
            p.resolve("${env:KPASS}", &origin(), &env(), &mut d)
                .as_deref(),
            Some("${env:KPASS}")
        );
        assert!(!d.has_errors());
        assert!(d.items[0]
            .message
            .contains("not declared in config.providers"));
    }

    #[test]
    fn declaration_errors() {
        let (_, d) = providers(&[("config.providers", "vault")]);
        assert!(d.items[0]
            .message
            .contains("'config.providers.vault.class' is not set"));
        let (_, d) = providers(&[
            ("config.providers", "vault"),
            ("config.providers.vault.class", "io.confluent.VaultProvider"),
        ]);
        assert!(d.items[0]
            .message
            .contains("unsupported config provider class"));
    }
}
