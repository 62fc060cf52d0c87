//! Faults other than a kill at a named failpoint (issue 14): a leader frozen past its Lease
//! while its write is decided, and API faults injected into a chosen request
//! (`--test-api-fault`, src/transport.rs).
//!
//! The stale-leader drill is the exact hole the issue names: leader A appends a contraction's
//! Intent (4 → 3), reads the workload, passes its Lease check and is frozen (SIGSTOP at the
//! `before-effect` failpoint); the fleet is paused; standby B takes the Lease and cancels the
//! Intent; A wakes up with its write decided on the old read. Required: no write by A is
//! accepted after B's first write, the workload keeps its replicas, the journal verifies. It
//! runs twice: with the transport's Lease guard (A's write is never sent) and without it
//! (`--test-skip-lease-guard`: A's write is sent, and the API server refuses it because B
//! fenced the workload before canceling).

mod e2e_common;

use celld_harness::audit::marker_of;
use celld_harness::operator::OperatorProcess;
use celld_harness::TestNamespace;
use celld_operator::api::CelldFleet;
use e2e_common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;
use std::time::{Duration, Instant};

/// Waits until the Lease `ns/name` is held by `identity`.
async fn lease_held_by(client: &kube::Client, ns: &str, name: &str, identity: &str) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let holder = leases
            .get_opt(name)
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity);
        if holder.as_deref() == Some(identity) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{identity} did not take the Lease {ns}/{name} (holder {holder:?})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the frozen leader was about to change.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Frozen {
    /// A Scale 4 → 3: its write is the Deployment update.
    Scale,
    /// An administrative MemberReplacement of a Bucket member: its write is the Pod delete
    /// (UID + resourceVersion).
    Replacement,
}

/// What the deposed leader A sent to the target after the takeover (`verb resource code by
/// user-agent`), once the drill's own checks passed.
/// How B closes the operation A was frozen in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Close {
    /// The fleet is paused: B cancels it before issue (`CanceledBeforeIssue`).
    Pause,
    /// A person abandons it (`journal abandon`): B consumes the command (`Abandoned`).
    Abandon,
}

