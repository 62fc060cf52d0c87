//! When the journal and the world disagree, or the journal itself is damaged or gone
//! (docs/journal.md "Integrity: when the journal cannot be used"): every such case ends
//! `Blocked` with a reason that says what was found, what was expected and the command that
//! resolves it, or is recorded (`Recovered`) and goes on. Nothing here loops: a state no new
//! plan can change is never re-planned, and a request canceled because the world moved under
//! it is planned again only after a growing pause.
//!
//! - `JournalInvalid`: the annotation fails verification. Status keeps its last known
//!   figures; a deleted fleet still finishes (in a fresh journal that keeps the claims).
//! - `JournalMissing`: the annotation is gone while this replica's mirror holds entries.
//! - `EffectMarkerMismatch`: the workload's `celld.eric.dev/effect` names nothing this
//!   journal can record (see [`journal::Journal::check_marker`]).
//! - Repairs (`journal restore`, `journal reset`) arrive as `celld.eric.dev/journal-command`
//!   values and are consumed before the journal is loaded, because it may not load.

use super::reasons;
use std::time::{Duration, Instant};

use journal::{Journal, MarkerCheck, RepairCommand};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::{Class, Ctx, Error, KubeContext, Report, Run};
use crate::api::keys::{JOURNAL_ANNOTATION, JOURNAL_COMMAND_ANNOTATION};
use crate::api::{CelldFleet, CelldFleetStatus};
use crate::journal_store;

/// `Intent.reason` of a Delete run in a fresh journal because the fleet's journal was damaged
/// or missing: the history of the claims is unknown, so they are kept (deleted by a person).
pub const KEEP_CLAIMS_REASON: &str =
    "fleet deleted while its journal was unusable; a new journal was started for the deletion and the claims are kept";

/// A request canceled with `PredecessorChanged`, remembered to pace its re-planning.
#[derive(Clone, Debug)]
pub struct Replan {
    fingerprint: String,
    count: u32,
    until: Instant,
}

/// The pause before the same request is planned again after its `n`-th cancellation in a
/// row: 30 s, 60 s, 120 s … capped at 10 min (so at most two cancellations, four entries, of
/// one request in any minute).
pub(crate) fn replan_pause(n: u32) -> Duration {
    Duration::from_secs((30u64 << n.saturating_sub(1).min(5)).min(600))
}

/// What a planned request is, for the backoff: kind, replicas, token, image.
pub(crate) fn fingerprint(
    kind: journal::OperationKind,
    from: i32,
    to: i32,
    token: Option<&str>,
    image: Option<&str>,
) -> String {
    format!("{kind} {from}->{to} token={token:?} image={image:?}")
}

/// Records a `PredecessorChanged` cancellation of `fingerprint` (metric and backoff).
pub(crate) fn note_canceled(run: &Run<'_>, fingerprint: String) {
    run.ctx
        .metrics
        .canceled_replans
        .get_or_create(&crate::metrics::FleetLabels {
            namespace: run.ns.clone(),
            fleet: run.name.clone(),
        })
        .inc();
    if let Ok(mut map) = run.ctx.replan_backoff.lock() {
        let count = match map.get(&run.uid) {
            Some(r) if r.fingerprint == fingerprint => r.count + 1,
            _ => 1,
        };
        map.insert(
            run.uid.clone(),
            Replan {
                fingerprint,
                count,
                until: Instant::now() + replan_pause(count),
            },
        );
    }
}

/// Forgets the backoff of a fleet whose write was issued.
pub(crate) fn clear_backoff(run: &Run<'_>) {
    if let Ok(mut map) = run.ctx.replan_backoff.lock() {
        map.remove(&run.uid);
    }
}

/// While the same request is paused after cancellations: how many and for how long.
pub(crate) fn replan_paused(run: &Run<'_>, fingerprint: &str) -> Option<(u32, Duration)> {
    let map = run.ctx.replan_backoff.lock().ok()?;
    let r = map.get(&run.uid)?;
    let left = r.until.checked_duration_since(Instant::now())?;
    (r.fingerprint == fingerprint).then_some((r.count, left))
}

