//! `CelldFleet`: spec, defaults, admission rules and status (docs/design.md "Validation",
//! "Status and conditions").
// The CustomResource derive takes one `printcolumn(...)` per column; clippy reads the
// repeated `type_ = ...` keys as duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::patterns::*;

/// Root CEL rule on `CelldFleet` (derived names must stay valid DNS names).
pub const FLEET_NAME_RULE: &str =
    "size(self.metadata.name) <= 40 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')";
/// Message of [`FLEET_NAME_RULE`].
pub const FLEET_NAME_MESSAGE: &str = "fleet name must be a DNS label of at most 40 characters";

/// One celld fleet: one application, one S3 bucket, N members.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "celld.eric.dev",
    version = "v1alpha1",
    kind = "CelldFleet",
    plural = "celldfleets",
    singular = "celldfleet",
    shortname = "cf",
    namespaced,
    status = "CelldFleetStatus",
    derive = "PartialEq",
    doc = "A fleet of celld members: one application, one S3 bucket, N members.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.labelSelector"
    ),
    printcolumn(name = "Profile", type_ = "string", json_path = ".spec.profile"),
    printcolumn(name = "Desired", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(
        name = "Operation",
        type_ = "string",
        json_path = ".status.currentOperation.summary"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.placement.azCount == size(self.placement.zones)",
     "message": "azCount must equal the zones count"},
    {"rule": "self.replicas >= self.placement.azCount",
     "message": "replicas must be at least placement.azCount"},
    {"rule": "(self.profile == 'PersistentFleet') == (has(self.storage.storageClassName) && self.storage.storageClassName != '')",
     "message": "storageClassName is required for PersistentFleet and forbidden for Bucket"},
    {"rule": "self.placement.zones.all(z, z.startsWith(self.storage.region) && size(z) == size(self.storage.region) + 1 && z.matches('[a-z]$'))",
     "message": "zones must be standard AZ names in storage.region"},
    {"rule": "!has(self.capacity) || self.capacity.minReplicas >= self.placement.azCount",
     "message": "capacity.minReplicas must be at least placement.azCount"},
    {"rule": "self.bucketWorkload != 'Ordered' || self.profile == 'Bucket'",
     "message": "bucketWorkload Ordered requires profile Bucket"},
    {"rule": "self.profile == 'Bucket' || !has(self.storage.scratch)",
     "message": "storage.scratch is only for Bucket"},
    {"rule": "self.profile == 'PersistentFleet' || !has(self.storage.onScaleIn)",
     "message": "storage.onScaleIn is only for PersistentFleet"},
    {"rule": "self.profile == oldSelf.profile && self.bucketWorkload == oldSelf.bucketWorkload && self.serviceAccountName == oldSelf.serviceAccountName && self.storage == oldSelf.storage && self.placement == oldSelf.placement && has(self.execution) == has(oldSelf.execution) && (!has(self.execution) || self.execution == oldSelf.execution) && has(self.lifecycle) == has(oldSelf.lifecycle) && (!has(self.lifecycle) || self.lifecycle == oldSelf.lifecycle) && has(self.env) == has(oldSelf.env) && (!has(self.env) || self.env == oldSelf.env)",
     "message": "runtime storage, layout, placement, execution, lifecycle and env are fixed at creation"}
]))]
pub struct CelldFleetSpec {
    /// Durability profile, fixed at creation.
    pub profile: Profile,
    /// Workload kind of a Bucket fleet.
    #[serde(default)]
    pub bucket_workload: BucketWorkload,
    /// Registry-qualified runtime image pinned by digest; required to provision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = RUNTIME_IMAGE))]
    pub runtime_image: Option<String>,
    /// Desired member count (also written through `/scale`).
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1, max = 100))]
    pub replicas: i32,
    /// Capacity ownership; absent means manual.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacitySpec>,
    /// Pause, restart token and coordinated downtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<MaintenanceSpec>,
    /// ServiceAccount the members run as (it carries the bucket identity).
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN))]
    pub service_account_name: String,
    /// The fleet's bucket and disks.
    pub storage: StorageSpec,
    /// Zones and spreading.
    pub placement: PlacementSpec,
    /// Container resources and runtime limits.
    #[serde(default)]
    #[schemars(extend("default" = {}))]
    pub execution: ExecutionSpec,
    /// Shutdown budget and grace period. The schema default is the full default
    /// object, not `{}`: the API server checks a default against the CEL rule
    /// without applying nested defaults, and the rule needs both fields.
    #[serde(default)]
    pub lifecycle: LifecycleSpec,
    /// Extra `CELLD_*` variables, rendered after the operator's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub env: Option<Vec<FleetEnvVar>>,
}

