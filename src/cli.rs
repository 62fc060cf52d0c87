//! Command line (docs/design.md "Command line"): `run`, `crds`, `version`, `status`,
//! `journal …`, `replace`.
//!
//! The binary installed as `kubectl-celld` serves the same commands (`kubectl celld …`).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Kubernetes operator for fleets of the celld runtime.
#[derive(Parser, Debug)]
#[command(
    name = "celld-operator",
    version,
    about,
    disable_help_subcommand = true
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the controller.
    Run(Box<RunArgs>),
    /// Print both CRDs as multi-document YAML.
    Crds,
    /// Print the version, commit and served API version.
    Version,
    /// Print the reference of every condition type and reason the operator sets, as
    /// Markdown (docs/conditions.md is this output).
    Conditions,
    /// Read, verify and export operation journals; send commands.
    #[command(subcommand)]
    Journal(JournalCommand),
    /// One screen about one fleet: replicas, every member (node, IP, readiness, restarts,
    /// last exit code, claim, runtime generation), the open and recent operations, the
    /// conditions that need attention and the journal's size.
    Status {
        /// The fleet, as `NAMESPACE/NAME`.
        #[arg(value_name = "NS/FLEET", value_parser = parse_target)]
        target: (String, String),
        /// `text` for people, `json` for scripts (every condition, full timestamps).
        #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
        output: StatusFormat,
        /// The installation's `--journal-annotation-bytes`, to show the journal against it.
        #[arg(long, default_value_t = 65536)]
        journal_budget: u32,
        /// Do not ask the members' `/state` for their runtime generation (it dials each
        /// member's Pod IP, which works from inside the cluster network only).
        #[arg(long)]
        no_state: bool,
    },
    /// Ask for one member to be replaced on a fresh disk: sets
    /// `celld.eric.dev/replace-member` to the member's current Pod UID.
    Replace {
        /// The fleet, as `NAMESPACE/NAME`.
        #[arg(value_name = "NS/FLEET", value_parser = parse_target)]
        target: (String, String),
        /// The member's Pod name (e.g. `beta-1`).
        member: String,
    },
}

/// Log output format.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable lines.
    Plain,
}

