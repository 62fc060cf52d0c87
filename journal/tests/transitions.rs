//! Entry types, operation phases and the legal transitions.
mod common;

use common::*;
use journal::*;

// ---- each entry type ----

#[test]
fn intent_opens_an_operation_in_phase_intent() {
    let mut w = Writer::new();
    let e = w.push(op(1), intent_body(OperationKind::Scale, 3, 2));
    assert_eq!(e.seq(), 1);
    assert_eq!(e.prev(), Hash::ZERO);
    assert_eq!(w.state(op(1)), OperationState::Open(Phase::Intent));
    assert_eq!(w.journal.fold().current().unwrap().id(), op(1));
}

#[test]
fn issued_moves_the_operation_to_phase_issued() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 2));
    w.push(op(1), issued(op(1), "replicas"));
    assert_eq!(w.phase(op(1)), Phase::Issued);
    let o = w.journal.fold().operation(op(1)).unwrap();
    assert!(o.has_effect(&Step::Replicas));
    assert_eq!(o.current_step(), Some(Step::Replicas));
}

#[test]
fn proof_captured_counts_as_issued() {
    let mut w = Writer::new();
    let mut i = intent(OperationKind::Scale, 3, 2);
    i.targets = vec![target("beta-2")];
    w.push(op(1), EntryBody::Intent(i));
    w.push(op(1), proof(op(1), "beta-2"));
    assert_eq!(w.phase(op(1)), Phase::Issued);
    let o = w.journal.fold().operation(op(1)).unwrap();
    assert_eq!(o.proof_for("beta-2").unwrap().phase, "data_safe");
    assert_eq!(o.current_step(), Some(Step::Proof("beta-2".into())));
}

#[test]
fn claim_retired_counts_as_issued() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Delete, 3, 0));
    w.push(op(1), retired("data-beta-0"));
    assert_eq!(w.phase(op(1)), Phase::Issued);
    assert!(w
        .journal
        .fold()
        .operation(op(1))
        .unwrap()
        .has_effect(&Step::Retire("data-beta-0".into())));
}

#[test]
fn observed_moves_the_operation_to_phase_observed() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 4));
    w.push(op(1), issued(op(1), "replicas"));
    w.push(op(1), observed());
    assert_eq!(w.phase(op(1)), Phase::Observed);
}

#[test]
fn completed_closes_the_operation_with_its_outcome() {
    let mut w = Writer::new();
    w.scale(op(1), 3, 4);
    assert_eq!(
        w.state(op(1)),
        OperationState::Closed(Outcome::Completed(CompletedOutcome::Succeeded))
    );
    assert!(w.journal.fold().current().is_none());
}

#[test]
fn completed_without_observed_is_allowed_after_issue() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::MemberReplacement, 3, 3));
    w.push(op(1), issued(op(1), "hold"));
    w.push(op(1), issued(op(1), "release"));
    w.push(op(1), completed(CompletedOutcome::MemberChanged));
    assert_eq!(
        w.state(op(1)),
        OperationState::Closed(Outcome::Completed(CompletedOutcome::MemberChanged))
    );
}

#[test]
fn canceled_before_issue_closes_the_operation() {
    for reason in [
        CancelReason::CanceledBeforeIssue,
        CancelReason::DeadlineBeforeIssue,
        CancelReason::RequestChanged,
        CancelReason::PredecessorChanged,
    ] {
        let mut w = Writer::new();
        w.push(op(1), intent_body(OperationKind::Scale, 3, 2));
        w.push(op(1), canceled(reason));
        assert_eq!(
            w.state(op(1)),
            OperationState::Closed(Outcome::Canceled(reason))
        );
        assert_eq!(
            Outcome::Canceled(reason).as_str(),
            reason.as_str(),
            "recentOperations shows the reason"
        );
    }
}

#[test]
fn blocked_puts_the_operation_in_phase_blocked() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 2));
    w.push(op(1), issued(op(1), "replicas"));
    w.push(op(1), blocked("claim UID changed"));
    assert_eq!(w.phase(op(1)), Phase::Blocked);
    assert_eq!(
        w.journal
            .fold()
            .operation(op(1))
            .unwrap()
            .blocked()
            .unwrap()
            .1,
        "claim UID changed"
    );
}