/// The report for a marker the journal cannot record (`EffectMarkerMismatch`, docs/journal.md
/// "The guarded write and the effect marker").
pub(crate) fn marker_mismatch(run: &Run<'_>, check: &MarkerCheck, kind: &str) -> Option<Report> {
    let MarkerCheck::Mismatch {
        found,
        expected,
        why,
    } = check
    else {
        return None;
    };
    let show = |v: Option<String>| v.unwrap_or_else(|| "(none)".into());
    Some(Report::blocked(
        &reasons::EFFECT_MARKER_MISMATCH,
        format!(
            "{kind} {} carries effect marker {} but the journal's last effect is {} ({why}); the operator writes \
             nothing to it until resolved: after checking the live spec, `kubectl celld journal adopt {}/{}` \
             takes it as the starting point (sets the marker to the journal's last effect), or restore the marker by hand",
            run.name,
            show(found.clone()),
            show(expected.as_ref().map(ToString::to_string)),
            run.ns,
            run.name
        ),
    ))
}

/// Loads the fleet's journal, or says why it cannot be used (`JournalInvalid`,
/// `JournalMissing`).
pub(crate) fn load(ctx: &Ctx, fleet: &CelldFleet) -> Result<Journal, Report> {
    let (ns, name) = (fleet.namespace().unwrap_or_default(), fleet.name_any());
    let journal = journal_store::load(fleet).map_err(|e| {
        Report::blocked(
            &reasons::JOURNAL_INVALID,
            format!(
                "The journal annotation fails verification ({e}); the operator changes nothing for this fleet. \
                 Repair with `kubectl celld journal restore {ns}/{name} --from-mirror` (or `--from-file EXPORT`)"
            ),
        )
    })?;
    if fleet.annotations().contains_key(JOURNAL_ANNOTATION) {
        return Ok(journal);
    }
    // No annotation: a new fleet, unless this replica mirrored entries for it.
    let uid = fleet.uid().unwrap_or_default();
    let held = ctx
        .mirror
        .as_ref()
        .and_then(|m| m.head(&uid).ok().flatten());
    let Some((last, _)) = held else {
        return Ok(journal);
    };
    let first = ctx
        .mirror
        .as_ref()
        .and_then(|m| m.entries(&uid).ok())
        .and_then(|e| e.first().map(journal::Entry::seq))
        .unwrap_or(1);
    Err(Report::blocked(
        &reasons::JOURNAL_MISSING,
        format!(
            "The journal annotation is gone while the local mirror holds entries {first}..{last}; restore it with \
             `kubectl celld journal restore {ns}/{name} --from-mirror`, or start a new journal with \
             `kubectl celld journal reset {ns}/{name} --reason TEXT`"
        ),
    ))
}

async fn event(ctx: &Ctx, fleet: &CelldFleet, type_: EventType, reason: &str, note: String) {
    let Some(recorder) = crate::pass::recorder(&ctx.recorder) else {
        return;
    };
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: reason.into(),
        secondary: None,
    };
    recorder.publish(event, fleet.object_ref(&())).await;
}

