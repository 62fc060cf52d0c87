//! Real-cluster acceptance tests of the test bed (issue 4, "Done when"): a hand-written
//! StatefulSet of the celld simulator run by the real StatefulSet controller, scheduler, PV
//! binder and the test kubelet, with the ledger, sampler, identity and audit oracles.
//!
//! Every test uses its own namespace and bucket on the shared [`TestBed`]. Tests that need the
//! store path healthy hold `store_shared()`; the proxy-outage test holds `store_exclusive()`.
//! On failure the panic hook prints where every log is; the namespace is kept for inspection.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use celld_harness::TestNamespace;
use celld_sim::ledger::Ledger;
use celld_testbed::audit::AuditQuery;
use celld_testbed::pods::{self, is_ready, last_exit_code, pod_ip, restart_count};
use celld_testbed::simset::Placement;
use celld_testbed::store::StoreServer;
use celld_testbed::{Expect, SimSet, TestBed};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::DeleteParams;
use kube::{Api, Client};
use serde_json::{json, Value};

const READY: Duration = Duration::from_secs(120);
const ADMIN_USER: &str = "celld-test-admin";
const STS_CONTROLLER: &str = "system:serviceaccount:kube-system:statefulset-controller";

struct Ctx {
    bed: &'static TestBed,
    client: Client,
    ns: TestNamespace,
    bucket: String,
    started: Instant,
    name: &'static str,
}

async fn setup(name: &'static str, prefix: &str) -> Ctx {
    let started = Instant::now();
    let bed = TestBed::shared().await;
    let client = bed.client().await.expect("admin client");
    let ns = bed
        .namespace(&client, prefix)
        .await
        .expect("test namespace");
    let bucket = bed.unique_bucket(prefix).expect("bucket");
    eprintln!(
        "[{name}] namespace {}, bucket {bucket} (bed ready after {:?})",
        ns.name,
        started.elapsed()
    );
    Ctx {
        bed,
        client,
        ns,
        bucket,
        started,
        name,
    }
}

impl Ctx {
    fn ns(&self) -> &str {
        &self.ns.name
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), self.ns())
    }

    async fn create(&self, set: &SimSet) {
        set.create(&self.client, self.ns(), &self.bed.node_prefix)
            .await
            .expect("creating the StatefulSet and its Service");
    }

    async fn ready(&self, set: &SimSet, not_uids: &[(String, String)]) -> Vec<Pod> {
        self.bed
            .wait_ready(&self.client, self.ns(), &set.pod_names(), not_uids, READY)
            .await
            .unwrap_or_else(|e| panic!("[{}] {e:#}", self.name))
    }

    async fn pod(&self, name: &str) -> Pod {
        pods::get(&self.client, self.ns(), name)
            .await
            .unwrap_or_else(|| panic!("Pod {}/{name} not found", self.ns()))
    }

    async fn delete_pod(&self, name: &str, grace: Option<u32>) {
        let dp = DeleteParams {
            grace_period_seconds: grace,
            ..DeleteParams::default()
        };
        self.pods().delete(name, &dp).await.expect("deleting a Pod");
    }

    /// Deletes the namespace and waits (≤ 60 s) until it is gone, so members drain and the
    /// provisioner reclaims the disks while the kubelet still runs. A failed test skips this
    /// and keeps its namespace for inspection.
    async fn finish(self) {
        eprintln!(
            "[{}] passed in {:.1} s",
            self.name,
            self.started.elapsed().as_secs_f64()
        );
        let name = self.ns.name.clone();
        let _ = self.ns.delete().await;
        let api = Api::<Namespace>::all(self.client.clone());
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if matches!(api.get_opt(&name).await, Ok(None)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        eprintln!(
            "[{}] namespace {name} still terminating after 60 s",
            self.name
        );
    }
}

async fn ledger_phase(ledger: &mut Ledger, urls: &[String], when: &str) {
    if let Err(e) = ledger.phase(urls).await {
        panic!("ledger {when}: {e}");
    }
}

async fn ledger_check(ledger: &Ledger, urls: &[String], when: &str) {
    let r = ledger.check(urls).await;
    assert!(r.passed(), "ledger check {when}: {}", r.summary());
}

/// `(cell, id)` of every data object the store holds (`cells/<cell>/data/<epoch>/<id>`).
fn stored_ids(store: &StoreServer, bucket: &str) -> BTreeSet<(String, String)> {
    store
        .keys(bucket, "cells/")
        .iter()
        .filter_map(|k| {
            let parts: Vec<&str> = k.split('/').collect();
            (parts.len() == 5 && parts[2] == "data")
                .then(|| (parts[1].to_string(), parts[4].to_string()))
        })
        .collect()
}

