//! Command-line definition.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// kmirror: replicate Kafka topics, configs, ACLs and consumer-group offsets between clusters,
/// reading MirrorMaker 2 and MirrorMaker 1 configurations unchanged.
#[derive(Debug, Parser)]
#[command(
    name = "kmirror",
    version,
    about,
    after_help = "Exit codes: 0 success, 1 runtime failure, 2 bad command line, 3 invalid configuration, 4 plan --check found warnings or ignored keys, 5 verify found differences, 6 verify found data still in flight (and no difference), 7 offsets apply --skip-active left out groups with members on the target."
)]
pub(crate) struct Cli {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub(crate) log_format: LogFormat,
    /// Log filter in RUST_LOG syntax (e.g. `info`, `kmirror=debug`); default: $RUST_LOG or `info`.
    #[arg(long, global = true)]
    pub(crate) log_level: Option<String>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum Format {
    Text,
    Json,
}

/// How `verify` counts the records of a partition.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum CountArg {
    /// By offsets; a partition found short is counted record by record.
    Auto,
    /// By offsets only (transaction markers and compaction make a complete copy look short).
    Offsets,
    /// Every partition record by record, as a reader sees it (reads both logs).
    Records,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Explain a configuration offline: flows, filters, naming, internal topics, syncs, security.
    Plan {
        #[command(flatten)]
        config: ConfigArgs,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Exit with code 4 if there is any warning or ignored key.
        #[arg(long)]
        check: bool,
    },
    /// Replicate as MirrorMaker 2 dedicated mode does (connect-mirror-maker.sh).
    Run {
        #[command(flatten)]
        config: ConfigArgs,
        /// Serve Prometheus metrics and /status at http://ADDRESS ("off" to disable). Port 0
        /// picks a free port. Without this option: 127.0.0.1:9464, or a free port when another
        /// process has 9464 (the address taken is logged).
        #[arg(long, value_name = "ADDRESS")]
        metrics_address: Option<String>,
        /// After SIGTERM or SIGINT, drain in-flight writes and store positions for at most this
        /// long, then exit with status 1 (what was not stored is copied again after a restart).
        /// Keep it below the grace period of the process manager (Kubernetes: 30 s).
        #[arg(long, default_value_t = 25, value_name = "SECONDS")]
        shutdown_timeout: u64,
    },
    /// Compare source and target of each flow: topics, partition counts, record counts, newest
    /// timestamps, configs, ACLs, consumer-group translations. Exit 0 when everything matches,
    /// 5 when something differs, 6 when nothing differs but data is still in flight.
    Verify {
        #[command(flatten)]
        config: ConfigArgs,
        /// Only this flow (e.g. A->B); default: every replicating flow this process serves.
        #[arg(long)]
        flow: Option<String>,
        /// Only source topics matching this Java regex (whole name; commas allowed).
        #[arg(long, value_name = "REGEX")]
        topics: Option<String>,
        /// Also compare the last N records of each partition byte for byte.
        #[arg(long, value_name = "N", default_value_t = 0)]
        deep: usize,
        /// How record counts are compared: by offsets, then record by record where the
        /// offsets find a partition short (auto); by offsets only; or record by record always.
        #[arg(long, value_enum, default_value_t = CountArg::Auto)]
        count: CountArg,
        /// Also print the rows that match.
        #[arg(long)]
        all: bool,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Progress of a running kmirror, from its /status endpoint: per flow the partitions
    /// replicating, records/s, MB/s, lag in records and seconds, time to catch up, errors.
    Status {
        /// The running process's --metrics-address.
        #[arg(long, default_value = "127.0.0.1:9464", value_name = "ADDRESS")]
        address: String,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Show it again every N seconds until interrupted: progress bars on a terminal, one
        /// line per flow and look otherwise.
        #[arg(long, value_name = "SECONDS")]
        watch: Option<u64>,
    },
    /// Replicate as MirrorMaker 1 did (kafka-mirror-maker.sh), with its flags.
    Legacy(LegacyCmd),
    /// Consumer-group failover: translated offsets on the target, from the checkpoints there.
    #[command(subcommand)]
    Offsets(OffsetsCmd),
}

#[derive(Debug, Subcommand)]
pub(crate) enum OffsetsCmd {
    /// Print groups' translated offsets on the target (as RemoteClusterUtils.translateOffsets).
    Translate(OffsetsArgs),
    /// Commit groups' translated offsets on the target; refused, for every group, while any of
    /// them has active members there; never rewinds an offset the target already holds past
    /// the translation.
    Apply {
        #[command(flatten)]
        args: OffsetsArgs,
        /// Show current and new offsets without committing.
        #[arg(long)]
        dry_run: bool,
        /// Commit every group without active members on the target and list the others
        /// (exit code 7 if any), instead of committing nothing when one group is active.
        #[arg(long)]
        skip_active: bool,
    },
}

#[derive(Debug, Args)]
pub(crate) struct OffsetsArgs {
    #[command(flatten)]
    pub(crate) config: ConfigArgs,
    /// The cluster the group consumed from (the flow's source alias).
    #[arg(long)]
    pub(crate) source: String,
    /// The cluster the group moves to (the flow's target alias).
    #[arg(long)]
    pub(crate) target: String,
    /// A group to move (repeat for more).
    #[arg(long, required_unless_present = "groups")]
    pub(crate) group: Vec<String>,
    /// Also every group with checkpoints whose id matches one of these patterns (MM2's `groups`
    /// syntax: comma-separated regular expressions matching whole ids, e.g. 'billing-.*,audit').
    #[arg(long, value_name = "PATTERNS")]
    pub(crate) groups: Option<String>,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub(crate) format: Format,
}

#[derive(Debug, Args)]
pub(crate) struct ConfigArgs {
    /// An MM2 dedicated-mode file (connect-mirror-maker.properties).
    pub(crate) config: Option<PathBuf>,
    /// Serve only the flows whose target is one of these aliases (MM2's --clusters).
    #[arg(long, num_args = 1..)]
    pub(crate) clusters: Vec<String>,
    /// An MM2 connector file (MirrorSourceConnector, MirrorCheckpointConnector,
    /// MirrorHeartbeatConnector) as used with connect-standalone; repeat for several.
    #[arg(long)]
    pub(crate) connector: Vec<PathBuf>,
    /// The Connect worker file that went with the connector files.
    #[arg(long, requires = "connector")]
    pub(crate) worker: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct LegacyCmd {
    /// Consumer properties for the source cluster.
    #[arg(long = "consumer.config")]
    pub(crate) consumer_config: PathBuf,
    /// Producer properties for the target cluster.
    #[arg(long = "producer.config")]
    pub(crate) producer_config: PathBuf,
    /// Topics to mirror (Java regex; commas allowed).
    #[arg(long)]
    pub(crate) include: Option<String>,
    /// Deprecated alias of --include.
    #[arg(long)]
    pub(crate) whitelist: Option<String>,
    #[arg(long = "num.streams")]
    pub(crate) num_streams: Option<String>,
    #[arg(long = "offset.commit.interval.ms")]
    pub(crate) offset_commit_interval_ms: Option<String>,
    #[arg(long = "abort.on.send.failure")]
    pub(crate) abort_on_send_failure: Option<String>,
    #[arg(long = "message.handler")]
    pub(crate) message_handler: Option<String>,
    #[arg(long = "message.handler.args")]
    pub(crate) message_handler_args: Option<String>,
    #[arg(long = "consumer.rebalance.listener")]
    pub(crate) consumer_rebalance_listener: Option<String>,
    #[arg(long = "rebalance.listener.args")]
    pub(crate) rebalance_listener_args: Option<String>,
    /// Create missing target topics with the source's partition count and configs (default
    /// true); false relies on the target's auto.create.topics.enable, as MM1 did.
    #[arg(long = "create.topics", value_name = "true|false")]
    pub(crate) create_topics: Option<String>,
    /// Leave out what kmirror copied into the source from the target, so two processes can
    /// copy both ways under the same topic names (kmirror's own, as
    /// kmirror.loop.prevention.enabled in MM2 mode; default false). Registers the producer ids
    /// this process writes with in the target's kmirror-producers.internal.
    #[arg(long = "loop.prevention", value_name = "true|false")]
    pub(crate) loop_prevention: Option<String>,
    /// Cap the bytes fetched per second by the whole process (kmirror's own, as
    /// kmirror.rate.limit.bytes.per.second in MM2 mode); 0 or absent: no limit.
    #[arg(long = "rate.limit.bytes.per.second", value_name = "BYTES")]
    pub(crate) rate_limit: Option<String>,
    /// Built-in record transforms in Kafka Connect's SMT syntax (Filter with predicates,
    /// DropHeaders, InsertHeader, RegexRouter): the replacement for --message.handler.
    #[arg(long, value_name = "FILE")]
    pub(crate) transforms: Option<PathBuf>,
    /// Serve Prometheus metrics and /status at http://ADDRESS ("off" to disable; port 0 picks
    /// one). Without it: 127.0.0.1:9464, or a free port when 9464 is taken (logged).
    #[arg(long, value_name = "ADDRESS")]
    pub(crate) metrics_address: Option<String>,
    /// Accepted and ignored, as in MM1.
    #[arg(long = "new.consumer")]
    pub(crate) new_consumer: bool,
    /// Print what the command line means and exit.
    #[arg(long)]
    pub(crate) plan: bool,
    /// Exit with code 4 if there is any warning or ignored key (with or without --plan).
    #[arg(long)]
    pub(crate) check: bool,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub(crate) format: Format,
}
