//! Two operator installations on one fleet (`ForeignOperator`, docs/operations.md "Two
//! operator installations").
//!
//! An installation is named by its Lease (`namespace/name`): replicas of one installation
//! share it and elect one writer; two installations hold two Leases and would both write.
//! Each installation leaves two records on a fleet it reconciles:
//!
//! - every journal entry names the writer's Lease (`leader.lease`);
//! - the `celld.eric.dev/operators` annotation maps each Lease to its holder and the last time
//!   it said it was there: written when the Lease is missing from it, once per process start
//!   (when the record is stale or names another holder), and refreshed every third of the
//!   window while another installation is seen.
//!
//! A record of another Lease newer than `--foreign-operator-window` means a second
//! installation: the fleet is `Blocked` with `ForeignOperator`, nothing is appended and
//! nothing is issued for it, and a Warning Event names both installations. Both sides see the
//! other's record (the first through the second's annotation write, the second through the
//! first's record), so neither issues until one of them is stopped; the survivor goes on once
//! the other's last record is older than the window. Older records are history (an
//! installation replaced by another) and are ignored.
//!
//! Both installations compute the same condition message (every installation seen, sorted),
//! so their status writes agree and do not wake each other in a loop.

use super::reasons;
use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use journal::Entry;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{Error, KubeContext, Report, Run};
use crate::api::keys::OPERATORS_ANNOTATION;

/// One installation's record in the `celld.eric.dev/operators` annotation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The identity (Pod name) of the Lease holder that wrote it.
    pub holder: String,
    /// When it was written.
    pub seen: DateTime<Utc>,
}

/// Lease → record, as stored.
pub type Records = BTreeMap<String, Record>;

/// Parses the annotation; a value that does not parse is reported and treated as empty
/// (the next write replaces it).
pub fn parse(value: Option<&str>) -> Result<Records, String> {
    match value {
        None => Ok(Records::new()),
        Some(v) => serde_json::from_str(v).map_err(|e| format!("{OPERATORS_ANNOTATION}: {e}")),
    }
}

/// The installations seen within `window` before `now`, from the journal's entries and the
/// annotation: Lease → (holder, newest time). Entries without a Lease (older releases) name
/// no installation.
pub fn recent(
    entries: &[Entry],
    records: &Records,
    now: DateTime<Utc>,
    window: Duration,
) -> BTreeMap<String, (String, DateTime<Utc>)> {
    let since = now - chrono::Duration::from_std(window).unwrap_or(chrono::Duration::MAX);
    let mut seen: BTreeMap<String, (String, DateTime<Utc>)> = BTreeMap::new();
    let mut note = |lease: &str, holder: &str, at: DateTime<Utc>| {
        if at < since {
            return;
        }
        let slot = seen
            .entry(lease.to_string())
            .or_insert_with(|| (holder.to_string(), at));
        if at >= slot.1 {
            *slot = (holder.to_string(), at);
        }
    };
    for e in entries {
        if let Some(lease) = &e.leader().lease {
            note(lease, &e.leader().identity, e.at());
        }
    }
    for (lease, r) in records {
        note(lease, &r.holder, r.seen);
    }
    seen
}

/// The condition message when installations other than `mine` are in `recent`: every
/// installation named (this one included, with its own identity), sorted, so that each side
/// writes the same words.
pub fn message(
    mine: &str,
    identity: &str,
    recent: &BTreeMap<String, (String, DateTime<Utc>)>,
    window: Duration,
) -> Option<String> {
    if !recent.keys().any(|l| l != mine) {
        return None;
    }
    let mut all: BTreeMap<&str, &str> = recent
        .iter()
        .map(|(l, (h, _))| (l.as_str(), h.as_str()))
        .collect();
    all.insert(mine, identity);
    let names: Vec<String> = all
        .iter()
        .map(|(l, h)| format!("Lease {l} (holder {h})"))
        .collect();
    let window = format_duration(window);
    Some(format!(
        "Entries in this fleet's journal or its {OPERATORS_ANNOTATION} annotation come from more than one \
         operator installation within the last {window}: {}; no installation issues anything for this fleet \
         until only one remains (stop the others; the survivor goes on {window} after their last record)",
        names.join(", ")
    ))
}

/// `10m`, `1h30m`, `45s`: the way the flag is written.
pub fn format_duration(d: Duration) -> String {
    let s = d.as_secs();
    let (h, m, sec) = (s / 3600, s / 60 % 60, s % 60);
    let mut out = String::new();
    if h > 0 {
        out += &format!("{h}h");
    }
    if m > 0 {
        out += &format!("{m}m");
    }
    if sec > 0 || out.is_empty() {
        out += &format!("{sec}s");
    }
    out
}

