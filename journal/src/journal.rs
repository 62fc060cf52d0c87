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
        for e in self.doc.entries().iter().rev() {
            match e.body() {
                EntryBody::Issued(i) if i.step.writes_workload_marker() => {
                    return Some(i.effect.clone())
                }
                EntryBody::Recovered(r) if r.effect.step.writes_workload_marker() => {
                    return Some(r.effect.clone())
                }
                EntryBody::Intent(i) if i.kind.writes_workload() => {
                    return i.predecessor_effect.clone()
                }
                EntryBody::Intent(i) if i.predecessor_effect.is_some() => {
                    return i.predecessor_effect.clone()
                }
                _ => {}
            }
        }
        None
    }

    /// `status.lastRestartToken`: see [`Fold::last_restart_token`].
    pub fn last_restart_token(&self) -> Option<&str> {
        self.fold.last_restart_token()
    }
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
