//! Strict operations on the real cluster with simulator members and the real store
//! (docs/design.md "Strict operations"), with their crash drills: a Retire contraction
//! removes a member only after a recorded proof and deletes its claim once with UID + RV
//! preconditions; every failure mode removes nothing, blocks with its cause, and `journal
//! retry` completes it; a coordinated restart proves every member, stops and resumes the fleet
//! with the token; killed at any failpoint, each effect is written exactly once.

use std::collections::BTreeMap;
use std::time::Duration;

use celld_harness::operator::{verify_journal, OperatorProcess};
use celld_operator::api::CelldFleet;
use celld_sim::ledger::Ledger;
use celld_testbed::audit::{AuditLog, AuditQuery};
use celld_testbed::sampler::Expect;
use celld_testbed::{TestBed, RUNTIME_IMAGE};
use journal::{EntryBody, OperationId, Step};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

mod sim_common;
use sim_common::*;

const BIN: &str = env!("CARGO_BIN_EXE_celld-operator");

/// A PersistentFleet of simulator members retiring disks on contraction.
fn retire_fleet(name: &str, replicas: i32, bucket: &str) -> CelldFleet {
    let mut f = sim_fleet(
        name,
        replicas,
        bucket,
        json!({"zones": ["us-east-1a"], "azCount": 1, "mode": "Relaxed"}),
    );
    f.spec.storage.on_scale_in = Some(celld_operator::api::OnScaleIn::Retire);
    f
}

/// A Bucket fleet (Deployment) of simulator members.
fn bucket_fleet(name: &str, replicas: i32, bucket: &str) -> CelldFleet {
    serde_json::from_value(json!({
        "apiVersion": "celld.eric.dev/v1alpha1", "kind": "CelldFleet",
        "metadata": {"name": name},
        "spec": {"profile": "Bucket", "runtimeImage": RUNTIME_IMAGE, "replicas": replicas,
                 "serviceAccountName": "celld",
                 "storage": {"bucket": bucket, "region": "us-east-1"},
                 "placement": {"zones": ["us-east-1a"], "azCount": 1, "mode": "Relaxed"},
                 "lifecycle": {"shutdownSeconds": 10, "terminationGraceSeconds": 15},
                 "env": [{"name": "CELLD_READY_FLEET_GATE_MS", "value": "2000"}]}
    }))
    .unwrap()
}

fn journal_of(f: &CelldFleet) -> journal::Journal {
    celld_operator::journal_store::load(f).expect("the journal loads")
}

/// The newest operation of the fleet's journal.
async fn newest_op(api: &Api<CelldFleet>, name: &str) -> Option<journal::Operation> {
    let f = api.get(name).await.ok()?;
    journal_of(&f).fold().operations().last().cloned()
}

async fn running_pods(client: &Client, ns: &str) -> Vec<Pod> {
    let mut pods: Vec<Pod> = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    pods.sort_by_key(|p| p.name_any());
    pods
}

async fn urls_of_running(bed: &TestBed, client: &Client, ns: &str) -> Vec<String> {
    let names: Vec<String> = running_pods(client, ns)
        .await
        .iter()
        .map(|p| p.name_any())
        .collect();
    bed.member_urls(client, ns, &names)
        .await
        .expect("member URLs")
}

