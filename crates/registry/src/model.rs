//! The Confluent Schema Registry API's types, as its JSON names them. A schema's type is absent
//! for Avro (the API's default), and its references absent when it has none; both are written
//! back the same way, so a schema round-trips unchanged.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A schema id: what a record's wire format carries, meaningful only in its own registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SchemaId(pub i32);

impl fmt::Display for SchemaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The kind of a schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum SchemaType {
    #[default]
    Avro,
    Protobuf,
    Json,
}

impl SchemaType {
    fn is_avro(&self) -> bool {
        *self == SchemaType::Avro
    }
}

/// Another subject's version a schema refers to (a Protobuf import, a JSON Schema `$ref`, a
/// named Avro type), under the `name` the schema uses for it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Reference {
    pub name: String,
    pub subject: String,
    pub version: i32,
}

/// A schema as registered: its text, type and references.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schema {
    #[serde(
        rename = "schemaType",
        default,
        skip_serializing_if = "SchemaType::is_avro"
    )]
    pub schema_type: SchemaType,
    pub schema: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub references: Vec<Reference>,
}

/// One version of a subject.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registered {
    pub subject: String,
    pub version: i32,
    pub id: SchemaId,
    #[serde(flatten)]
    pub schema: Schema,
}

/// What a registry, or one subject, lets clients do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Mode {
    #[serde(rename = "READWRITE")]
    ReadWrite,
    #[serde(rename = "READONLY")]
    ReadOnly,
    #[serde(rename = "READONLY_OVERRIDE")]
    ReadOnlyOverride,
    /// Schemas are registered with the ids and versions given (how a registry is migrated
    /// with its ids kept).
    Import,
}

/// A compatibility level, global or of one subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Compatibility {
    Backward,
    BackwardTransitive,
    Forward,
    ForwardTransitive,
    Full,
    FullTransitive,
    None,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_avro_schema_has_no_type_and_references_only_when_it_has_some() {
        let avro = Schema {
            schema_type: SchemaType::Avro,
            schema: "\"int\"".into(),
            references: vec![],
        };
        assert_eq!(
            serde_json::to_string(&avro).unwrap(),
            r#"{"schema":"\"int\""}"#
        );
        let proto = Schema {
            schema_type: SchemaType::Protobuf,
            schema: "syntax = \"proto3\";".into(),
            references: vec![Reference {
                name: "other.proto".into(),
                subject: "other".into(),
                version: 2,
            }],
        };
        let text = serde_json::to_string(&proto).unwrap();
        assert_eq!(
            text,
            r#"{"schemaType":"PROTOBUF","schema":"syntax = \"proto3\";","references":[{"name":"other.proto","subject":"other","version":2}]}"#
        );
        assert_eq!(serde_json::from_str::<Schema>(&text).unwrap(), proto);
    }

    #[test]
    fn a_version_reads_as_registries_write_it() {
        // As Apicurio's ccompat API answers GET /subjects/{s}/versions/{v}.
        let v: Registered = serde_json::from_str(
            r#"{"subject":"a-value","version":1,"id":7,"schema":"{\"type\":\"string\"}"}"#,
        )
        .unwrap();
        assert_eq!(v.id, SchemaId(7));
        assert_eq!(v.schema.schema_type, SchemaType::Avro);
        let j: Registered = serde_json::from_str(
            r#"{"subject":"j","version":3,"id":9,"schemaType":"JSON","schema":"{}","references":[]}"#,
        )
        .unwrap();
        assert_eq!(j.schema.schema_type, SchemaType::Json);
        assert!(serde_json::from_str::<Registered>(r#"{"subject":"x","version":1}"#).is_err());
    }

    #[test]
    fn modes_and_levels_use_the_apis_names() {
        for (m, name) in [
            (Mode::ReadWrite, "READWRITE"),
            (Mode::ReadOnly, "READONLY"),
            (Mode::ReadOnlyOverride, "READONLY_OVERRIDE"),
            (Mode::Import, "IMPORT"),
        ] {
            assert_eq!(serde_json::to_string(&m).unwrap(), format!("\"{name}\""));
        }
        let c: Compatibility = serde_json::from_str("\"BACKWARD_TRANSITIVE\"").unwrap();
        assert_eq!(c, Compatibility::BackwardTransitive);
        assert!(serde_json::from_str::<Mode>("\"SOMETHING\"").is_err());
    }
}
