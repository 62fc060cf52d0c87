//! Pod facts and waiting helpers.

use std::future::Future;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::{Api, Client};

use crate::member::Member;

/// Ready condition True.
pub fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Has a deletionTimestamp.
pub fn is_terminating(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_some()
}

/// The Pod's UID.
pub fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap_or_default()
}

/// `status.podIP`.
pub fn pod_ip(p: &Pod) -> Option<IpAddr> {
    p.status.as_ref()?.pod_ip.as_ref()?.parse().ok()
}

/// `spec.nodeName`.
pub fn node_name(p: &Pod) -> Option<String> {
    p.spec.as_ref()?.node_name.clone()
}

/// The member at the Pod's IP.
pub fn member(p: &Pod) -> Option<Member> {
    pod_ip(p).map(Member::new)
}

/// A container's status.
pub fn container_status<'a>(p: &'a Pod, container: &str) -> Option<&'a ContainerStatus> {
    p.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == container)
}

/// `restartCount` of a container (0 when unknown).
pub fn restart_count(p: &Pod, container: &str) -> i32 {
    container_status(p, container).map_or(0, |c| c.restart_count)
}

/// `lastState.terminated.exitCode` of a container.
pub fn last_exit_code(p: &Pod, container: &str) -> Option<i32> {
    container_status(p, container)?
        .last_state
        .as_ref()?
        .terminated
        .as_ref()
        .map(|t| t.exit_code)
}

/// Polls `f` every 250 ms until it yields a value; after `timeout` fails with `what` and
/// `hint` (where the logs are).
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, hint: &str, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for: {what}\n{hint}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The Pod, if it exists.
pub async fn get(client: &Client, ns: &str, name: &str) -> Option<Pod> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .ok()
        .flatten()
}

/// Waits until every named Pod exists, is Ready, not terminating and (when `not_uids` names a
/// UID for it) is another incarnation than that one. Returns the Pods in `names` order.
pub async fn wait_ready(
    client: &Client,
    ns: &str,
    names: &[String],
    not_uids: &[(String, String)],
    timeout: Duration,
    hint: &str,
) -> Result<Vec<Pod>> {
    let api = Api::<Pod>::namespaced(client.clone(), ns);
    let what = format!("Pods {names:?} in {ns} Ready (new incarnations of {not_uids:?})");
    eventually(&what, timeout, hint, || {
        let api = api.clone();
        async move {
            let mut out = Vec::new();
            for n in names {
                let p = api.get_opt(n).await.ok().flatten()?;
                if !is_ready(&p) || is_terminating(&p) || pod_ip(&p).is_none() {
                    return None;
                }
                if not_uids
                    .iter()
                    .any(|(name, old)| name == n && *old == uid(&p))
                {
                    return None;
                }
                out.push(p);
            }
            Some(out)
        }
    })
    .await
}

/// Ledger member URLs (`http://<pod ip>:8080`) of the Pods.
pub fn member_urls(pods: &[Pod]) -> Vec<String> {
    pods.iter()
        .filter_map(pod_ip)
        .map(crate::member::member_url)
        .collect()
}
