//! The operator on the real cluster (issue: reconciler core): the binary runs as a child
//! process against the local control plane, members run on the test kubelet.
//!
//! Members here are no-process Pods (Ready at once): these scenarios check what the
//! operator writes and decides. Data-level scenarios (ledger, self-fence) run with
//! simulator members in the test-bed suite.
//!
//! Each scenario's operators are one installation of their own (Lease
//! `celld-e2e/celld-operator-<test namespace>`) watching only the test's namespace, so the
//! scenarios run side by side; one whose operator watches every namespace runs alone
//! (`exclusive()`).

mod e2e_common;

use celld_harness::audit::{deletes as audit_deletes, marker_of, writes as audit_writes};
use celld_harness::operator::OperatorProcess;
use celld_harness::{cluster, Cluster};
use celld_operator::api::{CelldFleet, CelldStorageReservation};
use e2e_common::*;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Service, ServiceAccount};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{json, Value};
use std::process::Command;
use std::time::{Duration, Instant};

#[tokio::test]
async fn persistent_fleet_provisions_scales_restarts_once_and_deletes_keeping_the_reservation() {
    let _guard = isolated().await;
    let (c, client, ns) = setup("pf").await;
    let _op = Operator::start(None);
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let bucket = unique_bucket("pf");
    create_ready(&api, &fleet("beta", "PersistentFleet", 3, &bucket), 3).await;
    assert_rendered(&client, &ns.name, "beta").await;

    // Rendered objects exist and are owned; the reservation binds the bucket.
    let uid = api.get("beta").await.unwrap().uid().unwrap();
    let sts = Api::<StatefulSet>::namespaced(client.clone(), &ns.name)
        .get("beta")
        .await
        .unwrap();
    assert_eq!(sts.labels()["celld.eric.dev/fleet-uid"], uid);
    assert!(sts.annotations()["celld.eric.dev/effect"].ends_with("/create"));
    let peers = Api::<Service>::namespaced(client.clone(), &ns.name)
        .get("beta-peers")
        .await
        .unwrap();
    assert_eq!(peers.spec.unwrap().cluster_ip.as_deref(), Some("None"));
    c.kubectl(&[
        "-n",
        &ns.name,
        "get",
        "networkpolicy/beta",
        "poddisruptionbudget/beta",
        "service/beta",
    ])
    .unwrap();
    let reservation_name = CelldStorageReservation::name_for_bucket(&bucket);
    let reservation = Api::<CelldStorageReservation>::all(client.clone())
        .get(&reservation_name)
        .await
        .unwrap();
    assert_eq!(reservation.spec.fleet_uid, uid);

    // Growth 3→4 on a fresh claim, with exactly one replica write.
    c.kubectl(&["-n", &ns.name, "scale", "celldfleet/beta", "--replicas=4"])
        .unwrap();
    ready(&api, "beta", 4).await;
    let grow_marker = marker_of(c, &ns.name, "statefulset", "beta");
    assert!(grow_marker.ends_with("/replicas"));
    assert_eq!(
        audit_writes(c, &ns.name, "statefulsets", "beta", Some(&grow_marker)),
        1
    );
    let claim3 = claim_uid(&client, &ns.name, "data-beta-3")
        .await
        .expect("a fresh claim for ordinal 3");

    // Contraction 4→3 keeps the claim; growing back reattaches the same claim.
    c.kubectl(&["-n", &ns.name, "scale", "celldfleet/beta", "--replicas=3"])
        .unwrap();
    ready(&api, "beta", 3).await;
    assert_eq!(
        claim_uid(&client, &ns.name, "data-beta-3").await,
        Some(claim3.clone()),
        "Retain keeps the disk"
    );
    c.kubectl(&["-n", &ns.name, "scale", "celldfleet/beta", "--replicas=4"])
        .unwrap();
    ready(&api, "beta", 4).await;
    assert_eq!(
        claim_uid(&client, &ns.name, "data-beta-3").await,
        Some(claim3),
        "growth reattaches the kept claim"
    );

    // A restart token is applied once: the template write carries it, status reports it.
    let restart_audit = audit_from_now();
    api.patch(
        "beta",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"maintenance": {"restartToken": "t-1"}}})),
    )
    .await
    .unwrap();
    until("lastRestartToken t-1", 120, &api, "beta", || async {
        let s = api.get("beta").await.ok()?.status?;
        (s.last_restart_token.as_deref() == Some("t-1") && s.current_operation.is_none())
            .then_some(())
    })
    .await;
    let restart_marker = marker_of(c, &ns.name, "statefulset", "beta");
    assert!(restart_marker.ends_with("/template"));
    assert_eq!(
        audit_writes(c, &ns.name, "statefulsets", "beta", Some(&restart_marker)),
        1
    );
    // The rolling restart replaced one member at a time, highest ordinal first: each Pod
    // deleted and created again before the next one was deleted.
    let expected: Vec<(String, String)> = (0..4)
        .rev()
        .flat_map(|i| {
            [
                ("delete".to_string(), format!("beta-{i}")),
                ("create".to_string(), format!("beta-{i}")),
            ]
        })
        .collect();
    assert_eq!(rollout_sequence(&restart_audit, &ns.name), expected);
    let writes_before = audit_writes(c, &ns.name, "statefulsets", "beta", None);
    drop(_op);
    for _ in 0..2 {
        let _again = Operator::start(None);
        tokio::time::sleep(Duration::from_secs(8)).await;
    }
    assert_eq!(
        audit_writes(c, &ns.name, "statefulsets", "beta", None),
        writes_before,
        "operator restarts after completion cause zero workload writes"
    );

    // Deletion: workload, claims, prerequisites, finalizer; the reservation stays.
    let _op = Operator::start(None);
    let delete_audit = audit_from_now();
    api.delete("beta", &Default::default()).await.unwrap();
    until("the fleet to be gone", 120, &api, "beta", || async {
        api.get_opt("beta").await.ok()?.is_none().then_some(())
    })
    .await;
    // From the audit log: the workload, then the 4 claims, then the 4 prerequisites, then
    // the finalizer, each phase finished before the next began.
    assert_teardown_order(&delete_audit, &ns.name, 4);
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(claims.items.is_empty(), "every fleet claim is deleted");
    assert!(Api::<StatefulSet>::namespaced(client.clone(), &ns.name)
        .get_opt("beta")
        .await
        .unwrap()
        .is_none());
    assert!(Api::<Service>::namespaced(client.clone(), &ns.name)
        .get_opt("beta-peers")
        .await
        .unwrap()
        .is_none());
    let kept = Api::<CelldStorageReservation>::all(client.clone())
        .get(&reservation_name)
        .await
        .unwrap();
    assert_eq!(
        kept.spec.fleet_uid, uid,
        "the reservation stays bound to the deleted fleet"
    );

    // A same-named new fleet (new UID) cannot reuse the bucket.
    api.create(
        &PostParams::default(),
        &fleet("beta", "PersistentFleet", 3, &bucket),
    )
    .await
    .unwrap();
    reason(&api, "beta", "StorageScopeConflict").await;
    cleanup(&client, ns).await;
}

#[tokio::test]
async fn bucket_fleet_grows_and_shrinks_one_member_at_a_time() {
    let _guard = isolated().await;
    let (_c, client, ns) = setup("bk").await;
    let _op = Operator::start(None);
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    create_ready(&api, &fleet("alpha", "Bucket", 3, &unique_bucket("bk")), 3).await;
    assert_rendered(&client, &ns.name, "alpha").await;
    api.patch(
        "alpha",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 5}})),
    )
    .await
    .unwrap();
    ready(&api, "alpha", 5).await;
    api.patch(
        "alpha",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 3}})),
    )
    .await
    .unwrap();
    ready(&api, "alpha", 3).await;
    let history = api
        .get("alpha")
        .await
        .unwrap()
        .status
        .unwrap()
        .recent_operations;
    let scales: Vec<_> = history
        .iter()
        .filter(|o| format!("{:?}", o.kind) == "Scale")
        .collect();
    assert_eq!(
        scales.len(),
        3,
        "one growth 3→5, then two contractions of one member each: {history:?}"
    );
    // Fleet gauges and journal counters on /metrics.
    let text = scrape().await;
    let labels = format!("namespace=\"{}\",fleet=\"alpha\"", ns.name);
    assert!(
        text.contains(&format!("celld_fleet_ready_replicas{{{labels}}} 3")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "celld_journal_appends_total{{{labels},type=\"Intent\"}} 4"
        )),
        "{text}"
    );
    assert!(text.contains("celld_operator_leader 1"), "{text}");
    // The leader's journal mirror on disk: sled's log holds at least one segment (its file
    // ends one byte short of 512 KiB).
    let mirror_bytes: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("celld_journal_mirror_disk_bytes "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(mirror_bytes >= 500_000, "{text}");
    // A reacting reconcile is timed from the watch event that triggered it (src/reaction.rs):
    // the growth's write at least, triggered by the fleet's own event; never more often than
    // the writes themselves are timed.
    let count = |family: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{family}_count ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let (waits, passes) = (
        count("celld_operator_reaction_wait_seconds"),
        count("celld_operator_reaction_pass_seconds"),
    );
    assert!(
        (1..=passes).contains(&waits),
        "{waits} waits, {passes} passes:\n{text}"
    );
    // Every metric the chart's alerts use is exported, and the per-fleet ones have a sample
    // for this fleet (an alert on a family nobody exports never fires: it happened).
    let rules = include_str!("../helm/celld-operator/templates/metrics.yaml");
    let used: std::collections::BTreeSet<&str> = rules
        .lines()
        .filter(|l| l.trim_start().starts_with("expr:"))
        .flat_map(|l| {
            l.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("celld_"))
        })
        .collect();
    assert!(used.len() >= 6, "{used:?}");
    for name in &used {
        let family = name.strip_suffix("_total").unwrap_or(name);
        assert!(
            text.lines()
                .any(|l| l.starts_with(&format!("# TYPE {family} "))),
            "the alerts use {name}, which /metrics does not export:\n{text}"
        );
        if name.starts_with("celld_fleet_") || name.starts_with("celld_journal_") {
            assert!(
                text.lines()
                    .any(|l| l.starts_with(&format!("{name}{{{labels}}}"))),
                "{name} has no sample for {}/alpha:\n{text}",
                ns.name
            );
        }
    }
    // One Event per journal entry, reason by entry type, the operation id in the note. Events
    // are sent after their entry is committed, off the reconcile's path (src/events.rs): wait
    // for every Scale's `OperationCompleted`, then count.
    let completed = |events: &[k8s_openapi::api::events::v1::Event], id: &str| {
        events.iter().any(|e| {
            e.reason.as_deref() == Some("OperationCompleted")
                && e.note.as_deref().is_some_and(|n| n.contains(id))
        })
    };
    let events = until("the Events of every entry", 60, &api, "alpha", || async {
        let events = events_in(&client, &ns.name).await?;
        scales
            .iter()
            .all(|o| completed(&events, o.id.as_str()))
            .then_some(events)
    })
    .await;
    let intents: Vec<_> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("OperationIntent"))
        .collect();
    assert_eq!(intents.len(), 4, "Provision and three Scales");
    cleanup(&client, ns).await;
}

