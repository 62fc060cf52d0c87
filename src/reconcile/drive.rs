//! Driving the open operation forward, and opening a new one (docs/design.md "Operation kinds").
//!
//! Every workload write is the guarded write (docs/design.md "The guarded write"): fresh GET; the
//! effect marker `<op>/<step>` already present means the write happened (maybe just before a crash)
//! and is recorded as `Issued{replayed}`; otherwise the marker must equal the predecessor and the
//! step's precondition must hold, or nothing is written (Canceled in Intent, Blocked after issue).
//! The write carries the read resourceVersion.

use super::reasons;
use journal::{
    CancelReason, Canceled, Completed, CompletedOutcome, Effect, EntryBody, Intent, Issued,
    MarkerCheck, Observed, OperationId, OperationKind, PersonAction, Phase, Step, Target,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::{Resource, ResourceExt};

use super::compare::rendered_matches;
use super::integrity;
use super::plan::{plan, Desired, LiveView, Plan};
use super::workload::{self, LiveWorkload};
use super::{Error, KubeContext, Report, Run};
use crate::api::keys::{
    FENCE_ANNOTATION, FLEET_UID_LABEL, JOURNAL_COMMAND_ANNOTATION, RESTART_TOKEN_ANNOTATION,
};
use crate::api::{CelldStorageReservation, Profile};
use crate::failpoint;
use crate::render::{self, claim_name, uses_statefulset, FleetRef, Workload};

/// The workload as rendered for `replicas` with `token` in the Pod template.
fn rendered(run: &Run<'_>, replicas: i32, token: Option<&str>) -> Workload {
    rendered_with(run, &run.fleet.spec, replicas, token)
}

/// The workload as rendered from `spec` (e.g. with the image an Intent recorded).
pub(super) fn rendered_with(
    run: &Run<'_>,
    spec: &crate::api::CelldFleetSpec,
    replicas: i32,
    token: Option<&str>,
) -> Workload {
    let f = FleetRef {
        name: &run.name,
        namespace: &run.ns,
        uid: &run.uid,
        spec,
    };
    let template = render::pod_template(&f, &run.ctx.render, token);
    let reservation = CelldStorageReservation::name_for_bucket(&spec.storage.bucket);
    render::render_workload(&f, replicas, template, &reservation)
}

pub(super) fn live_token(live: &LiveWorkload) -> Option<String> {
    live.template()?
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(RESTART_TOKEN_ANNOTATION)
        .cloned()
}

fn live_image(live: &LiveWorkload) -> Option<String> {
    live.template()?
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == "celld")?
        .image
        .clone()
}

/// Whether the live operator-owned fields equal the rendering.
fn owned_fields_current(live: &LiveWorkload, want: &Workload) -> bool {
    let live_v = match live {
        LiveWorkload::StatefulSet(s) => serde_json::to_value(s),
        LiveWorkload::Deployment(d) => serde_json::to_value(d),
    }
    .unwrap_or_default();
    let want_v = match want {
        Workload::StatefulSet(s) => serde_json::to_value(s),
        Workload::Deployment(d) => serde_json::to_value(d),
    }
    .unwrap_or_default();
    [
        "template",
        "strategy",
        "updateStrategy",
        "persistentVolumeClaimRetentionPolicy",
    ]
    .iter()
    .all(|k| {
        let w = &want_v["spec"][k];
        w.is_null() || rendered_matches(w, &live_v["spec"][k])
    })
}

fn schedule_decided(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_some()
        || pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable")
                })
            })
}