/// Consumes a repair command (`restore-from-mirror`, `reset <reason>`) before the journal is
/// loaded. `Ok(None)`: one was consumed (or refused and removed); reconcile again from a
/// fresh read. `Ok(Some(fleet))`: there was none.
pub(crate) async fn consume_repair(
    ctx: &Ctx,
    api: &Api<CelldFleet>,
    fleet: CelldFleet,
) -> Result<Option<CelldFleet>, Error> {
    let Some(value) = fleet.annotations().get(JOURNAL_COMMAND_ANNOTATION) else {
        return Ok(Some(fleet));
    };
    let Some(parsed) = journal::parse_repair_command(value) else {
        return Ok(Some(fleet));
    };
    let name = fleet.name_any();
    let uid = fleet.uid().unwrap_or_default();
    let planned: Result<(String, RepairCommand), String> = match parsed {
        Err(e) => Err(e.to_string()),
        Ok(RepairCommand::RestoreFromMirror) => {
            restored_annotation(ctx, &fleet).map(|text| (text, RepairCommand::RestoreFromMirror))
        }
        // A journal that verifies is never reset: its history (and any open operation) would
        // be forgotten; abandon is the command for an operation.
        Ok(RepairCommand::Reset { .. })
            if fleet.annotations().contains_key(JOURNAL_ANNOTATION)
                && journal_store::load(&fleet).is_ok() =>
        {
            Err("the journal annotation verifies; `reset` is for a damaged or missing journal (use `journal abandon` for an operation)".into())
        }
        Ok(reset @ RepairCommand::Reset { .. }) => {
            Ok((journal::Document::empty(uid.clone()).encode(), reset))
        }
    };
    let (annotation, note, warning) = match &planned {
        Ok((text, RepairCommand::RestoreFromMirror)) => (
            json!(text),
            "The journal annotation was restored from the operator's local mirror (verified chain)".to_string(),
            false,
        ),
        Ok((text, RepairCommand::Reset { reason })) => (
            json!(text),
            format!("A new journal was started by `journal reset`: {reason}; the mirror's entries were kept aside (diverged, reason Reset)"),
            true,
        ),
        Err(why) => (
            serde_json::Value::Null,
            format!("The journal command {value:?} was refused and removed: {why}"),
            true,
        ),
    };
    let mut annotations = serde_json::Map::new();
    annotations.insert(JOURNAL_COMMAND_ANNOTATION.into(), serde_json::Value::Null);
    if planned.is_ok() {
        annotations.insert(JOURNAL_ANNOTATION.into(), annotation);
    }
    // Compare-and-swap: the repair applies to the fleet as just read, or not at all.
    let patch = json!({"metadata": {"resourceVersion": fleet.resource_version(), "annotations": annotations}});
    let patched = api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .ctx(|| "consuming a journal repair command".into())?;
    if let (Ok((_, RepairCommand::Reset { .. })), Some(mirror)) = (&planned, &ctx.mirror) {
        // After the annotation is written: a failed write leaves the mirror as it was, so
        // `restore --from-mirror` still works.
        match mirror.set_aside(&uid) {
            Ok(n) => {
                tracing::info!(fleet = %name, entries = n, "mirror entries set aside by journal reset")
            }
            Err(e) => {
                tracing::warn!(fleet = %name, error = %e, "setting the mirror's entries aside failed; the next append reconciles it")
            }
        }
    }
    if warning {
        tracing::warn!(fleet = %name, "{note}");
    } else {
        tracing::info!(fleet = %name, "{note}");
    }
    let (type_, reason) = match &planned {
        Ok((_, RepairCommand::RestoreFromMirror)) => (EventType::Normal, "JournalRestored"),
        Ok((_, RepairCommand::Reset { .. })) => (EventType::Warning, "JournalReset"),
        Err(_) => (EventType::Warning, "JournalCommandRefused"),
    };
    event(ctx, &patched, type_, reason, note).await;
    Ok(None)
}

/// The annotation text `restore-from-mirror` writes: the mirror's chain for the fleet,
/// verified and compacted to the budget; refused when the annotation is usable and not
/// behind the mirror.
fn restored_annotation(ctx: &Ctx, fleet: &CelldFleet) -> Result<String, String> {
    let uid = fleet.uid().unwrap_or_default();
    let mirror = ctx
        .mirror
        .as_ref()
        .ok_or("this replica runs without a journal mirror")?;
    let entries = mirror
        .entries(&uid)
        .map_err(|e| format!("reading the mirror: {e}"))?;
    if entries.is_empty() {
        return Err(format!(
            "the local mirror holds no entries for fleet UID {uid}"
        ));
    }
    let restored = Journal::from_history(&uid, entries, ctx.budget)
        .map_err(|e| format!("the mirror's chain cannot be used: {e}"))?;
    if fleet.annotations().contains_key(JOURNAL_ANNOTATION) {
        if let Ok(current) = journal_store::load(fleet) {
            if current.document().seq() >= restored.document().seq() {
                return Err(format!(
                    "the annotation verifies and is not behind the mirror (seq {} >= {}); nothing to restore",
                    current.document().seq(),
                    restored.document().seq()
                ));
            }
        }
    }
    Ok(restored.document().encode())
}

