//! `kubectl celld status NS/FLEET`: one screen about one fleet (docs/operations.md
//! "Reading a fleet: `kubectl celld status`"), or `-o json` for scripts.
//!
//! [`View::build`] is a pure projection of what the API server holds (the fleet, its Pods and
//! claims) plus what the members answered on `/state`; [`View::render`] lays it out. Nothing
//! here writes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use serde::Serialize;

use crate::api::{CelldFleet, Profile};

/// Everything the status screen shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct View {
    pub namespace: String,
    pub name: String,
    pub profile: String,
    pub image: Option<String>,
    pub paused: bool,
    pub deleting: bool,
    pub replicas: Replicas,
    pub members: Vec<Member>,
    pub current_operation: Option<crate::api::CurrentOperation>,
    pub recent_operations: Vec<crate::api::RecentOperation>,
    /// Conditions that need attention (`Blocked`, `OperationStalled`, the journal warnings
    /// and `Ready` when True is expected but False), and every condition under `-o json`.
    pub conditions: Vec<ConditionLine>,
    pub journal: Option<JournalLine>,
}

/// Desired (the spec), applied (the workload's spec.replicas), ready (the workload's status).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Replicas {
    pub desired: i32,
    pub applied: Option<i32>,
    pub ready: Option<i32>,
}

/// One member Pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Member {
    pub pod: String,
    pub uid: String,
    pub node: Option<String>,
    pub ip: Option<String>,
    pub phase: Option<String>,
    pub ready: bool,
    pub terminating: bool,
    pub restarts: i32,
    pub last_exit_code: Option<i32>,
    pub claim: Option<String>,
    pub claim_uid: Option<String>,
    pub claim_phase: Option<String>,
    /// The runtime generation from `/state`, when the member answered.
    pub runtime_generation: Option<String>,
    /// Why `/state` gave nothing (unreachable, invalid answer), when it was asked.
    pub state_error: Option<String>,
}

/// One condition, as the status shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConditionLine {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
    pub since: String,
    /// Whether it asks for attention (shown on the screen).
    pub active: bool,
}

/// The journal's size against the operator's budget (the budget is a flag of `run`; the
/// screen shows the default unless `--journal-budget` says otherwise).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JournalLine {
    pub seq: i64,
    pub bytes: i64,
    pub budget: i64,
    /// The last seq compaction dropped (0: nothing dropped).
    pub compacted_through: i64,
}

/// What `/state` answered per member, keyed by Pod name: the runtime generation or why not.
pub type States = BTreeMap<String, Result<String, String>>;

/// The conditions whose True status needs attention, and the one whose False does.
fn active(type_: &str, status: &str) -> bool {
    match type_ {
        "Blocked" | "OperationStalled" | "JournalSizeWarning" | "JournalTimeWarning"
        | "MaintenancePaused" | "Deleting" => status == "True",
        "Ready" | "InfrastructureReady" => status == "False",
        _ => false,
    }
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The claim a member Pod mounts (its first PersistentVolumeClaim volume).
fn claim_of(p: &Pod) -> Option<String> {
    p.spec
        .as_ref()?
        .volumes
        .as_ref()?
        .iter()
        .find_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.clone())
}

/// The runtime's name for the member on `/state`: the Pod name on a PersistentFleet, the Pod
/// UID on every Bucket fleet (docs/runtime.md).
pub fn state_name(fleet: &CelldFleet, pod: &Pod) -> String {
    if fleet.spec.profile == Profile::PersistentFleet {
        pod.name_any()
    } else {
        pod.uid().unwrap_or_default()
    }
}

