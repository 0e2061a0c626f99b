//! Unit tests of `plan`, kept apart so the module reads on its own.

use super::*;
use crate::config::mm2;
use crate::config::properties::Properties;
use crate::config::providers::SystemEnvironment;

fn plan(text: &str, served: &[&str]) -> Plan {
    let props = Properties::parse(text, "mm2.properties").unwrap();
    let served: Vec<String> = served.iter().map(|s| s.to_string()).collect();
    Plan::new(&mm2::load(&props, &served, &SystemEnvironment).unwrap())
}

const SASL: &str = "clusters = A, B\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n\
    B.security.protocol = SASL_PLAINTEXT\nB.sasl.mechanism = PLAIN\n\
    B.sasl.jaas.config = org.apache.kafka.common.security.plain.PlainLoginModule required username=\"mm2\" password=\"topsecret\";\n\
    A->B.enabled = true\ntasks.max = 3\n";

#[test]
fn text_plan_explains_flows_names_and_internal_topics() {
    let text = plan(SASL, &[]).render_text();
    for needle in [
        "kmirror plan for mm2.properties (MirrorMaker 2 dedicated mode)",
        "B  b:9092  SASL_PLAINTEXT PLAIN user=mm2 password=[hidden]",
        "Flow A->B  [replicate]  served by this process",
        "'orders' on A becomes 'A.orders' on B",
        "mm2-offset-syncs.B.internal",
        "A.checkpoints.internal",
        "mm2-offsets.A.internal",
        "Flow B->A  [heartbeats only]",
        "group offsets   off",
        "checkpoints     every 60 s",
        "mm2.properties:8: tasks.max: kmirror has no Connect tasks",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    assert!(!text.contains("topsecret"));
}

/// A tuning key honoured but named nowhere in the plan left a user unsure it was read.
#[test]
fn every_connector_key_set_is_named_with_its_value() {
    let text = plan(
        "clusters = A, B\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n\
         A->B.enabled = true\nadmin.timeout.ms = 5000\nA->B.offset.lag.max = 50\n\
         A->B.kmirror.positions.interval.ms = 1000\n",
        &[],
    )
    .render_text();
    let flow = &text[text.find("Flow A->B").expect("the flow")..];
    let flow = &flow[..flow.find("Flow B->A").unwrap_or(flow.len())];
    for needle in [
        "keys set",
        "admin.timeout.ms = 5000",
        "offset.lag.max = 50",
        "kmirror.positions.interval.ms = 1000",
    ] {
        assert!(flow.contains(needle), "missing {needle:?} in:\n{flow}");
    }
    // The flow's identity is its heading, not a setting.
    assert!(!flow.contains("    enabled = true"), "{flow}");
}

#[test]
fn json_plan_masks_secrets_and_marks_served_flows() {
    let p = plan(SASL, &["A"]);
    let json = serde_json::to_value(&p).unwrap();
    assert!(!json.to_string().contains("topsecret"));
    let flows = json["flows"].as_array().unwrap();
    let served: Vec<(&str, bool)> = flows
        .iter()
        .map(|f| (f["flow"].as_str().unwrap(), f["served"].as_bool().unwrap()))
        .collect();
    assert_eq!(served, [("A->B", false), ("B->A", true)]);
    assert_eq!(json["served_targets"][0], "A");
    assert_eq!(flows[0]["config"]["topics"]["include"][0], ".*");
}

#[test]
fn plan_shows_both_msk_iam_forms_with_their_roles_and_an_oidc_endpoints_tls() {
    let text = "clusters = A, B, C\nA.bootstrap.servers = a:9098\nB.bootstrap.servers = b:9098\n\
        C.bootstrap.servers = c:9093\n\
        A.security.protocol = SASL_SSL\nA.sasl.mechanism = AWS_MSK_IAM\n\
        A.sasl.jaas.config = software.amazon.msk.auth.iam.IAMLoginModule required awsRoleArn=\"arn:aws:iam::1:role/reader\" awsRoleExternalId=\"ext-secret-7\";\n\
        A.sasl.client.callback.handler.class = software.amazon.msk.auth.iam.IAMClientCallbackHandler\n\
        B.security.protocol = SASL_SSL\nB.sasl.mechanism = OAUTHBEARER\n\
        B.sasl.jaas.config = org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required awsProfileName=\"ops\" awsRoleArn=\"arn:aws:iam::2:role/writer\";\n\
        B.sasl.login.callback.handler.class = software.amazon.msk.auth.iam.IAMOAuthBearerLoginCallbackHandler\n\
        C.security.protocol = SASL_SSL\nC.sasl.mechanism = OAUTHBEARER\n\
        C.sasl.oauthbearer.token.endpoint.url = https://idp.example/token?key=query-secret-8\n\
        C.sasl.login.callback.handler.class = org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler\n\
        C.sasl.login.connect.timeout.ms = 7000\n\
        C.sasl.jaas.config = org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required clientId=\"km\" clientSecret=\"client-secret-9\" ssl.truststore.type=\"PEM\" ssl.truststore.location=\"/etc/idp-ca.pem\";\n\
        A->B.enabled = true\nA->C.enabled = true\n";
    let p = plan(text, &[]);
    let shown = p.render_text();
    for needle in [
        "SASL_SSL AWS_MSK_IAM SigV4 credentials from the default chain (environment, web identity, shared files' profile, container, instance metadata), assuming role arn:aws:iam::1:role/reader (session kmirror, STS us-east-1)",
        "SASL_SSL OAUTHBEARER Amazon MSK IAM token, credentials from profile 'ops' (awsProfileName), assuming role arn:aws:iam::2:role/writer",
        "OAUTHBEARER OIDC client credentials at https://idp.example/token client=km secret=[hidden]",
        "token endpoint timeouts connect 7000 ms, read 10000 ms, TLS trust=CA /etc/idp-ca.pem",
    ] {
        assert!(shown.contains(needle), "missing {needle:?} in:\n{shown}");
    }
    let json = serde_json::to_value(&p).unwrap().to_string();
    for secret in ["ext-secret-7", "query-secret-8", "client-secret-9"] {
        assert!(!shown.contains(secret), "{secret} in:\n{shown}");
        assert!(!json.contains(secret), "{secret} in:\n{json}");
    }
}

#[test]
fn plan_explains_schema_sync_with_secrets_masked_and_no_key_left_ignored() {
    let text = "clusters = A, B\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n\
        A.schema.registry.url = https://sr-a:8081\n\
        A.basic.auth.user.info = reader:sr-secret-1\n\
        B.schema.registry.url = https://writer:sr-secret-2@sr-b:8081/apis/ccompat/v7\n\
        B.schema.registry.ssl.endpoint.identification.algorithm =\n\
        A->B.enabled = true\nA->B.kmirror.schemas.ids = translate\n\
        kmirror.schemas.subjects = common\\\\..*\nkmirror.schemas.refresh.interval.seconds = 10\n";
    let p = plan(text, &[]);
    assert!(p.ignored.is_empty(), "{:?}", p.ignored);
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    let shown = p.render_text();
    for needle in [
        "schemas        from https://sr-a:8081, basic auth to https://sr-b:8081/apis/ccompat/v7 (TLS trust=system roots hostname-verification=OFF), every 10 s",
        "<topic>-key and <topic>-value of the replicated topics, named on the target as their topics are, and subjects matching common\\..*",
        "_schemas is not replicated",
        "ids          translate: the target assigns its own ids",
        "a partition waits until the schemas its records name are on the target",
    ] {
        assert!(shown.contains(needle), "missing {needle:?} in:\n{shown}");
    }
    // The reverse flow only emits heartbeats: no schemas.
    assert_eq!(shown.matches("  schemas ").count(), 1, "{shown}");
    let json = serde_json::to_value(&p).unwrap().to_string();
    for secret in ["sr-secret-1", "sr-secret-2"] {
        assert!(!shown.contains(secret), "{secret} in:\n{shown}");
        assert!(!json.contains(secret), "{secret} in:\n{json}");
    }
    // Only the source names a registry: a warning, which makes `plan --check` exit 4.
    let p = plan(
        "clusters = A, B\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n\
         A.schema.registry.url = http://sr-a:8081\nA->B.enabled = true\n",
        &[],
    );
    assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);
    assert!(p.warnings[0].to_string().contains("B.schema.registry.url"));
    // The source's URL acts in no flow: listed too, with why.
    assert_eq!(p.ignored.len(), 1, "{:?}", p.ignored);
    assert_eq!(p.ignored[0].origin.key, "A.schema.registry.url");
    assert!(p.ignored[0]
        .reason
        .contains("no flow syncs schemas with cluster A"));
    assert!(p
        .render_text()
        .contains("schemas        off (set A.schema.registry.url and B.schema.registry.url"));
    // Switched off on purpose: not an ignored key. Without registries, the flow keys are.
    let off = plan(
        "clusters = A, B\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n\
         A.schema.registry.url = http://sr-a:8081\nB.schema.registry.url = http://sr-b:8081\n\
         A->B.enabled = true\nkmirror.schemas.enabled = false\n",
        &[],
    );
    assert!(
        off.ignored.is_empty() && off.warnings.is_empty(),
        "{:?}",
        off.ignored
    );
    assert!(off.render_text().contains("schemas        off"));
    let none = plan(
        "clusters = A, B\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n\
         A->B.enabled = true\nA->B.kmirror.schemas.ids = translate\n",
        &[],
    );
    assert_eq!(none.ignored.len(), 1, "{:?}", none.ignored);
    assert!(none.ignored[0].reason.contains("schema.registry.url"));
}
