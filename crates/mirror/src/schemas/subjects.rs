//! One pass of subject sync (docs/schemas.md, "Subject sync"): every version of every selected
//! source subject, soft-deleted ones too, is registered on the target in [`order`] order, under
//! the target's name for the subject, with its references renamed the same way and pointing at
//! the target's versions. A version the target holds already (looked up by content) is not
//! registered again, so a pass after a restart registers nothing.
//!
//! - While a subject's history replays its compatibility is NONE on the target (a history that
//!   a later level would refuse was accepted when it was written); then the source's own level
//!   of the subject is applied.
//! - Last, the source's global level and mode and each subject's own mode are set on the target,
//!   so a READONLY mode does not lock the pass out; a read-only target subject is opened for a
//!   new version and closed again.
//! - A version soft-deleted on the source is registered and then soft-deleted on the target:
//!   the target shows what the source shows, and old records that name it still translate.
//! - The result maps every source id to its target id, for the records that carry them.
//!
//! [`order`]: super::order

use super::order::{registration_order, OrderError, VersionKey};
use kmirror_registry::{
    Compatibility, Mode, Registered, RegistryClient, RegistryError, Schema, SchemaId,
};
use std::collections::{BTreeMap, BTreeSet};

/// What subject sync needs of a registry: the seam between this pass and the network.
#[allow(async_fn_in_trait)] // implemented in kmirror only; callers use concrete types
pub trait Registry {
    async fn subjects(&self, deleted: bool) -> Result<Vec<String>, RegistryError>;
    async fn versions(&self, subject: &str, deleted: bool) -> Result<Vec<i32>, RegistryError>;
    async fn version(&self, subject: &str, version: i32) -> Result<Registered, RegistryError>;
    async fn register(&self, subject: &str, schema: &Schema) -> Result<SchemaId, RegistryError>;
    /// Registers under the given id and version (the subject in IMPORT mode).
    async fn register_as(
        &self,
        subject: &str,
        schema: &Schema,
        id: SchemaId,
        version: i32,
    ) -> Result<SchemaId, RegistryError>;
    async fn set_import(&self, subject: &str) -> Result<(), RegistryError>;
    async fn delete_mode(&self, subject: &str) -> Result<(), RegistryError>;
    /// The registry's mode (`subject` None), or a subject's own (None when it has none).
    async fn mode(&self, subject: Option<&str>) -> Result<Option<Mode>, RegistryError>;
    async fn set_mode(&self, subject: Option<&str>, mode: Mode) -> Result<(), RegistryError>;
    /// The registry's global compatibility level.
    async fn global_compatibility(&self) -> Result<Option<Compatibility>, RegistryError>;
    async fn set_global_compatibility(&self, level: Compatibility) -> Result<(), RegistryError>;
    async fn lookup(
        &self,
        subject: &str,
        schema: &Schema,
    ) -> Result<Option<Registered>, RegistryError>;
    async fn compatibility(&self, subject: &str) -> Result<Option<Compatibility>, RegistryError>;
    async fn set_compatibility(
        &self,
        subject: &str,
        level: Compatibility,
    ) -> Result<(), RegistryError>;
    async fn delete_compatibility(&self, subject: &str) -> Result<(), RegistryError>;
    async fn delete_version(&self, subject: &str, version: i32) -> Result<(), RegistryError>;
    async fn subjects_of(&self, id: SchemaId) -> Result<Vec<(String, i32)>, RegistryError>;
}

