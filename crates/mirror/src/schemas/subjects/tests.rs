//! Subject sync against an in-memory registry that behaves as the real ones do where the pass
//! depends on it: ids by content (the same schema has one id in every subject), versions
//! numbered in order, references checked at registration, soft deletes.

use super::*;
use kmirror_registry::{Reference, SchemaType};
use std::sync::Mutex;

#[derive(Default)]
struct Fake {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    next_id: i32,
    subjects: BTreeMap<String, Vec<Entry>>,
    levels: BTreeMap<String, Compatibility>,
    /// Writes, in order.
    calls: Vec<String>,
    refuse_registrations: bool,
    /// Versions read and looked up.
    reads: usize,
    /// Subjects' own modes, and the registry's.
    modes: BTreeMap<String, Mode>,
    global_mode: Option<Mode>,
    global_level: Option<Compatibility>,
    /// Takes IMPORT mode and still assigns its own ids (as Apicurio does).
    assigns_own_ids: bool,
    /// Lists at most this many subjects.
    max_listed: Option<usize>,
}

#[derive(Clone)]
struct Entry {
    version: i32,
    id: SchemaId,
    schema: Schema,
    deleted: bool,
}

fn refused(status: u16, code: i64, message: String) -> RegistryError {
    RegistryError::Refused {
        url: "fake".into(),
        what: "call".into(),
        status,
        code: Some(code),
        message,
    }
}

impl Fake {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    /// Registers directly (set-up), returning the id.
    fn seed(&self, subject: &str, schema: &Schema) -> SchemaId {
        let mut s = self.state();
        add(&mut s, subject, schema)
    }

    fn entries(&self, subject: &str) -> Vec<Entry> {
        self.state()
            .subjects
            .get(subject)
            .cloned()
            .unwrap_or_default()
    }
}

fn add(s: &mut State, subject: &str, schema: &Schema) -> SchemaId {
    let existing = s
        .subjects
        .values()
        .flatten()
        .find(|e| e.schema == *schema)
        .map(|e| e.id);
    let id = existing.unwrap_or_else(|| {
        s.next_id += 1;
        SchemaId(s.next_id)
    });
    let versions = s.subjects.entry(subject.to_string()).or_default();
    if let Some(e) = versions.iter().find(|e| e.schema == *schema) {
        return e.id;
    }
    let version = versions.len() as i32 + 1;
    versions.push(Entry {
        version,
        id,
        schema: schema.clone(),
        deleted: false,
    });
    id
}

