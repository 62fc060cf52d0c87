//! Cells of the ledger application: ownership records with epochs, activation, the write and
//! read paths, forwarding to the owner, takeover of expired owners' cells, and release.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::config::Durability;
use crate::disk::blocking;
use crate::durability::{self, ReplicateError};
use crate::model::{
    data_key, data_prefix, lease_key, now_ms, own_key, DataRecord, LeaseRecord, OwnRecord,
    SessionRef,
};
use crate::node::Node;
use crate::store::{Cond, StoreError};
use crate::{peer, recovery};

/// What the client asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Put,
    Get,
    /// Take the cell if its owner is gone (the sweeper); answers like `Get`.
    Activate,
}

impl Op {
    pub fn method(self) -> &'static str {
        match self {
            Op::Put => "PUT",
            Op::Get | Op::Activate => "GET",
        }
    }
}

/// The answer to a ledger request.
pub struct Outcome {
    pub status: u16,
    pub body: Value,
}

fn unavailable(why: impl std::fmt::Display) -> Outcome {
    Outcome {
        status: 503,
        body: json!({ "error": why.to_string() }),
    }
}

/// A cell this node owns: its epoch and every id durably in it.
pub struct Active {
    pub epoch: u64,
    pub ids: HashSet<String>,
}

#[derive(Default)]
pub struct Slot {
    pub active: Option<Active>,
}

#[derive(Default)]
pub struct Cells {
    slots: std::sync::Mutex<HashMap<String, Arc<Mutex<Slot>>>>,
    owned: std::sync::Mutex<HashSet<String>>,
}

impl Cells {
    fn slot(&self, cell: &str) -> Arc<Mutex<Slot>> {
        self.slots
            .lock()
            .expect("slots")
            .entry(cell.to_string())
            .or_default()
            .clone()
    }

    pub fn owned_count(&self) -> usize {
        self.owned.lock().expect("owned").len()
    }

    pub fn is_owned(&self, cell: &str) -> bool {
        self.owned.lock().expect("owned").contains(cell)
    }

    fn set_owned(&self, cell: &str, owned: bool) {
        let mut set = self.owned.lock().expect("owned");
        if owned {
            set.insert(cell.to_string());
        } else {
            set.remove(cell);
        }
    }

    /// Waits for every in-flight request and holds every cell: used once the node stopped
    /// admitting ledger traffic (drain, strict removal).
    pub async fn quiesce(&self) -> Vec<(String, OwnedMutexGuard<Slot>)> {
        let slots: Vec<(String, Arc<Mutex<Slot>>)> = self
            .slots
            .lock()
            .expect("slots")
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut out = Vec::new();
        for (cell, slot) in slots {
            out.push((cell, slot.lock_owned().await));
        }
        out
    }
}

/// Serves one ledger request (public `/?cell&id`, or forwarded by a peer with `forwarded`).
pub async fn handle(node: &Arc<Node>, op: Op, cell: &str, id: &str, forwarded: bool) -> Outcome {
    if !node.serving() {
        return unavailable(format!("not serving ({})", node.phase()));
    }
    let slot = node.cells.slot(cell);
    let mut guard = slot.lock().await;
    // Re-check: a drain may have begun while this request waited for the cell.
    if !node.serving() {
        return unavailable(format!("not serving ({})", node.phase()));
    }
    if guard.active.is_some() {
        return local(node, op, cell, id, &mut guard).await;
    }
    for _ in 0..4 {
        let own = match node.store.get_json::<OwnRecord>(&own_key(cell)).await {
            Ok(o) => o,
            Err(e) => return unavailable(e),
        };
        let taken = match own {
            None => {
                if op != Op::Put {
                    return Outcome {
                        status: 200,
                        body: json!({ "stored": false }),
                    };
                }
                claim(node, cell, 1, Cond::Absent).await
            }
            Some((rec, etag)) => {
                let mine_from_before = rec.node == node.cfg.node;
                if rec.released || mine_from_before {
                    // Released cells are wholly in the store; this node's own predecessor
                    // sessions were recovered before it started serving.
                    claim(node, cell, rec.epoch + 1, Cond::Matches(etag)).await
                } else {
                    let lease = match node
                        .store
                        .get_json::<LeaseRecord>(&lease_key(&rec.node))
                        .await
                    {
                        Ok(l) => l.map(|(l, _)| l),
                        Err(e) => return unavailable(e),
                    };
                    match lease {
                        Some(l) if l.live_at(now_ms()) => {
                            if forwarded {
                                return unavailable(format!("owner {} is elsewhere", rec.node));
                            }
                            drop(guard);
                            return peer::forward(node, &l.addr, op, cell, id).await;
                        }
                        other => {
                            // The owner's lease expired: recover its sessions, then take over.
                            let sessions = match other {
                                Some(l) => l.sessions(),
                                None => vec![SessionRef {
                                    session: rec.session.clone(),
                                    owner: rec.node.clone(),
                                    followers: vec![],
                                }],
                            };
                            node.restoring
                                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            let recovered = recovery::recover_sessions(node, &sessions).await;
                            node.restoring
                                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                            if let Err(e) = recovered {
                                return unavailable(format!("taking over from {}: {e}", rec.node));
                            }
                            tracing::info!(cell, from = %rec.node, epoch = rec.epoch + 1, "taking over an expired owner's cell");
                            claim(node, cell, rec.epoch + 1, Cond::Matches(etag)).await
                        }
                    }
                }
            }
        };
        match taken {
            Ok(epoch) => match activate(node, cell, epoch).await {
                Ok(active) => {
                    guard.active = Some(active);
                    node.cells.set_owned(cell, true);
                    return local(node, op, cell, id, &mut guard).await;
                }
                Err(e) => return unavailable(e),
            },
            Err(StoreError::PreconditionFailed) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            Err(e) => return unavailable(e),
        }
    }
    unavailable("ownership of the cell is contended")
}