impl Registry for RegistryClient {
    async fn subjects(&self, deleted: bool) -> Result<Vec<String>, RegistryError> {
        RegistryClient::subjects(self, deleted).await
    }
    async fn versions(&self, subject: &str, deleted: bool) -> Result<Vec<i32>, RegistryError> {
        RegistryClient::versions(self, subject, deleted).await
    }
    async fn version(&self, subject: &str, version: i32) -> Result<Registered, RegistryError> {
        RegistryClient::version(self, subject, version, true).await
    }
    async fn register(&self, subject: &str, schema: &Schema) -> Result<SchemaId, RegistryError> {
        RegistryClient::register(self, subject, schema, None).await
    }
    async fn register_as(
        &self,
        subject: &str,
        schema: &Schema,
        id: SchemaId,
        version: i32,
    ) -> Result<SchemaId, RegistryError> {
        RegistryClient::register(self, subject, schema, Some((id, version))).await
    }
    async fn set_import(&self, subject: &str) -> Result<(), RegistryError> {
        RegistryClient::set_mode(self, Some(subject), Mode::Import).await
    }
    async fn delete_mode(&self, subject: &str) -> Result<(), RegistryError> {
        match RegistryClient::delete_mode(self, subject).await {
            Err(e) if !e.is_not_found() => Err(e),
            _ => Ok(()),
        }
    }
    async fn mode(&self, subject: Option<&str>) -> Result<Option<Mode>, RegistryError> {
        RegistryClient::mode(self, subject).await
    }
    async fn set_mode(&self, subject: Option<&str>, mode: Mode) -> Result<(), RegistryError> {
        RegistryClient::set_mode(self, subject, mode).await
    }
    async fn global_compatibility(&self) -> Result<Option<Compatibility>, RegistryError> {
        RegistryClient::compatibility(self, None).await
    }
    async fn set_global_compatibility(&self, level: Compatibility) -> Result<(), RegistryError> {
        RegistryClient::set_compatibility(self, None, level).await
    }
    async fn lookup(
        &self,
        subject: &str,
        schema: &Schema,
    ) -> Result<Option<Registered>, RegistryError> {
        RegistryClient::lookup(self, subject, schema, true).await
    }
    async fn compatibility(&self, subject: &str) -> Result<Option<Compatibility>, RegistryError> {
        RegistryClient::compatibility(self, Some(subject)).await
    }
    async fn set_compatibility(
        &self,
        subject: &str,
        level: Compatibility,
    ) -> Result<(), RegistryError> {
        RegistryClient::set_compatibility(self, Some(subject), level).await
    }
    async fn delete_compatibility(&self, subject: &str) -> Result<(), RegistryError> {
        RegistryClient::delete_compatibility(self, subject).await
    }
    async fn delete_version(&self, subject: &str, version: i32) -> Result<(), RegistryError> {
        RegistryClient::delete_version(self, subject, version, false).await
    }
    async fn subjects_of(&self, id: SchemaId) -> Result<Vec<(String, i32)>, RegistryError> {
        RegistryClient::subjects_of(self, id).await
    }
}

/// Which subjects a pass copies, and their names on the target.
pub struct Selection<'a> {
    pub subjects: &'a (dyn Fn(&str) -> bool + Sync),
    /// `kmirror.schemas.ids = keep`: register under the source's ids and versions.
    pub keep_ids: bool,
    /// The target's name of a source subject (the flow's replication policy for subjects
    /// derived from topic names).
    pub rename: &'a (dyn Fn(&str) -> String + Sync),
}

impl std::fmt::Debug for Selection<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Selection").finish_non_exhaustive()
    }
}

/// What passes remember. A subject's version never changes once registered (only whether it
/// is soft-deleted), so each is read from the source and looked up on the target once; later
/// passes list versions and handle the new ones. Forgotten on the target side when the target
/// registry lost its schemas (an in-memory registry restarted).
#[derive(Debug, Default, Clone)]
pub struct Known {
    source: BTreeMap<VersionKey, Registered>,
    target: BTreeMap<VersionKey, OnTarget>,
}

#[derive(Debug, Clone, Copy)]
struct OnTarget {
    version: i32,
    id: SchemaId,
    deleted: bool,
}

impl Known {
    /// Every source id synced so far, to its target id.
    pub fn ids(&self) -> BTreeMap<SchemaId, SchemaId> {
        self.target
            .iter()
            .filter_map(|(k, t)| Some((self.source.get(k)?.id, t.id)))
            .collect()
    }

    /// The target lost what was registered: the next pass looks every version up again.
    pub fn forget_target(&mut self) {
        self.target.clear();
    }
}

/// What a pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Synced {
    /// Versions registered on the target by this pass.
    pub registered: u64,
    /// Versions the target held already.
    pub present: u64,
    /// Versions soft-deleted on the target as they are on the source.
    pub soft_deleted: u64,
    /// Every source id seen, to its target id.
    pub ids: BTreeMap<SchemaId, SchemaId>,
}

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("source {0}")]
    Source(RegistryError),
    #[error("target {0}")]
    Target(RegistryError),
    #[error(transparent)]
    Order(#[from] OrderError),
    #[error("target schema registry: {subject} has no version of a schema it has just registered")]
    Vanished { subject: String },
    #[error("target schema registry does not keep the ids it is given: {subject} got id {got} for the source's {asked} in IMPORT mode: set kmirror.schemas.ids = translate")]
    IdNotKept {
        subject: String,
        asked: SchemaId,
        got: SchemaId,
    },
}

/// A source version, and whether the source shows it as soft-deleted.
struct SourceVersion {
    registered: Registered,
    deleted: bool,
}

