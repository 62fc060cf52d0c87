//! The audit-log reader: the "exactly one write" oracle (docs/design.md "Oracles").
//!
//! The API server writes one JSON object per line to `<cluster work dir>/audit/audit.log`
//! (policy: `integration/cluster/audit-policy.yaml`; mode `blocking`, so an event is in the file
//! before the client sees the response). Writes to StatefulSets, Deployments, ReplicaSets, their
//! scale subresources and the celld resources are logged with the request body, and so are deletes
//! of Pods and claims (their `DeleteOptions` carry the preconditions); other writes to Pods,
//! claims, PVs, Services, PDBs and NetworkPolicies with metadata only.
//!
//! [`AuditLog::since_now`] remembers the current end of the file, so a test only sees the
//! events that happened after it started (the log is shared by every test and never rotated).
//!
//! ```no_run
//! # fn f(bed: &celld_testbed::TestBed, ns: &str) -> anyhow::Result<()> {
//! use celld_testbed::audit::{AuditLog, AuditQuery};
//! let audit = bed.audit();                                   // marks "now"
//! // … the scenario …
//! let q = AuditQuery::writes().resource("statefulsets").namespace(ns).successful();
//! let per_object = audit.writes_per_object(&q)?;             // {(statefulsets, ns, name): 1}
//! let per_user = audit.writes_per_user(&q)?;                 // {"system:serviceaccount:…": 1}
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;

/// The write verbs the audit policy records.
pub const WRITE_VERBS: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];

/// One audit event (stage `ResponseComplete` or `Panic`).
#[derive(Debug, Clone, PartialEq)]
pub struct AuditEvent {
    /// `create`, `update`, `patch`, `delete`, …
    pub verb: String,
    /// The authenticated user.
    pub user: String,
    /// The impersonated user, when the request was impersonated.
    pub impersonated_user: Option<String>,
    /// API group (`""` for core).
    pub api_group: String,
    /// Resource (`pods`, `statefulsets`, …).
    pub resource: String,
    /// Subresource (`status`, `scale`, …).
    pub subresource: Option<String>,
    /// Namespace (absent for cluster-scoped objects).
    pub namespace: Option<String>,
    /// Object name (absent for collection requests).
    pub name: Option<String>,
    /// HTTP status of the response.
    pub code: Option<u16>,
    /// The request URI.
    pub request_uri: String,
    /// The request body (level `Request` only: workloads, celld resources, and the
    /// `DeleteOptions` of Pod and claim deletes).
    pub request_object: Option<Value>,
    /// When the request was received (RFC 3339).
    pub received: String,
    /// The client's User-Agent (the operator sends `celld-operator/<version> (<identity>)`).
    pub user_agent: String,
}

impl AuditEvent {
    /// Parses one line of the audit log; `None` for other stages and unparsable lines.
    pub fn parse(line: &str) -> Option<AuditEvent> {
        let v: Value = serde_json::from_str(line).ok()?;
        if v["kind"] != "Event" {
            return None;
        }
        let stage = v["stage"].as_str()?;
        if stage != "ResponseComplete" && stage != "Panic" {
            return None;
        }
        let obj = &v["objectRef"];
        let s = |x: &Value| x.as_str().map(str::to_string);
        Some(AuditEvent {
            verb: s(&v["verb"])?,
            user: s(&v["user"]["username"]).unwrap_or_default(),
            impersonated_user: s(&v["impersonatedUser"]["username"]),
            api_group: s(&obj["apiGroup"]).unwrap_or_default(),
            resource: s(&obj["resource"]).unwrap_or_default(),
            subresource: s(&obj["subresource"]),
            namespace: s(&obj["namespace"]),
            name: s(&obj["name"]),
            code: v["responseStatus"]["code"].as_u64().map(|c| c as u16),
            request_uri: s(&v["requestURI"]).unwrap_or_default(),
            request_object: v.get("requestObject").cloned(),
            received: s(&v["requestReceivedTimestamp"]).unwrap_or_default(),
            user_agent: s(&v["userAgent"]).unwrap_or_default(),
        })
    }

