//! AWS authentication for Amazon MSK: SASL/AWS_MSK_IAM and its OAUTHBEARER form (`iam`), and
//! where the credentials come from (docs/configuration.md, "AWS MSK IAM"): a role to assume
//! (`assume_role`), web identity (`web_identity`), the container and instance metadata
//! services (`metadata`), with STS's answers read in one place (`sts`) and the credentials
//! they all give in `credentials`.

pub mod assume_role;
pub mod credentials;
pub mod iam;
pub mod metadata;
mod sts;
pub mod web_identity;