/// One pass: reads the selected subjects of `source` and brings `target` up to them; `known`
/// carries what earlier passes did.
pub async fn sync_subjects<S: Registry, T: Registry>(
    source: &S,
    target: &T,
    selection: &Selection<'_>,
    known: &mut Known,
) -> Result<Synced, SyncError> {
    let mut subjects = source.subjects(true).await.map_err(SyncError::Source)?;
    subjects.retain(|s| (selection.subjects)(s));
    sync_listed(source, target, subjects, selection, known).await
}

/// A pass over `subjects` (selected already).
async fn sync_listed<S: Registry, T: Registry>(
    source: &S,
    target: &T,
    subjects: Vec<String>,
    selection: &Selection<'_>,
    known: &mut Known,
) -> Result<Synced, SyncError> {
    let fetched = read_source(source, subjects, known)
        .await
        .map_err(SyncError::Source)?;
    let graph: BTreeMap<VersionKey, Vec<VersionKey>> = fetched
        .iter()
        .map(|(k, v)| {
            let refs = v.registered.schema.references.iter();
            (
                k.clone(),
                refs.map(|r| (r.subject.clone(), r.version)).collect(),
            )
        })
        .collect();
    let order = registration_order(&graph)?;
    let mut done = Synced::default();
    // The target's version of each source version registered or found.
    let mut on_target: BTreeMap<VersionKey, i32> = BTreeMap::new();
    // Target subjects whose compatibility this pass relaxed: their source subject, and the
    // target's own level before.
    let mut relaxed: BTreeMap<String, (String, Option<Compatibility>)> = BTreeMap::new();
    // Target subjects put in IMPORT mode by this pass (keep).
    let mut imported: BTreeSet<String> = BTreeSet::new();
    // Read-only target subjects opened for this pass, with their own mode before.
    let mut unlocked: BTreeMap<String, Option<Mode>> = BTreeMap::new();
    let replayed: Result<(), SyncError> = async {
        for key in order {
            let v = &fetched[&key];
            let to = (selection.rename)(&key.0);
            if let Some(t) = known.target.get_mut(&key) {
                if v.deleted && !t.deleted {
                    target
                        .delete_version(&to, t.version)
                        .await
                        .map_err(SyncError::Target)?;
                    t.deleted = true;
                    done.soft_deleted += 1;
                }
                done.ids.insert(v.registered.id, t.id);
                done.present += 1;
                on_target.insert(key, t.version);
                continue;
            }
            let schema = for_target(&v.registered.schema, selection, &on_target);
            let (target_version, target_id) = match target
                .lookup(&to, &schema)
                .await
                .map_err(SyncError::Target)?
            {
                Some(found) => {
                    done.ids.insert(v.registered.id, found.id);
                    done.present += 1;
                    // Soft-deleted on the source while nothing watched (before a restart): the
                    // target's version follows.
                    if v.deleted {
                        let live = match target.versions(&to, false).await {
                            Ok(live) => live,
                            Err(e) if e.is_not_found() => Vec::new(),
                            Err(e) => return Err(SyncError::Target(e)),
                        };
                        if live.contains(&found.version) {
                            target
                                .delete_version(&to, found.version)
                                .await
                                .map_err(SyncError::Target)?;
                            done.soft_deleted += 1;
                        }
                    }
                    (found.version, found.id)
                }
                None => {
                    if !relaxed.contains_key(&to) {
                        // A read-only subject (the source's READONLY copied by an earlier pass)
                        // takes the new version and is read-only again afterwards.
                        let own = target.mode(Some(&to)).await.map_err(SyncError::Target)?;
                        let effective = match own {
                            Some(m) => Some(m),
                            None => target.mode(None).await.map_err(SyncError::Target)?,
                        };
                        if effective == Some(Mode::ReadOnly) {
                            target
                                .set_mode(Some(&to), Mode::ReadWrite)
                                .await
                                .map_err(SyncError::Target)?;
                            unlocked.insert(to.clone(), own);
                        }
                        let before = target.compatibility(&to).await.map_err(SyncError::Target)?;
                        target
                            .set_compatibility(&to, Compatibility::None)
                            .await
                            .map_err(SyncError::Target)?;
                        relaxed.insert(to.clone(), (key.0.clone(), before));
                    }
                    let id = if selection.keep_ids {
                        // IMPORT mode takes the source's id and version (docs/schemas.md,
                        // "Keeping ids"); the subject's own mode is removed after the pass.
                        if imported.insert(to.clone()) {
                            target.set_import(&to).await.map_err(SyncError::Target)?;
                        }
                        let asked = v.registered.id;
                        let got = target
                            .register_as(&to, &schema, asked, key.1)
                            .await
                            .map_err(SyncError::Target)?;
                        if got != asked {
                            return Err(SyncError::IdNotKept {
                                subject: to.clone(),
                                asked,
                                got,
                            });
                        }
                        got
                    } else {
                        target
                            .register(&to, &schema)
                            .await
                            .map_err(SyncError::Target)?
                    };
                    let found = target
                        .lookup(&to, &schema)
                        .await
                        .map_err(SyncError::Target)?
                        .ok_or_else(|| SyncError::Vanished {
                            subject: to.clone(),
                        })?;
                    done.ids.insert(v.registered.id, id);
                    done.registered += 1;
                    if v.deleted {
                        target
                            .delete_version(&to, found.version)
                            .await
                            .map_err(SyncError::Target)?;
                        done.soft_deleted += 1;
                    }
                    (found.version, id)
                }
            };
            known.target.insert(
                key.clone(),
                OnTarget {
                    version: target_version,
                    id: target_id,
                    deleted: v.deleted,
                },
            );
            on_target.insert(key, target_version);
        }
        Ok(())
    }
    .await;
    // Levels and modes are put back whether or not the replay got through.
    let restored = restore(source, target, relaxed, imported, unlocked).await;
    replayed?;
    restored?;
    // Last, so a READONLY mode does not lock this pass out.
    let subjects: BTreeSet<&String> = fetched.keys().map(|(s, _)| s).collect();
    copy_settings(source, target, selection, subjects).await?;
    Ok(done)
}