async fn stale_leader_drill(
    tag: &str,
    skip_guard: bool,
    what: Frozen,
    close: Close,
) -> Vec<String> {
    let (c, client, ns) = setup(tag).await;
    let admin = c.admin_kubeconfig.clone();
    let operator_ns = format!("celld-e2e-{tag}");
    let _ = c.kubectl(&["create", "namespace", &operator_ns]);
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let replica = |identity: &str, fault: Option<&str>, extra: &[&str]| {
        let mut opts = Operator::options(fault, &admin, &operator_ns, identity);
        opts.metrics_addr = None;
        opts.extra_args.extend(extra.iter().map(|s| s.to_string()));
        OperatorProcess::start(&opts)
    };
    {
        let mut settle = replica(&format!("{tag}-s"), None, &[]);
        create_ready(&api, &fleet("sl", "Bucket", 4, &unique_bucket("sl")), 4).await;
        assert_eq!(settle.terminate(Duration::from_secs(30)).await, 0);
    }
    // The object A's write targets: the Deployment, or one member Pod.
    let member = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|p| p.metadata.deletion_timestamp.is_none());
    let (resource, target) = match what {
        Frozen::Scale => ("deployments", "sl".to_string()),
        Frozen::Replacement => ("pods", member.as_ref().expect("a member Pod").name_any()),
    };
    let member_uid = member.as_ref().and_then(|p| p.uid());
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), &ns.name);
    let deployment = || async { deployments.get("sl").await.unwrap() };
    let writes_to_target = |events: &[AuditEvent]| -> Vec<String> {
        events
            .iter()
            .filter(|e| e.resource == resource && e.is_write())
            .filter(|e| e.name.as_deref() == Some(target.as_str()))
            .filter(|e| e.namespace.as_deref() == Some(ns.name.as_str()))
            .map(|e| format!("{} {} {:?} by {}", e.verb, e.resource, e.code, e.user_agent))
            .collect()
    };
    let guard: &[&str] = if skip_guard {
        &["--test-skip-lease-guard"]
    } else {
        &[]
    };
    // Identities of this drill's own (drills run side by side; the audit log is shared).
    let (id_a, id_b) = (format!("{tag}-a"), format!("{tag}-b"));
    let (by_a, by_b) = (format!("({id_a})"), format!("({id_b})"));
    let a = replica(&id_a, Some("before-effect:1:stop"), guard);
    lease_held_by(&client, &operator_ns, &lease_name(), &id_a).await;
    let audit = audit_from_now();
    match what {
        Frozen::Scale => {
            c.kubectl(&["-n", &ns.name, "scale", "celldfleet/sl", "--replicas=3"])
                .unwrap();
        }
        Frozen::Replacement => {
            let uid = member_uid.clone().unwrap_or_default();
            request_replacement(&api, "sl", &target, &uid).await;
        }
    }
    let kind = match what {
        Frozen::Scale => "Scale",
        Frozen::Replacement => "MemberReplacement",
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !a.is_stopped() {
        assert!(
            Instant::now() < deadline,
            "replica-a never stopped at before-effect; log: {}",
            a.log().display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // While A is frozen, after its Lease check: the fleet is paused, or the operation
    // abandoned by a person.
    match close {
        Close::Pause => set_paused(&api, "sl", true).await,
        Close::Abandon => {
            let f = api.get("sl").await.unwrap();
            let journal = celld_operator::journal_store::load(&f).expect("the journal loads");
            let open = journal
                .fold()
                .current()
                .map(|o| o.id().to_string())
                .expect("A's operation is open");
            let command = json!({"metadata": {"annotations": {
                celld_operator::api::keys::JOURNAL_COMMAND_ANNOTATION: format!("abandon {open}")}}});
            api.patch("sl", &PatchParams::default(), &Patch::Merge(command))
                .await
                .unwrap();
        }
    }
    let _b = replica(&id_b, None, &[]);
    let outcome = until(
        &format!("B to close the {kind}"),
        90,
        &api,
        "sl",
        || async {
            let s = api.get("sl").await.ok()?.status?;
            s.recent_operations
                .first()
                .filter(|o| format!("{:?}", o.kind) == kind)
                .map(|o| o.outcome.clone())
        },
    )
    .await;
    let expected = match close {
        Close::Pause => "CanceledBeforeIssue",
        Close::Abandon => "Abandoned",
    };
    assert_eq!(outcome, expected);
    let annotations = match what {
        Frozen::Scale => {
            let d = deployment().await;
            d.metadata.annotations
        }
        Frozen::Replacement => pods.get(&target).await.unwrap().metadata.annotations,
    };
    let fence = annotations
        .as_ref()
        .and_then(|a| a.get("celld.eric.dev/fence").cloned())
        .unwrap_or_default();
    assert!(
        fence.ends_with("/fenced"),
        "B fenced {resource}/{target} before closing: {fence:?}"
    );
    // A wakes up with its write decided on the read before the fence.
    a.signal("CONT");
    let mut a = a;
    let code = a.exited(Duration::from_secs(60)).await;
    assert_ne!(
        code, 0,
        "the deposed leader exits once it sees the Lease lost"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events = audit.events().unwrap();
    let takeover = events
        .iter()
        .position(|e| e.succeeded() && e.is_write() && e.user_agent.contains(&by_b))
        .expect("B wrote after taking over");
    let late: Vec<String> = events[takeover..]
        .iter()
        .filter(|e| e.succeeded() && e.is_write() && e.user_agent.contains(&by_a))
        .map(|e| format!("{} {}", e.verb, e.request_uri))
        .collect();
    assert!(
        late.is_empty(),
        "writes by the deposed leader were accepted after the takeover: {late:?}"
    );
    let by_a: Vec<String> = writes_to_target(&events[takeover..])
        .into_iter()
        .filter(|w| w.contains(&by_a))
        .collect();
    let log = std::fs::read_to_string(a.log()).unwrap_or_default();
    if skip_guard {
        // The write went out (the caller checks how it was refused).
        assert!(
            !by_a.is_empty(),
            "A's decided write was sent: {by_a:?}\n{}",
            writes_to_target(&events).join("\n")
        );
    } else {
        assert!(by_a.is_empty(), "A sent no write to the target: {by_a:?}");
        assert!(
            log.contains("not sent"),
            "A's transport refused to send: {}",
            a.log().display()
        );
    }
    match what {
        Frozen::Scale => {
            let d = deployment().await;
            assert_eq!(
                d.spec.and_then(|s| s.replicas),
                Some(4),
                "no contraction for the closed operation"
            );
        }
        Frozen::Replacement => {
            let p = pods.get_opt(&target).await.unwrap();
            assert!(
                p.as_ref().is_some_and(
                    |p| p.uid() == member_uid && p.metadata.deletion_timestamp.is_none()
                ),
                "the member of the canceled replacement was not deleted: {:?}",
                p.map(|p| p.metadata)
            );
        }
    }
    if close == Close::Pause {
        set_paused(&api, "sl", false).await;
    }
    cleanup(&client, ns).await;
    by_a
}

#[tokio::test]
async fn a_frozen_leader_issues_nothing_after_the_takeover() {
    let _guard = isolated().await;
    stale_leader_drill("stale", false, Frozen::Scale, Close::Pause).await;
}

/// Without the guard, A's write reaches the API server and is refused with 409 because B
/// fenced the target. Woken up, A also finds its Lease lost; it lets the running reconcile
/// end before exiting, so the write already sent gets its answer. (It used to exit at once,
/// which cut the request off: the API server then recorded 504 "context canceled" instead of
/// the fence's 409 — found in CI, in 2 of 3 runs on a loaded machine.)
async fn fence_drill(tag: &str, what: Frozen, close: Close, verb: &str) {
    let by_a = stale_leader_drill(tag, true, what, close).await;
    eprintln!("fence drill {tag}: A's writes to the target after the takeover: {by_a:?}");
    assert!(
        by_a.iter()
            .any(|w| w.starts_with(verb) && w.contains("Some(409)")),
        "A's {verb} was sent and refused with 409 by the fence: {by_a:?}"
    );
}

#[tokio::test]
async fn a_frozen_leaders_write_is_refused_by_the_fence() {
    let _guard = isolated().await;
    fence_drill("fence", Frozen::Scale, Close::Pause, "update").await;
}

/// A MemberReplacement canceled before issue fences its member Pod: the deposed leader's Pod
/// delete (UID + resourceVersion) fails instead of deleting a member for a canceled operation.
#[tokio::test]
async fn a_frozen_leaders_member_delete_is_refused_by_the_pod_fence() {
    let _guard = isolated().await;
    fence_drill("podfence", Frozen::Replacement, Close::Pause, "delete").await;
}

/// `journal abandon` of a MemberReplacement before issue fences its member Pod the same way.
#[tokio::test]
async fn an_abandoned_replacements_member_delete_is_refused_by_the_pod_fence() {
    let _guard = isolated().await;
    fence_drill(
        "abandonfence",
        Frozen::Replacement,
        Close::Abandon,
        "delete",
    )
    .await;
}

// ---------------------------------------------------------------------------------------
// The API fault sweep: one operator process per run, with one fault injected into the i-th
// request matching a filter (the workload writes in `make test`; every write the operator
// sends to the fleet's namespace in `make drills`: journal appends, status, Events, workload
// writes). Each operation is first run clean with `--test-api-fault=none@1:...`, which counts
// the matching requests; then once per (index × fault kind).

/// What one operation of the sweep changes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Change {
    /// `kubectl scale` of fleet `sl` from → to.
    Scale { from: i32, to: i32 },
    /// A new `maintenance.restartToken` on `sl`: a rolling Restart.
    Restart,
    /// The other of two runtime images on `sl`: an Upgrade.
    Upgrade,
    /// A hand edit of `sl`'s Deployment template (drift), repaired by a TemplateUpdate.
    Drift,
    /// A new Bucket fleet `pd` with 3 members (one per zone).
    Provision,
    /// Deleting fleet `pd`.
    Delete,
    /// An administrative replacement of one of `sl`'s members
    /// (`celld.eric.dev/replace-member: <pod>/<uid>`): one guarded Pod delete.
    Replace,
}

/// One operation the sweep runs. They run in the order of [`SWEEP_OPS`], each leaving the
/// fleets where the next one starts.
#[derive(Clone, Copy)]
struct SweepOp {
    label: &'static str,
    change: Change,
}

const CONTRACTION: SweepOp = SweepOp {
    label: "Scale contraction",
    change: Change::Scale { from: 4, to: 3 },
};
const GROWTH: SweepOp = SweepOp {
    label: "Scale growth",
    change: Change::Scale { from: 3, to: 4 },
};
const RESTART: SweepOp = SweepOp {
    label: "Restart (rolling)",
    change: Change::Restart,
};
const REPLACE: SweepOp = SweepOp {
    label: "MemberReplacement",
    change: Change::Replace,
};
const SWEEP_OPS: [SweepOp; 8] = [
    CONTRACTION,
    GROWTH,
    RESTART,
    REPLACE,
    SweepOp {
        label: "Upgrade",
        change: Change::Upgrade,
    },
    SweepOp {
        label: "TemplateUpdate",
        change: Change::Drift,
    },
    SweepOp {
        label: "Provision",
        change: Change::Provision,
    },
    SweepOp {
        label: "Delete",
        change: Change::Delete,
    },
];

impl SweepOp {
    fn fleet(&self) -> &'static str {
        match self.change {
            Change::Provision | Change::Delete => "pd",
            _ => "sl",
        }
    }

    /// The operation that returns the fleets to where this one starts (Scale growth after a
    /// contraction, Delete after Provision, and back); the others leave them as they found them.
    fn partner(&self) -> Option<Change> {
        match self.change {
            Change::Scale { from, to } => Some(Change::Scale { from: to, to: from }),
            Change::Provision => Some(Change::Delete),
            Change::Delete => Some(Change::Provision),
            _ => None,
        }
    }

    /// The journal's name for the operation kind.
    fn kind(&self) -> &'static str {
        match self.change {
            Change::Scale { .. } => "Scale",
            Change::Restart => "Restart",
            Change::Upgrade => "Upgrade",
            Change::Drift => "TemplateUpdate",
            Change::Provision => "Provision",
            Change::Delete => "Delete",
            Change::Replace => "MemberReplacement",
        }
    }

    /// The requests the bounded sweep faults: the ones that carry the effect (the workload
    /// writes; a member replacement's Pod delete).
    fn effect_filter(&self) -> &'static str {
        match self.change {
            Change::Replace => "write:pods",
            _ => "write:deployments",
        }
    }

    /// Members once the operation is done.
    fn members(&self) -> i32 {
        match self.change {
            Change::Scale { to, .. } => to,
            Change::Provision | Change::Delete => 3,
            _ => 4,
        }
    }

    /// The newest closed operation of the fleet (so a run knows which one is its own).
    async fn last_closed(&self, api: &Api<CelldFleet>) -> Option<String> {
        let f = api.get_opt(self.fleet()).await.unwrap()?;
        Some(f.status?.recent_operations.first()?.id.clone())
    }

    /// Starts the operation (`n` makes tokens and edits unique). Provision and Delete are
    /// idempotent here, so a run that follows a stuck one can ask again.
    async fn trigger(&self, c: &celld_harness::Cluster, api: &Api<CelldFleet>, ns: &str, n: usize) {
        match self.change {
            Change::Scale { from, to } => {
                let at = api
                    .get("sl")
                    .await
                    .unwrap()
                    .status
                    .and_then(|s| s.applied_replicas);
                assert_eq!(at, Some(from), "{} starts at {from} members", self.label);
                c.kubectl(&[
                    "-n",
                    ns,
                    "scale",
                    "celldfleet/sl",
                    &format!("--replicas={to}"),
                ])
                .unwrap();
            }
            Change::Restart => {
                set_restart_token(api, "sl", &format!("sweep-{n}")).await;
            }
            Change::Upgrade => {
                let now = api.get("sl").await.unwrap().spec.runtime_image;
                let next = if now.as_deref() == Some(image(1).as_str()) {
                    image(2)
                } else {
                    image(1)
                };
                api.patch(
                    "sl",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"runtimeImage": next}})),
                )
                .await
                .unwrap();
            }
            Change::Drift => {
                let edit = json!([{"op": "replace",
                    "path": "/spec/template/spec/containers/0/readinessProbe/periodSeconds",
                    "value": 7 + (n % 50)}]);
                c.kubectl(&[
                    "-n",
                    ns,
                    "patch",
                    "deployment",
                    "sl",
                    "--type=json",
                    "-p",
                    &edit.to_string(),
                ])
                .unwrap();
            }
            Change::Provision => {
                let f = fleet("pd", "Bucket", 3, &unique_bucket("pd"));
                match api.create(&kube::api::PostParams::default(), &f).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(e) => panic!("creating fleet pd: {e}"),
                }
            }
            Change::Delete => match api.delete("pd", &Default::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => panic!("deleting fleet pd: {e}"),
            },
            Change::Replace => {
                // A live member of `sl` at its current UID (pd's members are named `pd-…`).
                let pods: Api<Pod> = Api::namespaced(api.clone().into_client(), ns);
                let member = pods
                    .list(&ListParams::default())
                    .await
                    .unwrap()
                    .items
                    .into_iter()
                    .find(|p| {
                        p.name_any().starts_with("sl-") && p.metadata.deletion_timestamp.is_none()
                    })
                    .expect("a live member of sl");
                let uid = member.uid().unwrap_or_default();
                request_replacement(api, "sl", &member.name_any(), &uid).await;
            }
        }
    }

    /// Done: a new closed operation of this kind that `Succeeded`, every member ready
    /// (Delete: the fleet is gone).
    async fn settled(&self, api: &Api<CelldFleet>, before: &Option<String>) -> bool {
        let Ok(found) = api.get_opt(self.fleet()).await else {
            return false;
        };
        if self.change == Change::Delete {
            return found.is_none();
        }
        // A replacement's request is removed in the write that closes it.
        let request_open = found.as_ref().is_some_and(|f| {
            f.annotations()
                .contains_key("celld.eric.dev/replace-member")
        });
        !request_open
            && found.and_then(|f| f.status).is_some_and(|s| {
                s.current_operation.is_none()
                    && s.ready_replicas == Some(self.members())
                    && s.applied_replicas == Some(self.members())
                    && s.recent_operations.first().is_some_and(|o| {
                        Some(&o.id) != before.as_ref()
                            && format!("{:?}", o.kind) == self.kind()
                            && o.outcome == "Succeeded"
                    })
            })
    }

    /// Whether [`SweepOp::settled`] holds within `limit`.
    async fn settles_within(
        &self,
        api: &Api<CelldFleet>,
        before: &Option<String>,
        limit: Duration,
    ) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.settled(api, before).await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        false
    }

    /// Operator writes that carry the effect: the workload writes with the operation's
    /// marker (Delete: the workload deletes; every Provision creates `pd` again under the
    /// same name; Replace: every Pod delete in the namespace), counted from the run's audit.
    /// A write answered 504 "context canceled" (its sender was killed mid-request) may have
    /// committed all the same: it counts as the effect when no accepted write does, so a
    /// committed-but-unanswered write followed by a second one still counts two.
    fn effects(&self, c: &celld_harness::Cluster, ns: &str, run: &AuditLog) -> usize {
        let events = run.events().unwrap();
        let ours = |e: &&AuditEvent| by_operator(e) && e.namespace.as_deref() == Some(ns);
        // Accepted writes, plus unanswered ones that may have committed: all of them, but
        // one whose precondition resourceVersion an accepted write carries too did not (two
        // writes with the same precondition cannot both commit).
        let count = |hits: Vec<&AuditEvent>| {
            let precondition = |e: &AuditEvent| {
                e.request_object.as_ref().and_then(|o| {
                    o["metadata"]["resourceVersion"]
                        .as_str()
                        .or(o["preconditions"]["resourceVersion"].as_str())
                        .map(str::to_string)
                })
            };
            let accepted = hits.iter().filter(|e| e.succeeded()).count();
            let unanswered = hits
                .iter()
                .filter(|e| e.unanswered())
                .filter(|e| {
                    let rv = precondition(e);
                    !hits
                        .iter()
                        .any(|a| a.succeeded() && rv.is_some() && precondition(a) == rv)
                })
                .count();
            accepted + unanswered
        };
        match self.change {
            Change::Replace => {
                return count(
                    events
                        .iter()
                        .filter(ours)
                        .filter(|e| e.verb == "delete" && e.resource == "pods")
                        .filter(|e| e.subresource.is_none())
                        .collect(),
                )
            }
            Change::Delete => {
                return count(
                    events
                        .iter()
                        .filter(ours)
                        .filter(|e| e.verb == "delete" && e.resource == "deployments")
                        .filter(|e| e.name.as_deref() == Some("pd"))
                        .collect(),
                )
            }
            _ => {}
        }
        let marker = marker_of(c, ns, "deployment", self.fleet());
        let marker_of_write = |e: &AuditEvent| {
            e.request_object
                .as_ref()
                .and_then(|o| o["metadata"]["annotations"]["celld.eric.dev/effect"].as_str())
                .map(str::to_string)
        };
        let workload_writes: Vec<&AuditEvent> = events
            .iter()
            .filter(ours)
            .filter(|e| matches!(e.verb.as_str(), "create" | "update" | "patch"))
            .filter(|e| e.resource == "deployments" && e.subresource.is_none())
            .filter(|e| e.name.as_deref() == Some(self.fleet()))
            .collect();
        let writes = count(
            workload_writes
                .iter()
                .copied()
                .filter(|e| marker_of_write(e).as_deref() == Some(marker.as_str()))
                .collect(),
        );
        if self.change != Change::Restart {
            return writes;
        }
        // A restart token is issued once: the template writes (any operation's `…/template`
        // marker) in this run that carry the run's token, counted as well.
        let token = restart_token(c, ns);
        let template_writes = count(
            workload_writes
                .iter()
                .copied()
                .filter(|e| marker_of_write(e).is_some_and(|m| m.ends_with("/template")))
                .filter(|e| {
                    e.request_object.as_ref().is_some_and(|o| {
                        o["spec"]["template"]["metadata"]["annotations"]
                            ["celld.eric.dev/restart-token"]
                            == token.as_str()
                    })
                })
                .collect(),
        );
        if template_writes == writes {
            writes
        } else {
            // Any difference fails the run (counted as a duplicate effect).
            writes.max(template_writes).max(2)
        }
    }
}

