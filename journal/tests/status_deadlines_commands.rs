//! Status projection, deadlines and person commands.
mod common;

use chrono::Duration;
use common::*;
use journal::deadline::due;
use journal::*;

// ---- projection ----

#[test]
fn the_summary_shows_from_and_to_when_they_differ() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 2));
    w.push(op(1), issued(op(1), "replicas"));
    let p = w.journal.projection(Budget::default());
    let c = p.current_operation.unwrap();
    assert_eq!(c.summary, "Scale/Issued 3->2");
    assert_eq!(c.step, Some(Step::Replicas));
    assert_eq!(c.from, 3);
    assert_eq!(c.to, 2);
    assert_eq!(c.blocker, "");
    assert_eq!(c.started_at, t(1));
    assert_eq!(c.deadline, t(30));
}

#[test]
fn the_summary_shows_the_member_when_from_equals_to() {
    let mut w = Writer::new();
    let mut i = intent(OperationKind::MemberReplacement, 3, 3);
    i.targets = vec![target("beta-1")];
    w.push(op(1), EntryBody::Intent(i));
    w.push(op(1), issued(op(1), "hold"));
    let c = w
        .journal
        .projection(Budget::default())
        .current_operation
        .unwrap();
    assert_eq!(c.summary, "MemberReplacement/Issued beta-1");
    assert_eq!(c.member.as_deref(), Some("beta-1"));
}

#[test]
fn the_summary_is_kind_and_phase_alone_without_change_or_single_member() {
    let mut w = Writer::new();
    let mut i = intent(OperationKind::Restart, 3, 3);
    i.targets = vec![target("beta-0"), target("beta-1"), target("beta-2")];
    w.push(op(1), EntryBody::Intent(i));
    w.push(op(1), issued(op(1), "template"));
    w.push(op(1), stalled());
    let c = w
        .journal
        .projection(Budget::default())
        .current_operation
        .unwrap();
    assert_eq!(c.summary, "Restart/Stalled");
    assert_eq!(c.member, None);
    assert_eq!(c.blocker, "deadline 2026-11-29T10:30:00Z passed");
}

#[test]
fn a_blocked_operation_shows_its_blocker() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 2));
    w.push(op(1), issued(op(1), "replicas"));
    w.push(op(1), blocked("claim data-beta-2 now has UID x"));
    let c = w
        .journal
        .projection(Budget::default())
        .current_operation
        .unwrap();
    assert_eq!(c.phase, Phase::Blocked);
    assert_eq!(c.blocker, "claim data-beta-2 now has UID x");
    assert_eq!(c.summary, "Scale/Blocked 3->2");
}

#[test]
fn recent_operations_are_the_five_newest_finished_newest_first() {
    let mut w = Writer::new();
    for n in 1..=6 {
        w.scale(op(n), n as i32, n as i32 + 1);
    }
    w.push(op(7), intent_body(OperationKind::Scale, 7, 8));
    w.push(op(7), canceled(CancelReason::RequestChanged));
    w.push(op(8), intent_body(OperationKind::Scale, 7, 8));
    let p = w.journal.projection(Budget::default());
    let ids: Vec<OperationId> = p.recent_operations.iter().map(|r| r.id).collect();
    assert_eq!(ids, vec![op(7), op(6), op(5), op(4), op(3)]);
    assert_eq!(p.recent_operations[0].outcome.as_str(), "RequestChanged");
    assert_eq!(p.recent_operations[1].outcome.as_str(), "Succeeded");
    assert_eq!(p.current_operation.unwrap().id, op(8));
    assert_eq!(p.open_operations, 1);
}

#[test]
fn the_journal_status_describes_the_annotation() {
    let mut w = Writer::new();
    w.scale(op(1), 3, 4);
    let p = w.journal.projection(Budget::default());
    let doc = w.journal.document();
    assert_eq!(p.journal.seq, 4);
    assert_eq!(p.journal.head_hash, doc.head().to_hex());
    assert_eq!(p.journal.bytes as usize, doc.encode().len());
    assert_eq!(p.journal.compacted_through, 0);
    assert!(!p.size.warning());
    assert_eq!(p.current_operation, None);
}

