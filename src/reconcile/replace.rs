//! Member replacement (docs/design.md "Member replacement"): a member's Pod and disk are
//! replaced as one journaled `MemberReplacement` operation.
//!
//! The Pod keeps the member's name while its old disk is released, so no successor starts on
//! the old disk between the two deletions, and a member that recovers before the decision is
//! kept. The step table (each step decided from the journal, carried out after its guard
//! passed on fresh reads; the driver runs the first step not done and stops at the first wait):
//!
//! | # | step | guard (fresh reads) | write (precondition) | done when |
//! |---|---|---|---|---|
//! | 1 | `hold` | Pod UID as recorded, not terminating | Pod update (read RV): finalizer, label, annotation with `committed: false` | `Issued`; a Pod already holding this op's hold → `Issued{replayed}` |
//! | 2 | `pod` | trigger re-checked (still down / claim still `Lost` / request unchanged / claim still terminating) | Pod delete (UID + RV) | `Issued`; trigger gone → `release`, `Completed{MemberChanged}` |
//! | 3 | `commit` | Pod terminating, holds the finalizer, fleet label, controller the fleet's StatefulSet | Pod update: `committed: true` | `Issued`; hold removed by someone else → `Completed{ClaimKept}` |
//! | 4 | `retire/<claim>` | UID and RV as recorded, not terminating, fleet label, no other Pod uses it | claim delete (UID + RV) | `ClaimRetired`; RV moved → kept (`ClaimKept`); UID changed → `release`, then `Blocked` |
//! | 5 | `release` | Pod still holds this op's hold | Pod update: finalizer, label, annotation removed (others kept) | `Issued`; Pod gone or hold gone → `Issued{replayed}` |
//! | 6 | `Observed` | — | — | the ordinal's member Ready on a claim whose UID differs from the old one (kept: the same) |
//! | 7 | `Completed` | — | — | `Succeeded` or `ClaimKept` (an `Administrative` request's annotation removed in the same write) |
//!
//! Bucket fleets (administrative only) and `ClaimDeleted` (the claim is already going) run
//! only `pod`, then `Observed` once the workload is back to its ready count. Without a hold,
//! the member found terminating or gone at its recorded UID means the `pod` step is done
//! (`Issued{replayed}`): the delete's answer may have been lost or the process died after it.

use super::reasons;
use journal::{
    CancelReason, Canceled, ClaimRetired, Completed, CompletedOutcome, Effect, EntryBody, Intent,
    Issued, Observed, OperationId, OperationKind, Recovered, Step, Target, ADOPTED_HOLD_REASON,
};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::ResourceExt;

use super::drive::OpenOp;
use super::heal;
use super::{Error, KubeContext, Report, Run};
use crate::api::keys::{
    FLEET_UID_LABEL, REPLACEMENT_CLAIM_ANNOTATION, REPLACEMENT_FLEET_LABEL,
    REPLACE_MEMBER_ANNOTATION, REPLACING_FINALIZER,
};
use crate::api::Profile;
use crate::failpoint;

/// `Intent.reason` values of `MemberReplacement`.
pub const ADMINISTRATIVE: &str = "Administrative";
/// A member's claim is `Lost`.
pub const DISK_LOST: &str = "DiskLost";
/// A member's claim is being deleted under its live Pod.
pub const CLAIM_DELETED: &str = "ClaimDeleted";
/// A member stayed down past the replacement delay.
pub const LONG_DOWN: &str = "LongDown";

/// The hold annotation on a Pod.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hold {
    #[serde(rename = "fleetUID")]
    pub fleet_uid: String,
    #[serde(rename = "claimUID")]
    pub claim_uid: Option<String>,
    pub claim_resource_version: Option<String>,
    pub committed: bool,
    pub operation_id: Option<String>,
}

fn hold_of(pod: &Pod) -> Option<Hold> {
    serde_json::from_str(pod.annotations().get(REPLACEMENT_CLAIM_ANNOTATION)?).ok()
}

fn holds_finalizer(pod: &Pod) -> bool {
    pod.finalizers().iter().any(|f| f == REPLACING_FINALIZER)
}

/// Whether `pod` holds the hold of operation `op`.
fn held_by(pod: &Pod, op: OperationId) -> bool {
    holds_finalizer(pod) && hold_of(pod).and_then(|h| h.operation_id) == Some(op.to_string())
}

/// Whether `pod` holds operation `op`'s committed hold (the `commit` step landed).
pub(crate) fn committed_by(pod: &Pod, op: OperationId) -> bool {
    held_by(pod, op) && hold_of(pod).is_some_and(|h| h.committed)
}

/// The `replace-member` value an administrative operation answers.
fn request_of(intent: &Intent) -> Option<String> {
    let t = intent.targets.first()?;
    Some(format!("{}/{}", t.pod, t.pod_uid.as_deref().unwrap_or("")))
}

/// Whether `body` closes an administrative replacement whose request is still on the fleet
/// (then the request is removed in the same write).
pub(crate) fn closes_request(run: &Run<'_>, op: OperationId, body: &EntryBody) -> bool {
    if !matches!(
        body,
        EntryBody::Completed(_) | EntryBody::Canceled(_) | EntryBody::Abandoned(_)
    ) {
        return false;
    }
    let Some(o) = run.journal.fold().operation(op) else {
        return false;
    };
    o.kind() == OperationKind::MemberReplacement
        && o.intent().reason.as_deref() == Some(ADMINISTRATIVE)
        && run.fleet.annotations().get(REPLACE_MEMBER_ANNOTATION) == request_of(o.intent()).as_ref()
}