/// Writes the ownership record for this node at `epoch` (create or compare-and-swap).
async fn claim(node: &Node, cell: &str, epoch: u64, cond: Cond) -> Result<u64, StoreError> {
    let rec = OwnRecord {
        node: node.cfg.node.clone(),
        epoch,
        generation: node.generation.clone(),
        session: node.session.clone(),
        released: false,
        taken_ms: now_ms(),
    };
    node.store.put_checked(&own_key(cell), &rec, cond).await?;
    Ok(epoch)
}

/// Loads a cell's ids from the store: every epoch's objects (each takeover or release put all
/// earlier data there first).
async fn activate(node: &Node, cell: &str, epoch: u64) -> Result<Active, StoreError> {
    let prefix = data_prefix(cell);
    let keys = node.store.list(&prefix).await?;
    let ids = keys
        .iter()
        .filter_map(|k| k.strip_prefix(&prefix))
        .filter_map(|rest| rest.split_once('/').map(|(_, id)| id.to_string()))
        .collect();
    Ok(Active { epoch, ids })
}

async fn local(node: &Arc<Node>, op: Op, cell: &str, id: &str, slot: &mut Slot) -> Outcome {
    let active = slot.active.as_mut().expect("active cell");
    if op != Op::Put || active.ids.contains(id) {
        return Outcome {
            status: 200,
            body: if op == Op::Put {
                json!({ "id": id, "stored": true })
            } else {
                json!({ "stored": active.ids.contains(id) })
            },
        };
    }
    let epoch = active.epoch;
    let result = match node.cfg.durability {
        Durability::Bucket => bucket_write(node, cell, epoch, id, 0).await,
        Durability::Fleet => fleet_write(node, cell, epoch, id).await,
    };
    match result {
        Ok(()) => {
            active.ids.insert(id.to_string());
            Outcome {
                status: 200,
                body: json!({ "id": id, "stored": true }),
            }
        }
        Err(WriteError::OwnershipLost) => {
            slot.active = None;
            node.cells.set_owned(cell, false);
            unavailable("ownership of the cell moved")
        }
        Err(WriteError::Other(e)) => unavailable(e),
    }
}

pub enum WriteError {
    OwnershipLost,
    Other(String),
}

/// The Bucket rule: acknowledge once the store holds the write and a re-read of the ownership
/// record still shows this node at the same epoch.
pub async fn bucket_write(
    node: &Node,
    cell: &str,
    epoch: u64,
    id: &str,
    seq: u64,
) -> Result<(), WriteError> {
    let rec = DataRecord {
        cell: cell.to_string(),
        id: id.to_string(),
        epoch,
        node: node.cfg.node.clone(),
        session: node.session.clone(),
        seq,
    };
    node.store
        .put_json(&data_key(cell, epoch, id), &rec, Cond::None)
        .await
        .map_err(|e| WriteError::Other(e.to_string()))?;
    match node.store.get_json::<OwnRecord>(&own_key(cell)).await {
        Ok(Some((own, _)))
            if own.node == node.cfg.node
                && own.epoch == epoch
                && own.generation == node.generation
                && !own.released =>
        {
            Ok(())
        }
        Ok(_) => Err(WriteError::OwnershipLost),
        Err(e) => Err(WriteError::Other(e.to_string())),
    }
}

