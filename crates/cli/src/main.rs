//! The `kmirror` binary: a thin layer over the engine crates. It parses the command line, loads
//! configuration files, renders results and maps failures to documented exit codes.
//!
//! Exit codes: 0 success; 1 runtime failure; 2 bad command line; 3 invalid configuration (also
//! one the clusters prove wrong before anything is written: a target schema registry that
//! does not keep ids);
//! 4 `plan --check` found warnings or ignored keys; 5 `verify` found differences; 6 `verify`
//! found data still in flight and no difference; 7 `offsets apply --skip-active` left out
//! groups with members on the target. Each code means one thing, so a script can branch on it.

mod cli;
mod logging;
mod metrics_http;
mod status_cmd;

use anyhow::Context;
use clap::Parser;
use cli::{Cli, Command, ConfigArgs, Format, LegacyCmd, OffsetsCmd};
use kmirror_mirror::config::diagnostics::ConfigError;
use kmirror_mirror::config::model::MirrorConfig;
use kmirror_mirror::config::properties::{Properties, PropertiesError};
use kmirror_mirror::config::providers::SystemEnvironment;
use kmirror_mirror::config::{connector, legacy, mm2};
use kmirror_mirror::plan::{describe_security, Plan};
use std::process::ExitCode;

const EXIT_RUNTIME: u8 = 1;
const EXIT_CONFIG: u8 = 3;
const EXIT_CHECK: u8 = 4;
const EXIT_GROUPS_SKIPPED: u8 = 7;

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format, cli.log_level.as_deref());
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            if let Some(c) = e.downcast_ref::<ConfigError>() {
                eprintln!("{c}");
                ExitCode::from(EXIT_CONFIG)
            } else if let Some(c @ kmirror_mirror::engine::EngineError::Config { .. }) =
                e.downcast_ref::<kmirror_mirror::engine::EngineError>()
            {
                // A setting the clusters proved wrong before anything was written.
                eprintln!("1 configuration error:\n  error: {c}");
                ExitCode::from(EXIT_CONFIG)
            } else if let Some(c @ kmirror_mirror::legacy::LegacyError::Config(_)) =
                e.downcast_ref::<kmirror_mirror::legacy::LegacyError>()
            {
                eprintln!("1 configuration error:\n  error: {c}");
                ExitCode::from(EXIT_CONFIG)
            } else if let Some(p @ PropertiesError::BadEscape { .. }) =
                e.downcast_ref::<PropertiesError>()
            {
                eprintln!("1 configuration error:\n  error: {p}");
                ExitCode::from(EXIT_CONFIG)
            } else {
                eprintln!("error: {e:#}");
                ExitCode::from(EXIT_RUNTIME)
            }
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Plan {
            config,
            format,
            check,
        } => {
            let cfg = load(&config)?;
            kmirror_mirror::config::preflight::tls_files(&cfg)?;
            let plan = Plan::new(&cfg);
            match format {
                Format::Text => print!("{}", plan.render_text()),
                Format::Json => println!("{}", serde_json::to_string_pretty(&plan)?),
            }
            if check && (!plan.warnings.is_empty() || !plan.ignored.is_empty()) {
                eprintln!(
                    "plan --check: {} warning(s), {} ignored key(s)",
                    plan.warnings.len(),
                    plan.ignored.len()
                );
                return Ok(ExitCode::from(EXIT_CHECK));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Run {
            config,
            metrics_address,
            shutdown_timeout,
        } => {
            let metrics_address = parse_metrics_address(metrics_address.as_deref())?;
            let cfg = load(&config)?;
            kmirror_mirror::config::preflight::tls_files(&cfg)?;
            report(&cfg);
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let deadline = std::time::Duration::from_secs(shutdown_timeout);
            let result = runtime.block_on(run_engine(cfg, metrics_address, deadline));
            // Tasks still waiting on a silent broker are dropped, not waited for.
            runtime.shutdown_timeout(std::time::Duration::from_secs(1));
            result?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Verify {
            config,
            flow,
            topics,
            deep,
            count,
            all,
            format,
        } => {
            let cfg = load(&config)?;
            kmirror_mirror::config::preflight::tls_files(&cfg)?;
            let topics = topics
                .map(|t| {
                    kmirror_mirror::filter::PatternList::from_items(vec![legacy::mm1_topic_regex(
                        &t,
                    )])
                    .map_err(|e| anyhow::anyhow!("--topics '{t}': invalid regex: {e}"))
                })
                .transpose()?;
            let count = match count {
                cli::CountArg::Auto => kmirror_mirror::verify::Count::Auto,
                cli::CountArg::Offsets => kmirror_mirror::verify::Count::Offsets,
                cli::CountArg::Records => kmirror_mirror::verify::Count::Records,
            };
            let options = kmirror_mirror::verify::collect::Options {
                topics,
                deep,
                count,
            };
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let report = runtime.block_on(kmirror_mirror::verify::collect::all(
                &cfg,
                flow.as_deref(),
                &options,
            ))?;
            match format {
                Format::Text => print!("{}", report.render(all)),
                Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
            }
            Ok(ExitCode::from(report.exit_code()))
        }
        Command::Status {
            address,
            format,
            watch,
        } => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(status_cmd::run(&address, format, watch))
        }
        Command::Legacy(cmd) => legacy_cmd(cmd),
        Command::Offsets(cmd) => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            runtime.block_on(offsets_cmd(cmd))
        }
    }
}