impl View {
    /// The view of `fleet` from its Pods, claims and the members' `/state` answers.
    pub fn build(
        fleet: &CelldFleet,
        pods: &[Pod],
        claims: &[PersistentVolumeClaim],
        states: &States,
        budget: i64,
    ) -> View {
        let status = fleet.status.clone().unwrap_or_default();
        let claims: BTreeMap<String, &PersistentVolumeClaim> =
            claims.iter().map(|c| (c.name_any(), c)).collect();
        let mut members: Vec<Member> = pods
            .iter()
            .map(|p| {
                let container = p
                    .status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .and_then(|c| c.first());
                let last_exit_code = container.and_then(|c| {
                    c.last_state
                        .as_ref()
                        .and_then(|s| s.terminated.as_ref())
                        .map(|t| t.exit_code)
                });
                let claim = claim_of(p);
                let found = claim.as_ref().and_then(|c| claims.get(c));
                let state = states.get(&p.name_any());
                Member {
                    pod: p.name_any(),
                    uid: p.uid().unwrap_or_default(),
                    node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
                    ip: p.status.as_ref().and_then(|s| s.pod_ip.clone()),
                    phase: p.status.as_ref().and_then(|s| s.phase.clone()),
                    ready: pod_ready(p),
                    terminating: p.metadata.deletion_timestamp.is_some(),
                    restarts: container.map(|c| c.restart_count).unwrap_or(0),
                    last_exit_code,
                    claim_uid: found.and_then(|c| c.uid()),
                    claim_phase: found
                        .and_then(|c| c.status.as_ref())
                        .and_then(|s| s.phase.clone()),
                    claim,
                    runtime_generation: state.and_then(|s| s.as_ref().ok().cloned()),
                    state_error: state.and_then(|s| s.as_ref().err().cloned()),
                }
            })
            .collect();
        members.sort_by_key(|m| natural(&m.pod));
        let conditions = status
            .conditions
            .iter()
            .map(|c| ConditionLine {
                type_: c.type_.clone(),
                status: c.status.clone(),
                reason: c.reason.clone(),
                message: c.message.clone(),
                since: c.last_transition_time.0.to_string(),
                active: active(&c.type_, &c.status),
            })
            .collect();
        View {
            namespace: fleet.namespace().unwrap_or_default(),
            name: fleet.name_any(),
            profile: format!("{:?}", fleet.spec.profile),
            image: fleet.spec.runtime_image.clone(),
            paused: fleet.spec.maintenance.as_ref().is_some_and(|m| m.paused),
            deleting: fleet.metadata.deletion_timestamp.is_some(),
            replicas: Replicas {
                desired: fleet.spec.replicas,
                applied: status.applied_replicas,
                ready: status.ready_replicas,
            },
            members,
            current_operation: status.current_operation.clone(),
            recent_operations: status.recent_operations.clone(),
            conditions,
            journal: status.journal.as_ref().map(|j| JournalLine {
                seq: j.seq,
                bytes: j.bytes,
                budget,
                compacted_through: j.compacted_through,
            }),
        }
    }

