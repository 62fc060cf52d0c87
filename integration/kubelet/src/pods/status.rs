//! Pod status as the kubelet reports it: container states, phase, conditions with transition
//! times. Pure: the worker passes in what it knows and `now`.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, HostIP, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// How a container run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Termination {
    /// Exit code (128 + signal when killed by a signal).
    pub exit_code: i32,
    /// `Completed`, `Error` or `StartError`.
    pub reason: String,
    /// Detail (start errors).
    pub message: Option<String>,
    /// When it started (absent for a start error).
    pub started_at: Option<Timestamp>,
    /// When it ended.
    pub finished_at: Timestamp,
    /// Its container id.
    pub container_id: Option<String>,
}

impl Termination {
    /// The termination of a process that exited with `exit_code`.
    pub fn exited(
        exit_code: i32,
        started_at: Option<Timestamp>,
        finished_at: Timestamp,
        id: Option<String>,
    ) -> Self {
        Self {
            exit_code,
            reason: if exit_code == 0 { "Completed" } else { "Error" }.to_string(),
            message: None,
            started_at,
            finished_at,
            container_id: id,
        }
    }

    fn to_api(&self) -> ContainerState {
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: self.exit_code,
                reason: Some(self.reason.clone()),
                message: self.message.clone(),
                started_at: self.started_at.map(Time),
                finished_at: Some(Time(self.finished_at)),
                container_id: self.container_id.clone(),
                signal: None,
            }),
            ..ContainerState::default()
        }
    }
}

/// A container's current state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Not running: `ContainerCreating`, `ErrImagePull`, `CrashLoopBackOff`,
    /// `CreateContainerConfigError`.
    Waiting {
        /// Reason.
        reason: String,
        /// Message.
        message: Option<String>,
    },
    /// Running since.
    Running {
        /// Start time.
        started_at: Timestamp,
    },
    /// Ended and not restarting (or the Pod is terminating).
    Terminated(Termination),
}

/// Everything status needs to know about one container.
#[derive(Debug, Clone)]
pub struct ContainerView {
    /// Container name.
    pub name: String,
    /// Image from the spec.
    pub image: String,
    /// Program the image maps to, shown as `imageID`.
    pub image_id: String,
    /// Current state.
    pub state: State,
    /// Previous termination.
    pub last: Option<Termination>,
    /// Number of restarts.
    pub restart_count: i32,
    /// Readiness.
    pub ready: bool,
    /// Container id of the current run.
    pub container_id: Option<String>,
}

impl ContainerView {
    fn to_api(&self) -> ContainerStatus {
        let state = match &self.state {
            State::Waiting { reason, message } => ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(reason.clone()),
                    message: message.clone(),
                }),
                ..ContainerState::default()
            },
            State::Running { started_at } => ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(Time(*started_at)),
                }),
                ..ContainerState::default()
            },
            State::Terminated(t) => t.to_api(),
        };
        let running = matches!(self.state, State::Running { .. });
        ContainerStatus {
            name: self.name.clone(),
            image: self.image.clone(),
            image_id: self.image_id.clone(),
            container_id: match &self.state {
                State::Terminated(t) => t.container_id.clone(),
                _ => self.container_id.clone(),
            },
            ready: self.ready && running,
            started: Some(running),
            restart_count: self.restart_count,
            state: Some(state),
            last_state: Some(
                self.last
                    .as_ref()
                    .map(Termination::to_api)
                    .unwrap_or_default(),
            ),
            ..ContainerStatus::default()
        }
    }
}

