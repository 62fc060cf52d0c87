//! The one-member-down sampler (docs/design.md "Oracles"): during a rollout, contraction or fault,
//! sample the members every second (from the API server: what the workload controller and the
//! operator see) and record a violation whenever more of them are missing, unready or terminating
//! than the scenario allows.
//!
//! ```no_run
//! # async fn f(client: kube::Client, ns: &str) {
//! use celld_testbed::sampler::{Expect, Sampler};
//! let sampler = Sampler::start(client, ns, Expect::StatefulSet("sim".into()), 1);
//! // … the scenario …
//! let report = sampler.finish().await;
//! report.assert_ok();                   // panics with every violating sample
//! assert!(report.max_down >= 1);        // optional: it did see the member go
//! # }
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Which members are expected.
#[derive(Debug, Clone)]
pub enum Expect {
    /// These Pod names.
    Names(Vec<String>),
    /// `<name>-0 … <name>-(replicas-1)`, with `spec.replicas` read at every sample.
    StatefulSet(String),
    /// `count` Pods matching a label selector (down = count − up Pods).
    Selector {
        /// Label selector.
        selector: String,
        /// Expected member count.
        count: usize,
    },
}

/// One sample's verdict.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Time since the sampler started.
    pub at: Duration,
    /// Members down and why (`missing`, `unready`, `terminating`).
    pub down: BTreeMap<String, &'static str>,
}

/// What the sampler saw.
#[derive(Debug, Clone, Default)]
pub struct SamplerReport {
    /// Samples taken.
    pub samples: usize,
    /// Most members down at once.
    pub max_down: usize,
    /// Members allowed down.
    pub allowed_down: usize,
    /// Samples with more than `allowed_down` members down.
    pub violations: Vec<Sample>,
    /// Samples that could not be taken (API errors).
    pub errors: Vec<String>,
}

impl SamplerReport {
    /// No violation and at least one sample.
    pub fn ok(&self) -> bool {
        self.violations.is_empty() && self.samples > 0
    }

    /// Readable account.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} samples, at most {} down (allowed {}), {} violations, {} sample errors",
            self.samples,
            self.max_down,
            self.allowed_down,
            self.violations.len(),
            self.errors.len()
        );
        for v in self.violations.iter().take(20) {
            s.push_str(&format!("\n  at {:?}: down {:?}", v.at, v.down));
        }
        for e in self.errors.iter().take(5) {
            s.push_str(&format!("\n  sample error: {e}"));
        }
        s
    }

    /// Panics with the summary unless [`SamplerReport::ok`].
    pub fn assert_ok(&self) {
        assert!(
            self.ok(),
            "one-member-down sampler failed: {}",
            self.summary()
        );
    }
}

/// A running sampler (a task on the caller's runtime).
pub struct Sampler {
    stop: watch::Sender<bool>,
    task: JoinHandle<SamplerReport>,
}

fn pod_up(p: &Pod) -> Result<(), &'static str> {
    if p.metadata.deletion_timestamp.is_some() {
        return Err("terminating");
    }
    let ready = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    if ready {
        Ok(())
    } else {
        Err("unready")
    }
}

/// Down members among `pods` when `names` are expected.
fn down_by_names(pods: &[Pod], names: &[String]) -> BTreeMap<String, &'static str> {
    let by_name: BTreeMap<&str, &Pod> = pods
        .iter()
        .map(|p| (p.metadata.name.as_deref().unwrap_or_default(), p))
        .collect();
    let mut down = BTreeMap::new();
    for n in names {
        match by_name.get(n.as_str()) {
            None => {
                down.insert(n.clone(), "missing");
            }
            Some(p) => {
                if let Err(why) = pod_up(p) {
                    down.insert(n.clone(), why);
                }
            }
        }
    }
    down
}

/// Down members when `count` Pods matching a selector are expected: `count − up` of them,
/// named by the unready/terminating Pods first, then `<missing #i>`.
fn down_by_count(pods: &[Pod], count: usize) -> BTreeMap<String, &'static str> {
    let mut not_up = Vec::new();
    let mut up = 0usize;
    for p in pods {
        match pod_up(p) {
            Ok(()) => up += 1,
            Err(why) => not_up.push((p.metadata.name.clone().unwrap_or_default(), why)),
        }
    }
    let n_down = count.saturating_sub(up);
    let mut down: BTreeMap<String, &'static str> = not_up.into_iter().take(n_down).collect();
    let mut i = 0;
    while down.len() < n_down {
        down.insert(format!("<missing #{i}>"), "missing");
        i += 1;
    }
    down
}

