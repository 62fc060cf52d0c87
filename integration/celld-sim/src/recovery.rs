//! Recovery of a leader session to the store: from the local log when this disk holds it, else
//! from the store plus every follower's fragment, fetched by peer name (and sealed, so a fenced
//! leader cannot add behind the recovery's back).
//!
//! While a follower that may hold entries is unreachable, recovery fails and is retried: nothing
//! is answered from incomplete data. Only when every holder answered and one of them conclusively
//! lost its copy (its disk is a new incarnation) is `log/<session>.loss.json` written; recovery
//! then continues without the lost entries.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::json;
use thiserror::Error;

use crate::disk::{self, blocking};
use crate::model::{
    complete_key, covered_key, data_key, loss_key, now_ms, DataRecord, Entry, Holder, LossRecord,
    SessionRef,
};
use crate::node::Node;
use crate::peer;
use crate::store::{Cond, StoreError};

#[derive(Debug, Error)]
pub enum RecoveryError {
    #[error("follower {node} (holding part of session {session}) is unreachable: {why}")]
    Unreachable {
        node: String,
        session: String,
        why: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("local disk: {0}")]
    Disk(#[from] std::io::Error),
}

pub async fn recover_sessions(
    node: &Arc<Node>,
    sessions: &[SessionRef],
) -> Result<(), RecoveryError> {
    for s in sessions {
        recover_session(node, s).await?;
    }
    Ok(())
}

pub async fn recover_session(node: &Arc<Node>, s: &SessionRef) -> Result<(), RecoveryError> {
    if s.session == node.session {
        return Ok(());
    }
    let mine = s.owner == node.cfg.node;
    if node.store.exists(&complete_key(&s.session)).await? {
        if mine {
            blocking(|| disk::remove_session_log(&node.cfg.watch, &s.session))?;
        }
        return Ok(());
    }
    let local = if mine {
        blocking(|| disk::read_session_log(&node.cfg.watch, &s.session))?
    } else {
        None
    };
    let mut entries: BTreeMap<u64, Entry> = BTreeMap::new();
    let mut lost: Vec<Holder> = Vec::new();
    match &local {
        // The local log has every entry this session acknowledged (fsync precedes replication).
        Some(log) => {
            for e in log {
                entries.insert(e.seq, e.clone());
            }
        }
        None => {
            let names: BTreeSet<&str> = s.followers.iter().map(|h| h.node.as_str()).collect();
            for name in names {
                let recorded: Vec<&Holder> =
                    s.followers.iter().filter(|h| h.node == name).collect();
                let mut outstanding = Vec::new();
                for h in recorded {
                    if !node.store.exists(&covered_key(&s.session, h)).await? {
                        outstanding.push(h);
                    }
                }
                if outstanding.is_empty() {
                    continue;
                }
                let answer = if name == node.cfg.node {
                    let a = blocking(|| {
                        node.fragments
                            .lock()
                            .expect("fragments")
                            .fetch(&s.session, true)
                    })?;
                    peer::FetchAnswer {
                        node: name.to_string(),
                        disk_incarnation: node.disk_incarnation.clone(),
                        known: a.known,
                        entries: a.entries,
                        covered_seq: a.covered_seq,
                        sealed: a.sealed,
                        dropped: a.dropped,
                    }
                } else {
                    let unreachable = |why: String| RecoveryError::Unreachable {
                        node: name.to_string(),
                        session: s.session.clone(),
                        why,
                    };
                    let addr =
                        node.lease_of(name).await?.map(|l| l.addr).ok_or_else(|| {
                            unreachable("no lease record names its address".into())
                        })?;
                    peer::fetch(node, &addr, &s.session, true)
                        .await
                        .map_err(|e| unreachable(e.to_string()))?
                };
                for e in answer.entries {
                    entries.insert(e.seq, e);
                }
                for h in outstanding {
                    if h.disk_incarnation != answer.disk_incarnation {
                        lost.push(h.clone());
                    }
                }
            }
        }
    }
    if !lost.is_empty() {
        let record = LossRecord {
            session: s.session.clone(),
            owner: s.owner.clone(),
            lost_holders: lost.clone(),
            recovered_entries: entries.len(),
            written_by: node.cfg.node.clone(),
            at_ms: now_ms(),
            note: "these holders' disks were replaced; entries only they held and that were not \
                   flushed to the store are lost"
                .into(),
        };
        match node
            .store
            .put_json(&loss_key(&s.session), &record, Cond::Absent)
            .await
        {
            Ok(_) | Err(StoreError::PreconditionFailed) => {}
            Err(e) => return Err(e.into()),
        }
        tracing::error!(session = %s.session, lost = ?lost, "session data lost: wrote the loss record");
    }
    for e in entries.values() {
        let rec = DataRecord {
            cell: e.cell.clone(),
            id: e.id.clone(),
            epoch: e.epoch,
            node: s.owner.clone(),
            session: s.session.clone(),
            seq: e.seq,
        };
        node.store
            .put_json(&data_key(&e.cell, e.epoch, &e.id), &rec, Cond::None)
            .await?;
    }
    node.store
        .put_json(
            &complete_key(&s.session),
            &json!({ "session": s.session, "by": node.cfg.node, "entries": entries.len(), "at_ms": now_ms() }),
            Cond::None,
        )
        .await?;
    tracing::info!(session = %s.session, entries = entries.len(), from_local_log = local.is_some(), "session recovered to the store");
    peer::drop_session_at(node, &s.followers, &s.session).await;
    if s.followers.iter().any(|h| h.node == node.cfg.node) {
        blocking(|| {
            node.fragments
                .lock()
                .expect("fragments")
                .drop_session(&s.session)
        })?;
    }
    if local.is_some() {
        blocking(|| disk::remove_session_log(&node.cfg.watch, &s.session))?;
    }
    Ok(())
}