/// Whether a source mode is copied: not IMPORT (kmirror's own tool while it registers), nor
/// READONLY_OVERRIDE, which would also override the subject mode kmirror opens a read-only
/// subject with, and so lock every later pass out.
fn copied_mode(mode: Mode) -> bool {
    matches!(mode, Mode::ReadWrite | Mode::ReadOnly)
}

/// The source's global compatibility level and mode, and each copied subject's own mode, on
/// the target (see [`copied_mode`]).
async fn copy_settings<S: Registry, T: Registry>(
    source: &S,
    target: &T,
    selection: &Selection<'_>,
    subjects: BTreeSet<&String>,
) -> Result<(), SyncError> {
    let level = source
        .global_compatibility()
        .await
        .map_err(SyncError::Source)?;
    if let Some(level) = level {
        if target
            .global_compatibility()
            .await
            .map_err(SyncError::Target)?
            != Some(level)
        {
            target
                .set_global_compatibility(level)
                .await
                .map_err(SyncError::Target)?;
        }
    }
    let global = source.mode(None).await.map_err(SyncError::Source)?;
    for subject in subjects {
        let Some(mode) = source
            .mode(Some(subject))
            .await
            .map_err(SyncError::Source)?
        else {
            continue;
        };
        // A registry that answers every subject with the global mode has none of its own.
        if Some(mode) == global || !copied_mode(mode) {
            continue;
        }
        let to = (selection.rename)(subject);
        if target.mode(Some(&to)).await.map_err(SyncError::Target)? != Some(mode) {
            target
                .set_mode(Some(&to), mode)
                .await
                .map_err(SyncError::Target)?;
        }
    }
    if let Some(mode) = global.filter(|m| copied_mode(*m)) {
        if target.mode(None).await.map_err(SyncError::Target)? != Some(mode) {
            target
                .set_mode(None, mode)
                .await
                .map_err(SyncError::Target)?;
        }
    }
    Ok(())
}

/// Puts back what a pass changed on the target: each relaxed subject gets the source subject's
/// own level, or the target's as it was (none: the subject follows the target registry's
/// global level again); each subject put in IMPORT mode loses its own mode.
async fn restore<S: Registry, T: Registry>(
    source: &S,
    target: &T,
    relaxed: BTreeMap<String, (String, Option<Compatibility>)>,
    imported: BTreeSet<String>,
    unlocked: BTreeMap<String, Option<Mode>>,
) -> Result<(), SyncError> {
    let mut first = None;
    for (to, (from, before)) in relaxed {
        let level = match source.compatibility(&from).await {
            Ok(l) => l,
            Err(e) => {
                first.get_or_insert(SyncError::Source(e));
                continue;
            }
        };
        let set = match level.or(before) {
            Some(level) => target.set_compatibility(&to, level).await,
            None => target.delete_compatibility(&to).await,
        };
        if let Err(e) = set {
            first.get_or_insert(SyncError::Target(e));
        }
    }
    for to in imported {
        if let Err(e) = target.delete_mode(&to).await {
            first.get_or_insert(SyncError::Target(e));
        }
    }
    for (to, before) in unlocked {
        let put_back = match before {
            Some(mode) => target.set_mode(Some(&to), mode).await,
            None => target.delete_mode(&to).await,
        };
        if let Err(e) = put_back {
            first.get_or_insert(SyncError::Target(e));
        }
    }
    first.map_or(Ok(()), Err)
}

