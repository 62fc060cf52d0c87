//! Strict operations: the Retire contraction and the coordinated restart (docs/design.md
//! "Strict operations"). Both remove members only on the strength of a data-safe proof from
//! each member's runtime, recorded (`ProofCaptured`) before anything acts on it and
//! re-validated on fresh reads right before the destructive write.
//!
//! An operation is strict when its Intent says so in `reason`:
//!
//! | kind | reason | targets | destructive step | claims |
//! |---|---|---|---|---|
//! | `Scale` | `Retire` | the victim (highest ordinal) | `replicas` (`to = from − 1`) | the victim's, retired |
//! | `Restart` | `Coordinated` | every member | `stop` (`replicas = 0`), then `resume` | kept |
//! | `Restart` | `CoordinatedRetire` | every member | `stop`, then `resume` | every target's, retired |
//!
//! The step table. Each step is decided from the journal (which steps are recorded) and
//! carried out after the guard named here passed on fresh reads; the driver runs the first
//! step that is not done and stops at the first wait:
//!
//! | # | step | guard (fresh reads) | write (precondition) | done when |
//! |---|---|---|---|---|
//! | 1 | `proof/<m>` each, ≤ 8 in flight | Pod UID and IP as recorded, not deleting; `/state` at the recorded generation with no removal running | `POST /shutdown?mode=remove-disk` (operation id, generation) | `Issued` on 202 (or `/state` shows ours) |
//! | 2 | proof each | the same identity; `/state` polled every 1 s | — | `ProofCaptured` once rules 1–5 hold; `failed`, another id or generation, a blocker, a changed Pod → `Blocked` |
//! | 3 | `replicas` / `stop` | workload marker = predecessor, `spec.replicas == from`; every proof re-validated | workload update (resourceVersion) | `Issued` |
//! | 4 | wait | — | — | no Pod with a target's UID remains |
//! | 5 | `retire/<claim>` each (retiring only) | same UID and RV as recorded, not deleting, fleet label, no Pod uses it, a recorded proof for its member | claim delete (UID + RV) | `ClaimRetired`; then every retired claim is gone |
//! | 6 | `resume` (coordinated) | marker = `<op>/stop`, `spec.replicas == 0` | workload update: `replicas = from`, full rendering with the token and the Intent's image | `Issued` |
//! | 7 | `Observed` | Retire: the victim and its claim are gone; coordinated: rolled out, every member Ready | — | `Completed` |
//!
//! A failed guard while nothing is issued cancels (`PredecessorChanged`); after issue it blocks
//! and keeps every disk. After `journal retry`, each member without a valid proof is looked at
//! again: a member whose removal `failed` is restarted on its own disk (`restart/<m>`, a guarded
//! Pod delete), awaited until Ready and asked again under the same operation id at its new
//! generation (recorded in that `Issued`'s `target`); a member whose process restarted by itself
//! is asked again at once; proofs from unchanged runtimes are captured again from a fresh read.

use super::reasons;
use std::net::IpAddr;
use std::time::Duration;

use futures::stream::{self, StreamExt};
use journal::{
    CancelReason, Canceled, ClaimRetired, Completed, CompletedOutcome, Effect, EntryBody, Intent,
    Issued, Observed, Operation, OperationKind, Proof, ProofCaptured, Step, Target,
};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, Preconditions};
use kube::{Client, Resource, ResourceExt};

use super::drive::OpenOp;
use super::workload::LiveWorkload;
use super::{Error, KubeContext, Report, Run};
use crate::api::keys::FLEET_UID_LABEL;
use crate::api::{OnScaleIn, Profile};
use crate::failpoint;
use crate::member::{self, NotAProof, Phase, Posted, Shutdown};
use crate::render::{claim_name, uses_statefulset};

/// `Intent.reason` of a Retire contraction.
pub const RETIRE: &str = "Retire";
/// `Intent.reason` of a coordinated restart that keeps every disk.
pub const COORDINATED: &str = "Coordinated";
/// `Intent.reason` of a coordinated restart that retires every disk.
pub const COORDINATED_RETIRE: &str = "CoordinatedRetire";
/// Requests to members in flight at once.
const IN_FLIGHT: usize = 8;
/// How often `/state` is read while a member drains.
pub const POLL: Duration = Duration::from_secs(1);

/// Whether an Intent opens a strict operation.
pub(crate) fn is_strict(intent: &Intent) -> bool {
    matches!(
        (intent.kind, intent.reason.as_deref()),
        (OperationKind::Scale, Some(RETIRE))
            | (
                OperationKind::Restart,
                Some(COORDINATED | COORDINATED_RETIRE)
            )
    )
}

fn coordinated(intent: &Intent) -> bool {
    intent.kind == OperationKind::Restart
}

fn retires_claims(intent: &Intent) -> bool {
    matches!(intent.reason.as_deref(), Some(RETIRE | COORDINATED_RETIRE))
}

pub(crate) fn destructive_step(intent: &Intent) -> Step {
    if coordinated(intent) {
        Step::Stop
    } else {
        Step::Replicas
    }
}

