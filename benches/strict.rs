//! `make bench-strict`: wall time and API writes of strict operations on the real cluster with
//! simulator members and the real store (median of 3 each):
//!
//! - one Retire contraction step of a PersistentFleet (6→5, 5→4, 4→3);
//! - a coordinated restart of 3 and of 5 members (disks kept).
//!
//! Each run's time is split from its journal entries (their `at` is taken when they are
//! appended): **runtime** = first `proof/<m>` request → last `ProofCaptured` (the members
//! draining to data-safe); **Kubernetes** = the destructive write (`replicas`/`stop`) → the next
//! entry (its Pods gone) plus `resume` → `Observed` (the rollout), both including the operator's
//! wake-up latency; **operator** = the rest (deciding, requesting, re-validating, recording).
//! API writes are the operator's accepted writes in the audit log (its User-Agent) between the
//! Intent and the Completed entry, by resource.

use std::collections::BTreeMap;

use celld_harness::operator::OperatorProcess;
use celld_operator::api::CelldFleet;
use celld_testbed::audit::AuditQuery;
use celld_testbed::TestBed;
use journal::{EntryBody, Step};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

#[path = "../tests/sim_common/mod.rs"]
mod sim_common;
use sim_common::*;

#[derive(Debug, Default, Clone)]
struct Sample {
    wall: f64,
    runtime: f64,
    kubernetes: f64,
    operator: f64,
    writes: BTreeMap<String, usize>,
}

fn secs(a: chrono::DateTime<chrono::Utc>, b: chrono::DateTime<chrono::Utc>) -> f64 {
    (b - a).num_milliseconds() as f64 / 1000.0
}