/// Where the metrics endpoint listens, if anywhere.
#[derive(Debug, Clone, Copy, PartialEq)]
enum MetricsAddress {
    Off,
    /// Given with --metrics-address: that address or a clear failure.
    Given(std::net::SocketAddr),
    /// Not given: the default port, or a free one when another process on the host holds it
    /// (a second kmirror on one host must not fail on a port it never asked for).
    Default,
}

/// The metrics port taken when --metrics-address is not given and it is free.
const DEFAULT_METRICS_ADDRESS: std::net::SocketAddr =
    std::net::SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9464);

fn parse_metrics_address(a: Option<&str>) -> anyhow::Result<MetricsAddress> {
    match a {
        None => Ok(MetricsAddress::Default),
        Some("off") => Ok(MetricsAddress::Off),
        Some(a) => Ok(MetricsAddress::Given(
            a.parse::<std::net::SocketAddr>().map_err(|e| {
                anyhow::anyhow!(
                    "--metrics-address '{a}': expected HOST:PORT with an IP address, or off ({e})"
                )
            })?,
        )),
    }
}

/// Binds the metrics listener. A busy default port falls back to a free port on the same
/// interface, with a warning naming it; a busy address the user gave fails.
async fn bind_metrics(
    address: MetricsAddress,
    default: std::net::SocketAddr,
) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    use tokio::net::TcpListener;
    match address {
        MetricsAddress::Off => Ok(None),
        MetricsAddress::Given(addr) => {
            Ok(Some(TcpListener::bind(addr).await.with_context(|| {
                format!("--metrics-address {addr}: cannot listen")
            })?))
        }
        MetricsAddress::Default => match TcpListener::bind(default).await {
            Ok(l) => Ok(Some(l)),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                let mut free = default;
                free.set_port(0);
                let l = TcpListener::bind(free)
                    .await
                    .with_context(|| format!("metrics endpoint: cannot listen on {free}"))?;
                tracing::warn!(
                    busy = %default,
                    address = %l.local_addr()?,
                    "the default metrics port is taken (another kmirror on this host?); serving metrics and /status on a free port instead (set --metrics-address to choose)"
                );
                Ok(Some(l))
            }
            Err(e) => {
                Err(e).with_context(|| format!("metrics endpoint: cannot listen on {default}"))
            }
        },
    }
}

