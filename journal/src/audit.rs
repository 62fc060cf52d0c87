//! Audit functions behind `celld-operator journal show|verify|export`, usable without a cluster.
//!
//! Each works on a mirror directory (all fleets, or one with `--fleet`) and, for the cluster
//! source, on entries or documents the caller fetched. Output goes to any `impl Write`:
//! - `show`: a table of operations with their transitions, or JSON Lines (one operation a line:
//!   `{"fleetUID","id","kind","from","to","state","startedAt","finishedAt","transitions":[{"seq","at","type","detail"}]}`);
//! - `export`: JSON Lines, one entry a line, as `{"entry":<the stored entry JSON>,"fleetUID":"…"}`
//!   (the `entry` object is byte-for-byte what the chain hashes, so it can be re-verified);
//! - `verify`: recomputes each fleet's chain, checks the transitions (when the history starts at
//!   seq 1), compares the mirror with any annotation given, and reports the first bad entry.
//!   [`VerifyReport::ok`] decides the exit code.
//!
//! Show and export never fail on a broken journal: they print what is there, marking entries
//! that break the transition rules with `!`.

use std::io::{self, Write};

use crate::chain::{self, ChainError};
use crate::codec::{format_time, Document};
use crate::fold::{Fold, OperationState, TransitionError};
use crate::json::{self, Json};
use crate::mirror::plan::{plan_reconcile, Signal};
use crate::mirror::{Mirror, MirrorError};
use crate::model::*;

/// Output format of `show`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Aligned text for people.
    Table,
    /// One JSON object per line.
    JsonLines,
}

