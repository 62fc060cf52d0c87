//! The journal on the real API server: compare-and-swap appends to the fleet
//! annotation, the sled mirror, and the `journal` CLI reading both.

use std::process::Command;

use celld_harness::{cluster, TestNamespace};
use celld_operator::api::keys::{JOURNAL_ANNOTATION, JOURNAL_COMMAND_ANNOTATION};
use celld_operator::api::CelldFleet;
use celld_operator::journal_store::{self, AppendError};
use chrono::{TimeZone, Utc};
use journal::*;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::json;

fn fleet_manifest(name: &str) -> CelldFleet {
    serde_json::from_value(json!({
        "apiVersion": "celld.eric.dev/v1alpha1", "kind": "CelldFleet",
        "metadata": {"name": name},
        "spec": {"profile": "Bucket", "serviceAccountName": "celld",
                 "storage": {"bucket": format!("{name}-data"), "region": "us-east-1"},
                 "placement": {"zones": ["us-east-1a"], "azCount": 1}}
    }))
    .unwrap()
}

fn entry(op: OperationId, body: EntryBody) -> NewEntry {
    NewEntry {
        at: Utc.with_ymd_and_hms(2026, 11, 29, 10, 0, 0).unwrap(),
        op,
        leader: Leader {
            identity: "celld-operator-test".into(),
            lease_transitions: 1,
            lease: None,
        },
        body,
    }
}

