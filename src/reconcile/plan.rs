//! The planner (docs/design.md "Planning order"): a pure function from the fleet's desired state
//! and the observed workload to the next operation to open, or the reason none is opened. No
//! client, no clock: table-driven tests below cover the rules.

use journal::OperationKind;

/// What the planner sees of the live workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveView {
    /// `spec.replicas` of the owned workload.
    pub applied: i32,
    /// The operator-owned fields equal the current rendering (with the live token).
    pub template_current: bool,
    /// Restart token in the live Pod template.
    pub live_token: Option<String>,
    /// Image of the live `celld` container.
    pub live_image: Option<String>,
    /// Rolled out at `applied` (docs/design.md "Terms").
    pub rolled_out: bool,
    /// The workload controller observed its current spec.
    pub observed_current: bool,
    /// The highest-ordinal member was never scheduled and its claim is absent or Pending:
    /// it holds no data and may be removed without waiting for rollout (docs/design.md "Planning
    /// order").
    pub highest_never_placed: bool,
}

/// What the planner is asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    /// `spec.replicas`.
    pub replicas: i32,
    /// `spec.runtimeImage` (validated present).
    pub image: String,
    /// `spec.maintenance.restartToken`, when non-empty.
    pub token: Option<String>,
    /// The token applied by the last completed operation (journal).
    pub last_completed_token: Option<String>,
    /// `allowCoordinatedDowntime`.
    pub coordinated: bool,
    /// PersistentFleet: one disk per ordinal, growth in runs.
    pub persistent: bool,
    /// Ordinals that have a kept claim (labelled, not terminating).
    pub kept_ordinals: Vec<i32>,
    /// PersistentFleet with `storage.onScaleIn: Retire`: contractions retire the removed
    /// member's disk after a strict proof.
    pub retire: bool,
}

/// The planner's decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Open an operation.
    Open {
        /// Operation kind.
        kind: OperationKind,
        /// Replica count before.
        from: i32,
        /// Replica count after.
        to: i32,
        /// Restart token carried by the template write.
        token: Option<String>,
        /// Image carried by the template write.
        image: Option<String>,
        /// A strict operation (proofs first): a Retire contraction or a coordinated restart.
        strict: bool,
    },
    /// Nothing to do: the fleet is settled.
    Settled,
    /// Something is asked for but must wait (message for `Provisioning`).
    Wait(String),
    /// Something is asked for that this build cannot do (message for `UnsupportedTransition`).
    Unsupported(String),
}

/// A new restart is requested: non-empty, not in the live template, not already applied.
pub fn token_requested(d: &Desired, live: &LiveView) -> bool {
    match &d.token {
        Some(t) => {
            live.live_token.as_deref() != Some(t) && d.last_completed_token.as_deref() != Some(t)
        }
        None => false,
    }
}

/// End of the growth run starting at `from` (docs/design.md "Planning order"): ordinals are added
/// while each next one is of the same kind (kept or fresh) as the first.
pub fn growth_run_end(from: i32, target: i32, kept: &[i32]) -> i32 {
    let first_kept = kept.contains(&from);
    let mut end = from + 1;
    while end < target && kept.contains(&end) == first_kept {
        end += 1;
    }
    end
}

/// Provision's first target: Bucket all at once, PersistentFleet the first run.
pub fn provision_target(d: &Desired) -> i32 {
    if d.persistent {
        growth_run_end(0, d.replicas, &d.kept_ordinals)
    } else {
        d.replicas
    }
}

