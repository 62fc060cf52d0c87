//! Reading the operator's `/metrics`: API requests by verb and resource
//! (`celld_operator_api_requests_total`, counted by a tower layer on the operator's client,
//! src/metrics.rs), reconciles, reconcile errors and journal appends; the reflector-cache
//! figures (`celld_operator_reconcile_passes_total{pass}`,
//! `celld_operator_cache_escalations_total{cause}`, `celld_operator_fleets_reconciled`,
//! `celld_operator_leader_ready_seconds`), each `None` when the binary does not export it;
//! deltas between two scrapes; waiting until the operator is quiet; `/readyz`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Verbs that change something on the API server.
pub const WRITE_VERBS: [&str; 4] = ["create", "update", "patch", "delete"];

/// Resources whose requests are the leader-election loop, not fleet work.
pub const BACKGROUND_RESOURCES: [&str; 1] = ["leases"];

/// The part of a reaction `celld_operator_reaction_pass_seconds` times: the reconcile that
/// wrote, from its start to its guarded workload write.
pub const PASS_TO_WRITE: &str = "pass_to_write";

/// The part `celld_operator_reaction_wait_seconds` times: the fleet's earliest pending
/// trigger (a watch event, as it reached the operator) → the start of the reconcile that
/// wrote.
pub const TRIGGER_TO_PASS: &str = "trigger_to_pass";

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
    /// `celld_operator_reconcile_duration_seconds_sum`.
    pub reconcile_seconds: f64,
    /// `celld_operator_reconcile_errors_total` by reason.
    pub errors: BTreeMap<String, f64>,
    /// `celld_journal_appends_total` by entry type, summed over fleets.
    pub appends: BTreeMap<String, f64>,
    /// `celld_operator_reconcile_passes_total` by `pass` (`cached`, `fresh`); `None` when the
    /// operator does not export it.
    pub passes: Option<BTreeMap<String, f64>>,
    /// `celld_operator_cache_escalations_total` by `cause`; `None` when not exported.
    pub escalations: Option<BTreeMap<String, f64>>,
    /// `celld_operator_api_request_duration_seconds` by verb: `_sum` and `_count` (empty
    /// when the binary does not export it).
    pub request_seconds: BTreeMap<String, f64>,
    /// The same histogram's `_count` by verb.
    pub requests_timed: BTreeMap<String, f64>,
    /// `celld_operator_reaction_pass_seconds` (part `pass_to_write`) and
    /// `celld_operator_reaction_wait_seconds` (part `trigger_to_pass`) by `(part, le)`:
    /// cumulative bucket counts, with `le = "sum"` and `"count"` for the sum and the count
    /// (empty when not exported).
    pub reaction: BTreeMap<(String, String), f64>,
    /// `celld_operator_reaction_pass_requests` `_sum` and `_count` (keys `sum`, `count`;
    /// empty when not exported).
    pub reaction_requests: BTreeMap<String, f64>,
    /// `celld_operator_fleets_reconciled` (gauge); `None` when not exported.
    pub fleets_reconciled: Option<f64>,
    /// `celld_operator_leader_ready_seconds` (gauge, set once); `None` when not exported or
    /// still 0 (not set yet).
    pub leader_ready_seconds: Option<f64>,
    /// `celld_operator_leader` (1 while this replica holds the Lease).
    pub leader: Option<f64>,
    /// `celld_operator_cached_objects` (objects in the watch-fed caches); `None` when not
    /// exported.
    pub cached_objects: Option<f64>,
    /// `celld_operator_cached_bytes`; `None` when not exported (older binaries).
    pub cached_bytes: Option<f64>,
    /// `celld_operator_watch_connections`; `None` when not exported.
    pub watch_connections: Option<f64>,
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
            reconcile_seconds: self.reconcile_seconds - before.reconcile_seconds,
            request_seconds: sub(&self.request_seconds, &before.request_seconds),
            requests_timed: sub(&self.requests_timed, &before.requests_timed),
            reaction: sub(&self.reaction, &before.reaction),
            reaction_requests: sub(&self.reaction_requests, &before.reaction_requests),
            errors: sub(&self.errors, &before.errors),
            appends: sub(&self.appends, &before.appends),
            passes: self.passes.as_ref().map(|a| {
                let empty = BTreeMap::new();
                sub(a, before.passes.as_ref().unwrap_or(&empty))
            }),
            escalations: self.escalations.as_ref().map(|a| {
                let empty = BTreeMap::new();
                sub(a, before.escalations.as_ref().unwrap_or(&empty))
            }),
        }
    }

    /// Every request except the leader-election loop's (and watches with `ignore_watches`).
    fn fleet_work(&self, ignore_watches: bool) -> f64 {
        self.requests
            .iter()
            .filter(|((v, r), _)| {
                let lease = BACKGROUND_RESOURCES.contains(&r.as_str());
                let watch = ignore_watches && v == "watch";
                !lease && !watch
            })
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
    /// Seconds spent in reconciles (summed over the concurrent ones).
    pub reconcile_seconds: f64,
    /// Seconds the timed requests took, by verb.
    pub request_seconds: BTreeMap<String, f64>,
    /// Timed requests, by verb.
    pub requests_timed: BTreeMap<String, f64>,
    /// `celld_operator_reaction_pass_seconds` by `(part, le | "sum" | "count")`.
    pub reaction: BTreeMap<(String, String), f64>,
    /// `celld_operator_reaction_pass_requests` by `sum` and `count`.
    pub reaction_requests: BTreeMap<String, f64>,
    /// Failed reconciles by reason.
    pub errors: BTreeMap<String, f64>,
    /// Journal entries appended by type.
    pub appends: BTreeMap<String, f64>,
    /// Reconcile passes by `pass` (`None`: not exported by the operator).
    pub passes: Option<BTreeMap<String, f64>>,
    /// Cache escalations by `cause` (`None`: not exported by the operator).
    pub escalations: Option<BTreeMap<String, f64>>,
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
            reconcile_seconds: self.reconcile_seconds / n,
            request_seconds: div(&self.request_seconds),
            requests_timed: div(&self.requests_timed),
            reaction: self
                .reaction
                .iter()
                .map(|(k, v)| (k.clone(), v / n))
                .collect(),
            reaction_requests: div(&self.reaction_requests),
            errors: div(&self.errors),
            appends: div(&self.appends),
            passes: self.passes.as_ref().map(div),
            escalations: self.escalations.as_ref().map(div),
        }
    }

    /// Mean answer time of a request by verb, in ms (verbs with no timed request are left
    /// out; empty when the binary does not time requests).
    pub fn request_ms_by_verb(&self) -> BTreeMap<String, f64> {
        self.requests_timed
            .iter()
            .filter(|(_, n)| **n > 0.0)
            .map(|(verb, n)| {
                let secs = self.request_seconds.get(verb).copied().unwrap_or(0.0);
                (verb.clone(), secs * 1000.0 / n)
            })
            .collect()
    }

    /// Mean requests the reconcile that wrote sent up to and including its guarded workload
    /// write (`celld_operator_reaction_pass_requests`; `None` when not exported or none).
    pub fn reaction_requests_mean(&self) -> Option<f64> {
        let n = self.reaction_requests.get("count").copied().unwrap_or(0.0);
        (n > 0.0).then(|| self.reaction_requests.get("sum").copied().unwrap_or(0.0) / n)
    }

    /// `celld_operator_reaction_pass_seconds` by part: `[n, mean ms, p50, p90, p99]`, the
    /// quantiles as the upper bound (ms) of the bucket that holds them (empty when not
    /// exported).
    pub fn reaction_ms_by_part(&self) -> BTreeMap<String, [f64; 5]> {
        let mut out = BTreeMap::new();
        let parts: std::collections::BTreeSet<&String> =
            self.reaction.keys().map(|(p, _)| p).collect();
        for part in parts {
            let get = |le: &str| {
                self.reaction
                    .get(&(part.clone(), le.to_string()))
                    .copied()
                    .unwrap_or(0.0)
            };
            let n = get("count");
            if n <= 0.0 {
                continue;
            }
            let mut buckets: Vec<(f64, f64)> = self
                .reaction
                .iter()
                .filter(|((p, _), _)| p == part)
                .filter_map(|((_, le), c)| Some((le.parse::<f64>().ok()?, *c)))
                .collect();
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            let q = |q: f64| {
                buckets
                    .iter()
                    .find(|(_, c)| *c >= q * n)
                    .map_or(f64::INFINITY, |(le, _)| le * 1000.0)
            };
            out.insert(
                part.clone(),
                [n, get("sum") * 1000.0 / n, q(0.5), q(0.9), q(0.99)],
            );
        }
        out
    }

    /// Requests to the leader Lease (the leader-election loop).
    pub fn lease_requests(&self) -> f64 {
        self.count(|_, resource| BACKGROUND_RESOURCES.contains(&resource))
    }

    /// Every request except the Lease's.
    pub fn fleet_requests(&self) -> f64 {
        self.count(|_, resource| !BACKGROUND_RESOURCES.contains(&resource))
    }
}

