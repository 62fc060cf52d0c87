//! CRD admission on the real API server (issue: foundation, item 6).
//!
//! Every validation rule of the CRD schema (`src/api/`) is exercised by at least one manifest that
//! the API server must reject with the rule's message; valid samples are accepted and read back
//! with defaults; immutable fields are rejected on update; `/scale` works.

use celld_harness::{api_error_message, cluster, repo_root, TestNamespace};
use celld_operator::api::{CelldFleet, CelldStorageReservation};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::{json, Value};

fn fleet_resource() -> ApiResource {
    ApiResource::erase::<CelldFleet>(&())
}

/// A valid PersistentFleet manifest that each case mutates.
fn base_fleet(name: &str) -> Value {
    json!({
        "apiVersion": "celld.eric.dev/v1alpha1",
        "kind": "CelldFleet",
        "metadata": {"name": name},
        "spec": {
            "profile": "PersistentFleet",
            "runtimeImage": format!("registry.example.com/celld/celld@sha256:{}", "a".repeat(64)),
            "replicas": 3,
            "serviceAccountName": "celld",
            "storage": {"bucket": "celld-data", "region": "us-east-1", "storageClassName": "fast"},
            "placement": {"zones": ["us-east-1a", "us-east-1b", "us-east-1c"], "azCount": 3}
        }
    })
}

/// A valid Bucket manifest.
fn base_bucket(name: &str) -> Value {
    let mut v = base_fleet(name);
    v["spec"]["profile"] = json!("Bucket");
    v["spec"]["storage"]
        .as_object_mut()
        .unwrap()
        .remove("storageClassName");
    v
}