/// Step 3: `abandon <op>` / `retry <op>`, consumed in the same write as its entry.
pub async fn consume_command(run: &mut Run<'_>, value: &str) -> Result<(), Error> {
    let refused = match journal::parse_command(value) {
        Ok(cmd) => {
            // Abandoning an operation whose write landed but was not recorded yet (killed at
            // `after-effect`): the landed effect is recorded as replayed first, so the journal
            // never says "never issued" about a change the world shows.
            if cmd.action == journal::CommandAction::Abandon {
                // Otherwise the next destructive step's target is fenced first, like any
                // close of an effect not seen to land.
                if let Some(op) = open_op(run).filter(|o| o.id == cmd.op) {
                    if !fence_before_abandon(run, &op).await? {
                        // Consumed at the next reconcile, after a fresh read.
                        return Ok(());
                    }
                }
            }
            match run
                .journal
                .command_entry(&cmd, "user", None, run.now, run.ctx.leader.clone())
            {
                Ok(entry) => {
                    run.append_with(entry.op, entry.body, true).await?;
                    return Ok(());
                }
                Err(e) => e.to_string(),
            }
        }
        Err(e) => e.to_string(),
    };
    tracing::warn!(fleet = %run.name, command = value, reason = %refused, "journal command refused and removed");
    let patch = serde_json::json!({"metadata": {
        "resourceVersion": run.fleet.resource_version(),
        "annotations": {JOURNAL_COMMAND_ANNOTATION: null}
    }});
    run.fleet = run
        .api
        .patch(
            &run.name,
            &Default::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .ctx(|| "removing a refused journal command".into())?;
    Ok(())
}

/// Data of the open operation, copied out of the fold.
#[derive(Clone)]
pub(crate) struct OpenOp {
    pub id: OperationId,
    pub kind: OperationKind,
    pub intent: Intent,
    pub phase: Phase,
    pub issued: bool,
    pub observed: bool,
    pub blocker: Option<String>,
}

pub(crate) fn open_op(run: &Run<'_>) -> Option<OpenOp> {
    let op = run.journal.fold().current()?;
    Some(OpenOp {
        id: op.id(),
        kind: op.kind(),
        intent: op.intent().clone(),
        phase: op.phase(),
        issued: op.issued_anything(),
        observed: op.observed().is_some(),
        blocker: op.blocked().map(|(_, b)| b.to_string()),
    })
}

fn step_of(kind: OperationKind) -> Step {
    match kind {
        OperationKind::Provision => Step::Create,
        OperationKind::Scale => Step::Replicas,
        _ => Step::Template,
    }
}

fn progress(op: &OpenOp, detail: &str) -> Report {
    Report::progress(format!(
        "{} {} ({}->{}) {} at step {}: {detail}",
        op.kind,
        op.id,
        op.intent.from,
        op.intent.to,
        op.phase.as_str(),
        step_of(op.kind)
    ))
}

/// Step 10: drive the open operation.
pub async fn drive_open(run: &mut Run<'_>) -> Result<Report, Error> {
    let Some(op) = open_op(run) else {
        return Ok(Report::provisioning("No operation is open".into()));
    };
    if op.kind == OperationKind::Delete {
        return super::delete::drive(run).await;
    }
    if op.kind == OperationKind::MemberReplacement {
        return super::replace::drive(run, &op).await;
    }
    if super::strict::is_strict(&op.intent) {
        return super::strict::drive(run, &op).await;
    }
    if !op.issued && effect_landed(run, &op).await? {
        // Killed after its write (`after-effect`): the operation is issued in the world even
        // though the journal has no `Issued` yet. Record it as replayed before any cancel or
        // deadline rule for Intent could apply.
        return Box::pin(issue(run, &op)).await;
    }
    if let Some(action) = run
        .journal
        .fold()
        .current()
        .and_then(|o| journal::deadline::due(o, run.now))
    {
        let canceled = matches!(action, journal::DeadlineAction::Cancel { .. });
        if canceled {
            if close_unissued(run, &op, action.body()).await?.is_none() {
                return Ok(progress(
                    &op,
                    "its workload changed while it was being closed; deciding again",
                ));
            }
            return Ok(Report::provisioning(format!(
                "{} {} passed its deadline before issue and was canceled",
                op.kind, op.id
            )));
        }
        run.append(action.op(), action.body()).await?;
    }
    if let Some(blocker) = &op.blocker {
        return Ok(Report::blocked(
            &reasons::OPERATION_BLOCKED,
            format!(
                "{} {} is blocked at {}: {blocker}. {}",
                op.kind,
                op.id,
                step_of(op.kind),
                reasons::resolve_hint(&run.ns, &run.name, op.id)
            ),
        ));
    }
    if !op.issued {
        if let Some(reason) = cancel_reason(run, &op) {
            if close_unissued(run, &op, EntryBody::Canceled(Canceled { reason }))
                .await?
                .is_none()
            {
                return Ok(progress(
                    &op,
                    "its workload changed while it was being closed; deciding again",
                ));
            }
            return Ok(if reason == CancelReason::CanceledBeforeIssue {
                Report::blocked(
                    &reasons::MAINTENANCE_PAUSED,
                    format!("Paused: no operation starts and no member is healed; {} {} was canceled before issue", op.kind, op.id),
                )
            } else {
                Report::provisioning(format!(
                    "{} {} was canceled ({}); planning again",
                    op.kind,
                    op.id,
                    reason.as_str()
                ))
            });
        }
        return Box::pin(issue(run, &op)).await;
    }
    let mut observed = None;
    if !op.observed {
        if let Some(why) = marker_moved_after_issue(run, &op).await? {
            // Another writer changed the workload after this operation's write: going on
            // would mean guessing whose change the rollout shows (docs/design.md
            // "Deadlines, Stalled and abandon").
            run.append(op.id, EntryBody::Blocked(journal::Blocked { blocker: why }))
                .await?;
            return Ok(Report::blocked(
                &reasons::OPERATION_BLOCKED,
                format!(
                    "{} {} is blocked at {}: the workload changed after its write. {}",
                    op.kind,
                    op.id,
                    step_of(op.kind),
                    reasons::resolve_hint(&run.ns, &run.name, op.id)
                ),
            ));
        }
        match target_reached(run, &op).await? {
            // Appended with `Completed`, in one write, below.
            Ok(()) => {
                observed = Some(EntryBody::Observed(Observed {
                    note: observed_note(&op),
                }));
            }
            Err(waiting) => {
                if let Some(why) = superseded(run, &op) {
                    run.append(
                        op.id,
                        EntryBody::Abandoned(PersonAction {
                            by: "operator".into(),
                            reason: Some(format!("Superseded: {why}")),
                        }),
                    )
                    .await?;
                    return Ok(Report::provisioning(format!(
                        "{} {} was superseded ({why}) while waiting for the rollout; planning again",
                        op.kind, op.id
                    )));
                }
                return Ok(progress(&op, &waiting));
            }
        }
    }
    // A planning cached pass completes only an operation it may carry out itself.
    let _decision = run.decide(op.kind, false)?;
    failpoint::reach("before-complete");
    // `Observed` (when this pass saw the target reached) and `Completed` are one write
    // (docs/design.md "Journal writes"): a crash before it leaves neither, and the next pass
    // checks the target again; an `Observed` already in the journal is not repeated.
    let mut bodies: Vec<EntryBody> = observed.into_iter().collect();
    bodies.push(EntryBody::Completed(Completed {
        outcome: CompletedOutcome::Succeeded,
    }));
    // The next contraction's victim is read fresh while this write is in flight (docs/design.md
    // "Fresh reads"): the planner, later in this pass, records that read in its Intent
    // instead of sending it after the write.
    let next = match next_victim(run, &op) {
        // Only when the workload has rolled out: else the planner waits before contracting.
        Some(name)
            if run
                .workload()
                .await
                .ok()
                .flatten()
                .is_some_and(|w| w.rolled_out()) =>
        {
            Some(name)
        }
        _ => None,
    };
    let next = next.map(|name| {
        let pods = Api::<Pod>::namespaced(run.client.clone(), &run.ns);
        async move {
            let read = pods.get_opt(&name).await;
            (name, read)
        }
    });
    let (appended, read) = futures::join!(
        run.append_all(op.id, bodies),
        futures::future::OptionFuture::from(next)
    );
    appended?;
    // A failed read is not kept: the planner sends it again and handles its error.
    if let Some((name, Ok(pod))) = read {
        run.next_victim = Some((name, pod));
    }
    Ok(Report::provisioning(format!(
        "{} {} completed",
        op.kind, op.id
    )))
}

/// The member the next contraction will remove when `op`, an operation of a StatefulSet,
/// completes with the fleet asking for fewer members than `op` left (a contraction with more
/// to go, or a growth the user took back while it ran): once the workload has rolled out, the
/// planner opens that contraction in the same pass, with the StatefulSet's highest ordinal as
/// its victim. `None` when something else is likely next (a Retire contraction reads its own
/// targets; a paused fleet plans nothing).
fn next_victim(run: &Run<'_>, op: &OpenOp) -> Option<String> {
    let spec = &run.fleet.spec;
    let retire = spec.profile == Profile::PersistentFleet
        && spec.storage.on_scale_in == Some(crate::api::OnScaleIn::Retire);
    let paused = spec.maintenance.as_ref().is_some_and(|m| m.paused);
    (uses_statefulset(spec)
        && !retire
        && !paused
        && op.intent.to > 0
        && spec.replicas < op.intent.to)
        .then(|| format!("{}-{}", run.name, op.intent.to - 1))
}

fn observed_note(op: &OpenOp) -> String {
    match op.kind {
        OperationKind::Provision | OperationKind::Scale if op.intent.to >= op.intent.from => {
            format!(
                "workload observed {} members, each placed by the scheduler",
                op.intent.to
            )
        }
        OperationKind::Scale => format!(
            "workload observed {} members; the removed member is gone",
            op.intent.to
        ),
        _ => "rolled out".into(),
    }
}

/// Supersession (docs/design.md "Restart, Upgrade and TemplateUpdate (rolling)"): an issued
/// rolling template operation that only waits for the workload controller is closed with
/// `Abandoned{by: operator, reason: Superseded}` when the spec now asks for another image or a
/// new restart token, so a corrective change (e.g. away from an image that never turns Ready)
/// is planned at once. Never while paused, and never for contractions or deletions (they
/// remove members or disks).
fn superseded(run: &Run<'_>, op: &OpenOp) -> Option<String> {
    let spec = &run.fleet.spec;
    if spec.maintenance.as_ref().is_some_and(|m| m.paused) {
        return None;
    }
    if !matches!(
        op.kind,
        OperationKind::Upgrade | OperationKind::Restart | OperationKind::TemplateUpdate
    ) {
        return None;
    }
    if let (Some(asked), Some(now)) = (op.intent.image.as_deref(), spec.runtime_image.as_deref()) {
        if asked != now {
            return Some(format!("runtimeImage is now {now}"));
        }
    }
    let token = spec
        .maintenance
        .as_ref()
        .and_then(|m| m.restart_token.as_deref())
        .filter(|t| !t.is_empty())?;
    let new = op.intent.token.as_deref() != Some(token)
        && run.journal.last_restart_token() != Some(token);
    new.then(|| format!("restart token {token} was requested"))
}

/// Cancel rules before issue (docs/design.md "Cancel rules").
pub(super) fn cancel_reason(run: &Run<'_>, op: &OpenOp) -> Option<CancelReason> {
    let spec = &run.fleet.spec;
    if spec.maintenance.as_ref().is_some_and(|m| m.paused) {
        return Some(CancelReason::CanceledBeforeIssue);
    }
    let token = spec
        .maintenance
        .as_ref()
        .and_then(|m| m.restart_token.clone())
        .filter(|t| !t.is_empty());
    let changed = match op.kind {
        OperationKind::Scale if op.intent.to > op.intent.from => spec.replicas <= op.intent.from,
        OperationKind::Scale => spec.replicas >= op.intent.from,
        OperationKind::Restart => {
            let coordinated_now = spec
                .maintenance
                .as_ref()
                .is_some_and(|m| m.allow_coordinated_downtime);
            token != op.intent.token
                || coordinated_now != super::strict::is_strict(&op.intent)
                || (coordinated_now && spec.runtime_image != op.intent.image)
        }
        OperationKind::Upgrade => spec.runtime_image != op.intent.image,
        _ => false,
    };
    changed.then_some(CancelReason::RequestChanged)
}

/// Records the operation's landed workload effect as `Issued{replayed}` (no write).
pub(crate) async fn record_replayed(run: &mut Run<'_>, op: &OpenOp) -> Result<(), Error> {
    let step = step_of(op.kind);
    let live = run.workload().await?;
    let rv = live
        .as_ref()
        .and_then(|w| w.meta().resource_version.clone());
    let effect = Effect::new(op.id, step.clone());
    run.append(op.id, issued(step, effect, rv.clone(), rv, true))
        .await?;
    Ok(())
}

/// After this operation's write, the workload must still carry its marker: `Some(why)` when
/// it carries another (a hand edit, a restore, another writer). Not for deletions.
async fn marker_moved_after_issue(run: &Run<'_>, op: &OpenOp) -> Result<Option<String>, Error> {
    if op.kind == OperationKind::Delete || !op.issued {
        return Ok(None);
    }
    let own = Effect::new(op.id, step_of(op.kind)).to_string();
    let live = run.workload().await?;
    Ok(live.and_then(|w| {
        let found = w.marker().map(str::to_owned);
        (found.as_deref() != Some(own.as_str())).then(|| {
            format!(
                "the workload's effect marker is {}, expected {own} (written by this operation); \
                 it was changed after the write by a hand edit, a restore or another writer",
                found.as_deref().unwrap_or("(none)")
            )
        })
    }))
}

/// Whether the workload carries this operation's own effect marker.
pub(crate) async fn effect_landed(run: &Run<'_>, op: &OpenOp) -> Result<bool, Error> {
    let marker = Effect::new(op.id, step_of(op.kind)).to_string();
    let live = run.workload().await?;
    Ok(live.is_some_and(|w| w.marker() == Some(marker.as_str())))
}

/// What closing an unissued operation found on its target (see [`fence_target`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Fence {
    /// The workload carries the operation's own marker: the effect landed; record it, never
    /// cancel it.
    Landed,
    /// The target is fenced (or there is none): close the operation.
    Fenced,
    /// The workload changed between the read and the fence: decide again.
    Moved,
}

