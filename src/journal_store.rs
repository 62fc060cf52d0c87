//! The journal's home on the cluster: the fleet annotation `celld.eric.dev/journal`,
//! appended with compare-and-swap, then mirrored to the local sled store.
//!
//! Order matters (docs/journal.md "Where it lives"): the annotation is the authority, so an
//! entry exists once the patch carrying the fleet's `metadata.resourceVersion` is
//! accepted; only then is it written to the mirror and flushed, and only after that may
//! the effect it announces be issued. A conflict or an unknown outcome is never retried
//! here: the next reconcile reads the fleet again and decides from what is there.

use journal::{Budget, Entry, Journal, LoadError, Mirror, MirrorError, NewEntry, StageError};
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;

use crate::api::keys::{JOURNAL_ANNOTATION, JOURNAL_COMMAND_ANNOTATION};
use crate::api::CelldFleet;

/// Why an append did not commit.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    /// The entry is illegal here or does not fit the budget; nothing was written.
    #[error(transparent)]
    Stage(#[from] StageError),
    /// The fleet changed since it was read (HTTP 409); nothing was written.
    #[error("the fleet changed since resourceVersion {0}; the next reconcile decides again")]
    Conflict(String),
    /// The request failed; it may or may not have been applied.
    #[error("appending to the journal annotation failed (outcome unknown): {0}")]
    Unknown(#[source] kube::Error),
    /// The fleet lacks a name, namespace or resourceVersion.
    #[error("the fleet object lacks {0}")]
    Incomplete(&'static str),
    /// The committed entry could not be mirrored; the effect must not be issued.
    #[error("mirroring the committed entry failed: {0}")]
    Mirror(#[from] MirrorError),
}

/// Loads and verifies the journal held by a fleet object.
pub fn load(fleet: &CelldFleet) -> Result<Journal, LoadError> {
    let uid = fleet.uid().unwrap_or_default();
    Journal::load(
        fleet
            .annotations()
            .get(JOURNAL_ANNOTATION)
            .map(String::as_str),
        &uid,
    )
}

/// A committed append.
#[derive(Debug)]
pub struct Committed {
    /// The journal after the append.
    pub journal: Journal,
    /// The sealed entries, oldest first (each is published as an Event).
    pub entries: Vec<Entry>,
    /// The fleet as the API server returned it (new resourceVersion).
    pub fleet: CelldFleet,
    /// `JournalDiverged` / `JournalRollback` found while mirroring (publish as Warning Events).
    pub signals: Vec<journal::Signal>,
}

/// Makes sure the mirror holds every entry of `journal` on disk before an effect is issued
/// (docs/journal.md "Where it lives"): a mirror write that failed after its annotation append
/// committed is caught up here, or the effect waits. A mirror that already holds the newest
/// entry is flushed too: an append whose flush failed left its entries in sled's memory only
/// (a flush with nothing to write costs nothing).
pub fn ensure_mirrored(
    mirror: &Mirror,
    journal: &Journal,
) -> Result<Vec<journal::Signal>, MirrorError> {
    let doc = journal.document();
    if doc.seq() == 0 {
        return Ok(Vec::new());
    }
    if mirror.head(journal.fleet_uid())?.map(|(seq, _)| seq) == Some(doc.seq()) {
        mirror.flush()?;
        return Ok(Vec::new());
    }
    Ok(mirror.reconcile(doc)?.signals)
}

/// Appends `entries` (one or more, in order) to the journal of `fleet` (as read, with its
/// resourceVersion) in one compare-and-swap, then mirrors them. Several entries in one write
/// commit together or not at all: an operation's `Observed` and `Completed` are one write
/// (docs/design.md "Journal writes"). `remove` names annotations removed in the same write: a
/// consumed `journal-command` (so a command is consumed exactly when its entry is committed),
/// or a `replace-member` request closed by this entry.
pub async fn append(
    api: &Api<CelldFleet>,
    fleet: &CelldFleet,
    journal: &Journal,
    entries: Vec<NewEntry>,
    budget: Budget,
    mirror: Option<&Mirror>,
    remove: &[&str],
) -> Result<Committed, AppendError> {
    if entries.is_empty() {
        return Err(AppendError::Incomplete("an entry to append"));
    }
    // Each entry is staged on the journal the one before it produced: its seq, prev hash,
    // legality in the fold and the budget (with compaction) are checked as if appended alone.
    let mut staged_journal = journal.clone();
    let mut sealed = Vec::with_capacity(entries.len());
    let mut annotation = String::new();
    for entry in entries {
        let staged = staged_journal.stage(entry, budget)?;
        annotation = staged.annotation().to_owned();
        sealed.push(staged.entry().clone());
        staged_journal = staged.into_journal();
    }
    let name = fleet
        .metadata
        .name
        .as_deref()
        .ok_or(AppendError::Incomplete("a name"))?;
    let rv = fleet
        .metadata
        .resource_version
        .as_deref()
        .ok_or(AppendError::Incomplete("a resourceVersion"))?;
    let mut annotations = serde_json::Map::new();
    annotations.insert(JOURNAL_ANNOTATION.into(), json!(annotation));
    for key in remove {
        annotations.insert((*key).into(), serde_json::Value::Null);
    }
    // A merge patch that names metadata.resourceVersion is a compare-and-swap: the API
    // server answers 409 if the fleet moved on.
    let patch = json!({"metadata": {"resourceVersion": rv, "annotations": annotations}});
    let patched = match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(f) => f,
        Err(kube::Error::Api(status)) if status.code == 409 => {
            return Err(AppendError::Conflict(rv.to_string()))
        }
        Err(e) => return Err(AppendError::Unknown(e)),
    };
    let journal = staged_journal;
    let mut signals = Vec::new();
    if let Some(mirror) = mirror {
        // `record` flushes; a mirror that is behind is reconciled (once, inside `record`)
        // from the annotation just written, which is verified: it is this journal plus the
        // sealed entries. The reconcile's signals are published by the caller.
        if let Some(plan) = mirror.record(journal.document(), &sealed)? {
            signals = plan.signals;
        }
    }
    Ok(Committed {
        journal,
        entries: sealed,
        fleet: patched,
        signals,
    })
}

/// Sets the `journal-command` annotation (`abandon <op>` / `retry <op>`), conditioned on
/// the fleet's resourceVersion so a command never lands on a fleet the user did not see.
pub async fn send_command(
    api: &Api<CelldFleet>,
    name: &str,
    command: &str,
) -> Result<(), kube::Error> {
    // A compare-and-swap on a fresh read; the operator writes the fleet often (journal,
    // status), so a conflict is read again and retried a few times instead of failing the
    // person's command.
    let mut attempt = 0;
    loop {
        let fleet = api.get(name).await?;
        let patch = json!({"metadata": {
            "resourceVersion": fleet.metadata.resource_version,
            "annotations": {JOURNAL_COMMAND_ANNOTATION: command}
        }});
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < 9 => {
                attempt += 1;
                tokio::time::sleep(std::time::Duration::from_millis(100 * attempt)).await;
            }
            Err(e) => return Err(e),
        }
    }
}