/// Flags of `run`.
#[derive(Args, Debug, Clone)]
#[command(arg_required_else_help = false)]
pub struct RunArgs {
    /// Lease namespace; operator Pods there are admitted by each fleet's NetworkPolicy.
    #[arg(long, default_value = "celld-system")]
    pub operator_namespace: String,
    /// Name of the leader Lease in the operator namespace. `namespace/name` names the
    /// installation: replicas sharing it elect one writer; another Lease is another
    /// installation (`ForeignOperator`).
    #[arg(long, default_value = crate::leader::DEFAULT_LEASE_NAME)]
    pub lease_name: String,
    /// The administrator attests the CNI enforces NetworkPolicy; without it nothing is provisioned.
    #[arg(long)]
    pub network_policy_enforced: bool,
    /// Metrics address (`0` = off), e.g. `:8084`.
    #[arg(long, default_value = "0")]
    pub metrics_bind_address: String,
    /// Health address for `/livez` and `/readyz`.
    #[arg(long, default_value = ":8082")]
    pub health_bind_address: String,
    /// How long a member may stay down before it is replaced (at least 1m).
    #[arg(long, default_value = "10m", value_parser = parse_replacement_delay)]
    pub member_replacement_delay: Duration,
    /// Disposable test clusters: test StorageClass provisioner, test-store environment, failpoints.
    #[arg(long)]
    pub local_test: bool,
    /// Local journal mirror (sled).
    #[arg(long, default_value = "/var/lib/celld-operator/journal")]
    pub journal_dir: PathBuf,
    /// Byte budget of the journal annotation (hard maximum 131072).
    #[arg(long, default_value_t = 65536, value_parser = clap::value_parser!(u32).range(32_768..=131_072))]
    pub journal_annotation_bytes: u32,
    /// Mirror entries kept per fleet.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub journal_retention: u64,
    /// Bound of the mirror's page cache in bytes (1 MiB..=1 GiB): sled keeps recently read and
    /// written pages in memory up to this size (docs/operations.md "Sizing the journal mirror").
    #[arg(long, default_value_t = journal::DEFAULT_CACHE_BYTES,
          value_parser = clap::value_parser!(u64).range(1_048_576..=1_073_741_824))]
    pub journal_cache_bytes: u64,
    /// Each fleet's newest mirror entries held in sled; older ones are archived in files
    /// (docs/journal.md "The mirror on disk"). Hidden: tests set a small window to see the
    /// archive at work after a few operations.
    #[arg(long, hide = true, default_value_t = journal::DEFAULT_LIVE_ENTRIES,
          value_parser = clap::value_parser!(u64).range(4..=1_000_000))]
    pub journal_live_entries: u64,
    /// `NAME[:N][:stop]`: exit with code 3 (or stop with SIGSTOP) the (N-th) time NAME is
    /// reached (needs --local-test).
    #[arg(long, value_parser = parse_fault_point)]
    pub fault_point: Option<FaultPoint>,
    /// Test clusters only: the time an operation gets before it is canceled (before issue) or
    /// turns Stalled (after issue), instead of 30 minutes (+5 per member when coordinated).
    #[arg(long, hide = true, value_parser = parse_duration)]
    pub operation_deadline: Option<Duration>,
    /// Test clusters only: replaces --member-replacement-delay (no minimum).
    #[arg(long, hide = true, value_parser = parse_duration)]
    pub test_replacement_delay: Option<Duration>,
    /// Test clusters only: how long past its deletion deadline a stuck member is
    /// force-deleted, instead of 2 minutes.
    #[arg(long, hide = true, value_parser = parse_duration)]
    pub test_termination_margin: Option<Duration>,
    /// Test clusters only: how long every other member must have been Ready before one is
    /// replaced, instead of 5 minutes.
    #[arg(long, hide = true, value_parser = parse_duration)]
    pub test_absorb_window: Option<Duration>,
    /// Test clusters only: how much older than its Pod a claim must be to count as an old
    /// disk, instead of 1 minute.
    #[arg(long, hide = true, value_parser = parse_duration)]
    pub test_claim_age: Option<Duration>,
    /// Test clusters only: `KIND@N[:VERB[:RESOURCE[:NAMESPACE]]]`, inject one API fault
    /// (timeout-before, lost-response, conflict, throttle, unavailable, reset; `none` only
    /// counts) into the N-th request matching the filter (src/transport.rs).
    #[arg(long, hide = true, value_parser = crate::transport::FaultSpec::parse)]
    pub test_api_fault: Option<crate::transport::FaultSpec>,
    /// Test clusters only: send writes without the transport's Lease check (the stale-leader
    /// drill shows the API server refusing a deposed leader's write by its precondition).
    #[arg(long, hide = true)]
    pub test_skip_lease_guard: bool,
    /// Test clusters only: no cached pass; every reconcile reads the fleet and its objects
    /// fresh from the API server (the design before the watch-fed caches, kept so a benchmark
    /// can measure both in one run).
    #[arg(long, hide = true)]
    pub test_fresh_reads: bool,
    /// Test clusters only: a fresh pass sends its planning reads one after another, as before
    /// they were sent at once (`reconcile::prefetch`; the bench compares both side by side).
    #[arg(long, hide = true)]
    pub test_no_prefetch: bool,
    /// Test clusters only: every write of a fresh pass forgets everything the pass read
    /// (a journal append included), and its status reads the workload and Pods again, as
    /// before a write forgot only what was read of its own kind (`crate::pass_reads`; the
    /// bench compares both side by side).
    #[arg(long, hide = true)]
    pub test_forget_all_on_write: bool,
    /// Test clusters only: a cached pass decides nothing itself; any operation it finds to
    /// decide or carry out is left to a fresh pass, as before cache-planned operations
    /// (`crate::pass::planning_client`; the bench compares both side by side).
    #[arg(long, hide = true)]
    pub test_no_cache_planning: bool,
    /// Test clusters only: kube-runtime's controller bounds the reconciles itself
    /// (`--reconcile-concurrency`), starting those that wait for a slot in hash order, as
    /// before the slots were served in order (`crate::slots`; the bench compares both side by
    /// side).
    #[arg(long, hide = true)]
    pub test_kube_slots: bool,
    /// Test clusters only: objects per page of a cluster-wide watch's list instead of
    /// `watches::CLUSTER_LIST_PAGE` (the bench compares page sizes side by side).
    #[arg(long, hide = true, value_parser = clap::value_parser!(u32).range(1..=5000))]
    pub test_cluster_list_page: Option<u32>,
    /// Test clusters only: the caches' watches use kube-runtime's `watcher` (an 8 KiB line
    /// buffer kept by every stream) instead of `watch_stream::watch` (the bench compares both
    /// side by side).
    #[arg(long, hide = true)]
    pub test_kube_watcher: bool,
    /// Fleet namespaces whose watches share one HTTP/2 connection to the API server (9 watches
    /// per namespace). 0: every watch has its own HTTP/1.1 connection, as kube's client does
    /// (for an API server or proxy without HTTP/2). HTTP/2 is used only for a direct `https`
    /// cluster URL (no proxy, no TLS server-name override).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(0..=100))]
    pub watch_namespaces_per_connection: u16,
    /// Where the watches of the fleets' Pods, claims, workloads, Services, NetworkPolicies and
    /// PDBs look. `namespace`: 9 watches in each fleet namespace (the fleet Role of each
    /// namespace is enough). `cluster`: one label-selected watch per kind across the cluster
    /// plus one ServiceAccount watch per fleet namespace, which takes far less memory and
    /// start-up time with many fleet namespaces, but needs cluster-wide get/list/watch of
    /// those kinds (chart value `watchScope: cluster`). With `--watch-namespaces`, objects
    /// of other namespaces are dropped as they arrive.
    #[arg(long, value_enum, default_value = "namespace")]
    pub watch_scope: crate::watches::WatchScope,
    /// A status change that is progress only (member counts, condition messages) is written
    /// at most once per this interval per fleet, and at the latest when it ends; every other
    /// change is written at once. 0s..10s; 0s writes every change at once.
    #[arg(long, default_value = "1s", value_parser = parse_status_progress_interval)]
    pub status_progress_interval: Duration,
    /// Fleets reconciled at the same time (each fleet is reconciled by one task at a time);
    /// reconciles waiting for a slot are served in the order their triggers fell due.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub reconcile_concurrency: u16,
    /// glibc malloc arenas (`mallopt(M_ARENA_MAX)`), set before any thread starts; 0 keeps
    /// glibc's default (8 per CPU). Ignored when `MALLOC_ARENA_MAX` is in the environment
    /// (glibc has applied it) and on builds not linked against glibc.
    #[arg(long, default_value_t = DEFAULT_MALLOC_ARENAS, value_parser = clap::value_parser!(u16).range(0..=256))]
    pub malloc_arenas: u16,
    /// Log format.
    #[arg(long, value_enum, default_value = "json")]
    pub log_format: LogFormat,
    /// Comma-separated namespaces whose fleets this installation lists, watches and reconciles
    /// (default: all); fleets elsewhere are untouched. The chart sets it from fleetNamespaces.
    #[arg(long, value_delimiter = ',', value_name = "NS,...")]
    pub watch_namespaces: Vec<String>,
    /// How recent a record of another operator installation (another Lease) in a fleet's
    /// journal or `celld.eric.dev/operators` annotation must be to stop this one issuing for
    /// that fleet (`ForeignOperator`); at least 30s.
    #[arg(long, default_value = "10m", value_parser = parse_foreign_window)]
    pub foreign_operator_window: Duration,
}

