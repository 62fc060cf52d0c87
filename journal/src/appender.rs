//! The seam between the journal and the place the annotation lives.
//!
//! [`Appender`] is a small synchronous trait: read the annotation with its version, and write a
//! new value with a compare-and-swap on that version. The crate stays free of any Kubernetes
//! client; the operator implements it over the fleet object (`metadata.resourceVersion` as the
//! version, a patch carrying it as the compare-and-swap).
//!
//! An async client does not need the trait at all: everything here is a thin wrapper around
//! [`Journal::load`] and [`Journal::stage`], so an async reconcile does
//!
//! ```text
//! let journal = Journal::load(annotations.get(JOURNAL_ANNOTATION), uid)?;  // pure
//! let staged = journal.stage(entry, budget)?;                             // pure
//! patch_with_resource_version(fleet, rv, staged.annotation()).await?;     // compare-and-swap
//! let entry = staged.entry().clone();
//! let journal = staged.into_journal();
//! mirror.record(journal.document(), &[entry])?; // flushed: only now issue the effect
//! ```
//!
//! After a conflict or an unknown outcome ([`AppendError::Lost`]: the request may or may not
//! have been applied) the caller drops what it holds; the next reconcile loads again and decides
//! from what is really there. Never retry an append blindly: that is how an entry gets written
//! twice.
//!
//! [`InMemoryAppender`] implements the trait for tests and can simulate conflicts, lost responses
//! (the write is applied but the caller gets an error) and unavailability.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::compaction::{Budget, Compaction, SizeStatus};
use crate::journal::{Journal, LoadError, StageError};
use crate::model::{Entry, NewEntry};

/// The annotation holding the journal.
pub const JOURNAL_ANNOTATION: &str = "celld.eric.dev/journal";

/// The version a compare-and-swap is conditioned on (the fleet's `metadata.resourceVersion`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Version(pub String);

/// The annotation as read, with its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The annotation value; `None` when the fleet has none yet.
    pub annotation: Option<String>,
    /// The version it was read at.
    pub version: Version,
}

/// A failed read or write of the annotation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AppendError {
    /// The version moved: someone else wrote the object. Nothing was written.
    #[error("conflict: the fleet changed since version {expected:?}")]
    Conflict {
        /// The version the write was conditioned on.
        expected: Version,
    },
    /// The outcome is unknown (timeout, connection lost after sending): the write may have been
    /// applied.
    #[error("the write's outcome is unknown: {reason}")]
    Lost {
        /// What happened.
        reason: String,
    },
    /// The store could not be reached; nothing was written.
    #[error("the journal store is unavailable: {reason}")]
    Unavailable {
        /// What happened.
        reason: String,
    },
}

/// Where the annotation lives.
pub trait Appender {
    /// Reads the annotation and its version.
    fn load(&self) -> Result<Snapshot, AppendError>;
    /// Writes `annotation` if the object is still at `expected`; returns the new version.
    fn compare_and_swap(
        &self,
        expected: &Version,
        annotation: &str,
    ) -> Result<Version, AppendError>;
}

/// Loading failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadFailure {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] AppendError),
    /// The annotation is not a valid journal for this fleet.
    #[error(transparent)]
    Journal(#[from] LoadError),
}

/// Appending failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AppendFailure {
    /// The entry was refused before anything was written.
    #[error(transparent)]
    Stage(#[from] StageError),
    /// The write failed or its outcome is unknown.
    #[error(transparent)]
    Store(#[from] AppendError),
}

/// A committed append.
#[derive(Debug, Clone)]
pub struct Appended {
    /// The journal after the append.
    pub journal: Journal,
    /// The object's new version.
    pub version: Version,
    /// The sealed entry, to mirror.
    pub entry: Entry,
    /// What compaction dropped.
    pub compaction: Option<Compaction>,
    /// The annotation's size.
    pub size: SizeStatus,
}

/// Loads and verifies the fleet's journal.
pub fn load_journal<A: Appender + ?Sized>(
    appender: &A,
    fleet_uid: &str,
) -> Result<(Journal, Version), LoadFailure> {
    let snapshot = appender.load()?;
    let journal = Journal::load(snapshot.annotation.as_deref(), fleet_uid)?;
    Ok((journal, snapshot.version))
}

/// Stages `entry` on `journal` (read at `version`) and writes it with a compare-and-swap.
pub fn append<A: Appender + ?Sized>(
    appender: &A,
    journal: &Journal,
    version: &Version,
    entry: NewEntry,
    budget: Budget,
) -> Result<Appended, AppendFailure> {
    let staged = journal.stage(entry, budget)?;
    let version = appender.compare_and_swap(version, staged.annotation())?;
    let entry = staged.entry().clone();
    let compaction = staged.compaction().cloned();
    let size = staged.size();
    Ok(Appended {
        journal: staged.into_journal(),
        version,
        entry,
        compaction,
        size,
    })
}

/// A fault the [`InMemoryAppender`] injects into one compare-and-swap call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Refuse with [`AppendError::Conflict`]; nothing written.
    Conflict,
    /// Apply the write, then report [`AppendError::Lost`].
    LoseResponse,
    /// Refuse with [`AppendError::Unavailable`]; nothing written.
    Unavailable,
}

