//! Self-healing (docs/design.md "Self-healing"): confirming the deletion of members stuck on a
//! node that cannot confirm it, and deciding when a member is replaced on a fresh disk.
//!
//! The decisions are pure functions of fresh reads ([`disk_lost`], [`evaluate`]) so each rule
//! is unit-tested; the replacement itself is a journaled `MemberReplacement` (`replace.rs`).
//!
//! | Trigger | Applies when | Steps |
//! |---|---|---|
//! | `DiskLost` | a member's claim is `Lost`; nothing open; every other member schedule-decided (even with two members down) | hold, pod, commit, retire, release |
//! | `ClaimDeleted` | settled; a member's claim is terminating while its live, scheduled Pod holds it | pod |
//! | `LongDown` | settled; exactly one member down past the replacement delay, its claim `Bound` and older than the Pod, no image or configuration error, every other member Ready for the absorb window | hold, pod, commit, retire, release |
//!
//! Never replaced: a member waiting with `ErrImagePull`, `ImagePullBackOff`, `InvalidImageName`,
//! `ErrImageNeverPull` or `CreateContainerConfigError` (a fresh disk fixes none of these), and
//! nothing but `DiskLost` while two or more members are down (celld tolerates losing one).

use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, Preconditions};
use kube::ResourceExt;

use super::{Error, KubeContext, Run};
use crate::api::keys::REPLACING_FINALIZER;

/// The timings of self-healing (`--member-replacement-delay` and the fixed windows, which
/// test clusters may shorten with hidden `--local-test` flags).
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    /// How long a member may stay down before it is replaced (default 10 min, min 1 min).
    pub replacement_delay: Duration,
    /// How long past its deletion deadline a terminating member is force-deleted (2 min).
    pub termination_margin: Duration,
    /// How long every other member must have been Ready (5 min).
    pub absorb_window: Duration,
    /// How much older than its Pod a claim must be to count as an old disk (1 min).
    pub claim_age: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            replacement_delay: Duration::from_secs(600),
            termination_margin: Duration::from_secs(120),
            absorb_window: Duration::from_secs(300),
            claim_age: Duration::from_secs(60),
        }
    }
}

/// Waiting reasons a fresh disk does not fix.
pub const NOT_A_DISK_PROBLEM: [&str; 5] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
];

/// One member slot: ordinal, its Pod and its claim (fresh reads).
#[derive(Debug, Clone)]
pub struct Slot {
    pub ordinal: i32,
    pub name: String,
    pub pod: Option<Pod>,
    pub claim: Option<PersistentVolumeClaim>,
}

/// What the settled-fleet rules decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Every member is up.
    Healthy,
    /// Open a `MemberReplacement` with this reason for this ordinal.
    Replace { ordinal: i32, reason: &'static str },
    /// Someone is down; nothing is done now. `due`: when to look again.
    Wait {
        message: String,
        due: Option<DateTime<Utc>>,
    },
    /// `MemberUnschedulable`: past the delay, unplaceable and not replaceable.
    Unschedulable { message: String },
}