#[tokio::test]
async fn foreign_objects_are_refused_and_left_untouched() {
    let _guard = isolated().await;
    let (c, client, ns) = setup("foreign").await;
    let _op = Operator::start(None);
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    // A foreign claim at a member name.
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data-gamma-0"},
        "spec": {"accessModes": ["ReadWriteOncePod"], "storageClassName": "celld-test-hostpath",
                 "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name);
    let foreign = claims.create(&PostParams::default(), &claim).await.unwrap();
    api.create(
        &PostParams::default(),
        &fleet("gamma", "PersistentFleet", 3, &unique_bucket("fc")),
    )
    .await
    .unwrap();
    let message = reason(&api, "gamma", "StorageIdentityConflict").await;
    assert!(message.contains("data-gamma-0"), "{message}");
    assert!(Api::<StatefulSet>::namespaced(client.clone(), &ns.name)
        .get_opt("gamma")
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        claims.get("data-gamma-0").await.unwrap().uid(),
        foreign.uid(),
        "the claim is untouched"
    );

    // A foreign Service at the peers name.
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "delta-peers"},
        "spec": {"clusterIP": "None", "ports": [{"name": "peer", "port": 8081}]}
    }))
    .unwrap();
    let services = Api::<Service>::namespaced(client.clone(), &ns.name);
    let before = services.create(&PostParams::default(), &svc).await.unwrap();
    api.create(
        &PostParams::default(),
        &fleet("delta", "Bucket", 3, &unique_bucket("fs")),
    )
    .await
    .unwrap();
    let message = reason(&api, "delta", "InfrastructureBlocked").await;
    assert!(message.contains("delta-peers"), "{message}");
    assert_eq!(
        services
            .get("delta-peers")
            .await
            .unwrap()
            .resource_version(),
        before.resource_version()
    );

    // A second fleet on the same bucket.
    let bucket = unique_bucket("shared");
    api.create(&PostParams::default(), &fleet("one", "Bucket", 3, &bucket))
        .await
        .unwrap();
    ready(&api, "one", 3).await;
    let reservations = Api::<CelldStorageReservation>::all(client.clone());
    let reservation_name = api
        .get("one")
        .await
        .unwrap()
        .status
        .and_then(|s| s.reservation)
        .expect("status.reservation");
    let reservation_before = reservations.get(&reservation_name).await.unwrap();
    api.create(&PostParams::default(), &fleet("two", "Bucket", 3, &bucket))
        .await
        .unwrap();
    reason(&api, "two", "StorageScopeConflict").await;
    assert!(
        c.kubectl(&["-n", &ns.name, "get", "deployment", "two"])
            .is_err(),
        "nothing is created"
    );
    assert_eq!(
        reservations
            .get(&reservation_name)
            .await
            .unwrap()
            .resource_version(),
        reservation_before.resource_version(),
        "the reservation is unchanged"
    );

    // An owned peers Service that only lacks appProtocol is back-filled in place (the
    // Service watch triggers the reconcile); its identity and addresses are kept.
    let peers_before = services.get("one-peers").await.unwrap();
    services
        .patch(
            "one-peers",
            &PatchParams::default(),
            &Patch::<Value>::Json(
                serde_json::from_value(json!([
                    {"op": "test", "path": "/spec/ports/0/appProtocol", "value": "tcp"},
                    {"op": "remove", "path": "/spec/ports/0/appProtocol"}
                ]))
                .unwrap(),
            ),
        )
        .await
        .unwrap();
    let peers_after = until("appProtocol to be back-filled", 60, &api, "one", || async {
        let s = services.get("one-peers").await.ok()?;
        let p = s
            .spec
            .as_ref()?
            .ports
            .as_ref()?
            .first()?
            .app_protocol
            .clone();
        (p.as_deref() == Some("tcp")).then_some(s)
    })
    .await;
    assert_eq!(peers_after.uid(), peers_before.uid());
    assert_eq!(
        peers_after.spec.as_ref().unwrap().cluster_ip,
        peers_before.spec.as_ref().unwrap().cluster_ip
    );
    let blocked = api
        .get("one")
        .await
        .unwrap()
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Blocked")
        .unwrap();
    assert_eq!(blocked.status, "False", "{blocked:?}");

    // A missing ServiceAccount blocks with its name; creating it lets the fleet provision.
    let mut rho = fleet("rho", "Bucket", 3, &unique_bucket("sa"));
    rho.spec.service_account_name = "celld-rho".into();
    api.create(&PostParams::default(), &rho).await.unwrap();
    let message = reason(&api, "rho", "ServiceAccountMissing").await;
    assert!(message.contains("celld-rho"), "{message}");
    assert!(
        c.kubectl(&["-n", &ns.name, "get", "deployment", "rho"])
            .is_err(),
        "nothing is created"
    );
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "celld-rho"}})).unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    ready(&api, "rho", 3).await;
    cleanup(&client, ns).await;
}

/// Crash drills (docs/design.md "Failpoints"): the operator exits at a failpoint of a Scale and is
/// restarted; the audit log shows exactly one write per effect marker.
#[tokio::test]
async fn scale_drills_issue_each_effect_exactly_once() {
    let _guard = isolated().await;
    let (c, client, ns) = setup("drill").await;
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    {
        let _op = Operator::start(None);
        create_ready(
            &api,
            &fleet("eps", "PersistentFleet", 3, &unique_bucket("dr")),
            3,
        )
        .await;
    }
    // Growth and contraction alternate (6 nodes, one member per node).
    let drills = [
        ("before-intent", 4),
        ("after-intent", 5),
        ("before-effect", 4),
        ("after-effect", 5),
        ("before-complete", 4),
        ("before-effect", 5),
        ("after-effect", 4),
    ];
    for (point, replicas) in drills {
        let mut op = Operator::start(Some(point));
        tokio::time::sleep(Duration::from_secs(2)).await;
        c.kubectl(&[
            "-n",
            &ns.name,
            "scale",
            "celldfleet/eps",
            &format!("--replicas={replicas}"),
        ])
        .unwrap();
        assert_eq!(
            op.exited(Duration::from_secs(60)).await,
            3,
            "{point}: the failpoint exits with code 3"
        );
        drop(op);
        let _op = Operator::start(None);
        ready(&api, "eps", replicas).await;
        let marker = marker_of(c, &ns.name, "statefulset", "eps");
        assert!(marker.ends_with("/replicas"), "{point}: {marker}");
        assert_eq!(
            audit_writes(c, &ns.name, "statefulsets", "eps", Some(&marker)),
            1,
            "{point}: exactly one write for {marker}"
        );
    }
    // Every operator of the drills is stopped: the annotation and the mirror agree.
    verify_journal(
        &ns.name,
        "eps",
        Some(&test_dir().join("celld-operator-e2e/journal")),
    );
    let _op = Operator::start(None); // deletion needs a running operator
    cleanup(&client, ns).await;
}