fn sts_replicas(bed: &TestBed, ns: &str, name: &str) -> i32 {
    bed.cluster
        .kubectl(&[
            "-n",
            ns,
            "get",
            "statefulset",
            name,
            "-o",
            "jsonpath={.spec.replicas}",
        ])
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Accepted claim deletes since `audit` was marked: (name, precondition UID, precondition RV).
fn claim_deletes(audit: &AuditLog, ns: &str) -> Vec<(String, String, String)> {
    audited_deletes(audit, ns, "persistentvolumeclaims", false)
}

/// Accepted workload writes carrying `marker` since `audit` was marked.
fn marker_writes(audit: &AuditLog, ns: &str, resource: &str, marker: &str) -> usize {
    let q = AuditQuery::writes()
        .resource(resource)
        .subresource(None)
        .namespace(ns)
        .successful();
    audit
        .query(&q)
        .unwrap()
        .iter()
        .filter(|e| {
            e.request_object
                .as_ref()
                .is_some_and(|b| b["metadata"]["annotations"]["celld.eric.dev/effect"] == marker)
        })
        .count()
}

/// Accepted writes of the operator (its User-Agent) to `resource` since `audit` was marked.
fn workload_writes(audit: &AuditLog, ns: &str, resource: &str) -> usize {
    let q = AuditQuery::writes()
        .resource(resource)
        .namespace(ns)
        .successful();
    audit
        .query(&q)
        .unwrap()
        .iter()
        .filter(|e| e.user_agent.starts_with("celld-operator/"))
        .count()
}

fn retry(bed: &TestBed, ns: &str, fleet: &str, op: OperationId) {
    let out = std::process::Command::new(BIN)
        .env("KUBECONFIG", bed.kubeconfig())
        .args([
            "journal",
            "retry",
            &format!("{ns}/{fleet}"),
            &op.to_string(),
        ])
        .output()
        .expect("journal retry runs");
    assert!(
        out.status.success(),
        "journal retry: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Scenario 11 (+ the describe view): Retire 3→2 removes beta-2 only after a proof for the
/// recorded id and generation, deletes its claim exactly once with UID + RV preconditions,
/// regrowth 2→3 gets a new claim UID; the ledger reads every acknowledged ID after each phase
/// and the one-member-down sampler never fires.
#[tokio::test]
async fn retire_contraction_removes_a_member_only_after_its_proof_and_regrowth_gets_a_new_claim() {
    let bed = TestBed::shared().await;
    let _store = bed.store_shared().await;
    let client = bed.client().await.unwrap();
    let ns = fleet_namespace(bed, &client, "strict-retire").await;
    let bucket = bed.unique_bucket("strictr").unwrap();
    let op = OperatorProcess::start(&operator_options(bed, "strict-retire", &ns.name, None));
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    api.create(&PostParams::default(), &retire_fleet("beta", 3, &bucket))
        .await
        .unwrap();
    wait_settled(&api, "beta", 3, &op.log).await;
    let sampler = bed.sampler(&client, &ns.name, Expect::StatefulSet("beta".into()), 1);
    let mut ledger = Ledger::new(&format!("strictr-{}", ns.name));
    ledger
        .phase(&urls_of_running(bed, &client, &ns.name).await)
        .await
        .expect("ledger after provision");
    let before = claim_uids(&client, &ns.name).await;
    let audit = bed.audit();
    bed.cluster
        .kubectl(&["-n", &ns.name, "scale", "celldfleet/beta", "--replicas=2"])
        .unwrap();
    wait_settled(&api, "beta", 2, &op.log).await;
    poll_until("the Retire to complete", 120, &op.log, || async {
        newest_op(&api, "beta")
            .await
            .is_some_and(|o| o.kind() == journal::OperationKind::Scale && !o.is_open())
    })
    .await;
    ledger
        .phase(&urls_of_running(bed, &client, &ns.name).await)
        .await
        .expect("ledger after Retire 3->2");

    // The journal: Intent with the victim's identity, the proof for this id and generation
    // recorded before the replica write, the claim retired after it.
    let o = newest_op(&api, "beta").await.unwrap();
    let t = &o.intent().targets[0];
    assert_eq!(t.pod, "beta-2");
    assert_eq!(t.claim.as_deref(), Some("data-beta-2"));
    assert_eq!(t.claim_uid.as_ref(), before.get("data-beta-2"));
    let generation = t
        .runtime_generation
        .clone()
        .expect("generation recorded at Intent");
    let seq_of = |want: &dyn Fn(&EntryBody) -> bool| {
        o.entries()
            .iter()
            .find(|e| want(e.body()))
            .map(|e| e.seq())
            .unwrap_or_else(|| panic!("missing entry in {:?}", o.entries()))
    };
    let proof = seq_of(&|b| {
        matches!(b, EntryBody::ProofCaptured(p) if p.member == "beta-2"
            && p.proof.expected_generation == generation
            && p.proof.operation_id == o.id().to_string()
            && p.proof.phase == "data_safe" && p.proof.control_only)
    });
    let replicas = seq_of(&|b| matches!(b, EntryBody::Issued(i) if i.step == Step::Replicas));
    let retired = seq_of(&|b| matches!(b, EntryBody::ClaimRetired(c) if c.claim == "data-beta-2"));
    assert!(proof < replicas && replicas < retired, "{:?}", o.entries());
    assert_eq!(o.closure().map(|c| c.outcome.as_str()), Some("Succeeded"));

    // The audit log: one replica write with the marker, one claim delete with UID + RV.
    let marker = format!("{}/replicas", o.id());
    assert_eq!(marker_writes(&audit, &ns.name, "statefulsets", &marker), 1);
    let deletes = claim_deletes(&audit, &ns.name);
    assert_eq!(
        deletes,
        vec![(
            "data-beta-2".to_string(),
            t.claim_uid.clone().unwrap(),
            t.claim_resource_version.clone().unwrap()
        )],
        "exactly one claim delete, carrying the recorded UID and resourceVersion"
    );
    let after = claim_uids(&client, &ns.name).await;
    assert!(!after.contains_key("data-beta-2"), "{after:?}");

    // `kubectl describe` shows the proof and the retired claim.
    let described = bed
        .cluster
        .kubectl(&["-n", &ns.name, "describe", "celldfleet", "beta"])
        .unwrap();
    assert!(
        described.contains("OperationProofCaptured") && described.contains("OperationClaimRetired"),
        "{described}"
    );

    // Regrowth: a fresh claim for beta-2.
    bed.cluster
        .kubectl(&["-n", &ns.name, "scale", "celldfleet/beta", "--replicas=3"])
        .unwrap();
    wait_settled(&api, "beta", 3, &op.log).await;
    let regrown = claim_uids(&client, &ns.name).await;
    assert_ne!(regrown.get("data-beta-2"), before.get("data-beta-2"));
    assert!(regrown.contains_key("data-beta-2"));
    assert_eq!(regrown.get("data-beta-0"), before.get("data-beta-0"));
    ledger
        .phase(&urls_of_running(bed, &client, &ns.name).await)
        .await
        .expect("ledger after regrowth 2->3");
    sampler.finish().await.assert_ok();
    ns.delete_and_wait().await.unwrap();
    drop(op);
}

/// How a failure is caused: faults set before the contraction, and faults set once the
/// removal request was accepted (the removal then takes 4 s).
struct FailureMode {
    name: &'static str,
    before: serde_json::Value,
    during: Option<serde_json::Value>,
    cause: &'static str,
    heal: serde_json::Value,
}

/// Scenario 12 and the Retire part of scenario 25: each failure mode removes nothing (claim
/// UIDs unchanged, no claim delete, no replica write), reports `OperationBlocked` with its
/// cause, and `journal retry` completes it once the cause is gone. One member per mode.
#[tokio::test]
async fn retire_failure_modes_remove_nothing_and_journal_retry_completes_them() {
    let modes = vec![
        FailureMode {
            name: "a removal that ends failed",
            before: json!({"removal": "fail"}),
            during: None,
            cause: "failed",
            heal: json!({"removal": "ok"}),
        },
        FailureMode {
            name: "a process restart mid-removal (new generation)",
            before: json!({"removal_delay_ms": 4000}),
            during: Some(json!({"crash": "exit:1@0"})),
            cause: "generation",
            heal: json!({}),
        },
        FailureMode {
            name: "a proof with another operation id",
            before: json!({"removal_delay_ms": 4000}),
            during: Some(json!({"state": "other_operation_id"})),
            cause: "not",
            heal: json!({"state": "ok"}),
        },
        FailureMode {
            name: "a proof with another generation",
            before: json!({"removal_delay_ms": 4000}),
            during: Some(json!({"state": "other_generation"})),
            cause: "process restarted",
            heal: json!({"state": "ok"}),
        },
        FailureMode {
            name: "a data_safe removal that is not control-only",
            before: json!({"removal_delay_ms": 4000}),
            during: Some(json!({"state": "not_control_only"})),
            cause: "control-only",
            heal: json!({"state": "ok"}),
        },
        FailureMode {
            name: "a removal that names a blocker",
            before: json!({"removal_delay_ms": 4000}),
            during: Some(json!({"state": "blocker"})),
            cause: "blocker",
            heal: json!({"state": "ok"}),
        },
        FailureMode {
            // The removal takes 25 s: the member fences itself (exit 3, lease TTL 10 s) first.
            name: "a member partitioned from the store mid-removal (scenario 25)",
            before: json!({"removal_delay_ms": 25000}),
            during: Some(json!({"store": "partition"})),
            cause: "generation",
            heal: json!({"store": "ok"}),
        },
    ];
    let bed = TestBed::shared().await;
    let _store = bed.store_shared().await;
    let client = bed.client().await.unwrap();
    let ns = fleet_namespace(bed, &client, "strict-fail").await;
    let bucket = bed.unique_bucket("strictf").unwrap();
    let op = OperatorProcess::start(&operator_options(bed, "strict-fail", &ns.name, None));
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let mut replicas = modes.len() as i32 + 1;
    api.create(
        &PostParams::default(),
        &retire_fleet("phi", replicas, &bucket),
    )
    .await
    .unwrap();
    wait_settled(&api, "phi", replicas, &op.log).await;
    let mut ledger = Ledger::new(&format!("strictf-{}", ns.name));
    ledger
        .phase(&urls_of_running(bed, &client, &ns.name).await)
        .await
        .expect("ledger after provision");
    for mode in &modes {
        let victim = format!("phi-{}", replicas - 1);
        let claim = format!("data-{victim}");
        let what = mode.name;
        let member = bed.member(&client, &ns.name, &victim).await.unwrap();
        member.set_faults(&mode.before).await.unwrap();
        let claims_before = claim_uids(&client, &ns.name).await;
        let audit = bed.audit();
        bed.cluster
            .kubectl(&[
                "-n",
                &ns.name,
                "scale",
                "celldfleet/phi",
                &format!("--replicas={}", replicas - 1),
            ])
            .unwrap();
        if let Some(during) = &mode.during {
            poll_until(
                &format!("{what}: the removal request"),
                120,
                &op.log,
                || async {
                    newest_op(&api, "phi")
                        .await
                        .is_some_and(|o| o.is_open() && o.has_effect(&Step::Proof(victim.clone())))
                },
            )
            .await;
            member.set_faults(during).await.unwrap();
        }
        poll_until(
            &format!("{what}: OperationBlocked"),
            180,
            &op.log,
            || async {
                api.get("phi")
                    .await
                    .ok()
                    .and_then(|f| f.status)
                    .is_some_and(|s| {
                        s.conditions.iter().any(|c| {
                            c.type_ == "Blocked"
                                && c.status == "True"
                                && c.reason == "OperationBlocked"
                                && c.message.contains(mode.cause)
                        })
                    })
            },
        )
        .await;
        let o = newest_op(&api, "phi").await.unwrap();
        assert!(o.blocked().is_some(), "{what}: {:?}", o.entries());
        if mode.name.contains("partitioned") {
            // It fenced itself: exit code 3 in the container's last state.
            let pod = Api::<Pod>::namespaced(client.clone(), &ns.name)
                .get(&victim)
                .await
                .unwrap();
            let exit = pod
                .status
                .and_then(|s| s.container_statuses)
                .and_then(|c| c.into_iter().find(|c| c.name == "celld"))
                .and_then(|c| c.last_state?.terminated.map(|t| t.exit_code));
            assert_eq!(exit, Some(3), "{what}: the member self-fenced");
        }
        // Nothing removed: claims, replicas, no claim delete, no replica write.
        assert_eq!(claim_uids(&client, &ns.name).await, claims_before, "{what}");
        assert_eq!(sts_replicas(bed, &ns.name, "phi"), replicas, "{what}");
        assert!(claim_deletes(&audit, &ns.name).is_empty(), "{what}");
        assert_eq!(
            marker_writes(
                &audit,
                &ns.name,
                "statefulsets",
                &format!("{}/replicas", o.id())
            ),
            0,
            "{what}"
        );
        // The cause goes away (a crashed process came back with its faults reset).
        if let Ok(m) = bed.member(&client, &ns.name, &victim).await {
            let _ = m.set_faults(&mode.heal).await;
        }
        retry(bed, &ns.name, "phi", o.id());
        poll_until(
            &format!("{what}: completion after retry"),
            240,
            &op.log,
            || async {
                api.get("phi")
                    .await
                    .ok()
                    .and_then(|f| f.status)
                    .is_some_and(|s| {
                        s.current_operation.is_none()
                            && s.recent_operations
                                .iter()
                                .any(|r| r.id == o.id().to_string() && r.outcome == "Succeeded")
                    })
            },
        )
        .await;
        replicas -= 1;
        wait_settled(&api, "phi", replicas, &op.log).await;
        let deletes = claim_deletes(&audit, &ns.name);
        assert_eq!(deletes.len(), 1, "{what}: {deletes:?}");
        assert_eq!(deletes[0].0, claim, "{what}");
        assert_eq!(Some(&deletes[0].1), claims_before.get(&claim), "{what}");
        ledger
            .phase(&urls_of_running(bed, &client, &ns.name).await)
            .await
            .unwrap_or_else(|e| panic!("ledger after {what}: {e}"));
    }
    ns.delete_and_wait().await.unwrap();
    drop(op);
}

/// Nothing open and `n` members Ready (any workload kind).
async fn settled_ready(api: &Api<CelldFleet>, n: i32, log: &std::path::Path) {
    poll_until(&format!("kappa to settle at {n}"), 240, log, || async {
        api.get("kappa")
            .await
            .ok()
            .and_then(|f| f.status)
            .is_some_and(|s| s.current_operation.is_none() && s.ready_replicas == Some(n))
    })
    .await
}

/// The profile of a coordinated restart test.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Profile {
    Retain,
    Retire,
    Bucket,
    /// A Bucket fleet on an ordered StatefulSet (`bucketWorkload: Ordered`).
    OrderedBucket,
}

/// Scenario 18: a coordinated restart of 3 members proves every member, stops the fleet and
/// resumes it with the token (and, changed in the same edit, the image); claims are new with
/// Retire and the same with Retain; the ledger reads every acknowledged ID after.
async fn coordinated_restart(profile: Profile) {
    let tag = format!("strict-coord-{}", format!("{profile:?}").to_lowercase());
    let bed = TestBed::shared().await;
    let _store = bed.store_shared().await;
    let client = bed.client().await.unwrap();
    let ns = fleet_namespace(bed, &client, &tag).await;
    let bucket = bed.unique_bucket("strictc").unwrap();
    let op = OperatorProcess::start(&operator_options(bed, &tag, &ns.name, None));
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let fleet = match profile {
        Profile::Retire => retire_fleet("kappa", 3, &bucket),
        Profile::Retain => sim_fleet(
            "kappa",
            3,
            &bucket,
            json!({"zones": ["us-east-1a"], "azCount": 1, "mode": "Relaxed"}),
        ),
        Profile::Bucket => bucket_fleet("kappa", 3, &bucket),
        Profile::OrderedBucket => {
            let mut f = bucket_fleet("kappa", 3, &bucket);
            f.spec.bucket_workload = serde_json::from_value(json!("Ordered")).unwrap();
            f
        }
    };
    api.create(&PostParams::default(), &fleet).await.unwrap();
    settled_ready(&api, 3, &op.log).await;
    let mut ledger = Ledger::new(&format!("strictc-{}", ns.name));
    ledger
        .phase(&urls_of_running(bed, &client, &ns.name).await)
        .await
        .expect("ledger before the coordinated restart");
    let claims_before = claim_uids(&client, &ns.name).await;
    let pods_before: BTreeMap<String, String> = running_pods(&client, &ns.name)
        .await
        .iter()
        .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
        .collect();
    let audit = bed.audit();
    let patch = json!({"spec": {"maintenance": {"restartToken": "full-stop-1", "allowCoordinatedDowntime": true}}});
    api.patch("kappa", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    poll_until("the coordinated restart", 300, &op.log, || async {
        api.get("kappa")
            .await
            .ok()
            .and_then(|f| f.status)
            .is_some_and(|s| {
                s.last_restart_token.as_deref() == Some("full-stop-1")
                    && s.current_operation.is_none()
            })
    })
    .await;
    settled_ready(&api, 3, &op.log).await;
    let o = newest_op(&api, "kappa").await.unwrap();
    assert_eq!(o.kind(), journal::OperationKind::Restart);
    assert_eq!(o.intent().targets.len(), 3);
    let proofs: Vec<&str> = o.proofs().map(|p| p.member.as_str()).collect();
    assert_eq!(proofs.len(), 3, "every member proved: {proofs:?}");
    let resource = if profile == Profile::Bucket {
        "deployments"
    } else {
        "statefulsets"
    };
    for step in ["stop", "resume"] {
        assert_eq!(
            marker_writes(&audit, &ns.name, resource, &format!("{}/{step}", o.id())),
            1,
            "{step} written once"
        );
    }
    assert_eq!(
        workload_writes(&audit, &ns.name, resource),
        2,
        "the operator wrote the workload twice: stop and resume"
    );
    let pods_after: BTreeMap<String, String> = running_pods(&client, &ns.name)
        .await
        .iter()
        .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
        .collect();
    assert!(
        pods_after
            .values()
            .all(|u| !pods_before.values().any(|b| b == u)),
        "every member restarted: {pods_before:?} → {pods_after:?}"
    );
    let claims_after = claim_uids(&client, &ns.name).await;
    match profile {
        Profile::Retain => assert_eq!(claims_after, claims_before, "Retain keeps every disk"),
        Profile::Retire => {
            assert_eq!(claims_after.len(), 3);
            for (name, uid) in &claims_before {
                assert_ne!(claims_after.get(name), Some(uid), "{name} is a new claim");
            }
            assert_eq!(
                claim_deletes(&audit, &ns.name).len(),
                3,
                "each claim deleted once"
            );
        }
        Profile::Bucket | Profile::OrderedBucket => assert!(claims_after.is_empty()),
    }
    ledger
        .phase(&urls_of_running(bed, &client, &ns.name).await)
        .await
        .expect("ledger after the coordinated restart");
    ns.delete_and_wait().await.unwrap();
    drop(op);
}

#[tokio::test]
async fn coordinated_restart_of_a_persistent_fleet_keeps_every_disk_under_retain() {
    coordinated_restart(Profile::Retain).await;
}

#[tokio::test]
async fn coordinated_restart_of_a_persistent_fleet_retires_every_disk_under_retire() {
    coordinated_restart(Profile::Retire).await;
}

#[tokio::test]
async fn coordinated_restart_of_a_bucket_fleet_stops_and_resumes_the_deployment() {
    coordinated_restart(Profile::Bucket).await;
}

/// Regression: members of an Ordered Bucket fleet (a StatefulSet) answer `/state` with their
/// Pod UID, as every Bucket member does; the operator expected the Pod name there.
#[tokio::test]
async fn coordinated_restart_of_an_ordered_bucket_fleet_stops_and_resumes_the_statefulset() {
    coordinated_restart(Profile::OrderedBucket).await;
}

/// Crash drills: a Retire contraction killed once at each of its failpoints (the N-th
/// `before-effect`/`after-effect` names the step: 1 = `proof/<victim>`, 2 = `replicas`). After
/// each kill a fresh operator completes it; the audit log shows one replica write for its
/// marker and one delete of the victim's claim; the journal verifies against the mirror.
#[tokio::test]
async fn retire_contraction_drills_at_every_failpoint_write_each_effect_once() {
    let points = [
        "before-intent",
        "after-intent",
        "before-effect:1",
        "after-effect:1",
        "before-effect:2",
        "after-effect:2",
        "before-claim-delete",
        "after-claim-delete",
        "before-complete",
    ];
    let bed = TestBed::shared().await;
    let _store = bed.store_shared().await;
    let client = bed.client().await.unwrap();
    let ns = fleet_namespace(bed, &client, "strict-drill").await;
    let bucket = bed.unique_bucket("strictd").unwrap();
    let options = |p: Option<&str>| operator_options(bed, "strict-drill", &ns.name, p);
    let mut op = OperatorProcess::start(&options(None));
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let mut replicas = points.len() as i32 + 1;
    api.create(
        &PostParams::default(),
        &retire_fleet("rho", replicas, &bucket),
    )
    .await
    .unwrap();
    wait_settled(&api, "rho", replicas, &op.log).await;
    let mut ledger = Ledger::new(&format!("strictd-{}", ns.name));
    for point in points {
        let what = format!("Retire {replicas}->{} killed at {point}", replicas - 1);
        let claims_before = claim_uids(&client, &ns.name).await;
        let victim_claim = format!("data-rho-{}", replicas - 1);
        let audit = bed.audit();
        drop(op);
        let mut killed = OperatorProcess::start(&options(Some(point)));
        bed.cluster
            .kubectl(&[
                "-n",
                &ns.name,
                "scale",
                "celldfleet/rho",
                &format!("--replicas={}", replicas - 1),
            ])
            .unwrap();
        assert_eq!(killed.exited(Duration::from_secs(180)).await, 3, "{what}");
        drop(killed);
        op = OperatorProcess::start(&options(None));
        replicas -= 1;
        wait_settled(&api, "rho", replicas, &op.log).await;
        poll_until(&format!("{what}: completed"), 120, &op.log, || async {
            newest_op(&api, "rho").await.is_some_and(|o| !o.is_open())
        })
        .await;
        let o = newest_op(&api, "rho").await.unwrap();
        assert_eq!(
            o.closure().map(|c| c.outcome.as_str()),
            Some("Succeeded"),
            "{what}: {:?}",
            o.entries()
        );
        assert_eq!(
            marker_writes(
                &audit,
                &ns.name,
                "statefulsets",
                &format!("{}/replicas", o.id())
            ),
            1,
            "{what}: one replica write"
        );
        let deletes = claim_deletes(&audit, &ns.name);
        assert_eq!(deletes.len(), 1, "{what}: {deletes:?}");
        assert_eq!(deletes[0].0, victim_claim, "{what}");
        assert_eq!(
            Some(&deletes[0].1),
            claims_before.get(&victim_claim),
            "{what}"
        );
        let proofs_asked = o
            .entries()
            .iter()
            .filter(
                |e| matches!(e.body(), EntryBody::Issued(i) if matches!(i.step, Step::Proof(_))),
            )
            .count();
        assert_eq!(proofs_asked, 1, "{what}: the proof was asked once");
        ledger
            .phase(&urls_of_running(bed, &client, &ns.name).await)
            .await
            .unwrap_or_else(|e| panic!("ledger after {what}: {e}"));
    }
    let op = after_drills(
        bed,
        &api,
        &ns.name,
        "rho",
        "statefulsets",
        "strict-drill",
        op,
    )
    .await;
    ns.delete_and_wait().await.unwrap();
    drop(op);
}

/// Two further operator restarts after the drills write nothing to the workload, and the
/// journal verifies against annotation and mirror.
async fn after_drills(
    bed: &TestBed,
    api: &Api<CelldFleet>,
    ns: &str,
    fleet: &str,
    resource: &str,
    tag: &str,
    op: OperatorProcess,
) -> OperatorProcess {
    let opts = operator_options(bed, tag, ns, None);
    drop(op);
    let audit = bed.audit();
    for _ in 0..2 {
        let op = OperatorProcess::start(&opts);
        tokio::time::sleep(Duration::from_secs(8)).await;
        drop(op);
    }
    assert_eq!(
        workload_writes(&audit, ns, resource),
        0,
        "restarts after completion write nothing"
    );
    let f = api.get(fleet).await.unwrap();
    assert!(journal_of(&f).fold().current().is_none());
    verify_journal(
        BIN.as_ref(),
        bed.kubeconfig(),
        ns,
        fleet,
        Some(&opts.work_dir.join(&opts.identity).join("journal")),
    );
    // Deletion needs a running operator.
    OperatorProcess::start(&opts)
}

/// Crash drills of a coordinated restart (3 members): killed once at each failpoint (the N-th
/// effect: 1–3 the proofs, 4 `stop`, 5 `resume`), `stop` and `resume` are each written once,
/// each retired claim is deleted once, and the token is applied once.
async fn coordinated_drills(retire: bool) {
    let mut points = vec![
        "before-intent",
        "after-intent",
        "before-effect:1",
        "after-effect:1",
        "before-effect:4",
        "after-effect:4",
        "before-effect:5",
        "after-effect:5",
        "before-complete",
    ];
    if retire {
        points.extend(["before-claim-delete:2", "after-claim-delete:2"]);
    }
    let tag = if retire {
        "strict-cdrill-retire"
    } else {
        "strict-cdrill-retain"
    };
    let bed = TestBed::shared().await;
    let _store = bed.store_shared().await;
    let client = bed.client().await.unwrap();
    let ns = fleet_namespace(bed, &client, tag).await;
    let bucket = bed.unique_bucket("strictcd").unwrap();
    let options = |p: Option<&str>| operator_options(bed, tag, &ns.name, p);
    let mut op = OperatorProcess::start(&options(None));
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let fleet = if retire {
        retire_fleet("tau", 3, &bucket)
    } else {
        sim_fleet(
            "tau",
            3,
            &bucket,
            json!({"zones": ["us-east-1a"], "azCount": 1, "mode": "Relaxed"}),
        )
    };
    api.create(&PostParams::default(), &fleet).await.unwrap();
    wait_settled(&api, "tau", 3, &op.log).await;
    api.patch(
        "tau",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"maintenance": {"allowCoordinatedDowntime": true}}})),
    )
    .await
    .unwrap();
    let mut ledger = Ledger::new(&format!("strictcd-{}", ns.name));
    for (i, point) in points.into_iter().enumerate() {
        let token = format!("drill-{i}");
        let what = format!("coordinated restart {token} killed at {point}");
        let claims_before = claim_uids(&client, &ns.name).await;
        let audit = bed.audit();
        drop(op);
        let mut killed = OperatorProcess::start(&options(Some(point)));
        api.patch(
            "tau",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"maintenance": {"restartToken": token}}})),
        )
        .await
        .unwrap();
        assert_eq!(killed.exited(Duration::from_secs(240)).await, 3, "{what}");
        drop(killed);
        op = OperatorProcess::start(&options(None));
        wait_token_applied(&api, "tau", &token, 300, &op.log).await;
        wait_settled(&api, "tau", 3, &op.log).await;
        let o = newest_op(&api, "tau").await.unwrap();
        assert_eq!(o.intent().token.as_deref(), Some(token.as_str()), "{what}");
        for step in ["stop", "resume"] {
            assert_eq!(
                marker_writes(
                    &audit,
                    &ns.name,
                    "statefulsets",
                    &format!("{}/{step}", o.id())
                ),
                1,
                "{what}: {step} written once"
            );
        }
        let deletes = claim_deletes(&audit, &ns.name);
        let claims_after = claim_uids(&client, &ns.name).await;
        if retire {
            assert_eq!(
                deletes.len(),
                3,
                "{what}: one delete per claim: {deletes:?}"
            );
            let names: std::collections::BTreeSet<_> = deletes.iter().map(|d| &d.0).collect();
            assert_eq!(names.len(), 3, "{what}: {deletes:?}");
            for (name, uid) in &claims_before {
                assert_ne!(claims_after.get(name), Some(uid), "{what}: {name} is new");
            }
        } else {
            assert!(deletes.is_empty(), "{what}: {deletes:?}");
            assert_eq!(claims_after, claims_before, "{what}");
        }
        let asked = o
            .entries()
            .iter()
            .filter(
                |e| matches!(e.body(), EntryBody::Issued(i) if matches!(i.step, Step::Proof(_))),
            )
            .count();
        assert_eq!(asked, 3, "{what}: each member asked once");
        ledger
            .phase(&urls_of_running(bed, &client, &ns.name).await)
            .await
            .unwrap_or_else(|e| panic!("ledger after {what}: {e}"));
    }
    let op = after_drills(bed, &api, &ns.name, "tau", "statefulsets", tag, op).await;
    ns.delete_and_wait().await.unwrap();
    drop(op);
}