/// Before an operation that was not seen to land is closed (canceled or abandoned before
/// issue), from a fresh read of its workload: when the workload carries the operation's
/// marker, the effect landed. Otherwise the workload is written back as read with
/// `celld.eric.dev/fence: <op>/fenced` and the read resourceVersion, so a write this
/// operation's step decided on an earlier read (a deposed leader's, stopped or stalled in a
/// connection after its Lease check) fails its precondition instead of landing for an
/// operation the journal calls closed (docs/operations.md "Requests, timeouts, retries and
/// stale leaders"). Without a workload there is nothing to fence: a create carries no
/// precondition, and a deposed leader's late create is kept out by the transport's Lease
/// check and write timeout.
pub(crate) async fn fence_target(run: &Run<'_>, op: &OpenOp) -> Result<Fence, Error> {
    fence_workload(run, op.id, step_of(op.kind)).await
}

/// [`fence_target`] for the workload step `step` of operation `id`.
pub(crate) async fn fence_workload(
    run: &Run<'_>,
    id: OperationId,
    step: Step,
) -> Result<Fence, Error> {
    let own = Effect::new(id, step).to_string();
    let Some(mut live) = run.reread_workload().await? else {
        return Ok(Fence::Fenced);
    };
    if live.marker() == Some(own.as_str()) {
        return Ok(Fence::Landed);
    }
    live.set_fence(&format!("{id}/fenced"));
    run.ctx.check_lease();
    match run.replace_workload(&live).await {
        Ok(_) => {
            tracing::info!(fleet = %run.name, op = %id, "fenced the workload before closing the operation");
            Ok(Fence::Fenced)
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Fence::Moved),
        Err(e) => Err(e).ctx(|| format!("fencing the workload before closing {id}")),
    }
}

