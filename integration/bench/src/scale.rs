//! Figure 3, the scale bed: PersistentFleets of `members` no-process members, grown in bounded
//! batches to each size (100 → 500 → 1,000 by default, never deleted in between). At every
//! size, each operator design (`cached`: the default binary; `fresh`: the same binary with
//! `--test-fresh-reads`) gets a fresh process and is measured the same way: start-up, at-rest
//! traffic over a window that holds a full resync, RSS and CPU, the reaction under load (a
//! fraction of the fleets scaling or restarting at the same time), and the same again with one
//! "hot" fleet whose upgrade never finishes (fairness).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use celld_operator::api::keys::JOURNAL_ANNOTATION;
use celld_operator::api::CelldFleet;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use serde::{Serialize, Serializer};
use serde_json::json;
use tokio::task::JoinHandle;

use crate::bed::{fleet, fleet_settled, progress, wait_fleet, Bed};
use crate::scrape::Delta;
use crate::stats::{summarize, Summary};
use crate::timeline::{request_to_write, settled_to_decrease, FleetTimelines, Mark};

/// Label on every scale-bed fleet (value: the run id); the bench's fleet watch selects on it.
pub const SCALE_LABEL: &str = "bench.celld.eric.dev/scale";

/// The image of the hot fleet's upgrade: unmapped, so the test kubelet answers `ErrImagePull`
/// for ever (integration/kubelet/src/images.rs) and the rollout never finishes.
pub fn hot_image() -> String {
    format!("celld.test/bench-unpullable@sha256:{}", "2".repeat(64))
}

/// Longest wait for one step of an active fleet (a write, a settle) before it is counted as
/// timed out and the fleet stops its rounds.
const STEP_LIMIT: Duration = Duration::from_secs(300);

/// The read design an operator process runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Base {
    /// Watch-fed reflector caches; an idle reconcile sends nothing (the default binary).
    Cached,
    /// Every reconcile reads fresh from the API server (`--test-fresh-reads`).
    Fresh,
}

/// Whether a design's extra item is an environment variable (`NAME=value`) rather than a flag.
pub fn is_env(item: &str) -> bool {
    !item.starts_with('-') && item.split_once('=').is_some_and(|(n, _)| !n.is_empty())
}

/// An operator design compared by the scale bed: `cached` or `fresh`, optionally followed by
/// operator flags, environment variables or another operator binary joined with `+` (e.g.
/// `cached+--reconcile-concurrency=32`, `cached+MALLOC_ARENA_MAX=2`,
/// `cached+bin:/tmp/celld-operator-main`), so a tuning or a change is measured side by side
/// with the defaults in the same run, on the same bed. `+pad:N` is not the operator's: the
/// bench adds an annotation of N bytes to the design's active fleets before its reaction
/// figures, so the cost of a larger fleet object (a journal near its budget) is measured with
/// the same journal history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Design {
    base: Base,
    extra: Vec<String>,
    binary: Option<std::path::PathBuf>,
    padding: usize,
    name: String,
}

impl Design {
    /// The design as written (`cached`, `fresh`, `cached+--flag=value`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Flags added to `celld-operator run --local-test …`, and `NAME=value` items set in its
    /// environment.
    pub fn flags(&self) -> Vec<String> {
        let mut flags = match self.base {
            Base::Cached => Vec::new(),
            Base::Fresh => vec!["--test-fresh-reads".to_string()],
        };
        flags.extend(self.extra.iter().cloned());
        flags
    }

    /// The operator binary this design runs (`None`: the bench's `--operator-bin`).
    pub fn binary(&self) -> Option<&std::path::Path> {
        self.binary.as_deref()
    }

    /// Bytes of padding annotation on the design's active fleets (`+pad:N`; 0: none).
    pub fn padding(&self) -> usize {
        self.padding
    }

    /// A short tag for namespace names: the base's initial, then the last alphanumerics of
    /// the extra items and, with any, four hex digits of a hash of the whole design (`c`,
    /// `f`, `crrency32` + hash), so two designs whose items end alike
    /// (`…+--status-progress-interval=1s`) do not share a namespace, hot fleet or bucket.
    pub fn tag(&self) -> String {
        let binary = self
            .binary
            .as_ref()
            .map(|b| b.display().to_string())
            .unwrap_or_default();
        let pad = if self.padding > 0 {
            format!("p{}", self.padding)
        } else {
            String::new()
        };
        let extra: Vec<char> = self
            .extra
            .concat()
            .chars()
            .chain(binary.chars())
            .chain(pad.chars())
            .filter(char::is_ascii_alphanumeric)
            .map(|c| c.to_ascii_lowercase())
            .collect();
        let tail: String = extra[extra.len().saturating_sub(8)..].iter().collect();
        let hash = if extra.is_empty() {
            String::new()
        } else {
            // FNV-1a (32 bits), the low 16.
            let h = self.name.bytes().fold(0x811c_9dc5_u32, |h, b| {
                (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
            });
            format!("{:04x}", h & 0xffff)
        };
        format!("{}{tail}{hash}", &self.name[..1])
    }

    /// Parses `cached` or `fresh`, optionally followed by `+--flag[=value]`, `+NAME=value`,
    /// `+bin:PATH` and `+pad:N` segments.
    pub fn parse(s: &str) -> Result<Design, String> {
        let s = s.trim();
        let mut parts = s.split('+');
        let base = match parts.next().unwrap_or_default() {
            "cached" => Base::Cached,
            "fresh" => Base::Fresh,
            other => {
                return Err(format!(
                    "{other:?}: expected cached or fresh, optionally followed by +--flag=value"
                ))
            }
        };
        let (pads, rest): (Vec<String>, Vec<String>) = parts
            .map(str::to_string)
            .partition(|p| p.starts_with("pad:"));
        let padding = match pads.as_slice() {
            [] => 0,
            [one] => one[4..]
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=200_000).contains(n))
                .ok_or_else(|| format!("{one:?} in {s:?}: pad:N takes 1..=200000 bytes"))?,
            _ => return Err(format!("{s:?}: at most one pad:N")),
        };
        let (binaries, extra): (Vec<String>, Vec<String>) =
            rest.into_iter().partition(|p| p.starts_with("bin:"));
        let binary = match binaries.as_slice() {
            [] => None,
            [one] if one.len() > 4 => Some(std::path::PathBuf::from(&one[4..])),
            _ => return Err(format!("{s:?}: at most one bin:PATH, with a path")),
        };
        if let Some(bad) = extra
            .iter()
            .find(|f| !is_env(f) && (!f.starts_with("--") || f.len() < 3))
        {
            return Err(format!(
                "{bad:?} in {s:?}: an extra item is a flag (--name[=value]), NAME=value or bin:PATH"
            ));
        }
        Ok(Design {
            base,
            extra,
            binary,
            padding,
            name: s.to_string(),
        })
    }
}

/// What the scale bed does.
#[derive(Debug, Clone)]
pub struct ScaleConfig {
    /// Fleet counts, ascending (the bed grows from one to the next).
    pub sizes: Vec<usize>,
    /// Members per fleet.
    pub members: i32,
    /// Designs, in the order they are run at each size.
    pub designs: Vec<Design>,
    /// Length of each at-rest window.
    pub window: Duration,
    /// Fleets per namespace.
    pub per_namespace: usize,
    /// At most this many fleets created and not yet settled.
    pub batch: usize,
    /// Fraction of the fleets active in the reaction measurement.
    pub active_fraction: f64,
    /// Operations per active fleet in each reaction measurement.
    pub rounds: usize,
    /// The spread reaction: active fleets start evenly over this long (zero: not measured).
    pub spread: Duration,
    /// How long the operator must be quiet (Lease and watch re-opens aside, no reconcile)
    /// before a window starts.
    pub quiet: Duration,
}

/// `None` is written as `"n/a"` (a figure the operator does not export, or could not be
/// measured).
fn na<T: Serialize, S: Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => v.serialize(s),
        None => s.serialize_str("n/a"),
    }
}

/// Results of the scale bed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ScaleResult {
    /// Members per fleet.
    pub members: i32,
    /// Fleets per namespace.
    pub fleets_per_namespace: usize,
    /// Creation batch (fleets in flight).
    pub batch: usize,
    /// At-rest window (s).
    pub window_s: f64,
    /// Fraction of fleets active in the reaction measurement.
    pub active_fraction: f64,
    /// Operations per active fleet per reaction measurement.
    pub rounds: usize,
    /// Designs asked for but not run, with the reason.
    pub skipped_designs: BTreeMap<String, String>,
    /// One entry per size.
    pub sizes: Vec<SizeResult>,
}

/// One size of the bed.
#[derive(Debug, Clone, Serialize)]
pub struct SizeResult {
    /// Fleets.
    pub fleets: usize,
    /// Namespaces they are spread over.
    pub namespaces: usize,
    /// Member Pods (= claims).
    pub pods: usize,
    /// How the fleets added for this size were created.
    pub creation: Creation,
    /// One entry per design run.
    pub designs: Vec<DesignResult>,
    /// Every figure side by side, with fresh ÷ cached.
    pub ratios: Vec<Ratio>,
}