/// Replicates until SIGINT or SIGTERM, then drains in-flight writes and stores positions.
async fn run_engine(
    cfg: MirrorConfig,
    metrics_address: MetricsAddress,
    deadline: std::time::Duration,
) -> anyhow::Result<()> {
    let (shutdown, metrics, process) = serve_process(metrics_address).await?;
    within_deadline(
        &shutdown,
        deadline,
        kmirror_mirror::engine::run(&cfg, shutdown.clone(), metrics.clone()),
    )
    .await?;
    failed_task(&process)?;
    let flows = metrics.flow_figures();
    let batches = |mode: &str| -> u64 {
        flows
            .iter()
            .filter_map(|f| metrics.batches.get(&f.labels.mode(mode)).map(|c| c.get()))
            .sum()
    };
    tracing::info!(
        records = flows.iter().map(|f| f.records).sum::<u64>(),
        batches_forwarded = batches("batch"),
        batches_reencoded = batches("record"),
        "stopped"
    );
    Ok(())
}

/// Runs `work` to its end, except that once `shutdown` is triggered it gets at most `deadline`
/// to finish: a silent target broker would otherwise hold each in-flight produce for up to
/// `delivery.timeout.ms` (2 minutes), longer than Kubernetes and systemd wait.
/// Positions acknowledged before are already stored (the writer stores every 250 ms), so
/// exiting loses nothing; what was in flight is copied again after a restart.
async fn within_deadline<T, E>(
    shutdown: &kmirror_mirror::engine::Shutdown,
    deadline: std::time::Duration,
    work: impl std::future::Future<Output = Result<T, E>>,
) -> anyhow::Result<T>
where
    E: std::error::Error + Send + Sync + 'static,
{
    tokio::select! {
        r = work => Ok(r?),
        _ = async {
            shutdown.wait().await;
            tokio::time::sleep(deadline).await
        } => {
            let secs = deadline.as_secs_f64();
            tracing::error!(deadline_s = secs, "shutdown deadline passed with writes still in flight; exiting (they are copied again after a restart)");
            anyhow::bail!("shutdown did not finish within --shutdown-timeout {secs} s; in-flight writes were abandoned and are copied again after a restart")
        }
    }
}

/// MM1 mode's shutdown deadline (its command line is MM1's, so not an option there): the
/// default of `run --shutdown-timeout`, or longer when the producer file's `request.timeout.ms`
/// is: a silent target gets one request timeout to acknowledge what is in flight, and the
/// final commit comes after it (Java's default of 30 s would otherwise always miss it).
fn legacy_shutdown_timeout(request_timeout: std::time::Duration) -> std::time::Duration {
    const DEFAULT: std::time::Duration = std::time::Duration::from_secs(25);
    /// For the final commit to the source and leaving the group.
    const AFTER_THE_LAST_ANSWER: std::time::Duration = std::time::Duration::from_secs(5);
    DEFAULT.max(request_timeout + AFTER_THE_LAST_ANSWER)
}

/// MM1 mode until SIGINT or SIGTERM, then flushes, commits and leaves the group.
async fn run_legacy(
    cfg: legacy::LegacyConfig,
    metrics_address: MetricsAddress,
) -> anyhow::Result<()> {
    let (shutdown, metrics, process) = serve_process(metrics_address).await?;
    within_deadline(
        &shutdown,
        legacy_shutdown_timeout(cfg.producer.request_timeout),
        kmirror_mirror::legacy::run(std::sync::Arc::new(cfg), shutdown.clone(), metrics.clone()),
    )
    .await?;
    failed_task(&process)?;
    tracing::info!(
        records = metrics
            .flow_figures()
            .iter()
            .map(|f| f.records)
            .sum::<u64>(),
        "stopped"
    );
    Ok(())
}

