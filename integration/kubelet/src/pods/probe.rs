//! Readiness and liveness probes: `httpGet` (plain HTTP), `tcpSocket` and `exec`.
//!
//! Each container with a probe gets a prober task that runs the probe every `periodSeconds`
//! after `initialDelaySeconds` and reports each result; thresholds are applied by the Pod worker
//! ([`ProbeTracker`]). HTTPS and gRPC probes always fail (not modelled), and redirects are not
//! followed (a 3xx counts as success, as the real kubelet does for redirects to other hosts).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::sync::mpsc;

/// Which probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    /// Readiness: gates the container's `ready`.
    Readiness,
    /// Liveness: too many failures restart the container.
    Liveness,
}

/// Probe timing from the Pod spec, with Kubernetes defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// `initialDelaySeconds` (0).
    pub initial_delay: Duration,
    /// `periodSeconds` (10).
    pub period: Duration,
    /// `timeoutSeconds` (1).
    pub timeout: Duration,
    /// `successThreshold` (1).
    pub success_threshold: u32,
    /// `failureThreshold` (3).
    pub failure_threshold: u32,
}

impl Timing {
    /// Reads the timing of a probe.
    pub fn of(probe: &Probe) -> Self {
        let secs =
            |v: Option<i32>, default: i32| Duration::from_secs(v.unwrap_or(default).max(0) as u64);
        Self {
            initial_delay: secs(probe.initial_delay_seconds, 0),
            period: secs(probe.period_seconds, 10).max(Duration::from_secs(1)),
            timeout: secs(probe.timeout_seconds, 1).max(Duration::from_secs(1)),
            success_threshold: probe.success_threshold.unwrap_or(1).max(1) as u32,
            failure_threshold: probe.failure_threshold.unwrap_or(3).max(1) as u32,
        }
    }
}

/// Consecutive results → current verdict, as the kubelet's prober applies thresholds.
#[derive(Debug, Clone)]
pub struct ProbeTracker {
    timing: Timing,
    successes: u32,
    failures: u32,
    /// The verdict: readiness starts false, liveness starts true.
    pub passing: bool,
}

impl ProbeTracker {
    /// A tracker with the initial verdict of the probe kind.
    pub fn new(kind: ProbeKind, timing: Timing) -> Self {
        Self {
            timing,
            successes: 0,
            failures: 0,
            passing: kind == ProbeKind::Liveness,
        }
    }

    /// Applies one result; returns true when the verdict changed.
    pub fn observe(&mut self, success: bool) -> bool {
        let before = self.passing;
        if success {
            self.failures = 0;
            self.successes += 1;
            if self.successes >= self.timing.success_threshold {
                self.passing = true;
            }
        } else {
            self.successes = 0;
            self.failures += 1;
            if self.failures >= self.timing.failure_threshold {
                self.passing = false;
            }
        }
        before != self.passing
    }
}

/// A probe ready to run against one container incarnation.
#[derive(Debug, Clone)]
pub enum Check {
    /// GET `http://addr/path` with headers; 200..=399 passes.
    Http {
        /// Target.
        addr: SocketAddr,
        /// Path and query.
        path: String,
        /// Extra headers.
        headers: Vec<(String, String)>,
    },
    /// A TCP connect passes.
    Tcp(SocketAddr),
    /// The command exits 0.
    Exec {
        /// argv.
        argv: Vec<String>,
        /// The container's environment.
        env: Vec<(String, String)>,
        /// Working directory.
        cwd: PathBuf,
    },
    /// Always fails, with a reason (HTTPS, gRPC, unknown port name).
    Unsupported(String),
}

fn port_of(container: &Container, port: &IntOrString) -> Option<u16> {
    match port {
        IntOrString::Int(p) => u16::try_from(*p).ok(),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok()),
    }
}