enum Edit {
    Set(&'static str, Value),
    Remove(&'static str),
}

fn apply_edits(mut v: Value, edits: &[Edit]) -> Value {
    for edit in edits {
        match edit {
            Edit::Set(path, value) => {
                let (parent, key) = path.rsplit_once('/').unwrap();
                let target = if parent.is_empty() {
                    &mut v
                } else {
                    v.pointer_mut(parent).unwrap()
                };
                target
                    .as_object_mut()
                    .unwrap()
                    .insert(key.to_string(), value.clone());
            }
            Edit::Remove(path) => {
                let (parent, key) = path.rsplit_once('/').unwrap();
                v.pointer_mut(parent)
                    .unwrap()
                    .as_object_mut()
                    .unwrap()
                    .remove(key);
            }
        }
    }
    v
}

struct Case {
    name: &'static str,
    bucket_profile: bool,
    edits: Vec<Edit>,
    expect: &'static str,
}

fn case(name: &'static str, edits: Vec<Edit>, expect: &'static str) -> Case {
    Case {
        name,
        bucket_profile: false,
        edits,
        expect,
    }
}

fn bucket_case(name: &'static str, edits: Vec<Edit>, expect: &'static str) -> Case {
    Case {
        name,
        bucket_profile: true,
        edits,
        expect,
    }
}

fn invalid_cases() -> Vec<Case> {
    use Edit::*;
    let envs = |items: Value| Set("/spec/env", items);
    vec![
        // Root rule on the name.
        case(
            "name-41-chars",
            vec![Set("/metadata/name", json!("a".repeat(41)))],
            "fleet name must be a DNS label of at most 40 characters",
        ),
        case(
            "name-with-dot",
            vec![Set("/metadata/name", json!("alpha.beta"))],
            "fleet name must be a DNS label of at most 40 characters",
        ),
        // profile and bucketWorkload.
        case(
            "profile-missing",
            vec![Remove("/spec/profile")],
            "spec.profile: Required value",
        ),
        case(
            "profile-unknown",
            vec![Set("/spec/profile", json!("Disk"))],
            "spec.profile: Unsupported value: \"Disk\"",
        ),
        case(
            "bucket-workload-unknown",
            vec![Set("/spec/bucketWorkload", json!("DaemonSet"))],
            "spec.bucketWorkload: Unsupported value",
        ),
        case(
            "ordered-needs-bucket (S6)",
            vec![Set("/spec/bucketWorkload", json!("Ordered"))],
            "bucketWorkload Ordered requires profile Bucket",
        ),
        // runtimeImage.
        case(
            "image-tag-not-digest",
            vec![Set(
                "/spec/runtimeImage",
                json!("registry.example.com/celld/celld:1.0"),
            )],
            "spec.runtimeImage in body should match",
        ),
        case(
            "image-without-registry",
            vec![Set(
                "/spec/runtimeImage",
                json!(format!("celld@sha256:{}", "a".repeat(64))),
            )],
            "spec.runtimeImage in body should match",
        ),
        case(
            "image-short-digest",
            vec![Set(
                "/spec/runtimeImage",
                json!("registry.example.com/celld@sha256:abc"),
            )],
            "spec.runtimeImage in body should match",
        ),
        // replicas.
        case(
            "replicas-zero",
            vec![Set("/spec/replicas", json!(0))],
            "spec.replicas in body should be greater than or equal to 1",
        ),
        case(
            "replicas-101",
            vec![Set("/spec/replicas", json!(101))],
            "spec.replicas in body should be less than or equal to 100",
        ),
        case(
            "replicas-below-azcount (S2)",
            vec![Set("/spec/replicas", json!(2))],
            "replicas must be at least placement.azCount",
        ),
        // serviceAccountName.
        case(
            "service-account-missing",
            vec![Remove("/spec/serviceAccountName")],
            "spec.serviceAccountName: Required value",
        ),
        case(
            "service-account-invalid",
            vec![Set("/spec/serviceAccountName", json!("Bad_Name"))],
            "spec.serviceAccountName in body should match",
        ),
        // storage.
        case(
            "storage-missing",
            vec![Remove("/spec/storage")],
            "spec.storage: Required value",
        ),
        case(
            "bucket-too-short",
            vec![Set("/spec/storage/bucket", json!("ab"))],
            "spec.storage.bucket in body should be at least 3 chars long",
        ),
        case(
            "bucket-uppercase",
            vec![Set("/spec/storage/bucket", json!("Celld-Data"))],
            "spec.storage.bucket in body should match",
        ),
        case(
            "bucket-too-long",
            vec![Set("/spec/storage/bucket", json!("b".repeat(64)))],
            "spec.storage.bucket: Too long",
        ),
        case(
            "region-invalid",
            vec![Set("/spec/storage/region", json!("useast1"))],
            "spec.storage.region in body should match",
        ),
        case(
            "persistent-without-storage-class (S3)",
            vec![Remove("/spec/storage/storageClassName")],
            "storageClassName is required for PersistentFleet and forbidden for Bucket",
        ),
        bucket_case(
            "bucket-with-storage-class (S3)",
            vec![Set("/spec/storage/storageClassName", json!("fast"))],
            "storageClassName is required for PersistentFleet and forbidden for Bucket",
        ),
        case(
            "size-zero",
            vec![Set("/spec/storage/sizeGiB", json!(0))],
            "spec.storage.sizeGiB in body should be greater than or equal to 1",
        ),
        case(
            "size-too-large",
            vec![Set("/spec/storage/sizeGiB", json!(16385))],
            "spec.storage.sizeGiB in body should be less than or equal to 16384",
        ),
        case(
            "scratch-on-persistent (S7)",
            vec![Set("/spec/storage/scratch", json!({"request": "1Gi"}))],
            "storage.scratch is only for Bucket",
        ),
        bucket_case(
            "scratch-limit-below-request",
            vec![Set(
                "/spec/storage/scratch",
                json!({"request": "2Gi", "limit": "1Gi"}),
            )],
            "scratch limit must be at least the request",
        ),
        bucket_case(
            "scratch-request-bad-unit",
            vec![Set("/spec/storage/scratch", json!({"request": "10GB"}))],
            "spec.storage.scratch.request in body should match",
        ),
        bucket_case(
            "scratch-request-missing",
            vec![Set("/spec/storage/scratch", json!({"limit": "1Gi"}))],
            "spec.storage.scratch.request: Required value",
        ),
        bucket_case(
            "on-scale-in-on-bucket (S8)",
            vec![Set("/spec/storage/onScaleIn", json!("Retire"))],
            "storage.onScaleIn is only for PersistentFleet",
        ),
        case(
            "on-scale-in-unknown",
            vec![Set("/spec/storage/onScaleIn", json!("Delete"))],
            "spec.storage.onScaleIn: Unsupported value",
        ),
        // placement.
        case(
            "azcount-mismatch (S1)",
            vec![Set("/spec/placement/azCount", json!(2))],
            "azCount must equal the zones count",
        ),
        case(
            "azcount-zero",
            vec![Set("/spec/placement/azCount", json!(0))],
            "spec.placement.azCount in body should be greater than or equal to 1",
        ),
        case(
            "zones-empty",
            vec![Set("/spec/placement/zones", json!([]))],
            "spec.placement.zones in body should have at least 1 items",
        ),
        case(
            "zones-seven",
            vec![Set(
                "/spec/placement/zones",
                json!([
                    "us-east-1a",
                    "us-east-1b",
                    "us-east-1c",
                    "us-east-1d",
                    "us-east-1e",
                    "us-east-1f",
                    "us-east-1g"
                ]),
            )],
            "spec.placement.zones: Too many: 7: must have at most 6 items",
        ),
        case(
            "zones-duplicate",
            vec![Set(
                "/spec/placement/zones",
                json!(["us-east-1a", "us-east-1a", "us-east-1b"]),
            )],
            "spec.placement.zones[1]: Duplicate value",
        ),
        case(
            "zone-other-region (S4)",
            vec![Set(
                "/spec/placement/zones",
                json!(["us-east-1a", "us-east-1b", "eu-west-1c"]),
            )],
            "zones must be standard AZ names in storage.region",
        ),
        case(
            "zone-long-suffix (S4)",
            vec![Set(
                "/spec/placement/zones",
                json!(["us-east-1a", "us-east-1b", "us-east-1cc"]),
            )],
            "zones must be standard AZ names in storage.region",
        ),
        case(
            "zone-digit-suffix (S4)",
            vec![Set(
                "/spec/placement/zones",
                json!(["us-east-1a", "us-east-1b", "us-east-12"]),
            )],
            "zones must be standard AZ names in storage.region",
        ),
        case(
            "placement-mode-unknown",
            vec![Set("/spec/placement/mode", json!("Loose"))],
            "spec.placement.mode: Unsupported value",
        ),
        // execution.
        case(
            "cpu-request-bad",
            vec![Set("/spec/execution", json!({"cpuRequest": "1core"}))],
            "spec.execution.cpuRequest in body should match",
        ),
        case(
            "cpu-limit-below-request",
            vec![Set(
                "/spec/execution",
                json!({"cpuRequest": "500m", "cpuLimit": "250m"}),
            )],
            "cpuLimit must be at least cpuRequest",
        ),
        case(
            "memory-limit-below-request",
            vec![Set("/spec/execution", json!({"memoryRequest": "2Gi"}))],
            "memoryLimit must be at least memoryRequest",
        ),
        case(
            "memory-request-bad",
            vec![Set("/spec/execution", json!({"memoryRequest": "1GB"}))],
            "spec.execution.memoryRequest in body should match",
        ),
        case(
            "max-resident-cells-zero",
            vec![Set("/spec/execution", json!({"maxResidentCells": 0}))],
            "spec.execution.maxResidentCells in body should be greater than or equal to 1",
        ),
        case(
            "idle-evict-too-long",
            vec![Set("/spec/execution", json!({"idleEvictSeconds": 86401}))],
            "spec.execution.idleEvictSeconds in body should be less than or equal to 86400",
        ),
        // lifecycle.
        case(
            "shutdown-26-with-default-grace",
            vec![Set("/spec/lifecycle", json!({"shutdownSeconds": 26}))],
            "terminationGraceSeconds must be at least shutdownSeconds + 5",
        ),
        case(
            "grace-24-with-default-shutdown",
            vec![Set(
                "/spec/lifecycle",
                json!({"terminationGraceSeconds": 24}),
            )],
            "terminationGraceSeconds must be at least shutdownSeconds + 5",
        ),
        case(
            "grace-below-minimum",
            vec![Set(
                "/spec/lifecycle",
                json!({"shutdownSeconds": 1, "terminationGraceSeconds": 5}),
            )],
            "spec.lifecycle.terminationGraceSeconds in body should be greater than or equal to 6",
        ),
        case(
            "shutdown-zero",
            vec![Set("/spec/lifecycle", json!({"shutdownSeconds": 0}))],
            "spec.lifecycle.shutdownSeconds in body should be greater than or equal to 1",
        ),
        // env.
        case(
            "env-name-lowercase",
            vec![envs(json!([{"name": "CELLD_foo", "value": "x"}]))],
            "spec.env[0].name in body should match",
        ),
        case(
            "env-name-not-celld",
            vec![envs(json!([{"name": "PATH", "value": "x"}]))],
            "spec.env[0].name in body should match",
        ),
        case(
            "env-reserved-name",
            vec![envs(json!([{"name": "CELLD_NODE", "value": "x"}]))],
            "this variable is set by the operator or reserved",
        ),
        case(
            "env-reserved-prefix",
            vec![envs(json!([{"name": "CELLD_TEST_MODE", "value": "x"}]))],
            "this variable is set by the operator or reserved",
        ),
        case(
            "env-value-and-secret",
            vec![envs(
                json!([{"name": "CELLD_X", "value": "x", "secretKeyRef": {"name": "s", "key": "k"}}]),
            )],
            "exactly one of value or secretKeyRef",
        ),
        case(
            "env-neither",
            vec![envs(json!([{"name": "CELLD_X"}]))],
            "exactly one of value or secretKeyRef",
        ),
        case(
            "env-duplicate-name",
            vec![envs(
                json!([{"name": "CELLD_X", "value": "1"}, {"name": "CELLD_X", "value": "2"}]),
            )],
            "spec.env[1]: Duplicate value",
        ),
        case(
            "env-33-items",
            vec![envs(Value::Array(
                (0..33)
                    .map(|i| json!({"name": format!("CELLD_V{i}"), "value": "x"}))
                    .collect(),
            ))],
            "spec.env: Too many: 33: must have at most 32 items",
        ),
        case(
            "env-secret-key-invalid",
            vec![envs(
                json!([{"name": "CELLD_X", "secretKeyRef": {"name": "s", "key": "a b"}}]),
            )],
            "spec.env[0].secretKeyRef.key in body should match",
        ),
        case(
            "env-value-too-long",
            vec![envs(
                json!([{"name": "CELLD_X", "value": "v".repeat(4097)}]),
            )],
            "spec.env[0].value: Too long",
        ),
        // capacity.
        case(
            "capacity-min-above-max",
            vec![Set(
                "/spec/capacity",
                json!({"minReplicas": 5, "maxReplicas": 4}),
            )],
            "capacity.minReplicas must be at most capacity.maxReplicas",
        ),
        case(
            "capacity-min-below-azcount (S5)",
            vec![Set("/spec/capacity", json!({"minReplicas": 2}))],
            "capacity.minReplicas must be at least placement.azCount",
        ),
        case(
            "capacity-cpu-thresholds",
            vec![Set("/spec/capacity", json!({"cpuLowMillicores": 300}))],
            "capacity.cpuLowMillicores must be below capacity.cpuHighMillicores",
        ),
        case(
            "capacity-memory-thresholds",
            vec![Set("/spec/capacity", json!({"memoryLowMiB": 768}))],
            "capacity.memoryLowMiB must be below capacity.memoryHighMiB",
        ),
        case(
            "capacity-windows",
            vec![Set(
                "/spec/capacity",
                json!({"minWindowSeconds": 30, "maxWindowSeconds": 10}),
            )],
            "capacity.minWindowSeconds must be at most capacity.maxWindowSeconds",
        ),
        case(
            "capacity-sample-interval",
            vec![Set("/spec/capacity", json!({"sampleIntervalSeconds": 60}))],
            "capacity.sampleIntervalSeconds must be at most capacity.maxAgeSeconds",
        ),
        case(
            "capacity-mode-unknown",
            vec![Set("/spec/capacity", json!({"mode": "Manual"}))],
            "spec.capacity.mode: Unsupported value",
        ),
        case(
            "capacity-step-too-big",
            vec![Set("/spec/capacity", json!({"scaleOutStep": 11}))],
            "spec.capacity.scaleOutStep in body should be less than or equal to 10",
        ),
        // maintenance.
        case(
            "restart-token-too-long",
            vec![Set(
                "/spec/maintenance",
                json!({"restartToken": "t".repeat(129)}),
            )],
            "spec.maintenance.restartToken: Too long",
        ),
    ]
}

#[tokio::test]
async fn crds_are_established() {
    let cluster = cluster();
    let out = cluster
        .kubectl(&["get", "crd", "celldfleets.celld.eric.dev", "celldstoragereservations.celld.eric.dev",
            "-o", "jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type==\"Established\")].status};{end}"])
        .unwrap();
    assert_eq!(
        out,
        "celldfleets.celld.eric.dev=True;celldstoragereservations.celld.eric.dev=True;"
    );
    // The installed CRD is the generated one (no drift between crds/ and the binary).
    let generated = celld_operator::api::crds_yaml().unwrap();
    let committed = std::fs::read_to_string(repo_root().join("crds/celld.eric.dev.yaml")).unwrap();
    assert_eq!(generated, committed, "crds/ is stale: run `make crds`");
}

#[tokio::test]
async fn invalid_fleets_are_rejected_with_actionable_messages() {
    let cluster = cluster();
    let client = cluster.admin_client().await.unwrap();
    let ns = TestNamespace::create(&client, "admission").await.unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns.name, &fleet_resource());
    let cases = invalid_cases();
    assert!(
        cases.len() >= 30,
        "the issue asks for at least 30 invalid manifests"
    );
    let mut failures = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let name = format!("bad-{i}");
        let base = if c.bucket_profile {
            base_bucket(&name)
        } else {
            base_fleet(&name)
        };
        let manifest = apply_edits(base, &c.edits);
        let obj: DynamicObject = serde_json::from_value(manifest).unwrap();
        match api_error_message(api.create(&PostParams::default(), &obj).await) {
            Ok(message) if message.contains(c.expect) => {}
            Ok(message) => failures.push(format!(
                "{}: expected {:?} in {:?}",
                c.name, c.expect, message
            )),
            Err(e) => failures.push(format!("{}: {e}", c.name)),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    eprintln!(
        "{} invalid CelldFleet manifests rejected with the expected message",
        cases.len()
    );
    ns.delete().await.unwrap();
}

#[tokio::test]
async fn valid_samples_are_accepted_and_read_back_with_defaults() {
    let cluster = cluster();
    let client = cluster.admin_client().await.unwrap();
    let ns = TestNamespace::create(&client, "samples").await.unwrap();
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let samples = repo_root().join("config/samples");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&samples).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let fleet: CelldFleet =
            serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let created = api
            .create(&PostParams::default(), &fleet)
            .await
            .unwrap_or_else(|e| panic!("sample {} rejected: {e}", path.display()));
        names.push(created.name_unchecked());
    }
    assert!(
        names.len() >= 2,
        "expected the Bucket and PersistentFleet samples"
    );

