//! The CelldStorageReservation spec and its `specHash` (docs/design.md "The storage reservation").

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::api::{CelldFleetSpec, CelldStorageReservationSpec, OnScaleIn, Profile};

/// Canonical JSON as RFC 8785 (JCS) for the values a fleet spec holds: object keys
/// sorted (serde_json's default map is ordered; keys are ASCII so byte order equals
/// JCS's UTF-16 order), no whitespace, integers and strings as serde_json writes them.
/// Floats never occur in a fleet spec.
fn canonical_json(value: &Value) -> String {
    // `Value`'s map is a BTreeMap (the `preserve_order` feature is not enabled), so
    // serialization is already sorted and compact.
    serde_json::to_string(value).expect("a JSON value always serializes")
}

/// Lowercase hex SHA-256 of the JCS form of the defaulted spec without `replicas`,
/// `capacity`, `runtimeImage` and `maintenance`, plus `initialReplicas`, with
/// `storage.onScaleIn` materialised as `Retain` for PersistentFleet.
pub fn spec_hash(spec: &CelldFleetSpec, initial_replicas: i32) -> String {
    let mut v = serde_json::to_value(spec).expect("a fleet spec always serializes");
    let map = v.as_object_mut().expect("a spec is an object");
    for key in ["replicas", "capacity", "runtimeImage", "maintenance"] {
        map.remove(key);
    }
    map.insert("initialReplicas".into(), Value::from(initial_replicas));
    if spec.profile == Profile::PersistentFleet {
        let on_scale_in = spec.storage.on_scale_in.unwrap_or(OnScaleIn::Retain);
        map["storage"]["onScaleIn"] =
            serde_json::to_value(on_scale_in).expect("an enum serializes");
    }
    hex::encode(Sha256::digest(canonical_json(&v).as_bytes()))
}

/// The reservation spec a fleet creates.
pub fn reservation_spec(
    namespace: &str,
    name: &str,
    uid: &str,
    spec: &CelldFleetSpec,
) -> CelldStorageReservationSpec {
    CelldStorageReservationSpec {
        bucket: spec.storage.bucket.clone(),
        fleet_namespace: namespace.to_string(),
        fleet_name: name.to_string(),
        fleet_uid: uid.to_string(),
        spec_hash: spec_hash(spec, spec.replicas),
        initial_replicas: Some(spec.replicas),
        owner_kind: None,
        prefix: None,
        endpoint: None,
        initialization: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::fixtures::spec;

    #[test]
    fn spec_hash_ignores_mutable_fields_and_tracks_fixed_ones() {
        let a = spec("PersistentFleet");
        let mut b = a.clone();
        b.replicas = 7;
        b.runtime_image = Some("other".into());
        b.maintenance = Some(Default::default());
        assert_eq!(spec_hash(&a, 3), spec_hash(&b, 3));
        assert_ne!(
            spec_hash(&a, 3),
            spec_hash(&a, 4),
            "initialReplicas is hashed"
        );
        let mut c = a.clone();
        c.storage.size_gib = 11;
        assert_ne!(spec_hash(&a, 3), spec_hash(&c, 3));
    }

    #[test]
    fn absent_on_scale_in_hashes_as_retain_for_persistent_fleets() {
        let a = spec("PersistentFleet");
        let mut b = a.clone();
        b.storage.on_scale_in = Some(OnScaleIn::Retain);
        assert_eq!(spec_hash(&a, 3), spec_hash(&b, 3));
        b.storage.on_scale_in = Some(OnScaleIn::Retire);
        assert_ne!(spec_hash(&a, 3), spec_hash(&b, 3));
    }

    #[test]
    fn canonical_json_sorts_keys_without_whitespace() {
        let v = serde_json::json!({"b": 1, "a": {"d": "x", "c": [true, null]}});
        assert_eq!(
            canonical_json(&v),
            r#"{"a":{"c":[true,null],"d":"x"},"b":1}"#
        );
        let h = spec_hash(&spec("Bucket"), 3);
        assert_eq!(h.len(), 64);
        assert!(h.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')));
    }
}
