use super::*;
use kmirror_registry::Reference;

fn version(subject: &str, version: i32, id: i32, schema: Schema) -> Registered {
    Registered {
        subject: subject.into(),
        version,
        id: SchemaId(id),
        schema,
    }
}

fn avro(text: &str) -> Schema {
    Schema {
        schema_type: SchemaType::Avro,
        schema: text.into(),
        references: vec![],
    }
}

fn proto(text: &str, refs: &[(&str, &str, i32)]) -> Schema {
    Schema {
        schema_type: SchemaType::Protobuf,
        schema: text.into(),
        references: refs
            .iter()
            .map(|(n, s, v)| Reference {
                name: (*n).into(),
                subject: (*s).into(),
                version: *v,
            })
            .collect(),
    }
}

const V1: &str = r#"{"type":"record","name":"O","fields":[{"name":"id","type":"long"}]}"#;
const V2: &str = r#"{"type":"record","name":"O","fields":[{"name":"id","type":"long"},{"name":"n","type":"string","default":""}]}"#;
const CUSTOMER: &str = "syntax = \"proto3\";\nmessage Customer { int32 id = 1; }\n";
const EVENT: &str =
    "syntax = \"proto3\";\nimport \"customer.proto\";\nmessage Event { Customer c = 1; }\n";

/// The source: `orders-value` (two Avro versions), `events-value` importing `customer.proto`.
fn source() -> RegistryState {
    let mut subjects = BTreeMap::new();
    subjects.insert(
        "orders-value".to_string(),
        SubjectState {
            versions: vec![
                version("orders-value", 1, 1, avro(V1)),
                version("orders-value", 2, 2, avro(V2)),
            ],
            compatibility: Some(Compatibility::Forward),
            ..SubjectState::default()
        },
    );
    subjects.insert(
        "customer.proto".to_string(),
        SubjectState {
            versions: vec![version("customer.proto", 1, 3, proto(CUSTOMER, &[]))],
            ..SubjectState::default()
        },
    );
    subjects.insert(
        "events-value".to_string(),
        SubjectState {
            versions: vec![version(
                "events-value",
                1,
                4,
                proto(EVENT, &[("customer.proto", "customer.proto", 1)]),
            )],
            ..SubjectState::default()
        },
    );
    RegistryState {
        subjects,
        compatibility: Some(Compatibility::Backward),
        mode: Some(Mode::ReadWrite),
    }
}

fn rename(s: &str) -> String {
    match s.strip_suffix("-value") {
        Some(t) => format!("A.{t}-value"),
        None => s.to_string(),
    }
}

/// The target as a `translate` sync leaves it: renamed subjects, its own ids, the texts
/// reformatted.
fn target() -> RegistryState {
    let mut subjects = BTreeMap::new();
    subjects.insert(
        "A.orders-value".to_string(),
        SubjectState {
            versions: vec![
                version("A.orders-value", 1, 11, avro(&V1.replace(',', ", "))),
                version("A.orders-value", 2, 12, avro(V2)),
            ],
            compatibility: Some(Compatibility::Forward),
            ..SubjectState::default()
        },
    );
    subjects.insert(
        "customer.proto".to_string(),
        SubjectState {
            versions: vec![version(
                "customer.proto",
                1,
                13,
                proto(&CUSTOMER.replace('\n', "\n\n  "), &[]),
            )],
            ..SubjectState::default()
        },
    );
    subjects.insert(
        "A.events-value".to_string(),
        SubjectState {
            versions: vec![version(
                "A.events-value",
                1,
                14,
                proto(EVENT, &[("customer.proto", "customer.proto", 1)]),
            )],
            ..SubjectState::default()
        },
    );
    RegistryState {
        subjects,
        compatibility: Some(Compatibility::Backward),
        mode: Some(Mode::ReadWrite),
    }
}