#[derive(Default)]
struct Row {
    runs: usize,
    passed: usize,
    duplicates: usize,
    stuck: usize,
}

impl Row {
    /// Counts one run; whether it passed (settled, exactly one accepted effect write).
    fn record(&mut self, out: &RunOutcome) -> bool {
        let duplicate = out.effects != 1;
        self.runs += 1;
        self.duplicates += usize::from(duplicate);
        self.stuck += usize::from(!out.settled);
        let passed = out.settled && !duplicate;
        self.passed += usize::from(passed);
        passed
    }
}

/// Result of one run: whether it settled, the faulted request (from the operator's log), the
/// accepted writes carrying the operation's effect, the matching requests counted.
struct RunOutcome {
    /// The last closed operation before the run (what settling is judged against).
    before: Option<String>,
    settled: bool,
    faulted: Option<String>,
    effects: usize,
    counted: usize,
    elapsed: Duration,
}

/// The restart token in the Deployment `sl`'s Pod template now.
fn restart_token(c: &celld_harness::Cluster, ns: &str) -> String {
    c.kubectl(&[
        "-n",
        ns,
        "get",
        "deployment",
        "sl",
        "-o",
        "jsonpath={.spec.template.metadata.annotations.celld\\.eric\\.dev/restart-token}",
    ])
    .unwrap_or_default()
}

