//! Configuration: reading MM2, connector and MM1 inputs into one validated model.

pub mod aws_iam;
pub mod client;
pub mod connector;
pub mod diagnostics;
pub mod flow;
pub mod front;
mod jaas;
pub mod kerberos;
pub mod keys;
pub mod legacy;
pub mod mm2;
pub mod model;
pub mod oauth;
pub mod preflight;
pub mod properties;
pub mod providers;
pub mod schemas;
mod tls;
pub mod transforms;
pub mod values;