/// Cell → owning node, from `cells/<cell>/own.json`.
fn cell_owners(store: &StoreServer, bucket: &str, cells: &[String]) -> BTreeMap<String, String> {
    cells
        .iter()
        .filter_map(|c| {
            let own = store.json(bucket, &format!("cells/{c}/own.json"))?;
            Some((c.clone(), own["node"].as_str()?.to_string()))
        })
        .collect()
}

fn follower_names(info: &Value) -> Vec<String> {
    info["followers"]
        .as_array()
        .map(|fs| {
            fs.iter()
                .filter_map(|f| f["node"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Issue 4: the StatefulSet becomes Ready through the real controllers; the ledger writes 12 ids
/// per phase and reads all back; Pod IPs change on recreation while peer names keep resolving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statefulset_of_the_simulator_becomes_ready_and_keeps_the_ledger_across_pod_recreation() {
    let c = setup("ready", "tb-ready").await;
    let _store = c.bed.store_shared().await;
    let audit = c.bed.audit();
    let set = SimSet::fleet("sim", 3, &c.bucket);
    c.create(&set).await;
    let pods = c.ready(&set, &[]).await;

    let sts_api = Api::<StatefulSet>::namespaced(c.client.clone(), c.ns());
    c.bed
        .eventually("StatefulSet status readyReplicas == 3", READY, || {
            let api = sts_api.clone();
            async move {
                let s = api.get("sim").await.ok()?;
                (s.status?.ready_replicas == Some(3)).then_some(())
            }
        })
        .await
        .unwrap();

    let general = c.bed.general_node_names();
    let range_prefix = format!("127.{}.", 30 + c.bed.slot);
    let hosts = c.bed.hosts();
    for (i, p) in pods.iter().enumerate() {
        let node = pods::node_name(p).expect("scheduled");
        assert!(general.contains(&node), "{node} is one of the bed's Nodes");
        let ip = pod_ip(p).unwrap();
        assert!(
            ip.to_string().starts_with(&range_prefix),
            "{ip} in the bed's range"
        );
        let peer = set.peer_name(c.ns(), i as i32);
        assert_eq!(hosts.get(&peer), Some(&ip), "hosts file maps {peer}");
        // PersistentFleet members advertise their stable name, never their IP.
        let lease = c
            .bed
            .store
            .json(&c.bucket, &format!("nodes/sim-{i}.json"))
            .expect("lease record in the store");
        assert_eq!(lease["addr"], format!("{peer}:8081"), "{lease}");
    }

    let mut ledger = Ledger::new(&format!("{}-ledger", c.ns()));
    let urls = pods::member_urls(&pods);
    ledger_phase(&mut ledger, &urls, "phase 1").await;
    assert_eq!(ledger.acknowledged().len(), 12);

    // Recreate sim-1: a new incarnation gets a new IP; its name follows it.
    let before = c
        .bed
        .identity(&c.client, c.ns(), &set.selector())
        .await
        .unwrap();
    let old = pods[1].clone();
    let old_ip = pod_ip(&old).unwrap();
    let old_gen = pods::member(&old).unwrap().generation().await.unwrap();
    c.delete_pod("sim-1", None).await;
    let pods = c.ready(&set, &[("sim-1".into(), pods::uid(&old))]).await;
    let new_ip = pod_ip(&pods[1]).unwrap();
    assert_ne!(new_ip, old_ip, "a recreated Pod gets a new IP");
    let peer = set.peer_name(c.ns(), 1);
    assert_eq!(
        c.bed.hosts().get(&peer),
        Some(&new_ip),
        "{peer} follows the new IP"
    );
    let new_gen = pods::member(&pods[1]).unwrap().generation().await.unwrap();
    assert_ne!(new_gen, old_gen, "a new process has a new generation");
    let lease = c.bed.store.json(&c.bucket, "nodes/sim-1.json").unwrap();
    assert_eq!(lease["addr"], format!("{peer}:8081"));

    // The name resolves to the new incarnation: a cell created on sim-1 is read through sim-0,
    // which forwards to sim-1's advertised name.
    let probe_cell = format!("{}-name-probe", c.ns());
    let new1 = pods::member(&pods[1]).unwrap();
    let put = c
        .bed
        .eventually(
            "sim-1 acknowledges a write to a new cell",
            READY,
            || async {
                let a = new1.put_id(&probe_cell, "probe-1").await.ok()?;
                (a.status == 200 && a.json()["stored"] == true).then_some(a)
            },
        )
        .await
        .unwrap();
    assert_eq!(put.json()["id"], "probe-1");
    let owner = c
        .bed
        .store
        .json(&c.bucket, &format!("cells/{probe_cell}/own.json"))
        .expect("ownership record");
    assert_eq!(owner["node"], "sim-1", "{owner}");
    let via0 = pods::member(&pods[0])
        .unwrap()
        .get_id(&probe_cell, "probe-1")
        .await
        .unwrap();
    assert_eq!(
        (via0.status, via0.json()["stored"].clone()),
        (200, Value::Bool(true)),
        "sim-0 forwards to {peer}: {:?}",
        via0.body
    );

    // Phase 2 through the new IP set: writes are forwarded and followed by peer name.
    let urls = pods::member_urls(&pods);
    ledger_phase(&mut ledger, &urls, "phase 2 after recreating sim-1").await;
    assert_eq!(ledger.acknowledged().len(), 24);

    let after = c
        .bed
        .identity(&c.client, c.ns(), &set.selector())
        .await
        .unwrap();
    let d = before.diff(&after);
    assert_eq!(d.pods_replaced, vec!["sim-1"], "{d:?}");
    assert_eq!(d.pods_kept, vec!["sim-0", "sim-2"], "{d:?}");
    assert_eq!(d.claims_kept.len(), 3, "{d:?}");
    assert_eq!(
        d.volumes_kept.len(),
        3,
        "the disk stays with the name: {d:?}"
    );

    // Audit: one StatefulSet create by the test; the controller created 3 + 1 Pods and 3 claims.
    let sts_writes = audit
        .writes_per_user_and_object(
            &AuditQuery::writes()
                .resource("statefulsets")
                .subresource(None)
                .namespace(c.ns())
                .successful(),
        )
        .unwrap();
    assert_eq!(sts_writes.len(), 1, "{sts_writes:?}");
    let ((user, verb, obj), n) = sts_writes.iter().next().unwrap();
    assert_eq!(
        (user.as_str(), verb.as_str(), obj.name.as_str(), *n),
        (ADMIN_USER, "create", "sim", 1)
    );
    let pod_creates = audit
        .writes_per_object(
            &AuditQuery::writes()
                .verb("create")
                .resource("pods")
                .subresource(None)
                .namespace(c.ns())
                .user(STS_CONTROLLER)
                .successful(),
        )
        .unwrap();
    let per_pod: BTreeMap<&str, usize> = pod_creates
        .iter()
        .map(|(k, n)| (k.name.as_str(), *n))
        .collect();
    assert_eq!(
        per_pod,
        BTreeMap::from([("sim-0", 1), ("sim-1", 2), ("sim-2", 1)]),
        "Pod creates per object"
    );
    let claim_creates = audit
        .writes_per_user(
            &AuditQuery::writes()
                .verb("create")
                .resource("persistentvolumeclaims")
                .namespace(c.ns())
                .successful(),
        )
        .unwrap();
    assert_eq!(
        claim_creates,
        BTreeMap::from([(STS_CONTROLLER.to_string(), 3)])
    );
    c.finish().await;
}

/// Issue 4: deleting a member Pod gracefully and by SIGKILL loses no acknowledged id (the disk
/// is kept). Flushing is off, so acknowledged data lives only on member disks and followers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_deletion_and_sigkill_of_a_member_lose_no_acknowledged_id() {
    let c = setup("restart", "tb-restart").await;
    let _store = c.bed.store_shared().await;
    let set = SimSet {
        flush_ms: 600_000,
        ..SimSet::fleet("sim", 3, &c.bucket)
    };
    c.create(&set).await;
    let pods = c.ready(&set, &[]).await;
    let mut ledger = Ledger::new(&format!("{}-ledger", c.ns()));
    ledger_phase(&mut ledger, &pods::member_urls(&pods), "phase 1").await;
    assert!(
        stored_ids(&c.bed.store, &c.bucket).is_empty(),
        "with flushing off no acknowledged id is in the store yet"
    );

    let before = c
        .bed
        .identity(&c.client, c.ns(), &set.selector())
        .await
        .unwrap();
    let sampler = c
        .bed
        .sampler(&c.client, c.ns(), Expect::StatefulSet("sim".into()), 1);

    // Graceful: SIGTERM, drain, exit 0, a new Pod on the same claim.
    let old0 = pods::uid(&pods[0]);
    c.delete_pod("sim-0", None).await;
    let pods = c.ready(&set, &[("sim-0".into(), old0)]).await;
    ledger_phase(
        &mut ledger,
        &pods::member_urls(&pods),
        "phase 2 after graceful deletion",
    )
    .await;

    // SIGKILL: no drain at all; the container restarts on the same Pod, IP and disk.
    let p1 = c.pod("sim-1").await;
    let rc = restart_count(&p1, "celld");
    let killed = c
        .bed
        .kubelet
        .kill(c.ns(), "sim-1", None)
        .await
        .expect("kubelet kill");
    eprintln!("[restart] SIGKILL: {killed:?}");
    let after_kill = c
        .bed
        .eventually(
            "sim-1 restarted after SIGKILL (exit 137) and Ready",
            READY,
            || {
                let client = c.client.clone();
                let ns = c.ns().to_string();
                async move {
                    let p = pods::get(&client, &ns, "sim-1").await?;
                    (restart_count(&p, "celld") > rc
                        && last_exit_code(&p, "celld") == Some(137)
                        && is_ready(&p))
                    .then_some(p)
                }
            },
        )
        .await
        .unwrap();
    assert_eq!(pods::uid(&after_kill), pods::uid(&p1), "same Pod");
    assert_eq!(
        pod_ip(&after_kill),
        pod_ip(&p1),
        "a container restart keeps the Pod IP"
    );
    let pods = c.ready(&set, &[]).await;
    ledger_phase(
        &mut ledger,
        &pods::member_urls(&pods),
        "phase 3 after SIGKILL",
    )
    .await;
    assert_eq!(ledger.acknowledged().len(), 36);

    let report = sampler.finish().await;
    eprintln!("[restart] sampler: {}", report.summary());
    report.assert_ok();
    assert!(
        report.max_down >= 1,
        "the sampler saw the deleted member go: {}",
        report.summary()
    );

    let after = c
        .bed
        .identity(&c.client, c.ns(), &set.selector())
        .await
        .unwrap();
    let d = before.diff(&after);
    assert_eq!(d.pods_replaced, vec!["sim-0"], "{d:?}");
    assert_eq!(d.claims_kept.len(), 3, "every disk kept: {d:?}");
    assert_eq!(d.volumes_kept.len(), 3, "every PV kept: {d:?}");
    c.finish().await;
}

/// Issue 4: the oracle can fail. A leader and its only follower are killed without draining
/// and both their claims deleted (two disks wiped while both are down, flushing off): the ids
/// that lived only there are gone, and the ledger must report them missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_detects_ids_lost_when_two_members_disks_are_wiped_while_both_are_down() {
    let c = setup("wipe", "tb-wipe").await;
    let _store = c.bed.store_shared().await;
    let set = SimSet {
        flush_ms: 600_000,
        ..SimSet::fleet("sim", 3, &c.bucket)
    };
    c.create(&set).await;
    let pods = c.ready(&set, &[]).await;
    let mut ledger = Ledger::new(&format!("{}-ledger", c.ns()));
    ledger_phase(&mut ledger, &pods::member_urls(&pods), "phase 1").await;

    // A leader with unflushed writes and exactly one follower.
    let mut chosen = None;
    for (i, p) in pods.iter().enumerate() {
        let info = pods::member(p).unwrap().sim_info().await.unwrap();
        let followers = follower_names(&info);
        if info["unflushed_writes"].as_u64().unwrap_or(0) > 0 && followers.len() == 1 {
            let f: usize = followers[0]
                .strip_prefix("sim-")
                .and_then(|s| s.parse().ok())
                .expect("follower is a member");
            chosen = Some((i, f));
            break;
        }
    }
    let (l, f) = chosen.expect("a leader with unflushed writes and one follower");
    let (leader, follower) = (format!("sim-{l}"), format!("sim-{f}"));
    let owners = cell_owners(&c.bed.store, &c.bucket, ledger.cells());
    let leader_cells: BTreeSet<String> = owners
        .iter()
        .filter(|(_, o)| **o == leader)
        .map(|(c, _)| c.clone())
        .collect();
    assert!(!leader_cells.is_empty(), "{leader} owns cells: {owners:?}");
    eprintln!("[wipe] leader {leader} (cells {leader_cells:?}), follower {follower}");

    // No drain on the way down: SIGTERM is ignored, the kubelet SIGKILLs after the grace.
    for i in [l, f] {
        pods::member(&pods[i])
            .unwrap()
            .set_faults(&json!({"sigterm": "ignore"}))
            .await
            .unwrap();
    }
    let before = c
        .bed
        .identity(&c.client, c.ns(), &set.selector())
        .await
        .unwrap();
    // The sampler can fail too: two members down at once is a violation when one is allowed.
    let sampler = c
        .bed
        .sampler(&c.client, c.ns(), Expect::StatefulSet("sim".into()), 1);
    let claims = Api::<PersistentVolumeClaim>::namespaced(c.client.clone(), c.ns());
    for i in [l, f] {
        claims
            .delete(&set.claim_name(i as i32), &DeleteParams::default())
            .await
            .expect("deleting a claim");
    }
    for i in [l, f] {
        c.delete_pod(&format!("sim-{i}"), Some(2)).await;
    }
    // The StatefulSet controller waits until the old claims are gone, then creates fresh ones.
    let pods = c
        .ready(
            &set,
            &[
                (leader.clone(), pods::uid(&pods[l])),
                (follower.clone(), pods::uid(&pods[f])),
            ],
        )
        .await;
    let after = c
        .bed
        .identity(&c.client, c.ns(), &set.selector())
        .await
        .unwrap();
    let report = sampler.finish().await;
    eprintln!("[wipe] sampler: {}", report.summary());
    assert!(
        !report.ok(),
        "two members down must violate one-member-down"
    );
    assert!(report.max_down >= 2, "{}", report.summary());
    let d = before.diff(&after);
    let mut wiped = vec![set.claim_name(l as i32), set.claim_name(f as i32)];
    wiped.sort();
    assert_eq!(d.claims_replaced, wiped, "both disks are fresh: {d:?}");
    assert_eq!(d.volumes_replaced.len(), 2, "{d:?}");
    let pvs = Api::<PersistentVolume>::all(c.client.clone());
    for pv in &d.volumes_replaced {
        c.bed
            .eventually(
                &format!("old PV {pv} deleted (reclaim Delete)"),
                READY,
                || {
                    let pvs = pvs.clone();
                    async move { pvs.get_opt(pv).await.ok()?.is_none().then_some(()) }
                },
            )
            .await
            .unwrap();
    }

    let report = ledger.check(&pods::member_urls(&pods)).await;
    eprintln!("[wipe] oracle: {}", report.summary());
    assert!(!report.passed(), "the oracle must detect the loss");
    assert!(!report.missing.is_empty(), "lost ids are reported missing");
    assert!(report.wrong.is_empty() && report.false_positives.is_empty());
    for a in &report.missing {
        assert!(
            leader_cells.contains(&a.cell),
            "only ids of {leader}'s cells can be lost: {a}"
        );
    }
    let loss: Vec<String> = c
        .bed
        .store
        .keys(&c.bucket, "log/")
        .into_iter()
        .filter(|k| k.ends_with(".loss.json"))
        .collect();
    assert!(!loss.is_empty(), "the simulator recorded the loss");
    c.finish().await;
}

/// Issue 4: one member partitioned from the store self-fences (exit 3, restart) and comes back
/// on the same disk with every acknowledged id. The fault proxy partitions every member, so the
/// partition of one member is the simulator's own switch `PUT /sim/faults {"store":"partition"}`
/// (every store call of that process fails); it ends with the fenced process, so the restarted
/// container finds the store restored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_partitioned_from_the_store_self_fences_and_comes_back_on_its_disk() {
    let c = setup("fence", "tb-fence").await;
    let _store = c.bed.store_shared().await;
    let set = SimSet {
        flush_ms: 600_000,
        ..SimSet::fleet("sim", 3, &c.bucket)
    };
    c.create(&set).await;
    let pods = c.ready(&set, &[]).await;
    let mut ledger = Ledger::new(&format!("{}-ledger", c.ns()));
    ledger_phase(&mut ledger, &pods::member_urls(&pods), "phase 1").await;

    let target = &pods[2];
    let member = pods::member(target).unwrap();
    let info0 = member.sim_info().await.unwrap();
    let rc = restart_count(target, "celld");
    let before = c
        .bed
        .identity(&c.client, c.ns(), &set.selector())
        .await
        .unwrap();
    let sampler = c
        .bed
        .sampler(&c.client, c.ns(), Expect::StatefulSet("sim".into()), 1);

    member
        .set_faults(&json!({"store": "partition"}))
        .await
        .unwrap();
    let t = Instant::now();
    let fenced = c
        .bed
        .eventually(
            "sim-2 shows lastState.terminated.exitCode 3 and a restart",
            Duration::from_secs(60),
            || {
                let client = c.client.clone();
                let ns = c.ns().to_string();
                async move {
                    let p = pods::get(&client, &ns, "sim-2").await?;
                    (restart_count(&p, "celld") > rc && last_exit_code(&p, "celld") == Some(3))
                        .then_some(p)
                }
            },
        )
        .await
        .unwrap();
    eprintln!("[fence] self-fenced and restarted after {:?}", t.elapsed());
    let log =
        std::fs::read_to_string(
            c.bed
                .container_log(c.ns(), "sim-2", &pods::uid(target), "celld"),
        )
        .unwrap();
    let line = log
        .lines()
        .find(|l| l.starts_with("SELF-FENCE:"))
        .expect("a SELF-FENCE: line in the member log");
    eprintln!("[fence] {line}");
    assert_eq!(
        pods::uid(&fenced),
        pods::uid(target),
        "a restart, not a new Pod"
    );

    let pods = c.ready(&set, &[]).await;
    assert_eq!(pod_ip(&pods[2]), pod_ip(target), "same Pod, same IP");
    let info1 = member.sim_info().await.unwrap();
    assert_ne!(info1["generation"], info0["generation"], "a new process");
    assert_eq!(
        info1["disk_incarnation"], info0["disk_incarnation"],
        "back on the same disk"
    );
    ledger_check(&ledger, &pods::member_urls(&pods), "after the self-fence").await;
    ledger_phase(&mut ledger, &pods::member_urls(&pods), "phase 2").await;

    let report = sampler.finish().await;
    eprintln!("[fence] sampler: {}", report.summary());
    report.assert_ok();
    let after = c
        .bed
        .identity(&c.client, c.ns(), &set.selector())
        .await
        .unwrap();
    let d = before.diff(&after);
    assert_eq!(d.pods_kept.len(), 3, "{d:?}");
    assert_eq!(d.volumes_kept.len(), 3, "{d:?}");
    c.finish().await;
}

/// The fault proxy's partition: the store goes dark for everyone (black hole); every member
/// self-fences (exit 3) and cannot start again until the store is restored, then all come back
/// on their own disks with every acknowledged id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_through_the_fault_proxy_fences_every_member_and_restoring_it_recovers_them()
{
    let c = setup("outage", "tb-outage").await;
    let _exclusive = c.bed.store_exclusive().await;
    let set = SimSet {
        flush_ms: 600_000,
        ..SimSet::fleet("sim", 3, &c.bucket)
    };
    c.create(&set).await;
    let pods = c.ready(&set, &[]).await;
    let mut ledger = Ledger::new(&format!("{}-ledger", c.ns()));
    ledger_phase(&mut ledger, &pods::member_urls(&pods), "phase 1").await;
    let rcs: Vec<i32> = pods.iter().map(|p| restart_count(p, "celld")).collect();

    c.bed.partition_store();
    let fenced = c
        .bed
        .eventually(
            "every member exited 3 and restarted",
            Duration::from_secs(60),
            || {
                let client = c.client.clone();
                let ns = c.ns().to_string();
                let rcs = rcs.clone();
                async move {
                    let mut out = Vec::new();
                    for (i, rc) in rcs.iter().enumerate() {
                        let p = pods::get(&client, &ns, &format!("sim-{i}")).await?;
                        if restart_count(&p, "celld") <= *rc
                            || last_exit_code(&p, "celld") != Some(3)
                        {
                            return None;
                        }
                        out.push(p);
                    }
                    Some(out)
                }
            },
        )
        .await;
    // While the store is dark, the restarted members cannot serve.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut dark_ready = Vec::new();
    for i in 0..3 {
        let p = c.pod(&format!("sim-{i}")).await;
        if is_ready(&p) {
            dark_ready.push(i);
        }
    }
    c.bed.restore_store();
    let fenced = fenced.unwrap();
    assert!(
        dark_ready.is_empty(),
        "members Ready without a store: {dark_ready:?}"
    );

    let pods = c.ready(&set, &[]).await;
    for (a, b) in pods.iter().zip(&fenced) {
        assert_eq!(
            pods::uid(a),
            pods::uid(b),
            "restarts on the same Pods and disks"
        );
    }
    ledger_check(&ledger, &pods::member_urls(&pods), "after the outage").await;
    ledger_phase(&mut ledger, &pods::member_urls(&pods), "phase 2").await;
    c.finish().await;
}

/// Issue 4: a zombie Node keeps its member process running while the deleted Pod stays
/// Terminating; when the Node is back the deletion completes and a new incarnation starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_node_keeps_the_member_running_while_its_pod_stays_terminating() {
    let c = setup("zombie", "tb-zombie").await;
    let _store = c.bed.store_shared().await;
    let _node = c.bed.reserved_node_exclusive().await;
    let node = c.bed.reserved_node.clone();
    let set = SimSet {
        placement: Placement::Node(node.clone()),
        ..SimSet::bucket("zsim", 1, &c.bucket)
    };
    c.create(&set).await;
    let pods = c.ready(&set, &[]).await;
    let old = pods[0].clone();
    assert_eq!(pods::node_name(&old).as_deref(), Some(node.as_str()));
    let member = pods::member(&old).unwrap();
    let info0 = member.sim_info().await.unwrap();
    let pid = info0["pid"].as_i64().expect("pid") as i32;
    let mut ledger = Ledger::new(&format!("{}-ledger", c.ns()));
    ledger_phase(&mut ledger, &pods::member_urls(&pods), "phase 1").await;

    c.bed.kubelet.zombie(&node).await.expect("zombie");
    c.delete_pod("zsim-0", Some(2)).await;
    // Observe well past the grace period; collect problems, bring the Node back, then assert.
    let mut problems = Vec::new();
    let mut observations = 0;
    let until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_secs(1)).await;
        observations += 1;
        match pods::get(&c.client, c.ns(), "zsim-0").await {
            Some(p) if pods::uid(&p) == pods::uid(&old) && pods::is_terminating(&p) => {}
            other => problems.push(format!(
                "the Pod is not the old one Terminating: {:?}",
                other.map(|p| (pods::uid(&p), p.metadata.deletion_timestamp))
            )),
        }
        // SAFETY: kill(pid, 0) only checks that the process exists.
        if unsafe { libc::kill(pid, 0) } != 0 {
            problems.push(format!("member process {pid} is gone"));
        }
        match member.sim_info().await {
            Ok(i) if i["generation"] == info0["generation"] => {}
            other => problems.push(format!("the member does not answer as before: {other:?}")),
        }
    }
    let zombie_ledger = ledger.check(&pods::member_urls(&pods)).await;
    c.bed.kubelet.node_back(&node).await.expect("node back");
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(observations >= 6);
    assert!(
        zombie_ledger.passed(),
        "the zombie's member keeps serving: {}",
        zombie_ledger.summary()
    );

    // Back: the deletion is carried out (SIGTERM, exit), the controller recreates the member.
    let pods = c.ready(&set, &[("zsim-0".into(), pods::uid(&old))]).await;
    assert_ne!(pod_ip(&pods[0]), pod_ip(&old));
    c.bed
        .eventually(
            "the zombie's old process exited",
            Duration::from_secs(30),
            || async move {
                // SAFETY: as above.
                (unsafe { libc::kill(pid, 0) } != 0).then_some(())
            },
        )
        .await
        .unwrap();
    ledger_check(
        &ledger,
        &pods::member_urls(&pods),
        "after the node came back",
    )
    .await;
    c.finish().await;
}

