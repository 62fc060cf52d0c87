//! A hand-written StatefulSet of the simulator (issue 4): the objects the operator would render
//! for a fleet, minus the operator. Env follows docs/runtime.md "The member environment"
//! (`--local-test` store settings included) plus the simulator's test tuning:
//!
//! | Variable | Value here | Why |
//! |---|---|---|
//! | `CELLD_TTL_MS` | 3000 (runtime default 10000) | a self-fence happens within ~3 s |
//! | `CELLD_SHUTDOWN_TOTAL_MS` | 10000 | grace = 15 s (≥ shutdown + 5 s) |
//! | `CELLD_READY_FLEET_GATE_MS` | 2000 (default 120000) | the first-readiness gate while a peer drains |
//! | `CELLD_SIM_FLUSH_MS` | 1000, or large so data stays only on disks and fragments | |
//! | `CELLD_SIM_STORE_WAIT_MS` | 30000 | how long a start waits for an unreachable store |
//! | `CELLD_SIM_EXIT_WITH_PID` | the test process | a member never outlives the test |
//!
//! Readiness probe: `GET /.well-known/celld/health` on 8080 every second (failure threshold 2).
//! `podManagementPolicy: Parallel` (as the operator renders): with `OrderedReady`, a fresh-disk
//! member waiting for a follower that the controller has not recreated yet would wait forever.

use std::collections::BTreeMap;

use anyhow::Result;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Service;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::{json, Value};

use crate::store::{ACCESS_KEY, SECRET_KEY};
use crate::{RUNTIME_IMAGE, STORAGE_CLASS, STORE_ENDPOINT};

/// Where the members run.
#[derive(Debug, Clone)]
pub enum Placement {
    /// The test bed's general Nodes (label `celld.test/kubelet=<prefix>`, untainted).
    General,
    /// One Node by name, with a toleration for the reserved Node's taint.
    Node(String),
}

/// A StatefulSet of simulator members.
#[derive(Debug, Clone)]
pub struct SimSet {
    /// StatefulSet name; the headless Service is `<name>-peers`.
    pub name: String,
    /// Members.
    pub replicas: i32,
    /// `fleet` (PersistentFleet) or `bucket`.
    pub durability: String,
    /// Bucket (must exist: `TestBed::bucket`).
    pub bucket: String,
    /// `CELLD_TTL_MS`.
    pub ttl_ms: u64,
    /// `CELLD_SHUTDOWN_TOTAL_MS`.
    pub shutdown_ms: u64,
    /// `CELLD_SIM_FLUSH_MS`.
    pub flush_ms: u64,
    /// Extra env (name → value), after the contract's.
    pub extra_env: BTreeMap<String, String>,
    /// Placement.
    pub placement: Placement,
    /// Image (any `registry.celld.test/celld[:tag|@digest]` runs the simulator).
    pub image: String,
}

impl SimSet {
    /// A PersistentFleet StatefulSet of `replicas` members on the general Nodes.
    pub fn fleet(name: &str, replicas: i32, bucket: &str) -> Self {
        Self {
            name: name.to_string(),
            replicas,
            durability: "fleet".into(),
            bucket: bucket.to_string(),
            ttl_ms: 3000,
            shutdown_ms: 10_000,
            flush_ms: 1000,
            extra_env: BTreeMap::new(),
            placement: Placement::General,
            image: RUNTIME_IMAGE.to_string(),
        }
    }

    /// A Bucket-profile StatefulSet (`CELLD_NODE` = Pod UID, advertises the Pod IP).
    pub fn bucket(name: &str, replicas: i32, bucket: &str) -> Self {
        Self {
            durability: "bucket".into(),
            ..Self::fleet(name, replicas, bucket)
        }
    }

    /// The headless Service name.
    pub fn service_name(&self) -> String {
        format!("{}-peers", self.name)
    }

    /// Pod names `<name>-0 …`.
    pub fn pod_names(&self) -> Vec<String> {
        (0..self.replicas)
            .map(|i| format!("{}-{i}", self.name))
            .collect()
    }

    /// The claim of ordinal `i` (`data-<name>-<i>`).
    pub fn claim_name(&self, i: i32) -> String {
        format!("data-{}-{i}", self.name)
    }

    /// The peer DNS name of ordinal `i` (`<pod>.<svc>.<ns>.svc`).
    pub fn peer_name(&self, ns: &str, i: i32) -> String {
        format!("{}-{i}.{}.{ns}.svc", self.name, self.service_name())
    }

    /// Label selector of the members.
    pub fn selector(&self) -> String {
        format!(
            "app.kubernetes.io/name=celld-sim,celld.test/set={}",
            self.name
        )
    }

    fn labels(&self) -> Value {
        json!({"app.kubernetes.io/name": "celld-sim", "celld.test/set": self.name})
    }

