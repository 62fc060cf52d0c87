//! The operator with simulator members (issue: reconciler core): every phase of a
//! PersistentFleet's life keeps every acknowledged ledger ID, and the one-member-down
//! sampler never sees two members down.

use std::time::{Duration, Instant};

use celld_harness::audit::{self, marker_of};
use celld_harness::operator::{verify_journal, OperatorProcess};
use celld_operator::api::CelldFleet;
use celld_sim::ledger::Ledger;
use celld_testbed::sampler::Expect;
use celld_testbed::{TestBed, RUNTIME_REPOSITORY};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

mod sim_common;
use sim_common::*;

// Each test runs its own operator installation (its own Lease namespace) scoped to the
// test's namespace with --watch-namespaces, so no operator acts on another test's fleet
// (failpoints count only its own fleets' boundaries) and the tests run side by side.

#[tokio::test]
async fn persistent_fleet_keeps_every_acknowledged_id_through_growth_contraction_and_restart() {
    let bed = TestBed::shared().await;
    let _store = bed.store_shared().await;
    let client = bed.client().await.unwrap();
    let ns = fleet_namespace(bed, &client, "sim-e2e").await;
    let bucket = bed.unique_bucket("opsim").unwrap();
    let op = OperatorProcess::start(&operator_options(bed, "sim-e2e", &ns.name, None));
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let placement = json!({"zones": ["us-east-1a", "us-east-1b", "us-east-1c"], "azCount": 3});
    let fleet = sim_fleet("beta", 3, &bucket, placement);
    api.create(&PostParams::default(), &fleet).await.unwrap();
    wait_settled(&api, "beta", 3, &op.log).await;
    let sampler = bed.sampler(&client, &ns.name, Expect::StatefulSet("beta".into()), 1);
    let mut ledger = Ledger::new(&format!("opsim-{}", &ns.name));
    ledger
        .phase(&member_urls(bed, &client, &ns.name, 3).await)
        .await
        .expect("ledger after provision");
    status_matches_the_api_objects(bed, &client, &api, &ns.name, "beta").await;

    let kubectl_scale = |n: i32| {
        bed.cluster.kubectl(&[
            "-n",
            &ns.name,
            "scale",
            "celldfleet/beta",
            &format!("--replicas={n}"),
        ])
    };
    kubectl_scale(4).unwrap();
    wait_settled(&api, "beta", 4, &op.log).await;
    ledger
        .phase(&member_urls(bed, &client, &ns.name, 4).await)
        .await
        .expect("ledger after growth 3->4");

    let claims_after_growth = claim_uids(&client, &ns.name).await;
    assert_eq!(
        claims_after_growth.len(),
        4,
        "one claim per member: {claims_after_growth:?}"
    );
    kubectl_scale(3).unwrap();
    wait_settled(&api, "beta", 3, &op.log).await;
    ledger
        .phase(&member_urls(bed, &client, &ns.name, 3).await)
        .await
        .expect("ledger after contraction 4->3");

    let token = json!({"spec": {"maintenance": {"restartToken": "sim-1"}}});
    api.patch("beta", &PatchParams::default(), &Patch::Merge(token))
        .await
        .unwrap();
    poll_until(
        "the rolling restart with token sim-1",
        240,
        &op.log,
        || async {
            let s = api
                .get("beta")
                .await
                .ok()
                .and_then(|f| f.status)
                .unwrap_or_default();
            s.last_restart_token.as_deref() == Some("sim-1") && s.current_operation.is_none()
        },
    )
    .await;
    wait_settled(&api, "beta", 3, &op.log).await;
    ledger
        .phase(&member_urls(bed, &client, &ns.name, 3).await)
        .await
        .expect("ledger after the rolling restart");

    // A member cut off from the store fences itself (exit 3) and restarts on its own disk:
    // a Warning MemberSelfFenced, no removal, nothing lost.
    let member = bed.member(&client, &ns.name, "beta-1").await.unwrap();
    member
        .set_faults(&json!({"store": "partition"}))
        .await
        .unwrap();
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &ns.name);
    poll_until(
        "a MemberSelfFenced event for beta-1",
        120,
        &op.log,
        || async {
            let Ok(list) = events.list(&Default::default()).await else {
                return false;
            };
            list.items.iter().any(|e| {
                e.reason.as_deref() == Some("MemberSelfFenced")
                    && e.related.as_ref().and_then(|r| r.name.as_deref()) == Some("beta-1")
            })
        },
    )
    .await;
    wait_settled(&api, "beta", 3, &op.log).await;
    ledger
        .phase(&member_urls(bed, &client, &ns.name, 3).await)
        .await
        .expect("ledger after a self-fence");
    let report = sampler.finish().await;
    report.assert_ok();

    // Every claim survived every phase: contraction kept data-beta-3 (Retain), the restart and
    // the self-fence restarted members on their own disks.
    assert_eq!(
        claim_uids(&client, &ns.name).await,
        claims_after_growth,
        "no claim replaced or removed"
    );
    let journal = celld_operator::journal_store::load(&api.get("beta").await.unwrap()).unwrap();
    assert_eq!(
        journal.fold().operations().len(),
        4,
        "Provision, two Scales, Restart; a self-fence opens none"
    );
    ns.delete_and_wait().await.unwrap();
    drop(op);
}