fn ts(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> DateTime<Utc> {
    DateTime::from_timestamp(t.0.as_second(), t.0.subsec_nanosecond().max(0) as u32)
        .unwrap_or_default()
}

fn ready_condition(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
}

/// Ready and not terminating.
pub fn is_up(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && ready_condition(pod).is_some_and(|c| c.status == "True")
}

/// Since when the member is Ready (`None`: not Ready).
fn ready_since(pod: &Pod) -> Option<DateTime<Utc>> {
    let c = ready_condition(pod).filter(|c| c.status == "True")?;
    c.last_transition_time
        .as_ref()
        .map(ts)
        .or_else(|| pod.metadata.creation_timestamp.as_ref().map(ts))
}

/// When the member became not-Ready (else when its Pod was created).
fn down_since(pod: &Pod) -> Option<DateTime<Utc>> {
    ready_condition(pod)
        .filter(|c| c.status != "True")
        .and_then(|c| c.last_transition_time.as_ref().map(ts))
        .or_else(|| pod.metadata.creation_timestamp.as_ref().map(ts))
}

/// The first container or init container waiting with a reason a fresh disk does not fix.
pub fn config_error(pod: &Pod) -> Option<(String, String)> {
    let st = pod.status.as_ref()?;
    st.container_statuses
        .iter()
        .flatten()
        .chain(st.init_container_statuses.iter().flatten())
        .find_map(|c| {
            let w = c.state.as_ref()?.waiting.as_ref()?;
            let reason = w.reason.clone()?;
            NOT_A_DISK_PROBLEM
                .contains(&reason.as_str())
                .then(|| (reason, w.message.clone().unwrap_or_default()))
        })
}

/// `PodScheduled=False/Unschedulable`: since when, and the scheduler's message.
pub fn unschedulable(pod: &Pod) -> Option<(Option<DateTime<Utc>>, String)> {
    let c = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
    (c.reason.as_deref() == Some("Unschedulable")).then(|| {
        (
            c.last_transition_time.as_ref().map(ts),
            c.message.clone().unwrap_or_default(),
        )
    })
}

fn claim_phase(c: &PersistentVolumeClaim) -> Option<&str> {
    c.status.as_ref()?.phase.as_deref()
}

/// The member's Pod is placed, or the scheduler said it cannot be.
pub fn schedule_decided(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_some()
        || unschedulable(pod).is_some()
}

/// `DiskLost` (planned before everything but Provision): the first member whose claim is
/// `Lost` while its Pod exists and is not terminating, provided every other member is
/// schedule-decided. `Err(message)` when a claim is lost but the rule must wait.
pub fn disk_lost(slots: &[Slot]) -> Option<Result<i32, String>> {
    let lost = slots.iter().find(|s| {
        s.claim.as_ref().is_some_and(|c| {
            claim_phase(c) == Some("Lost") && c.metadata.deletion_timestamp.is_none()
        })
    })?;
    let claim = lost
        .claim
        .as_ref()
        .map(|c| c.name_any())
        .unwrap_or_default();
    match &lost.pod {
        Some(p) if p.metadata.deletion_timestamp.is_none() => {}
        _ => {
            return Some(Err(format!(
                "Claim {claim} of member {} is Lost; waiting for the member's Pod to exist before replacing it",
                lost.name
            )))
        }
    }
    if let Some(other) = slots
        .iter()
        .find(|s| s.ordinal != lost.ordinal && !s.pod.as_ref().is_some_and(schedule_decided))
    {
        return Some(Err(format!(
            "Claim {claim} of member {} is Lost; waiting for the scheduler to place member {} before replacing it",
            lost.name, other.name
        )));
    }
    Some(Ok(lost.ordinal))
}

fn at(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn dur(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// The rules for a settled fleet (no operation open, nothing else planned): `ClaimDeleted`,
/// then `LongDown` with every guard, else what a person should know about down members.
pub fn evaluate(slots: &[Slot], now: DateTime<Utc>, t: &Timings, persistent: bool) -> Verdict {
    if persistent {
        // ClaimDeleted: the claim is going while a live, scheduled Pod holds it.
        if let Some(s) = slots.iter().find(|s| {
            s.claim
                .as_ref()
                .is_some_and(|c| c.metadata.deletion_timestamp.is_some())
                && s.pod.as_ref().is_some_and(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && p.spec
                            .as_ref()
                            .and_then(|sp| sp.node_name.as_ref())
                            .is_some()
                })
        }) {
            return Verdict::Replace {
                ordinal: s.ordinal,
                reason: "ClaimDeleted",
            };
        }
    }
    let down: Vec<&Slot> = slots
        .iter()
        .filter(|s| !s.pod.as_ref().is_some_and(is_up))
        .collect();
    let Some(first) = down.first() else {
        return Verdict::Healthy;
    };
    if down.len() > 1 {
        let names: Vec<&str> = down.iter().map(|s| s.name.as_str()).collect();
        return Verdict::Wait {
            message: format!(
                "Members {} are down; celld tolerates losing one member, so none is replaced while more than one is down",
                names.join(", ")
            ),
            due: None,
        };
    }
    let s = *first;
    let Some(pod) = &s.pod else {
        return Verdict::Wait {
            message: format!(
                "Member {} has no Pod yet; the workload controller creates it",
                s.name
            ),
            due: None,
        };
    };
    if pod.metadata.deletion_timestamp.is_some() {
        return Verdict::Wait {
            message: format!("Member {} is terminating", s.name),
            due: None,
        };
    }
    if !persistent {
        return Verdict::Wait {
            message: format!(
                "Member {} is down; Bucket members are not replaced automatically (kubectl celld replace)",
                s.name
            ),
            due: None,
        };
    }
    if let Some((reason, message)) = config_error(pod) {
        return Verdict::Wait {
            message: format!(
                "Member {} is down ({reason}: {message}); a fresh disk does not fix that, so it is not replaced",
                s.name
            ),
            due: None,
        };
    }
    let since = down_since(pod).unwrap_or(now);
    let due = since + dur(t.replacement_delay);
    let unplaced = unschedulable(pod);
    // Why a fresh disk cannot be tried (checked at the due time, reported before it too).
    let claim_bound = s
        .claim
        .as_ref()
        .is_some_and(|c| claim_phase(c) == Some("Bound"));
    let claim_old = match (
        s.claim
            .as_ref()
            .and_then(|c| c.metadata.creation_timestamp.as_ref()),
        pod.metadata.creation_timestamp.as_ref(),
    ) {
        (Some(c), Some(p)) => ts(c) + dur(t.claim_age) < ts(p),
        _ => false,
    };
    let others_since = slots
        .iter()
        .filter(|o| o.ordinal != s.ordinal)
        .filter_map(|o| o.pod.as_ref().and_then(ready_since))
        .max();
    let absorbed_at = others_since.map(|r| r + dur(t.absorb_window));
    let cannot = if !claim_bound {
        Some(format!(
            "its claim {} is not Bound, so it is already on a fresh disk",
            s.claim
                .as_ref()
                .map(|c| c.name_any())
                .unwrap_or_else(|| "(none)".into())
        ))
    } else if !claim_old {
        Some("its claim was created with this Pod, so it is already on a fresh disk".to_string())
    } else {
        None
    };
    if now < due {
        let message = match &unplaced {
            Some((_, msg)) => format!("Member {} cannot be scheduled yet ({msg})", s.name),
            None if cannot.is_some() => format!(
                "Member {} is down; it will not be replaced: {}",
                s.name,
                cannot.clone().unwrap_or_default()
            ),
            None => format!(
                "Member {} is down; unless it recovers, it will be replaced on a fresh disk at {}",
                s.name,
                at(due.max(absorbed_at.unwrap_or(due)))
            ),
        };
        return Verdict::Wait {
            message,
            due: Some(due),
        };
    }
    if let Some(why) = cannot {
        return match unplaced {
            Some((since, msg)) => Verdict::Unschedulable {
                message: format!(
                    "Member {} has been unschedulable since {} ({msg}) and cannot be replaced: {why}",
                    s.name,
                    since.map(at).unwrap_or_else(|| "its creation".into())
                ),
            },
            None => Verdict::Wait {
                message: format!("Member {} is down; it will not be replaced: {why}", s.name),
                due: None,
            },
        };
    }
    match absorbed_at {
        Some(a) if a <= now => Verdict::Replace {
            ordinal: s.ordinal,
            reason: "LongDown",
        },
        Some(a) => Verdict::Wait {
            message: format!(
                "Member {} is down; it will be replaced on a fresh disk at {} once every other member has been Ready for {} s",
                s.name,
                at(a),
                t.absorb_window.as_secs()
            ),
            due: Some(a),
        },
        None => Verdict::Wait {
            message: format!(
                "Member {} is down; waiting for every other member to be Ready before replacing it",
                s.name
            ),
            due: None,
        },
    }
}

/// Fresh reads of every member slot `0..replicas` (Pod and claim by name).
pub(crate) async fn slots(run: &Run<'_>, replicas: i32) -> Result<Vec<Slot>, Error> {
    let persistent = run.fleet.spec.profile == crate::api::Profile::PersistentFleet;
    let mut out = Vec::new();
    for i in 0..replicas.max(0) {
        let name = format!("{}-{i}", run.name);
        let pod = run
            .get_opt::<Pod>(&name)
            .await?
            .filter(|p| super::owned(p, &run.uid) || owned_by_sts(p, &run.name));
        let claim = if persistent {
            run.claim_at(i).await?
        } else {
            None
        };
        out.push(Slot {
            ordinal: i,
            name,
            pod,
            claim,
        });
    }
    Ok(out)
}

fn owned_by_sts(p: &Pod, sts: &str) -> bool {
    p.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "StatefulSet" && o.name == sts && o.controller == Some(true))
        && p.labels().contains_key(crate::api::keys::FLEET_UID_LABEL)
}

/// Step 15: a StatefulSet member terminating longer than its deadline plus the margin is
/// deleted with grace 0 and its UID (fresh read; Warning `MemberForceDeleted`). Not journaled:
/// the deletion was already requested; this only confirms it for a node that cannot.
pub(crate) async fn force_delete_stuck(run: &Run<'_>) -> Result<(), Error> {
    if !crate::render::uses_statefulset(&run.fleet.spec) {
        return Ok(());
    }
    let margin = dur(run.ctx.healing.termination_margin);
    let now = Utc::now();
    let api = Api::<Pod>::namespaced(run.client.clone(), &run.ns);
    for listed in run.pods().await? {
        let Some(deadline) = listed.metadata.deletion_timestamp.as_ref().map(ts) else {
            continue;
        };
        if deadline + margin > now || listed.finalizers().iter().any(|f| f == REPLACING_FINALIZER) {
            continue;
        }
        let name = listed.name_any();
        let Some(pod) = api
            .get_opt(&name)
            .await
            .ctx(|| format!("reading member {name}"))?
        else {
            continue;
        };
        if pod.metadata.uid != listed.metadata.uid || pod.metadata.deletion_timestamp.is_none() {
            continue;
        }
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        run.ctx.check_lease();
        match api.delete(&name, &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => continue,
            Err(e) => return Err(e).ctx(|| format!("force-deleting member {name}")),
        }
        tracing::warn!(member = %name, uid = ?pod.metadata.uid, "member force-deleted: its node did not confirm termination");
        run.ctx
            .metrics
            .force_deletes
            .get_or_create(&crate::metrics::FleetLabels {
                namespace: run.ns.clone(),
                fleet: run.name.clone(),
            })
            .inc();
        run.member_event(
            "MemberForceDeleted",
            format!(
                "Pod {name} removed with grace 0 after its node failed to confirm termination; the member restarts on its own disk"
            ),
            &pod,
        )
        .await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateWaiting, ContainerStatus, PersistentVolumeClaimStatus,
        PodCondition, PodSpec, PodStatus,
    };

    #[allow(non_snake_case)]
    fn Time(d: DateTime<Utc>) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(d.timestamp()).unwrap(),
        )
    }

    fn t0() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-12-02T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }
    fn mins(m: i64) -> DateTime<Utc> {
        t0() + chrono::Duration::minutes(m)
    }

    fn pod(ready: bool, since: DateTime<Utc>, created: DateTime<Utc>) -> Pod {
        let mut p = Pod::default();
        p.metadata.creation_timestamp = Some(Time(created));
        p.spec = Some(PodSpec {
            node_name: Some("n1".into()),
            ..PodSpec::default()
        });
        p.status = Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                last_transition_time: Some(Time(since)),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        });
        p
    }

    fn claim(phase: &str, created: DateTime<Utc>) -> PersistentVolumeClaim {
        let mut c = PersistentVolumeClaim::default();
        c.metadata.name = Some("work-f-0".into());
        c.metadata.creation_timestamp = Some(Time(created));
        c.status = Some(PersistentVolumeClaimStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        c
    }

    /// Three members created at t0-60m, claims at t0-120m, members Ready since t0-30m.
    fn fleet() -> Vec<Slot> {
        (0..3)
            .map(|i| Slot {
                ordinal: i,
                name: format!("f-{i}"),
                pod: Some(pod(true, mins(-30), mins(-60))),
                claim: Some(claim("Bound", mins(-120))),
            })
            .collect()
    }

    fn timings() -> Timings {
        Timings::default()
    }

    #[test]
    fn healthy_fleet_does_nothing() {
        assert_eq!(evaluate(&fleet(), t0(), &timings(), true), Verdict::Healthy);
    }

    #[test]
    fn one_member_down_is_replaced_only_after_the_delay() {
        let mut f = fleet();
        f[1].pod = Some(pod(false, mins(-5), mins(-60)));
        match evaluate(&f, t0(), &timings(), true) {
            Verdict::Wait { message, due } => {
                assert_eq!(due, Some(mins(5)));
                assert!(
                    message.contains("will be replaced on a fresh disk at 2026-12-02T10:05:00Z"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            evaluate(&f, mins(5), &timings(), true),
            Verdict::Replace {
                ordinal: 1,
                reason: "LongDown"
            }
        );
    }

    #[test]
    fn two_members_down_replace_nothing() {
        let mut f = fleet();
        f[1].pod = Some(pod(false, mins(-50), mins(-60)));
        f[2].pod = Some(pod(false, mins(-50), mins(-60)));
        assert!(matches!(
            evaluate(&f, mins(60), &timings(), true),
            Verdict::Wait { due: None, .. }
        ));
    }

    #[test]
    fn image_and_config_errors_are_never_replaced() {
        for reason in NOT_A_DISK_PROBLEM {
            for init in [false, true] {
                let mut f = fleet();
                let mut p = pod(false, mins(-50), mins(-60));
                let cs = ContainerStatus {
                    name: "celld".into(),
                    state: Some(ContainerState {
                        waiting: Some(ContainerStateWaiting {
                            reason: Some(reason.into()),
                            message: Some("no".into()),
                        }),
                        ..ContainerState::default()
                    }),
                    ..ContainerStatus::default()
                };
                let st = p.status.as_mut().unwrap();
                if init {
                    st.init_container_statuses = Some(vec![cs]);
                } else {
                    st.container_statuses = Some(vec![cs]);
                }
                f[0].pod = Some(p);
                match evaluate(&f, mins(60), &timings(), true) {
                    Verdict::Wait { message, due: None } => {
                        assert!(message.contains(reason), "{message}")
                    }
                    other => panic!("{reason} (init {init}): {other:?}"),
                }
            }
        }
    }

    #[test]
    fn a_fresh_claim_is_not_replaced_and_unplaceable_reports_unschedulable() {
        let mut f = fleet();
        let mut p = pod(false, mins(-50), mins(-60));
        p.spec.as_mut().unwrap().node_name = None;
        p.status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()
            .push(PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                reason: Some("Unschedulable".into()),
                message: Some("0/3 nodes are available".into()),
                last_transition_time: Some(Time(mins(-50))),
                ..PodCondition::default()
            });
        f[2].pod = Some(p);
        f[2].claim = Some(claim("Pending", mins(-60)));
        match evaluate(&f, mins(-45), &timings(), true) {
            Verdict::Wait { message, .. } => {
                assert!(
                    message.contains("cannot be scheduled yet (0/3 nodes"),
                    "{message}"
                )
            }
            other => panic!("{other:?}"),
        }
        match evaluate(&f, mins(0), &timings(), true) {
            Verdict::Unschedulable { message } => {
                assert!(message.contains("not Bound"), "{message}")
            }
            other => panic!("{other:?}"),
        }
        // Bound but created with the Pod: already fresh.
        f[2].claim = Some(claim("Bound", mins(-60)));
        assert!(matches!(
            evaluate(&f, mins(0), &timings(), true),
            Verdict::Unschedulable { .. }
        ));
        // An old, bound claim on a dead node: replaced.
        f[2].claim = Some(claim("Bound", mins(-120)));
        assert_eq!(
            evaluate(&f, mins(0), &timings(), true),
            Verdict::Replace {
                ordinal: 2,
                reason: "LongDown"
            }
        );
    }

    #[test]
    fn others_must_have_been_ready_for_the_absorb_window() {
        let mut f = fleet();
        f[0].pod = Some(pod(true, mins(-2), mins(-60)));
        f[1].pod = Some(pod(false, mins(-20), mins(-60)));
        match evaluate(&f, t0(), &timings(), true) {
            Verdict::Wait { due, .. } => assert_eq!(due, Some(mins(3))),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            evaluate(&f, mins(3), &timings(), true),
            Verdict::Replace { ordinal: 1, .. }
        ));
    }

    #[test]
    fn bucket_members_are_never_replaced_automatically() {
        let mut f = fleet();
        for s in &mut f {
            s.claim = None;
        }
        f[1].pod = Some(pod(false, mins(-50), mins(-60)));
        assert!(matches!(
            evaluate(&f, mins(60), &timings(), false),
            Verdict::Wait { .. }
        ));
    }

    #[test]
    fn a_deleted_claim_under_a_live_pod_is_claim_deleted() {
        let mut f = fleet();
        f[2].claim.as_mut().unwrap().metadata.deletion_timestamp = Some(Time(mins(-1)));
        assert_eq!(
            evaluate(&f, t0(), &timings(), true),
            Verdict::Replace {
                ordinal: 2,
                reason: "ClaimDeleted"
            }
        );
    }

    #[test]
    fn disk_lost_applies_with_two_down_but_waits_for_scheduling() {
        let mut f = fleet();
        f[0].claim = Some(claim("Lost", mins(-120)));
        f[0].pod = Some(pod(false, mins(-1), mins(-60)));
        f[1].pod = Some(pod(false, mins(-1), mins(-60)));
        assert_eq!(disk_lost(&f), Some(Ok(0)));
        f[1].pod.as_mut().unwrap().spec.as_mut().unwrap().node_name = None;
        assert!(matches!(disk_lost(&f), Some(Err(_))));
        assert_eq!(disk_lost(&fleet()), None);
    }
}
