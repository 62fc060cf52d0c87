//! Self-healing and member replacement on the real cluster with simulator members and the
//! real store (scenarios 16, 20, 21, 26): an administrative replacement with the member's UID
//! runs one `MemberReplacement` onto a fresh claim and removes its request, a wrong UID or a
//! paused fleet is refused and deletes nothing; a claim the real PV controller marks `Lost` is
//! replaced (`MemberDiskLost`); a member stuck in `ErrImagePull` past the delay is never
//! replaced; killed at every failpoint of the protocol, each Pod and claim is deleted once and
//! a member whose trigger went away before `pod` is kept (`MemberChanged`).

use std::time::Duration;

use celld_harness::operator::{verify_journal, OperatorProcess};
use celld_operator::api::CelldFleet;
use celld_sim::ledger::Ledger;
use celld_testbed::audit::{AuditLog, AuditQuery};
use celld_testbed::TestBed;
use journal::{EntryBody, OperationKind, Step};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

mod sim_common;
use sim_common::*;

const BIN: &str = env!("CARGO_BIN_EXE_celld-operator");
const REQUEST: &str = "celld.eric.dev/replace-member";

/// The operator of test `tag` with seconds instead of minutes for the healing windows.
fn heal_options(
    bed: &TestBed,
    tag: &str,
    ns: &str,
    fault_point: Option<&str>,
) -> celld_harness::operator::OperatorOptions {
    let mut o = operator_options(bed, tag, ns, fault_point);
    o.extra_args.extend([
        "--test-replacement-delay=6s".to_string(),
        "--test-termination-margin=3s".to_string(),
        "--test-absorb-window=2s".to_string(),
        "--test-claim-age=1s".to_string(),
    ]);
    o
}

fn fleet(name: &str, replicas: i32, bucket: &str) -> CelldFleet {
    sim_fleet(
        name,
        replicas,
        bucket,
        json!({"zones": ["us-east-1a"], "azCount": 1, "mode": "Relaxed"}),
    )
}

fn journal_of(f: &CelldFleet) -> journal::Journal {
    celld_operator::journal_store::load(f).expect("the journal loads")
}

async fn replacements(api: &Api<CelldFleet>, name: &str) -> Vec<journal::Operation> {
    let f = api.get(name).await.unwrap();
    journal_of(&f)
        .fold()
        .operations()
        .iter()
        .filter(|o| o.kind() == OperationKind::MemberReplacement)
        .cloned()
        .collect()
}