/// `HTTP/1.1 GET path` on a loopback address: the status line and the body (the operator
/// answers and closes).
pub async fn http_get(addr: &str, path: &str) -> Result<(String, String)> {
    let fetch = async {
        let mut sock = tokio::net::TcpStream::connect(addr).await?;
        let req = format!("GET {path} HTTP/1.1\r\nhost: bench\r\nconnection: close\r\n\r\n");
        sock.write_all(req.as_bytes()).await?;
        let mut out = Vec::new();
        sock.read_to_end(&mut out).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&out).into_owned())
    };
    let raw = tokio::time::timeout(Duration::from_secs(10), fetch)
        .await
        .with_context(|| format!("GET http://{addr}{path} timed out"))?
        .with_context(|| format!("GET http://{addr}{path}"))?;
    let Some((head, body)) = raw.split_once("\r\n\r\n") else {
        bail!("malformed answer to GET {path}: {raw:.200}");
    };
    Ok((
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    ))
}

/// `/readyz` on the operator's health address answers 200.
pub async fn ready(addr: &str) -> bool {
    matches!(http_get(addr, "/readyz").await, Ok((status, _)) if status.starts_with("HTTP/1.1 200"))
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
        let (status, body) = http_get(&self.addr, "/metrics").await?;
        if !status.starts_with("HTTP/1.1 200") {
            bail!("/metrics answered {status}");
        }
        Ok(body)
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

    /// Waits until no request other than the Lease's was sent and no reconcile ran for
    /// `quiet`, polling every 250 ms, at most `max`; returns the last snapshot and whether it
    /// was quiet.
    pub async fn quiet(&self, quiet: Duration, max: Duration) -> Result<(Snapshot, bool)> {
        self.quiet_every(quiet, max, Duration::from_millis(250), false)
            .await
    }

    /// [`MetricsEndpoint::quiet`] polling every `poll` (the scale bed polls less often: with
    /// a thousand fleets one scrape is a few hundred KiB the operator has to encode), and
    /// with `ignore_watches` not counting watch (re-)opens as activity (hundreds of watch
    /// streams, each re-opened every few minutes, would leave no quiet gap at scale).
    pub async fn quiet_every(
        &self,
        quiet: Duration,
        max: Duration,
        poll: Duration,
        ignore_watches: bool,
    ) -> Result<(Snapshot, bool)> {
        let deadline = Instant::now() + max;
        let mut last = self.snapshot().await?;
        let mut last_change = Instant::now();
        loop {
            tokio::time::sleep(poll).await;
            let now = self.snapshot().await?;
            if now.fleet_work(ignore_watches) != last.fleet_work(ignore_watches)
                || now.reconciles != last.reconciles
            {
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
    // A family the operator registered but has no series of yet (e.g. no escalation so far)
    // shows only its `# TYPE` line: present, and empty.
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        match rest.split_whitespace().next().map(family) {
            Some("celld_operator_reconcile_passes") => {
                s.passes.get_or_insert_with(BTreeMap::new);
            }
            Some("celld_operator_cache_escalations") => {
                s.escalations.get_or_insert_with(BTreeMap::new);
            }
            _ => {}
        }
    }
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
        // The two reaction histograms, by part: `le` of each bucket, `sum`, `count`.
        let reaction = [
            ("celld_operator_reaction_pass_seconds_", PASS_TO_WRITE),
            ("celld_operator_reaction_wait_seconds_", TRIGGER_TO_PASS),
        ]
        .into_iter()
        .find_map(|(family, part)| Some((part, name.strip_prefix(family)?)));
        if let Some((part, stat)) = reaction {
            let key = match stat {
                "bucket" => bucket(&label("le")),
                "sum" | "count" => stat.to_string(),
                _ => continue,
            };
            s.reaction.insert((part.into(), key), value);
            continue;
        }
        match name {
            "celld_operator_api_requests_total" => {
                *s.requests
                    .entry((label("verb"), label("resource")))
                    .or_default() += value;
            }
            "celld_operator_reconcile_duration_seconds_count" => s.reconciles += value,
            "celld_operator_reconcile_duration_seconds_sum" => s.reconcile_seconds += value,
            "celld_operator_api_request_duration_seconds_sum" => {
                *s.request_seconds.entry(label("verb")).or_default() += value;
            }
            "celld_operator_api_request_duration_seconds_count" => {
                *s.requests_timed.entry(label("verb")).or_default() += value;
            }
            "celld_operator_reaction_pass_requests_sum" => {
                s.reaction_requests.insert("sum".into(), value);
            }
            "celld_operator_reaction_pass_requests_count" => {
                s.reaction_requests.insert("count".into(), value);
            }
            "celld_operator_reconcile_errors_total" => {
                *s.errors.entry(label("reason")).or_default() += value;
            }
            "celld_journal_appends_total" => {
                *s.appends.entry(label("type")).or_default() += value;
            }
            _ => match family(name) {
                "celld_operator_reconcile_passes" => {
                    *s.passes
                        .get_or_insert_with(BTreeMap::new)
                        .entry(label("pass"))
                        .or_default() += value;
                }
                "celld_operator_cache_escalations" => {
                    *s.escalations
                        .get_or_insert_with(BTreeMap::new)
                        .entry(label("cause"))
                        .or_default() += value;
                }
                "celld_operator_fleets_reconciled" => s.fleets_reconciled = Some(value),
                "celld_operator_leader_ready_seconds" if value > 0.0 => {
                    s.leader_ready_seconds = Some(value);
                }
                "celld_operator_leader" => s.leader = Some(value),
                "celld_operator_cached_objects" => s.cached_objects = Some(value),
                "celld_operator_cached_bytes" => s.cached_bytes = Some(value),
                "celld_operator_watch_connections" => s.watch_connections = Some(value),
                _ => {}
            },
        }
    }
    // prometheus_client writes nothing at all for a family without series (not even `# TYPE`),
    // so a binary that counts passes and escalations but has none yet looks like one that does
    // not export them. The gauges of the same release are always written: with them, an
    // absent family is an empty one.
    if s.fleets_reconciled.is_some() || s.cached_objects.is_some() {
        s.passes.get_or_insert_with(BTreeMap::new);
        s.escalations.get_or_insert_with(BTreeMap::new);
    }
    s
}

/// A metric family's name without the counter suffix `_total`.
/// A histogram bucket's `le` as the bench keys it (`+Inf` as `inf`).
fn bucket(le: &str) -> String {
    match le {
        "+Inf" => "inf".to_string(),
        le => le.to_string(),
    }
}

fn family(name: &str) -> &str {
    name.strip_suffix("_total").unwrap_or(name)
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
        assert_eq!(d.lease_requests(), 2.0);
        assert_eq!(d.fleet_requests(), 4.0);
        assert!(d.reaction_ms_by_part().is_empty(), "not exported");
        assert_eq!(d.reaction_requests_mean(), None, "not exported");
        assert_eq!((d.passes, d.escalations), (None, None), "not exported");
        let reacted = parse(
            "celld_operator_reaction_pass_seconds_bucket{le=\"0.001\"} 0\n\
             celld_operator_reaction_pass_seconds_bucket{le=\"0.002\"} 5\n\
             celld_operator_reaction_pass_seconds_bucket{le=\"0.004\"} 9\n\
             celld_operator_reaction_pass_seconds_bucket{le=\"+Inf\"} 10\n\
             celld_operator_reaction_pass_seconds_sum 0.05\n\
             celld_operator_reaction_pass_seconds_count 10\n\
             celld_operator_reaction_pass_requests_bucket{le=\"1.0\"} 0\n\
             celld_operator_reaction_pass_requests_sum 65.0\n\
             celld_operator_reaction_pass_requests_count 10\n\
             celld_operator_reaction_wait_seconds_bucket{le=\"0.001\"} 2\n\
             celld_operator_reaction_wait_seconds_bucket{le=\"0.002\"} 8\n\
             celld_operator_reaction_wait_seconds_bucket{le=\"+Inf\"} 8\n\
             celld_operator_reaction_wait_seconds_sum 0.012\n\
             celld_operator_reaction_wait_seconds_count 8\n",
        )
        .since(&before);
        assert_eq!(reacted.reaction_requests_mean(), Some(6.5));
        assert_eq!(
            reacted.reaction_ms_by_part(),
            BTreeMap::from([
                (
                    "pass_to_write".to_string(),
                    [10.0, 5.0, 2.0, 4.0, f64::INFINITY]
                ),
                ("trigger_to_pass".to_string(), [8.0, 1.5, 2.0, 2.0, 2.0])
            ])
        );
        let gauges_only = parse("celld_operator_fleets_reconciled 0\n");
        assert_eq!(
            (gauges_only.passes, gauges_only.escalations),
            (Some(BTreeMap::new()), Some(BTreeMap::new())),
            "exported by this release, no series yet"
        );
        assert_eq!(after.fleets_reconciled, None);
    }

    #[test]
    fn cache_figures_are_read_when_present_and_none_when_absent() {
        let before = parse(
            "# TYPE celld_operator_reconcile_passes counter\n\
             celld_operator_reconcile_passes_total{pass=\"cached\"} 10\n\
             # TYPE celld_operator_cache_escalations counter\n\
             # TYPE celld_operator_fleets_reconciled gauge\n\
             celld_operator_fleets_reconciled 3\n\
             # TYPE celld_operator_leader_ready_seconds gauge\n\
             celld_operator_leader_ready_seconds 0\n\
             celld_operator_leader 1\n",
        );
        assert_eq!(
            before.escalations,
            Some(BTreeMap::new()),
            "registered, no series yet"
        );
        assert_eq!(before.leader_ready_seconds, None, "0 is not set yet");
        assert_eq!(before.leader, Some(1.0));
        let after = parse(
            "celld_operator_reconcile_passes_total{pass=\"cached\"} 25\n\
             celld_operator_reconcile_passes_total{pass=\"fresh\"} 2\n\
             celld_operator_cache_escalations_total{cause=\"get statefulsets\"} 2\n\
             celld_operator_fleets_reconciled 5\n\
             celld_operator_leader_ready_seconds 1.25\n",
        );
        assert_eq!(after.fleets_reconciled, Some(5.0));
        assert_eq!(after.leader_ready_seconds, Some(1.25));
        let d = after.since(&before);
        let passes = d.passes.expect("exported");
        assert_eq!((passes["cached"], passes["fresh"]), (15.0, 2.0));
        assert_eq!(d.escalations.expect("exported")["get statefulsets"], 2.0);
    }
}
