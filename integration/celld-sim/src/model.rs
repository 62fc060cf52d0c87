//! Records the simulator keeps in the object store, and where they live.
//!
//! ```text
//! nodes/<node>.json                         lease record
//! cells/<cell>/own.json                     ownership {node, epoch, …}
//! cells/<cell>/data/<epoch>/<id>            one object per acknowledged (or flushed) id
//! log/<session>/complete.json               the session is bucket_complete: no follower needed
//! log/<session>/covered/<node>.<disk>.json  that holder uploaded its fragment of the session
//! log/<session>.loss.json                   recovery found the session's data partly lost
//! probe/<node>/<generation>                 startup probe of conditional writes
//! ```

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub fn lease_key(node: &str) -> String {
    format!("nodes/{node}.json")
}

pub fn own_key(cell: &str) -> String {
    format!("cells/{cell}/own.json")
}

pub fn data_prefix(cell: &str) -> String {
    format!("cells/{cell}/data/")
}

pub fn data_key(cell: &str, epoch: u64, id: &str) -> String {
    format!("cells/{cell}/data/{epoch}/{id}")
}

pub fn complete_key(session: &str) -> String {
    format!("log/{session}/complete.json")
}

pub fn covered_key(session: &str, holder: &Holder) -> String {
    format!(
        "log/{session}/covered/{}.{}.json",
        holder.node, holder.disk_incarnation
    )
}

pub fn loss_key(session: &str) -> String {
    format!("log/{session}.loss.json")
}

/// One acknowledged write in a leader's log or a follower's fragment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub seq: u64,
    pub cell: String,
    pub epoch: u64,
    pub id: String,
}

/// A node's disk as a holder of fragments: a wiped disk is a new incarnation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Holder {
    pub node: String,
    pub disk_incarnation: String,
}

/// A leader log session that may still need recovery, with every follower it ever used.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRef {
    pub session: String,
    pub owner: String,
    #[serde(default)]
    pub followers: Vec<Holder>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LogInfo {
    /// The current session of this process.
    pub session: String,
    /// Every holder the current session has replicated to. A follower is recorded here before it
    /// is first used, so a recovering node knows every place a fragment can be.
    #[serde(default)]
    pub followers: Vec<Holder>,
    /// Predecessor sessions not yet recovered to the store.
    #[serde(default)]
    pub pending: Vec<SessionRef>,
}

/// `nodes/<node>.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LeaseRecord {
    pub node: String,
    pub addr: String,
    pub generation: String,
    pub expires_ms: u64,
    #[serde(default)]
    pub renewed_ms: u64,
    #[serde(default)]
    pub disk_incarnation: String,
    #[serde(default)]
    pub durability: String,
    #[serde(default)]
    pub ownership_index_generation: u64,
    #[serde(default)]
    pub log: LogInfo,
    #[serde(default)]
    pub load: serde_json::Value,
    /// Set during strict removal: not a follower candidate, and holds back others' readiness gate.
    #[serde(default)]
    pub draining: bool,
    /// Set by a drained exit: the lease is given up on purpose.
    #[serde(default)]
    pub stopped: bool,
    /// A strict removal ended (data_safe or failed): alive for control and log recovery only.
    #[serde(default)]
    pub control_only: bool,
}

impl LeaseRecord {
    pub fn live_at(&self, now: u64) -> bool {
        !self.stopped && self.expires_ms > now
    }

    /// Live and serving: a candidate follower or cell taker.
    pub fn serving_at(&self, now: u64) -> bool {
        self.live_at(now) && !self.draining && !self.control_only
    }

    /// Every session of this node that may hold data not yet in the store.
    pub fn sessions(&self) -> Vec<SessionRef> {
        let mut out = self.log.pending.clone();
        if !self.log.session.is_empty() {
            out.push(SessionRef {
                session: self.log.session.clone(),
                owner: self.node.clone(),
                followers: self.log.followers.clone(),
            });
        }
        out
    }
}

/// `cells/<cell>/own.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnRecord {
    pub node: String,
    pub epoch: u64,
    #[serde(default)]
    pub generation: String,
    #[serde(default)]
    pub session: String,
    /// The owner handed the cell back with everything in the store.
    #[serde(default)]
    pub released: bool,
    #[serde(default)]
    pub taken_ms: u64,
}

/// `cells/<cell>/data/<epoch>/<id>`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DataRecord {
    pub cell: String,
    pub id: String,
    pub epoch: u64,
    pub node: String,
    pub session: String,
    pub seq: u64,
}

/// `log/<session>.loss.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LossRecord {
    pub session: String,
    pub owner: String,
    /// Holders whose copy is conclusively gone (their disk is a new incarnation).
    pub lost_holders: Vec<Holder>,
    pub recovered_entries: usize,
    pub written_by: String,
    pub at_ms: u64,
    pub note: String,
}
