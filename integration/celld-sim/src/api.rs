//! The two listeners: public (8080: health and the ledger) and internal (8081: `/state`, strict
//! removal, `/sim/*`). Every answer of `/state` can be corrupted by the `state` fault switch.

use std::sync::Arc;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::LOCATION;
use hyper::{Method, Request};
use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::cells::{self, Op};
use crate::config::is_safe_name;
use crate::faults::{RemovalFault, StateFault};
use crate::http::{self, bytes_response, error_response, json_response, Abort, HandlerResult};
use crate::model::now_ms;
use crate::node::Node;
use crate::removal::RemovalPhase;
use crate::{peer, removal};

pub async fn serve_public(node: Arc<Node>, listener: TcpListener) {
    http::serve(listener, move |req| {
        let node = node.clone();
        async move { public(node, req).await }
    })
    .await
}

pub async fn serve_internal(node: Arc<Node>, listener: TcpListener) {
    http::serve(listener, move |req| {
        let node = node.clone();
        async move { internal(node, req).await }
    })
    .await
}

async fn public(node: Arc<Node>, req: Request<Incoming>) -> HandlerResult {
    match (req.method().clone(), req.uri().path()) {
        (Method::GET, "/.well-known/celld/health") => Ok(if node.ready() {
            json_response(200, &json!({ "status": "ready" }))
        } else {
            json_response(503, &json!({ "status": node.phase() }))
        }),
        (method @ (Method::GET | Method::PUT), "/") => {
            let params = http::query_params(req.uri().query());
            let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
            let (Some(cell), Some(id)) = (get("cell"), get("id")) else {
                return Ok(error_response(400, "cell and id are required"));
            };
            if !is_safe_name(&cell) || !is_safe_name(&id) {
                return Ok(error_response(400, "cell and id: 1-128 of [A-Za-z0-9_.-]"));
            }
            let op = if method == Method::PUT {
                Op::Put
            } else {
                Op::Get
            };
            let out = cells::handle(&node, op, &cell, &id, false).await;
            Ok(json_response(out.status, &out.body))
        }
        (_, "/") | (_, "/.well-known/celld/health") => {
            Ok(error_response(405, "method not allowed"))
        }
        _ => Ok(error_response(404, "not found")),
    }
}

async fn internal(node: Arc<Node>, req: Request<Incoming>) -> HandlerResult {
    let path = req.uri().path().to_string();
    match path.as_str() {
        "/state" => {
            if req.method() != Method::GET {
                return Ok(error_response(405, "GET only"));
            }
            state(&node)
        }
        "/shutdown" => removal::post(node, req).await,
        "/sim/info" => Ok(json_response(200, &info(&node))),
        "/sim/faults" => match *req.method() {
            Method::GET => Ok(json_response(200, &node.faults.get().to_json())),
            Method::PUT => {
                let body = match http::read_body(req.into_body(), 1 << 20).await {
                    Ok(b) => b,
                    Err(e) => return Ok(error_response(400, &e.to_string())),
                };
                let patch: Value = match serde_json::from_slice(&body) {
                    Ok(v) => v,
                    Err(e) => return Ok(error_response(400, &format!("malformed JSON: {e}"))),
                };
                match node.faults.apply(&patch) {
                    Ok(set) => {
                        tracing::info!(faults = %set.to_json(), "fault switches changed");
                        Ok(json_response(200, &set.to_json()))
                    }
                    Err(e) => Ok(error_response(400, &e)),
                }
            }
            _ => Ok(error_response(405, "GET or PUT")),
        },
        p if p.starts_with("/sim/peer/") => peer::serve(node, req).await,
        _ => Ok(error_response(404, "not found")),
    }
}

/// The `shutdown` object of `/state` (docs/runtime.md "`GET /state`").
pub fn shutdown_json(node: &Node) -> Value {
    let op = node.removal.lock().expect("removal").clone();
    let control_only = op.as_ref().is_some_and(|o| o.phase.terminal());
    json!({
        "schema_version": 1,
        "runtime_generation": node.generation,
        "capabilities": {
            "strict_disk_removal": node.faults.get().removal != RemovalFault::CapabilityFalse,
        },
        "control_only": control_only,
        "operation": op.map(|o| o.to_json()),
    })
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map(|pages| pages * 4096)
        .unwrap_or(0)
}