/// An audit failure (not a verification finding: those are in [`VerifyReport`]).
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The mirror could not be read.
    #[error(transparent)]
    Mirror(#[from] MirrorError),
    /// Writing the output failed.
    #[error("writing the output: {0}")]
    Io(#[from] io::Error),
    /// `--fleet` names a fleet the mirror does not hold.
    #[error("the mirror holds no journal for fleet {fleet} (it holds: {known})")]
    UnknownFleet {
        /// The requested fleet.
        fleet: String,
        /// Fleets present.
        known: String,
    },
}

fn select_fleets(mirror: &Mirror, fleet: Option<&str>) -> Result<Vec<String>, AuditError> {
    let all = mirror.fleets();
    match fleet {
        None => Ok(all),
        Some(f) if all.iter().any(|x| x == f) => Ok(vec![f.to_owned()]),
        Some(f) => Err(AuditError::UnknownFleet {
            fleet: f.to_owned(),
            known: if all.is_empty() {
                "none".to_owned()
            } else {
                all.join(", ")
            },
        }),
    }
}

/// A one-line description of an entry's payload (also usable as an Event note).
pub fn entry_detail(entry: &Entry) -> String {
    match entry.body() {
        EntryBody::Intent(i) => {
            let mut s = format!("{} {}->{}", i.kind, i.from, i.to);
            if let Some(t) = &i.token {
                s.push_str(&format!(" token={t}"));
            }
            if let Some(img) = &i.image {
                s.push_str(&format!(" image={img}"));
            }
            if let Some(r) = &i.reason {
                s.push_str(&format!(" reason={r}"));
            }
            let pods: Vec<&str> = i.targets.iter().map(|t| t.pod.as_str()).collect();
            if !pods.is_empty() {
                s.push_str(&format!(" targets={}", pods.join(",")));
            }
            s.push_str(&format!(" deadline={}", format_time(&i.deadline)));
            if let Some(p) = &i.predecessor_effect {
                s.push_str(&format!(" after={p}"));
            }
            s
        }
        EntryBody::Issued(i) => {
            let mut s = i.step.to_string();
            if let Some(rv) = &i.decided_on_resource_version {
                s.push_str(&format!(" rv={rv}"));
            }
            if let Some(rv) = &i.result_resource_version {
                s.push_str(&format!("->{rv}"));
            }
            if i.replayed {
                s.push_str(" (replayed)");
            }
            if let Some(t) = &i.target {
                s.push_str(&format!(
                    " to podUID={} generation={}",
                    t.pod_uid.as_deref().unwrap_or("?"),
                    t.runtime_generation.as_deref().unwrap_or("?")
                ));
            }
            s
        }
        EntryBody::ProofCaptured(p) => format!(
            "{} phase={} generation={} controlOnly={}{}",
            p.member,
            p.proof.phase,
            p.proof.expected_generation,
            p.proof.control_only,
            p.proof
                .blocker
                .as_ref()
                .map(|b| format!(" blocker={b}"))
                .unwrap_or_default()
        ),
        EntryBody::ClaimRetired(c) => format!(
            "{} uid={}{}",
            c.claim,
            c.claim_uid,
            c.claim_resource_version
                .as_ref()
                .map(|rv| format!(" rv={rv}"))
                .unwrap_or_default()
        ),
        EntryBody::Observed(o) => o.note.clone(),
        EntryBody::Completed(c) => c.outcome.to_string(),
        EntryBody::Canceled(c) => c.reason.to_string(),
        EntryBody::Blocked(b) => b.blocker.clone(),
        EntryBody::Stalled(s) => format!("deadline {} passed", format_time(&s.deadline)),
        EntryBody::Abandoned(p) | EntryBody::Retried(p) => match &p.reason {
            Some(r) => format!("by {}: {r}", p.by),
            None => format!("by {}", p.by),
        },
        EntryBody::Recovered(r) => format!("{} (found in {})", r.effect, r.source),
    }
}

/// One operation as shown: folded leniently, so broken histories still print.
struct OperationView {
    id: OperationId,
    kind: String,
    from_to: Option<(i32, i32)>,
    state: String,
    started: Option<String>,
    finished: Option<String>,
    started_at: Option<chrono::DateTime<chrono::Utc>>,
    finished_at: Option<chrono::DateTime<chrono::Utc>>,
    entries: Vec<(Entry, Option<TransitionError>)>,
}

fn operation_views(entries: &[Entry]) -> Vec<OperationView> {
    let mut fold = Fold::default();
    let mut views: Vec<OperationView> = Vec::new();
    for e in entries {
        let error = fold.apply(e).err();
        let view = match views.iter_mut().position(|v| v.id == e.op()) {
            Some(i) => &mut views[i],
            None => {
                views.push(OperationView {
                    id: e.op(),
                    kind: String::new(),
                    from_to: None,
                    state: String::new(),
                    started: None,
                    finished: None,
                    started_at: None,
                    finished_at: None,
                    entries: Vec::new(),
                });
                views.last_mut().expect("just pushed")
            }
        };
        view.entries.push((e.clone(), error));
    }
    for v in &mut views {
        match fold.operation(v.id) {
            Some(o) => {
                v.kind = o.kind().to_string();
                v.from_to = Some((o.intent().from, o.intent().to));
                v.started = Some(format_time(&o.started_at()));
                v.started_at = Some(o.started_at());
                v.state = match o.state() {
                    OperationState::Open(p) => format!("Open/{p}"),
                    OperationState::Closed(outcome) => match outcome {
                        crate::fold::Outcome::Completed(c) => format!("Completed/{c}"),
                        crate::fold::Outcome::Canceled(r) => format!("Canceled/{r}"),
                        crate::fold::Outcome::Abandoned => "Abandoned".to_owned(),
                    },
                };
                v.finished = o.closure().map(|c| format_time(&c.at));
                v.finished_at = o.closure().map(|c| c.at);
            }
            None if v
                .entries
                .iter()
                .all(|(e, err)| e.entry_type() == EntryType::Recovered && err.is_none()) =>
            {
                v.kind = "-".to_owned();
                v.state = "Recovered".to_owned();
            }
            None => {
                v.kind = "?".to_owned();
                v.state = "no Intent in this history".to_owned();
            }
        }
    }
    views
}

/// What `show` prints and which operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShowOptions {
    /// Table or JSON Lines.
    pub format: Format,
    /// Only operations whose id starts with this (a full id or a prefix of one).
    pub operation: Option<String>,
    /// Only operations with an entry at or after this instant.
    pub since: Option<chrono::DateTime<chrono::Utc>>,
}