/// The bed of one sweep: its namespace, fleets and a counter for unique triggers.
struct Bed {
    c: &'static celld_harness::Cluster,
    api: Api<CelldFleet>,
    ns: String,
    runs: usize,
}

impl Bed {
    /// A namespace with fleet `sl` (Bucket, 4 members) settled by a clean operator.
    async fn new(tag: &str) -> (kube::Client, TestNamespace, Bed) {
        let (c, client, ns) = setup(tag).await;
        let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
        {
            let _settle = Operator::start(None);
            create_ready(&api, &fleet("sl", "Bucket", 4, &unique_bucket(tag)), 4).await;
        }
        let bed = Bed {
            c,
            api,
            ns: ns.name.clone(),
            runs: 0,
        };
        (client, ns, bed)
    }
}

async fn sweep_run(
    bed: &mut Bed,
    op: SweepOp,
    fault: &str,
    kill_after: Option<Duration>,
) -> RunOutcome {
    bed.runs += 1;
    let (c, api, ns) = (bed.c, bed.api.clone(), bed.ns.clone());
    let before = op.last_closed(&api).await;
    let run_audit = audit_from_now();
    let ident = "celld-operator-e2e";
    let log_path = test_dir().join(ident).join("operator.log");
    let offset = celld_harness::drill::log_offset(&log_path);
    let fault = fault.to_string();
    let mut operator = Operator::start_with(|o| {
        o.metrics_addr = None;
        o.extra_args.push(format!("--test-api-fault={fault}"));
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = Instant::now();
    op.trigger(c, &api, &ns, bed.runs).await;
    if let Some(delay) = kill_after {
        // A kill at an arbitrary instant, then a clean restart that must finish the job.
        tokio::time::sleep(delay).await;
        operator.signal("KILL");
        let _ = operator.exited(Duration::from_secs(10)).await;
        drop(operator);
        operator = Operator::start_with(|o| o.metrics_addr = None);
    }
    let settled = op
        .settles_within(&api, &before, Duration::from_secs(90))
        .await;
    let elapsed = started.elapsed();
    // Settled or not, what it wrote is final once it stops.
    let _ = operator.terminate(Duration::from_secs(30)).await;
    drop(operator);
    let celld_harness::drill::FaultLog { faulted, counted } =
        celld_harness::drill::fault_log(&log_path, offset);
    let effects = op.effects(c, &ns, &run_audit);
    if op.change != Change::Delete {
        verify_journal(
            &ns,
            op.fleet(),
            Some(&test_dir().join(ident).join("journal")),
        );
    }
    RunOutcome {
        before,
        settled,
        faulted,
        effects,
        counted,
        elapsed,
    }
}

/// After a run that did not settle: an operator without faults, started on what the run
/// left, settles the operation within 90 s.
async fn recover(bed: &Bed, op: SweepOp, before: &Option<String>) -> bool {
    let mut operator = Operator::start_with(|o| o.metrics_addr = None);
    let settled = op
        .settles_within(&bed.api, before, Duration::from_secs(90))
        .await;
    let _ = operator.terminate(Duration::from_secs(30)).await;
    settled
}

/// Runs the sweep over `ops` with faults of `kinds` injected into the requests matching
/// `filter` (`VERB:RESOURCE`, the namespace is added), then `kills` random-instant kills per
/// operation; prints the table and fails on any duplicate effect or stuck run.
async fn sweep(tag: &str, filter: Option<&str>, ops: &[SweepOp], kinds: &[&str], kills: usize) {
    let (client, ns, mut bed) = Bed::new(tag).await;
    let filter_of = |op: &SweepOp| format!("{}:{}", filter.unwrap_or(op.effect_filter()), ns.name);
    // Clean runs: how many matching requests each operation sends.
    let mut counts = Vec::new();
    for op in ops {
        let out = sweep_run(&mut bed, *op, &format!("none@1:{}", filter_of(op)), None).await;
        assert!(out.settled, "{} did not settle in its clean run", op.label);
        assert_eq!(out.effects, 1, "{}: one accepted effect write", op.label);
        counts.push((*op, out.counted, out.elapsed));
    }
    eprintln!(
        "sweep {tag}: matching requests per clean run: {}",
        counts
            .iter()
            .map(|(op, n, t)| format!("{} = {n} ({t:?})", op.label))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut table: std::collections::BTreeMap<(String, String), Row> = Default::default();
    let mut failures = Vec::new();
    let max = counts.iter().map(|(_, n, _)| *n).max().unwrap_or(0);
    for index in 1..=max {
        for kind in kinds {
            // Every operation in order, so each run starts where its operation expects: an
            // operation with fewer requests than `index` runs clean only when its partner
            // (the other half of a pair that starts where the first ends) is faulted.
            for (op, count, _) in &counts {
                let partner_faulted = counts
                    .iter()
                    .any(|(p, n, _)| op.partner().is_some_and(|q| q == p.change) && index <= *n);
                if index > *count && !partner_faulted {
                    continue;
                }
                let filter = filter_of(op);
                let fault = if index <= *count {
                    format!("{kind}@{index}:{filter}")
                } else {
                    format!("none@1:{filter}")
                };
                let out = sweep_run(&mut bed, *op, &fault, None).await;
                if index > *count {
                    assert!(out.settled, "{}: a clean run did not settle", op.label);
                    continue;
                }
                let passed = table
                    .entry((op.label.to_string(), kind.to_string()))
                    .or_default()
                    .record(&out);
                if !passed {
                    failures.push(format!(
                        "{} {kind}@{index}: settled={} effect writes={} faulted={:?}",
                        op.label, out.settled, out.effects, out.faulted
                    ));
                }
                eprintln!(
                    "sweep {tag}: {} {kind}@{index}: {} ({})",
                    op.label,
                    if passed { "ok" } else { "FAILED" },
                    out.faulted.as_deref().unwrap_or("no request faulted")
                );
                if !out.settled {
                    // Bring it back to where the next run starts: an operator without faults
                    // must finish the operation the run left (triggering it again would not
                    // do: a Provision of a fleet that exists starts nothing).
                    assert!(
                        recover(&bed, *op, &out.before).await,
                        "{} did not recover without faults",
                        op.label
                    );
                }
            }
        }
    }
    // Kills at uniformly random instants inside each operation (seeded, re-runnable with
    // CELLD_DRILL_SEED), each followed by a clean restart.
    let seed = celld_harness::drill::seed();
    let mut rng = seed | 1;
    eprintln!("sweep {tag}: random kills, CELLD_DRILL_SEED={seed}");
    for round in 0..kills {
        for (op, _, clean) in &counts {
            let delay = celld_harness::drill::instant_within(&mut rng, *clean);
            let clean = format!("none@1:{}", filter_of(op));
            let out = sweep_run(&mut bed, *op, &clean, Some(delay)).await;
            let passed = table
                .entry((op.label.to_string(), "kill (random)".to_string()))
                .or_default()
                .record(&out);
            if !passed {
                failures.push(format!(
                    "{} kill #{round} at {delay:?} (seed {seed}): settled={} effect writes={}",
                    op.label, out.settled, out.effects
                ));
            }
            eprintln!(
                "sweep {tag}: {} kill at {delay:?}: {}",
                op.label,
                if passed { "ok" } else { "FAILED" }
            );
        }
    }
    let faulted = filter.map_or("each operation's effect writes".to_string(), |f| {
        f.to_string()
    });
    eprintln!("\nsweep {tag} ({faulted} in {}):", ns.name);
    eprintln!(
        "{:<20} {:<16} {:>5} {:>7} {:>10} {:>6}",
        "operation", "fault", "runs", "passed", "duplicate", "stuck"
    );
    for ((op, kind), row) in &table {
        eprintln!(
            "{op:<20} {kind:<16} {:>5} {:>7} {:>10} {:>6}",
            row.runs, row.passed, row.duplicates, row.stuck
        );
    }
    finish(&client, ns, "sweep failures", &failures).await;
}

/// Fails with `failures` if there are any; else the namespace goes while an operator runs (it
/// removes the fleet's finalizer).
async fn finish(client: &kube::Client, ns: TestNamespace, what: &str, failures: &[String]) {
    assert!(failures.is_empty(), "{what}:\n{}", failures.join("\n"));
    let _operator = Operator::start_with(|o| o.metrics_addr = None);
    cleanup(client, ns).await;
}

/// The bounded sweep of `make test`: every fault kind on the effect writes (the workload
/// writes; a member replacement's Pod delete) of every operation kind of a Bucket fleet, and
/// one kill at a random instant inside each.
#[tokio::test]
async fn api_faults_on_workload_writes_never_duplicate_an_effect() {
    let _guard = isolated().await;
    sweep("sweep-wl", None, &SWEEP_OPS, &ALL_KINDS, 1).await;
}

/// A fleet status write answered 409 at each index of every operation kind (the fault layer
/// answers without sending, so no watch event follows): every operation settles. The
/// exhaustive drills found a Provision whose last status write was refused that way left
/// unsettled, its status written only at the slow resync.
#[tokio::test]
async fn a_refused_status_write_never_leaves_an_operation_unsettled() {
    let _guard = isolated().await;
    sweep(
        "sweep-st",
        Some("patch:celldfleets/status"),
        &SWEEP_OPS,
        &["conflict"],
        0,
    )
    .await;
}

const ALL_KINDS: [&str; 6] = [
    "timeout-before",
    "lost-response",
    "conflict",
    "throttle",
    "unavailable",
    "reset",
];

/// `make drills`: every fault kind on every write the operator sends to the namespace during
/// each operation, and ten kills at random instants inside each.
#[tokio::test]
#[ignore = "exhaustive: make drills"]
async fn api_faults_on_every_write_never_duplicate_an_effect() {
    let _guard = isolated().await;
    sweep("sweep-all", Some("write:*"), &SWEEP_OPS, &ALL_KINDS, 10).await;
}

// ---------------------------------------------------------------------------------------
// Stale leaders frozen at random instants: two replicas, an operation started, the leader
// stopped (SIGSTOP from outside, as a frozen VM or a long GC pause would) at a uniformly
// random delay inside the operation's clean duration; the standby takes the Lease once it
// expires and finishes; the old leader is woken up. Checks per run: no write of the deposed
// leader's received after the standby acquired the Lease (its acquireTime) accepted, exactly
// one accepted effect write, the operation settled, the journal verifies against the new
// leader's mirror.

/// One frozen-leader run; whether it passed, with a line for the table.
async fn frozen_leader_run(
    bed: &mut Bed,
    operator_ns: &str,
    tag: &str,
    op: SweepOp,
    delay: Duration,
) -> Result<String, String> {
    bed.runs += 1;
    let (c, api, ns) = (bed.c, bed.api.clone(), bed.ns.clone());
    let client = c.admin_client().await.unwrap();
    let admin = c.admin_kubeconfig.clone();
    let replica = |identity: &str| {
        let mut opts = Operator::options(None, &admin, operator_ns, identity);
        opts.metrics_addr = None;
        OperatorProcess::start(&opts)
    };
    let (id_a, id_b) = (
        format!("{tag}-a{}", bed.runs),
        format!("{tag}-b{}", bed.runs),
    );
    let (by_a, by_b) = (format!("({id_a})"), format!("({id_b})"));
    let before = op.last_closed(&api).await;
    let mut a = replica(&id_a);
    lease_held_by(&client, operator_ns, &lease_name(), &id_a).await;
    let mut b = replica(&id_b);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let audit = audit_from_now();
    op.trigger(c, &api, &ns, bed.runs).await;
    tokio::time::sleep(delay).await;
    a.signal("STOP");
    lease_held_by(&client, operator_ns, &lease_name(), &id_b).await;
    // The takeover instant: B's acquireTime on the Lease (Lease writes are not audited, and B
    // writes nothing else when the operation finished before A was frozen).
    let acquired = Api::<Lease>::namespaced(client.clone(), operator_ns)
        .get(&lease_name())
        .await
        .unwrap()
        .spec
        .and_then(|s| s.acquire_time)
        .map(|t| t.0.to_string())
        .expect("B's Lease has an acquireTime");
    let acquired = chrono::DateTime::parse_from_rfc3339(&acquired)
        .unwrap_or_else(|e| panic!("acquireTime {acquired}: {e}"));
    let settled = op
        .settles_within(&api, &before, Duration::from_secs(90))
        .await;
    a.signal("CONT");
    let a_code = a.exited(Duration::from_secs(60)).await;
    drop(a);
    let _ = b.terminate(Duration::from_secs(30)).await;
    drop(b);
    let events = audit.events().unwrap();
    // Accepted writes by A received after B acquired the Lease.
    let late: Vec<String> = events
        .iter()
        .filter(|e| e.succeeded() && e.is_write() && e.user_agent.contains(&by_a))
        .filter(|e| {
            chrono::DateTime::parse_from_rfc3339(&e.received).map_or(true, |at| at >= acquired)
        })
        .map(|e| format!("{} {} at {}", e.verb, e.request_uri, e.received))
        .collect();
    let b_wrote = events
        .iter()
        .any(|e| e.succeeded() && e.is_write() && e.user_agent.contains(&by_b));
    let effects = op.effects(c, &ns, &audit);
    if op.change != Change::Delete {
        verify_journal(
            &ns,
            op.fleet(),
            Some(&test_dir().join(&id_b).join("journal")),
        );
    }
    let line = format!(
        "{} frozen at {delay:?}: settled={settled} effect writes={effects} late writes by A={} (A exited {a_code}, B wrote: {b_wrote})",
        op.label,
        late.len()
    );
    if settled && effects == 1 && late.is_empty() && a_code != 0 {
        Ok(line)
    } else {
        Err(format!("{line}: {late:?}"))
    }
}

/// `runs` frozen-leader runs over the Bucket operations, at seeded random instants.
async fn frozen_leader_drill(tag: &str, runs: usize) {
    let (client, ns, mut bed) = Bed::new(tag).await;
    // The installation of the clean runs (`Operator::start`): one Lease, or the fleet would
    // see two installations and block (ForeignOperator).
    let operator_ns = "celld-e2e".to_string();
    // Each operation's clean duration bounds the instants.
    let ops = [CONTRACTION, GROWTH, RESTART, REPLACE];
    let mut windows = Vec::new();
    for op in ops {
        let out = sweep_run(&mut bed, op, "none@1", None).await;
        assert!(out.settled, "{} did not settle in its clean run", op.label);
        windows.push((op, out.elapsed));
    }
    let seed = celld_harness::drill::seed();
    let mut rng = seed | 1;
    eprintln!(
        "frozen leaders {tag}: CELLD_DRILL_SEED={seed}, clean durations {:?}",
        windows
            .iter()
            .map(|(o, t)| format!("{} {t:?}", o.label))
            .collect::<Vec<_>>()
    );
    let (mut passed, mut failures) = (0, Vec::new());
    for i in 0..runs {
        let (op, window) = windows[i % windows.len()];
        let delay = celld_harness::drill::instant_within(&mut rng, window);
        match frozen_leader_run(&mut bed, &operator_ns, tag, op, delay).await {
            Ok(line) => {
                passed += 1;
                eprintln!("frozen leaders {tag}: ok: {line}");
            }
            Err(line) => {
                eprintln!("frozen leaders {tag}: FAILED: {line}");
                failures.push(line);
            }
        }
    }
    eprintln!("frozen leaders {tag}: {runs} runs, {passed} passed, seed {seed}");
    let what = format!("frozen-leader failures (seed {seed})");
    finish(&client, ns, &what, &failures).await;
}

/// `make test`: three frozen-leader runs (one per operation kind).
#[tokio::test]
async fn leaders_frozen_at_random_instants_write_nothing_after_the_takeover() {
    let _guard = isolated().await;
    frozen_leader_drill("frozen", 3).await;
}

/// `make drills`: twelve frozen-leader runs.
#[tokio::test]
#[ignore = "exhaustive: make drills"]
async fn leaders_frozen_at_twelve_random_instants_write_nothing_after_the_takeover() {
    let _guard = isolated().await;
    frozen_leader_drill("frozen-all", 12).await;
}

/// Regression (found by the random-kill drill): a SIGTERM that arrived between the standby
/// loop and the controller's start (e.g. during replay) was lost, and the operator ran on.
/// SIGTERM at a series of instants during start-up: the process always ends.
#[tokio::test]
async fn a_sigterm_during_start_up_is_never_lost() {
    let _guard = isolated().await;
    let (client, ns, _bed) = Bed::new("startterm").await;
    let mut seen = Vec::new();
    for delay_ms in [0u64, 30, 60, 120, 250, 500, 1000, 2000] {
        let mut operator = Operator::start_with(|o| o.metrics_addr = None);
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        // Before the handler is installed, SIGTERM's default action ends the process
        // (no exit code); after it, a graceful stop exits 0.
        let code = operator.terminate(Duration::from_secs(30)).await;
        assert!(
            code == 0 || code == -1,
            "SIGTERM {delay_ms} ms after start: exit code {code}; log: {}",
            operator.log().display()
        );
        seen.push((delay_ms, code));
    }
    eprintln!("SIGTERM during start-up (delay ms, exit code): {seen:?}");
    finish(&client, ns, "start-up SIGTERM", &[]).await;
}