fn cli(bed: &TestBed, args: &[&str]) -> String {
    let out = std::process::Command::new(BIN)
        .env("KUBECONFIG", bed.kubeconfig())
        .args(args)
        .output()
        .expect("the CLI runs");
    assert!(
        out.status.success(),
        "{args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Accepted deletes by the operator (its User-Agent) of `resource` since `audit` was marked:
/// (name, precondition UID, precondition RV).
fn operator_deletes(audit: &AuditLog, ns: &str, resource: &str) -> Vec<(String, String, String)> {
    audited_deletes(audit, ns, resource, true)
}

async fn pod_uid(client: &Client, ns: &str, name: &str) -> String {
    Api::<Pod>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap()
        .uid()
        .unwrap_or_default()
}

async fn condition(
    api: &Api<CelldFleet>,
    name: &str,
    type_: &str,
) -> Option<(String, String, String)> {
    let f = api.get(name).await.ok()?;
    let c = f
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == type_)?;
    Some((c.status, c.reason, c.message))
}

async fn wait_refused(api: &Api<CelldFleet>, name: &str, needle: &str, log: &std::path::Path) {
    poll_until(
        &format!("ReplacementRefused naming {needle:?}"),
        90,
        log,
        || async {
            condition(api, name, "Blocked")
                .await
                .is_some_and(|(s, r, m)| {
                    s == "True" && r == "ReplacementRefused" && m.contains(needle)
                })
        },
    )
    .await;
}

/// Waits until the newest MemberReplacement is closed; returns it.
async fn wait_replacement_closed(
    api: &Api<CelldFleet>,
    name: &str,
    count: usize,
    log: &std::path::Path,
) -> journal::Operation {
    poll_until(
        &format!("{count} member replacement(s) of {name} to close"),
        240,
        log,
        || async {
            let r = replacements(api, name).await;
            r.len() >= count && r.iter().all(|o| !o.is_open())
        },
    )
    .await;
    replacements(api, name).await.pop().unwrap()
}

fn steps(o: &journal::Operation) -> Vec<String> {
    o.entries()
        .iter()
        .filter_map(|e| match e.body() {
            EntryBody::Issued(i) => Some(i.step.to_string()),
            EntryBody::ClaimRetired(c) => Some(format!("retired {}", c.claim)),
            _ => None,
        })
        .collect()
}

/// Scenario 20 and the pause part of 16: a wrong UID is refused and deletes nothing; a
/// paused fleet refuses a valid request until unpaused; then one `MemberReplacement` moves the
/// member onto a fresh claim (one Pod delete with its UID, one claim delete with UID + RV) and
/// removes the request in the write that completes it; the ledger reads every acknowledged ID.
#[tokio::test]
async fn administrative_replacement_gives_a_fresh_claim_and_refusals_delete_nothing() {
    let bed = TestBed::shared().await;
    let _store = bed.store_shared().await;
    let client = bed.client().await.unwrap();
    let tag = "heal-admin";
    let ns = fleet_namespace(bed, &client, tag).await;
    let bucket = bed.unique_bucket("heala").unwrap();
    let op = OperatorProcess::start(&heal_options(bed, tag, &ns.name, None));
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    api.create(&PostParams::default(), &fleet("beta", 3, &bucket))
        .await
        .unwrap();
    wait_settled(&api, "beta", 3, &op.log).await;
    let mut ledger = Ledger::new(&format!("heala-{}", ns.name));
    ledger
        .phase(&member_urls(bed, &client, &ns.name, 3).await)
        .await
        .expect("ledger after provision");
    let before = claim_uids(&client, &ns.name).await;
    let audit = bed.audit();

    // A wrong UID: refused, the annotation stays, nothing deleted.
    let uid = pod_uid(&client, &ns.name, "beta-1").await;
    api.patch(
        "beta",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {REQUEST: "beta-1/not-its-uid"}}})),
    )
    .await
    .unwrap();
    wait_refused(
        &api,
        "beta",
        &format!("member beta-1 now has UID {uid}"),
        &op.log,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let f = api.get("beta").await.unwrap();
    assert_eq!(
        f.annotations().get(REQUEST).map(String::as_str),
        Some("beta-1/not-its-uid"),
        "a refused request stays"
    );
    assert!(replacements(&api, "beta").await.is_empty());

    // Paused: a valid request (set by the CLI) waits and deletes nothing.
    api.patch(
        "beta",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"maintenance": {"paused": true}}})),
    )
    .await
    .unwrap();
    let said = cli(bed, &["replace", &format!("{}/beta", ns.name), "beta-1"]);
    assert!(said.contains(&format!("beta-1/{uid}")), "{said}");
    wait_refused(&api, "beta", "the fleet is paused", &op.log).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(replacements(&api, "beta").await.is_empty());
    assert!(operator_deletes(&audit, &ns.name, "pods").is_empty());
    assert!(operator_deletes(&audit, &ns.name, "persistentvolumeclaims").is_empty());

    // Unpaused: it proceeds by itself.
    api.patch(
        "beta",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"maintenance": {"paused": false}}})),
    )
    .await
    .unwrap();
    let o = wait_replacement_closed(&api, "beta", 1, &op.log).await;
    wait_settled(&api, "beta", 3, &op.log).await;
    assert_eq!(o.intent().reason.as_deref(), Some("Administrative"));
    assert_eq!(
        o.closure().map(|c| c.outcome.as_str()),
        Some("Succeeded"),
        "{:?}",
        o.entries()
    );
    assert_eq!(
        steps(&o),
        ["hold", "pod", "commit", "retired data-beta-1", "release"],
        "{:?}",
        o.entries()
    );
    let t = &o.intent().targets[0];
    assert_eq!(t.pod_uid.as_deref(), Some(uid.as_str()));
    assert_eq!(t.claim_uid.as_ref(), before.get("data-beta-1"));
    let after = claim_uids(&client, &ns.name).await;
    assert_ne!(
        after.get("data-beta-1"),
        before.get("data-beta-1"),
        "a fresh claim"
    );
    assert!(after.contains_key("data-beta-1"));
    assert_eq!(after.get("data-beta-0"), before.get("data-beta-0"));
    assert_eq!(after.get("data-beta-2"), before.get("data-beta-2"));
    let f = api.get("beta").await.unwrap();
    assert!(
        !f.annotations().contains_key(REQUEST),
        "the request is removed"
    );
    assert_eq!(
        operator_deletes(&audit, &ns.name, "pods"),
        vec![(
            "beta-1".to_string(),
            uid.clone(),
            o.entries()
                .iter()
                .find_map(|e| match e.body() {
                    EntryBody::Issued(i) if i.step == Step::Pod => {
                        i.decided_on_resource_version.clone()
                    }
                    _ => None,
                })
                .unwrap_or_default()
        )],
        "one Pod delete with UID + RV"
    );
    assert_eq!(
        operator_deletes(&audit, &ns.name, "persistentvolumeclaims"),
        vec![(
            "data-beta-1".to_string(),
            t.claim_uid.clone().unwrap(),
            t.claim_resource_version.clone().unwrap()
        )],
        "one claim delete with UID + RV"
    );
    let described = bed
        .cluster
        .kubectl(&["-n", &ns.name, "describe", "celldfleet", "beta"])
        .unwrap();
    assert!(described.contains("MemberReplaced"), "{described}");
    assert!(
        !described.contains("(MemberReplacement) is open"),
        "the request is not refused by its own operation: {described}"
    );
    ledger
        .phase(&member_urls(bed, &client, &ns.name, 3).await)
        .await
        .expect("ledger after the replacement");
    ns.delete_and_wait().await.unwrap();
    drop(op);
}

/// Scenario 21: the PV of beta-0's claim is removed; the real PV controller marks the claim
/// `Lost`; the operator replaces the member on a fresh disk (`MemberDiskLost`).
#[tokio::test]
async fn a_lost_claim_is_replaced_on_a_fresh_disk() {
    let bed = TestBed::shared().await;
    let _store = bed.store_shared().await;
    let client = bed.client().await.unwrap();
    let tag = "heal-lost";
    let ns = fleet_namespace(bed, &client, tag).await;
    let bucket = bed.unique_bucket("healls").unwrap();
    let op = OperatorProcess::start(&heal_options(bed, tag, &ns.name, None));
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    api.create(&PostParams::default(), &fleet("beta", 3, &bucket))
        .await
        .unwrap();
    wait_settled(&api, "beta", 3, &op.log).await;
    let before = claim_uids(&client, &ns.name).await;
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name);
    let pv_name = claims
        .get("data-beta-0")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.volume_name)
        .expect("bound");
    let pvs = Api::<PersistentVolume>::all(client.clone());
    // Deleted first, then unprotected: the pv-protection controller re-adds its finalizer to a
    // PV that is not being deleted.
    pvs.delete(&pv_name, &DeleteParams::default())
        .await
        .unwrap();
    poll_until("the PV to go", 60, &op.log, || async {
        let _ = pvs
            .patch(
                &pv_name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await;
        pvs.get_opt(&pv_name).await.ok().flatten().is_none()
    })
    .await;
    let o = wait_replacement_closed(&api, "beta", 1, &op.log).await;
    assert_eq!(
        o.intent().reason.as_deref(),
        Some("DiskLost"),
        "{:?}",
        o.entries()
    );
    assert_eq!(o.closure().map(|c| c.outcome.as_str()), Some("Succeeded"));
    wait_settled(&api, "beta", 3, &op.log).await;
    let after = claim_uids(&client, &ns.name).await;
    assert_ne!(after.get("data-beta-0"), before.get("data-beta-0"));
    assert!(after.contains_key("data-beta-0"));
    assert_eq!(after.get("data-beta-1"), before.get("data-beta-1"));
    let described = bed
        .cluster
        .kubectl(&["-n", &ns.name, "describe", "celldfleet", "beta"])
        .unwrap();
    assert!(described.contains("MemberDiskLost"), "{described}");
    ns.delete_and_wait().await.unwrap();
    drop(op);
}

