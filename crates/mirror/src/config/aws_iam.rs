//! SASL/AWS_MSK_IAM from the lines AWS's `aws-msk-iam-auth` library documents
//! (docs/configuration.md, "AWS MSK IAM"): `sasl.jaas.config =
//! software.amazon.msk.auth.iam.IAMLoginModule required [awsProfileName="..."];` with
//! `sasl.client.callback.handler.class = software.amazon.msk.auth.iam.IAMClientCallbackHandler`.

use super::values::{Reader, Setting};
use kmirror_kafka::settings::{AwsIam, AwsRole};
use kmirror_kafka::{SaslCredentials, SaslMechanism, Secret};

pub const MODULE: &str = "software.amazon.msk.auth.iam.IAMLoginModule";
const HANDLER: &str = "software.amazon.msk.auth.iam.IAMClientCallbackHandler";

pub(super) fn credentials(r: &mut Reader<'_>, jaas: &Setting) -> Option<SaslCredentials> {
    let mut bad = |why: String| {
        r.diags.error(Some(&jaas.origin), Some(&jaas.value), why);
        None
    };
    let (module, options) = match super::jaas::jaas_options(&jaas.value) {
        Ok(p) => p,
        Err(why) => {
            return bad(format!(
                "malformed JAAS configuration ({why}); expected: {MODULE} required;"
            ))
        }
    };
    if module != MODULE {
        return bad(format!(
            "login module {module} does not match sasl.mechanism=AWS_MSK_IAM: use {MODULE}"
        ));
    }
    let aws = settings(&options);
    let profile = aws.profile.clone();
    if let Some(h) = r.get("sasl.client.callback.handler.class") {
        if h.value.trim() != HANDLER {
            r.diags.error(
                Some(&h.origin),
                Some(&h.value),
                format!("unsupported client callback handler for AWS_MSK_IAM: expected {HANDLER}"),
            );
            return None;
        }
    }
    Some(SaslCredentials {
        mechanism: SaslMechanism::AwsMskIam,
        username: profile
            .clone()
            .unwrap_or_else(|| "(default credentials)".into()),
        password: Secret::default(),
        oauth: None,
        aws: Some(aws),
        kerberos: None,
    })
}

/// Where the credentials come from, in the options the MSK library's login module and its
/// OAUTHBEARER handler both take: `awsProfileName`, and `awsRoleArn` with
/// `awsRoleSessionName` (default "kmirror"), `awsRoleExternalId` and `awsStsRegion`.
pub(super) fn settings(options: &[(String, String)]) -> AwsIam {
    let option = |name: &str| super::jaas::jaas_option(options, name).filter(|v| !v.is_empty());
    AwsIam {
        profile: option("awsProfileName"),
        role: option("awsRoleArn").map(|arn| AwsRole {
            arn,
            session_name: option("awsRoleSessionName").unwrap_or_else(|| "kmirror".into()),
            external_id: option("awsRoleExternalId").map(Secret::new),
            sts_region: option("awsStsRegion"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<SaslCredentials, Vec<String>> {
        crate::config::client::parse_sasl_for_test(pairs, credentials)
    }

    #[test]
    fn the_msk_library_lines_are_read_and_unsupported_ones_named() {
        let c = parse(&[
            ("sasl.jaas.config", &format!("{MODULE} required;")),
            ("sasl.client.callback.handler.class", HANDLER),
        ])
        .unwrap();
        assert_eq!(
            c.aws,
            Some(AwsIam {
                profile: None,
                role: None
            })
        );
        let c = parse(&[(
            "sasl.jaas.config",
            &format!("{MODULE} required awsProfileName=\"ops\";"),
        )])
        .unwrap();
        assert_eq!(c.aws.unwrap().profile.as_deref(), Some("ops"));
        let c = parse(&[(
            "sasl.jaas.config",
            &format!("{MODULE} required awsRoleArn=\"arn:aws:iam::1:role/x\" awsStsRegion=\"eu-west-1\" awsRoleExternalId=\"ext\";"),
        )])
        .unwrap();
        let role = c.aws.unwrap().role.unwrap();
        assert_eq!(
            (
                role.arn.as_str(),
                role.session_name.as_str(),
                role.sts_region.as_deref()
            ),
            ("arn:aws:iam::1:role/x", "kmirror", Some("eu-west-1"))
        );
        assert_eq!(role.external_id.unwrap().expose(), "ext");
        let e = parse(&[
            ("sasl.jaas.config", &format!("{MODULE} required;")),
            ("sasl.client.callback.handler.class", "com.example.Other"),
        ])
        .unwrap_err();
        assert!(e[0].contains(HANDLER), "{e:?}");
        let e = parse(&[(
            "sasl.jaas.config",
            "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"u\" password=\"p\";",
        )])
        .unwrap_err();
        assert!(
            e[0].contains("does not match sasl.mechanism=AWS_MSK_IAM"),
            "{e:?}"
        );
    }
}