/// Growth, contraction and regrowth with simulator members: PersistentFleet 2→3 on a fresh
/// claim, 3→1 with the operator killed between the two steps, 1→3 back onto the kept disks;
/// the ledger reads every acknowledged ID after each phase, the one-member-down sampler never
/// fires, and every claim keeps its identity.
#[tokio::test]
async fn contraction_to_one_and_regrowth_keep_every_acknowledged_id() {
    let bed = TestBed::shared().await;
    let _store = bed.store_shared().await;
    let client = bed.client().await.unwrap();
    let ns = fleet_namespace(bed, &client, "sim-e2e2").await;
    let bucket = bed.unique_bucket("opsim2").unwrap();
    let options =
        |fault_point: Option<&str>| operator_options(bed, "sim-e2e2", &ns.name, fault_point);
    let mut op = OperatorProcess::start(&options(None));
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let placement = json!({"zones": ["us-east-1a"], "azCount": 1, "mode": "Relaxed"});
    let fleet = sim_fleet("gamma", 2, &bucket, placement);
    api.create(&PostParams::default(), &fleet).await.unwrap();
    wait_settled(&api, "gamma", 2, &op.log).await;
    let sampler = bed.sampler(&client, &ns.name, Expect::StatefulSet("gamma".into()), 1);
    let mut ledger = Ledger::new(&format!("opsim2-{}", &ns.name));
    let urls = |n: i32| fleet_member_urls(bed, &client, &ns.name, "gamma", n);
    ledger
        .phase(&urls(2).await)
        .await
        .expect("ledger after provision");
    let scale = |n: i32| {
        bed.cluster.kubectl(&[
            "-n",
            &ns.name,
            "scale",
            "celldfleet/gamma",
            &format!("--replicas={n}"),
        ])
    };

    let before_growth = claim_uids(&client, &ns.name).await;
    assert_eq!(before_growth.len(), 2);
    scale(3).unwrap();
    wait_settled(&api, "gamma", 3, &op.log).await;
    ledger
        .phase(&urls(3).await)
        .await
        .expect("ledger after 2->3");
    let claims = claim_uids(&client, &ns.name).await;
    assert_eq!(
        claims.len(),
        3,
        "a fresh claim for the new member: {claims:?}"
    );
    assert!(before_growth.iter().all(|(k, v)| claims.get(k) == Some(v)));

    // 3→1 with a kill when the second step is decided.
    drop(op);
    let mut killed = OperatorProcess::start(&options(Some("before-intent:2")));
    scale(1).unwrap();
    assert_eq!(killed.exited(Duration::from_secs(180)).await, 3);
    drop(killed);
    ledger
        .phase(&urls(2).await)
        .await
        .expect("ledger between the two steps");
    op = OperatorProcess::start(&options(None));
    wait_settled(&api, "gamma", 1, &op.log).await;
    ledger
        .phase(&urls(1).await)
        .await
        .expect("ledger after 3->1");
    assert_eq!(
        claim_uids(&client, &ns.name).await,
        claims,
        "Retain keeps every disk"
    );
    sampler.finish().await.assert_ok();

    // A growth run adds both kept members at once (both join unready, which is not "down");
    // the member that was already there never goes down meanwhile.
    let sampler = bed.sampler(&client, &ns.name, Expect::Names(vec!["gamma-0".into()]), 0);
    scale(3).unwrap();
    wait_settled(&api, "gamma", 3, &op.log).await;
    ledger
        .phase(&urls(3).await)
        .await
        .expect("ledger after 1->3");
    assert_eq!(
        claim_uids(&client, &ns.name).await,
        claims,
        "kept disks reattached"
    );
    sampler.finish().await.assert_ok();
    let journal = celld_operator::journal_store::load(&api.get("gamma").await.unwrap()).unwrap();
    let scales: Vec<String> = journal
        .entries()
        .iter()
        .map(journal::audit::entry_detail)
        .filter(|d| d.starts_with("Scale "))
        .collect();
    assert_eq!(scales.len(), 4, "2->3, 3->2, 2->1, 1->3: {scales:?}");
    ns.delete_and_wait().await.unwrap();
    drop(op);
}

