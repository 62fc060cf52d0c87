//! Strict removal: `POST /shutdown?mode=remove-disk` and its state machine (docs/runtime.md
//! "Strict disk removal: `POST /shutdown?mode=remove-disk`").
//!
//! ```text
//! (none) ──valid POST──▶ draining ──every obligation covered──▶ data_safe   (terminal)
//!                            └──deadline or store error──────▶ failed      (terminal)
//! ```

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request};
use serde::de::{MapAccess, Visitor};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::config::is_safe_name;
use crate::disk::blocking;
use crate::faults::RemovalFault;
use crate::http::{self, error_response, json_response, Abort, HandlerResult};
use crate::lease::LeaseError;
use crate::model::{
    complete_key, covered_key, data_key, data_prefix, loss_key, now_ms, DataRecord, Entry, Holder,
};
use crate::node::{Node, Stage};
use crate::store::{Cond, StoreError};
use crate::{api, cells, durability};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemovalPhase {
    Draining,
    DataSafe,
    Failed,
}

impl RemovalPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            RemovalPhase::Draining => "draining",
            RemovalPhase::DataSafe => "data_safe",
            RemovalPhase::Failed => "failed",
        }
    }

    pub fn terminal(self) -> bool {
        self != RemovalPhase::Draining
    }
}

#[derive(Clone, Debug)]
pub struct Operation {
    pub operation_id: String,
    pub expected_generation: String,
    pub phase: RemovalPhase,
    pub blocker: Option<String>,
}

impl Operation {
    pub fn to_json(&self) -> Value {
        json!({
            "operation_id": self.operation_id,
            "expected_generation": self.expected_generation,
            "mode": "remove-disk",
            "phase": self.phase.as_str(),
            "blocker": self.blocker,
        })
    }
}

