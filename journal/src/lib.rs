//! The celld-operator operation journal (reference: `docs/journal.md` in the repository).
//!
//! Every decision that changes a fleet's members is first written down as an entry in the fleet's
//! journal, then carried out by one guarded write, then its outcome is written down. This crate
//! holds everything about that journal that does not need a Kubernetes client, so it can be
//! tested exhaustively:
//!
//! | module | concern |
//! |---|---|
//! | [`model`] | ids, kinds, steps, entry payloads, sealed immutable [`Entry`] |
//! | [`chain`] | canonical JSON, SHA-256 per entry, `prev` links, [`chain::verify`] |
//! | [`codec`] | the annotation [`Document`]: strict decoding, compact encoding |
//! | [`fold`] | operations as the fold of their entries; legal transitions ([`TransitionError`]) |
//! | `journal` (re-exported) | [`Journal`] (verified document + fold) and [`Staged`] appends |
//! | [`compaction`] | byte [`Budget`], compaction, size warning |
//! | [`deadline`] | deadline evaluation with `now` passed in |
//! | [`command`] | `abandon <op>` / `retry <op>` |
//! | [`projection`] | `status.currentOperation`, `recentOperations`, `lastRestartToken`, `journal` |
//! | [`appender`] | the compare-and-swap seam ([`Appender`]) and an in-memory implementation |
//! | [`mirror`] | the sled mirror and its reconcile with the annotation |
//! | [`audit`] | `journal show|verify|export` over a mirror directory |
//!
//! A reconcile uses it like this (the operator supplies the reads and writes):
//!
//! ```
//! use chrono::{TimeZone, Utc};
//! use journal::*;
//!
//! let fleet = "9f1c2d3e-0000-4000-8000-000000000001";
//! let store = InMemoryAppender::new();
//! let (journal, version) = load_journal(&store, fleet).unwrap();
//! assert!(journal.fold().current().is_none());
//!
//! let now = Utc.with_ymd_and_hms(2026, 11, 29, 10, 0, 0).unwrap();
//! let op = OperationId::new_v4();
//! let leader = Leader {
//!     identity: "celld-operator-0".into(),
//!     lease_transitions: 3,
//!     lease: Some("celld-system/celld-operator".into()),
//! };
//! let intent = NewEntry {
//!     at: now,
//!     op,
//!     leader: leader.clone(),
//!     body: EntryBody::Intent(Intent {
//!         kind: OperationKind::Scale,
//!         from: 3,
//!         to: 4,
//!         token: None,
//!         image: None,
//!         reason: None,
//!         deadline: default_deadline(now, None),
//!         targets: vec![],
//!         workload_uid: Some("wl-uid".into()),
//!         predecessor_effect: journal.predecessor_effect(),
//!     }),
//! };
//! let appended = append(&store, &journal, &version, intent, Budget::default()).unwrap();
//! let status = appended.journal.projection(Budget::default());
//! assert_eq!(status.current_operation.unwrap().summary, "Scale/Intent 3->4");
//! ```
//!
//! # Fine print decided here
//!
//! - **One open operation.** An `Intent` is refused while any operation is open, except an
//!   adoption of an orphan replacement hold (`MemberReplacement`, reason `AdoptedHold`), which
//!   never writes the workload (docs/design.md "Operation kinds").
//! - **Exactly once.** A step is recorded once per operation. Only `proof/<member>` and
//!   `restart/<member>` (the guarded Pod delete before a retried strict proof) may be recorded
//!   again, after a `Retried`; a claim is retired once, retry or not.
//! - **Completed** needs something issued; `Observed` is not required (a replacement that
//!   finds its member recovered completes `MemberChanged` without one).
//! - **Blocked** may be written before anything is issued; a blocked operation accepts only
//!   `Retried`, `Abandoned` or `Stalled` (so it cannot be canceled). `Retried` clears the block
//!   but not a stall.
//! - **Recovered** may follow a terminal entry, for a step the operation did not record (an
//!   effect that landed just before a crash, then the operation was abandoned on restart);
//!   for an unknown operation id it forms a *foreign record*.
//! - **Deadlines** fire at `now >= deadline`; nothing fires for an observed operation or one
//!   blocked before issue.
//! - **Compaction** drops whole operations only, oldest first, just enough to fit.
//!   `lastRestartToken` is computed from the operations still in the annotation.
//! - **Format**: optional fields are omitted when absent and never empty; `null` is refused;
//!   timestamps are written as RFC 3339 UTC (`Z`); the document envelope is written in the
//!   key order of docs/journal.md "Format", entries in canonical form.
//! - **Mirror**: new mirrors are created in place (the directory may be a mount point) with a
//!   format marker, bracketed by [`mirror::CREATING`]; a database without the marker is
//!   refused, never adopted, unless that file shows it is an interrupted creation, which is completed.
#![deny(missing_docs)]

mod journal;
mod json;

pub mod appender;
pub mod audit;
pub mod chain;
pub mod codec;
pub mod command;
pub mod compaction;
pub mod deadline;
pub mod fold;
pub mod mirror;
pub mod model;
pub mod projection;

pub use appender::{
    append, load_journal, AppendError, AppendFailure, Appended, Appender, Fault, InMemoryAppender,
    LoadFailure, Snapshot, Version, JOURNAL_ANNOTATION,
};
pub use chain::{ChainError, ChainProblem};
pub use codec::{decode_document, decode_entry, DecodeError, Document, Hole, HARD_MAX_BYTES};
pub use command::{
    parse_command, parse_repair_command, Command, CommandAction, CommandError, RepairCommand,
    COMMAND_ANNOTATION,
};
pub use compaction::{
    Budget, BudgetError, Compaction, OverBudget, SizeStatus, DEFAULT_BUDGET_BYTES,
};
pub use deadline::{default_deadline, DeadlineAction};
pub use fold::{
    Closure, EffectRecord, EffectSource, Fold, Operation, OperationState, Outcome, Phase,
    TransitionError, ADOPTED_HOLD_REASON,
};
pub use journal::{Journal, LoadError, MarkerCheck, StageError, Staged};
pub use mirror::plan::{plan_reconcile, DivergeReason, MirrorAction, ReconcilePlan, Signal};
pub use mirror::{
    Mirror, MirrorError, MirrorOptions, DEFAULT_CACHE_BYTES, DEFAULT_LIVE_ENTRIES,
    DEFAULT_RETENTION,
};
pub use model::*;
pub use projection::{CurrentOperation, JournalStatus, RecentOperation, StatusProjection};