/// `--malloc-arenas` default (docs/operations.md "Caches, requests at rest and reaction time").
pub const DEFAULT_MALLOC_ARENAS: u16 = 0;

/// The failpoints (docs/design.md "Failpoints").
pub const FAULT_POINTS: [&str; 7] = [
    "before-intent",
    "after-intent",
    "before-effect",
    "after-effect",
    "before-claim-delete",
    "after-claim-delete",
    "before-complete",
];

/// A parsed `--fault-point`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultPoint {
    /// Boundary name.
    pub name: String,
    /// Fire on the N-th time the boundary is reached (1-based).
    pub nth: u32,
    /// `NAME:N:stop`: the process stops itself (SIGSTOP) instead of exiting, as a leader
    /// frozen past its Lease (a GC pause, a frozen VM); SIGCONT resumes it there.
    pub stop: bool,
}

fn parse_fault_point(s: &str) -> Result<FaultPoint, String> {
    let (s, stop) = match s.strip_suffix(":stop") {
        Some(rest) => (rest, true),
        None => (s, false),
    };
    let (name, nth) = match s.split_once(':') {
        Some((n, k)) => (
            n,
            k.parse::<u32>()
                .map_err(|_| format!("{k:?} is not a positive count"))?,
        ),
        None => (s, 1),
    };
    if nth == 0 {
        return Err("the count is 1-based".into());
    }
    if !FAULT_POINTS.contains(&name) {
        return Err(format!(
            "unknown failpoint {name:?}; known: {}",
            FAULT_POINTS.join(", ")
        ));
    }
    Ok(FaultPoint {
        name: name.to_string(),
        nth,
        stop,
    })
}