fn default_replicas() -> i32 {
    3
}

/// Durability profile.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Profile {
    /// Members keep state in S3.
    Bucket,
    /// One disk per member; writes acknowledged once followers fsynced them.
    PersistentFleet,
}

/// Workload kind of a Bucket fleet.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum BucketWorkload {
    /// A Deployment.
    #[default]
    Deployment,
    /// An ordered StatefulSet.
    Ordered,
}

/// `spec.capacity`. Only `mode` has an effect in this release.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.minReplicas <= self.maxReplicas", "message": "capacity.minReplicas must be at most capacity.maxReplicas"},
    {"rule": "self.cpuLowMillicores < self.cpuHighMillicores", "message": "capacity.cpuLowMillicores must be below capacity.cpuHighMillicores"},
    {"rule": "self.memoryLowMiB < self.memoryHighMiB", "message": "capacity.memoryLowMiB must be below capacity.memoryHighMiB"},
    {"rule": "self.minWindowSeconds <= self.maxWindowSeconds", "message": "capacity.minWindowSeconds must be at most capacity.maxWindowSeconds"},
    {"rule": "self.sampleIntervalSeconds <= self.maxAgeSeconds", "message": "capacity.sampleIntervalSeconds must be at most capacity.maxAgeSeconds"}
]))]
pub struct CapacitySpec {
    /// Who owns `spec.replicas`.
    #[serde(default)]
    pub mode: CapacityMode,
    /// Reserved.
    #[serde(default = "d3")]
    #[schemars(range(min = 1, max = 100))]
    pub min_replicas: i32,
    /// Reserved.
    #[serde(default = "d10")]
    #[schemars(range(min = 1, max = 100))]
    pub max_replicas: i32,
    /// Reserved.
    #[serde(default = "d1")]
    #[schemars(range(min = 1, max = 10))]
    pub scale_out_step: i32,
    /// Reserved.
    #[serde(default = "d15")]
    #[schemars(range(min = 5, max = 300))]
    pub sample_interval_seconds: i32,
    /// Reserved.
    #[serde(default = "d45")]
    #[schemars(range(min = 10, max = 600))]
    pub max_age_seconds: i32,
    /// Reserved.
    #[serde(default = "d5")]
    #[schemars(range(min = 1, max = 60))]
    pub min_window_seconds: i32,
    /// Reserved.
    #[serde(default = "d60")]
    #[schemars(range(min = 5, max = 300))]
    pub max_window_seconds: i32,
    /// Reserved.
    #[serde(default = "d3")]
    #[schemars(range(min = 2, max = 100))]
    pub min_samples: i32,
    /// Reserved.
    #[serde(default = "d30")]
    #[schemars(range(min = 10, max = 3600))]
    pub scale_out_stabilization_seconds: i32,
    /// Reserved.
    #[serde(default = "d600")]
    #[schemars(range(min = 60, max = 86400))]
    pub scale_in_stabilization_seconds: i32,
    /// Reserved.
    #[serde(default = "d300")]
    #[schemars(range(min = 30, max = 86400))]
    pub scale_out_cooldown_seconds: i32,
    /// Reserved.
    #[serde(default = "d900")]
    #[schemars(range(min = 60, max = 86400))]
    pub scale_in_cooldown_seconds: i32,
    /// Reserved.
    #[serde(default = "d600")]
    #[schemars(range(min = 60, max = 86400))]
    pub provisioning_timeout_seconds: i32,
    /// Reserved.
    #[serde(default = "d120")]
    #[schemars(range(min = 30, max = 3600))]
    pub redistribution_observation_seconds: i32,
    /// Reserved.
    #[serde(default = "d200")]
    #[schemars(range(min = 1))]
    pub cpu_high_millicores: i32,
    /// Reserved.
    #[serde(default = "d80")]
    #[schemars(range(min = 1))]
    pub cpu_low_millicores: i32,
    /// Reserved.
    #[serde(default = "d768", rename = "memoryHighMiB")]
    #[schemars(range(min = 1))]
    pub memory_high_mib: i32,
    /// Reserved.
    #[serde(default = "d384", rename = "memoryLowMiB")]
    #[schemars(range(min = 1))]
    pub memory_low_mib: i32,
}