/// The failpoints (docs/design.md "Failpoints"), in boundary order.
const FAILPOINTS: [&str; 5] = [
    "before-intent",
    "after-intent",
    "before-effect",
    "after-effect",
    "before-complete",
];

/// The drills with simulator members: a rolling Restart, an Upgrade, a TemplateUpdate
/// (a hand edit of the StatefulSet's template, repaired) and a Scale step (growth onto a
/// fresh or a kept disk and contraction alternating) are each killed at every failpoint.
/// After each kill a fresh operator completes the operation, the audit log shows exactly one
/// write carrying its effect marker, and the ledger reads every acknowledged ID; the
/// one-member-down sampler never fires, and the journal verifies against both the
/// annotation and the mirror.
#[tokio::test]
async fn drills_at_every_failpoint_keep_every_acknowledged_id() {
    let bed = TestBed::shared().await;
    let _store = bed.store_shared().await;
    let client = bed.client().await.unwrap();
    let ns = fleet_namespace(bed, &client, "sim-drill").await;
    let bucket = bed.unique_bucket("opsimd").unwrap();
    let options =
        |fault_point: Option<&str>| operator_options(bed, "sim-drill", &ns.name, fault_point);
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let placement = json!({"zones": ["us-east-1a"], "azCount": 1, "mode": "Relaxed"});
    let fleet = sim_fleet("delta", 3, &bucket, placement);
    let mut op = OperatorProcess::start(&options(None));
    api.create(&PostParams::default(), &fleet).await.unwrap();
    wait_settled(&api, "delta", 3, &op.log).await;
    let sampler = bed.sampler(&client, &ns.name, Expect::StatefulSet("delta".into()), 1);
    let mut ledger = Ledger::new(&format!("opsimd-{}", &ns.name));
    let urls = |n: i32| fleet_member_urls(bed, &client, &ns.name, "delta", n);
    ledger
        .phase(&urls(3).await)
        .await
        .expect("ledger after provision");
    let marker = || marker_of(bed.cluster, &ns.name, "statefulset", "delta");
    let kubectl = |args: &[&str]| {
        let mut all = vec!["-n", &ns.name];
        all.extend_from_slice(args);
        bed.cluster.kubectl(&all).unwrap();
    };
    let mut replicas = 3;
    let mut operations = 1;
    for (i, point) in FAILPOINTS.into_iter().enumerate() {
        for step in ["restart", "upgrade", "drift", "scale"] {
            let before = marker();
            drop(op);
            let mut killed = OperatorProcess::start(&options(Some(point)));
            let (what, suffix, target) = match step {
                "restart" => {
                    let patch =
                        json!({"spec": {"maintenance": {"restartToken": format!("drill-{i}")}}});
                    api.patch("delta", &PatchParams::default(), &Patch::Merge(patch))
                        .await
                        .unwrap();
                    ("Restart".to_string(), "/template", replicas)
                }
                "upgrade" => {
                    let image = format!("{RUNTIME_REPOSITORY}@sha256:{:064x}", 2 + i);
                    let patch = json!({"spec": {"runtimeImage": image}});
                    api.patch("delta", &PatchParams::default(), &Patch::Merge(patch))
                        .await
                        .unwrap();
                    ("Upgrade".to_string(), "/template", replicas)
                }
                "drift" => {
                    let edit = json!([{"op": "replace",
                        "path": "/spec/template/spec/containers/0/readinessProbe/periodSeconds",
                        "value": 7 + i}]);
                    kubectl(&[
                        "patch",
                        "statefulset",
                        "delta",
                        "--type=json",
                        "-p",
                        &edit.to_string(),
                    ]);
                    ("TemplateUpdate".to_string(), "/template", replicas)
                }
                _ => {
                    let target = if replicas == 3 { 4 } else { 3 };
                    kubectl(&["scale", "celldfleet/delta", &format!("--replicas={target}")]);
                    (format!("Scale {replicas}->{target}"), "/replicas", target)
                }
            };
            let what = format!("{what} killed at {point}");
            assert_eq!(killed.exited(Duration::from_secs(240)).await, 3, "{what}");
            drop(killed);
            op = OperatorProcess::start(&options(None));
            poll_until(&format!("{what} to finish"), 300, &op.log, || async {
                let now = marker();
                now != before && finished(&api, "delta", &now).await
            })
            .await;
            wait_settled(&api, "delta", target, &op.log).await;
            let now = marker();
            assert!(now.ends_with(suffix), "{what}: marker {now:?}");
            assert_eq!(
                audit::writes(bed.cluster, &ns.name, "statefulsets", "delta", Some(&now)),
                1,
                "{what}: exactly one write for {now}"
            );
            ledger
                .phase(&urls(target).await)
                .await
                .unwrap_or_else(|e| panic!("ledger after {what}: {e}"));
            replicas = target;
            operations += 1;
        }
    }
    sampler.finish().await.assert_ok();
    let journal = celld_operator::journal_store::load(&api.get("delta").await.unwrap()).unwrap();
    let kinds: Vec<String> = journal
        .fold()
        .operations()
        .iter()
        .map(|o| format!("{:?}", o.kind()))
        .collect();
    assert_eq!(
        kinds.len(),
        operations,
        "one operation per drill: {kinds:?}"
    );
    // Stopped, so the mirror is flushed and quiet: annotation and mirror agree.
    let opts = options(None);
    drop(op);
    verify_journal(
        env!("CARGO_BIN_EXE_celld-operator").as_ref(),
        bed.kubeconfig(),
        &ns.name,
        "delta",
        Some(&opts.work_dir.join(&opts.identity).join("journal")),
    );
    let op = OperatorProcess::start(&opts); // deletion needs a running operator
    ns.delete_and_wait().await.unwrap();
    drop(op);
}