/// The fence of [`fence_target`] on an object that a destructive step of operation `id`
/// writes with a resourceVersion precondition (a replacement's hold, Pod delete or commit):
/// the object with UID `uid` is written back as read with the fence annotation. `landed`
/// says whether the object shows the step's own effect. An object that is gone or has
/// another UID needs no fence (a write with the recorded UID fails anyway); nor, unless
/// `terminating_too`, one that is terminating (its resourceVersion moved when it started).
pub(crate) async fn fence_object<K>(
    run: &Run<'_>,
    api: &Api<K>,
    name: &str,
    uid: Option<&str>,
    id: OperationId,
    terminating_too: bool,
    landed: impl Fn(&K) -> bool,
) -> Result<Fence, Error>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    let found = api
        .get_opt(name)
        .await
        .ctx(|| format!("reading {name} before fencing it"))?;
    let Some(mut obj) = found.filter(|o| {
        o.meta().uid.as_deref() == uid && (terminating_too || o.meta().deletion_timestamp.is_none())
    }) else {
        return Ok(Fence::Fenced);
    };
    if landed(&obj) {
        return Ok(Fence::Landed);
    }
    obj.meta_mut()
        .annotations
        .get_or_insert_with(Default::default)
        .insert(FENCE_ANNOTATION.into(), format!("{id}/fenced"));
    run.ctx.check_lease();
    match api.replace(name, &Default::default(), &obj).await {
        Ok(_) => {
            tracing::info!(fleet = %run.name, op = %id, object = name, "fenced a target before closing the operation");
            Ok(Fence::Fenced)
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Fence::Moved),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Fence::Fenced),
        Err(e) => Err(e).ctx(|| format!("fencing {name} before closing {id}")),
    }
}

/// Before a person's `abandon`: whatever the operation's next destructive step targets is
/// fenced, so a write a deposed leader decided for it fails. Scale, Restart, Upgrade,
/// TemplateUpdate and Provision before issue: the workload (an effect found landed is
/// recorded first). Strict operations: the workload while their `replicas`/`stop` (or,
/// after `stop`, `resume`) step is not recorded. MemberReplacement: the member Pod until the
/// Pod step is recorded, then (with a hold) the terminating Pod until the commit is recorded.
/// A committed replacement is adopted and finished anyway (its claim delete carries the
/// recorded UID and resourceVersion, so it happens once whoever sends it); fencing the claim
/// would defeat that check. Delete needs none: its steps are deletes with the UID and
/// resourceVersion of a fresh read, and it cannot be abandoned.
/// `false` when a target moved meanwhile: the command is consumed at the next reconcile.
async fn fence_before_abandon(run: &mut Run<'_>, op: &OpenOp) -> Result<bool, Error> {
    let Some(o) = run.journal.fold().operation(op.id).cloned() else {
        return Ok(true);
    };
    if op.kind == OperationKind::Delete {
        return Ok(true);
    }
    let fence = if super::strict::is_strict(&op.intent) {
        let first = super::strict::destructive_step(&op.intent);
        let step = if !o.has_effect(&first) {
            first
        } else if first == Step::Stop && !o.has_effect(&Step::Resume) {
            Step::Resume
        } else {
            return Ok(true);
        };
        let fence = fence_workload(run, op.id, step.clone()).await?;
        if fence == Fence::Landed {
            // Landed before a kill and not recorded yet: recorded before the abandon.
            let rv = run
                .workload()
                .await?
                .and_then(|w| w.meta().resource_version.clone());
            let effect = Effect::new(op.id, step.clone());
            run.append(op.id, issued(step, effect, rv.clone(), rv, true))
                .await?;
        }
        fence
    } else if op.kind == OperationKind::MemberReplacement {
        let Some(t) = op.intent.targets.first() else {
            return Ok(true);
        };
        let pods = Api::<Pod>::namespaced(run.client.clone(), &run.ns);
        let uid = t.pod_uid.as_deref();
        if !o.has_effect(&Step::Pod) {
            // A hold in place but not recorded is released as an orphan once abandoned.
            fence_object(run, &pods, &t.pod, uid, op.id, false, |_| false).await?
        } else if !super::replace::simple(&op.intent) && !o.has_effect(&Step::Commit) {
            // The next effect is the commit, a write of the terminating Pod.
            fence_object(run, &pods, &t.pod, uid, op.id, true, |p| {
                super::replace::committed_by(p, op.id)
            })
            .await?
        } else {
            return Ok(true);
        }
    } else if !op.issued {
        let fence = fence_target(run, op).await?;
        if fence == Fence::Landed {
            record_replayed(run, op).await?;
        }
        fence
    } else {
        return Ok(true);
    };
    Ok(fence != Fence::Moved)
}

/// Closes an unissued operation with `body` after fencing its target; `None` when it cannot
/// be closed now (the effect landed and was recorded, or the workload moved): the caller
/// reports progress and the next reconcile decides again.
async fn close_unissued(
    run: &mut Run<'_>,
    op: &OpenOp,
    body: EntryBody,
) -> Result<Option<()>, Error> {
    match fence_target(run, op).await? {
        Fence::Fenced => {
            run.append(op.id, body).await?;
            Ok(Some(()))
        }
        Fence::Landed => {
            record_replayed(run, op).await?;
            Ok(None)
        }
        Fence::Moved => Ok(None),
    }
}