#[tokio::test]
async fn coordinated_restart_drills_at_every_failpoint_under_retain() {
    coordinated_drills(false).await;
}

#[tokio::test]
async fn coordinated_restart_drills_at_every_failpoint_under_retire() {
    coordinated_drills(true).await;
}

// ---------------------------------------------------------------------------------------
// The API fault sweep of the strict operations (the Bucket kinds' sweep is in
// tests/operator_faults.rs): a PersistentFleet `phi` of 3 simulator members that retires
// disks, swept through a Retire contraction 3 → 2, the growth back, and a coordinated restart
// (which retires every disk). One operator process per run with one fault injected into the
// i-th request matching a filter: the StatefulSet writes (`replicas`, `stop`, `resume`) or the
// claim deletes. After each run: the operation `Succeeded`, each effect marker was accepted
// exactly once, each claim delete carried the claim's UID from before the run and no claim was
// deleted twice, each member was asked for its proof once, the journal verifies against
// annotation and mirror, and the ledger reads every acknowledged write.

/// What one strict sweep run changes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum StrictChange {
    /// `kubectl scale` 3 → 2: a Retire contraction.
    Retire,
    /// `kubectl scale` 2 → 3: growth on a new claim.
    Regrow,
    /// A new restart token with `allowCoordinatedDowntime`: a coordinated restart.
    Coordinated,
}