pub(crate) fn simple(intent: &Intent) -> bool {
    intent.reason.as_deref() == Some(CLAIM_DELETED)
        || intent.targets.first().is_none_or(|t| t.claim.is_none())
}

fn label(o: &journal::Operation) -> String {
    let i = o.intent();
    format!(
        "MemberReplacement {} ({} {})",
        o.id(),
        i.targets.first().map(|t| t.pod.as_str()).unwrap_or("?"),
        i.reason.as_deref().unwrap_or("")
    )
}

fn progress(o: &journal::Operation, detail: &str) -> Report {
    let step = o
        .current_step()
        .map(|s| s.to_string())
        .unwrap_or_else(|| "intent".into());
    Report::progress(format!("{} at step {step}: {detail}", label(o)))
}

fn current(run: &Run<'_>, id: OperationId) -> journal::Operation {
    run.journal
        .fold()
        .operation(id)
        .cloned()
        .expect("the operation is in the fold")
}

fn issued(
    o: &journal::Operation,
    step: Step,
    replayed: bool,
    decided: Option<String>,
    result: Option<String>,
) -> EntryBody {
    EntryBody::Issued(Issued {
        effect: Effect::new(o.id(), step.clone()),
        step,
        decided_on_resource_version: decided,
        result_resource_version: result,
        replayed,
        target: None,
    })
}

async fn complete(
    run: &mut Run<'_>,
    o: &journal::Operation,
    outcome: CompletedOutcome,
) -> Result<Report, Error> {
    failpoint::reach("before-complete");
    run.append(o.id(), EntryBody::Completed(Completed { outcome }))
        .await?;
    run.ctx
        .metrics
        .replacements
        .get_or_create(&crate::metrics::ReplacementLabels {
            reason: o.intent().reason.clone().unwrap_or_default(),
            outcome: outcome.as_str().into(),
        })
        .inc();
    Ok(Report::provisioning(format!(
        "{} completed ({outcome})",
        label(o)
    )))
}

/// Before a replacement that issued nothing is canceled: its first effect (the hold, or a
/// simple replacement's Pod delete) is a write with the member Pod's resourceVersion, so the
/// Pod is fenced first ([`super::drive::fence_object`]), and a write a deposed leader
/// decided on an earlier read fails. `false` when the hold landed or the Pod moved
/// meanwhile: the next reconcile decides again from a fresh read.
async fn fence_member(run: &Run<'_>, o: &journal::Operation) -> Result<bool, Error> {
    let Some(t) = o.intent().targets.first() else {
        return Ok(true);
    };
    let pods = Api::<Pod>::namespaced(run.client.clone(), &run.ns);
    let id = o.id();
    let fence =
        super::drive::fence_object(run, &pods, &t.pod, t.pod_uid.as_deref(), id, false, |p| {
            held_by(p, id)
        })
        .await?;
    Ok(fence == super::drive::Fence::Fenced)
}

/// A failed guard: `Canceled` while nothing is issued, else `Blocked`.
async fn refuse(run: &mut Run<'_>, id: OperationId, why: String) -> Result<Report, Error> {
    let o = current(run, id);
    if !o.issued_anything() {
        if !fence_member(run, &o).await? {
            return Ok(progress(
                &o,
                &format!("{why}; its member changed while it was being closed, deciding again"),
            ));
        }
        run.append(
            id,
            EntryBody::Canceled(Canceled {
                reason: CancelReason::PredecessorChanged,
            }),
        )
        .await?;
        return Ok(Report::provisioning(format!(
            "{} canceled before issue: {why}; planning again",
            label(&o)
        )));
    }
    run.append(
        id,
        EntryBody::Blocked(journal::Blocked {
            blocker: why.clone(),
        }),
    )
    .await?;
    Ok(blocked_report(run, &current(run, id), &why))
}

fn blocked_report(run: &Run<'_>, o: &journal::Operation, blocker: &str) -> Report {
    let step = o
        .current_step()
        .map(|s| s.to_string())
        .unwrap_or_else(|| "intent".into());
    Report::blocked(
        &reasons::OPERATION_BLOCKED,
        format!(
            "MemberReplacement {} is blocked at {step}: {blocker}. {}",
            o.id(),
            reasons::resolve_hint(&run.ns, &run.name, o.id())
        ),
    )
}

/// Opens a `MemberReplacement` of member `ordinal` with `reason`, from fresh reads, and drives
/// its first step.
pub(crate) async fn open(
    run: &mut Run<'_>,
    reason: &'static str,
    ordinal: i32,
    pod_name: Option<String>,
) -> Result<Report, Error> {
    let name = pod_name.unwrap_or_else(|| format!("{}-{ordinal}", run.name));
    let Some(pod) = Api::<Pod>::namespaced(run.client.clone(), &run.ns)
        .get_opt(&name)
        .await
        .ctx(|| format!("reading member {name}"))?
    else {
        return Ok(Report::provisioning(format!(
            "Member {name} is gone; not replacing it"
        )));
    };
    let persistent = run.fleet.spec.profile == Profile::PersistentFleet;
    let claim = if persistent {
        run.claim_at(ordinal).await?
    } else {
        None
    };
    let live = run.workload().await?;
    let replicas = live.as_ref().map(|w| w.replicas()).unwrap_or(0);
    failpoint::reach("before-intent");
    let id = OperationId::new_v4();
    let intent = Intent {
        kind: OperationKind::MemberReplacement,
        from: replicas,
        to: replicas,
        token: None,
        image: None,
        reason: Some(reason.to_string()),
        deadline: run.ctx.deadline(run.now, None),
        targets: vec![Target {
            pod: name,
            pod_uid: pod.metadata.uid.clone(),
            pod_ip: pod.status.as_ref().and_then(|s| s.pod_ip.clone()),
            runtime_generation: None,
            claim: claim.as_ref().map(|c| c.name_any()),
            claim_uid: claim.as_ref().and_then(|c| c.metadata.uid.clone()),
            claim_resource_version: claim.as_ref().and_then(|c| c.resource_version()),
        }],
        workload_uid: live.as_ref().and_then(|w| w.meta().uid.clone()),
        predecessor_effect: run.journal.predecessor_effect(),
    };
    run.append(id, EntryBody::Intent(intent)).await?;
    failpoint::reach("after-intent");
    let open = super::drive::open_op(run).expect("just opened");
    drive(run, &open).await
}

