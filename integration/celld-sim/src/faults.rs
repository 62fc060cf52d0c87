//! Fault switches (integration/celld-sim/README.md "Endpoints"): set by `PUT /sim/faults` (a JSON
//! object; omitted keys keep their value) and initially from the file named by
//! `CELLD_SIM_FAULTS_FILE`.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde_json::{Map, Value};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadyFault {
    Auto,
    Never,
    DelayMs(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateFault {
    Ok,
    Eof,
    Oversize,
    DuplicateKey,
    Malformed,
    SchemaVersion2,
    NoGeneration,
    WrongNode,
    Redirect,
    StaleSampledMs,
    /// A running removal is reported under another operation id.
    OtherOperationId,
    /// `runtime_generation` is reported as another one (as after a restart).
    OtherGeneration,
    /// `control_only` stays false, even once the removal is terminal.
    NotControlOnly,
    /// A running removal names a blocker, even once `data_safe`.
    Blocker,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemovalFault {
    Ok,
    Fail,
    Hang,
    Status(u16),
    CapabilityFalse,
    EofOnTransition,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreFault {
    Ok,
    Partition,
    LatencyMs(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeersFault {
    Ok,
    Partition,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SigtermFault {
    Drain,
    Ignore,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashFault {
    None,
    Exit { code: i32, after_ms: u64 },
}

fn ms_suffix(s: &str, prefix: &str) -> Option<u64> {
    s.strip_prefix(prefix)?.parse().ok()
}

impl FromStr for ReadyFault {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "auto" => Ok(Self::Auto),
            "never" => Ok(Self::Never),
            _ => ms_suffix(s, "delay_ms:").map(Self::DelayMs).ok_or(()),
        }
    }
}

impl fmt::Display for ReadyFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Never => f.write_str("never"),
            Self::DelayMs(n) => write!(f, "delay_ms:{n}"),
        }
    }
}

const STATE_FAULTS: [(&str, StateFault); 14] = [
    ("ok", StateFault::Ok),
    ("eof", StateFault::Eof),
    ("oversize", StateFault::Oversize),
    ("duplicate_key", StateFault::DuplicateKey),
    ("malformed", StateFault::Malformed),
    ("schema_version_2", StateFault::SchemaVersion2),
    ("no_generation", StateFault::NoGeneration),
    ("wrong_node", StateFault::WrongNode),
    ("redirect", StateFault::Redirect),
    ("stale_sampled_ms", StateFault::StaleSampledMs),
    ("other_operation_id", StateFault::OtherOperationId),
    ("other_generation", StateFault::OtherGeneration),
    ("not_control_only", StateFault::NotControlOnly),
    ("blocker", StateFault::Blocker),
];

impl FromStr for StateFault {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        STATE_FAULTS
            .iter()
            .find(|(n, _)| *n == s)
            .map(|(_, v)| *v)
            .ok_or(())
    }
}

impl fmt::Display for StateFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = STATE_FAULTS
            .iter()
            .find(|(_, v)| v == self)
            .map(|(n, _)| *n)
            .unwrap_or("ok");
        f.write_str(name)
    }
}

impl FromStr for RemovalFault {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "ok" => Ok(Self::Ok),
            "fail" => Ok(Self::Fail),
            "hang" => Ok(Self::Hang),
            "capability_false" => Ok(Self::CapabilityFalse),
            "eof_on_transition" => Ok(Self::EofOnTransition),
            _ => match ms_suffix(s, "status:") {
                Some(code @ (400 | 409 | 501 | 200)) => Ok(Self::Status(code as u16)),
                _ => Err(()),
            },
        }
    }
}

impl fmt::Display for RemovalFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ok => f.write_str("ok"),
            Self::Fail => f.write_str("fail"),
            Self::Hang => f.write_str("hang"),
            Self::Status(c) => write!(f, "status:{c}"),
            Self::CapabilityFalse => f.write_str("capability_false"),
            Self::EofOnTransition => f.write_str("eof_on_transition"),
        }
    }
}

impl FromStr for StoreFault {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "ok" => Ok(Self::Ok),
            "partition" => Ok(Self::Partition),
            _ => ms_suffix(s, "latency_ms:").map(Self::LatencyMs).ok_or(()),
        }
    }
}

impl fmt::Display for StoreFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ok => f.write_str("ok"),
            Self::Partition => f.write_str("partition"),
            Self::LatencyMs(n) => write!(f, "latency_ms:{n}"),
        }
    }
}

impl FromStr for PeersFault {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "ok" => Ok(Self::Ok),
            "partition" => Ok(Self::Partition),
            _ => Err(()),
        }
    }
}

impl fmt::Display for PeersFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ok => "ok",
            Self::Partition => "partition",
        })
    }
}

impl FromStr for SigtermFault {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "drain" => Ok(Self::Drain),
            "ignore" => Ok(Self::Ignore),
            _ => Err(()),
        }
    }
}

impl fmt::Display for SigtermFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Drain => "drain",
            Self::Ignore => "ignore",
        })
    }
}

