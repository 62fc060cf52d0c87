//! Name resolution through a hosts file only (integration/celld-sim/README.md "Running it").
//!
//! The test kubelet keeps the file current; the simulator re-reads it when it changed, checking at
//! most once a second. A name missing from the file is unreachable: there is no fallback to the
//! system resolver, so a member can never reach something the test bed did not map.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use thiserror::Error;

#[derive(Debug, Error)]
#[error("{0} is not in the hosts file {1}")]
pub struct Unresolvable(pub String, pub String);

struct Snapshot {
    names: HashMap<String, IpAddr>,
    checked: Option<Instant>,
    stamp: Option<(SystemTime, u64)>,
}

pub struct Hosts {
    path: PathBuf,
    snapshot: Mutex<Snapshot>,
}

const RECHECK: Duration = Duration::from_secs(1);

impl Hosts {
    pub fn new(path: PathBuf) -> Hosts {
        Hosts {
            path,
            snapshot: Mutex::new(Snapshot {
                names: HashMap::new(),
                checked: None,
                stamp: None,
            }),
        }
    }

    /// Resolves an IP literal or a name from the hosts file.
    pub fn resolve(&self, host: &str) -> Result<IpAddr, Unresolvable> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(ip);
        }
        let name = host.trim_end_matches('.').to_ascii_lowercase();
        let mut snap = self.snapshot.lock().expect("hosts lock");
        self.refresh(&mut snap);
        let mut candidates = vec![name.clone()];
        if let Some(short) = name.strip_suffix(".cluster.local") {
            candidates.push(short.to_string());
        } else if name.ends_with(".svc") {
            candidates.push(format!("{name}.cluster.local"));
        }
        candidates
            .iter()
            .find_map(|n| snap.names.get(n).copied())
            .ok_or_else(|| Unresolvable(name, self.path.display().to_string()))
    }

    fn refresh(&self, snap: &mut Snapshot) {
        if snap.checked.is_some_and(|t| t.elapsed() < RECHECK) {
            return;
        }
        snap.checked = Some(Instant::now());
        let stamp = std::fs::metadata(&self.path)
            .ok()
            .map(|m| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()));
        if stamp == snap.stamp && stamp.is_some() {
            return;
        }
        snap.stamp = stamp;
        snap.names = std::fs::read_to_string(&self.path)
            .map(|text| parse(&text))
            .unwrap_or_default();
    }
}

/// Parses `ip name [alias…]` lines; `#` starts a comment. The first mapping of a name wins, as
/// with the system resolver.
pub fn parse(text: &str) -> HashMap<String, IpAddr> {
    let mut names = HashMap::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default();
        let mut fields = line.split_whitespace();
        let Some(ip) = fields.next().and_then(|f| f.parse::<IpAddr>().ok()) else {
            continue;
        };
        for name in fields {
            names
                .entry(name.trim_end_matches('.').to_ascii_lowercase())
                .or_insert(ip);
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_with_and_without_cluster_local() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hosts");
        std::fs::write(
            &path,
            "127.0.0.1 localhost\n127.0.3.4 beta-0.beta-peers.fleets.svc # peer\n127.0.3.5 x.svc.cluster.local\n",
        )
        .unwrap();
        let hosts = Hosts::new(path);
        let ip: IpAddr = "127.0.3.4".parse().unwrap();
        assert_eq!(hosts.resolve("beta-0.beta-peers.fleets.svc").unwrap(), ip);
        assert_eq!(
            hosts
                .resolve("beta-0.beta-peers.fleets.svc.cluster.local")
                .unwrap(),
            ip
        );
        assert_eq!(
            hosts.resolve("x.svc").unwrap(),
            "127.0.3.5".parse::<IpAddr>().unwrap()
        );
        assert!(hosts.resolve("beta-1.beta-peers.fleets.svc").is_err());
        assert_eq!(
            hosts.resolve("127.9.9.9").unwrap(),
            "127.9.9.9".parse::<IpAddr>().unwrap()
        );
    }
}
