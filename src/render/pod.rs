//! The member Pod template (docs/design.md "Rendering") and its environment (docs/runtime.md
//! "The member environment").

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectFieldSelector, PodAffinityTerm, PodAntiAffinity, PodSchedulingGate, PodSecurityContext,
    PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecretKeySelector,
    SecurityContext, TopologySpreadConstraint, Volume, VolumeMount, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{fleet_labels, peers_service_name, FleetRef, RenderSettings};
use crate::api::keys::RESTART_TOKEN_ANNOTATION;
use crate::api::{BucketWorkload, PlacementMode, Profile};

/// Scheduling gate of Ordered Bucket Pods in Strict mode (docs/design.md "Zone gate").
pub const BUCKET_ZONE_GATE: &str = "celld.eric.dev/bucket-zone";
/// Mount path of the `data` volume (`CELLD_WATCH`).
pub const DATA_MOUNT_PATH: &str = "/work";

fn field_ref(path: &str) -> Option<EnvVarSource> {
    Some(EnvVarSource {
        field_ref: Some(ObjectFieldSelector {
            api_version: Some("v1".into()),
            field_path: path.into(),
        }),
        ..EnvVarSource::default()
    })
}

fn value(name: &str, v: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(v.into()),
        value_from: None,
    }
}

/// The container environment: the variables of docs/runtime.md "The member environment" in
/// that order, then `spec.env` in list order.
pub fn container_env(fleet: &FleetRef, settings: &RenderSettings) -> Vec<EnvVar> {
    let spec = fleet.spec;
    let persistent = spec.profile == Profile::PersistentFleet;
    let mut env = vec![
        EnvVar {
            name: "POD_IP".into(),
            value: None,
            value_from: field_ref("status.podIP"),
        },
        EnvVar {
            name: "CELLD_NODE".into(),
            value: None,
            value_from: field_ref(if persistent {
                "metadata.name"
            } else {
                "metadata.uid"
            }),
        },
        value(
            "CELLD_ADVERTISE",
            if persistent {
                format!(
                    "$(CELLD_NODE).{}.{}.svc:8081",
                    peers_service_name(fleet.name),
                    fleet.namespace
                )
            } else {
                "$(POD_IP):8081".to_string()
            },
        ),
        value("CELLD_BUCKET", format!("s3://{}", spec.storage.bucket)),
        value("AWS_REGION", spec.storage.region.clone()),
        value(
            "CELLD_DURABILITY",
            if persistent { "fleet" } else { "bucket" },
        ),
        value("CELLD_ADDR", "0.0.0.0:8080"),
        value("CELLD_INTERNAL_ADDR", "0.0.0.0:8081"),
        value("CELLD_WATCH", DATA_MOUNT_PATH),
        value("CELLD_TTL_MS", "10000"),
        value(
            "CELLD_SHUTDOWN_TOTAL_MS",
            (i64::from(spec.lifecycle.shutdown_seconds) * 1000).to_string(),
        ),
        value("CELLD_TOKIO_THREADS", "2"),
    ];
    if let Some(cells) = spec.execution.max_resident_cells {
        env.push(value("CELLD_MAX_RESIDENT_CELLS", cells.to_string()));
    }
    if let Some(secs) = spec.execution.idle_evict_seconds {
        env.push(value("CELLD_IDLE_EVICT_S", secs.to_string()));
    }
    if settings.local_test {
        env.push(value("S3_ENDPOINT", super::TEST_STORE_ENDPOINT));
        env.push(value("AWS_ALLOW_HTTP", "true"));
        env.push(value("AWS_ACCESS_KEY_ID", super::TEST_STORE_ACCESS_KEY));
        env.push(value("AWS_SECRET_ACCESS_KEY", super::TEST_STORE_SECRET_KEY));
    }
    for user in spec.env.iter().flatten() {
        env.push(EnvVar {
            name: user.name.clone(),
            value: user.value.clone(),
            value_from: user.secret_key_ref.as_ref().map(|r| EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: r.name.clone(),
                    key: r.key.clone(),
                    optional: None,
                }),
                ..EnvVarSource::default()
            }),
        });
    }
    env
}