    /// The user the request acted as (the impersonated one, else the authenticated one).
    pub fn effective_user(&self) -> &str {
        self.impersonated_user.as_deref().unwrap_or(&self.user)
    }

    /// A write verb.
    pub fn is_write(&self) -> bool {
        WRITE_VERBS.contains(&self.verb.as_str())
    }

    /// Answered 2xx.
    pub fn succeeded(&self) -> bool {
        self.code.is_some_and(|c| (200..300).contains(&c))
    }

    /// Answered 504 "context canceled": the client went away (killed, or its request
    /// timed out) before the answer. Such a write **may have committed**: the API server logs
    /// 504 for a write whose client is gone even when storage accepted it (seen in the fault
    /// sweep: a kill mid-request, the write landed, the next operator found its marker).
    pub fn unanswered(&self) -> bool {
        self.code == Some(504)
    }

    /// `(resource[/subresource], namespace, name)`.
    pub fn object_key(&self) -> ObjectKey {
        ObjectKey {
            resource: match &self.subresource {
                Some(sub) => format!("{}/{sub}", self.resource),
                None => self.resource.clone(),
            },
            namespace: self.namespace.clone().unwrap_or_default(),
            name: self.name.clone().unwrap_or_default(),
        }
    }
}

/// An object as the audit log names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// `resource` or `resource/subresource`.
    pub resource: String,
    /// Namespace (`""` when cluster-scoped).
    pub namespace: String,
    /// Name (`""` for collection requests).
    pub name: String,
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.resource, self.namespace, self.name)
    }
}

/// A filter over audit events; every field that is set must match.
#[derive(Debug, Clone, Default)]
pub struct AuditQuery {
    /// Verbs (any of them); empty = every verb.
    pub verbs: Vec<String>,
    /// Resource.
    pub resource: Option<String>,
    /// `Some(None)`: only requests without a subresource; `Some(Some(s))`: exactly `s`.
    pub subresource: Option<Option<String>>,
    /// API group.
    pub api_group: Option<String>,
    /// Namespace.
    pub namespace: Option<String>,
    /// Object name.
    pub name: Option<String>,
    /// Effective user (impersonated user, else the authenticated one).
    pub user: Option<String>,
    /// Only 2xx answers.
    pub only_successful: bool,
}

impl AuditQuery {
    /// Every event.
    pub fn all() -> Self {
        Self::default()
    }

    /// create / update / patch / delete / deletecollection.
    pub fn writes() -> Self {
        Self {
            verbs: WRITE_VERBS.iter().map(|v| v.to_string()).collect(),
            ..Self::default()
        }
    }

    /// Only this verb.
    pub fn verb(mut self, verb: &str) -> Self {
        self.verbs = vec![verb.to_string()];
        self
    }

    /// Only this resource.
    pub fn resource(mut self, resource: &str) -> Self {
        self.resource = Some(resource.to_string());
        self
    }

    /// Only this subresource (`None`: only the main resource).
    pub fn subresource(mut self, sub: Option<&str>) -> Self {
        self.subresource = Some(sub.map(str::to_string));
        self
    }

    /// Only this API group (`""` = core).
    pub fn api_group(mut self, group: &str) -> Self {
        self.api_group = Some(group.to_string());
        self
    }

    /// Only this namespace.
    pub fn namespace(mut self, ns: &str) -> Self {
        self.namespace = Some(ns.to_string());
        self
    }

    /// Only this object name.
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }

    /// Only this effective user.
    pub fn user(mut self, user: &str) -> Self {
        self.user = Some(user.to_string());
        self
    }

    /// Only requests answered 2xx.
    pub fn successful(mut self) -> Self {
        self.only_successful = true;
        self
    }

    /// Whether `e` passes the filter.
    pub fn matches(&self, e: &AuditEvent) -> bool {
        (self.verbs.is_empty() || self.verbs.contains(&e.verb))
            && self.resource.as_ref().is_none_or(|r| *r == e.resource)
            && self
                .subresource
                .as_ref()
                .is_none_or(|s| *s == e.subresource)
            && self.api_group.as_ref().is_none_or(|g| *g == e.api_group)
            && self
                .namespace
                .as_ref()
                .is_none_or(|n| Some(n) == e.namespace.as_ref())
            && self
                .name
                .as_ref()
                .is_none_or(|n| Some(n) == e.name.as_ref())
            && self.user.as_ref().is_none_or(|u| u == e.effective_user())
            && (!self.only_successful || e.succeeded())
    }
}

