//! Subject sync between two real registries (Apicurio, its Confluent API): a history with a
//! reference and a soft-deleted version arrives on a target whose ids differ, under the flow's
//! names, with the source's global level and a subject's read-only mode; every source id maps
//! to a target id whose schema is the source's; a second pass registers nothing.

use kmirror_mirror::schemas::subjects::{sync_subjects, Known, Selection};
use kmirror_registry::{
    Auth, Compatibility, Reference, RegistryClient, RegistrySettings, Schema, SchemaType,
};
use kmirror_testkit::Registry;
use std::time::Duration;

fn client(r: &Registry) -> RegistryClient {
    RegistryClient::new(&RegistrySettings {
        url: r.url().into(),
        auth: Auth::None,
        tls: None,
        timeout: Duration::from_secs(10),
    })
    .unwrap()
}

fn record(name: &str, fields: &[(&str, &str)]) -> Schema {
    let fields: Vec<String> = fields
        .iter()
        .map(|(n, t)| format!(r#"{{"name":"{n}","type":"{t}"}}"#))
        .collect();
    Schema {
        schema_type: SchemaType::Avro,
        schema: format!(
            r#"{{"type":"record","name":"{name}","namespace":"demo","fields":[{}]}}"#,
            fields.join(",")
        ),
        references: vec![],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_history_arrives_on_a_target_with_other_ids_and_a_second_pass_registers_nothing()
{
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| Registry::start("subjects-src").unwrap());
        let b = s.spawn(|| Registry::start("subjects-dst").unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    let (source, target) = (client(&a), client(&b));
    // The target has schemas of its own: its ids run ahead of any of the source's.
    for i in 0..10 {
        target
            .register(
                "local-value",
                &record(&format!("Local{i}"), &[("x", "int")]),
                None,
            )
            .await
            .unwrap();
    }
    let money = source
        .register("money", &record("Money", &[("cents", "long")]), None)
        .await
        .unwrap();
    let v1 = source
        .register("orders-value", &record("Order", &[("id", "string")]), None)
        .await
        .unwrap();
    let mut with_money = record("Order", &[("id", "string"), ("price", "demo.Money")]);
    with_money.references = vec![Reference {
        name: "demo.Money".into(),
        subject: "money".into(),
        version: 1,
    }];
    let v2 = source
        .register("orders-value", &with_money, None)
        .await
        .unwrap();
    let old = source
        .register("gone-value", &record("Gone", &[("g", "int")]), None)
        .await
        .unwrap();
    source
        .register(
            "gone-value",
            &record("Gone", &[("g", "int"), ("h", "int")]),
            None,
        )
        .await
        .unwrap();
    source.delete_version("gone-value", 1, false).await.unwrap();
    source
        .set_compatibility(Some("orders-value"), Compatibility::Forward)
        .await
        .unwrap();
    source
        .set_compatibility(None, Compatibility::BackwardTransitive)
        .await
        .unwrap();
    // Read-only on the source once its history is written: copied last on the target.
    source
        .set_mode(Some("gone-value"), kmirror_registry::Mode::ReadOnly)
        .await
        .unwrap();

    let rename = |s: &str| {
        if s.ends_with("-value") {
            format!("A.{s}")
        } else {
            s.to_string()
        }
    };
    let selection = Selection {
        subjects: &|s: &str| s.ends_with("-value"),
        keep_ids: false,
        rename: &rename,
    };
    let done = sync_subjects(&source, &target, &selection, &mut Known::default())
        .await
        .unwrap();
    eprintln!("first pass: {done:?}");
    assert_eq!(
        (done.registered, done.present, done.soft_deleted),
        (5, 0, 1)
    );
    for id in [money, v1, v2, old] {
        let to = done.ids[&id];
        assert_ne!(to, id, "the target's ids run ahead of the source's");
        // The same schema behind both ids (Apicurio compacts Avro text: compare parsed).
        let s: serde_json::Value =
            serde_json::from_str(&source.schema(id).await.unwrap().schema).unwrap();
        let t: serde_json::Value =
            serde_json::from_str(&target.schema(to).await.unwrap().schema).unwrap();
        assert_eq!(s, t, "source id {id} -> target id {to}");
    }
    let mut subjects = target.subjects(false).await.unwrap();
    subjects.sort();
    assert_eq!(
        subjects,
        vec!["A.gone-value", "A.orders-value", "local-value", "money"]
    );
    assert_eq!(
        target.versions("A.orders-value", false).await.unwrap(),
        vec![1, 2]
    );
    let second = target.version("A.orders-value", 2, false).await.unwrap();
    assert_eq!(second.schema.references[0].subject, "money");
    // The soft-deleted version is there, deleted, as on the source.
    assert_eq!(
        target.versions("A.gone-value", false).await.unwrap(),
        vec![2]
    );
    assert_eq!(
        target.versions("A.gone-value", true).await.unwrap(),
        vec![1, 2]
    );
    assert_eq!(
        target.compatibility(Some("A.orders-value")).await.unwrap(),
        Some(Compatibility::Forward)
    );

    assert_eq!(
        target.compatibility(None).await.unwrap(),
        Some(Compatibility::BackwardTransitive)
    );
    assert_eq!(
        target.mode(Some("A.gone-value")).await.unwrap(),
        Some(kmirror_registry::Mode::ReadOnly)
    );
    assert_eq!(
        target.mode(None).await.unwrap(),
        Some(kmirror_registry::Mode::ReadWrite)
    );

    let again = sync_subjects(&source, &target, &selection, &mut Known::default())
        .await
        .unwrap();
    assert_eq!(
        (again.registered, again.present, again.soft_deleted),
        (0, 5, 0)
    );
    assert_eq!(again.ids, done.ids);
}

/// `keep` against a registry that assigns its own ids (Apicurio): the probe says so, naming
/// the key to set, and leaves the registry as it found it (its subjects and modes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_that_assigns_its_own_ids_is_found_out_and_left_as_it_was() {
    use kmirror_mirror::schemas::keep::{probe_ids, Probe};
    use kmirror_registry::Mode;
    let r = Registry::start("keep-probe").unwrap();
    let c = client(&r);
    c.register("existing-value", &record("Existing", &[("e", "int")]), None)
        .await
        .unwrap();
    let probe = probe_ids(&c, 42).await.unwrap();
    let Probe::NotKept(e) = probe else {
        panic!("Apicurio kept an imported id")
    };
    let text = e.to_string();
    assert!(
        text.contains("kmirror.schemas.ids = translate") && text.contains(r.url()),
        "{text}"
    );
    assert_eq!(c.subjects(true).await.unwrap(), vec!["existing-value"]);
    assert_eq!(c.mode(None).await.unwrap(), Some(Mode::ReadWrite));
    assert!(c.schema(e.asked).await.unwrap_err().is_not_found());
}