/// The Pod phase from container states (a port of the kubelet's `getPhase` without init
/// containers). `terminal` = the Pod was terminated (deletion finished): no more restarts.
pub fn phase(restart_policy: &str, containers: &[ContainerView], terminal: bool) -> &'static str {
    let (mut waiting, mut running, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for c in containers {
        match &c.state {
            State::Running { .. } => running += 1,
            State::Terminated(t) => {
                stopped += 1;
                if t.exit_code == 0 {
                    succeeded += 1;
                }
            }
            State::Waiting { .. } if c.last.is_some() => stopped += 1,
            State::Waiting { .. } => waiting += 1,
        }
    }
    if terminal && running == 0 && waiting == 0 {
        return if stopped == succeeded {
            "Succeeded"
        } else {
            "Failed"
        };
    }
    if waiting > 0 {
        return "Pending";
    }
    if running > 0 {
        return "Running";
    }
    if stopped == 0 {
        return "Pending";
    }
    match restart_policy {
        "Never" if stopped == succeeded => "Succeeded",
        "Never" => "Failed",
        "OnFailure" if stopped == succeeded => "Succeeded",
        "OnFailure" => "Running",
        _ => "Running",
    }
}

/// Remembers each kubelet-owned condition's status and when it last changed.
#[derive(Debug, Default, Clone)]
pub struct ConditionClock {
    seen: HashMap<String, (String, Timestamp)>,
}

impl ConditionClock {
    /// Seeds the clock from conditions already on the Pod (a kubelet restart keeps times).
    pub fn seed(&mut self, existing: &[PodCondition]) {
        for c in existing {
            if let Some(t) = &c.last_transition_time {
                self.seen.insert(c.type_.clone(), (c.status.clone(), t.0));
            }
        }
    }

    /// The transition time of `type_` now having `status`.
    pub fn stamp(&mut self, type_: &str, status: &str, now: Timestamp) -> Timestamp {
        match self.seen.get(type_) {
            Some((s, t)) if s == status => *t,
            _ => {
                self.seen
                    .insert(type_.to_string(), (status.to_string(), now));
                now
            }
        }
    }
}

/// Inputs of a status computation.
#[derive(Debug, Clone)]
pub struct StatusInput<'a> {
    /// `spec.restartPolicy` (default `Always`).
    pub restart_policy: &'a str,
    /// Containers in spec order.
    pub containers: &'a [ContainerView],
    /// Conditions on the live Pod (foreign ones are kept; `PodScheduled` is kept as is).
    pub existing_conditions: &'a [PodCondition],
    /// `spec.readinessGates` condition types.
    pub readiness_gates: &'a [String],
    /// Pod IP, once assigned.
    pub pod_ip: Option<String>,
    /// When the kubelet took the Pod.
    pub start_time: Timestamp,
    /// Sandbox (IP, folders, volumes) ready.
    pub sandbox_ready: bool,
    /// Terminated for good (deletion finished).
    pub terminal: bool,
    /// Why the Pod cannot be initialized (init containers are not modelled).
    pub not_initialized: Option<String>,
}

const KUBELET_CONDITIONS: [&str; 4] = [
    "PodReadyToStartContainers",
    "Initialized",
    "ContainersReady",
    "Ready",
];

fn condition(
    clock: &mut ConditionClock,
    type_: &str,
    ok: bool,
    reason: Option<&str>,
    message: Option<String>,
    now: Timestamp,
) -> PodCondition {
    let status = if ok { "True" } else { "False" };
    PodCondition {
        type_: type_.to_string(),
        status: status.to_string(),
        last_transition_time: Some(Time(clock.stamp(type_, status, now))),
        reason: if ok { None } else { reason.map(str::to_string) },
        message: if ok { None } else { message },
        ..PodCondition::default()
    }
}