/// Ids that records name and the map lacks (a subject outside the selection, or registered
/// since the last pass): the subjects that hold them are synced, with the flow's names. Ids the
/// source registry does not know are returned apart: their payloads only look like the wire
/// format.
pub async fn sync_ids<S: Registry, T: Registry>(
    source: &S,
    target: &T,
    ids: &BTreeSet<SchemaId>,
    rename: &(dyn Fn(&str) -> String + Sync),
    keep_ids: bool,
    known: &mut Known,
) -> Result<(Synced, BTreeSet<SchemaId>), SyncError> {
    let mut subjects = BTreeSet::new();
    let mut unknown = BTreeSet::new();
    for id in ids {
        match source.subjects_of(*id).await {
            Ok(found) => subjects.extend(found.into_iter().map(|(s, _)| s)),
            Err(e) if e.is_not_found() => {
                unknown.insert(*id);
            }
            Err(e) => return Err(SyncError::Source(e)),
        }
    }
    let selection = Selection {
        subjects: &|s| subjects.contains(s),
        keep_ids,
        rename,
    };
    // The subjects the source named, not filtered through its listing (Apicurio lists at most
    // 1,000).
    let listed: Vec<String> = subjects.iter().cloned().collect();
    let done = sync_listed(source, target, listed, &selection, known).await?;
    Ok((done, unknown))
}

/// Every version of the selected subjects, soft-deleted ones too, and every version they refer
/// to, transitively (a referenced subject is copied whether or not it is selected).
async fn read_source<S: Registry>(
    source: &S,
    mut subjects: Vec<String>,
    known: &mut Known,
) -> Result<BTreeMap<VersionKey, SourceVersion>, RegistryError> {
    let mut fetched = BTreeMap::new();
    subjects.sort();
    subjects.dedup();
    for s in subjects {
        let live: BTreeSet<i32> = match source.versions(&s, false).await {
            Ok(v) => v.into_iter().collect(),
            // Every version soft-deleted: the subject is listed only with deleted ones.
            Err(e) if e.is_not_found() => BTreeSet::new(),
            Err(e) => return Err(e),
        };
        for v in source.versions(&s, true).await? {
            let key = (s.clone(), v);
            let registered = match known.source.get(&key) {
                Some(r) => r.clone(),
                None => {
                    let r = source.version(&s, v).await?;
                    known.source.insert(key, r.clone());
                    r
                }
            };
            let deleted = !live.contains(&v);
            fetched.insert(
                (s.clone(), v),
                SourceVersion {
                    registered,
                    deleted,
                },
            );
        }
    }
    let mut wanted: Vec<VersionKey> = references(&fetched);
    while let Some(key) = wanted.pop() {
        if fetched.contains_key(&key) {
            continue;
        }
        let registered = match known.source.get(&key) {
            Some(r) => r.clone(),
            None => {
                let r = source.version(&key.0, key.1).await?;
                known.source.insert(key.clone(), r.clone());
                r
            }
        };
        let v = SourceVersion {
            registered,
            deleted: false,
        };
        wanted.extend(
            v.registered
                .schema
                .references
                .iter()
                .map(|r| (r.subject.clone(), r.version)),
        );
        fetched.insert(key, v);
    }
    Ok(fetched)
}

fn references(fetched: &BTreeMap<VersionKey, SourceVersion>) -> Vec<VersionKey> {
    fetched
        .values()
        .flat_map(|v| v.registered.schema.references.iter())
        .map(|r| (r.subject.clone(), r.version))
        .filter(|k| !fetched.contains_key(k))
        .collect()
}

/// A source schema as the target registers it: references renamed, at the target's versions.
fn for_target(
    schema: &Schema,
    selection: &Selection<'_>,
    on_target: &BTreeMap<VersionKey, i32>,
) -> Schema {
    let mut out = schema.clone();
    for r in &mut out.references {
        // Registered before this one (the order guarantees it).
        if let Some(v) = on_target.get(&(r.subject.clone(), r.version)) {
            r.version = *v;
        }
        r.subject = (selection.rename)(&r.subject);
    }
    out
}

#[cfg(test)]
mod tests;