fn failed(j: &Judged) -> Vec<(&'static str, String, String)> {
    j.verdicts
        .iter()
        .filter(|(_, _, (s, _))| *s == Status::Failed)
        .map(|(c, s, (_, d))| (*c, s.clone(), d.clone()))
        .collect()
}

#[test]
fn a_translated_copy_passes_and_maps_ids() {
    let j = judge(&source(), &target(), &rename, false);
    assert_eq!(failed(&j), vec![]);
    assert_eq!(j.ids, BTreeMap::from([(1, 11), (2, 12), (3, 13), (4, 14)]));
    let orders = j
        .verdicts
        .iter()
        .find(|(c, s, _)| *c == "subject" && s == "orders-value")
        .unwrap();
    assert_eq!(
        orders.2 .1,
        "2 version(s) as A.orders-value, ids 1->11, 2->12"
    );
    // A subject and registry settings row each, besides the subject rows.
    assert_eq!(j.verdicts.len(), 3 + 3 + 1);
}

#[test]
fn a_version_deleted_on_the_target_fails_naming_it() {
    let mut t = target();
    t.subjects
        .get_mut("A.orders-value")
        .unwrap()
        .versions
        .remove(1);
    let j = judge(&source(), &t, &rename, false);
    let f = failed(&j);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].1, "orders-value");
    assert!(
        f[0].2.contains("version 2 (id 2) not on A.orders-value"),
        "{f:?}"
    );
    assert!(!j.ids.contains_key(&2));
    // A whole subject missing.
    let mut t = target();
    t.subjects.remove("A.events-value");
    let f = failed(&judge(&source(), &t, &rename, false));
    assert_eq!(f[0].2, "not on the target as A.events-value");
}

#[test]
fn keep_needs_the_same_ids() {
    let f = failed(&judge(&source(), &target(), &rename, true));
    assert_eq!(f.len(), 3, "{f:?}");
    assert!(
        f[1].2
            .contains("id 4 on the source, 14 on the target (ids kept)"),
        "{f:?}"
    );
    let mut same = target();
    for s in same.subjects.values_mut() {
        for v in &mut s.versions {
            v.id = SchemaId(v.id.0 - 10);
        }
    }
    assert_eq!(failed(&judge(&source(), &same, &rename, true)), vec![]);
}

#[test]
fn a_reference_to_another_version_fails() {
    let mut t = target();
    t.subjects
        .get_mut("customer.proto")
        .unwrap()
        .versions
        .push(version(
            "customer.proto",
            2,
            15,
            proto(
                "syntax = \"proto3\";\nmessage Customer { int32 id = 1; string n = 2; }\n",
                &[],
            ),
        ));
    t.subjects.get_mut("A.events-value").unwrap().versions[0]
        .schema
        .references[0]
        .version = 2;
    let f = failed(&judge(&source(), &t, &rename, false));
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(
        f[0].2,
        "version 1: reference customer.proto points to customer.proto version 2 on the target, expected customer.proto version 1"
    );
}

#[test]
fn the_levels_and_modes_that_apply_are_compared_except_import() {
    // A subject's own level against the target registry's that applies to it.
    let mut t = target();
    t.subjects.get_mut("A.orders-value").unwrap().compatibility = None;
    let f = failed(&judge(&source(), &t, &rename, false));
    assert_eq!(
        f,
        vec![(
            "settings",
            "orders-value".to_string(),
            "compatibility FORWARD on the source, BACKWARD on the target".to_string()
        )]
    );
    // A registry that answers every subject with its global mode: the same mode applies.
    let mut t = target();
    for s in t.subjects.values_mut() {
        s.mode = Some(Mode::ReadWrite);
    }
    assert_eq!(failed(&judge(&source(), &t, &rename, false)), vec![]);
    // Another global mode on the target: each subject following it, and the registry.
    let mut t = target();
    t.mode = Some(Mode::ReadOnly);
    let f = failed(&judge(&source(), &t, &rename, false));
    assert_eq!(f.len(), 4, "{f:?}");
    assert!(f
        .iter()
        .all(|(c, _, d)| *c == "settings"
            && d == "mode READWRITE on the source, READONLY on the target"));
    // A source in IMPORT mode (being migrated into) is not a mode kmirror copies.
    let mut s = source();
    s.mode = Some(Mode::Import);
    let mut t = target();
    t.mode = None;
    assert_eq!(failed(&judge(&s, &t, &rename, false)), vec![]);
}

