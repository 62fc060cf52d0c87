//! The control client of a celld member: `GET /state` and the strict disk removal
//! `POST /shutdown?mode=remove-disk` on the member's internal port, and the rules that make
//! an answer a *proof* that the member's disk may be removed (docs/runtime.md).
//!
//! Client rules: HTTP/1.1 over plain TCP to `<podIP>:8081`, a new connection per request, no
//! proxies (the environment is never read), a 3xx is an error, connect 1 s, whole request 2 s
//! (`/state`) or 3 s (POST), bodies above 1 MiB rejected, exactly one JSON object with no
//! duplicate keys at any depth. Anything else is [`Unknown`]: never progress, never success.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use serde_json::{Map, Value};

/// The internal (control and peer) port of every member.
pub const INTERNAL_PORT: u16 = 8081;
/// Largest body read.
pub const MAX_BODY: usize = 1024 * 1024;
const CONNECT: Duration = Duration::from_secs(1);
const STATE_TIMEOUT: Duration = Duration::from_secs(2);
const POST_TIMEOUT: Duration = Duration::from_secs(3);

/// An answer that says nothing: transport error, timeout, redirect, oversized or invalid body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unknown(pub String);

/// `shutdown.operation` of `/state` (and the body of a 202).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removal {
    pub operation_id: String,
    pub expected_generation: String,
    pub mode: String,
    pub phase: Phase,
    pub blocker: Option<String>,
}

/// Phase of a strict removal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Draining,
    DataSafe,
    Failed,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::Draining => "draining",
            Phase::DataSafe => "data_safe",
            Phase::Failed => "failed",
        })
    }
}

/// The `shutdown` object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shutdown {
    pub runtime_generation: String,
    pub strict_disk_removal: bool,
    pub control_only: bool,
    pub operation: Option<Removal>,
}

/// A validated `GET /state` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// `node`, when the member sent it (checked against the expected node name).
    pub node: Option<String>,
    pub shutdown: Shutdown,
    /// The load fields, kept verbatim for audit (nothing is decided from them).
    pub load: Map<String, Value>,
}

/// Parses one JSON object strictly: a single value, no trailing data, no duplicate keys at any
/// depth.
pub fn parse_object(body: &[u8]) -> Result<Map<String, Value>, Unknown> {
    use serde::de::Deserializer as _;
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = de
        .deserialize_any(StrictVisitor)
        .map_err(|e| Unknown(format!("invalid JSON: {e}")))?;
    de.end()
        .map_err(|e| Unknown(format!("trailing data after the JSON object: {e}")))?;
    match value {
        Value::Object(m) => Ok(m),
        other => Err(Unknown(format!("expected a JSON object, got {other}"))),
    }
}

/// Builds a `Value`, refusing duplicate object keys at any depth. (The journal crate's JSON
/// tree also keeps duplicates, but for its canonical hashing: it keeps no value for
/// non-integer numbers, which a member's load figures may be, so it is not reused here.)
struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = Value;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(Strict)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(serde::de::Error::custom(format!("duplicate key {key:?}")));
            }
            let v = map.next_value_seed(Strict)?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

struct Strict;

impl<'de> serde::de::DeserializeSeed<'de> for Strict {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

fn field<'a>(m: &'a Map<String, Value>, key: &str, at: &str) -> Result<&'a Value, Unknown> {
    m.get(key)
        .ok_or_else(|| Unknown(format!("{at}{key} is missing")))
}

fn string(m: &Map<String, Value>, key: &str, at: &str, max: usize) -> Result<String, Unknown> {
    match field(m, key, at)? {
        Value::String(s) if !s.is_empty() && s.len() <= max => Ok(s.clone()),
        Value::String(s) if s.is_empty() => Err(Unknown(format!("{at}{key} is empty"))),
        Value::String(_) => Err(Unknown(format!("{at}{key} is longer than {max} bytes"))),
        other => Err(Unknown(format!("{at}{key} is not a string: {other}"))),
    }
}

