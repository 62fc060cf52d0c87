//! The `celld.eric.dev/v1alpha1` API: `CelldFleet` and `CelldStorageReservation`.
//! Validation that the API server can do lives in the schema (ranges, patterns, CEL rules;
//! docs/design.md "Validation"); `crds()` renders the CRDs installed from `crds/`.

pub mod fleet;
pub mod keys;
pub mod reservation;

pub use fleet::*;
pub use reservation::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, ValidationRule,
};
use kube::CustomResourceExt;

/// API group of both kinds.
pub const GROUP: &str = "celld.eric.dev";
/// The only served and storage version.
pub const VERSION: &str = "v1alpha1";

/// The CRDs this operator owns, in install order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    let mut fleet = CelldFleet::crd();
    // The root rule sees `metadata.name`; the derive only reaches `spec`/`status`.
    for version in &mut fleet.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            schema
                .x_kubernetes_validations
                .get_or_insert_with(Vec::new)
                .push(ValidationRule {
                    rule: fleet::FLEET_NAME_RULE.into(),
                    message: Some(fleet::FLEET_NAME_MESSAGE.into()),
                    ..ValidationRule::default()
                });
        }
    }
    vec![
        without_nullable(fleet),
        without_nullable(CelldStorageReservation::crd()),
    ]
}

/// Drops `nullable: true` from the generated schema: an explicit `null` then is
/// pruned before defaulting (as if the field were absent) instead of being stored,
/// so `has(self.x)` in CEL rules and the operator's decoding see the same thing.
fn without_nullable(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    fn strip(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                map.remove("nullable");
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut value = serde_json::to_value(&crd).expect("a CRD always serializes");
    if let Some(versions) = value.pointer_mut("/spec/versions") {
        strip(versions);
    }
    serde_json::from_value(value).expect("removing `nullable` keeps a valid CRD")
}

/// The CRDs as one multi-document YAML stream (what `celld-operator crds` prints).
pub fn crds_yaml() -> Result<String, serde_yaml::Error> {
    let mut out = String::new();
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}

/// JSON schema fragments shared by several fields.
pub mod patterns {
    /// DNS subdomain (RFC 1123).
    pub const DNS_SUBDOMAIN: &str =
        r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
    /// DNS label (RFC 1123).
    pub const DNS_LABEL: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
    /// S3 bucket name as the fleet accepts it.
    pub const BUCKET: &str = r"^[a-z0-9][a-z0-9-]*[a-z0-9]$";
    /// Registry-qualified repository pinned by digest.
    pub const RUNTIME_IMAGE: &str = r"^([a-z0-9]+([.-][a-z0-9]+)*|localhost)(:[0-9]{1,5})?(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)+@sha256:[a-f0-9]{64}$";
    /// CPU quantity as accepted by `execution`.
    pub const CPU: &str = r"^[0-9]+(\.[0-9]+)?m?$";
    /// Memory or storage quantity.
    pub const MEMORY: &str = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$";
    /// AWS region.
    pub const REGION: &str = r"^[a-z]{2}(-[a-z]+)+-[0-9]+$";
    /// User environment variable names.
    pub const ENV_NAME: &str = r"^CELLD_[A-Z][A-Z0-9_]*$";
    /// Secret key names.
    pub const SECRET_KEY: &str = r"^[-._a-zA-Z0-9]+$";
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema_of(crd: &CustomResourceDefinition) -> serde_json::Value {
        serde_json::to_value(&crd.spec.versions[0].schema).unwrap()["openAPIV3Schema"].clone()
    }

    #[test]
    fn fleet_crd_carries_the_root_name_rule_and_the_scale_subresource() {
        let crds = crds();
        let fleet = &crds[0];
        assert_eq!(
            fleet.metadata.name.as_deref(),
            Some("celldfleets.celld.eric.dev")
        );
        assert_eq!(
            fleet.spec.names.short_names.as_deref(),
            Some(&["cf".to_string()][..])
        );
        let schema = schema_of(fleet);
        assert_eq!(
            schema["x-kubernetes-validations"][0]["message"],
            FLEET_NAME_MESSAGE
        );
        let scale = fleet.spec.versions[0]
            .subresources
            .as_ref()
            .unwrap()
            .scale
            .as_ref()
            .unwrap();
        assert_eq!(
            scale.label_selector_path.as_deref(),
            Some(".status.labelSelector")
        );
        assert_eq!(scale.spec_replicas_path, ".spec.replicas");
        assert_eq!(scale.status_replicas_path, ".status.replicas");
    }

    #[test]
    fn generated_schema_has_no_nullable_fields() {
        for crd in crds() {
            let text = serde_json::to_string(&schema_of(&crd)).unwrap();
            assert!(
                !text.contains("\"nullable\""),
                "{}",
                crd.metadata.name.unwrap()
            );
        }
    }

    #[test]
    fn spec_rules_s1_to_s9_are_present_in_order() {
        let schema = schema_of(&crds()[0]);
        let rules = schema["properties"]["spec"]["x-kubernetes-validations"]
            .as_array()
            .unwrap();
        assert_eq!(rules.len(), 9);
        assert!(rules[8]["rule"].as_str().unwrap().contains("oldSelf"));
        assert_eq!(rules[0]["message"], "azCount must equal the zones count");
    }

    #[test]
    fn printer_columns_follow_the_api_order() {
        let crds = crds();
        let names: Vec<_> = crds[0].spec.versions[0]
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(names, ["Profile", "Desired", "Ready", "Operation", "Age"]);
    }

    #[test]
    fn reservation_name_is_s3_plus_56_hex_of_the_bucket_hash() {
        let name = CelldStorageReservation::name_for_bucket("celld-beta-data");
        assert_eq!(name.len(), 59);
        assert!(name.starts_with("s3-"));
        assert!(name[3..]
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(
            name,
            CelldStorageReservation::name_for_bucket("celld-beta-datb")
        );
    }

    #[test]
    fn a_minimal_spec_deserializes_with_the_api_defaults() {
        let spec: CelldFleetSpec = serde_json::from_value(serde_json::json!({
            "profile": "Bucket", "serviceAccountName": "sa",
            "storage": {"bucket": "b-data", "region": "us-east-1"},
            "placement": {"zones": ["us-east-1a"], "azCount": 1}
        }))
        .unwrap();
        assert_eq!(spec.replicas, 3);
        assert_eq!(spec.bucket_workload, BucketWorkload::Deployment);
        assert_eq!(spec.execution, ExecutionSpec::default());
        assert_eq!(spec.lifecycle.termination_grace_seconds, 30);
        assert_eq!(spec.storage.size_gib, 10);
        assert_eq!(spec.placement.mode, PlacementMode::Strict);
    }
}
