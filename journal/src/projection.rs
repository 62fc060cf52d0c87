//! The status projection (docs/design.md "Status and conditions"): `currentOperation`,
//! `recentOperations`, `lastRestartToken` and `journal`. Computed from the journal only; never read
//! back.

use chrono::{DateTime, Utc};

use crate::codec::format_time;
use crate::compaction::{Budget, SizeStatus};
use crate::fold::{Operation, Outcome, Phase};
use crate::journal::Journal;
use crate::model::{OperationId, OperationKind, Step};

/// Most entries in `recentOperations`.
pub const RECENT_OPERATIONS: usize = 5;

/// `status.currentOperation`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentOperation {
    /// Operation id.
    pub id: OperationId,
    /// Kind.
    pub kind: OperationKind,
    /// Phase.
    pub phase: Phase,
    /// Current effect step; `None` while nothing is issued.
    pub step: Option<Step>,
    /// Replicas before.
    pub from: i32,
    /// Replicas after.
    pub to: i32,
    /// The single target Pod, when there is exactly one.
    pub member: Option<String>,
    /// From the Intent entry.
    pub started_at: DateTime<Utc>,
    /// From the Intent entry.
    pub deadline: DateTime<Utc>,
    /// Why it is waiting, stalled or blocked; empty while progressing normally.
    pub blocker: String,
    /// `<kind>/<phase>`, then ` <from>-><to>` when they differ, else ` <member>` when set.
    pub summary: String,
}

impl CurrentOperation {
    /// Projects an open operation.
    pub fn of(op: &Operation) -> CurrentOperation {
        let phase = op.phase();
        let intent = op.intent();
        let member = op.member().map(str::to_owned);
        let blocker = match (op.blocked(), op.stalled()) {
            (Some((_, blocker)), _) => blocker.to_owned(),
            (None, Some((_, deadline))) if phase == Phase::Stalled => {
                format!("deadline {} passed", format_time(&deadline))
            }
            _ => String::new(),
        };
        let summary = summary(
            intent.kind,
            phase,
            intent.from,
            intent.to,
            member.as_deref(),
        );
        CurrentOperation {
            id: op.id(),
            kind: intent.kind,
            phase,
            step: op.current_step(),
            from: intent.from,
            to: intent.to,
            member,
            started_at: op.started_at(),
            deadline: op.deadline(),
            blocker,
            summary,
        }
    }
}

/// The `summary` text, e.g. `Scale/Issued 3->2`, `MemberReplacement/Issued beta-1`,
/// `Restart/Stalled`.
pub fn summary(
    kind: OperationKind,
    phase: Phase,
    from: i32,
    to: i32,
    member: Option<&str>,
) -> String {
    let mut s = format!("{kind}/{phase}");
    if from != to {
        s.push_str(&format!(" {from}->{to}"));
    } else if let Some(m) = member {
        s.push(' ');
        s.push_str(m);
    }
    s
}

/// One element of `status.recentOperations`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecentOperation {
    /// Operation id.
    pub id: OperationId,
    /// Kind.
    pub kind: OperationKind,
    /// The closing entry's value.
    pub outcome: Outcome,
    /// When the closing entry was written.
    pub finished_at: DateTime<Utc>,
}

/// `status.journal`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalStatus {
    /// Seq of the newest entry.
    pub seq: i64,
    /// Its hash, hex.
    pub head_hash: String,
    /// Encoded size of the annotation.
    pub bytes: i64,
    /// Last seq dropped by compaction.
    pub compacted_through: i64,
}

/// Everything status and metrics need from the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusProjection {
    /// The oldest open operation, if any.
    pub current_operation: Option<CurrentOperation>,
    /// The last finished operations (≤ 5), newest first.
    pub recent_operations: Vec<RecentOperation>,
    /// `status.lastRestartToken` (see [`crate::Fold::last_restart_token`]).
    pub last_restart_token: Option<String>,
    /// `status.journal`.
    pub journal: JournalStatus,
    /// Size against the budget (condition `JournalSizeWarning` when `size.warning()`).
    pub size: SizeStatus,
    /// Gauge `celld_journal_open_operations`.
    pub open_operations: usize,
    /// Gauge `celld_journal_stalled_operations` (open, in phase Stalled).
    pub stalled_operations: usize,
}

impl Journal {
    /// The status projection.
    pub fn projection(&self, budget: Budget) -> StatusProjection {
        let fold = self.fold();
        let recent_operations = fold
            .finished_newest_first()
            .into_iter()
            .take(RECENT_OPERATIONS)
            .filter_map(|o| {
                let c = o.closure()?;
                Some(RecentOperation {
                    id: o.id(),
                    kind: o.kind(),
                    outcome: c.outcome,
                    finished_at: c.at,
                })
            })
            .collect();
        let size = self.size_status(budget);
        let doc = self.document();
        StatusProjection {
            current_operation: fold.current().map(CurrentOperation::of),
            recent_operations,
            last_restart_token: self.last_restart_token().map(str::to_owned),
            journal: JournalStatus {
                seq: doc.seq() as i64,
                head_hash: doc.head().to_hex(),
                bytes: size.bytes as i64,
                compacted_through: doc.compacted_through() as i64,
            },
            size,
            open_operations: fold.open_operations().count(),
            stalled_operations: fold
                .open_operations()
                .filter(|o| o.phase() == Phase::Stalled)
                .count(),
        }
    }
}