/// Parses `10m`, `1h`, `1h30m`, `90s` (Go-style, h/m/s) and requires at least one minute.
pub fn parse_replacement_delay(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_secs(60) {
        return Err(format!("{s} is below the minimum of 1m"));
    }
    Ok(d)
}

fn parse_status_progress_interval(s: &str) -> Result<Duration, String> {
    let d = if s == "0" {
        Duration::ZERO
    } else {
        parse_duration(s)?
    };
    if d > Duration::from_secs(10) {
        return Err(format!("{s} is above the maximum of 10s"));
    }
    Ok(d)
}

fn parse_foreign_window(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_secs(30) {
        return Err(format!("{s} is below the minimum of 30s"));
    }
    Ok(d)
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    if s.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = 0u64;
    let mut number = String::new();
    for c in s.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit = match c {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return Err(format!("{s:?}: unknown unit {c:?} (use h, m or s)")),
        };
        let n: u64 = number
            .parse()
            .map_err(|_| format!("{s:?} is not a duration like 10m or 1h30m"))?;
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or("duration too large")?;
        number.clear();
    }
    if !number.is_empty() {
        return Err(format!("{s:?} lacks a unit (h, m or s)"));
    }
    Ok(Duration::from_secs(total))
}

impl RunArgs {
    /// The self-healing timings these flags give.
    pub fn healing(&self) -> crate::reconcile::heal::Timings {
        let d = crate::reconcile::heal::Timings::default();
        crate::reconcile::heal::Timings {
            replacement_delay: self
                .test_replacement_delay
                .unwrap_or(self.member_replacement_delay),
            termination_margin: self.test_termination_margin.unwrap_or(d.termination_margin),
            absorb_window: self.test_absorb_window.unwrap_or(d.absorb_window),
            claim_age: self.test_claim_age.unwrap_or(d.claim_age),
        }
    }

    /// Cross-flag rules that clap cannot express.
    pub fn check(&self) -> Result<(), String> {
        if self.fault_point.is_some() && !self.local_test {
            return Err("--fault-point needs --local-test".into());
        }
        if self.operation_deadline.is_some() && !self.local_test {
            return Err("--operation-deadline needs --local-test".into());
        }
        for (set, flag) in [
            (
                self.test_replacement_delay.is_some(),
                "--test-replacement-delay",
            ),
            (
                self.test_termination_margin.is_some(),
                "--test-termination-margin",
            ),
            (self.test_absorb_window.is_some(), "--test-absorb-window"),
            (self.test_claim_age.is_some(), "--test-claim-age"),
            (self.test_api_fault.is_some(), "--test-api-fault"),
            (self.test_skip_lease_guard, "--test-skip-lease-guard"),
            (self.test_fresh_reads, "--test-fresh-reads"),
            (self.test_no_prefetch, "--test-no-prefetch"),
            (self.test_forget_all_on_write, "--test-forget-all-on-write"),
            (self.test_no_cache_planning, "--test-no-cache-planning"),
            (self.test_kube_slots, "--test-kube-slots"),
            (
                self.test_cluster_list_page.is_some(),
                "--test-cluster-list-page",
            ),
            (self.test_kube_watcher, "--test-kube-watcher"),
        ] {
            if set && !self.local_test {
                return Err(format!("{flag} needs --local-test"));
            }
        }
        for ns in &self.watch_namespaces {
            let label = !ns.is_empty()
                && ns.len() <= 63
                && ns
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !ns.starts_with('-')
                && !ns.ends_with('-');
            if !label {
                return Err(format!(
                    "--watch-namespaces: {ns:?} is not a namespace name (lowercase letters, digits and '-', at most 63)"
                ));
            }
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = self.watch_namespaces.iter().find(|ns| !seen.insert(*ns)) {
            return Err(format!("--watch-namespaces names {dup} twice"));
        }
        Ok(())
    }
}

/// Output format of `status`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusFormat {
    /// One screen for people.
    Text,
    /// One JSON object.
    Json,
}