    /// The screen: aligned sections, one line per member.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut line = |s: String| {
            out.push_str(s.trim_end());
            out.push('\n');
        };
        line(format!("Fleet:      {}/{}", self.namespace, self.name));
        line(format!("Profile:    {}", self.profile));
        line(format!(
            "Image:      {}",
            self.image.as_deref().unwrap_or("(not set)")
        ));
        let opt = |v: Option<i32>| v.map_or("-".to_string(), |v| v.to_string());
        line(format!(
            "Replicas:   desired {}, applied {}, ready {}",
            self.replicas.desired,
            opt(self.replicas.applied),
            opt(self.replicas.ready)
        ));
        let mut flags = Vec::new();
        if self.paused {
            flags.push("paused");
        }
        if self.deleting {
            flags.push("deleting");
        }
        if !flags.is_empty() {
            line(format!("State:      {}", flags.join(", ")));
        }
        if let Some(j) = &self.journal {
            let pct = if j.budget > 0 {
                j.bytes * 100 / j.budget
            } else {
                0
            };
            line(format!(
                "Journal:    seq {}, {} of {} bytes ({pct}%){}",
                j.seq,
                j.bytes,
                j.budget,
                if j.compacted_through > 0 {
                    format!(", compacted through {}", j.compacted_through)
                } else {
                    String::new()
                }
            ));
        }
        line(String::new());
        line("Members:".into());
        let rows: Vec<Vec<String>> = std::iter::once(
            [
                "POD",
                "READY",
                "NODE",
                "IP",
                "RESTARTS",
                "LAST-EXIT",
                "CLAIM",
                "CLAIM-UID",
                "GENERATION",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        )
        .chain(self.members.iter().map(|m| {
            let ready = if m.terminating {
                "Terminating".to_string()
            } else if m.ready {
                "True".to_string()
            } else {
                format!("False ({})", m.phase.as_deref().unwrap_or("?"))
            };
            vec![
                m.pod.clone(),
                ready,
                m.node.clone().unwrap_or_else(|| "-".into()),
                m.ip.clone().unwrap_or_else(|| "-".into()),
                m.restarts.to_string(),
                m.last_exit_code.map_or("-".to_string(), |c| c.to_string()),
                m.claim.clone().unwrap_or_else(|| "-".into()),
                m.claim_uid.clone().unwrap_or_else(|| "-".into()),
                m.runtime_generation
                    .clone()
                    .or_else(|| m.state_error.as_ref().map(|_| "unreachable".into()))
                    .unwrap_or_else(|| "-".into()),
            ]
        }))
        .collect();
        for row in journal::audit::aligned(&rows) {
            line(format!("  {row}"));
        }
        if self.members.is_empty() {
            line("  (none)".into());
        }
        line(String::new());
        match &self.current_operation {
            Some(o) => {
                line(format!("Open operation: {:?} {}", o.kind, o.id));
                line(format!(
                    "  phase {:?}, step {}, {}→{}",
                    o.phase,
                    o.step.as_deref().unwrap_or("-"),
                    opt(o.from),
                    opt(o.to)
                ));
                if let Some(s) = &o.started_at {
                    line(format!("  started {}", second(s)));
                }
                if let Some(d) = &o.deadline {
                    line(format!("  deadline {}", second(d)));
                }
                if let Some(b) = &o.blocker {
                    line(format!("  blocked: {b}"));
                }
                if let Some(s) = &o.summary {
                    line(format!("  {s}"));
                }
            }
            None => line("Open operation: none".into()),
        }
        if !self.recent_operations.is_empty() {
            line(String::new());
            line("Recent operations:".into());
            let rows: Vec<Vec<String>> = std::iter::once(
                ["ID", "KIND", "OUTCOME", "FINISHED"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
            )
            .chain(self.recent_operations.iter().map(|o| {
                vec![
                    o.id.clone(),
                    format!("{:?}", o.kind),
                    o.outcome.clone(),
                    o.finished_at.as_deref().map(second).unwrap_or_default(),
                ]
            }))
            .collect();
            for row in journal::audit::aligned(&rows) {
                line(format!("  {row}"));
            }
        }
        line(String::new());
        let active: Vec<&ConditionLine> = self.conditions.iter().filter(|c| c.active).collect();
        if active.is_empty() {
            let ready = self
                .conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .map(|c| format!(" ({}: {})", c.reason, c.message))
                .unwrap_or_default();
            line(format!("Conditions: nothing needs attention{ready}"));
        } else {
            line("Conditions:".into());
            for c in active {
                line(format!(
                    "  {}={} {} since {}: {}",
                    c.type_,
                    c.status,
                    c.reason,
                    second(&c.since),
                    c.message
                ));
            }
        }
        out
    }
}

/// `beta-10` after `beta-9`.
fn natural(name: &str) -> (String, u64) {
    match name.rsplit_once('-') {
        Some((head, n)) if n.chars().all(|c| c.is_ascii_digit()) && !n.is_empty() => {
            (head.to_string(), n.parse().unwrap_or(0))
        }
        _ => (name.to_string(), 0),
    }
}