/// The name a member answers `/state` with: the Pod name on a StatefulSet, the Pod UID on a
/// Deployment (docs/runtime.md "The member environment").
fn node_name(by_pod_name: bool, pod: &Pod) -> String {
    if by_pod_name {
        pod.name_any()
    } else {
        pod.metadata.uid.clone().unwrap_or_default()
    }
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn pod_ip(pod: &Pod) -> Option<String> {
    pod.status.as_ref()?.pod_ip.clone()
}

/// What a fresh read shows of a target member.
#[derive(Debug, Clone)]
enum Seen {
    /// No Pod by that name.
    Gone,
    /// The recorded Pod (same UID and IP), being deleted.
    Terminating,
    /// The recorded Pod, running; its `/state` answer.
    Same { state: Result<Shutdown, String> },
    /// Another Pod by that name (new UID or IP): a new identity.
    Replaced {
        identity: Target,
        ready: bool,
        state: Result<Shutdown, String>,
    },
}

/// Reads the Pod named `reference.pod` and, when it runs, its `/state` at its Pod IP.
async fn read_member(client: Client, ns: String, by_pod_name: bool, reference: Target) -> Seen {
    let pod = match Api::<Pod>::namespaced(client, &ns)
        .get_opt(&reference.pod)
        .await
    {
        Ok(Some(p)) => p,
        Ok(None) => return Seen::Gone,
        Err(e) => {
            return Seen::Same {
                state: Err(format!("reading Pod {}: {e}", reference.pod)),
            }
        }
    };
    let same = pod.metadata.uid == reference.pod_uid && pod_ip(&pod) == reference.pod_ip;
    if same && pod.metadata.deletion_timestamp.is_some() {
        return Seen::Terminating;
    }
    let state = match pod_ip(&pod).and_then(|ip| ip.parse::<IpAddr>().ok()) {
        Some(ip) => member::state(ip, &node_name(by_pod_name, &pod))
            .await
            .map(|s| s.shutdown)
            .map_err(|e| e.0),
        None => Err(format!("Pod {} has no IP", reference.pod)),
    };
    if same {
        return Seen::Same { state };
    }
    let identity = Target {
        pod: reference.pod.clone(),
        pod_uid: pod.metadata.uid.clone(),
        pod_ip: pod_ip(&pod),
        runtime_generation: state.as_ref().ok().map(|s| s.runtime_generation.clone()),
        claim: reference.claim.clone(),
        claim_uid: reference.claim_uid.clone(),
        claim_resource_version: reference.claim_resource_version.clone(),
    };
    Seen::Replaced {
        ready: pod_ready(&pod) && pod.metadata.deletion_timestamp.is_none(),
        identity,
        state,
    }
}

/// What to do next for one target while proofs are gathered (step 1–2 of the table).
#[derive(Debug, Clone, PartialEq)]
enum ProofStep {
    /// A valid proof is held.
    Done,
    /// Nothing to do yet (draining, restarting, not answering).
    Wait(String),
    /// Send the strict removal request to `target` (`Some`: a new identity, recorded).
    Ask(Target, bool),
    /// `/state` already shows our request: record it as issued (replayed), never resend.
    RecordAsked(Target, bool),
    /// Record the proof.
    Capture(Proof),
    /// Restart the member on its own disk (`restart/<m>`): guarded Pod delete.
    RestartMember(Target),
    /// The recorded Pod is already terminating after a retry: record the restart as replayed.
    RecordRestart,
    /// Going on would need a guess: block (cancel while nothing is issued).
    Block(String),
}

/// Which of a member's records is the newest: what was done last for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Last {
    Nothing,
    Asked,
    Captured,
    Restarted,
}

fn last_for(o: &Operation, member: &str) -> (Last, bool) {
    let asked = o.last_record_seq(&Step::Proof(member.into()));
    let captured = o.last_proof_seq(member);
    let restarted = o.last_record_seq(&Step::Restart(member.into()));
    let newest = [
        (asked, Last::Asked),
        (captured, Last::Captured),
        (restarted, Last::Restarted),
    ]
    .into_iter()
    .filter_map(|(s, l)| s.map(|s| (s, l)))
    .max_by_key(|(s, _)| *s);
    match newest {
        None => (Last::Nothing, false),
        Some((seq, l)) => (l, o.retries().iter().any(|&r| r > seq)),
    }
}

fn ours(s: &Shutdown, op: &str, generation: &str) -> bool {
    s.operation
        .as_ref()
        .is_some_and(|r| r.operation_id == op && r.expected_generation == generation)
}

fn proof_of(s: &Shutdown, now: chrono::DateTime<chrono::Utc>) -> Proof {
    let r = s.operation.as_ref();
    Proof {
        operation_id: r.map(|r| r.operation_id.clone()).unwrap_or_default(),
        expected_generation: r.map(|r| r.expected_generation.clone()).unwrap_or_default(),
        phase: r.map(|r| r.phase.to_string()).unwrap_or_default(),
        control_only: s.control_only,
        blocker: r.and_then(|r| r.blocker.clone()),
        observed_at: now,
    }
}

/// The decision for one member (pure: the fold, its reference identity and a fresh read).
fn decide(
    o: &Operation,
    reference: &Target,
    seen: &Seen,
    now: chrono::DateTime<chrono::Utc>,
) -> ProofStep {
    let m = reference.pod.as_str();
    let op = o.id().to_string();
    let generation = reference.runtime_generation.clone().unwrap_or_default();
    let (last, retried) = last_for(o, m);
    let with_generation = |mut t: Target, s: &Shutdown| {
        t.runtime_generation = Some(s.runtime_generation.clone());
        t
    };
    match (last, retried, seen) {
        (Last::Captured, false, _) => ProofStep::Done,
        // Restarted after a retry: wait for the new Pod, then ask it under the same id.
        (Last::Restarted, false, Seen::Replaced { identity, ready, state }) => match state {
            _ if !ready => ProofStep::Wait(format!("waiting for {m} to be Ready after its restart")),
            Err(e) => ProofStep::Wait(format!("{m} does not answer /state yet: {e}")),
            Ok(s) if s.runtime_generation == generation => {
                ProofStep::Wait(format!("{m} still runs generation {generation}"))
            }
            Ok(s) if ours(s, &op, &s.runtime_generation) => {
                ProofStep::RecordAsked(with_generation(identity.clone(), s), true)
            }
            Ok(s) if s.operation.is_none() => {
                ProofStep::Ask(with_generation(identity.clone(), s), true)
            }
            Ok(s) => ProofStep::Block(format!(
                "{m} runs removal {} after its restart, not this operation's",
                s.operation.as_ref().map(|r| r.operation_id.as_str()).unwrap_or("?")
            )),
        },
        (Last::Restarted, false, _) => {
            ProofStep::Wait(format!("waiting for {m} to restart on its own disk"))
        }
        // First request.
        (Last::Nothing, _, Seen::Same { state }) => match state {
            Err(e) => ProofStep::Wait(format!("{m} does not answer /state: {e}")),
            Ok(s) if s.runtime_generation != generation => ProofStep::Block(format!(
                "the runtime generation of {m} is {}, not {generation} recorded at Intent (the process restarted); its disk is kept",
                s.runtime_generation
            )),
            Ok(s) if ours(s, &op, &generation) => ProofStep::RecordAsked(reference.clone(), false),
            Ok(s) if !s.strict_disk_removal => ProofStep::Block(format!(
                "{m} no longer offers strict disk removal (capability false)"
            )),
            Ok(s) if s.operation.is_none() => ProofStep::Ask(reference.clone(), false),
            Ok(s) => ProofStep::Block(format!(
                "{m} is running another removal ({})",
                s.operation.as_ref().map(|r| r.operation_id.as_str()).unwrap_or("?")
            )),
        },
        (Last::Nothing, _, other) => ProofStep::Block(changed(m, other, "before its removal was requested")),
        // After a retry: look again.
        (_, true, Seen::Terminating) => ProofStep::RecordRestart,
        (_, true, Seen::Same { state }) => match state {
            Err(e) => ProofStep::Wait(format!("{m} does not answer /state: {e}")),
            // The process restarted by itself: ask the new one, recording its generation.
            Ok(s) if s.runtime_generation != generation => {
                if ours(s, &op, &s.runtime_generation) {
                    ProofStep::RecordAsked(with_generation(reference.clone(), s), true)
                } else if s.operation.is_none() {
                    ProofStep::Ask(with_generation(reference.clone(), s), true)
                } else {
                    ProofStep::Block(format!("{m} runs another removal after its restart"))
                }
            }
            Ok(s) if s.operation.is_none() => ProofStep::Ask(reference.clone(), false),
            Ok(s) => match member::check_proof(s, &op, &generation) {
                Ok(()) => ProofStep::Capture(proof_of(s, now)),
                Err(e) if e.may_still_come() => ProofStep::Wait(format!("{m}: {e}")),
                Err(NotAProof::NotDataSafe {
                    phase: Phase::Failed,
                    ..
                }) if ours(s, &op, &generation) => ProofStep::RestartMember(reference.clone()),
                Err(e) => ProofStep::Block(format!("{m}: {e}")),
            },
        },
        (_, true, Seen::Replaced { identity, ready, state }) => match state {
            _ if !ready => ProofStep::Wait(format!("waiting for the new Pod of {m} to be Ready")),
            Err(e) => ProofStep::Wait(format!("{m} does not answer /state yet: {e}")),
            Ok(s) if ours(s, &op, &s.runtime_generation) => {
                ProofStep::RecordAsked(with_generation(identity.clone(), s), true)
            }
            Ok(s) if s.operation.is_none() => {
                ProofStep::Ask(with_generation(identity.clone(), s), true)
            }
            Ok(_) => ProofStep::Block(format!("{m} runs another removal after its restart")),
        },
        (_, true, Seen::Gone) => ProofStep::Wait(format!("waiting for {m} to be recreated")),
        // Asked, waiting for the proof.
        (_, false, Seen::Same { state }) => match state {
            Err(e) => ProofStep::Wait(format!("{m} does not answer /state: {e}")),
            Ok(s) => match member::check_proof(s, &op, &generation) {
                Ok(()) => ProofStep::Capture(proof_of(s, now)),
                Err(e) if e.may_still_come() => ProofStep::Wait(format!("{m}: {e}")),
                Err(e) => ProofStep::Block(format!("{m}: {e}; its disk is kept")),
            },
        },
        (_, false, other) => ProofStep::Block(changed(m, other, "before its proof was captured")),
    }
}