/// Whether this installation writes its record now: it is missing; or this process has not
/// announced itself on the fleet yet and the record is stale or names another holder; or
/// another installation is seen and the record is older than a third of the window.
pub fn needs_write(
    own: Option<&Record>,
    identity: &str,
    announced: bool,
    contended: bool,
    now: DateTime<Utc>,
    window: Duration,
) -> bool {
    let Some(own) = own else {
        return true;
    };
    let age = (now - own.seen).to_std().unwrap_or(Duration::ZERO);
    (!announced && (age >= window || own.holder != identity)) || (contended && age >= window / 3)
}

/// The annotation after writing this installation's record: records older than the window
/// (history, ignored by every check) are dropped, so the value stays small.
pub fn updated(
    records: &Records,
    mine: &str,
    identity: &str,
    now: DateTime<Utc>,
    window: Duration,
) -> Records {
    let since = now - chrono::Duration::from_std(window).unwrap_or(chrono::Duration::MAX);
    let mut out: Records = records
        .iter()
        .filter(|(l, r)| l.as_str() != mine && r.seen >= since)
        .map(|(l, r)| (l.clone(), r.clone()))
        .collect();
    out.insert(
        mine.to_string(),
        Record {
            holder: identity.to_string(),
            seen: now,
        },
    );
    out
}