impl ShowOptions {
    /// Every operation in `format`.
    pub fn all(format: Format) -> ShowOptions {
        ShowOptions {
            format,
            operation: None,
            since: None,
        }
    }

    fn keeps(&self, v: &OperationView) -> bool {
        self.operation
            .as_ref()
            .is_none_or(|p| v.id.to_string().starts_with(p.as_str()))
            && self
                .since
                .is_none_or(|t| v.entries.iter().any(|(e, _)| e.at() >= t))
    }
}

/// A time to the second, for the table (`2026-12-03T15:04:05Z`); JSON keeps full precision.
fn format_second(t: &chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// `…T10:30:00.123456789Z` → `…T10:30:00Z` wherever a time appears in `text`.
fn to_the_second(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let (mut i, mut copied) = (0, 0);
    while i < b.len() {
        // `:SS.` followed by digits then `Z`: drop the fraction (ASCII only, so the cut is
        // on a character boundary).
        if b[i] == b'.' && i >= 3 && b[i - 3] == b':' && b[i - 1].is_ascii_digit() {
            let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
            if digits > 0 && b.get(i + 1 + digits) == Some(&b'Z') {
                out.push_str(&text[copied..i]);
                i += 1 + digits;
                copied = i;
                continue;
            }
        }
        i += 1;
    }
    out.push_str(&text[copied..]);
    out
}

#[cfg(test)]
mod second_tests {
    #[test]
    fn fractions_of_seconds_are_dropped_and_the_rest_kept() {
        assert_eq!(
            super::to_the_second("Scale 3→2 deadline=2026-11-29T10:30:00.123456789Z after=x/1.5"),
            "Scale 3→2 deadline=2026-11-29T10:30:00Z after=x/1.5"
        );
        assert_eq!(
            super::to_the_second("rv=1.2 at 10:00:00Z"),
            "rv=1.2 at 10:00:00Z"
        );
    }
}

/// Left-aligned columns two spaces apart, each as wide as its widest cell; the last column
/// is not padded (also `kubectl celld status`'s tables).
pub fn aligned(rows: &[Vec<String>]) -> Vec<String> {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    rows.iter()
        .map(|r| {
            let cells: Vec<String> = r
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    if i + 1 == r.len() {
                        c.clone()
                    } else {
                        format!("{c:<w$}", w = widths[i])
                    }
                })
                .collect();
            cells.join("  ").trim_end().to_owned()
        })
        .collect()
}

/// Prints the operations of one fleet's entries.
pub fn show_entries(
    fleet_uid: &str,
    entries: &[Entry],
    format: Format,
    out: &mut dyn Write,
) -> io::Result<()> {
    show_entries_with(fleet_uid, entries, &ShowOptions::all(format), out)
}