fn state_value(node: &Node) -> Value {
    let shutdown = shutdown_json(node);
    if shutdown["control_only"] == true {
        return json!({ "shutdown": shutdown });
    }
    let owned = node.cells.owned_count();
    let draining = node.removal_phase() == Some(RemovalPhase::Draining)
        || node.stage() == crate::node::Stage::Stopping;
    let rss = rss_bytes();
    json!({
        "node": node.cfg.node,
        "owned_cells": owned,
        "occupied": owned,
        "restoring": node.restoring.load(std::sync::atomic::Ordering::SeqCst),
        "capacity_waiting": 0,
        "activation_waiting": 0,
        "node_load": {
            "sampled_ms": now_ms(),
            "draining": draining,
            "rebalance_paused": false,
            "resident_cells": owned,
            "rss_bytes": rss,
            "in_use_bytes": rss,
            "pressured": false,
            "memory_headroom": true,
        },
        "shutdown": shutdown,
    })
}

/// `GET /state`, with the `state` fault switch applied.
fn state(node: &Node) -> HandlerResult {
    let mut v = state_value(node);
    let fault = node.faults.get().state;
    let body = match fault {
        StateFault::Ok => serde_json::to_string(&v).expect("json"),
        StateFault::Eof => return Err(Abort),
        StateFault::Redirect => {
            let mut resp = error_response(307, "moved");
            if let Ok(loc) = format!("http://{}/state", node.cfg.internal_addr).parse() {
                resp.headers_mut().insert(LOCATION, loc);
            }
            return Ok(resp);
        }
        StateFault::Oversize => {
            v["padding"] = Value::String("x".repeat((1 << 20) + 16));
            serde_json::to_string(&v).expect("json")
        }
        StateFault::DuplicateKey => {
            let shutdown = serde_json::to_string(&v["shutdown"]).expect("json");
            format!(
                r#"{{"node":{},"shutdown":{shutdown},"shutdown":{shutdown}}}"#,
                serde_json::to_string(&node.cfg.node).expect("json")
            )
        }
        StateFault::Malformed => {
            let full = serde_json::to_string(&v).expect("json");
            full[..full.len() / 2].to_string()
        }
        StateFault::SchemaVersion2 => {
            v["shutdown"]["schema_version"] = json!(2);
            serde_json::to_string(&v).expect("json")
        }
        StateFault::NoGeneration => {
            if let Some(o) = v["shutdown"].as_object_mut() {
                o.remove("runtime_generation");
            }
            serde_json::to_string(&v).expect("json")
        }
        StateFault::WrongNode => {
            v["node"] = json!(format!("{}-impostor", node.cfg.node));
            serde_json::to_string(&v).expect("json")
        }
        StateFault::OtherOperationId => {
            if let Some(id) = v["shutdown"]["operation"]["operation_id"].as_str() {
                v["shutdown"]["operation"]["operation_id"] = json!(format!("other-{id}"));
            }
            serde_json::to_string(&v).expect("json")
        }
        StateFault::OtherGeneration => {
            v["shutdown"]["runtime_generation"] = json!(format!("{}-other", node.generation));
            serde_json::to_string(&v).expect("json")
        }
        StateFault::NotControlOnly => {
            v["shutdown"]["control_only"] = json!(false);
            serde_json::to_string(&v).expect("json")
        }
        StateFault::Blocker => {
            if v["shutdown"]["operation"].is_object() {
                v["shutdown"]["operation"]["blocker"] = json!("sim fault: blocker");
            }
            serde_json::to_string(&v).expect("json")
        }
        StateFault::StaleSampledMs => {
            if v.get("node_load").is_some() {
                v["node_load"]["sampled_ms"] = json!(now_ms().saturating_sub(3_600_000));
            }
            serde_json::to_string(&v).expect("json")
        }
    };
    Ok(bytes_response(200, "application/json", Bytes::from(body)))
}

/// `GET /sim/info`.
pub fn info(node: &Node) -> Value {
    json!({
        "node": node.cfg.node,
        "generation": node.generation,
        "pid": node.pid,
        "durability": node.cfg.durability.as_str(),
        "phase": node.phase(),
        "ready": node.ready(),
        "owned_cells": node.cells.owned_count(),
        "unflushed_writes": node.unflushed_writes(),
        "follower_fragments": node.follower_fragments(),
        "lease_expires_ms": node.lease.confirmed_expires_ms(),
        "session": node.session,
        "disk_incarnation": node.disk_incarnation,
        "followers": node.lease.record().log.followers,
    })
}