#[test]
fn blocked_is_allowed_before_anything_is_issued() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 2));
    w.push(op(1), blocked("runtime generation changed"));
    assert_eq!(w.phase(op(1)), Phase::Blocked);
}

#[test]
fn stalled_after_issue_puts_the_operation_in_phase_stalled() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Restart, 3, 3));
    w.push(op(1), issued(op(1), "template"));
    w.push(op(1), stalled());
    assert_eq!(w.phase(op(1)), Phase::Stalled);
}

#[test]
fn a_stalled_operation_still_completes_when_its_target_is_reached() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Restart, 3, 3));
    w.push(op(1), issued(op(1), "template"));
    w.push(op(1), stalled());
    w.push(op(1), observed());
    assert_eq!(w.phase(op(1)), Phase::Observed);
    w.push(op(1), completed(CompletedOutcome::Succeeded));
    assert!(!w.journal.fold().operation(op(1)).unwrap().is_open());
}

#[test]
fn abandoned_closes_the_operation_from_any_phase() {
    let setups: Vec<Vec<EntryBody>> = vec![
        vec![],
        vec![issued(op(1), "replicas")],
        vec![issued(op(1), "replicas"), observed()],
        vec![issued(op(1), "replicas"), stalled()],
        vec![blocked("needs a person")],
    ];
    for setup in setups {
        let mut w = Writer::new();
        w.push(op(1), intent_body(OperationKind::Scale, 3, 2));
        for b in setup {
            w.push(op(1), b);
        }
        w.push(op(1), abandoned());
        assert_eq!(w.state(op(1)), OperationState::Closed(Outcome::Abandoned));
    }
}

#[test]
fn retried_clears_a_block() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 2));
    w.push(op(1), issued(op(1), "replicas"));
    w.push(op(1), blocked("removal failed"));
    w.push(op(1), retried());
    assert_eq!(w.phase(op(1)), Phase::Issued);
    assert_eq!(
        w.journal.fold().operation(op(1)).unwrap().retries().len(),
        1
    );
}

#[test]
fn retried_keeps_a_stall_because_the_deadline_did_pass() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Restart, 3, 3));
    w.push(op(1), issued(op(1), "template"));
    w.push(op(1), stalled());
    w.push(op(1), retried());
    assert_eq!(w.phase(op(1)), Phase::Stalled);
}

#[test]
fn recovered_for_an_unknown_operation_is_a_foreign_record() {
    let mut w = Writer::new();
    w.push(op(9), recovered(op(9), "template"));
    let fold = w.journal.fold();
    assert!(fold.operation(op(9)).is_none());
    assert_eq!(fold.foreign_records().len(), 1);
    assert_eq!(fold.foreign_records()[0].effects()[0].step, Step::Template);
    assert!(
        fold.current().is_none(),
        "a foreign record is not an open operation"
    );
    w.push(op(1), intent_body(OperationKind::Scale, 3, 4));
}

#[test]
fn recovered_for_a_held_operation_counts_as_issued() {
    let mut w = Writer::new();
    let mut i = intent(OperationKind::MemberReplacement, 3, 3);
    i.reason = Some(ADOPTED_HOLD_REASON.into());
    w.push(op(1), EntryBody::Intent(i));
    for step in ["hold", "pod", "commit"] {
        w.push(op(1), recovered(op(1), step));
    }
    assert_eq!(w.phase(op(1)), Phase::Issued);
    let effects = w
        .journal
        .fold()
        .operation(op(1))
        .unwrap()
        .effects()
        .to_vec();
    assert!(effects.iter().all(|e| e.source == EffectSource::Recovered));
}

#[test]
fn a_replayed_issue_is_recorded_as_replayed() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 4));
    let mut body = issued(op(1), "replicas");
    if let EntryBody::Issued(i) = &mut body {
        i.replayed = true;
        i.result_resource_version = None;
    }
    w.push(op(1), body);
    assert_eq!(
        w.journal.fold().operation(op(1)).unwrap().effects()[0].source,
        EffectSource::Issued { replayed: true }
    );
}

// ---- refused transitions ----

