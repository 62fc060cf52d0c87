//! Journal integrity on the real cluster (issue: journal integrity and liveness): whenever the
//! world and the journal disagree, or the journal annotation is damaged or gone, the fleet
//! ends `Blocked` with the right reason (or the effect is recorded as `Recovered`) within a
//! bounded number of journal entries and Events, status keeps its figures, no workload write
//! happens that the journal does not explain, and the documented command resolves it.
//!
//! The triggers run side by side, one fleet each, under one operator, so one 60 s window
//! covers them all.

mod e2e_common;

use std::process::Output;
use std::time::Duration;

use celld_harness::audit::writes as audit_writes;
use celld_harness::cluster;
use celld_operator::api::CelldFleet;
use e2e_common::*;
use journal::Journal;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{json, Value};

const JOURNAL: &str = "celld.eric.dev/journal";
const EFFECT: &str = "celld.eric.dev/effect";

/// Runs `celld-operator ARGS` as the admin.
fn cli(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_celld-operator"))
        .env("KUBECONFIG", &cluster().admin_kubeconfig)
        .args(args)
        .output()
        .expect("celld-operator runs")
}

fn cli_ok(args: &[&str]) -> String {
    let out = cli(args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "celld-operator {args:?}: {text}");
    text
}

/// A fleet in one zone with relaxed placement, so it may have a single member (and more
/// members than the zone has test nodes).
fn small_fleet(name: &str, profile: &str, replicas: i32) -> CelldFleet {
    let mut f = fleet(name, profile, replicas, &unique_bucket(name));
    f.spec.placement.zones = vec!["us-east-1a".into()];
    f.spec.placement.az_count = 1;
    f.spec.placement.mode = celld_operator::api::PlacementMode::Relaxed;
    f
}

async fn annotation(api: &Api<CelldFleet>, name: &str) -> Option<String> {
    api.get(name)
        .await
        .unwrap()
        .annotations()
        .get(JOURNAL)
        .cloned()
}

async fn set_fleet_annotation(api: &Api<CelldFleet>, name: &str, key: &str, value: Value) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
    )
    .await
    .unwrap();
}

async fn set_replicas(api: &Api<CelldFleet>, name: &str, n: i32) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": n}})),
    )
    .await
    .unwrap();
}

async fn set_marker(client: &Client, ns: &str, name: &str, marker: Value) {
    Api::<Deployment>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {EFFECT: marker}}})),
        )
        .await
        .unwrap();
}

async fn marker(client: &Client, ns: &str, name: &str) -> Option<String> {
    Api::<Deployment>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap()
        .annotations()
        .get(EFFECT)
        .cloned()
}

/// Events about fleet `name` itself (not its Services or workload; a folded series counts as
/// its count).
async fn events_about(client: &Client, ns: &str, name: &str) -> Vec<(String, String, i32)> {
    Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some("CelldFleet") && r.name.as_deref() == Some(name)
            })
        })
        .map(|e| {
            (
                e.reason.clone().unwrap_or_default(),
                e.type_.clone().unwrap_or_default(),
                e.series.as_ref().map_or(1, |s| s.count),
            )
        })
        .collect()
}

fn event_total(events: &[(String, String, i32)]) -> i32 {
    events.iter().map(|(_, _, n)| n).sum()
}

fn seq_of(text: Option<&str>) -> i64 {
    text.and_then(|t| serde_json::from_str::<Value>(t).ok())
        .and_then(|v| v["seq"].as_i64())
        .unwrap_or(0)
}

/// One way to damage the journal annotation.
#[derive(Clone, Copy, Debug)]
enum Tamper {
    EditedField,
    RemovedEntry,
    SwappedEntries,
    InvalidJson,
    WrongHash,
}

impl Tamper {
    fn apply(self, text: &str) -> String {
        if let Tamper::InvalidJson = self {
            return text[..text.len() / 2].to_string();
        }
        let mut doc: Value = serde_json::from_str(text).unwrap();
        let entries = doc["entries"].as_array_mut().unwrap();
        assert!(entries.len() >= 3, "enough entries to tamper with");
        match self {
            Tamper::EditedField => entries[0]["at"] = json!("2020-01-01T00:00:00Z"),
            Tamper::RemovedEntry => {
                entries.remove(1);
            }
            Tamper::SwappedEntries => entries.swap(1, 2),
            Tamper::WrongHash => {
                let last = entries.len() - 1;
                entries[last]["hash"] = json!("ab".repeat(32));
            }
            Tamper::InvalidJson => unreachable!(),
        }
        doc.to_string()
    }
}