/// A tmpfs mounted for the life of the value (the test bed runs as root), lazily unmounted.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &std::path::Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .expect("mount runs");
        assert!(
            out.status.success(),
            "mounting a {size} tmpfs at {} failed (the test bed needs root): {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(dir.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// `strace` attached to every thread of a process, failing each of its `pwrite64` calls
/// (sled's writes) with `errno`, as a full or failing disk does; detached when dropped.
struct FailWrites(std::process::Child);

impl FailWrites {
    async fn attach(pid: u32, errno: &str, log: &std::path::Path) -> FailWrites {
        let mut cmd = Command::new("strace");
        cmd.args(["-f", "-qq", "-e", "trace=pwrite64", "-e"])
            .arg(format!("inject=pwrite64:error={errno}"))
            .arg("-o")
            .arg(log);
        // With -f, strace attaches every thread of the process, and follows new ones.
        cmd.arg("-p").arg(pid.to_string());
        let child = cmd
            .spawn()
            .expect("strace is installed by `make deps` (Debian package strace)");
        // Attached once the traced threads show strace as their tracer.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
            if status
                .lines()
                .any(|l| l.starts_with("TracerPid:") && l.split_whitespace().nth(1) != Some("0"))
            {
                break;
            }
            assert!(Instant::now() < deadline, "strace did not attach to {pid}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        FailWrites(child)
    }
}

impl Drop for FailWrites {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The leader's journal mirror on a volume's mount point (as the chart mounts it) whose
/// writes start failing with ENOSPC, a full disk (docs/operations.md "A journal mirror write
/// fails"). The growth's Intent commits to the annotation, the mirror cannot hold it, and
/// sled accepts no write after a failed one: the replica exits with code 4 and issues no
/// workload write. A replica started again (its disk fine) reopens the mirror, backfills it
/// from the annotation and carries the growth out.
#[tokio::test]
async fn a_failed_mirror_disk_stops_effects_until_the_replica_reopens_it() {
    let _guard = isolated().await;
    let (c, client, ns) = setup("mfull").await;
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let sts = Api::<StatefulSet>::namespaced(client.clone(), &ns.name);
    let journal_dir = test_dir().join("celld-operator-e2e/journal");
    let disk = Tmpfs::mount(&journal_dir, "64m");
    let mut op = Operator::start(None);
    create_ready(
        &api,
        &fleet("phi", "PersistentFleet", 3, &unique_bucket("mf")),
        3,
    )
    .await;
    // Created in place on the mount point.
    assert!(journal_dir.join("db").is_file() && journal_dir.join("conf").is_file());
    until("the provision to close", 60, &api, "phi", || async {
        let s = api.get("phi").await.ok()?.status?;
        s.current_operation.is_none().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = celld_operator::journal_store::load(&api.get("phi").await.unwrap())
        .unwrap()
        .document()
        .seq();
    let writes = audit_writes(c, &ns.name, "statefulsets", "phi", None);
    let strace = FailWrites::attach(op.pid(), "ENOSPC", &test_dir().join("strace.log")).await;
    c.kubectl(&["-n", &ns.name, "scale", "celldfleet/phi", "--replicas=4"])
        .unwrap();
    assert_eq!(
        op.exited(Duration::from_secs(60)).await,
        4,
        "the replica exits when its mirror's disk fails; log: {}",
        op.log.display()
    );
    drop(strace);
    let log = std::fs::read_to_string(&op.log).unwrap();
    assert!(
        log.contains("its disk failed") && log.contains("exiting with code 4"),
        "{log}"
    );
    drop(op);
    // The Intent committed; the mirror (reopened here: sled reads its log back) does not
    // hold it; the workload was not written.
    let committed = celld_operator::journal_store::load(&api.get("phi").await.unwrap()).unwrap();
    let intent = committed
        .document()
        .entries()
        .iter()
        .find(|e| e.seq() > before && matches!(e.body(), journal::EntryBody::Intent(_)))
        .map(|e| e.seq())
        .expect("the growth's Intent committed");
    let held = journal::Mirror::open_existing(&journal_dir)
        .unwrap()
        .head(committed.fleet_uid())
        .unwrap()
        .map_or(0, |(seq, _)| seq);
    assert!(
        held < intent,
        "the mirror holds seq {held}, the Intent is {intent}"
    );
    assert_eq!(
        sts.get("phi").await.unwrap().spec.and_then(|s| s.replicas),
        Some(3)
    );
    assert_eq!(
        audit_writes(c, &ns.name, "statefulsets", "phi", None),
        writes,
        "no workload write after an entry the mirror could not hold"
    );
    // A new process reopens the mirror and carries the growth out. It holds only the newest 4
    // entries of a fleet in sled, so the mirror the first process left (format v1, no
    // archive) gets its older entries archived in files on the same volume.
    assert!(!journal_dir.join("archive").exists());
    let mut op = Operator::start_with(|o| o.extra_args.push("--journal-live-entries=4".into()));
    ready(&api, "phi", 4).await;
    until("the growth to close", 60, &api, "phi", || async {
        let s = api.get("phi").await.ok()?.status?;
        s.current_operation.is_none().then_some(())
    })
    .await;
    op.terminate(Duration::from_secs(30)).await;
    drop(op);
    let done = celld_operator::journal_store::load(&api.get("phi").await.unwrap()).unwrap();
    let mirror = journal::Mirror::open_existing(&journal_dir).unwrap();
    assert_eq!(
        mirror.head(done.fleet_uid()).unwrap(),
        Some((done.document().seq(), done.document().head())),
        "the mirror holds the annotation's newest entry again"
    );
    let held = mirror.entries(done.fleet_uid()).unwrap();
    assert_eq!(held.first().map(|e| e.seq()), Some(1));
    assert_eq!(held.len() as u64, done.document().seq());
    drop(mirror);
    let segments = std::fs::read_dir(journal_dir.join("archive").join(done.fleet_uid()))
        .map(|d| d.count())
        .unwrap_or(0);
    assert!(
        segments >= 1,
        "older entries archived on the mirror's volume"
    );
    // `journal verify --source both`: the mirror, archive included, against the annotation.
    verify_journal(&ns.name, "phi", Some(&journal_dir));
    let _op = Operator::start(None); // deletion needs a running operator
    cleanup(&client, ns).await;
    drop(disk);
}

/// Pause while an operation is in Intent cancels it before issue; no workload write.
#[tokio::test]
async fn pause_cancels_an_operation_still_in_intent() {
    let _guard = isolated().await;
    let (c, client, ns) = setup("pause").await;
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    {
        let _op = Operator::start(None);
        create_ready(
            &api,
            &fleet("zeta", "PersistentFleet", 4, &unique_bucket("pz")),
            4,
        )
        .await;
    }
    let writes = audit_writes(c, &ns.name, "statefulsets", "zeta", None);
    let mut op = Operator::start(Some("after-intent"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    // A contraction (scenario 15), killed right after its Intent.
    c.kubectl(&["-n", &ns.name, "scale", "celldfleet/zeta", "--replicas=3"])
        .unwrap();
    assert_eq!(op.exited(Duration::from_secs(60)).await, 3);
    drop(op);
    // The journal's last entry is that contraction's Intent, nothing after it.
    let journal = celld_operator::journal_store::load(&api.get("zeta").await.unwrap()).unwrap();
    let last = journal.document().entries().last().unwrap().clone();
    match last.body() {
        journal::EntryBody::Intent(i) => assert_eq!(
            (i.kind.to_string(), i.from, i.to),
            ("Scale".to_string(), 4, 3),
            "{i:?}"
        ),
        other => panic!("the last entry is {other:?}, not the contraction's Intent"),
    }
    set_paused(&api, "zeta", true).await;
    let running = Operator::start(None);
    let outcome = until("the Scale to be canceled", 60, &api, "zeta", || async {
        let s = api.get("zeta").await.ok()?.status?;
        s.recent_operations
            .first()
            .filter(|o| format!("{:?}", o.kind) == "Scale")
            .map(|o| o.outcome.clone())
    })
    .await;
    assert_eq!(outcome, "CanceledBeforeIssue");
    tokio::time::sleep(Duration::from_secs(3)).await;
    // One workload write while paused: the fence written before the cancel (it moves the
    // resourceVersion so a write decided on an earlier read fails); replicas and marker are
    // as they were.
    assert_eq!(
        audit_writes(c, &ns.name, "statefulsets", "zeta", None),
        writes + 1,
        "no workload write while paused but the fence"
    );
    let sts: StatefulSet = Api::namespaced(client.clone(), &ns.name)
        .get("zeta")
        .await
        .unwrap();
    let fence = sts
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("celld.eric.dev/fence").cloned());
    assert!(
        fence.as_deref().is_some_and(|f| f.ends_with("/fenced")),
        "{fence:?}"
    );
    assert_eq!(sts.spec.and_then(|s| s.replicas), Some(4));
    reason(&api, "zeta", "MaintenancePaused").await;
    // While paused nothing starts: no restart, no upgrade, no drift repair.
    api.patch(
        "zeta",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"maintenance": {"restartToken": "paused-1"}}})),
    )
    .await
    .unwrap();
    c.kubectl(&[
        "-n",
        &ns.name,
        "patch",
        "statefulset",
        "zeta",
        "--type=json",
        "-p",
        r#"[{"op": "replace", "path": "/spec/template/spec/containers/0/readinessProbe/periodSeconds", "value": 9}]"#,
    ])
    .unwrap();
    let hand_edited = audit_writes(c, &ns.name, "statefulsets", "zeta", None);
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        audit_writes(c, &ns.name, "statefulsets", "zeta", None),
        hand_edited,
        "no restart, growth or drift repair while paused"
    );
    let st = api.get("zeta").await.unwrap().status.unwrap();
    assert!(st.current_operation.is_none(), "{:?}", st.current_operation);
    assert_ne!(st.last_restart_token.as_deref(), Some("paused-1"));
    // Unpausing resumes: the contraction, the restart and the repair are planned and complete.
    set_paused(&api, "zeta", false).await;
    until(
        "everything asked while paused to be done",
        180,
        &api,
        "zeta",
        || async {
            let s = api.get("zeta").await.ok()?.status?;
            let sts = Api::<StatefulSet>::namespaced(client.clone(), &ns.name)
                .get("zeta")
                .await
                .ok()?;
            let period = sts
                .spec?
                .template
                .spec?
                .containers
                .first()?
                .readiness_probe
                .clone()?
                .period_seconds;
            (s.current_operation.is_none()
                && s.ready_replicas == Some(3)
                && s.last_restart_token.as_deref() == Some("paused-1")
                && period == Some(2))
            .then_some(())
        },
    )
    .await;

    // Pause after issue does not stop an operation: killed right after its replica write,
    // the operator restarts into a paused fleet and still completes the growth.
    drop(running);
    let mut op = Operator::start(Some("after-effect"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.kubectl(&["-n", &ns.name, "scale", "celldfleet/zeta", "--replicas=4"])
        .unwrap();
    assert_eq!(op.exited(Duration::from_secs(60)).await, 3);
    drop(op);
    set_paused(&api, "zeta", true).await;
    let _op = Operator::start(None);
    let outcome = until(
        "the issued Scale to complete while paused",
        90,
        &api,
        "zeta",
        || async {
            let s = api.get("zeta").await.ok()?.status?;
            if s.current_operation.is_some() || s.ready_replicas != Some(4) {
                return None;
            }
            s.recent_operations
                .first()
                .filter(|o| format!("{:?}", o.kind) == "Scale")
                .map(|o| o.outcome.clone())
        },
    )
    .await;
    assert_eq!(outcome, "Succeeded");
    set_paused(&api, "zeta", false).await;
    cleanup(&client, ns).await;
}

/// The Helm chart's RBAC is enough: the operator authenticated as the chart's
/// ServiceAccount (impersonation) runs a PersistentFleet through growth, contraction,
/// restart and deletion in a listed namespace, and reports NamespaceAccessDenied in an
/// unlisted one.
#[tokio::test]
async fn the_chart_service_account_is_enough_to_run_a_fleet() {
    // Its second operator watches every namespace: no other test runs meanwhile.
    let _guard = exclusive().await;
    let (c, client, ns) = setup("chart").await;
    let other = namespace(&client, "unlisted").await;
    fleet_service_account(&client, &other.name).await;
    let chart = celld_harness::repo_root().join("helm/celld-operator");
    let listed = format!("fleetNamespaces={{{}}}", ns.name);
    c.helm(&[
        "upgrade",
        "--install",
        "celld-operator",
        chart.to_str().unwrap(),
        "--namespace",
        "celld-system",
        "--create-namespace",
        "--set",
        &listed,
        "--set",
        "networkPolicyEnforced=true",
    ])
    .unwrap();
    // A kubeconfig that authenticates as admin and acts as the chart's ServiceAccount.
    let text = std::fs::read_to_string(&c.admin_kubeconfig).unwrap();
    let mut kc: Value = serde_yaml::from_str(&text).unwrap();
    kc["users"][0]["user"]["as"] = json!("system:serviceaccount:celld-system:celld-operator");
    std::fs::create_dir_all(test_dir()).unwrap();
    let kubeconfig = test_dir().join("chart-sa.kubeconfig");
    std::fs::write(&kubeconfig, serde_yaml::to_string(&kc).unwrap()).unwrap();
    // As the chart runs it: --watch-namespaces from fleetNamespaces. A fleet in a namespace
    // it does not list is never read or touched.
    let denied: Api<CelldFleet> = Api::namespaced(client.clone(), &other.name);
    let iota = fleet("iota", "Bucket", 3, &unique_bucket("un"));
    denied.create(&PostParams::default(), &iota).await.unwrap();
    let opts = Operator::options(None, &kubeconfig, "celld-system", "celld-operator-e2e");
    assert!(opts
        .extra_args
        .contains(&format!("--watch-namespaces={}", ns.name)));
    let op = OperatorProcess::start(&opts);

    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let theta = fleet("theta", "PersistentFleet", 3, &unique_bucket("ch"));
    api.create(&PostParams::default(), &theta).await.unwrap();
    ready(&api, "theta", 3).await;
    c.kubectl(&["-n", &ns.name, "scale", "celldfleet/theta", "--replicas=4"])
        .unwrap();
    ready(&api, "theta", 4).await;
    c.kubectl(&["-n", &ns.name, "scale", "celldfleet/theta", "--replicas=3"])
        .unwrap();
    ready(&api, "theta", 3).await;
    let token = json!({"spec": {"maintenance": {"restartToken": "sa-1"}}});
    api.patch("theta", &PatchParams::default(), &Patch::Merge(token))
        .await
        .unwrap();
    until("lastRestartToken sa-1", 120, &api, "theta", || async {
        let s = api.get("theta").await.ok()?.status?;
        (s.last_restart_token.as_deref() == Some("sa-1") && s.current_operation.is_none())
            .then_some(())
    })
    .await;
    // Every workload write was made as the ServiceAccount.
    let text = std::fs::read_to_string(c.work_dir.join("audit/audit.log")).unwrap();
    let users: std::collections::BTreeSet<String> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| {
            e["objectRef"]["namespace"] == ns.name.as_str()
                && e["objectRef"]["resource"] == "statefulsets"
        })
        .filter(|e| matches!(e["verb"].as_str(), Some("create" | "update" | "patch")))
        .map(|e| {
            e["impersonatedUser"]["username"]
                .as_str()
                .unwrap_or("(not impersonated)")
                .to_string()
        })
        .collect();
    assert_eq!(
        users.into_iter().collect::<Vec<_>>(),
        ["system:serviceaccount:celld-system:celld-operator"]
    );
    api.delete("theta", &Default::default()).await.unwrap();
    until("theta to be gone", 120, &api, "theta", || async {
        api.get_opt("theta").await.ok()?.is_none().then_some(())
    })
    .await;

    // Through all of that, the fleet outside --watch-namespaces was left alone.
    let untouched = denied.get("iota").await.unwrap();
    assert!(untouched.status.is_none(), "{:?}", untouched.status);
    assert!(untouched.finalizers().is_empty());
    assert!(!untouched
        .annotations()
        .contains_key("celld.eric.dev/journal"));
    assert_eq!(audit_writes(c, &other.name, "celldfleets", "iota", None), 1);

    // Watching every namespace, a namespace without the Role: NamespaceAccessDenied with
    // what to do.
    drop(op);
    let mut opts = Operator::options(None, &kubeconfig, "celld-system", "celld-operator-e2e");
    opts.extra_args
        .retain(|a| !a.starts_with("--watch-namespaces"));
    let _op = OperatorProcess::start(&opts);
    let message = reason(&denied, "iota", "NamespaceAccessDenied").await;
    assert!(
        message.contains(&other.name) && message.contains("fleetNamespaces"),
        "{message}"
    );
    // The operator cannot act there: its first namespace read (replacement holds on Pods,
    // reconcile step 4) is refused before it adds its finalizer, so the fleet is deleted
    // without it. (Were a finalizer there from an earlier installation, the test removes it.)
    assert!(
        !denied
            .get("iota")
            .await
            .unwrap()
            .finalizers()
            .iter()
            .any(|f| f == celld_operator::api::keys::LIFECYCLE_FINALIZER),
        "no finalizer is added to a fleet the operator cannot act for"
    );
    let release = json!({"metadata": {"finalizers": null}});
    denied.delete("iota", &Default::default()).await.unwrap();
    match denied
        .patch("iota", &PatchParams::default(), &Patch::Merge(release))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => panic!("releasing iota: {e}"),
    }
    cleanup(&client, other).await;
    cleanup(&client, ns).await;
}

/// Ordered Bucket fleets: the zone gate pins ordinal n to zones[n mod 3]; contraction
/// removes exactly the highest ordinal.
#[tokio::test]
async fn ordered_bucket_pins_zones_and_removes_the_highest_ordinal() {
    let _guard = isolated().await;
    let (_c, client, ns) = setup("ord").await;
    let _op = Operator::start(None);
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let mut f = fleet("kappa", "Bucket", 3, &unique_bucket("ord"));
    f.spec.bucket_workload = celld_operator::api::BucketWorkload::Ordered;
    api.create(&PostParams::default(), &f).await.unwrap();
    ready(&api, "kappa", 3).await;
    assert_rendered(&client, &ns.name, "kappa").await;
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), &ns.name);
    let mut uids = Vec::new();
    for (i, zone) in ["us-east-1a", "us-east-1b", "us-east-1c"]
        .iter()
        .enumerate()
    {
        let pod = pods.get(&format!("kappa-{i}")).await.unwrap();
        let spec = pod.spec.clone().unwrap();
        assert_eq!(
            spec.node_selector.unwrap()["topology.kubernetes.io/zone"],
            *zone
        );
        assert!(
            spec.scheduling_gates.unwrap_or_default().is_empty(),
            "the gate is released"
        );
        uids.push(pod.uid());
    }
    // Contraction needs replicas ≥ azCount: grow to 4 first, then remove the highest ordinal.
    api.patch(
        "kappa",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 4}})),
    )
    .await
    .unwrap();
    ready(&api, "kappa", 4).await;
    let fourth = pods.get("kappa-3").await.unwrap();
    assert_eq!(
        fourth.spec.unwrap().node_selector.unwrap()["topology.kubernetes.io/zone"],
        "us-east-1a"
    );
    api.patch(
        "kappa",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 3}})),
    )
    .await
    .unwrap();
    ready(&api, "kappa", 3).await;
    assert!(
        pods.get_opt("kappa-3").await.unwrap().is_none(),
        "the highest ordinal is removed"
    );
    for (i, uid) in uids.iter().enumerate() {
        assert_eq!(
            &pods.get(&format!("kappa-{i}")).await.unwrap().uid(),
            uid,
            "kappa-{i} is untouched"
        );
    }
    cleanup(&client, ns).await;
}