/// Scenario 21, second part: a member stuck in `ErrImagePull` (an upgrade to an image the
/// node cannot pull, abandoned) stays down past the delay and is never replaced.
#[tokio::test]
async fn a_member_stuck_in_err_image_pull_is_never_replaced() {
    let bed = TestBed::shared().await;
    let _store = bed.store_shared().await;
    let client = bed.client().await.unwrap();
    let tag = "heal-image";
    let ns = fleet_namespace(bed, &client, tag).await;
    let bucket = bed.unique_bucket("healim").unwrap();
    let op = OperatorProcess::start(&heal_options(bed, tag, &ns.name, None));
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    api.create(&PostParams::default(), &fleet("beta", 3, &bucket))
        .await
        .unwrap();
    wait_settled(&api, "beta", 3, &op.log).await;
    let before = claim_uids(&client, &ns.name).await;
    let missing = "registry.celld.test/missing@sha256:00000000000000000000000000000000000000000000000000000000000000ff";
    api.patch(
        "beta",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"runtimeImage": missing}})),
    )
    .await
    .unwrap();
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    poll_until("beta-2 to wait with ErrImagePull", 120, &op.log, || async {
        pods.get_opt("beta-2")
            .await
            .ok()
            .flatten()
            .is_some_and(|p| {
                celld_operator::reconcile::heal::config_error(&p)
                    .is_some_and(|(r, _)| r == "ErrImagePull")
            })
    })
    .await;
    let upgrade = journal_of(&api.get("beta").await.unwrap())
        .fold()
        .current()
        .map(|o| o.id().to_string())
        .expect("the upgrade is open");
    cli(
        bed,
        &["journal", "abandon", &format!("{}/beta", ns.name), &upgrade],
    );
    let audit = bed.audit();
    poll_until(
        "the fleet to say why beta-2 is not replaced",
        60,
        &op.log,
        || async {
            condition(&api, "beta", "Progressing")
                .await
                .is_some_and(|(_, _, m)| m.contains("ErrImagePull") && m.contains("not replaced"))
        },
    )
    .await;
    // Well past delay (6 s) + absorb window (2 s).
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(replacements(&api, "beta").await.is_empty());
    assert!(operator_deletes(&audit, &ns.name, "pods").is_empty());
    assert!(operator_deletes(&audit, &ns.name, "persistentvolumeclaims").is_empty());
    assert_eq!(claim_uids(&client, &ns.name).await, before);
    ns.delete_and_wait().await.unwrap();
    drop(op);
}