#[test]
fn stalled_operations_are_counted_for_the_gauge() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 4));
    w.push(op(1), issued(op(1), "replicas"));
    assert_eq!(
        w.journal.projection(Budget::default()).stalled_operations,
        0
    );
    w.push(op(1), stalled());
    assert_eq!(
        w.journal.projection(Budget::default()).stalled_operations,
        1
    );
}

// ---- deadlines ----

#[test]
fn the_default_deadline_is_thirty_minutes() {
    assert_eq!(default_deadline(t(0), None), t(30));
}

#[test]
fn a_coordinated_restart_adds_five_minutes_per_member() {
    assert_eq!(default_deadline(t(0), Some(3)), t(45));
    assert_eq!(default_deadline(t(0), Some(0)), t(30));
}

#[test]
fn an_intent_past_its_deadline_is_due_for_cancel() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 4));
    assert!(w.journal.deadlines_due(t(29)).is_empty());
    let due = w.journal.deadlines_due(t(30));
    assert_eq!(due, vec![DeadlineAction::Cancel { op: op(1) }]);
    // The action's entry is accepted.
    w.push(op(1), due[0].body());
    assert_eq!(
        w.state(op(1)),
        OperationState::Closed(Outcome::Canceled(CancelReason::DeadlineBeforeIssue))
    );
}

#[test]
fn an_issued_operation_past_its_deadline_is_due_for_one_stall() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 4));
    w.push(op(1), issued(op(1), "replicas"));
    let due = w.journal.deadlines_due(t(31));
    assert_eq!(
        due,
        vec![DeadlineAction::Stall {
            op: op(1),
            deadline: t(30)
        }]
    );
    w.push(op(1), due[0].body());
    assert!(
        w.journal.deadlines_due(t(90)).is_empty(),
        "only one Stalled entry per operation"
    );
}

#[test]
fn an_observed_operation_is_not_stalled() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 4));
    w.push(op(1), issued(op(1), "replicas"));
    w.push(op(1), observed());
    assert!(w.journal.deadlines_due(t(60)).is_empty());
}

#[test]
fn an_operation_blocked_before_issue_is_not_canceled_by_its_deadline() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 4));
    w.push(op(1), blocked("generation changed"));
    assert!(w.journal.deadlines_due(t(60)).is_empty());
}

#[test]
fn a_blocked_operation_after_issue_still_stalls() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 4));
    w.push(op(1), issued(op(1), "replicas"));
    w.push(op(1), blocked("marker changed"));
    let due = w.journal.deadlines_due(t(60));
    assert!(matches!(due.as_slice(), [DeadlineAction::Stall { .. }]));
    w.push(op(1), due[0].body());
}

#[test]
fn closed_operations_have_no_deadline() {
    let mut w = Writer::new();
    w.scale(op(1), 3, 4);
    let o = w.journal.fold().operation(op(1)).unwrap();
    assert_eq!(due(o, t(1000)), None);
    assert_eq!(w.journal.next_deadline(t(0)), None);
}

#[test]
fn the_next_deadline_is_the_earliest_pending_one() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 4));
    assert_eq!(w.journal.next_deadline(t(5)), Some(t(30)));
    assert_eq!(
        w.journal.next_deadline(t(30)),
        None,
        "already due, not in the future"
    );
    assert_eq!(
        w.journal.next_deadline(t(5) - Duration::days(1)),
        Some(t(30))
    );
}

// ---- commands ----

#[test]
fn abandon_and_retry_commands_parse() {
    let id = op(3);
    assert_eq!(
        parse_command(&format!("abandon {id}")).unwrap(),
        Command {
            action: CommandAction::Abandon,
            op: id
        }
    );
    assert_eq!(
        parse_command(&format!("  retry\t{}\n", id.to_string().to_uppercase())).unwrap(),
        Command {
            action: CommandAction::Retry,
            op: id
        }
    );
    assert_eq!(
        parse_command(&format!("retry {id}")).unwrap().to_string(),
        format!("retry {id}")
    );
}

