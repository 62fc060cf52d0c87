//! Reading the operator's `/metrics`: API requests by verb and resource
//! (`celld_operator_api_requests_total`, counted by a tower layer on the operator's client,
//! src/metrics.rs), reconciles, reconcile errors and journal appends; deltas between two
//! scrapes; waiting until the operator is quiet.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Verbs that change something on the API server.
pub const WRITE_VERBS: [&str; 4] = ["create", "update", "patch", "delete"];

/// Resources whose requests are the leader-election loop, not fleet work.
pub const BACKGROUND_RESOURCES: [&str; 1] = ["leases"];

/// `(verb, resource)` → count.
pub type Requests = BTreeMap<(String, String), f64>;

/// One scrape of the counters the bench uses.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// When it was taken (bench clock).
    pub at: Option<Instant>,
    /// `celld_operator_api_requests_total` by `(verb, resource)`.
    pub requests: Requests,
    /// `celld_operator_reconcile_duration_seconds_count`.
    pub reconciles: f64,
    /// `celld_operator_reconcile_errors_total` by reason.
    pub errors: BTreeMap<String, f64>,
    /// `celld_journal_appends_total` by entry type, summed over fleets.
    pub appends: BTreeMap<String, f64>,
}

impl Snapshot {
    /// Counters of `self` minus those of `before` (series absent before count from 0).
    pub fn since(&self, before: &Snapshot) -> Delta {
        fn sub<K: Ord + Clone>(a: &BTreeMap<K, f64>, b: &BTreeMap<K, f64>) -> BTreeMap<K, f64> {
            a.iter()
                .map(|(k, v)| (k.clone(), v - b.get(k).copied().unwrap_or(0.0)))
                .filter(|(_, v)| *v != 0.0)
                .collect()
        }
        Delta {
            seconds: match (self.at, before.at) {
                (Some(a), Some(b)) => a.duration_since(b).as_secs_f64(),
                _ => 0.0,
            },
            requests: sub(&self.requests, &before.requests),
            reconciles: self.reconciles - before.reconciles,
            errors: sub(&self.errors, &before.errors),
            appends: sub(&self.appends, &before.appends),
        }
    }

    /// Every request except the leader-election loop's.
    fn fleet_work(&self) -> f64 {
        self.requests
            .iter()
            .filter(|((_, r), _)| !BACKGROUND_RESOURCES.contains(&r.as_str()))
            .map(|(_, v)| v)
            .sum()
    }
}

/// What happened between two scrapes.
#[derive(Debug, Clone, Default)]
pub struct Delta {
    /// Wall time between the scrapes.
    pub seconds: f64,
    /// Requests by `(verb, resource)`.
    pub requests: Requests,
    /// Reconciles run.
    pub reconciles: f64,
    /// Failed reconciles by reason.
    pub errors: BTreeMap<String, f64>,
    /// Journal entries appended by type.
    pub appends: BTreeMap<String, f64>,
}

impl Delta {
    /// Requests with a write verb, leases excluded.
    pub fn writes(&self) -> f64 {
        self.count(|verb, resource| {
            WRITE_VERBS.contains(&verb) && !BACKGROUND_RESOURCES.contains(&resource)
        })
    }

    /// `get` and `list` requests, leases excluded.
    pub fn reads(&self) -> f64 {
        self.count(|verb, resource| {
            matches!(verb, "get" | "list") && !BACKGROUND_RESOURCES.contains(&resource)
        })
    }

    /// Requests matching `keep(verb, resource)`.
    pub fn count(&self, keep: impl Fn(&str, &str) -> bool) -> f64 {
        self.requests
            .iter()
            .filter(|((v, r), _)| keep(v, r))
            .map(|(_, n)| n)
            .sum::<f64>()
            + 0.0 // an empty sum is -0.0
    }

    /// Every counter divided by `n` (e.g. a whole contraction → per removed member).
    pub fn per(&self, n: f64) -> Delta {
        let div = |m: &BTreeMap<String, f64>| m.iter().map(|(k, v)| (k.clone(), v / n)).collect();
        Delta {
            seconds: self.seconds / n,
            requests: self
                .requests
                .iter()
                .map(|(k, v)| (k.clone(), v / n))
                .collect(),
            reconciles: self.reconciles / n,
            errors: div(&self.errors),
            appends: div(&self.appends),
        }
    }
}

/// The operator's metrics endpoint.
#[derive(Debug, Clone)]
pub struct MetricsEndpoint {
    /// `127.0.0.1:PORT`.
    pub addr: String,
}