/// Issues the operation's single workload step with the guarded write.
async fn issue(run: &mut Run<'_>, op: &OpenOp) -> Result<Report, Error> {
    // In a planning cached pass, only an operation of a kind it may carry out itself; its
    // reads below go to the API server (the pass's client sends reads as they are).
    let _decision = run.decide(op.kind, super::strict::is_strict(&op.intent))?;
    let client = run.client.clone();
    let step = step_of(op.kind);
    let effect = Effect::new(op.id, step.clone());
    let marker = effect.to_string();
    // The guard's fresh reads: sent while this operation's `Intent` append was in flight
    // when this pass appended it, else now.
    let reads = match run.guard_reads.take().filter(|r| r.op == op.id) {
        Some(reads) => reads,
        None => guard_reads(run, op.id, &op.intent).await,
    };
    let GuardReads {
        live,
        victim,
        claims,
        ..
    } = reads;
    let live = live.ctx(|| "reading the workload".into())?;

    if let Some(live) = &live {
        if live.marker() == Some(marker.as_str()) {
            // The write happened before a crash: record it, never repeat it.
            let rv = live.meta().resource_version.clone();
            run.append(op.id, issued(step, effect, rv.clone(), rv, true))
                .await?;
            return Ok(progress(
                &now_open(run, op),
                "effect found already applied; recorded as replayed",
            ));
        }
    }
    if step == Step::Create {
        if live.is_some() {
            run.append(
                op.id,
                EntryBody::Canceled(Canceled {
                    reason: CancelReason::PredecessorChanged,
                }),
            )
            .await?;
            return Ok(Report::provisioning(
                "The workload appeared before it was created; planning again".into(),
            ));
        }
        if let Err(why) = claims? {
            return cancel_predecessor_changed(run, op, &why).await;
        }
        let want = rendered(run, op.intent.to, op.intent.token.as_deref());
        run.before_effect();
        let created = match workload::create(&client, &run.ns, want, &marker).await {
            Ok(w) => w,
            // Created meanwhile (maybe by us before a lost response): the next reconcile reads the marker.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                return Ok(progress(op, "workload already exists; re-reading"))
            }
            Err(e) => return Err(e).ctx(|| "creating the workload".into()),
        };
        failpoint::reach("after-effect");
        run.saw_workload(Some(&created));
        run.append(
            op.id,
            issued(
                step,
                effect,
                None,
                created.meta().resource_version.clone(),
                false,
            ),
        )
        .await?;
        return Ok(Report::provisioning(
            "Workload created; members are being scheduled and started".into(),
        ));
    }

    // Guard: marker = predecessor, replicas = from, owned; contraction: victim as recorded.
    let predecessor = run.journal.predecessor_effect().map(|e| e.to_string());
    if let Some(w) = live.as_ref().filter(|w| w.owned_by(&run.uid)) {
        if let MarkerCheck::Unrecorded(found) = run.journal.check_marker(w.marker()) {
            // Another operation's write that this journal never recorded (e.g. abandoned
            // after it landed): record it, never reissue it; the next reconcile decides
            // against it as the predecessor.
            let body = EntryBody::Recovered(journal::Recovered {
                effect: found.clone(),
                source: "workload-marker".into(),
            });
            run.append(found.op, body).await?;
            return Ok(progress(
                op,
                &format!("recorded effect {found} found on the workload; deciding again"),
            ));
        }
    }
    let guard = match &live {
        None => Err("the workload is gone".to_string()),
        Some(w) if !w.owned_by(&run.uid) => {
            Err("the workload is not owned by this fleet".to_string())
        }
        Some(w) if w.marker().map(str::to_string) != predecessor => Err(format!(
            "the workload's effect marker is {:?}, expected {:?}",
            w.marker(),
            predecessor
        )),
        Some(w) if w.replicas() != op.intent.from => Err(format!(
            "the workload has {} replicas, expected {}",
            w.replicas(),
            op.intent.from
        )),
        Some(_) => match victim? {
            Ok(()) => claims?,
            Err(why) => Err(why),
        },
    };
    let guard = match (guard, live) {
        (Ok(()), Some(w)) => Ok(w),
        (Ok(()), None) => Err("the workload is gone".to_string()),
        (Err(why), _) => Err(why),
    };
    let mut live = match guard {
        Ok(w) => w,
        Err(why) => {
            return cancel_predecessor_changed(run, op, &why).await;
        }
    };
    let decided_on = live.meta().resource_version.clone();
    match step {
        Step::Replicas => live.set_replicas(op.intent.to),
        _ => live.take_owned_fields(&rendered(run, op.intent.to, op.intent.token.as_deref())),
    }
    live.set_marker(&marker);
    run.before_effect();
    // The one write a planning cached pass sends besides its appends and status.
    let permit = crate::pass::permit();
    let written = run.replace_workload(&live).await;
    drop(permit);
    let written = match written {
        Ok(w) => w,
        // Never retried with a newer version: the next reconcile decides again.
        Err(kube::Error::Api(s)) if s.code == 409 => {
            return Ok(progress(op, "the workload changed; deciding again"))
        }
        Err(e) => return Err(e).ctx(|| "writing the workload".into()),
    };
    failpoint::reach("after-effect");
    integrity::clear_backoff(run);
    run.append(
        op.id,
        issued(
            step,
            effect,
            decided_on,
            written.meta().resource_version.clone(),
            false,
        ),
    )
    .await?;
    // What the next pass reports until the workload controller has seen the write: said
    // now, with the phase the journal holds now, so that pass has no message to correct
    // (a status write of its own).
    Ok(progress(&now_open(run, op), WAITING_FOR_OBSERVATION))
}

/// The detail reported while the workload controller has not yet observed an issued write.
pub(crate) const WAITING_FOR_OBSERVATION: &str =
    "waiting for the workload controller to observe the change";

