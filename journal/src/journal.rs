//! [`Journal`]: a verified annotation document together with the fold of its operations, and
//! [`Staged`]: the next document, computed but not yet written.
//!
//! ```text
//! load annotation ──decode──▶ Document ──verify + fold──▶ Journal
//! Journal.stage(NewEntry, budget) ──▶ Staged { annotation text, entry, compaction }
//!        compare-and-swap the text (Appender, or the operator's async client)
//! on success: Staged.into_journal() ──▶ Journal; then mirror the entry and flush
//! on conflict or unknown outcome: drop both and start the next reconcile from a fresh load
//! ```

use crate::chain::{self, ChainError};
use crate::codec::{self, DecodeError, Document};
use crate::compaction::{self, Budget, Compaction, OverBudget, SizeStatus};
use crate::fold::{Fold, TransitionError};
use crate::model::*;

/// Why an annotation could not be taken as this fleet's journal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// Not a well-formed document.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// The document belongs to another fleet (e.g. copied with the object's metadata).
    #[error("the journal belongs to fleet {found}, not to this fleet ({expected})")]
    ForeignFleet {
        /// This fleet's UID.
        expected: String,
        /// The document's `fleetUID`.
        found: String,
    },
    /// The hash chain does not verify.
    #[error("journal chain is broken: {0}")]
    Chain(#[from] ChainError),
    /// An entry breaks the transition rules.
    #[error("journal entry {seq} is not a legal transition: {error}")]
    Transition {
        /// The entry.
        seq: Seq,
        /// The rule it breaks.
        error: TransitionError,
    },
    /// A rebuilt history does not fit the budget even after compaction.
    #[error(transparent)]
    OverBudget(OverBudget),
}

