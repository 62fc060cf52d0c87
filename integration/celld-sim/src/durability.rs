//! PersistentFleet durability: replication of each log entry to one follower, and the background
//! flusher that uploads the log to the store and lets followers drop covered fragments.

use std::sync::Arc;

use thiserror::Error;

use crate::disk::blocking;
use crate::lease::LeaseError;
use crate::model::{data_key, now_ms, DataRecord, Entry, Holder, LeaseRecord};
use crate::node::Node;
use crate::peer::{self, AppendError};
use crate::store::{Cond, StoreError};

#[derive(Debug, Error)]
pub enum ReplicateError {
    /// No live member accepted the entry: the caller falls back to the Bucket rule.
    #[error("no live follower")]
    NoFollower,
    #[error("recording a follower in the lease failed: {0}")]
    Lease(String),
}

/// Live fleet members that may follow this node, in ring order starting after this node.
pub fn follower_candidates(node: &Node) -> Vec<LeaseRecord> {
    let now = now_ms();
    let mut live: Vec<LeaseRecord> = node
        .members
        .read()
        .expect("members")
        .iter()
        .filter(|m| m.node != node.cfg.node && m.serving_at(now) && m.durability == "fleet")
        .cloned()
        .collect();
    live.sort_by(|a, b| a.node.cmp(&b.node));
    let split = live.partition_point(|m| m.node.as_str() < node.cfg.node.as_str());
    live.rotate_left(split);
    live
}

/// Makes sure `holder` is listed in this session's followers before it holds anything: a node
/// recovering this session later must know every place a fragment can be.
async fn record_follower(node: &Node, holder: &Holder) -> Result<(), ReplicateError> {
    if node.lease.record().log.followers.contains(holder) {
        return Ok(());
    }
    let h = holder.clone();
    match node
        .lease
        .update(move |r| {
            if !r.log.followers.contains(&h) {
                r.log.followers.push(h);
            }
        })
        .await
    {
        Ok(()) => Ok(()),
        Err(LeaseError::Fenced(cause)) => node.lease.fence(cause, "while recording a follower"),
        Err(LeaseError::Store(e)) => Err(ReplicateError::Lease(e.to_string())),
    }
}

/// Replicates one entry to one follower (fsynced there) before the write is acknowledged.
pub async fn replicate(node: &Arc<Node>, entry: &Entry) -> Result<(), ReplicateError> {
    for cand in follower_candidates(node) {
        let mut holder = Holder {
            node: cand.node.clone(),
            disk_incarnation: cand.disk_incarnation.clone(),
        };
        for _ in 0..2 {
            record_follower(node, &holder).await?;
            match peer::append(
                node,
                &cand.addr,
                &holder.disk_incarnation,
                std::slice::from_ref(entry),
            )
            .await
            {
                Ok(()) => return Ok(()),
                // Its disk is newer than its lease record said: record that disk, then retry.
                Err(AppendError::Incarnation(actual)) => holder.disk_incarnation = actual,
                Err(e) => {
                    tracing::debug!(follower = %cand.node, error = %e, "follower append failed");
                    break;
                }
            }
        }
    }
    Err(ReplicateError::NoFollower)
}

/// Uploads every unflushed entry of the current session; returns the highest seq now covered.
pub async fn flush_all(node: &Arc<Node>) -> Result<u64, StoreError> {
    let pending = blocking(|| {
        node.log
            .lock()
            .expect("log")
            .as_ref()
            .map(|l| l.unflushed())
    })
    .unwrap_or_default();
    let mut covered =
        blocking(|| node.log.lock().expect("log").as_ref().map(|l| l.flushed())).unwrap_or(0);
    let mut failure = None;
    for e in &pending {
        let rec = DataRecord {
            cell: e.cell.clone(),
            id: e.id.clone(),
            epoch: e.epoch,
            node: node.cfg.node.clone(),
            session: node.session.clone(),
            seq: e.seq,
        };
        match node
            .store
            .put_json(&data_key(&e.cell, e.epoch, &e.id), &rec, Cond::None)
            .await
        {
            Ok(_) => covered = e.seq,
            Err(err) => {
                failure = Some(err);
                break;
            }
        }
    }
    if covered > 0 {
        if let Err(e) = blocking(|| {
            node.log
                .lock()
                .expect("log")
                .as_mut()
                .map(|l| l.set_flushed(covered))
                .unwrap_or(Ok(()))
        }) {
            tracing::warn!(error = %e, "recording the flushed watermark failed");
        }
        if !pending.is_empty() {
            peer::cover_everywhere(node, &node.session, covered).await;
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(covered),
    }
}

/// The background flusher (`CELLD_SIM_FLUSH_MS`).
pub async fn flush_loop(node: Arc<Node>) {
    loop {
        tokio::time::sleep(node.cfg.flush_interval).await;
        if node.stage() == crate::node::Stage::Stopping {
            return;
        }
        if let Err(e) = flush_all(&node).await {
            tracing::debug!(error = %e, "background flush failed; will retry");
        }
    }
}
