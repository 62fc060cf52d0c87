//! The byte budget and compaction (docs/journal.md "Compaction").
//!
//! When an append would make the encoded annotation exceed the budget, whole finished
//! (completed, canceled or abandoned) operations are dropped, just enough to fit, in this
//! order: first operations canceled before anything was issued (noise: an `Intent` and its
//! `Canceled`, e.g. from a re-planning loop), oldest first; then the other finished ones,
//! oldest first; the 8 most recently finished operations that issued something only as a last
//! resort (oldest first), when nothing else is left and they still do not fit (operations with
//! many per-member entries, e.g. coordinated restarts). Never dropped: an open operation; the
//! last completed operation of each kind; the operation whose restart token is
//! `lastRestartToken`; the operation whose entry answers the predecessor effect; the newest
//! entry's operation. So noise cannot evict real history, and what the planner reads from the
//! journal never changes by compaction.
//!
//! A dropped run at the front advances `compactedThrough`/`compactedHash`; a dropped run
//! between kept entries becomes a *hole* `{from, through, hash}` in the document, where `hash`
//! is entry `through`'s hash, which the next kept entry's `prev` links to. The chain verifies
//! across both exactly as before, and the mirror keeps every entry. Foreign records
//! (`Recovered` entries of unknown operations) are dropped like finished operations.

use std::collections::{HashMap, HashSet};

use crate::codec::{Document, Hole, HARD_MAX_BYTES};
use crate::fold::{Fold, Outcome};
use crate::journal::predecessor_entry;
use crate::model::{Entry, Hash, OperationId, Seq};

/// Default byte budget of the annotation (64 KiB, flag `--journal-annotation-bytes`).
pub const DEFAULT_BUDGET_BYTES: usize = 64 * 1024;

/// Smallest budget accepted: what compaction always keeps (the last 8 finished operations, the
/// last completed one of each other kind and the open one: about 24 KiB for rolling and scale
/// operations) must fit, or every append would fail. Operations that still do not fit (many
/// per-member entries) report `JournalOverBudget`.
pub const MIN_BUDGET_BYTES: usize = 32 * 1024;

/// How many of the most recently finished operations compaction always keeps.
pub const KEEP_FINISHED_OPERATIONS: usize = 8;

/// The configured byte budget, between [`MIN_BUDGET_BYTES`] and [`HARD_MAX_BYTES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget(usize);

/// A budget outside the accepted range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("journal annotation budget {bytes} bytes is outside {min}..={max}")]
pub struct BudgetError {
    /// Requested.
    pub bytes: usize,
    /// Minimum.
    pub min: usize,
    /// Maximum (the hard maximum).
    pub max: usize,
}

impl Budget {
    /// A budget of `bytes`.
    pub fn new(bytes: usize) -> Result<Budget, BudgetError> {
        if (MIN_BUDGET_BYTES..=HARD_MAX_BYTES).contains(&bytes) {
            Ok(Budget(bytes))
        } else {
            Err(BudgetError {
                bytes,
                min: MIN_BUDGET_BYTES,
                max: HARD_MAX_BYTES,
            })
        }
    }
    /// The budget in bytes.
    pub fn bytes(&self) -> usize {
        self.0
    }
}

impl Default for Budget {
    fn default() -> Self {
        Budget(DEFAULT_BUDGET_BYTES)
    }
}

/// Size of the annotation against its budget (condition `JournalSizeWarning`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeStatus {
    /// Encoded size in bytes (`status.journal.bytes`).
    pub bytes: usize,
    /// The budget.
    pub budget: usize,
    /// Whether compaction could drop anything now.
    pub compactable: bool,
}

impl SizeStatus {
    /// True above 75 % of the budget with nothing left to compact.
    pub fn warning(&self) -> bool {
        self.bytes * 4 > self.budget * 3 && !self.compactable
    }
}

/// What one compaction dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compaction {
    /// The new `compactedThrough` (last dropped seq).
    pub through: Seq,
    /// The new `compactedHash` (its hash).
    pub hash: Hash,
    /// Number of entries dropped by this compaction.
    pub dropped_entries: usize,
    /// Operations (and foreign records) whose entries were dropped.
    pub dropped_operations: Vec<OperationId>,
}

/// The append cannot fit in the budget even after all allowed compaction.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the journal would need {smallest} bytes after all allowed compaction, over the budget of {budget} bytes ({why})")]
pub struct OverBudget {
    /// Smallest size compaction can reach.
    pub smallest: usize,
    /// The budget.
    pub budget: usize,
    /// What stops further compaction.
    pub why: String,
}

