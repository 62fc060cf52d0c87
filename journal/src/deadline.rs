//! Deadlines (docs/design.md "Deadlines, Stalled and abandon"), evaluated with `now` passed in.
//!
//! - Every `Intent` has a deadline: [`default_deadline`] gives 30 minutes, plus 5 minutes per
//!   member for a coordinated restart.
//! - At or past the deadline with nothing issued: `Canceled{DeadlineBeforeIssue}` is due.
//! - At or past the deadline after issue: one `Stalled` is due (never a second one); the
//!   operation stays open and driven.
//! - Nothing is due for an operation that was observed (it only waits for `Completed`), nor for
//!   one blocked before anything was issued (it waits for a person, and canceling a blocked
//!   operation is not allowed).

use chrono::{DateTime, Duration, Utc};

use crate::fold::Operation;
use crate::journal::Journal;
use crate::model::{CancelReason, Canceled, EntryBody, OperationId, Stalled};

/// Default time an operation gets from decision to completion.
pub const DEFAULT_DEADLINE_MINUTES: i64 = 30;

/// Extra time per member for a coordinated restart.
pub const COORDINATED_MINUTES_PER_MEMBER: i64 = 5;

/// The deadline of an operation decided at `started_at`: 30 minutes, plus 5 minutes per member
/// when `coordinated_members` is given (a coordinated restart of that many members).
pub fn default_deadline(
    started_at: DateTime<Utc>,
    coordinated_members: Option<u32>,
) -> DateTime<Utc> {
    let extra = coordinated_members.map_or(0, |n| i64::from(n) * COORDINATED_MINUTES_PER_MEMBER);
    started_at + Duration::minutes(DEFAULT_DEADLINE_MINUTES + extra)
}

/// An entry the deadline rules require now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadlineAction {
    /// Append `Canceled{DeadlineBeforeIssue}`.
    Cancel {
        /// The operation.
        op: OperationId,
    },
    /// Append `Stalled{deadline}`.
    Stall {
        /// The operation.
        op: OperationId,
        /// The deadline that passed.
        deadline: DateTime<Utc>,
    },
}

impl DeadlineAction {
    /// The operation concerned.
    pub fn op(&self) -> OperationId {
        match self {
            DeadlineAction::Cancel { op } | DeadlineAction::Stall { op, .. } => *op,
        }
    }
    /// The entry body to append.
    pub fn body(&self) -> EntryBody {
        match self {
            DeadlineAction::Cancel { .. } => EntryBody::Canceled(Canceled {
                reason: CancelReason::DeadlineBeforeIssue,
            }),
            DeadlineAction::Stall { deadline, .. } => EntryBody::Stalled(Stalled {
                deadline: *deadline,
            }),
        }
    }
}

/// What the deadline rules require for `op` at `now`, if anything.
pub fn due(op: &Operation, now: DateTime<Utc>) -> Option<DeadlineAction> {
    if !op.is_open() || now < op.deadline() || op.observed().is_some() {
        return None;
    }
    if !op.issued_anything() {
        if op.blocked().is_some() {
            return None;
        }
        return Some(DeadlineAction::Cancel { op: op.id() });
    }
    if op.stalled().is_some() {
        return None;
    }
    Some(DeadlineAction::Stall {
        op: op.id(),
        deadline: op.deadline(),
    })
}

impl Journal {
    /// Every deadline action due at `now`, oldest operation first.
    pub fn deadlines_due(&self, now: DateTime<Utc>) -> Vec<DeadlineAction> {
        self.fold()
            .open_operations()
            .filter_map(|o| due(o, now))
            .collect()
    }

    /// The earliest future instant at which a deadline action becomes due (for the requeue).
    pub fn next_deadline(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.fold()
            .open_operations()
            .filter(|o| o.deadline() > now && due(o, o.deadline()).is_some())
            .map(|o| o.deadline())
            .min()
    }
}