fn changed(m: &str, seen: &Seen, when: &str) -> String {
    match seen {
        Seen::Gone => format!("member {m} is gone {when}; its disk is kept"),
        Seen::Terminating => format!("member {m} is being deleted {when}; its disk is kept"),
        Seen::Replaced { identity, .. } => format!(
            "member {m} is another Pod now (UID {}, IP {}) {when}; its disk is kept",
            identity.pod_uid.as_deref().unwrap_or("?"),
            identity.pod_ip.as_deref().unwrap_or("?")
        ),
        Seen::Same { .. } => format!("member {m} changed {when}"),
    }
}

fn sts_of(run: &Run<'_>) -> bool {
    uses_statefulset(&run.fleet.spec)
}

/// Whether members are named by their Pod name (`CELLD_NODE`, src/render/pod.rs): on a
/// PersistentFleet; a Bucket member, Ordered (a StatefulSet) or not, is named by its Pod UID.
/// Found by reading: this followed the workload kind, so every `/state` of an Ordered Bucket
/// member was rejected for naming another node.
fn named_by_pod_name(run: &Run<'_>) -> bool {
    run.fleet.spec.profile == Profile::PersistentFleet
}

/// Fresh reads of every target (≤ 8 in flight), with their reference identities.
async fn read_targets(run: &Run<'_>, o: &Operation) -> Vec<(Target, Seen)> {
    let client = run.client.clone();
    let ns = run.ns.clone();
    let by_pod_name = named_by_pod_name(run);
    let refs: Vec<Target> = o
        .intent()
        .targets
        .iter()
        .map(|t| o.reference_target(&t.pod).unwrap_or_else(|| t.clone()))
        .collect();
    stream::iter(refs.into_iter().map(|r| {
        let (client, ns) = (client.clone(), ns.clone());
        async move {
            let seen = read_member(client, ns, by_pod_name, r.clone()).await;
            (r, seen)
        }
    }))
    .buffered(IN_FLIGHT)
    .collect()
    .await
}

fn label(o: &Operation) -> String {
    let i = o.intent();
    format!(
        "{} {} ({}->{}, {})",
        i.kind,
        o.id(),
        i.from,
        i.to,
        i.reason.as_deref().unwrap_or("")
    )
}

/// Drives an open strict operation one step (the table above).
pub(crate) async fn drive(run: &mut Run<'_>, open: &OpenOp) -> Result<Report, Error> {
    if let Some(action) = run
        .journal
        .fold()
        .current()
        .and_then(|o| journal::deadline::due(o, run.now))
    {
        let canceled = matches!(action, journal::DeadlineAction::Cancel { .. });
        run.append(action.op(), action.body()).await?;
        if canceled {
            return Ok(Report::provisioning(format!(
                "{} {} passed its deadline before issue and was canceled",
                open.kind, open.id
            )));
        }
    }
    let o = run
        .journal
        .fold()
        .operation(open.id)
        .cloned()
        .expect("the open operation is in the fold");
    if let Some((_, blocker)) = o.blocked() {
        return Ok(blocked_report(run, &o, blocker));
    }
    if !o.issued_anything() {
        if let Some(reason) = super::drive::cancel_reason(run, open) {
            run.append(o.id(), EntryBody::Canceled(Canceled { reason }))
                .await?;
            return Ok(Report::provisioning(format!(
                "{} was canceled ({}); planning again",
                label(&o),
                reason.as_str()
            )));
        }
    }
    let intent = o.intent().clone();
    let destructive = destructive_step(&intent);
    if !o.has_effect(&destructive) {
        if let Some(report) = gather_proofs(run, &o).await? {
            return Ok(report);
        }
        // The proofs just captured are part of the operation the guard checks.
        let o = current(run, &o);
        return destroy(run, &o).await;
    }
    // 4. No Pod with a target's UID remains.
    let pods = run.pods().await?;
    let waiting: Vec<String> = intent
        .targets
        .iter()
        .filter_map(|t| o.reference_target(&t.pod))
        .filter(|t| pods.iter().any(|p| p.metadata.uid == t.pod_uid))
        .map(|t| t.pod)
        .collect();
    if !waiting.is_empty() {
        return Ok(progress(
            &o,
            &format!("waiting for {} to stop", waiting.join(", ")),
        ));
    }
    // 5. Retire the claims, then wait for them to go.
    if retires_claims(&intent) {
        if let Some(report) = retire_claims(run, &o).await? {
            return Ok(report);
        }
    }
    let o = current(run, &o);
    // 6. Resume.
    if coordinated(&intent) && !o.has_effect(&Step::Resume) {
        return resume(run, &o).await;
    }
    // 7. Observed, Completed.
    if o.observed().is_none() {
        let note = if coordinated(&intent) {
            let live = run.workload().await?;
            let Some(live) = live else {
                return Ok(progress(&o, "the workload is gone"));
            };
            let token_ok = intent.token.is_none()
                || super::drive::live_token(&live).as_deref() == intent.token.as_deref();
            if !(live.observed_current() && live.rolled_out() && token_ok) {
                return Ok(progress(
                    &o,
                    &format!(
                        "resumed; {} of {} members ready",
                        live.ready_replicas(),
                        intent.from
                    ),
                ));
            }
            format!(
                "resumed with token {}: every member of {} is Ready",
                intent.token.as_deref().unwrap_or("(none)"),
                intent.from
            )
        } else {
            let live = run.workload().await?;
            if !live.as_ref().is_some_and(LiveWorkload::observed_current) {
                return Ok(progress(&o, super::drive::WAITING_FOR_OBSERVATION));
            }
            let t = &intent.targets[0];
            format!(
                "member {} is gone and its claim {} retired; {} members remain",
                t.pod,
                t.claim.as_deref().unwrap_or("?"),
                intent.to
            )
        };
        run.append(o.id(), EntryBody::Observed(Observed { note }))
            .await?;
    }
    failpoint::reach("before-complete");
    run.append(
        o.id(),
        EntryBody::Completed(Completed {
            outcome: CompletedOutcome::Succeeded,
        }),
    )
    .await?;
    Ok(Report::provisioning(format!("{} completed", label(&o))))
}