/// Two replicas (docs/design.md "Leader Lease"): only the Lease holder writes; the holder
/// dies right after issuing an Upgrade's template write (before recording it), the standby
/// takes the Lease, finds the effect marker in the world, records it as replayed and
/// completes the operation without writing again.
#[tokio::test]
async fn a_standby_resumes_the_leaders_operation_without_a_second_write() {
    let _guard = isolated().await;
    let (c, client, ns) = setup("ha").await;
    let audit = audit_from_now();
    let admin = c.admin_kubeconfig.clone();
    let _ = c.kubectl(&["create", "namespace", "celld-e2e-ha"]);
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    // Replicas of one install each serve their own endpoints; these serve none but the
    // standby's health endpoint below.
    let replica = |fault: Option<&str>, identity: &str| {
        let mut opts = Operator::options(fault, &admin, "celld-e2e-ha", identity);
        opts.metrics_addr = None;
        OperatorProcess::start(&opts)
    };
    let mut a = replica(Some("after-effect:2"), "replica-a");
    api.create(
        &PostParams::default(),
        &fleet("lam", "PersistentFleet", 3, &unique_bucket("ha")),
    )
    .await
    .unwrap();
    ready(&api, "lam", 3).await; // Provision's create was the first after-effect
    let mut b = replica(None, "replica-b");
    let upgrade = json!({"spec": {"runtimeImage": image(2)}});
    api.patch("lam", &PatchParams::default(), &Patch::Merge(upgrade))
        .await
        .unwrap();
    assert_eq!(
        a.exited(Duration::from_secs(60)).await,
        3,
        "replica-a dies after the template write"
    );
    // Everything the API server accepted while replica-a held the Lease.
    let while_a_led = audit.events().unwrap();
    until(
        "the upgrade to complete under replica-b",
        120,
        &api,
        "lam",
        || async {
            let s = api.get("lam").await.ok()?.status?;
            let done = s.current_operation.is_none()
                && s.recent_operations
                    .first()
                    .is_some_and(|o| format!("{:?}", o.kind) == "Upgrade");
            done.then_some(())
        },
    )
    .await;
    // While replica-a held the Lease, the standby wrote nothing at all (fleet, workload,
    // Lease, Events: every request carries its identity in the User-Agent).
    let by_b = |events: Vec<AuditEvent>| -> Vec<AuditEvent> {
        events
            .into_iter()
            .filter(|e| e.succeeded() && e.is_write() && e.user_agent.contains("(replica-b)"))
            .collect()
    };
    let before: Vec<String> = by_b(while_a_led)
        .iter()
        .map(|e| format!("{} {}", e.verb, e.request_uri))
        .collect();
    assert!(
        before.is_empty(),
        "the standby wrote while the leader lived: {before:?}"
    );
    assert!(
        by_b(audit.events().unwrap())
            .iter()
            .any(|e| e.namespace.as_deref() == Some(ns.name.as_str())),
        "the standby's own writes are visible in the audit log once it leads"
    );
    let marker = marker_of(c, &ns.name, "statefulset", "lam");
    assert!(marker.ends_with("/template"), "{marker}");
    assert_eq!(
        audit_writes(c, &ns.name, "statefulsets", "lam", Some(&marker)),
        1,
        "one template write"
    );
    let journal = celld_operator::journal_store::load(&api.get("lam").await.unwrap()).unwrap();
    let op = marker.split('/').next().unwrap().to_string();
    let entries: Vec<_> = journal
        .entries()
        .iter()
        .filter(|e| e.op().to_string() == op)
        .collect();
    let intent_by = entries[0].leader().identity.clone();
    let issued = entries
        .iter()
        .find(|e| format!("{:?}", e.entry_type()) == "Issued")
        .unwrap();
    assert_eq!(intent_by, "replica-a");
    assert_eq!(
        issued.leader().identity,
        "replica-b",
        "the standby recorded the effect"
    );
    assert!(
        journal::audit::entry_detail(issued).contains("replayed"),
        "{}",
        journal::audit::entry_detail(issued)
    );
    // Graceful stop (docs/design.md "Leader Lease"): a standby exits 0 at once; the leader lets
    // running reconciles reach a boundary, releases the Lease (holder cleared before it exits) and
    // exits 0.
    let health = free_loopback_addr();
    let mut opts = Operator::options(None, &admin, "celld-e2e-ha", "replica-c");
    opts.metrics_addr = None;
    opts.health_addr = Some(health.clone());
    let mut standby = OperatorProcess::start(&opts);
    let probe = |path: &'static str| {
        let health = health.clone();
        async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut sock = tokio::net::TcpStream::connect(&health).await.ok()?;
            sock.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
                .await
                .ok()?;
            let mut out = String::new();
            sock.read_to_string(&mut out).await.ok()?;
            out.lines().next().map(str::to_string)
        }
    };
    until("the standby to be ready", 30, &api, "lam", || async {
        probe("/readyz").await.filter(|l| l.contains("200"))
    })
    .await;
    assert!(probe("/livez").await.unwrap_or_default().contains("200"));
    assert_eq!(
        standby.terminate(Duration::from_secs(15)).await,
        0,
        "standby"
    );
    drop(standby);
    assert_eq!(b.terminate(Duration::from_secs(20)).await, 0, "leader");
    let holder = c
        .kubectl(&[
            "-n",
            "celld-e2e-ha",
            "get",
            "lease",
            &lease_name(),
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ])
        .unwrap();
    assert!(
        holder.trim().is_empty(),
        "the Lease was released: holder {holder:?}"
    );
    drop(b);
    let _c = replica(None, "replica-c");
    cleanup(&client, ns).await;
}

/// Delete requests for claims of `ns` recorded in the audit log, per claim name (any outcome).
fn claim_deletes(c: &Cluster, ns: &str) -> std::collections::BTreeMap<String, usize> {
    let text = std::fs::read_to_string(c.work_dir.join("audit/audit.log")).unwrap_or_default();
    let mut out = std::collections::BTreeMap::new();
    for e in text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        if e["stage"] == "ResponseComplete"
            && e["verb"] == "delete"
            && e["objectRef"]["resource"] == "persistentvolumeclaims"
            && e["objectRef"]["namespace"] == ns
        {
            *out.entry(e["objectRef"]["name"].as_str().unwrap_or("").to_string())
                .or_default() += 1;
        }
    }
    out
}

/// Crash drills for the other journaled kinds: a rolling Restart killed at each failpoint,
/// and a PersistentFleet Delete killed around its claim deletes, each resume and issue every
/// effect exactly once.
#[tokio::test]
async fn restart_and_delete_drills_issue_each_effect_exactly_once() {
    let _guard = isolated().await;
    let (c, client, ns) = setup("drill2").await;
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    {
        let _op = Operator::start(None);
        let f = fleet("mu", "PersistentFleet", 3, &unique_bucket("d2"));
        api.create(&PostParams::default(), &f).await.unwrap();
        ready(&api, "mu", 3).await;
    }
    for (i, point) in [
        "before-intent",
        "after-intent",
        "before-effect",
        "after-effect",
        "before-complete",
    ]
    .iter()
    .enumerate()
    {
        let token = format!("drill-{i}");
        let mut op = Operator::start(Some(point));
        tokio::time::sleep(Duration::from_secs(2)).await;
        let patch = json!({"spec": {"maintenance": {"restartToken": token}}});
        api.patch("mu", &PatchParams::default(), &Patch::Merge(patch))
            .await
            .unwrap();
        assert_eq!(op.exited(Duration::from_secs(60)).await, 3, "{point}");
        drop(op);
        let _op = Operator::start(None);
        until(
            &format!("token {token} applied after a kill at {point}"),
            120,
            &api,
            "mu",
            || async {
                let s = api.get("mu").await.ok()?.status?;
                (s.last_restart_token.as_deref() == Some(token.as_str())
                    && s.current_operation.is_none())
                .then_some(())
            },
        )
        .await;
        let marker = marker_of(c, &ns.name, "statefulset", "mu");
        assert!(marker.ends_with("/template"), "{point}: {marker}");
        assert_eq!(
            audit_writes(c, &ns.name, "statefulsets", "mu", Some(&marker)),
            1,
            "{point}: one template write"
        );
    }
    // Delete: killed right after the first claim delete, then right before the next one.
    let mut op = Operator::start(Some("after-claim-delete"));
    api.delete("mu", &Default::default()).await.unwrap();
    assert_eq!(
        op.exited(Duration::from_secs(120)).await,
        3,
        "after-claim-delete"
    );
    drop(op);
    let mut op = Operator::start(Some("before-claim-delete"));
    assert_eq!(
        op.exited(Duration::from_secs(120)).await,
        3,
        "before-claim-delete"
    );
    drop(op);
    let _op = Operator::start(None);
    until("mu to be deleted", 120, &api, "mu", || async {
        api.get_opt("mu").await.ok()?.is_none().then_some(())
    })
    .await;
    let deletes = claim_deletes(c, &ns.name);
    assert_eq!(deletes.len(), 3, "every claim deleted: {deletes:?}");
    assert!(
        deletes.values().all(|n| *n == 1),
        "each claim deleted exactly once: {deletes:?}"
    );
    assert!(
        audit_writes(c, &ns.name, "statefulsets", "mu", None) > 0,
        "the drills wrote the workload"
    );
    cleanup(&client, ns).await;
}

/// An annotation restored from an older copy (docs/journal.md "Replay"): the mirror is ahead, the
/// operator reports JournalRollback, records the effect it finds on the workload as Recovered
/// (never reissued) and goes on planning from there.
#[tokio::test]
async fn a_rolled_back_journal_is_reported_and_its_missing_effect_recovered_not_reissued() {
    let _guard = isolated().await;
    let (c, client, ns) = setup("rollback").await;
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let key = celld_operator::api::keys::JOURNAL_ANNOTATION;
    let old_copy;
    let grow_marker;
    {
        let _op = Operator::start(None);
        create_ready(
            &api,
            &fleet("nu", "PersistentFleet", 3, &unique_bucket("rb")),
            3,
        )
        .await;
        old_copy = api.get("nu").await.unwrap().annotations()[key].clone();
        c.kubectl(&["-n", &ns.name, "scale", "celldfleet/nu", "--replicas=4"])
            .unwrap();
        ready(&api, "nu", 4).await;
        grow_marker = marker_of(c, &ns.name, "statefulset", "nu");
    }
    // A backup restore puts the older journal back.
    let restore = json!({"metadata": {"annotations": {key: old_copy}}});
    api.patch("nu", &PatchParams::default(), &Patch::Merge(restore))
        .await
        .unwrap();
    let _op = Operator::start(None);
    until_event(
        "a JournalRollback event",
        60,
        &api,
        "nu",
        &client,
        &ns.name,
        |e| e.reason.as_deref() == Some("JournalRollback"),
    )
    .await;
    let recovered_op = grow_marker.split('/').next().unwrap().to_string();
    until(
        "the workload's effect recorded as Recovered",
        60,
        &api,
        "nu",
        || async {
            let j = celld_operator::journal_store::load(&api.get("nu").await.ok()?).ok()?;
            j.entries()
                .iter()
                .any(|e| {
                    e.op().to_string() == recovered_op
                        && format!("{:?}", e.entry_type()) == "Recovered"
                })
                .then_some(())
        },
    )
    .await;
    // Planning goes on from the recovered predecessor: contraction 4→3 works.
    c.kubectl(&["-n", &ns.name, "scale", "celldfleet/nu", "--replicas=3"])
        .unwrap();
    ready(&api, "nu", 3).await;
    assert_eq!(
        audit_writes(c, &ns.name, "statefulsets", "nu", Some(&grow_marker)),
        1,
        "never reissued"
    );
    cleanup(&client, ns).await;
}

/// Without `--network-policy-enforced` a fleet reports IsolationUnverified and nothing is
/// created, not even the reservation (docs/design.md "Reconcile order", step 8).
#[tokio::test]
async fn without_the_network_policy_attestation_nothing_is_provisioned() {
    let _guard = isolated().await;
    let (c, client, ns) = setup("iso").await;
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let bucket = unique_bucket("iso");
    {
        let _op = Operator::start_with(|o| o.without_network_policy_attestation = true);
        api.create(
            &PostParams::default(),
            &fleet("iota", "PersistentFleet", 3, &bucket),
        )
        .await
        .unwrap();
        let message = reason(&api, "iota", "IsolationUnverified").await;
        assert!(message.contains("--network-policy-enforced"), "{message}");
        // A few more reconciles, then nothing of the fleet's may exist.
        tokio::time::sleep(Duration::from_secs(3)).await;
        for kind in [
            "statefulset",
            "service",
            "networkpolicy",
            "poddisruptionbudget",
            "pvc",
        ] {
            let out = c
                .kubectl(&["-n", &ns.name, "get", kind, "-o", "name"])
                .unwrap();
            assert!(out.trim().is_empty(), "{kind}: {out}");
        }
        let reservations = c
            .kubectl(&[
                "get",
                "celldstoragereservations",
                "-o",
                "jsonpath={.items[*].spec.bucket}",
            ])
            .unwrap();
        assert!(
            !reservations.contains(&bucket),
            "no reservation: {reservations}"
        );
        let st = api.get("iota").await.unwrap().status.unwrap();
        assert!(st.current_operation.is_none() && st.recent_operations.is_empty());
    }
    // With the attestation the same fleet provisions.
    let _op = Operator::start(None);
    ready(&api, "iota", 3).await;
    cleanup(&client, ns).await;
}

/// Owned prerequisites that a person changes or deletes are put back (docs/design.md "Reads
/// of a fresh pass"): a pass that finds them in the namespace's store as rendered sends no
/// request for them, so this proves that one that finds them changed or missing still
/// decides from a fresh read and writes: the NetworkPolicy's rules are restored, the deleted
/// PDB is created again.
#[tokio::test]
async fn owned_prerequisites_changed_or_deleted_by_hand_are_restored() {
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let _guard = isolated().await;
    let (_c, client, ns) = setup("prq").await;
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let bucket = unique_bucket("prq");
    let _op = Operator::start(None);
    create_ready(&api, &fleet("rho", "PersistentFleet", 3, &bucket), 3).await;
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns.name);
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns.name);
    let rendered = policies.get("rho").await.unwrap();
    let rendered_ingress = rendered.spec.as_ref().and_then(|s| s.ingress.clone());
    assert!(
        rendered_ingress.as_ref().is_some_and(|i| !i.is_empty()),
        "the rendered NetworkPolicy has ingress rules: {rendered_ingress:?}"
    );
    let old_budget = budgets.get("rho").await.unwrap().uid();
    policies
        .patch(
            "rho",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ingress": []}})),
        )
        .await
        .unwrap();
    budgets.delete("rho", &Default::default()).await.unwrap();
    until(
        "the NetworkPolicy's rules restored",
        60,
        &api,
        "rho",
        || async {
            let live = policies.get("rho").await.ok()?;
            (live.spec.as_ref().and_then(|s| s.ingress.clone()) == rendered_ingress).then_some(())
        },
    )
    .await;
    until(
        "the PodDisruptionBudget created again",
        60,
        &api,
        "rho",
        || async {
            let live = budgets.get_opt("rho").await.ok()??;
            (live.uid() != old_budget && live.metadata.deletion_timestamp.is_none()).then_some(())
        },
    )
    .await;
    ready(&api, "rho", 3).await;
    cleanup(&client, ns).await;
}

