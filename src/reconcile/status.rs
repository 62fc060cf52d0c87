//! Status as a projection of the world and the journal (docs/design.md "Status and
//! conditions"). Never read back as an input.

use std::collections::BTreeMap;

use chrono::Utc;
use journal::{Budget, Journal};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;

use super::reasons::{self, Classed, Kind, Reason};
use super::workload::LiveWorkload;
use super::{Error, KubeContext};
use crate::api::keys::FLEET_UID_LABEL;
use crate::api::{self, CelldFleet, CelldFleetStatus};

/// Class of a reason (docs/design.md "Status and conditions").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// The fleet is what was asked for.
    Done,
    /// Waiting for the world (scheduler, rollout).
    Wait,
    /// An operation is moving.
    Progress,
    /// Needs a person; nothing moves.
    Blocked,
    /// Needs a person, but the fleet's objects are in place.
    BlockedInfraReady,
}

/// The reconcile's outcome: one reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// PascalCase reason.
    pub reason: &'static str,
    /// Class of the reason.
    pub class: Class,
    /// What a person should know or do.
    pub message: String,
}

impl Report {
    /// A reason that needs a person, with the class it is reported with (blocked, or
    /// blocked with the fleet's objects in place).
    pub fn blocked(reason: &'static Classed, message: String) -> Self {
        Self {
            reason: reason.name,
            class: match reason.kind {
                Kind::BlockedInfraReady => Class::BlockedInfraReady,
                _ => Class::Blocked,
            },
            message,
        }
    }
    /// Progress of an open operation.
    pub fn progress(message: String) -> Self {
        Self {
            reason: reasons::LIFECYCLE_PROGRESS.name,
            class: Class::Progress,
            message,
        }
    }
    /// Waiting for the world.
    pub fn provisioning(message: String) -> Self {
        Self {
            reason: reasons::PROVISIONING.name,
            class: Class::Wait,
            message,
        }
    }
    /// Done.
    pub fn provisioned(n: i32) -> Self {
        Self {
            reason: reasons::PROVISIONED.name,
            class: Class::Done,
            message: format!("All {n} members run the current template and are ready"),
        }
    }
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// What the conditions other than `Blocked` speak about, for their messages: each condition's
/// message is about its own subject (members, objects, operations, the journal), not the
/// reconcile's one message repeated.
struct Subjects {
    ready: bool,
    ready_count: i32,
    replicas: Option<i32>,
    class: Class,
    journal_bytes: Option<(i64, i64)>,
}

impl Subjects {
    fn ready_message(&self) -> String {
        match self.replicas {
            None => "No workload: no member runs".to_string(),
            Some(0) => "The workload has 0 replicas: no member runs".to_string(),
            Some(n) if self.ready => format!("All {n} members are ready"),
            Some(n) => format!("{} of {n} members are ready", self.ready_count),
        }
    }

    fn infrastructure_message(&self, infra: bool, report: &str) -> String {
        if infra {
            "Prerequisites, Services, NetworkPolicy, PodDisruptionBudget and workload are in place"
                .to_string()
        } else {
            report.to_string()
        }
    }

    fn progressing_message(&self, progressing: bool, report: &str) -> String {
        match self.class {
            _ if progressing => report.to_string(),
            Class::Done => "No operation is open: the fleet is as specified".to_string(),
            _ => "Nothing moves until the block is resolved (see Blocked)".to_string(),
        }
    }

    fn journal_message(&self) -> String {
        match self.journal_bytes {
            Some((bytes, budget)) => format!("The journal uses {bytes} of {budget} bytes"),
            None => "The journal's size is not known".to_string(),
        }
    }
}

fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.into(),
        status: if status { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
    }
}

/// What [`write`] did with the status it computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// The fleet already holds it: nothing was sent.
    Unchanged,
    /// Written, conditioned on the fleet's resourceVersion: that version is replaced.
    Written,
    /// The fleet moved on (409): the next reconcile writes it (the one the fleet's watch
    /// event brings, or a requeue after `SOON` at the latest).
    Conflict,
    /// A progress-only change within the pace interval (`crate::status_pace`): nothing was
    /// sent; the reconcile looks again after this long and writes it then.
    Deferred(std::time::Duration),
}