/// `op` as the journal holds it now (its phase after this pass's appends).
fn now_open(run: &Run<'_>, op: &OpenOp) -> OpenOp {
    open_op(run)
        .filter(|o| o.id == op.id)
        .unwrap_or_else(|| op.clone())
}

/// The first step's guard failed while nothing was issued: `Canceled{PredecessorChanged}`,
/// counted, and the same request's re-planning paced (integrity.rs).
async fn cancel_predecessor_changed(
    run: &mut Run<'_>,
    op: &OpenOp,
    why: &str,
) -> Result<Report, Error> {
    let body = EntryBody::Canceled(Canceled {
        reason: CancelReason::PredecessorChanged,
    });
    if close_unissued(run, op, body).await?.is_none() {
        return Ok(progress(
            op,
            "its workload changed while it was being closed; deciding again",
        ));
    }
    integrity::note_canceled(run, fingerprint_of(op));
    Ok(Report::provisioning(format!(
        "{} {} canceled before issue: {why}; planning again",
        op.kind, op.id
    )))
}

fn fingerprint_of(op: &OpenOp) -> String {
    integrity::fingerprint(
        op.kind,
        op.intent.from,
        op.intent.to,
        op.intent.token.as_deref(),
        op.intent.image.as_deref(),
    )
}

fn issued(
    step: Step,
    effect: Effect,
    decided: Option<String>,
    result: Option<String>,
    replayed: bool,
) -> EntryBody {
    EntryBody::Issued(Issued {
        step,
        effect,
        decided_on_resource_version: decided,
        result_resource_version: result,
        replayed,
        target: None,
    })
}

/// The fresh reads that guard an operation's workload write (docs/design.md "The guarded
/// write"), made once its `Intent` is decided: the workload (its marker, replicas and
/// resourceVersion, which the write carries), a contraction's recorded victim, and for a growth
/// (or Provision) of a PersistentFleet the claims at the new members' names. None depends on
/// another's answer, so they are sent together.
pub(crate) struct GuardReads {
    /// The operation they were read for.
    op: OperationId,
    live: Result<Option<LiveWorkload>, kube::Error>,
    victim: Result<Result<(), String>, Error>,
    claims: Result<Result<(), String>, Error>,
}

/// [`GuardReads`] for operation `op` with `intent`, holding nothing of `run`: the planner
/// sends them while the `Intent`'s append (which holds the run) is in flight, and the
/// guarded write uses them only once that append has committed (docs/design.md "Fresh
/// reads").
fn guard_reads(
    run: &Run<'_>,
    op: OperationId,
    intent: &Intent,
) -> impl std::future::Future<Output = GuardReads> + Send + 'static {
    let client = run.client.clone();
    let cache = run.cache.clone();
    let ns = run.ns.clone();
    let name = run.name.clone();
    let uid = run.uid.clone();
    let sts = uses_statefulset(&run.fleet.spec);
    // Growth (and Provision) of a PersistentFleet attaches whatever claim exists at each new
    // member's name: they are re-read just before the write, as the planner read them when
    // it decided (a foreign claim created between the Intent and a crash must never be
    // attached).
    let growth = matches!(intent.kind, OperationKind::Provision | OperationKind::Scale)
        && intent.to > intent.from;
    let new_members = if growth && run.fleet.spec.profile == Profile::PersistentFleet {
        intent.from.max(0)..intent.to
    } else {
        0..0
    };
    let victim = intent.targets.first().cloned();
    async move {
        let (live, victim, claims) = futures::join!(
            workload::get(&client, &ns, &name, sts),
            victim_unchanged(&client, &ns, victim.as_ref()),
            new_members_claims_ok(cache.as_ref(), &client, &ns, &name, &uid, new_members)
        );
        GuardReads {
            op,
            live,
            victim,
            claims,
        }
    }
}

/// The claims at the new members' names (ordinals `new_members`) may be attached: each is
/// absent, or this fleet's and not being deleted.
async fn new_members_claims_ok(
    cache: Option<&crate::watches::NsCache>,
    client: &kube::Client,
    ns: &str,
    fleet: &str,
    uid: &str,
    new_members: std::ops::Range<i32>,
) -> Result<Result<(), String>, Error> {
    for i in new_members {
        let name = claim_name(fleet, i);
        let Some(claim) = super::reread::<k8s_openapi::api::core::v1::PersistentVolumeClaim>(
            cache, client, ns, &name,
        )
        .await?
        else {
            continue;
        };
        if claim.labels().get(FLEET_UID_LABEL).map(String::as_str) != Some(uid) {
            return Ok(Err(format!(
                "claim {name} exists without this fleet's UID label"
            )));
        }
        if claim.meta().deletion_timestamp.is_some() {
            return Ok(Err(format!("claim {name} is being deleted")));
        }
    }
    Ok(Ok(()))
}

/// A contraction's recorded victim must still be the same Pod (fresh read).
async fn victim_unchanged(
    client: &kube::Client,
    ns: &str,
    target: Option<&Target>,
) -> Result<Result<(), String>, Error> {
    let Some(target) = target else {
        return Ok(Ok(()));
    };
    let pod = Api::<Pod>::namespaced(client.clone(), ns)
        .get_opt(&target.pod)
        .await
        .ctx(|| format!("reading member {}", target.pod))?;
    let uid = pod.as_ref().and_then(|p| p.metadata.uid.clone());
    Ok(if uid == target.pod_uid {
        Ok(())
    } else {
        Err(format!(
            "member {} now has UID {:?}, recorded {:?}",
            target.pod, uid, target.pod_uid
        ))
    })
}