fn quantity(s: &str) -> Quantity {
    Quantity(s.to_string())
}

/// The Pod template. `restart_token` is the token to render: the live token while no
/// new one is being applied (so clearing `spec.maintenance.restartToken` never rolls).
pub fn pod_template(
    fleet: &FleetRef,
    settings: &RenderSettings,
    restart_token: Option<&str>,
) -> PodTemplateSpec {
    let spec = fleet.spec;
    let labels = fleet_labels(fleet.uid);
    let strict = spec.placement.mode == PlacementMode::Strict;
    let ordered_bucket =
        spec.profile == Profile::Bucket && spec.bucket_workload == BucketWorkload::Ordered;
    let bucket = spec.profile == Profile::Bucket;

    let anti_term = PodAffinityTerm {
        topology_key: "kubernetes.io/hostname".into(),
        label_selector: Some(LabelSelector {
            match_labels: Some(labels.clone()),
            ..LabelSelector::default()
        }),
        ..PodAffinityTerm::default()
    };
    let pod_anti_affinity = if strict {
        PodAntiAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![anti_term]),
            ..PodAntiAffinity::default()
        }
    } else {
        PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                WeightedPodAffinityTerm {
                    weight: 100,
                    pod_affinity_term: anti_term,
                },
            ]),
            ..PodAntiAffinity::default()
        }
    };
    let node_affinity = NodeAffinity {
        required_during_scheduling_ignored_during_execution: Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: Some(vec![
                    NodeSelectorRequirement {
                        key: "topology.kubernetes.io/zone".into(),
                        operator: "In".into(),
                        values: Some(spec.placement.zones.clone()),
                    },
                    NodeSelectorRequirement {
                        key: "kubernetes.io/os".into(),
                        operator: "In".into(),
                        values: Some(vec!["linux".into()]),
                    },
                ]),
                match_fields: None,
            }],
        }),
        ..NodeAffinity::default()
    };
    // Ordered Bucket + Strict: a zone gate pins each ordinal instead of a spread constraint.
    let gated = ordered_bucket && strict;
    let spread = (!gated).then(|| {
        vec![TopologySpreadConstraint {
            topology_key: "topology.kubernetes.io/zone".into(),
            max_skew: 1,
            when_unsatisfiable: if strict {
                "DoNotSchedule"
            } else {
                "ScheduleAnyway"
            }
            .into(),
            min_domains: strict.then_some(spec.placement.az_count),
            node_affinity_policy: Some("Honor".into()),
            node_taints_policy: Some("Honor".into()),
            label_selector: Some(LabelSelector {
                match_labels: Some(labels.clone()),
                ..LabelSelector::default()
            }),
            ..TopologySpreadConstraint::default()
        }]
    });

    let mut requests = BTreeMap::from([
        ("cpu".to_string(), quantity(&spec.execution.cpu_request)),
        (
            "memory".to_string(),
            quantity(&spec.execution.memory_request),
        ),
    ]);
    let mut limits =
        BTreeMap::from([("memory".to_string(), quantity(&spec.execution.memory_limit))]);
    if let Some(cpu) = &spec.execution.cpu_limit {
        limits.insert("cpu".into(), quantity(cpu));
    }
    let mut volumes = None;
    if bucket {
        let size = format!("{}Gi", spec.storage.size_gib);
        let (request, limit) = match &spec.storage.scratch {
            Some(s) => (
                s.request.clone(),
                s.limit.clone().unwrap_or_else(|| s.request.clone()),
            ),
            None => (size.clone(), size),
        };
        requests.insert("ephemeral-storage".into(), quantity(&request));
        limits.insert("ephemeral-storage".into(), quantity(&limit));
        volumes = Some(vec![Volume {
            name: "data".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                size_limit: Some(quantity(&limit)),
                medium: None,
            }),
            ..Volume::default()
        }]);
    }

    let container = Container {
        name: "celld".into(),
        image: spec.runtime_image.clone(),
        image_pull_policy: Some("IfNotPresent".into()),
        ports: Some(vec![
            ContainerPort {
                name: Some("application".into()),
                container_port: 8080,
                protocol: Some("TCP".into()),
                ..ContainerPort::default()
            },
            ContainerPort {
                name: Some("peer".into()),
                container_port: 8081,
                protocol: Some("TCP".into()),
                ..ContainerPort::default()
            },
        ]),
        env: Some(container_env(fleet, settings)),
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/.well-known/celld/health".into()),
                port: IntOrString::Int(8080),
                scheme: Some("HTTP".into()),
                ..HTTPGetAction::default()
            }),
            period_seconds: Some(2),
            timeout_seconds: Some(1),
            failure_threshold: Some(3),
            success_threshold: Some(1),
            ..Probe::default()
        }),
        resources: Some(ResourceRequirements {
            requests: Some(requests),
            limits: Some(limits),
            ..ResourceRequirements::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: "data".into(),
            mount_path: DATA_MOUNT_PATH.into(),
            ..VolumeMount::default()
        }]),
        ..Container::default()
    };

    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels),
            annotations: restart_token
                .map(|t| BTreeMap::from([(RESTART_TOKEN_ANNOTATION.to_string(), t.to_string())])),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            service_account_name: Some(spec.service_account_name.clone()),
            automount_service_account_token: Some(false),
            termination_grace_period_seconds: Some(i64::from(
                spec.lifecycle.termination_grace_seconds,
            )),
            security_context: Some(PodSecurityContext {
                run_as_user: Some(10001),
                run_as_group: Some(10001),
                fs_group: Some(10001),
                run_as_non_root: Some(true),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    localhost_profile: None,
                }),
                ..PodSecurityContext::default()
            }),
            affinity: Some(Affinity {
                node_affinity: Some(node_affinity),
                pod_anti_affinity: Some(pod_anti_affinity),
                ..Affinity::default()
            }),
            topology_spread_constraints: spread,
            scheduling_gates: gated.then(|| {
                vec![PodSchedulingGate {
                    name: BUCKET_ZONE_GATE.into(),
                }]
            }),
            containers: vec![container],
            volumes,
            ..PodSpec::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::fixtures::{fleet_ref, spec};

    fn env_of(profile: &str, local_test: bool) -> Vec<EnvVar> {
        let s = spec(profile);
        let f = fleet_ref(&s);
        container_env(
            &f,
            &RenderSettings {
                local_test,
                ..RenderSettings::default()
            },
        )
    }

    #[test]
    fn persistent_members_advertise_their_stable_peer_name_never_the_pod_ip() {
        let env = env_of("PersistentFleet", false);
        let names: Vec<_> = env.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "POD_IP",
                "CELLD_NODE",
                "CELLD_ADVERTISE",
                "CELLD_BUCKET",
                "AWS_REGION",
                "CELLD_DURABILITY",
                "CELLD_ADDR",
                "CELLD_INTERNAL_ADDR",
                "CELLD_WATCH",
                "CELLD_TTL_MS",
                "CELLD_SHUTDOWN_TOTAL_MS",
                "CELLD_TOKIO_THREADS"
            ]
        );
        assert_eq!(
            env[2].value.as_deref(),
            Some("$(CELLD_NODE).beta-peers.fleets.svc:8081")
        );
        assert_eq!(
            env[1]
                .value_from
                .as_ref()
                .unwrap()
                .field_ref
                .as_ref()
                .unwrap()
                .field_path,
            "metadata.name"
        );
        assert_eq!(env[5].value.as_deref(), Some("fleet"));
        assert_eq!(env[10].value.as_deref(), Some("20000"));
    }

    #[test]
    fn bucket_members_are_their_pod_uid_and_advertise_the_pod_ip() {
        let env = env_of("Bucket", true);
        assert_eq!(
            env[1]
                .value_from
                .as_ref()
                .unwrap()
                .field_ref
                .as_ref()
                .unwrap()
                .field_path,
            "metadata.uid"
        );
        assert_eq!(env[2].value.as_deref(), Some("$(POD_IP):8081"));
        let tail: Vec<_> = env[12..].iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            tail,
            [
                "S3_ENDPOINT",
                "AWS_ALLOW_HTTP",
                "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY"
            ]
        );
    }

    #[test]
    fn user_env_follows_the_operator_variables_in_list_order() {
        let mut s = spec("Bucket");
        s.env = Some(serde_json::from_value(serde_json::json!([
            {"name": "CELLD_B", "value": "2"}, {"name": "CELLD_A", "secretKeyRef": {"name": "s", "key": "k"}}
        ])).unwrap());
        s.execution.max_resident_cells = Some(7);
        let f = fleet_ref(&s);
        let env = container_env(&f, &RenderSettings::default());
        let n = env.len();
        assert_eq!(env[n - 3].name, "CELLD_MAX_RESIDENT_CELLS");
        assert_eq!(
            (env[n - 2].name.as_str(), env[n - 1].name.as_str()),
            ("CELLD_B", "CELLD_A")
        );
        assert_eq!(
            env[n - 1]
                .value_from
                .as_ref()
                .unwrap()
                .secret_key_ref
                .as_ref()
                .unwrap()
                .key,
            "k"
        );
    }

    #[test]
    fn strict_placement_requires_anti_affinity_and_spreads_with_min_domains() {
        let s = spec("PersistentFleet");
        let f = fleet_ref(&s);
        let t = pod_template(&f, &RenderSettings::default(), None);
        let pod = t.spec.unwrap();
        let anti = pod.affinity.unwrap().pod_anti_affinity.unwrap();
        assert!(anti
            .required_during_scheduling_ignored_during_execution
            .is_some());
        let spread = &pod.topology_spread_constraints.unwrap()[0];
        assert_eq!(
            (spread.when_unsatisfiable.as_str(), spread.min_domains),
            ("DoNotSchedule", Some(3))
        );
        assert!(
            pod.volumes.is_none(),
            "PersistentFleet mounts the claim template, not an emptyDir"
        );
        assert!(
            t.metadata.unwrap().annotations.is_none(),
            "no token until one is applied"
        );
        assert_eq!(pod.automount_service_account_token, Some(false));
    }

    #[test]
    fn relaxed_placement_prefers_anti_affinity_and_schedules_anyway() {
        let mut s = spec("Bucket");
        s.placement.mode = PlacementMode::Relaxed;
        let f = fleet_ref(&s);
        let pod = pod_template(&f, &RenderSettings::default(), Some("t1"))
            .spec
            .unwrap();
        let anti = pod.affinity.unwrap().pod_anti_affinity.unwrap();
        assert_eq!(
            anti.preferred_during_scheduling_ignored_during_execution
                .unwrap()[0]
                .weight,
            100
        );
        let spread = &pod.topology_spread_constraints.unwrap()[0];
        assert_eq!(
            (spread.when_unsatisfiable.as_str(), spread.min_domains),
            ("ScheduleAnyway", None)
        );
    }

    #[test]
    fn ordered_strict_bucket_pods_are_gated_without_a_spread_constraint() {
        let mut s = spec("Bucket");
        s.bucket_workload = BucketWorkload::Ordered;
        let f = fleet_ref(&s);
        let pod = pod_template(&f, &RenderSettings::default(), None)
            .spec
            .unwrap();
        assert_eq!(pod.scheduling_gates.unwrap()[0].name, BUCKET_ZONE_GATE);
        assert!(pod.topology_spread_constraints.is_none());
    }

    #[test]
    fn bucket_scratch_sizes_the_empty_dir_and_ephemeral_storage() {
        let mut s = spec("Bucket");
        s.storage.scratch = Some(
            serde_json::from_value(serde_json::json!({"request": "2Gi", "limit": "4Gi"})).unwrap(),
        );
        s.execution.cpu_limit = Some("1".into());
        let f = fleet_ref(&s);
        let pod = pod_template(&f, &RenderSettings::default(), None)
            .spec
            .unwrap();
        let res = pod.containers[0].resources.clone().unwrap();
        assert_eq!(
            res.requests.unwrap()["ephemeral-storage"],
            Quantity("2Gi".into())
        );
        let limits = res.limits.unwrap();
        assert_eq!(limits["ephemeral-storage"], Quantity("4Gi".into()));
        assert_eq!(limits["cpu"], Quantity("1".into()));
        assert_eq!(
            pod.volumes.unwrap()[0]
                .empty_dir
                .as_ref()
                .unwrap()
                .size_limit,
            Some(Quantity("4Gi".into()))
        );
    }
}
