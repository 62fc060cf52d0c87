//! The workload `<f>` (docs/design.md "Rendering"): a Deployment for Bucket fleets, a StatefulSet
//! for Ordered Bucket and PersistentFleet.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
    RollingUpdateStatefulSetStrategy, StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy,
    StatefulSetSpec, StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PodTemplateSpec, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{fleet_labels, peers_service_name, uses_statefulset, FleetRef};
use crate::api::keys::STORAGE_RESERVATION_ANNOTATION;
use crate::api::Profile;

/// The rendered workload of a fleet.
#[derive(Clone, Debug, PartialEq)]
pub enum Workload {
    /// Bucket fleets with `bucketWorkload: Deployment`.
    Deployment(Box<Deployment>),
    /// PersistentFleet and Ordered Bucket fleets.
    StatefulSet(Box<StatefulSet>),
}

fn meta(fleet: &FleetRef) -> ObjectMeta {
    ObjectMeta {
        name: Some(fleet.name.to_string()),
        namespace: Some(fleet.namespace.to_string()),
        labels: Some(fleet_labels(fleet.uid)),
        ..ObjectMeta::default()
    }
}

/// Renders the fleet's workload with `replicas` members and the given Pod template.
/// `reservation` names the CelldStorageReservation recorded on the claim template.
pub fn render_workload(
    fleet: &FleetRef,
    replicas: i32,
    template: PodTemplateSpec,
    reservation: &str,
) -> Workload {
    if uses_statefulset(fleet.spec) {
        Workload::StatefulSet(Box::new(statefulset(
            fleet,
            replicas,
            template,
            reservation,
        )))
    } else {
        Workload::Deployment(Box::new(deployment(fleet, replicas, template)))
    }
}

/// Deployment `<f>`: rolling, one member down at a time, no surge (with required host
/// anti-affinity an extra Pod might find no node).
pub fn deployment(fleet: &FleetRef, replicas: i32, template: PodTemplateSpec) -> Deployment {
    Deployment {
        metadata: meta(fleet),
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(fleet_labels(fleet.uid)),
                ..LabelSelector::default()
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString::Int(1)),
                    max_surge: Some(IntOrString::Int(0)),
                }),
            }),
            template,
            ..DeploymentSpec::default()
        }),
        status: None,
    }
}

/// StatefulSet `<f>`: parallel Pod management, partition 0, claims retained on delete
/// and scale (disks outlive members; only journaled retirements delete them).
pub fn statefulset(
    fleet: &FleetRef,
    replicas: i32,
    template: PodTemplateSpec,
    reservation: &str,
) -> StatefulSet {
    let claim_templates = (fleet.spec.profile == Profile::PersistentFleet).then(|| {
        vec![PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data".into()),
                labels: Some(fleet_labels(fleet.uid)),
                annotations: Some(BTreeMap::from([(
                    STORAGE_RESERVATION_ANNOTATION.to_string(),
                    reservation.to_string(),
                )])),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOncePod".into()]),
                storage_class_name: fleet.spec.storage.storage_class_name.clone(),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([(
                        "storage".to_string(),
                        Quantity(format!("{}Gi", fleet.spec.storage.size_gib)),
                    )])),
                    limits: None,
                }),
                ..PersistentVolumeClaimSpec::default()
            }),
            status: None,
        }]
    });
    StatefulSet {
        metadata: meta(fleet),
        spec: Some(StatefulSetSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(fleet_labels(fleet.uid)),
                ..LabelSelector::default()
            },
            service_name: Some(peers_service_name(fleet.name)),
            pod_management_policy: Some("Parallel".into()),
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateStatefulSetStrategy {
                    partition: Some(0),
                    max_unavailable: None,
                }),
            }),
            persistent_volume_claim_retention_policy: Some(
                StatefulSetPersistentVolumeClaimRetentionPolicy {
                    when_deleted: Some("Retain".into()),
                    when_scaled: Some("Retain".into()),
                },
            ),
            volume_claim_templates: claim_templates,
            template,
            ..StatefulSetSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::BucketWorkload;
    use crate::render::{
        fixtures::{fleet_ref, spec},
        pod_template, RenderSettings,
    };

    #[test]
    fn persistent_fleet_renders_a_statefulset_with_a_retained_claim_template() {
        let s = spec("PersistentFleet");
        let f = fleet_ref(&s);
        let t = pod_template(&f, &RenderSettings::default(), None);
        let Workload::StatefulSet(sts) = render_workload(&f, 2, t, "s3-abc") else {
            panic!("expected a StatefulSet")
        };
        let spec_ = sts.spec.unwrap();
        assert_eq!(spec_.replicas, Some(2));
        assert_eq!(spec_.service_name.as_deref(), Some("beta-peers"));
        assert_eq!(spec_.pod_management_policy.as_deref(), Some("Parallel"));
        let claim = &spec_.volume_claim_templates.unwrap()[0];
        assert_eq!(
            claim.metadata.annotations.as_ref().unwrap()[STORAGE_RESERVATION_ANNOTATION],
            "s3-abc"
        );
        let cs = claim.spec.as_ref().unwrap();
        assert_eq!(
            cs.access_modes.as_deref(),
            Some(&["ReadWriteOncePod".to_string()][..])
        );
        assert_eq!(cs.storage_class_name.as_deref(), Some("fast"));
        let retention = spec_.persistent_volume_claim_retention_policy.unwrap();
        assert_eq!(
            (
                retention.when_deleted.as_deref(),
                retention.when_scaled.as_deref()
            ),
            (Some("Retain"), Some("Retain"))
        );
    }

    #[test]
    fn bucket_fleets_render_a_deployment_unless_ordered() {
        let mut s = spec("Bucket");
        let f = fleet_ref(&s);
        let t = pod_template(&f, &RenderSettings::default(), None);
        let Workload::Deployment(d) = render_workload(&f, 3, t.clone(), "r") else {
            panic!("expected a Deployment")
        };
        let strategy = d.spec.unwrap().strategy.unwrap().rolling_update.unwrap();
        assert_eq!(
            (strategy.max_unavailable, strategy.max_surge),
            (Some(IntOrString::Int(1)), Some(IntOrString::Int(0)))
        );
        s.bucket_workload = BucketWorkload::Ordered;
        let f = fleet_ref(&s);
        let Workload::StatefulSet(sts) = render_workload(&f, 3, t, "r") else {
            panic!("expected a StatefulSet")
        };
        assert!(
            sts.spec.unwrap().volume_claim_templates.is_none(),
            "Ordered Bucket members use scratch only"
        );
    }
}