#[test]
fn malformed_commands_are_rejected_with_a_reason() {
    let id = op(3).to_string();
    type Check = fn(&CommandError) -> bool;
    let cases: Vec<(String, Check)> = vec![
        ("".into(), |e| matches!(e, CommandError::Empty)),
        ("  \n".into(), |e| matches!(e, CommandError::Empty)),
        (
            format!("delete {id}"),
            |e| matches!(e, CommandError::UnknownVerb { verb } if verb == "delete"),
        ),
        (format!("Abandon {id}"), |e| {
            matches!(e, CommandError::UnknownVerb { .. })
        }),
        ("abandon".into(), |e| {
            matches!(e, CommandError::MissingOperation { .. })
        }),
        (
            format!("abandon {id} now"),
            |e| matches!(e, CommandError::TrailingWords { extra } if extra == "now"),
        ),
        ("retry not-a-uuid".into(), |e| {
            matches!(e, CommandError::InvalidOperationId { .. })
        }),
        (format!("retry {}", id.replace('-', "")), |e| {
            matches!(e, CommandError::InvalidOperationId { .. })
        }),
        (format!("retry {{{id}}}"), |e| {
            matches!(e, CommandError::InvalidOperationId { .. })
        }),
        (format!("retry {id}\u{0}"), |e| {
            matches!(e, CommandError::ControlCharacter)
        }),
        (format!("retry\n{id}"), |e| {
            matches!(e, CommandError::ControlCharacter)
        }),
        ("x".repeat(300), |e| {
            matches!(e, CommandError::TooLong { .. })
        }),
    ];
    for (input, check) in cases {
        let err = parse_command(&input).unwrap_err();
        assert!(check(&err), "{input:?} gave {err:?}");
        assert!(
            err.to_string().contains("abandon <operation id>"),
            "{err} says what is expected"
        );
    }
}

#[test]
fn an_abandon_command_closes_the_operation() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Restart, 3, 3));
    w.push(op(1), issued(op(1), "template"));
    let cmd = parse_command(&format!("abandon {}", op(1))).unwrap();
    let entry = w
        .journal
        .command_entry(&cmd, "alice", Some("journal-command"), t(40), leader())
        .unwrap();
    w.journal = w
        .journal
        .stage(entry, Budget::default())
        .unwrap()
        .into_journal();
    assert_eq!(w.state(op(1)), OperationState::Closed(Outcome::Abandoned));
    let last = w.journal.entries().last().unwrap().clone();
    assert_eq!(
        last.body(),
        &EntryBody::Abandoned(PersonAction {
            by: "alice".into(),
            reason: Some("journal-command".into())
        })
    );
}

#[test]
fn a_retry_command_unblocks_the_operation() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 2));
    w.push(op(1), issued(op(1), "replicas"));
    w.push(op(1), blocked("removal failed"));
    let cmd = parse_command(&format!("retry {}", op(1))).unwrap();
    let entry = w
        .journal
        .command_entry(&cmd, "bob", None, t(40), leader())
        .unwrap();
    w.journal = w
        .journal
        .stage(entry, Budget::default())
        .unwrap()
        .into_journal();
    assert_eq!(w.phase(op(1)), Phase::Issued);
}

#[test]
fn commands_for_unknown_closed_or_unblocked_operations_are_refused() {
    let mut w = Writer::new();
    w.scale(op(1), 3, 4);
    w.push(op(2), intent_body(OperationKind::Scale, 4, 5));
    let refuse = |w: &Writer, text: String| {
        let cmd = parse_command(&text).unwrap();
        w.journal
            .command_entry(&cmd, "alice", None, t(50), leader())
            .unwrap_err()
    };
    assert!(matches!(
        refuse(&w, format!("abandon {}", op(9))),
        TransitionError::UnknownOperation { .. }
    ));
    assert!(matches!(
        refuse(&w, format!("abandon {}", op(1))),
        TransitionError::OperationClosed { .. }
    ));
    assert!(matches!(
        refuse(&w, format!("retry {}", op(2))),
        TransitionError::RetryNotApplicable { .. }
    ));
}
