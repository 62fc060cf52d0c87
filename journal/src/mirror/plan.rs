//! The reconcile rules between the mirror and the annotation (docs/journal.md "Replay"), as a pure
//! function from what the mirror holds to a plan of writes and moves.
//!
//! - Mirror missing entries → write them from the annotation (backfill).
//! - Same seq, different hash → the annotation wins: the mirror's entry moves to the `diverged`
//!   tree and the annotation's is written; signal `JournalDiverged`.
//! - The mirror's entry at `compactedThrough` has another hash than `compactedHash` → the
//!   mirror's whole history up to there is of another chain: it moves to `diverged`;
//!   signal `JournalDiverged`.
//! - Mirror ahead of the annotation (annotation restored from an older copy) → signal
//!   `JournalRollback`; the mirror's extra entries move to `diverged` (reason `Rollback`, or
//!   `Diverged` when the common part diverged too). The operator then lets the world's effect
//!   markers decide: an effect present in the world is recorded as `Recovered`, never reissued.
//! - Mirror entries older than the annotation's window (compacted out of it) are kept: that is
//!   the audit archive.

use std::collections::BTreeMap;

use crate::codec::Document;
use crate::model::{Entry, Hash, Seq};

/// Why entries were moved to the `diverged` tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DivergeReason {
    /// Same seq, different hash than the annotation.
    Diverged,
    /// Beyond the annotation's head (the annotation was rolled back).
    Rollback,
    /// Set aside by `journal reset` (a person started a new journal for the fleet).
    Reset,
}

impl DivergeReason {
    /// Stored spelling.
    pub fn as_str(&self) -> &'static str {
        match self {
            DivergeReason::Diverged => "Diverged",
            DivergeReason::Rollback => "Rollback",
            DivergeReason::Reset => "Reset",
        }
    }
}

/// A Warning Event the operator publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signal {
    /// `JournalDiverged`: the mirror and the annotation disagree from `first_seq` on.
    JournalDiverged {
        /// First seq that differs.
        first_seq: Seq,
    },
    /// `JournalRollback`: the mirror is ahead of the annotation.
    JournalRollback {
        /// The annotation's newest seq.
        annotation_seq: Seq,
        /// The mirror's newest seq.
        mirror_seq: Seq,
    },
}

impl Signal {
    /// The Event reason.
    pub fn event_reason(&self) -> &'static str {
        match self {
            Signal::JournalDiverged { .. } => "JournalDiverged",
            Signal::JournalRollback { .. } => "JournalRollback",
        }
    }
    /// The Event note.
    pub fn message(&self) -> String {
        match self {
            Signal::JournalDiverged { first_seq } => format!(
                "The local journal mirror differs from the fleet's journal from entry {first_seq} on; the annotation wins and the mirror's entries were kept aside"
            ),
            Signal::JournalRollback {
                annotation_seq,
                mirror_seq,
            } => format!(
                "The fleet's journal ends at entry {annotation_seq} but the local mirror holds entries up to {mirror_seq} (restored from an older copy?); the extra entries were kept aside and effects found in the world are recorded as Recovered"
            ),
        }
    }
}

/// One change to the mirror.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MirrorAction {
    /// Move every mirror entry with `from <= seq <= through` to the `diverged` tree.
    MoveToDiverged {
        /// First seq.
        from: Seq,
        /// Last seq.
        through: Seq,
        /// Why.
        reason: DivergeReason,
    },
    /// Write the annotation's entry.
    Write(Entry),
}

/// What reconciling one fleet's mirror with its annotation takes. Apply the moves before the
/// writes (they are listed in that order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcilePlan {
    /// Moves first, then writes in seq order.
    pub actions: Vec<MirrorAction>,
    /// Events to publish.
    pub signals: Vec<Signal>,
}

impl ReconcilePlan {
    /// True when mirror and annotation agree.
    pub fn is_empty(&self) -> bool {
        self.actions.is_empty() && self.signals.is_empty()
    }
    /// Number of entries written.
    pub fn writes(&self) -> usize {
        self.actions
            .iter()
            .filter(|a| matches!(a, MirrorAction::Write(_)))
            .count()
    }
}

/// Plans the reconcile of a mirror holding `mirror` — `(seq, hash)` of its entries for this
/// fleet, at least every entry with seq ≥ the annotation's `compactedThrough`, in any order —
/// with `annotation`.
pub fn plan_reconcile(mirror: &[(Seq, Hash)], annotation: &Document) -> ReconcilePlan {
    let held: BTreeMap<Seq, Hash> = mirror.iter().copied().collect();
    let mut moves: Vec<(Seq, Seq, DivergeReason)> = Vec::new();
    let mut writes = Vec::new();
    let mut first_diverged: Option<Seq> = None;

    let ct = annotation.compacted_through();
    if ct > 0 {
        if let Some(h) = held.get(&ct) {
            if *h != annotation.compacted_hash() {
                moves.push((1, ct, DivergeReason::Diverged));
                first_diverged = Some(ct);
            }
        }
    }
    for e in annotation.entries() {
        match held.get(&e.seq()) {
            None => writes.push(e.clone()),
            Some(h) if *h == e.hash() => {}
            Some(_) => {
                match moves.last_mut() {
                    Some((_, through, DivergeReason::Diverged)) if *through + 1 == e.seq() => {
                        *through = e.seq()
                    }
                    _ => moves.push((e.seq(), e.seq(), DivergeReason::Diverged)),
                }
                first_diverged.get_or_insert(e.seq());
                writes.push(e.clone());
            }
        }
    }
    let mut signals = Vec::new();
    if let Some(first_seq) = first_diverged {
        signals.push(Signal::JournalDiverged { first_seq });
    }
    let annotation_seq = annotation.seq();
    if let Some((&mirror_seq, _)) = held.iter().next_back() {
        if mirror_seq > annotation_seq {
            let reason = if first_diverged.is_some() {
                DivergeReason::Diverged
            } else {
                DivergeReason::Rollback
            };
            moves.push((annotation_seq + 1, mirror_seq, reason));
            signals.push(Signal::JournalRollback {
                annotation_seq,
                mirror_seq,
            });
        }
    }
    let mut actions: Vec<MirrorAction> = moves
        .into_iter()
        .map(|(from, through, reason)| MirrorAction::MoveToDiverged {
            from,
            through,
            reason,
        })
        .collect();
    actions.extend(writes.into_iter().map(MirrorAction::Write));
    ReconcilePlan { actions, signals }
}