/// Step 2 of a reconcile: records this installation on the fleet when due and returns
/// `Some(ForeignOperator report)` when another installation is seen (nothing else runs).
pub(crate) async fn check(run: &mut Run<'_>) -> Result<Option<Report>, Error> {
    let Some(mine) = run.ctx.leader.lease.clone() else {
        return Ok(None);
    };
    let identity = run.ctx.leader.identity.clone();
    let window = run.ctx.foreign_window;
    let now = Utc::now();
    let raw = run.fleet.annotations().get(OPERATORS_ANNOTATION).cloned();
    let records = parse(raw.as_deref()).unwrap_or_else(|e| {
        tracing::warn!(fleet = %format!("{}/{}", run.ns, run.name), "{e}; it is rewritten");
        Records::new()
    });
    let entries: &[Entry] = if run.journal_unusable {
        &[]
    } else {
        run.journal.document().entries()
    };
    let seen = recent(entries, &records, now, window);
    let message = message(&mine, &identity, &seen, window);
    let announced = run
        .ctx
        .announced
        .lock()
        .map(|s| s.contains(&run.uid))
        .unwrap_or(false);
    if needs_write(
        records.get(&mine),
        &identity,
        announced,
        message.is_some(),
        now,
        window,
    ) {
        // Only the lease holder writes to a fleet; the record is no effect, so no failpoint.
        run.ctx.check_lease();
        let value = serde_json::to_string(&updated(&records, &mine, &identity, now, window))
            .expect("records serialize");
        let patch = json!({"metadata": {
            "resourceVersion": run.fleet.resource_version(),
            "annotations": {OPERATORS_ANNOTATION: value},
        }});
        run.fleet = run
            .api
            .patch(&run.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .ctx(|| format!("recording this installation in {OPERATORS_ANNOTATION}"))?;
    }
    if let Ok(mut s) = run.ctx.announced.lock() {
        s.insert(run.uid.clone());
    }
    let Some(message) = message else {
        if let Ok(mut r) = run.ctx.foreign_reported.lock() {
            r.remove(&run.uid);
        }
        return Ok(None);
    };
    // One Warning Event per installation and set of installations seen (each side reports
    // it, whichever of them stored the shared condition first).
    let others: Vec<String> = seen.keys().filter(|l| **l != mine).cloned().collect();
    let key = others.join(",");
    // A cached pass that would report leaves the record to the fresh pass, which reports.
    let first = run
        .ctx
        .foreign_reported
        .lock()
        .map(|mut r| {
            let first = r.get(&run.uid) != Some(&key);
            if !(first && run.escalate(|| "create events (ForeignOperator)".into())) {
                r.insert(run.uid.clone(), key.clone());
            }
            first
        })
        .unwrap_or(false);
    if first {
        tracing::warn!(
            fleet = %format!("{}/{}", run.ns, run.name),
            others = %key,
            reason = "ForeignOperator",
            "blocked: {message}"
        );
        if let Some(recorder) = run.recorder() {
            let event = Event {
                type_: EventType::Warning,
                reason: "ForeignOperator".into(),
                note: Some(message.clone()),
                action: "ForeignOperator".into(),
                secondary: None,
            };
            recorder.publish(event, run.fleet.object_ref(&())).await;
        }
    }
    Ok(Some(Report::blocked(&reasons::FOREIGN_OPERATOR, message)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use journal::{EntryBody, Journal, Leader, NewEntry, OperationId};

    const W: Duration = Duration::from_secs(600);

    fn t(min: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 2, 10, 0, 0).unwrap() + chrono::Duration::minutes(min)
    }

    fn journal_by(lease: Option<&str>, at: DateTime<Utc>) -> Journal {
        let j = Journal::new("uid");
        let op = OperationId::new_v4();
        let entry = NewEntry {
            at,
            op,
            leader: Leader {
                identity: "a-0".into(),
                lease_transitions: 1,
                lease: lease.map(str::to_string),
            },
            body: EntryBody::Recovered(journal::Recovered {
                effect: format!("{op}/replicas").parse().unwrap(),
                source: "test".into(),
            }),
        };
        j.stage(entry, journal::Budget::default())
            .expect("stages")
            .into_journal()
    }

    #[test]
    fn a_recent_entry_of_another_lease_is_another_installation() {
        let j = journal_by(Some("a/celld-operator"), t(0));
        let seen = recent(j.document().entries(), &Records::new(), t(5), W);
        assert_eq!(seen.len(), 1);
        let m = message("b/celld-operator", "b-0", &seen, W).expect("foreign");
        assert!(
            m.contains("Lease a/celld-operator (holder a-0), Lease b/celld-operator (holder b-0)"),
            "{m}"
        );
        assert!(m.contains("within the last 10m"), "{m}");
        // Its own entries are no other installation; entries older than the window are history.
        assert!(message("a/celld-operator", "a-0", &seen, W).is_none());
        let old = recent(j.document().entries(), &Records::new(), t(11), W);
        assert!(message("b/celld-operator", "b-0", &old, W).is_none());
        // Entries of older releases carry no Lease: they name no installation.
        let j = journal_by(None, t(0));
        assert!(recent(j.document().entries(), &Records::new(), t(1), W).is_empty());
    }

    #[test]
    fn both_installations_write_the_same_message() {
        let mut records = Records::new();
        records.insert(
            "a/celld-operator".into(),
            Record {
                holder: "a-0".into(),
                seen: t(0),
            },
        );
        records.insert(
            "b/celld-operator".into(),
            Record {
                holder: "b-0".into(),
                seen: t(1),
            },
        );
        let seen = recent(&[], &records, t(2), W);
        assert_eq!(
            message("a/celld-operator", "a-0", &seen, W),
            message("b/celld-operator", "b-0", &seen, W)
        );
        // The second installation's first record is enough for the first to see it.
        records.remove("a/celld-operator");
        let seen = recent(&[], &records, t(2), W);
        assert_eq!(
            message("a/celld-operator", "a-0", &seen, W),
            message(
                "b/celld-operator",
                "b-0",
                &{
                    let mut s = seen.clone();
                    s.insert("a/celld-operator".into(), ("a-0".into(), t(0)));
                    s
                },
                W
            )
        );
    }

    #[test]
    fn the_record_is_written_when_missing_once_per_start_and_while_contended() {
        let own = Record {
            holder: "a-0".into(),
            seen: t(0),
        };
        assert!(needs_write(None, "a-0", true, false, t(0), W));
        // Fresh, same holder: nothing to write, announced or not.
        assert!(!needs_write(Some(&own), "a-0", false, false, t(1), W));
        // Stale at this process's first look: written once; not again at rest.
        assert!(needs_write(Some(&own), "a-0", false, false, t(10), W));
        assert!(!needs_write(Some(&own), "a-0", true, false, t(60), W));
        // Another holder of the same Lease (a new replica leads): written at its first look.
        assert!(needs_write(Some(&own), "a-1", false, false, t(1), W));
        // Contended: refreshed every third of the window.
        assert!(!needs_write(Some(&own), "a-0", true, true, t(3), W));
        assert!(needs_write(Some(&own), "a-0", true, true, t(4), W));
    }

    #[test]
    fn writing_drops_stale_records_and_keeps_recent_ones() {
        let mut records = Records::new();
        records.insert(
            "old/celld-operator".into(),
            Record {
                holder: "o".into(),
                seen: t(0),
            },
        );
        records.insert(
            "b/celld-operator".into(),
            Record {
                holder: "b-0".into(),
                seen: t(15),
            },
        );
        records.insert(
            "a/celld-operator".into(),
            Record {
                holder: "a-0".into(),
                seen: t(1),
            },
        );
        let out = updated(&records, "a/celld-operator", "a-1", t(20), W);
        assert_eq!(
            out.keys().collect::<Vec<_>>(),
            ["a/celld-operator", "b/celld-operator"]
        );
        assert_eq!(
            out["a/celld-operator"],
            Record {
                holder: "a-1".into(),
                seen: t(20)
            }
        );
        let text = serde_json::to_string(&out).unwrap();
        assert_eq!(parse(Some(&text)).unwrap(), out);
        assert!(parse(Some("{not json"))
            .unwrap_err()
            .contains(OPERATORS_ANNOTATION));
    }
}