fn cli(cluster: &celld_harness::Cluster, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_celld-operator"))
        .env("KUBECONFIG", &cluster.admin_kubeconfig)
        .arg("journal")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn appends_are_compare_and_swap_mirrored_and_auditable_with_the_cli() {
    let cluster = cluster();
    let client = cluster.admin_client().await.unwrap();
    let ns = TestNamespace::create(&client, "journal").await.unwrap();
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let mut fleet = api
        .create(&PostParams::default(), &fleet_manifest("gamma"))
        .await
        .unwrap();
    let mirror_dir = tempfile::tempdir().unwrap();
    let mirror = Mirror::open(mirror_dir.path(), MirrorOptions::default()).unwrap();
    let budget = Budget::default();

    // A whole Scale operation: Intent, Issued, Observed, Completed.
    let op = OperationId::new_v4();
    let mut journal = journal_store::load(&fleet).unwrap();
    let intent = Intent {
        kind: OperationKind::Scale,
        from: 3,
        to: 4,
        token: None,
        image: None,
        reason: None,
        deadline: default_deadline(Utc.with_ymd_and_hms(2026, 11, 29, 10, 0, 0).unwrap(), None),
        targets: vec![],
        workload_uid: Some("wl".into()),
        predecessor_effect: journal.predecessor_effect(),
    };
    let bodies = vec![
        EntryBody::Intent(intent),
        EntryBody::Issued(Issued {
            step: Step::Replicas,
            effect: Effect::new(op, Step::Replicas),
            decided_on_resource_version: Some("10".into()),
            result_resource_version: Some("11".into()),
            replayed: false,
            target: None,
        }),
        EntryBody::Observed(Observed {
            note: "rollout done".into(),
        }),
        EntryBody::Completed(Completed {
            outcome: CompletedOutcome::Succeeded,
        }),
    ];
    // Intent and Issued one write each; Observed and Completed together, in one write, as
    // the operator appends them.
    let mut bodies = bodies.into_iter();
    let writes: Vec<Vec<EntryBody>> = vec![
        bodies.next().into_iter().collect(),
        bodies.next().into_iter().collect(),
        bodies.collect(),
    ];
    for write in writes {
        let n = write.len();
        let seq_before = journal.document().seq();
        let committed = journal_store::append(
            &api,
            &fleet,
            &journal,
            write.into_iter().map(|b| entry(op, b)).collect(),
            budget,
            Some(&mirror),
            &[],
        )
        .await
        .unwrap();
        assert_ne!(
            committed.fleet.resource_version(),
            fleet.resource_version(),
            "each append is a write"
        );
        let seqs: Vec<u64> = committed.entries.iter().map(|e| e.seq()).collect();
        assert_eq!(
            seqs,
            (seq_before + 1..=seq_before + n as u64).collect::<Vec<_>>(),
            "one write holds consecutive entries"
        );
        assert_eq!(
            journal_store::load(&committed.fleet)
                .unwrap()
                .document()
                .head(),
            committed.journal.document().head(),
            "the stored annotation is the journal with every entry of the write"
        );
        fleet = committed.fleet;
        journal = committed.journal;
    }
    let stored = api.get("gamma").await.unwrap();
    assert_eq!(
        stored.metadata.generation,
        Some(1),
        "annotation writes never bump the generation"
    );
    let reloaded = journal_store::load(&stored).unwrap();
    assert_eq!(reloaded.entries().len(), 4);
    assert_eq!(reloaded.document().head(), journal.document().head());
    assert_eq!(mirror.entries(&stored.uid().unwrap()).unwrap().len(), 4);
    assert!(
        reloaded.fold().current().is_none(),
        "the operation is closed"
    );

    // A stale copy loses the compare-and-swap and writes nothing.
    api.patch(
        "gamma",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
    )
    .await
    .unwrap();
    let op2 = OperationId::new_v4();
    let stale_intent = Intent {
        kind: OperationKind::Restart,
        from: 4,
        to: 4,
        token: Some("t1".into()),
        image: None,
        reason: None,
        deadline: default_deadline(Utc.with_ymd_and_hms(2026, 11, 29, 10, 5, 0).unwrap(), None),
        targets: vec![],
        workload_uid: Some("wl".into()),
        predecessor_effect: journal.predecessor_effect(),
    };
    let result = journal_store::append(
        &api,
        &fleet,
        &journal,
        vec![entry(op2, EntryBody::Intent(stale_intent.clone()))],
        budget,
        Some(&mirror),
        &[],
    )
    .await;
    assert!(
        matches!(result, Err(AppendError::Conflict(_))),
        "{result:?}"
    );
    // Entries of one write commit together or not at all: a second Intent for the same
    // operation is illegal, so neither is written, even to a fresh copy.
    let fresh = api.get("gamma").await.unwrap();
    let op3 = OperationId::new_v4();
    let result = journal_store::append(
        &api,
        &fresh,
        &journal,
        vec![
            entry(op3, EntryBody::Intent(stale_intent.clone())),
            entry(op3, EntryBody::Intent(stale_intent)),
        ],
        budget,
        Some(&mirror),
        &[],
    )
    .await;
    assert!(matches!(result, Err(AppendError::Stage(_))), "{result:?}");
    let after = api.get("gamma").await.unwrap();
    assert_eq!(
        after.metadata.resource_version, fresh.metadata.resource_version,
        "nothing written"
    );
    assert_eq!(
        after.annotations().get(JOURNAL_ANNOTATION),
        stored.annotations().get(JOURNAL_ANNOTATION)
    );
    assert_eq!(
        mirror.entries(&stored.uid().unwrap()).unwrap().len(),
        4,
        "nothing mirrored without a commit"
    );
    drop(mirror);

    // The CLI reads the cluster and the mirror.
    let target = format!("{}/gamma", ns.name);
    let (code, out, err) = cli(cluster, &["show", &target]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&op.to_string()) && out.contains("Scale"),
        "{out}"
    );
    let (code, out, _) = cli(cluster, &["export", &target]);
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 4);
    let dir = mirror_dir.path().to_str().unwrap();
    let (code, out, err) = cli(
        cluster,
        &["verify", &target, "--source", "both", "--journal-dir", dir],
    );
    assert_eq!(code, 0, "verify both: {out}{err}");
    let (code, out, _) = cli(cluster, &["show", "--mirror", dir]);
    assert_eq!(code, 0);
    assert!(out.contains(&op.to_string()));

    // A command is validated before it is sent, then set on the fleet.
    let (code, _, err) = cli(cluster, &["abandon", &target, "not-a-uuid"]);
    assert_eq!(code, 1, "{err}");
    assert!(!api
        .get("gamma")
        .await
        .unwrap()
        .annotations()
        .contains_key(JOURNAL_COMMAND_ANNOTATION));
    let (code, _, err) = cli(cluster, &["retry", &target, &op.to_string()]);
    assert_eq!(code, 0, "{err}");
    let cmd = api
        .get("gamma")
        .await
        .unwrap()
        .annotations()
        .get(JOURNAL_COMMAND_ANNOTATION)
        .cloned();
    assert_eq!(cmd, Some(format!("retry {op}")));

    // A tampered annotation fails verification and names the bad entry.
    let text = after.annotations()[JOURNAL_ANNOTATION].clone();
    let tampered = text.replacen("\"to\":4", "\"to\":9", 1);
    assert_ne!(tampered, text);
    api.patch(
        "gamma",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {JOURNAL_ANNOTATION: tampered}}})),
    )
    .await
    .unwrap();
    let (code, out, err) = cli(cluster, &["verify", &target]);
    assert_eq!(
        code, 1,
        "a tampered journal must fail verification: {out}{err}"
    );
    assert!(
        format!("{out}{err}").contains("seq 1") || format!("{out}{err}").contains("entry 1"),
        "{out}{err}"
    );
    ns.delete().await.unwrap();
}

/// Installed as `kubectl-celld`, the binary serves `kubectl celld …`.
#[tokio::test]
async fn the_binary_works_as_a_kubectl_plugin() {
    let cluster = cluster();
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_celld-operator"),
        dir.path().join("kubectl-celld"),
    )
    .unwrap();
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(cluster.bin_dir.join("kubectl"))
        .env("PATH", path)
        .env("KUBECONFIG", &cluster.admin_kubeconfig)
        .args(["celld", "version"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("celld-operator ") && text.contains("celld.eric.dev/v1alpha1"),
        "{text}"
    );
}