/// Prints the operations of one fleet's entries that `options` keeps.
pub fn show_entries_with(
    fleet_uid: &str,
    entries: &[Entry],
    options: &ShowOptions,
    out: &mut dyn Write,
) -> io::Result<()> {
    let views: Vec<OperationView> = operation_views(entries)
        .into_iter()
        .filter(|v| options.keeps(v))
        .collect();
    match options.format {
        Format::Table => {
            let range = match (entries.first(), entries.last()) {
                (Some(a), Some(b)) => format!("entries {}..{}", a.seq(), b.seq()),
                _ => "no entries".to_owned(),
            };
            writeln!(
                out,
                "FLEET {fleet_uid} ({range}, {} operations{})",
                views.len(),
                if options.operation.is_some() || options.since.is_some() {
                    " shown"
                } else {
                    ""
                }
            )?;
            let mut rows = vec![[
                "OPERATION",
                "KIND",
                "FROM->TO",
                "STATE",
                "STARTED",
                "FINISHED",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()];
            rows.extend(views.iter().map(|v| {
                vec![
                    v.id.to_string(),
                    v.kind.clone(),
                    v.from_to
                        .map_or("-".to_owned(), |(f, t)| format!("{f}->{t}")),
                    v.state.clone(),
                    v.started_at.map_or("-".to_owned(), |t| format_second(&t)),
                    v.finished_at.map_or("-".to_owned(), |t| format_second(&t)),
                ]
            }));
            let lines = aligned(&rows);
            writeln!(out, "{}", lines[0])?;
            // Every operation's transitions share one set of column widths.
            let transition_rows: Vec<Vec<String>> = views
                .iter()
                .flat_map(|v| v.entries.iter())
                .map(|(e, error)| {
                    vec![
                        format!("{}{:>6}", if error.is_some() { "!" } else { " " }, e.seq()),
                        format_second(&e.at()),
                        e.entry_type().as_str().to_owned(),
                        to_the_second(&entry_detail(e)),
                    ]
                })
                .collect();
            let transition_lines = aligned(&transition_rows);
            let mut next = transition_lines.iter();
            for (v, line) in views.iter().zip(lines.iter().skip(1)) {
                writeln!(out, "{line}")?;
                for (_, error) in &v.entries {
                    if let Some(l) = next.next() {
                        writeln!(out, "  {l}")?;
                    }
                    if let Some(err) = error {
                        writeln!(out, "           ! {err}")?;
                    }
                }
            }
            writeln!(out)?;
        }
        Format::JsonLines => {
            for v in &views {
                let transitions = v
                    .entries
                    .iter()
                    .map(|(e, error)| {
                        let mut b = Json::obj()
                            .int("seq", e.seq())
                            .str("at", &format_time(&e.at()))
                            .str("type", e.entry_type().as_str())
                            .str("detail", &entry_detail(e));
                        if let Some(err) = error {
                            b = b.str("error", &err.to_string());
                        }
                        b.build()
                    })
                    .collect();
                let mut b = Json::obj()
                    .str("fleetUID", fleet_uid)
                    .str("id", &v.id.to_string())
                    .str("kind", &v.kind)
                    .str("state", &v.state)
                    .opt_str("startedAt", v.started.as_deref())
                    .opt_str("finishedAt", v.finished.as_deref())
                    .field("transitions", Json::Arr(transitions));
                if let Some((f, t)) = v.from_to {
                    b = b.int("from", f).int("to", t);
                }
                writeln!(out, "{}", json::canonical(&b.build()))?;
            }
        }
    }
    Ok(())
}

/// `journal show --mirror DIR [--fleet UID]`.
pub fn show(
    mirror: &Mirror,
    fleet: Option<&str>,
    format: Format,
    out: &mut dyn Write,
) -> Result<(), AuditError> {
    show_with(mirror, fleet, &ShowOptions::all(format), out)
}

/// `journal show --mirror DIR [--fleet UID]` with filters.
pub fn show_with(
    mirror: &Mirror,
    fleet: Option<&str>,
    options: &ShowOptions,
    out: &mut dyn Write,
) -> Result<(), AuditError> {
    for f in select_fleets(mirror, fleet)? {
        show_entries_with(&f, &mirror.entries(&f)?, options, out)?;
    }
    Ok(())
}

/// Writes one fleet's entries as JSON Lines; returns the number written.
pub fn export_entries(
    fleet_uid: &str,
    entries: &[Entry],
    out: &mut dyn Write,
) -> io::Result<usize> {
    let mut uid = String::new();
    json::write_string(fleet_uid, &mut uid);
    for e in entries {
        writeln!(out, "{{\"entry\":{},\"fleetUID\":{uid}}}", e.to_json())?;
    }
    Ok(entries.len())
}

/// `journal export --mirror DIR [--fleet UID]`; returns the number of entries written.
pub fn export(
    mirror: &Mirror,
    fleet: Option<&str>,
    out: &mut dyn Write,
) -> Result<usize, AuditError> {
    let mut n = 0;
    for f in select_fleets(mirror, fleet)? {
        n += export_entries(&f, &mirror.entries(&f)?, out)?;
    }
    Ok(n)
}

/// How the mirror compares with a fleet's annotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnnotationCheck {
    /// The annotation's chain is broken.
    Broken(ChainError),
    /// Every annotation entry is in the mirror with the same hash.
    InSync,
    /// The mirror lacks some annotation entries (it is backfilled on the next start).
    MirrorBehind {
        /// How many.
        missing: usize,
    },
    /// They disagree (`JournalDiverged` and/or `JournalRollback`).
    Disagree(Vec<Signal>),
}