/// Scenario 26: an administrative replacement killed once at each failpoint (the N-th effect:
/// 1 `hold`, 2 `pod`, 3 `commit`, 4 `release`) finishes after a restart; each Pod UID and each
/// claim UID is deleted at most once, the old claim exactly once; the journal verifies. Then a
/// request withdrawn after `hold` (operator down) is released at `pod` with `MemberChanged`,
/// deleting nothing.
#[tokio::test]
async fn replacement_drills_at_every_failpoint_delete_each_pod_and_claim_once() {
    let points = [
        "before-intent",
        "after-intent",
        "before-effect:1",
        "after-effect:1",
        "before-effect:2",
        "after-effect:2",
        "before-effect:3",
        "after-effect:3",
        "before-claim-delete",
        "after-claim-delete",
        "before-effect:4",
        "after-effect:4",
        "before-complete",
    ];
    let bed = TestBed::shared().await;
    let _store = bed.store_shared().await;
    let client = bed.client().await.unwrap();
    let tag = "heal-drill";
    let ns = fleet_namespace(bed, &client, tag).await;
    let bucket = bed.unique_bucket("heald").unwrap();
    let options = |p: Option<&str>| heal_options(bed, tag, &ns.name, p);
    let mut op = OperatorProcess::start(&options(None));
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    api.create(&PostParams::default(), &fleet("rho", 3, &bucket))
        .await
        .unwrap();
    wait_settled(&api, "rho", 3, &op.log).await;
    let mut ledger = Ledger::new(&format!("heald-{}", ns.name));
    ledger
        .phase(&fleet_member_urls(bed, &client, &ns.name, "rho", 3).await)
        .await
        .expect("ledger after provision");
    for (i, point) in points.iter().enumerate() {
        let member = format!("rho-{}", i % 3);
        let what = format!("replacement of {member} killed at {point}");
        let claims_before = claim_uids(&client, &ns.name).await;
        let claim = format!("data-{member}");
        let uid = pod_uid(&client, &ns.name, &member).await;
        let audit = bed.audit();
        drop(op);
        let mut killed = OperatorProcess::start(&options(Some(point)));
        cli(bed, &["replace", &format!("{}/rho", ns.name), &member]);
        assert_eq!(killed.exited(Duration::from_secs(180)).await, 3, "{what}");
        drop(killed);
        op = OperatorProcess::start(&options(None));
        let o = wait_replacement_closed(&api, "rho", i + 1, &op.log).await;
        wait_settled(&api, "rho", 3, &op.log).await;
        assert_eq!(
            o.closure().map(|c| c.outcome.as_str()),
            Some("Succeeded"),
            "{what}: {:?}",
            o.entries()
        );
        let pod_deletes = operator_deletes(&audit, &ns.name, "pods");
        assert_eq!(pod_deletes.len(), 1, "{what}: {pod_deletes:?}");
        assert_eq!(
            (pod_deletes[0].0.as_str(), pod_deletes[0].1.as_str()),
            (member.as_str(), uid.as_str()),
            "{what}"
        );
        let claim_deletes = operator_deletes(&audit, &ns.name, "persistentvolumeclaims");
        assert_eq!(claim_deletes.len(), 1, "{what}: {claim_deletes:?}");
        assert_eq!(claim_deletes[0].0, claim, "{what}");
        assert_eq!(
            Some(&claim_deletes[0].1),
            claims_before.get(&claim),
            "{what}"
        );
        let after = claim_uids(&client, &ns.name).await;
        assert_ne!(
            after.get(&claim),
            claims_before.get(&claim),
            "{what}: a fresh claim"
        );
        let f = api.get("rho").await.unwrap();
        assert!(
            !f.annotations().contains_key(REQUEST),
            "{what}: request removed"
        );
        ledger
            .phase(&fleet_member_urls(bed, &client, &ns.name, "rho", 3).await)
            .await
            .unwrap_or_else(|e| panic!("ledger after {what}: {e}"));
    }

    // Withdrawn after `hold` while the operator is down: released at `pod`, nothing deleted.
    let audit = bed.audit();
    let claims_before = claim_uids(&client, &ns.name).await;
    let uid = pod_uid(&client, &ns.name, "rho-0").await;
    drop(op);
    let mut killed = OperatorProcess::start(&options(Some("after-effect:1")));
    cli(bed, &["replace", &format!("{}/rho", ns.name), "rho-0"]);
    assert_eq!(killed.exited(Duration::from_secs(180)).await, 3);
    drop(killed);
    let held = Api::<Pod>::namespaced(client.clone(), &ns.name)
        .get("rho-0")
        .await
        .unwrap();
    assert!(
        held.finalizers()
            .iter()
            .any(|f| f == "celld.eric.dev/replacing-disk"),
        "the hold landed before the kill"
    );
    api.patch(
        "rho",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {REQUEST: null}}})),
    )
    .await
    .unwrap();
    let op = OperatorProcess::start(&options(None));
    let o = wait_replacement_closed(&api, "rho", points.len() + 1, &op.log).await;
    assert_eq!(
        o.closure().map(|c| c.outcome.as_str()),
        Some("MemberChanged"),
        "{:?}",
        o.entries()
    );
    assert_eq!(steps(&o), ["hold", "release"], "{:?}", o.entries());
    let pod = Api::<Pod>::namespaced(client.clone(), &ns.name)
        .get("rho-0")
        .await
        .unwrap();
    assert_eq!(
        pod.uid().as_deref(),
        Some(uid.as_str()),
        "the member is kept"
    );
    assert!(!pod
        .finalizers()
        .iter()
        .any(|f| f == "celld.eric.dev/replacing-disk"));
    assert!(operator_deletes(&audit, &ns.name, "pods").is_empty());
    assert!(operator_deletes(&audit, &ns.name, "persistentvolumeclaims").is_empty());
    assert_eq!(claim_uids(&client, &ns.name).await, claims_before);
    wait_settled(&api, "rho", 3, &op.log).await;

    let opts = options(None);
    drop(op);
    verify_journal(
        BIN.as_ref(),
        bed.kubeconfig(),
        &ns.name,
        "rho",
        Some(&opts.work_dir.join(&opts.identity).join("journal")),
    );
    let op = OperatorProcess::start(&opts);
    ns.delete_and_wait().await.unwrap();
    drop(op);
}

fn spread_fleet(name: &str, replicas: i32, bucket: &str) -> CelldFleet {
    sim_fleet(
        name,
        replicas,
        bucket,
        json!({"zones": ["us-east-1a", "us-east-1b", "us-east-1c"], "azCount": 3}),
    )
}

async fn node_of(client: &Client, ns: &str, pod: &str) -> String {
    Api::<Pod>::namespaced(client.clone(), ns)
        .get(pod)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.node_name)
        .expect("scheduled")
}