/// An operation that cannot finish turns Stalled at its deadline (condition, Warning Event,
/// gauge) and is still driven; `journal abandon` frees the fleet, and the next plan starts from
/// observation (docs/design.md "Deadlines, Stalled and abandon"). The deadline is shortened
/// with the test-only `--operation-deadline`.
#[tokio::test]
async fn an_operation_that_cannot_finish_stalls_and_abandon_frees_the_fleet() {
    let _guard = isolated().await;
    let (c, client, ns) = setup("stall").await;
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let _op = Operator::start_with(|o| o.extra_args.push("--operation-deadline=25s".into()));
    create_ready(
        &api,
        &fleet("sigma", "PersistentFleet", 3, &unique_bucket("st")),
        3,
    )
    .await;
    // An image the kubelet cannot pull: the highest member never turns Ready again.
    let missing = format!("celld.test/missing@sha256:{}", "e".repeat(64));
    api.patch(
        "sigma",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"runtimeImage": missing}})),
    )
    .await
    .unwrap();
    let op_id = until("the Upgrade to stall", 120, &api, "sigma", || async {
        let s = api.get("sigma").await.ok()?.status?;
        let cur = s.current_operation?;
        let stalled = s
            .conditions
            .iter()
            .any(|c| c.type_ == "OperationStalled" && c.status == "True");
        (format!("{:?}", cur.kind) == "Upgrade" && stalled).then_some(cur.id)
    })
    .await;
    // Sent after the entry is committed (src/events.rs): waited for, not read once.
    until_event(
        "a Warning OperationStalled event naming the operation",
        60,
        &api,
        "sigma",
        &client,
        &ns.name,
        |e| {
            e.reason.as_deref() == Some("OperationStalled")
                && e.type_.as_deref() == Some("Warning")
                && e.note.as_deref().is_some_and(|n| n.contains(&op_id))
        },
    )
    .await;
    let text = scrape().await;
    let labels = format!("namespace=\"{}\",fleet=\"sigma\"", ns.name);
    assert!(
        text.contains(&format!("celld_journal_stalled_operations{{{labels}}} 1")),
        "{text}"
    );
    // `kubectl describe` shows the current operation and its journal events.
    let described = c
        .kubectl(&["-n", &ns.name, "describe", "celldfleet", "sigma"])
        .unwrap();
    for want in [
        "Current Operation",
        op_id.as_str(),
        "Upgrade",
        "Recent Operations",
        "Provision",
        "OperationStalled",
        "OperationIssued",
    ] {
        assert!(
            described.contains(want),
            "describe lacks {want}:\n{described}"
        );
    }
    // Still open and still driven: nothing else is planned meanwhile.
    let target = format!("{}/sigma", ns.name);
    let out = Command::new(env!("CARGO_BIN_EXE_celld-operator"))
        .env("KUBECONFIG", &c.admin_kubeconfig)
        .args(["journal", "abandon", &target, &op_id])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "journal abandon: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let outcome = until("the Upgrade to be abandoned", 60, &api, "sigma", || async {
        let s = api.get("sigma").await.ok()?.status?;
        if s.current_operation.is_some() {
            return None;
        }
        s.recent_operations
            .iter()
            .find(|o| o.id == op_id)
            .map(|o| o.outcome.clone())
    })
    .await;
    assert_eq!(outcome, "Abandoned");
    assert!(
        c.kubectl(&[
            "-n",
            &ns.name,
            "get",
            "celldfleet",
            "sigma",
            "-o",
            "jsonpath={.metadata.annotations.celld\\.eric\\.dev/journal-command}"
        ])
        .unwrap()
        .trim()
        .is_empty(),
        "the command annotation is consumed"
    );
    // The fleet is free: a corrective image is planned at once and rolls the fleet back.
    api.patch(
        "sigma",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"runtimeImage": image(1)}})),
    )
    .await
    .unwrap();
    ready(&api, "sigma", 3).await;
    // Superseded (docs/design.md "Restart, Upgrade and TemplateUpdate (rolling)"): a second
    // bad Upgrade waits for a member that never turns Ready; asking for a good image closes it
    // (Abandoned by the operator) at once.
    api.patch(
        "sigma",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"runtimeImage": missing}})),
    )
    .await
    .unwrap();
    let stuck = until(
        "the second bad Upgrade to be issued",
        60,
        &api,
        "sigma",
        || async {
            let cur = api.get("sigma").await.ok()?.status?.current_operation?;
            (format!("{:?}", cur.kind) == "Upgrade" && format!("{:?}", cur.phase) == "Issued")
                .then_some(cur.id)
        },
    )
    .await;
    api.patch(
        "sigma",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"runtimeImage": image(3)}})),
    )
    .await
    .unwrap();
    until("the good image to roll out", 120, &api, "sigma", || async {
        let s = api.get("sigma").await.ok()?.status?;
        let sts = Api::<StatefulSet>::namespaced(client.clone(), &ns.name)
            .get("sigma")
            .await
            .ok()?;
        let live = sts.spec?.template.spec?.containers.first()?.image.clone()?;
        (s.current_operation.is_none() && s.ready_replicas == Some(3) && live == image(3))
            .then_some(())
    })
    .await;
    let journal = celld_operator::journal_store::load(&api.get("sigma").await.unwrap()).unwrap();
    let closing = journal
        .entries()
        .iter()
        .rfind(|e| e.op().to_string() == stuck)
        .map(journal::audit::entry_detail)
        .unwrap();
    assert!(
        closing.contains("Superseded") && closing.contains("operator"),
        "{closing}"
    );
    let history = api
        .get("sigma")
        .await
        .unwrap()
        .status
        .unwrap()
        .recent_operations;
    assert!(
        history
            .first()
            .is_some_and(|o| format!("{:?}", o.kind) == "Upgrade" && o.outcome == "Succeeded"),
        "{history:?}"
    );
    verify_journal(&ns.name, "sigma", None);
    cleanup(&client, ns).await;
}

/// The real HPA controller writes `/scale` (min/max clamping, no metrics needed); the operator
/// grows and contracts through the same journaled path and never writes `spec.replicas`
/// itself.
#[tokio::test]
async fn the_hpa_drives_scaling_through_scale_and_is_never_fought() {
    use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
    let _guard = isolated().await;
    let (c, client, ns) = setup("hpa").await;
    let _op = Operator::start(None);
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    create_ready(
        &api,
        &fleet("eta", "PersistentFleet", 3, &unique_bucket("hpa")),
        3,
    )
    .await;
    let hpas = Api::<HorizontalPodAutoscaler>::namespaced(client.clone(), &ns.name);
    let hpa = |min: i32, max: i32| -> HorizontalPodAutoscaler {
        serde_json::from_value(json!({
            "metadata": {"name": "eta"},
            "spec": {"scaleTargetRef": {"apiVersion": "celld.eric.dev/v1alpha1", "kind": "CelldFleet", "name": "eta"},
                     "minReplicas": min, "maxReplicas": max}
        }))
        .unwrap()
    };
    hpas.create(&PostParams::default(), &hpa(4, 4))
        .await
        .unwrap();
    until(
        "the HPA to raise spec.replicas to 4",
        90,
        &api,
        "eta",
        || async { (api.get("eta").await.ok()?.spec.replicas == 4).then_some(()) },
    )
    .await;
    ready(&api, "eta", 4).await;
    hpas.patch(
        "eta",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"minReplicas": 3, "maxReplicas": 3}})),
    )
    .await
    .unwrap();
    until(
        "the HPA to lower spec.replicas to 3",
        90,
        &api,
        "eta",
        || async { (api.get("eta").await.ok()?.spec.replicas == 3).then_some(()) },
    )
    .await;
    ready(&api, "eta", 3).await;
    let history = api
        .get("eta")
        .await
        .unwrap()
        .status
        .unwrap()
        .recent_operations;
    let scales: Vec<_> = history
        .iter()
        .filter(|o| format!("{:?}", o.kind) == "Scale")
        .map(|o| o.outcome.clone())
        .collect();
    assert_eq!(
        scales,
        vec!["Succeeded".to_string(), "Succeeded".to_string()],
        "one growth 3→4 and one contraction 4→3: {history:?}"
    );
    // Who wrote the fleet: `/scale` only by the HPA controller; no other write carries a spec.
    let text = std::fs::read_to_string(c.work_dir.join("audit/audit.log")).unwrap();
    let writes: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| {
            e["stage"] == "ResponseComplete"
                && e["objectRef"]["namespace"] == ns.name.as_str()
                && e["objectRef"]["resource"] == "celldfleets"
                && matches!(e["verb"].as_str(), Some("update" | "patch"))
                && e["responseStatus"]["code"]
                    .as_i64()
                    .is_some_and(|c| c < 300)
        })
        .collect();
    let scale_writers: std::collections::BTreeSet<String> = writes
        .iter()
        .filter(|e| e["objectRef"]["subresource"] == "scale")
        .map(|e| e["user"]["username"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(
        scale_writers.into_iter().collect::<Vec<_>>(),
        vec!["system:serviceaccount:kube-system:horizontal-pod-autoscaler".to_string()]
    );
    let spec_writes: Vec<&Value> = writes
        .iter()
        .filter(|e| e["objectRef"]["subresource"].is_null())
        .filter(|e| !e["requestObject"]["spec"].is_null())
        .collect();
    assert!(spec_writes.is_empty(), "{spec_writes:#?}");
    assert!(
        writes
            .iter()
            .any(|e| e["objectRef"]["subresource"].is_null()),
        "the operator's journal appends are in the audit log (the filter sees its writes)"
    );
    // The HPA sees the fleet settle at its bound (status.replicas through `/scale`).
    until("the HPA to observe 3 replicas", 60, &api, "eta", || async {
        let st = hpas.get("eta").await.ok()?.status?;
        (st.current_replicas == Some(3) && st.desired_replicas == 3).then_some(())
    })
    .await;
    hpas.delete("eta", &Default::default()).await.unwrap();
    cleanup(&client, ns).await;
}

/// The kind and outcome of the operation that wrote effect `marker` (`<op>/<effect>`), once
/// it is among the recent operations and nothing is open (waits up to 60 s, then reports
/// what it found): never an earlier operation of the same kind (status is written at the end
/// of a reconcile, after the workload write the caller may have seen).
async fn outcome_of(api: &Api<CelldFleet>, name: &str, marker: &str) -> (String, String) {
    let op = marker.split('/').next().unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = api.get(name).await.unwrap().status.unwrap_or_default();
        let found = s
            .recent_operations
            .iter()
            .find(|o| o.id == op)
            .map(|o| (format!("{:?}", o.kind), o.outcome.clone()));
        match found {
            Some(found) if s.current_operation.is_none() => return found,
            _ if Instant::now() > deadline => {
                return (format!("operation {op} not finished"), String::new())
            }
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Kills at every failpoint of Provision, Upgrade and TemplateUpdate (drift repair), and at a
/// Bucket Delete's decision points, workload and prerequisite effects and completion
/// (docs/design.md "Failpoints"): each resumed operation completes and every effect is issued
/// exactly once.
#[tokio::test]
async fn provision_upgrade_drift_and_delete_drills_issue_each_effect_exactly_once() {
    let _guard = isolated().await;
    let (c, client, ns) = setup("drill3").await;
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let points = [
        "before-intent",
        "after-intent",
        "before-effect",
        "after-effect",
        "before-complete",
    ];
    let kill = |point: &'static str| async move {
        let op = Operator::start(Some(point));
        tokio::time::sleep(Duration::from_secs(2)).await;
        op
    };
    // Provision: one Bucket fleet per failpoint; the Deployment is created exactly once.
    for (i, point) in points.iter().enumerate() {
        let name = format!("pv{i}");
        let mut op = kill(point).await;
        api.create(
            &PostParams::default(),
            &fleet(&name, "Bucket", 3, &unique_bucket("pv")),
        )
        .await
        .unwrap();
        assert_eq!(
            op.exited(Duration::from_secs(60)).await,
            3,
            "Provision {point}"
        );
        drop(op);
        let _op = Operator::start(None);
        ready(&api, &name, 3).await;
        let marker = marker_of(c, &ns.name, "deployment", &name);
        assert!(marker.ends_with("/create"), "Provision {point}: {marker}");
        assert_eq!(
            audit_writes(c, &ns.name, "deployments", &name, None),
            1,
            "Provision {point}: the Deployment is written once, by its create"
        );
        assert_eq!(
            outcome_of(&api, &name, &marker).await,
            ("Provision".into(), "Succeeded".into()),
            "Provision {point}"
        );
    }
    // Upgrade: a new runtime image per failpoint; one template write each.
    {
        let _op = Operator::start(None);
        create_ready(
            &api,
            &fleet("up", "PersistentFleet", 3, &unique_bucket("up")),
            3,
        )
        .await;
    }
    let up_claims = claim_uids_of(&client, &ns.name, "up", 3).await;
    for (i, point) in points.iter().enumerate() {
        let img = image(2 + i as u8);
        let mut op = kill(point).await;
        api.patch(
            "up",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"runtimeImage": img}})),
        )
        .await
        .unwrap();
        assert_eq!(
            op.exited(Duration::from_secs(60)).await,
            3,
            "Upgrade {point}"
        );
        drop(op);
        let _op = Operator::start(None);
        until(
            &format!("Upgrade to {img} after a kill at {point}"),
            120,
            &api,
            "up",
            || async {
                let sts = Api::<StatefulSet>::namespaced(client.clone(), &ns.name)
                    .get("up")
                    .await
                    .ok()?;
                let live = sts.spec?.template.spec?.containers.first()?.image.clone()?;
                (live == img).then_some(())
            },
        )
        .await;
        ready(&api, "up", 3).await;
        let marker = marker_of(c, &ns.name, "statefulset", "up");
        assert!(marker.ends_with("/template"), "Upgrade {point}: {marker}");
        assert_eq!(
            audit_writes(c, &ns.name, "statefulsets", "up", Some(&marker)),
            1,
            "Upgrade {point}: one template write"
        );
        assert_eq!(
            outcome_of(&api, "up", &marker).await,
            ("Upgrade".into(), "Succeeded".into()),
            "Upgrade {point}"
        );
    }
    assert_eq!(
        claim_uids_of(&client, &ns.name, "up", 3).await,
        up_claims,
        "upgrades roll on the retained disks"
    );
    // TemplateUpdate: a hand edit of the template is drift, repaired by one guarded write.
    for (i, point) in points.iter().enumerate() {
        let mut op = kill(point).await;
        c.kubectl(&[
            "-n",
            &ns.name,
            "patch",
            "statefulset",
            "up",
            "--type=json",
            "-p",
            &json!([{"op": "replace",
                     "path": "/spec/template/spec/containers/0/readinessProbe/periodSeconds",
                     "value": 7 + i}])
            .to_string(),
        ])
        .unwrap();
        assert_eq!(
            op.exited(Duration::from_secs(60)).await,
            3,
            "TemplateUpdate {point}"
        );
        drop(op);
        let _op = Operator::start(None);
        until(
            &format!("drift repaired after a kill at {point}"),
            120,
            &api,
            "up",
            || async {
                let sts = Api::<StatefulSet>::namespaced(client.clone(), &ns.name)
                    .get("up")
                    .await
                    .ok()?;
                let c = sts.spec?.template.spec?.containers.first()?.clone();
                (c.readiness_probe?.period_seconds == Some(2)).then_some(())
            },
        )
        .await;
        ready(&api, "up", 3).await;
        let marker = marker_of(c, &ns.name, "statefulset", "up");
        assert!(
            marker.ends_with("/template"),
            "TemplateUpdate {point}: {marker}"
        );
        assert_eq!(
            audit_writes(c, &ns.name, "statefulsets", "up", Some(&marker)),
            1,
            "TemplateUpdate {point}: one template write ({marker})"
        );
        assert_eq!(
            outcome_of(&api, "up", &marker).await,
            ("TemplateUpdate".into(), "Succeeded".into()),
            "TemplateUpdate {point}"
        );
    }
    // Delete: the workload effect (first), the prerequisites effect (second), completion.
    // Two more Bucket fleets for the Delete's own decision points.
    {
        let _op = Operator::start(None);
        for name in ["pv5", "pv6"] {
            api.create(
                &PostParams::default(),
                &fleet(name, "Bucket", 3, &unique_bucket("pv")),
            )
            .await
            .unwrap();
        }
        ready(&api, "pv5", 3).await;
        ready(&api, "pv6", 3).await;
    }
    let deletes = [
        ("pv5", "before-intent"),
        ("pv6", "after-intent"),
        ("pv0", "before-effect"),
        ("pv1", "after-effect"),
        ("pv2", "before-effect:2"),
        ("pv3", "after-effect:2"),
        ("pv4", "before-complete"),
    ];
    for (name, point) in deletes {
        let mut op = Operator::start(Some(point));
        tokio::time::sleep(Duration::from_secs(2)).await;
        api.delete(name, &Default::default()).await.unwrap();
        assert_eq!(
            op.exited(Duration::from_secs(90)).await,
            3,
            "Delete {point}"
        );
        drop(op);
        let _op = Operator::start(None);
        until(
            &format!("{name} to be deleted after a kill at {point}"),
            120,
            &api,
            name,
            || async { api.get_opt(name).await.ok()?.is_none().then_some(()) },
        )
        .await;
        assert_eq!(
            audit_deletes(c, &ns.name, "deployments", name),
            1,
            "Delete {point}: the Deployment is deleted once"
        );
        for svc in [name.to_string(), format!("{name}-peers")] {
            assert_eq!(
                audit_deletes(c, &ns.name, "services", &svc),
                1,
                "Delete {point}: Service {svc} is deleted once"
            );
        }
        assert_eq!(
            audit_deletes(c, &ns.name, "networkpolicies", name),
            1,
            "Delete {point}"
        );
        assert_eq!(
            audit_deletes(c, &ns.name, "poddisruptionbudgets", name),
            1,
            "Delete {point}"
        );
    }
    verify_journal(&ns.name, "up", None);
    let _op = Operator::start(None);
    cleanup(&client, ns).await;
}