/// What a trigger's fleet must show after the window.
struct Case {
    fleet: &'static str,
    reason: &'static str,
    /// Journal text before the trigger (to compare entries written).
    seq_before: i64,
    writes_before: usize,
    events_before: i32,
}

#[tokio::test]
async fn every_journal_mismatch_ends_blocked_with_bounded_writes_and_its_command_resolves_it() {
    let _guard = isolated().await;
    let (c, client, ns) = setup("integrity").await;
    let _op = Operator::start(None);
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);

    let tampers = [
        ("t-edit", Tamper::EditedField),
        ("t-remove", Tamper::RemovedEntry),
        ("t-swap", Tamper::SwappedEntries),
        ("t-json", Tamper::InvalidJson),
        ("t-hash", Tamper::WrongHash),
    ];
    let mut names: Vec<&'static str> = vec!["nomarker", "oldmarker", "missing", "reset"];
    names.extend(tampers.iter().map(|(n, _)| *n));
    for name in &names {
        api.create(&Default::default(), &small_fleet(name, "Bucket", 1))
            .await
            .unwrap();
    }
    for name in &names {
        ready(&api, name, 1).await;
    }
    // A second operation each, so a removed or swapped entry is in the middle, and the
    // predecessor is no longer the Provision's effect.
    for name in &names {
        set_replicas(&api, name, 2).await;
    }
    for name in &names {
        ready(&api, name, 2).await;
    }
    // An export taken while the journal is good, for `restore --from-file`.
    let export_dir = tempfile_dir();
    let export_path = export_dir.join("t-json.jsonl");
    let export = cli_ok(&[
        "journal",
        "export",
        &format!("{}/t-json", ns.name),
        "--source",
        "cluster",
    ]);
    std::fs::write(&export_path, &export).unwrap();

    // The triggers, then a spec change each that would need a workload write.
    let mut cases = Vec::new();
    for name in &names {
        let text = annotation(&api, name).await;
        cases.push(Case {
            fleet: name,
            reason: "",
            seq_before: seq_of(text.as_deref()),
            writes_before: audit_writes(c, &ns.name, "deployments", name, None),
            events_before: event_total(&events_about(&client, &ns.name, name).await),
        });
    }
    let create_marker = {
        let text = annotation(&api, "oldmarker").await.unwrap();
        let doc: Value = serde_json::from_str(&text).unwrap();
        let op = doc["entries"][0]["op"].as_str().unwrap().to_string();
        format!("{op}/create")
    };
    set_marker(&client, &ns.name, "nomarker", Value::Null).await;
    set_marker(&client, &ns.name, "oldmarker", json!(create_marker)).await;
    for name in ["missing", "reset"] {
        set_fleet_annotation(&api, name, JOURNAL, Value::Null).await;
    }
    for (name, tamper) in &tampers {
        let text = annotation(&api, name).await.unwrap();
        set_fleet_annotation(&api, name, JOURNAL, json!(tamper.apply(&text))).await;
    }
    for name in &names {
        set_replicas(&api, name, 3).await;
    }
    let reasons: Vec<&str> = names
        .iter()
        .map(|n| match *n {
            "nomarker" | "oldmarker" => "EffectMarkerMismatch",
            "missing" | "reset" => "JournalMissing",
            _ => "JournalInvalid",
        })
        .collect();
    for (case, want) in cases.iter_mut().zip(&reasons) {
        case.reason = want;
    }
    for case in &cases {
        let message = reason(&api, case.fleet, case.reason).await;
        assert!(
            message.contains("kubectl celld journal"),
            "{}: the message names the command that resolves it: {message}",
            case.fleet
        );
    }
    // The window: 60 s in which every fleet asks for a write it must not get.
    tokio::time::sleep(Duration::from_secs(60)).await;
    for case in &cases {
        let f = api.get(case.fleet).await.unwrap();
        let st = f.status.clone().unwrap();
        let blocked = st.conditions.iter().find(|c| c.type_ == "Blocked").unwrap();
        assert_eq!(
            (blocked.status.as_str(), blocked.reason.as_str()),
            ("True", case.reason),
            "{}: {}",
            case.fleet,
            blocked.message
        );
        let text = f.annotations().get(JOURNAL).cloned();
        let written = seq_of(text.as_deref()) - case.seq_before;
        if case.reason == "EffectMarkerMismatch" {
            assert!(
                (0..=4).contains(&written),
                "{}: {written} entries in 60 s",
                case.fleet
            );
        }
        let writes = audit_writes(c, &ns.name, "deployments", case.fleet, None);
        assert_eq!(
            writes,
            case.writes_before + usize::from(case.fleet == "nomarker" || case.fleet == "oldmarker"),
            "{}: no workload write but the test's own marker edit",
            case.fleet
        );
        let events = events_about(&client, &ns.name, case.fleet).await;
        let new_events = event_total(&events) - case.events_before;
        assert!(
            (1..=4).contains(&new_events),
            "{}: {new_events} Events in 60 s: {events:?}",
            case.fleet
        );
        let warnings: Vec<_> = events
            .iter()
            .filter(|(r, t, _)| r == case.reason && t == "Warning")
            .collect();
        assert_eq!(
            warnings.len(),
            1,
            "{}: one Warning {} Event: {events:?}",
            case.fleet,
            case.reason
        );
        assert_eq!(warnings[0].2, 1, "{}: published once", case.fleet);
        // Status keeps its figures while blocked.
        assert_eq!(st.applied_replicas, Some(2), "{}", case.fleet);
        assert_eq!(st.ready_replicas, Some(2), "{}", case.fleet);
        assert_eq!(st.replicas, 2, "{}", case.fleet);
        assert!(!st.recent_operations.is_empty(), "{}", case.fleet);
        assert_eq!(
            st.journal.as_ref().map(|j| j.seq),
            Some(case.seq_before),
            "{}: journal figures kept",
            case.fleet
        );
    }
    // `journal verify --source cluster` describes a broken annotation as the annotation.
    let out = cli(&["journal", "verify", &format!("{}/t-swap", ns.name)]);
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(1), "{shown}");
    assert!(
        shown.starts_with("FAIL") && shown.contains("annotation") && !shown.contains("mirror"),
        "{shown}"
    );
    assert!(!shown.contains("chain: OK"), "{shown}");

    // The documented commands resolve each case; then the asked-for scale happens.
    cli_ok(&["journal", "adopt", &format!("{}/nomarker", ns.name)]);
    let expected = {
        let text = annotation(&api, "oldmarker").await.unwrap();
        Journal::load(
            Some(&text),
            &api.get("oldmarker").await.unwrap().uid().unwrap(),
        )
        .unwrap()
        .predecessor_effect()
        .unwrap()
        .to_string()
    };
    set_marker(&client, &ns.name, "oldmarker", json!(expected)).await;
    cli_ok(&[
        "journal",
        "restore",
        &format!("{}/missing", ns.name),
        "--from-mirror",
    ]);
    cli_ok(&[
        "journal",
        "reset",
        &format!("{}/reset", ns.name),
        "--reason",
        "annotation removed by a restore tool (test)",
    ]);
    for (name, _) in &tampers {
        if *name == "t-json" {
            cli_ok(&[
                "journal",
                "restore",
                &format!("{}/t-json", ns.name),
                "--from-file",
                export_path.to_str().unwrap(),
            ]);
        } else {
            cli_ok(&[
                "journal",
                "restore",
                &format!("{}/{name}", ns.name),
                "--from-mirror",
            ]);
        }
    }
    for name in &names {
        ready(&api, name, 3).await;
    }
    // The resumed history: restored chains continue the old one; the reset one starts anew
    // with the live marker recorded as Recovered.
    for case in &cases {
        let seq = seq_of(annotation(&api, case.fleet).await.as_deref());
        if case.fleet == "reset" {
            let text = annotation(&api, "reset").await.unwrap();
            let doc: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(doc["entries"][0]["type"], "Recovered", "{text}");
        } else {
            assert!(
                seq > case.seq_before,
                "{}: the history continues",
                case.fleet
            );
        }
    }
    // Events are sent after their entry is committed (src/events.rs): waited for.
    until("the JournalReset Event", 60, &api, "reset", || async {
        events_about(&client, &ns.name, "reset")
            .await
            .iter()
            .any(|(r, _, _)| r == "JournalReset")
            .then_some(())
    })
    .await;
    // A journal that verifies is never reset: the command is refused and removed.
    let seq = seq_of(annotation(&api, "missing").await.as_deref());
    cli_ok(&[
        "journal",
        "reset",
        &format!("{}/missing", ns.name),
        "--reason",
        "by mistake",
    ]);
    until("the reset to be refused", 60, &api, "missing", || async {
        let refused = events_about(&client, &ns.name, "missing")
            .await
            .iter()
            .any(|(r, t, _)| r == "JournalCommandRefused" && t == "Warning");
        let f = api.get("missing").await.ok()?;
        (refused
            && !f
                .annotations()
                .contains_key("celld.eric.dev/journal-command"))
        .then_some(())
    })
    .await;
    assert_eq!(seq_of(annotation(&api, "missing").await.as_deref()), seq);
    // Nothing still blocks, and the Blocked condition said so with a Normal Event.
    for name in &names {
        let st = api.get(name).await.unwrap().status.unwrap();
        let blocked = st.conditions.iter().find(|c| c.type_ == "Blocked").unwrap();
        assert_eq!(blocked.status, "False", "{name}: {}", blocked.message);
    }
    cleanup(&client, ns).await;
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = cluster()
        .work_dir
        .join(format!("journal-integrity-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Killed right after its write, then abandoned before a new operator ran: the landed write
/// is recorded (`Issued{replayed}`) before `Abandoned`, never reissued, and the next plan
/// starts from it (no `EffectMarkerMismatch`).
#[tokio::test]
async fn abandoning_an_operation_whose_write_landed_records_the_write_first() {
    let _guard = isolated().await;
    let (c, client, ns) = setup("abandon-landed").await;
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    {
        let _op = Operator::start(None);
        api.create(&Default::default(), &small_fleet("kappa", "Bucket", 1))
            .await
            .unwrap();
        ready(&api, "kappa", 1).await;
    }
    let mut op = Operator::start(Some("after-effect"));
    set_replicas(&api, "kappa", 2).await;
    assert_eq!(op.exited(Duration::from_secs(60)).await, 3);
    let live = marker(&client, &ns.name, "kappa").await.unwrap();
    let op_id = live.split('/').next().unwrap().to_string();
    assert!(live.ends_with("/replicas"), "{live}");
    cli_ok(&["journal", "abandon", &format!("{}/kappa", ns.name), &op_id]);
    let _op = Operator::start(None);
    until("the abandon to be consumed", 60, &api, "kappa", || async {
        let f = api.get("kappa").await.ok()?;
        (!f.annotations()
            .contains_key("celld.eric.dev/journal-command")
            && f.status?.current_operation.is_none())
        .then_some(())
    })
    .await;
    let text = annotation(&api, "kappa").await.unwrap();
    let uid = api.get("kappa").await.unwrap().uid().unwrap();
    let journal = Journal::load(Some(&text), &uid).unwrap();
    let types: Vec<String> = journal
        .entries()
        .iter()
        .filter(|e| e.op().to_string() == op_id)
        .map(|e| format!("{:?}", e.entry_type()))
        .collect();
    assert_eq!(types, ["Intent", "Issued", "Abandoned"], "{types:?}");
    assert_eq!(journal.predecessor_effect().unwrap().to_string(), live);
    // One write carried the marker; nothing blocks; the fleet is what was asked.
    assert_eq!(
        audit_writes(c, &ns.name, "deployments", "kappa", Some(&live)),
        1
    );
    ready(&api, "kappa", 2).await;
    let st = api.get("kappa").await.unwrap().status.unwrap();
    let blocked = st.conditions.iter().find(|c| c.type_ == "Blocked").unwrap();
    assert_eq!(blocked.status, "False", "{}", blocked.message);
    cleanup(&client, ns).await;
}

/// A fleet whose journal annotation is damaged is still deleted (the finalizer is not held
/// hostage): compute goes, the claims stay (their history is unknown), and the deletion is
/// journaled in a fresh journal.
#[tokio::test]
async fn a_fleet_with_a_damaged_journal_is_deleted_keeping_its_claims() {
    let _guard = isolated().await;
    let (_c, client, ns) = setup("damaged-delete").await;
    let _op = Operator::start(None);
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    create_ready(&api, &small_fleet("lambda", "PersistentFleet", 1), 1).await;
    let claim = claim_uid(&client, &ns.name, "data-lambda-0").await;
    assert!(claim.is_some());
    set_fleet_annotation(&api, "lambda", JOURNAL, json!("{\"v\":1,\"broken")).await;
    reason(&api, "lambda", "JournalInvalid").await;
    api.delete("lambda", &Default::default()).await.unwrap();
    until("the fleet to be gone", 120, &api, "lambda", || async {
        api.get_opt("lambda").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(
        Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(client.clone(), &ns.name)
            .get_opt("lambda")
            .await
            .unwrap()
            .is_none_or(|s| s.metadata.deletion_timestamp.is_some())
    );
    let kept = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name)
        .get_opt("data-lambda-0")
        .await
        .unwrap();
    assert_eq!(kept.and_then(|c| c.uid()), claim, "the claim is kept");
    ns.delete_and_wait().await.unwrap();
}

/// Resuming a growth re-reads what its decision read: a foreign claim created at the new
/// member's name between the Intent and a crash is never attached (the operation is canceled
/// before its write and the fleet reports `StorageIdentityConflict`).
#[tokio::test]
async fn a_resumed_growth_rechecks_the_claims_it_would_attach() {
    let _guard = isolated().await;
    let (c, client, ns) = setup("regrow-claims").await;
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    {
        let _op = Operator::start(None);
        create_ready(&api, &small_fleet("mu", "PersistentFleet", 1), 1).await;
    }
    let mut op = Operator::start(Some("after-intent"));
    set_replicas(&api, "mu", 2).await;
    assert_eq!(op.exited(Duration::from_secs(60)).await, 3);
    let writes_before = audit_writes(c, &ns.name, "statefulsets", "mu", None);
    // A claim at the new member's name, not this fleet's.
    let foreign: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data-mu-1"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "celld-test-hostpath",
                 "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name);
    let foreign_uid = claims
        .create(&Default::default(), &foreign)
        .await
        .unwrap()
        .uid();
    let _op = Operator::start(None);
    let message = reason(&api, "mu", "StorageIdentityConflict").await;
    assert!(message.contains("data-mu-1"), "{message}");
    let text = annotation(&api, "mu").await.unwrap();
    assert!(
        text.contains("\"PredecessorChanged\""),
        "the resumed growth was canceled before its write: {text}"
    );
    // The cancel fenced the StatefulSet (one write that keeps its spec); no write asked for
    // the second member.
    assert!(audit_writes(c, &ns.name, "statefulsets", "mu", None) > writes_before);
    assert_eq!(
        celld_harness::audit::writes_matching(c, &ns.name, "statefulsets", "mu", |o| {
            o["spec"]["replicas"] == 2
        }),
        0,
        "the StatefulSet was not scaled onto the foreign claim"
    );
    let still = claims.get("data-mu-1").await.unwrap();
    assert_eq!(still.uid(), foreign_uid);
    assert!(still.labels().get("celld.eric.dev/fleet-uid").is_none());
    // Removing the foreign claim lets the asked-for growth happen.
    claims
        .delete("data-mu-1", &Default::default())
        .await
        .unwrap();
    ready(&api, "mu", 2).await;
    cleanup(&client, ns).await;
}

/// After its write, an operation's marker changed under it (a hand edit): the operation is
/// `Blocked` (`OperationBlocked`, the blocker names both markers), never driven on a guess;
/// `abandon` frees the fleet, which then reports `EffectMarkerMismatch` until `adopt`.
#[tokio::test]
async fn a_marker_changed_after_issue_blocks_the_operation() {
    let _guard = isolated().await;
    let (_c, client, ns) = setup("moved-marker").await;
    let _op = Operator::start(None);
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    create_ready(&api, &small_fleet("nu", "Bucket", 1), 1).await;
    // An image the kubelet cannot pull: the Upgrade is issued and waits for its rollout.
    let missing = format!("celld.test/missing@sha256:{}", "e".repeat(64));
    api.patch(
        "nu",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"runtimeImage": missing}})),
    )
    .await
    .unwrap();
    let op_id = until("the Upgrade to be issued", 60, &api, "nu", || async {
        let cur = api.get("nu").await.ok()?.status?.current_operation?;
        (format!("{:?}", cur.kind) == "Upgrade" && format!("{:?}", cur.phase) == "Issued")
            .then_some(cur.id)
    })
    .await;
    set_marker(&client, &ns.name, "nu", json!("edited-by-hand")).await;
    let message = reason(&api, "nu", "OperationBlocked").await;
    assert!(message.contains(&op_id), "{message}");
    let blocker = api
        .get("nu")
        .await
        .unwrap()
        .status
        .unwrap()
        .current_operation
        .unwrap()
        .blocker
        .unwrap_or_default();
    assert!(
        blocker.contains("edited-by-hand") && blocker.contains(&format!("{op_id}/template")),
        "{blocker}"
    );
    cli_ok(&["journal", "abandon", &format!("{}/nu", ns.name), &op_id]);
    reason(&api, "nu", "EffectMarkerMismatch").await;
    cli_ok(&["journal", "adopt", &format!("{}/nu", ns.name)]);
    api.patch(
        "nu",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"runtimeImage": image(1)}})),
    )
    .await
    .unwrap();
    ready(&api, "nu", 1).await;
    cleanup(&client, ns).await;
}