impl StrictChange {
    fn label(self) -> &'static str {
        match self {
            StrictChange::Retire => "Retire 3->2",
            StrictChange::Regrow => "growth 2->3",
            StrictChange::Coordinated => "coordinated Restart",
        }
    }

    /// The other half of a pair that returns the fleet to where the first starts.
    fn partner(self) -> Option<StrictChange> {
        match self {
            StrictChange::Retire => Some(StrictChange::Regrow),
            StrictChange::Regrow => Some(StrictChange::Retire),
            StrictChange::Coordinated => None,
        }
    }

    fn members(self) -> i32 {
        match self {
            StrictChange::Retire => 2,
            _ => 3,
        }
    }

    /// The workload steps whose markers are each accepted once.
    fn steps(self) -> &'static [&'static str] {
        match self {
            StrictChange::Retire | StrictChange::Regrow => &["replicas"],
            StrictChange::Coordinated => &["stop", "resume"],
        }
    }

    /// Claims deleted (each once, with the UID it had before the run).
    fn claim_deletes(self) -> usize {
        match self {
            StrictChange::Retire => 1,
            StrictChange::Regrow => 0,
            StrictChange::Coordinated => 3,
        }
    }

    /// Proofs asked, each once.
    fn proofs(self) -> usize {
        match self {
            StrictChange::Retire => 1,
            StrictChange::Regrow => 0,
            StrictChange::Coordinated => 3,
        }
    }
}