/// What `verify` found for one fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetReport {
    /// The fleet.
    pub fleet_uid: String,
    /// Entries in the mirror.
    pub entries: usize,
    /// Oldest and newest seq in the mirror.
    pub range: Option<(Seq, Seq)>,
    /// Ranges of seqs this mirror never held (`from..=through`): entries written while another
    /// replica led and compacted out of the annotation before this one backfilled. Not an
    /// error; the chain is verified on each side of a gap.
    pub gaps: Vec<(Seq, Seq)>,
    /// The first chain problem in the mirror, or an unreadable entry.
    pub chain: Result<(), String>,
    /// The first illegal transition, when the mirror's history starts at seq 1 without gaps.
    pub transitions: Option<Result<(), (Seq, TransitionError)>>,
    /// Entries kept aside in `diverged`.
    pub diverged: usize,
    /// Comparison with the annotation, when one was given.
    pub annotation: Option<AnnotationCheck>,
    /// Entries whose time is not sane ([`time_warnings`]); warnings, not failures.
    pub time_warnings: Vec<String>,
}

impl FleetReport {
    /// Whether nothing is wrong (a mirror that is only behind is fine).
    pub fn ok(&self) -> bool {
        self.chain.is_ok()
            && !matches!(self.transitions, Some(Err(_)))
            && !matches!(
                self.annotation,
                Some(AnnotationCheck::Broken(_)) | Some(AnnotationCheck::Disagree(_))
            )
    }
}

/// What `verify` found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VerifyReport {
    /// Per fleet.
    pub fleets: Vec<FleetReport>,
}

impl VerifyReport {
    /// True when every fleet verifies (exit code 0).
    pub fn ok(&self) -> bool {
        self.fleets.iter().all(FleetReport::ok)
    }
}

/// Verifies one fleet's mirror entries, and compares them with `annotation` if given.
pub fn verify_fleet(
    fleet_uid: &str,
    entries: Result<Vec<Entry>, MirrorError>,
    diverged: usize,
    annotation: Option<&Document>,
) -> FleetReport {
    let mut gaps = Vec::new();
    let (entries, chain) = match entries {
        Ok(list) => {
            // Verify each run of consecutive seqs; across a gap the link cannot be checked.
            let mut chain = Ok(());
            let mut start = match list.first() {
                Some(e) if e.seq() == 1 => Some((0, Hash::ZERO)),
                _ => None,
            };
            let mut from = 0;
            for i in 1..=list.len() {
                let run_ends = i == list.len() || list[i].seq() != list[i - 1].seq() + 1;
                if !run_ends {
                    continue;
                }
                if chain.is_ok() {
                    chain = chain::verify_entries(&list[from..i], start).map_err(|e| e.to_string());
                }
                if i < list.len() && list[i].seq() > list[i - 1].seq() {
                    gaps.push((list[i - 1].seq() + 1, list[i].seq() - 1));
                }
                from = i;
                start = None;
            }
            (list, chain)
        }
        Err(e) => (Vec::new(), Err(e.to_string())),
    };
    let transitions = match entries.first() {
        Some(e) if e.seq() == 1 && gaps.is_empty() && chain.is_ok() => {
            Some(Fold::from_entries(&entries).map(|_| ()))
        }
        _ => None,
    };
    let annotation = annotation.map(|doc| match chain::verify(doc) {
        Err(e) => AnnotationCheck::Broken(e),
        Ok(()) => {
            let held: Vec<(Seq, Hash)> = entries
                .iter()
                .filter(|e| e.seq() >= doc.compacted_through())
                .map(|e| (e.seq(), e.hash()))
                .collect();
            let plan = plan_reconcile(&held, doc);
            if !plan.signals.is_empty() {
                AnnotationCheck::Disagree(plan.signals)
            } else if plan.writes() > 0 {
                AnnotationCheck::MirrorBehind {
                    missing: plan.writes(),
                }
            } else {
                AnnotationCheck::InSync
            }
        }
    });
    FleetReport {
        fleet_uid: fleet_uid.to_owned(),
        time_warnings: time_warnings(&entries, chrono::Utc::now()),
        entries: entries.len(),
        range: entries
            .first()
            .zip(entries.last())
            .map(|(a, b)| (a.seq(), b.seq())),
        gaps,
        chain,
        transitions,
        diverged,
        annotation,
    }
}

