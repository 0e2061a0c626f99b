//! Unit tests of `aws::iam`, kept apart so the module reads on its own.

use super::*;
use aws_credential_types::Credentials;
use std::time::UNIX_EPOCH;

#[test]
fn aws_sigv4_presigns_as_awss_published_example() {
    // docs.aws.amazon.com, "Authenticating Requests: Using Query Parameters (AWS Signature
    // Version 4)": GET examplebucket/test.txt, 2013-05-24, 86400 s, UNSIGNED-PAYLOAD.
    let identity = Credentials::new(
        "AKIAIOSFODNN7EXAMPLE",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        None,
        None,
        "test",
    )
    .into();
    let mut settings = SigningSettings::default();
    settings.signature_location = SignatureLocation::QueryParams;
    settings.expires_in = Some(Duration::from_secs(86400));
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region("us-east-1")
        .name("s3")
        .time(UNIX_EPOCH + Duration::from_secs(1_369_353_600))
        .settings(settings)
        .build()
        .unwrap()
        .into();
    let req = SignableRequest::new(
        "GET",
        "https://examplebucket.s3.amazonaws.com/test.txt",
        std::iter::empty(),
        SignableBody::UnsignedPayload,
    )
    .unwrap();
    let (_, signature) = sign(req, &params).unwrap().into_parts();
    assert_eq!(
        signature,
        "aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"
    );
}

fn creds(token: Option<&str>) -> AwsCredentials {
    AwsCredentials {
        access_key_id: "AKIDEXAMPLE".into(),
        secret_access_key: Secret::new("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"),
        session_token: token.map(Secret::new),
    }
}

#[test]
fn the_payload_has_the_msk_libraries_fields_and_a_checkable_signature() {
    let host = "b-1.demo.abc123.c2.kafka.us-east-1.amazonaws.com";
    let now = UNIX_EPOCH + Duration::from_secs(1_440_938_160); // 2015-08-30T12:36:00Z
    let p = payload(host, "us-east-1", &creds(Some("session-token-x")), now).unwrap();
    let doc: BTreeMap<String, String> = serde_json::from_str(p.expose()).unwrap();
    let keys: Vec<&str> = doc.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "action",
            "host",
            "user-agent",
            "version",
            "x-amz-algorithm",
            "x-amz-credential",
            "x-amz-date",
            "x-amz-expires",
            "x-amz-security-token",
            "x-amz-signature",
            "x-amz-signedheaders",
        ]
    );
    assert_eq!(doc["version"], "2020_10_22");
    assert_eq!(doc["action"], "kafka-cluster:Connect");
    assert_eq!(doc["host"], host);
    assert_eq!(doc["x-amz-algorithm"], "AWS4-HMAC-SHA256");
    assert_eq!(
        doc["x-amz-credential"],
        "AKIDEXAMPLE/20150830/us-east-1/kafka-cluster/aws4_request"
    );
    assert_eq!(doc["x-amz-date"], "20150830T123600Z");
    assert_eq!(doc["x-amz-expires"], "900");
    assert_eq!(doc["x-amz-signedheaders"], "host");
    assert_eq!(doc["x-amz-security-token"], "session-token-x");
    // The signature, worked out by hand from SigV4's definition (canonical request, string
    // to sign, derived key), independently of the signing crate.
    let canonical_query = "Action=kafka-cluster%3AConnect&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDEXAMPLE%2F20150830%2Fus-east-1%2Fkafka-cluster%2Faws4_request&X-Amz-Date=20150830T123600Z&X-Amz-Expires=900&X-Amz-Security-Token=session-token-x&X-Amz-SignedHeaders=host";
    let canonical = format!(
        "GET\n/\n{canonical_query}\nhost:{host}\n\nhost\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/kafka-cluster/aws4_request\n{}",
        hex(&sha256(canonical.as_bytes()))
    );
    let mut key = hmac(b"AWS4wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", b"20150830");
    for part in ["us-east-1", "kafka-cluster", "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    assert_eq!(doc["x-amz-signature"], hex(&hmac(&key, to_sign.as_bytes())));
    // Without a session token, no token field.
    let p = payload(host, "us-east-1", &creds(None), now).unwrap();
    assert!(!p.expose().contains("x-amz-security-token"));
    assert_eq!(format!("{p:?}"), "[hidden]");
}