/// The operator's member client (`celld_operator::member`) against simulator members on the
/// real cluster, over their Pod IPs: every member's `/state` validates (schema 1, a generation
/// of its own, strict removal offered, `node` = Pod name, no operation); a strict removal of
/// one member becomes a proof for its operation id and generation only; a request with another
/// generation is a conflict; repeating the request returns the same terminal result.
#[tokio::test]
async fn the_member_client_reads_state_and_recognises_a_strict_removal_proof() {
    use celld_operator::member::{self, NotAProof, Phase, Posted};
    let bed = TestBed::shared().await;
    let _store = bed.store_shared().await;
    let client = bed.client().await.unwrap();
    let ns = fleet_namespace(bed, &client, "sim-member").await;
    let bucket = bed.unique_bucket("opsimm").unwrap();
    let op = OperatorProcess::start(&operator_options(bed, "sim-member", &ns.name, None));
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let placement = json!({"zones": ["us-east-1a"], "azCount": 1, "mode": "Relaxed"});
    api.create(
        &PostParams::default(),
        &sim_fleet("eps", 3, &bucket, placement),
    )
    .await
    .unwrap();
    wait_settled(&api, "eps", 3, &op.log).await;
    // Paused: the operator starts nothing while a member is stranded by hand below.
    api.patch(
        "eps",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"maintenance": {"paused": true}}})),
    )
    .await
    .unwrap();
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), &ns.name);
    let mut generations = std::collections::BTreeMap::new();
    for i in 0..3 {
        let name = format!("eps-{i}");
        let pod = pods.get(&name).await.unwrap();
        let ip: std::net::IpAddr = pod.status.unwrap().pod_ip.unwrap().parse().unwrap();
        let s = member::state(ip, &name).await.unwrap();
        assert_eq!(s.node.as_deref(), Some(name.as_str()));
        assert!(s.shutdown.strict_disk_removal && !s.shutdown.control_only);
        assert_eq!(s.shutdown.operation, None);
        // The member's own name is the only one its answer is accepted for.
        let e = member::state(ip, "someone-else").await.unwrap_err();
        assert!(e.0.contains("not \"someone-else\""), "{e}");
        generations.insert(name, (ip, s.shutdown.runtime_generation));
    }
    let distinct: std::collections::BTreeSet<_> = generations.values().map(|(_, g)| g).collect();
    assert_eq!(
        distinct.len(),
        3,
        "one generation per process: {generations:?}"
    );

    let (ip, generation) = generations["eps-2"].clone();
    let id = uuid::Uuid::new_v4().to_string();
    match member::remove_disk(ip, &id, &generation).await {
        Posted::Accepted(s) => {
            let o = s.operation.expect("the accepted removal");
            assert_eq!(
                (o.operation_id.as_str(), o.expected_generation.as_str()),
                (id.as_str(), generation.as_str())
            );
        }
        other => panic!("POST answered {other:?}"),
    }
    // Another operation at a generation the process does not have: 409.
    let other = uuid::Uuid::new_v4().to_string();
    assert_eq!(
        member::remove_disk(ip, &other, "not-this-process").await,
        Posted::Conflict
    );
    let deadline = Instant::now() + Duration::from_secs(90);
    let proof = loop {
        let s = member::state(ip, "eps-2").await.unwrap();
        match member::check_proof(&s.shutdown, &id, &generation) {
            Ok(()) => break s,
            Err(e) if e.may_still_come() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => panic!("no proof: {e}"),
        }
    };
    assert!(proof.shutdown.control_only);
    assert!(matches!(
        member::check_proof(&proof.shutdown, &other, &generation),
        Err(NotAProof::OtherOperation { .. })
    ));
    assert!(matches!(
        member::check_proof(&proof.shutdown, &id, &generations["eps-1"].1),
        Err(NotAProof::Generation { .. })
    ));
    // A member that misreports (the simulator's fault switches, reachable only through its
    // own control API) never gives a proof, and each answer says why.
    let sim = celld_testbed::Member::new(ip);
    for (fault, why) in [
        ("other_operation_id", "not"),
        ("other_generation", "process restarted"),
        ("not_control_only", "not control-only"),
        ("blocker", "blocker: sim fault: blocker"),
    ] {
        sim.set_faults(&json!({"state": fault})).await.unwrap();
        let s = member::state(ip, "eps-2").await.unwrap();
        let e = member::check_proof(&s.shutdown, &id, &generation).unwrap_err();
        assert!(e.to_string().contains(why), "{fault}: {e}");
    }
    sim.set_faults(&json!({"state": "ok"})).await.unwrap();
    member::check_proof(
        &member::state(ip, "eps-2").await.unwrap().shutdown,
        &id,
        &generation,
    )
    .expect("a proof again once the member answers truthfully");
    // The same request again: the terminal result, not a new removal.
    match member::remove_disk(ip, &id, &generation).await {
        Posted::Accepted(s) => assert_eq!(s.operation.unwrap().phase, Phase::DataSafe),
        other => panic!("repeated POST answered {other:?}"),
    }
    // The other members are untouched: no operation, not control-only.
    for name in ["eps-0", "eps-1"] {
        let (ip, g) = &generations[name];
        let s = member::state(*ip, name).await.unwrap();
        assert_eq!(
            (
                &s.shutdown.runtime_generation,
                s.shutdown.operation.is_none()
            ),
            (g, true)
        );
    }
    ns.delete_and_wait().await.unwrap();
    drop(op);
}

