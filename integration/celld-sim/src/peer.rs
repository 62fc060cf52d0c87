//! The simulator's own peer protocol on the internal listener (`/sim/peer/*`): forwarding ledger
//! requests to the owner, follower append, fragment fetch (with seal), cover and drop.
//! Peers are dialled at their lease record's `addr`, resolved through the hosts file.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::{Method, Request};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use thiserror::Error;

use crate::cells::{self, Op, Outcome};
use crate::config::is_safe_name;
use crate::disk::{blocking, AppendRefused};
use crate::faults::PeersFault;
use crate::http::{
    self, error_response, json_response, percent_encode, Abort, ClientResponse, HandlerResult,
    Limits,
};
use crate::model::{Entry, Holder};
use crate::node::{Node, Stage};

#[derive(Debug, Error)]
pub enum PeerError {
    #[error("peer traffic is partitioned by the peers fault switch")]
    Partitioned,
    #[error("{0}")]
    Unreachable(String),
    #[error("peer answered {0}: {1}")]
    Status(u16, String),
    #[error("peer answer unreadable: {0}")]
    BadAnswer(String),
}

async fn call(
    node: &Node,
    addr: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
    limits: Limits,
) -> Result<ClientResponse, PeerError> {
    if node.faults.get().peers == PeersFault::Partition {
        return Err(PeerError::Partitioned);
    }
    let (host, port) = addr
        .rsplit_once(':')
        .and_then(|(h, p)| p.parse::<u16>().ok().map(|p| (h, p)))
        .ok_or_else(|| PeerError::Unreachable(format!("bad peer address {addr:?}")))?;
    let ip = node
        .hosts
        .resolve(host)
        .map_err(|e| PeerError::Unreachable(e.to_string()))?;
    let (headers, bytes) = match body {
        Some(v) => (
            vec![("content-type", "application/json".to_string())],
            Bytes::from(serde_json::to_vec(&v).expect("json")),
        ),
        None => (vec![], Bytes::new()),
    };
    http::call(
        SocketAddr::new(ip, port),
        addr,
        method,
        path,
        &headers,
        bytes,
        limits,
    )
    .await
    .map_err(|e| PeerError::Unreachable(e.to_string()))
}

fn parse<T: for<'de> Deserialize<'de>>(resp: &ClientResponse) -> Result<T, PeerError> {
    if resp.status != 200 {
        return Err(PeerError::Status(
            resp.status,
            String::from_utf8_lossy(&resp.body)
                .chars()
                .take(200)
                .collect(),
        ));
    }
    serde_json::from_slice(&resp.body).map_err(|e| PeerError::BadAnswer(e.to_string()))
}

/// Relays a ledger request to the owner's internal listener.
pub async fn forward(node: &Node, addr: &str, op: Op, cell: &str, id: &str) -> Outcome {
    let path = format!(
        "/sim/peer/cell?cell={}&id={}",
        percent_encode(cell, false),
        percent_encode(id, false)
    );
    let method = if op == Op::Put {
        Method::PUT
    } else {
        Method::GET
    };
    // The owner may spend a follower timeout and a store round trip before it answers.
    let limits = Limits {
        total: std::time::Duration::from_secs(6),
        ..Limits::PEER
    };
    match call(node, addr, method, &path, None, limits).await {
        Ok(resp) => Outcome {
            status: resp.status,
            body: serde_json::from_slice(&resp.body)
                .unwrap_or_else(|_| json!({ "error": "unreadable answer from the owner" })),
        },
        Err(e) => Outcome {
            status: 503,
            body: json!({ "error": format!("owner at {addr} unreachable: {e}") }),
        },
    }
}

#[derive(Serialize, Deserialize)]
struct AppendRequest {
    leader: String,
    session: String,
    generation: String,
    /// The follower disk the leader recorded; a different disk refuses (409) with its own.
    disk_incarnation: String,
    entries: Vec<Entry>,
}

#[derive(Debug, Error)]
pub enum AppendError {
    #[error("follower disk is {0}")]
    Incarnation(String),
    #[error(transparent)]
    Peer(#[from] PeerError),
}

pub async fn append(
    node: &Node,
    addr: &str,
    expected_incarnation: &str,
    entries: &[Entry],
) -> Result<(), AppendError> {
    let req = AppendRequest {
        leader: node.cfg.node.clone(),
        session: node.session.clone(),
        generation: node.generation.clone(),
        disk_incarnation: expected_incarnation.to_string(),
        entries: entries.to_vec(),
    };
    let resp = call(
        node,
        addr,
        Method::POST,
        "/sim/peer/append",
        Some(serde_json::to_value(req).expect("json")),
        Limits::PEER,
    )
    .await?;
    if resp.status == 409 {
        if let Ok(v) = serde_json::from_slice::<Value>(&resp.body) {
            if v["error"] == "disk_incarnation" {
                if let Some(actual) = v["disk_incarnation"].as_str() {
                    return Err(AppendError::Incarnation(actual.to_string()));
                }
            }
        }
    }
    parse::<Value>(&resp)?;
    Ok(())
}

/// A follower's answer to a fetch.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FetchAnswer {
    pub node: String,
    pub disk_incarnation: String,
    pub known: bool,
    pub entries: Vec<Entry>,
    pub covered_seq: u64,
    pub sealed: bool,
    pub dropped: bool,
}

/// Fetches (and with `seal`, seals) a follower's fragment of `session`.
pub async fn fetch(
    node: &Node,
    addr: &str,
    session: &str,
    seal: bool,
) -> Result<FetchAnswer, PeerError> {
    let resp = call(
        node,
        addr,
        Method::POST,
        "/sim/peer/fetch",
        Some(json!({ "session": session, "seal": seal })),
        Limits::PEER,
    )
    .await?;
    parse(&resp)
}