impl Registry for Fake {
    async fn subjects(&self, deleted: bool) -> Result<Vec<String>, RegistryError> {
        let s = self.state();
        let listed = s
            .subjects
            .iter()
            .filter(|(_, v)| v.iter().any(|e| deleted || !e.deleted));
        // As Apicurio caps its listing (apicurio.ccompat.max-subjects).
        let cap = s.max_listed.unwrap_or(usize::MAX);
        Ok(listed.map(|(k, _)| k.clone()).take(cap).collect())
    }
    async fn versions(&self, subject: &str, deleted: bool) -> Result<Vec<i32>, RegistryError> {
        let s = self.state();
        let v: Vec<i32> = s
            .subjects
            .get(subject)
            .into_iter()
            .flatten()
            .filter(|e| deleted || !e.deleted)
            .map(|e| e.version)
            .collect();
        if v.is_empty() {
            return Err(refused(
                404,
                40401,
                format!("Subject '{subject}' not found."),
            ));
        }
        Ok(v)
    }
    async fn version(&self, subject: &str, version: i32) -> Result<Registered, RegistryError> {
        let mut s = self.state();
        s.reads += 1;
        let e = s
            .subjects
            .get(subject)
            .and_then(|v| v.iter().find(|e| e.version == version))
            .ok_or_else(|| refused(404, 40402, "Version not found.".into()))?;
        Ok(Registered {
            subject: subject.into(),
            version,
            id: e.id,
            schema: e.schema.clone(),
        })
    }
    async fn register(&self, subject: &str, schema: &Schema) -> Result<SchemaId, RegistryError> {
        let mut s = self.state();
        if s.refuse_registrations {
            return Err(refused(403, 40301, "not allowed".into()));
        }
        let mode = s.modes.get(subject).copied().or(s.global_mode);
        if mode == Some(Mode::ReadOnly) {
            return Err(refused(
                422,
                42205,
                format!("Subject {subject} is in read-only mode"),
            ));
        }
        for r in &schema.references {
            let known = s
                .subjects
                .get(&r.subject)
                .is_some_and(|v| v.iter().any(|e| e.version == r.version));
            if !known {
                return Err(refused(
                    422,
                    42201,
                    format!("unknown reference {}", r.subject),
                ));
            }
        }
        s.calls.push(format!("register {subject}"));
        Ok(add(&mut s, subject, schema))
    }
    async fn lookup(
        &self,
        subject: &str,
        schema: &Schema,
    ) -> Result<Option<Registered>, RegistryError> {
        let mut s = self.state();
        s.reads += 1;
        let found = s
            .subjects
            .get(subject)
            .and_then(|v| v.iter().find(|e| e.schema == *schema));
        Ok(found.map(|e| Registered {
            subject: subject.into(),
            version: e.version,
            id: e.id,
            schema: e.schema.clone(),
        }))
    }
    async fn compatibility(&self, subject: &str) -> Result<Option<Compatibility>, RegistryError> {
        Ok(self.state().levels.get(subject).copied())
    }
    async fn set_compatibility(
        &self,
        subject: &str,
        level: Compatibility,
    ) -> Result<(), RegistryError> {
        let mut s = self.state();
        s.calls.push(format!("level {subject} {level:?}"));
        s.levels.insert(subject.into(), level);
        Ok(())
    }
    async fn delete_compatibility(&self, subject: &str) -> Result<(), RegistryError> {
        let mut s = self.state();
        s.calls.push(format!("level {subject} removed"));
        s.levels.remove(subject);
        Ok(())
    }
    async fn subjects_of(&self, id: SchemaId) -> Result<Vec<(String, i32)>, RegistryError> {
        let s = self.state();
        let found: Vec<(String, i32)> = s
            .subjects
            .iter()
            .flat_map(|(name, v)| {
                v.iter()
                    .filter(|e| e.id == id)
                    .map(|e| (name.clone(), e.version))
            })
            .collect();
        if found.is_empty() {
            return Err(refused(404, 40403, format!("Schema {id} not found")));
        }
        Ok(found)
    }
    async fn register_as(
        &self,
        subject: &str,
        schema: &Schema,
        id: SchemaId,
        version: i32,
    ) -> Result<SchemaId, RegistryError> {
        let mut s = self.state();
        s.calls
            .push(format!("register {subject} as {id}/{version}"));
        if s.modes.get(subject) != Some(&Mode::Import) {
            return Err(refused(
                422,
                42205,
                format!("Subject {subject} is not in import mode"),
            ));
        }
        if s.assigns_own_ids {
            return Ok(add(&mut s, subject, schema));
        }
        let versions = s.subjects.entry(subject.to_string()).or_default();
        versions.push(Entry {
            version,
            id,
            schema: schema.clone(),
            deleted: false,
        });
        Ok(id)
    }
    async fn set_import(&self, subject: &str) -> Result<(), RegistryError> {
        let mut s = self.state();
        s.calls.push(format!("import {subject}"));
        s.modes.insert(subject.into(), Mode::Import);
        Ok(())
    }
    async fn delete_mode(&self, subject: &str) -> Result<(), RegistryError> {
        let mut s = self.state();
        s.calls.push(format!("mode {subject} removed"));
        s.modes.remove(subject);
        Ok(())
    }
    async fn mode(&self, subject: Option<&str>) -> Result<Option<Mode>, RegistryError> {
        let s = self.state();
        Ok(match subject {
            Some(subject) => s.modes.get(subject).copied(),
            None => s.global_mode,
        })
    }
    async fn set_mode(&self, subject: Option<&str>, mode: Mode) -> Result<(), RegistryError> {
        let mut s = self.state();
        s.calls
            .push(format!("mode {} {mode:?}", subject.unwrap_or("(global)")));
        match subject {
            Some(subject) => {
                s.modes.insert(subject.into(), mode);
            }
            None => s.global_mode = Some(mode),
        }
        Ok(())
    }
    async fn global_compatibility(&self) -> Result<Option<Compatibility>, RegistryError> {
        Ok(self.state().global_level)
    }
    async fn set_global_compatibility(&self, level: Compatibility) -> Result<(), RegistryError> {
        let mut s = self.state();
        s.calls.push(format!("level (global) {level:?}"));
        s.global_level = Some(level);
        Ok(())
    }
    async fn delete_version(&self, subject: &str, version: i32) -> Result<(), RegistryError> {
        let mut s = self.state();
        s.calls.push(format!("delete {subject} {version}"));
        let e = s
            .subjects
            .get_mut(subject)
            .and_then(|v| v.iter_mut().find(|e| e.version == version))
            .ok_or_else(|| refused(404, 40402, "Version not found.".into()))?;
        e.deleted = true;
        Ok(())
    }
}

