//! celld-operator: a Kubernetes operator for fleets of the celld runtime.
//!
//! `main → controller → reconcile → render / journal_store → api`; `repair` holds the
//! CLI's journal repairs. See README and docs/ for the design.

pub mod api;
pub mod cli;
pub mod compact_store;
pub mod controller;
pub mod events;
pub mod failpoint;
pub mod journal_store;
pub mod leader;
pub mod member;
pub mod metrics;
pub mod own_writes;
pub mod pass;
pub mod pass_reads;
pub mod reaction;
pub mod reconcile;
pub mod render;
pub mod repair;
pub mod slots;
pub mod status_pace;
pub mod status_view;
pub mod transport;
pub mod validate;
pub mod watch_clients;
pub mod watch_stream;
pub mod watches;
