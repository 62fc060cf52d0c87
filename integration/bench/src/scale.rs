//! Figures 3 and 4: many 1-member Bucket fleets (Deployment, no-process member), added in
//! steps to each requested size. At every size the bench waits until all are settled and the
//! operator fell quiet, then reads the operator's RSS, and for the at-rest sizes counts every
//! request over a window.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use celld_operator::api::CelldFleet;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde::Serialize;

use crate::bed::{fleet, fleet_settled, progress, Bed};
use crate::scrape::{Delta, BACKGROUND_RESOURCES};

/// Sizes and layout.
#[derive(Debug, Clone)]
pub struct ScaleConfig {
    /// Fleet counts for the at-rest window.
    pub at_rest: Vec<usize>,
    /// Fleet counts for RSS.
    pub rss: Vec<usize>,
    /// Length of the at-rest window.
    pub window: Duration,
    /// Fleets per namespace (the operator runs 8 watches per fleet namespace).
    pub per_namespace: usize,
    /// How long the operator must send nothing (Lease aside) before a size counts as at rest.
    pub quiet: Duration,
}

/// At-rest traffic at one size.
#[derive(Debug, Clone, Serialize)]
pub struct AtRest {
    /// Settled fleets.
    pub fleets: usize,
    /// Namespaces they are spread over.
    pub namespaces: usize,
    /// Window length (s).
    pub window_s: f64,
    /// All requests, leases included, per fleet per minute.
    pub per_fleet_per_min: f64,
    /// Requests per fleet per minute by verb, leases excluded.
    pub per_fleet_per_min_by_verb: BTreeMap<String, f64>,
    /// Write requests per fleet per minute, leases excluded.
    pub writes_per_fleet_per_min: f64,
    /// Requests per minute for the whole operator by `verb resource` (leases included).
    pub per_min_by_request: BTreeMap<String, f64>,
    /// Reconciles per minute (whole operator).
    pub reconciles_per_min: f64,
    /// Fleets no longer settled at the end of the window.
    pub unsettled_after: usize,
    /// The operator was quiet (Lease aside) before the window started.
    pub quiet_before: bool,
    /// The operator's writes per minute as the audit log answered them, by `verb resource code`.
    pub audited_writes_per_min: BTreeMap<String, f64>,
    /// Derived, not measured: what a window of many minutes would show per fleet per minute
    /// (Lease + watch re-opens + the 10-minute resync; see `long_run_estimate`).
    pub estimated_long_run_per_fleet_per_min: Option<f64>,
}

/// Operator memory at one size.
#[derive(Debug, Clone, Serialize)]
pub struct Memory {
    /// Settled fleets.
    pub fleets: usize,
    /// Namespaces.
    pub namespaces: usize,
    /// VmRSS (KiB).
    pub rss_kib: u64,
    /// VmHWM, the peak RSS so far (KiB).
    pub hwm_kib: u64,
    /// Seconds from the first create of this step to all fleets settled.
    pub settle_s: f64,
}

/// Results of the scale phase.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ScaleResult {
    /// At-rest windows.
    pub at_rest: Vec<AtRest>,
    /// Memory at every size reached (the RSS sizes asked for, and the at-rest sizes).
    pub memory: Vec<Memory>,
    /// What one reconcile of a settled fleet costs (the 10-minute resync, which no at-rest
    /// window of a few minutes after provisioning sees).
    pub idle_reconcile: Option<IdleReconcile>,
    /// The operator's watch streams, for the long-run estimate.
    pub watch_streams: WatchStreams,
}

/// The operator's watch streams (each is re-opened every 290 s, kube-runtime's default watch
/// timeout: one `watch` request per stream per 290 s at rest).
#[derive(Debug, Clone, Default, Serialize)]
pub struct WatchStreams {
    /// Watches open before any fleet exists (the fleet controller's).
    pub cluster_wide: f64,
    /// Watches opened per fleet namespace (measured when the first namespaces got fleets).
    pub per_namespace: Option<f64>,
}

/// Seconds after which kube-runtime re-opens a watch (`timeoutSeconds=290`).
pub const WATCH_REOPEN_S: f64 = 290.0;

/// Long-run requests per fleet per minute at rest: the Lease as measured, every watch stream
/// re-opened each [`WATCH_REOPEN_S`], and one idle reconcile per fleet every 10 minutes.
fn long_run_estimate(a: &AtRest, streams: &WatchStreams, idle: &IdleReconcile) -> Option<f64> {
    let per_ns = streams.per_namespace?;
    if a.fleets == 0 {
        return None;
    }
    let lease: f64 = a
        .per_min_by_request
        .iter()
        .filter(|(k, _)| k.ends_with(" leases"))
        .map(|(_, v)| v)
        .sum();
    let watches = (streams.cluster_wide + per_ns * a.namespaces as f64) * 60.0 / WATCH_REOPEN_S;
    Some((lease + watches) / a.fleets as f64 + idle.resync_per_fleet_per_min)
}

