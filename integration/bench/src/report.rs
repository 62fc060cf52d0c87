//! The printed tables and `target/bench/operator.json`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::Serialize;

use crate::ops::{OpKind, OpsResult};
use crate::scale::{DesignResult, Reaction, ScaleResult, SizeResult};
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
    /// Figure 3, the scale bed (absent with --skip-scale).
    pub scale: Option<ScaleResult>,
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

        if !self.latency.is_empty() || !self.writes_per_operation.is_empty() {
            ops_text(&mut o, self);
        }
        if let Some(scale) = &self.scale {
            scale_text(&mut o, scale);
        }
        o
    }
}

/// Sections 1 and 2 (absent with --skip-ops).
fn ops_text(o: &mut String, rep: &Report) {
    {
        let _ = writeln!(
            o,
            "\n1. Latency, ms (bench watches, local monotonic clock; no-process members)"
        );
        let _ = writeln!(
            o,
            "   {:<16} {:<54} {:>4} {:>8} {:>8} {:>8} {:>8}",
            "profile", "from → to", "n", "median", "p90", "min", "max"
        );
        for r in &rep.latency {
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
        for (p, n) in &rep.unobserved_settles {
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
        for r in &rep.writes_per_operation {
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
    }
}

/// `v` with [`num`], or `n/a`.
fn opt(v: Option<f64>) -> String {
    v.map_or("n/a".into(), num)
}

fn opt_map(m: &Option<BTreeMap<String, f64>>) -> String {
    m.as_ref().map_or("n/a".into(), |m| breakdown(m, |_| true))
}

/// Section 3: the scale bed.
fn scale_text(o: &mut String, s: &ScaleResult) {
    let _ = writeln!(
        o,
        "\n3. Scale bed: PersistentFleet, {} no-process members per fleet (one claim each), {} fleets per namespace; at-rest window {:.0} s; {:.0} % of the fleets active, {} rounds each",
        s.members,
        s.fleets_per_namespace,
        s.window_s,
        s.active_fraction * 100.0,
        s.rounds
    );
    for (design, why) in &s.skipped_designs {
        let _ = writeln!(o, "   design {design} not run: {why}");
    }
    for size in &s.sizes {
        size_text(o, size);
    }
}

fn size_text(o: &mut String, size: &SizeResult) {
    let c = &size.creation;
    let _ = writeln!(
        o,
        "\n   {} fleets ({} Pods and claims, {} namespaces): {} created for this size in {:.0} s ({:.2} fleets/s, operator {} running)",
        size.fleets, size.pods, size.namespaces, c.created, c.seconds, c.fleets_per_s, c.operator
    );
    let names: Vec<&str> = size.designs.iter().map(|d| d.design.as_str()).collect();
    let mut head = format!("   {:<44}", "figure");
    for n in &names {
        head.push_str(&format!(" {n:>12}"));
    }
    head.push_str(&format!(" {:>13}", "fresh÷cached"));
    let _ = writeln!(o, "{head}");
    for r in &size.ratios {
        let mut line = format!("   {:<44}", r.figure);
        for n in &names {
            line.push_str(&format!(
                " {:>12}",
                opt(r.values.get(*n).copied().flatten())
            ));
        }
        line.push_str(&format!(
            " {:>13}",
            r.fresh_over_cached
                .map_or("n/a".into(), |x| format!("{x:.2}"))
        ));
        let _ = writeln!(o, "{line}");
    }
    for d in &size.designs {
        design_text(o, d);
    }
}

fn design_text(o: &mut String, d: &DesignResult) {
    let a = &d.at_rest;
    let pad = "      ";
    let _ = writeln!(
        o,
        "   {}{}:",
        d.design,
        if d.flags.is_empty() {
            String::new()
        } else {
            format!(" ({})", d.flags.join(" "))
        }
    );
    let _ = writeln!(
        o,
        "{pad}start-up: {:.1} requests and {:.2} reconciles per fleet until quiet",
        d.startup.requests_per_fleet, d.startup.reconciles_per_fleet
    );
    let _ = writeln!(
        o,
        "{pad}at rest, per fleet per minute (Lease excluded): {}",
        breakdown(&a.per_fleet_per_min_by_request, |_| true)
    );
    let _ = writeln!(
        o,
        "{pad}at rest, whole operator per minute: {}",
        breakdown(&a.per_min_by_request, |_| true)
    );
    let _ = writeln!(
        o,
        "{pad}at rest: reconcile passes per minute: {}; cache escalations in the window: {}",
        opt_map(&a.passes_per_min),
        opt_map(&a.escalations)
    );
    let rejected = crate::audit::rejected(&a.audited_writes_per_min);
    if !rejected.is_empty() || !a.reconcile_errors.is_empty() {
        let _ = writeln!(
            o,
            "{pad}at rest: rejected writes per minute (audit log): {}; failed reconciles: {}",
            breakdown(&rejected, |_| true),
            breakdown(&a.reconcile_errors, |_| true)
        );
    }
    if a.unsettled_after > 0 || !a.quiet_before {
        let _ = writeln!(
            o,
            "{pad}note: {} fleet(s) unsettled after the window; quiet before: {}",
            a.unsettled_after, a.quiet_before
        );
    }
    reaction_text(o, "reaction under load", &d.reaction);
    if let Some(f) = &d.fairness {
        reaction_text(
            o,
            &format!(
                "with the hot fleet {} ({})",
                f.hot_fleet,
                f.hot_operation
                    .as_deref()
                    .unwrap_or("no open operation at the end")
            ),
            &f.with_hot,
        );
        let _ = writeln!(
            o,
            "{pad}fairness: p99 of the other fleets {} ms without the hot fleet, {} ms with it",
            opt(f.p99_without_ms),
            opt(f.p99_with_ms)
        );
    }
    if let Some(r) = &d.spread {
        reaction_text(
            o,
            &format!(
                "starting one after another over {:.0} s instead of at once",
                r.spread_ms as f64 / 1000.0
            ),
            r,
        );
    }
}

fn reaction_text(o: &mut String, title: &str, r: &Reaction) {
    let pad = "      ";
    let _ = writeln!(
        o,
        "{pad}{title}: {} fleets active ({} scaling, {} restarting) × {} rounds: {} operations in {:.0} s; per operation {} requests (Lease excluded) and {} reconciles; per minute {} requests, {} reconciles, passes {}; escalations: {}",
        r.active_fleets,
        r.scaling,
        r.restarting,
        r.rounds,
        r.operations,
        r.seconds,
        opt(r.requests_per_operation),
        opt(r.reconciles_per_operation),
        num(r.requests_per_min),
        num(r.reconciles_per_min),
        opt_map(&r.passes_per_min),
        opt_map(&r.escalations)
    );
    let _ = writeln!(
        o,
        "{pad}  meanwhile: a reconcile held a slot {} ms on average, {:.1} reconciles at once; mean request ms by verb: {}; fleets in their operations at once: at most {}, {:.1} on average",
        opt(r.reconcile_ms_mean),
        r.slots_busy,
        breakdown(&r.request_ms_by_verb, |_| true),
        r.active_at_once_peak,
        r.active_at_once_mean
    );
    for (part, [n, mean, p50, p90, p99]) in &r.reaction_ms_by_part {
        let (what, requests) = match part.as_str() {
            crate::scrape::TRIGGER_TO_PASS => (
                "the fleet's earliest pending watch event → the start of the reconcile that wrote",
                String::new(),
            ),
            _ => (
                "the reconcile that wrote, its start → the write",
                format!(
                    "; requests it sent up to the write, mean {}",
                    opt(r.reaction_requests_mean)
                ),
            ),
        };
        let _ = writeln!(
            o,
            "{pad}  operator's reaction, {part} ({what}): n {n:.0}, mean {mean:.1} ms, p50/p90/p99 ≤ {p50}/{p90}/{p99} ms (bucket bounds){requests}",
        );
    }
    let _ = writeln!(
        o,
        "{pad}  requests per operation by request: {}",
        breakdown(&r.per_operation_by_request, |_| true)
    );
    let _ = writeln!(
        o,
        "{pad}  {:<88} {:>4} {:>7} {:>7} {:>7}",
        "ms", "n", "p50", "p99", "max"
    );
    let mut rows: Vec<(&str, &Option<Summary>)> =
        r.rows.iter().map(|x| (x.figure.as_str(), &x.ms)).collect();
    rows.push(("every sample", &r.all_ms));
    for (figure, ms) in rows {
        match ms {
            Some(s) => {
                let _ = writeln!(
                    o,
                    "{pad}  {:<88} {:>4} {:>7.0} {:>7.0} {:>7.0}",
                    figure, s.n, s.median, s.p99, s.max
                );
            }
            None => {
                let _ = writeln!(
                    o,
                    "{pad}  {figure:<88} {:>4} {:>7} {:>7} {:>7}",
                    0, "n/a", "n/a", "n/a"
                );
            }
        }
    }
    if r.unobserved_settles > 0 || r.timeouts > 0 {
        let _ = writeln!(
            o,
            "{pad}  {} queued contraction(s) with no settle visible before the decrease (not sampled); {} step(s) timed out",
            r.unobserved_settles, r.timeouts
        );
    }
}
