//! Reading a [`Chain`] from Connect's SMT keys. Every mistake is reported with its file, line,
//! key and value, all in one run; keys a transform does not know are errors too, since a
//! misspelt `replacement` would otherwise rename nothing in silence.

use crate::config::diagnostics::{Diagnostics, Origin};
use crate::config::values::{Reader, Setting, SettingMap};
use crate::filter::java_regex;
use crate::filter::split_list;
use crate::transform::replacement::Replacement;
use crate::transform::{Chain, Condition, Kind, Predicate, Step};

const CONNECT: &str = "org.apache.kafka.connect.transforms.";
const CONNECT_PREDICATES: &str = "org.apache.kafka.connect.transforms.predicates.";

const TRANSFORMS: &str =
    "Filter, DropHeaders, InsertHeader, RegexRouter (Connect's class names or these short names)";
const PREDICATES: &str = "TopicNameMatches, HasHeaderKey, RecordIsTombstone (Connect's), KeyMatches, HeaderValueMatches (kmirror's)";

/// Reads `transforms` / `predicates` from one scope's settings; an absent or empty `transforms`
/// is the empty chain.
pub fn parse(map: &SettingMap, diags: &mut Diagnostics) -> Chain {
    let aliases = list(map.get("transforms"));
    let predicate_aliases = list(map.get("predicates"));
    let mut used_predicates = Vec::new();
    let mut steps = Vec::new();
    for alias in &aliases {
        let prefix = format!("transforms.{alias}.");
        if let Some(step) = step(map, diags, alias, &prefix, &predicate_aliases) {
            if let Some(c) = map.get(&format!("{prefix}predicate")) {
                used_predicates.push(c.value.trim().to_string());
            }
            steps.push(step);
        }
    }
    // Keys of aliases that are not listed: a transform left out of `transforms` by mistake.
    for (key, s) in map {
        for (root, listed) in [
            ("transforms.", &aliases),
            ("predicates.", &predicate_aliases),
        ] {
            if let Some(rest) = key.strip_prefix(root) {
                let alias = rest.split('.').next().unwrap_or_default();
                if !listed.iter().any(|a| a == alias) {
                    diags.warning(
                        Some(&s.origin),
                        Some(&s.value),
                        format!(
                            "ignored: '{alias}' is not listed in '{}'",
                            root.trim_end_matches('.')
                        ),
                    );
                }
            }
        }
    }
    for p in &predicate_aliases {
        if !used_predicates.contains(p) {
            if let Some(s) = map.get("predicates") {
                diags.warning(
                    Some(&s.origin),
                    Some(&s.value),
                    format!("predicate '{p}' is used by no transform"),
                );
            }
        }
    }
    Chain { steps }
}

fn list(s: Option<&Setting>) -> Vec<String> {
    s.map(|s| split_list(&s.value))
        .unwrap_or_default()
        .into_iter()
        .filter(|a| !a.is_empty())
        .collect()
}

/// Checks that every `prefix*` key is one of `known` (plus `type`).
fn known_keys(map: &SettingMap, diags: &mut Diagnostics, prefix: &str, known: &[&str]) {
    for (key, s) in map.range(prefix.to_string()..) {
        let Some(rest) = key.strip_prefix(prefix) else {
            break;
        };
        if rest != "type" && !known.contains(&rest) {
            let hint = crate::config::keys::did_you_mean(rest, known.iter().copied())
                .map(|h| format!(" (did you mean '{prefix}{h}'?)"))
                .unwrap_or_default();
            diags.error(
                Some(&s.origin),
                Some(&s.value),
                format!(
                    "unknown key for this type; known: {}{hint}",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            );
        }
    }
}

fn required<'a>(
    map: &'a SettingMap,
    diags: &mut Diagnostics,
    key: &str,
    context: &Origin,
    what: &str,
) -> Option<&'a Setting> {
    let s = map.get(key);
    if s.is_none() {
        diags.error(Some(context), None, format!("{key} is required: {what}"));
    }
    s
}

/// A Java regex, matched against the whole input (as Connect's `Matcher.matches()`).
fn full_regex(s: &Setting, diags: &mut Diagnostics) -> Option<String> {
    match java_regex::translate(s.value.trim()) {
        Ok(r) => Some(format!("^(?:{r})$")),
        Err(e) => {
            diags.error(
                Some(&s.origin),
                Some(&s.value),
                format!("invalid regex {e}"),
            );
            None
        }
    }
}