fn boolean(m: &Map<String, Value>, key: &str, at: &str) -> Result<bool, Unknown> {
    field(m, key, at)?
        .as_bool()
        .ok_or_else(|| Unknown(format!("{at}{key} is not a boolean")))
}

fn object<'a>(v: &'a Value, what: &str) -> Result<&'a Map<String, Value>, Unknown> {
    v.as_object()
        .ok_or_else(|| Unknown(format!("{what} is not an object")))
}

/// Validates a `shutdown` object (of `/state` or the body of a 202).
pub fn parse_shutdown(v: &Value) -> Result<Shutdown, Unknown> {
    let s = object(v, "shutdown")?;
    match field(s, "schema_version", "shutdown.")? {
        Value::Number(n) if n.as_u64() == Some(1) => {}
        other => {
            return Err(Unknown(format!(
                "shutdown.schema_version is {other}, this operator speaks schema 1"
            )))
        }
    }
    let runtime_generation = string(s, "runtime_generation", "shutdown.", 256)?;
    let caps = object(
        field(s, "capabilities", "shutdown.")?,
        "shutdown.capabilities",
    )?;
    let strict_disk_removal = boolean(caps, "strict_disk_removal", "shutdown.capabilities.")?;
    let control_only = boolean(s, "control_only", "shutdown.")?;
    let operation = match field(s, "operation", "shutdown.")? {
        Value::Null => None,
        v => {
            let o = object(v, "shutdown.operation")?;
            let at = "shutdown.operation.";
            let phase = match string(o, "phase", at, 64)?.as_str() {
                "draining" => Phase::Draining,
                "data_safe" => Phase::DataSafe,
                "failed" => Phase::Failed,
                p => return Err(Unknown(format!("{at}phase {p:?} is not a known phase"))),
            };
            let blocker = match field(o, "blocker", at)? {
                Value::Null => None,
                Value::String(b) => Some(b.clone()),
                other => return Err(Unknown(format!("{at}blocker is not a string: {other}"))),
            };
            Some(Removal {
                operation_id: string(o, "operation_id", at, 128)?,
                expected_generation: string(o, "expected_generation", at, 256)?,
                mode: string(o, "mode", at, 64)?,
                phase,
                blocker,
            })
        }
    };
    Ok(Shutdown {
        runtime_generation,
        strict_disk_removal,
        control_only,
        operation,
    })
}

/// Validates a `/state` body for member `node` (its `CELLD_NODE`: Pod name or Pod UID).
pub fn parse_state(body: &[u8], node: &str) -> Result<State, Unknown> {
    let mut m = parse_object(body)?;
    let shutdown = parse_shutdown(field(&m, "shutdown", "")?)?;
    let reported = match m.remove("node") {
        None => None,
        Some(Value::String(n)) if n == node => Some(n),
        Some(other) => {
            return Err(Unknown(format!(
                "the answer is from node {other}, not {node:?}"
            )))
        }
    };
    m.remove("shutdown");
    Ok(State {
        node: reported,
        shutdown,
        load: m,
    })
}

/// Why a `/state` answer is not a proof that member's disk may be removed (rules 1–4; the Pod
/// identity, rule 5, is checked by the caller on a fresh Pod read).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotAProof {
    #[error("the runtime generation is {found}, not {expected} recorded at Intent (the process restarted)")]
    Generation { found: String, expected: String },
    #[error("the member is not control-only yet")]
    NotControlOnly,
    #[error("no strict removal is running")]
    NoOperation,
    #[error("the removal running is {found_id} at generation {found_generation}, not {expected_id} at {expected_generation}")]
    OtherOperation {
        found_id: String,
        found_generation: String,
        expected_id: String,
        expected_generation: String,
    },
    #[error("the removal's mode is {0:?}, not remove-disk")]
    Mode(String),
    #[error("the removal is {phase}{}", .blocker.as_ref().map(|b| format!(": {b}")).unwrap_or_default())]
    NotDataSafe {
        phase: Phase,
        blocker: Option<String>,
    },
    #[error("the removal is data_safe but still names a blocker: {0}")]
    Blocker(String),
}

