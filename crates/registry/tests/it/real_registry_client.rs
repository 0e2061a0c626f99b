//! One registry, every call in turn. Apicurio stands for the registries that speak the
//! Confluent API; where it differs from Confluent's own (the ids of an import), the test says so.

use kmirror_registry::error::{SCHEMA_NOT_FOUND, SUBJECT_NOT_FOUND};
use kmirror_registry::{
    Auth, Compatibility, Mode, Reference, RegistryClient, RegistryError, RegistrySettings, Schema,
    SchemaId, SchemaType,
};
use kmirror_testkit::Registry;
use std::time::{Duration, Instant};

fn client(url: &str, timeout: Duration) -> RegistryClient {
    RegistryClient::new(&RegistrySettings {
        url: url.into(),
        auth: Auth::None,
        tls: None,
        timeout,
    })
    .unwrap()
}

fn avro(name: &str, field: &str) -> Schema {
    Schema {
        schema_type: SchemaType::Avro,
        schema: format!(
            r#"{{"type":"record","name":"{name}","fields":[{{"name":"{field}","type":"int"}}]}}"#
        ),
        references: vec![],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_schema_sync_makes_against_a_real_registry() {
    let r = Registry::start("registry-client").unwrap();
    let c = client(r.url(), Duration::from_secs(10));

    assert!(c.subjects(false).await.unwrap().is_empty());
    // Two versions of one subject, one of another.
    let v1 = c
        .register("orders-value", &avro("Order", "a"), None)
        .await
        .unwrap();
    let v2 = c
        .register("orders-value", &avro("Order2", "b"), None)
        .await
        .unwrap();
    let other = c
        .register("users-value", &avro("User", "u"), None)
        .await
        .unwrap();
    assert!(v1 != v2 && v2 != other, "{v1} {v2} {other}");
    // Registering the same schema again gives the same id and no new version.
    assert_eq!(
        c.register("orders-value", &avro("Order", "a"), None)
            .await
            .unwrap(),
        v1
    );
    let mut subjects = c.subjects(false).await.unwrap();
    subjects.sort();
    assert_eq!(subjects, vec!["orders-value", "users-value"]);
    assert_eq!(c.versions("orders-value", false).await.unwrap(), vec![1, 2]);
    let second = c.version("orders-value", 2, false).await.unwrap();
    assert_eq!(
        (second.subject.as_str(), second.version, second.id),
        ("orders-value", 2, v2)
    );
    assert_eq!(second.schema.schema_type, SchemaType::Avro);
    assert!(
        second.schema.schema.contains("Order2"),
        "{}",
        second.schema.schema
    );
    let by_id = c.schema(v1).await.unwrap();
    assert!(by_id.schema.contains("\"Order\""), "{}", by_id.schema);

    // Lookup by content: found under its subject, not under another, nor in a missing subject.
    let found = c
        .lookup("orders-value", &avro("Order2", "b"), false)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((found.version, found.id), (2, v2));
    assert!(c
        .lookup("users-value", &avro("Order2", "b"), false)
        .await
        .unwrap()
        .is_none());
    assert!(c
        .lookup("nobody-value", &avro("Order", "a"), false)
        .await
        .unwrap()
        .is_none());

    // Where an id is registered.
    assert_eq!(
        c.subjects_of(v2).await.unwrap(),
        vec![("orders-value".to_string(), 2)]
    );
    assert!(c
        .subjects_of(SchemaId(999_999))
        .await
        .unwrap_err()
        .is_not_found());

    // Not found, told apart by code.
    let e = c.schema(SchemaId(999_999)).await.unwrap_err();
    assert!(
        e.is_not_found() && e.code() == Some(SCHEMA_NOT_FOUND),
        "{e}"
    );
    let e = c.versions("nobody-value", false).await.unwrap_err();
    assert!(
        e.is_not_found() && e.code() == Some(SUBJECT_NOT_FOUND),
        "{e}"
    );
    assert!(!e.is_retriable());

    // A reference to another subject's version round-trips.
    let referring = Schema {
        schema_type: SchemaType::Avro,
        schema: r#"{"type":"record","name":"Wrapper","fields":[{"name":"o","type":"Order"}]}"#
            .into(),
        references: vec![Reference {
            name: "Order".into(),
            subject: "orders-value".into(),
            version: 1,
        }],
    };
    let w = c.register("wrapper-value", &referring, None).await.unwrap();
    let back = c.version("wrapper-value", 1, false).await.unwrap();
    assert_eq!(back.id, w);
    assert_eq!(back.schema.references, referring.references);

    // Compatibility and mode, global and per subject.
    c.set_compatibility(None, Compatibility::Backward)
        .await
        .unwrap();
    assert_eq!(
        c.compatibility(None).await.unwrap(),
        Some(Compatibility::Backward)
    );
    // A subject with no level of its own: Confluent's registry answers 40408 (None here);
    // Apicurio answers NONE, whatever the global level.
    assert_eq!(
        c.compatibility(Some("users-value")).await.unwrap(),
        Some(Compatibility::None)
    );
    c.set_compatibility(Some("users-value"), Compatibility::FullTransitive)
        .await
        .unwrap();
    assert_eq!(
        c.compatibility(Some("users-value")).await.unwrap(),
        Some(Compatibility::FullTransitive)
    );
    assert_eq!(c.mode(None).await.unwrap(), Some(Mode::ReadWrite));
    c.set_mode(Some("imported-value"), Mode::Import)
        .await
        .unwrap();
    assert_eq!(
        c.mode(Some("imported-value")).await.unwrap(),
        Some(Mode::Import)
    );

    // An import that asks for the source's id: Confluent's registry keeps it, Apicurio assigns
    // its own (which is why kmirror checks the id it gets back, and `keep` is refused there).
    let asked = SchemaId(7_777);
    let got = c
        .register("imported-value", &avro("Imported", "i"), Some((asked, 1)))
        .await
        .unwrap();
    assert_ne!(got, asked, "Apicurio kept an imported id");
    c.set_mode(Some("imported-value"), Mode::ReadWrite)
        .await
        .unwrap();

    // A version another subject refers to cannot be deleted (42206); one no one refers to is
    // soft-deleted: listed and found only when deleted ones are asked for.
    let e = c
        .delete_version("orders-value", 1, false)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(42206), "{e}");
    c.delete_version("orders-value", 2, false).await.unwrap();
    assert_eq!(c.versions("orders-value", false).await.unwrap(), vec![1]);
    assert_eq!(c.versions("orders-value", true).await.unwrap(), vec![1, 2]);
    let order2 = avro("Order2", "b");
    assert!(c
        .lookup("orders-value", &order2, false)
        .await
        .unwrap()
        .is_none());
    let found = c
        .lookup("orders-value", &order2, true)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((found.version, found.id), (2, v2));

    // Soft delete, listed as deleted, then gone for good.
    assert_eq!(
        c.delete_subject("users-value", false).await.unwrap(),
        vec![1]
    );
    assert!(!c
        .subjects(false)
        .await
        .unwrap()
        .contains(&"users-value".to_string()));
    assert!(c
        .subjects(true)
        .await
        .unwrap()
        .contains(&"users-value".to_string()));
    assert_eq!(
        c.delete_subject("users-value", true).await.unwrap(),
        vec![1]
    );
    assert!(!c
        .subjects(true)
        .await
        .unwrap()
        .contains(&"users-value".to_string()));

    // A frozen registry: the call ends within its timeout as retriable, naming the call.
    let quick = client(r.url(), Duration::from_secs(2));
    r.pause().unwrap();
    let t0 = Instant::now();
    let e = quick.subjects(false).await.unwrap_err();
    let took = t0.elapsed();
    r.resume().unwrap();
    assert!(matches!(e, RegistryError::Unreachable { .. }), "{e}");
    assert!(
        e.is_retriable() && e.to_string().contains("GET /subjects"),
        "{e}"
    );
    assert!(took < Duration::from_secs(6), "{took:?}");
    assert_eq!(
        quick.versions("orders-value", true).await.unwrap(),
        vec![1, 2]
    );

    // Nobody listening: unreachable too.
    let url = r.url().to_string();
    drop(r);
    let e = client(&url, Duration::from_secs(2))
        .subjects(false)
        .await
        .unwrap_err();
    assert!(
        matches!(e, RegistryError::Unreachable { .. }) && e.is_retriable(),
        "{e}"
    );
}