#[test]
fn cancel_after_issue_is_rejected() {
    let firsts = vec![
        issued(op(1), "replicas"),
        proof(op(1), "beta-2"),
        retired("data-beta-2"),
        recovered(op(1), "replicas"),
    ];
    for first in firsts {
        let mut w = Writer::new();
        let mut i = intent(OperationKind::Scale, 3, 2);
        i.targets = vec![target("beta-2")];
        w.push(op(1), EntryBody::Intent(i));
        let issued_seq = w.push(op(1), first).seq();
        assert_eq!(
            w.refused(op(1), canceled(CancelReason::RequestChanged)),
            TransitionError::CancelAfterIssue {
                op: op(1),
                issued_seq
            }
        );
    }
}

#[test]
fn nothing_follows_a_terminal_entry() {
    let terminals = vec![
        completed(CompletedOutcome::Succeeded),
        abandoned(),
        canceled(CancelReason::RequestChanged),
    ];
    for terminal in terminals {
        let mut w = Writer::new();
        w.push(op(1), intent_body(OperationKind::Scale, 3, 2));
        if !matches!(terminal, EntryBody::Canceled(_)) {
            w.push(op(1), issued(op(1), "replicas"));
        }
        let closed_seq = w.push(op(1), terminal).seq();
        for next in [
            issued(op(1), "replicas"),
            observed(),
            completed(CompletedOutcome::Succeeded),
            abandoned(),
            retried(),
            blocked("x"),
        ] {
            let e = w.refused(op(1), next);
            assert!(
                matches!(e, TransitionError::OperationClosed { closed_seq: s, .. } if s == closed_seq),
                "{e}"
            );
        }
    }
}

#[test]
fn an_unrecorded_effect_of_a_closed_operation_may_be_recovered_once() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Restart, 3, 3));
    w.push(op(1), abandoned());
    w.push(op(1), recovered(op(1), "template"));
    assert_eq!(w.state(op(1)), OperationState::Closed(Outcome::Abandoned));
    assert_eq!(
        w.journal.predecessor_effect(),
        Some(Effect::new(op(1), Step::Template))
    );
    assert!(matches!(
        w.refused(op(1), recovered(op(1), "template")),
        TransitionError::DuplicateEffect { .. }
    ));
    assert!(matches!(
        w.refused(op(1), recovered(op(1), "replicas")),
        TransitionError::StepNotAllowed { .. }
    ));
    assert!(matches!(
        w.refused(op(1), issued(op(1), "template")),
        TransitionError::OperationClosed { .. }
    ));
}

#[test]
fn a_second_intent_while_one_is_open_is_rejected() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 2));
    assert_eq!(
        w.refused(op(2), intent_body(OperationKind::Restart, 3, 3)),
        TransitionError::OperationAlreadyOpen {
            op: op(2),
            open: op(1),
            kind: OperationKind::Scale
        }
    );
    // Also a replacement, which does not write the workload: one operation at a time.
    let e = w.refused(op(3), intent_body(OperationKind::MemberReplacement, 3, 3));
    assert!(matches!(e, TransitionError::OperationAlreadyOpen { .. }));
}

#[test]
fn an_adoption_may_open_while_another_operation_is_open() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 4));
    w.push(op(1), issued(op(1), "replicas"));
    let mut adopt = intent(OperationKind::MemberReplacement, 4, 4);
    adopt.reason = Some(ADOPTED_HOLD_REASON.into());
    w.push(op(2), EntryBody::Intent(adopt));
    let open: Vec<OperationId> = w.journal.fold().open_operations().map(|o| o.id()).collect();
    assert_eq!(open, vec![op(1), op(2)]);
    assert_eq!(w.journal.fold().current().unwrap().id(), op(1));
}

#[test]
fn a_new_intent_is_accepted_once_the_open_operation_closed() {
    let mut w = Writer::new();
    w.scale(op(1), 3, 4);
    w.push(op(2), intent_body(OperationKind::Scale, 4, 3));
}

#[test]
fn reusing_an_operation_id_is_rejected() {
    let mut w = Writer::new();
    w.scale(op(1), 3, 4);
    assert_eq!(
        w.refused(op(1), intent_body(OperationKind::Scale, 4, 5)),
        TransitionError::DuplicateOperation { op: op(1) }
    );
    w.push(op(7), recovered(op(7), "template"));
    assert_eq!(
        w.refused(op(7), intent_body(OperationKind::Scale, 4, 5)),
        TransitionError::DuplicateOperation { op: op(7) }
    );
}