async fn sample(
    client: &Client,
    ns: &str,
    expect: &Expect,
) -> Result<BTreeMap<String, &'static str>, String> {
    let api = Api::<Pod>::namespaced(client.clone(), ns);
    let lp = match expect {
        Expect::Selector { selector, .. } => ListParams::default().labels(selector),
        _ => ListParams::default(),
    };
    let names = match expect {
        Expect::Names(n) => n.clone(),
        Expect::StatefulSet(name) => {
            let sts = Api::<StatefulSet>::namespaced(client.clone(), ns)
                .get(name)
                .await
                .map_err(|e| e.to_string())?;
            let replicas = sts.spec.and_then(|s| s.replicas).unwrap_or(1).max(0);
            (0..replicas).map(|i| format!("{name}-{i}")).collect()
        }
        Expect::Selector { .. } => Vec::new(),
    };
    let pods = api.list(&lp).await.map_err(|e| e.to_string())?.items;
    Ok(match expect {
        Expect::Selector { count, .. } => down_by_count(&pods, *count),
        _ => down_by_names(&pods, &names),
    })
}

impl Sampler {
    /// Starts sampling every second; `allowed_down` members may be down at once.
    pub fn start(client: Client, ns: &str, expect: Expect, allowed_down: usize) -> Sampler {
        Self::start_every(client, ns, expect, allowed_down, Duration::from_secs(1))
    }

    /// As [`Sampler::start`] with another period.
    pub fn start_every(
        client: Client,
        ns: &str,
        expect: Expect,
        allowed_down: usize,
        period: Duration,
    ) -> Sampler {
        let (stop, mut stopped) = watch::channel(false);
        let ns = ns.to_string();
        let task = tokio::spawn(async move {
            let start = Instant::now();
            let mut report = SamplerReport {
                allowed_down,
                ..SamplerReport::default()
            };
            loop {
                match sample(&client, &ns, &expect).await {
                    Ok(down) => {
                        report.samples += 1;
                        report.max_down = report.max_down.max(down.len());
                        if down.len() > allowed_down {
                            report.violations.push(Sample {
                                at: start.elapsed(),
                                down,
                            });
                        }
                    }
                    Err(e) => report.errors.push(e),
                }
                tokio::select! {
                    _ = tokio::time::sleep(period) => {}
                    _ = stopped.changed() => break,
                }
            }
            report
        });
        Sampler { stop, task }
    }

    /// Stops sampling and returns the report.
    pub async fn finish(self) -> SamplerReport {
        let _ = self.stop.send(true);
        self.task.await.expect("sampler task")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ready: bool, terminating: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "deletionTimestamp": terminating.then_some("2026-01-01T00:00:00Z"),
            },
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
        }))
        .unwrap()
    }

    #[test]
    fn names_missing_unready_and_terminating_members() {
        let names: Vec<String> = (0..4).map(|i| format!("m-{i}")).collect();
        let pods = [
            pod("m-0", true, false),
            pod("m-1", false, false),
            pod("m-2", true, true),
        ];
        let down = down_by_names(&pods, &names);
        assert_eq!(
            down,
            BTreeMap::from([
                ("m-1".to_string(), "unready"),
                ("m-2".to_string(), "terminating"),
                ("m-3".to_string(), "missing"),
            ])
        );
        assert!(down_by_names(&[pod("m-0", true, false)], &names[..1]).is_empty());
    }

    #[test]
    fn counts_down_members_by_selector() {
        let pods = [pod("a", true, false), pod("b", false, false)];
        assert_eq!(down_by_count(&pods, 2).len(), 1);
        assert_eq!(down_by_count(&pods, 3).len(), 2);
        // A surplus unready Pod (a surge) does not count when enough are up.
        assert!(down_by_count(&pods, 1).is_empty());
        assert_eq!(down_by_count(&[], 2).len(), 2);
    }
}