    // A minimal manifest reads back with every schema default materialised.
    let minimal = json!({
        "apiVersion": "celld.eric.dev/v1alpha1", "kind": "CelldFleet",
        "metadata": {"name": "minimal"},
        "spec": {"profile": "Bucket", "serviceAccountName": "celld",
                 "storage": {"bucket": "minimal-data", "region": "eu-west-1"},
                 "placement": {"zones": ["eu-west-1a"], "azCount": 1}}
    });
    let fleet: CelldFleet = serde_json::from_value(minimal).unwrap();
    api.create(&PostParams::default(), &fleet).await.unwrap();
    let raw: DynamicObject = Api::namespaced_with(client.clone(), &ns.name, &fleet_resource())
        .get("minimal")
        .await
        .unwrap();
    let spec = &raw.data["spec"];
    assert_eq!(spec["replicas"], json!(3));
    assert_eq!(spec["bucketWorkload"], json!("Deployment"));
    assert_eq!(spec["storage"]["sizeGiB"], json!(10));
    assert_eq!(spec["placement"]["mode"], json!("Strict"));
    assert_eq!(
        spec["execution"],
        json!({"cpuRequest": "250m", "memoryRequest": "512Mi", "memoryLimit": "1Gi"})
    );
    assert_eq!(
        spec["lifecycle"],
        json!({"shutdownSeconds": 20, "terminationGraceSeconds": 30})
    );
    assert!(
        spec["storage"].get("onScaleIn").is_none(),
        "onScaleIn has no schema default"
    );
    assert!(spec.get("capacity").is_none() && spec.get("maintenance").is_none());