fn current(run: &Run<'_>, o: &Operation) -> Operation {
    run.journal
        .fold()
        .operation(o.id())
        .cloned()
        .unwrap_or_else(|| o.clone())
}

fn progress(o: &Operation, detail: &str) -> Report {
    let step = o
        .current_step()
        .map(|s| s.to_string())
        .unwrap_or_else(|| "intent".into());
    Report::progress(format!("{} at step {step}: {detail}", label(o)))
}

fn blocked_report(run: &Run<'_>, o: &Operation, blocker: &str) -> Report {
    let step = o
        .current_step()
        .map(|s| s.to_string())
        .unwrap_or_else(|| "intent".into());
    Report::blocked(
        &reasons::OPERATION_BLOCKED,
        format!(
            "{} {} is blocked at {step}: {blocker}. {}",
            o.kind(),
            o.id(),
            reasons::resolve_hint(&run.ns, &run.name, o.id())
        ),
    )
}

/// A failed guard: `Canceled{PredecessorChanged}` while nothing is issued, else `Blocked`.
async fn refuse(run: &mut Run<'_>, o: &Operation, why: String) -> Result<Report, Error> {
    let fresh = current(run, o);
    if !fresh.issued_anything() {
        run.append(
            o.id(),
            EntryBody::Canceled(Canceled {
                reason: CancelReason::PredecessorChanged,
            }),
        )
        .await?;
        return Ok(Report::provisioning(format!(
            "{} canceled before issue: {why}; planning again",
            label(o)
        )));
    }
    run.append(
        o.id(),
        EntryBody::Blocked(journal::Blocked {
            blocker: why.clone(),
        }),
    )
    .await?;
    Ok(blocked_report(run, &current(run, o), &why))
}

fn issued(o: &Operation, step: Step, replayed: bool, target: Option<Target>) -> EntryBody {
    EntryBody::Issued(Issued {
        effect: Effect::new(o.id(), step.clone()),
        step,
        decided_on_resource_version: None,
        result_resource_version: None,
        replayed,
        target,
    })
}

/// Steps 1–2: request and capture every proof. `None` when every target holds one.
async fn gather_proofs(run: &mut Run<'_>, o: &Operation) -> Result<Option<Report>, Error> {
    let seen = read_targets(run, o).await;
    let now = chrono::Utc::now();
    let steps: Vec<(Target, ProofStep)> = seen
        .iter()
        .map(|(r, s)| (r.clone(), decide(o, r, s, now)))
        .collect();
    tracing::debug!(op = %o.id(), ?steps, "strict proofs");
    // A block first: nothing more is sent once going on would need a guess.
    if let Some((_, ProofStep::Block(why))) =
        steps.iter().find(|(_, s)| matches!(s, ProofStep::Block(_)))
    {
        return refuse(run, o, why.clone()).await.map(Some);
    }
    let mut asks = Vec::new();
    let mut waits = Vec::new();
    for (r, step) in steps {
        let m = r.pod.clone();
        match step {
            ProofStep::Done => {}
            ProofStep::Wait(w) => waits.push(w),
            ProofStep::Capture(proof) => {
                run.append(
                    o.id(),
                    EntryBody::ProofCaptured(ProofCaptured { member: m, proof }),
                )
                .await?;
            }
            ProofStep::RecordAsked(t, new) => {
                let body = issued(o, Step::Proof(m), true, new.then_some(t));
                run.append(o.id(), body).await?;
                waits.push(format!("{} is draining", r.pod));
            }
            ProofStep::RecordRestart => {
                run.append(o.id(), issued(o, Step::Restart(m.clone()), true, None))
                    .await?;
                waits.push(format!("{m} is restarting"));
            }
            ProofStep::RestartMember(t) => {
                restart_member(run, o, &t).await?;
                waits.push(format!("{m} is restarting on its own disk"));
            }
            ProofStep::Ask(t, new) => asks.push((t, new)),
            ProofStep::Block(_) => unreachable!("handled above"),
        }
    }
    if !asks.is_empty() {
        ask(run, o, asks, &mut waits).await?;
    }
    let o = current(run, o);
    let held = o
        .intent()
        .targets
        .iter()
        .filter(|t| last_for(&o, &t.pod) == (Last::Captured, false))
        .count();
    let total = o.intent().targets.len();
    if held == total {
        return Ok(None);
    }
    run.requeue = Some(POLL);
    Ok(Some(progress(
        &o,
        &format!(
            "{held} of {total} proofs captured; {}",
            if waits.is_empty() {
                "requests sent".to_string()
            } else {
                waits.join("; ")
            }
        ),
    )))
}