/// Cancel rules before issue: paused; an administrative request changed or removed.
fn cancel_reason(run: &Run<'_>, intent: &Intent) -> Option<CancelReason> {
    if run
        .fleet
        .spec
        .maintenance
        .as_ref()
        .is_some_and(|m| m.paused)
    {
        return Some(CancelReason::CanceledBeforeIssue);
    }
    if intent.reason.as_deref() == Some(ADMINISTRATIVE)
        && run.fleet.annotations().get(REPLACE_MEMBER_ANNOTATION) != request_of(intent).as_ref()
    {
        return Some(CancelReason::RequestChanged);
    }
    None
}

/// Drives an open `MemberReplacement` one step (the table above).
pub(crate) async fn drive(run: &mut Run<'_>, open: &OpenOp) -> Result<Report, Error> {
    // Killed after the hold landed (`after-effect`): the operation is issued in the world even
    // though the journal has no `Issued` yet. Record it as replayed before any cancel or
    // deadline rule for Intent could apply.
    if !open.issued && !simple(&open.intent) {
        if let Some(t) = open.intent.targets.first() {
            let landed = Api::<Pod>::namespaced(run.client.clone(), &run.ns)
                .get_opt(&t.pod)
                .await
                .ctx(|| format!("reading member {}", t.pod))?
                .is_some_and(|p| p.metadata.uid == t.pod_uid && held_by(&p, open.id));
            if landed {
                let o = current(run, open.id);
                return hold(run, &o, &t.clone()).await;
            }
        }
    }
    if let Some(action) = run
        .journal
        .fold()
        .current()
        .filter(|o| o.id() == open.id)
        .and_then(|o| journal::deadline::due(o, run.now))
    {
        let canceled = matches!(action, journal::DeadlineAction::Cancel { .. });
        if canceled && !fence_member(run, &current(run, open.id)).await? {
            return Ok(progress(
                &current(run, open.id),
                "its member changed while it was being closed; deciding again",
            ));
        }
        run.append(action.op(), action.body()).await?;
        if canceled {
            return Ok(Report::provisioning(format!(
                "MemberReplacement {} passed its deadline before issue and was canceled",
                open.id
            )));
        }
    }
    let o = current(run, open.id);
    if let Some((_, blocker)) = o.blocked() {
        return Ok(blocked_report(run, &o, blocker));
    }
    let intent = o.intent().clone();
    if !o.issued_anything() {
        if let Some(reason) = cancel_reason(run, &intent) {
            if !fence_member(run, &o).await? {
                return Ok(progress(
                    &o,
                    "its member changed while it was being closed; deciding again",
                ));
            }
            run.append(o.id(), EntryBody::Canceled(Canceled { reason }))
                .await?;
            return Ok(Report::provisioning(format!(
                "{} was canceled ({}); planning again",
                label(&o),
                reason.as_str()
            )));
        }
    }
    let Some(t) = intent.targets.first().cloned() else {
        return refuse(run, o.id(), "the Intent names no member".into()).await;
    };
    let pods = Api::<Pod>::namespaced(run.client.clone(), &run.ns);
    let is_simple = simple(&intent);
    if !is_simple && !o.has_effect(&Step::Hold) {
        return hold(run, &o, &t).await;
    }
    if !o.has_effect(&Step::Pod) {
        return delete_pod(run, &o, &t, is_simple).await;
    }
    if !is_simple {
        if !o.has_effect(&Step::Commit) {
            return commit(run, &o, &t).await;
        }
        if !o.has_effect(&Step::Release) {
            if let Some(report) = retire(run, &o, &t).await? {
                return Ok(report);
            }
            return release(run, &current(run, o.id()), &t).await;
        }
    }
    let o = current(run, o.id());
    let kept = !is_simple
        && o.effects()
            .iter()
            .all(|e| !matches!(e.step, Step::Retire(_)));
    if o.observed().is_none() {
        let note = if is_simple && t.claim.is_none() {
            let Some(live) = run.workload().await? else {
                return Ok(progress(&o, "the workload is gone"));
            };
            let old_gone = !run
                .pods()
                .await?
                .iter()
                .any(|p| p.metadata.uid == t.pod_uid);
            if !(old_gone && live.observed_current() && live.rolled_out()) {
                return Ok(progress(
                    &o,
                    &format!(
                        "waiting for the workload to be back to {} ready members ({} ready)",
                        live.replicas(),
                        live.ready_replicas()
                    ),
                ));
            }
            format!("the workload is back to {} ready members", live.replicas())
        } else {
            let pod = pods
                .get_opt(&t.pod)
                .await
                .ctx(|| format!("reading member {}", t.pod))?;
            let ordinal = t
                .pod
                .rsplit('-')
                .next()
                .and_then(|s| s.parse::<i32>().ok())
                .unwrap_or(0);
            let claim = run.claim_at(ordinal).await?;
            let new_pod = pod
                .as_ref()
                .filter(|p| p.metadata.uid != t.pod_uid && heal::is_up(p));
            let claim_uid = claim.as_ref().and_then(|c| c.metadata.uid.clone());
            let claim_ok = if kept {
                claim_uid == t.claim_uid
            } else {
                claim_uid.is_some() && claim_uid != t.claim_uid
            };
            let Some(p) = new_pod.filter(|_| claim_ok) else {
                return Ok(progress(
                    &o,
                    &format!(
                        "waiting for member {} to be Ready on {}",
                        t.pod,
                        if kept {
                            "its kept claim"
                        } else {
                            "a fresh claim"
                        }
                    ),
                ));
            };
            format!(
                "member {} is Ready (Pod {}) on claim {} UID {}{}",
                t.pod,
                p.metadata.uid.as_deref().unwrap_or("?"),
                t.claim.as_deref().unwrap_or("?"),
                claim_uid.as_deref().unwrap_or("?"),
                if kept { " (kept)" } else { " (fresh)" }
            )
        };
        run.append(o.id(), EntryBody::Observed(Observed { note }))
            .await?;
    }
    let o = current(run, o.id());
    complete(
        run,
        &o,
        if kept {
            CompletedOutcome::ClaimKept
        } else {
            CompletedOutcome::Succeeded
        },
    )
    .await
}

