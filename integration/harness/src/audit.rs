//! Reading the control plane's audit log (README.md "The local control plane"): the drills count
//! the writes the API server accepted, per object and per effect marker.

use serde_json::Value;

use crate::Cluster;

/// The audit events of `c` that completed successfully (status below 300).
fn succeeded(c: &Cluster) -> Vec<Value> {
    let text = std::fs::read_to_string(c.work_dir.join("audit/audit.log")).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| {
            e["stage"] == "ResponseComplete"
                && e["responseStatus"]["code"]
                    .as_i64()
                    .is_some_and(|code| code < 300)
        })
        .collect()
}

fn names(e: &Value, ns: &str, resource: &str, name: &str) -> bool {
    e["objectRef"]["namespace"] == ns
        && e["objectRef"]["resource"] == resource
        && e["objectRef"]["name"] == name
}

/// Successful creates, updates and patches of `resource` `ns/name` itself (no
/// subresource), only those carrying effect marker `marker` when given.
pub fn writes(c: &Cluster, ns: &str, resource: &str, name: &str, marker: Option<&str>) -> usize {
    succeeded(c)
        .iter()
        .filter(|e| matches!(e["verb"].as_str(), Some("create" | "update" | "patch")))
        .filter(|e| names(e, ns, resource, name) && e["objectRef"]["subresource"].is_null())
        .filter(|e| match marker {
            Some(m) => e["requestObject"]["metadata"]["annotations"]["celld.eric.dev/effect"] == m,
            None => true,
        })
        .count()
}

/// Successful creates, updates and patches of `resource` `ns/name` itself whose request body
/// satisfies `pred` (e.g. asks for some replica count).
pub fn writes_matching(
    c: &Cluster,
    ns: &str,
    resource: &str,
    name: &str,
    pred: impl Fn(&Value) -> bool,
) -> usize {
    succeeded(c)
        .iter()
        .filter(|e| matches!(e["verb"].as_str(), Some("create" | "update" | "patch")))
        .filter(|e| names(e, ns, resource, name) && e["objectRef"]["subresource"].is_null())
        .filter(|e| pred(&e["requestObject"]))
        .count()
}

/// Successful deletes of `resource` `ns/name`.
pub fn deletes(c: &Cluster, ns: &str, resource: &str, name: &str) -> usize {
    succeeded(c)
        .iter()
        .filter(|e| e["verb"] == "delete" && names(e, ns, resource, name))
        .count()
}

/// The effect marker (`celld.eric.dev/effect`) `kind` `ns/name` carries now, or "".
pub fn marker_of(c: &Cluster, ns: &str, kind: &str, name: &str) -> String {
    c.kubectl(&[
        "-n",
        ns,
        "get",
        kind,
        name,
        "-o",
        "jsonpath={.metadata.annotations.celld\\.eric\\.dev/effect}",
    ])
    .unwrap_or_else(|e| panic!("reading the effect marker of {kind} {ns}/{name}: {e}"))
}

/// Sent by an operator replica (`celld-operator/<version> (<identity>)`), not by a
/// controller of the control plane (the Deployment controller writes a Deployment's
/// revision annotation with the whole object, effect marker included).
fn by_operator(e: &Value) -> bool {
    e["userAgent"]
        .as_str()
        .is_some_and(|u| u.starts_with("celld-operator/"))
}

/// [`writes`] sent by an operator replica.
pub fn operator_writes(c: &Cluster, ns: &str, resource: &str, name: &str, marker: &str) -> usize {
    succeeded(c)
        .iter()
        .filter(|e| by_operator(e))
        .filter(|e| matches!(e["verb"].as_str(), Some("create" | "update" | "patch")))
        .filter(|e| names(e, ns, resource, name) && e["objectRef"]["subresource"].is_null())
        .filter(|e| {
            e["requestObject"]["metadata"]["annotations"]["celld.eric.dev/effect"] == marker
        })
        .count()
}

/// [`deletes`] sent by an operator replica.
pub fn operator_deletes(c: &Cluster, ns: &str, resource: &str, name: &str) -> usize {
    succeeded(c)
        .iter()
        .filter(|e| by_operator(e) && e["verb"] == "delete" && names(e, ns, resource, name))
        .count()
}