/// Builds the check of a probe for a container running on `pod_ip`.
pub fn check_of(
    probe: &Probe,
    container: &Container,
    pod_ip: IpAddr,
    env: &[(String, String)],
    cwd: PathBuf,
) -> Check {
    if let Some(http) = &probe.http_get {
        if http.scheme.as_deref().is_some_and(|s| s != "HTTP") {
            return Check::Unsupported("HTTPS probes are not modelled".into());
        }
        let host = http
            .host
            .as_deref()
            .and_then(|h| h.parse::<IpAddr>().ok())
            .unwrap_or(pod_ip);
        let Some(port) = port_of(container, &http.port) else {
            return Check::Unsupported(format!("unknown probe port {:?}", http.port));
        };
        let path = http.path.clone().unwrap_or_else(|| "/".into());
        let path = if path.starts_with('/') {
            path
        } else {
            format!("/{path}")
        };
        let headers = http
            .http_headers
            .iter()
            .flatten()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect();
        return Check::Http {
            addr: SocketAddr::new(host, port),
            path,
            headers,
        };
    }
    if let Some(tcp) = &probe.tcp_socket {
        let host = tcp
            .host
            .as_deref()
            .and_then(|h| h.parse::<IpAddr>().ok())
            .unwrap_or(pod_ip);
        return match port_of(container, &tcp.port) {
            Some(port) => Check::Tcp(SocketAddr::new(host, port)),
            None => Check::Unsupported(format!("unknown probe port {:?}", tcp.port)),
        };
    }
    if let Some(exec) = &probe.exec {
        return Check::Exec {
            argv: exec.command.clone().unwrap_or_default(),
            env: env.to_vec(),
            cwd,
        };
    }
    Check::Unsupported("only httpGet, tcpSocket and exec probes are modelled".into())
}

/// Runs a check once.
pub async fn run_check(check: &Check, timeout: Duration) -> bool {
    match check {
        Check::Http {
            addr,
            path,
            headers,
        } => crate::http::request(*addr, "GET", path, headers, None, timeout)
            .await
            .is_ok_and(|a| (200..400).contains(&a.status)),
        Check::Tcp(addr) => matches!(
            tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await,
            Ok(Ok(_))
        ),
        Check::Exec { argv, env, cwd } => {
            let Some((program, args)) = argv.split_first() else {
                return false;
            };
            let child = tokio::process::Command::new(program)
                .args(args)
                .env_clear()
                .envs(env.iter().map(|(k, v)| (k, v)))
                .current_dir(cwd)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .status();
            matches!(tokio::time::timeout(timeout, child).await, Ok(Ok(s)) if s.success())
        }
        Check::Unsupported(_) => false,
    }
}

/// One probe result, tagged with the container incarnation it belongs to.
#[derive(Debug, Clone)]
pub struct ProbeResult {
    /// Container index in the Pod spec.
    pub container: usize,
    /// The container's start sequence (results of an older start are ignored).
    pub start_seq: u64,
    /// Which probe.
    pub kind: ProbeKind,
    /// Passed or not.
    pub success: bool,
}

/// Runs a probe loop until the receiver is gone or the task is aborted.
pub fn spawn_prober(
    check: Check,
    timing: Timing,
    tag: ProbeResult,
    results: mpsc::UnboundedSender<super::worker::Event>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        tokio::time::sleep(timing.initial_delay).await;
        let mut ticker = tokio::time::interval(timing.period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let success = run_check(&check, timing.timeout).await;
            let result = ProbeResult {
                success,
                ..tag.clone()
            };
            if results.send(super::worker::Event::Probe(result)).is_err() {
                return;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(success: u32, failure: u32) -> Timing {
        Timing {
            initial_delay: Duration::ZERO,
            period: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            success_threshold: success,
            failure_threshold: failure,
        }
    }

    #[test]
    fn readiness_needs_success_threshold_and_drops_after_failure_threshold() {
        let mut t = ProbeTracker::new(ProbeKind::Readiness, timing(2, 3));
        assert!(!t.passing);
        assert!(!t.observe(true));
        assert!(t.observe(true));
        assert!(!t.observe(false));
        assert!(!t.observe(false));
        assert!(t.observe(false));
        assert!(!t.passing);
    }

    #[test]
    fn liveness_starts_passing() {
        let mut t = ProbeTracker::new(ProbeKind::Liveness, timing(1, 1));
        assert!(t.passing);
        assert!(t.observe(false));
        assert!(!t.passing);
    }
}