/// Requests of one reconcile of a settled fleet, measured by touching an annotation of every
/// fleet (each touch is one watch event → one reconcile) and dividing by the fleets.
#[derive(Debug, Clone, Serialize)]
pub struct IdleReconcile {
    /// Fleets touched.
    pub fleets: usize,
    /// Reconciles counted per fleet (1 expected).
    pub reconciles_per_fleet: f64,
    /// Requests per fleet by `verb resource` (leases excluded).
    pub requests_per_fleet: BTreeMap<String, f64>,
    /// All requests per fleet, leases excluded.
    pub total_per_fleet: f64,
    /// Writes per fleet, leases excluded.
    pub writes_per_fleet: f64,
    /// Writes answered ≥ 400 per fleet (audit log), by `verb resource code`.
    pub rejected_per_fleet: BTreeMap<String, f64>,
    /// `total_per_fleet` spread over the 10-minute resync: requests per fleet per minute
    /// the resync adds at rest.
    pub resync_per_fleet_per_min: f64,
}

/// Runs the phase; its namespaces stay until [`Bed::down`] (deleting hundreds of fleets
/// through the operator is not what is measured here).
pub async fn run(bed: &Bed, cfg: &ScaleConfig) -> Result<ScaleResult> {
    let sizes: BTreeSet<usize> = cfg.at_rest.iter().chain(&cfg.rss).copied().collect();
    let per_ns = cfg.per_namespace.max(1);
    let mut namespaces: Vec<String> = Vec::new();
    let mut created = 0usize;
    let mut out = ScaleResult::default();
    let (start, _) = bed
        .metrics
        .quiet(cfg.quiet, Duration::from_secs(60))
        .await?;
    let mut streams = WatchStreams {
        cluster_wide: start
            .requests
            .iter()
            .filter(|((v, _), _)| v == "watch")
            .map(|(_, n)| n)
            .sum(),
        per_namespace: None,
    };
    for &size in &sizes {
        let step_start = Instant::now();
        let before_step = bed.metrics.snapshot().await?;
        let namespaces_before = namespaces.len();
        if size > created {
            progress(&format!(
                "[scale] creating fleets {created}..{size} ({per_ns} per namespace)"
            ));
            while namespaces.len() < size.div_ceil(per_ns) {
                let ns = bed.namespace(&format!("rest{}", namespaces.len())).await?;
                namespaces.push(ns);
            }
            let jobs: Vec<(String, String)> = (created..size)
                .map(|i| (namespaces[i / per_ns].clone(), format!("f{i:03}")))
                .collect();
            futures::stream::iter(jobs)
                .map(|(ns, name)| async move {
                    let f = fleet(&name, "Bucket", 1, &bed.bucket(&ns, &name))?;
                    Api::<CelldFleet>::namespaced(bed.client.clone(), &ns)
                        .create(&PostParams::default(), &f)
                        .await?;
                    Ok::<_, anyhow::Error>(())
                })
                .buffer_unordered(8)
                .try_collect::<Vec<_>>()
                .await?;
            created = size;
        }
        wait_all_settled(
            bed,
            &namespaces,
            size,
            Duration::from_secs(120 + 3 * size as u64),
        )
        .await?;
        let settle_s = step_start.elapsed().as_secs_f64();
        let (settled, quiet) = bed
            .metrics
            .quiet(cfg.quiet, Duration::from_secs(120))
            .await?;
        let new_namespaces = namespaces.len() - namespaces_before;
        if streams.per_namespace.is_none() && new_namespaces > 0 {
            // Watches opened while this step's namespaces got their first fleets (steps last
            // seconds, far less than the 290 s after which a watch is re-opened).
            let opened = settled
                .since(&before_step)
                .count(|v, r| v == "watch" && r != "celldfleets");
            streams.per_namespace = Some(opened / new_namespaces as f64);
        }
        progress(&format!(
            "[scale] {size} fleets settled in {settle_s:.0} s{}",
            if quiet {
                ""
            } else {
                " (operator still busy after 120 s)"
            }
        ));
        {
            let (rss_kib, hwm_kib) = bed.operator().memory_kib()?;
            progress(&format!(
                "[scale] {size} fleets: operator RSS {} MiB",
                rss_kib / 1024
            ));
            out.memory.push(Memory {
                fleets: size,
                namespaces: namespaces.len(),
                rss_kib,
                hwm_kib,
                settle_s,
            });
        }
        if cfg.at_rest.contains(&size) {
            progress(&format!(
                "[scale] {size} fleets at rest: counting requests for {:?}",
                cfg.window
            ));
            let before = bed.metrics.snapshot().await?;
            bed.operator_audit()?;
            tokio::time::sleep(cfg.window).await;
            let after = bed.metrics.snapshot().await?;
            let audited = bed.operator_audit()?;
            let unsettled = count_settled(bed, &namespaces)
                .await
                .map(|n| size - n.min(size))?;
            let mut figures = at_rest(
                &after.since(&before),
                size,
                namespaces.len(),
                unsettled,
                quiet,
            );
            let minutes = figures.window_s / 60.0;
            figures.audited_writes_per_min =
                audited.into_iter().map(|(k, v)| (k, v / minutes)).collect();
            out.at_rest.push(figures);
        }
    }
    if created > 0 {
        let idle = idle_reconcile(bed, &namespaces, created, cfg.quiet).await?;
        for a in &mut out.at_rest {
            a.estimated_long_run_per_fleet_per_min = long_run_estimate(a, &streams, &idle);
        }
        out.idle_reconcile = Some(idle);
    }
    out.watch_streams = streams;
    Ok(out)
}

