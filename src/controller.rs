//! `celld-operator run`: the controller process (docs/design.md "Controller, watches and requeue",
//! "Command line").

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use journal::{Budget, Leader, Mirror, MirrorOptions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::WatchStreamExt;
use kube::{Api, Resource, ResourceExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::api::CelldFleet;
use crate::cli::{LogFormat, RunArgs};
use crate::compact_store::CompactFleet;
use crate::leader::{self, Leadership};
use crate::reconcile::{self, Ctx, Next};
use crate::render::RenderSettings;

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,kube=warn,tower=warn,hyper=warn")
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Plain => builder.init(),
    }
}

/// `:8082` → `0.0.0.0:8082`; `0` → off.
fn bind_address(s: &str) -> anyhow::Result<Option<SocketAddr>> {
    if s == "0" || s.is_empty() {
        return Ok(None);
    }
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_string()
    };
    Ok(Some(full.parse().map_err(|e| anyhow::anyhow!("{s}: {e}"))?))
}

/// Binds the `what` endpoint at `spec` (`0` or empty: disabled).
async fn listen(what: &str, spec: &str) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    let Some(addr) = bind_address(spec)? else {
        return Ok(None);
    };
    tokio::net::TcpListener::bind(addr)
        .await
        .map(Some)
        .map_err(|e| anyhow::anyhow!("cannot serve the {what} endpoint on {addr}: {e}"))
}

/// A minimal HTTP/1.1 responder: `route(path)` gives the 200 body, `None` is a 503 for
/// `/readyz` and a 404 elsewhere.
async fn serve<F>(listener: tokio::net::TcpListener, route: F) -> anyhow::Result<()>
where
    F: Fn(&str) -> Option<String> + Send + Sync + 'static,
{
    let route = Arc::new(route);
    loop {
        let (mut sock, _) = listener.accept().await?;
        let route = route.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let n = sock.read(&mut buf).await.unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]);
            let path = req.split_whitespace().nth(1).unwrap_or("/").to_string();
            let (status, body) = match route(&path) {
                Some(body) => ("200 OK", body),
                None if path == "/readyz" => ("503 Service Unavailable", "not ready".to_string()),
                None => ("404 Not Found", "not found".to_string()),
            };
            let resp = format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(resp.as_bytes()).await;
        });
    }
}

/// On gaining the Lease (docs/journal.md "Replay"): reconcile the local mirror with every
/// fleet's annotation before driving anything. Missing entries are backfilled; a mirror that
/// disagrees or is ahead keeps its entries under `diverged` and a Warning Event
/// (`JournalDiverged`, `JournalRollback`) says so. The annotation stays the authority.
async fn replay_mirror(ctx: &Ctx, apis: &[Api<CelldFleet>]) -> anyhow::Result<()> {
    use kube::runtime::events::{Event, EventType};
    let Some(mirror) = &ctx.mirror else {
        return Ok(());
    };
    let mut fleets = Vec::new();
    for api in apis {
        fleets.extend(api.list(&Default::default()).await?.items);
    }
    for fleet in fleets {
        if let (Some(w), Some(ns)) = (&ctx.watches, fleet.namespace()) {
            w.track(&ns, &fleet.name_any(), &fleet.uid().unwrap_or_default());
        }
        let Some(text) = fleet
            .annotations()
            .get(crate::api::keys::JOURNAL_ANNOTATION)
        else {
            continue;
        };
        // Only a verified chain of this very fleet may reconcile the mirror: a damaged or
        // copied annotation must not move the mirror's good entries aside (the fleet
        // reports JournalInvalid instead, and the mirror is what restores it).
        let Ok(verified) = journal::Journal::load(Some(text), &fleet.uid().unwrap_or_default())
        else {
            continue;
        };
        let plan = match mirror.reconcile(verified.document()) {
            Ok(plan) => plan,
            Err(e @ journal::MirrorError::DiskFailed(_)) => {
                let key = format!(
                    "{}/{}",
                    fleet.namespace().unwrap_or_default(),
                    fleet.name_any()
                );
                exit_on_failed_mirror(&key, &e)
            }
            Err(e) => {
                tracing::warn!(fleet = %fleet.name_any(), error = %e, "mirror reconcile failed");
                continue;
            }
        };
        for signal in &plan.signals {
            let (reason, note) = match signal {
                journal::Signal::JournalDiverged { first_seq } => (
                    "JournalDiverged",
                    format!("The local mirror disagrees with the journal annotation from seq {first_seq}; the annotation wins and the mirror's entries were kept under `diverged`"),
                ),
                journal::Signal::JournalRollback { annotation_seq, mirror_seq } => (
                    "JournalRollback",
                    format!("The journal annotation (seq {annotation_seq}) is older than the local mirror (seq {mirror_seq}), e.g. restored from a backup; the mirror's extra entries were kept under `diverged` and effects found in the world are never reissued"),
                ),
            };
            tracing::warn!(fleet = %fleet.name_any(), reason, "{note}");
            if let Some(recorder) = &ctx.recorder {
                let event = Event {
                    type_: EventType::Warning,
                    reason: reason.into(),
                    note: Some(note),
                    action: "Replay".into(),
                    secondary: None,
                };
                recorder.publish(event, fleet.object_ref(&())).await;
            }
        }
    }
    Ok(())
}

