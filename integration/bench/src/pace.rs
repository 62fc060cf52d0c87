//! The machine's pace when a design's figures are taken.
//!
//! The scale bed runs on a machine it shares with the control plane, and that machine may be
//! shared with more: two runs of the same operator binary a few hours apart have measured its
//! start-up CPU seconds for the same work 1.6 times apart, and the API server's answers 3 times
//! as slow (integration/bench/README.md "The machine's pace"). Figures of different runs are only
//! comparable when the machine was as fast, so each design records, right after its at-rest
//! window (every fleet settled, the operator quiet):
//!
//! - a fixed single-thread task of the bench process: dependent reads spread over a 32 MiB table
//!   (a core's speed and its memory's latency), the median of 5 runs;
//! - the API server's answer to 40 GETs of one Namespace, one after the other;
//! - its answer to 20 merge PATCHes of one ConfigMap in a namespace of the bench's own, one
//!   after the other (a write through admission, etcd and the audit log).
//!
//! Nothing here is asserted: the figures say how fast the machine was, next to what was measured
//! on it.

use crate::bed::{Bed, BENCH_LABEL};
use crate::stats::{self, Summary};
use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde::Serialize;
use serde_json::json;
use std::time::Instant;

/// Table entries of the CPU probe (32 MiB of `u64`).
const TABLE: usize = 1 << 22;
/// Dependent reads per probe run.
const READS: usize = 1 << 21;

/// The machine's pace at one instant of the run.
#[derive(Debug, Clone, Serialize)]
pub struct Pace {
    /// The bench's fixed single-thread task, ms (5 runs).
    pub cpu_probe_ms: Option<Summary>,
    /// GET of one Namespace, ms (40 in a row).
    pub api_get_ms: Option<Summary>,
    /// Merge PATCH of one ConfigMap, ms (20 in a row).
    pub api_patch_ms: Option<Summary>,
}

/// One run of the CPU probe: milliseconds, and the walk's end (kept so the loop is not elided).
fn cpu_probe(table: &[u64]) -> (f64, u64) {
    let started = Instant::now();
    let mask = (table.len() - 1) as u64;
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    for _ in 0..READS {
        x = table[(x & mask) as usize] ^ x.rotate_left(17).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    }
    (started.elapsed().as_secs_f64() * 1e3, x)
}

/// The table the probe walks: a fixed pseudo-random permutation of values.
fn probe_table() -> Vec<u64> {
    let mut s = 0x2545_f491_4f6c_dd1d_u64;
    (0..TABLE)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        })
        .collect()
}

/// Measures the machine's pace now (see the module documentation).
pub async fn measure(bed: &Bed) -> Result<Pace> {
    let cpu = tokio::task::spawn_blocking(|| {
        let table = probe_table();
        let runs: Vec<(f64, u64)> = (0..5).map(|_| cpu_probe(&table)).collect();
        std::hint::black_box(runs.iter().fold(0, |a, r| a ^ r.1));
        runs.into_iter().map(|r| r.0).collect::<Vec<f64>>()
    })
    .await
    .context("the CPU probe")?;

    let namespaces = Api::<Namespace>::all(bed.client.clone());
    let mut gets = Vec::with_capacity(40);
    for _ in 0..40 {
        let started = Instant::now();
        namespaces
            .get("default")
            .await
            .context("GET namespace default")?;
        gets.push(started.elapsed().as_secs_f64() * 1e3);
    }

    let ns = format!("bench-pace-{}", bed.run_id);
    let created = namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": ns, "labels": {BENCH_LABEL: "true"}}
            }))?,
        )
        .await;
    if let Err(e) = created {
        if !already_exists(&e) {
            return Err(e).with_context(|| format!("creating namespace {ns}"));
        }
    }
    let maps = Api::<ConfigMap>::namespaced(bed.client.clone(), &ns);
    let created = maps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "pace"}}))?,
        )
        .await;
    if let Err(e) = created {
        if !already_exists(&e) {
            return Err(e).context("creating ConfigMap pace");
        }
    }
    let mut patches = Vec::with_capacity(20);
    for i in 0..20 {
        let started = Instant::now();
        maps.patch(
            "pace",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"i": i.to_string()}})),
        )
        .await
        .context("PATCH ConfigMap pace")?;
        patches.push(started.elapsed().as_secs_f64() * 1e3);
    }
    Ok(Pace {
        cpu_probe_ms: stats::summarize(&cpu),
        api_get_ms: stats::summarize(&gets),
        api_patch_ms: stats::summarize(&patches),
    })
}

fn already_exists(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_probe_walks_the_whole_table_deterministically() {
        let table = probe_table();
        assert_eq!(table.len(), TABLE);
        let (ms_a, end_a) = cpu_probe(&table);
        let (_, end_b) = cpu_probe(&table);
        assert_eq!(end_a, end_b, "the same table gives the same walk");
        assert!(ms_a > 0.0);
        let distinct: std::collections::HashSet<u64> = table[..1000].iter().copied().collect();
        assert_eq!(distinct.len(), 1000, "the table is not degenerate");
    }
}