/// Step 1: the hold (finalizer, label, annotation) on the member Pod, with its read RV.
async fn hold(run: &mut Run<'_>, o: &journal::Operation, t: &Target) -> Result<Report, Error> {
    let api = Api::<Pod>::namespaced(run.client.clone(), &run.ns);
    let pod = api
        .get_opt(&t.pod)
        .await
        .ctx(|| format!("reading member {}", t.pod))?;
    let Some(mut pod) = pod.filter(|p| p.metadata.uid == t.pod_uid) else {
        return refuse(
            run,
            o.id(),
            format!("member {} is gone or has a new UID", t.pod),
        )
        .await;
    };
    if held_by(&pod, o.id()) {
        // Written before a crash: recorded, never repeated.
        return replayed(
            run,
            o,
            Step::Hold,
            &pod,
            "hold found in place; recorded as replayed",
        )
        .await;
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return refuse(
            run,
            o.id(),
            format!("member {} is already terminating", t.pod),
        )
        .await;
    }
    if holds_finalizer(&pod) {
        return refuse(
            run,
            o.id(),
            format!("member {} already holds another replacement hold", t.pod),
        )
        .await;
    }
    let h = Hold {
        fleet_uid: run.uid.clone(),
        claim_uid: t.claim_uid.clone(),
        claim_resource_version: t.claim_resource_version.clone(),
        committed: false,
        operation_id: Some(o.id().to_string()),
    };
    pod.metadata
        .finalizers
        .get_or_insert_with(Vec::new)
        .push(REPLACING_FINALIZER.into());
    pod.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(REPLACEMENT_FLEET_LABEL.into(), run.uid.clone());
    set_hold(&mut pod, &h);
    write_pod(
        run,
        o,
        Step::Hold,
        pod,
        &format!("member {} is held; deleting its Pod next", t.pod),
    )
    .await
}

/// A Pod step found already done (written before a crash): recorded, never repeated.
async fn replayed(
    run: &mut Run<'_>,
    o: &journal::Operation,
    step: Step,
    pod: &Pod,
    what: &str,
) -> Result<Report, Error> {
    let rv = pod.resource_version();
    run.append(o.id(), issued(o, step, true, rv.clone(), rv))
        .await?;
    Ok(progress(&current(run, o.id()), what))
}

fn set_hold(pod: &mut Pod, h: &Hold) {
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            REPLACEMENT_CLAIM_ANNOTATION.into(),
            serde_json::to_string(h).unwrap_or_default(),
        );
}

/// The guarded Pod update of `step` (`hold`, `commit`): written with the resourceVersion it
/// was read at, then recorded; a conflict is decided again from a fresh read.
async fn write_pod(
    run: &mut Run<'_>,
    o: &journal::Operation,
    step: Step,
    pod: Pod,
    done: &str,
) -> Result<Report, Error> {
    let name = pod.name_any();
    let decided = pod.resource_version();
    let api = Api::<Pod>::namespaced(run.client.clone(), &run.ns);
    run.before_effect();
    let written = match api.replace(&name, &PostParams::default(), &pod).await {
        Ok(p) => p,
        Err(kube::Error::Api(s)) if s.code == 409 => {
            return Ok(progress(
                o,
                &format!("member {name} changed; deciding again"),
            ))
        }
        Err(e) => return Err(e).ctx(|| format!("writing step {step} to member {name}")),
    };
    failpoint::reach("after-effect");
    run.append(
        o.id(),
        issued(o, step, false, decided, written.resource_version()),
    )
    .await?;
    Ok(progress(&current(run, o.id()), done))
}