/// Scenario 23 (first part) and `LongDown`: with two members unready past the delay nothing is
/// replaced and the fleet says why; with one, it says when it will act, then replaces that
/// member on a fresh disk (`MemberReplaced`), keeping the other disks.
#[tokio::test]
async fn two_members_down_replace_nothing_and_one_long_down_member_is_replaced() {
    let bed = TestBed::shared().await;
    let _store = bed.store_shared().await;
    let client = bed.client().await.unwrap();
    let tag = "heal-down";
    let ns = fleet_namespace(bed, &client, tag).await;
    let bucket = bed.unique_bucket("healdn").unwrap();
    let op = OperatorProcess::start(&heal_options(bed, tag, &ns.name, None));
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    api.create(&PostParams::default(), &fleet("beta", 3, &bucket))
        .await
        .unwrap();
    wait_settled(&api, "beta", 3, &op.log).await;
    // beta-2 restarts once on its disk: a claim created with its Pod would count as a fresh
    // disk already, and a member on a fresh disk is never replaced.
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    let first = pod_uid(&client, &ns.name, "beta-2").await;
    pods.delete("beta-2", &DeleteParams::default())
        .await
        .unwrap();
    poll_until("beta-2 to come back", 120, &op.log, || async {
        pods.get_opt("beta-2")
            .await
            .ok()
            .flatten()
            .is_some_and(|p| {
                p.uid().as_deref() != Some(first.as_str()) && celld_testbed::pods::is_ready(&p)
            })
    })
    .await;
    wait_settled(&api, "beta", 3, &op.log).await;
    let before = claim_uids(&client, &ns.name).await;
    let audit = bed.audit();
    let m1 = bed.member(&client, &ns.name, "beta-1").await.unwrap();
    let m2 = bed.member(&client, &ns.name, "beta-2").await.unwrap();
    m1.set_faults(&json!({"ready": "never"})).await.unwrap();
    m2.set_faults(&json!({"ready": "never"})).await.unwrap();
    poll_until(
        "the fleet to report two members down",
        90,
        &op.log,
        || async {
            condition(&api, "beta", "Progressing")
                .await
                .is_some_and(|(_, _, m)| m.contains("none is replaced while more than one is down"))
        },
    )
    .await;
    // Well past delay (6 s) + absorb window (2 s).
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert!(replacements(&api, "beta").await.is_empty());
    assert!(operator_deletes(&audit, &ns.name, "pods").is_empty());
    assert!(operator_deletes(&audit, &ns.name, "persistentvolumeclaims").is_empty());

    // beta-1 recovers; beta-2 stays down: announced, then replaced.
    m1.set_faults(&json!({"ready": "auto"})).await.unwrap();
    poll_until(
        "the fleet to say when beta-2 is replaced",
        90,
        &op.log,
        || async {
            condition(&api, "beta", "Progressing")
                .await
                .is_some_and(|(_, _, m)| {
                    m.contains("Member beta-2 is down") && m.contains("unless it recovers")
                })
                || !replacements(&api, "beta").await.is_empty()
        },
    )
    .await;
    let o = wait_replacement_closed(&api, "beta", 1, &op.log).await;
    wait_settled(&api, "beta", 3, &op.log).await;
    assert_eq!(o.intent().reason.as_deref(), Some("LongDown"));
    assert_eq!(o.intent().targets[0].pod, "beta-2");
    assert_eq!(
        o.closure().map(|c| c.outcome.as_str()),
        Some("Succeeded"),
        "{:?}",
        o.entries()
    );
    let after = claim_uids(&client, &ns.name).await;
    assert_ne!(after.get("data-beta-2"), before.get("data-beta-2"));
    assert_eq!(after.get("data-beta-1"), before.get("data-beta-1"));
    assert_eq!(after.get("data-beta-0"), before.get("data-beta-0"));
    let deletes = operator_deletes(&audit, &ns.name, "persistentvolumeclaims");
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    let described = bed
        .cluster
        .kubectl(&["-n", &ns.name, "describe", "celldfleet", "beta"])
        .unwrap();
    assert!(described.contains("MemberReplaced"), "{described}");
    ns.delete_and_wait().await.unwrap();
    drop(op);
}

