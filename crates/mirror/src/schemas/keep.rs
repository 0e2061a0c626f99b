//! Whether a target registry keeps the ids it is given (docs/schemas.md, "Keeping ids"):
//! `kmirror.schemas.ids = keep` registers each schema under the source's id, in IMPORT mode, as
//! Confluent's registry allows. Some registries accept IMPORT mode and still assign ids of their
//! own (Apicurio): records would then name schemas the target does not have under those ids. So
//! before any record is written, one schema is registered under a throwaway subject with an id
//! the registry does not use, and the id it answers is compared. The registry is left as it was
//! found: the subject deleted for good, its mode removed.

use kmirror_registry::{Mode, RegistryClient, RegistryError, Schema, SchemaId, SchemaType};

/// A target registry that assigns its own ids.
#[derive(Debug, thiserror::Error)]
#[error("target schema registry {registry} does not keep the ids it is given (asked for {asked} in IMPORT mode, it answered {got}): set kmirror.schemas.ids = translate")]
pub struct IdsNotKept {
    pub registry: String,
    pub asked: SchemaId,
    pub got: SchemaId,
}

/// What the probe found.
#[derive(Debug)]
pub enum Probe {
    Keeps,
    NotKept(IdsNotKept),
}

/// Registers a throwaway schema with an unused id and says whether the id was kept. `nonce`
/// makes the subject and the schema unique (a process id and a time will do).
pub async fn probe_ids(target: &RegistryClient, nonce: u64) -> Result<Probe, RegistryError> {
    let subject = format!("_kmirror-id-probe-{nonce}");
    let schema = Schema {
        schema_type: SchemaType::Avro,
        schema: format!(
            r#"{{"type":"record","name":"KmirrorIdProbe{nonce}","namespace":"kmirror","fields":[]}}"#
        ),
        references: vec![],
    };
    // High, and checked unused: a registry's own ids count up from 1.
    let mut asked = SchemaId(1_000_000_000 + (nonce % 1_000_000_000) as i32);
    while probe_id_taken(target, asked).await? {
        asked = SchemaId(asked.0.wrapping_add(1).max(1_000_000_000));
    }
    target.set_mode(Some(&subject), Mode::Import).await?;
    let registered = target.register(&subject, &schema, Some((asked, 1))).await;
    let cleaned = clean_up(target, &subject, registered.is_ok()).await;
    let got = registered?;
    cleaned?;
    Ok(if got == asked {
        Probe::Keeps
    } else {
        Probe::NotKept(IdsNotKept {
            registry: target.shown().to_string(),
            asked,
            got,
        })
    })
}

async fn probe_id_taken(target: &RegistryClient, id: SchemaId) -> Result<bool, RegistryError> {
    match target.schema(id).await {
        Ok(_) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e),
    }
}

/// Deletes the probe's subject for good (a permanent delete needs a soft one first) and its
/// mode, whatever happened before.
async fn clean_up(
    target: &RegistryClient,
    subject: &str,
    registered: bool,
) -> Result<(), RegistryError> {
    let mut first_error = None;
    if registered {
        for permanent in [false, true] {
            if let Err(e) = target.delete_subject(subject, permanent).await {
                first_error.get_or_insert(e);
            }
        }
    }
    if let Err(e) = target.delete_mode(subject).await {
        if !e.is_not_found() {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}