/// The trigger, re-checked on fresh reads before the Pod is deleted: `Err(why it is gone)`.
async fn trigger_holds(
    run: &Run<'_>,
    o: &journal::Operation,
    t: &Target,
    pod: &Pod,
) -> Result<Result<(), String>, Error> {
    let reason = o.intent().reason.clone().unwrap_or_default();
    let claim = || async {
        match &t.claim {
            Some(name) => Api::<PersistentVolumeClaim>::namespaced(run.client.clone(), &run.ns)
                .get_opt(name)
                .await
                .ctx(|| format!("reading claim {name}")),
            None => Ok(None),
        }
    };
    Ok(match reason.as_str() {
        ADMINISTRATIVE => {
            let now = run.fleet.annotations().get(REPLACE_MEMBER_ANNOTATION);
            if now == request_of(o.intent()).as_ref() {
                Ok(())
            } else {
                Err(format!("the request changed to {now:?}"))
            }
        }
        DISK_LOST => {
            let c = claim().await?;
            let phase = c.as_ref().and_then(|c| c.status.as_ref()?.phase.clone());
            if phase.as_deref() == Some("Lost") {
                Ok(())
            } else {
                Err(format!(
                    "claim {} is {} again",
                    t.claim.as_deref().unwrap_or("?"),
                    phase.unwrap_or_else(|| "gone".into())
                ))
            }
        }
        CLAIM_DELETED => {
            let c = claim().await?;
            if c.as_ref()
                .is_some_and(|c| c.metadata.deletion_timestamp.is_some())
            {
                Ok(())
            } else {
                Err("the claim is no longer being deleted".into())
            }
        }
        LONG_DOWN => {
            if heal::is_up(pod) {
                Err(format!("member {} recovered", t.pod))
            } else if let Some((r, _)) = heal::config_error(pod) {
                Err(format!(
                    "member {} now waits with {r}, which a fresh disk does not fix",
                    t.pod
                ))
            } else {
                Ok(())
            }
        }
        _ => Ok(()),
    })
}

/// Step 2: the Pod deleted with UID + RV, after the trigger was re-checked.
async fn delete_pod(
    run: &mut Run<'_>,
    o: &journal::Operation,
    t: &Target,
    is_simple: bool,
) -> Result<Report, Error> {
    let api = Api::<Pod>::namespaced(run.client.clone(), &run.ns);
    let pod = api
        .get_opt(&t.pod)
        .await
        .ctx(|| format!("reading member {}", t.pod))?
        .filter(|p| p.metadata.uid == t.pod_uid);
    let Some(pod) = pod else {
        if is_simple {
            // The member at its recorded UID is gone: the delete this step sends is the
            // only one a simple replacement has, and its answer may have been lost (or the
            // process died after sending it). Whoever deleted it, the member is being
            // replaced, which is what the operation was for: the step is recorded as found
            // done, as for a terminating Pod below. (Recording `Canceled` before issue here
            // was wrong: found by the API fault sweep, a lost response to the delete.)
            run.append(o.id(), issued(o, Step::Pod, true, None, None))
                .await?;
            return Ok(progress(
                &current(run, o.id()),
                &format!("member {} is gone; its delete recorded as replayed", t.pod),
            ));
        }
        // Held Pods cannot go without the hold being removed: someone else removed it.
        return complete(run, o, CompletedOutcome::MemberChanged).await;
    };
    if pod.metadata.deletion_timestamp.is_some() && (is_simple || held_by(&pod, o.id())) {
        return replayed(
            run,
            o,
            Step::Pod,
            &pod,
            "Pod found terminating; recorded as replayed",
        )
        .await;
    }
    if !is_simple && !held_by(&pod, o.id()) {
        return refuse(
            run,
            o.id(),
            format!("the hold on member {} was removed", t.pod),
        )
        .await;
    }
    if let Err(why) = trigger_holds(run, o, t, &pod).await? {
        if is_simple {
            let reason = if o.intent().reason.as_deref() == Some(ADMINISTRATIVE) {
                CancelReason::RequestChanged
            } else {
                CancelReason::PredecessorChanged
            };
            if !fence_member(run, o).await? {
                return Ok(progress(
                    o,
                    "its member changed while it was being closed; deciding again",
                ));
            }
            run.append(o.id(), EntryBody::Canceled(Canceled { reason }))
                .await?;
            return Ok(Report::provisioning(format!(
                "{} canceled: {why}",
                label(o)
            )));
        }
        tracing::info!(op = %o.id(), member = %t.pod, %why, "replacement trigger gone before the Pod step: releasing");
        release(run, o, t).await?;
        let o = current(run, o.id());
        return complete(run, &o, CompletedOutcome::MemberChanged).await;
    }
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: pod.resource_version(),
        }),
        ..DeleteParams::default()
    };
    run.before_effect();
    match api.delete(&t.pod, &dp).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
            return Ok(progress(
                o,
                &format!("member {} changed; deciding again", t.pod),
            ))
        }
        Err(e) => return Err(e).ctx(|| format!("deleting member {}", t.pod)),
    }
    failpoint::reach("after-effect");
    run.append(
        o.id(),
        issued(o, Step::Pod, false, pod.resource_version(), None),
    )
    .await?;
    let reason = o.intent().reason.clone().unwrap_or_default();
    let (event, note) = if reason == DISK_LOST {
        (
            "MemberDiskLost",
            format!("Member {} lost its volume and is being replaced; celld records data that existed only there as a bounded loss", t.pod),
        )
    } else {
        (
            "MemberReplaced",
            format!("Replacing member {} on a fresh disk: {reason}", t.pod),
        )
    };
    run.member_event(event, note, &pod).await;
    Ok(progress(
        &current(run, o.id()),
        &format!("member {} is being deleted", t.pod),
    ))
}