impl MetricsEndpoint {
    /// `GET /metrics` (plain HTTP/1.1; the operator answers and closes).
    pub async fn text(&self) -> Result<String> {
        let fetch = async {
            let mut sock = tokio::net::TcpStream::connect(&self.addr).await?;
            sock.write_all(b"GET /metrics HTTP/1.1\r\nhost: bench\r\nconnection: close\r\n\r\n")
                .await?;
            let mut out = String::new();
            sock.read_to_string(&mut out).await?;
            Ok::<_, std::io::Error>(out)
        };
        let raw = tokio::time::timeout(Duration::from_secs(10), fetch)
            .await
            .context("scraping /metrics timed out")?
            .with_context(|| format!("scraping http://{}/metrics", self.addr))?;
        let Some((head, body)) = raw.split_once("\r\n\r\n") else {
            bail!("malformed /metrics answer: {raw:.200}");
        };
        if !head.starts_with("HTTP/1.1 200") {
            bail!("/metrics answered {}", head.lines().next().unwrap_or(""));
        }
        Ok(body.to_string())
    }

    /// One snapshot of the counters.
    pub async fn snapshot(&self) -> Result<Snapshot> {
        let text = self.text().await?;
        let mut s = parse(&text);
        s.at = Some(Instant::now());
        Ok(s)
    }

    /// `celld_operator_leader` is 1.
    pub async fn is_leader(&self) -> bool {
        match self.text().await {
            Ok(text) => text
                .lines()
                .any(|l| l.trim_end() == "celld_operator_leader 1"),
            Err(_) => false,
        }
    }

    /// Waits until no request other than the Lease's was sent for `quiet`, polling every
    /// 250 ms, at most `max`; returns the last snapshot and whether it was quiet.
    pub async fn quiet(&self, quiet: Duration, max: Duration) -> Result<(Snapshot, bool)> {
        let deadline = Instant::now() + max;
        let mut last = self.snapshot().await?;
        let mut last_change = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let now = self.snapshot().await?;
            if now.fleet_work() != last.fleet_work() || now.reconciles != last.reconciles {
                last_change = Instant::now();
            }
            last = now;
            if last_change.elapsed() >= quiet {
                return Ok((last, true));
            }
            if Instant::now() >= deadline {
                return Ok((last, false));
            }
        }
    }
}

/// `name{k="v",…} value` lines → the bench's counters.
pub fn parse(text: &str) -> Snapshot {
    let mut s = Snapshot::default();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => (n, labels_of(rest.trim_end_matches('}'))),
            None => (series, BTreeMap::new()),
        };
        let label = |k: &str| labels.get(k).cloned().unwrap_or_default();
        match name {
            "celld_operator_api_requests_total" => {
                *s.requests
                    .entry((label("verb"), label("resource")))
                    .or_default() += value;
            }
            "celld_operator_reconcile_duration_seconds_count" => s.reconciles += value,
            "celld_operator_reconcile_errors_total" => {
                *s.errors.entry(label("reason")).or_default() += value;
            }
            "celld_journal_appends_total" => {
                *s.appends.entry(label("type")).or_default() += value;
            }
            _ => {}
        }
    }
    s
}

/// `k="v",k2="v2"` (label values here never contain quotes or commas).
fn labels_of(text: &str) -> BTreeMap<String, String> {
    text.split("\",")
        .filter_map(|kv| kv.split_once("=\""))
        .map(|(k, v)| (k.to_string(), v.trim_end_matches('"').to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operators_exposition_is_parsed_into_counters_and_deltas() {
        let before = parse(
            "# HELP x\n\
             celld_operator_api_requests_total{verb=\"get\",resource=\"pods\"} 3\n\
             celld_operator_api_requests_total{verb=\"update\",resource=\"leases\"} 10\n\
             celld_operator_reconcile_duration_seconds_count 4\n\
             # EOF\n",
        );
        let after = parse(
            "celld_operator_api_requests_total{verb=\"get\",resource=\"pods\"} 5\n\
             celld_operator_api_requests_total{verb=\"update\",resource=\"leases\"} 12\n\
             celld_operator_api_requests_total{verb=\"patch\",resource=\"celldfleets/status\"} 2\n\
             celld_operator_reconcile_duration_seconds_count 7\n\
             celld_operator_reconcile_errors_total{reason=\"Conflict\"} 1\n\
             celld_journal_appends_total{namespace=\"n\",fleet=\"a\",type=\"Intent\"} 1\n\
             celld_journal_appends_total{namespace=\"n\",fleet=\"b\",type=\"Intent\"} 2\n",
        );
        let d = after.since(&before);
        assert_eq!(d.writes(), 2.0, "the Lease update is not fleet work");
        assert_eq!(d.reads(), 2.0);
        assert_eq!(d.reconciles, 3.0);
        assert_eq!(d.errors["Conflict"], 1.0);
        assert_eq!(d.appends["Intent"], 3.0);
        assert_eq!(d.per(2.0).writes(), 1.0);
    }
}