macro_rules! int_defaults {
    ($($name:ident = $v:expr),* $(,)?) => { $(fn $name() -> i32 { $v })* };
}
int_defaults!(
    d1 = 1,
    d3 = 3,
    d5 = 5,
    d10 = 10,
    d15 = 15,
    d20 = 20,
    d30 = 30,
    d45 = 45,
    d60 = 60,
    d80 = 80,
    d120 = 120,
    d200 = 200,
    d300 = 300,
    d384 = 384,
    d600 = 600,
    d768 = 768,
    d900 = 900,
);

/// Capacity ownership mode.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum CapacityMode {
    /// Recommend only (behaves as manual in this release).
    #[default]
    Shadow,
    /// Reserved for the capacity-policy feature (behaves as manual).
    ScaleOut,
    /// Reserved for the capacity-policy feature (behaves as manual).
    Automatic,
    /// One `/scale` writer (an HPA, `kubectl scale`) owns `spec.replicas`.
    External,
}

/// `spec.maintenance`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceSpec {
    /// No new operation, healing or repair; an operation still in Intent is canceled.
    #[serde(default)]
    pub paused: bool,
    /// A new non-empty value requests one restart of every member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub restart_token: Option<String>,
    /// `true`: restarts are coordinated (whole fleet stops); `false`: rolling.
    #[serde(default)]
    pub allow_coordinated_downtime: bool,
}

/// `spec.storage`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageSpec {
    /// The fleet's bucket; the whole bucket belongs to this fleet.
    #[schemars(length(min = 3, max = 63), regex(pattern = BUCKET))]
    pub bucket: String,
    /// The bucket's region.
    #[schemars(length(max = 32), regex(pattern = REGION))]
    pub region: String,
    /// StorageClass of member disks (PersistentFleet only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN))]
    pub storage_class_name: Option<String>,
    /// Disk size (PersistentFleet) or scratch size (Bucket), in GiB.
    #[serde(default = "d10", rename = "sizeGiB")]
    #[schemars(range(min = 1, max = 16384))]
    pub size_gib: i32,
    /// Explicit scratch sizing (Bucket only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scratch: Option<ScratchSpec>,
    /// What happens to a removed member's disk (PersistentFleet only; absent means Retain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_scale_in: Option<OnScaleIn>,
}

/// `storage.scratch`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.limit) || quantity(self.limit).compareTo(quantity(self.request)) >= 0",
     "message": "scratch limit must be at least the request"}
]))]
pub struct ScratchSpec {
    /// Ephemeral-storage request and `emptyDir` size.
    #[schemars(length(max = 32), regex(pattern = MEMORY))]
    pub request: String,
    /// Ephemeral-storage limit; defaults to the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), regex(pattern = MEMORY))]
    pub limit: Option<String>,
}

/// `storage.onScaleIn`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum OnScaleIn {
    /// Keep the claim of a removed member.
    #[default]
    Retain,
    /// Delete the claim after a strict data-safe proof.
    Retire,
}