/// Why an entry cannot be appended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StageError {
    /// The transition rules refuse it.
    #[error(transparent)]
    Transition(#[from] TransitionError),
    /// Its JSON would not decode back to the same entry (e.g. an empty optional string).
    #[error("the entry cannot be stored: {0}")]
    Unencodable(DecodeError),
    /// Even after compaction it does not fit the budget.
    #[error(transparent)]
    OverBudget(#[from] OverBudget),
}

/// A verified journal: the annotation document and the fold of its operations.
#[derive(Debug, Clone)]
pub struct Journal {
    doc: Document,
    fold: Fold,
}

impl Journal {
    /// The journal of a fleet that has none yet (no annotation).
    pub fn new(fleet_uid: impl Into<String>) -> Journal {
        Journal {
            doc: Document::empty(fleet_uid),
            fold: Fold::default(),
        }
    }

    /// Decodes and loads the annotation value; `None` (no annotation) is an empty journal.
    pub fn load(annotation: Option<&str>, fleet_uid: &str) -> Result<Journal, LoadError> {
        match annotation {
            None => Ok(Journal::new(fleet_uid)),
            Some(text) => Journal::from_document(codec::decode_document(text)?, fleet_uid),
        }
    }

    /// Takes a decoded document: checks the fleet UID, verifies the chain and folds the entries
    /// under the transition rules.
    pub fn from_document(doc: Document, fleet_uid: &str) -> Result<Journal, LoadError> {
        if doc.fleet_uid() != fleet_uid {
            return Err(LoadError::ForeignFleet {
                expected: fleet_uid.to_owned(),
                found: doc.fleet_uid().to_owned(),
            });
        }
        chain::verify(&doc)?;
        let fold = Fold::from_entries(doc.entries())
            .map_err(|(seq, error)| LoadError::Transition { seq, error })?;
        Ok(Journal { doc, fold })
    }

    /// The annotation document.
    pub fn document(&self) -> &Document {
        &self.doc
    }
    /// The folded operations.
    pub fn fold(&self) -> &Fold {
        &self.fold
    }
    /// The entries still in the annotation, oldest first.
    pub fn entries(&self) -> &[Entry] {
        self.doc.entries()
    }
    /// The fleet UID.
    pub fn fleet_uid(&self) -> &str {
        self.doc.fleet_uid()
    }

    /// Checks an entry against the transition rules without staging it.
    pub fn check(&self, entry: &NewEntry) -> Result<(), TransitionError> {
        self.fold.check(entry.op, &entry.body)
    }

    /// Computes the journal after appending `entry`: checks the transition, seals it onto the
    /// chain, compacts just enough to fit `budget`, and encodes the annotation. Nothing is
    /// written; see the module docs for what to do with the result.
    pub fn stage(&self, entry: NewEntry, budget: Budget) -> Result<Staged, StageError> {
        self.fold.check(entry.op, &entry.body)?;
        let sealed = chain::seal(self.doc.seq(), self.doc.head(), entry);
        // Store only what reads back identically: the decoder is the single definition of the
        // format, so a value it would refuse must not be written in the first place.
        match codec::decode_entry(sealed.to_json()) {
            Ok(back) if back == sealed => {}
            Ok(_) => {
                return Err(StageError::Unencodable(DecodeError::InvalidValue {
                    path: "the entry".to_owned(),
                    problem: "does not read back identically".to_owned(),
                }))
            }
            Err(e) => return Err(StageError::Unencodable(e)),
        }
        let mut doc = self.doc.clone();
        doc.seq = sealed.seq();
        doc.head = sealed.hash();
        doc.entries.push(sealed.clone());
        let mut fold = self.fold.clone();
        fold.apply_unchecked(&sealed);
        let compaction = match compaction::compact_to_fit(&doc, &fold, budget)? {
            None => None,
            Some((compacted, report)) => {
                doc = compacted;
                fold.forget(&report.dropped_operations);
                Some(report)
            }
        };
        let size = compaction::size_status(&doc, &fold, budget);
        let annotation = doc.encode();
        debug_assert_eq!(annotation.len(), size.bytes);
        Ok(Staged {
            journal: Journal { doc, fold },
            entry: sealed,
            compaction,
            size,
            annotation,
        })
    }

    /// Size of the annotation against `budget` (`status.journal.bytes`, `JournalSizeWarning`).
    pub fn size_status(&self, budget: Budget) -> SizeStatus {
        compaction::size_status(&self.doc, &self.fold, budget)
    }

    /// The last effect this journal issued on the workload (a step that writes the marker
    /// `celld.eric.dev/effect`: create, replicas, template, stop, resume), which a new
    /// operation's first guarded write requires as the workload's current marker.
    ///
    /// Walks back from the newest entry: an `Issued` or `Recovered` of a marker step answers;
    /// an `Intent` of a workload-writing kind answers with its recorded `predecessorEffect`
    /// (which is why every Intent records it: after compaction the `Issued` may be gone);
    /// a `MemberReplacement` Intent answers only if it recorded one.
    pub fn predecessor_effect(&self) -> Option<Effect> {
        predecessor_entry(self.doc.entries()).and_then(|(_, effect)| effect)
    }

    /// `status.lastRestartToken`: see [`Fold::last_restart_token`].
    pub fn last_restart_token(&self) -> Option<&str> {
        self.fold.last_restart_token()
    }

    /// Compares the workload's live effect marker (`celld.eric.dev/effect`) with this journal
    /// (docs/design.md "The guarded write", steps 2 to 4). Pure: the caller read the workload
    /// fresh.
    ///
    /// - equal to [`Journal::predecessor_effect`] (or both absent) → [`MarkerCheck::Expected`];
    /// - an effect of a marker-writing step that this journal may still record (an operation
    ///   whose write landed but was never recorded, e.g. abandoned or canceled after a kill
    ///   between write and record, or an operation the annotation does not hold at all, e.g.
    ///   restored from an older copy) → [`MarkerCheck::Unrecorded`]: record it `Recovered`,
    ///   never reissue it;
    /// - anything else (no marker, not a marker, an effect this journal already recorded but
    ///   not as its last one) → [`MarkerCheck::Mismatch`]: no new plan can change that, so a
    ///   person decides; the operator writes nothing to the workload meanwhile.
    pub fn check_marker(&self, live: Option<&str>) -> MarkerCheck {
        let expected = self.predecessor_effect();
        if expected.as_ref().map(ToString::to_string).as_deref() == live {
            return MarkerCheck::Expected;
        }
        let mismatch = |why: &str| MarkerCheck::Mismatch {
            found: live.map(str::to_owned),
            expected: expected.clone(),
            why: why.to_owned(),
        };
        let Some(text) = live else {
            return mismatch("the marker is missing (removed by hand, or the workload was recreated or restored without it)");
        };
        let Ok(effect) = text.parse::<Effect>() else {
            return mismatch("the value is not an effect marker written by this operator");
        };
        if !effect.step.writes_workload_marker() {
            return mismatch("the step does not write the workload marker");
        }
        let recovered = EntryBody::Recovered(Recovered {
            effect: effect.clone(),
            source: "workload-marker".to_owned(),
        });
        match self.fold.check(effect.op, &recovered) {
            Ok(()) => MarkerCheck::Unrecorded(effect),
            Err(_) => mismatch(
                "the journal already recorded that effect, and later ones (a workload restored from a backup, or a write by another operator)",
            ),
        }
    }

    /// Rebuilds a journal from a fleet's history (the mirror's entries or an export, oldest
    /// first): the chain must verify from its first entry (seq 1 from zeros, or a later seq whose
    /// `prev` is taken as the compacted prefix), every entry must fold under the transition
    /// rules, and the result is compacted to fit `budget` the way appends compact. Used by
    /// `journal restore` to write a verified chain back to the annotation.
    pub fn from_history(
        fleet_uid: &str,
        entries: Vec<Entry>,
        budget: Budget,
    ) -> Result<Journal, LoadError> {
        let (compacted_through, compacted_hash) = match entries.first() {
            Some(first) if first.seq() > 1 => (first.seq() - 1, first.prev()),
            _ => (0, Hash::ZERO),
        };
        let (seq, head) = match entries.last() {
            Some(last) => (last.seq(), last.hash()),
            None => (0, Hash::ZERO),
        };
        let doc = Document {
            fleet_uid: fleet_uid.to_owned(),
            seq,
            head,
            compacted_through,
            compacted_hash,
            holes: Vec::new(),
            entries,
        };
        let journal = Journal::from_document(doc, fleet_uid)?;
        match compaction::compact_to_fit(&journal.doc, &journal.fold, budget) {
            Ok(None) => Ok(journal),
            Ok(Some((doc, report))) => {
                let mut fold = journal.fold;
                fold.forget(&report.dropped_operations);
                Ok(Journal { doc, fold })
            }
            Err(over) => Err(LoadError::OverBudget(over)),
        }
    }
}

/// What the workload's effect marker says against the journal ([`Journal::check_marker`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkerCheck {
    /// The marker is the journal's last effect (or both are absent).
    Expected,
    /// The marker names an effect this journal did not record: record it `Recovered`; it is
    /// then the predecessor of the next write.
    Unrecorded(Effect),
    /// The marker contradicts the journal in a way no new plan can resolve.
    Mismatch {
        /// The live marker.
        found: Option<String>,
        /// The journal's last effect.
        expected: Option<Effect>,
        /// Why it cannot be recorded.
        why: String,
    },
}