/// The status the kubelet reports.
pub fn build(input: &StatusInput<'_>, clock: &mut ConditionClock, now: Timestamp) -> PodStatus {
    let phase = phase(input.restart_policy, input.containers, input.terminal);
    let completed = phase == "Succeeded" || phase == "Failed";
    let unready: Vec<&str> = input
        .containers
        .iter()
        .filter(|c| !(c.ready && matches!(c.state, State::Running { .. })))
        .map(|c| c.name.as_str())
        .collect();
    let containers_ready = unready.is_empty() && !completed;
    let (cr_reason, cr_message) = if completed {
        ("PodCompleted", None)
    } else {
        (
            "ContainersNotReady",
            Some(format!(
                "containers with unready status: [{}]",
                unready.join(" ")
            )),
        )
    };
    let gate_missing: Vec<&String> = input
        .readiness_gates
        .iter()
        .filter(|g| {
            !input
                .existing_conditions
                .iter()
                .any(|c| &c.type_ == *g && c.status == "True")
        })
        .collect();
    let (ready, ready_reason, ready_message) = if !containers_ready {
        (false, cr_reason, cr_message.clone())
    } else if !gate_missing.is_empty() {
        (
            false,
            "ReadinessGatesNotReady",
            Some(format!(
                "the status of pod readiness gates is not \"True\": {gate_missing:?}"
            )),
        )
    } else {
        (true, "", None)
    };
    let mut conditions: Vec<PodCondition> = Vec::new();
    let scheduled = input
        .existing_conditions
        .iter()
        .find(|c| c.type_ == "PodScheduled")
        .cloned()
        .unwrap_or_else(|| condition(clock, "PodScheduled", true, None, None, now));
    conditions.push(condition(
        clock,
        "PodReadyToStartContainers",
        input.sandbox_ready && !input.terminal,
        None,
        None,
        now,
    ));
    conditions.push(condition(
        clock,
        "Initialized",
        input.not_initialized.is_none(),
        Some("ContainersNotInitialized"),
        input.not_initialized.clone(),
        now,
    ));
    conditions.push(condition(
        clock,
        "Ready",
        ready,
        Some(ready_reason),
        ready_message,
        now,
    ));
    conditions.push(condition(
        clock,
        "ContainersReady",
        containers_ready,
        Some(cr_reason),
        cr_message,
        now,
    ));
    conditions.push(scheduled);
    for c in input.existing_conditions {
        if c.type_ != "PodScheduled" && !KUBELET_CONDITIONS.contains(&c.type_.as_str()) {
            conditions.push(c.clone());
        }
    }
    PodStatus {
        phase: Some(phase.to_string()),
        conditions: Some(conditions),
        host_ip: Some("127.0.0.1".into()),
        host_ips: Some(vec![HostIP {
            ip: "127.0.0.1".into(),
        }]),
        pod_ip: input.pod_ip.clone(),
        pod_ips: input
            .pod_ip
            .as_ref()
            .map(|ip| vec![PodIP { ip: ip.clone() }]),
        start_time: Some(Time(input.start_time)),
        container_statuses: Some(input.containers.iter().map(ContainerView::to_api).collect()),
        ..PodStatus::default()
    }
}