/// Scenario 24: every member down at once (all processes killed, then all Pods deleted)
/// changes no claim or PV; the fleet recovers with every acknowledged ID.
#[tokio::test]
async fn every_member_down_at_once_changes_no_disk() {
    let bed = TestBed::shared().await;
    let _store = bed.store_shared().await;
    let client = bed.client().await.unwrap();
    let tag = "heal-all";
    let ns = fleet_namespace(bed, &client, tag).await;
    let bucket = bed.unique_bucket("healal").unwrap();
    let op = OperatorProcess::start(&heal_options(bed, tag, &ns.name, None));
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    api.create(&PostParams::default(), &fleet("beta", 3, &bucket))
        .await
        .unwrap();
    wait_settled(&api, "beta", 3, &op.log).await;
    let mut ledger = Ledger::new(&format!("healal-{}", ns.name));
    ledger
        .phase(&member_urls(bed, &client, &ns.name, 3).await)
        .await
        .expect("ledger before");
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name);
    let volumes = |list: Vec<PersistentVolumeClaim>| {
        list.into_iter()
            .map(|c| (c.name_any(), c.spec.and_then(|s| s.volume_name)))
            .collect::<Vec<_>>()
    };
    let before = claim_uids(&client, &ns.name).await;
    let pvs_before = volumes(claims.list(&Default::default()).await.unwrap().items);
    let audit = bed.audit();
    for i in 0..3 {
        bed.kubelet
            .kill(&ns.name, &format!("beta-{i}"), None)
            .await
            .unwrap();
    }
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    for i in 0..3 {
        pods.delete(&format!("beta-{i}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    wait_settled(&api, "beta", 3, &op.log).await;
    assert!(replacements(&api, "beta").await.is_empty());
    assert_eq!(claim_uids(&client, &ns.name).await, before);
    assert_eq!(
        volumes(claims.list(&Default::default()).await.unwrap().items),
        pvs_before
    );
    assert!(operator_deletes(&audit, &ns.name, "persistentvolumeclaims").is_empty());
    ledger
        .phase(&member_urls(bed, &client, &ns.name, 3).await)
        .await
        .expect("ledger after every member was down");
    ns.delete_and_wait().await.unwrap();
    drop(op);
}

/// Scenario 22: a member on a node that stops heart-beating (zombie: its process keeps
/// running) is evicted and stays Terminating; 3 s (test margin) past its deadline it is
/// force-deleted with grace 0 and its UID (`MemberForceDeleted`) and comes back on its disk
/// (same claim UID), unschedulable because its volume lives on the cordoned node; past the
/// delay it is replaced on a fresh disk elsewhere. Exclusive: the node fault would reach the
/// other tests' Pods.
#[tokio::test]
async fn zombie_node_member_is_force_deleted_returns_on_its_disk_then_is_replaced() {
    let bed = TestBed::shared().await;
    let _store = bed.store_exclusive().await;
    let client = bed.client().await.unwrap();
    let tag = "heal-zombie";
    let ns = fleet_namespace(bed, &client, tag).await;
    let bucket = bed.unique_bucket("healz").unwrap();
    let op = OperatorProcess::start(&heal_options(bed, tag, &ns.name, None));
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    api.create(&PostParams::default(), &spread_fleet("zeta", 3, &bucket))
        .await
        .unwrap();
    wait_settled(&api, "zeta", 3, &op.log).await;
    let before = claim_uids(&client, &ns.name).await;
    let node = node_of(&client, &ns.name, "zeta-1").await;
    let old_uid = pod_uid(&client, &ns.name, "zeta-1").await;
    let audit = bed.audit();
    bed.kubelet.zombie(&node).await.unwrap();
    bed.cluster.kubectl(&["cordon", &node]).unwrap();
    let restore = || async {
        let _ = bed.kubelet.node_back(&node).await;
        let _ = bed.cluster.kubectl(&["uncordon", &node]);
    };
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    pods.delete("zeta-1", &DeleteParams::default())
        .await
        .unwrap();
    // Force-deleted, then recreated at the same name on the same claim.
    poll_until("zeta-1 to come back as a new Pod", 120, &op.log, || async {
        pods.get_opt("zeta-1")
            .await
            .ok()
            .flatten()
            .is_some_and(|p| p.uid().as_deref() != Some(old_uid.as_str()))
    })
    .await;
    let force = operator_deletes(&audit, &ns.name, "pods");
    let q = AuditQuery::writes()
        .verb("delete")
        .resource("pods")
        .namespace(&ns.name)
        .name("zeta-1")
        .successful();
    let grace0 = audit
        .query(&q)
        .unwrap()
        .into_iter()
        .filter(|e| e.user_agent.starts_with("celld-operator/"))
        .filter(|e| {
            e.request_object.as_ref().is_some_and(|b| {
                b["gracePeriodSeconds"] == 0 && b["preconditions"]["uid"] == old_uid.as_str()
            })
        })
        .count();
    assert_eq!(
        grace0, 1,
        "one force delete with grace 0 and the UID: {force:?}"
    );
    assert_eq!(
        claim_uids(&client, &ns.name).await.get("data-zeta-1"),
        before.get("data-zeta-1"),
        "it returns on its own disk"
    );
    let o = wait_replacement_closed(&api, "zeta", 1, &op.log).await;
    assert_eq!(
        o.intent().reason.as_deref(),
        Some("LongDown"),
        "{:?}",
        o.entries()
    );
    assert_eq!(
        o.closure().map(|c| c.outcome.as_str()),
        Some("Succeeded"),
        "{:?}",
        o.entries()
    );
    wait_settled(&api, "zeta", 3, &op.log).await;
    let after = claim_uids(&client, &ns.name).await;
    assert_ne!(after.get("data-zeta-1"), before.get("data-zeta-1"));
    assert_ne!(node_of(&client, &ns.name, "zeta-1").await, node);
    let described = bed
        .cluster
        .kubectl(&["-n", &ns.name, "describe", "celldfleet", "zeta"])
        .unwrap();
    assert!(described.contains("MemberForceDeleted"), "{described}");
    restore().await;
    ns.delete_and_wait().await.unwrap();
    drop(op);
}

/// Scenario 23, second part: a new member that no node can take (every node of its only zone
/// cordoned) reports `MemberUnschedulable` after the delay (its claim was never bound, so a
/// fresh disk cannot help); once a node is schedulable again it starts.
#[tokio::test]
async fn an_unplaceable_member_reports_member_unschedulable_after_the_delay() {
    let bed = TestBed::shared().await;
    let _store = bed.store_exclusive().await;
    let client = bed.client().await.unwrap();
    let tag = "heal-unsched";
    let ns = fleet_namespace(bed, &client, tag).await;
    let bucket = bed.unique_bucket("healun").unwrap();
    let op = OperatorProcess::start(&heal_options(bed, tag, &ns.name, None));
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    api.create(&PostParams::default(), &fleet("beta", 2, &bucket))
        .await
        .unwrap();
    wait_settled(&api, "beta", 2, &op.log).await;
    let zone_nodes: Vec<String> = bed
        .general_nodes
        .iter()
        .filter(|(_, z)| z == "us-east-1a")
        .map(|(n, _)| n.clone())
        .collect();
    for n in &zone_nodes {
        bed.cluster.kubectl(&["cordon", n]).unwrap();
    }
    bed.cluster
        .kubectl(&["-n", &ns.name, "scale", "celldfleet/beta", "--replicas=3"])
        .unwrap();
    poll_until("MemberUnschedulable", 120, &op.log, || async {
        let c = condition(&api, "beta", "Blocked").await;
        c.is_some_and(|(s, r, m)| {
            s == "True"
                && r == "MemberUnschedulable"
                && m.contains("beta-2")
                && m.contains("cannot be replaced")
        })
    })
    .await;
    assert!(replacements(&api, "beta").await.is_empty());
    for n in &zone_nodes {
        bed.cluster.kubectl(&["uncordon", n]).unwrap();
    }
    wait_settled(&api, "beta", 3, &op.log).await;
    assert!(replacements(&api, "beta").await.is_empty());
    ns.delete_and_wait().await.unwrap();
    drop(op);
}

/// `ClaimDeleted`: a member's claim deleted by hand while its Pod runs (the claim stays
/// terminating under claim protection) is resolved by deleting only the Pod: the StatefulSet
/// recreates both, and the member returns on a fresh claim. No claim delete by the operator.
#[tokio::test]
async fn a_claim_deleted_under_a_live_member_is_resolved_by_deleting_its_pod() {
    let bed = TestBed::shared().await;
    let _store = bed.store_shared().await;
    let client = bed.client().await.unwrap();
    let tag = "heal-claimdel";
    let ns = fleet_namespace(bed, &client, tag).await;
    let bucket = bed.unique_bucket("healcd").unwrap();
    let op = OperatorProcess::start(&heal_options(bed, tag, &ns.name, None));
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    api.create(&PostParams::default(), &fleet("beta", 3, &bucket))
        .await
        .unwrap();
    wait_settled(&api, "beta", 3, &op.log).await;
    let before = claim_uids(&client, &ns.name).await;
    let uid = pod_uid(&client, &ns.name, "beta-0").await;
    let audit = bed.audit();
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name)
        .delete("data-beta-0", &DeleteParams::default())
        .await
        .unwrap();
    let o = wait_replacement_closed(&api, "beta", 1, &op.log).await;
    assert_eq!(
        o.intent().reason.as_deref(),
        Some("ClaimDeleted"),
        "{:?}",
        o.entries()
    );
    assert_eq!(steps(&o), ["pod"], "{:?}", o.entries());
    assert_eq!(o.closure().map(|c| c.outcome.as_str()), Some("Succeeded"));
    wait_settled(&api, "beta", 3, &op.log).await;
    let after = claim_uids(&client, &ns.name).await;
    assert_ne!(after.get("data-beta-0"), before.get("data-beta-0"));
    assert!(after.contains_key("data-beta-0"));
    let pod_deletes = operator_deletes(&audit, &ns.name, "pods");
    assert_eq!(pod_deletes.len(), 1, "{pod_deletes:?}");
    assert_eq!(pod_deletes[0].1, uid);
    assert!(operator_deletes(&audit, &ns.name, "persistentvolumeclaims").is_empty());
    ns.delete_and_wait().await.unwrap();
    drop(op);
}

/// Administrative replacement of a Bucket member (Deployment): only the `pod` step, a delete
/// with the member's UID, and `Observed` once the workload is back to its ready count.
#[tokio::test]
async fn administrative_replacement_of_a_bucket_member_deletes_only_its_pod() {
    let bed = TestBed::shared().await;
    let _store = bed.store_shared().await;
    let client = bed.client().await.unwrap();
    let tag = "heal-bucket";
    let ns = fleet_namespace(bed, &client, tag).await;
    let bucket = bed.unique_bucket("healbk").unwrap();
    let op = OperatorProcess::start(&heal_options(bed, tag, &ns.name, None));
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let f: CelldFleet = serde_json::from_value(json!({
        "apiVersion": "celld.eric.dev/v1alpha1", "kind": "CelldFleet",
        "metadata": {"name": "omega"},
        "spec": {"profile": "Bucket", "runtimeImage": celld_testbed::RUNTIME_IMAGE, "replicas": 2,
                 "serviceAccountName": "celld",
                 "storage": {"bucket": bucket, "region": "us-east-1"},
                 "placement": {"zones": ["us-east-1a"], "azCount": 1, "mode": "Relaxed"},
                 "lifecycle": {"shutdownSeconds": 10, "terminationGraceSeconds": 15},
                 "env": [{"name": "CELLD_READY_FLEET_GATE_MS", "value": "2000"}]}
    }))
    .unwrap();
    api.create(&PostParams::default(), &f).await.unwrap();
    wait_settled(&api, "omega", 2, &op.log).await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    let victim = pods
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|p| p.metadata.deletion_timestamp.is_none())
        .expect("a member");
    let (name, uid) = (victim.name_any(), victim.uid().unwrap_or_default());
    let audit = bed.audit();
    cli(bed, &["replace", &format!("{}/omega", ns.name), &name]);
    let o = wait_replacement_closed(&api, "omega", 1, &op.log).await;
    assert_eq!(o.intent().reason.as_deref(), Some("Administrative"));
    assert_eq!(steps(&o), ["pod"], "{:?}", o.entries());
    assert_eq!(o.closure().map(|c| c.outcome.as_str()), Some("Succeeded"));
    wait_settled(&api, "omega", 2, &op.log).await;
    assert_eq!(
        operator_deletes(&audit, &ns.name, "pods"),
        vec![(
            name.clone(),
            uid.clone(),
            o.entries()
                .iter()
                .find_map(|e| match e.body() {
                    EntryBody::Issued(i) if i.step == Step::Pod =>
                        i.decided_on_resource_version.clone(),
                    _ => None,
                })
                .unwrap_or_default()
        )]
    );
    assert!(pods
        .get_opt(&name)
        .await
        .unwrap()
        .is_none_or(|p| p.uid() != Some(uid)));
    let f = api.get("omega").await.unwrap();
    assert!(!f.annotations().contains_key(REQUEST));
    ns.delete_and_wait().await.unwrap();
    drop(op);
}