/// Consecutive failed reconciles of a fleet: incremented on a failure (returns the new
/// count), cleared on a success.
fn error_streak(ctx: &Ctx, key: &str, failed: bool) -> u32 {
    let Ok(mut map) = ctx.error_streaks.lock() else {
        return 1;
    };
    if failed {
        let n = map.entry(key.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    } else {
        map.remove(key);
        0
    }
}

/// Error backoff (docs/design.md "Controller, watches and requeue"): 1 s, 2 s, 4 s …
/// capped at 60 s.
fn error_backoff(streak: u32) -> Duration {
    let exp = streak.saturating_sub(1).min(6);
    Duration::from_secs((1u64 << exp).min(60))
}

/// FNV-1a-32 of the fleet UID modulo 2000 ms: spreads resyncs of many fleets.
fn jitter(uid: &str) -> Duration {
    let mut h: u32 = 0x811c_9dc5;
    for b in uid.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    Duration::from_millis(u64::from(h % 2000))
}

/// One reconcile of one fleet, as the controller calls it: a reconcile slot
/// (`crate::slots`), then [`reconcile_in_slot`].
async fn reconcile_fleet(
    fleet: Arc<CompactFleet>,
    ctx: Arc<Ctx>,
) -> Result<Action, reconcile::Error> {
    // The reconcile itself is boxed on both ways: inline, its state (2.7 KB in a debug build)
    // would make every reconcile waiting for a slot that large (1,000 of them at start-up).
    let Some(slots) = &ctx.slots else {
        return Box::pin(reconcile_in_slot(fleet, ctx.clone())).await;
    };
    let _slot = slots.take().await;
    // No new reconcile starts once the process stops (a signal, a lost Lease): one that was
    // still waiting for a slot ends here, as kube starts none after it is told to stop.
    if slots.stopping() {
        return Ok(Action::await_change());
    }
    // The copy kube handed over may have aged while this waited: the store's newest.
    let ns = fleet.namespace().unwrap_or_default();
    let fleet = slots.latest(&ns, &fleet.name_any()).unwrap_or(fleet);
    // Boxed, and only once the slot is held: a reconcile waiting for one stays small.
    Box::pin(reconcile_in_slot(fleet, ctx.clone())).await
}

/// One reconcile of one fleet in its slot, in the fleet's `reconcile` span.
async fn reconcile_in_slot(
    fleet: Arc<CompactFleet>,
    ctx: Arc<Ctx>,
) -> Result<Action, reconcile::Error> {
    use tracing::Instrument;
    let ns = fleet.namespace().unwrap_or_default();
    let name = fleet.name_any();
    // Instrumented, not entered: a span entered across an await stays entered on the thread
    // while the reconcile is parked, and other fleets' log lines would carry this fleet.
    let span = tracing::info_span!("reconcile", fleet = %format!("{ns}/{name}"));
    reconcile_in_span(fleet, ctx, ns, name)
        .instrument(span)
        .await
}

/// The reconcile itself: lease check, metrics, requeue.
async fn reconcile_in_span(
    fleet: Arc<CompactFleet>,
    ctx: Arc<Ctx>,
    ns: String,
    name: String,
) -> Result<Action, reconcile::Error> {
    ctx.check_lease();
    let started = std::time::Instant::now();
    let waited = ctx.triggers.start(&format!("{ns}/{name}"));
    // A cached copy that does not decode (not expected) leaves the reconcile to fresh reads.
    let cached = fleet.fleet();
    let (result, pass) = crate::reaction::scope(
        waited,
        reconcile::reconcile(&ns, &name, &ctx, cached.as_ref()),
    )
    .await;
    ctx.metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    ctx.metrics
        .passes
        .get_or_create(&crate::metrics::PassLabels {
            pass: match pass {
                reconcile::PassKind::Cached => "cached",
                reconcile::PassKind::Status => "status",
                reconcile::PassKind::Planned => "planned",
                reconcile::PassKind::Fresh => "fresh",
                reconcile::PassKind::Stale => "stale",
            }
            .into(),
        })
        .inc();
    // Counted once a reconcile of the fleet succeeded; a fleet found gone leaves the count.
    if let Ok(mut seen) = ctx.reconciled.lock() {
        let key = format!("{ns}/{name}");
        match &result {
            Ok(_) if ctx.forgotten(&ns, &name) => {
                seen.remove(&key);
            }
            Ok(_) => {
                seen.insert(key);
            }
            Err(_) => {}
        }
        ctx.metrics.fleets_reconciled.set(seen.len() as i64);
    }
    if let Some(w) = &ctx.watches {
        ctx.metrics.cached_objects.set(w.cached_objects() as i64);
        ctx.metrics.cached_bytes.set(w.cached_bytes() as i64);
        ctx.metrics
            .watched_namespaces
            .set(w.namespaces().len() as i64);
        ctx.metrics
            .watch_connections
            .set(w.watch_connections() as i64);
    }
    if let Err(e) = &result {
        ctx.metrics
            .reconcile_errors
            .get_or_create(&crate::metrics::ReasonLabels {
                reason: e.category().into(),
            })
            .inc();
        if e.mirror_disk_failed() {
            exit_on_failed_mirror(&format!("{ns}/{name}"), &e);
        }
    }
    let next = result?;
    error_streak(&ctx, &format!("{ns}/{name}"), false);
    let jitter = jitter(&fleet.uid().unwrap_or_default());
    Ok(match next {
        Next::Soon => Action::requeue(reconcile::SOON),
        Next::Blocked => Action::requeue(reconcile::BLOCKED + jitter),
        Next::Later => Action::requeue(reconcile::LATER + jitter),
        Next::After(d) => Action::requeue(d),
    })
}

/// Exit code of a replica whose journal mirror's disk failed (docs/operations.md "A journal
/// mirror write fails").
pub const MIRROR_DISK_FAILED_EXIT: i32 = 4;

/// The journal mirror's disk failed (full, or an I/O error): sled accepts no write after a
/// failed one, even once the disk has room again, so this process can issue no effect until
/// it opens the mirror again. It exits: the container restarts and reopens the mirror (the
/// Lease's next holder, this replica or another, backfills it from the annotations before it
/// reconciles). The entry that could not be mirrored is committed in the fleet's annotation
/// and its effect was not issued.
fn exit_on_failed_mirror(fleet: &str, error: &dyn std::fmt::Display) -> ! {
    tracing::error!(fleet, error = %error, "the journal mirror's disk failed: exiting so that the mirror is opened again");
    eprintln!(
        "celld-operator: {fleet}: {error}; exiting with code {MIRROR_DISK_FAILED_EXIT} so that the mirror is opened again"
    );
    std::process::exit(MIRROR_DISK_FAILED_EXIT);
}

fn error_policy(fleet: Arc<CompactFleet>, error: &reconcile::Error, ctx: Arc<Ctx>) -> Action {
    let key = format!(
        "{}/{}",
        fleet.namespace().unwrap_or_default(),
        fleet.name_any()
    );
    let delay = error_backoff(error_streak(&ctx, &key, true));
    tracing::warn!(fleet = %key, category = error.category(), error = %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

type Trigger = futures::stream::BoxStream<'static, kube::runtime::reflector::ObjectRef<CelldFleet>>;

/// Splits the watches' fleet triggers by namespace, one stream per controller (in the order
/// of `namespaces`; a single stream when they are empty, i.e. cluster-wide). A trigger for a
/// namespace no controller watches is dropped.
fn route_triggers(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<kube::runtime::reflector::ObjectRef<CelldFleet>>,
    namespaces: &[String],
) -> Vec<Trigger> {
    if namespaces.is_empty() {
        return vec![futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()];
    }
    let mut senders = std::collections::HashMap::new();
    let mut streams = Vec::new();
    for ns in namespaces {
        let (tx, mut out) = tokio::sync::mpsc::unbounded_channel();
        senders.insert(ns.clone(), tx);
        streams.push(futures::stream::poll_fn(move |cx| out.poll_recv(cx)).boxed());
    }
    tokio::spawn(async move {
        while let Some(fleet) = rx.recv().await {
            if let Some(tx) = fleet.namespace.as_ref().and_then(|ns| senders.get(ns)) {
                let _ = tx.send(fleet);
            }
        }
    });
    streams
}

/// `celld-operator/<version> (<identity>)`, the User-Agent of every request (characters a
/// header cannot carry are replaced by `_`).
pub fn user_agent(identity: &str) -> String {
    let identity: String = identity
        .chars()
        .map(|c| if c.is_ascii_graphic() { c } else { '_' })
        .collect();
    format!("celld-operator/{} ({identity})", env!("CARGO_PKG_VERSION"))
}

/// Runs the controller until SIGTERM/SIGINT or a lost Lease.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    process_started();
    init_logging(args.log_format);
    if let Some(fp) = args.fault_point.clone() {
        crate::failpoint::arm(fp);
    }
    let metrics = Arc::new(crate::metrics::Metrics::new());
    let identity = std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "celld-operator".into());
    // Every request names the replica: the API server's audit log tells replicas apart.
    let mut config = kube::Config::infer().await?;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_str(&user_agent(&identity))?,
    ));
    // kube's own retry layer is off: it would retry writes (429/503/504, up to 15 times,
    // backoff up to 1000 s) below the Lease check. The transport retries reads only and
    // sends a write only while the Lease is held with the margin (src/transport.rs).
    config.default_retry = false;
    let leadership = Leadership::default();
    let transport = crate::transport::TransportLayer::new(crate::transport::TransportOptions {
        leadership: Some(leadership.clone()),
        fault: args.test_api_fault.clone(),
        skip_lease_guard: args.test_skip_lease_guard,
        metrics: Some(metrics.clone()),
    });
    let watch_clients = if args.test_fresh_reads {
        None
    } else {
        let transport = transport.clone();
        let metrics = metrics.clone();
        crate::watch_clients::WatchClients::new(
            &config,
            usize::from(args.watch_namespaces_per_connection),
            move |builder| {
                builder
                    .with_layer(&transport)
                    .with_layer(&crate::metrics::request_counter::<kube::client::Body>(
                        metrics.clone(),
                    ))
                    .build()
            },
        )
    };
    let client = kube::client::ClientBuilder::try_from(config)?
        .with_layer(&transport)
        .with_layer(&crate::metrics::request_counter::<kube::client::Body>(
            metrics.clone(),
        ))
        .build();
    let ready = Arc::new(AtomicBool::new(false));
    // Both endpoints are bound before anything else starts: an address that cannot be bound
    // (in use, not local) ends the process with the address in the error instead of running
    // with probes or scrapes that can never succeed.
    let metrics_listener = listen("metrics", &args.metrics_bind_address).await?;
    let health_listener = listen("health", &args.health_bind_address).await?;
    if let Some(listener) = metrics_listener {
        let metrics = metrics.clone();
        tokio::spawn(async move {
            if let Err(e) = serve(listener, move |path| match path {
                "/metrics" => Some(metrics.encode()),
                _ => None,
            })
            .await
            {
                tracing::error!(error = %e, "metrics endpoint failed");
            }
        });
    }
    if let Some(listener) = health_listener {
        let ready = ready.clone();
        tokio::spawn(async move {
            let health = move |path: &str| match path {
                "/livez" => Some("ok".to_string()),
                "/readyz" if ready.load(Ordering::SeqCst) => Some("ok".to_string()),
                _ => None,
            };
            if let Err(e) = serve(listener, health).await {
                tracing::error!(error = %e, "health endpoint failed");
            }
        });
    }
    // Leader election first: a standby never reconciles.
    let mut election = tokio::spawn(leader::run(
        client.clone(),
        args.operator_namespace.clone(),
        args.lease_name.clone(),
        identity.clone(),
        leadership.clone(),
    ));
    // A watch, not a Notify: a signal that arrives while no one waits yet (between the
    // standby loop and the controller's start, e.g. during replay) is still seen by every
    // later wait. Found by the random-kill drill: a SIGTERM during start-up was lost.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopping = stop_rx.clone();
    let stop = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stopping| *stopping).await;
        }
    };
    let stop_on_lost_lease = stop_tx.clone();
    {
        tokio::spawn(async move {
            termination().await;
            tracing::info!("termination signal: finishing running reconciles");
            let _ = stop_tx.send(true);
            // A second signal ends the process at once.
            termination().await;
            std::process::exit(1);
        });
    }
    let stopped = stop();
    tokio::pin!(stopped);
    // A standby is ready as soon as it runs (it keeps no caches and issues nothing), so a
    // two-replica install becomes Ready; the leader is ready again once journals are replayed.
    ready.store(true, Ordering::SeqCst);
    while !leadership.holds() {
        if (&mut stopped).now_or_never().is_some() {
            tracing::info!("standby stopped");
            return Ok(());
        }
        if election.is_finished() {
            return Err(election
                .await?
                .err()
                .unwrap_or_else(|| anyhow::anyhow!("leader election ended")));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ready.store(false, Ordering::SeqCst);
    let mirror = Mirror::open(
        &args.journal_dir,
        MirrorOptions {
            retention: args.journal_retention,
            cache_bytes: args.journal_cache_bytes,
            live_entries: args.journal_live_entries,
        },
    )
    .map_err(|e| anyhow::anyhow!("journal mirror {}: {e}", args.journal_dir.display()))?;
    let (pod_events_tx, pod_events_rx) = tokio::sync::mpsc::unbounded_channel();
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        render: RenderSettings {
            operator_namespace: args.operator_namespace.clone(),
            local_test: args.local_test,
        },
        network_policy_enforced: args.network_policy_enforced,
        operation_deadline: args.operation_deadline,
        budget: Budget::new(args.journal_annotation_bytes as usize)
            .map_err(|e| anyhow::anyhow!("{e}"))?,
        mirror: Some(mirror),
        leader: Leader {
            identity: identity.clone(),
            lease_transitions: leadership.transitions() as u32,
            lease: Some(format!("{}/{}", args.operator_namespace, args.lease_name)),
        },
        leadership: Some(leadership.clone()),
        metrics: metrics.clone(),
        seen: Default::default(),
        error_streaks: Default::default(),
        gates_verified: Default::default(),
        restart_baseline: Default::default(),
        watches: Some(if args.test_fresh_reads {
            crate::watches::Watches::new(client.clone(), pod_events_tx).without_stores()
        } else {
            let watches = crate::watches::Watches::new(client.clone(), pod_events_tx)
                .with_scope(args.watch_scope)
                .within(&args.watch_namespaces)
                .with_list_page(
                    args.test_cluster_list_page
                        .unwrap_or(crate::watches::CLUSTER_LIST_PAGE),
                )
                .with_kube_watcher(args.test_kube_watcher);
            match watch_clients {
                Some(c) => watches.with_watch_clients(c),
                None => watches,
            }
        }),
        replan_backoff: Default::default(),
        foreign_window: args.foreign_operator_window,
        healing: args.healing(),
        announced: Default::default(),
        foreign_reported: Default::default(),
        fresh_reads: args.test_fresh_reads,
        reconciled: Default::default(),
        own_writes: Default::default(),
        status_pace: crate::status_pace::StatusPace::new(args.status_progress_interval),
        triggers: Default::default(),
        slots: (!args.test_kube_slots)
            .then(|| crate::slots::Slots::new(usize::from(args.reconcile_concurrency), stopping)),
        prefetch: !args.test_no_prefetch,
        forget_all_on_write: args.test_forget_all_on_write,
        cache_planning: !args.test_no_cache_planning,
        recorder: Some(crate::events::Outbox::start(
            kube::runtime::events::Recorder::new(
                client.clone(),
                kube::runtime::events::Reporter {
                    controller: "celld-operator".into(),
                    instance: Some(identity.clone()),
                },
            ),
            metrics.clone(),
        )),
    });
    // `--watch-namespaces`: one controller per namespace, each listing and watching fleets
    // only there (a namespaced installation never lists fleets elsewhere); otherwise one
    // cluster-wide controller.
    let scopes: Vec<Option<String>> = if args.watch_namespaces.is_empty() {
        vec![None]
    } else {
        args.watch_namespaces.iter().cloned().map(Some).collect()
    };
    let apis: Vec<Api<CelldFleet>> = scopes
        .iter()
        .map(|ns| match ns {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        })
        .collect();
    replay_mirror(&ctx, &apis).await?;
    ctx.note_mirror_size();
    // The caches of every namespace with a fleet are listed before the first reconcile, so
    // a start reconciles settled fleets from them (bounded: a namespace whose watch is
    // refused reconciles from fresh reads and reports NamespaceAccessDenied).
    if let (Some(w), false) = (&ctx.watches, ctx.fresh_reads) {
        if !w.wait_ready(CACHE_START_WAIT).await {
            tracing::warn!(
                "some namespaces' caches were not listed within {CACHE_START_WAIT:?}; their fleets are reconciled from fresh reads until they are"
            );
        }
    }
    return_freed_memory();
    tracing::info!(identity, namespaces = ?args.watch_namespaces, "leader: reconciling fleets");
    metrics.leader.set(1);
    metrics
        .leader_ready_seconds
        .set(process_started().elapsed().as_secs_f64());
    ready.store(true, Ordering::SeqCst);
    let client_for_release = client.clone();
    let triggers = route_triggers(pod_events_rx, &args.watch_namespaces);
    let controllers = scopes
        .into_iter()
        .zip(triggers)
        .map(|(fleets_ns, trigger)| {
            // The controller's own fleet store keeps each fleet as JSON (`CompactFleet`, less
            // managedFields: nothing reads them and each status write adds to them), decoded
            // when the fleet reconciles.
            let (reader, writer) = kube::runtime::reflector::store();
            if let Some(slots) = &ctx.slots {
                slots.add_store(fleets_ns.clone(), reader.clone());
            }
            let fleets: Api<CompactFleet> = match fleets_ns {
                Some(ns) => Api::namespaced(client.clone(), &ns),
                None => Api::all(client.clone()),
            };
            // Each trigger's arrival is noted for `celld_operator_reaction_wait_seconds`.
            let arrivals = ctx.clone();
            let fleets = kube::runtime::watcher(fleets, crate::watches::watch_config())
                .default_backoff()
                .reflect(writer)
                .applied_objects()
                .inspect(move |f| {
                    if let Ok(f) = f {
                        let ns = f.namespace().unwrap_or_default();
                        arrivals.triggers.arrived(&format!("{ns}/{}", f.name_any()));
                    }
                });
            let arrivals = ctx.clone();
            let trigger = trigger.map(move |r| {
                arrivals.triggers.arrived(&format!(
                    "{}/{}",
                    r.namespace.as_deref().unwrap_or_default(),
                    r.name
                ));
                let key = kube::runtime::reflector::ObjectRef::<CompactFleet>::new(&r.name);
                match r.namespace {
                    Some(ns) => key.within(&ns),
                    None => key,
                }
            });
            Controller::for_stream(fleets, reader)
                .with_config(
                    // With the operator's own slots kube starts every due reconcile at
                    // once (0: no bound) and each waits for a slot in that order.
                    kube::runtime::controller::Config::default().concurrency(
                        if ctx.slots.is_some() {
                            0
                        } else {
                            args.reconcile_concurrency
                        },
                    ),
                )
                .reconcile_on(trigger)
                .graceful_shutdown_on(stop())
                .run(reconcile_fleet, error_policy, ctx.clone())
                .boxed()
        });
    let controller = futures::stream::select_all(controllers).for_each(|_| async {});
    tokio::pin!(controller);
    let bounded = async {
        stop().await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::select! {
        _ = &mut controller => tracing::info!("controller stopped"),
        _ = bounded => tracing::warn!("running reconciles did not finish within {SHUTDOWN_GRACE:?}; stopping anyway"),
        result = &mut election => {
            let err = result.map_err(anyhow::Error::from).and_then(|r| r).err();
            // No new reconcile starts; running ones end at their next write, which the
            // transport refuses without the Lease (a request already sent gets its answer
            // instead of being cut off mid-flight, so the audit log shows how the API server
            // decided it). Bounded, then the process exits non-zero.
            tracing::error!("lost the leader Lease: no new reconcile starts; exiting once running ones end (at most {LOST_LEASE_GRACE:?})");
            let _ = stop_on_lost_lease.send(true);
            if tokio::time::timeout(LOST_LEASE_GRACE, &mut controller).await.is_err() {
                tracing::warn!("running reconciles did not end within {LOST_LEASE_GRACE:?}");
            }
            metrics.leader.set(0);
            anyhow::bail!("leader election ended: {}", err.map(|e| e.to_string()).unwrap_or_default());
        }
    }
    // Events the last reconciles queued are sent while the Lease is still ours (bounded).
    if let Some(outbox) = &ctx.recorder {
        if !outbox.flush(EVENT_FLUSH).await {
            tracing::warn!("some queued Events were not sent within {EVENT_FLUSH:?}");
        }
    }
    election.abort();
    metrics.leader.set(0);
    match leader::release(
        client_for_release,
        &args.operator_namespace,
        &args.lease_name,
        &identity,
    )
    .await
    {
        Ok(true) => tracing::info!(identity, "released the leader Lease"),
        Ok(false) => tracing::info!(identity, "the leader Lease was no longer ours"),
        Err(e) => {
            tracing::warn!(error = %e, "could not release the leader Lease; it expires in 15 s")
        }
    }
    Ok(())
}

