//! The test bed's kubelet (integration/kubelet/README.md): registers Nodes, runs the Pods bound to
//! them as local processes on fresh loopback IPs, reports their status truthfully, terminates them
//! gracefully, keeps a hosts file for peer names, provisions `hostpath.csi.k8s.io` volumes as
//! folders, and exposes fault controls (zombie node, kill, pause) on a loopback HTTP endpoint.
//!
//! For tests: [`launcher::TestKubelet`] starts the binary and [`client::ControlClient`] drives
//! its fault controls. The conventions members rely on are in the crate README.

pub mod client;
pub mod config;
pub mod control;
pub mod hosts;
pub mod http;
pub mod images;
pub mod ips;
pub mod launcher;
pub mod nodes;
pub mod pods;
pub mod provisioner;
pub mod shared;

mod kubelet;

pub use kubelet::run;
