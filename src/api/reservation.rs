//! `CelldStorageReservation` (docs/design.md "The storage reservation"): binds one bucket to one
//! fleet UID for ever.
// The CustomResource derive takes one `printcolumn(...)` per column; clippy reads the
// repeated `type_ = ...` keys as duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::patterns::*;

/// Binding of one S3 bucket to one fleet; never transferred, never deleted by the operator.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "celld.eric.dev",
    version = "v1alpha1",
    kind = "CelldStorageReservation",
    plural = "celldstoragereservations",
    singular = "celldstoragereservation",
    derive = "PartialEq",
    doc = "Binds one S3 bucket to one CelldFleet UID for ever.",
    printcolumn(name = "Bucket", type_ = "string", json_path = ".spec.bucket"),
    printcolumn(
        name = "Namespace",
        type_ = "string",
        json_path = ".spec.fleetNamespace"
    ),
    printcolumn(name = "Fleet", type_ = "string", json_path = ".spec.fleetName"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self == oldSelf", "message": "storage reservations cannot be transferred or changed"}
]))]
pub struct CelldStorageReservationSpec {
    /// The fleet's bucket.
    #[schemars(length(min = 3, max = 63), regex(pattern = BUCKET))]
    pub bucket: String,
    /// Fleet namespace.
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL))]
    pub fleet_namespace: String,
    /// Fleet name.
    #[schemars(length(min = 1, max = 40), regex(pattern = DNS_LABEL))]
    pub fleet_name: String,
    /// Fleet `metadata.uid`.
    #[serde(rename = "fleetUID")]
    #[schemars(length(min = 1, max = 128))]
    pub fleet_uid: String,
    /// JCS SHA-256 of the fleet's fixed spec.
    #[schemars(regex(pattern = r"^[a-f0-9]{64}$"))]
    pub spec_hash: String,
    /// `spec.replicas` at creation (older reservations lack it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub initial_replicas: Option<i32>,
    /// Never set by this release; kept for round-tripping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_kind: Option<String>,
    /// Never set by this release; kept for round-tripping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// Never set by this release; kept for round-tripping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object")]
    pub endpoint: Option<serde_json::Value>,
    /// Never set by this release; kept for round-tripping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object")]
    pub initialization: Option<serde_json::Value>,
}

fn preserve_unknown_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

impl CelldStorageReservation {
    /// `s3-` + the first 56 hex characters of SHA-256(bucket).
    pub fn name_for_bucket(bucket: &str) -> String {
        use sha2::{Digest, Sha256};
        let digest = hex::encode(Sha256::digest(bucket.as_bytes()));
        format!("s3-{}", &digest[..56])
    }
}