/// The entry that answers [`Journal::predecessor_effect`], and its answer (compaction keeps
/// that entry's operation, so the answer never changes by compaction).
pub(crate) fn predecessor_entry(entries: &[Entry]) -> Option<(&Entry, Option<Effect>)> {
    for e in entries.iter().rev() {
        match e.body() {
            EntryBody::Issued(i) if i.step.writes_workload_marker() => {
                return Some((e, Some(i.effect.clone())))
            }
            EntryBody::Recovered(r) if r.effect.step.writes_workload_marker() => {
                return Some((e, Some(r.effect.clone())))
            }
            EntryBody::Intent(i) if i.kind.writes_workload() || i.predecessor_effect.is_some() => {
                return Some((e, i.predecessor_effect.clone()))
            }
            _ => {}
        }
    }
    None
}

/// The result of [`Journal::stage`]: the annotation text to compare-and-swap, and the journal it
/// becomes once the write is acknowledged.
#[derive(Debug, Clone)]
pub struct Staged {
    journal: Journal,
    entry: Entry,
    compaction: Option<Compaction>,
    size: SizeStatus,
    annotation: String,
}

impl Staged {
    /// The new annotation value (compact JSON, within the budget).
    pub fn annotation(&self) -> &str {
        &self.annotation
    }
    /// The sealed entry (mirror it after the write is acknowledged).
    pub fn entry(&self) -> &Entry {
        &self.entry
    }
    /// What compaction dropped, if anything.
    pub fn compaction(&self) -> Option<&Compaction> {
        self.compaction.as_ref()
    }
    /// Size of the new annotation.
    pub fn size(&self) -> SizeStatus {
        self.size
    }
    /// The new document.
    pub fn document(&self) -> &Document {
        &self.journal.doc
    }
    /// The journal as it is once the write is acknowledged. Call only after the
    /// compare-and-swap succeeded.
    pub fn into_journal(self) -> Journal {
        self.journal
    }
}
