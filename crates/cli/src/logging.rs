//! Logging setup: text or JSON lines on stderr, filtered RUST_LOG-style.

use crate::cli::LogFormat;
use tracing_subscriber::EnvFilter;

pub(crate) fn init(format: LogFormat, level: Option<&str>) {
    let filter = match level {
        Some(l) => EnvFilter::new(l),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    use std::io::IsTerminal;
    // Colours only on a terminal: redirected logs stay greppable.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
