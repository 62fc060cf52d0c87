//! The printed tables and `target/bench/operator.json`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::Serialize;

use crate::ops::{OpKind, OpsResult};
use crate::scale::ScaleResult;
use crate::stats::{median, summarize, Summary};

/// Where and what was measured.
#[derive(Debug, Clone, Serialize)]
pub struct Meta {
    /// UTC time the run started.
    pub started_at: String,
    /// Wall time of the whole run (s).
    pub duration_s: f64,
    /// `git rev-parse HEAD` of the checkout.
    pub git_commit: String,
    /// Uncommitted changes (`git status --porcelain`) under src/, journal/, crds/: the
    /// operator measured was built from the working tree.
    pub uncommitted: Vec<String>,
    /// The operator binary and its cargo profile.
    pub operator_binary: String,
    /// `release` or `debug`, from the binary's folder.
    pub operator_profile: String,
    /// CPUs of the machine (control plane, kubelet, operator and bench share them).
    pub cpus: usize,
    /// Test kubelet Nodes.
    pub nodes: usize,
    /// `/proc/loadavg` at the start and at the end (other work on the machine skews figures).
    pub loadavg: [String; 2],
    /// Control plane folder and API server.
    pub cluster: String,
    /// The options the run was started with.
    pub options: BTreeMap<String, String>,
}

/// One latency figure.
#[derive(Debug, Clone, Serialize)]
pub struct LatencyRow {
    /// Fleet profile.
    pub profile: String,
    /// What is timed.
    pub figure: String,
    /// Milliseconds.
    pub ms: Option<Summary>,
}

/// Requests of one operation kind.
#[derive(Debug, Clone, Serialize)]
pub struct OpRow {
    /// Fleet profile.
    pub profile: String,
    /// Operation.
    pub operation: String,
    /// Write requests (create/update/patch/delete), leases excluded.
    pub writes: Option<Summary>,
    /// get + list requests, leases excluded.
    pub reads: Option<Summary>,
    /// Reconciles run.
    pub reconciles: Option<Summary>,
    /// Median per `verb resource` (every verb; leases included for completeness).
    pub by_request: BTreeMap<String, f64>,
    /// Median journal entries appended, by type.
    pub journal_appends: BTreeMap<String, f64>,
    /// Median of the operator's writes as answered (audit log), by `verb resource code`.
    pub audited_writes: BTreeMap<String, f64>,
    /// Failed reconciles summed over all samples, by reason.
    pub reconcile_errors_total: BTreeMap<String, f64>,
    /// Samples whose "after" scrape was taken before the operator fell quiet.
    pub not_quiet: usize,
}

/// The whole report (also the JSON document).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Context.
    pub meta: Meta,
    /// Figure 1.
    pub latency: Vec<LatencyRow>,
    /// Contraction steps whose settle was not seen before the next write, per profile.
    pub unobserved_settles: BTreeMap<String, usize>,
    /// Figure 2.
    pub writes_per_operation: Vec<OpRow>,
    /// Figures 3 and 4.
    pub scale: ScaleResult,
}

fn median_map<'a>(maps: impl Iterator<Item = BTreeMap<String, f64>> + 'a) -> BTreeMap<String, f64> {
    let maps: Vec<_> = maps.collect();
    let keys: BTreeSet<String> = maps.iter().flat_map(|m| m.keys().cloned()).collect();
    keys.into_iter()
        .map(|k| {
            let samples: Vec<f64> = maps
                .iter()
                .map(|m| m.get(&k).copied().unwrap_or(0.0))
                .collect();
            (k, median(&samples))
        })
        .filter(|(_, v)| *v != 0.0)
        .collect()
}

/// Figure 1 and 2 rows from the scenarios.
pub fn from_ops(results: &[OpsResult]) -> (Vec<LatencyRow>, BTreeMap<String, usize>, Vec<OpRow>) {
    let mut latency = Vec::new();
    let mut unobserved = BTreeMap::new();
    let mut ops = Vec::new();
    for r in results {
        let row = |figure: &str, v: &[f64]| LatencyRow {
            profile: r.profile.clone(),
            figure: figure.into(),
            ms: summarize(v),
        };
        latency.push(row(
            "settled at n → replicas n→n-1 written (contraction)",
            &r.settled_to_next_removal,
        ));
        latency.push(row(
            "fleet replicas +1 → workload replicas +1 (growth)",
            &r.growth,
        ));
        latency.push(row(
            "fleet replicas n→1 → first workload decrease",
            &r.contraction_start,
        ));
        latency.push(row(
            "fleet created → workload created (Provision)",
            &r.provision,
        ));
        unobserved.insert(r.profile.clone(), r.unobserved_settles);
        let kinds: BTreeSet<OpKind> = r.ops.iter().map(|o| o.kind).collect();
        for kind in kinds {
            let samples: Vec<_> = r.ops.iter().filter(|o| o.kind == kind).collect();
            let figure = |f: &dyn Fn(&crate::scrape::Delta) -> f64| {
                summarize(&samples.iter().map(|s| f(&s.delta)).collect::<Vec<_>>())
            };
            let mut errors = BTreeMap::new();
            for s in &samples {
                for (k, v) in &s.delta.errors {
                    *errors.entry(k.clone()).or_insert(0.0) += v;
                }
            }
            ops.push(OpRow {
                profile: r.profile.clone(),
                operation: kind.label(r.members),
                writes: figure(&|d| d.writes()),
                reads: figure(&|d| d.reads()),
                reconciles: figure(&|d| d.reconciles),
                by_request: median_map(samples.iter().map(|s| {
                    s.delta
                        .requests
                        .iter()
                        .map(|((v, res), n)| (format!("{v} {res}"), *n))
                        .collect()
                })),
                journal_appends: median_map(samples.iter().map(|s| s.delta.appends.clone())),
                audited_writes: median_map(samples.iter().map(|s| s.audited.clone())),
                reconcile_errors_total: errors,
                not_quiet: samples.iter().filter(|s| s.not_quiet).count(),
            });
        }
    }
    (latency, unobserved, ops)
}

