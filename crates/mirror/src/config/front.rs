//! The stage the three configuration forms share: one parsed properties file becomes settings
//! that know where they came from. A key given twice is warned about (the later value wins, as
//! with Java's `Properties`), config providers are declared and every `${provider:...}` reference
//! is resolved. After this, each form (`mm2`, `connector`, `legacy`) only maps its own keys.

use super::diagnostics::{Diagnostics, Origin};
use super::properties::{Properties, Property};
use super::providers::{Environment, Providers};
use super::values::{Setting, SettingMap};
use std::sync::Arc;

/// A file's settings, resolved, and the providers that resolved them.
#[derive(Debug, Default)]
pub struct FileSettings {
    pub settings: SettingMap,
    pub providers: Providers,
}

/// Reads one file. `inherited` are providers declared elsewhere (a Connect worker's, for its
/// connector files) that apply when the file declares none of its own. The `config.providers*`
/// keys themselves are kept as written.
pub fn read(
    props: &Properties,
    inherited: Option<&Providers>,
    env: &dyn Environment,
    diags: &mut Diagnostics,
) -> FileSettings {
    let file: Arc<str> = Arc::from(props.source.as_str());
    let origin = |p: &Property| Origin {
        file: file.clone(),
        line: p.line,
        key: p.key.clone(),
    };
    for (old, winner_line) in props.duplicates() {
        diags.warning(
            Some(&origin(old)),
            None,
            format!("set again on line {winner_line}; the later value wins, as in Java"),
        );
    }
    let own = Providers::declare(
        |k| props.get(k).map(|p| (p.value.clone(), origin(p))),
        diags,
    );
    let providers = match inherited {
        Some(p) if props.get("config.providers").is_none() => p.clone(),
        _ => own,
    };
    let mut settings = SettingMap::new();
    for p in props.iter() {
        let o = origin(p);
        let value = if p.key.starts_with("config.providers") {
            Some(p.value.clone())
        } else {
            providers.resolve(&p.value, &o, env, diags)
        };
        if let Some(value) = value {
            settings.insert(p.key.clone(), Setting { value, origin: o });
        }
    }
    FileSettings {
        settings,
        providers,
    }
}