/// What every replicating command sets up first: the shutdown signal on SIGTERM/SIGINT and the
/// metrics endpoint, under the process's supervisor: a panic in either stops the engine, which
/// drains and stores its positions, and fails the command ([`failed_task`]).
async fn serve_process(
    metrics_address: MetricsAddress,
) -> anyhow::Result<(
    kmirror_mirror::engine::Shutdown,
    std::sync::Arc<kmirror_mirror::metrics::Metrics>,
    kmirror_mirror::engine::Supervisor,
)> {
    use kmirror_mirror::engine::{Shutdown, Supervisor};
    use kmirror_mirror::metrics::Metrics;
    let shutdown = Shutdown::default();
    let metrics = std::sync::Arc::new(Metrics::new());
    let process = Supervisor::default();
    // Registered before anything else runs, so a SIGTERM at any later point drains.
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let (trigger, failed) = (shutdown.clone(), process.clone());
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {
                tracing::info!("shutting down: draining in-flight writes and storing positions");
            }
            _ = int.recv() => {
                tracing::info!("shutting down: draining in-flight writes and storing positions");
            }
            _ = failed.failed() => {}
        }
        trigger.trigger();
    });
    if let Some(listener) = bind_metrics(metrics_address, DEFAULT_METRICS_ADDRESS).await? {
        tracing::info!(address = %listener.local_addr()?, "serving Prometheus metrics at /metrics");
        metrics_http::serve(listener, metrics.clone(), &process);
    }
    Ok((shutdown, metrics, process))
}

/// The command fails when one of the process's own tasks panicked (the engine stopped for it).
fn failed_task(process: &kmirror_mirror::engine::Supervisor) -> anyhow::Result<()> {
    match process.failure() {
        Some((task, message)) => {
            anyhow::bail!("the process's {task} task panicked: {message} (a bug in kmirror; please report it with the log)")
        }
        None => Ok(()),
    }
}