fn text_regex(s: &Setting, diags: &mut Diagnostics) -> Option<regex::Regex> {
    compiled(s, diags, regex::Regex::new)
}

fn bytes_regex(s: &Setting, diags: &mut Diagnostics) -> Option<regex::bytes::Regex> {
    compiled(s, diags, regex::bytes::Regex::new)
}

/// The setting's Java regex, anchored to the whole value, built by `build`.
fn compiled<R>(
    s: &Setting,
    diags: &mut Diagnostics,
    build: impl Fn(&str) -> Result<R, regex::Error>,
) -> Option<R> {
    let r = full_regex(s, diags)?;
    build(&r)
        .map_err(|e| {
            diags.error(
                Some(&s.origin),
                Some(&s.value),
                format!("invalid regex: {e}"),
            )
        })
        .ok()
}

fn simple_name<'a>(class: &'a str, package: &str) -> &'a str {
    class.strip_prefix(package).unwrap_or(class)
}

fn step(
    map: &SettingMap,
    diags: &mut Diagnostics,
    alias: &str,
    prefix: &str,
    predicate_aliases: &[String],
) -> Option<Step> {
    let list_origin = map.get("transforms").map(|s| s.origin.clone())?;
    let ty = required(
        map,
        diags,
        &format!("{prefix}type"),
        &list_origin,
        &format!("the transform of '{alias}' ({TRANSFORMS})"),
    )?;
    let class = ty.value.trim();
    let (kind, known, description) = match simple_name(class, CONNECT) {
        "Filter" => (
            Some(Kind::Filter),
            &[][..],
            "Filter: drop the record".to_string(),
        ),
        "DropHeaders" => {
            let names = required(
                map,
                diags,
                &format!("{prefix}headers"),
                &ty.origin,
                "the header names to drop",
            )
            .map(|s| split_list(&s.value));
            let desc = format!(
                "DropHeaders: {}",
                names.clone().unwrap_or_default().join(", ")
            );
            (
                names.map(|n| Kind::DropHeaders(n.into_iter().map(String::into_bytes).collect())),
                &["headers"][..],
                desc,
            )
        }
        "InsertHeader" => {
            let name = required(
                map,
                diags,
                &format!("{prefix}header"),
                &ty.origin,
                "the header name",
            );
            let value = required(
                map,
                diags,
                &format!("{prefix}value.literal"),
                &ty.origin,
                "the header value",
            );
            let desc = format!(
                "InsertHeader: {}={}",
                name.map_or("", |s| s.value.trim()),
                value.map_or("", |s| s.value.as_str())
            );
            let kind = match (name, value) {
                (Some(n), Some(v)) => Some(Kind::InsertHeader {
                    name: n.value.trim().as_bytes().to_vec(),
                    value: v.value.as_bytes().to_vec(),
                }),
                _ => None,
            };
            (kind, &["header", "value.literal"][..], desc)
        }
        "RegexRouter" => regex_router(map, diags, prefix, ty),
        _ => {
            diags.error(
                Some(&ty.origin),
                Some(class),
                format!(
                    "kmirror cannot load Java transform classes; built-in transforms: {TRANSFORMS}"
                ),
            );
            return None;
        }
    };
    let mut all_known = known.to_vec();
    all_known.extend(["predicate", "negate"]);
    known_keys(map, diags, prefix, &all_known);
    let negate = Reader::new(map, diags).bool(&format!("{prefix}negate"), false);
    let condition = match map.get(&format!("{prefix}predicate")) {
        None => {
            if let Some(n) = map.get(&format!("{prefix}negate")) {
                diags.warning(
                    Some(&n.origin),
                    Some(&n.value),
                    "negate has no effect without a predicate",
                );
            }
            None
        }
        Some(p) => {
            let name = p.value.trim();
            if !predicate_aliases.iter().any(|a| a == name) {
                diags.error(
                    Some(&p.origin),
                    Some(&p.value),
                    "no such predicate: list it in 'predicates' and give it a type",
                );
                None
            } else {
                predicate(map, diags, name).map(|predicate| Condition { predicate, negate })
            }
        }
    };
    let kind = kind?;
    let when = match (&condition, map.get(&format!("{prefix}predicate"))) {
        (Some(_), Some(p)) => format!(
            " when {}{}",
            if negate { "not " } else { "" },
            p.value.trim()
        ),
        _ => String::new(),
    };
    Some(Step {
        alias: alias.to_string(),
        description: format!("{alias}: {description}{when}"),
        kind,
        condition,
    })
}