/// Sends the strict removal requests (≤ 8 in flight) and records each accepted one.
async fn ask(
    run: &mut Run<'_>,
    o: &Operation,
    asks: Vec<(Target, bool)>,
    waits: &mut Vec<String>,
) -> Result<(), Error> {
    let op = o.id().to_string();
    for _ in &asks {
        run.before_effect();
    }
    let by_pod_name = named_by_pod_name(run);
    let ctx = run.ctx;
    let answers: Vec<(Target, bool, Posted)> = stream::iter(asks.into_iter().map(|(t, new)| {
        let op = op.clone();
        async move {
            let ip = t.pod_ip.as_deref().and_then(|ip| ip.parse::<IpAddr>().ok());
            let generation = t.runtime_generation.clone().unwrap_or_default();
            // Again right before each request: with more than IN_FLIGHT targets, the later
            // ones leave seconds after the check above. A member request cannot be fenced
            // through the API (docs/operations.md "Requests, timeouts, retries and stale leaders"), so the Lease
            // check is its only guard.
            ctx.check_lease();
            let posted = match ip {
                Some(ip) => member::remove_disk(ip, &op, &generation).await,
                None => Posted::Unknown(format!("{} has no recorded IP", t.pod)),
            };
            (t, new, posted)
        }
    }))
    .buffered(IN_FLIGHT)
    .collect()
    .await;
    // The members answered: what the pass reads next is read again.
    run.forget_reads();
    for (t, new, posted) in answers {
        failpoint::reach("after-effect");
        let m = t.pod.clone();
        let generation = t.runtime_generation.clone().unwrap_or_default();
        let accepted = match posted {
            Posted::Accepted(_) => true,
            Posted::Conflict | Posted::Unknown(_) => {
                // 409 or no answer: `/state` decides (our id at our generation is a 202).
                let seen =
                    read_member(run.client.clone(), run.ns.clone(), by_pod_name, t.clone()).await;
                match seen {
                    Seen::Same { state: Ok(s) } if ours(&s, &op, &generation) => true,
                    Seen::Same { state: Ok(s) } if s.operation.is_none() => {
                        waits.push(format!("{m} did not take the request yet"));
                        false
                    }
                    Seen::Same { state: Err(e) } => {
                        waits.push(format!("{m} did not answer: {e}"));
                        false
                    }
                    Seen::Same { state: Ok(s) } => {
                        let why = format!(
                            "{m} refused the removal request (409) and runs {}",
                            s.operation
                                .as_ref()
                                .map(|r| format!(
                                    "removal {} at generation {}",
                                    r.operation_id, r.expected_generation
                                ))
                                .unwrap_or_default()
                        );
                        refuse(run, o, why).await?;
                        return Ok(());
                    }
                    other => {
                        refuse(
                            run,
                            o,
                            changed(&m, &other, "while its removal was requested"),
                        )
                        .await?;
                        return Ok(());
                    }
                }
            }
            Posted::Unsupported(why) => {
                refuse(run, o, format!("{m}: {why}")).await?;
                return Ok(());
            }
        };
        if accepted {
            run.append(
                o.id(),
                issued(o, Step::Proof(m.clone()), false, new.then_some(t)),
            )
            .await?;
            waits.push(format!("{m} accepted the removal request"));
        }
    }
    Ok(())
}

/// `restart/<m>` after a retry of a failed removal: the member's Pod deleted with UID and
/// resourceVersion preconditions from a fresh read; its disk is kept.
async fn restart_member(run: &mut Run<'_>, o: &Operation, t: &Target) -> Result<(), Error> {
    let pods = Api::<Pod>::namespaced(run.client.clone(), &run.ns);
    let Some(pod) = pods
        .get_opt(&t.pod)
        .await
        .ctx(|| format!("reading member {}", t.pod))?
    else {
        return Ok(());
    };
    if pod.metadata.uid != t.pod_uid {
        return Ok(());
    }
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: pod.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    run.before_effect();
    match pods.delete(&t.pod, &dp).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => return Ok(()),
        Err(e) => return Err(e).ctx(|| format!("restarting member {}", t.pod)),
    }
    failpoint::reach("after-effect");
    let mut body = issued(o, Step::Restart(t.pod.clone()), false, None);
    if let EntryBody::Issued(i) = &mut body {
        i.decided_on_resource_version = pod.metadata.resource_version.clone();
    }
    run.append(o.id(), body).await?;
    Ok(())
}

/// Every proof re-validated on fresh reads: `Err(why)` names the first that no longer holds.
async fn proofs_still_valid(run: &Run<'_>, o: &Operation) -> Result<(), String> {
    let op = o.id().to_string();
    for (r, seen) in read_targets(run, o).await {
        let m = &r.pod;
        let generation = r.runtime_generation.clone().unwrap_or_default();
        let recorded = o
            .proof_for(m)
            .is_some_and(|p| p.expected_generation == generation && p.operation_id == op);
        if !recorded {
            return Err(format!(
                "no proof of {m} at generation {generation} is recorded"
            ));
        }
        match seen {
            Seen::Same { state: Ok(s) } => member::check_proof(&s, &op, &generation)
                .map_err(|e| format!("the proof of {m} no longer holds: {e}; its disk is kept"))?,
            Seen::Same { state: Err(e) } => {
                return Err(format!(
                    "the proof of {m} cannot be re-read ({e}); its disk is kept"
                ))
            }
            other => return Err(changed(m, &other, "after its proof was captured")),
        }
    }
    Ok(())
}

/// Step 3: `replicas` (Retire) or `stop` (coordinated), after every proof is re-validated.
async fn destroy(run: &mut Run<'_>, o: &Operation) -> Result<Report, Error> {
    let intent = o.intent().clone();
    let step = destructive_step(&intent);
    let marker = Effect::new(o.id(), step.clone()).to_string();
    let Some(mut live) = run.reread_workload().await? else {
        return refuse(run, o, "the workload is gone".into()).await;
    };
    if live.marker() == Some(marker.as_str()) {
        // Written before a crash: recorded, never repeated.
        let rv = live.meta().resource_version.clone();
        let mut body = issued(o, step, true, None);
        if let EntryBody::Issued(i) = &mut body {
            i.decided_on_resource_version = rv.clone();
            i.result_resource_version = rv;
        }
        run.append(o.id(), body).await?;
        return Ok(progress(
            &current(run, o),
            "effect found already applied; recorded as replayed",
        ));
    }
    let predecessor = run.journal.predecessor_effect().map(|e| e.to_string());
    let guard = if !live.owned_by(&run.uid) {
        Err("the workload is not owned by this fleet".to_string())
    } else if live.marker().map(str::to_string) != predecessor {
        Err(format!(
            "the workload's effect marker is {:?}, expected {:?}",
            live.marker(),
            predecessor
        ))
    } else if live.replicas() != intent.from {
        Err(format!(
            "the workload has {} replicas, expected {}",
            live.replicas(),
            intent.from
        ))
    } else {
        proofs_still_valid(run, o).await
    };
    if let Err(why) = guard {
        return refuse(run, o, why).await;
    }
    let decided_on = live.meta().resource_version.clone();
    live.set_replicas(if step == Step::Stop { 0 } else { intent.to });
    live.set_marker(&marker);
    run.before_effect();
    let written = match run.replace_workload(&live).await {
        Ok(w) => w,
        Err(kube::Error::Api(s)) if s.code == 409 => {
            return Ok(progress(o, "the workload changed; deciding again"))
        }
        Err(e) => return Err(e).ctx(|| "writing the workload".into()),
    };
    failpoint::reach("after-effect");
    let mut body = issued(o, step, false, None);
    if let EntryBody::Issued(i) = &mut body {
        i.decided_on_resource_version = decided_on;
        i.result_resource_version = written.meta().resource_version.clone();
    }
    run.append(o.id(), body).await?;
    Ok(progress(
        &current(run, o),
        if coordinated(&intent) {
            "every member proved data-safe; the fleet is stopping"
        } else {
            "the member proved data-safe; it is being removed"
        },
    ))
}