/// Two operator installations (two Leases) on one fleet: each reports the other
/// (`Blocked=True ForeignOperator`, one Warning Event from each), neither appends or writes
/// anything for the fleet while both run, and once the second stops, the first goes on after
/// the window and completes what was asked in the meantime, with no entry of the second.
#[tokio::test]
async fn a_second_installation_is_reported_by_both_and_neither_issues() {
    let _guard = isolated().await;
    let (c, client, ns) = setup("foreign").await;
    const WINDOW: &str = "--foreign-operator-window=40s";
    let first = Operator::start_with(|o| o.extra_args.push(WINDOW.into()));
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    create_ready(&api, &small_fleet("xi", "Bucket", 1), 1).await;
    let _ = c.kubectl(&["create", "namespace", "celld-e2e-second"]);
    let mut opts = Operator::options(
        None,
        &c.admin_kubeconfig,
        "celld-e2e-second",
        "celld-operator-second",
    );
    opts.metrics_addr = None;
    opts.extra_args.push(WINDOW.into());
    let second = celld_harness::operator::OperatorProcess::start(&opts);

    let message = reason(&api, "xi", "ForeignOperator").await;
    let (lease_first, lease_second) = (
        format!("celld-e2e/{}", lease_name()),
        format!("celld-e2e-second/{}", lease_name()),
    );
    assert!(
        message.contains(&format!("Lease {lease_first} (holder celld-operator-e2e)"))
            && message.contains(&format!(
                "Lease {lease_second} (holder celld-operator-second)"
            )),
        "{message}"
    );
    // Each installation says so itself.
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &ns.name);
    until(
        "a ForeignOperator Event from each installation",
        60,
        &api,
        "xi",
        || async {
            let mut by: Vec<String> = events
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .filter(|e| {
                    e.reason.as_deref() == Some("ForeignOperator")
                        && e.type_.as_deref() == Some("Warning")
                })
                .filter_map(|e| e.reporting_instance)
                .collect();
            by.sort();
            by.dedup();
            (by == ["celld-operator-e2e", "celld-operator-second"]).then_some(())
        },
    )
    .await;

    // Asked to grow while both run: neither opens, appends or writes anything.
    let deployments = Api::<Deployment>::namespaced(client.clone(), &ns.name);
    let seq = seq_of(annotation(&api, "xi").await.as_deref());
    let generation = deployments.get("xi").await.unwrap().metadata.generation;
    let effect = marker(&client, &ns.name, "xi").await;
    set_replicas(&api, "xi", 2).await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(
        seq_of(annotation(&api, "xi").await.as_deref()),
        seq,
        "no journal entry while both run"
    );
    assert_eq!(
        deployments.get("xi").await.unwrap().metadata.generation,
        generation,
        "no workload write"
    );
    assert_eq!(marker(&client, &ns.name, "xi").await, effect);
    let f = api.get("xi").await.unwrap();
    let blocked = f
        .status
        .clone()
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Blocked")
        .unwrap();
    assert_eq!(
        (blocked.status.as_str(), blocked.reason.as_str()),
        ("True", "ForeignOperator")
    );
    let records: Value =
        serde_json::from_str(&f.annotations()["celld.eric.dev/operators"]).unwrap();
    assert!(
        records.get(&lease_first).is_some() && records.get(&lease_second).is_some(),
        "{records}"
    );

    // The second installation stops: the first goes on once its record is older than the window.
    drop(second);
    ready(&api, "xi", 2).await;
    let text = annotation(&api, "xi").await.unwrap();
    let journal = Journal::load(Some(&text), &f.uid().unwrap()).unwrap();
    let entries = journal.document().entries();
    assert!(entries.len() as i64 > seq);
    for e in entries {
        assert_ne!(
            e.leader().lease.as_deref(),
            Some(lease_second.as_str()),
            "the second installation wrote {e:?}"
        );
    }
    assert_eq!(
        entries.last().unwrap().leader().lease.as_deref(),
        Some(lease_first.as_str())
    );
    cleanup(&client, ns).await;
    drop(first);
}