/// Whether the operation's target is reached; `Err(what we wait for)` otherwise.
async fn target_reached(run: &Run<'_>, op: &OpenOp) -> Result<Result<(), String>, Error> {
    let live = run.workload().await?;
    let Some(live) = live else {
        return Ok(Err("the workload is gone".into()));
    };
    if !live.observed_current() {
        return Ok(Err(WAITING_FOR_OBSERVATION.into()));
    }
    let pods: Vec<Pod> = run
        .pods()
        .await?
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    match op.kind {
        OperationKind::Provision | OperationKind::Scale if op.intent.to >= op.intent.from => {
            if (pods.len() as i32) < op.intent.to {
                return Ok(Err(format!(
                    "{} of {} members created",
                    pods.len(),
                    op.intent.to
                )));
            }
            if let Some(p) = pods.iter().find(|p| !schedule_decided(p)) {
                return Ok(Err(format!(
                    "waiting for the scheduler to place member {}",
                    p.name_any()
                )));
            }
            Ok(Ok(()))
        }
        OperationKind::Scale => {
            let all = run.pods().await?;
            if let Some(victim) = op.intent.targets.first() {
                if all.iter().any(|p| p.metadata.uid == victim.pod_uid) {
                    return Ok(Err(format!("waiting for member {} to stop", victim.pod)));
                }
            } else if all.len() as i32 > op.intent.to {
                return Ok(Err(format!(
                    "waiting for {} members to stop",
                    all.len() as i32 - op.intent.to
                )));
            }
            Ok(Ok(()))
        }
        _ => {
            let token_ok = op.intent.token.is_none() || live_token(&live) == op.intent.token;
            if token_ok && live.rolled_out() {
                Ok(Ok(()))
            } else {
                Ok(Err(
                    "Rolling update in progress, one member at a time".into()
                ))
            }
        }
    }
}