/// Touches an annotation on every fleet and counts what the reconciles it causes send.
async fn idle_reconcile(
    bed: &Bed,
    namespaces: &[String],
    fleets: usize,
    quiet: Duration,
) -> Result<IdleReconcile> {
    progress(&format!(
        "[scale] idle reconcile: touching an annotation on all {fleets} fleets"
    ));
    let (before, _) = bed.metrics.quiet(quiet, Duration::from_secs(120)).await?;
    bed.operator_audit()?;
    let touch = serde_json::json!({"metadata": {"annotations": {"bench.celld.eric.dev/touch": bed.run_id}}});
    for ns in namespaces {
        let api = Api::<CelldFleet>::namespaced(bed.client.clone(), ns);
        for f in api.list(&ListParams::default()).await?.items {
            api.patch(
                &f.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&touch),
            )
            .await?;
        }
    }
    let (after, _) = bed.metrics.quiet(quiet, Duration::from_secs(300)).await?;
    let d = after.since(&before);
    let n = fleets as f64;
    let audited = bed.operator_audit()?;
    let total = d.count(|_, r| !BACKGROUND_RESOURCES.contains(&r)) / n;
    Ok(IdleReconcile {
        fleets,
        reconciles_per_fleet: d.reconciles / n,
        requests_per_fleet: d
            .requests
            .iter()
            .filter(|((_, r), _)| !BACKGROUND_RESOURCES.contains(&r.as_str()))
            .map(|((v, r), c)| (format!("{v} {r}"), c / n))
            .collect(),
        total_per_fleet: total,
        writes_per_fleet: d.writes() / n,
        rejected_per_fleet: crate::audit::rejected(&audited)
            .into_iter()
            .map(|(k, v)| (k, v / n))
            .collect(),
        resync_per_fleet_per_min: total / 10.0,
    })
}

fn at_rest(d: &Delta, fleets: usize, namespaces: usize, unsettled: usize, quiet: bool) -> AtRest {
    let minutes = d.seconds / 60.0;
    let per_fleet_min = |n: f64| {
        if fleets == 0 {
            0.0
        } else {
            n / fleets as f64 / minutes
        }
    };
    let mut by_verb = BTreeMap::new();
    for ((verb, resource), n) in &d.requests {
        if !BACKGROUND_RESOURCES.contains(&resource.as_str()) {
            *by_verb.entry(verb.clone()).or_insert(0.0) += per_fleet_min(*n);
        }
    }
    AtRest {
        fleets,
        namespaces,
        window_s: d.seconds,
        per_fleet_per_min: per_fleet_min(d.count(|_, _| true)),
        per_fleet_per_min_by_verb: by_verb,
        writes_per_fleet_per_min: per_fleet_min(d.writes()),
        per_min_by_request: d
            .requests
            .iter()
            .map(|((v, r), n)| (format!("{v} {r}"), n / minutes))
            .collect(),
        reconciles_per_min: d.reconciles / minutes,
        unsettled_after: unsettled,
        quiet_before: quiet,
        audited_writes_per_min: BTreeMap::new(),
        estimated_long_run_per_fleet_per_min: None,
    }
}

/// Fleets settled at 1 member across `namespaces`.
async fn count_settled(bed: &Bed, namespaces: &[String]) -> Result<usize> {
    let mut n = 0;
    for ns in namespaces {
        let list = Api::<CelldFleet>::namespaced(bed.client.clone(), ns)
            .list(&ListParams::default())
            .await?;
        n += list.items.iter().filter(|f| fleet_settled(f, 1)).count();
    }
    Ok(n)
}

async fn wait_all_settled(
    bed: &Bed,
    namespaces: &[String],
    want: usize,
    within: Duration,
) -> Result<()> {
    let deadline = Instant::now() + within;
    let mut last_report = Instant::now();
    loop {
        let n = count_settled(bed, namespaces).await?;
        if n >= want {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("only {n} of {want} fleets settled after {within:?}");
        }
        if last_report.elapsed() > Duration::from_secs(15) {
            progress(&format!("[scale] {n} of {want} fleets settled"));
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