/// Growing the bed to a size.
#[derive(Debug, Clone, Serialize)]
pub struct Creation {
    /// Fleets created for this size.
    pub created: usize,
    /// Seconds from the first create to every fleet settled.
    pub seconds: f64,
    /// Fleets settled per second.
    pub fleets_per_s: f64,
    /// The design of the operator process running meanwhile.
    pub operator: String,
}

/// One design at one size.
#[derive(Debug, Clone, Serialize)]
pub struct DesignResult {
    /// `cached` or `fresh`.
    pub design: String,
    /// Flags added to the operator.
    pub flags: Vec<String>,
    /// Start-up.
    pub startup: Startup,
    /// At-rest window.
    pub at_rest: AtRest,
    /// VmRSS at the end of the window (KiB).
    pub rss_kib: u64,
    /// VmHWM, the process's peak RSS so far (KiB).
    pub hwm_kib: u64,
    /// Of VmRSS: anonymous memory (heap, stacks), KiB.
    pub rss_anon_kib: Option<u64>,
    /// Of VmRSS: mapped files (mostly the operator binary's code), KiB.
    pub rss_file_kib: Option<u64>,
    /// CPU seconds (user + system) per minute over the window.
    pub cpu_s_per_min: f64,
    /// `celld_operator_cached_objects` at the end of the window.
    #[serde(serialize_with = "na")]
    pub cached_objects: Option<f64>,
    /// `celld_operator_cached_bytes` at the end of the window (JSON held by the compact stores).
    pub cached_bytes: Option<f64>,
    /// ESTABLISHED TCP connections from the operator to the API server at the end of the
    /// window (watches, the request pool and the Lease), counted from /proc.
    #[serde(serialize_with = "na")]
    pub api_connections: Option<usize>,
    /// `celld_operator_watch_connections` (HTTP/2 connections carrying namespace watches)
    /// at the end of the window.
    #[serde(serialize_with = "na")]
    pub watch_connections: Option<f64>,
    /// The machine's pace right after the window (`pace.rs`): figures of runs on a machine
    /// that was slower are not comparable.
    pub pace: crate::pace::Pace,
    /// Which fleets this design's reaction figures act on.
    pub active: ActiveSummary,
    /// Reaction under load.
    pub reaction: Reaction,
    /// The reaction again with a hot fleet present.
    pub fairness: Option<Fairness>,
    /// The reaction again, the active fleets starting one after another over
    /// `ScaleConfig::spread` instead of at once (`None`: not measured).
    #[serde(serialize_with = "na")]
    pub spread: Option<Reaction>,
}

/// From process start.
#[derive(Debug, Clone, Serialize)]
pub struct Startup {
    /// Process spawned → `/readyz` 200 and `celld_operator_leader 1` (journal mirror replayed).
    #[serde(serialize_with = "na")]
    pub ready_s: Option<f64>,
    /// `celld_operator_leader_ready_seconds` as the operator measured it.
    #[serde(serialize_with = "na")]
    pub leader_ready_metric_s: Option<f64>,
    /// Process spawned → `celld_operator_fleets_reconciled ≥ fleets`.
    #[serde(serialize_with = "na")]
    pub all_reconciled_s: Option<f64>,
    /// Process spawned → every fleet settled (bench watch) and the operator quiet.
    pub settled_quiet_s: f64,
    /// Requests (Lease excluded) from spawn to quiet, per fleet.
    pub requests_per_fleet: f64,
    /// Reconciles from spawn to quiet, per fleet.
    pub reconciles_per_fleet: f64,
    /// The operator's CPU seconds (user + system) from spawn to settled and quiet.
    #[serde(serialize_with = "na")]
    pub cpu_s: Option<f64>,
}

/// At-rest traffic over the window.
#[derive(Debug, Clone, Serialize)]
pub struct AtRest {
    /// Window length (s).
    pub window_s: f64,
    /// Requests per fleet per minute, Lease excluded.
    pub requests_per_fleet_per_min: f64,
    /// Writes per fleet per minute, Lease excluded.
    pub writes_per_fleet_per_min: f64,
    /// Lease requests per minute (the whole operator; not per fleet).
    pub lease_requests_per_min: f64,
    /// Requests per fleet per minute by `verb resource`, Lease excluded.
    pub per_fleet_per_min_by_request: BTreeMap<String, f64>,
    /// Requests per minute of the whole operator by `verb resource`, Lease included.
    pub per_min_by_request: BTreeMap<String, f64>,
    /// Reconciles per minute.
    pub reconciles_per_min: f64,
    /// Reconcile passes per minute by `pass` (`cached`, `fresh`).
    #[serde(serialize_with = "na")]
    pub passes_per_min: Option<BTreeMap<String, f64>>,
    /// Cache escalations in the window by cause.
    #[serde(serialize_with = "na")]
    pub escalations: Option<BTreeMap<String, f64>>,
    /// Failed reconciles in the window by reason.
    pub reconcile_errors: BTreeMap<String, f64>,
    /// The operator's writes per minute as the audit log answered them, by `verb resource code`.
    pub audited_writes_per_min: BTreeMap<String, f64>,
    /// Fleets not settled at the end of the window.
    pub unsettled_after: usize,
    /// The operator was quiet before the window started.
    pub quiet_before: bool,
}

/// Latencies of one kind of reaction.
#[derive(Debug, Clone, Serialize)]
pub struct ReactionRow {
    /// What is timed.
    pub figure: String,
    /// Milliseconds.
    #[serde(serialize_with = "na")]
    pub ms: Option<Summary>,
}

/// The reaction under load.
#[derive(Debug, Clone, Serialize)]
pub struct Reaction {
    /// Active fleets (all at the same time).
    pub active_fleets: usize,
    /// Their first operations started evenly over this many ms (0: all at once).
    pub spread_ms: u64,
    /// Of which scaling `members → members+1 → members` per round.
    pub scaling: usize,
    /// Of which restarting by token per round.
    pub restarting: usize,
    /// Rounds per active fleet.
    pub rounds: usize,
    /// By kind.
    pub rows: Vec<ReactionRow>,
    /// Every sample of every kind.
    #[serde(serialize_with = "na")]
    pub all_ms: Option<Summary>,
    /// Queued contractions whose settle at `members+1` the bench did not see before the
    /// decrease (not sampled).
    pub unobserved_settles: usize,
    /// Steps that did not finish within the step limit (the fleet stopped its rounds).
    pub timeouts: usize,
    /// Wall time of the measurement (s).
    pub seconds: f64,
    /// Most fleets in their operations at the same time (from each fleet's first spec change
    /// to its last operation settled).
    pub active_at_once_peak: usize,
    /// Fleets in their operations at the same time, on average over the measurement.
    pub active_at_once_mean: f64,
    /// Operations completed (a scaling round is two: the growth and the contraction).
    pub operations: usize,
    /// Requests (whole operator, Lease excluded) per completed operation; with a hot fleet
    /// its re-checks are included.
    #[serde(serialize_with = "na")]
    pub requests_per_operation: Option<f64>,
    /// Reconciles per completed operation.
    #[serde(serialize_with = "na")]
    pub reconciles_per_operation: Option<f64>,
    /// The operator's CPU milliseconds (user + system) per completed operation meanwhile;
    /// with a hot fleet its re-checks are included.
    #[serde(serialize_with = "na")]
    pub cpu_ms_per_operation: Option<f64>,
    /// Requests per minute meanwhile (whole operator, Lease excluded).
    pub requests_per_min: f64,
    /// Reconciles per minute meanwhile.
    pub reconciles_per_min: f64,
    /// Reconcile passes per minute meanwhile, by `pass`.
    #[serde(serialize_with = "na")]
    pub passes_per_min: Option<BTreeMap<String, f64>>,
    /// Cache escalations meanwhile, by cause.
    #[serde(serialize_with = "na")]
    pub escalations: Option<BTreeMap<String, f64>>,
    /// Mean time of one reconcile meanwhile (ms): how long it held a slot.
    #[serde(serialize_with = "na")]
    pub reconcile_ms_mean: Option<f64>,
    /// Reconciles running at once on average meanwhile (seconds in reconciles ÷ wall
    /// seconds; at `--reconcile-concurrency` every slot was busy all the time).
    pub slots_busy: f64,
    /// Mean answer time of the operator's requests meanwhile, by verb (ms; empty when the
    /// binary does not time them).
    pub request_ms_by_verb: BTreeMap<String, f64>,
    /// The operator's own timing of its guarded workload writes meanwhile: the reconcile that
    /// wrote, from its start to the write (`celld_operator_reaction_pass_seconds`, part
    /// `pass_to_write`), and before it, from the fleet's earliest pending watch event to that
    /// reconcile's start (`celld_operator_reaction_wait_seconds`, part `trigger_to_pass`;
    /// passes started by a requeue alone are not in it): `[n, mean ms, p50, p90, p99]`,
    /// quantiles as bucket upper bounds; empty when not exported.
    pub reaction_ms_by_part: BTreeMap<String, [f64; 5]>,
    /// Requests that reconcile sent up to and including the write, on average
    /// (`celld_operator_reaction_pass_requests`; `None` when not exported).
    #[serde(serialize_with = "na")]
    pub reaction_requests_mean: Option<f64>,
    /// Requests per completed operation by `verb resource` (Lease excluded).
    pub per_operation_by_request: BTreeMap<String, f64>,
}