/// Output format of `journal show`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShowFormat {
    /// Aligned text, times to the second.
    Table,
    /// JSON Lines, one operation a line, full-precision times.
    Jsonl,
    /// One JSON array of operations, full-precision times.
    Json,
    /// YAML, the same fields as `json`.
    Yaml,
}

/// `--since`: an RFC 3339 instant, or a duration back from now (`90s`, `15m`, `2h`).
pub fn parse_since(s: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&chrono::Utc));
    }
    let back = parse_duration(s).map_err(|e| {
        format!("{e}; --since takes an RFC 3339 time (2026-12-03T15:04:05Z) or a duration (15m)")
    })?;
    let back = chrono::Duration::from_std(back).map_err(|e| e.to_string())?;
    Ok(chrono::Utc::now() - back)
}

/// Which copy of a journal to read.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The fleet's annotation on the cluster (the authority).
    Cluster,
    /// The local sled mirror at `--journal-dir`.
    Mirror,
    /// Both, compared (verify reports disagreements).
    Both,
}

/// Where `journal` reads from.
#[derive(Args, Debug, Clone)]
pub struct JournalSource {
    /// The fleet, as `NAMESPACE/NAME` (cluster source).
    #[arg(value_name = "NS/FLEET")]
    pub target: Option<String>,
    /// Which copy to read.
    #[arg(long, value_enum, default_value = "cluster")]
    pub source: Source,
    /// The local mirror (sled) for `--source mirror|both`.
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/celld-operator/journal"
    )]
    pub journal_dir: PathBuf,
    /// Shorthand for `--source mirror --journal-dir DIR`.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["source", "journal_dir"])]
    pub mirror: Option<PathBuf>,
    /// Only this fleet UID (mirror source without NS/FLEET).
    #[arg(long, value_name = "UID")]
    pub fleet: Option<String>,
}

impl JournalSource {
    /// The effective source and mirror directory.
    pub fn resolved(&self) -> (Source, PathBuf) {
        match &self.mirror {
            Some(dir) => (Source::Mirror, dir.clone()),
            None => (self.source, self.journal_dir.clone()),
        }
    }
}

/// Parses `NAMESPACE/NAME`.
pub fn parse_target(s: &str) -> Result<(String, String), String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => Err(format!("{s:?} is not NAMESPACE/FLEET")),
    }
}