/// Scale Intents of a fleet's journal, as `from->to`, oldest first.
async fn scale_intents(api: &Api<CelldFleet>, name: &str) -> Vec<String> {
    let journal = celld_operator::journal_store::load(&api.get(name).await.unwrap()).unwrap();
    journal
        .entries()
        .iter()
        .map(journal::audit::entry_detail)
        .filter_map(|d| {
            d.strip_prefix("Scale ")
                .map(|r| r.split_whitespace().next().unwrap_or("").to_string())
        })
        .collect()
}

/// PersistentFleet growth on a fresh claim, contraction 3→1 with the operator killed between
/// the two steps, and regrowth 1→3 onto the kept disks in one run (docs/design.md "Planning
/// order"): one replica write per step, every claim identity unchanged.
#[tokio::test]
async fn contraction_resumes_between_steps_and_regrowth_reattaches_kept_disks() {
    let _guard = isolated().await;
    let (c, client, ns) = setup("contract").await;
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let mut f =
        serde_json::to_value(fleet("nu", "PersistentFleet", 2, &unique_bucket("nu"))).unwrap();
    f["spec"]["placement"] = json!({"zones": ["us-east-1a"], "azCount": 1, "mode": "Relaxed"});
    let f: CelldFleet = serde_json::from_value(f).unwrap();
    {
        let _op = Operator::start(None);
        api.create(&PostParams::default(), &f).await.unwrap();
        ready(&api, "nu", 2).await;
        // 2→3: a fresh claim, one replica write.
        assert!(claim_uid(&client, &ns.name, "data-nu-2").await.is_none());
        c.kubectl(&["-n", &ns.name, "scale", "celldfleet/nu", "--replicas=3"])
            .unwrap();
        ready(&api, "nu", 3).await;
        let marker = marker_of(c, &ns.name, "statefulset", "nu");
        assert_eq!(
            audit_writes(c, &ns.name, "statefulsets", "nu", Some(&marker)),
            1
        );
    }
    let claims: Vec<Option<String>> = claim_uids_of(&client, &ns.name, "nu", 3).await;
    assert!(claims.iter().all(Option::is_some), "{claims:?}");
    // 3→1, killed when it decides the second step.
    let mut op = Operator::start(Some("before-intent:2"));
    c.kubectl(&["-n", &ns.name, "scale", "celldfleet/nu", "--replicas=1"])
        .unwrap();
    assert_eq!(
        op.exited(Duration::from_secs(90)).await,
        3,
        "killed between the steps"
    );
    drop(op);
    let applied = api
        .get("nu")
        .await
        .unwrap()
        .status
        .unwrap()
        .applied_replicas;
    assert_eq!(
        applied,
        Some(2),
        "the first step removed exactly one member"
    );
    {
        let _op = Operator::start(None);
        ready(&api, "nu", 1).await;
    }
    // Every claim stays (Retain); the operator wrote each step once.
    assert_eq!(claim_uids_of(&client, &ns.name, "nu", 3).await, claims);
    let intents = scale_intents(&api, "nu").await;
    assert_eq!(
        intents,
        vec!["2->3", "3->2", "2->1"],
        "one member per contraction step"
    );
    // 1→3: both kept disks are reattached in one run.
    let _op = Operator::start(None);
    c.kubectl(&["-n", &ns.name, "scale", "celldfleet/nu", "--replicas=3"])
        .unwrap();
    ready(&api, "nu", 3).await;
    assert_eq!(
        claim_uids_of(&client, &ns.name, "nu", 3).await,
        claims,
        "kept disks reattached"
    );
    let intents = scale_intents(&api, "nu").await;
    assert_eq!(
        intents.last().map(String::as_str),
        Some("1->3"),
        "{intents:?}"
    );
    let text = std::fs::read_to_string(c.work_dir.join("audit/audit.log")).unwrap();
    let replica_markers: Vec<String> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| {
            e["stage"] == "ResponseComplete"
                && e["objectRef"]["namespace"] == ns.name.as_str()
                && e["objectRef"]["resource"] == "statefulsets"
                && e["verb"] == "update"
        })
        .filter_map(|e| {
            e["requestObject"]["metadata"]["annotations"]["celld.eric.dev/effect"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    let unique: std::collections::BTreeSet<&String> = replica_markers.iter().collect();
    assert_eq!(
        unique.len(),
        replica_markers.len(),
        "no marker written twice: {replica_markers:?}"
    );
    assert_eq!(
        replica_markers.len(),
        4,
        "2→3, 3→2, 2→1, 1→3: {replica_markers:?}"
    );
    cleanup(&client, ns).await;
}

/// UIDs of the claims `data-<name>-0..n`.
async fn claim_uids_of(client: &Client, ns: &str, name: &str, n: i32) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(claim_uid(client, ns, &format!("data-{name}-{i}")).await);
    }
    out
}