/// How long a start waits for the caches' first lists before reconciling.
const CACHE_START_WAIT: Duration = Duration::from_secs(10);

/// When this process started (the first call, from `run`, is early enough).
fn process_started() -> std::time::Instant {
    static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *STARTED.get_or_init(std::time::Instant::now)
}

/// How long running reconciles get to reach a boundary on SIGTERM (docs/design.md "Leader Lease").
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// How long a graceful stop waits for queued Events to be sent (`crate::events`).
const EVENT_FLUSH: Duration = Duration::from_secs(2);

/// How long running reconciles get to end after the Lease was lost: longer than the
/// transport's write timeout (4 s), so a write already sent gets its answer.
const LOST_LEASE_GRACE: Duration = Duration::from_secs(5);

/// SIGTERM or SIGINT.
async fn termination() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Every minute, hands the heap's free pages back to the OS (glibc's `malloc_trim`): the
/// start-up burst (every fleet's first reconcile, every namespace's first lists) and each
/// burst of operations leave freed memory inside glibc's arenas, which glibc keeps resident
/// otherwise; the caches that stay are what should be resident (integration/bench/README.md).
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    tokio::spawn(async {
        let mut every = tokio::time::interval(Duration::from_secs(60));
        loop {
            every.tick().await;
            // SAFETY: malloc_trim(3) takes no pointer and only releases free heap pages.
            unsafe {
                libc::malloc_trim(0);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_endpoint_that_cannot_be_bound_is_an_error_naming_the_address() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let err = listen("health", &addr).await.unwrap_err().to_string();
        assert!(
            err.contains("cannot serve the health endpoint") && err.contains(&addr),
            "{err}"
        );
        assert!(listen("metrics", "0").await.unwrap().is_none());
        assert!(listen("metrics", "127.0.0.1:0").await.unwrap().is_some());
    }

    #[test]
    fn errors_back_off_from_one_second_to_a_minute() {
        let secs: Vec<u64> = (1..=9).map(|n| error_backoff(n).as_secs()).collect();
        assert_eq!(secs, vec![1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }

    #[test]
    fn jitter_is_stable_per_fleet_and_below_two_seconds() {
        assert_eq!(jitter("a-uid"), jitter("a-uid"));
        assert!(jitter("a-uid") < Duration::from_secs(2));
        assert_ne!(jitter("a-uid"), jitter("another-uid"));
    }
}
#[cfg(test)]
mod slot_tests {
    type Handle = tower_test::mock::Handle<
        http::Request<kube::client::Body>,
        http::Response<kube::client::Body>,
    >;

    /// A fleet, and a context whose API server is `Handle` (nothing is answered unless asked).
    fn fleet_and_ctx() -> (
        std::sync::Arc<crate::compact_store::CompactFleet>,
        std::sync::Arc<super::Ctx>,
        Handle,
    ) {
        let f: crate::api::CelldFleet = serde_json::from_value(serde_json::json!({
            "apiVersion": "celld.eric.dev/v1alpha1", "kind": "CelldFleet",
            "metadata": {"name": "f", "namespace": "ns", "uid": "u1"},
            "spec": {"profile": "Bucket", "runtimeImage": "img@sha256:1", "replicas": 1,
                     "serviceAccountName": "celld",
                     "placement": {"zones": ["us-east-1a"], "azCount": 1, "mode": "Relaxed"},
                     "storage": {"bucket": "b", "region": "us-east-1"}}
        }))
        .unwrap();
        let fleet = std::sync::Arc::new(crate::compact_store::CompactFleet::new(f).unwrap());
        let (service, handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let ctx = std::sync::Arc::new(crate::reconcile::pass_reads_tests::ctx(kube::Client::new(
            service, "default",
        )));
        (fleet, ctx, handle)
    }

    /// A reconcile waiting for a slot holds little: 1,000 of them wait at start-up, and the
    /// bench measured 3 MiB more at rest when the reconcile's state was inline (2.7 KB each).
    #[tokio::test]
    async fn a_reconcile_waiting_for_a_slot_is_small() {
        let (fleet, ctx, _handle) = fleet_and_ctx();
        let waiting = super::reconcile_fleet(fleet.clone(), ctx.clone());
        let running = super::reconcile_in_slot(fleet, ctx);
        let (waiting, running) = (
            std::mem::size_of_val(&waiting),
            std::mem::size_of_val(&running),
        );
        assert!(
            waiting <= 512 && waiting * 4 < running,
            "waiting {waiting} bytes, running {running}"
        );
    }

    /// A reconcile parked on a request leaves its fleet's span: log lines written meanwhile
    /// by others on the same thread do not carry that fleet.
    #[tokio::test(flavor = "current_thread")]
    async fn a_parked_reconcile_leaves_its_span() {
        let _subscriber = tracing::subscriber::set_default(tracing_subscriber::registry());
        let (fleet, ctx, mut handle) = fleet_and_ctx();
        assert!(tracing::Span::current().is_none());
        let reconcile = tokio::spawn(super::reconcile_in_slot(fleet, ctx));
        // Its first request reaches the API server (unanswered): the reconcile is parked.
        let (request, _answer) = handle.next_request().await.expect("a request");
        let current = tracing::Span::current();
        assert!(
            current.is_none(),
            "while parked on {} the reconcile's span is still entered here: {:?}",
            request.uri(),
            current.metadata().map(|m| m.name())
        );
        reconcile.abort();
    }
}