fn split(o: &journal::Operation) -> Sample {
    let e = o.entries();
    let at = |f: &dyn Fn(&EntryBody) -> bool| -> Vec<chrono::DateTime<chrono::Utc>> {
        e.iter().filter(|x| f(x.body())).map(|x| x.at()).collect()
    };
    let start = e.first().unwrap().at();
    let end = e.last().unwrap().at();
    let first_ask = at(&|b| matches!(b, EntryBody::Issued(i) if matches!(i.step, Step::Proof(_))))
        .into_iter()
        .min()
        .unwrap();
    let last_proof = at(&|b| matches!(b, EntryBody::ProofCaptured(_)))
        .into_iter()
        .max()
        .unwrap();
    let mut kubernetes = 0.0;
    for (i, x) in e.iter().enumerate() {
        if let EntryBody::Issued(is) = x.body() {
            if matches!(is.step, Step::Replicas | Step::Stop) {
                if let Some(next) = e.get(i + 1) {
                    kubernetes += secs(x.at(), next.at());
                }
            }
            if is.step == Step::Resume {
                let observed = at(&|b| matches!(b, EntryBody::Observed(_)))[0];
                kubernetes += secs(x.at(), observed);
            }
        }
    }
    let wall = secs(start, end);
    let runtime = secs(first_ask, last_proof);
    Sample {
        wall,
        runtime,
        kubernetes,
        operator: wall - runtime - kubernetes,
        writes: BTreeMap::new(),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn report(name: &str, samples: &[Sample]) -> serde_json::Value {
    let m = |f: fn(&Sample) -> f64| median(samples.iter().map(f).collect());
    let mut writes: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for s in samples {
        for (k, v) in &s.writes {
            writes.entry(k.clone()).or_default().push(*v as f64);
        }
    }
    let writes: BTreeMap<String, f64> = writes.into_iter().map(|(k, v)| (k, median(v))).collect();
    println!(
        "{name:<44} {:>7.1} s {:>8.1} s {:>10.1} s {:>8.1} s   {}",
        m(|s| s.wall),
        m(|s| s.runtime),
        m(|s| s.kubernetes),
        m(|s| s.operator),
        writes
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    json!({"name": name, "runs": samples.len(), "wall_s": m(|s| s.wall), "runtime_s": m(|s| s.runtime),
           "kubernetes_s": m(|s| s.kubernetes), "operator_s": m(|s| s.operator), "writes": writes,
           "samples": samples.iter().map(|s| json!({"wall_s": s.wall, "runtime_s": s.runtime,
               "kubernetes_s": s.kubernetes, "operator_s": s.operator, "writes": s.writes})).collect::<Vec<_>>()})
}

fn operator_writes(audit: &celld_testbed::audit::AuditLog, ns: &str) -> BTreeMap<String, usize> {
    let q = AuditQuery::writes().namespace(ns).successful();
    let mut out = BTreeMap::new();
    for e in audit.query(&q).unwrap() {
        if e.user_agent.starts_with("celld-operator/") {
            let key = match &e.subresource {
                Some(s) => format!("{} {}/{s}", e.verb, e.resource),
                None => format!("{} {}", e.verb, e.resource),
            };
            *out.entry(key).or_default() += 1;
        }
    }
    out
}

async fn newest(api: &Api<CelldFleet>, name: &str) -> journal::Operation {
    let f = api.get(name).await.unwrap();
    celld_operator::journal_store::load(&f)
        .unwrap()
        .fold()
        .operations()
        .last()
        .unwrap()
        .clone()
}

async fn retire_steps(bed: &TestBed, client: &kube::Client) -> Vec<Sample> {
    let ns = fleet_namespace(bed, client, "bench-retire").await;
    let bucket = bed.unique_bucket("benchr").unwrap();
    let op = OperatorProcess::start(&operator_options(bed, "bench-retire", &ns.name, None));
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let mut f = sim_fleet(
        "br",
        6,
        &bucket,
        json!({"zones": ["us-east-1a"], "azCount": 1, "mode": "Relaxed"}),
    );
    f.spec.storage.on_scale_in = Some(celld_operator::api::OnScaleIn::Retire);
    api.create(&PostParams::default(), &f).await.unwrap();
    wait_settled(&api, "br", 6, &op.log).await;
    let mut samples = Vec::new();
    for n in [5, 4, 3] {
        let audit = bed.audit();
        api.patch(
            "br",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": n}})),
        )
        .await
        .unwrap();
        wait_settled(&api, "br", n, &op.log).await;
        poll_until("the Retire to complete", 60, &op.log, || async {
            !newest(&api, "br").await.is_open()
        })
        .await;
        let mut s = split(&newest(&api, "br").await);
        s.writes = operator_writes(&audit, &ns.name);
        eprintln!("[bench-strict] Retire {}->{n}: {s:?}", n + 1);
        samples.push(s);
    }
    ns.delete_and_wait().await.unwrap();
    drop(op);
    samples
}

async fn coordinated(bed: &TestBed, client: &kube::Client, members: i32) -> Vec<Sample> {
    let tag = format!("bench-coord-{members}");
    let ns = fleet_namespace(bed, client, &tag).await;
    let bucket = bed.unique_bucket("benchc").unwrap();
    let op = OperatorProcess::start(&operator_options(bed, &tag, &ns.name, None));
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let mut f = sim_fleet(
        "bc",
        members,
        &bucket,
        json!({"zones": ["us-east-1a"], "azCount": 1, "mode": "Relaxed"}),
    );
    f.spec.maintenance = serde_json::from_value(json!({"allowCoordinatedDowntime": true})).ok();
    api.create(&PostParams::default(), &f).await.unwrap();
    wait_settled(&api, "bc", members, &op.log).await;
    let mut samples = Vec::new();
    for i in 0..3 {
        let token = format!("bench-{i}");
        let audit = bed.audit();
        api.patch(
            "bc",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"maintenance": {"restartToken": token}}})),
        )
        .await
        .unwrap();
        wait_token_applied(&api, "bc", &token, 300, &op.log).await;
        wait_settled(&api, "bc", members, &op.log).await;
        let mut s = split(&newest(&api, "bc").await);
        s.writes = operator_writes(&audit, &ns.name);
        eprintln!("[bench-strict] coordinated restart of {members} #{i}: {s:?}");
        samples.push(s);
    }
    ns.delete_and_wait().await.unwrap();
    drop(op);
    samples
}

#[tokio::main]
async fn main() {
    let bed = TestBed::shared().await;
    let _store = bed.store_shared().await;
    let client = bed.client().await.unwrap();
    let retire = retire_steps(bed, &client).await;
    let c3 = coordinated(bed, &client, 3).await;
    let c5 = coordinated(bed, &client, 5).await;
    println!();
    println!(
        "{:<44} {:>9} {:>10} {:>12} {:>10}   operator writes (median)",
        "strict operation (median of 3)", "wall", "runtime", "Kubernetes", "operator"
    );
    let rows = vec![
        report("Retire contraction step (PersistentFleet)", &retire),
        report("Coordinated restart, 3 members (Retain)", &c3),
        report("Coordinated restart, 5 members (Retain)", &c5),
    ];
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench/strict.json");
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    std::fs::write(&out, serde_json::to_string_pretty(&rows).unwrap()).unwrap();
    println!("JSON: {}", out.display());
}