/// The live objects of fleet `name` (3 members, zones a/b/c, azCount 3, Strict placement, as
/// built by `fleet()`: a PersistentFleet, a Bucket Deployment or an Ordered Bucket StatefulSet)
/// equal the objects written out below by hand from the rendering rules (docs/design.md
/// "Rendering", docs/runtime.md "The member environment"), not from the operator's own renderer:
/// every field written here must be present with an equal value (lists element by element); fields
/// the API server adds are ignored.
async fn assert_rendered(client: &Client, ns: &str, name: &str) {
    let f = Api::<CelldFleet>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap();
    let uid = f.uid().unwrap();
    let reservation = f
        .status
        .as_ref()
        .and_then(|s| s.reservation.clone())
        .unwrap();
    let spec = serde_json::to_value(&f.spec).unwrap();
    let exec = &spec["execution"];
    let persistent = spec["profile"] == "PersistentFleet";
    let ordered = spec["bucketWorkload"] == "Ordered";
    let label = json!({"celld.eric.dev/fleet-uid": uid});
    let peers = format!("{name}-peers");
    let meta = |n: &str| json!({"name": n, "namespace": ns, "labels": label});
    let network_policy = json!({
        "metadata": meta(name),
        "spec": {
            "podSelector": {"matchLabels": label},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {"from": [
                    {"podSelector": {"matchLabels": label}},
                    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "celld-e2e"}},
                     "podSelector": {"matchLabels": {"app.kubernetes.io/name": "celld-operator"}}}],
                 "ports": [{"protocol": "TCP", "port": 8081}]},
                {"from": [{"podSelector": {"matchLabels": {"celld.eric.dev/client-of": name}}}],
                 "ports": [{"protocol": "TCP", "port": 8080}]}
            ],
            "egress": [
                {"to": [{"podSelector": {"matchLabels": label}}],
                 "ports": [{"protocol": "TCP", "port": 8081}]},
                {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                         "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                 "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
                {"ports": [{"protocol": "TCP", "port": 443}]},
                {"to": [{"ipBlock": {"cidr": "169.254.170.23/32"}}],
                 "ports": [{"protocol": "TCP", "port": 80}]},
                {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "celld-test-store"}},
                         "podSelector": {"matchLabels": {"app": "minio"}}}],
                 "ports": [{"protocol": "TCP", "port": 9000}]}
            ]
        }
    });
    let pdb = json!({
        "metadata": meta(name),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": label}}
    });
    let service = json!({
        "metadata": meta(name),
        "spec": {"type": "ClusterIP", "selector": label,
                 "ports": [{"name": "application", "port": 8080, "targetPort": 8080, "protocol": "TCP"}]}
    });
    let peers_service = json!({
        "metadata": meta(&peers),
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": true, "selector": label,
                 "ports": [{"name": "peer", "port": 8081, "targetPort": 8081, "protocol": "TCP", "appProtocol": "tcp"}]}
    });
    let field = |path: &str| json!({"fieldRef": {"apiVersion": "v1", "fieldPath": path}});
    let shutdown_ms = spec["lifecycle"]["shutdownSeconds"].as_i64().unwrap() * 1000;
    let env = json!([
        {"name": "POD_IP", "valueFrom": field("status.podIP")},
        {"name": "CELLD_NODE", "valueFrom": field(if persistent { "metadata.name" } else { "metadata.uid" })},
        {"name": "CELLD_ADVERTISE", "value": if persistent {
            format!("$(CELLD_NODE).{peers}.{ns}.svc:8081")
        } else {
            "$(POD_IP):8081".to_string()
        }},
        {"name": "CELLD_BUCKET", "value": format!("s3://{}", spec["storage"]["bucket"].as_str().unwrap())},
        {"name": "AWS_REGION", "value": "us-east-1"},
        {"name": "CELLD_DURABILITY", "value": if persistent { "fleet" } else { "bucket" }},
        {"name": "CELLD_ADDR", "value": "0.0.0.0:8080"},
        {"name": "CELLD_INTERNAL_ADDR", "value": "0.0.0.0:8081"},
        {"name": "CELLD_WATCH", "value": "/work"},
        {"name": "CELLD_TTL_MS", "value": "10000"},
        {"name": "CELLD_SHUTDOWN_TOTAL_MS", "value": shutdown_ms.to_string()},
        {"name": "CELLD_TOKIO_THREADS", "value": "2"},
        {"name": "S3_ENDPOINT", "value": "http://minio.celld-test-store.svc:9000"},
        {"name": "AWS_ALLOW_HTTP", "value": "true"},
        {"name": "AWS_ACCESS_KEY_ID", "value": "celld-test"},
        {"name": "AWS_SECRET_ACCESS_KEY", "value": "celld-test-secret"}
    ]);
    let mut template = json!({
                "metadata": {"labels": label},
                "spec": {
                    "serviceAccountName": "celld",
                    "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": spec["lifecycle"]["terminationGraceSeconds"],
                    "securityContext": {"runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
                                        "runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                    "affinity": {
                        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                            {"matchExpressions": [
                                {"key": "topology.kubernetes.io/zone", "operator": "In",
                                 "values": ["us-east-1a", "us-east-1b", "us-east-1c"]},
                                {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]}},
                        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                            {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": label}}]}
                    },
                    "topologySpreadConstraints": [{
                        "topologyKey": "topology.kubernetes.io/zone", "maxSkew": 1,
                        "whenUnsatisfiable": "DoNotSchedule", "minDomains": 3,
                        "nodeAffinityPolicy": "Honor", "nodeTaintsPolicy": "Honor",
                        "labelSelector": {"matchLabels": label}}],
                    "containers": [{
                        "name": "celld",
                        "image": image(1),
                        "imagePullPolicy": "IfNotPresent",
                        "ports": [{"name": "application", "containerPort": 8080, "protocol": "TCP"},
                                  {"name": "peer", "containerPort": 8081, "protocol": "TCP"}],
                        "env": env,
                        "readinessProbe": {"httpGet": {"path": "/.well-known/celld/health", "port": 8080, "scheme": "HTTP"},
                                           "periodSeconds": 2, "timeoutSeconds": 1, "failureThreshold": 3, "successThreshold": 1},
                        "resources": {"requests": {"cpu": exec["cpuRequest"], "memory": exec["memoryRequest"]},
                                      "limits": {"memory": exec["memoryLimit"]}},
                        "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
                        "volumeMounts": [{"name": "data", "mountPath": "/work"}]
                    }]
                }
    });
    let pod = &mut template["spec"];
    if !persistent {
        // Bucket: scratch on an emptyDir, limited and requested as ephemeral storage
        // (sizeGiB without `scratch`).
        pod["volumes"] = json!([{"name": "data", "emptyDir": {"sizeLimit": "1Gi"}}]);
        let r = &mut pod["containers"][0]["resources"];
        r["requests"]["ephemeral-storage"] = json!("1Gi");
        r["limits"]["ephemeral-storage"] = json!("1Gi");
    }
    if ordered {
        // Ordered Bucket with Strict placement: the zone gate instead of a spread constraint.
        pod.as_object_mut()
            .unwrap()
            .remove("topologySpreadConstraints");
        pod["schedulingGates"] = json!([{"name": "celld.eric.dev/bucket-zone"}]);
    }
    let (workload_kind, workload) = if persistent || ordered {
        let mut w = json!({
            "metadata": meta(name),
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": label},
                "serviceName": peers,
                "podManagementPolicy": "Parallel",
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
                "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
                "template": template
            }
        });
        if persistent {
            w["spec"]["volumeClaimTemplates"] = json!([{
                "metadata": {"name": "data", "labels": label,
                             "annotations": {"celld.eric.dev/storage-reservation": reservation}},
                "spec": {"accessModes": ["ReadWriteOncePod"], "storageClassName": "celld-test-hostpath",
                         "resources": {"requests": {"storage": "1Gi"}}}
            }]);
        }
        ("statefulset", w)
    } else {
        (
            "deployment",
            json!({
                "metadata": meta(name),
                "spec": {
                    "replicas": 3,
                    "selector": {"matchLabels": label},
                    "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
                    "template": template
                }
            }),
        )
    };
    let get = |kind: &str, n: &str| {
        let out = cluster()
            .kubectl(&["-n", ns, "get", kind, n, "-o", "json"])
            .unwrap();
        serde_json::from_str::<Value>(&out).unwrap()
    };
    for (kind, n, want) in [
        ("networkpolicy", name, network_policy),
        ("poddisruptionbudget", name, pdb),
        ("service", name, service),
        ("service", peers.as_str(), peers_service),
        (workload_kind, name, workload),
    ] {
        let live = get(kind, n);
        if let Err(at) = contains(&want, &live, kind) {
            panic!("{kind} {n} differs from the rendering rules at {at}:\nwant {want:#}\nlive {live:#}");
        }
        // docs/design.md "Rendering": no owner references; labels are the fleet label only.
        assert!(
            live["metadata"]["ownerReferences"].is_null(),
            "{kind} {n} has owner references"
        );
        assert_eq!(live["metadata"]["labels"], label, "{kind} {n} labels");
    }
    // The Pod template carries no restart token until one is applied, and no probes but readiness.
    let live = get(workload_kind, name);
    let c = &live["spec"]["template"]["spec"]["containers"][0];
    assert!(
        c["livenessProbe"].is_null() && c["startupProbe"].is_null(),
        "{c}"
    );
    assert!(c["command"].is_null() && c["args"].is_null(), "{c}");
    assert!(
        live["spec"]["template"]["metadata"]["annotations"]["celld.eric.dev/restart-token"]
            .is_null()
    );
    if persistent {
        assert!(
            live["spec"]["template"]["spec"]["volumes"].is_null(),
            "no scratch volume on a PersistentFleet"
        );
    }
}

/// `want` ⊆ `live`: every key of an object present and equal; lists of equal length, element
/// by element; scalars equal (numbers by value). `Err(path)` names the first difference.
fn contains(want: &Value, live: &Value, path: &str) -> Result<(), String> {
    match (want, live) {
        (Value::Object(w), Value::Object(l)) => {
            for (k, v) in w {
                let at = format!("{path}.{k}");
                contains(v, l.get(k).unwrap_or(&Value::Null), &at)?;
            }
            Ok(())
        }
        (Value::Array(w), Value::Array(l)) => {
            if w.len() != l.len() {
                return Err(format!("{path} (length {} vs {})", w.len(), l.len()));
            }
            for (i, (a, b)) in w.iter().zip(l).enumerate() {
                contains(a, b, &format!("{path}[{i}]"))?;
            }
            Ok(())
        }
        (Value::Number(a), Value::Number(b)) if a.as_f64() == b.as_f64() => Ok(()),
        (a, b) if a == b => Ok(()),
        _ => Err(path.to_string()),
    }
}