/// Step 3: `committed: true` on the terminating, held Pod.
async fn commit(run: &mut Run<'_>, o: &journal::Operation, t: &Target) -> Result<Report, Error> {
    let api = Api::<Pod>::namespaced(run.client.clone(), &run.ns);
    let pod = api
        .get_opt(&t.pod)
        .await
        .ctx(|| format!("reading member {}", t.pod))?
        .filter(|p| p.metadata.uid == t.pod_uid);
    let Some(mut pod) = pod.filter(|p| held_by(p, o.id())) else {
        tracing::warn!(op = %o.id(), member = %t.pod, "the hold was removed by someone else before commit: the claim is kept");
        return complete(run, o, CompletedOutcome::ClaimKept).await;
    };
    let controller_ok = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.kind == "StatefulSet" && r.name == run.name && r.controller == Some(true));
    let label_ok = pod.labels().get(FLEET_UID_LABEL).map(String::as_str) == Some(run.uid.as_str());
    if pod.metadata.deletion_timestamp.is_none() || !controller_ok || !label_ok {
        return refuse(
            run,
            o.id(),
            format!(
                "member {} is not a terminating Pod of this fleet's StatefulSet (terminating {}, controller {controller_ok}, label {label_ok})",
                t.pod,
                pod.metadata.deletion_timestamp.is_some()
            ),
        )
        .await;
    }
    let mut h = hold_of(&pod).expect("held_by parsed it");
    if h.committed {
        return replayed(
            run,
            o,
            Step::Commit,
            &pod,
            "commit found in place; recorded as replayed",
        )
        .await;
    }
    h.committed = true;
    set_hold(&mut pod, &h);
    write_pod(
        run,
        o,
        Step::Commit,
        pod,
        "committed: the old disk is never reused; retiring it",
    )
    .await
}

/// Step 4: the old claim deleted with its recorded UID and RV, once. `None`: retired or kept,
/// go on to `release`.
async fn retire(
    run: &mut Run<'_>,
    o: &journal::Operation,
    t: &Target,
) -> Result<Option<Report>, Error> {
    let (Some(name), Some(uid)) = (t.claim.clone(), t.claim_uid.clone()) else {
        return Ok(None);
    };
    if o.has_effect(&Step::Retire(name.clone())) {
        return Ok(None);
    }
    let api = Api::<PersistentVolumeClaim>::namespaced(run.client.clone(), &run.ns);
    let claim = api
        .get_opt(&name)
        .await
        .ctx(|| format!("reading claim {name}"))?;
    let retired = EntryBody::ClaimRetired(ClaimRetired {
        claim: name.clone(),
        claim_uid: uid.clone(),
        claim_resource_version: t.claim_resource_version.clone(),
    });
    let Some(claim) = claim else {
        run.append(o.id(), retired).await?;
        return Ok(None);
    };
    if claim.uid().as_deref() != Some(uid.as_str()) {
        // Another claim at that name: never deleted. The member is released onto it, and a
        // person decides.
        let why = format!(
            "claim {name} now has UID {}, recorded {uid}; it is kept",
            claim.uid().unwrap_or_default()
        );
        release(run, o, t).await?;
        return refuse(run, o.id(), why).await.map(Some);
    }
    if claim.metadata.deletion_timestamp.is_some() {
        // The delete was sent before a crash (`after-claim-delete`): never a second one.
        run.append(o.id(), retired).await?;
        return Ok(None);
    }
    if claim.resource_version() != t.claim_resource_version {
        tracing::warn!(op = %o.id(), claim = %name, "claim changed since Intent: kept (ClaimKept)");
        return Ok(None);
    }
    if claim.labels().get(FLEET_UID_LABEL).map(String::as_str) != Some(run.uid.as_str()) {
        tracing::warn!(op = %o.id(), claim = %name, "claim lost this fleet's UID label: kept (ClaimKept)");
        return Ok(None);
    }
    let users: Vec<String> = run
        .pods()
        .await?
        .into_iter()
        .filter(|p| p.metadata.uid != t.pod_uid && super::strict::uses_claim(p, &name))
        .map(|p| p.name_any())
        .collect();
    if !users.is_empty() {
        return Ok(Some(progress(
            o,
            &format!("claim {name} is used by {}; waiting", users.join(", ")),
        )));
    }
    run.ctx.check_lease();
    failpoint::reach("before-claim-delete");
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.clone()),
            resource_version: t.claim_resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    match api.delete(&name, &dp).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {
            return Ok(Some(progress(
                o,
                &format!("claim {name} changed while being retired; deciding again"),
            )))
        }
        Err(e) => return Err(e).ctx(|| format!("retiring claim {name}")),
    }
    failpoint::reach("after-claim-delete");
    run.append(o.id(), retired).await?;
    Ok(None)
}

/// Removes the hold (finalizer, label, annotation; everything else kept) from `pod`.
fn without_hold(mut pod: Pod) -> Pod {
    if let Some(f) = pod.metadata.finalizers.as_mut() {
        f.retain(|f| f != REPLACING_FINALIZER);
    }
    if let Some(l) = pod.metadata.labels.as_mut() {
        l.remove(REPLACEMENT_FLEET_LABEL);
    }
    if let Some(a) = pod.metadata.annotations.as_mut() {
        a.remove(REPLACEMENT_CLAIM_ANNOTATION);
    }
    pod
}

