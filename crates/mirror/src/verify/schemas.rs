//! `verify`'s schema checks (docs/verify.md, "Schemas"): each source subject a flow syncs, as the
//! target registry holds it. The verdicts are pure ([`judge`]); [`read`] reads one registry.
//! - `subject`: every live source version is on the target subject under the flow's name, with
//!   canonically equal text, references pointing to the matching target versions, and with
//!   `keep` the same id;
//! - `settings`: the compatibility level and mode that apply to the subject (its own, else the
//!   registry's) are the source's (modes kmirror never copies, IMPORT and READONLY_OVERRIDE, are
//!   not compared), and so are the registry's. A subject read only for the versions others
//!   refer to is judged on those versions alone.
//!
//! The source-to-target id map of the versions found equal is what `deep` uses to compare
//! records whose ids were rewritten.

use super::Status;
use kmirror_registry::{Compatibility, Mode, Registered, RegistryClient, RegistryError, Schema};
use kmirror_registry::{SchemaId, SchemaType};
use std::collections::{BTreeMap, BTreeSet};

/// One subject as a registry holds it: its live versions, oldest first, its soft-deleted ones,
/// and its own levels.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SubjectState {
    pub versions: Vec<Registered>,
    pub deleted: Vec<Registered>,
    pub compatibility: Option<Compatibility>,
    pub mode: Option<Mode>,
    /// Read only for the versions other subjects refer to (kmirror copies only those of a
    /// subject it does not select): neither its other versions nor its levels are compared.
    pub referenced_only: bool,
}

/// The subjects read from one registry, and its global levels.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RegistryState {
    pub subjects: BTreeMap<String, SubjectState>,
    pub compatibility: Option<Compatibility>,
    pub mode: Option<Mode>,
}