/// `kubectl celld status NS/FLEET -o json` (the binary, as a user runs it) against the API
/// objects: replicas as the status says, every member Pod with its node, IP and readiness, the
/// claim it mounts with that claim's UID, and a runtime generation from each member's
/// `/state`; the text screen names every member.
async fn status_matches_the_api_objects(
    bed: &TestBed,
    client: &kube::Client,
    api: &Api<CelldFleet>,
    ns: &str,
    name: &str,
) {
    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
    use kube::ResourceExt;
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_celld-operator"))
            .env("KUBECONFIG", bed.kubeconfig())
            .args(args)
            .output()
            .expect("celld-operator status runs");
        assert!(
            out.status.success(),
            "status {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let target = format!("{ns}/{name}");
    let view: serde_json::Value =
        serde_json::from_str(&run(&["status", &target, "-o", "json"])).expect("JSON");
    let fleet = api.get(name).await.unwrap();
    let status = fleet.status.clone().unwrap();
    assert_eq!(view["replicas"]["desired"], fleet.spec.replicas);
    assert_eq!(view["replicas"]["applied"], json!(status.applied_replicas));
    assert_eq!(view["replicas"]["ready"], json!(status.ready_replicas));
    assert_eq!(view["profile"], "PersistentFleet");
    assert_eq!(
        view["journal"]["seq"],
        json!(status.journal.as_ref().unwrap().seq)
    );
    let uid = fleet.uid().unwrap();
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&kube::api::ListParams::default().labels(&format!("celld.eric.dev/fleet-uid={uid}")))
        .await
        .unwrap()
        .items;
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    let members = view["members"].as_array().expect("members");
    assert_eq!(members.len(), pods.len(), "{view:#}");
    for p in &pods {
        let m = members
            .iter()
            .find(|m| m["pod"] == p.name_any())
            .unwrap_or_else(|| panic!("{} in {view:#}", p.name_any()));
        let spec = p.spec.as_ref().unwrap();
        let st = p.status.as_ref().unwrap();
        assert_eq!(m["uid"], json!(p.uid()));
        assert_eq!(m["node"], json!(spec.node_name));
        assert_eq!(m["ip"], json!(st.pod_ip));
        assert_eq!(m["ready"], true, "{m}");
        let claim = format!("data-{}", p.name_any());
        assert_eq!(m["claim"], claim.as_str());
        let claim_uid = claims
            .iter()
            .find(|c| c.name_any() == claim)
            .and_then(|c| c.uid());
        assert_eq!(m["claimUid"], json!(claim_uid));
        assert!(
            m["runtimeGeneration"]
                .as_str()
                .is_some_and(|g| !g.is_empty()),
            "the member answered /state: {m}"
        );
    }
    assert!(view["currentOperation"].is_null(), "{view:#}");
    assert!(
        view["recentOperations"][0]["outcome"] == "Succeeded",
        "{view:#}"
    );
    let text = run(&["status", &target]);
    for p in &pods {
        assert!(text.contains(&p.name_any()), "{text}");
    }
    assert!(
        text.contains("Conditions: nothing needs attention"),
        "{text}"
    );
    // The history the same user reads next, filtered to the last operation.
    let last = status.recent_operations[0].id.clone();
    let shown = run(&[
        "journal",
        "show",
        &target,
        "--operation",
        &last,
        "-o",
        "json",
    ]);
    let shown: serde_json::Value = serde_json::from_str(&shown).expect("journal show -o json");
    assert_eq!(shown.as_array().map(Vec::len), Some(1), "{shown:#}");
    assert_eq!(shown[0]["id"], last.as_str());
}