#[test]
fn an_entry_for_an_unknown_operation_is_rejected() {
    let mut w = Writer::new();
    assert_eq!(
        w.refused(op(5), issued(op(5), "replicas")),
        TransitionError::UnknownOperation {
            op: op(5),
            entry_type: EntryType::Issued
        }
    );
    assert!(matches!(
        w.refused(op(5), abandoned()),
        TransitionError::UnknownOperation { .. }
    ));
}

#[test]
fn issuing_the_same_step_twice_is_rejected() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 4));
    let first = w.push(op(1), issued(op(1), "replicas")).seq();
    assert_eq!(
        w.refused(op(1), issued(op(1), "replicas")),
        TransitionError::DuplicateEffect {
            op: op(1),
            step: Step::Replicas,
            first_seq: first
        }
    );
    // A replayed issue is the same effect: also refused.
    let mut replay = issued(op(1), "replicas");
    if let EntryBody::Issued(i) = &mut replay {
        i.replayed = true;
    }
    assert!(matches!(
        w.refused(op(1), replay),
        TransitionError::DuplicateEffect { .. }
    ));
    assert!(matches!(
        w.refused(op(1), recovered(op(1), "replicas")),
        TransitionError::DuplicateEffect { .. }
    ));
}

#[test]
fn a_retried_proof_request_may_be_issued_again() {
    let mut w = Writer::new();
    let mut i = intent(OperationKind::Scale, 3, 2);
    i.targets = vec![target("beta-2")];
    w.push(op(1), EntryBody::Intent(i));
    w.push(op(1), issued(op(1), "proof/beta-2"));
    w.push(op(1), blocked("removal failed"));
    w.push(op(1), retried());
    w.push(op(1), issued(op(1), "restart/beta-2"));
    w.push(op(1), issued(op(1), "proof/beta-2"));
    w.push(op(1), proof(op(1), "beta-2"));
    assert!(matches!(
        w.refused(op(1), issued(op(1), "proof/beta-2")),
        TransitionError::DuplicateEffect { .. }
    ));
}

#[test]
fn a_workload_write_is_never_recorded_twice_even_after_a_retry() {
    let mut w = Writer::new();
    let mut i = intent(OperationKind::Restart, 2, 2);
    i.targets = vec![target("beta-0")];
    w.push(op(1), EntryBody::Intent(i));
    w.push(op(1), issued(op(1), "proof/beta-0"));
    w.push(op(1), proof(op(1), "beta-0"));
    w.push(op(1), issued(op(1), "stop"));
    w.push(op(1), blocked("resume guard failed"));
    w.push(op(1), retried());
    let o = w.journal.fold().operation(op(1)).unwrap();
    assert!(o.has_effect(&Step::Stop));
    assert!(!o.may_record(&Step::Stop));
    assert!(o.retried_since(&Step::Proof("beta-0".into())));
    assert!(o.may_record(&Step::Proof("beta-0".into())));
    assert!(matches!(
        w.refused(op(1), issued(op(1), "stop")),
        TransitionError::DuplicateEffect { .. }
    ));
    w.push(op(1), issued(op(1), "resume"));
}

#[test]
fn retiring_a_claim_twice_is_rejected_even_after_a_retry() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Delete, 3, 0));
    let first = w.push(op(1), retired("data-beta-0")).seq();
    w.push(op(1), blocked("prerequisite not owned"));
    w.push(op(1), retried());
    assert_eq!(
        w.refused(op(1), retired("data-beta-0")),
        TransitionError::ClaimAlreadyRetired {
            op: op(1),
            claim: "data-beta-0".into(),
            first_seq: first
        }
    );
}

