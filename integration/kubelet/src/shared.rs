//! State shared by the kubelet's tasks: nodes and their fault switches, Pod IPs, the hosts file,
//! and the per-Pod facts the control endpoint reports.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use kube::Client;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::config::Args;
use crate::hosts::{HostsFile, PodHostEntry};
use crate::ips::IpAllocator;

/// A container as the control endpoint reports it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ContainerInfo {
    /// Container name.
    pub name: String,
    /// Process id (= process group id) while running; `None` in no-process mode or when stopped.
    pub pid: Option<i32>,
    /// `running`, `waiting:<reason>`, `terminated:<exit code>`.
    pub state: String,
    /// Restarts so far.
    pub restart_count: i32,
    /// Ready.
    pub ready: bool,
}

/// A Pod incarnation as the control endpoint reports it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PodInfo {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// Node.
    pub node: String,
    /// Pod IP.
    pub ip: Option<Ipv4Addr>,
    /// Phase as last computed.
    pub phase: String,
    /// Terminating (deletion seen and being carried out).
    pub terminating: bool,
    /// Folder holding `logs/<container>.log` and `volumes/`.
    pub dir: PathBuf,
    /// Containers.
    pub containers: Vec<ContainerInfo>,
}

/// Everything the tasks share.
pub struct Shared {
    /// API client (the test kubelet's identity).
    pub client: Client,
    /// Flags.
    pub args: Args,
    /// (node, zone) in order.
    pub nodes: Vec<(String, String)>,
    zombies: Mutex<HashSet<String>>,
    /// Bumped whenever the zombie set changes.
    pub zombie_tx: watch::Sender<u64>,
    /// Pod IPs.
    pub ips: Mutex<IpAllocator>,
    /// The hosts file.
    pub hosts: Mutex<HostsFile>,
    /// Live Pod incarnations by UID.
    pub pods: Mutex<HashMap<String, Arc<Mutex<PodInfo>>>>,
    /// True once shutdown began.
    pub shutdown: watch::Receiver<bool>,
    host_seq: AtomicU64,
}

impl Shared {
    /// Builds the shared state.
    pub fn new(
        client: Client,
        args: Args,
        shutdown: watch::Receiver<bool>,
    ) -> Result<Self, String> {
        let (first, last) = crate::ips::parse_range(&args.pod_ip_range)?;
        let statics = crate::hosts::static_entries(args.store_ip, &args.static_hosts);
        let mut ips = IpAllocator::new(first, last);
        if let Some(last_given) = std::fs::read_to_string(args.work_dir.join("run/next-pod-ip"))
            .ok()
            .and_then(|t| t.trim().parse::<Ipv4Addr>().ok())
        {
            ips.resume_after(last_given);
        }
        Ok(Self {
            client,
            nodes: args.node_names(),
            zombies: Mutex::new(HashSet::new()),
            zombie_tx: watch::channel(0).0,
            ips: Mutex::new(ips),
            hosts: Mutex::new(HostsFile::new(args.hosts_path(), statics)),
            pods: Mutex::new(HashMap::new()),
            shutdown,
            host_seq: AtomicU64::new(0),
            args,
        })
    }

    /// A Pod IP: `previous` (a Pod adopted after a kubelet restart) when it is free, else a fresh
    /// one. The allocation cursor is persisted in `<work-dir>/run/next-pod-ip`, so a restarted
    /// kubelet does not hand out again the addresses of recently deleted Pods.
    pub fn take_ip(&self, previous: Option<Ipv4Addr>) -> Option<Ipv4Addr> {
        let mut ips = self.ips.lock().expect("ips lock");
        if let Some(ip) = previous {
            if ips.claim(ip) {
                return Some(ip);
            }
        }
        let ip = ips.allocate()?;
        let cursor = self.args.work_dir.join("run/next-pod-ip");
        let _ = std::fs::create_dir_all(self.args.work_dir.join("run"));
        let _ = std::fs::write(cursor, ip.to_string());
        Some(ip)
    }

    /// Is `node` one of ours?
    pub fn owns_node(&self, node: &str) -> bool {
        self.nodes.iter().any(|(n, _)| n == node)
    }

    /// Is `node` a zombie (no heartbeats, no API writes for its Pods)?
    pub fn is_zombie(&self, node: &str) -> bool {
        self.zombies.lock().expect("zombie lock").contains(node)
    }

    /// Turns a node into a zombie or back; returns false for an unknown node.
    pub fn set_zombie(&self, node: &str, zombie: bool) -> bool {
        if !self.owns_node(node) {
            return false;
        }
        let changed = {
            let mut z = self.zombies.lock().expect("zombie lock");
            if zombie {
                z.insert(node.to_string())
            } else {
                z.remove(node)
            }
        };
        if changed {
            self.zombie_tx.send_modify(|v| *v += 1);
        }
        true
    }

    /// Publishes (or replaces) a Pod incarnation's hosts entry and rewrites the file.
    pub fn set_host(&self, uid: &str, name: String, ip: Ipv4Addr, created: i64) {
        let seq = self.host_seq.fetch_add(1, Ordering::Relaxed);
        let mut hosts = self.hosts.lock().expect("hosts lock");
        hosts.set(
            uid,
            PodHostEntry {
                name,
                ip,
                order: (created, seq),
            },
        );
        if let Err(e) = hosts.write() {
            tracing::error!(error = %e, path = %hosts.path().display(), "writing hosts file");
        }
    }

    /// Drops a Pod incarnation's hosts entry and rewrites the file.
    pub fn remove_host(&self, uid: &str) {
        let mut hosts = self.hosts.lock().expect("hosts lock");
        hosts.remove(uid);
        if let Err(e) = hosts.write() {
            tracing::error!(error = %e, path = %hosts.path().display(), "writing hosts file");
        }
    }

    /// A snapshot of every live Pod incarnation.
    pub fn pod_infos(&self) -> Vec<PodInfo> {
        let pods = self.pods.lock().expect("pods lock");
        let mut out: Vec<PodInfo> = pods
            .values()
            .map(|p| p.lock().expect("pod info lock").clone())
            .collect();
        out.sort_by(|a, b| (&a.namespace, &a.name, &a.uid).cmp(&(&b.namespace, &b.name, &b.uid)));
        out
    }

    /// The zombie set, for reports.
    pub fn zombies(&self) -> BTreeMap<String, bool> {
        let z = self.zombies.lock().expect("zombie lock");
        self.nodes
            .iter()
            .map(|(n, _)| (n.clone(), z.contains(n)))
            .collect()
    }
}