impl NotAProof {
    /// Whether waiting can still turn this into a proof (draining); otherwise the operation
    /// is `Blocked` and the disk kept. `NotControlOnly` is only reported for a removal that
    /// says `data_safe` (the phase is checked first): a contradiction, never a reason to wait.
    pub fn may_still_come(&self) -> bool {
        matches!(
            self,
            NotAProof::NotDataSafe {
                phase: Phase::Draining,
                ..
            }
        )
    }
}

/// Rules 1–4 of a proof: the recorded generation, control-only, our operation at our
/// generation in mode remove-disk, `data_safe` without a blocker.
pub fn check_proof(s: &Shutdown, operation_id: &str, generation: &str) -> Result<(), NotAProof> {
    if s.runtime_generation != generation {
        return Err(NotAProof::Generation {
            found: s.runtime_generation.clone(),
            expected: generation.into(),
        });
    }
    let Some(op) = &s.operation else {
        return Err(NotAProof::NoOperation);
    };
    if op.operation_id != operation_id || op.expected_generation != generation {
        return Err(NotAProof::OtherOperation {
            found_id: op.operation_id.clone(),
            found_generation: op.expected_generation.clone(),
            expected_id: operation_id.into(),
            expected_generation: generation.into(),
        });
    }
    if op.mode != "remove-disk" {
        return Err(NotAProof::Mode(op.mode.clone()));
    }
    if op.phase != Phase::DataSafe {
        return Err(NotAProof::NotDataSafe {
            phase: op.phase,
            blocker: op.blocker.clone(),
        });
    }
    if let Some(b) = &op.blocker {
        return Err(NotAProof::Blocker(b.clone()));
    }
    if !s.control_only {
        return Err(NotAProof::NotControlOnly);
    }
    Ok(())
}

/// What `POST /shutdown?mode=remove-disk` answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Posted {
    /// 202: accepted (or a repeat); acceptance only, never safety.
    Accepted(Shutdown),
    /// 409: wrong generation, another operation, or an ordinary shutdown: read `/state`.
    Conflict,
    /// 400, 501 or a plain 200: this member does not offer the protocol.
    Unsupported(String),
    /// Anything else, or no answer: read `/state` to learn what happened.
    Unknown(String),
}

/// One HTTP/1.1 exchange on a fresh connection; `Err` for anything but a complete answer
/// within the limits.
async fn exchange(
    addr: SocketAddr,
    request: http::Request<Full<Bytes>>,
    timeout: Duration,
) -> Result<(http::StatusCode, Bytes), Unknown> {
    let work = async {
        let tcp = tokio::time::timeout(CONNECT, tokio::net::TcpStream::connect(addr))
            .await
            .map_err(|_| Unknown(format!("connecting to {addr} timed out")))?
            .map_err(|e| Unknown(format!("connecting to {addr}: {e}")))?;
        let io = hyper_util::rt::TokioIo::new(tcp);
        let (mut send, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| Unknown(format!("HTTP handshake with {addr}: {e}")))?;
        let conn = tokio::spawn(conn);
        let response = send
            .send_request(request)
            .await
            .map_err(|e| Unknown(format!("request to {addr}: {e}")))?;
        let status = response.status();
        if status.is_redirection() {
            return Err(Unknown(format!("{addr} answered a redirect ({status})")));
        }
        let body = Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| Unknown(format!("reading the answer of {addr}: {e}")))?
            .to_bytes();
        conn.abort();
        Ok((status, body))
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| Unknown(format!("{addr} did not answer within {timeout:?}")))?
}

fn request(
    method: http::Method,
    addr: SocketAddr,
    path: &str,
    body: Option<String>,
) -> http::Request<Full<Bytes>> {
    let mut b = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, addr.to_string());
    if body.is_some() {
        b = b.header(http::header::CONTENT_TYPE, "application/json");
    }
    b.body(Full::new(Bytes::from(body.unwrap_or_default())))
        .expect("a valid request")
}