/// `kmirror offsets translate|apply`.
async fn offsets_cmd(cmd: OffsetsCmd) -> anyhow::Result<ExitCode> {
    use kmirror_mirror::failover;
    let (args, apply, dry_run, skip_active) = match cmd {
        OffsetsCmd::Translate(a) => (a, false, false, false),
        OffsetsCmd::Apply {
            args,
            dry_run,
            skip_active,
        } => (args, true, dry_run, skip_active),
    };
    let started = std::time::Instant::now();
    let cfg = load(&args.config)?;
    kmirror_mirror::config::preflight::tls_files(&cfg)?;
    let wanted = format!("{}->{}", args.source, args.target);
    let Some(flow) = cfg.flows.iter().find(|f| f.id.to_string() == wanted) else {
        let known: Vec<String> = cfg.flows.iter().map(|f| f.id.to_string()).collect();
        anyhow::bail!(
            "no flow {wanted} in the configuration (flows: {})",
            known.join(", ")
        );
    };
    let target = kmirror_kafka::cluster::KafkaCluster::connect(flow.clients.target_admin.clone())
        .await
        .with_context(|| format!("connecting to {}", args.target))?;
    let matching = match &args.groups {
        Some(p) => Some(
            kmirror_mirror::filter::PatternList::parse(p)
                .map_err(|e| anyhow::anyhow!("--groups: {e}"))?,
        ),
        None => None,
    };
    let select = failover::Selection {
        named: args.group.clone(),
        matching,
    };
    let rows = failover::translate_groups(flow, &target, &select).await?;
    match args.format {
        Format::Text => print!("{}", failover::render(&rows)),
        Format::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
    }
    // Named groups the checkpoints know nothing of.
    let without: Vec<&String> = args
        .group
        .iter()
        .filter(|g| !rows.iter().any(|r| &r.group == *g))
        .collect();
    let groups: std::collections::BTreeSet<&str> = rows.iter().map(|r| r.group.as_str()).collect();
    let mut code = ExitCode::SUCCESS;
    if apply {
        if dry_run {
            eprintln!("dry run: nothing committed");
        } else {
            let applied = failover::apply_groups_with(flow, &target, &rows, skip_active).await?;
            for (group, n) in &applied.committed {
                eprintln!(
                    "committed {n} partition offset(s) for group {group} on {}",
                    args.target
                );
            }
            let moved = applied.committed.values().filter(|n| **n > 0).count();
            let partitions: usize = applied.committed.values().sum();
            eprintln!(
                "summary: {} group(s) with checkpoints; {moved} moved ({partitions} partition offsets), {} already there, {} refused (active members on {}){}; {} named without a checkpoint{}; {:.1} s",
                groups.len(),
                applied.committed.len() - moved,
                applied.refused.len(),
                args.target,
                listed(
                    applied
                        .refused
                        .iter()
                        .map(|(g, m, s)| format!("{g} ({m} members, {s})"))
                ),
                without.len(),
                listed(without.iter()),
                started.elapsed().as_secs_f64()
            );
            if !applied.refused.is_empty() {
                code = ExitCode::from(EXIT_GROUPS_SKIPPED);
            }
        }
    } else {
        eprintln!(
            "summary: {} group(s) with checkpoints; {} named without a checkpoint{}; {:.1} s",
            groups.len(),
            without.len(),
            listed(without.iter()),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(code)
}

/// `: a, b` after a count in a summary line, or nothing when there is none.
fn listed<T: std::fmt::Display>(items: impl Iterator<Item = T>) -> String {
    let items: Vec<String> = items.map(|i| i.to_string()).collect();
    if items.is_empty() {
        String::new()
    } else {
        format!(": {}", items.join(", "))
    }
}

/// Loads whichever configuration form the arguments name.
fn load(args: &ConfigArgs) -> anyhow::Result<MirrorConfig> {
    let env = SystemEnvironment;
    let cfg = if !args.connector.is_empty() {
        if args.config.is_some() {
            anyhow::bail!("give either an mm2.properties file or --connector files, not both");
        }
        let files = args
            .connector
            .iter()
            .map(|p| Properties::load(p))
            .collect::<Result<Vec<_>, _>>()?;
        let worker = args
            .worker
            .as_ref()
            .map(|p| Properties::load(p))
            .transpose()?;
        connector::load(&files, worker.as_ref(), &env)?
    } else {
        let Some(path) = &args.config else {
            if let Some(f) = args.clusters.iter().find(|c| c.ends_with(".properties")) {
                anyhow::bail!("no configuration file: '{f}' was read as a --clusters alias; put the file first, as with connect-mirror-maker.sh: kmirror run {f} --clusters ...");
            }
            anyhow::bail!("no configuration: give an mm2.properties file, or --connector FILE");
        };
        let props = Properties::load(path)?;
        mm2::load(&props, &args.clusters, &env)?
    };
    Ok(cfg)
}

/// Logs what the process would serve, and every warning and ignored key once.
fn report(cfg: &MirrorConfig) {
    for w in cfg.diagnostics.warnings() {
        tracing::warn!("{w}");
    }
    for i in &cfg.ignored {
        match &i.did_you_mean {
            Some(h) => {
                tracing::warn!(key = %i.origin.key, "ignored: {}: {} (did you mean '{h}'?)", i.origin, i.reason)
            }
            None => tracing::info!(key = %i.origin.key, "ignored: {}: {}", i.origin, i.reason),
        }
    }
    for f in cfg.served_flows() {
        tracing::info!(
            flow = %f.id,
            replicate = f.replication,
            source = %describe_security(&f.clients.source_consumer),
            target = %describe_security(&f.clients.target_producer),
            "flow configured"
        );
    }
}

fn legacy_cmd(cmd: LegacyCmd) -> anyhow::Result<ExitCode> {
    let consumer = Properties::load(&cmd.consumer_config).context("--consumer.config")?;
    let producer = Properties::load(&cmd.producer_config).context("--producer.config")?;
    let args = legacy::LegacyArgs {
        include: cmd.include,
        whitelist: cmd.whitelist,
        num_streams: cmd.num_streams,
        offset_commit_interval_ms: cmd.offset_commit_interval_ms,
        abort_on_send_failure: cmd.abort_on_send_failure,
        message_handler: cmd.message_handler,
        message_handler_args: cmd.message_handler_args,
        rebalance_listener: cmd.consumer_rebalance_listener,
        rebalance_listener_args: cmd.rebalance_listener_args,
        create_topics: cmd.create_topics,
        loop_prevention: cmd.loop_prevention,
        rate_limit: cmd.rate_limit,
        transforms: cmd
            .transforms
            .as_ref()
            .map(|p| Properties::load(p))
            .transpose()
            .context("--transforms")?,
    };
    let metrics_address = parse_metrics_address(cmd.metrics_address.as_deref())?;
    let cfg = legacy::load(&consumer, &producer, &args, &SystemEnvironment)?;
    if cmd.check && (cfg.diagnostics.warnings().next().is_some() || !cfg.ignored.is_empty()) {
        eprintln!(
            "legacy --check: {} warning(s), {} ignored key(s)",
            cfg.diagnostics.warnings().count(),
            cfg.ignored.len()
        );
        for i in &cfg.ignored {
            eprintln!("  ignored {}: {}", i.origin, i.reason);
        }
        return Ok(ExitCode::from(EXIT_CHECK));
    }
    if cmd.check && !cmd.plan {
        return Ok(ExitCode::SUCCESS);
    }
    if cmd.plan {
        match cmd.format {
            Format::Json => println!("{}", serde_json::to_string_pretty(&cfg)?),
            Format::Text => print!("{}", kmirror_mirror::legacy::plan::text(&cfg)),
        }
        return Ok(ExitCode::SUCCESS);
    }
    for w in cfg.diagnostics.warnings() {
        tracing::warn!("{w}");
    }
    for i in &cfg.ignored {
        tracing::info!(key = %i.origin.key, "ignored: {}: {}", i.origin, i.reason);
    }
    tracing::info!(
        source = %describe_security(&cfg.consumer),
        target = %describe_security(&cfg.producer),
        group = %cfg.group_id,
        "MM1 mode configured"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(run_legacy(cfg, metrics_address));
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    result?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mm1_mode_waits_past_the_producers_request_timeout_before_giving_up_its_final_commit() {
        let s = std::time::Duration::from_secs;
        assert_eq!(legacy_shutdown_timeout(s(5)), s(25));
        assert_eq!(legacy_shutdown_timeout(s(20)), s(25));
        // Java's default request.timeout.ms.
        assert_eq!(legacy_shutdown_timeout(s(30)), s(35));
        assert_eq!(legacy_shutdown_timeout(s(120)), s(125));
    }

    #[test]
    fn metrics_address_forms() {
        assert_eq!(
            parse_metrics_address(None).unwrap(),
            MetricsAddress::Default
        );
        assert_eq!(
            parse_metrics_address(Some("off")).unwrap(),
            MetricsAddress::Off
        );
        assert_eq!(
            parse_metrics_address(Some("127.0.0.1:0")).unwrap(),
            MetricsAddress::Given("127.0.0.1:0".parse().unwrap())
        );
        let e = parse_metrics_address(Some("localhost:9464")).unwrap_err();
        assert!(e.to_string().contains("'localhost:9464'"), "{e}");
    }

    /// A second process on a host: the default port is taken, so it serves elsewhere; an
    /// address the user gave is theirs to fix.
    #[tokio::test]
    async fn a_busy_default_port_falls_back_and_a_given_one_fails() {
        let holder = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let busy = holder.local_addr().unwrap();
        let other = bind_metrics(MetricsAddress::Default, busy)
            .await
            .unwrap()
            .expect("a listener");
        let got = other.local_addr().unwrap();
        assert_ne!(got.port(), busy.port());
        assert_eq!(got.ip(), busy.ip());
        let e = bind_metrics(MetricsAddress::Given(busy), busy)
            .await
            .unwrap_err();
        assert!(format!("{e:#}").contains("cannot listen"), "{e:#}");
        assert!(bind_metrics(MetricsAddress::Off, busy)
            .await
            .unwrap()
            .is_none());
    }
}