/// The reaction with one hot fleet present.
#[derive(Debug, Clone, Serialize)]
pub struct Fairness {
    /// `namespace/name` of the hot fleet.
    pub hot_fleet: String,
    /// Its upgrade's image (never pullable).
    pub hot_image: String,
    /// Its open operation at the end (`kind phase`), if any.
    #[serde(serialize_with = "na")]
    pub hot_operation: Option<String>,
    /// The reaction measured with it.
    pub with_hot: Reaction,
    /// p99 of every reaction sample of the other fleets, without the hot fleet (ms).
    #[serde(serialize_with = "na")]
    pub p99_without_ms: Option<f64>,
    /// The same with the hot fleet (ms).
    #[serde(serialize_with = "na")]
    pub p99_with_ms: Option<f64>,
}

/// One figure of every design at a size, and fresh ÷ cached.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    /// What.
    pub figure: String,
    /// Value per design (`cached`, `fresh`).
    pub values: BTreeMap<String, Option<f64>>,
    /// fresh ÷ cached, when both exist and cached is not 0.
    #[serde(serialize_with = "na")]
    pub fresh_over_cached: Option<f64>,
}

/// A figure's name and value.
pub type Figure = (&'static str, Option<f64>);

/// The figures compared across designs, in table order.
pub fn figures(d: &DesignResult) -> Vec<Figure> {
    let pass = |p: &Option<BTreeMap<String, f64>>, k: &str| {
        p.as_ref().map(|m| m.get(k).copied().unwrap_or(0.0))
    };
    let fair = d.fairness.as_ref();
    vec![
        ("start-up: ready + leader, s", d.startup.ready_s),
        (
            "start-up: leader ready (operator gauge), s",
            d.startup.leader_ready_metric_s,
        ),
        (
            "start-up: every fleet reconciled, s",
            d.startup.all_reconciled_s,
        ),
        (
            "start-up: settled and quiet, s",
            Some(d.startup.settled_quiet_s),
        ),
        (
            "start-up: requests per fleet",
            Some(d.startup.requests_per_fleet),
        ),
        ("start-up: operator CPU s", d.startup.cpu_s),
        (
            "at rest: requests/fleet/min (no Lease)",
            Some(d.at_rest.requests_per_fleet_per_min),
        ),
        (
            "at rest: writes/fleet/min",
            Some(d.at_rest.writes_per_fleet_per_min),
        ),
        (
            "at rest: Lease requests/min",
            Some(d.at_rest.lease_requests_per_min),
        ),
        (
            "at rest: reconciles/min",
            Some(d.at_rest.reconciles_per_min),
        ),
        (
            "at rest: cached passes/min",
            pass(&d.at_rest.passes_per_min, "cached"),
        ),
        (
            "at rest: fresh passes/min",
            pass(&d.at_rest.passes_per_min, "fresh"),
        ),
        ("cached objects", d.cached_objects),
        ("cached JSON MiB", d.cached_bytes.map(|b| b / 1048576.0)),
        (
            "TCP connections to the API server",
            d.api_connections.map(|n| n as f64),
        ),
        ("HTTP/2 watch connections", d.watch_connections),
        ("VmRSS, MiB", Some(d.rss_kib as f64 / 1024.0)),
        ("VmHWM, MiB", Some(d.hwm_kib as f64 / 1024.0)),
        (
            "of VmRSS: anonymous (heap), MiB",
            d.rss_anon_kib.map(|k| k as f64 / 1024.0),
        ),
        (
            "of VmRSS: mapped files (the binary), MiB",
            d.rss_file_kib.map(|k| k as f64 / 1024.0),
        ),
        ("CPU s/min at rest", Some(d.cpu_s_per_min)),
        (
            "machine pace: bench CPU probe, ms",
            d.pace.cpu_probe_ms.as_ref().map(|s| s.median),
        ),
        (
            "machine pace: API GET at rest, ms",
            d.pace.api_get_ms.as_ref().map(|s| s.median),
        ),
        (
            "machine pace: API PATCH at rest, ms",
            d.pace.api_patch_ms.as_ref().map(|s| s.median),
        ),
        (
            "under load: requests per operation",
            d.reaction.requests_per_operation,
        ),
        (
            "under load: reconciles per operation",
            d.reaction.reconciles_per_operation,
        ),
        (
            "under load: operator CPU ms per operation",
            d.reaction.cpu_ms_per_operation,
        ),
        (
            "reaction p50, ms",
            d.reaction.all_ms.as_ref().map(|s| s.median),
        ),
        (
            "reaction p99, ms",
            d.reaction.all_ms.as_ref().map(|s| s.p99),
        ),
        (
            "reaction p99 with a hot fleet, ms",
            fair.and_then(|f| f.p99_with_ms),
        ),
        (
            "settled → next write p99 (all at once), ms",
            settled_p99(&d.reaction),
        ),
        (
            "spread starts: reaction p50, ms",
            d.spread
                .as_ref()
                .and_then(|r| r.all_ms.as_ref())
                .map(|s| s.median),
        ),
        (
            "spread starts: reaction p99, ms",
            d.spread
                .as_ref()
                .and_then(|r| r.all_ms.as_ref())
                .map(|s| s.p99),
        ),
        (
            "spread starts: settled → next write p99, ms",
            d.spread.as_ref().and_then(settled_p99),
        ),
    ]
}

/// The most intervals that overlap at one instant, and the mean overlap over the span from
/// the first start to the last end.
fn at_once(busy: &[(Instant, Instant)]) -> (usize, f64) {
    let mut edges: Vec<(Instant, i32)> = busy
        .iter()
        .flat_map(|(from, to)| [(*from, 1), (*to, -1)])
        .collect();
    // At one instant an end goes before a start: touching intervals do not overlap.
    edges.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut now, mut peak) = (0i32, 0i32);
    for (_, step) in &edges {
        now += step;
        peak = peak.max(now);
    }
    let span = match (edges.first(), edges.last()) {
        (Some(first), Some(last)) => last.0.duration_since(first.0).as_secs_f64(),
        _ => 0.0,
    };
    let busy_s: f64 = busy
        .iter()
        .map(|(from, to)| to.duration_since(*from).as_secs_f64())
        .sum();
    let mean = if span > 0.0 { busy_s / span } else { 0.0 };
    (peak.max(0) as usize, mean)
}

/// p99 of the pod-ready (settled) → next workload write samples: the contraction queued
/// during the growth.
fn settled_p99(r: &Reaction) -> Option<f64> {
    r.rows
        .iter()
        .find(|row| row.figure == CONTRACTION)
        .and_then(|row| row.ms.as_ref())
        .map(|s| s.p99)
}

fn ratios(designs: &[DesignResult]) -> Vec<Ratio> {
    let Some(first) = designs.first() else {
        return Vec::new();
    };
    let by_design: Vec<(String, Vec<Figure>)> = designs
        .iter()
        .map(|d| (d.design.clone(), figures(d)))
        .collect();
    figures(first)
        .iter()
        .enumerate()
        .map(|(i, (figure, _))| {
            let values: BTreeMap<String, Option<f64>> = by_design
                .iter()
                .map(|(name, f)| (name.clone(), f[i].1))
                .collect();
            let get = |k: &str| values.get(k).copied().flatten();
            let fresh_over_cached = match (get("fresh"), get("cached")) {
                (Some(f), Some(c)) if c != 0.0 => Some(f / c),
                _ => None,
            };
            Ratio {
                figure: figure.to_string(),
                values,
                fresh_over_cached,
            }
        })
        .collect()
}

/// A fleet of the bed.
#[derive(Debug, Clone)]
struct FleetRef {
    ns: String,
    name: String,
    uid: String,
}

/// The fleets one design's reaction figures act on, and where they sit in the bed.
#[derive(Clone, Copy)]
struct ActiveFleets<'a> {
    fleets: &'a [FleetRef],
    /// Index of the first in creation order.
    first: usize,
    /// None of them was active for an earlier design or size of this run.
    fresh: bool,
}

/// Hands each design (and size) fleets no earlier one acted on, while the bed has them, so
/// every design starts its operations on fleets with the same history: one operation's
/// journal entries make the fleet object, and so every later write of it, larger (measured
/// 2026-12-05: in runs that reused the first fleets, the design measured first was faster).
#[derive(Default)]
struct ActivePicks {
    /// Fleets `0..used` (creation order) have been handed out.
    used: usize,
}