/// `journal verify --mirror DIR [--fleet UID]`, comparing with `annotations` (the documents
/// fetched from the cluster; empty for a mirror-only check). Annotations of fleets the mirror
/// does not hold are reported as a mirror that is entirely behind.
pub fn verify(
    mirror: &Mirror,
    fleet: Option<&str>,
    annotations: &[Document],
    out: &mut dyn Write,
) -> Result<VerifyReport, AuditError> {
    let mut fleets = match fleet {
        Some(f) if annotations.iter().any(|d| d.fleet_uid() == f) => vec![f.to_owned()],
        _ => select_fleets(mirror, fleet)?,
    };
    if fleet.is_none() {
        for d in annotations {
            if !fleets.iter().any(|f| f == d.fleet_uid()) {
                fleets.push(d.fleet_uid().to_owned());
            }
        }
    }
    let mut report = VerifyReport::default();
    for f in fleets {
        let diverged = mirror.diverged(&f).map(|d| d.len()).unwrap_or(0);
        let doc = annotations.iter().find(|d| d.fleet_uid() == f);
        let r = verify_fleet(&f, mirror.entries(&f), diverged, doc);
        render_fleet_report(&r, out)?;
        report.fleets.push(r);
    }
    Ok(report)
}

/// Prints one fleet's findings.
pub fn render_fleet_report(r: &FleetReport, out: &mut dyn Write) -> io::Result<()> {
    let status = if r.ok() { "OK  " } else { "FAIL" };
    let range = r.range.map_or("no entries".to_owned(), |(a, b)| {
        format!("entries {a}..{b}")
    });
    writeln!(
        out,
        "{status} fleet {}: mirror {range} ({} entries, {} kept aside as diverged)",
        r.fleet_uid, r.entries, r.diverged
    )?;
    for (from, through) in &r.gaps {
        writeln!(
            out,
            "     gap: entries {from}..{through} were never mirrored here (written while another replica led)"
        )?;
    }
    match &r.chain {
        Ok(()) => writeln!(out, "     chain: OK")?,
        Err(e) => writeln!(out, "     chain: first bad entry: {e}")?,
    }
    match &r.transitions {
        None => writeln!(
            out,
            "     transitions: not checked (the mirror does not hold the whole history)"
        )?,
        Some(Ok(())) => writeln!(out, "     transitions: OK")?,
        Some(Err((seq, e))) => writeln!(out, "     transitions: entry {seq}: {e}")?,
    }
    for w in &r.time_warnings {
        writeln!(out, "     warning: time: {w}")?;
    }
    match &r.annotation {
        None => {}
        Some(AnnotationCheck::Broken(e)) => writeln!(out, "     annotation: chain broken: {e}")?,
        Some(AnnotationCheck::InSync) => writeln!(out, "     annotation: mirror in sync")?,
        Some(AnnotationCheck::MirrorBehind { missing }) => writeln!(
            out,
            "     annotation: mirror lacks {missing} entries (backfilled on the next start)"
        )?,
        Some(AnnotationCheck::Disagree(signals)) => {
            for s in signals {
                writeln!(
                    out,
                    "     annotation: {}: {}",
                    s.event_reason(),
                    s.message()
                )?;
            }
        }
    }
    Ok(())
}

