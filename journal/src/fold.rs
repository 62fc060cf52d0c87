//! Operations as the fold of their entries, and the legal transitions.
//!
//! An operation starts with `Intent` and is closed by exactly one terminal entry (`Completed`,
//! `Canceled` or `Abandoned`). The rules, each enforced with a [`TransitionError`]:
//!
//! | entry | allowed when |
//! |---|---|
//! | `Intent` | the id is new, and no operation is open — except an adoption (`MemberReplacement` with reason `AdoptedHold`, docs/design.md "Member replacement"), which never writes the workload; target Pods unique; `predecessorEffect` not its own |
//! | `Issued` | open, not blocked, not yet observed; `effect` is `<op>/<step>`; the step belongs to the kind; the step was not recorded before — except `proof/<member>` and `restart/<member>`, which may be recorded again after a `Retried` that follows their last record (a retried strict removal asks the runtime again under the same id, docs/design.md "Strict operations") |
//! | `ProofCaptured` | as `Issued`, for a member among the Intent's targets, with `proof.operationId` equal to the op; once per member unless retried since |
//! | `ClaimRetired` | as `Issued` (step `retire/<claim>`); a claim is retired at most once, retry or not |
//! | `Recovered` | for an open operation: as `Issued`; for a closed one: the step belongs to the kind and is not recorded yet (an effect that landed but was never recorded before the operation was abandoned; it reopens nothing); for an unknown id: always (a *foreign record*: the world shows an effect of an operation the journal lost); each effect once |
//! | `Observed` | open, not blocked, something issued, not observed yet |
//! | `Completed` | open, not blocked, something issued |
//! | `Canceled` | open, not blocked, **nothing issued** (no `Issued`, `ProofCaptured`, `ClaimRetired` or `Recovered`) |
//! | `Blocked` | open and not already blocked |
//! | `Stalled` | open, something issued, not stalled before (one `Stalled` per operation) |
//! | `Retried` | blocked or stalled; clears the block (a stall stays: the deadline did pass) |
//! | `Abandoned` | open |
//! | anything but `Recovered` | after a terminal entry: never; for an unknown operation: never |
//!
//! "Something issued" means any `Issued`, `ProofCaptured`, `ClaimRetired` or `Recovered` entry.

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use crate::model::*;

/// `Intent.reason` of an operation adopting an orphan replacement hold (docs/design.md "Member
/// replacement"): the only operation that may open while another is open.
pub const ADOPTED_HOLD_REASON: &str = "AdoptedHold";

/// Phase of an open operation, as projected to `status.currentOperation.phase`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Decided; nothing issued.
    Intent,
    /// At least one effect recorded.
    Issued,
    /// The target was reached; `Completed` pending.
    Observed,
    /// The deadline passed after issue; still driven.
    Stalled,
    /// Needs a person (`journal retry` or `journal abandon`).
    Blocked,
}

impl Phase {
    /// Status spelling.
    pub fn as_str(&self) -> &'static str {
        match self {
            Phase::Intent => "Intent",
            Phase::Issued => "Issued",
            Phase::Observed => "Observed",
            Phase::Stalled => "Stalled",
            Phase::Blocked => "Blocked",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a closed operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// `Completed{outcome}`.
    Completed(CompletedOutcome),
    /// `Canceled{reason}`.
    Canceled(CancelReason),
    /// `Abandoned`.
    Abandoned,
}

impl Outcome {
    /// The value shown in `status.recentOperations[].outcome`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::Completed(o) => o.as_str(),
            Outcome::Canceled(r) => r.as_str(),
            Outcome::Abandoned => "Abandoned",
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Open (with its phase) or closed (with its outcome).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperationState {
    /// Still open.
    Open(Phase),
    /// Closed by a terminal entry.
    Closed(Outcome),
}

/// How an effect came to be recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EffectSource {
    /// An `Issued` entry; `replayed` when the effect was found already in the world.
    Issued {
        /// `Issued.replayed`.
        replayed: bool,
    },
    /// A `ClaimRetired` entry.
    ClaimRetired,
    /// A `Recovered` entry.
    Recovered,
}

/// One recorded effect of an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectRecord {
    /// Seq of the entry that recorded it.
    pub seq: Seq,
    /// The step.
    pub step: Step,
    /// Which entry type recorded it.
    pub source: EffectSource,
    /// `Issued.target`: the member's identity a re-asked `proof/<member>` was sent to.
    pub target: Option<Target>,
}