/// The operations (and foreign records) compaction may drop, in the order it drops them, and
/// what it must keep. Dropped first: operations canceled before anything was issued (noise:
/// an `Intent` and its `Canceled`), oldest first; then the other finished operations, oldest
/// first. Always kept: open operations; the [`KEEP_FINISHED_OPERATIONS`] most recently
/// finished operations that issued something; the last completed operation of each kind;
/// the operation whose token is `lastRestartToken`; the operation whose entry answers the
/// predecessor effect; and the operation of the newest entry.
fn drop_order(doc: &Document, fold: &Fold) -> DropOrder {
    let mut keep: HashSet<OperationId> = fold.open_operations().map(|o| o.id()).collect();
    let recent: Vec<OperationId> = fold
        .finished_newest_first()
        .into_iter()
        .filter(|o| o.issued_anything())
        .take(KEEP_FINISHED_OPERATIONS)
        .map(|o| o.id())
        .collect();
    let mut last_of_kind: HashMap<String, (Seq, OperationId)> = HashMap::new();
    let mut last_token: Option<(Seq, OperationId)> = None;
    for o in fold.operations() {
        if let Some(c) = o.closure() {
            if matches!(c.outcome, Outcome::Completed(_)) {
                let slot = last_of_kind
                    .entry(o.kind().to_string())
                    .or_insert((c.seq, o.id()));
                if c.seq >= slot.0 {
                    *slot = (c.seq, o.id());
                }
                if o.intent().token.is_some() && last_token.is_none_or(|(s, _)| c.seq > s) {
                    last_token = Some((c.seq, o.id()));
                }
            }
        }
    }
    keep.extend(last_of_kind.values().map(|(_, id)| *id));
    keep.extend(last_token.map(|(_, id)| id));
    if let Some((e, _)) = predecessor_entry(&doc.entries) {
        keep.insert(e.op());
    }
    if let Some(newest) = doc.entries.last() {
        keep.insert(newest.op());
    }
    let mut noise = Vec::new();
    let mut rest = Vec::new();
    let mut seen = HashSet::new();
    for e in &doc.entries {
        let id = e.op();
        if keep.contains(&id) || recent.contains(&id) || !seen.insert(id) {
            continue;
        }
        match fold.operation(id) {
            Some(o) if !o.issued_anything() => noise.push(id),
            _ => rest.push(id),
        }
    }
    noise.extend(rest);
    // The recent ones, oldest first, only when nothing else is left to drop.
    let last_resort: Vec<OperationId> = recent
        .iter()
        .rev()
        .filter(|id| !keep.contains(id))
        .copied()
        .collect();
    let open = fold
        .open_operations()
        .next()
        .map(|o| format!("operation {} is open; ", o.id()))
        .unwrap_or_default();
    DropOrder {
        order: noise,
        last_resort,
        why: format!(
            "{open}open operations, the last completed operation of each kind, the last restart token's operation \
             and the predecessor effect are kept"
        ),
    }
}

/// What compaction may drop, in order.
struct DropOrder {
    /// Noise first, then older finished operations, oldest first.
    order: Vec<OperationId>,
    /// The [`KEEP_FINISHED_OPERATIONS`] most recently finished operations that are not kept for
    /// another reason, oldest first: dropped only when the budget cannot hold them (operations
    /// with many per-member entries, e.g. coordinated restarts of large fleets). The mirror
    /// keeps them.
    last_resort: Vec<OperationId>,
    /// What is never dropped, for `JournalOverBudget`.
    why: String,
}

/// `doc` without the entries of `dropped`: a dropped run at the front extends
/// `compactedThrough`; a dropped run between kept entries becomes a hole whose hash is the
/// `prev` of the entry after it. (The newest entry is never dropped, so no run is trailing.)
fn without(doc: &Document, dropped: &HashSet<OperationId>) -> Document {
    let entries: Vec<Entry> = doc
        .entries
        .iter()
        .filter(|e| !dropped.contains(&e.op()))
        .cloned()
        .collect();
    let (mut ct, mut ch) = (doc.compacted_through, doc.compacted_hash);
    let mut holes = Vec::new();
    let mut prev: Option<Seq> = None;
    for e in &entries {
        let after = prev.unwrap_or(ct);
        if e.seq() > after + 1 {
            if prev.is_none() {
                ct = e.seq() - 1;
                ch = e.prev();
            } else {
                holes.push(Hole {
                    from: after + 1,
                    through: e.seq() - 1,
                    hash: e.prev(),
                });
            }
        }
        prev = Some(e.seq());
    }
    Document {
        fleet_uid: doc.fleet_uid.clone(),
        seq: doc.seq,
        head: doc.head,
        compacted_through: ct,
        compacted_hash: ch,
        holes,
        entries,
    }
}

/// Compacts `doc` (whose operations are `fold`) just enough to fit `budget`, dropping whole
/// operations in [`drop_order`]. Returns `None` when it already fits.
pub(crate) fn compact_to_fit(
    doc: &Document,
    fold: &Fold,
    budget: Budget,
) -> Result<Option<(Document, Compaction)>, OverBudget> {
    if doc.encoded_len() <= budget.bytes() {
        return Ok(None);
    }
    let DropOrder {
        order,
        last_resort,
        why,
    } = drop_order(doc, fold);
    let mut dropped: HashSet<OperationId> = HashSet::new();
    let mut dropped_operations = Vec::new();
    let mut smallest = doc.encoded_len();
    for id in order.into_iter().chain(last_resort) {
        dropped.insert(id);
        dropped_operations.push(id);
        let compacted = without(doc, &dropped);
        smallest = compacted.encoded_len();
        if smallest <= budget.bytes() {
            let compaction = Compaction {
                through: compacted.compacted_through,
                hash: compacted.compacted_hash,
                dropped_entries: doc.entries.len() - compacted.entries.len(),
                dropped_operations,
            };
            return Ok(Some((compacted, compaction)));
        }
    }
    Err(OverBudget {
        smallest,
        budget: budget.bytes(),
        why,
    })
}

/// The size status of `doc` against `budget`.
pub(crate) fn size_status(doc: &Document, fold: &Fold, budget: Budget) -> SizeStatus {
    // Eating into the recent operations is compaction too, but worth a warning.
    let order = drop_order(doc, fold).order;
    SizeStatus {
        bytes: doc.encoded_len(),
        budget: budget.bytes(),
        compactable: !order.is_empty(),
    }
}