/// True when every field of `desired` has the same value in `actual` (fields the server adds,
/// such as `lastProbeTime: null`, are ignored; arrays must match element by element).
pub fn json_subset(desired: &serde_json::Value, actual: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (desired, actual) {
        (Value::Object(d), Value::Object(a)) => d.iter().all(|(k, dv)| match a.get(k) {
            Some(av) => json_subset(dv, av),
            None => dv.is_null() || dv.as_object().is_some_and(|o| o.is_empty()),
        }),
        (Value::Array(d), Value::Array(a)) => {
            d.len() == a.len() && d.iter().zip(a).all(|(dv, av)| json_subset(dv, av))
        }
        (d, a) => d == a,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(state: State, last: Option<Termination>, ready: bool) -> ContainerView {
        ContainerView {
            name: "c".into(),
            image: "img".into(),
            image_id: "id".into(),
            state,
            last,
            restart_count: 0,
            ready,
            container_id: None,
        }
    }

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn term(code: i32) -> Termination {
        Termination::exited(code, Some(ts(1)), ts(2), None)
    }

    fn waiting(reason: &str) -> State {
        State::Waiting {
            reason: reason.into(),
            message: None,
        }
    }

    #[test]
    fn phase_follows_the_kubelet_rules() {
        let running = State::Running { started_at: ts(1) };
        assert_eq!(
            phase(
                "Always",
                &[view(waiting("ContainerCreating"), None, false)],
                false
            ),
            "Pending"
        );
        assert_eq!(
            phase(
                "Always",
                &[view(waiting("ErrImagePull"), None, false)],
                false
            ),
            "Pending"
        );
        assert_eq!(
            phase("Always", &[view(running, None, true)], false),
            "Running"
        );
        // crash loop: waiting with a previous termination counts as stopped → Running
        assert_eq!(
            phase(
                "Always",
                &[view(waiting("CrashLoopBackOff"), Some(term(3)), false)],
                false
            ),
            "Running"
        );
        assert_eq!(
            phase(
                "Never",
                &[view(State::Terminated(term(3)), None, false)],
                false
            ),
            "Failed"
        );
        assert_eq!(
            phase(
                "Never",
                &[view(State::Terminated(term(0)), None, false)],
                false
            ),
            "Succeeded"
        );
        assert_eq!(
            phase(
                "OnFailure",
                &[view(State::Terminated(term(0)), None, false)],
                false
            ),
            "Succeeded"
        );
        assert_eq!(
            phase(
                "Always",
                &[view(State::Terminated(term(0)), None, false)],
                true
            ),
            "Succeeded"
        );
        assert_eq!(
            phase(
                "Always",
                &[view(State::Terminated(term(143)), None, false)],
                true
            ),
            "Failed"
        );
    }

    #[test]
    fn conditions_keep_transition_times_until_their_status_changes() {
        let mut clock = ConditionClock::default();
        let containers = [view(State::Running { started_at: ts(1) }, None, false)];
        let input = StatusInput {
            restart_policy: "Always",
            containers: &containers,
            existing_conditions: &[],
            readiness_gates: &[],
            pod_ip: Some("127.1.0.1".into()),
            start_time: ts(1),
            sandbox_ready: true,
            terminal: false,
            not_initialized: None,
        };
        let get = |s: &PodStatus, t: &str| {
            s.conditions
                .as_ref()
                .unwrap()
                .iter()
                .find(|c| c.type_ == t)
                .cloned()
                .unwrap()
        };
        let first = build(&input, &mut clock, ts(10));
        assert_eq!(get(&first, "Ready").status, "False");
        assert_eq!(
            get(&first, "Ready").reason.as_deref(),
            Some("ContainersNotReady")
        );
        assert_eq!(
            get(&first, "Ready").last_transition_time,
            Some(Time(ts(10)))
        );
        let again = build(&input, &mut clock, ts(20));
        assert_eq!(
            get(&again, "Ready").last_transition_time,
            Some(Time(ts(10)))
        );
        let ready = [view(State::Running { started_at: ts(1) }, None, true)];
        let input = StatusInput {
            containers: &ready,
            ..input
        };
        let now_ready = build(&input, &mut clock, ts(30));
        assert_eq!(get(&now_ready, "Ready").status, "True");
        assert_eq!(
            get(&now_ready, "Ready").last_transition_time,
            Some(Time(ts(30)))
        );
        assert_eq!(
            get(&now_ready, "Initialized").last_transition_time,
            Some(Time(ts(10)))
        );
        assert_eq!(now_ready.phase.as_deref(), Some("Running"));
        assert_eq!(now_ready.pod_ips.unwrap()[0].ip, "127.1.0.1");
    }

    #[test]
    fn readiness_gates_hold_ready_false() {
        let mut clock = ConditionClock::default();
        let containers = [view(State::Running { started_at: ts(1) }, None, true)];
        let gates = ["example.com/gate".to_string()];
        let input = StatusInput {
            restart_policy: "Always",
            containers: &containers,
            existing_conditions: &[],
            readiness_gates: &gates,
            pod_ip: None,
            start_time: ts(1),
            sandbox_ready: true,
            terminal: false,
            not_initialized: None,
        };
        let s = build(&input, &mut clock, ts(5));
        let ready = s
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.reason.as_deref(), Some("ReadinessGatesNotReady"));
    }

    #[test]
    fn json_subset_ignores_fields_added_by_the_server() {
        let desired = serde_json::json!({"a": 1, "l": [{"x": 1, "s": {}}], "n": null});
        let actual = serde_json::json!({"a": 1, "l": [{"x": 1, "y": null}], "extra": 2});
        assert!(json_subset(&desired, &actual));
        let shorter = serde_json::json!({"a": 1, "l": []});
        assert!(!json_subset(&desired, &shorter));
    }
}