/// An RFC 3339 time to the second (`2026-12-03T15:04:05Z`); other text unchanged.
pub fn second(t: &str) -> String {
    match chrono::DateTime::parse_from_rfc3339(t) {
        Ok(d) => d
            .with_timezone(&chrono::Utc)
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string(),
        Err(_) => t.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fleet() -> CelldFleet {
        serde_json::from_value(json!({
            "apiVersion": "celld.eric.dev/v1alpha1", "kind": "CelldFleet",
            "metadata": {"name": "beta", "namespace": "demo", "uid": "f-1"},
            "spec": {"profile": "PersistentFleet", "runtimeImage": "img@sha256:1", "replicas": 3,
                     "serviceAccountName": "celld",
                     "placement": {"zones": ["us-east-1a"], "azCount": 1, "mode": "Relaxed"},
                     "storage": {"bucket": "b", "region": "us-east-1", "sizeGiB": 1}},
            "status": {"replicas": 3, "appliedReplicas": 3, "readyReplicas": 2,
                       "journal": {"seq": 12, "headHash": "h", "bytes": 6553},
                       "currentOperation": {"id": "op-1", "kind": "Restart", "phase": "Issued",
                           "step": "template", "from": 3, "to": 3,
                           "startedAt": "2026-12-03T15:04:05.123456Z",
                           "deadline": "2026-12-03T15:34:05.123456Z", "summary": "rolling"},
                       "recentOperations": [{"id": "op-0", "kind": "Scale",
                           "outcome": "Succeeded", "finishedAt": "2026-12-03T14:00:00.5Z"}],
                       "conditions": [
                           {"type": "Ready", "status": "False", "reason": "LifecycleProgress",
                            "message": "2 of 3 members are ready",
                            "lastTransitionTime": "2026-12-03T15:04:06Z"},
                           {"type": "Blocked", "status": "False", "reason": "LifecycleProgress",
                            "message": "Nothing needs a person",
                            "lastTransitionTime": "2026-12-03T15:00:00Z"}]}
        }))
        .unwrap()
    }

    fn pod(name: &str, ready: bool, claim: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": format!("uid-{name}")},
            "spec": {"nodeName": "node-a", "containers": [{"name": "celld"}],
                     "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]},
            "status": {"phase": "Running", "podIP": "127.0.0.5",
                       "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}],
                       "containerStatuses": [{"name": "celld", "ready": ready, "restartCount": 2,
                           "image": "i", "imageID": "", "started": true,
                           "lastState": {"terminated": {"exitCode": 3}}}]}
        }))
        .unwrap()
    }

    fn claim(name: &str) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": format!("cuid-{name}")},
            "status": {"phase": "Bound"}
        }))
        .unwrap()
    }

    #[test]
    fn the_view_joins_pods_claims_and_state_answers() {
        let pods = [
            pod("beta-10", true, "data-beta-10"),
            pod("beta-2", false, "data-beta-2"),
        ];
        let claims = [claim("data-beta-2"), claim("data-beta-10")];
        let mut states = States::new();
        states.insert("beta-2".into(), Ok("7".into()));
        states.insert("beta-10".into(), Err("connection refused".into()));
        let v = View::build(&fleet(), &pods, &claims, &states, 65536);
        assert_eq!(v.members[0].pod, "beta-2", "natural order");
        assert_eq!(v.members[0].claim_uid.as_deref(), Some("cuid-data-beta-2"));
        assert_eq!(v.members[0].runtime_generation.as_deref(), Some("7"));
        assert_eq!(v.members[0].restarts, 2);
        assert_eq!(v.members[0].last_exit_code, Some(3));
        assert_eq!(
            v.members[1].state_error.as_deref(),
            Some("connection refused")
        );
        assert_eq!(
            v.replicas,
            Replicas {
                desired: 3,
                applied: Some(3),
                ready: Some(2)
            }
        );
        let text = v.render();
        assert!(
            text.contains("Replicas:   desired 3, applied 3, ready 2"),
            "{text}"
        );
        assert!(
            text.contains("Journal:    seq 12, 6553 of 65536 bytes (9%)"),
            "{text}"
        );
        assert!(text.contains("Open operation: Restart op-1"), "{text}");
        assert!(
            text.contains("deadline 2026-12-03T15:34:05Z"),
            "to the second: {text}"
        );
        assert!(
            text.contains("Ready=False LifecycleProgress since 2026-12-03T15:04:06Z: 2 of 3 members are ready"),
            "{text}"
        );
        assert!(
            !text.contains("Blocked=False"),
            "only what needs attention: {text}"
        );
        // Columns line up whatever the widths.
        let header = text.lines().find(|l| l.contains("POD")).unwrap();
        let row = text.lines().find(|l| l.contains("beta-10")).unwrap();
        assert_eq!(header.find("READY"), row.find("True"), "{text}");
        assert_eq!(header.find("GENERATION"), row.find("unreachable"), "{text}");
    }

    #[test]
    fn a_fleet_without_status_renders_without_panicking() {
        let mut f = fleet();
        f.status = None;
        let v = View::build(&f, &[], &[], &States::new(), 65536);
        let text = v.render();
        assert!(text.contains("(none)"));
        assert!(text.contains("Open operation: none"));
        assert!(text.contains("desired 3, applied -, ready -"), "{text}");
    }
}
