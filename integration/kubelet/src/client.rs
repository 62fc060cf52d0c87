//! Rust client of the control endpoint, for tests.

use std::net::SocketAddr;
use std::time::Duration;

use serde::de::DeserializeOwned;

pub use crate::control::{Info, NodeReport, SignalAnswer, Signalled};
pub use crate::shared::{ContainerInfo, PodInfo};

/// A control-endpoint client.
#[derive(Debug, Clone)]
pub struct ControlClient {
    addr: SocketAddr,
}

/// A failed control call.
#[derive(Debug, thiserror::Error)]
#[error("test kubelet control {path}: {message}")]
pub struct ControlError {
    /// Route.
    pub path: String,
    /// Status or transport error.
    pub message: String,
}

impl ControlClient {
    /// A client for the endpoint at `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        Self { addr }
    }

    /// The endpoint address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    async fn call<T: DeserializeOwned>(&self, method: &str, path: &str) -> Result<T, ControlError> {
        let err = |message: String| ControlError {
            path: path.to_string(),
            message,
        };
        let answer =
            crate::http::request(self.addr, method, path, &[], None, Duration::from_secs(5))
                .await
                .map_err(err)?;
        if answer.status != 200 {
            return Err(err(format!(
                "{}: {}",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            )));
        }
        serde_json::from_slice(&answer.body).map_err(|e| err(format!("decoding answer: {e}")))
    }

    /// True once the kubelet registered its Nodes and listed its Pods.
    pub async fn healthy(&self) -> bool {
        crate::http::request(
            self.addr,
            "GET",
            "/healthz",
            &[],
            None,
            Duration::from_secs(2),
        )
        .await
        .is_ok_and(|a| a.status == 200)
    }

    /// Work dir, hosts file, Nodes.
    pub async fn info(&self) -> Result<Info, ControlError> {
        self.call("GET", "/info").await
    }

    /// Nodes and their zombie flags.
    pub async fn nodes(&self) -> Result<Vec<NodeReport>, ControlError> {
        self.call("GET", "/nodes").await
    }

    /// Every live Pod incarnation with IP and pids.
    pub async fn pods(&self) -> Result<Vec<PodInfo>, ControlError> {
        self.call("GET", "/pods").await
    }

    /// The live incarnation of `ns/name` that is not terminating (else any).
    pub async fn pod(&self, ns: &str, name: &str) -> Result<Option<PodInfo>, ControlError> {
        let mut pods: Vec<PodInfo> = self
            .pods()
            .await?
            .into_iter()
            .filter(|p| p.namespace == ns && p.name == name)
            .collect();
        pods.sort_by_key(|p| p.terminating);
        Ok(pods.into_iter().next())
    }

    /// Zombie node: heartbeats stop, processes keep running, deletions are not confirmed.
    pub async fn zombie(&self, node: &str) -> Result<Vec<NodeReport>, ControlError> {
        self.call("POST", &format!("/nodes/{node}/zombie")).await
    }

    /// Node back: heartbeats resume and the node catches up with its Pods.
    pub async fn node_back(&self, node: &str) -> Result<Vec<NodeReport>, ControlError> {
        self.call("POST", &format!("/nodes/{node}/back")).await
    }

    async fn pod_action(
        &self,
        ns: &str,
        name: &str,
        action: &str,
        container: Option<&str>,
    ) -> Result<SignalAnswer, ControlError> {
        let query = container.map_or(String::new(), |c| format!("?container={c}"));
        self.call("POST", &format!("/pods/{ns}/{name}/{action}{query}"))
            .await
    }

    /// SIGKILL the Pod's container process(es).
    pub async fn kill(
        &self,
        ns: &str,
        name: &str,
        container: Option<&str>,
    ) -> Result<SignalAnswer, ControlError> {
        self.pod_action(ns, name, "kill", container).await
    }

    /// SIGSTOP the Pod's container process(es).
    pub async fn pause(
        &self,
        ns: &str,
        name: &str,
        container: Option<&str>,
    ) -> Result<SignalAnswer, ControlError> {
        self.pod_action(ns, name, "pause", container).await
    }

    /// SIGCONT the Pod's container process(es).
    pub async fn resume(
        &self,
        ns: &str,
        name: &str,
        container: Option<&str>,
    ) -> Result<SignalAnswer, ControlError> {
        self.pod_action(ns, name, "resume", container).await
    }
}