impl Stored {
    /// The status is what the fleet now holds.
    pub fn held(self) -> bool {
        matches!(self, Stored::Unchanged | Stored::Written)
    }

    /// A request was sent (written or answered 409).
    pub fn sent(self) -> bool {
        matches!(self, Stored::Written | Stored::Conflict)
    }
}

/// What a status is computed from besides the fleet: its journal (`None`: cannot be used),
/// the journal's byte budget, the member Pods, the workload and the reconcile's report.
#[derive(Clone, Copy)]
pub struct Seen<'a> {
    pub journal: Option<&'a Journal>,
    pub budget: Budget,
    pub pods: &'a [Pod],
    pub live: Option<&'a LiveWorkload>,
    pub report: &'a Report,
}

/// Whether `new` differs from `old` only in progress: the member counts (`replicas`,
/// `observedReplicas`, `joiningReplicas`, `terminatingReplicas`, `readyReplicas`) and the
/// conditions' messages. A condition's status, reason or transition, the operation, the
/// journal figures, the generation: anything else is not progress only
/// (`crate::status_pace`).
pub fn progress_only(old: &CelldFleetStatus, new: &CelldFleetStatus) -> bool {
    let without_progress = |s: &CelldFleetStatus| {
        let mut s = s.clone();
        s.replicas = 0;
        s.observed_replicas = None;
        s.joining_replicas = None;
        s.terminating_replicas = None;
        s.ready_replicas = None;
        for c in &mut s.conditions {
            c.message.clear();
        }
        s
    };
    without_progress(old) == without_progress(new)
}