/// `spec.placement`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementSpec {
    /// Zone allowlist.
    #[schemars(length(min = 1, max = 6), inner(length(min = 1, max = 33)), extend("x-kubernetes-list-type" = "set"))]
    pub zones: Vec<String>,
    /// Number of zones to spread over; equals the zones count.
    #[schemars(range(min = 1, max = 6))]
    pub az_count: i32,
    /// Strict or relaxed spreading.
    #[serde(default)]
    pub mode: PlacementMode,
}

/// Placement mode.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum PlacementMode {
    /// Required anti-affinity, zone spread `DoNotSchedule`.
    #[default]
    Strict,
    /// Preferred anti-affinity, spread `ScheduleAnyway`.
    Relaxed,
}

/// `spec.execution`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.cpuLimit) || quantity(self.cpuLimit).compareTo(quantity(self.cpuRequest)) >= 0",
     "message": "cpuLimit must be at least cpuRequest"},
    {"rule": "!has(self.memoryLimit) || quantity(self.memoryLimit).compareTo(quantity(self.memoryRequest)) >= 0",
     "message": "memoryLimit must be at least memoryRequest"}
]))]
pub struct ExecutionSpec {
    /// Container CPU request.
    #[serde(default = "default_cpu_request")]
    #[schemars(length(max = 32), regex(pattern = CPU))]
    pub cpu_request: String,
    /// Container CPU limit (absent: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), regex(pattern = CPU))]
    pub cpu_limit: Option<String>,
    /// Container memory request.
    #[serde(default = "default_memory_request")]
    #[schemars(length(max = 32), regex(pattern = MEMORY))]
    pub memory_request: String,
    /// Container memory limit.
    #[serde(default = "default_memory_limit")]
    #[schemars(length(max = 32), regex(pattern = MEMORY))]
    pub memory_limit: String,
    /// `CELLD_MAX_RESIDENT_CELLS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000000))]
    pub max_resident_cells: Option<i32>,
    /// `CELLD_IDLE_EVICT_S`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub idle_evict_seconds: Option<i32>,
}

impl Default for ExecutionSpec {
    fn default() -> Self {
        Self {
            cpu_request: default_cpu_request(),
            cpu_limit: None,
            memory_request: default_memory_request(),
            memory_limit: default_memory_limit(),
            max_resident_cells: None,
            idle_evict_seconds: None,
        }
    }
}

fn default_cpu_request() -> String {
    "250m".into()
}
fn default_memory_request() -> String {
    "512Mi".into()
}
fn default_memory_limit() -> String {
    "1Gi".into()
}

/// `spec.lifecycle`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.terminationGraceSeconds >= self.shutdownSeconds + 5",
     "message": "terminationGraceSeconds must be at least shutdownSeconds + 5"}
]))]
pub struct LifecycleSpec {
    /// `CELLD_SHUTDOWN_TOTAL_MS = shutdownSeconds × 1000`.
    #[serde(default = "d20")]
    #[schemars(range(min = 1, max = 3600))]
    pub shutdown_seconds: i32,
    /// Pod `terminationGracePeriodSeconds`.
    #[serde(default = "d30")]
    #[schemars(range(min = 6, max = 3605))]
    pub termination_grace_seconds: i32,
}

impl Default for LifecycleSpec {
    fn default() -> Self {
        Self {
            shutdown_seconds: d20(),
            termination_grace_seconds: d30(),
        }
    }
}

/// One user environment variable.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.value) != has(self.secretKeyRef)",
     "message": "exactly one of value or secretKeyRef"},
    {"rule": "!(self.name in ['CELLD_NODE', 'CELLD_ADVERTISE', 'CELLD_BUCKET', 'CELLD_DURABILITY', 'CELLD_ADDR', 'CELLD_INTERNAL_ADDR', 'CELLD_WATCH', 'CELLD_TTL_MS', 'CELLD_SHUTDOWN_TOTAL_MS', 'CELLD_TOKIO_THREADS', 'CELLD_MAX_RESIDENT_CELLS', 'CELLD_IDLE_EVICT_S']) && !['CELLD_REEXEC_', 'CELLD_OTEL', 'CELLD_UNSAFE_', 'CELLD_TEST_', 'CELLD_STRICT_'].exists(p, self.name.startsWith(p))",
     "message": "this variable is set by the operator or reserved"}
]))]
pub struct FleetEnvVar {
    /// Variable name (`CELLD_*`, not reserved).
    #[schemars(length(max = 128), regex(pattern = ENV_NAME))]
    pub name: String,
    /// Literal value (may be empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub value: Option<String>,
    /// Value from a Secret in the fleet namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<SecretKeyRef>,
}