/// Step 5: every target's claim deleted with the recorded UID and resourceVersion, once, and
/// only with a recorded proof for its member; then awaited until gone. `None` when all are gone.
async fn retire_claims(run: &mut Run<'_>, o: &Operation) -> Result<Option<Report>, Error> {
    let api = Api::<PersistentVolumeClaim>::namespaced(run.client.clone(), &run.ns);
    let op = o.id().to_string();
    let pods = run.pods().await?;
    let mut gone_waits = Vec::new();
    for t in o.intent().targets.clone() {
        let (Some(name), Some(uid)) = (t.claim.clone(), t.claim_uid.clone()) else {
            continue;
        };
        let claim = api
            .get_opt(&name)
            .await
            .ctx(|| format!("reading claim {name}"))?;
        let o_now = current(run, o);
        if o_now.has_effect(&Step::Retire(name.clone())) {
            if claim
                .as_ref()
                .is_some_and(|c| c.uid().as_deref() == Some(uid.as_str()))
            {
                gone_waits.push(name);
            }
            continue;
        }
        let reference = o_now.reference_target(&t.pod).unwrap_or_else(|| t.clone());
        let generation = reference.runtime_generation.clone().unwrap_or_default();
        let proven = o_now
            .proof_for(&t.pod)
            .is_some_and(|p| p.operation_id == op && p.expected_generation == generation);
        if !proven {
            return refuse(
                run,
                o,
                format!(
                    "no valid proof of {} is recorded; claim {name} is kept",
                    t.pod
                ),
            )
            .await
            .map(Some);
        }
        let retired = EntryBody::ClaimRetired(ClaimRetired {
            claim: name.clone(),
            claim_uid: uid.clone(),
            claim_resource_version: t.claim_resource_version.clone(),
        });
        let Some(claim) = claim else {
            // Already gone: counts as retired (docs/design.md "The guarded write").
            run.append(o.id(), retired).await?;
            continue;
        };
        if claim.uid().as_deref() != Some(uid.as_str()) {
            return refuse(
                run,
                o,
                format!(
                    "claim {name} now has UID {}, recorded {uid}; it is kept",
                    claim.uid().unwrap_or_default()
                ),
            )
            .await
            .map(Some);
        }
        if claim.meta().deletion_timestamp.is_some() {
            // The delete was sent before a crash (`after-claim-delete`): never a second one.
            run.append(o.id(), retired).await?;
            gone_waits.push(name);
            continue;
        }
        if claim.resource_version() != t.claim_resource_version {
            return refuse(
                run,
                o,
                format!(
                    "claim {name} changed since Intent (resourceVersion {} → {}); it is kept",
                    t.claim_resource_version.as_deref().unwrap_or("?"),
                    claim.resource_version().unwrap_or_default()
                ),
            )
            .await
            .map(Some);
        }
        if claim.labels().get(FLEET_UID_LABEL).map(String::as_str) != Some(run.uid.as_str()) {
            return refuse(
                run,
                o,
                format!("claim {name} lost this fleet's UID label; it is kept"),
            )
            .await
            .map(Some);
        }
        if let Some(user) = pods.iter().find(|p| uses_claim(p, &name)) {
            return Ok(Some(progress(
                &o_now,
                &format!("waiting for {} to stop using claim {name}", user.name_any()),
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
            // The precondition failed: the next reconcile reads the claim again and decides.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                return Ok(Some(progress(
                    &o_now,
                    &format!("claim {name} changed while being retired; deciding again"),
                )))
            }
            Err(e) => return Err(e).ctx(|| format!("retiring claim {name}")),
        }
        failpoint::reach("after-claim-delete");
        run.append(o.id(), retired).await?;
        gone_waits.push(name);
    }
    if gone_waits.is_empty() {
        return Ok(None);
    }
    Ok(Some(progress(
        &current(run, o),
        &format!("waiting for retired claims {} to go", gone_waits.join(", ")),
    )))
}

/// Whether `pod` mounts claim `claim`.
pub(super) fn uses_claim(pod: &Pod, claim: &str) -> bool {
    pod.spec.as_ref().is_some_and(|s| {
        s.volumes.iter().flatten().any(|v| {
            v.persistent_volume_claim
                .as_ref()
                .is_some_and(|c| c.claim_name == claim)
        })
    })
}

/// Step 6: `resume`: `replicas = from` with the full rendering (the Intent's token and image).
async fn resume(run: &mut Run<'_>, o: &Operation) -> Result<Report, Error> {
    let intent = o.intent().clone();
    let marker = Effect::new(o.id(), Step::Resume).to_string();
    let stop = Effect::new(o.id(), Step::Stop).to_string();
    let Some(mut live) = run.reread_workload().await? else {
        return refuse(run, o, "the workload is gone".into()).await;
    };
    if live.marker() == Some(marker.as_str()) {
        let rv = live.meta().resource_version.clone();
        let mut body = issued(o, Step::Resume, true, None);
        if let EntryBody::Issued(i) = &mut body {
            i.decided_on_resource_version = rv.clone();
            i.result_resource_version = rv;
        }
        run.append(o.id(), body).await?;
        return Ok(progress(
            &current(run, o),
            "resume found already applied; recorded as replayed",
        ));
    }
    let guard = if !live.owned_by(&run.uid) {
        Err("the workload is not owned by this fleet".to_string())
    } else if live.marker() != Some(stop.as_str()) {
        Err(format!(
            "the workload's effect marker is {:?}, expected {stop}",
            live.marker()
        ))
    } else if live.replicas() != 0 {
        Err(format!(
            "the workload has {} replicas, expected 0 after stop",
            live.replicas()
        ))
    } else {
        Ok(())
    };
    if let Err(why) = guard {
        return refuse(run, o, why).await;
    }
    let decided_on = live.meta().resource_version.clone();
    let mut spec = run.fleet.spec.clone();
    if intent.image.is_some() {
        spec.runtime_image = intent.image.clone();
    }
    let want = super::drive::rendered_with(run, &spec, intent.from, intent.token.as_deref());
    live.take_owned_fields(&want);
    live.set_replicas(intent.from);
    live.set_marker(&marker);
    run.before_effect();
    let written = match run.replace_workload(&live).await {
        Ok(w) => w,
        Err(kube::Error::Api(s)) if s.code == 409 => {
            return Ok(progress(o, "the workload changed; deciding again"))
        }
        Err(e) => return Err(e).ctx(|| "writing the workload".into()),
    };
    failpoint::reach("after-effect");
    let mut body = issued(o, Step::Resume, false, None);
    if let EntryBody::Issued(i) = &mut body {
        i.decided_on_resource_version = decided_on;
        i.result_resource_version = written.meta().resource_version.clone();
    }
    run.append(o.id(), body).await?;
    Ok(progress(
        &current(run, o),
        "resumed: members start again with the new token",
    ))
}