/// A `RegexRouter` step: the topic renamed by a Java regex and its replacement.
fn regex_router(
    map: &SettingMap,
    diags: &mut Diagnostics,
    prefix: &str,
    ty: &Setting,
) -> (Option<Kind>, &'static [&'static str], String) {
    let regex = required(
        map,
        diags,
        &format!("{prefix}regex"),
        &ty.origin,
        "a Java regex matched against the whole topic name",
    );
    let replacement = required(
        map,
        diags,
        &format!("{prefix}replacement"),
        &ty.origin,
        "the new topic name, with $1... for groups",
    );
    let desc = format!(
        "RegexRouter: {} -> {}",
        regex.map_or("", |s| s.value.trim()),
        replacement.map_or("", |s| s.value.trim())
    );
    let compiled = regex.and_then(|s| text_regex(s, diags));
    let kind = match (compiled, replacement) {
        (Some(re), Some(rep)) => match Replacement::parse(rep.value.trim(), &re) {
            Ok(r) => Some(Kind::RegexRouter {
                regex: re,
                replacement: r,
            }),
            Err(e) => {
                diags.error(Some(&rep.origin), Some(&rep.value), e);
                None
            }
        },
        _ => None,
    };
    (kind, &["regex", "replacement"][..], desc)
}

fn predicate(map: &SettingMap, diags: &mut Diagnostics, alias: &str) -> Option<Predicate> {
    let prefix = format!("predicates.{alias}.");
    let list_origin = map.get("predicates").map(|s| s.origin.clone())?;
    let ty = required(
        map,
        diags,
        &format!("{prefix}type"),
        &list_origin,
        &format!("the predicate of '{alias}' ({PREDICATES})"),
    )?;
    let class = ty.value.trim();
    let get = |diags: &mut Diagnostics, key: &str, what: &str| {
        required(map, diags, &format!("{prefix}{key}"), &ty.origin, what)
    };
    let (p, known) = match simple_name(class, CONNECT_PREDICATES) {
        "TopicNameMatches" => (
            get(diags, "pattern", "a Java regex of topic names")
                .and_then(|s| text_regex(s, diags))
                .map(Predicate::TopicNameMatches),
            &["pattern"][..],
        ),
        "HasHeaderKey" => (
            get(diags, "name", "the header name")
                .map(|s| Predicate::HasHeaderKey(s.value.trim().as_bytes().to_vec())),
            &["name"][..],
        ),
        "RecordIsTombstone" => (Some(Predicate::RecordIsTombstone), &[][..]),
        "KeyMatches" => (
            get(diags, "pattern", "a Java regex of record keys")
                .and_then(|s| bytes_regex(s, diags))
                .map(Predicate::KeyMatches),
            &["pattern"][..],
        ),
        "HeaderValueMatches" => {
            let name = get(diags, "name", "the header name");
            let value = get(diags, "pattern", "a Java regex of the header's value")
                .and_then(|s| bytes_regex(s, diags));
            (
                match (name, value) {
                    (Some(n), Some(v)) => Some(Predicate::HeaderValueMatches {
                        name: n.value.trim().as_bytes().to_vec(),
                        value: v,
                    }),
                    _ => None,
                },
                &["name", "pattern"][..],
            )
        }
        _ => {
            diags.error(
                Some(&ty.origin),
                Some(class),
                format!(
                    "kmirror cannot load Java predicate classes; built-in predicates: {PREDICATES}"
                ),
            );
            return None;
        }
    };
    known_keys(map, diags, &prefix, known);
    p
}

#[cfg(test)]
mod tests {
    use crate::config::properties::Properties;
    use crate::config::values::settings_of;

    fn settings(text: &str) -> SettingMap {
        settings_of(&Properties::parse(text, "t.properties").unwrap())
    }

    fn chain(text: &str) -> Chain {
        let mut d = Diagnostics::default();
        let c = parse(&settings(text), &mut d);
        assert!(!d.has_errors(), "{d:?}");
        c
    }
    use super::*;