/// Holds found on Pods: a replacement abandoned after `commit` (the operator was down) leaves a
/// committed hold; the restarted operator adopts it (`AdoptedHold`, the done steps `Recovered`)
/// and finishes onto a fresh claim, because the old disk must never be reused after `commit`.
/// Abandoned after `hold` instead, the orphan hold is recorded and released: the member stays on
/// its disk.
#[tokio::test]
async fn orphan_holds_are_adopted_when_committed_and_released_otherwise() {
    let bed = TestBed::shared().await;
    let _store = bed.store_shared().await;
    let client = bed.client().await.unwrap();
    let tag = "heal-orphan";
    let ns = fleet_namespace(bed, &client, tag).await;
    let bucket = bed.unique_bucket("healor").unwrap();
    let options = |p: Option<&str>| heal_options(bed, tag, &ns.name, p);
    let op = OperatorProcess::start(&options(None));
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    api.create(&PostParams::default(), &fleet("beta", 3, &bucket))
        .await
        .unwrap();
    wait_settled(&api, "beta", 3, &op.log).await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    let held = |p: &Pod| {
        p.finalizers()
            .iter()
            .any(|f| f == "celld.eric.dev/replacing-disk")
    };

    // Committed, then abandoned while the operator is down: adopted.
    let before = claim_uids(&client, &ns.name).await;
    drop(op);
    let mut killed = OperatorProcess::start(&options(Some("after-effect:3")));
    cli(bed, &["replace", &format!("{}/beta", ns.name), "beta-1"]);
    assert_eq!(killed.exited(Duration::from_secs(180)).await, 3);
    drop(killed);
    let first = journal_of(&api.get("beta").await.unwrap())
        .fold()
        .current()
        .map(|o| o.id().to_string())
        .expect("the replacement is open");
    cli(
        bed,
        &["journal", "abandon", &format!("{}/beta", ns.name), &first],
    );
    let op = OperatorProcess::start(&options(None));
    let adopted = wait_replacement_closed(&api, "beta", 2, &op.log).await;
    assert_eq!(
        adopted.intent().reason.as_deref(),
        Some("AdoptedHold"),
        "{:?}",
        adopted.entries()
    );
    assert_eq!(
        adopted.closure().map(|c| c.outcome.as_str()),
        Some("Succeeded")
    );
    let recovered: Vec<String> = adopted
        .entries()
        .iter()
        .filter_map(|e| match e.body() {
            EntryBody::Recovered(r) => Some(r.effect.step.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(
        recovered,
        ["hold", "pod", "commit"],
        "{:?}",
        adopted.entries()
    );
    wait_settled(&api, "beta", 3, &op.log).await;
    let after = claim_uids(&client, &ns.name).await;
    assert_ne!(
        after.get("data-beta-1"),
        before.get("data-beta-1"),
        "never back on the old disk"
    );
    assert!(!pods.get("beta-1").await.map(|p| held(&p)).unwrap_or(false));

    // Held, then abandoned: released onto the same disk.
    let before = claim_uids(&client, &ns.name).await;
    let uid = pod_uid(&client, &ns.name, "beta-2").await;
    drop(op);
    let mut killed = OperatorProcess::start(&options(Some("after-effect:1")));
    cli(bed, &["replace", &format!("{}/beta", ns.name), "beta-2"]);
    assert_eq!(killed.exited(Duration::from_secs(180)).await, 3);
    drop(killed);
    let second = journal_of(&api.get("beta").await.unwrap())
        .fold()
        .current()
        .map(|o| o.id().to_string())
        .expect("the replacement is open");
    cli(
        bed,
        &["journal", "abandon", &format!("{}/beta", ns.name), &second],
    );
    let op = OperatorProcess::start(&options(None));
    poll_until("the orphan hold to be released", 60, &op.log, || async {
        pods.get_opt("beta-2")
            .await
            .ok()
            .flatten()
            .is_some_and(|p| !held(&p))
    })
    .await;
    let f = api.get("beta").await.unwrap();
    let j = journal_of(&f);
    let o = j
        .fold()
        .operations()
        .iter()
        .find(|o| o.id().to_string() == second)
        .cloned()
        .unwrap();
    assert!(
        o.entries()
            .iter()
            .any(|e| matches!(e.body(), EntryBody::Recovered(r) if r.source == "orphan-hold")),
        "{:?}",
        o.entries()
    );
    assert!(
        !f.annotations().contains_key(REQUEST),
        "abandon removes the request"
    );
    assert_eq!(
        pod_uid(&client, &ns.name, "beta-2").await,
        uid,
        "the member is kept"
    );
    assert_eq!(claim_uids(&client, &ns.name).await, before);
    ns.delete_and_wait().await.unwrap();
    drop(op);
}

/// Scenario 25: a member partitioned from the store fences itself (exit code 3 in `lastState`,
/// `MemberSelfFenced`) and restarts on the same disk once the partition is gone (its restarted
/// process starts without the fault): it is not replaced and no disk changes. The replacement
/// delay is 60 s here, so the seconds the member is down stay well inside it, as minutes do
/// inside the real 10-minute default.
#[tokio::test]
async fn a_self_fenced_member_restarts_on_its_disk_and_is_not_replaced() {
    let bed = TestBed::shared().await;
    let _store = bed.store_shared().await;
    let client = bed.client().await.unwrap();
    let tag = "heal-fence";
    let ns = fleet_namespace(bed, &client, tag).await;
    let bucket = bed.unique_bucket("healfe").unwrap();
    let mut opts = heal_options(bed, tag, &ns.name, None);
    for a in opts.extra_args.iter_mut() {
        if a.starts_with("--test-replacement-delay=") {
            *a = "--test-replacement-delay=60s".into();
        }
    }
    let op = OperatorProcess::start(&opts);
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    api.create(&PostParams::default(), &fleet("beta", 3, &bucket))
        .await
        .unwrap();
    wait_settled(&api, "beta", 3, &op.log).await;
    let before = claim_uids(&client, &ns.name).await;
    let uid = pod_uid(&client, &ns.name, "beta-1").await;
    let audit = bed.audit();
    let m = bed.member(&client, &ns.name, "beta-1").await.unwrap();
    m.set_faults(&json!({"store": "partition"})).await.unwrap();
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    poll_until(
        "beta-1 to fence itself and come back Ready",
        180,
        &op.log,
        || async {
            pods.get_opt("beta-1")
                .await
                .ok()
                .flatten()
                .is_some_and(|p| {
                    let fenced = celld_testbed::pods::container_status(&p, "celld").and_then(|c| {
                        c.last_state
                            .as_ref()?
                            .terminated
                            .as_ref()
                            .map(|t| t.exit_code)
                    }) == Some(3);
                    fenced && celld_testbed::pods::is_ready(&p)
                })
        },
    )
    .await;
    wait_settled(&api, "beta", 3, &op.log).await;
    assert_eq!(
        pod_uid(&client, &ns.name, "beta-1").await,
        uid,
        "the same Pod, restarted"
    );
    assert!(replacements(&api, "beta").await.is_empty());
    assert_eq!(claim_uids(&client, &ns.name).await, before);
    assert!(operator_deletes(&audit, &ns.name, "pods").is_empty());
    assert!(operator_deletes(&audit, &ns.name, "persistentvolumeclaims").is_empty());
    poll_until("the MemberSelfFenced Event", 60, &op.log, || async {
        bed.cluster
            .kubectl(&["-n", &ns.name, "describe", "celldfleet", "beta"])
            .is_ok_and(|d| d.contains("MemberSelfFenced"))
    })
    .await;
    ns.delete_and_wait().await.unwrap();
    drop(op);
}