    /// The container env (docs/runtime.md "The member environment" for the chosen durability,
    /// then test tuning).
    pub fn env(&self, ns: &str) -> Vec<Value> {
        let fleet = self.durability == "fleet";
        let mut env = vec![
            json!({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}),
            json!({"name": "CELLD_NODE", "valueFrom": {"fieldRef": {"fieldPath":
                if fleet { "metadata.name" } else { "metadata.uid" }}}}),
            json!({"name": "CELLD_ADVERTISE", "value": if fleet {
                format!("$(CELLD_NODE).{}.{ns}.svc:8081", self.service_name())
            } else {
                "$(POD_IP):8081".to_string()
            }}),
            json!({"name": "CELLD_BUCKET", "value": format!("s3://{}", self.bucket)}),
            json!({"name": "AWS_REGION", "value": "us-east-1"}),
            json!({"name": "CELLD_DURABILITY", "value": self.durability}),
            json!({"name": "CELLD_ADDR", "value": "0.0.0.0:8080"}),
            json!({"name": "CELLD_INTERNAL_ADDR", "value": "0.0.0.0:8081"}),
            json!({"name": "CELLD_WATCH", "value": "/work"}),
            json!({"name": "CELLD_TTL_MS", "value": self.ttl_ms.to_string()}),
            json!({"name": "CELLD_SHUTDOWN_TOTAL_MS", "value": self.shutdown_ms.to_string()}),
            json!({"name": "CELLD_TOKIO_THREADS", "value": "2"}),
            json!({"name": "S3_ENDPOINT", "value": STORE_ENDPOINT}),
            json!({"name": "AWS_ALLOW_HTTP", "value": "true"}),
            json!({"name": "AWS_ACCESS_KEY_ID", "value": ACCESS_KEY}),
            json!({"name": "AWS_SECRET_ACCESS_KEY", "value": SECRET_KEY}),
            json!({"name": "CELLD_READY_FLEET_GATE_MS", "value": "2000"}),
            json!({"name": "CELLD_SIM_FLUSH_MS", "value": self.flush_ms.to_string()}),
            json!({"name": "CELLD_SIM_STORE_WAIT_MS", "value": "30000"}),
            json!({"name": "CELLD_SIM_EXIT_WITH_PID", "value": std::process::id().to_string()}),
        ];
        for (k, v) in &self.extra_env {
            env.push(json!({"name": k, "value": v}));
        }
        env
    }

    /// The headless Service.
    pub fn service(&self) -> Value {
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": self.service_name(), "labels": self.labels()},
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": true,
                "selector": self.labels(),
                "ports": [{"name": "peer", "port": 8081, "targetPort": 8081}],
            },
        })
    }

    /// The StatefulSet. `node_prefix` is the test bed's (`celld.test/kubelet` label value).
    pub fn statefulset(&self, ns: &str, node_prefix: &str) -> Value {
        let (node_selector, tolerations) = match &self.placement {
            Placement::General => (json!({crate::KUBELET_LABEL: node_prefix}), json!([])),
            Placement::Node(node) => (
                json!({crate::KUBELET_LABEL: node_prefix, "kubernetes.io/hostname": node}),
                json!([{"key": crate::RESERVED_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]),
            ),
        };
        json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": self.name, "labels": self.labels()},
            "spec": {
                "replicas": self.replicas,
                "serviceName": self.service_name(),
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": self.labels()},
                "template": {
                    "metadata": {"labels": self.labels()},
                    "spec": {
                        "nodeSelector": node_selector,
                        "tolerations": tolerations,
                        "automountServiceAccountToken": false,
                        "terminationGracePeriodSeconds": self.shutdown_ms / 1000 + 5,
                        "containers": [{
                            "name": "celld",
                            "image": self.image,
                            "ports": [
                                {"name": "application", "containerPort": 8080},
                                {"name": "peer", "containerPort": 8081},
                            ],
                            "env": self.env(ns),
                            "readinessProbe": {
                                "httpGet": {"path": "/.well-known/celld/health", "port": 8080},
                                "periodSeconds": 1, "timeoutSeconds": 1,
                                "failureThreshold": 2, "successThreshold": 1,
                            },
                            "volumeMounts": [{"name": "data", "mountPath": "/work"}],
                        }],
                    },
                },
                "volumeClaimTemplates": [{
                    "metadata": {"name": "data"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": STORAGE_CLASS,
                        "resources": {"requests": {"storage": "1Gi"}},
                    },
                }],
            },
        })
    }

    /// Creates the Service and the StatefulSet in `ns`.
    pub async fn create(&self, client: &Client, ns: &str, node_prefix: &str) -> Result<()> {
        let svc: Service = serde_json::from_value(self.service())?;
        Api::<Service>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &svc)
            .await?;
        let sts: StatefulSet = serde_json::from_value(self.statefulset(ns, node_prefix))?;
        Api::<StatefulSet>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &sts)
            .await?;
        Ok(())
    }
}