/// `GET /state` of member `node` at `ip` (its Pod IP, never a Service or name).
pub async fn state(ip: std::net::IpAddr, node: &str) -> Result<State, Unknown> {
    if let Some(esc) = crate::pass::cached() {
        esc.escalate(|| "get member /state".into());
        return Err(Unknown("not asked: a cached pass sends no request".into()));
    }
    let addr = SocketAddr::new(ip, INTERNAL_PORT);
    let (status, body) = exchange(
        addr,
        request(http::Method::GET, addr, "/state", None),
        STATE_TIMEOUT,
    )
    .await?;
    if status != http::StatusCode::OK {
        return Err(Unknown(format!("GET /state answered {status}")));
    }
    parse_state(&body, node)
}

/// The operation id's allowed form (1–128 of `[A-Za-z0-9_.-]`).
pub fn valid_operation_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// `POST /shutdown?mode=remove-disk` with `{operation_id, expected_generation}`.
pub async fn remove_disk(ip: std::net::IpAddr, operation_id: &str, generation: &str) -> Posted {
    if let Some(esc) = crate::pass::cached() {
        esc.escalate(|| "post member removal".into());
        return Posted::Unknown("not sent: a cached pass sends no request".into());
    }
    if !valid_operation_id(operation_id) || generation.is_empty() || generation.len() > 256 {
        return Posted::Unsupported(format!(
            "refusing to send operation id {operation_id:?} / generation of {} bytes",
            generation.len()
        ));
    }
    let addr = SocketAddr::new(ip, INTERNAL_PORT);
    let body = serde_json::json!({"operation_id": operation_id, "expected_generation": generation})
        .to_string();
    let (status, body) = match exchange(
        addr,
        request(
            http::Method::POST,
            addr,
            "/shutdown?mode=remove-disk",
            Some(body),
        ),
        POST_TIMEOUT,
    )
    .await
    {
        Ok(r) => r,
        Err(Unknown(e)) => return Posted::Unknown(e),
    };
    match status.as_u16() {
        202 => match parse_object(&body).and_then(|m| parse_shutdown(&Value::Object(m))) {
            Ok(s) => Posted::Accepted(s),
            Err(Unknown(e)) => Posted::Unknown(format!("202 with an invalid body: {e}")),
        },
        409 => Posted::Conflict,
        400 | 501 | 200 => Posted::Unsupported(format!(
            "strict removal unsupported (the member answered {status})"
        )),
        _ => Posted::Unknown(format!("the member answered {status}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state_json(op: Value, control_only: bool, generation: &str) -> String {
        serde_json::json!({
            "node": "beta-2",
            "owned_cells": 12,
            "shutdown": {"schema_version": 1, "runtime_generation": generation,
                         "capabilities": {"strict_disk_removal": true},
                         "control_only": control_only, "operation": op}
        })
        .to_string()
    }

    fn removal(id: &str, generation: &str, phase: &str, blocker: Value) -> Value {
        serde_json::json!({"operation_id": id, "expected_generation": generation,
                           "mode": "remove-disk", "phase": phase, "blocker": blocker})
    }

    #[test]
    fn a_data_safe_removal_of_our_operation_at_our_generation_is_a_proof() {
        let s = parse_state(
            state_json(removal("op-1", "g1", "data_safe", Value::Null), true, "g1").as_bytes(),
            "beta-2",
        )
        .unwrap();
        assert_eq!(s.node.as_deref(), Some("beta-2"));
        assert_eq!(s.load["owned_cells"], 12);
        check_proof(&s.shutdown, "op-1", "g1").unwrap();
    }

    #[test]
    fn everything_else_is_not_a_proof_and_says_why() {
        let cases = [
            (
                removal("op-1", "g1", "data_safe", Value::Null),
                true,
                "g2",
                "generation is g2",
            ),
            (
                removal("op-2", "g1", "data_safe", Value::Null),
                true,
                "g1",
                "op-2 at generation g1",
            ),
            (
                removal("op-1", "g0", "data_safe", Value::Null),
                true,
                "g1",
                "op-1 at generation g0",
            ),
            (
                removal(
                    "op-1",
                    "g1",
                    "draining",
                    "draining application activity".into(),
                ),
                false,
                "g1",
                "draining: draining application activity",
            ),
            (
                removal("op-1", "g1", "failed", "deadline exceeded".into()),
                true,
                "g1",
                "failed: deadline exceeded",
            ),
            (
                removal("op-1", "g1", "data_safe", "still flushing".into()),
                true,
                "g1",
                "blocker: still flushing",
            ),
            (
                removal("op-1", "g1", "data_safe", Value::Null),
                false,
                "g1",
                "not control-only",
            ),
            (Value::Null, false, "g1", "no strict removal"),
        ];
        for (op, control_only, generation, why) in cases {
            let s = parse_state(
                state_json(op, control_only, generation).as_bytes(),
                "beta-2",
            )
            .unwrap();
            let e = check_proof(&s.shutdown, "op-1", "g1").unwrap_err();
            assert!(e.to_string().contains(why), "{e} lacks {why:?}");
        }
        let draining = NotAProof::NotDataSafe {
            phase: Phase::Draining,
            blocker: None,
        };
        assert!(draining.may_still_come());
        let failed = NotAProof::NotDataSafe {
            phase: Phase::Failed,
            blocker: None,
        };
        assert!(!failed.may_still_come());
    }

    #[test]
    fn answers_outside_the_contract_are_unknown() {
        let ok = state_json(Value::Null, false, "g1");
        let bad = [
            (
                r#"{"shutdown":{},"shutdown":{}}"#.to_string(),
                "duplicate key",
            ),
            (
                ok.replace(r#""mode""#, r#""x""#).replace(
                    r#""schema_version":1"#,
                    r#""schema_version":1,"schema_version":1"#,
                ),
                "duplicate key",
            ),
            (format!("{ok} {{}}"), "trailing"),
            ("[1]".into(), "expected a JSON object"),
            (
                ok.replace(r#""schema_version":1"#, r#""schema_version":2"#),
                "schema 1",
            ),
            (
                ok.replace(r#""runtime_generation":"g1""#, r#""runtime_generation":"""#),
                "runtime_generation is empty",
            ),
            (
                ok.replace(
                    r#""strict_disk_removal":true"#,
                    r#""strict_disk_removal":"yes""#,
                ),
                "not a boolean",
            ),
            (
                ok.replace(r#""node":"beta-2""#, r#""node":"beta-1""#),
                "not \"beta-2\"",
            ),
            (r#"{"node":"beta-2"}"#.into(), "shutdown is missing"),
            (
                ok.replace(r#""control_only":false,"#, ""),
                "control_only is missing",
            ),
        ];
        for (body, why) in bad {
            let e = parse_state(body.as_bytes(), "beta-2").unwrap_err();
            assert!(e.0.contains(why), "{body}: {e} lacks {why:?}");
        }
        // Control-only mode may leave out every load field and `node`.
        let minimal = r#"{"shutdown":{"schema_version":1,"runtime_generation":"g","capabilities":{"strict_disk_removal":false},"control_only":true,"operation":null}}"#;
        let s = parse_state(minimal.as_bytes(), "beta-2").unwrap();
        assert!(!s.shutdown.strict_disk_removal && s.node.is_none() && s.load.is_empty());
    }

    #[test]
    fn operation_ids_are_checked_before_anything_is_sent() {
        assert!(valid_operation_id("2502a8e9-a691-4ebe-b5d8-3326d08bcac0"));
        assert!(!valid_operation_id(""));
        assert!(!valid_operation_id("a/b"));
        assert!(!valid_operation_id(&"a".repeat(129)));
    }
}