#[test]
fn a_second_proof_for_a_member_needs_a_retry() {
    let mut w = Writer::new();
    let mut i = intent(OperationKind::Restart, 2, 2);
    i.targets = vec![target("beta-0"), target("beta-1")];
    w.push(op(1), EntryBody::Intent(i));
    let first = w.push(op(1), proof(op(1), "beta-0")).seq();
    w.push(op(1), proof(op(1), "beta-1"));
    assert_eq!(
        w.refused(op(1), proof(op(1), "beta-0")),
        TransitionError::DuplicateProof {
            op: op(1),
            member: "beta-0".into(),
            first_seq: first
        }
    );
    w.push(op(1), blocked("generation changed on beta-0"));
    w.push(op(1), retried());
    w.push(op(1), proof(op(1), "beta-0"));
}

#[test]
fn a_proof_for_a_member_that_is_not_a_target_is_rejected() {
    let mut w = Writer::new();
    let mut i = intent(OperationKind::Scale, 3, 2);
    i.targets = vec![target("beta-2")];
    w.push(op(1), EntryBody::Intent(i));
    assert_eq!(
        w.refused(op(1), proof(op(1), "beta-1")),
        TransitionError::UnknownTarget {
            op: op(1),
            member: "beta-1".into()
        }
    );
}

#[test]
fn a_proof_naming_another_operation_is_rejected() {
    let mut w = Writer::new();
    let mut i = intent(OperationKind::Scale, 3, 2);
    i.targets = vec![target("beta-2")];
    w.push(op(1), EntryBody::Intent(i));
    assert!(matches!(
        w.refused(op(1), proof(op(2), "beta-2")),
        TransitionError::ProofForOtherOperation { .. }
    ));
}

#[test]
fn observed_before_anything_was_issued_is_rejected() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 4));
    assert_eq!(
        w.refused(op(1), observed()),
        TransitionError::NotYetIssued {
            op: op(1),
            entry_type: EntryType::Observed
        }
    );
    assert!(matches!(
        w.refused(op(1), completed(CompletedOutcome::Succeeded)),
        TransitionError::NotYetIssued { .. }
    ));
}

#[test]
fn observing_twice_is_rejected() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 4));
    w.push(op(1), issued(op(1), "replicas"));
    let s = w.push(op(1), observed()).seq();
    assert_eq!(
        w.refused(op(1), observed()),
        TransitionError::AlreadyObserved {
            op: op(1),
            observed_seq: s
        }
    );
}

#[test]
fn an_effect_after_observed_is_rejected() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Restart, 3, 3));
    w.push(op(1), issued(op(1), "template"));
    let s = w.push(op(1), observed()).seq();
    assert_eq!(
        w.refused(op(1), issued(op(1), "stop")),
        TransitionError::EffectAfterObserved {
            op: op(1),
            entry_type: EntryType::Issued,
            observed_seq: s
        }
    );
}

#[test]
fn a_stall_before_issue_is_rejected() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 4));
    assert!(matches!(
        w.refused(op(1), stalled()),
        TransitionError::NotYetIssued {
            entry_type: EntryType::Stalled,
            ..
        }
    ));
}

#[test]
fn stalling_twice_is_rejected() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 4));
    w.push(op(1), issued(op(1), "replicas"));
    let s = w.push(op(1), stalled()).seq();
    assert_eq!(
        w.refused(op(1), stalled()),
        TransitionError::AlreadyStalled {
            op: op(1),
            stalled_seq: s
        }
    );
}

#[test]
fn a_blocked_operation_accepts_only_retry_abandon_or_stall() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 4));
    w.push(op(1), issued(op(1), "replicas"));
    let s = w
        .push(op(1), blocked("marker names another operation"))
        .seq();
    for body in [
        issued(op(1), "replicas"),
        observed(),
        completed(CompletedOutcome::Succeeded),
        blocked("again"),
        recovered(op(1), "replicas"),
    ] {
        assert!(matches!(
            w.refused(op(1), body),
            TransitionError::OperationBlocked { blocked_seq, .. } if blocked_seq == s
        ));
    }
    w.push(op(1), stalled());
    assert_eq!(w.phase(op(1)), Phase::Blocked);
}

#[test]
fn canceling_a_blocked_operation_is_rejected() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 4));
    w.push(op(1), blocked("generation changed"));
    assert!(matches!(
        w.refused(op(1), canceled(CancelReason::CanceledBeforeIssue)),
        TransitionError::OperationBlocked { .. }
    ));
}

