//! Desired objects of a fleet (docs/design.md "Rendering"): pure functions of the fleet spec,
//! its UID and the operator's settings. No client, no clock.
//!
//! Defaultable fields are rendered explicitly (protocol `TCP`, probe scheme `HTTP`,
//! `fieldRef.apiVersion: v1`) so live objects compare equal after the API server
//! applied its defaults.

mod infra;
pub mod pod;
mod reservation;
mod workload;

pub use infra::{network_policy, peers_service, pod_disruption_budget, service};
pub use pod::{container_env, pod_template};
pub use reservation::{reservation_spec, spec_hash};
pub use workload::{deployment, render_workload, statefulset, Workload};

use std::collections::BTreeMap;

use crate::api::keys::FLEET_UID_LABEL;
use crate::api::{BucketWorkload, CelldFleetSpec, Profile};

/// Operator-wide settings that shape rendering.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderSettings {
    /// `--operator-namespace`: operator Pods admitted by each NetworkPolicy.
    pub operator_namespace: String,
    /// `--local-test`: test-store environment and egress rule.
    pub local_test: bool,
}

impl Default for RenderSettings {
    fn default() -> Self {
        Self {
            operator_namespace: "celld-system".into(),
            local_test: false,
        }
    }
}

/// Identity of the fleet being rendered.
#[derive(Clone, Copy, Debug)]
pub struct FleetRef<'a> {
    /// Fleet name `<f>`.
    pub name: &'a str,
    /// Fleet namespace.
    pub namespace: &'a str,
    /// Fleet `metadata.uid`.
    pub uid: &'a str,
    /// The defaulted spec.
    pub spec: &'a CelldFleetSpec,
}

/// The fleet label (`celld.eric.dev/fleet-uid: <uid>`) as a label map.
pub fn fleet_labels(uid: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(FLEET_UID_LABEL.to_string(), uid.to_string())])
}

/// Whether the fleet runs as a StatefulSet (PersistentFleet or Ordered Bucket).
pub fn uses_statefulset(spec: &CelldFleetSpec) -> bool {
    spec.profile == Profile::PersistentFleet || spec.bucket_workload == BucketWorkload::Ordered
}

/// Name of the headless peer Service.
pub fn peers_service_name(fleet: &str) -> String {
    format!("{fleet}-peers")
}

/// Name of a member's claim (`data-<f>-<ordinal>`).
pub fn claim_name(fleet: &str, ordinal: i32) -> String {
    format!("data-{fleet}-{ordinal}")
}

/// The runtime endpoint of the test object store (docs/runtime.md "The member environment",
/// `--local-test`).
pub const TEST_STORE_ENDPOINT: &str = "http://minio.celld-test-store.svc:9000";
/// Fixed test-store access key (`--local-test`).
pub const TEST_STORE_ACCESS_KEY: &str = "celld-test";
/// Fixed test-store secret key (`--local-test`).
pub const TEST_STORE_SECRET_KEY: &str = "celld-test-secret";

#[cfg(test)]
pub(crate) mod fixtures {
    use super::FleetRef;
    use crate::api::CelldFleetSpec;

    /// The fleet `beta` in namespace `fleets` with UID `u1`.
    pub fn fleet_ref(spec: &CelldFleetSpec) -> FleetRef<'_> {
        FleetRef {
            name: "beta",
            namespace: "fleets",
            uid: "u1",
            spec,
        }
    }

    pub fn spec(profile: &str) -> CelldFleetSpec {
        let mut v = serde_json::json!({
            "profile": profile,
            "runtimeImage": format!("registry.example.com/celld/celld@sha256:{}", "a".repeat(64)),
            "replicas": 3,
            "serviceAccountName": "celld-beta",
            "storage": {"bucket": "beta-data", "region": "us-east-1"},
            "placement": {"zones": ["us-east-1a", "us-east-1b", "us-east-1c"], "azCount": 3}
        });
        if profile == "PersistentFleet" {
            v["storage"]["storageClassName"] = "fast".into();
        }
        serde_json::from_value(v).unwrap()
    }
}
