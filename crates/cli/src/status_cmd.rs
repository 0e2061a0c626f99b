//! `kmirror status`: reads a running process's `/status` and shows it — plain lines (or JSON)
//! once, or with `--watch` again and again: in-place progress bars per flow on a terminal
//! (copied records against copied + lag), one line per flow and look when not a terminal.

use crate::cli::Format;
use anyhow::Context;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use kmirror_mirror::status::{render, Status};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// GET /status from `address`.
pub(crate) async fn fetch(address: &str) -> anyhow::Result<Status> {
    let unreachable = || {
        format!(
            "cannot reach kmirror at {address} (is it running with --metrics-address {address}?)"
        )
    };
    let mut stream = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::TcpStream::connect(address),
    )
    .await
    .map_err(|_| anyhow::anyhow!("{}: timed out", unreachable()))?
    .with_context(unreachable)?;
    stream
        .write_all(format!("GET /status HTTP/1.1\r\nHost: {address}\r\n\r\n").as_bytes())
        .await?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .map_err(|_| anyhow::anyhow!("{address}: no answer within 10 s"))??;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("{address}: not an HTTP answer"))?;
    if !head.starts_with("HTTP/1.1 200") {
        anyhow::bail!(
            "{address}: {} (an older kmirror without /status?)",
            head.lines().next().unwrap_or_default()
        );
    }
    serde_json::from_str(body).with_context(|| format!("{address}: /status is not kmirror's JSON"))
}

pub(crate) async fn run(
    address: &str,
    format: Format,
    watch: Option<u64>,
) -> anyhow::Result<ExitCode> {
    let show = |s: &Status| -> anyhow::Result<()> {
        match format {
            Format::Json => println!("{}", serde_json::to_string(s)?),
            Format::Text => print!("{}", render(s)),
        }
        Ok(())
    };
    let Some(every) = watch else {
        show(&fetch(address).await?)?;
        return Ok(ExitCode::SUCCESS);
    };
    let every = Duration::from_secs(every.max(1));
    if !(std::io::stdout().is_terminal() && matches!(format, Format::Text)) {
        loop {
            show(&fetch(address).await?)?;
            tokio::time::sleep(every).await;
        }
    }
    let bars = MultiProgress::new();
    let style =
        ProgressStyle::with_template("{prefix:>8} [{bar:40.cyan/blue}] {percent:>3}% {msg}")?
            .progress_chars("=> ");
    let header = bars.add(ProgressBar::new_spinner());
    let mut by_flow: BTreeMap<String, ProgressBar> = BTreeMap::new();
    loop {
        let s = match fetch(address).await {
            Ok(s) => s,
            Err(e) => {
                header.set_message(format!("{e:#}"));
                tokio::time::sleep(every).await;
                continue;
            }
        };
        header.set_message(format!(
            "{} (up {:.0} s){}",
            if s.ready { "ready" } else { "NOT READY" },
            s.uptime_seconds,
            s.reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        ));
        for f in &s.flows {
            let bar = by_flow.entry(f.flow.clone()).or_insert_with(|| {
                let b = bars.add(ProgressBar::new(1));
                b.set_style(style.clone());
                b.set_prefix(f.flow.clone());
                b
            });
            bar.set_length((f.records + f.lag_records.max(0) as u64).max(1));
            bar.set_position(f.records);
            let eta = match f.eta_seconds {
                Some(e) if f.lag_records > 0 => format!("eta {e:.0} s"),
                _ if f.lag_records == 0 => "caught up".into(),
                _ => "eta -".into(),
            };
            bar.set_message(format!(
                "{:.0} rec/s {:.2} MB/s lag {} ({:.1} s) {eta}{}{}",
                f.records_per_second,
                f.megabytes_per_second,
                f.lag_records,
                f.lag_seconds,
                if f.connected { "" } else { " DISCONNECTED" },
                if f.errors > 0 {
                    format!(" errors {}", f.errors)
                } else {
                    String::new()
                }
            ));
        }
        tokio::time::sleep(every).await;
    }
}