#[test]
fn retry_of_an_operation_that_is_neither_blocked_nor_stalled_is_rejected() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 4));
    assert_eq!(
        w.refused(op(1), retried()),
        TransitionError::RetryNotApplicable {
            op: op(1),
            phase: Phase::Intent
        }
    );
    w.push(op(1), issued(op(1), "replicas"));
    assert_eq!(
        w.refused(op(1), retried()),
        TransitionError::RetryNotApplicable {
            op: op(1),
            phase: Phase::Issued
        }
    );
}

#[test]
fn a_step_of_another_kind_is_rejected() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Upgrade, 3, 3));
    assert_eq!(
        w.refused(op(1), issued(op(1), "replicas")),
        TransitionError::StepNotAllowed {
            op: op(1),
            kind: OperationKind::Upgrade,
            step: Step::Replicas
        }
    );
    assert!(matches!(
        w.refused(op(1), retired("data-x")),
        TransitionError::StepNotAllowed { .. }
    ));
}

#[test]
fn an_effect_naming_another_operation_is_rejected() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 4));
    let mut body = issued(op(1), "replicas");
    if let EntryBody::Issued(i) = &mut body {
        i.effect = Effect::new(op(2), Step::Replicas);
    }
    assert!(matches!(
        w.refused(op(1), body),
        TransitionError::EffectMismatch { .. }
    ));
    let mut body = issued(op(1), "replicas");
    if let EntryBody::Issued(i) = &mut body {
        i.effect = Effect::new(op(1), Step::Template);
    }
    assert!(matches!(
        w.refused(op(1), body),
        TransitionError::EffectMismatch { .. }
    ));
    assert!(matches!(
        w.refused(op(1), recovered(op(2), "replicas")),
        TransitionError::EffectMismatch { .. }
    ));
}

#[test]
fn an_intent_listing_a_target_twice_is_rejected() {
    let mut w = Writer::new();
    let mut i = intent(OperationKind::Restart, 2, 2);
    i.targets = vec![target("beta-0"), target("beta-0")];
    assert!(matches!(
        w.refused(op(1), EntryBody::Intent(i)),
        TransitionError::InvalidIntent { .. }
    ));
    let mut i = intent(OperationKind::Scale, 2, 3);
    i.predecessor_effect = Some(Effect::new(op(1), Step::Replicas));
    assert!(matches!(
        w.refused(op(1), EntryBody::Intent(i)),
        TransitionError::InvalidIntent { .. }
    ));
}

#[test]
fn a_foreign_effect_is_recorded_only_once() {
    let mut w = Writer::new();
    let first = w.push(op(9), recovered(op(9), "template")).seq();
    assert_eq!(
        w.refused(op(9), recovered(op(9), "template")),
        TransitionError::DuplicateEffect {
            op: op(9),
            step: Step::Template,
            first_seq: first
        }
    );
    w.push(op(9), recovered(op(9), "stop"));
}

#[test]
fn a_refused_entry_leaves_the_journal_unchanged() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 4));
    let before = w.journal.document().clone();
    let _ = w.refused(op(1), observed());
    assert_eq!(w.journal.document(), &before);
}

// ---- helpers over the whole journal ----

#[test]
fn the_predecessor_is_the_last_workload_effect() {
    let mut w = Writer::new();
    assert_eq!(w.journal.predecessor_effect(), None);
    w.push(op(1), intent_body(OperationKind::Provision, 0, 3));
    assert_eq!(w.journal.predecessor_effect(), None);
    w.push(op(1), issued(op(1), "create"));
    w.push(op(1), observed());
    w.push(op(1), completed(CompletedOutcome::Succeeded));
    let create = Effect::new(op(1), Step::Create);
    assert_eq!(w.journal.predecessor_effect(), Some(create.clone()));
    // A contraction with Retire: proof and retire steps do not touch the workload marker.
    let mut i = intent(OperationKind::Scale, 3, 2);
    i.targets = vec![target("beta-2")];
    i.predecessor_effect = Some(create.clone());
    w.push(op(2), EntryBody::Intent(i));
    w.push(op(2), issued(op(2), "proof/beta-2"));
    w.push(op(2), proof(op(2), "beta-2"));
    assert_eq!(w.journal.predecessor_effect(), Some(create));
    w.push(op(2), issued(op(2), "replicas"));
    w.push(op(2), retired("data-beta-2"));
    assert_eq!(
        w.journal.predecessor_effect(),
        Some(Effect::new(op(2), Step::Replicas))
    );
}