fn avro(name: &str) -> Schema {
    Schema {
        schema_type: SchemaType::Avro,
        schema: format!(r#"{{"type":"record","name":"{name}","fields":[]}}"#),
        references: vec![],
    }
}

fn referring(name: &str, subject: &str, version: i32) -> Schema {
    Schema {
        references: vec![Reference {
            name: "Common".into(),
            subject: subject.into(),
            version,
        }],
        ..avro(name)
    }
}

fn prefixed(s: &str) -> String {
    if s.ends_with("-value") {
        format!("A.{s}")
    } else {
        s.to_string()
    }
}

#[tokio::test]
async fn a_history_with_references_arrives_in_order_with_ids_mapped_and_a_second_pass_registers_nothing(
) {
    let source = Fake::default();
    let common = source.seed("common", &avro("Common"));
    let o1 = source.seed("orders-value", &avro("Order1"));
    let o2 = source.seed("orders-value", &referring("Order2", "common", 1));
    source.seed("users-value", &avro("User"));
    source
        .state()
        .levels
        .insert("orders-value".into(), Compatibility::Full);
    let target = Fake::default();
    // Unrelated schemas first, so target ids differ from the source's.
    target.seed("unrelated", &avro("X"));
    target.seed("unrelated", &avro("Y"));
    let selection = Selection {
        subjects: &|s| s.starts_with("orders"),
        keep_ids: false,
        rename: &prefixed,
    };

    let done = sync_subjects(&source, &target, &selection, &mut Known::default())
        .await
        .unwrap();
    assert_eq!(
        (done.registered, done.present, done.soft_deleted),
        (3, 0, 0)
    );
    let orders = target.entries("A.orders-value");
    assert_eq!(orders.len(), 2);
    let (t1, t2) = (orders[0].id, orders[1].id);
    let tc = target.entries("common")[0].id;
    assert_eq!(done.ids, BTreeMap::from([(common, tc), (o1, t1), (o2, t2)]));
    assert!(done.ids.iter().all(|(s, t)| s != t), "{:?}", done.ids);
    // The reference names the target's subject and version.
    assert_eq!(orders[1].schema.references[0].subject, "common");
    assert_eq!(orders[1].schema.references[0].version, 1);
    // Not selected, not referred to: not copied.
    assert!(target.entries("A.users-value").is_empty());
    // Order: the referenced subject before the version that refers to it; each subject's level
    // relaxed before its first registration and set after: the source's own, or removed.
    let calls = target.state().calls.clone();
    assert_eq!(
        calls,
        vec![
            "level common None",
            "register common",
            "level A.orders-value None",
            "register A.orders-value",
            "register A.orders-value",
            "level A.orders-value Full",
            "level common removed",
        ]
    );

    // A restart: found, not registered again, the same ids.
    target.state().calls.clear();
    let again = sync_subjects(&source, &target, &selection, &mut Known::default())
        .await
        .unwrap();
    assert_eq!((again.registered, again.present), (0, 3));
    assert_eq!(again.ids, done.ids);
    assert!(
        target.state().calls.is_empty(),
        "{:?}",
        target.state().calls
    );
}

#[tokio::test]
async fn a_soft_deleted_version_is_registered_then_deleted_on_the_target() {
    let source = Fake::default();
    let old = source.seed("t-value", &avro("Old"));
    source.seed("t-value", &avro("New"));
    source.state().subjects.get_mut("t-value").unwrap()[0].deleted = true;
    let target = Fake::default();
    target.seed("t-value", &avro("Elsewhere"));
    let selection = Selection {
        subjects: &|_| true,
        keep_ids: false,
        rename: &|s| s.to_string(),
    };
    let done = sync_subjects(&source, &target, &selection, &mut Known::default())
        .await
        .unwrap();
    assert_eq!((done.registered, done.soft_deleted), (2, 1));
    let on_target = target.entries("t-value");
    let states: Vec<(i32, bool)> = on_target.iter().map(|e| (e.version, e.deleted)).collect();
    // The target's own version stays; the copied history follows, its first version deleted.
    assert_eq!(states, vec![(1, false), (2, true), (3, false)]);
    assert_eq!(done.ids[&old], on_target[1].id);
    // Its own earlier level came back (it had none: removed).
    assert!(target.state().levels.is_empty());
}

#[tokio::test]
async fn a_refusing_target_ends_the_pass_naming_the_side() {
    let source = Fake::default();
    source.seed("t-value", &avro("A"));
    let target = Fake::default();
    target.state().refuse_registrations = true;
    let selection = Selection {
        subjects: &|_| true,
        keep_ids: false,
        rename: &|s| s.to_string(),
    };
    let e = sync_subjects(&source, &target, &selection, &mut Known::default())
        .await
        .unwrap_err();
    assert!(matches!(e, SyncError::Target(_)), "{e}");
    assert!(
        e.to_string().starts_with("target schema registry fake"),
        "{e}"
    );
}

#[tokio::test]
async fn ids_named_by_records_bring_their_subjects_and_unknown_ids_are_told_apart() {
    let source = Fake::default();
    source.seed("selected-value", &avro("S"));
    let outside = source.seed("other-subject", &avro("O"));
    let target = Fake::default();
    target.seed("local", &avro("L"));
    let ids = BTreeSet::from([outside, SchemaId(999)]);
    let (done, unknown) = sync_ids(
        &source,
        &target,
        &ids,
        &prefixed,
        false,
        &mut Known::default(),
    )
    .await
    .unwrap();
    assert_eq!(unknown, BTreeSet::from([SchemaId(999)]));
    assert_eq!(done.registered, 1);
    assert_eq!(done.ids[&outside], target.entries("other-subject")[0].id);
    // Only the subject that holds a named id.
    assert!(target.entries("A.selected-value").is_empty());
}

#[tokio::test]
async fn later_passes_read_and_look_up_only_new_versions_and_follow_new_soft_deletes() {
    let source = Fake::default();
    let first = source.seed("t-value", &avro("V1"));
    let target = Fake::default();
    target.seed("local", &avro("L"));
    let selection = Selection {
        subjects: &|_| true,
        keep_ids: false,
        rename: &|s| s.to_string(),
    };
    let mut known = Known::default();
    sync_subjects(&source, &target, &selection, &mut known)
        .await
        .unwrap();
    let (sr, tr) = (source.state().reads, target.state().reads);
    assert!(sr >= 1 && tr >= 1);

    // Nothing new: listed, not read nor looked up again.
    let idle = sync_subjects(&source, &target, &selection, &mut known)
        .await
        .unwrap();
    assert_eq!((idle.registered, idle.present), (0, 1));
    assert_eq!((source.state().reads, target.state().reads), (sr, tr));

    // A new version: read once, registered; the first soft-deleted since: deleted on the target.
    let second = source.seed("t-value", &avro("V2"));
    source.state().subjects.get_mut("t-value").unwrap()[0].deleted = true;
    let next = sync_subjects(&source, &target, &selection, &mut known)
        .await
        .unwrap();
    assert_eq!((next.registered, next.soft_deleted), (1, 1));
    assert_eq!(source.state().reads, sr + 1);
    let on_target = target.entries("t-value");
    assert_eq!(
        on_target.iter().map(|e| e.deleted).collect::<Vec<_>>(),
        vec![true, false]
    );
    let ids = known.ids();
    assert_eq!(ids.len(), 2);
    assert_eq!(ids[&first], on_target[0].id);
    assert_eq!(ids[&second], on_target[1].id);

    // The target lost its schemas: forgotten, the next pass looks up and registers again.
    known.forget_target();
    *target.state() = State::default();
    let again = sync_subjects(&source, &target, &selection, &mut known)
        .await
        .unwrap();
    assert_eq!(again.registered, 2);
}

#[tokio::test]
async fn keeping_ids_registers_under_the_sources_ids_and_versions_in_import_mode_then_removes_it() {
    let source = Fake::default();
    source.seed("skip", &avro("Skip"));
    let v1 = source.seed("t-value", &avro("V1"));
    let v2 = source.seed("t-value", &avro("V2"));
    let target = Fake::default();
    let selection = Selection {
        subjects: &|s| s == "t-value",
        keep_ids: true,
        rename: &prefixed,
    };
    let done = sync_subjects(&source, &target, &selection, &mut Known::default())
        .await
        .unwrap();
    assert_eq!(done.registered, 2);
    assert_eq!(done.ids, BTreeMap::from([(v1, v1), (v2, v2)]));
    let on_target: Vec<(i32, SchemaId)> = target
        .entries("A.t-value")
        .iter()
        .map(|e| (e.version, e.id))
        .collect();
    assert_eq!(on_target, vec![(1, v1), (2, v2)]);
    assert!(target.state().modes.is_empty(), "IMPORT mode removed");
    let calls = target.state().calls.clone();
    assert_eq!(
        calls,
        vec![
            "level A.t-value None".to_string(),
            "import A.t-value".into(),
            format!("register A.t-value as {v1}/1"),
            format!("register A.t-value as {v2}/2"),
            "level A.t-value removed".into(),
            "mode A.t-value removed".into(),
        ]
    );
}

#[tokio::test]
async fn a_target_that_assigns_its_own_ids_under_keep_stops_the_pass_and_is_put_back() {
    let source = Fake::default();
    source.seed("pad", &avro("Pad"));
    source.seed("t-value", &avro("V1"));
    let target = Fake::default();
    target.state().assigns_own_ids = true;
    let selection = Selection {
        subjects: &|s| s == "t-value",
        keep_ids: true,
        rename: &|s| s.to_string(),
    };
    let e = sync_subjects(&source, &target, &selection, &mut Known::default())
        .await
        .unwrap_err();
    assert!(matches!(e, SyncError::IdNotKept { .. }), "{e}");
    assert!(
        e.to_string().contains("kmirror.schemas.ids = translate"),
        "{e}"
    );
    // Level and mode put back even though the pass failed.
    let s = target.state();
    assert!(s.modes.is_empty() && s.levels.is_empty(), "{:?}", s.calls);
}

#[tokio::test]
async fn global_level_and_modes_follow_the_source_and_read_only_does_not_lock_later_passes_out() {
    let source = Fake::default();
    source.seed("t-value", &avro("V1"));
    source.seed("u-value", &avro("U1"));
    {
        let mut s = source.state();
        s.global_level = Some(Compatibility::Full);
        s.global_mode = Some(Mode::ReadWrite);
        s.modes.insert("t-value".into(), Mode::ReadOnly);
        // As a registry that answers each subject with the global mode shows it.
        s.modes.insert("u-value".into(), Mode::ReadWrite);
    }
    let target = Fake::default();
    let selection = Selection {
        subjects: &|_| true,
        keep_ids: false,
        rename: &|s| s.to_string(),
    };
    let mut known = Known::default();
    sync_subjects(&source, &target, &selection, &mut known)
        .await
        .unwrap();
    {
        let t = target.state();
        assert_eq!(t.global_level, Some(Compatibility::Full));
        assert_eq!(t.global_mode, Some(Mode::ReadWrite));
        assert_eq!(
            t.modes,
            BTreeMap::from([("t-value".to_string(), Mode::ReadOnly)])
        );
        // Read-only only after its history was registered.
        let calls = &t.calls;
        let last_register = calls
            .iter()
            .rposition(|c| c.starts_with("register t-value"));
        let read_only = calls.iter().position(|c| c == "mode t-value ReadOnly");
        assert!(last_register < read_only, "{calls:?}");
    }

    // A new version on the source: the read-only target subject takes it, and is read-only again.
    source.seed("t-value", &avro("V2"));
    target.state().calls.clear();
    let next = sync_subjects(&source, &target, &selection, &mut known)
        .await
        .unwrap();
    assert_eq!(next.registered, 1);
    let t = target.state();
    assert_eq!(
        t.modes.get("t-value"),
        Some(&Mode::ReadOnly),
        "{:?}",
        t.calls
    );
    assert_eq!(
        t.calls
            .iter()
            .filter(|c| c.starts_with("mode t-value"))
            .count(),
        2,
        "{:?}",
        t.calls
    );
    assert_eq!(t.subjects["t-value"].len(), 2);
}

#[tokio::test]
async fn a_version_soft_deleted_while_nothing_watched_is_deleted_on_the_target_after_a_restart() {
    let source = Fake::default();
    source.seed("t-value", &avro("Old"));
    source.seed("t-value", &avro("New"));
    let target = Fake::default();
    let selection = Selection {
        subjects: &|_| true,
        keep_ids: false,
        rename: &|s| s.to_string(),
    };
    sync_subjects(&source, &target, &selection, &mut Known::default())
        .await
        .unwrap();
    assert!(target.entries("t-value").iter().all(|e| !e.deleted));
    // kmirror down; the source soft-deletes version 1; kmirror starts again (nothing known).
    source.state().subjects.get_mut("t-value").unwrap()[0].deleted = true;
    let again = sync_subjects(&source, &target, &selection, &mut Known::default())
        .await
        .unwrap();
    assert_eq!((again.registered, again.soft_deleted), (0, 1));
    let states: Vec<bool> = target
        .entries("t-value")
        .iter()
        .map(|e| e.deleted)
        .collect();
    assert_eq!(states, vec![true, false]);
    // And once deleted, not again.
    let third = sync_subjects(&source, &target, &selection, &mut Known::default())
        .await
        .unwrap();
    assert_eq!(third.soft_deleted, 0);
}

#[tokio::test]
async fn an_id_in_a_subject_the_source_does_not_list_is_still_found() {
    let source = Fake::default();
    source.seed("a-value", &avro("A"));
    let beyond = source.seed("z-value", &avro("Z"));
    source.state().max_listed = Some(1);
    let target = Fake::default();
    let (done, unknown) = sync_ids(
        &source,
        &target,
        &BTreeSet::from([beyond]),
        &|s| s.to_string(),
        false,
        &mut Known::default(),
    )
    .await
    .unwrap();
    assert!(unknown.is_empty());
    assert_eq!(done.ids[&beyond], target.entries("z-value")[0].id);
}