/// A GET on loopback (plain HTTP/1.1); the body.
async fn http_get(addr: &str, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut sock = tokio::net::TcpStream::connect(addr).await.ok()?;
    sock.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .ok()?;
    let mut out = String::new();
    sock.read_to_string(&mut out).await.ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") {
        return None;
    }
    // Prometheus answers small queries with a plain body, larger ones chunked.
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut rest = body;
        let mut joined = String::new();
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).ok()?;
            if n == 0 {
                break;
            }
            joined.push_str(tail.get(..n)?);
            rest = tail.get(n + 2..)?;
        }
        return Some(joined);
    }
    Some(body.to_string())
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A real Prometheus (Debian's `prometheus`, installed by `make deps`) scrapes a running
/// operator with a fleet and loads the chart's alert rules (rendered with helm): every rule
/// is evaluated without error, every alert's signal (its expression without the threshold)
/// and every query of the chart's Grafana dashboard returns at least one series.
#[tokio::test]
async fn prometheus_evaluates_every_alert_and_dashboard_query_against_the_operator() {
    let _guard = isolated().await;
    let (c, client, ns) = setup("prom").await;
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let _operator = Operator::start(None);
    create_ready(&api, &fleet("mon", "Bucket", 3, &unique_bucket("mon")), 3).await;

    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let chart = repo.join("helm/celld-operator");
    let rendered = c
        .helm(&[
            "template",
            "celld-operator",
            chart.to_str().unwrap(),
            "--namespace",
            "celld-system",
            "--set",
            "metrics.prometheusRule.enabled=true",
        ])
        .unwrap();
    let rule_spec = rendered
        .split("\n---")
        .find(|d| d.contains("kind: PrometheusRule"))
        .expect("the chart renders a PrometheusRule");
    // The `spec:` block, unindented: a Prometheus rules file.
    let spec = rule_spec
        .split_once("\nspec:\n")
        .map(|(_, s)| s)
        .expect("spec");
    let rules_file: String = spec
        .lines()
        .map(|l| l.strip_prefix("  ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    let dir = c.work_dir.join(format!("prometheus-{}", ns.name));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("rules.yaml"), &rules_file).unwrap();
    let target = metrics_addr();
    std::fs::write(
        dir.join("prometheus.yml"),
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             rule_files: [rules.yaml]\n\
             scrape_configs:\n  - job_name: celld-operator\n    static_configs: [{{targets: ['{target}']}}]\n"
        ),
    )
    .unwrap();
    let listen = free_loopback_addr();
    let binary = ["/usr/bin/prometheus", "/usr/local/bin/prometheus"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("prometheus is installed by `make deps` (Debian package prometheus)");
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let mut prometheus = Command::new(binary)
        .arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={listen}"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("prometheus starts");
    struct Kill<'a>(&'a mut std::process::Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _kill = Kill(&mut prometheus);
    let query = |q: String| {
        let listen = listen.clone();
        async move {
            let body = http_get(&listen, &format!("/api/v1/query?query={}", urlencode(&q))).await?;
            let v: Value = serde_json::from_str(&body).ok()?;
            Some(v["data"]["result"].as_array().map_or(0, Vec::len))
        }
    };
    // Scraped at least a few times (rates need two samples).
    let deadline = Instant::now() + Duration::from_secs(60);
    while query("count_over_time(celld_operator_leader[1m])".into())
        .await
        .unwrap_or(0)
        == 0
        || query("sum(rate(celld_operator_api_requests_total[1m]))".into())
            .await
            .unwrap_or(0)
            == 0
    {
        assert!(
            Instant::now() < deadline,
            "Prometheus did not scrape the operator at {target}; log: {}",
            dir.join("prometheus.log").display()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Every rule evaluated without error.
    let deadline = Instant::now() + Duration::from_secs(30);
    let rules: Value = loop {
        let body = http_get(&listen, "/api/v1/rules").await.unwrap_or_default();
        let v: Value = serde_json::from_str(&body).unwrap_or_default();
        let rules = v["data"]["groups"][0]["rules"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if !rules.is_empty() && rules.iter().all(|r| r["health"] == "ok") {
            break v;
        }
        assert!(Instant::now() < deadline, "rules not healthy: {v:#}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let alerts = rules["data"]["groups"][0]["rules"].as_array().unwrap();
    assert!(alerts.len() >= 6, "{rules:#}");
    let mut empty = Vec::new();
    for a in alerts {
        let expr = a["query"].as_str().unwrap();
        // The signal: the expression without its threshold (and without the `absent` guard).
        let signal = expr.split(" or absent(").next().unwrap();
        let signal = signal
            .rsplit_once(" > ")
            .or_else(|| signal.rsplit_once(" < "))
            .map_or(signal, |(s, _)| s)
            .trim_start_matches('(');
        if query(signal.to_string()).await.unwrap_or(0) == 0 {
            empty.push(format!("{} ({signal})", a["name"]));
        }
    }
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(chart.join("files/dashboard.json")).unwrap())
            .unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 10);
    for p in panels {
        for t in p["targets"].as_array().unwrap() {
            let q = t["expr"].as_str().unwrap().to_string();
            if query(q.clone()).await.unwrap_or(0) == 0 {
                empty.push(format!("panel {:?} ({q})", p["title"]));
            }
        }
    }
    assert!(
        empty.is_empty(),
        "queries without a series: {empty:#?}\nPrometheus log: {}",
        dir.join("prometheus.log").display()
    );
    cleanup(&client, ns).await;
}

/// `celld_operator_api_requests_total` by `verb resource`, Lease requests left out, and the
/// reconcile pass counters, from one scrape.
/// `celld_operator_reconcile_passes_total{pass="status"}`: cached passes that sent only the
/// fleet's status.
fn status_passes(text: &str) -> u64 {
    passes(text, "status")
}

/// `celld_operator_reconcile_passes_total{pass}` from one scrape (0 when absent).
fn passes(text: &str, pass: &str) -> u64 {
    let prefix = format!("celld_operator_reconcile_passes_total{{pass=\"{pass}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn requests_and_passes(text: &str) -> (std::collections::BTreeMap<String, u64>, u64, u64) {
    let mut requests = std::collections::BTreeMap::new();
    let (mut cached, mut fresh) = (0, 0);
    for line in text.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let value: u64 = value.parse().unwrap_or(0);
        if let Some(labels) = series.strip_prefix("celld_operator_api_requests_total{") {
            if !labels.contains("resource=\"leases\"") {
                requests.insert(labels.trim_end_matches('}').to_string(), value);
            }
        } else if series == "celld_operator_reconcile_passes_total{pass=\"cached\"}" {
            cached = value;
        } else if series == "celld_operator_reconcile_passes_total{pass=\"fresh\"}" {
            fresh = value;
        }
    }
    (requests, cached, fresh)
}

/// Waits (at most 30 s) until `n` more cached passes than `cached_before` are counted, then
/// 3 s more, so whatever else their events cause has had time to be sent; returns that scrape.
async fn after_cached_passes(cached_before: u64, n: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let text = scrape().await;
        if requests_and_passes(&text).1 >= cached_before + n {
            tokio::time::sleep(Duration::from_secs(3)).await;
            return scrape().await;
        }
        assert!(
            Instant::now() < deadline,
            "{n} idle reconciles were not decided from the caches within 30 s:\n{text}"
        );
    }
}

/// Scrapes until two scrapes 3 s apart show the same requests (Lease aside): the operator
/// is at rest. Returns the second scrape.
async fn at_rest() -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = scrape().await;
    loop {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let now = scrape().await;
        if requests_and_passes(&now).0 == requests_and_passes(&last).0 {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "the operator did not come to rest within 60 s:\n{now}"
        );
        last = now;
    }
}

#[tokio::test]
async fn a_settled_fleet_is_reconciled_from_the_caches_without_a_request() {
    let _guard = isolated().await;
    let (_c, client, ns) = setup("rest").await;
    let _op = Operator::start(None);
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    create_ready(
        &api,
        &fleet("alpha", "PersistentFleet", 3, &unique_bucket("rest")),
        3,
    )
    .await;
    let before = at_rest().await;
    let (requests_before, cached_before, fresh_before) = requests_and_passes(&before);

    // Three events that change nothing the operator acts on: two fleet annotations and a
    // label on a member Pod (a watched object). Each triggers a reconcile.
    for n in 0..2 {
        api.patch(
            "alpha",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"test.celld/touch": n.to_string()}}}),
            ),
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), &ns.name)
        .patch(
            "alpha-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"test.celld/touch": "1"}}})),
        )
        .await
        .unwrap();
    let after = after_cached_passes(cached_before, 3).await;
    let (requests_after, cached_after, fresh_after) = requests_and_passes(&after);
    assert_eq!(
        requests_after, requests_before,
        "idle reconciles sent requests (Lease aside): before {requests_before:#?} after {requests_after:#?}"
    );
    assert!(
        cached_after >= cached_before + 3,
        "{cached_before} → {cached_after}"
    );
    assert_eq!(
        fresh_after, fresh_before,
        "an idle reconcile ran a fresh pass"
    );

    // A status that differs from what the caches show (here edited by hand; in a live fleet,
    // a member Pod that became ready) is written by the cached pass itself: one status
    // patch, no fresh pass, nothing else.
    let status_before = status_passes(&after);
    api.patch_status(
        "alpha",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"observedReplicas": 99}})),
    )
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = api.get("alpha").await.unwrap().status.unwrap_or_default();
        if st.observed_replicas == Some(3) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the edited status was not corrected within 30 s: {st:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let corrected = at_rest().await;
    let (requests_corrected, _, fresh_corrected) = requests_and_passes(&corrected);
    let sent: std::collections::BTreeMap<&String, u64> = requests_corrected
        .iter()
        .filter_map(|(k, v)| {
            let was = requests_after.get(k).copied().unwrap_or(0);
            (*v != was).then_some((k, v - was))
        })
        .collect();
    assert!(
        sent.len() == 1
            && sent.iter().all(|(k, v)| *v == 1
                && k.contains("verb=\"patch\"")
                && k.contains("resource=\"celldfleets/status\"")),
        "correcting the status sent more than one status patch: {sent:#?}"
    );
    assert_eq!(
        fresh_corrected, fresh_after,
        "correcting the status ran a fresh pass"
    );
    assert_eq!(
        status_passes(&corrected),
        status_before + 1,
        "the status was not written by one cached pass"
    );

    // A change the operator acts on and may carry out from the caches (a Scale) is decided,
    // journaled and written by a planning cached pass, each write with its guard
    // (docs/design.md "Cache-planned operations"): the growth completes.
    api.patch(
        "alpha",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 4}})),
    )
    .await
    .unwrap();
    ready(&api, "alpha", 4).await;
    let text = scrape().await;
    assert!(
        passes(&text, "planned") > passes(&corrected, "planned"),
        "the growth was not planned from the caches:\n{text}"
    );
    assert!(
        text.lines().any(
            |l| l.starts_with("celld_operator_cache_escalations_total{cause=")
                && !l.ends_with(" 0")
        ),
        "no escalation was counted:\n{text}"
    );
    cleanup(&client, ns).await;
}

/// `celld_operator_<name>` (a gauge without labels) from one scrape.
fn gauge(text: &str, name: &str) -> Option<i64> {
    let prefix = format!("celld_operator_{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

/// The watches of several fleet namespaces (9 each) share one HTTP/2 connection, where
/// `--watch-namespaces-per-connection 0` (kube's HTTP/1.1 client) opens one connection per
/// watch; fleets run the same either way.
#[tokio::test]
async fn namespace_watches_share_one_http2_connection() {
    let _guard = isolated().await;
    let (c, client, first) = setup("h2").await;
    let mut namespaces = vec![first];
    for prefix in ["h2b", "h2c"] {
        let ns = namespace(&client, prefix).await;
        fleet_service_account(&client, &ns.name).await;
        namespaces.push(ns);
    }
    let names: Vec<String> = namespaces.iter().map(|n| n.name.clone()).collect();
    let port =
        celld_harness::net::url_port(&c.apiserver_url).expect("the API server URL names its port");
    let mut per_watch = 0;
    let mut running = None;
    for (per_connection, replicas) in [(0, 3), (10, 4)] {
        if let Some(mut previous) = running.take() {
            let previous: &mut OperatorProcess = &mut previous;
            assert_eq!(previous.terminate(Duration::from_secs(30)).await, 0);
        }
        let op = Operator::start_with(|o| {
            o.extra_args
                .retain(|a| !a.starts_with("--watch-namespaces="));
            o.extra_args
                .push(format!("--watch-namespaces={}", names.join(",")));
            o.extra_args.push(format!(
                "--watch-namespaces-per-connection={per_connection}"
            ));
        });
        for ns in &names {
            let api: Api<CelldFleet> = Api::namespaced(client.clone(), ns);
            if replicas == 3 {
                api.create(
                    &PostParams::default(),
                    &fleet("eta", "Bucket", 3, &unique_bucket("h2")),
                )
                .await
                .unwrap();
            } else {
                api.patch(
                    "eta",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"replicas": replicas}})),
                )
                .await
                .unwrap();
            }
            ready(&api, "eta", replicas).await;
        }
        let text = at_rest().await;
        assert_eq!(gauge(&text, "watched_namespaces"), Some(3), "{text}");
        let open = celld_harness::net::established_to(op.pid(), port).unwrap();
        eprintln!("--watch-namespaces-per-connection={per_connection}: {open} connections to the API server");
        if per_connection == 0 {
            assert_eq!(gauge(&text, "watch_connections"), Some(0), "{text}");
            assert!(
                open >= 27,
                "3 namespaces × 9 watches over HTTP/1.1 hold at least 27 connections, saw {open}"
            );
            per_watch = open;
        } else {
            assert_eq!(gauge(&text, "watch_connections"), Some(1), "{text}");
            assert!(
                open + 18 <= per_watch,
                "the 27 namespace watches should share one connection: {open} connections \
                 against {per_watch} with one per watch"
            );
        }
        running = Some(op);
    }
    // The second operator removes the fleets' finalizers.
    for ns in namespaces {
        cleanup(&client, ns).await;
    }
}

/// `--watch-scope cluster`: one label-selected watch per kind across the cluster serves the
/// fleets of every watched namespace. Objects of a namespace outside `--watch-namespaces`
/// (here a Service with a fleet label) are dropped as they arrive; a settled fleet is
/// reconciled from the shared caches without a request; member readiness (growth) and a
/// deleted PDB reach the operator through the cluster-wide watches.
#[tokio::test]
async fn cluster_wide_watches_serve_fleets_in_several_namespaces() {
    use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Service, ServiceAccount};
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let _guard = isolated().await;
    let (_c, client, first) = setup("cw").await;
    let second = namespace(&client, "cwb").await;
    fleet_service_account(&client, &second.name).await;
    let outside = namespace(&client, "cwx").await;
    let foreign: Service = serde_json::from_value(json!({
        "metadata": {"name": "foreign", "labels": {"celld.eric.dev/fleet-uid": "not-a-fleet-here"}},
        "spec": {"ports": [{"port": 8080}]}
    }))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), &outside.name)
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let names = [first.name.clone(), second.name.clone()];
    let _op = Operator::start_with(|o| {
        o.extra_args
            .retain(|a| !a.starts_with("--watch-namespaces="));
        o.extra_args
            .push(format!("--watch-namespaces={}", names.join(",")));
        o.extra_args.push("--watch-scope=cluster".into());
    });
    let apis: Vec<Api<CelldFleet>> = names
        .iter()
        .map(|ns| Api::namespaced(client.clone(), ns))
        .collect();
    create_ready(
        &apis[0],
        &fleet("eta", "PersistentFleet", 3, &unique_bucket("cw")),
        3,
    )
    .await;
    create_ready(
        &apis[1],
        &fleet("eta", "Bucket", 3, &unique_bucket("cwb")),
        3,
    )
    .await;

    // The caches hold the two namespaces' labelled objects and ServiceAccounts, nothing else.
    async fn expected(client: &Client, names: &[String]) -> i64 {
        let lp = ListParams::default().labels("celld.eric.dev/fleet-uid");
        let mut n = 0;
        for ns in names {
            macro_rules! count {
                ($($k:ty),*) => {$(
                    n += Api::<$k>::namespaced(client.clone(), ns).list(&lp).await.unwrap().items.len();
                )*};
            }
            count!(
                Pod,
                StatefulSet,
                Deployment,
                PersistentVolumeClaim,
                Service,
                NetworkPolicy,
                PodDisruptionBudget
            );
            n += Api::<ServiceAccount>::namespaced(client.clone(), ns)
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .len();
        }
        n as i64
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let text = loop {
        let text = at_rest().await;
        let want = expected(&client, &names).await;
        if gauge(&text, "cached_objects") == Some(want) {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "cached objects {:?}, labelled objects and ServiceAccounts of the two namespaces {want}:\n{text}",
            gauge(&text, "cached_objects")
        );
        // The gauge is set after each reconcile: touch a fleet.
        apis[0]
            .patch(
                "eta",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {"test.celld/count": want.to_string()}}}),
                ),
            )
            .await
            .unwrap();
    };
    assert_eq!(gauge(&text, "watched_namespaces"), Some(2), "{text}");

    // Settled fleets are reconciled from the shared caches without a request.
    let (requests_before, cached_before, fresh_before) = requests_and_passes(&text);
    for api in &apis {
        api.patch(
            "eta",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"test.celld/touch": "1"}}})),
        )
        .await
        .unwrap();
    }
    let after = after_cached_passes(cached_before, 2).await;
    let (requests_after, _, fresh_after) = requests_and_passes(&after);
    assert_eq!(
        requests_after, requests_before,
        "idle reconciles sent requests (Lease aside)"
    );
    assert_eq!(
        fresh_after, fresh_before,
        "an idle reconcile ran a fresh pass"
    );

    // Member readiness of the second namespace and a deleted PDB of the first reach the
    // operator through the cluster-wide watches.
    apis[1]
        .patch(
            "eta",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 4}})),
        )
        .await
        .unwrap();
    ready(&apis[1], "eta", 4).await;
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &names[0]);
    let old_budget = budgets.get("eta").await.unwrap().uid();
    budgets.delete("eta", &Default::default()).await.unwrap();
    until(
        "the PodDisruptionBudget created again",
        60,
        &apis[0],
        "eta",
        || async {
            let live = budgets.get_opt("eta").await.ok()??;
            (live.uid() != old_budget && live.metadata.deletion_timestamp.is_none()).then_some(())
        },
    )
    .await;
    for ns in [first, second] {
        cleanup(&client, ns).await;
    }
    outside.delete().await.unwrap();
}