/// Issue 4: strict removal answers 202, then `draining`, then `data_safe` only once the
/// member's data is in the store; another operation id gets 409. Then the operator's
/// destructive step (Pod and claim deleted) loses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_shutdown_reaches_data_safe_only_after_the_data_is_in_the_store() {
    let c = setup("strict", "tb-strict").await;
    let _store = c.bed.store_shared().await;
    let set = SimSet {
        flush_ms: 600_000,
        ..SimSet::fleet("sim", 3, &c.bucket)
    };
    c.create(&set).await;
    let pods = c.ready(&set, &[]).await;
    let mut ledger = Ledger::new(&format!("{}-ledger", c.ns()));
    ledger_phase(&mut ledger, &pods::member_urls(&pods), "phase 1").await;

    let target = &pods[0];
    let m = pods::member(target).unwrap();
    let info = m.sim_info().await.unwrap();
    assert!(info["unflushed_writes"].as_u64().unwrap() > 0, "{info}");

    // What sim-0 must put in the store: its own cells' ids and the ids of leaders it follows.
    let mut followers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (i, p) in pods.iter().enumerate() {
        let info = pods::member(p).unwrap().sim_info().await.unwrap();
        followers.insert(format!("sim-{i}"), follower_names(&info));
    }
    let owners = cell_owners(&c.bed.store, &c.bucket, ledger.cells());
    let obligations: BTreeSet<(String, String)> = ledger
        .acknowledged()
        .iter()
        .filter(|a| {
            owners.get(&a.cell).is_some_and(|o| {
                o == "sim-0"
                    || followers
                        .get(o)
                        .is_some_and(|f| f.iter().any(|n| n == "sim-0"))
            })
        })
        .map(|a| (a.cell.clone(), a.id.clone()))
        .collect();
    assert!(
        !obligations.is_empty(),
        "owners {owners:?}, followers {followers:?}"
    );
    let in_store = stored_ids(&c.bed.store, &c.bucket);
    assert!(
        obligations.iter().all(|o| !in_store.contains(o)),
        "nothing is in the store before the removal (flushing off)"
    );

    let state = m.state_json().await.unwrap();
    assert_eq!(state["node"], "sim-0");
    assert_eq!(state["shutdown"]["schema_version"], 1);
    assert_eq!(
        state["shutdown"]["capabilities"]["strict_disk_removal"],
        true
    );
    assert_eq!(state["shutdown"]["operation"], Value::Null);
    let generation = state["shutdown"]["runtime_generation"]
        .as_str()
        .unwrap()
        .to_string();
    // Slow the outcome so that `draining` is observable.
    m.set_faults(&json!({"removal_delay_ms": 1500}))
        .await
        .unwrap();

    let r = m.remove_disk("op-a", &generation).await.unwrap();
    assert_eq!(r.status, 202, "{:?}", r.body);
    let accepted = r.json();
    assert_eq!(accepted["operation"]["operation_id"], "op-a");
    assert_eq!(accepted["operation"]["mode"], "remove-disk");
    assert_eq!(accepted["operation"]["phase"], "draining");
    let r = m.remove_disk("op-b", &generation).await.unwrap();
    assert_eq!(r.status, 409, "another operation id is refused");
    assert_eq!(m.health().await, Some(503), "unready once removal began");

    let mut phases = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let last = loop {
        let s = m.state_json().await.unwrap();
        let phase = s["shutdown"]["operation"]["phase"]
            .as_str()
            .unwrap_or("?")
            .to_string();
        if phases.last() != Some(&phase) {
            phases.push(phase.clone());
        }
        if phase == "data_safe" {
            // At the first sighting of data_safe, everything it owed is in the store.
            let in_store = stored_ids(&c.bed.store, &c.bucket);
            let missing: Vec<_> = obligations
                .iter()
                .filter(|o| !in_store.contains(o))
                .collect();
            assert!(
                missing.is_empty(),
                "data_safe while the store lacks {missing:?}"
            );
            break s;
        }
        if phase == "draining" {
            assert!(s["shutdown"]["operation"]["blocker"].is_string(), "{s}");
        } else {
            panic!("unexpected phase {phase}: {s}");
        }
        assert!(
            Instant::now() < deadline,
            "no data_safe within 30 s: {phases:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(phases, vec!["draining", "data_safe"]);
    assert_eq!(last["shutdown"]["operation"]["blocker"], Value::Null);
    assert_eq!(
        last["shutdown"]["operation"]["expected_generation"],
        generation.as_str()
    );
    assert_eq!(last["shutdown"]["control_only"], true);
    assert_eq!(
        last.as_object().unwrap().len(),
        1,
        "control-only /state holds only shutdown"
    );
    assert_eq!(m.health().await, Some(503));
    let r = m.remove_disk("op-a", &generation).await.unwrap();
    assert_eq!(r.status, 202, "a repeat returns the terminal result");
    assert_eq!(r.json()["operation"]["phase"], "data_safe");
    let r = m.remove_disk("op-b", &generation).await.unwrap();
    assert_eq!(r.status, 409);

    // data_safe meant it: delete the Pod and its disk; nothing is lost.
    let before = c
        .bed
        .identity(&c.client, c.ns(), &set.selector())
        .await
        .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(c.client.clone(), c.ns())
        .delete(&set.claim_name(0), &DeleteParams::default())
        .await
        .unwrap();
    c.delete_pod("sim-0", None).await;
    let pods = c.ready(&set, &[("sim-0".into(), pods::uid(target))]).await;
    let after = c
        .bed
        .identity(&c.client, c.ns(), &set.selector())
        .await
        .unwrap();
    let d = before.diff(&after);
    assert_eq!(d.claims_replaced, vec![set.claim_name(0)], "{d:?}");
    let fresh = pods::member(&pods[0]).unwrap();
    let s = fresh.state_json().await.unwrap();
    assert_ne!(s["shutdown"]["runtime_generation"], generation.as_str());
    assert_eq!(s["shutdown"]["operation"], Value::Null);
    assert_eq!(
        fresh.remove_disk("op-a", &generation).await.unwrap().status,
        409
    );
    ledger_check(
        &ledger,
        &pods::member_urls(&pods),
        "after removing sim-0's disk",
    )
    .await;
    ledger_phase(&mut ledger, &pods::member_urls(&pods), "phase 2").await;
    c.finish().await;
}