/// The filters of the strict sweep (`VERB:RESOURCE`, the namespace is added).
const STRICT_FILTERS: [&str; 2] = ["write:statefulsets", "delete:persistentvolumeclaims"];

struct StrictBed<'a> {
    bed: &'a TestBed,
    client: Client,
    api: Api<CelldFleet>,
    ns: String,
    ledger: Ledger,
    runs: usize,
}

/// One strict sweep run: whether it passed, what went wrong otherwise, the matching requests
/// counted, the faulted request and the run's duration.
struct StrictOutcome {
    problems: Vec<String>,
    counted: usize,
    faulted: Option<String>,
    elapsed: Duration,
}

async fn strict_run(
    sb: &mut StrictBed<'_>,
    change: StrictChange,
    fault: &str,
    kill_after: Option<Duration>,
) -> StrictOutcome {
    sb.runs += 1;
    let (bed, api, ns) = (sb.bed, sb.api.clone(), sb.ns.clone());
    let mut opts = operator_options(bed, "strict-sweep", &ns, None);
    let log_path = opts.work_dir.join(&opts.identity).join("operator.log");
    let offset = celld_harness::drill::log_offset(&log_path);
    opts.extra_args.push(format!("--test-api-fault={fault}"));
    let before = newest_op(&api, "phi").await.map(|o| o.id());
    let claims_before = claim_uids(&sb.client, &ns).await;
    let audit = bed.audit();
    let mut op = OperatorProcess::start(&opts);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = std::time::Instant::now();
    match change {
        StrictChange::Retire | StrictChange::Regrow => {
            let to = change.members();
            bed.cluster
                .kubectl(&[
                    "-n",
                    &ns,
                    "scale",
                    "celldfleet/phi",
                    &format!("--replicas={to}"),
                ])
                .unwrap();
        }
        StrictChange::Coordinated => {
            let token = format!("sweep-{}", sb.runs);
            celld_harness::fleet::set_restart_token(&api, "phi", &token).await;
        }
    }
    if let Some(delay) = kill_after {
        tokio::time::sleep(delay).await;
        op.signal("KILL");
        let _ = op.exited(Duration::from_secs(10)).await;
        drop(op);
        let clean = operator_options(bed, "strict-sweep", &ns, None);
        op = OperatorProcess::start(&clean);
    }
    let mut problems = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(150);
    let done = loop {
        let status = api.get("phi").await.ok().and_then(|f| f.status);
        let newest = newest_op(&api, "phi").await;
        let settled = status.is_some_and(|s| {
            s.current_operation.is_none()
                && s.ready_replicas == Some(change.members())
                && s.applied_replicas == Some(change.members())
        });
        if let Some(o) = newest.filter(|o| Some(o.id()) != before && !o.is_open() && settled) {
            break Some(o);
        }
        if std::time::Instant::now() > deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let elapsed = started.elapsed();
    let _ = op.terminate(Duration::from_secs(30)).await;
    drop(op);
    match &done {
        None => problems.push("not settled within 150 s".to_string()),
        Some(o) => {
            let outcome = o.closure().map(|c| c.outcome.as_str().to_string());
            if outcome.as_deref() != Some("Succeeded") {
                problems.push(format!("closed {outcome:?}"));
            }
            for step in change.steps() {
                let marker = format!("{}/{step}", o.id());
                let n = marker_writes(&audit, &ns, "statefulsets", &marker);
                if n != 1 {
                    problems.push(format!("{marker} accepted {n} times"));
                }
            }
            let proofs = o
                .entries()
                .iter()
                .filter(|e| {
                    matches!(e.body(), EntryBody::Issued(i) if matches!(i.step, Step::Proof(_)))
                })
                .count();
            if proofs != change.proofs() {
                problems.push(format!("{proofs} proofs asked"));
            }
        }
    }
    let deletes = claim_deletes(&audit, &ns);
    let names: std::collections::BTreeSet<_> = deletes.iter().map(|d| &d.0).collect();
    if deletes.len() != change.claim_deletes() || names.len() != deletes.len() {
        problems.push(format!("claim deletes {deletes:?}"));
    }
    for (name, uid, _) in &deletes {
        if claims_before.get(name) != Some(uid) {
            problems.push(format!("claim {name} deleted with UID {uid}, not its own"));
        }
    }
    let celld_harness::drill::FaultLog { faulted, counted } =
        celld_harness::drill::fault_log(&log_path, offset);
    if done.is_some() {
        verify_journal(
            BIN.as_ref(),
            bed.kubeconfig(),
            &ns,
            "phi",
            Some(&opts.work_dir.join(&opts.identity).join("journal")),
        );
        let urls = urls_of_running(bed, &sb.client, &ns).await;
        if let Err(e) = sb.ledger.phase(&urls).await {
            problems.push(format!("ledger: {e}"));
        }
    }
    StrictOutcome {
        problems,
        counted,
        faulted,
        elapsed,
    }
}

/// Runs the strict sweep with faults of `kinds` and `kills` random-instant kills per
/// operation; prints the table and fails on any run that did not pass.
async fn strict_sweep(tag: &str, kinds: &[&str], kills: usize) {
    let bed = TestBed::shared().await;
    let _store = bed.store_shared().await;
    let client = bed.client().await.unwrap();
    let ns = fleet_namespace(bed, &client, tag).await;
    let bucket = bed.unique_bucket("strictsw").unwrap();
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    {
        let op = OperatorProcess::start(&operator_options(bed, "strict-sweep", &ns.name, None));
        let mut f = retire_fleet("phi", 3, &bucket);
        f.spec
            .maintenance
            .get_or_insert_with(Default::default)
            .allow_coordinated_downtime = true;
        api.create(&PostParams::default(), &f).await.unwrap();
        wait_settled(&api, "phi", 3, &op.log).await;
    }
    let mut sb = StrictBed {
        bed,
        client: client.clone(),
        api: api.clone(),
        ns: ns.name.clone(),
        ledger: Ledger::new(&format!("strictsw-{}", ns.name)),
        runs: 0,
    };
    let changes = [
        StrictChange::Retire,
        StrictChange::Regrow,
        StrictChange::Coordinated,
    ];
    // Clean runs: the matching requests of each (operation, filter).
    let mut counts = Vec::new();
    for filter in STRICT_FILTERS {
        for change in changes {
            let filter = format!("{filter}:{}", ns.name);
            let out = strict_run(&mut sb, change, &format!("none@1:{filter}"), None).await;
            assert!(
                out.problems.is_empty(),
                "{} clean run ({filter}): {:?}",
                change.label(),
                out.problems
            );
            counts.push((change, filter, out.counted, out.elapsed));
        }
    }
    eprintln!(
        "strict sweep {tag}: matching requests per clean run: {}",
        counts
            .iter()
            .map(|(c, f, n, t)| format!("{} {f} = {n} ({t:?})", c.label()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut table: BTreeMap<(String, String), [usize; 4]> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut record = |label: &str, kind: &str, out: &StrictOutcome, what: String| {
        let row = table
            .entry((label.to_string(), kind.to_string()))
            .or_default();
        let stuck = out.problems.iter().any(|p| p.starts_with("not settled"));
        let duplicate = out
            .problems
            .iter()
            .any(|p| p.contains("accepted") || p.starts_with("claim"));
        row[0] += 1;
        row[1] += usize::from(out.problems.is_empty());
        row[2] += usize::from(duplicate);
        row[3] += usize::from(stuck);
        let verdict = if out.problems.is_empty() {
            "ok".to_string()
        } else {
            failures.push(format!("{what}: {:?}", out.problems));
            format!("FAILED {:?}", out.problems)
        };
        eprintln!(
            "strict sweep: {what}: {verdict} ({})",
            out.faulted.as_deref().unwrap_or("no request faulted")
        );
    };
    let max = counts.iter().map(|c| c.2).max().unwrap_or(0);
    for index in 1..=max {
        for kind in kinds {
            for (change, filter, count, _) in &counts {
                let partner_faulted = counts
                    .iter()
                    .any(|(p, f, n, _)| change.partner() == Some(*p) && f == filter && index <= *n);
                if index > *count && !partner_faulted {
                    continue;
                }
                if index > *count {
                    let out = strict_run(&mut sb, *change, &format!("none@1:{filter}"), None).await;
                    assert!(
                        out.problems.is_empty(),
                        "{}: a clean run: {:?}",
                        change.label(),
                        out.problems
                    );
                    continue;
                }
                let fault = format!("{kind}@{index}:{filter}");
                let out = strict_run(&mut sb, *change, &fault, None).await;
                let passed = out.problems.is_empty();
                record(
                    change.label(),
                    kind,
                    &out,
                    format!("{} {fault}", change.label()),
                );
                if !passed {
                    // Back to where the next run starts, without faults.
                    let back =
                        strict_run(&mut sb, *change, &format!("none@1:{filter}"), None).await;
                    assert!(
                        back.problems.is_empty(),
                        "{} did not recover without faults: {:?}",
                        change.label(),
                        back.problems
                    );
                }
            }
        }
    }
    let seed = celld_harness::drill::seed();
    let mut rng = seed | 1;
    eprintln!("strict sweep {tag}: random kills, CELLD_DRILL_SEED={seed}");
    for round in 0..kills {
        for change in changes {
            let clean = counts
                .iter()
                .find(|c| c.0 == change)
                .map(|c| c.3)
                .unwrap_or_default();
            let delay = celld_harness::drill::instant_within(&mut rng, clean);
            let filter = format!("{}:{}", STRICT_FILTERS[0], ns.name);
            let out = strict_run(&mut sb, change, &format!("none@1:{filter}"), Some(delay)).await;
            record(
                change.label(),
                "kill (random)",
                &out,
                format!(
                    "{} kill #{round} at {delay:?} (seed {seed})",
                    change.label()
                ),
            );
        }
    }
    eprintln!(
        "\nstrict sweep {tag} (StatefulSet writes and claim deletes in {}):",
        ns.name
    );
    eprintln!(
        "{:<20} {:<16} {:>5} {:>7} {:>10} {:>6}",
        "operation", "fault", "runs", "passed", "duplicate", "stuck"
    );
    for ((op, kind), [runs, passed, duplicates, stuck]) in &table {
        eprintln!("{op:<20} {kind:<16} {runs:>5} {passed:>7} {duplicates:>10} {stuck:>6}");
    }
    assert!(
        failures.is_empty(),
        "strict sweep failures:\n{}",
        failures.join("\n")
    );
    let _op = OperatorProcess::start(&operator_options(bed, "strict-sweep", &ns.name, None));
    ns.delete_and_wait().await.unwrap();
}

/// `make test`: the fault kinds that reach the API server's answer path (a committed write
/// whose answer is lost, a refusal, a dropped connection) on every StatefulSet write and claim
/// delete of the strict operations, and one kill at a random instant inside each.
#[tokio::test]
async fn api_faults_on_strict_effect_writes_never_duplicate_an_effect() {
    strict_sweep("strict-sweep", &["lost-response", "conflict", "reset"], 1).await;
}

/// `make drills`: every fault kind, three random kills per operation.
#[tokio::test]
#[ignore = "exhaustive: make drills"]
async fn api_faults_of_every_kind_on_strict_effect_writes_never_duplicate_an_effect() {
    strict_sweep(
        "strict-sweep-all",
        &[
            "timeout-before",
            "lost-response",
            "conflict",
            "throttle",
            "unavailable",
            "reset",
        ],
        3,
    )
    .await;
}