/// Computes the status and writes it when it changed (merge patch carrying the fleet's
/// resourceVersion; a conflict just means the next reconcile writes it). A change that is
/// [`progress_only`] is not sent while `progress_wait` is `Some` (the rest of the fleet's pace
/// interval): [`Stored::Deferred`]. Returns the status and what was done with it ([`Stored`]). `journal: None`
/// means the journal cannot be used (damaged or missing): its projection keeps the last
/// known values (current and recent operations, `lastRestartToken`, journal figures, the
/// stall and size conditions), so nothing reading status (kubectl, dashboards) sees them
/// vanish.
pub async fn write(
    api: &Api<CelldFleet>,
    fleet: &CelldFleet,
    seen: &Seen<'_>,
    progress_wait: Option<std::time::Duration>,
) -> Result<(CelldFleetStatus, Stored), Error> {
    let Seen {
        journal,
        budget,
        pods,
        live,
        report,
    } = *seen;
    let old = fleet.status.clone().unwrap_or_default();
    let generation = fleet.metadata.generation;
    let uid = fleet.uid().unwrap_or_default();
    let mut st = CelldFleetStatus {
        label_selector: Some(format!("{FLEET_UID_LABEL}={uid}")),
        desired_replicas: Some(fleet.spec.replicas),
        observed_generation: generation,
        reservation: old.reservation.clone(),
        ..CelldFleetStatus::default()
    };
    let active: Vec<&Pod> = pods
        .iter()
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .collect();
    st.replicas = active.len() as i32;
    st.observed_replicas = Some(pods.len() as i32);
    st.terminating_replicas = Some(
        pods.iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
            .count() as i32,
    );
    st.joining_replicas = Some(
        pods.iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && !is_ready(p))
            .count() as i32,
    );
    st.replica_observation_valid = Some(pods.len() <= 200);
    let owned = live.filter(|w| w.owned_by(&uid));
    st.applied_replicas = Some(owned.map(LiveWorkload::replicas).unwrap_or(0));
    st.ready_replicas = Some(owned.map(LiveWorkload::ready_replicas).unwrap_or(0));

    let mut stalled = None;
    let mut size_warning = None;
    let mut time_warning = None;
    if let Some(j) = journal {
        let p = j.projection(budget);
        st.current_operation = p.current_operation.as_ref().map(|c| api::CurrentOperation {
            id: c.id.to_string(),
            kind: serde_json::from_value(json!(c.kind.to_string()))
                .unwrap_or(api::OperationKind::Scale),
            phase: serde_json::from_value(json!(c.phase.as_str()))
                .unwrap_or(api::OperationPhase::Intent),
            step: c.step.as_ref().map(ToString::to_string),
            from: Some(c.from),
            to: Some(c.to),
            member: c.member.clone(),
            started_at: Some(c.started_at.to_rfc3339()),
            deadline: Some(c.deadline.to_rfc3339()),
            blocker: (!c.blocker.is_empty()).then(|| c.blocker.clone()),
            summary: Some(c.summary.clone()),
        });
        if let Some(c) = p
            .current_operation
            .as_ref()
            .filter(|c| c.phase.as_str() == "Stalled")
        {
            // The blocker of a stalled operation is the deadline itself; say what it still
            // waits for instead (its summary: kind, step, target).
            let waiting = if c.blocker.is_empty() || c.blocker.contains("deadline") {
                c.summary.as_str()
            } else {
                c.blocker.as_str()
            };
            stalled = Some(format!(
                "{} {} has been open since {}; its deadline {} passed; it is still driven ({waiting}): fix what it waits for, or `kubectl celld journal abandon {}/{} {}`",
                c.kind,
                c.id,
                c.started_at.to_rfc3339(),
                c.deadline.to_rfc3339(),
                fleet.namespace().unwrap_or_default(),
                fleet.name_any(),
                c.id
            ));
        }
        st.recent_operations = p
            .recent_operations
            .iter()
            .map(|r| api::RecentOperation {
                id: r.id.to_string(),
                kind: serde_json::from_value(json!(r.kind.to_string()))
                    .unwrap_or(api::OperationKind::Scale),
                outcome: r.outcome.to_string(),
                finished_at: Some(r.finished_at.to_rfc3339()),
            })
            .collect();
        st.last_restart_token = p.last_restart_token.clone();
        st.journal = Some(api::JournalStatus {
            seq: p.journal.seq,
            head_hash: Some(p.journal.head_hash.clone()),
            bytes: p.journal.bytes,
            compacted_through: p.journal.compacted_through,
        });
        if p.size.warning() {
            size_warning = Some(format!(
                "The journal uses {} of {} bytes and nothing is left to compact",
                p.size.bytes, p.size.budget
            ));
        }
        // A writer's clock was wrong: deadlines and audits that read `at` may be misled.
        let times = journal::audit::time_warnings(j.entries(), Utc::now());
        if let Some(first) = times.first() {
            time_warning = Some(format!(
                "{first}{}; check the clocks of the operator's nodes (`kubectl celld journal verify {}/{}` lists the time warnings)",
                if times.len() > 1 {
                    format!(" (and {} more)", times.len() - 1)
                } else {
                    String::new()
                },
                fleet.namespace().unwrap_or_default(),
                fleet.name_any()
            ));
        }
    }

    if journal.is_none() {
        st.current_operation = old.current_operation.clone();
        st.recent_operations = old.recent_operations.clone();
        st.last_restart_token = old.last_restart_token.clone();
        st.journal = old.journal.clone();
        let kept = |t: &str| {
            old.conditions
                .iter()
                .find(|c| c.type_ == t && c.status == "True")
                .map(|c| c.message.clone())
        };
        stalled = kept("OperationStalled");
        size_warning = kept("JournalSizeWarning");
        time_warning = kept("JournalTimeWarning");
    }
    let (infra, progressing, blocked) = match report.class {
        Class::Done => (true, false, false),
        Class::Wait | Class::Progress => (true, true, false),
        Class::Blocked => (false, false, true),
        Class::BlockedInfraReady => (true, false, true),
    };
    let ready_count = st.ready_replicas.unwrap_or(0);
    let ready = ready_count > 0 && Some(ready_count) == owned.map(LiveWorkload::replicas);
    let paused = fleet.spec.maintenance.as_ref().is_some_and(|m| m.paused);
    let deleting = fleet.metadata.deletion_timestamp.is_some();
    let (r, m) = (report.reason, report.message.as_str());
    let subjects = Subjects {
        ready,
        ready_count,
        replicas: owned.map(LiveWorkload::replicas),
        class: report.class,
        journal_bytes: st
            .journal
            .as_ref()
            .map(|j| (j.bytes, budget.bytes() as i64)),
    };
    let own = |t: &str, status: bool, reason: &'static Reason, message: &str| {
        condition(t, status, reason.name, message, generation)
    };
    let mut conditions = vec![
        condition("Ready", ready, r, &subjects.ready_message(), generation),
        condition(
            "InfrastructureReady",
            infra,
            r,
            &subjects.infrastructure_message(infra, m),
            generation,
        ),
        condition(
            "Progressing",
            progressing,
            r,
            &subjects.progressing_message(progressing, m),
            generation,
        ),
        condition(
            "Blocked",
            blocked,
            r,
            if blocked { m } else { "Nothing needs a person" },
            generation,
        ),
        if paused {
            own(
                "MaintenancePaused",
                true,
                &reasons::MAINTENANCE_PAUSED.reason,
                "Paused: no operation starts and no member is healed",
            )
        } else {
            own(
                "MaintenancePaused",
                false,
                &reasons::NOT_PAUSED,
                "Not paused: operations start and members are healed",
            )
        },
        if deleting {
            own("Deleting", true, &reasons::DELETING, m)
        } else {
            own(
                "Deleting",
                false,
                &reasons::NOT_DELETING,
                "The fleet is not being deleted",
            )
        },
        match &stalled {
            Some(msg) => own("OperationStalled", true, &reasons::DEADLINE_EXCEEDED, msg),
            None => own(
                "OperationStalled",
                false,
                &reasons::NO_STALLED_OPERATION,
                "No open operation is past its deadline",
            ),
        },
        match &size_warning {
            Some(msg) => own(
                "JournalSizeWarning",
                true,
                &reasons::JOURNAL_NEAR_CAPACITY,
                msg,
            ),
            None => own(
                "JournalSizeWarning",
                false,
                &reasons::JOURNAL_WITHIN_BUDGET,
                &subjects.journal_message(),
            ),
        },
        match &time_warning {
            Some(msg) => own(
                "JournalTimeWarning",
                true,
                &reasons::ENTRY_TIMES_INCONSISTENT,
                msg,
            ),
            None => own(
                "JournalTimeWarning",
                false,
                &reasons::ENTRY_TIMES_CONSISTENT,
                "Every entry's time is consistent with the entries around it",
            ),
        },
    ];
    // Keep transition times of conditions whose status did not change.
    let previous: BTreeMap<&str, &Condition> = old
        .conditions
        .iter()
        .map(|c| (c.type_.as_str(), c))
        .collect();
    for c in &mut conditions {
        if let Some(p) = previous.get(c.type_.as_str()) {
            if p.status == c.status {
                c.last_transition_time = p.last_transition_time.clone();
            }
        }
    }
    st.blocked_since = if blocked {
        old.blocked_since
            .clone()
            .or_else(|| Some(Utc::now().to_rfc3339()))
    } else {
        None
    };
    st.conditions = conditions;
    if st == old {
        return Ok((st, Stored::Unchanged));
    }
    if let Some(wait) = progress_wait.filter(|_| progress_only(&old, &st)) {
        return Ok((st, Stored::Deferred(wait)));
    }
    // A merge patch only removes keys it names as null: clear what the projection dropped.
    let mut status = serde_json::to_value(&st).unwrap_or_default();
    if let (Some(new), Ok(serde_json::Value::Object(prev))) =
        (status.as_object_mut(), serde_json::to_value(&old))
    {
        for key in prev.keys() {
            new.entry(key.clone()).or_insert(serde_json::Value::Null);
        }
    }
    let patch =
        json!({"metadata": {"resourceVersion": fleet.metadata.resource_version}, "status": status});
    match api
        .patch_status(
            &fleet.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok((st, Stored::Written)),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok((st, Stored::Conflict)),
        Err(e) => Err(e).ctx(|| "writing status".into()),
    }
}