/// Steps 13–16: image, ownership, plan; a new operation's Intent, then its first step.
pub async fn plan_and_open(run: &mut Run<'_>) -> Result<Report, Error> {
    let spec = run.fleet.spec.clone();
    let Some(image) = spec.runtime_image.clone() else {
        return Ok(Report::blocked(
            &reasons::UNSUPPORTED_TRANSITION,
            "Set spec.runtimeImage to a celld image pinned by digest; the operator has no built-in image".into(),
        ));
    };
    let sts = uses_statefulset(&spec);
    let client = run.client.clone();
    let live = run.workload().await?;
    if let Some(w) = &live {
        if !w.owned_by(&run.uid) {
            let kind = if sts { "StatefulSet" } else { "Deployment" };
            return Ok(Report::blocked(
                &reasons::LIFECYCLE_BLOCKED,
                format!("{kind} {} exists but is not owned by this fleet; it is neither adopted nor changed", run.name),
            ));
        }
    }
    // The workload's effect marker against the journal, before anything is planned: an
    // effect this journal did not record is recorded (`Recovered`, never reissued) and is
    // the predecessor of the next write; a marker nothing can explain blocks the fleet
    // until a person resolves it, instead of planning and canceling in a loop.
    if let Some(w) = &live {
        let check = run.journal.check_marker(w.marker());
        if let MarkerCheck::Unrecorded(effect) = &check {
            let body = EntryBody::Recovered(journal::Recovered {
                effect: effect.clone(),
                source: "workload-marker".into(),
            });
            run.append(effect.op, body).await?;
            return Ok(Report::provisioning(format!(
                "Recorded effect {effect} found on the workload but missing from the journal; planning again"
            )));
        }
        let kind = if sts { "StatefulSet" } else { "Deployment" };
        if let Some(report) = integrity::marker_mismatch(run, &check, kind) {
            return Ok(report);
        }
    }
    // Member replacements planned before template and scale changes: a lost disk, then an
    // administrator's request (docs/design.md "Planning order").
    if let Some(w) = &live {
        let applied = w.replicas();
        if spec.profile == Profile::PersistentFleet {
            let slots = super::heal::slots(run, applied).await?;
            match super::heal::disk_lost(&slots) {
                Some(Ok(ordinal)) => {
                    return super::replace::open(run, super::replace::DISK_LOST, ordinal, None)
                        .await
                }
                Some(Err(wait)) => return Ok(Report::provisioning(wait)),
                None => {}
            }
        }
        match super::replace::admin_request(run).await? {
            Some(Ok((pod, ordinal))) => {
                return super::replace::open(
                    run,
                    super::replace::ADMINISTRATIVE,
                    ordinal,
                    Some(pod),
                )
                .await
            }
            Some(Err(why)) => return Ok(Report::blocked(&reasons::REPLACEMENT_REFUSED, why)),
            None => {}
        }
    }
    // Claims at member names: fresh reads (a foreign claim has no fleet label, so no list sees it).
    let mut kept = Vec::new();
    if spec.profile == Profile::PersistentFleet {
        let applied = live.as_ref().map(LiveWorkload::replicas).unwrap_or(0);
        for i in 0..spec.replicas.max(applied) {
            let name = claim_name(&run.name, i);
            let Some(claim) = run.claim_at(i).await? else {
                continue;
            };
            let labelled =
                claim.labels().get(FLEET_UID_LABEL).map(String::as_str) == Some(run.uid.as_str());
            if !labelled {
                return Ok(Report::blocked(
                    &reasons::STORAGE_IDENTITY_CONFLICT,
                    format!("Claim {name} exists without this fleet's UID label; it is neither attached nor deleted"),
                ));
            }
            if claim.meta().deletion_timestamp.is_some() {
                if i >= applied && i < spec.replicas {
                    return Ok(Report::provisioning(format!(
                        "Waiting for claim {name} to finish deleting before adding member {}-{i}",
                        run.name
                    )));
                }
                continue;
            }
            kept.push(i);
        }
    }
    let token = spec
        .maintenance
        .as_ref()
        .and_then(|m| m.restart_token.clone())
        .filter(|t| !t.is_empty());
    let highest_never_placed = match &live {
        Some(w) if sts && w.replicas() > 0 => {
            let ordinal = w.replicas() - 1;
            let pod = run
                .get_opt::<Pod>(&format!("{}-{ordinal}", run.name))
                .await?;
            let unscheduled = pod.as_ref().is_some_and(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none()
                    && p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter()
                                .any(|c| c.type_ == "PodScheduled" && c.status == "False")
                        })
            });
            let claim = run.claim_at(ordinal).await?;
            let claim_unbound = claim.as_ref().is_none_or(|c| {
                c.status
                    .as_ref()
                    .and_then(|s| s.phase.as_deref())
                    .is_none_or(|p| p == "Pending")
            });
            unscheduled && claim_unbound
        }
        _ => false,
    };
    let view = live.as_ref().map(|w| {
        let lt = live_token(w);
        LiveView {
            applied: w.replicas(),
            template_current: owned_fields_current(w, &rendered(run, w.replicas(), lt.as_deref())),
            live_token: lt,
            live_image: live_image(w),
            rolled_out: w.rolled_out(),
            observed_current: w.observed_current(),
            highest_never_placed,
        }
    });
    let desired = Desired {
        replicas: spec.replicas,
        image: image.clone(),
        token,
        last_completed_token: run.journal.last_restart_token().map(str::to_string),
        coordinated: spec
            .maintenance
            .as_ref()
            .is_some_and(|m| m.allow_coordinated_downtime),
        persistent: spec.profile == Profile::PersistentFleet,
        kept_ordinals: kept,
        retire: spec.profile == Profile::PersistentFleet
            && spec.storage.on_scale_in == Some(crate::api::OnScaleIn::Retire),
    };
    let decision = plan(&desired, view.as_ref());
    tracing::debug!(?desired, ?view, ?decision, "planned");
    match decision {
        Plan::Settled => {
            let w = live.as_ref().expect("settled implies a workload");
            if sts {
                // Settled: a member whose claim is going, or one down past the delay.
                let slots = super::heal::slots(run, w.replicas()).await?;
                let verdict = super::heal::evaluate(
                    &slots,
                    chrono::Utc::now(),
                    &run.ctx.healing,
                    spec.profile == Profile::PersistentFleet,
                );
                match verdict {
                    super::heal::Verdict::Healthy => {}
                    super::heal::Verdict::Replace { ordinal, reason } => {
                        return super::replace::open(run, reason, ordinal, None).await
                    }
                    super::heal::Verdict::Wait { message, due } => {
                        if let Some(due) = due {
                            let left = (due - chrono::Utc::now())
                                .to_std()
                                .unwrap_or_default()
                                .max(std::time::Duration::from_secs(1));
                            run.requeue = Some(left.min(super::LATER));
                        }
                        return Ok(Report::provisioning(message));
                    }
                    super::heal::Verdict::Unschedulable { message } => {
                        return Ok(Report::blocked(&reasons::MEMBER_UNSCHEDULABLE, message))
                    }
                }
            }
            Ok(if w.rolled_out() {
                Report::provisioned(w.replicas())
            } else {
                Report::provisioning(format!(
                    "Rolling update in progress, one member at a time: {} of {} members ready",
                    w.ready_replicas(),
                    w.replicas()
                ))
            })
        }
        Plan::Wait(msg) => Ok(Report::provisioning(msg)),
        Plan::Unsupported(msg) => Ok(Report::blocked(&reasons::UNSUPPORTED_TRANSITION, msg)),
        Plan::Open {
            kind,
            from,
            to,
            token,
            image,
            strict,
        } => {
            let mut targets = Vec::new();
            let mut reason = None;
            if strict {
                match super::strict::open_targets(run, kind, from).await? {
                    Ok(t) => targets = t,
                    Err(report) => return Ok(report),
                }
                reason = Some(super::strict::reason_for(run, kind).to_string());
            } else if kind == OperationKind::Scale && to < from && sts {
                // The StatefulSet removes the highest ordinal: record its identity now.
                let victim = format!("{}-{}", run.name, to);
                // Read fresh: sent in this pass, either now or while the journal write that
                // completed the operation before was in flight (`next_victim`).
                let pod = match run.next_victim.take() {
                    Some((read, pod)) if read == victim => pod,
                    _ => Api::<Pod>::namespaced(client.clone(), &run.ns)
                        .get_opt(&victim)
                        .await
                        .ctx(|| format!("reading member {victim}"))?,
                };
                let claim =
                    (spec.profile == Profile::PersistentFleet).then(|| claim_name(&run.name, to));
                targets.push(Target {
                    pod: victim,
                    pod_uid: pod.as_ref().and_then(|p| p.metadata.uid.clone()),
                    pod_ip: pod.as_ref().and_then(|p| p.status.as_ref()?.pod_ip.clone()),
                    runtime_generation: None,
                    claim,
                    claim_uid: None,
                    claim_resource_version: None,
                });
            }
            let fp = integrity::fingerprint(kind, from, to, token.as_deref(), image.as_deref());
            if let Some((count, left)) = integrity::replan_paused(run, &fp) {
                return Ok(Report::provisioning(format!(
                    "{kind} {from}->{to} was canceled {count} time(s) in a row because the workload changed under it; \
                     planning it again in {} s",
                    left.as_secs() + 1
                )));
            }
            // Every operation but a contraction creates Pods or claims: the ServiceAccount and
            // StorageClass are read fresh right before it is decided (docs/design.md "Fresh
            // reads").
            let contraction = kind == OperationKind::Scale && to < from;
            if !contraction && !strict {
                if let Some(report) = super::prereq::identity_and_storage(run).await? {
                    return Ok(report);
                }
            }
            // A planning cached pass decides this operation itself when it may carry it
            // out (docs/design.md "Cache-planned operations"); otherwise it escalates here,
            // before the failpoint, and a fresh pass decides. Inside the decision the
            // ServiceAccount and StorageClass are read again, fresh, as a fresh pass read
            // them (the check above was from the caches: a fleet blocked on a missing one
            // costs no request).
            let decision = run.decide(kind, strict)?;
            if decision.is_some() && !contraction && !strict {
                if let Some(report) = super::prereq::identity_and_storage(run).await? {
                    return Ok(report);
                }
            }
            failpoint::reach("before-intent");
            let id = OperationId::new_v4();
            let intent = Intent {
                kind,
                from,
                to,
                token,
                image,
                deadline: run.ctx.deadline(
                    run.now,
                    (strict && kind == OperationKind::Restart).then_some(targets.len() as u32),
                ),
                reason,
                targets,
                workload_uid: live.as_ref().and_then(|w| w.meta().uid.clone()),
                predecessor_effect: run.journal.predecessor_effect(),
            };
            // The guarded write's fresh reads go out while the `Intent` is being written:
            // none is used before it has committed (docs/design.md "Fresh reads"). A strict
            // operation's steps read their own targets.
            let reads = (!strict).then(|| guard_reads(run, id, &intent));
            let (appended, reads) = futures::join!(
                run.append(id, EntryBody::Intent(intent)),
                futures::future::OptionFuture::from(reads)
            );
            appended?;
            run.guard_reads = reads;
            failpoint::reach("after-intent");
            Box::pin(drive_open(run)).await
        }
    }
}