async fn addr_of(node: &Node, name: &str) -> Option<String> {
    node.lease_of(name).await.ok().flatten().map(|l| l.addr)
}

async fn notify(node: &Node, holders: impl IntoIterator<Item = String>, path: &str, body: Value) {
    for name in holders.into_iter().collect::<BTreeSet<_>>() {
        if name == node.cfg.node {
            continue;
        }
        if let Some(addr) = addr_of(node, &name).await {
            if let Err(e) = call(
                node,
                &addr,
                Method::POST,
                path,
                Some(body.clone()),
                Limits::PEER,
            )
            .await
            {
                tracing::debug!(follower = %name, path, error = %e, "peer notification failed");
            }
        }
    }
}

/// Tells this session's followers that entries up to `seq` are in the store.
pub async fn cover_everywhere(node: &Node, session: &str, seq: u64) {
    let holders = node
        .lease
        .record()
        .log
        .followers
        .into_iter()
        .map(|h| h.node);
    notify(
        node,
        holders,
        "/sim/peer/cover",
        json!({ "session": session, "seq": seq }),
    )
    .await;
}

/// Tells this node's current followers that its session is complete in the store.
pub async fn drop_session_everywhere(node: &Node, session: &str) {
    let holders = node
        .lease
        .record()
        .log
        .followers
        .into_iter()
        .map(|h| h.node);
    notify(
        node,
        holders,
        "/sim/peer/drop",
        json!({ "session": session }),
    )
    .await;
}

/// Tells the given holders that `session` is complete in the store.
pub async fn drop_session_at(node: &Node, holders: &[Holder], session: &str) {
    notify(
        node,
        holders.iter().map(|h| h.node.clone()),
        "/sim/peer/drop",
        json!({ "session": session }),
    )
    .await;
}

#[derive(Deserialize)]
struct SessionBody {
    session: String,
    #[serde(default)]
    seal: bool,
    #[serde(default)]
    seq: u64,
}

/// Serves `/sim/peer/*`.
pub async fn serve(node: Arc<Node>, req: Request<Incoming>) -> HandlerResult {
    if node.faults.get().peers == PeersFault::Partition {
        return Err(Abort);
    }
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    if path == "/sim/peer/cell" {
        let params = http::query_params(req.uri().query());
        let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let (Some(cell), Some(id)) = (get("cell"), get("id")) else {
            return Ok(error_response(400, "cell and id are required"));
        };
        if !is_safe_name(&cell) || !is_safe_name(&id) {
            return Ok(error_response(400, "cell and id: 1-128 of [A-Za-z0-9_.-]"));
        }
        let op = match method {
            Method::PUT => Op::Put,
            Method::GET => Op::Get,
            _ => return Ok(error_response(405, "GET or PUT")),
        };
        let out = cells::handle(&node, op, &cell, &id, true).await;
        return Ok(json_response(out.status, &out.body));
    }
    if method != Method::POST {
        return Ok(error_response(405, "POST"));
    }
    let body = match http::read_body(req.into_body(), 16 << 20).await {
        Ok(b) => b,
        Err(e) => return Ok(error_response(400, &e.to_string())),
    };
    match path.as_str() {
        "/sim/peer/append" => {
            let Ok(req) = serde_json::from_slice::<AppendRequest>(&body) else {
                return Ok(error_response(400, "bad append"));
            };
            if node.stage() == Stage::Stopping || node.removal_phase().is_some() {
                return Ok(error_response(503, "draining: follower appends are closed"));
            }
            if req.disk_incarnation != node.disk_incarnation {
                return Ok(json_response(
                    409,
                    &json!({ "error": "disk_incarnation", "disk_incarnation": node.disk_incarnation }),
                ));
            }
            let appended = blocking(|| {
                node.fragments.lock().expect("fragments").append(
                    &req.leader,
                    &req.session,
                    &req.entries,
                )
            });
            match appended {
                Ok(()) => Ok(json_response(
                    200,
                    &json!({ "disk_incarnation": node.disk_incarnation }),
                )),
                Err(AppendRefused::Sealed) => Ok(error_response(409, "sealed")),
                Err(AppendRefused::Io(e)) => Ok(error_response(500, &e.to_string())),
            }
        }
        "/sim/peer/fetch" | "/sim/peer/seal" | "/sim/peer/cover" | "/sim/peer/drop" => {
            let Ok(b) = serde_json::from_slice::<SessionBody>(&body) else {
                return Ok(error_response(400, "expected {\"session\": …}"));
            };
            let seal = b.seal || path == "/sim/peer/seal";
            let result = blocking(|| {
                let mut f = node.fragments.lock().expect("fragments");
                match path.as_str() {
                    "/sim/peer/cover" => f.cover(&b.session, b.seq).map(|_| json!({})),
                    "/sim/peer/drop" => f.drop_session(&b.session).map(|_| json!({})),
                    _ => f.fetch(&b.session, seal).map(|a| {
                        serde_json::to_value(FetchAnswer {
                            node: node.cfg.node.clone(),
                            disk_incarnation: node.disk_incarnation.clone(),
                            known: a.known,
                            entries: a.entries,
                            covered_seq: a.covered_seq,
                            sealed: a.sealed,
                            dropped: a.dropped,
                        })
                        .expect("json")
                    }),
                }
            });
            match result {
                Ok(v) => Ok(json_response(200, &v)),
                Err(e) => Ok(error_response(500, &e.to_string())),
            }
        }
        _ => Ok(error_response(404, "unknown peer route")),
    }
}