/// PersistentFleet: fsync in the local log, then one follower's fsync; with no live follower,
/// the Bucket rule.
async fn fleet_write(node: &Arc<Node>, cell: &str, epoch: u64, id: &str) -> Result<(), WriteError> {
    if !node.lease.valid_for_ack() {
        return Err(WriteError::Other("lease not confirmed".into()));
    }
    let entry = blocking(|| {
        node.log
            .lock()
            .expect("log")
            .as_mut()
            .expect("fleet nodes have a log")
            .append(cell, epoch, id)
    })
    .map_err(|e| WriteError::Other(format!("local log: {e}")))?;
    match durability::replicate(node, &entry).await {
        Ok(()) => {
            if node.lease.valid_for_ack() {
                Ok(())
            } else {
                Err(WriteError::Other("lease expired during replication".into()))
            }
        }
        Err(ReplicateError::NoFollower) => bucket_write(node, cell, epoch, id, entry.seq).await,
        Err(e) => Err(WriteError::Other(e.to_string())),
    }
}

/// Hands every owned cell back (`released: true`) after its data is in the store.
pub async fn release_all(
    node: &Node,
    held: Vec<(String, OwnedMutexGuard<Slot>)>,
) -> Result<(), StoreError> {
    let mut first_error = None;
    for (cell, mut guard) in held {
        let Some(active) = guard.active.take() else {
            continue;
        };
        node.cells.set_owned(&cell, false);
        let result = async {
            match node.store.get_json::<OwnRecord>(&own_key(&cell)).await? {
                Some((mut own, etag))
                    if own.node == node.cfg.node
                        && own.generation == node.generation
                        && own.epoch == active.epoch =>
                {
                    own.released = true;
                    node.store
                        .put_checked(&own_key(&cell), &own, Cond::Matches(etag))
                        .await
                        .map(|_| ())
                }
                _ => Ok(()),
            }
        }
        .await;
        if let Err(e) = result {
            tracing::warn!(cell, error = %e, "releasing a cell failed");
            first_error.get_or_insert(e);
        }
        // The guard stays dropped-but-empty: later requests find no active cell and, since the
        // node no longer serves, are refused.
        drop(guard);
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Rendezvous choice among live members: the one node that should take over `cell` eagerly.
fn preferred_taker(node: &Node, cell: &str) -> bool {
    let now = now_ms();
    let members = node.members.read().expect("members");
    let mut best: Option<(Vec<u8>, &str)> = None;
    let me_live = [node.cfg.node.as_str()];
    let names = members
        .iter()
        .filter(|m| m.serving_at(now) && m.durability == node.cfg.durability.as_str())
        .map(|m| m.node.as_str())
        .chain(me_live);
    for name in names {
        let score = Sha256::digest(format!("{cell}/{name}").as_bytes()).to_vec();
        if best.as_ref().is_none_or(|(b, _)| score > *b) {
            best = Some((score, name));
        }
    }
    best.is_some_and(|(_, n)| n == node.cfg.node)
}

/// Other nodes notice an expired lease and take over its cells (integration/celld-sim/README.md
/// "How it works"): every TTL/2 the preferred taker of each orphaned cell recovers the owner's
/// sessions and claims it.
pub async fn sweep_loop(node: Arc<Node>) {
    loop {
        tokio::time::sleep(node.cfg.ttl / 2).await;
        if !node.serving() {
            continue;
        }
        let Ok(keys) = node.store.list("cells/").await else {
            continue;
        };
        let now = now_ms();
        for key in keys.iter().filter(|k| k.ends_with("/own.json")) {
            let Some(cell) = key
                .strip_prefix("cells/")
                .and_then(|k| k.strip_suffix("/own.json"))
            else {
                continue;
            };
            if node.cells.is_owned(cell) {
                continue;
            }
            let Ok(Some((own, _))) = node.store.get_json::<OwnRecord>(key).await else {
                continue;
            };
            if own.released || own.node == node.cfg.node {
                continue;
            }
            let expired = match node.lease_of(&own.node).await {
                Ok(Some(l)) => !l.live_at(now),
                Ok(None) => true,
                Err(_) => false,
            };
            if expired && preferred_taker(&node, cell) {
                let out = handle(&node, Op::Activate, cell, "-", false).await;
                tracing::info!(
                    cell,
                    status = out.status,
                    "sweeper visited an orphaned cell"
                );
            }
        }
    }
}
