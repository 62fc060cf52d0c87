//! celld-operator: a Kubernetes operator for fleets of the celld runtime.
//!
//! Modules follow the house style (`../shared/style.md`): `api` (CRD types),
//! and, as they land, `render`, `plan`, `effects`, `status`, `cli`.

pub mod api;
pub mod cli;
pub mod controller;
pub mod failpoint;
pub mod journal_store;
pub mod leader;
pub mod metrics;
pub mod reconcile;
pub mod render;
pub mod validate;
pub mod watches;