#[derive(Debug, Default)]
struct MemoryState {
    annotation: Option<String>,
    version: u64,
    cas_calls: u64,
    scheduled: BTreeMap<u64, Fault>,
    writes: Vec<String>,
}

/// An in-memory annotation with a version counter, for tests.
#[derive(Debug, Default)]
pub struct InMemoryAppender {
    state: Mutex<MemoryState>,
}

impl InMemoryAppender {
    /// No annotation, version 1.
    pub fn new() -> Self {
        let a = Self::default();
        a.lock().version = 1;
        a
    }

    /// Starts with `annotation`.
    pub fn with_annotation(annotation: impl Into<String>) -> Self {
        let a = Self::new();
        a.lock().annotation = Some(annotation.into());
        a
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the next compare-and-swap call fail with `fault`.
    pub fn inject(&self, fault: Fault) {
        let mut s = self.lock();
        let next = s.cas_calls + 1;
        s.scheduled.insert(next, fault);
    }

    /// Makes the `call`-th compare-and-swap call (counting from 1 since creation) fail with
    /// `fault`.
    pub fn inject_at(&self, call: u64, fault: Fault) {
        self.lock().scheduled.insert(call, fault);
    }

    /// Someone else wrote the object (e.g. a label): the version moves, the annotation does not.
    pub fn touch(&self) {
        self.lock().version += 1;
    }

    /// Replaces the annotation behind the journal's back (a hand edit, a restore from backup).
    pub fn set_annotation(&self, annotation: Option<String>) {
        let mut s = self.lock();
        s.annotation = annotation;
        s.version += 1;
    }

    /// The current annotation.
    pub fn annotation(&self) -> Option<String> {
        self.lock().annotation.clone()
    }

    /// Every value written by a compare-and-swap that was applied, in order.
    pub fn writes(&self) -> Vec<String> {
        self.lock().writes.clone()
    }

    /// Number of compare-and-swap calls so far.
    pub fn cas_calls(&self) -> u64 {
        self.lock().cas_calls
    }
}

impl Appender for InMemoryAppender {
    fn load(&self) -> Result<Snapshot, AppendError> {
        let s = self.lock();
        Ok(Snapshot {
            annotation: s.annotation.clone(),
            version: Version(s.version.to_string()),
        })
    }

    fn compare_and_swap(
        &self,
        expected: &Version,
        annotation: &str,
    ) -> Result<Version, AppendError> {
        let mut s = self.lock();
        s.cas_calls += 1;
        let call = s.cas_calls;
        let fault = s.scheduled.remove(&call);
        match fault {
            Some(Fault::Conflict) => {
                return Err(AppendError::Conflict {
                    expected: expected.clone(),
                })
            }
            Some(Fault::Unavailable) => {
                return Err(AppendError::Unavailable {
                    reason: "injected".to_owned(),
                })
            }
            _ => {}
        }
        if expected.0 != s.version.to_string() {
            return Err(AppendError::Conflict {
                expected: expected.clone(),
            });
        }
        s.annotation = Some(annotation.to_owned());
        s.version += 1;
        s.writes.push(annotation.to_owned());
        if fault == Some(Fault::LoseResponse) {
            return Err(AppendError::Lost {
                reason: "injected: the write was applied but the response was lost".to_owned(),
            });
        }
        Ok(Version(s.version.to_string()))
    }
}