#[test]
fn a_subject_read_for_its_references_is_judged_on_those_versions_only() {
    let mut s = source();
    s.subjects
        .get_mut("customer.proto")
        .unwrap()
        .referenced_only = true;
    let mut t = target();
    // The target's copy of the subject holds another version besides; its levels differ.
    let other = version(
        "customer.proto",
        2,
        16,
        proto(
            "syntax = \"proto3\";\nmessage Customer { int32 id = 1; string n = 2; }\n",
            &[],
        ),
    );
    let customer = t.subjects.get_mut("customer.proto").unwrap();
    customer.versions.push(other);
    customer.compatibility = Some(Compatibility::Full);
    let j = judge(&s, &t, &rename, false);
    assert_eq!(failed(&j), vec![]);
    assert!(!j
        .verdicts
        .iter()
        .any(|(c, subject, _)| *c == "settings" && subject == "customer.proto"));
}

#[test]
fn soft_deleted_versions_map_their_ids_without_a_verdict() {
    let mut s = source();
    let mut t = target();
    s.subjects.get_mut("orders-value").unwrap().deleted =
        vec![version("orders-value", 3, 7, avro(r#"{"type":"string"}"#))];
    let j = judge(&s, &t, &rename, false);
    assert_eq!(failed(&j), vec![]);
    assert!(!j.ids.contains_key(&7));
    t.subjects.get_mut("A.orders-value").unwrap().deleted = vec![version(
        "A.orders-value",
        3,
        17,
        avro(r#"{"type":"string"}"#),
    )];
    let j = judge(&s, &t, &rename, false);
    assert_eq!(j.ids.get(&7), Some(&17));
}

#[test]
fn canonical_text_ignores_formatting_not_content() {
    assert!(canonically_equal(&avro(V1), &avro(&V1.replace(':', " : "))));
    assert!(!canonically_equal(&avro(V1), &avro(V2)));
    let json = |t: &str| Schema {
        schema_type: SchemaType::Json,
        schema: t.into(),
        references: vec![],
    };
    assert!(canonically_equal(
        &json(r#"{"type":"object","title":"A"}"#),
        &json(r#"{ "title": "A", "type": "object" }"#)
    ));
    assert!(!canonically_equal(
        &json(r#"{"type":"object"}"#),
        &avro(r#"{"type":"object"}"#)
    ));
    assert!(canonically_equal(
        &proto(CUSTOMER, &[]),
        &proto(
            "syntax  =  \"proto3\";\n\n  message Customer { int32 id = 1; }  \n",
            &[]
        )
    ));
    assert!(!canonically_equal(
        &proto(CUSTOMER, &[]),
        &proto(
            "syntax = \"proto3\";\nmessage Customer { int64 id = 1; }\n",
            &[]
        )
    ));
}

#[test]
fn payloads_equal_but_for_a_mapped_id() {
    let ids = BTreeMap::from([(1, 11)]);
    let s = b"\x00\x00\x00\x00\x01data";
    let t = b"\x00\x00\x00\x00\x0bdata";
    assert!(same_payload(s, t, &ids));
    assert!(same_payload(s, s, &ids));
    // Another id, other data, or an unmapped id.
    assert!(!same_payload(s, b"\x00\x00\x00\x00\x0cdata", &ids));
    assert!(!same_payload(s, b"\x00\x00\x00\x00\x0bdatA", &ids));
    assert!(!same_payload(b"\x00\x00\x00\x00\x02data", t, &ids));
    assert!(!same_payload(b"plain", b"plaiN", &ids));
}