/// A reader over the audit log from a start offset.
#[derive(Debug, Clone)]
pub struct AuditLog {
    path: PathBuf,
    start: u64,
    /// Inode of the file when marked: the API server rotates `audit.log` by renaming it to
    /// `audit-<time>.log` (same inode) and starting a new one.
    inode: Option<u64>,
}

fn inode(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// Complete lines of `path` from byte `start`.
fn complete_lines_from(path: &Path, start: u64) -> Result<String> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    f.seek(SeekFrom::Start(start))?;
    let mut text = String::new();
    f.read_to_string(&mut text)
        .with_context(|| format!("reading {}", path.display()))?;
    // A partial last line (being written right now) is left for the next read.
    Ok(match text.rfind('\n') {
        Some(i) => text[..=i].to_string(),
        None => String::new(),
    })
}

impl AuditLog {
    /// Events written from now on.
    pub fn since_now(path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        let start = std::fs::metadata(&path)
            .with_context(|| format!("reading {}", path.display()))?
            .len();
        let inode = inode(&path);
        Ok(Self { path, start, inode })
    }

    /// Every event in the file.
    pub fn from_start(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        let inode = inode(&path);
        Self {
            path,
            start: 0,
            inode,
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// All events since the start offset (complete lines only), across a rotation: when the
    /// file was rotated since the mark, the rest of the rotated file comes first.
    pub fn events(&self) -> Result<Vec<AuditEvent>> {
        let text = if self.inode.is_some() && inode(&self.path) != self.inode {
            let dir = self.path.parent().unwrap_or(Path::new("."));
            let rotated = std::fs::read_dir(dir)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .find(|p| p != &self.path && inode(p) == self.inode)
                .with_context(|| {
                    format!(
                        "{} was rotated since the mark and the rotated file is gone",
                        self.path.display()
                    )
                })?;
            let mut text = complete_lines_from(&rotated, self.start)?;
            text.push_str(&complete_lines_from(&self.path, 0)?);
            text
        } else {
            complete_lines_from(&self.path, self.start)?
        };
        Ok(text.lines().filter_map(AuditEvent::parse).collect())
    }

    /// Events passing `q`, in log order.
    pub fn query(&self, q: &AuditQuery) -> Result<Vec<AuditEvent>> {
        Ok(self
            .events()?
            .into_iter()
            .filter(|e| q.matches(e))
            .collect())
    }

    /// How many events pass `q`.
    pub fn count(&self, q: &AuditQuery) -> Result<usize> {
        Ok(self.query(q)?.len())
    }

    /// Events passing `q`, counted per object.
    pub fn writes_per_object(&self, q: &AuditQuery) -> Result<BTreeMap<ObjectKey, usize>> {
        let mut out = BTreeMap::new();
        for e in self.query(q)? {
            *out.entry(e.object_key()).or_insert(0) += 1;
        }
        Ok(out)
    }

    /// Events passing `q`, counted per effective user.
    pub fn writes_per_user(&self, q: &AuditQuery) -> Result<BTreeMap<String, usize>> {
        let mut out = BTreeMap::new();
        for e in self.query(q)? {
            *out.entry(e.effective_user().to_string()).or_insert(0) += 1;
        }
        Ok(out)
    }

    /// Events passing `q`, counted per (user, verb, object): the finest "exactly once" view.
    pub fn writes_per_user_and_object(
        &self,
        q: &AuditQuery,
    ) -> Result<BTreeMap<(String, String, ObjectKey), usize>> {
        let mut out = BTreeMap::new();
        for e in self.query(q)? {
            *out.entry((
                e.effective_user().to_string(),
                e.verb.clone(),
                e.object_key(),
            ))
            .or_insert(0) += 1;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"x","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/ns1/pods","verb":"create","user":{"username":"system:serviceaccount:kube-system:statefulset-controller"},"objectRef":{"resource":"pods","namespace":"ns1","name":"sim-0","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":201},"requestReceivedTimestamp":"2026-01-01T00:00:00Z"}"#;

    #[test]
    fn parses_and_filters_events() {
        let e = AuditEvent::parse(LINE).expect("parsed");
        assert_eq!(e.verb, "create");
        assert_eq!(e.resource, "pods");
        assert_eq!(e.api_group, "");
        assert_eq!(e.namespace.as_deref(), Some("ns1"));
        assert_eq!(e.name.as_deref(), Some("sim-0"));
        assert!(e.succeeded() && e.is_write());
        assert!(AuditQuery::writes()
            .resource("pods")
            .namespace("ns1")
            .successful()
            .matches(&e));
        assert!(!AuditQuery::writes()
            .resource("pods")
            .namespace("ns2")
            .matches(&e));
        assert!(!AuditQuery::writes().verb("delete").matches(&e));
        assert!(AuditQuery::writes().subresource(None).matches(&e));
        assert!(!AuditQuery::writes().subresource(Some("status")).matches(&e));
        assert!(AuditQuery::all()
            .user("system:serviceaccount:kube-system:statefulset-controller")
            .matches(&e));
        // Other stages and garbage are skipped.
        assert!(AuditEvent::parse(&LINE.replace("ResponseComplete", "ResponseStarted")).is_none());
        assert!(AuditEvent::parse("not json").is_none());
    }

    #[test]
    fn counts_from_the_start_offset_and_ignores_a_partial_line() {
        let dir = std::env::temp_dir().join(format!("tb-audit-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.log");
        std::fs::write(&path, format!("{LINE}\n")).unwrap();
        let log = AuditLog::since_now(&path).unwrap();
        assert_eq!(log.events().unwrap().len(), 0);
        let impersonated = LINE.replace(
            r#""user":{"username":"system:serviceaccount:kube-system:statefulset-controller"}"#,
            r#""user":{"username":"admin"},"impersonatedUser":{"username":"system:serviceaccount:op:celld"}"#,
        );
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(&format!("{LINE}\n{impersonated}\n{{\"kind\":\"Ev"));
        std::fs::write(&path, text).unwrap();
        let q = AuditQuery::writes().resource("pods");
        assert_eq!(log.count(&q).unwrap(), 2);
        let per_user = log.writes_per_user(&q).unwrap();
        assert_eq!(per_user["system:serviceaccount:op:celld"], 1);
        assert_eq!(
            per_user["system:serviceaccount:kube-system:statefulset-controller"],
            1
        );
        let per_object = log.writes_per_object(&q).unwrap();
        assert_eq!(per_object.len(), 1);
        assert_eq!(per_object.values().next(), Some(&2));
        assert_eq!(AuditLog::from_start(&path).count(&q).unwrap(), 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn events_after_the_mark_survive_a_rotation_of_the_file() {
        let dir = std::env::temp_dir().join(format!("tb-audit-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.log");
        std::fs::write(&path, format!("{LINE}\n")).unwrap();
        let log = AuditLog::since_now(&path).unwrap();
        // One event before the rotation, the file renamed (as the API server does at its size
        // limit), two events in the new file.
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(&format!("{LINE}\n"));
        std::fs::write(&path, text).unwrap();
        std::fs::rename(&path, dir.join("audit-2026-12-02T08-45-46.915.log")).unwrap();
        std::fs::write(&path, format!("{LINE}\n{LINE}\n")).unwrap();
        let q = AuditQuery::writes().resource("pods");
        assert_eq!(log.count(&q).unwrap(), 3);
        // The rotated file gone: an error, never a silent zero.
        std::fs::remove_file(dir.join("audit-2026-12-02T08-45-46.915.log")).unwrap();
        assert!(log.count(&q).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