impl FromStr for CrashFault {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        if s == "none" {
            return Ok(Self::None);
        }
        let (code, ms) = s
            .strip_prefix("exit:")
            .ok_or(())?
            .split_once('@')
            .ok_or(())?;
        Ok(Self::Exit {
            code: code.parse().map_err(|_| ())?,
            after_ms: ms.parse().map_err(|_| ())?,
        })
    }
}

impl fmt::Display for CrashFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::Exit { code, after_ms } => write!(f, "exit:{code}@{after_ms}"),
        }
    }
}

/// The whole set of switches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultSet {
    pub ready: ReadyFault,
    pub state: StateFault,
    pub removal: RemovalFault,
    pub removal_delay_ms: u64,
    pub store: StoreFault,
    pub peers: PeersFault,
    pub sigterm: SigtermFault,
    pub crash: CrashFault,
}

impl Default for FaultSet {
    fn default() -> Self {
        FaultSet {
            ready: ReadyFault::Auto,
            state: StateFault::Ok,
            removal: RemovalFault::Ok,
            removal_delay_ms: 0,
            store: StoreFault::Ok,
            peers: PeersFault::Ok,
            sigterm: SigtermFault::Drain,
            crash: CrashFault::None,
        }
    }
}

fn parse_field<T: FromStr>(key: &str, v: &Value) -> Result<T, String> {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("invalid value for {key}: {v}"))
}

impl FaultSet {
    /// Applies a JSON object of switches: every key must be known and every value valid, else
    /// nothing changes.
    pub fn merged(&self, patch: &Value) -> Result<FaultSet, String> {
        let obj = patch.as_object().ok_or("expected a JSON object")?;
        let mut next = self.clone();
        for (key, v) in obj {
            match key.as_str() {
                "ready" => next.ready = parse_field(key, v)?,
                "state" => next.state = parse_field(key, v)?,
                "removal" => next.removal = parse_field(key, v)?,
                "removal_delay_ms" => {
                    next.removal_delay_ms = v
                        .as_u64()
                        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                        .ok_or_else(|| format!("invalid value for {key}: {v}"))?
                }
                "store" => next.store = parse_field(key, v)?,
                "peers" => next.peers = parse_field(key, v)?,
                "sigterm" => next.sigterm = parse_field(key, v)?,
                "crash" => next.crash = parse_field(key, v)?,
                other => return Err(format!("unknown fault switch {other:?}")),
            }
        }
        Ok(next)
    }

    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("ready".into(), self.ready.to_string().into());
        m.insert("state".into(), self.state.to_string().into());
        m.insert("removal".into(), self.removal.to_string().into());
        m.insert("removal_delay_ms".into(), self.removal_delay_ms.into());
        m.insert("store".into(), self.store.to_string().into());
        m.insert("peers".into(), self.peers.to_string().into());
        m.insert("sigterm".into(), self.sigterm.to_string().into());
        m.insert("crash".into(), self.crash.to_string().into());
        Value::Object(m)
    }
}

/// The live switches, shared by every part of the simulator.
#[derive(Default)]
pub struct Faults {
    set: RwLock<FaultSet>,
    crash_arming: AtomicU64,
}

impl Faults {
    pub fn get(&self) -> FaultSet {
        self.set.read().expect("faults lock").clone()
    }

    /// Applies a patch; (re)arms the crash timer when `crash` is part of it.
    pub fn apply(self: &Arc<Self>, patch: &Value) -> Result<FaultSet, String> {
        let next = {
            let mut guard = self.set.write().expect("faults lock");
            let next = guard.merged(patch)?;
            *guard = next.clone();
            next
        };
        if patch.get("crash").is_some() {
            let arming = self.crash_arming.fetch_add(1, Ordering::SeqCst) + 1;
            if let CrashFault::Exit { code, after_ms } = next.crash {
                let me = Arc::clone(self);
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(after_ms)).await;
                    if me.crash_arming.load(Ordering::SeqCst) == arming {
                        eprintln!("celld-sim: crash fault fired: exit {code}");
                        std::process::exit(code);
                    }
                });
            }
        }
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn omitted_switches_keep_their_value() {
        let a = FaultSet::default()
            .merged(&json!({"store": "latency_ms:50", "removal": "status:501"}))
            .unwrap();
        let b = a.merged(&json!({"ready": "delay_ms:10"})).unwrap();
        assert_eq!(b.store, StoreFault::LatencyMs(50));
        assert_eq!(b.removal, RemovalFault::Status(501));
        assert_eq!(b.ready, ReadyFault::DelayMs(10));
    }

    #[test]
    fn an_invalid_switch_changes_nothing() {
        let a = FaultSet::default();
        assert!(a
            .merged(&json!({"store": "partition", "removal": "status:500"}))
            .is_err());
        assert!(a.merged(&json!({"nope": "x"})).is_err());
        assert!(a.merged(&json!(["store"])).is_err());
    }

    #[test]
    fn every_switch_round_trips_through_json() {
        let s = FaultSet::default()
            .merged(
                &json!({"crash": "exit:9@100", "state": "stale_sampled_ms", "sigterm": "ignore"}),
            )
            .unwrap();
        assert_eq!(FaultSet::default().merged(&s.to_json()).unwrap(), s);
    }
}