/// `journal` subcommands.
#[derive(Subcommand, Debug)]
pub enum JournalCommand {
    /// Operations and their transitions.
    Show {
        /// Where to read.
        #[command(flatten)]
        source: JournalSource,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value = "table")]
        format: ShowFormat,
        /// Only this operation (a full id, or a prefix of one).
        #[arg(long, value_name = "ID")]
        operation: Option<String>,
        /// Only operations with an entry at or after this time (RFC 3339, or a duration
        /// back from now: `15m`, `2h`).
        #[arg(long, value_name = "TIME", value_parser = parse_since)]
        since: Option<chrono::DateTime<chrono::Utc>>,
    },
    /// Recompute the hash chain and check the transitions; exit 1 on a broken journal.
    Verify {
        /// Where to read.
        #[command(flatten)]
        source: JournalSource,
    },
    /// Every entry as JSON Lines.
    Export {
        /// Where to read.
        #[command(flatten)]
        source: JournalSource,
        /// Output format (only `jsonl`).
        #[arg(long, default_value = "jsonl", value_parser = ["jsonl"])]
        format: String,
    },
    /// Stop driving a blocked or stalled operation (sets `celld.eric.dev/journal-command`).
    Abandon {
        /// The fleet, as `NAMESPACE/NAME`.
        #[arg(value_name = "NS/FLEET", value_parser = parse_target)]
        target: (String, String),
        /// The operation id.
        op: String,
    },
    /// Run a blocked operation's step again (sets `celld.eric.dev/journal-command`).
    Retry {
        /// The fleet, as `NAMESPACE/NAME`.
        #[arg(value_name = "NS/FLEET", value_parser = parse_target)]
        target: (String, String),
        /// The operation id.
        op: String,
    },
    /// Write a verified chain back to a damaged, missing or rolled-back journal annotation.
    Restore {
        /// The fleet, as `NAMESPACE/NAME`.
        #[arg(value_name = "NS/FLEET", value_parser = parse_target)]
        target: (String, String),
        /// Ask the running operator to restore from its local mirror
        /// (sets `celld.eric.dev/journal-command: restore-from-mirror`).
        #[arg(
            long,
            conflicts_with = "from_file",
            required_unless_present = "from_file"
        )]
        from_mirror: bool,
        /// Restore from an export (`journal export` JSON Lines) of this fleet.
        #[arg(long, value_name = "EXPORT")]
        from_file: Option<PathBuf>,
        /// Byte budget the restored annotation is compacted to (the operator's
        /// `--journal-annotation-bytes`).
        #[arg(long, default_value_t = 65536, value_parser = clap::value_parser!(u32).range(32_768..=131_072))]
        journal_annotation_bytes: u32,
    },
    /// Start a new, empty journal for a fleet whose annotation is damaged or gone; the
    /// operator's mirror keeps the old entries aside (sets `celld.eric.dev/journal-command`).
    Reset {
        /// The fleet, as `NAMESPACE/NAME`.
        #[arg(value_name = "NS/FLEET", value_parser = parse_target)]
        target: (String, String),
        /// Why (recorded in the Event, the log and the mirror).
        #[arg(long)]
        reason: String,
    },
    /// After an `EffectMarkerMismatch`: take the workload's live spec as the starting point by
    /// setting its effect marker to the journal's last effect (compare-and-swap).
    Adopt {
        /// The fleet, as `NAMESPACE/NAME`.
        #[arg(value_name = "NS/FLEET", value_parser = parse_target)]
        target: (String, String),
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("celld-operator").chain(args.iter().copied()))
    }

    #[test]
    fn replacement_delay_below_one_minute_is_a_startup_error() {
        assert!(parse(&["run", "--member-replacement-delay=30s"]).is_err());
        assert!(parse(&["run", "--member-replacement-delay=59s"]).is_err());
        let Command::Run(run) = parse(&["run", "--member-replacement-delay=1h30m"])
            .unwrap()
            .command
        else {
            panic!("expected run")
        };
        assert_eq!(run.member_replacement_delay, Duration::from_secs(5400));
    }

    /// The `run` arguments `args` parse to, or clap's message.
    fn run_args(args: &[&str]) -> Result<RunArgs, String> {
        match parse(args).map(|c| c.command) {
            Ok(Command::Run(run)) => Ok(*run),
            Ok(_) => panic!("expected run"),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn journal_cache_defaults_to_8_mib_and_is_bounded() {
        let cache = |args: &[&str]| run_args(args).map(|run| run.journal_cache_bytes);
        assert_eq!(cache(&["run"]), Ok(8 * 1024 * 1024));
        assert_eq!(
            cache(&["run", "--journal-cache-bytes=1048576"]),
            Ok(1 << 20)
        );
        assert_eq!(
            cache(&["run", "--journal-cache-bytes=1073741824"]),
            Ok(1 << 30)
        );
        let err = cache(&["run", "--journal-cache-bytes=1048575"]).unwrap_err();
        assert!(
            err.contains("--journal-cache-bytes") && err.contains("1048576..=1073741824"),
            "{err}"
        );
        assert!(cache(&["run", "--journal-cache-bytes=8MiB"]).is_err());
    }

    #[test]
    fn malloc_arenas_default_to_glibcs_and_are_bounded() {
        let arenas = |args: &[&str]| run_args(args).map(|run| run.malloc_arenas);
        assert_eq!(arenas(&["run"]), Ok(0));
        assert_eq!(arenas(&["run", "--malloc-arenas=1"]), Ok(1));
        assert_eq!(arenas(&["run", "--malloc-arenas", "256"]), Ok(256));
        let err = arenas(&["run", "--malloc-arenas=257"]).unwrap_err();
        assert!(
            err.contains("--malloc-arenas") && err.contains("0..=256"),
            "{err}"
        );
        assert!(arenas(&["run", "--malloc-arenas=-1"]).is_err());
        assert!(arenas(&["run", "--malloc-arenas=two"]).is_err());
    }

    #[test]
    fn healing_knobs_need_local_test() {
        for flag in [
            "--test-replacement-delay=5s",
            "--test-termination-margin=3s",
            "--test-absorb-window=2s",
            "--test-claim-age=1s",
        ] {
            let Command::Run(run) = parse(&["run", flag]).unwrap().command else {
                panic!("expected run")
            };
            let err = run.check().unwrap_err();
            assert!(err.contains("needs --local-test"), "{flag}: {err}");
            let Command::Run(run) = parse(&["run", "--local-test", flag]).unwrap().command else {
                panic!("expected run")
            };
            assert!(run.check().is_ok(), "{flag}");
        }
        let Command::Run(run) = parse(&[
            "run",
            "--local-test",
            "--test-replacement-delay=5s",
            "--test-absorb-window=2s",
        ])
        .unwrap()
        .command
        else {
            panic!("expected run")
        };
        let h = run.healing();
        assert_eq!(h.replacement_delay, Duration::from_secs(5));
        assert_eq!(h.absorb_window, Duration::from_secs(2));
        assert_eq!(h.termination_margin, Duration::from_secs(120));
        let Command::Run(run) = parse(&["run"]).unwrap().command else {
            panic!("expected run")
        };
        assert_eq!(run.healing().replacement_delay, Duration::from_secs(600));
    }

    #[test]
    fn fault_points_are_named_and_need_local_test() {
        let Command::Run(run) = parse(&["run", "--fault-point=after-effect:2"])
            .unwrap()
            .command
        else {
            panic!("expected run")
        };
        assert_eq!(
            run.fault_point,
            Some(FaultPoint {
                name: "after-effect".into(),
                nth: 2,
                stop: false,
            })
        );
        let Command::Run(run) = parse(&["run", "--fault-point=before-effect:1:stop"])
            .unwrap()
            .command
        else {
            panic!("expected run")
        };
        assert_eq!(
            run.fault_point,
            Some(FaultPoint {
                name: "before-effect".into(),
                nth: 1,
                stop: true,
            })
        );
        assert!(
            run.check().is_err(),
            "a failpoint without --local-test is refused"
        );
        assert!(parse(&["run", "--fault-point=nowhere"]).is_err());
        let Command::Run(run) = parse(&["run", "--operation-deadline=20s"]).unwrap().command else {
            panic!("expected run")
        };
        assert_eq!(run.operation_deadline, Some(Duration::from_secs(20)));
        assert!(
            run.check().is_err(),
            "a shortened deadline without --local-test is refused"
        );
        assert!(parse(&["run", "--fault-point=before-intent:0"]).is_err());
    }

    #[test]
    fn watch_namespaces_are_a_list_of_namespace_names() {
        let Command::Run(run) = parse(&["run", "--watch-namespaces=fleets-a,fleets-b"])
            .unwrap()
            .command
        else {
            panic!("expected run")
        };
        assert_eq!(run.watch_namespaces, ["fleets-a", "fleets-b"]);
        run.check().unwrap();
        let Command::Run(all) = parse(&["run"]).unwrap().command else {
            panic!("expected run")
        };
        assert!(all.watch_namespaces.is_empty(), "default: every namespace");
        for bad in ["Fleets", "a,,b", "-x", "a,a"] {
            let Command::Run(run) = parse(&["run", &format!("--watch-namespaces={bad}")])
                .unwrap()
                .command
            else {
                panic!("expected run")
            };
            assert!(run.check().is_err(), "{bad} is refused");
        }
    }

    #[test]
    fn status_progress_interval_defaults_to_one_second_and_is_bounded() {
        let interval = |args: &[&str]| run_args(args).map(|run| run.status_progress_interval);
        assert_eq!(interval(&["run"]), Ok(Duration::from_secs(1)));
        assert_eq!(
            interval(&["run", "--status-progress-interval=0"]),
            Ok(Duration::ZERO)
        );
        assert_eq!(
            interval(&["run", "--status-progress-interval=0s"]),
            Ok(Duration::ZERO)
        );
        assert_eq!(
            interval(&["run", "--status-progress-interval=10s"]),
            Ok(Duration::from_secs(10))
        );
        let err = interval(&["run", "--status-progress-interval=11s"]).unwrap_err();
        assert!(err.contains("maximum of 10s"), "{err}");
        assert!(interval(&["run", "--status-progress-interval=500ms"]).is_err());
    }

    #[test]
    fn watch_scope_defaults_to_namespace() {
        let Command::Run(run) = parse(&["run"]).unwrap().command else {
            panic!("expected run")
        };
        assert_eq!(run.watch_scope, crate::watches::WatchScope::Namespace);
        let Command::Run(run) = parse(&["run", "--watch-scope=cluster", "--watch-namespaces=a,b"])
            .unwrap()
            .command
        else {
            panic!("expected run")
        };
        assert_eq!(run.watch_scope, crate::watches::WatchScope::Cluster);
        run.check().unwrap();
        assert!(parse(&["run", "--watch-scope=everywhere"]).is_err());
    }

    #[test]
    fn stray_arguments_and_oversized_budgets_are_usage_errors() {
        assert!(parse(&["run", "extra"]).is_err());
        assert!(parse(&["run", "--journal-annotation-bytes=200000"]).is_err());
        assert!(parse(&["journal", "export", "--format=csv"]).is_err());
        assert!(
            parse(&["journal", "abandon", "fleets", "op"]).is_err(),
            "NS/FLEET is required"
        );
        assert!(parse(&["journal", "show", "--mirror", "/tmp/x", "--source", "cluster"]).is_err());
    }

    /// The Helm chart renders these flags; the binary must accept every one of them.
    #[test]
    fn the_charts_rendered_arguments_parse() {
        let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        for snapshot in ["values-default.yaml", "values-full.yaml"] {
            let text =
                std::fs::read_to_string(repo.join("helm/tests/snapshots").join(snapshot)).unwrap();
            let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&text)
                .map(|d| serde::Deserialize::deserialize(d).unwrap())
                .collect();
            let operator = docs
                .iter()
                .find(|d| d["kind"] == "Deployment" || d["kind"] == "StatefulSet")
                .expect("the chart renders the operator workload");
            let args: Vec<String> = serde_yaml::from_value(
                operator["spec"]["template"]["spec"]["containers"][0]["args"].clone(),
            )
            .unwrap();
            let cli = Cli::try_parse_from(
                std::iter::once("celld-operator".to_string()).chain(args.clone()),
            )
            .unwrap_or_else(|e| panic!("{snapshot}: chart args {args:?} rejected: {e}"));
            let Command::Run(run) = cli.command else {
                panic!("the chart runs `run`")
            };
            run.check().unwrap();
        }
    }
}

#[cfg(test)]
mod flag_docs {
    use clap::CommandFactory;

    /// Every flag of `run` a person may set is in docs/operations.md "Flags of `run`".
    #[test]
    fn every_visible_run_flag_is_documented() {
        let guide = include_str!("../docs/operations.md");
        let cli = super::Cli::command();
        let run = cli.find_subcommand("run").expect("run");
        let missing: Vec<String> = run
            .get_arguments()
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| a.get_long())
            .filter(|l| *l != "help")
            .map(|l| format!("--{l}"))
            .filter(|flag| !guide.contains(&format!("| `{flag}` |")))
            .collect();
        assert!(
            missing.is_empty(),
            "flags missing from docs/operations.md: {missing:?}"
        );
    }
}