#[test]
fn a_recovered_workload_effect_becomes_the_predecessor() {
    let mut w = Writer::new();
    w.scale(op(1), 3, 4);
    w.push(op(9), recovered(op(9), "template"));
    assert_eq!(
        w.journal.predecessor_effect(),
        Some(Effect::new(op(9), Step::Template))
    );
}

#[test]
fn the_predecessor_survives_compaction_through_the_intents() {
    let mut w = Writer::with_budget(Budget::new(32 * 1024).unwrap());
    w.scale(op(1), 1, 2);
    let last_effect = Effect::new(op(1), Step::Replicas);
    // Many replacements: no workload writes, each Intent records the predecessor.
    for n in 2..80 {
        let mut i = intent(OperationKind::MemberReplacement, 2, 2);
        i.predecessor_effect = Some(last_effect.clone());
        i.targets = vec![target("beta-1")];
        w.push(op(n), EntryBody::Intent(i));
        w.push(op(n), issued(op(n), "hold"));
        w.push(op(n), issued(op(n), "release"));
        w.push(op(n), completed(CompletedOutcome::MemberChanged));
    }
    // The old replacements were compacted out from behind op 1, which stays: it is the
    // last completed Scale and holds the predecessor effect.
    assert!(w.journal.fold().operation(op(2)).is_none());
    assert!(!w.journal.document().holes().is_empty());
    assert!(w.journal.fold().operation(op(1)).is_some());
    assert_eq!(w.journal.predecessor_effect(), Some(last_effect));
}

#[test]
fn the_last_restart_token_is_from_the_newest_completed_operation_that_carried_one() {
    let mut w = Writer::new();
    assert_eq!(w.journal.last_restart_token(), None);
    let mut i = intent(OperationKind::Restart, 3, 3);
    i.token = Some("t1".into());
    w.push(op(1), EntryBody::Intent(i));
    w.push(op(1), issued(op(1), "template"));
    assert_eq!(w.journal.last_restart_token(), None, "not completed yet");
    w.push(op(1), observed());
    w.push(op(1), completed(CompletedOutcome::Succeeded));
    assert_eq!(w.journal.last_restart_token(), Some("t1"));
    w.scale(op(2), 3, 4);
    assert_eq!(w.journal.last_restart_token(), Some("t1"));
    // A canceled restart does not count.
    let mut i = intent(OperationKind::Restart, 4, 4);
    i.token = Some("t2".into());
    w.push(op(3), EntryBody::Intent(i));
    w.push(op(3), canceled(CancelReason::CanceledBeforeIssue));
    assert_eq!(w.journal.last_restart_token(), Some("t1"));
    // An upgrade written together with a new token counts.
    let mut i = intent(OperationKind::Upgrade, 4, 4);
    i.token = Some("t3".into());
    i.image = Some("celld@sha256:abc".into());
    w.push(op(4), EntryBody::Intent(i));
    w.push(op(4), issued(op(4), "template"));
    w.push(op(4), observed());
    w.push(op(4), completed(CompletedOutcome::Succeeded));
    assert_eq!(w.journal.last_restart_token(), Some("t3"));
}

#[test]
fn journals_reload_to_the_same_fold() {
    let mut w = Writer::new();
    w.scale(op(1), 3, 4);
    w.push(op(2), intent_body(OperationKind::Restart, 4, 4));
    w.push(op(2), issued(op(2), "template"));
    let text = w.journal.document().encode();
    let back = Journal::load(Some(&text), FLEET).unwrap();
    assert_eq!(back.document(), w.journal.document());
    assert_eq!(
        back.fold().current().unwrap().phase(),
        w.journal.fold().current().unwrap().phase()
    );
}

#[test]
fn entry_types_publish_their_events() {
    assert_eq!(EntryType::Intent.event_reason(), "OperationIntent");
    assert_eq!(EntryType::Recovered.event_reason(), "OperationRecovered");
    assert!(EntryType::Blocked.event_is_warning());
    assert!(!EntryType::Issued.event_is_warning());
}