impl ActivePicks {
    /// The `k` fleets of `bed` (in creation order) after every one handed out so far; when
    /// fewer than `k` are left, the first `k` again, marked not fresh.
    fn next<'a>(&mut self, bed: &'a [FleetRef], k: usize) -> ActiveFleets<'a> {
        let k = k.min(bed.len());
        let (first, fresh) = if self.used + k <= bed.len() {
            self.used += k;
            (self.used - k, true)
        } else {
            (0, false)
        };
        ActiveFleets {
            fleets: &bed[first..first + k],
            first,
            fresh,
        }
    }
}

/// Fleets active in a reaction measurement at `size` fleets: `active_fraction` of them, at
/// least 2.
fn active_count(cfg: &ScaleConfig, size: usize) -> usize {
    ((cfg.active_fraction * size as f64).round() as usize)
        .max(2)
        .min(size)
}

/// Mean length of the active fleets' journal annotations, in bytes (`None`: a read failed;
/// the bench's own GETs, outside every timed window).
async fn journal_bytes(bed: &Bed, fleets: &[FleetRef]) -> Option<f64> {
    let mut total = 0usize;
    for f in fleets {
        let api: Api<CelldFleet> = Api::namespaced(bed.client.clone(), &f.ns);
        let fleet = api.get(&f.name).await.ok()?;
        total += fleet
            .annotations()
            .get(JOURNAL_ANNOTATION)
            .map_or(0, String::len);
    }
    (!fleets.is_empty()).then(|| total as f64 / fleets.len() as f64)
}

/// Annotation the bench pads active fleets with (`+pad:N`).
const PADDING_ANNOTATION: &str = "bench.celld.eric.dev/padding";

/// Adds an annotation of `bytes` bytes to each of `fleets` (a merge patch of metadata only:
/// no generation change, nothing the operator acts on).
async fn pad(bed: &Bed, fleets: &[FleetRef], bytes: usize) -> Result<()> {
    let value = "x".repeat(bytes);
    for f in fleets {
        let api: Api<CelldFleet> = Api::namespaced(bed.client.clone(), &f.ns);
        merge(
            &api,
            &f.name,
            json!({"metadata": {"annotations": {PADDING_ANNOTATION: value}}}),
        )
        .await?;
    }
    progress(&format!(
        "[scale] padded {} fleets with a {bytes}-byte annotation",
        fleets.len()
    ));
    Ok(())
}

/// Which fleets a design's reaction figures act on.
#[derive(Debug, Clone, Serialize)]
pub struct ActiveSummary {
    /// Index of the first active fleet, in creation order.
    pub first: usize,
    /// How many.
    pub count: usize,
    /// Bytes of padding annotation the bench added to each of them (`+pad:N`).
    pub padding_bytes: usize,
    /// None of them was active for an earlier design or size of this run.
    pub fresh: bool,
    /// Mean journal annotation length of the active fleets before the first reaction
    /// measurement (bytes).
    #[serde(serialize_with = "na")]
    pub journal_bytes_before: Option<f64>,
    /// The same after the last one.
    #[serde(serialize_with = "na")]
    pub journal_bytes_after: Option<f64>,
}

/// The bench's view of every scale-bed fleet: one cluster-wide watch on the label
/// [`SCALE_LABEL`], keeping whether each fleet is settled at its `spec.replicas`.
struct Board {
    settled: Arc<Mutex<HashMap<String, bool>>>,
    task: JoinHandle<()>,
}

