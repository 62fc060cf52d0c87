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
    /// A blocked reason.
    pub fn blocked(reason: &'static str, message: String) -> Self {
        Self {
            reason,
            class: Class::Blocked,
            message,
        }
    }
    /// A blocked reason whose infrastructure is in place.
    pub fn blocked_infra_ready(reason: &'static str, message: String) -> Self {
        Self {
            reason,
            class: Class::BlockedInfraReady,
            message,
        }
    }
    /// Progress of an open operation.
    pub fn progress(message: String) -> Self {
        Self {
            reason: "LifecycleProgress",
            class: Class::Progress,
            message,
        }
    }
    /// Waiting for the world.
    pub fn provisioning(message: String) -> Self {
        Self {
            reason: "Provisioning",
            class: Class::Wait,
            message,
        }
    }
    /// Done.
    pub fn provisioned(n: i32) -> Self {
        Self {
            reason: "Provisioned",
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

/// Computes the status and writes it when it changed (merge patch carrying the fleet's
/// resourceVersion; a conflict just means the next reconcile writes it). Returns the status
/// and whether it is what the fleet now holds (false after a conflict). `journal: None`
/// means the journal cannot be used (damaged or missing): its projection keeps the last
/// known values (current and recent operations, `lastRestartToken`, journal figures, the
/// stall and size conditions), so nothing reading status (kubectl, dashboards) sees them
/// vanish.
pub async fn write(
    api: &Api<CelldFleet>,
    fleet: &CelldFleet,
    journal: Option<&Journal>,
    budget: Budget,
    pods: &[Pod],
    live: Option<&LiveWorkload>,
    report: &Report,
) -> Result<(CelldFleetStatus, bool), Error> {
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
            stalled = Some(format!(
                "{} {} has been open since {}; deadline {} passed; waiting for {}",
                c.kind,
                c.id,
                c.started_at.to_rfc3339(),
                c.deadline.to_rfc3339(),
                if c.blocker.is_empty() {
                    "its target"
                } else {
                    &c.blocker
                }
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
                "{first}{}; check the clocks of the operator's nodes (`kubectl celld journal verify` lists every entry)",
                if times.len() > 1 {
                    format!(" (and {} more)", times.len() - 1)
                } else {
                    String::new()
                }
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
    let mut conditions = vec![
        condition("Ready", ready, r, m, generation),
        condition("InfrastructureReady", infra, r, m, generation),
        condition("Progressing", progressing, r, m, generation),
        condition("Blocked", blocked, r, m, generation),
        condition(
            "MaintenancePaused",
            paused,
            if paused {
                "MaintenancePaused"
            } else {
                "NotPaused"
            },
            if paused {
                "Paused: no operation starts and no member is healed"
            } else {
                ""
            },
            generation,
        ),
        condition(
            "Deleting",
            deleting,
            if deleting { "Deleting" } else { "NotDeleting" },
            if deleting { m } else { "" },
            generation,
        ),
        match &stalled {
            Some(msg) => condition(
                "OperationStalled",
                true,
                "DeadlineExceeded",
                msg,
                generation,
            ),
            None => condition(
                "OperationStalled",
                false,
                "NoStalledOperation",
                "",
                generation,
            ),
        },
        match &size_warning {
            Some(msg) => condition(
                "JournalSizeWarning",
                true,
                "JournalNearCapacity",
                msg,
                generation,
            ),
            None => condition(
                "JournalSizeWarning",
                false,
                "JournalWithinBudget",
                "",
                generation,
            ),
        },
        match &time_warning {
            Some(msg) => condition(
                "JournalTimeWarning",
                true,
                "EntryTimesInconsistent",
                msg,
                generation,
            ),
            None => condition(
                "JournalTimeWarning",
                false,
                "EntryTimesConsistent",
                "",
                generation,
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
        return Ok((st, true));
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
        Ok(_) => Ok((st, true)),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok((st, false)),
        Err(e) => Err(e).ctx(|| "writing status".into()),
    }
}