/// The plan conditions of a strict operation (docs/design.md "Strict operations") and its targets
/// from fresh reads: every member Ready, answering `/state` (schema 1) with strict removal offered
/// and no removal running; claims `Bound`. `Err(report)`: `StrictRemovalUnavailable` or a wait.
pub(crate) async fn open_targets(
    run: &Run<'_>,
    kind: OperationKind,
    from: i32,
) -> Result<Result<Vec<Target>, Report>, Error> {
    let sts = sts_of(run);
    let what = if kind == OperationKind::Restart {
        "coordinated restart"
    } else {
        "Retire contraction"
    };
    let mut pods: Vec<Pod> = run
        .pods()
        .await?
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    pods.sort_by_key(|p| {
        let name = p.name_any();
        let ordinal = name
            .rsplit('-')
            .next()
            .and_then(|o| o.parse::<i64>().ok())
            .unwrap_or(i64::MAX);
        (ordinal, name)
    });
    let ready = pods.iter().filter(|p| pod_ready(p)).count() as i32;
    if ready != from || pods.len() as i32 != from {
        return Ok(Err(Report::provisioning(format!(
            "Waiting until every member is Ready before the {what}: {ready} of {from} ready"
        ))));
    }
    let chosen: Vec<Pod> = if kind == OperationKind::Scale {
        let victim = format!("{}-{}", run.name, from - 1);
        pods.into_iter()
            .filter(|p| p.name_any() == victim)
            .collect()
    } else {
        pods
    };
    if chosen.is_empty() {
        return Ok(Err(Report::provisioning(format!(
            "Waiting for member {}-{} before the {what}",
            run.name,
            from - 1
        ))));
    }
    let states: Vec<(Pod, Result<member::State, member::Unknown>)> =
        stream::iter(chosen.into_iter().map(|p| async move {
            let state = match pod_ip(&p).and_then(|ip| ip.parse::<IpAddr>().ok()) {
                Some(ip) => member::state(ip, &node_name(named_by_pod_name(run), &p)).await,
                None => Err(member::Unknown("it has no Pod IP".into())),
            };
            (p, state)
        }))
        .buffered(IN_FLIGHT)
        .collect()
        .await;
    let persistent = run.fleet.spec.profile == Profile::PersistentFleet;
    let mut targets = Vec::new();
    for (pod, state) in states {
        let name = pod.name_any();
        let unavailable = |detail: String| {
            Ok(Err(Report::blocked(
                &reasons::STRICT_REMOVAL_UNAVAILABLE,
                format!("Member {name} {detail}; the requested {what} cannot start"),
            )))
        };
        let s = match state {
            Ok(s) => s.shutdown,
            Err(e) => return unavailable(format!("does not answer /state ({e})")),
        };
        if !s.strict_disk_removal {
            return unavailable("does not offer strict disk removal (capability false)".into());
        }
        if s.control_only {
            return unavailable("is control-only (a removal already ended)".into());
        }
        if let Some(r) = &s.operation {
            return unavailable(format!(
                "is running removal {} ({})",
                r.operation_id, r.phase
            ));
        }
        let mut t = Target {
            pod: name.clone(),
            pod_uid: pod.metadata.uid.clone(),
            pod_ip: pod_ip(&pod),
            runtime_generation: Some(s.runtime_generation.clone()),
            ..Target::default()
        };
        if persistent && sts {
            let ordinal = name
                .rsplit('-')
                .next()
                .and_then(|o| o.parse::<i32>().ok())
                .unwrap_or(-1);
            let claim = run.claim_at(ordinal).await?;
            let claim_name_ = claim_name(&run.name, ordinal);
            let Some(claim) = claim else {
                return Ok(Err(Report::provisioning(format!(
                    "Waiting for claim {claim_name_} of {name} before the {what}"
                ))));
            };
            let phase = claim.status.as_ref().and_then(|s| s.phase.clone());
            if phase.as_deref() != Some("Bound") {
                return Ok(Err(Report::provisioning(format!(
                    "Waiting for claim {claim_name_} to be Bound before the {what} (it is {})",
                    phase.as_deref().unwrap_or("without a phase")
                ))));
            }
            t.claim = Some(claim_name_);
            t.claim_uid = claim.uid();
            t.claim_resource_version = claim.resource_version();
        }
        targets.push(t);
    }
    Ok(Ok(targets))
}