/// One verdict: the check, the source subject (`(registry)` for the global levels), the verdict.
pub type Verdict = (&'static str, String, (Status, String));

/// What the schema checks found, and the ids of the versions found equal (source to target).
#[derive(Debug, Default)]
pub struct Judged {
    pub verdicts: Vec<Verdict>,
    pub ids: BTreeMap<i32, i32>,
}

/// Whether two schemas say the same: Avro and JSON Schema as JSON values (formatting and key
/// order aside), Protobuf line by line with blank lines and surrounding spaces aside (registries
/// keep the text they are given; kmirror registers the source's text).
pub fn canonically_equal(a: &Schema, b: &Schema) -> bool {
    if a.schema_type != b.schema_type {
        return false;
    }
    match a.schema_type {
        SchemaType::Avro | SchemaType::Json => {
            match (
                serde_json::from_str::<serde_json::Value>(&a.schema),
                serde_json::from_str::<serde_json::Value>(&b.schema),
            ) {
                (Ok(x), Ok(y)) => x == y,
                _ => a.schema == b.schema,
            }
        }
        SchemaType::Protobuf => {
            let lines = |s: &str| -> Vec<String> {
                s.lines()
                    .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                    .filter(|l| !l.is_empty())
                    .collect()
            };
            lines(&a.schema) == lines(&b.schema)
        }
    }
}

/// A level or mode as the registry API spells it (`BACKWARD_TRANSITIVE`, `READWRITE`).
fn level<T: serde::Serialize>(v: &Option<T>) -> String {
    match v.as_ref().map(serde_json::to_value) {
        Some(Ok(serde_json::Value::String(s))) => s,
        Some(_) => "?".into(),
        None => "none of its own".into(),
    }
}

/// Modes kmirror copies (IMPORT and READONLY_OVERRIDE belong to the registry they are set on).
fn compared_mode(m: Option<Mode>) -> Option<Mode> {
    m.filter(|m| !matches!(m, Mode::Import | Mode::ReadOnlyOverride))
}

/// Judges each source subject against the target; `rename` gives a subject's name on the
/// target, `keep` whether ids must be equal.
pub fn judge(
    source: &RegistryState,
    target: &RegistryState,
    rename: &dyn Fn(&str) -> String,
    keep: bool,
) -> Judged {
    let mut out = Judged::default();
    // Each source version found on the target: its target version and id.
    let mut found: BTreeMap<(String, i32), (i32, i32)> = BTreeMap::new();
    let mut problems: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (subject, s) in &source.subjects {
        let to = rename(subject);
        let Some(t) = target.subjects.get(&to) else {
            problems
                .entry(subject.clone())
                .or_default()
                .push(format!("not on the target as {to}"));
            continue;
        };
        let mut taken = BTreeSet::new();
        // Soft-deleted versions are compared for the id map only: records may still name them.
        for v in &s.deleted {
            let hit = t.versions.iter().chain(&t.deleted).find(|tv| {
                !taken.contains(&tv.version) && canonically_equal(&v.schema, &tv.schema)
            });
            if let Some(tv) = hit {
                taken.insert(tv.version);
                out.ids.insert(v.id.0, tv.id.0);
            }
        }
        for v in &s.versions {
            // Equal text, with references of the same names to the same subjects first: two
            // versions may differ in their references only.
            let alike = |tv: &&Registered| {
                let names =
                    |x: &Registered, f: &dyn Fn(&str) -> String| -> BTreeSet<(String, String)> {
                        let refs = x.schema.references.iter();
                        refs.map(|r| (r.name.clone(), f(&r.subject))).collect()
                    };
                names(v, rename) == names(tv, &|s: &str| s.to_string())
            };
            let equal = |tv: &&Registered| {
                !taken.contains(&tv.version) && canonically_equal(&v.schema, &tv.schema)
            };
            let hit = (t.versions.iter().find(|tv| equal(tv) && alike(tv)))
                .or_else(|| t.versions.iter().find(equal));
            match hit {
                Some(tv) => {
                    taken.insert(tv.version);
                    found.insert((subject.clone(), v.version), (tv.version, tv.id.0));
                    if keep && tv.id != v.id {
                        problems.entry(subject.clone()).or_default().push(format!(
                            "version {}: id {} on the source, {} on the target (ids kept)",
                            v.version, v.id.0, tv.id.0
                        ));
                    }
                }
                None => problems.entry(subject.clone()).or_default().push(format!(
                    "version {} (id {}) not on {to} with the same text",
                    v.version, v.id.0
                )),
            }
        }
    }
    // References point to the target versions matching the source's.
    for (subject, s) in &source.subjects {
        let to = rename(subject);
        for v in &s.versions {
            let Some(&(tv, _)) = found.get(&(subject.clone(), v.version)) else {
                continue;
            };
            let Some(t) = target.subjects[&to]
                .versions
                .iter()
                .find(|x| x.version == tv)
            else {
                continue;
            };
            for r in &v.schema.references {
                let want = found
                    .get(&(r.subject.clone(), r.version))
                    .map(|&(version, _)| (rename(&r.subject), version));
                let got = t
                    .schema
                    .references
                    .iter()
                    .find(|x| x.name == r.name)
                    .map(|x| (x.subject.clone(), x.version));
                if want.is_none() || got != want {
                    problems.entry(subject.clone()).or_default().push(format!(
                        "version {}: reference {} points to {} on the target, expected {}",
                        v.version,
                        r.name,
                        got.map_or_else(|| "nothing".into(), |(s, v)| format!("{s} version {v}")),
                        want.map_or_else(
                            || format!("{} version {} (not on the target)", r.subject, r.version),
                            |(s, v)| format!("{s} version {v}")
                        ),
                    ));
                }
            }
        }
    }
    for (subject, s) in &source.subjects {
        let to = rename(subject);
        let verdict = match problems.get(subject) {
            Some(p) => (Status::Failed, p.join("; ")),
            None => {
                let ids: Vec<String> = s
                    .versions
                    .iter()
                    .filter_map(|v| {
                        let (_, tid) = found.get(&(subject.clone(), v.version))?;
                        Some(format!("{}->{tid}", v.id.0))
                    })
                    .collect();
                let shown = ids.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
                let more = if ids.len() > 5 { ", ..." } else { "" };
                (
                    Status::Ok,
                    format!("{} version(s) as {to}, ids {shown}{more}", s.versions.len()),
                )
            }
        };
        out.verdicts.push(("subject", subject.clone(), verdict));
        // The levels that apply: the subject's own, else the registry's (a registry may answer
        // every subject with the global mode, or none of its own).
        let t = target.subjects.get(&to);
        if let (Some(t), false) = (t, s.referenced_only) {
            let source_mode = compared_mode(s.mode.or(source.mode));
            out.verdicts.push((
                "settings",
                subject.clone(),
                settings(
                    (s.compatibility.or(source.compatibility), source_mode),
                    (
                        t.compatibility.or(target.compatibility),
                        t.mode.or(target.mode),
                    ),
                    source_mode.is_some(),
                ),
            ));
        }
    }
    if !source.subjects.is_empty() {
        out.verdicts.push((
            "settings",
            "(registry)".into(),
            settings(
                (source.compatibility, compared_mode(source.mode)),
                (target.compatibility, compared_mode(target.mode)),
                compared_mode(source.mode).is_some(),
            ),
        ));
    }
    for (subject, s) in &source.subjects {
        for v in &s.versions {
            if let Some((_, tid)) = found.get(&(subject.clone(), v.version)) {
                out.ids.insert(v.id.0, *tid);
            }
        }
    }
    out
}

type Levels = (Option<Compatibility>, Option<Mode>);

/// The settings verdict: compatibility always compared, the mode only when the source's is one
/// kmirror copies.
fn settings(source: Levels, target: Levels, mode_compared: bool) -> (Status, String) {
    let mut diffs = Vec::new();
    if source.0 != target.0 {
        diffs.push(format!(
            "compatibility {} on the source, {} on the target",
            level(&source.0),
            level(&target.0)
        ));
    }
    if mode_compared && source.1 != target.1 {
        diffs.push(format!(
            "mode {} on the source, {} on the target",
            level(&source.1),
            level(&target.1)
        ));
    }
    if diffs.is_empty() {
        (
            Status::Ok,
            format!(
                "compatibility {}, mode {}",
                level(&source.0),
                level(&source.1)
            ),
        )
    } else {
        (Status::Failed, diffs.join("; "))
    }
}

/// A record's key or value equal on both sides, or equal but for a schema id the source's
/// version of which was found on the target under the target's id (`ids`).
pub fn same_payload(source: &[u8], target: &[u8], ids: &BTreeMap<i32, i32>) -> bool {
    if source == target {
        return true;
    }
    match (
        kmirror_registry::wire::schema_id(source),
        kmirror_registry::wire::schema_id(target),
    ) {
        (Some(SchemaId(s)), Some(SchemaId(t))) => {
            ids.get(&s) == Some(&t) && source.get(5..) == target.get(5..)
        }
        _ => false,
    }
}

/// Reads `subjects` of one registry (those it does not have are left out), with their live and
/// soft-deleted versions and own levels, then each version their live versions refer to (of
/// another subject: marked `referenced_only`), and the registry's global levels.
pub async fn read(
    registry: &RegistryClient,
    subjects: Vec<String>,
) -> Result<RegistryState, RegistryError> {
    let mut state = RegistryState {
        compatibility: registry.compatibility(None).await?,
        mode: registry.mode(None).await?,
        ..RegistryState::default()
    };
    let not_found = |r: Result<Vec<i32>, RegistryError>| match r {
        Err(e) if e.is_not_found() => Ok(Vec::new()),
        other => other,
    };
    let mut wanted: Vec<(String, i32)> = Vec::new();
    for subject in subjects.into_iter().collect::<BTreeSet<_>>() {
        let all = not_found(registry.versions(&subject, true).await)?;
        if all.is_empty() {
            continue;
        }
        let live = not_found(registry.versions(&subject, false).await)?;
        let mut s = SubjectState {
            compatibility: registry.compatibility(Some(&subject)).await?,
            mode: registry.mode(Some(&subject)).await?,
            ..SubjectState::default()
        };
        for v in all {
            // Deleted between the listing and now: as if never listed.
            let r = match registry.version(&subject, v, true).await {
                Ok(r) => r,
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e),
            };
            if live.contains(&v) {
                wanted.extend(
                    r.schema
                        .references
                        .iter()
                        .map(|x| (x.subject.clone(), x.version)),
                );
                s.versions.push(r);
            } else {
                s.deleted.push(r);
            }
        }
        state.subjects.insert(subject, s);
    }
    while let Some((subject, version)) = wanted.pop() {
        let held = state.subjects.get(&subject).is_some_and(|s| {
            s.versions
                .iter()
                .chain(&s.deleted)
                .any(|r| r.version == version)
        });
        if held {
            continue;
        }
        // Missing: the referring version's check names it.
        let r = match registry.version(&subject, version, true).await {
            Ok(r) => r,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        wanted.extend(
            r.schema
                .references
                .iter()
                .map(|x| (x.subject.clone(), x.version)),
        );
        let s = state
            .subjects
            .entry(subject)
            .or_insert_with(|| SubjectState {
                referenced_only: true,
                ..SubjectState::default()
            });
        s.versions.push(r);
        s.versions.sort_by_key(|r| r.version);
    }
    Ok(state)
}

/// The schema ids the keys and values of `records` carry in the wire format.
pub fn ids_named(records: &[kmirror_kafka::records::Record]) -> BTreeSet<i32> {
    records
        .iter()
        .flat_map(|r| [r.key.as_deref(), r.value.as_deref()])
        .flatten()
        .filter_map(|p| kmirror_registry::wire::schema_id(p).map(|id| id.0))
        .collect()
}

/// Source ids named by records `deep` compares that the subject checks did not map (a subject
/// outside the selection that kmirror synced for its ids, such as one of RecordNameStrategy):
/// each is looked up on the target under its subjects' target names, references renamed.
pub async fn map_more(
    ids: &mut BTreeMap<i32, i32>,
    wanted: BTreeSet<i32>,
    source: &RegistryClient,
    target: &RegistryClient,
    rename: &dyn Fn(&str) -> String,
) {
    for id in wanted {
        if ids.contains_key(&id) {
            continue;
        }
        let (Ok(mut schema), Ok(subjects)) = (
            source.schema(SchemaId(id)).await,
            source.subjects_of(SchemaId(id)).await,
        ) else {
            continue;
        };
        for r in &mut schema.references {
            r.subject = rename(&r.subject);
        }
        for (subject, _) in subjects {
            if let Ok(Some(found)) = target.lookup(&rename(&subject), &schema, true).await {
                ids.insert(id, found.id.0);
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests;