    // Capacity and maintenance defaults appear once the objects are given.
    let patched = api
        .patch("minimal", &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"capacity": {"mode": "External", "minReplicas": 1}, "maintenance": {}}})))
        .await
        .unwrap();
    let capacity = patched.spec.capacity.unwrap();
    assert_eq!(
        (
            capacity.max_replicas,
            capacity.scale_in_cooldown_seconds,
            capacity.memory_high_mib
        ),
        (10, 900, 768)
    );
    let maintenance = patched.spec.maintenance.unwrap();
    assert!(!maintenance.paused && !maintenance.allow_coordinated_downtime);
    ns.delete().await.unwrap();
}

#[tokio::test]
async fn immutable_fields_are_rejected_and_mutable_fields_accepted() {
    let cluster = cluster();
    let client = cluster.admin_client().await.unwrap();
    let ns = TestNamespace::create(&client, "immutable").await.unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns.name, &fleet_resource());
    let mut manifest = base_fleet("fixed");
    manifest["spec"]["env"] = json!([{"name": "CELLD_LOG", "value": "info"}]);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(manifest).unwrap(),
    )
    .await
    .unwrap();

    const S9: &str =
        "runtime storage, layout, placement, execution, lifecycle and env are fixed at creation";
    let immutable: Vec<(&str, Value)> = vec![
        (
            "profile",
            json!({"profile": "Bucket", "storage": {"storageClassName": null}}),
        ),
        ("bucketWorkload", json!({"bucketWorkload": "Ordered"})),
        ("serviceAccountName", json!({"serviceAccountName": "other"})),
        (
            "storage.bucket",
            json!({"storage": {"bucket": "other-bucket"}}),
        ),
        (
            "storage.region",
            json!({"storage": {"region": "us-west-2"}}),
        ),
        (
            "storage.storageClassName",
            json!({"storage": {"storageClassName": "slow"}}),
        ),
        ("storage.sizeGiB", json!({"storage": {"sizeGiB": 20}})),
        (
            "storage.onScaleIn",
            json!({"storage": {"onScaleIn": "Retire"}}),
        ),
        ("placement.mode", json!({"placement": {"mode": "Relaxed"}})),
        (
            "placement.zones",
            json!({"replicas": 4, "placement": {"zones": ["us-east-1a", "us-east-1b", "us-east-1d"]}}),
        ),
        (
            "execution.cpuRequest",
            json!({"execution": {"cpuRequest": "300m"}}),
        ),
        (
            "execution.maxResidentCells",
            json!({"execution": {"maxResidentCells": 10}}),
        ),
        (
            "lifecycle.shutdownSeconds",
            json!({"lifecycle": {"shutdownSeconds": 10}}),
        ),
        (
            "env value",
            json!({"env": [{"name": "CELLD_LOG", "value": "debug"}]}),
        ),
        ("env removed", json!({"env": null})),
    ];
    let mut failures = Vec::new();
    for (field, spec_patch) in &immutable {
        let result = api
            .patch(
                "fixed",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": spec_patch})),
            )
            .await;
        match api_error_message(result) {
            Ok(m) if m.contains(S9) => {}
            Ok(m) => failures.push(format!("{field}: unexpected message {m:?}")),
            Err(e) => failures.push(format!("{field}: {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "immutable fields:\n{}",
        failures.join("\n")
    );

    let mutable: Vec<(&str, Value)> = vec![
        ("replicas", json!({"replicas": 5})),
        (
            "runtimeImage",
            json!({"runtimeImage": format!("registry.example.com/celld/celld@sha256:{}", "b".repeat(64))}),
        ),
        ("capacity", json!({"capacity": {"mode": "External"}})),
        (
            "maintenance",
            json!({"maintenance": {"paused": true, "restartToken": "r1", "allowCoordinatedDowntime": true}}),
        ),
    ];
    for (field, spec_patch) in &mutable {
        api.patch(
            "fixed",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": spec_patch})),
        )
        .await
        .unwrap_or_else(|e| panic!("mutable field {field} rejected: {e}"));
    }
    let after = api.get("fixed").await.unwrap();
    assert_eq!(after.data["spec"]["replicas"], json!(5));
    assert_eq!(
        after.data["spec"]["maintenance"]["restartToken"],
        json!("r1")
    );
    ns.delete().await.unwrap();
}

#[tokio::test]
async fn kubectl_scale_changes_spec_replicas_and_scale_reports_the_status_selector() {
    let cluster = cluster();
    let client = cluster.admin_client().await.unwrap();
    let ns = TestNamespace::create(&client, "scale").await.unwrap();
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let fleet: CelldFleet = serde_json::from_value(base_bucket("scaled")).unwrap();
    let created = api.create(&PostParams::default(), &fleet).await.unwrap();
    let uid = created.meta().uid.clone().unwrap();
    let selector = format!("celld.eric.dev/fleet-uid={uid}");
    api.patch_status(
        "scaled",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"replicas": 3, "labelSelector": selector}})),
    )
    .await
    .unwrap();

    cluster
        .kubectl(&["-n", &ns.name, "scale", "celldfleet/scaled", "--replicas=5"])
        .unwrap();
    let after = api.get("scaled").await.unwrap();
    assert_eq!(after.spec.replicas, 5);
    assert_eq!(
        after.meta().generation,
        Some(2),
        "a /scale write is a spec edit"
    );

    let scale = api.get_scale("scaled").await.unwrap();
    let status = scale.status.unwrap();
    assert_eq!(status.selector.as_deref(), Some(selector.as_str()));
    assert_eq!(status.replicas, 3);
    assert_eq!(scale.spec.unwrap().replicas, Some(5));

    // `/scale` is subject to the same validation as the spec.
    let out = cluster
        .kubectl_output(&["-n", &ns.name, "scale", "celldfleet/scaled", "--replicas=2"])
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("replicas must be at least placement.azCount"));
    // `--resource-version` gives users a precondition.
    let out = cluster
        .kubectl_output(&[
            "-n",
            &ns.name,
            "scale",
            "celldfleet/scaled",
            "--replicas=4",
            "--resource-version=1",
        ])
        .unwrap();
    assert!(
        !out.status.success(),
        "a stale resourceVersion must be refused"
    );
    assert_eq!(api.get("scaled").await.unwrap().spec.replicas, 5);
    ns.delete().await.unwrap();
}

