//! The API server's answer to the operator's writes, from the control plane's audit log.
//!
//! The operator's request counter counts requests *sent*; the audit log
//! (integration/cluster/audit-policy.yaml: writes to workloads, fleets, reservations, Pods,
//! claims, Services, PDBs and NetworkPolicies; not Events or Leases) records each write's
//! response code. The operator runs as the impersonated user [`OPERATOR_USER`], so its
//! entries are told apart from the bench's, the kubelet's and the controllers'.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;

/// The user the operator impersonates (group `system:masters`).
pub const OPERATOR_USER: &str = "celld-bench-operator";

/// Writes the operator's kubeconfig: the admin one, impersonating [`OPERATOR_USER`].
pub fn operator_kubeconfig(admin: &Path, out: &Path) -> Result<()> {
    let mut config = kube::config::Kubeconfig::read_from(admin)?;
    for named in &mut config.auth_infos {
        if let Some(auth) = named.auth_info.as_mut() {
            auth.impersonate = Some(OPERATOR_USER.into());
            auth.impersonate_groups = Some(vec!["system:masters".into()]);
        }
    }
    // JSON is YAML: kubeconfig readers accept it.
    std::fs::write(out, serde_json::to_string_pretty(&config)?)
        .with_context(|| format!("writing {}", out.display()))
}

/// Reads the audit log from where the last read stopped.
#[derive(Debug)]
pub struct AuditTail {
    path: PathBuf,
    offset: u64,
    partial: String,
}

impl AuditTail {
    /// Starts at the current end of the log.
    pub fn new(path: &Path) -> Self {
        let offset = std::fs::metadata(path).map_or(0, |m| m.len());
        Self {
            path: path.to_path_buf(),
            offset,
            partial: String::new(),
        }
    }

    /// Moves to the current end of the log without reading what was written meanwhile.
    pub fn skip_to_end(&mut self) {
        self.offset = std::fs::metadata(&self.path).map_or(self.offset, |m| m.len());
        self.partial.clear();
    }

    /// The operator's writes answered since the last call, by `verb resource code`
    /// (e.g. `create celldstoragereservations 409`).
    pub fn operator_writes(&mut self) -> Result<BTreeMap<String, f64>> {
        let mut file = std::fs::File::open(&self.path)
            .with_context(|| format!("opening {}", self.path.display()))?;
        file.seek(SeekFrom::Start(self.offset))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        self.offset += bytes.len() as u64;
        let mut text = std::mem::take(&mut self.partial);
        text.push_str(&String::from_utf8_lossy(&bytes));
        let mut out = BTreeMap::new();
        let complete = match text.rfind('\n') {
            Some(i) => {
                self.partial = text[i + 1..].to_string();
                &text[..i]
            }
            None => {
                self.partial = text;
                return Ok(out);
            }
        };
        for line in complete.lines() {
            // Cheap filter before parsing (fleet bodies carry the journal, up to 64 KiB).
            if !line.contains(OPERATOR_USER) {
                continue;
            }
            let Ok(e) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            if let Some(key) = operator_write(&e) {
                *out.entry(key).or_insert(0.0) += 1.0;
            }
        }
        Ok(out)
    }
}

fn operator_write(e: &Value) -> Option<String> {
    if e["stage"] != "ResponseComplete" || e["impersonatedUser"]["username"] != OPERATOR_USER {
        return None;
    }
    let mut resource = e["objectRef"]["resource"].as_str()?.to_string();
    if let Some(sub) = e["objectRef"]["subresource"].as_str() {
        resource = format!("{resource}/{sub}");
    }
    let code = e["responseStatus"]["code"].as_i64().unwrap_or(0);
    Some(format!("{} {resource} {code}", e["verb"].as_str()?))
}

/// Entries of `writes` whose code is 400 or more.
pub fn rejected(writes: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    writes
        .iter()
        .filter(|(k, _)| {
            k.rsplit(' ')
                .next()
                .and_then(|c| c.parse::<i64>().ok())
                .is_some_and(|c| c >= 400)
        })
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_the_operators_completed_writes_count_with_their_code() {
        let e = json!({"stage": "ResponseComplete", "verb": "create",
            "impersonatedUser": {"username": OPERATOR_USER},
            "objectRef": {"resource": "celldstoragereservations"}, "responseStatus": {"code": 409}});
        assert_eq!(
            operator_write(&e).as_deref(),
            Some("create celldstoragereservations 409")
        );
        let status = json!({"stage": "ResponseComplete", "verb": "patch",
            "impersonatedUser": {"username": OPERATOR_USER},
            "objectRef": {"resource": "celldfleets", "subresource": "status"}, "responseStatus": {"code": 200}});
        assert_eq!(
            operator_write(&status).as_deref(),
            Some("patch celldfleets/status 200")
        );
        let bench = json!({"stage": "ResponseComplete", "verb": "create",
            "user": {"username": "celld-test-admin"},
            "objectRef": {"resource": "celldfleets"}, "responseStatus": {"code": 201}});
        assert_eq!(operator_write(&bench), None);
        let counts: BTreeMap<String, f64> = [
            ("create celldstoragereservations 409".to_string(), 3.0),
            ("patch celldfleets 200".to_string(), 4.0),
        ]
        .into();
        assert_eq!(rejected(&counts).len(), 1);
    }
}