impl Board {
    fn start(client: &Client, run_id: &str) -> Board {
        let settled: Arc<Mutex<HashMap<String, bool>>> = Arc::default();
        let sink = settled.clone();
        let config = watcher::Config::default().labels(&format!("{SCALE_LABEL}={run_id}"));
        let api = Api::<CelldFleet>::all(client.clone());
        let task = tokio::spawn(async move {
            let mut events = watcher::watcher(api, config).boxed();
            let mut listing: Option<HashMap<String, bool>> = None;
            while let Some(event) = events.next().await {
                let key = |f: &CelldFleet| {
                    format!("{}/{}", f.namespace().unwrap_or_default(), f.name_any())
                };
                let Ok(mut map) = sink.lock() else { return };
                match event {
                    Ok(Event::Init) => listing = Some(HashMap::new()),
                    Ok(Event::InitApply(f)) => {
                        let s = fleet_settled(&f, f.spec.replicas);
                        if let Some(l) = listing.as_mut() {
                            l.insert(key(&f), s);
                        }
                    }
                    Ok(Event::InitDone) => {
                        if let Some(l) = listing.take() {
                            *map = l;
                        }
                    }
                    Ok(Event::Apply(f)) => {
                        map.insert(key(&f), fleet_settled(&f, f.spec.replicas));
                    }
                    Ok(Event::Delete(f)) => {
                        map.remove(&key(&f));
                    }
                    Err(e) => {
                        drop(map);
                        eprintln!("  (bench fleet watch error, retrying: {e})");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        });
        Board { settled, task }
    }

    /// Fleets settled at their `spec.replicas`.
    fn settled(&self) -> usize {
        self.settled
            .lock()
            .map(|m| m.values().filter(|s| **s).count())
            .unwrap_or(0)
    }

    /// Up to `n` fleets not settled.
    fn unsettled(&self, n: usize) -> Vec<String> {
        self.settled
            .lock()
            .map(|m| {
                let mut v: Vec<String> = m
                    .iter()
                    .filter(|(_, s)| !**s)
                    .map(|(k, _)| k.clone())
                    .collect();
                v.sort();
                v.truncate(n);
                v
            })
            .unwrap_or_default()
    }

    /// Waits until at least `want` fleets are settled; gives up after `stall` without progress.
    async fn wait_settled(&self, want: usize, stall: Duration, what: &str) -> Result<()> {
        let mut last = self.settled();
        let mut last_change = Instant::now();
        let mut last_report = Instant::now();
        loop {
            let n = self.settled();
            if n >= want {
                return Ok(());
            }
            if n != last {
                last = n;
                last_change = Instant::now();
            }
            if last_change.elapsed() > stall {
                bail!(
                    "{what}: only {n} of {want} fleets settled, no progress for {stall:?}; unsettled: {:?}",
                    self.unsettled(5)
                );
            }
            if last_report.elapsed() > Duration::from_secs(15) {
                progress(&format!("[scale] {what}: {n} of {want} fleets settled"));
                last_report = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

impl Drop for Board {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Whether the operator binary accepts `flags` after `run --local-test` (clap refuses an
/// unknown flag before it gets to `--help`).
pub fn accepts(operator_bin: &std::path::Path, flags: &[String]) -> bool {
    std::process::Command::new(operator_bin)
        .args(["run", "--local-test"])
        .args(flags.iter().filter(|f| !is_env(f)))
        .arg("--help")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs the scale bed. Its namespaces stay until [`Bed::down`].
pub async fn run(
    bed: &mut Bed,
    cfg: &ScaleConfig,
    operator_bin: &std::path::Path,
) -> Result<ScaleResult> {
    let mut out = ScaleResult {
        members: cfg.members,
        fleets_per_namespace: cfg.per_namespace,
        batch: cfg.batch,
        window_s: cfg.window.as_secs_f64(),
        active_fraction: cfg.active_fraction,
        rounds: cfg.rounds,
        ..ScaleResult::default()
    };
    let mut designs = Vec::new();
    for d in &cfg.designs {
        let bin = d.binary().unwrap_or(operator_bin);
        if accepts(bin, &d.flags()) {
            designs.push(d.clone());
        } else {
            let why = format!(
                "{} does not accept {} (not in this build)",
                bin.display(),
                d.flags().join(" ")
            );
            progress(&format!("[scale] design {} skipped: {why}", d.name()));
            out.skipped_designs.insert(d.name().into(), why);
        }
    }
    let board = Board::start(&bed.client, &bed.run_id);
    let mut fleets: Vec<FleetRef> = Vec::new();
    let mut namespaces: Vec<String> = Vec::new();
    let mut running = "cached (default flags)".to_string();
    let mut picks = ActivePicks::default();
    for &size in &cfg.sizes {
        let creation = grow(
            bed,
            cfg,
            &board,
            &mut fleets,
            &mut namespaces,
            size,
            &running,
        )
        .await?;
        let mut results = Vec::new();
        for design in &designs {
            progress(&format!(
                "[scale] {size} fleets, design {}: fresh operator process{}",
                design.name(),
                if design.flags().is_empty() {
                    String::new()
                } else {
                    format!(" with {}", design.flags().join(" "))
                }
            ));
            let active = picks.next(&fleets[..size], active_count(cfg, size));
            let r = measure_design(bed, cfg, &board, active, size, design).await?;
            running = design.name().to_string();
            results.push(r);
        }
        out.sizes.push(SizeResult {
            fleets: size,
            namespaces: namespaces.len(),
            pods: size * cfg.members as usize,
            creation,
            ratios: ratios(&results),
            designs: results,
        });
    }
    Ok(out)
}

/// Creates fleets up to `size`, at most `cfg.batch` of them created and not yet settled.
async fn grow(
    bed: &Bed,
    cfg: &ScaleConfig,
    board: &Board,
    fleets: &mut Vec<FleetRef>,
    namespaces: &mut Vec<String>,
    size: usize,
    running: &str,
) -> Result<Creation> {
    let started = Instant::now();
    let first = fleets.len();
    let per_ns = cfg.per_namespace.max(1);
    if size > first {
        progress(&format!(
            "[scale] creating fleets {first}..{size}: PersistentFleet, {} no-process members each, {per_ns} per namespace, at most {} in flight",
            cfg.members, cfg.batch
        ));
    }
    let mut last_report = Instant::now();
    let mut last_settled = board.settled();
    let mut last_change = Instant::now();
    loop {
        let settled = board.settled();
        if fleets.len() >= size && settled >= size {
            break;
        }
        let in_flight = fleets.len().saturating_sub(settled);
        let room = cfg
            .batch
            .max(1)
            .saturating_sub(in_flight)
            .min(size - fleets.len().min(size));
        if room > 0 {
            let from = fleets.len();
            while namespaces.len() < (from + room).div_ceil(per_ns) {
                namespaces.push(bed.namespace(&format!("s{}", namespaces.len())).await?);
            }
            let jobs: Vec<(String, String)> = (from..from + room)
                .map(|i| (namespaces[i / per_ns].clone(), format!("f{i:04}")))
                .collect();
            let created: Vec<FleetRef> = futures::stream::iter(jobs)
                .map(|(ns, name)| create_fleet(bed, ns, name, cfg.members))
                .buffered(8)
                .try_collect()
                .await?;
            fleets.extend(created);
        }
        if settled != last_settled {
            last_settled = settled;
            last_change = Instant::now();
        } else if last_change.elapsed() > STEP_LIMIT {
            bail!(
                "growing to {size} fleets: {settled} settled, none more for {STEP_LIMIT:?}; unsettled: {:?}",
                board.unsettled(5)
            );
        }
        if last_report.elapsed() >= Duration::from_secs(10) {
            let done = settled.saturating_sub(first);
            let secs = started.elapsed().as_secs_f64();
            let rate = done as f64 / secs;
            let eta = if rate > 0.0 {
                format!("ETA {:.0} s", (size.saturating_sub(settled)) as f64 / rate)
            } else {
                "ETA unknown".into()
            };
            progress(&format!(
                "[scale] [{settled}/{size}] fleets settled, {} created, {rate:.2} fleets/s, {eta}",
                fleets.len()
            ));
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let created = size.saturating_sub(first);
    if created > 0 {
        progress(&format!(
            "[scale] [{size}/{size}] fleets settled: {created} created in {seconds:.0} s ({:.2} fleets/s)",
            created as f64 / seconds
        ));
    }
    Ok(Creation {
        created,
        seconds,
        fleets_per_s: if seconds > 0.0 {
            created as f64 / seconds
        } else {
            0.0
        },
        operator: running.to_string(),
    })
}

async fn create_fleet(bed: &Bed, ns: String, name: String, members: i32) -> Result<FleetRef> {
    let mut f = fleet(&name, "PersistentFleet", members, &bed.bucket(&ns, &name))?;
    f.metadata.labels = Some([(SCALE_LABEL.to_string(), bed.run_id.clone())].into());
    let created = Api::<CelldFleet>::namespaced(bed.client.clone(), &ns)
        .create(&PostParams::default(), &f)
        .await
        .with_context(|| format!("creating fleet {ns}/{name}"))?;
    Ok(FleetRef {
        uid: created.uid().unwrap_or_default(),
        ns,
        name,
    })
}

/// Scrape period of the scale bed (a scrape of a thousand fleets' series is a few hundred
/// KiB the operator encodes): fine while a figure is short, coarser later.
fn poll_period(since: Instant) -> Duration {
    if since.elapsed() < Duration::from_secs(5) {
        Duration::from_millis(100)
    } else {
        Duration::from_secs(1)
    }
}

async fn measure_design(
    bed: &mut Bed,
    cfg: &ScaleConfig,
    board: &Board,
    active: ActiveFleets<'_>,
    size: usize,
    design: &Design,
) -> Result<DesignResult> {
    let startup = start_up(bed, cfg, board, size, design).await?;
    progress(&format!(
        "[scale] {size} fleets, {}: ready + leader {}, every fleet reconciled {}, settled and quiet {:.1} s",
        design.name(),
        secs(startup.ready_s),
        secs(startup.all_reconciled_s),
        startup.settled_quiet_s
    ));

    // At rest.
    let (_, quiet_before) = bed
        .metrics
        .quiet_every(
            cfg.quiet,
            Duration::from_secs(300),
            Duration::from_secs(1),
            true,
        )
        .await?;
    progress(&format!(
        "[scale] {size} fleets, {}: at rest, counting every request for {:?}",
        design.name(),
        cfg.window
    ));
    bed.audit_skip()?;
    let before = bed.metrics.snapshot().await?;
    let cpu_before = bed.operator().cpu_seconds()?;
    let window_end = Instant::now() + cfg.window;
    let mut last_report = Instant::now();
    while Instant::now() < window_end {
        let left = window_end.saturating_duration_since(Instant::now());
        tokio::time::sleep(left.min(Duration::from_secs(5))).await;
        bed.operator
            .as_mut()
            .context("no operator")?
            .check_running()?;
        let left = window_end.saturating_duration_since(Instant::now());
        if last_report.elapsed() >= Duration::from_secs(60) && !left.is_zero() {
            progress(&format!(
                "[scale] {size} fleets, {}: at rest, {:.0} s of {:.0} s",
                design.name(),
                cfg.window.as_secs_f64() - left.as_secs_f64(),
                cfg.window.as_secs_f64()
            ));
            last_report = Instant::now();
        }
    }
    let after = bed.metrics.snapshot().await?;
    let cpu_after = bed.operator().cpu_seconds()?;
    let (rss_kib, hwm_kib) = bed.operator().memory_kib()?;
    let rss_split = bed.operator().rss_split_kib();
    let api_connections = celld_harness::net::url_port(&celld_harness::cluster().apiserver_url)
        .and_then(|port| celld_harness::net::established_to(bed.operator().pid, port).ok());
    let audited = bed.operator_audit()?;
    let d = after.since(&before);
    let minutes = d.seconds / 60.0;
    let at_rest = at_rest(
        &d,
        size,
        audited,
        size.saturating_sub(board.settled()),
        quiet_before,
    );
    let cpu_s_per_min = (cpu_after - cpu_before) / minutes;
    let pace = crate::pace::measure(bed).await?;
    let ms = |s: &Option<crate::stats::Summary>| s.as_ref().map_or(f64::NAN, |s| s.median);
    progress(&format!(
        "[scale] {size} fleets, {}: machine pace: CPU probe {:.0} ms, API GET {:.1} ms, PATCH {:.1} ms (medians)",
        design.name(),
        ms(&pace.cpu_probe_ms),
        ms(&pace.api_get_ms),
        ms(&pace.api_patch_ms)
    ));
    progress(&format!(
        "[scale] {size} fleets, {}: {:.3} requests/fleet/min (Lease excluded), {:.1} Lease requests/min, {:.1} reconciles/min, RSS {:.1} MiB, CPU {:.2} s/min",
        design.name(),
        at_rest.requests_per_fleet_per_min,
        at_rest.lease_requests_per_min,
        at_rest.reconciles_per_min,
        rss_kib as f64 / 1024.0,
        cpu_s_per_min
    ));

    // Reaction under load, then the same with a hot fleet.
    let ActiveFleets {
        fleets: active,
        first: active_first,
        fresh: active_fresh,
    } = active;
    let k = active.len();
    if design.padding() > 0 {
        pad(bed, active, design.padding()).await?;
        // The operator sees 50 fleet updates that change nothing it acts on: let it settle.
        bed.metrics
            .quiet_every(
                cfg.quiet,
                Duration::from_secs(120),
                Duration::from_secs(1),
                true,
            )
            .await?;
    }
    let journal_before = journal_bytes(bed, active).await;
    progress(&format!(
        "[scale] {size} fleets, {}: active fleets #{active_first}..#{} ({}), their journal annotations {:.0} bytes on average",
        design.name(),
        active_first + k,
        if active_fresh {
            "none of them active before in this run"
        } else {
            "the bed had too few fleets left: some were active before"
        },
        journal_before.unwrap_or(f64::NAN)
    ));
    let tag = format!("{}{}", size, design.tag());
    progress(&format!(
        "[scale] {size} fleets, {}: reaction under load, {k} fleets active ({} scaling {}→{}→{}, {} restarting), {} rounds",
        design.name(),
        k.div_ceil(2),
        cfg.members,
        cfg.members + 1,
        cfg.members,
        k / 2,
        cfg.rounds
    ));
    let reaction = react(
        bed,
        cfg,
        board,
        active,
        &format!("{tag}r"),
        false,
        Duration::ZERO,
    )
    .await?;
    progress(&format!(
        "[scale] {size} fleets, {}: reaction {}",
        design.name(),
        summary_line(&reaction)
    ));
    let fairness = fairness(bed, cfg, board, active, size, design, &tag, &reaction).await?;
    let spread = if cfg.spread.is_zero() {
        None
    } else {
        progress(&format!(
            "[scale] {size} fleets, {}: reaction again, the {k} fleets starting one after another over {:?}",
            design.name(),
            cfg.spread
        ));
        let r = react(
            bed,
            cfg,
            board,
            active,
            &format!("{tag}s"),
            false,
            cfg.spread,
        )
        .await?;
        progress(&format!(
            "[scale] {size} fleets, {}: spread reaction {}",
            design.name(),
            summary_line(&r)
        ));
        Some(r)
    };
    let journal_after = journal_bytes(bed, active).await;
    bed.operator
        .as_mut()
        .context("no operator")?
        .check_running()?;
    Ok(DesignResult {
        active: ActiveSummary {
            first: active_first,
            count: k,
            padding_bytes: design.padding(),
            fresh: active_fresh,
            journal_bytes_before: journal_before,
            journal_bytes_after: journal_after,
        },
        design: design.name().into(),
        flags: design.flags(),
        startup,
        at_rest,
        rss_kib,
        hwm_kib,
        rss_anon_kib: rss_split.map(|s| s.0),
        rss_file_kib: rss_split.map(|s| s.1),
        cpu_s_per_min,
        cached_objects: after.cached_objects,
        cached_bytes: after.cached_bytes,
        api_connections,
        watch_connections: after.watch_connections,
        pace,
        reaction,
        fairness: Some(fairness),
        spread,
    })
}

fn secs(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |s| format!("{s:.1} s"))
}

fn summary_line(r: &Reaction) -> String {
    match &r.all_ms {
        Some(s) => format!(
            "n {}, p50 {:.0} ms, p99 {:.0} ms{}{}",
            s.n,
            s.median,
            s.p99,
            if r.timeouts > 0 {
                format!(", {} timed out", r.timeouts)
            } else {
                String::new()
            },
            if r.unobserved_settles > 0 {
                format!(", {} settles not seen", r.unobserved_settles)
            } else {
                String::new()
            }
        ),
        None => format!("no samples ({} timed out)", r.timeouts),
    }
}

/// Restarts the operator with the design's flags and times its start-up.
async fn start_up(
    bed: &mut Bed,
    cfg: &ScaleConfig,
    board: &Board,
    size: usize,
    design: &Design,
) -> Result<Startup> {
    let spawned = bed
        .restart_operator_with(design.binary(), design.flags())
        .await?;
    let ready_limit = Duration::from_secs(120) + Duration::from_millis(200 * size as u64);
    let ready_s = loop {
        bed.operator
            .as_mut()
            .context("no operator")?
            .check_running()?;
        if crate::scrape::ready(&bed.health).await && bed.metrics.is_leader().await {
            break spawned.elapsed().as_secs_f64();
        }
        if spawned.elapsed() > ready_limit {
            bail!(
                "the operator ({}) was not ready and leader within {ready_limit:?}; log: {}",
                design.name(),
                bed.operator().log.display()
            );
        }
        tokio::time::sleep(poll_period(spawned)).await;
    };
    let first = bed.metrics.snapshot().await?;
    let mut all_reconciled_s = None;
    if first.fleets_reconciled.is_some() {
        let limit = Duration::from_secs(120) + Duration::from_secs(size as u64);
        loop {
            let s = bed.metrics.snapshot().await?;
            if s.fleets_reconciled.unwrap_or(0.0) >= size as f64 {
                all_reconciled_s = Some(spawned.elapsed().as_secs_f64());
                break;
            }
            if spawned.elapsed() > limit {
                progress(&format!(
                    "[scale] {}: celld_operator_fleets_reconciled {} < {size} after {limit:?} (reported n/a)",
                    design.name(),
                    s.fleets_reconciled.unwrap_or(0.0)
                ));
                break;
            }
            bed.operator
                .as_mut()
                .context("no operator")?
                .check_running()?;
            tokio::time::sleep(poll_period(spawned)).await;
        }
    }
    board
        .wait_settled(size, STEP_LIMIT, "after the operator start")
        .await?;
    let (quiet, _) = bed
        .metrics
        .quiet_every(
            cfg.quiet,
            Duration::from_secs(300),
            Duration::from_secs(1),
            true,
        )
        .await?;
    // The process is new: its CPU time so far is the start-up's.
    let cpu_s = bed.operator().cpu_seconds().ok();
    // The gauge is set once the leader is ready; read it late so it is surely set.
    let d = quiet.since(&crate::scrape::Snapshot::default());
    let n = size.max(1) as f64;
    Ok(Startup {
        ready_s: Some(ready_s),
        leader_ready_metric_s: quiet.leader_ready_seconds,
        all_reconciled_s,
        // The quiet period itself is not start-up work.
        settled_quiet_s: (spawned.elapsed().saturating_sub(cfg.quiet)).as_secs_f64(),
        requests_per_fleet: d.fleet_requests() / n,
        reconciles_per_fleet: d.reconciles / n,
        cpu_s,
    })
}

fn at_rest(
    d: &Delta,
    fleets: usize,
    audited: BTreeMap<String, f64>,
    unsettled: usize,
    quiet: bool,
) -> AtRest {
    let minutes = d.seconds / 60.0;
    let per_fleet_min = |n: f64| n / fleets.max(1) as f64 / minutes;
    let per_min = |m: &BTreeMap<String, f64>| -> BTreeMap<String, f64> {
        m.iter().map(|(k, v)| (k.clone(), v / minutes)).collect()
    };
    AtRest {
        window_s: d.seconds,
        requests_per_fleet_per_min: per_fleet_min(d.fleet_requests()),
        writes_per_fleet_per_min: per_fleet_min(d.writes()),
        lease_requests_per_min: d.lease_requests() / minutes,
        per_fleet_per_min_by_request: d
            .requests
            .iter()
            .filter(|((_, r), _)| !crate::scrape::BACKGROUND_RESOURCES.contains(&r.as_str()))
            .map(|((v, r), n)| (format!("{v} {r}"), per_fleet_min(*n)))
            .collect(),
        per_min_by_request: d
            .requests
            .iter()
            .map(|((v, r), n)| (format!("{v} {r}"), n / minutes))
            .collect(),
        reconciles_per_min: d.reconciles / minutes,
        passes_per_min: d.passes.as_ref().map(per_min),
        escalations: d.escalations.clone(),
        reconcile_errors: d.errors.clone(),
        audited_writes_per_min: per_min(&audited),
        unsettled_after: unsettled,
        quiet_before: quiet,
    }
}

/// What one active fleet measured.
#[derive(Default)]
struct Samples {
    growth: Vec<f64>,
    contraction: Vec<f64>,
    restart: Vec<f64>,
    unobserved: usize,
    timeouts: usize,
    operations: usize,
}

const GROWTH: &str = "fleet replicas n→n+1 → workload replicas n→n+1 written (growth)";
const CONTRACTION: &str =
    "settled at n+1 → workload replicas n+1→n written (contraction queued during the growth)";
const RESTART: &str = "fleet restart token → workload template written (rolling restart)";

/// The reaction under load: every active fleet runs `cfg.rounds` operations at the same time
/// (even positions scale `members → members+1 → members`, odd ones restart by token), timed
/// through the bench's own watches; fleet `i` of the `k` active ones starts its first operation
/// `spread × i / k` after the first (zero: all at once).
async fn react(
    bed: &Bed,
    cfg: &ScaleConfig,
    board: &Board,
    active: &[FleetRef],
    tag: &str,
    hot: bool,
    spread: Duration,
) -> Result<Reaction> {
    let timelines = FleetTimelines::start(
        &bed.client,
        &active
            .iter()
            .map(|f| (f.ns.clone(), f.uid.clone()))
            .collect::<Vec<_>>(),
    );
    // Every followed fleet seen settled through the new watches before anything starts.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !active
        .iter()
        .all(|f| timelines.fleet(&f.uid).is_some_and(|o| o.settled))
    {
        if Instant::now() > deadline {
            bail!("the active fleets were not all seen settled within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // With a hot fleet the operator is never quiet (it re-checks that fleet every 2 s).
    let before = if hot {
        bed.metrics.snapshot().await?
    } else {
        bed.metrics
            .quiet_every(
                cfg.quiet,
                Duration::from_secs(120),
                Duration::from_secs(1),
                true,
            )
            .await?
            .0
    };
    let cpu_before = bed.operator().cpu_seconds().ok();
    let started = Instant::now();
    let samples = futures::future::join_all(active.iter().enumerate().map(|(i, f)| {
        let timelines = &timelines;
        let offset = spread.mul_f64(i as f64 / active.len().max(1) as f64);
        async move {
            tokio::time::sleep(offset).await;
            let from = Instant::now();
            let api = Api::<CelldFleet>::namespaced(bed.client.clone(), &f.ns);
            let samples = if i % 2 == 0 {
                scale_rounds(&api, timelines, f, cfg.members, cfg.rounds).await
            } else {
                restart_rounds(&api, timelines, f, cfg.members, cfg.rounds, tag).await
            };
            (samples, (from, Instant::now()))
        }
    }))
    .await;
    let (samples, busy): (Vec<Samples>, Vec<(Instant, Instant)>) = samples.into_iter().unzip();
    let (at_once_peak, at_once_mean) = at_once(&busy);
    let seconds = started.elapsed().as_secs_f64();
    let cpu_after = bed.operator().cpu_seconds().ok();
    let after = bed.metrics.snapshot().await?;
    drop(timelines);
    // Every fleet back at rest before the next phase (a timed-out one may still be moving).
    board
        .wait_settled(board_size(board), STEP_LIMIT, "after the reaction")
        .await?;
    let d = after.since(&before);
    let minutes = d.seconds / 60.0;
    let mut all = Samples::default();
    for s in samples {
        all.growth.extend(s.growth);
        all.contraction.extend(s.contraction);
        all.restart.extend(s.restart);
        all.unobserved += s.unobserved;
        all.timeouts += s.timeouts;
        all.operations += s.operations;
    }
    let every: Vec<f64> = all
        .growth
        .iter()
        .chain(&all.contraction)
        .chain(&all.restart)
        .copied()
        .collect();
    let per_min = |m: &BTreeMap<String, f64>| -> BTreeMap<String, f64> {
        m.iter().map(|(k, v)| (k.clone(), v / minutes)).collect()
    };
    Ok(Reaction {
        active_fleets: active.len(),
        spread_ms: spread.as_millis() as u64,
        active_at_once_peak: at_once_peak,
        active_at_once_mean: at_once_mean,
        scaling: active.len().div_ceil(2),
        restarting: active.len() / 2,
        rounds: cfg.rounds,
        rows: vec![
            ReactionRow {
                figure: GROWTH.into(),
                ms: summarize(&all.growth),
            },
            ReactionRow {
                figure: CONTRACTION.into(),
                ms: summarize(&all.contraction),
            },
            ReactionRow {
                figure: RESTART.into(),
                ms: summarize(&all.restart),
            },
        ],
        all_ms: summarize(&every),
        unobserved_settles: all.unobserved,
        timeouts: all.timeouts,
        seconds,
        operations: all.operations,
        requests_per_operation: (all.operations > 0)
            .then(|| d.fleet_requests() / all.operations as f64),
        reconciles_per_operation: (all.operations > 0)
            .then(|| d.reconciles / all.operations as f64),
        cpu_ms_per_operation: match (cpu_before, cpu_after) {
            (Some(b), Some(a)) if all.operations > 0 => {
                Some((a - b) * 1000.0 / all.operations as f64)
            }
            _ => None,
        },
        requests_per_min: d.fleet_requests() / minutes,
        reconciles_per_min: d.reconciles / minutes,
        passes_per_min: d.passes.as_ref().map(per_min),
        escalations: d.escalations.clone(),
        reconcile_ms_mean: (d.reconciles > 0.0)
            .then(|| d.reconcile_seconds * 1000.0 / d.reconciles),
        slots_busy: if d.seconds > 0.0 {
            d.reconcile_seconds / d.seconds
        } else {
            0.0
        },
        request_ms_by_verb: d.request_ms_by_verb(),
        reaction_ms_by_part: d.reaction_ms_by_part(),
        reaction_requests_mean: d.reaction_requests_mean(),
        per_operation_by_request: d
            .requests
            .iter()
            .filter(|((_, r), _)| !crate::scrape::BACKGROUND_RESOURCES.contains(&r.as_str()))
            .filter(|_| all.operations > 0)
            .map(|((v, r), n)| (format!("{v} {r}"), n / all.operations as f64))
            .collect(),
    })
}

fn board_size(board: &Board) -> usize {
    board.settled.lock().map(|m| m.len()).unwrap_or(0)
}

/// Waits until `done(marks since from, fleet)` or [`STEP_LIMIT`]; `false` on timeout.
async fn wait_for(
    timelines: &FleetTimelines,
    uid: &str,
    from: usize,
    done: impl Fn(&[crate::timeline::Stamped], &crate::timeline::FleetObs) -> bool,
) -> bool {
    let deadline = Instant::now() + STEP_LIMIT;
    loop {
        let marks = timelines.marks_since(uid, from);
        if let Some(f) = timelines.fleet(uid) {
            if done(&marks, &f) {
                return true;
            }
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn merge(api: &Api<CelldFleet>, name: &str, patch: serde_json::Value) -> Result<()> {
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("patching fleet {name}"))?;
    Ok(())
}

/// `rounds` times: `spec.replicas` n → n+1; as soon as the growth write is seen, back to n
/// (the contraction is planned once the workload rolled out at n+1); then wait until the fleet
/// is settled at n again.
async fn scale_rounds(
    api: &Api<CelldFleet>,
    timelines: &FleetTimelines,
    f: &FleetRef,
    n: i32,
    rounds: usize,
) -> Samples {
    let mut s = Samples::default();
    for _ in 0..rounds {
        let from = timelines.marks_len(&f.uid);
        if let Err(e) = merge(api, &f.name, json!({"spec": {"replicas": n + 1}})).await {
            progress(&format!("[scale] {}/{}: {e:#}", f.ns, f.name));
            s.timeouts += 1;
            break;
        }
        let grown = |m: &[crate::timeline::Stamped], _: &crate::timeline::FleetObs| {
            m.iter()
                .any(|m| m.mark == Mark::WorkloadReplicas { from: n, to: n + 1 })
        };
        if !wait_for(timelines, &f.uid, from, grown).await {
            progress(&format!(
                "[scale] {}/{}: growth write not seen within {STEP_LIMIT:?}",
                f.ns, f.name
            ));
            s.timeouts += 1;
            break;
        }
        if let Err(e) = merge(api, &f.name, json!({"spec": {"replicas": n}})).await {
            progress(&format!("[scale] {}/{}: {e:#}", f.ns, f.name));
            s.timeouts += 1;
            break;
        }
        let back = |m: &[crate::timeline::Stamped], o: &crate::timeline::FleetObs| {
            o.replicas == n
                && o.settled
                && m.iter()
                    .any(|m| m.mark == Mark::WorkloadReplicas { from: n + 1, to: n })
        };
        if !wait_for(timelines, &f.uid, from, back).await {
            progress(&format!(
                "[scale] {}/{}: contraction not settled within {STEP_LIMIT:?}",
                f.ns, f.name
            ));
            s.timeouts += 1;
            break;
        }
        let marks = timelines.marks_since(&f.uid, from);
        if let Some(ms) = request_to_write(
            &marks,
            |m| *m == Mark::FleetReplicas(n + 1),
            |m| matches!(m, Mark::WorkloadReplicas { from, to } if to > from),
        ) {
            s.growth.push(ms);
        }
        s.operations += 2;
        match settled_to_decrease(&marks, n) {
            Ok(Some(ms)) => s.contraction.push(ms),
            Ok(None) => {}
            Err(()) => s.unobserved += 1,
        }
    }
    s
}

/// `rounds` times: a new `spec.maintenance.restartToken`; wait until the fleet reports it
/// applied and is settled.
async fn restart_rounds(
    api: &Api<CelldFleet>,
    timelines: &FleetTimelines,
    f: &FleetRef,
    n: i32,
    rounds: usize,
    tag: &str,
) -> Samples {
    let mut s = Samples::default();
    for round in 0..rounds {
        let from = timelines.marks_len(&f.uid);
        let token = format!("{tag}-{}-{round}", f.name);
        let patch = json!({"spec": {"maintenance": {"restartToken": token}}});
        if let Err(e) = merge(api, &f.name, patch).await {
            progress(&format!("[scale] {}/{}: {e:#}", f.ns, f.name));
            s.timeouts += 1;
            break;
        }
        let done = |m: &[crate::timeline::Stamped], o: &crate::timeline::FleetObs| {
            o.replicas == n
                && o.settled
                && o.last_token.as_deref() == Some(token.as_str())
                && m.iter().any(|m| m.mark == Mark::WorkloadTemplate)
        };
        if !wait_for(timelines, &f.uid, from, done).await {
            progress(&format!(
                "[scale] {}/{}: restart not settled within {STEP_LIMIT:?}",
                f.ns, f.name
            ));
            s.timeouts += 1;
            break;
        }
        let marks = timelines.marks_since(&f.uid, from);
        if let Some(ms) = request_to_write(
            &marks,
            |m| matches!(m, Mark::FleetToken(_)),
            |m| *m == Mark::WorkloadTemplate,
        ) {
            s.restart.push(ms);
        }
        s.operations += 1;
    }
    s
}

/// The reaction again, with one extra fleet whose rolling upgrade to an image the test
/// kubelet cannot pull never finishes (its open operation is re-checked every 2 s); the hot
/// fleet is deleted afterwards.
#[allow(clippy::too_many_arguments)]
async fn fairness(
    bed: &Bed,
    cfg: &ScaleConfig,
    board: &Board,
    active: &[FleetRef],
    size: usize,
    design: &Design,
    tag: &str,
    without: &Reaction,
) -> Result<Fairness> {
    let ns = bed.namespace(&format!("hot{size}{}", design.tag())).await?;
    let api = Api::<CelldFleet>::namespaced(bed.client.clone(), &ns);
    let name = "hot";
    api.create(
        &PostParams::default(),
        &fleet(name, "PersistentFleet", cfg.members, &bed.bucket(&ns, name))?,
    )
    .await?;
    let members = cfg.members;
    wait_fleet(&api, name, STEP_LIMIT, "the hot fleet provisioned", |f| {
        fleet_settled(f, members)
    })
    .await?;
    let image = hot_image();
    merge(&api, name, json!({"spec": {"runtimeImage": image}})).await?;
    wait_fleet(
        &api,
        name,
        STEP_LIMIT,
        "the hot fleet's upgrade open",
        |f| {
            f.status
                .as_ref()
                .is_some_and(|s| s.current_operation.is_some())
        },
    )
    .await?;
    // Let the StatefulSet controller replace the first member with one that cannot start.
    tokio::time::sleep(Duration::from_secs(5)).await;
    progress(&format!(
        "[scale] {size} fleets, {}: hot fleet {ns}/{name} upgrading to an unpullable image; reaction again",
        design.name()
    ));
    let with_hot = react(
        bed,
        cfg,
        board,
        active,
        &format!("{tag}h"),
        true,
        Duration::ZERO,
    )
    .await?;
    progress(&format!(
        "[scale] {size} fleets, {}: reaction with the hot fleet {}",
        design.name(),
        summary_line(&with_hot)
    ));
    let hot_operation = api.get_opt(name).await?.and_then(|f| {
        f.status.and_then(|s| {
            s.current_operation
                .map(|o| format!("{:?} {:?}", o.kind, o.phase))
        })
    });
    remove_hot(bed, &api, &ns, name).await?;
    Ok(Fairness {
        hot_fleet: format!("{ns}/{name}"),
        hot_image: image,
        hot_operation,
        p99_without_ms: without.all_ms.as_ref().map(|s| s.p99),
        p99_with_ms: with_hot.all_ms.as_ref().map(|s| s.p99),
        with_hot,
    })
}

/// Deletes the hot fleet through the operator (finalizer stripped if that takes over 3
/// minutes) and its namespace, which is left to go in the background.
async fn remove_hot(bed: &Bed, api: &Api<CelldFleet>, ns: &str, name: &str) -> Result<()> {
    let _ = api.delete(name, &DeleteParams::default()).await;
    let deadline = Instant::now() + Duration::from_secs(180);
    while api.get_opt(name).await?.is_some() {
        if Instant::now() > deadline {
            progress(&format!(
                "[scale] the hot fleet {ns}/{name} was not deleted within 180 s: stripping its finalizer"
            ));
            let strip = json!({"metadata": {"finalizers": null}});
            let _ = api
                .patch(name, &PatchParams::default(), &Patch::Merge(&strip))
                .await;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(bed.client.clone())
        .delete(ns, &DeleteParams::default())
        .await;
    Ok(())
}

#[cfg(test)]
mod at_once_tests {
    use super::at_once;
    use std::time::{Duration, Instant};

    #[test]
    fn overlapping_intervals_are_counted_at_their_peak_and_on_average() {
        let t = Instant::now();
        let s = |a: u64, b: u64| (t + Duration::from_secs(a), t + Duration::from_secs(b));
        // 0–10, 2–6, 4–12, and 12–14 touching the third: at most 3 at once (4–6); 24 busy
        // seconds over a 14 s span.
        let (peak, mean) = at_once(&[s(0, 10), s(2, 6), s(4, 12), s(12, 14)]);
        assert_eq!(peak, 3);
        assert!((mean - 24.0 / 14.0).abs() < 1e-9, "{mean}");
        assert_eq!(at_once(&[]), (0, 0.0));
    }
}

#[cfg(test)]
mod design_tests {
    use super::Design;

    #[test]
    fn a_design_is_a_base_and_optional_flags() {
        let c = Design::parse("cached").unwrap();
        assert_eq!(
            (c.name(), c.flags(), c.tag()),
            ("cached", vec![], "c".into())
        );
        let f = Design::parse(" fresh ").unwrap();
        assert_eq!(f.flags(), vec!["--test-fresh-reads".to_string()]);
        assert_eq!(f.tag(), "f");
        let t = Design::parse("fresh+--reconcile-concurrency=32+--x").unwrap();
        assert_eq!(t.name(), "fresh+--reconcile-concurrency=32+--x");
        assert_eq!(
            t.flags(),
            vec![
                "--test-fresh-reads".to_string(),
                "--reconcile-concurrency=32".into(),
                "--x".into()
            ]
        );
        assert_eq!(t.tag(), "frency32xe34b");
        let p = Design::parse("cached+pad:48000+--x").unwrap();
        assert_eq!((p.padding(), p.flags()), (48000, vec!["--x".to_string()]));
        assert_eq!(p.tag(), "cxp48000afd2");
        assert_eq!(c.padding(), 0);
        assert!(Design::parse("cached+pad:0").is_err());
        assert!(Design::parse("cached+pad:many").is_err());
        assert!(Design::parse("cached+pad:1+pad:2").is_err());
        let b = Design::parse("cached+bin:/tmp/op-main+--reconcile-concurrency=4").unwrap();
        assert_eq!(b.binary(), Some(std::path::Path::new("/tmp/op-main")));
        assert_eq!(b.flags(), vec!["--reconcile-concurrency=4".to_string()]);
        assert_eq!(b.tag(), "cmpopmainbed5");
        // Items that end alike still get their own tags.
        let (x, y) = (
            Design::parse("cached+--test-forget-all-on-write+--status-progress-interval=1s")
                .unwrap(),
            Design::parse("cached+--status-progress-interval=1s").unwrap(),
        );
        assert_eq!(
            (x.tag(), y.tag()),
            ("cterval1sc930".into(), "cterval1sb3e9".into())
        );
        assert_eq!(Design::parse("cached").unwrap().binary(), None);
        assert!(Design::parse("cached+bin:").is_err());
        assert!(Design::parse("cached+bin:/a+bin:/b").is_err());
        assert!(Design::parse("cache").is_err());
        assert!(Design::parse("cached+reconcile").is_err());
        assert!(Design::parse("cached+--").is_err());
        let e = Design::parse("cached+MALLOC_ARENA_MAX=2").unwrap();
        assert_eq!(e.flags(), vec!["MALLOC_ARENA_MAX=2".to_string()]);
        assert!(super::is_env("A=1") && !super::is_env("--a=1") && !super::is_env("=1"));
    }
}

#[cfg(test)]
mod active_picks_tests {
    use super::{ActivePicks, FleetRef};

    fn bed(n: usize) -> Vec<FleetRef> {
        (0..n)
            .map(|i| FleetRef {
                ns: "bench-0".into(),
                name: format!("f{i}"),
                uid: format!("u{i}"),
            })
            .collect()
    }

    #[test]
    fn each_design_acts_on_fleets_no_earlier_one_did_until_the_bed_runs_out() {
        let b = bed(10);
        let mut picks = ActivePicks::default();
        let names = |a: super::ActiveFleets<'_>| {
            (
                a.first,
                a.fresh,
                a.fleets.iter().map(|f| f.name.clone()).collect::<Vec<_>>(),
            )
        };
        assert_eq!(
            names(picks.next(&b, 4)),
            (
                0,
                true,
                vec!["f0".into(), "f1".into(), "f2".into(), "f3".into()]
            )
        );
        assert_eq!(names(picks.next(&b, 4)).0, 4);
        // Two left: the first four again, and it says so, as does every pick of used fleets.
        let third = names(picks.next(&b, 4));
        assert_eq!((third.0, third.1, third.2.len()), (0, false, 4));
        assert!(!names(picks.next(&b, 4)).1);
        // A larger bed (the next size) continues after every fleet handed out so far.
        let b = bed(20);
        assert_eq!(names(picks.next(&b, 5)).0, 8);
        let fifth = names(picks.next(&b, 5));
        assert_eq!((fifth.0, fifth.1), (13, true));
        // Never more than the bed.
        assert_eq!(names(picks.next(&bed(3), 5)).2.len(), 3);
    }
}