/// A key of a Secret in the fleet namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct SecretKeyRef {
    /// Secret name.
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN))]
    pub name: String,
    /// Key in the Secret.
    #[schemars(length(min = 1, max = 253), regex(pattern = SECRET_KEY))]
    pub key: String,
}

/// `status`: a projection, never an input.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CelldFleetStatus {
    /// Fleet Pods not Succeeded/Failed (terminating included); `/scale` status.
    #[serde(default)]
    pub replicas: i32,
    /// `/scale` selector: `celld.eric.dev/fleet-uid=<uid>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<String>,
    /// `spec.replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_replicas: Option<i32>,
    /// `spec.replicas` of the owned workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_replicas: Option<i32>,
    /// Pods with the fleet label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_replicas: Option<i32>,
    /// Non-terminating fleet Pods that are not Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub joining_replicas: Option<i32>,
    /// Fleet Pods with a deletionTimestamp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminating_replicas: Option<i32>,
    /// The workload's ready count (0 while its status is stale).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// The Pod inventory is complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_observation_valid: Option<bool>,
    /// Start of the current continuous `Blocked=True`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_since: Option<String>,
    /// Fleet generation this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Name of the CelldStorageReservation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<String>,
    /// Conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The open journal operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_operation: Option<CurrentOperation>,
    /// The last finished operations, newest first (≤ 5).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 5))]
    pub recent_operations: Vec<RecentOperation>,
    /// Restart token applied by the last completed operation that carried one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_restart_token: Option<String>,
    /// Journal summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal: Option<JournalStatus>,
}

/// Operation kinds (docs/design.md "Operation kinds").
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum OperationKind {
    /// Creates the workload and prerequisites.
    Provision,
    /// Changes the replica count.
    Scale,
    /// Applies a restart token.
    Restart,
    /// Applies a new runtime image.
    Upgrade,
    /// Corrects drift or applies a new rendering.
    TemplateUpdate,
    /// Replaces one member on a fresh disk.
    MemberReplacement,
    /// Tears a deleted fleet down.
    Delete,
}

/// Phase of the open operation as projected to status.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum OperationPhase {
    /// Decided, nothing issued.
    Intent,
    /// An effect was issued.
    Issued,
    /// Target reached, completion pending.
    Observed,
    /// Deadline passed after issue.
    Stalled,
    /// Needs a person.
    Blocked,
}

/// `status.currentOperation`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CurrentOperation {
    /// Operation id.
    pub id: String,
    /// Operation kind.
    pub kind: OperationKind,
    /// Phase.
    pub phase: OperationPhase,
    /// Current effect step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// Replica count before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<i32>,
    /// Replica count after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<i32>,
    /// The single target Pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    /// From the Intent entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// From the Intent entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
    /// Why it is waiting, stalled or blocked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocker: Option<String>,
    /// `<kind>/<phase>` plus ` <from>-><to>` or ` <member>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
}

/// One entry of `status.recentOperations`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecentOperation {
    /// Operation id.
    pub id: String,
    /// Operation kind.
    pub kind: OperationKind,
    /// Closing entry's value.
    pub outcome: String,
    /// When it closed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
}

/// `status.journal`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JournalStatus {
    /// Newest entry's seq.
    #[serde(default)]
    pub seq: i64,
    /// Newest entry's hash (hex).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_hash: Option<String>,
    /// Encoded size of the annotation.
    #[serde(default)]
    pub bytes: i64,
    /// Last seq dropped by compaction.
    #[serde(default)]
    pub compacted_through: i64,
}