    fn errors(text: &str) -> Vec<String> {
        let mut d = Diagnostics::default();
        parse(&settings(text), &mut d);
        d.errors().map(|e| e.to_string()).collect()
    }

    fn warnings(text: &str) -> Vec<String> {
        let mut d = Diagnostics::default();
        parse(&settings(text), &mut d);
        d.warnings().map(|e| e.to_string()).collect()
    }

    fn has(list: &[String], needle: &str) -> bool {
        list.iter().any(|e| e.contains(needle))
    }

    #[test]
    fn misconfigurations_are_named_with_file_line_and_key() {
        let e = errors("transforms = a\ntransforms.a.type = com.example.MyTransform\n");
        assert!(has(&e, "t.properties:2"), "{e:?}");
        assert!(has(&e, "transforms.a.type"), "{e:?}");
        assert!(has(&e, "cannot load Java transform classes"), "{e:?}");

        let e = errors("transforms = a\n");
        assert!(has(&e, "transforms.a.type is required"), "{e:?}");

        let e =
            errors("transforms = r\ntransforms.r.type = RegexRouter\ntransforms.r.regex = (.*)\n");
        assert!(has(&e, "transforms.r.replacement is required"), "{e:?}");

        let e = errors(
            "transforms = r\ntransforms.r.type = RegexRouter\ntransforms.r.regex = (a\ntransforms.r.replacement = x\n",
        );
        assert!(has(&e, "transforms.r.regex"), "{e:?}");

        let e = errors(
            "transforms = r\ntransforms.r.type = RegexRouter\ntransforms.r.regex = (.*)\ntransforms.r.replacement = $2\n",
        );
        assert!(has(&e, "group 2"), "{e:?}");

        let e = errors(
            "transforms = r\ntransforms.r.type = RegexRouter\ntransforms.r.regex = (.*)\ntransforms.r.replacment = x\n",
        );
        assert!(has(&e, "transforms.r.replacment"), "{e:?}");
        assert!(has(&e, "did you mean 'transforms.r.replacement'"), "{e:?}");

        let e = errors("transforms = f\ntransforms.f.type = Filter\ntransforms.f.predicate = p\n");
        assert!(has(&e, "no such predicate"), "{e:?}");

        let e = errors(
            "transforms = f\ntransforms.f.type = Filter\ntransforms.f.predicate = p\npredicates = p\npredicates.p.type = x.Y\n",
        );
        assert!(has(&e, "cannot load Java predicate classes"), "{e:?}");

        let e = errors(
            "transforms = f\ntransforms.f.type = Filter\ntransforms.f.predicate = p\ntransforms.f.negate = maybe\npredicates = p\npredicates.p.type = KeyMatches\npredicates.p.pattern = (?<=a)b\n",
        );
        assert!(has(&e, "transforms.f.negate"), "{e:?}");
        assert!(has(&e, "look-around"), "{e:?}");

        let e = errors("transforms = d\ntransforms.d.type = DropHeaders\n");
        assert!(has(&e, "transforms.d.headers is required"), "{e:?}");
        let e =
            errors("transforms = i\ntransforms.i.type = InsertHeader\ntransforms.i.header = h\n");
        assert!(has(&e, "transforms.i.value.literal is required"), "{e:?}");
    }

    #[test]
    fn unlisted_and_unused_aliases_are_warned_about() {
        let w = warnings(
            "transforms = f\ntransforms.f.type = Filter\ntransforms.g.type = Filter\npredicates = p\npredicates.p.type = RecordIsTombstone\n",
        );
        assert!(has(&w, "'g' is not listed in 'transforms'"), "{w:?}");
        assert!(has(&w, "predicate 'p' is used by no transform"), "{w:?}");
    }

    #[test]
    fn description_names_each_step() {
        let c = chain(
            "transforms = f, r\ntransforms.f.type = Filter\ntransforms.f.predicate = p\ntransforms.f.negate = true\n\
             transforms.r.type = RegexRouter\ntransforms.r.regex = (.*)\ntransforms.r.replacement = dr.$1\n\
             predicates = p\npredicates.p.type = TopicNameMatches\npredicates.p.pattern = keep.*\n",
        );
        assert_eq!(
            c.describe(),
            [
                "f: Filter: drop the record when not p",
                "r: RegexRouter: (.*) -> dr.$1"
            ]
        );
        assert_eq!(c.renaming_aliases(), ["r"]);
    }
}