fn num(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 || v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() < 0.1 {
        format!("{v:.3}")
    } else {
        format!("{v:.2}")
    }
}

fn breakdown(m: &BTreeMap<String, f64>, keep: impl Fn(&str) -> bool) -> String {
    let mut items: Vec<(&String, &f64)> = m.iter().filter(|(k, _)| keep(k)).collect();
    items.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.cmp(b.0)));
    if items.is_empty() {
        return "none".into();
    }
    items
        .iter()
        .map(|(k, v)| format!("{k} {}", num(**v)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn is_write_key(k: &str) -> bool {
    let verb = k.split(' ').next().unwrap_or("");
    crate::scrape::WRITE_VERBS.contains(&verb) && !k.ends_with(" leases")
}

fn is_read_key(k: &str) -> bool {
    (k.starts_with("get ") || k.starts_with("list ")) && !k.ends_with(" leases")
}

impl Report {
    /// The tables as printed at the end of the run.
    pub fn text(&self) -> String {
        let mut o = String::new();
        let m = &self.meta;
        let _ = writeln!(o, "\ncelld-operator benchmark — {} (commit {}{}), operator {} build, {} CPUs, {} test-kubelet Nodes, run took {:.0} s, load average {} → {}",
            m.started_at, &m.git_commit[..m.git_commit.len().min(10)],
            if m.uncommitted.is_empty() { String::new() } else { format!(" + {} uncommitted changes", m.uncommitted.len()) },
            m.operator_profile, m.cpus, m.nodes, m.duration_s, m.loadavg[0], m.loadavg[1]);

        let _ = writeln!(
            o,
            "\n1. Latency, ms (bench watches, local monotonic clock; no-process members)"
        );
        let _ = writeln!(
            o,
            "   {:<16} {:<54} {:>4} {:>8} {:>8} {:>8} {:>8}",
            "profile", "from → to", "n", "median", "p90", "min", "max"
        );
        for r in &self.latency {
            match &r.ms {
                Some(s) => {
                    let _ = writeln!(
                        o,
                        "   {:<16} {:<54} {:>4} {:>8.0} {:>8.0} {:>8.0} {:>8.0}",
                        r.profile, r.figure, s.n, s.median, s.p90, s.min, s.max
                    );
                }
                None => {
                    let _ = writeln!(o, "   {:<16} {:<54} {:>4}", r.profile, r.figure, 0);
                }
            }
        }
        for (p, n) in &self.unobserved_settles {
            if *n > 0 {
                let _ = writeln!(o, "   {p}: {n} contraction step(s) had no settle visible to the bench before the next write (not sampled)");
            }
        }

        let _ = writeln!(o, "\n2. API requests per operation (operator's celld_operator_api_requests_total deltas; Lease traffic excluded; median over n)");
        let _ = writeln!(
            o,
            "   {:<16} {:<40} {:>3} {:>7} {:>6} {:>6} {:>10}",
            "profile", "operation", "n", "writes", "p90", "reads", "reconciles"
        );
        for r in &self.writes_per_operation {
            let s = |x: &Option<Summary>| x.as_ref().map_or("-".into(), |s| num(s.median));
            let p = |x: &Option<Summary>| x.as_ref().map_or("-".into(), |s| num(s.p90));
            let _ = writeln!(
                o,
                "   {:<16} {:<40} {:>3} {:>7} {:>6} {:>6} {:>10}",
                r.profile,
                r.operation,
                r.writes.as_ref().map_or(0, |s| s.n),
                s(&r.writes),
                p(&r.writes),
                s(&r.reads),
                s(&r.reconciles)
            );
            let _ = writeln!(
                o,
                "   {:<16}   writes: {}",
                "",
                breakdown(&r.by_request, is_write_key)
            );
            let _ = writeln!(
                o,
                "   {:<16}   reads:  {}",
                "",
                breakdown(&r.by_request, is_read_key)
            );
            let mut extra = Vec::new();
            let rejected = crate::audit::rejected(&r.audited_writes);
            if !rejected.is_empty() {
                extra.push(format!(
                    "rejected by the API server (audit log, median): {}",
                    breakdown(&rejected, |_| true)
                ));
            }
            if !r.journal_appends.is_empty() {
                extra.push(format!(
                    "journal entries: {}",
                    breakdown(&r.journal_appends, |_| true)
                ));
            }
            if !r.reconcile_errors_total.is_empty() {
                extra.push(format!(
                    "failed reconciles (sum over n): {}",
                    breakdown(&r.reconcile_errors_total, |_| true)
                ));
            }
            if r.not_quiet > 0 {
                extra.push(format!("{} sample(s) not quiet", r.not_quiet));
            }
            if !extra.is_empty() {
                let _ = writeln!(o, "   {:<16}   {}", "", extra.join("; "));
            }
        }

        let _ = writeln!(
            o,
            "\n3. At-rest API requests (all fleets settled, Bucket, 1 no-process member each)"
        );
        let _ = writeln!(
            o,
            "   {:>6} {:>4} {:>8} {:>14} {:>16} {:>14}  per fleet per minute by verb (Lease excluded)",
            "fleets",
            "ns",
            "window",
            "req/fleet/min",
            "writes/fleet/min",
            "reconciles/min",
        );
        for a in &self.scale.at_rest {
            let _ = writeln!(
                o,
                "   {:>6} {:>4} {:>7.0}s {:>14.3} {:>16.3} {:>14.1}  {}",
                a.fleets,
                a.namespaces,
                a.window_s,
                a.per_fleet_per_min,
                a.writes_per_fleet_per_min,
                a.reconciles_per_min,
                breakdown(&a.per_fleet_per_min_by_verb, |_| true)
            );
            let _ = writeln!(
                o,
                "   {:>6}   whole operator per minute: {}",
                "",
                breakdown(&a.per_min_by_request, |_| true)
            );
            let rejected = crate::audit::rejected(&a.audited_writes_per_min);
            if !rejected.is_empty() {
                let _ = writeln!(
                    o,
                    "   {:>6}   rejected writes per minute (audit log): {}",
                    "",
                    breakdown(&rejected, |_| true)
                );
            }
            if a.unsettled_after > 0 || !a.quiet_before {
                let _ = writeln!(
                    o,
                    "   {:>6}   note: {} fleet(s) unsettled after the window; quiet before: {}",
                    "", a.unsettled_after, a.quiet_before
                );
            }
        }

        if let Some(i) = &self.scale.idle_reconcile {
            let _ = writeln!(o, "   idle reconcile of a settled fleet (annotation touched on all {} fleets): {:.2} reconciles, {:.1} requests, {:.1} writes per fleet", i.fleets, i.reconciles_per_fleet, i.total_per_fleet, i.writes_per_fleet);
            let _ = writeln!(
                o,
                "      per fleet: {}",
                breakdown(&i.requests_per_fleet, |_| true)
            );
            if !i.rejected_per_fleet.is_empty() {
                let _ = writeln!(
                    o,
                    "      rejected per fleet (audit log): {}",
                    breakdown(&i.rejected_per_fleet, |_| true)
                );
            }
            let _ = writeln!(o, "      → the 10-minute resync adds ≈ {:.2} requests per fleet per minute at rest (not seen in the windows above)", i.resync_per_fleet_per_min);
        }

        let w = &self.scale.watch_streams;
        if let Some(per_ns) = w.per_namespace {
            for a in &self.scale.at_rest {
                if let Some(e) = a.estimated_long_run_per_fleet_per_min {
                    let _ = writeln!(o, "   long-run estimate (derived, not measured), {} fleets: ≈ {:.2} requests per fleet per minute = Lease as measured + {:.0} watch streams ({:.0} cluster-wide + {:.0} per namespace × {}) re-opened every {:.0} s + resync",
                        a.fleets, e, w.cluster_wide + per_ns * a.namespaces as f64, w.cluster_wide, per_ns, a.namespaces, crate::scale::WATCH_REOPEN_S);
                }
            }
        }

        let _ = writeln!(o, "\n4. Operator RSS (/proc/PID/status; fresh operator process for this phase; Bucket fleets, 1 no-process member each)");
        let _ = writeln!(
            o,
            "   {:>6} {:>4} {:>10} {:>10} {:>12}",
            "fleets", "ns", "VmRSS MiB", "VmHWM MiB", "settled in s"
        );
        for mm in &self.scale.memory {
            let _ = writeln!(
                o,
                "   {:>6} {:>4} {:>10.1} {:>10.1} {:>12.0}",
                mm.fleets,
                mm.namespaces,
                mm.rss_kib as f64 / 1024.0,
                mm.hwm_kib as f64 / 1024.0,
                mm.settle_s
            );
        }
        o
    }
}