/// The next operation (docs/design.md "Planning order"; member replacements are decided around
/// it, in `drive::plan_and_open`).
pub fn plan(d: &Desired, live: Option<&LiveView>) -> Plan {
    let Some(live) = live else {
        return Plan::Open {
            kind: OperationKind::Provision,
            from: 0,
            to: provision_target(d),
            token: None,
            image: None,
            strict: false,
        };
    };
    let new_token = token_requested(d, live);
    if new_token && d.coordinated {
        // One coordinated Restart carries the token and, changed in the same edit, the image.
        if !live.rolled_out {
            return Plan::Wait(
                "Waiting until the last change has rolled out before the coordinated restart"
                    .into(),
            );
        }
        return Plan::Open {
            kind: OperationKind::Restart,
            from: live.applied,
            to: live.applied,
            token: d.token.clone(),
            image: Some(d.image.clone()),
            strict: true,
        };
    }
    let image_changed = live.live_image.as_deref() != Some(d.image.as_str());
    if image_changed || new_token || !live.template_current {
        let kind = if image_changed {
            OperationKind::Upgrade
        } else if new_token {
            OperationKind::Restart
        } else {
            OperationKind::TemplateUpdate
        };
        let token = if new_token {
            d.token.clone()
        } else {
            live.live_token.clone()
        };
        return Plan::Open {
            kind,
            from: live.applied,
            to: live.applied,
            token,
            image: Some(d.image.clone()),
            strict: false,
        };
    }
    if d.replicas > live.applied {
        if d.persistent && !live.observed_current {
            return Plan::Wait(
                "Waiting until the StatefulSet has observed its current spec before adding members"
                    .into(),
            );
        }
        let to = if d.persistent {
            growth_run_end(live.applied, d.replicas, &d.kept_ordinals)
        } else {
            d.replicas
        };
        return Plan::Open {
            kind: OperationKind::Scale,
            from: live.applied,
            to,
            token: None,
            image: None,
            strict: false,
        };
    }
    if d.replicas < live.applied {
        if !live.rolled_out && !live.highest_never_placed {
            return Plan::Wait(format!(
                "Keeping {} members until the last change has rolled out; then one member is removed",
                live.applied
            ));
        }
        return Plan::Open {
            kind: OperationKind::Scale,
            from: live.applied,
            to: live.applied - 1,
            token: None,
            image: None,
            // A never-placed member holds no data: removed without a proof.
            strict: d.retire && !live.highest_never_placed,
        };
    }
    Plan::Settled
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desired(replicas: i32) -> Desired {
        Desired {
            replicas,
            image: "img@sha256:a".into(),
            token: None,
            last_completed_token: None,
            coordinated: false,
            persistent: true,
            kept_ordinals: vec![],
            retire: false,
        }
    }

    fn live(applied: i32) -> LiveView {
        LiveView {
            applied,
            template_current: true,
            live_token: None,
            live_image: Some("img@sha256:a".into()),
            rolled_out: true,
            observed_current: true,
            highest_never_placed: false,
        }
    }

    fn open(kind: OperationKind, from: i32, to: i32) -> (OperationKind, i32, i32) {
        (kind, from, to)
    }

    fn kft(p: Plan) -> (OperationKind, i32, i32) {
        match p {
            Plan::Open { kind, from, to, .. } => (kind, from, to),
            other => panic!("expected an operation, got {other:?}"),
        }
    }

    #[test]
    fn a_missing_workload_is_provisioned_to_the_first_run() {
        let mut d = desired(3);
        assert_eq!(kft(plan(&d, None)), open(OperationKind::Provision, 0, 3));
        d.kept_ordinals = vec![0, 1];
        assert_eq!(
            kft(plan(&d, None)),
            open(OperationKind::Provision, 0, 2),
            "kept disks first, fresh ones next"
        );
        d.persistent = false;
        assert_eq!(
            kft(plan(&d, None)),
            open(OperationKind::Provision, 0, 3),
            "Bucket grows at once"
        );
    }

    #[test]
    fn growth_runs_stop_where_kept_and_fresh_ordinals_meet() {
        assert_eq!(growth_run_end(1, 5, &[1, 2]), 3);
        assert_eq!(growth_run_end(3, 5, &[1, 2]), 5);
        assert_eq!(growth_run_end(1, 5, &[3]), 3);
        let mut d = desired(5);
        d.kept_ordinals = vec![3, 4];
        assert_eq!(
            kft(plan(&d, Some(&live(2)))),
            open(OperationKind::Scale, 2, 3)
        );
    }

    #[test]
    fn contraction_waits_for_rollout_and_removes_one_member_at_a_time() {
        let d = desired(1);
        assert_eq!(
            kft(plan(&d, Some(&live(3)))),
            open(OperationKind::Scale, 3, 2)
        );
        let mut l = live(3);
        l.rolled_out = false;
        assert!(matches!(plan(&d, Some(&l)), Plan::Wait(m) if m.starts_with("Keeping 3 members")));
        l.highest_never_placed = true;
        assert_eq!(
            kft(plan(&d, Some(&l))),
            open(OperationKind::Scale, 3, 2),
            "an unplaceable growth can be undone"
        );
    }

    #[test]
    fn template_changes_come_before_scaling_and_carry_every_difference() {
        let mut d = desired(4);
        d.image = "img@sha256:b".into();
        d.token = Some("t1".into());
        let p = plan(&d, Some(&live(3)));
        assert_eq!(
            p,
            Plan::Open {
                kind: OperationKind::Upgrade,
                from: 3,
                to: 3,
                token: Some("t1".into()),
                image: Some("img@sha256:b".into()),
                strict: false,
            }
        );
        let mut d = desired(3);
        d.token = Some("t1".into());
        assert_eq!(
            kft(plan(&d, Some(&live(3)))),
            open(OperationKind::Restart, 3, 3)
        );
        let mut l = live(3);
        l.template_current = false;
        l.live_token = Some("t0".into());
        let p = plan(&desired(3), Some(&l));
        assert!(
            matches!(p, Plan::Open { kind: OperationKind::TemplateUpdate, token: Some(ref t), .. } if t == "t0"),
            "drift repair keeps the live token: clearing the spec token never rolls"
        );
    }

    #[test]
    fn a_token_already_applied_requests_nothing() {
        let mut d = desired(3);
        d.token = Some("t1".into());
        d.last_completed_token = Some("t1".into());
        assert_eq!(plan(&d, Some(&live(3))), Plan::Settled);
        d.last_completed_token = None;
        let mut l = live(3);
        l.live_token = Some("t1".into());
        assert_eq!(plan(&d, Some(&l)), Plan::Settled);
    }

    #[test]
    fn a_new_token_with_coordinated_downtime_opens_one_strict_restart_carrying_a_new_image_too() {
        let mut d = desired(3);
        d.token = Some("t1".into());
        d.coordinated = true;
        d.image = "img@sha256:b".into();
        assert_eq!(
            plan(&d, Some(&live(3))),
            Plan::Open {
                kind: OperationKind::Restart,
                from: 3,
                to: 3,
                token: Some("t1".into()),
                image: Some("img@sha256:b".into()),
                strict: true,
            }
        );
        let mut l = live(3);
        l.rolled_out = false;
        assert!(matches!(plan(&d, Some(&l)), Plan::Wait(m) if m.contains("coordinated")));
        // A lone image change under allowCoordinatedDowntime rolls (docs/design.md "Planning
        // order").
        d.token = None;
        assert!(matches!(
            plan(&d, Some(&live(3))),
            Plan::Open {
                kind: OperationKind::Upgrade,
                strict: false,
                ..
            }
        ));
    }

    #[test]
    fn retire_contractions_are_strict_unless_the_member_was_never_placed() {
        let mut d = desired(2);
        d.retire = true;
        assert!(matches!(
            plan(&d, Some(&live(3))),
            Plan::Open {
                kind: OperationKind::Scale,
                from: 3,
                to: 2,
                strict: true,
                ..
            }
        ));
        let mut l = live(3);
        l.rolled_out = false;
        l.highest_never_placed = true;
        assert!(matches!(
            plan(&d, Some(&l)),
            Plan::Open {
                kind: OperationKind::Scale,
                strict: false,
                ..
            }
        ));
        d.retire = false;
        assert!(matches!(
            plan(&d, Some(&live(3))),
            Plan::Open { strict: false, .. }
        ));
    }

    #[test]
    fn persistent_growth_waits_for_the_statefulset_to_observe_its_spec() {
        let mut l = live(2);
        l.observed_current = false;
        assert!(matches!(plan(&desired(3), Some(&l)), Plan::Wait(_)));
    }
}