/// How far in the future an entry's `at` may be before `journal verify` warns (clock skew
/// between the writer and the reader).
pub const ALLOWED_FUTURE_SKEW: chrono::Duration = chrono::Duration::minutes(5);

/// Entries whose time is not sane: earlier than their predecessor's, or more than
/// [`ALLOWED_FUTURE_SKEW`] after `now`. Warnings, not failures: the chain is intact, but a
/// deadline or an audit that reads `at` may be misled (a writer's clock was wrong).
pub fn time_warnings(entries: &[Entry], now: chrono::DateTime<chrono::Utc>) -> Vec<String> {
    let mut out = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if let Some(p) = i.checked_sub(1).map(|j| &entries[j]) {
            if e.at() < p.at() {
                out.push(format!(
                    "entry {} at {} is earlier than entry {} at {}",
                    e.seq(),
                    format_time(&e.at()),
                    p.seq(),
                    format_time(&p.at())
                ));
            }
        }
        if e.at() > now + ALLOWED_FUTURE_SKEW {
            out.push(format!(
                "entry {} at {} is more than {} min in the future",
                e.seq(),
                format_time(&e.at()),
                ALLOWED_FUTURE_SKEW.num_minutes()
            ));
        }
    }
    out
}

/// `journal verify --source cluster`: checks the annotation alone and describes it as the
/// annotation (header, chain, transitions, times). `text` is the annotation value (`None`:
/// the fleet has none). Returns whether it verifies; time findings are warnings.
pub fn verify_annotation(
    fleet_uid: &str,
    text: Option<&str>,
    now: chrono::DateTime<chrono::Utc>,
    out: &mut dyn Write,
) -> io::Result<bool> {
    let Some(text) = text else {
        writeln!(
            out,
            "OK   fleet {fleet_uid}: no journal annotation (no entries)"
        )?;
        return Ok(true);
    };
    let doc = match crate::codec::decode_document(text) {
        Ok(d) => d,
        Err(e) => {
            writeln!(
                out,
                "FAIL fleet {fleet_uid}: the annotation ({} bytes) does not decode: {e}",
                text.len()
            )?;
            return Ok(false);
        }
    };
    let range = match (doc.entries().first(), doc.entries().last()) {
        (Some(a), Some(b)) => format!("entries {}..{}", a.seq(), b.seq()),
        _ => "no entries".to_owned(),
    };
    let chain = if doc.fleet_uid() != fleet_uid {
        Err(format!(
            "the annotation belongs to fleet {}, not to this fleet",
            doc.fleet_uid()
        ))
    } else {
        chain::verify(&doc).map_err(|e| format!("first bad entry: {e}"))
    };
    let transitions = match &chain {
        Ok(()) => Some(Fold::from_entries(doc.entries()).map(|_| ())),
        Err(_) => None,
    };
    let ok = chain.is_ok() && transitions.as_ref().is_some_and(Result::is_ok);
    writeln!(
        out,
        "{} fleet {fleet_uid}: annotation {range}, seq {}, compacted through {} ({} bytes)",
        if ok { "OK  " } else { "FAIL" },
        doc.seq(),
        doc.compacted_through(),
        text.len()
    )?;
    match &chain {
        Ok(()) => writeln!(out, "     chain: OK")?,
        Err(e) => writeln!(out, "     chain: {e}")?,
    }
    match &transitions {
        None => writeln!(out, "     transitions: not checked (the chain is broken)")?,
        Some(Ok(())) => writeln!(out, "     transitions: OK")?,
        Some(Err((seq, e))) => writeln!(out, "     transitions: entry {seq}: {e}")?,
    }
    for w in time_warnings(doc.entries(), now) {
        writeln!(out, "     warning: time: {w}")?;
    }
    Ok(ok)
}