/// The closing entry of an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closure {
    /// Its seq.
    pub seq: Seq,
    /// Its time (`recentOperations[].finishedAt`).
    pub at: DateTime<Utc>,
    /// The outcome.
    pub outcome: Outcome,
}

/// An operation: the fold of its entries.
#[derive(Debug, Clone)]
pub struct Operation {
    id: OperationId,
    intent: Intent,
    intent_seq: Seq,
    started_at: DateTime<Utc>,
    effects: Vec<EffectRecord>,
    proofs: Vec<(Seq, ProofCaptured)>,
    observed: Option<(Seq, String)>,
    stalled: Option<(Seq, DateTime<Utc>)>,
    blocked: Option<(Seq, String)>,
    retried: Vec<Seq>,
    closed: Option<Closure>,
    entries: Vec<Entry>,
}

impl Operation {
    /// The operation id.
    pub fn id(&self) -> OperationId {
        self.id
    }
    /// Its kind.
    pub fn kind(&self) -> OperationKind {
        self.intent.kind
    }
    /// The `Intent` payload.
    pub fn intent(&self) -> &Intent {
        &self.intent
    }
    /// Seq of the `Intent`.
    pub fn intent_seq(&self) -> Seq {
        self.intent_seq
    }
    /// When it was decided (the `Intent`'s `at`).
    pub fn started_at(&self) -> DateTime<Utc> {
        self.started_at
    }
    /// The deadline from the `Intent`.
    pub fn deadline(&self) -> DateTime<Utc> {
        self.intent.deadline
    }
    /// Every recorded effect, in seq order.
    pub fn effects(&self) -> &[EffectRecord] {
        &self.effects
    }
    /// Captured proofs, in seq order.
    pub fn proofs(&self) -> impl Iterator<Item = &ProofCaptured> {
        self.proofs.iter().map(|(_, p)| p)
    }
    /// The proof currently held for `member` (the newest).
    pub fn proof_for(&self, member: &str) -> Option<&Proof> {
        self.proofs
            .iter()
            .rev()
            .find(|(_, p)| p.member == member)
            .map(|(_, p)| &p.proof)
    }
    /// Whether `step` has been recorded (by `Issued`, `ClaimRetired` or `Recovered`).
    pub fn has_effect(&self, step: &Step) -> bool {
        self.last_record_of(step).is_some()
    }
    /// Whether a `Retried` came after the last record of `step`, so that a `proof/<member>` or
    /// `restart/<member>` step may be recorded again (docs/design.md "Strict operations": a retried
    /// strict removal asks the runtime again under the same id). Which proofs to redo is the
    /// caller's decision (proofs from unchanged runtimes stay valid).
    pub fn retried_since(&self, step: &Step) -> bool {
        self.last_record_of(step)
            .is_some_and(|seq| self.retried.iter().any(|&r| r > seq))
    }
    /// Whether `step` may be recorded now as far as the exactly-once rule goes: never recorded,
    /// or a runtime-facing step (`proof/…`, `restart/…`) retried since its last record.
    pub fn may_record(&self, step: &Step) -> bool {
        !self.has_effect(step)
            || (matches!(step, Step::Proof(_) | Step::Restart(_)) && self.retried_since(step))
    }
    /// Whether anything was issued (`Issued`, `ProofCaptured`, `ClaimRetired` or `Recovered`).
    pub fn issued_anything(&self) -> bool {
        !self.effects.is_empty() || !self.proofs.is_empty()
    }
    /// Seq of the first issued entry.
    pub fn first_issue_seq(&self) -> Option<Seq> {
        let e = self.effects.first().map(|e| e.seq);
        let p = self.proofs.first().map(|(s, _)| *s);
        match (e, p) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
    /// The current effect step: the step of the newest `Issued`, `ClaimRetired`, `Recovered` or
    /// `ProofCaptured` (as `proof/<member>`).
    pub fn current_step(&self) -> Option<Step> {
        let e = self.effects.last().map(|e| (e.seq, e.step.clone()));
        let p = self
            .proofs
            .last()
            .map(|(s, p)| (*s, Step::Proof(p.member.clone())));
        match (e, p) {
            (Some(a), Some(b)) => Some(if a.0 > b.0 { a.1 } else { b.1 }),
            (a, b) => a.or(b).map(|x| x.1),
        }
    }
    /// `Observed` seq and note.
    pub fn observed(&self) -> Option<(Seq, &str)> {
        self.observed.as_ref().map(|(s, n)| (*s, n.as_str()))
    }
    /// `Stalled` seq and the deadline it recorded.
    pub fn stalled(&self) -> Option<(Seq, DateTime<Utc>)> {
        self.stalled
    }
    /// The current block (seq and blocker), if not retried since.
    pub fn blocked(&self) -> Option<(Seq, &str)> {
        self.blocked.as_ref().map(|(s, b)| (*s, b.as_str()))
    }
    /// Seqs of `Retried` entries.
    pub fn retries(&self) -> &[Seq] {
        &self.retried
    }
    /// The closing entry, if closed.
    pub fn closure(&self) -> Option<&Closure> {
        self.closed.as_ref()
    }
    /// Whether still open.
    pub fn is_open(&self) -> bool {
        self.closed.is_none()
    }
    /// Open phase or closed outcome.
    pub fn state(&self) -> OperationState {
        match &self.closed {
            Some(c) => OperationState::Closed(c.outcome),
            None => OperationState::Open(self.phase()),
        }
    }
    /// The phase it has (or had when it closed). Blocked wins over Observed over Stalled over
    /// Issued over Intent: a block needs a person; an observed operation only waits for
    /// `Completed`, so a passed deadline no longer matters.
    pub fn phase(&self) -> Phase {
        if self.blocked.is_some() {
            Phase::Blocked
        } else if self.observed.is_some() {
            Phase::Observed
        } else if self.stalled.is_some() {
            Phase::Stalled
        } else if self.issued_anything() {
            Phase::Issued
        } else {
            Phase::Intent
        }
    }
    /// The single target Pod, when the operation has exactly one target.
    pub fn member(&self) -> Option<&str> {
        match self.intent.targets.as_slice() {
            [one] => Some(one.pod.as_str()),
            _ => None,
        }
    }
    /// The entries of this operation, in seq order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }
    /// Seq of its newest entry.
    pub fn last_seq(&self) -> Seq {
        self.entries.last().map_or(self.intent_seq, |e| e.seq())
    }

    /// Seq of the newest record of `step` (`Issued`, `ClaimRetired` or `Recovered`).
    pub fn last_record_seq(&self, step: &Step) -> Option<Seq> {
        self.last_record_of(step)
    }

    /// Seq of the newest `ProofCaptured` for `member`.
    pub fn last_proof_seq(&self, member: &str) -> Option<Seq> {
        self.proofs
            .iter()
            .rev()
            .find(|(_, p)| p.member == member)
            .map(|(s, _)| *s)
    }

    /// The identity of target `member` that its proof must come from: the one recorded by the
    /// newest `proof/<member>` sent to a new identity (after a retry restarted the member),
    /// else the Intent's.
    pub fn reference_target(&self, member: &str) -> Option<Target> {
        let step = Step::Proof(member.to_owned());
        self.effects
            .iter()
            .rev()
            .filter(|e| e.step == step)
            .find_map(|e| e.target.clone())
            .or_else(|| {
                self.intent
                    .targets
                    .iter()
                    .find(|t| t.pod == member)
                    .cloned()
            })
    }

    fn last_record_of(&self, step: &Step) -> Option<Seq> {
        self.effects
            .iter()
            .rev()
            .find(|e| &e.step == step)
            .map(|e| e.seq)
    }
}

/// Entries of an operation id that has no `Intent` in this journal: `Recovered` records of
/// effects the world shows (e.g. after the annotation was restored from an old backup).
#[derive(Debug, Clone)]
pub struct ForeignRecord {
    id: OperationId,
    effects: Vec<EffectRecord>,
    entries: Vec<Entry>,
}

impl ForeignRecord {
    /// The operation id named by the world's marker.
    pub fn id(&self) -> OperationId {
        self.id
    }
    /// The recovered effects.
    pub fn effects(&self) -> &[EffectRecord] {
        &self.effects
    }
    /// The `Recovered` entries.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }
}

/// An entry that the transition rules refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// An `Intent` for an id that already has entries.
    #[error("operation {op} already has entries; an Intent must start a new operation id")]
    DuplicateOperation {
        /// The operation.
        op: OperationId,
    },
    /// An `Intent` while another operation is open.
    #[error("cannot open operation {op}: {kind} operation {open} is still open (at most one open operation per fleet)")]
    OperationAlreadyOpen {
        /// The refused operation.
        op: OperationId,
        /// The open one.
        open: OperationId,
        /// Its kind.
        kind: OperationKind,
    },
    /// An `Intent` with an impossible payload.
    #[error("invalid Intent for operation {op}: {problem}")]
    InvalidIntent {
        /// The operation.
        op: OperationId,
        /// What is wrong.
        problem: String,
    },
    /// A non-`Intent`, non-`Recovered` entry for an id without `Intent`.
    #[error("{entry_type} for operation {op}, which this journal does not hold (no Intent)")]
    UnknownOperation {
        /// The operation.
        op: OperationId,
        /// The refused entry's type.
        entry_type: EntryType,
    },
    /// Anything after a terminal entry.
    #[error("{entry_type} for operation {op}, which was closed by {closed_by} at seq {closed_seq}; nothing may follow a terminal entry")]
    OperationClosed {
        /// The operation.
        op: OperationId,
        /// The refused entry's type.
        entry_type: EntryType,
        /// How it was closed.
        closed_by: Outcome,
        /// Seq of the terminal entry.
        closed_seq: Seq,
    },
    /// `Canceled` after something was issued.
    #[error("cannot cancel operation {op}: it issued an effect at seq {issued_seq}; Canceled is allowed only before anything is issued")]
    CancelAfterIssue {
        /// The operation.
        op: OperationId,
        /// Seq of its first issued entry.
        issued_seq: Seq,
    },
    /// `Observed`, `Completed` or `Stalled` before anything was issued.
    #[error("{entry_type} for operation {op} before anything was issued")]
    NotYetIssued {
        /// The operation.
        op: OperationId,
        /// The refused entry's type.
        entry_type: EntryType,
    },
    /// Anything but `Retried`, `Abandoned` or `Stalled` while blocked.
    #[error("{entry_type} for operation {op}, which is blocked since seq {blocked_seq} ({blocker}); only Retried, Abandoned or Stalled may follow")]
    OperationBlocked {
        /// The operation.
        op: OperationId,
        /// The refused entry's type.
        entry_type: EntryType,
        /// Seq of the `Blocked` entry.
        blocked_seq: Seq,
        /// Its blocker.
        blocker: String,
    },
    /// An effect after `Observed`.
    #[error("{entry_type} for operation {op} after it was observed at seq {observed_seq}")]
    EffectAfterObserved {
        /// The operation.
        op: OperationId,
        /// The refused entry's type.
        entry_type: EntryType,
        /// Seq of `Observed`.
        observed_seq: Seq,
    },
    /// `Observed` twice.
    #[error("operation {op} was already observed at seq {observed_seq}")]
    AlreadyObserved {
        /// The operation.
        op: OperationId,
        /// Seq of the first `Observed`.
        observed_seq: Seq,
    },
    /// `Stalled` twice.
    #[error("operation {op} already stalled at seq {stalled_seq}")]
    AlreadyStalled {
        /// The operation.
        op: OperationId,
        /// Seq of the first `Stalled`.
        stalled_seq: Seq,
    },
    /// A step recorded a second time (the exactly-once rule).
    #[error("step {step} of operation {op} was already recorded at seq {first_seq}; an effect is recorded exactly once")]
    DuplicateEffect {
        /// The operation.
        op: OperationId,
        /// The step.
        step: Step,
        /// Seq of the earlier record.
        first_seq: Seq,
    },
    /// A claim retired twice.
    #[error("claim {claim} of operation {op} was already retired at seq {first_seq}")]
    ClaimAlreadyRetired {
        /// The operation.
        op: OperationId,
        /// The claim.
        claim: String,
        /// Seq of the earlier `ClaimRetired`.
        first_seq: Seq,
    },
    /// A second proof for a member without a retry in between.
    #[error("a proof for {member} of operation {op} was already captured at seq {first_seq}")]
    DuplicateProof {
        /// The operation.
        op: OperationId,
        /// The member.
        member: String,
        /// Seq of the earlier proof.
        first_seq: Seq,
    },
    /// `Retried` on an operation that is neither blocked nor stalled.
    #[error("cannot retry operation {op}: it is {phase}, and only blocked or stalled operations can be retried")]
    RetryNotApplicable {
        /// The operation.
        op: OperationId,
        /// Its phase.
        phase: Phase,
    },
    /// A step that the kind does not have.
    #[error("step {step} is not a step of {kind} operation {op}")]
    StepNotAllowed {
        /// The operation.
        op: OperationId,
        /// Its kind.
        kind: OperationKind,
        /// The step.
        step: Step,
    },
    /// An effect that names another operation or step.
    #[error("effect {effect} does not match operation {op} (expected {expected})")]
    EffectMismatch {
        /// The operation.
        op: OperationId,
        /// The effect in the entry.
        effect: Effect,
        /// What it should be.
        expected: String,
    },
    /// A proof for a member that is not a target.
    #[error("{member} is not a target of operation {op}")]
    UnknownTarget {
        /// The operation.
        op: OperationId,
        /// The member.
        member: String,
    },
    /// A proof carrying another operation's id.
    #[error("the proof for {member} names operation {found}, not {op}")]
    ProofForOtherOperation {
        /// The operation.
        op: OperationId,
        /// The member.
        member: String,
        /// The id in the proof.
        found: String,
    },
}