/// The request body: exactly `operation_id` and `expected_generation`, both strings, no
/// duplicate keys.
struct StrictBody(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for StrictBody {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StrictBody;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<StrictBody, A::Error> {
                let mut out: Vec<(String, Value)> = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Value>()? {
                    if out.iter().any(|(seen, _)| *seen == k) {
                        return Err(serde::de::Error::custom(format!("duplicate key {k:?}")));
                    }
                    out.push((k, v));
                }
                Ok(StrictBody(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// Validates the body; `Err` is the 400 message.
pub fn parse_request(content_type: Option<&str>, body: &[u8]) -> Result<(String, String), String> {
    let ct = content_type.unwrap_or_default();
    let media = ct.split(';').next().unwrap_or_default().trim();
    if !media.eq_ignore_ascii_case("application/json") {
        return Err(format!("Content-Type must be application/json, got {ct:?}"));
    }
    let parsed: StrictBody =
        serde_json::from_slice(body).map_err(|e| format!("malformed body: {e}"))?;
    let mut op = None;
    let mut generation = None;
    for (k, v) in parsed.0 {
        let Value::String(s) = v else {
            return Err(format!("{k} must be a string"));
        };
        match k.as_str() {
            "operation_id" => op = Some(s),
            "expected_generation" => generation = Some(s),
            other => return Err(format!("unexpected key {other:?}")),
        }
    }
    let op = op.ok_or("operation_id is required")?;
    let generation = generation.ok_or("expected_generation is required")?;
    if !is_safe_name(&op) {
        return Err("operation_id: 1-128 of [A-Za-z0-9_.-]".into());
    }
    if generation.len() > 256 {
        return Err("expected_generation longer than 256 bytes".into());
    }
    Ok((op, generation))
}

/// Serves `POST /shutdown?mode=remove-disk`.
pub async fn post(node: Arc<Node>, req: Request<Incoming>) -> HandlerResult {
    if req.method() != Method::POST {
        return Ok(error_response(405, "POST only"));
    }
    let params = http::query_params(req.uri().query());
    let mode = params
        .iter()
        .find(|(k, _)| k == "mode")
        .map(|(_, v)| v.as_str());
    if mode != Some("remove-disk") {
        return Ok(error_response(
            400,
            "unsupported mode: only mode=remove-disk is served",
        ));
    }
    let fault = node.faults.get().removal;
    match fault {
        RemovalFault::Status(200) => {
            return Ok(json_response(200, &json!({ "status": "shutting down" })))
        }
        RemovalFault::Status(code) => {
            return Ok(error_response(
                code,
                &format!("simulated status {code} (fault)"),
            ))
        }
        RemovalFault::CapabilityFalse => {
            return Ok(error_response(
                400,
                "strict removal is unsupported by this runtime",
            ))
        }
        _ => {}
    }
    let content_type = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = match http::read_body(req.into_body(), 1 << 20).await {
        Ok(b) => b,
        Err(e) => return Ok(error_response(400, &e.to_string())),
    };
    let (operation_id, expected_generation) = match parse_request(content_type.as_deref(), &body) {
        Ok(v) => v,
        Err(e) => return Ok(error_response(400, &e)),
    };

    let started = {
        let mut slot = node.removal.lock().expect("removal");
        if node.stage() == Stage::Stopping {
            return Ok(error_response(409, "an ordinary shutdown is in progress"));
        }
        if expected_generation != node.generation {
            return Ok(error_response(409, "wrong generation"));
        }
        match slot.as_ref() {
            Some(op)
                if op.operation_id == operation_id
                    && op.expected_generation == expected_generation =>
            {
                false
            }
            Some(_) => return Ok(error_response(409, "another operation is running")),
            None => {
                *slot = Some(Operation {
                    operation_id,
                    expected_generation,
                    phase: RemovalPhase::Draining,
                    blocker: Some("draining application activity".into()),
                });
                true
            }
        }
    };
    if started {
        tracing::info!("strict removal accepted: draining");
        tokio::spawn(run(node.clone(), Instant::now()));
        if fault == RemovalFault::EofOnTransition {
            return Err(Abort);
        }
    }
    Ok(json_response(202, &api::shutdown_json(&node)))
}

fn set_blocker(node: &Node, blocker: &str) {
    if let Some(op) = node.removal.lock().expect("removal").as_mut() {
        if op.phase == RemovalPhase::Draining {
            op.blocker = Some(blocker.to_string());
        }
    }
}

fn finish(node: &Node, phase: RemovalPhase, blocker: Option<String>) {
    let mut slot = node.removal.lock().expect("removal");
    if let Some(op) = slot.as_mut() {
        // Terminal results never change.
        if !op.phase.terminal() {
            op.phase = phase;
            op.blocker = blocker;
        }
    }
}

enum Obstacle {
    Store(StoreError),
    /// Something only time (or nothing) can resolve; waits for the deadline.
    Outstanding(String),
}

impl From<StoreError> for Obstacle {
    fn from(e: StoreError) -> Self {
        Obstacle::Store(e)
    }
}

async fn run(node: Arc<Node>, started: Instant) {
    let deadline = started + node.cfg.shutdown_total;
    let delay = Duration::from_millis(node.faults.get().removal_delay_ms);
    let fault = node.faults.get().removal;
    let outcome = match fault {
        RemovalFault::Hang => {
            set_blocker(&node, "hung (fault removal=hang)");
            return;
        }
        RemovalFault::Fail => Err(Obstacle::Outstanding("failed (fault removal=fail)".into())),
        _ => match tokio::time::timeout_at(deadline.into(), obligations(&node)).await {
            Ok(r) => r,
            Err(_) => Err(Obstacle::Outstanding("deadline exceeded".into())),
        },
    };
    // `removal_delay_ms` is the time from draining to the outcome.
    tokio::time::sleep_until((started + delay).into()).await;
    let (phase, blocker) = match outcome {
        Ok(()) if Instant::now() <= deadline => (RemovalPhase::DataSafe, None),
        Ok(()) => (RemovalPhase::Failed, Some("deadline exceeded".to_string())),
        Err(Obstacle::Store(e)) => (RemovalPhase::Failed, Some(format!("store error: {e}"))),
        Err(Obstacle::Outstanding(why)) if fault == RemovalFault::Fail => {
            (RemovalPhase::Failed, Some(why))
        }
        Err(Obstacle::Outstanding(why)) => {
            set_blocker(&node, &why);
            tokio::time::sleep_until(deadline.into()).await;
            let why = if why == "deadline exceeded" {
                why
            } else {
                format!("deadline exceeded ({why})")
            };
            (RemovalPhase::Failed, Some(why))
        }
    };
    finish(&node, phase, blocker.clone());
    tracing::info!(phase = phase.as_str(), blocker = ?blocker, "strict removal finished");
    let _ = node
        .lease
        .update(|r| {
            r.draining = false;
            r.control_only = true;
        })
        .await;
}

/// Everything `data_safe` requires: own log and every fragment held for other leaders in the
/// store, no loss record for those sessions, cells released, and a check that the store really
/// holds every object. See
/// docs/runtime.md "Strict disk removal: `POST /shutdown?mode=remove-disk`".
async fn obligations(node: &Arc<Node>) -> Result<(), Obstacle> {
    match node.lease.update(|r| r.draining = true).await {
        Ok(()) => {}
        Err(LeaseError::Fenced(cause)) => node.lease.fence(cause, "during strict removal"),
        Err(LeaseError::Store(e)) => return Err(e.into()),
    }
    while node.stage() == Stage::Recovering {
        set_blocker(node, "recovering predecessor sessions");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    set_blocker(node, "draining application activity");
    let held = node.cells.quiesce().await;

    set_blocker(node, "uploading the leader log");
    durability::flush_all(node).await?;
    let mut expected: Vec<Entry> = blocking(|| {
        node.log
            .lock()
            .expect("log")
            .as_ref()
            .map(|l| l.all())
            .unwrap_or_default()
    });
    node.store
        .put_json(
            &complete_key(&node.session),
            &json!({ "session": node.session, "by": node.cfg.node, "at_ms": now_ms() }),
            Cond::None,
        )
        .await?;

    set_blocker(node, "uploading fragments held for other leaders");
    let me = Holder {
        node: node.cfg.node.clone(),
        disk_incarnation: node.disk_incarnation.clone(),
    };
    let fragments = blocking(|| node.fragments.lock().expect("fragments").held());
    for (session, leader, entries) in fragments {
        if node.store.exists(&loss_key(&session)).await? {
            return Err(Obstacle::Outstanding(format!(
                "a loss record exists for session {session}"
            )));
        }
        if node.store.exists(&complete_key(&session)).await? {
            continue;
        }
        blocking(|| node.fragments.lock().expect("fragments").seal(&session))
            .map_err(|e| Obstacle::Outstanding(format!("sealing {session}: {e}")))?;
        for e in &entries {
            let rec = DataRecord {
                cell: e.cell.clone(),
                id: e.id.clone(),
                epoch: e.epoch,
                node: leader.clone(),
                session: session.clone(),
                seq: e.seq,
            };
            node.store
                .put_json(&data_key(&e.cell, e.epoch, &e.id), &rec, Cond::None)
                .await?;
        }
        node.store
            .put_json(
                &covered_key(&session, &me),
                &json!({ "session": session, "holder": me, "entries": entries.len(), "at_ms": now_ms() }),
                Cond::None,
            )
            .await?;
        expected.extend(entries);
    }

    set_blocker(node, "releasing owned cells");
    cells::release_all(node, held).await?;

    set_blocker(node, "verifying the store holds every object");
    let mut by_cell: BTreeMap<String, HashSet<String>> = BTreeMap::new();
    for e in &expected {
        by_cell
            .entry(e.cell.clone())
            .or_default()
            .insert(format!("{}/{}", e.epoch, e.id));
    }
    for (cell, wanted) in by_cell {
        let prefix = data_prefix(&cell);
        let present: HashSet<String> = node
            .store
            .list(&prefix)
            .await?
            .into_iter()
            .filter_map(|k| k.strip_prefix(&prefix).map(str::to_string))
            .collect();
        if let Some(missing) = wanted.iter().find(|w| !present.contains(*w)) {
            return Err(Obstacle::Store(StoreError::Unexpected {
                status: 0,
                body: format!("object cells/{cell}/data/{missing} missing after upload"),
            }));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const JSON: Option<&str> = Some("application/json");

    #[test]
    fn a_well_formed_request_parses() {
        assert_eq!(
            parse_request(
                JSON,
                br#"{"operation_id":"op-1","expected_generation":"g"}"#
            )
            .unwrap(),
            ("op-1".to_string(), "g".to_string())
        );
        assert!(parse_request(
            Some("application/json; charset=utf-8"),
            br#"{"expected_generation":"g","operation_id":"a.b_c"}"#
        )
        .is_ok());
    }

    #[test]
    fn malformed_requests_are_rejected() {
        let bad: &[&[u8]] = &[
            br#"{"operation_id":"op","expected_generation":"g","x":1}"#,
            br#"{"operation_id":"op"}"#,
            br#"{"operation_id":"op","operation_id":"op","expected_generation":"g"}"#,
            br#"{"operation_id":"op/1","expected_generation":"g"}"#,
            br#"{"operation_id":"","expected_generation":"g"}"#,
            br#"{"operation_id":1,"expected_generation":"g"}"#,
            br#"{"operation_id":"op","expected_generation":"g"} {}"#,
            br#"["op","g"]"#,
            b"",
        ];
        for body in bad {
            assert!(
                parse_request(JSON, body).is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        assert!(parse_request(
            Some("text/plain"),
            br#"{"operation_id":"op","expected_generation":"g"}"#
        )
        .is_err());
        let long = format!(
            r#"{{"operation_id":"op","expected_generation":"{}"}}"#,
            "g".repeat(257)
        );
        assert!(parse_request(JSON, long.as_bytes()).is_err());
    }
}