/// Step 5: the hold removed; the Pod and (when retired) the claim go, and the StatefulSet
/// recreates the member on a fresh claim.
async fn release(run: &mut Run<'_>, o: &journal::Operation, t: &Target) -> Result<Report, Error> {
    let api = Api::<Pod>::namespaced(run.client.clone(), &run.ns);
    let pod = api
        .get_opt(&t.pod)
        .await
        .ctx(|| format!("reading member {}", t.pod))?
        .filter(|p| p.metadata.uid == t.pod_uid);
    let Some(pod) = pod.filter(|p| held_by(p, o.id())) else {
        if !o.has_effect(&Step::Release) {
            run.append(o.id(), issued(o, Step::Release, true, None, None))
                .await?;
        }
        return Ok(progress(
            &current(run, o.id()),
            "the hold is gone; recorded as replayed",
        ));
    };
    let decided = pod.resource_version();
    run.before_effect();
    let written = match api
        .replace(&t.pod, &PostParams::default(), &without_hold(pod))
        .await
    {
        Ok(p) => p.resource_version(),
        Err(kube::Error::Api(s)) if s.code == 404 => None,
        Err(kube::Error::Api(s)) if s.code == 409 => {
            return Ok(progress(
                o,
                &format!("member {} changed; deciding again", t.pod),
            ))
        }
        Err(e) => return Err(e).ctx(|| format!("releasing member {}", t.pod)),
    };
    failpoint::reach("after-effect");
    run.append(o.id(), issued(o, Step::Release, false, decided, written))
        .await?;
    Ok(progress(
        &current(run, o.id()),
        &format!(
            "member {} released; the workload controller recreates it",
            t.pod
        ),
    ))
}

/// Step 4 of the reconcile: every Pod holding a replacement hold of this fleet. The open
/// operation's own hold is driven by it; a committed orphan of a live fleet is adopted; any
/// other orphan is recorded and released (the member restarts on its retained disk), so a
/// hold never strands a member.
pub(crate) async fn resolve_holds(run: &mut Run<'_>) -> Result<Option<Report>, Error> {
    let api = Api::<Pod>::namespaced(run.client.clone(), &run.ns);
    let held: Vec<Pod> = run
        .labelled_by::<Pod>(REPLACEMENT_FLEET_LABEL)
        .await?
        .into_iter()
        .filter(holds_finalizer)
        .collect();
    let open = run.journal.fold().current().map(|o| o.id());
    for pod in held {
        let h = hold_of(&pod);
        let op = h
            .as_ref()
            .and_then(|h| h.operation_id.as_deref())
            .and_then(|s| s.parse::<OperationId>().ok());
        if op.is_some() && op == open {
            continue;
        }
        let name = pod.name_any();
        let paused = run
            .fleet
            .spec
            .maintenance
            .as_ref()
            .is_some_and(|m| m.paused);
        let deleting = run.fleet.metadata.deletion_timestamp.is_some();
        let controller_ok =
            pod.metadata.owner_references.iter().flatten().any(|r| {
                r.kind == "StatefulSet" && r.name == run.name && r.controller == Some(true)
            });
        let adoptable = h
            .as_ref()
            .is_some_and(|h| h.committed && h.fleet_uid == run.uid)
            && pod.metadata.deletion_timestamp.is_some()
            && controller_ok
            && !paused
            && !deleting;
        if adoptable {
            if open.is_some() {
                // Adopted once the open operation closes (the journal allows a second open
                // operation for this, but one at a time keeps the order readable).
                continue;
            }
            return adopt(run, &pod, h.expect("adoptable")).await.map(Some);
        }
        // Recorded first (when the journal can say whose hold it was), then released.
        if let Some(op) = op {
            let body = EntryBody::Recovered(Recovered {
                effect: Effect::new(op, Step::Release),
                source: "orphan-hold".into(),
            });
            if run.journal.fold().check(op, &body).is_ok() {
                run.append(op, body).await?;
            }
        }
        tracing::warn!(member = %name, hold = ?h, "releasing an orphan replacement hold; the member restarts on its retained disk");
        run.ctx.check_lease();
        match api
            .replace(&name, &PostParams::default(), &without_hold(pod))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => return Err(e).ctx(|| format!("releasing orphan hold on {name}")),
        }
    }
    Ok(None)
}