fn sha256(data: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(data).to_vec()
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    use hmac::Mac;
    let mut m = <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(key).unwrap();
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn the_oauthbearer_token_is_the_presigned_url_with_the_user_agent() {
    use base64::Engine;
    let now = UNIX_EPOCH + Duration::from_secs(1_440_938_160);
    let (token, expires) = oauth_token_with("eu-west-1", &creds(None), now).unwrap();
    assert_eq!(expires, 1_440_938_160_000 + 900_000);
    let url = String::from_utf8(
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token.expose())
            .unwrap(),
    )
    .unwrap();
    assert!(
        url.starts_with(
            "https://kafka.eu-west-1.amazonaws.com/?Action=kafka-cluster%3AConnect&X-Amz-"
        ),
        "{url}"
    );
    for part in [
        "X-Amz-Algorithm=AWS4-HMAC-SHA256",
        "X-Amz-Credential=AKIDEXAMPLE%2F20150830%2Feu-west-1%2Fkafka-cluster%2Faws4_request",
        "X-Amz-Date=20150830T123600Z",
        "X-Amz-Expires=900",
        "X-Amz-SignedHeaders=host",
        "X-Amz-Signature=",
    ] {
        assert!(url.contains(part), "{part} in {url}");
    }
    assert!(
        url.ends_with(&format!(
            "&User-Agent=kmirror%2F{}",
            env!("CARGO_PKG_VERSION")
        )),
        "{url}"
    );
    // The signature is the one the payload form computes for the same host and time.
    let doc: BTreeMap<String, String> = serde_json::from_str(
        payload(
            "kafka.eu-west-1.amazonaws.com",
            "eu-west-1",
            &creds(None),
            now,
        )
        .unwrap()
        .expose(),
    )
    .unwrap();
    assert!(url.contains(&format!("X-Amz-Signature={}", doc["x-amz-signature"])));
    let env = |k: &str| (k == "AWS_REGION").then(|| "ap-south-1".to_string());
    assert_eq!(
        region_from(
            &AwsIam {
                profile: None,
                role: None
            },
            &env
        )
        .unwrap(),
        "ap-south-1"
    );
}

#[test]
fn regions_come_from_msk_host_names() {
    assert_eq!(
        region_of_host("b-1.demo.abc123.c2.kafka.eu-west-1.amazonaws.com").as_deref(),
        Some("eu-west-1")
    );
    assert_eq!(
        region_of_host("boot-x.c1.kafka-serverless.ap-southeast-2.amazonaws.com").as_deref(),
        Some("ap-southeast-2")
    );
    assert_eq!(
        region_of_host("b-1.x.kafka.cn-north-1.amazonaws.com.cn").as_deref(),
        Some("cn-north-1")
    );
    assert_eq!(region_of_host("127.0.0.1"), None);
    assert_eq!(region_of_host("amazonaws.com"), None);
}

#[test]
fn credentials_come_from_the_profile_the_environment_or_the_shared_files() {
    let dir = std::env::temp_dir().join(format!("kmirror-aws-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let credentials = dir.join("credentials");
    let config = dir.join("config");
    std::fs::write(
        &credentials,
        "[default]\naws_access_key_id = AKIADEFAULT\naws_secret_access_key = s1\n\n[ops]\naws_access_key_id=AKIAOPS\naws_secret_access_key=s2\naws_session_token=t2\n",
    )
    .unwrap();
    std::fs::write(
        &config,
        "[profile other]\nregion = eu-west-1\naws_access_key_id = AKIAOTHER\naws_secret_access_key = s3\n",
    )
    .unwrap();
    let files = |extra: &'static [(&'static str, &'static str)]| {
        let (c, f) = (
            credentials.display().to_string(),
            config.display().to_string(),
        );
        move |k: &str| -> Option<String> {
            match k {
                "AWS_SHARED_CREDENTIALS_FILE" => Some(c.clone()),
                "AWS_CONFIG_FILE" => Some(f.clone()),
                _ => extra
                    .iter()
                    .find(|(key, _)| *key == k)
                    .map(|(_, v)| v.to_string()),
            }
        }
    };
    let none = AwsIam {
        profile: None,
        role: None,
    };
    let env = files(&[]);
    assert_eq!(
        credentials_from(&none, &env)
            .unwrap()
            .unwrap()
            .access_key_id,
        "AKIADEFAULT"
    );
    let env = files(&[
        ("AWS_ACCESS_KEY_ID", "AKIAENV"),
        ("AWS_SECRET_ACCESS_KEY", "s0"),
    ]);
    assert_eq!(
        credentials_from(&none, &env)
            .unwrap()
            .unwrap()
            .access_key_id,
        "AKIAENV"
    );
    let env = files(&[("AWS_PROFILE", "other")]);
    assert_eq!(
        credentials_from(&none, &env)
            .unwrap()
            .unwrap()
            .access_key_id,
        "AKIAOTHER"
    );
    let ops = AwsIam {
        profile: Some("ops".into()),
        role: None,
    };
    let c = credentials_from(
        &ops,
        &files(&[
            ("AWS_ACCESS_KEY_ID", "AKIAENV"),
            ("AWS_SECRET_ACCESS_KEY", "s0"),
        ]),
    )
    .unwrap()
    .unwrap();
    assert_eq!(c.access_key_id, "AKIAOPS");
    assert_eq!(c.session_token.as_ref().unwrap().expose(), "t2");
    let missing = AwsIam {
        profile: Some("nope".into()),
        role: None,
    };
    let e = credentials_from(&missing, &files(&[]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("profile 'nope'"), "{e}");
    // Nothing anywhere: the chain goes on to the machine's sources.
    let empty = files(&[("AWS_PROFILE", "absent")]);
    assert!(credentials_from(&none, &empty).unwrap().is_none());
    assert!(!format!("{c:?}").contains("s2"));
    std::fs::remove_dir_all(&dir).unwrap();
}