/// The reason a new strict operation records: how it treats disks.
pub(crate) fn reason_for(run: &Run<'_>, kind: OperationKind) -> &'static str {
    let retire = run.fleet.spec.profile == Profile::PersistentFleet
        && run.fleet.spec.storage.on_scale_in == Some(OnScaleIn::Retire);
    match (kind, retire) {
        (OperationKind::Scale, _) => RETIRE,
        (_, true) => COORDINATED_RETIRE,
        (_, false) => COORDINATED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use journal::{Fold, Journal, Leader, NewEntry, OperationId, PersonAction};

    fn target(gen: &str) -> Target {
        Target {
            pod: "beta-2".into(),
            pod_uid: Some("uid-2".into()),
            pod_ip: Some("127.0.0.12".into()),
            runtime_generation: Some(gen.into()),
            claim: Some("data-beta-2".into()),
            claim_uid: Some("c-2".into()),
            claim_resource_version: Some("7".into()),
        }
    }

    struct Op {
        journal: Journal,
        id: OperationId,
    }

    impl Op {
        fn new() -> Op {
            let mut op = Op {
                journal: Journal::new("fleet-uid"),
                id: OperationId::new_v4(),
            };
            op.push(EntryBody::Intent(Intent {
                kind: OperationKind::Scale,
                from: 3,
                to: 2,
                token: None,
                image: None,
                reason: Some(RETIRE.into()),
                deadline: chrono::Utc::now() + chrono::Duration::minutes(30),
                targets: vec![target("g1")],
                workload_uid: None,
                predecessor_effect: None,
            }));
            op
        }
        fn push(&mut self, body: EntryBody) {
            let entry = NewEntry {
                at: chrono::Utc::now(),
                op: self.id,
                leader: Leader {
                    identity: "t".into(),
                    lease_transitions: 0,
                    lease: None,
                },
                body,
            };
            let budget = journal::Budget::new(128 * 1024).unwrap();
            self.journal = self.journal.stage(entry, budget).unwrap().into_journal();
        }
        fn op(&self) -> Operation {
            self.journal.fold().operation(self.id).unwrap().clone()
        }
        fn asked(&mut self, target: Option<Target>) {
            let o = self.op();
            self.push(issued(&o, Step::Proof("beta-2".into()), false, target));
        }
    }

    fn shutdown(op: Option<(&str, &str, Phase)>, gen: &str) -> Shutdown {
        Shutdown {
            runtime_generation: gen.into(),
            strict_disk_removal: true,
            control_only: op.is_some_and(|(_, _, p)| p != Phase::Draining),
            operation: op.map(|(id, g, phase)| member::Removal {
                operation_id: id.into(),
                expected_generation: g.into(),
                mode: "remove-disk".into(),
                phase,
                blocker: None,
            }),
        }
    }

    fn same(s: Shutdown) -> Seen {
        Seen::Same { state: Ok(s) }
    }

    #[test]
    fn a_member_without_a_request_is_asked_at_the_generation_recorded_at_intent() {
        let op = Op::new();
        let step = decide(
            &op.op(),
            &target("g1"),
            &same(shutdown(None, "g1")),
            chrono::Utc::now(),
        );
        assert_eq!(step, ProofStep::Ask(target("g1"), false));
    }

    #[test]
    fn a_restarted_process_before_the_request_blocks_and_keeps_the_disk() {
        let op = Op::new();
        let step = decide(
            &op.op(),
            &target("g1"),
            &same(shutdown(None, "g2")),
            chrono::Utc::now(),
        );
        assert!(
            matches!(step, ProofStep::Block(ref w) if w.contains("process restarted")),
            "{step:?}"
        );
    }

    #[test]
    fn a_request_found_running_after_a_crash_is_recorded_never_resent() {
        let op = Op::new();
        let id = op.id.to_string();
        let seen = same(shutdown(Some((&id, "g1", Phase::Draining)), "g1"));
        let step = decide(&op.op(), &target("g1"), &seen, chrono::Utc::now());
        assert_eq!(step, ProofStep::RecordAsked(target("g1"), false));
    }

    #[test]
    fn a_draining_member_is_waited_for_and_a_data_safe_one_gives_a_proof() {
        let mut op = Op::new();
        op.asked(None);
        let id = op.id.to_string();
        let draining = same(shutdown(Some((&id, "g1", Phase::Draining)), "g1"));
        assert!(matches!(
            decide(&op.op(), &target("g1"), &draining, chrono::Utc::now()),
            ProofStep::Wait(_)
        ));
        let safe = same(shutdown(Some((&id, "g1", Phase::DataSafe)), "g1"));
        assert!(matches!(
            decide(&op.op(), &target("g1"), &safe, chrono::Utc::now()),
            ProofStep::Capture(p) if p.expected_generation == "g1" && p.phase == "data_safe"
        ));
    }

    #[test]
    fn a_failed_removal_a_lost_process_or_a_changed_pod_blocks_while_asked() {
        let mut op = Op::new();
        op.asked(None);
        let id = op.id.to_string();
        let now = chrono::Utc::now();
        for seen in [
            same(shutdown(Some((&id, "g1", Phase::Failed)), "g1")),
            same(shutdown(None, "g2")),
            same(shutdown(Some(("other", "g1", Phase::DataSafe)), "g1")),
            Seen::Gone,
            Seen::Terminating,
        ] {
            let step = decide(&op.op(), &target("g1"), &seen, now);
            assert!(
                matches!(step, ProofStep::Block(_)),
                "{seen:?} gave {step:?}"
            );
        }
    }

    #[test]
    fn a_retried_failed_removal_restarts_the_member_then_asks_its_new_process() {
        let mut op = Op::new();
        op.asked(None);
        op.push(EntryBody::Blocked(journal::Blocked {
            blocker: "failed".into(),
        }));
        op.push(EntryBody::Retried(PersonAction {
            by: "user".into(),
            reason: None,
        }));
        let id = op.id.to_string();
        let failed = same(shutdown(Some((&id, "g1", Phase::Failed)), "g1"));
        assert_eq!(
            decide(&op.op(), &target("g1"), &failed, chrono::Utc::now()),
            ProofStep::RestartMember(target("g1"))
        );
        let o = op.op();
        op.push(issued(&o, Step::Restart("beta-2".into()), false, None));
        // The old Pod still terminating: wait; the new one Ready at a new generation: ask it.
        assert!(matches!(
            decide(
                &op.op(),
                &target("g1"),
                &Seen::Terminating,
                chrono::Utc::now()
            ),
            ProofStep::Wait(_)
        ));
        let mut new = target("g-new");
        new.pod_uid = Some("uid-2b".into());
        let seen = Seen::Replaced {
            identity: Target {
                runtime_generation: None,
                ..new.clone()
            },
            ready: true,
            state: Ok(shutdown(None, "g-new")),
        };
        assert_eq!(
            decide(&op.op(), &target("g1"), &seen, chrono::Utc::now()),
            ProofStep::Ask(new.clone(), true)
        );
        op.asked(Some(new.clone()));
        assert_eq!(op.op().reference_target("beta-2"), Some(new));
    }

    #[test]
    fn after_a_retry_an_unchanged_valid_proof_is_captured_again_from_a_fresh_read() {
        let mut op = Op::new();
        op.asked(None);
        op.push(EntryBody::Blocked(journal::Blocked {
            blocker: "blocker".into(),
        }));
        op.push(EntryBody::Retried(PersonAction {
            by: "user".into(),
            reason: None,
        }));
        let id = op.id.to_string();
        let safe = same(shutdown(Some((&id, "g1", Phase::DataSafe)), "g1"));
        assert!(matches!(
            decide(&op.op(), &target("g1"), &safe, chrono::Utc::now()),
            ProofStep::Capture(_)
        ));
    }

    #[test]
    fn only_retire_contractions_and_coordinated_restarts_are_strict() {
        let op = Op::new();
        assert!(is_strict(op.op().intent()));
        let mut i = op.op().intent().clone();
        i.reason = None;
        assert!(!is_strict(&i));
        i.kind = OperationKind::Restart;
        i.reason = Some(COORDINATED.into());
        assert!(is_strict(&i) && coordinated(&i) && !retires_claims(&i));
        i.reason = Some(COORDINATED_RETIRE.into());
        assert!(retires_claims(&i));
        assert_eq!(destructive_step(&i), Step::Stop);
        let _ = Fold::default;
    }
}