/// Adopts a committed orphan hold: `Intent{AdoptedHold}` with the hold's targets, the done
/// steps `Recovered`, then the rest of the protocol (retire, release).
async fn adopt(run: &mut Run<'_>, pod: &Pod, h: Hold) -> Result<Report, Error> {
    let name = pod.name_any();
    let claim = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .and_then(|v| {
            v.iter().find_map(|v| {
                v.persistent_volume_claim
                    .as_ref()
                    .map(|c| c.claim_name.clone())
            })
        });
    let live = run.workload().await?;
    let replicas = live.as_ref().map(|w| w.replicas()).unwrap_or(0);
    let id = OperationId::new_v4();
    let intent = Intent {
        kind: OperationKind::MemberReplacement,
        from: replicas,
        to: replicas,
        token: None,
        image: None,
        reason: Some(ADOPTED_HOLD_REASON.into()),
        deadline: run.ctx.deadline(run.now, None),
        targets: vec![Target {
            pod: name.clone(),
            pod_uid: pod.metadata.uid.clone(),
            pod_ip: pod.status.as_ref().and_then(|s| s.pod_ip.clone()),
            runtime_generation: None,
            claim,
            claim_uid: h.claim_uid.clone(),
            claim_resource_version: h.claim_resource_version.clone(),
        }],
        workload_uid: live.as_ref().and_then(|w| w.meta().uid.clone()),
        predecessor_effect: run.journal.predecessor_effect(),
    };
    run.append(id, EntryBody::Intent(intent)).await?;
    // The adopted hold names the new operation, so it is driven from here on.
    let api = Api::<Pod>::namespaced(run.client.clone(), &run.ns);
    let mut p = pod.clone();
    let mut h2 = h;
    h2.operation_id = Some(id.to_string());
    set_hold(&mut p, &h2);
    run.ctx.check_lease();
    api.replace(&name, &PostParams::default(), &p)
        .await
        .ctx(|| format!("adopting the hold on {name}"))?;
    for step in [Step::Hold, Step::Pod, Step::Commit] {
        run.append(
            id,
            EntryBody::Recovered(Recovered {
                effect: Effect::new(id, step),
                source: "adopted-hold".into(),
            }),
        )
        .await?;
    }
    let open = super::drive::open_op(run).expect("just opened");
    drive(run, &open).await
}

/// The administrative request (`celld.eric.dev/replace-member: <pod>/<uid>`): `None` without
/// one; `Some(Ok((pod, ordinal)))` when every check passes; `Some(Err(why))` names the first
/// that fails (`ReplacementRefused`; the annotation stays and the checks repeat).
pub(crate) async fn admin_request(
    run: &Run<'_>,
) -> Result<Option<Result<(String, i32), String>>, Error> {
    let Some(value) = run
        .fleet
        .annotations()
        .get(REPLACE_MEMBER_ANNOTATION)
        .cloned()
    else {
        return Ok(None);
    };
    let refused = |why: String| {
        Ok(Some(Err(format!(
            "Replacement request {value} refused: {why}"
        ))))
    };
    let Some((pod_name, uid)) = value
        .split_once('/')
        .filter(|(p, u)| !p.is_empty() && !u.is_empty())
    else {
        return refused("the value must be <pod-name>/<pod-uid> (kubectl celld replace NS/FLEET MEMBER sets it)".into());
    };
    if let Some(o) = run.journal.fold().current() {
        if o.kind() == OperationKind::MemberReplacement
            && o.intent().reason.as_deref() == Some(ADMINISTRATIVE)
            && request_of(o.intent()).as_ref() == Some(&value)
        {
            // Being served: nothing to refuse.
            return Ok(None);
        }
        return refused(format!("operation {} ({}) is open", o.id(), o.kind()));
    }
    if run
        .fleet
        .spec
        .maintenance
        .as_ref()
        .is_some_and(|m| m.paused)
    {
        return refused("the fleet is paused".into());
    }
    if run.fleet.metadata.deletion_timestamp.is_some() {
        return refused("the fleet is being deleted".into());
    }
    let pods = run.pods().await?;
    let Some(pod) = pods.iter().find(|p| p.name_any() == pod_name) else {
        return refused(format!("no member {pod_name} exists"));
    };
    if pod.metadata.uid.as_deref() != Some(uid) {
        return refused(format!(
            "member {pod_name} now has UID {}",
            pod.metadata.uid.as_deref().unwrap_or("?")
        ));
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return refused(format!("member {pod_name} is already terminating"));
    }
    if let Some(other) = pods
        .iter()
        .find(|p| p.name_any() != pod_name && !heal::is_up(p))
    {
        return refused(format!("member {} is also down", other.name_any()));
    }
    let ordinal = if crate::render::uses_statefulset(&run.fleet.spec) {
        match pod_name
            .strip_prefix(&format!("{}-", run.name))
            .and_then(|s| s.parse::<i32>().ok())
        {
            Some(i) => i,
            None => return refused(format!("{pod_name} is not a member name of this fleet")),
        }
    } else {
        0
    };
    Ok(Some(Ok((pod_name.to_string(), ordinal))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hold_annotation_has_the_documented_shape() {
        let h = Hold {
            fleet_uid: "f".into(),
            claim_uid: Some("c".into()),
            claim_resource_version: Some("7".into()),
            committed: false,
            operation_id: Some("o".into()),
        };
        assert_eq!(
            serde_json::to_value(&h).unwrap(),
            json!({"fleetUID": "f", "claimUID": "c", "claimResourceVersion": "7", "committed": false, "operationId": "o"})
        );
    }

    #[test]
    fn releasing_keeps_other_finalizers_labels_and_annotations() {
        let mut p = Pod::default();
        p.metadata.finalizers = Some(vec!["other/x".into(), REPLACING_FINALIZER.into()]);
        p.metadata.labels = Some(
            [
                ("a".to_string(), "1".to_string()),
                (REPLACEMENT_FLEET_LABEL.to_string(), "u".to_string()),
            ]
            .into(),
        );
        p.metadata.annotations = Some(
            [
                ("b".to_string(), "2".to_string()),
                (REPLACEMENT_CLAIM_ANNOTATION.to_string(), "{}".to_string()),
            ]
            .into(),
        );
        let r = without_hold(p);
        assert_eq!(r.metadata.finalizers, Some(vec!["other/x".to_string()]));
        assert_eq!(r.metadata.labels.unwrap().len(), 1);
        assert_eq!(r.metadata.annotations.unwrap().len(), 1);
    }
}
