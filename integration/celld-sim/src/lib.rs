//! The celld simulator (integration/celld-sim/README.md) and the ledger oracle of the test bed.
//!
//! The binary `celld-sim` is configured by environment only (docs/runtime.md "The member
//! environment" plus the `CELLD_SIM_*` knobs in [`config`]). The modules follow its concerns:
//! configuration, name resolution, the S3 client, the lease, cells and durability, recovery, the
//! peer protocol, strict removal, the HTTP API and fault switches. [`ledger`] is the test-side
//! oracle.

pub mod api;
pub mod cells;
pub mod config;
pub mod disk;
pub mod durability;
pub mod faults;
pub mod hosts;
pub mod http;
pub mod lease;
pub mod ledger;
pub mod model;
pub mod node;
pub mod peer;
pub mod recovery;
pub mod removal;
pub mod sigv4;
pub mod store;
