//! The byte budget and compaction (journal.md "Compaction").
//!
//! When an append would make the encoded annotation exceed the budget, the oldest entries of
//! finished (completed, canceled or abandoned) operations are dropped — never an entry of an open
//! operation, and never one of the 8 most recently finished operations. What is dropped is always
//! a prefix of the chain made of whole operations (an operation is never half-dropped), so the
//! rest still verifies from `compactedThrough`/`compactedHash`. Only as much is dropped as needed
//! to fit. Foreign records (`Recovered` entries of unknown operations) count as finished but not
//! as one of the 8 kept operations.
//!
//! Because the dropped prefix must be contiguous, an old open operation (an adoption left open
//! while later operations ran) also protects everything after its `Intent`.

use std::collections::{HashMap, HashSet};

use crate::codec::{encoded_len_parts, Document, HARD_MAX_BYTES};
use crate::fold::Fold;
use crate::model::{Entry, Hash, OperationId, Seq};

/// Default byte budget of the annotation (64 KiB, flag `--journal-annotation-bytes`).
pub const DEFAULT_BUDGET_BYTES: usize = 64 * 1024;

/// Smallest budget accepted: below this not even a few operations fit.
pub const MIN_BUDGET_BYTES: usize = 4 * 1024;

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

/// Numbers of leading entries that may be dropped (ascending, each a whole-operation boundary),
/// and why no larger prefix may be.
fn cut_points(entries: &[Entry], fold: &Fold) -> (Vec<usize>, String) {
    // Finished operations, newest first; the first KEEP_FINISHED_OPERATIONS are protected.
    let protected: HashSet<OperationId> = fold
        .finished_newest_first()
        .into_iter()
        .take(KEEP_FINISHED_OPERATIONS)
        .map(|o| o.id())
        .collect();
    let mut last_seq: HashMap<OperationId, Seq> = HashMap::new();
    for o in fold.operations() {
        last_seq.insert(o.id(), o.last_seq());
    }
    for f in fold.foreign_records() {
        last_seq.insert(f.id(), f.entries().last().map_or(0, |e| e.seq()));
    }
    let open: HashSet<OperationId> = fold.open_operations().map(|o| o.id()).collect();

    let mut cuts = Vec::new();
    let mut reach: Seq = 0; // highest last seq of every group touched so far
    for (i, e) in entries.iter().enumerate() {
        let op = e.op();
        if open.contains(&op) {
            return (cuts, format!("operation {op} is open"));
        }
        if protected.contains(&op) {
            return (
                cuts,
                format!("the last {KEEP_FINISHED_OPERATIONS} finished operations are kept"),
            );
        }
        reach = reach.max(last_seq.get(&op).copied().unwrap_or(e.seq()));
        if reach == e.seq() {
            cuts.push(i + 1);
        }
    }
    (cuts, "no entries are left".to_owned())
}

fn size_after_cut(doc: &Document, entries: &[Entry], cut: usize) -> usize {
    let (ct, ch) = if cut == 0 {
        (doc.compacted_through, doc.compacted_hash)
    } else {
        (entries[cut - 1].seq(), entries[cut - 1].hash())
    };
    encoded_len_parts(
        &doc.fleet_uid,
        doc.seq,
        &doc.head,
        ct,
        &ch,
        entries[cut..].iter().map(|e| e.to_json().len()),
    )
}

/// Compacts `doc` (whose operations are `fold`) just enough to fit `budget`. Returns `None` when
/// it already fits.
pub(crate) fn compact_to_fit(
    doc: &Document,
    fold: &Fold,
    budget: Budget,
) -> Result<Option<(Document, Compaction)>, OverBudget> {
    if doc.encoded_len() <= budget.bytes() {
        return Ok(None);
    }
    let (cuts, why) = cut_points(&doc.entries, fold);
    let mut smallest = doc.encoded_len();
    for cut in cuts {
        let size = size_after_cut(doc, &doc.entries, cut);
        smallest = size;
        if size <= budget.bytes() {
            let dropped = &doc.entries[..cut];
            let last = dropped.last().expect("a cut drops at least one entry");
            let mut dropped_operations: Vec<OperationId> = Vec::new();
            for e in dropped {
                if !dropped_operations.contains(&e.op()) {
                    dropped_operations.push(e.op());
                }
            }
            let compaction = Compaction {
                through: last.seq(),
                hash: last.hash(),
                dropped_entries: cut,
                dropped_operations,
            };
            let compacted = Document {
                fleet_uid: doc.fleet_uid.clone(),
                seq: doc.seq,
                head: doc.head,
                compacted_through: compaction.through,
                compacted_hash: compaction.hash,
                entries: doc.entries[cut..].to_vec(),
            };
            debug_assert_eq!(compacted.encoded_len(), size);
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
    let (cuts, _) = cut_points(&doc.entries, fold);
    SizeStatus {
        bytes: doc.encoded_len(),
        budget: budget.bytes(),
        compactable: !cuts.is_empty(),
    }
}