/// Whether storing the status of `report` over `old` is announced with an Event
/// ([`announce_blocked`]): the Blocked condition turns true, changes reason, or clears.
pub(crate) fn announces(old: &CelldFleetStatus, report: &Report) -> bool {
    let was = old.conditions.iter().find(|c| c.type_ == "Blocked");
    let was_blocked = was.is_some_and(|c| c.status == "True");
    let was_reason = was.map(|c| c.reason.as_str()).unwrap_or_default();
    let blocked = matches!(report.class, Class::Blocked | Class::BlockedInfraReady);
    // `ForeignOperator` is announced by each installation itself (foreign.rs), since both
    // write the same condition and only the first write is a transition.
    if blocked && report.reason == reasons::FOREIGN_OPERATOR.name {
        return false;
    }
    (blocked && (!was_blocked || was_reason != report.reason)) || (!blocked && was_blocked)
}

/// Every `Blocked=True` transition (or change of its reason) publishes one Warning Event and
/// one log line; clearing publishes one Normal Event (docs/design.md "Events and metrics").
/// Compared with the status read at the start of the reconcile, so a fleet that stays blocked says
/// it once.
pub(crate) async fn announce_blocked(run: &Run<'_>, old: &CelldFleetStatus, report: &Report) {
    if !announces(old, report) {
        return;
    }
    let was_reason = old
        .conditions
        .iter()
        .find(|c| c.type_ == "Blocked")
        .map(|c| c.reason.clone())
        .unwrap_or_default();
    let fleet = format!("{}/{}", run.ns, run.name);
    if matches!(report.class, Class::Blocked | Class::BlockedInfraReady) {
        tracing::warn!(fleet = %fleet, reason = report.reason, "blocked: {}", report.message);
        event(
            run.ctx,
            &run.fleet,
            EventType::Warning,
            report.reason,
            report.message.clone(),
        )
        .await;
    } else {
        tracing::info!(fleet = %fleet, previous = %was_reason, "no longer blocked: {}", report.message);
        event(
            run.ctx,
            &run.fleet,
            EventType::Normal,
            &was_reason,
            format!("Resolved: {}", report.message),
        )
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_request_is_planned_again_only_after_a_growing_pause() {
        let pauses: Vec<u64> = (1..=8).map(|n| replan_pause(n).as_secs()).collect();
        assert_eq!(pauses, vec![30, 60, 120, 240, 480, 600, 600, 600]);
        // Within 60 s at most two cancellations of one request can happen (t = 0, 30), so
        // at most four entries; a marker mismatch opens nothing at all.
        let mut t = 0;
        let mut n = 0;
        while t <= 60 {
            n += 1;
            t += replan_pause(n).as_secs();
        }
        assert!(n <= 2, "{n} cancellations within 60 s");
    }

    #[test]
    fn fingerprints_tell_requests_apart() {
        use journal::OperationKind::*;
        let a = fingerprint(Scale, 4, 5, None, None);
        assert_eq!(a, fingerprint(Scale, 4, 5, None, None));
        assert_ne!(a, fingerprint(Scale, 4, 6, None, None));
        assert_ne!(
            fingerprint(Restart, 3, 3, Some("t1"), None),
            fingerprint(Restart, 3, 3, Some("t2"), None)
        );
    }
}