#[tokio::test]
async fn storage_reservation_spec_cannot_be_changed() {
    let cluster = cluster();
    let client = cluster.admin_client().await.unwrap();
    let api: Api<CelldStorageReservation> = Api::all(client.clone());
    let bucket = format!("bucket-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let name = CelldStorageReservation::name_for_bucket(&bucket);
    assert_eq!(name.len(), 3 + 56);
    let reservation: CelldStorageReservation = serde_json::from_value(json!({
        "apiVersion": "celld.eric.dev/v1alpha1", "kind": "CelldStorageReservation",
        "metadata": {"name": name},
        "spec": {"bucket": bucket, "fleetNamespace": "fleets", "fleetName": "beta",
                 "fleetUID": "8cf9c808-182b-4439-8a9f-1589a38ff694", "specHash": "0".repeat(64), "initialReplicas": 3}
    }))
    .unwrap();
    api.create(&PostParams::default(), &reservation)
        .await
        .unwrap();
    for patch in [
        json!({"spec": {"fleetName": "other"}}),
        json!({"spec": {"fleetUID": "another"}}),
        json!({"spec": {"initialReplicas": 4}}),
    ] {
        let message = api_error_message(
            api.patch(&name, &PatchParams::default(), &Patch::Merge(patch.clone()))
                .await,
        )
        .unwrap();
        assert!(
            message.contains("storage reservations cannot be transferred or changed"),
            "{patch}: {message}"
        );
    }
    // Invalid reservations are rejected at creation too.
    let mut bad = reservation.clone();
    bad.metadata.name = Some(format!("{name}-x"));
    bad.spec.spec_hash = "not-a-hash".into();
    let message = api_error_message(api.create(&PostParams::default(), &bad).await).unwrap();
    assert!(
        message.contains("spec.specHash in body should match"),
        "{message}"
    );
    // Metadata stays editable (labels, annotations), the spec does not.
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"team": "storage"}}})),
    )
    .await
    .unwrap();
    api.delete(&name, &Default::default()).await.unwrap();
}