/// All operations of a journal (those still in the annotation), folded.
#[derive(Debug, Clone, Default)]
pub struct Fold {
    ops: Vec<Operation>,
    index: HashMap<OperationId, usize>,
    foreign: Vec<ForeignRecord>,
    foreign_index: HashMap<OperationId, usize>,
}

impl Fold {
    /// Folds entries in order, enforcing the transition rules.
    pub fn from_entries<'a>(
        entries: impl IntoIterator<Item = &'a Entry>,
    ) -> Result<Fold, (Seq, TransitionError)> {
        let mut fold = Fold::default();
        for e in entries {
            fold.apply(e).map_err(|err| (e.seq(), err))?;
        }
        Ok(fold)
    }

    /// Operations in the order they were opened.
    pub fn operations(&self) -> &[Operation] {
        &self.ops
    }
    /// One operation by id.
    pub fn operation(&self, id: OperationId) -> Option<&Operation> {
        self.index.get(&id).map(|&i| &self.ops[i])
    }
    /// Foreign records (`Recovered` entries of ids without `Intent`).
    pub fn foreign_records(&self) -> &[ForeignRecord] {
        &self.foreign
    }
    /// Open operations, oldest first.
    pub fn open_operations(&self) -> impl Iterator<Item = &Operation> {
        self.ops.iter().filter(|o| o.is_open())
    }
    /// The operation `status.currentOperation` shows: the oldest open one (an adoption opened
    /// alongside another operation is shown only once that one closes).
    pub fn current(&self) -> Option<&Operation> {
        self.open_operations().next()
    }
    /// Closed operations, most recently closed first.
    pub fn finished_newest_first(&self) -> Vec<&Operation> {
        let mut done: Vec<&Operation> = self.ops.iter().filter(|o| !o.is_open()).collect();
        done.sort_by_key(|o| std::cmp::Reverse(o.closure().map_or(0, |c| c.seq)));
        done
    }
    /// The restart token applied by the most recently *completed* operation that carried one
    /// (`status.lastRestartToken`). Only operations still in this journal count: after
    /// compaction dropped that operation this is `None`, so callers must also compare with the
    /// live template's token (the planner does both, docs/design.md "Planning order").
    pub fn last_restart_token(&self) -> Option<&str> {
        self.ops
            .iter()
            .filter_map(|o| match o.closure() {
                Some(
                    c @ Closure {
                        outcome: Outcome::Completed(_),
                        ..
                    },
                ) => o.intent.token.as_deref().map(|t| (c.seq, t)),
                _ => None,
            })
            .max_by_key(|(seq, _)| *seq)
            .map(|(_, t)| t)
    }

    /// Checks `body` for operation `op` against the rules without changing anything.
    pub fn check(&self, op: OperationId, body: &EntryBody) -> Result<(), TransitionError> {
        let entry_type = body.entry_type();
        if let EntryBody::Intent(intent) = body {
            return self.check_intent(op, intent);
        }
        let Some(o) = self.operation(op) else {
            return match body {
                EntryBody::Recovered(r) => self.check_foreign(op, r),
                _ => Err(TransitionError::UnknownOperation { op, entry_type }),
            };
        };
        if let Some(c) = &o.closed {
            if let EntryBody::Recovered(r) = body {
                // A fact about the world, e.g. an effect that landed just before a crash and
                // was never recorded because the operation was abandoned on restart: recording
                // it keeps the predecessor guard truthful and reopens nothing.
                if r.effect.op == op {
                    return self.check_step(o, &r.effect.step);
                }
            }
            return Err(TransitionError::OperationClosed {
                op,
                entry_type,
                closed_by: c.outcome,
                closed_seq: c.seq,
            });
        }
        if let Some((blocked_seq, blocker)) = &o.blocked {
            if !matches!(
                body,
                EntryBody::Retried(_) | EntryBody::Abandoned(_) | EntryBody::Stalled(_)
            ) {
                return Err(TransitionError::OperationBlocked {
                    op,
                    entry_type,
                    blocked_seq: *blocked_seq,
                    blocker: blocker.clone(),
                });
            }
        }
        let not_observed = || match o.observed {
            Some((observed_seq, _)) => Err(TransitionError::EffectAfterObserved {
                op,
                entry_type,
                observed_seq,
            }),
            None => Ok(()),
        };
        let issued_before = || {
            if o.issued_anything() {
                Ok(())
            } else {
                Err(TransitionError::NotYetIssued { op, entry_type })
            }
        };
        match body {
            EntryBody::Intent(_) => unreachable!("handled above"),
            EntryBody::Issued(i) => {
                not_observed()?;
                let expected = Effect::new(op, i.step.clone());
                if i.effect != expected {
                    return Err(TransitionError::EffectMismatch {
                        op,
                        effect: i.effect.clone(),
                        expected: expected.to_string(),
                    });
                }
                self.check_step(o, &i.step)
            }
            EntryBody::Recovered(r) => {
                not_observed()?;
                if r.effect.op != op {
                    return Err(TransitionError::EffectMismatch {
                        op,
                        effect: r.effect.clone(),
                        expected: format!("{op}/<step>"),
                    });
                }
                self.check_step(o, &r.effect.step)
            }
            EntryBody::ClaimRetired(c) => {
                not_observed()?;
                let step = Step::Retire(c.claim.clone());
                if !o.intent.kind.allows_step(&step) {
                    return Err(TransitionError::StepNotAllowed {
                        op,
                        kind: o.intent.kind,
                        step,
                    });
                }
                if let Some(first_seq) = o.last_record_of(&step) {
                    return Err(TransitionError::ClaimAlreadyRetired {
                        op,
                        claim: c.claim.clone(),
                        first_seq,
                    });
                }
                Ok(())
            }
            EntryBody::ProofCaptured(p) => {
                not_observed()?;
                let step = Step::Proof(p.member.clone());
                if !o.intent.kind.allows_step(&step) {
                    return Err(TransitionError::StepNotAllowed {
                        op,
                        kind: o.intent.kind,
                        step,
                    });
                }
                if !o.intent.targets.iter().any(|t| t.pod == p.member) {
                    return Err(TransitionError::UnknownTarget {
                        op,
                        member: p.member.clone(),
                    });
                }
                if p.proof.operation_id != op.to_string() {
                    return Err(TransitionError::ProofForOtherOperation {
                        op,
                        member: p.member.clone(),
                        found: truncate_for_message(&p.proof.operation_id),
                    });
                }
                if let Some((first_seq, _)) =
                    o.proofs.iter().rev().find(|(_, q)| q.member == p.member)
                {
                    if !o.retried.iter().any(|r| r > first_seq) {
                        return Err(TransitionError::DuplicateProof {
                            op,
                            member: p.member.clone(),
                            first_seq: *first_seq,
                        });
                    }
                }
                Ok(())
            }
            EntryBody::Observed(_) => {
                if let Some((observed_seq, _)) = o.observed {
                    return Err(TransitionError::AlreadyObserved { op, observed_seq });
                }
                issued_before()
            }
            EntryBody::Completed(_) => issued_before(),
            EntryBody::Canceled(_) => match o.first_issue_seq() {
                Some(issued_seq) => Err(TransitionError::CancelAfterIssue { op, issued_seq }),
                None => Ok(()),
            },
            EntryBody::Blocked(_) => Ok(()), // not blocked: checked above
            EntryBody::Stalled(_) => {
                if let Some((stalled_seq, _)) = o.stalled {
                    return Err(TransitionError::AlreadyStalled { op, stalled_seq });
                }
                issued_before()
            }
            EntryBody::Retried(_) => {
                if o.blocked.is_some() || o.stalled.is_some() {
                    Ok(())
                } else {
                    Err(TransitionError::RetryNotApplicable {
                        op,
                        phase: o.phase(),
                    })
                }
            }
            EntryBody::Abandoned(_) => Ok(()),
        }
    }

    fn check_intent(&self, op: OperationId, intent: &Intent) -> Result<(), TransitionError> {
        if self.index.contains_key(&op) || self.foreign_index.contains_key(&op) {
            return Err(TransitionError::DuplicateOperation { op });
        }
        let adoption = intent.kind == OperationKind::MemberReplacement
            && intent.reason.as_deref() == Some(ADOPTED_HOLD_REASON);
        if !adoption {
            if let Some(open) = self.current() {
                return Err(TransitionError::OperationAlreadyOpen {
                    op,
                    open: open.id,
                    kind: open.kind(),
                });
            }
        }
        let mut pods: Vec<&str> = intent.targets.iter().map(|t| t.pod.as_str()).collect();
        pods.sort_unstable();
        if let Some(w) = pods.windows(2).find(|w| w[0] == w[1]) {
            return Err(TransitionError::InvalidIntent {
                op,
                problem: format!("target {} is listed twice", w[0]),
            });
        }
        if let Some(p) = &intent.predecessor_effect {
            if p.op == op {
                return Err(TransitionError::InvalidIntent {
                    op,
                    problem: "the predecessor effect cannot be the operation's own".to_owned(),
                });
            }
        }
        Ok(())
    }

    fn check_step(&self, o: &Operation, step: &Step) -> Result<(), TransitionError> {
        if !o.intent.kind.allows_step(step) {
            return Err(TransitionError::StepNotAllowed {
                op: o.id,
                kind: o.intent.kind,
                step: step.clone(),
            });
        }
        if let Step::Retire(claim) = step {
            if let Some(first_seq) = o.last_record_of(step) {
                return Err(TransitionError::ClaimAlreadyRetired {
                    op: o.id,
                    claim: claim.clone(),
                    first_seq,
                });
            }
        }
        if let Some(first_seq) = o.last_record_of(step) {
            if !o.may_record(step) {
                return Err(TransitionError::DuplicateEffect {
                    op: o.id,
                    step: step.clone(),
                    first_seq,
                });
            }
        }
        Ok(())
    }

    fn check_foreign(&self, op: OperationId, r: &Recovered) -> Result<(), TransitionError> {
        if r.effect.op != op {
            return Err(TransitionError::EffectMismatch {
                op,
                effect: r.effect.clone(),
                expected: format!("{op}/<step>"),
            });
        }
        if let Some(f) = self.foreign_index.get(&op).map(|&i| &self.foreign[i]) {
            if let Some(prev) = f.effects.iter().find(|e| e.step == r.effect.step) {
                return Err(TransitionError::DuplicateEffect {
                    op,
                    step: r.effect.step.clone(),
                    first_seq: prev.seq,
                });
            }
        }
        Ok(())
    }

    /// Checks and folds one sealed entry.
    pub fn apply(&mut self, entry: &Entry) -> Result<(), TransitionError> {
        self.check(entry.op(), entry.body())?;
        self.apply_unchecked(entry);
        Ok(())
    }

    /// Folds an entry that passed [`Fold::check`].
    pub(crate) fn apply_unchecked(&mut self, entry: &Entry) {
        let op = entry.op();
        let seq = entry.seq();
        if let EntryBody::Intent(intent) = entry.body() {
            self.index.insert(op, self.ops.len());
            self.ops.push(Operation {
                id: op,
                intent: intent.clone(),
                intent_seq: seq,
                started_at: entry.at(),
                effects: Vec::new(),
                proofs: Vec::new(),
                observed: None,
                stalled: None,
                blocked: None,
                retried: Vec::new(),
                closed: None,
                entries: vec![entry.clone()],
            });
            return;
        }
        let Some(&i) = self.index.get(&op) else {
            if let EntryBody::Recovered(r) = entry.body() {
                let idx = *self.foreign_index.entry(op).or_insert_with(|| {
                    self.foreign.push(ForeignRecord {
                        id: op,
                        effects: Vec::new(),
                        entries: Vec::new(),
                    });
                    self.foreign.len() - 1
                });
                let f = &mut self.foreign[idx];
                f.effects.push(EffectRecord {
                    seq,
                    step: r.effect.step.clone(),
                    source: EffectSource::Recovered,
                    target: None,
                });
                f.entries.push(entry.clone());
            }
            return;
        };
        let o = &mut self.ops[i];
        o.entries.push(entry.clone());
        let close = |outcome| {
            Some(Closure {
                seq,
                at: entry.at(),
                outcome,
            })
        };
        match entry.body() {
            EntryBody::Intent(_) => {}
            EntryBody::Issued(x) => o.effects.push(EffectRecord {
                seq,
                step: x.step.clone(),
                source: EffectSource::Issued {
                    replayed: x.replayed,
                },
                target: x.target.clone(),
            }),
            EntryBody::Recovered(x) => o.effects.push(EffectRecord {
                seq,
                step: x.effect.step.clone(),
                source: EffectSource::Recovered,
                target: None,
            }),
            EntryBody::ClaimRetired(x) => o.effects.push(EffectRecord {
                seq,
                step: Step::Retire(x.claim.clone()),
                source: EffectSource::ClaimRetired,
                target: None,
            }),
            EntryBody::ProofCaptured(x) => o.proofs.push((seq, x.clone())),
            EntryBody::Observed(x) => o.observed = Some((seq, x.note.clone())),
            EntryBody::Completed(x) => o.closed = close(Outcome::Completed(x.outcome)),
            EntryBody::Canceled(x) => o.closed = close(Outcome::Canceled(x.reason)),
            EntryBody::Abandoned(_) => o.closed = close(Outcome::Abandoned),
            EntryBody::Blocked(x) => o.blocked = Some((seq, x.blocker.clone())),
            EntryBody::Stalled(x) => o.stalled = Some((seq, x.deadline)),
            EntryBody::Retried(_) => {
                o.retried.push(seq);
                o.blocked = None;
            }
        }
    }

    /// Forgets the operations and foreign records whose entries were compacted away.
    pub(crate) fn forget(&mut self, dropped: &[OperationId]) {
        if dropped.is_empty() {
            return;
        }
        self.ops.retain(|o| !dropped.contains(&o.id));
        self.foreign.retain(|f| !dropped.contains(&f.id));
        self.index = self
            .ops
            .iter()
            .enumerate()
            .map(|(i, o)| (o.id, i))
            .collect();
        self.foreign_index = self
            .foreign
            .iter()
            .enumerate()
            .map(|(i, f)| (f.id, i))
            .collect();
    }
}
