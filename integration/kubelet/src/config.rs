//! Command-line flags.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

/// The test kubelet: runs the Pods bound to its Nodes as local processes on loopback IPs, and
/// provisions `hostpath.csi.k8s.io` volumes as folders.
#[derive(Debug, Clone, Parser)]
#[command(name = "celld-test-kubelet", version)]
pub struct Args {
    /// Kubeconfig to act with (the cluster's `test-kubelet.kubeconfig`).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: PathBuf,

    /// Work folder: pods/<ns>_<name>_<uid>/{logs,volumes}, volumes/<node>/pvc-<uid>, hosts, run/.
    #[arg(long)]
    pub work_dir: PathBuf,

    /// Number of Nodes to register.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,

    /// Node names are `<prefix>-0 .. <prefix>-(N-1)`; use a distinct prefix per kubelet instance.
    #[arg(long, default_value = "celld-node")]
    pub node_prefix: String,

    /// Zones, assigned round-robin (`topology.kubernetes.io/zone`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "us-east-1a,us-east-1b,us-east-1c"
    )]
    pub zones: Vec<String>,

    /// Region label (`topology.kubernetes.io/region`).
    #[arg(long, default_value = "us-east-1")]
    pub region: String,

    /// Image map file (`repository = program` lines; see `images`). Without it only
    /// `celld.test/noprocess` runs.
    #[arg(long)]
    pub image_map: Option<PathBuf>,

    /// Loopback address of the fault-control HTTP endpoint; port 0 picks a free port. The bound
    /// address is written to `<work-dir>/control-addr`.
    #[arg(long, default_value = "127.0.0.1:16480")]
    pub control_addr: SocketAddr,

    /// Address the store name `minio.celld-test-store.svc` resolves to; members dial port 9000 on
    /// it, so the store (or its fault proxy) must listen on `<store-ip>:9000`.
    #[arg(long, default_value = "127.0.0.1")]
    pub store_ip: Ipv4Addr,

    /// Extra static hosts-file entries, `NAME=IP` (repeatable).
    #[arg(long = "static-host", value_parser = parse_static_host)]
    pub static_hosts: Vec<(String, Ipv4Addr)>,

    /// Hosts file kept for the members (default `<work-dir>/hosts`).
    #[arg(long)]
    pub hosts_file: Option<PathBuf>,

    /// Loopback range Pod IPs are taken from (one fresh address per Pod incarnation).
    #[arg(long, default_value = "127.1.0.0/16")]
    pub pod_ip_range: String,

    /// Taint put on every Node, `key=value:Effect` or `key:Effect` (repeatable).
    #[arg(long = "node-taint")]
    pub node_taints: Vec<String>,

    /// Pod capacity per Node.
    #[arg(long, default_value_t = 1000)]
    pub max_pods: u32,

    /// First crash-loop back-off (the first restart is immediate, as in the kubelet).
    #[arg(long, default_value_t = 10_000)]
    pub backoff_initial_ms: u64,

    /// Longest crash-loop / image-pull back-off.
    #[arg(long, default_value_t = 300_000)]
    pub backoff_max_ms: u64,

    /// Node Lease renewal period (the lease lasts 4 periods).
    #[arg(long, default_value_t = 10)]
    pub heartbeat_seconds: u64,

    /// Leave the Nodes registered when the kubelet exits (default: delete them and their Leases).
    #[arg(long)]
    pub keep_nodes_on_exit: bool,

    /// Exit (killing every container) when standard input closes: a parent test process that dies
    /// takes the kubelet with it.
    #[arg(long)]
    pub exit_on_stdin_eof: bool,

    /// JSON log lines.
    #[arg(long)]
    pub log_json: bool,
}

fn parse_static_host(s: &str) -> Result<(String, Ipv4Addr), String> {
    let (name, ip) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAME=IP"))?;
    let ip: Ipv4Addr = ip.parse().map_err(|e| format!("{s:?}: {e}"))?;
    if !ip.is_loopback() {
        return Err(format!("{s:?}: only loopback addresses are allowed"));
    }
    Ok((name.to_string(), ip))
}

impl Args {
    /// Checks flag combinations that clap cannot.
    pub fn validate(&self) -> Result<(), String> {
        if self.nodes == 0 {
            return Err("--nodes must be at least 1".into());
        }
        if self.zones.is_empty() || self.zones.iter().any(String::is_empty) {
            return Err("--zones must name at least one zone".into());
        }
        if !self.control_addr.ip().is_loopback() {
            return Err("--control-addr must be a loopback address".into());
        }
        if !self.store_ip.is_loopback() {
            return Err("--store-ip must be a loopback address".into());
        }
        crate::ips::parse_range(&self.pod_ip_range)?;
        for t in &self.node_taints {
            crate::nodes::parse_taint(t)?;
        }
        Ok(())
    }

    /// The hosts file path.
    pub fn hosts_path(&self) -> PathBuf {
        self.hosts_file
            .clone()
            .unwrap_or_else(|| self.work_dir.join("hosts"))
    }

    /// Node names and zones.
    pub fn node_names(&self) -> Vec<(String, String)> {
        (0..self.nodes)
            .map(|i| {
                (
                    format!("{}-{i}", self.node_prefix),
                    self.zones[i % self.zones.len()].clone(),
                )
            })
            .collect()
    }

    /// Crash-loop back-off bounds.
    pub fn backoff(&self) -> (Duration, Duration) {
        (
            Duration::from_millis(self.backoff_initial_ms),
            Duration::from_millis(self.backoff_max_ms.max(self.backoff_initial_ms)),
        )
    }
}
