//! Real-process tests of the simulator against a real s3s-fs store, on loopback addresses only.

mod common;

use std::time::{Duration, Instant};

use celld_sim::ledger::Ledger;
use common::{Bed, BedOptions};
use serde_json::Value;

const READY: Duration = Duration::from_secs(30);

fn exit_code(status: std::process::ExitStatus) -> Option<i32> {
    status.code()
}

async fn assert_ledger_passes(ledger: &Ledger, members: &[String], when: &str) {
    let report = ledger.check(members).await;
    assert!(report.passed(), "ledger check {when}: {}", report.summary());
    assert!(report.checked > 0);
}

async fn write_phase_fully(ledger: &mut Ledger, members: &[String]) {
    let phase = ledger.write_phase(members).await;
    assert!(
        phase.complete(),
        "phase {} left writes unacknowledged: {:?}",
        phase.phase,
        phase.unacknowledged
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_members_serve_the_ledger_and_keep_it_across_sigterm_and_restart() {
    let mut bed = Bed::new(
        "bucket",
        BedOptions {
            durability: "bucket",
            members: 2,
            ..Default::default()
        },
    )
    .await;
    bed.start_all();
    bed.wait_all_ready(READY).await;
    let urls = bed.urls();
    let mut ledger = Ledger::new("bucket-ledger");
    write_phase_fully(&mut ledger, &urls).await;
    assert_ledger_passes(&ledger, &urls, "after phase 1").await;

    // SIGTERM: drained exit 0 within the shutdown budget; the other member takes the cells.
    let t = Instant::now();
    bed.members[0].signal("TERM");
    let status = bed.members[0].wait_exit(Duration::from_secs(15));
    assert_eq!(exit_code(status), Some(0), "SIGTERM must exit 0");
    eprintln!("sigterm drain took {:?}", t.elapsed());
    assert_ledger_passes(&ledger, &bed.urls_of(&[1]), "while sim-0 is down").await;

    // Restart on the same disk (same Pod, same UID).
    bed.members[0].start();
    bed.members[0].wait_ready(READY).await;
    write_phase_fully(&mut ledger, &urls).await;
    assert_ledger_passes(&ledger, &urls, "after restart and phase 2").await;
    assert_eq!(ledger.acknowledged().len(), 24);
    bed.passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_members_replicate_and_keep_the_ledger_across_sigterm_and_restart() {
    let mut bed = Bed::new(
        "fleet-term",
        BedOptions {
            flush_ms: 60_000,
            ..Default::default()
        },
    )
    .await;
    bed.start_all();
    bed.wait_all_ready(READY).await;
    let urls = bed.urls();
    let mut ledger = Ledger::new("fleet-term-ledger");
    write_phase_fully(&mut ledger, &urls).await;
    assert_ledger_passes(&ledger, &urls, "after phase 1").await;

    // With the flusher slowed down, acknowledged writes live in leader logs and followers'
    // fragments, not in the store.
    let mut unflushed = 0;
    let mut fragments = 0;
    for m in &bed.members {
        let info = m.info().await;
        unflushed += info["unflushed_writes"].as_u64().unwrap();
        fragments += info["follower_fragments"].as_u64().unwrap();
    }
    assert_eq!(unflushed, 12, "every write is unflushed");
    assert_eq!(fragments, 12, "every write has one follower copy");
    assert!(bed
        .store
        .keys("cells/")
        .iter()
        .all(|k| !k.contains("/data/")));

    bed.members[1].signal("TERM");
    let status = bed.members[1].wait_exit(Duration::from_secs(15));
    assert_eq!(exit_code(status), Some(0));
    assert!(bed.members[1].log_text().contains("drained, exit 0"));
    assert_ledger_passes(&ledger, &bed.urls_of(&[0, 2]), "while sim-1 is down").await;

    bed.members[1].start();
    bed.members[1].wait_ready(READY).await;
    write_phase_fully(&mut ledger, &urls).await;
    assert_ledger_passes(&ledger, &urls, "after restart and phase 2").await;
    bed.passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_sigkill_of_one_member_loses_no_acknowledged_id() {
    let mut bed = Bed::new(
        "fleet-kill",
        BedOptions {
            flush_ms: 60_000,
            ..Default::default()
        },
    )
    .await;
    bed.start_all();
    bed.wait_all_ready(READY).await;
    let urls = bed.urls();
    let mut ledger = Ledger::new("fleet-kill-ledger");
    write_phase_fully(&mut ledger, &urls).await;

    bed.members[0].sigkill();
    // The survivors take sim-0's cells over once its lease expires, from its followers'
    // fragments (nothing of it is in the store yet).
    assert_ledger_passes(&ledger, &bed.urls_of(&[1, 2]), "with sim-0 killed").await;

    bed.members[0].start();
    bed.members[0].wait_ready(READY).await;
    write_phase_fully(&mut ledger, &urls).await;
    assert_ledger_passes(&ledger, &urls, "after sim-0 restarted on its disk").await;

    // Kill again right after writing and restart at once, before anyone takes over: recovery
    // from its own disk's log.
    write_phase_fully(&mut ledger, &urls).await;
    bed.members[2].sigkill();
    bed.members[2].start();
    bed.members[2].wait_ready(READY).await;
    assert_ledger_passes(&ledger, &urls, "after sim-2 was killed and restarted").await;
    bed.passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wiping_two_fleet_disks_while_both_are_down_loses_ids_and_the_oracle_sees_it() {
    let mut bed = Bed::new(
        "fleet-wipe",
        BedOptions {
            flush_ms: 600_000,
            ..Default::default()
        },
    )
    .await;
    bed.start_all();
    bed.wait_all_ready(READY).await;
    let urls = bed.urls();
    let mut ledger = Ledger::new("fleet-wipe-ledger");
    write_phase_fully(&mut ledger, &urls).await;
    assert_ledger_passes(&ledger, &urls, "before the loss").await;

    // Both disks gone while both members are down: sim-0's writes lived only on sim-0 and on
    // its follower sim-1.
    bed.members[0].sigkill();
    bed.members[1].sigkill();
    bed.members[0].wipe_disk();
    bed.members[1].wipe_disk();
    bed.members[0].start();
    bed.members[1].start();
    bed.wait_all_ready(READY).await;

    let report = ledger.check(&urls).await;
    eprintln!("{}", report.summary());
    assert!(!report.passed(), "the oracle must detect the loss");
    assert!(!report.missing.is_empty(), "lost ids are reported missing");
    assert!(report.wrong.is_empty() && report.false_positives.is_empty());
    let loss_records: Vec<String> = bed
        .store
        .keys("log/")
        .into_iter()
        .filter(|k| k.ends_with(".loss.json"))
        .collect();
    assert!(
        !loss_records.is_empty(),
        "a loss record names the lost session"
    );
    let record: Value =
        serde_json::from_slice(&std::fs::read(bed.store.object_path(&loss_records[0])).unwrap())
            .unwrap();
    eprintln!("loss record: {record}");
    assert_eq!(record["lost_holders"][0]["node"], "sim-1");
    bed.passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_partitioned_from_the_store_self_fences_and_recovers_on_its_disk() {
    let mut bed = Bed::new(
        "fence",
        BedOptions {
            flush_ms: 60_000,
            isolated_store: vec![0],
            ..Default::default()
        },
    )
    .await;
    bed.start_all();
    bed.wait_all_ready(READY).await;
    let urls = bed.urls();
    let mut ledger = Ledger::new("fence-ledger");
    write_phase_fully(&mut ledger, &urls).await;

    let t = Instant::now();
    Bed::set_proxy_mode(&bed.member_proxies[&0], "blackhole").await;
    let status = bed.members[0].wait_exit(Duration::from_secs(15));
    eprintln!("self-fenced after {:?}", t.elapsed());
    assert_eq!(exit_code(status), Some(3), "self-fence exits 3");
    let log = bed.members[0].log_text();
    let line = log
        .lines()
        .find(|l| l.starts_with("SELF-FENCE:"))
        .expect("a line starting with SELF-FENCE:");
    assert!(line.contains("node_lease_watchdog_fence"), "{line}");

    // Restoring the store does not revive the fenced process; the kubelet restarts it on the
    // same disk, with a new generation.
    Bed::set_proxy_mode(&bed.member_proxies[&0], "ok").await;
    bed.members[0].start();
    bed.members[0].wait_ready(READY).await;
    assert_ledger_passes(&ledger, &urls, "after the fenced member came back").await;
    write_phase_fully(&mut ledger, &urls).await;
    assert_ledger_passes(&ledger, &urls, "after phase 2").await;

    // Refusing connections fences the same way.
    Bed::set_proxy_mode(&bed.member_proxies[&0], "refuse").await;
    let status = bed.members[0].wait_exit(Duration::from_secs(15));
    assert_eq!(exit_code(status), Some(3));
    Bed::set_proxy_mode(&bed.member_proxies[&0], "ok").await;
    bed.members[0].start();
    bed.members[0].wait_ready(READY).await;
    assert_ledger_passes(&ledger, &urls, "after the second fence").await;
    bed.passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_or_deleted_lease_record_fences_with_its_own_cause() {
    let mut bed = Bed::new(
        "lease",
        BedOptions {
            durability: "fleet",
            members: 2,
            ..Default::default()
        },
    )
    .await;
    bed.start_all();
    bed.wait_all_ready(READY).await;
    let urls = bed.urls();
    let mut ledger = Ledger::new("lease-ledger");
    write_phase_fully(&mut ledger, &urls).await;

    // A second process under sim-0's name on the same disk takes the lease over; the first
    // fences itself, and the new one gets the disk once the old one is gone.
    let old_generation = bed.members[0].info().await["generation"].clone();
    let mut twin = common::Member {
        name: "sim-0-twin".into(),
        ip: std::net::Ipv4Addr::new(
            127,
            bed.members[0].ip.octets()[1],
            bed.members[0].ip.octets()[2],
            99,
        ),
        watch: bed.members[0].watch.clone(),
        env: bed.members[0].env.clone(),
        child: None,
        log: bed.dir.join("sim-0-twin.log"),
        starts: 0,
    };
    twin.env.insert("POD_IP".into(), twin.ip.to_string());
    twin.start();
    let status = bed.members[0].wait_exit(Duration::from_secs(10));
    assert_eq!(exit_code(status), Some(3));
    assert!(bed.members[0]
        .log_text()
        .lines()
        .any(|l| l.starts_with("SELF-FENCE: node_lease_record_mismatch_fence")));
    twin.wait_ready(READY).await;
    assert_ne!(twin.info().await["generation"], old_generation);
    assert_ledger_passes(
        &ledger,
        &[twin.url(), urls[1].clone()],
        "after the takeover",
    )
    .await;

    // A deleted record fences with the missing cause.
    let key = "nodes/sim-1.json";
    std::fs::remove_file(bed.store.object_path(key)).unwrap();
    let status = bed.members[1].wait_exit(Duration::from_secs(10));
    assert_eq!(exit_code(status), Some(3));
    assert!(bed.members[1]
        .log_text()
        .lines()
        .any(|l| l.starts_with("SELF-FENCE: node_lease_record_missing_fence")));
    bed.passed();
}

async fn poll_state_until(
    member: &common::Member,
    timeout: Duration,
    mut done: impl FnMut(&Value) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + timeout;
    let mut seen = Vec::new();
    loop {
        let s = member.state().await;
        let stop = done(&s);
        seen.push(s);
        if stop {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "state never reached the goal: {:?}",
            seen.last()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_removal_reaches_data_safe_only_once_the_store_holds_its_data() {
    let mut bed = Bed::new(
        "strict",
        BedOptions {
            flush_ms: 600_000,
            ..Default::default()
        },
    )
    .await;
    bed.start_all();
    bed.wait_all_ready(READY).await;
    let urls = bed.urls();
    let mut ledger = Ledger::new("strict-ledger");
    write_phase_fully(&mut ledger, &urls).await;

    let target = 0;
    let info = bed.members[target].info().await;
    assert!(info["unflushed_writes"].as_u64().unwrap() > 0);
    assert!(info["follower_fragments"].as_u64().unwrap() > 0);
    assert!(bed
        .store
        .keys("cells/")
        .iter()
        .all(|k| !k.contains("/data/")));

    let state = bed.members[target].state().await;
    assert_eq!(state["node"], "sim-0");
    assert_eq!(state["shutdown"]["schema_version"], 1);
    assert_eq!(
        state["shutdown"]["capabilities"]["strict_disk_removal"],
        true
    );
    assert_eq!(state["shutdown"]["control_only"], false);
    assert_eq!(state["shutdown"]["operation"], Value::Null);
    let generation = state["shutdown"]["runtime_generation"]
        .as_str()
        .unwrap()
        .to_string();

    // Protocol errors first: wrong generation 409, malformed 400, wrong mode 400.
    let r = bed.members[target]
        .remove_disk("op-a", "not-the-generation")
        .await
        .unwrap();
    assert_eq!(r.status, 409);
    let r = common::call(
        bed.members[target].internal(),
        hyper::Method::POST,
        "/shutdown?mode=remove-disk",
        Some("application/json"),
        r#"{"operation_id":"op-a"}"#,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 400);
    let r = common::call(
        bed.members[target].internal(),
        hyper::Method::POST,
        "/shutdown",
        Some("application/json"),
        &format!(r#"{{"operation_id":"op-a","expected_generation":"{generation}"}}"#),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 400);

    // Slow the outcome down so `draining` is observable.
    assert_eq!(
        bed.members[target]
            .set_faults(r#"{"removal_delay_ms": 1500}"#)
            .await
            .status,
        200
    );
    let r = bed.members[target]
        .remove_disk("op-a", &generation)
        .await
        .unwrap();
    assert_eq!(r.status, 202);
    let accepted: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(accepted["operation"]["operation_id"], "op-a");
    assert_eq!(accepted["operation"]["phase"], "draining");
    assert_eq!(accepted["operation"]["mode"], "remove-disk");

    let r = bed.members[target]
        .remove_disk("op-b", &generation)
        .await
        .unwrap();
    assert_eq!(r.status, 409, "another operation id is refused");
    assert_eq!(bed.members[target].health().await, Some(503));

    let seen = poll_state_until(&bed.members[target], Duration::from_secs(20), |s| {
        s["shutdown"]["operation"]["phase"] != "draining"
    })
    .await;
    assert_eq!(seen[0]["shutdown"]["operation"]["phase"], "draining");
    assert!(seen[0]["shutdown"]["operation"]["blocker"].is_string());
    let last = seen.last().unwrap();
    assert_eq!(
        last["shutdown"]["operation"]["phase"], "data_safe",
        "{last}"
    );
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
    assert_eq!(bed.members[target].health().await, Some(503));

    // Repeats: same id → 202 with the terminal result; another id → 409.
    let r = bed.members[target]
        .remove_disk("op-a", &generation)
        .await
        .unwrap();
    assert_eq!(r.status, 202);
    let again: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(again["operation"]["phase"], "data_safe");
    let r = bed.members[target]
        .remove_disk("op-b", &generation)
        .await
        .unwrap();
    assert_eq!(r.status, 409);

    // data_safe meant it: every id acknowledged through sim-0 or followed by it is now in the
    // store, so deleting its disk loses nothing.
    let data: Vec<String> = bed
        .store
        .keys("cells/")
        .into_iter()
        .filter(|k| k.contains("/data/"))
        .collect();
    assert!(!data.is_empty());
    bed.members[target].signal("TERM");
    let status = bed.members[target].wait_exit(Duration::from_secs(15));
    assert_eq!(exit_code(status), Some(0));
    bed.members[target].wipe_disk();
    assert_ledger_passes(
        &ledger,
        &bed.urls_of(&[1, 2]),
        "after removing sim-0's disk",
    )
    .await;

    // A new process answers with a new generation and no operation; the old request gets 409.
    bed.members[target].start();
    bed.members[target].wait_ready(READY).await;
    let fresh = bed.members[target].state().await;
    assert_ne!(fresh["shutdown"]["runtime_generation"], generation.as_str());
    assert_eq!(fresh["shutdown"]["operation"], Value::Null);
    let r = bed.members[target]
        .remove_disk("op-a", &generation)
        .await
        .unwrap();
    assert_eq!(r.status, 409);
    assert_ledger_passes(&ledger, &urls, "after sim-0 came back on a fresh disk").await;
    bed.passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_and_fault_switches_follow_the_contract() {
    let mut bed = Bed::new(
        "faults",
        BedOptions {
            durability: "bucket",
            members: 1,
            ..Default::default()
        },
    )
    .await;
    bed.start_all();
    bed.wait_all_ready(READY).await;
    let m = &bed.members[0];
    let internal = m.internal();

    let info = m.info().await;
    for key in [
        "node",
        "generation",
        "pid",
        "durability",
        "phase",
        "owned_cells",
        "unflushed_writes",
        "follower_fragments",
        "lease_expires_ms",
    ] {
        assert!(info.get(key).is_some(), "/sim/info lacks {key}: {info}");
    }
    assert_eq!(info["durability"], "bucket");

    assert_eq!(m.set_faults(r#"{"state": "nonsense"}"#).await.status, 400);
    assert_eq!(m.set_faults(r#"{"unknown": "ok"}"#).await.status, 400);

    let raw = |fault: &'static str| async move {
        let r = m.set_faults(&format!(r#"{{"state": "{fault}"}}"#)).await;
        assert_eq!(r.status, 200);
        common::get(internal, "/state").await
    };
    let r = raw("schema_version_2").await.unwrap();
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["shutdown"]["schema_version"], 2);
    let r = raw("no_generation").await.unwrap();
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert!(v["shutdown"].get("runtime_generation").is_none());
    let r = raw("wrong_node").await.unwrap();
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_ne!(v["node"], info["node"]);
    let r = raw("duplicate_key").await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&r.body)
            .matches("\"shutdown\"")
            .count(),
        2
    );
    let r = raw("malformed").await.unwrap();
    assert!(serde_json::from_slice::<Value>(&r.body).is_err());
    let r = raw("oversize").await.unwrap();
    assert!(r.body.len() > (1 << 20) + 1);
    let r = raw("redirect").await.unwrap();
    assert_eq!(r.status, 307);
    let r = raw("stale_sampled_ms").await.unwrap();
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert!(
        v["node_load"]["sampled_ms"].as_u64().unwrap() + 3_000_000 < celld_sim::model::now_ms()
    );
    assert!(raw("eof").await.is_err(), "eof drops the connection");
    assert_eq!(m.set_faults(r#"{"state": "ok"}"#).await.status, 200);
    let generation = m.state().await["shutdown"]["runtime_generation"]
        .as_str()
        .unwrap()
        .to_string();

    // Strict-removal protocol faults.
    for (fault, status) in [
        ("status:501", 501),
        ("status:200", 200),
        ("status:409", 409),
    ] {
        m.set_faults(&format!(r#"{{"removal": "{fault}"}}"#)).await;
        assert_eq!(
            m.remove_disk("op-x", &generation).await.unwrap().status,
            status
        );
    }
    m.set_faults(r#"{"removal": "capability_false"}"#).await;
    assert_eq!(
        m.state().await["shutdown"]["capabilities"]["strict_disk_removal"],
        false
    );
    assert_eq!(
        m.remove_disk("op-x", &generation).await.unwrap().status,
        400
    );

    // Readiness gate switch.
    m.set_faults(r#"{"ready": "never", "removal": "ok"}"#).await;
    assert_eq!(m.health().await, Some(503));
    m.set_faults(r#"{"ready": "auto"}"#).await;
    assert_eq!(m.health().await, Some(200));

    // eof_on_transition: the accepting POST loses its connection, yet the operation runs.
    m.set_faults(r#"{"removal": "eof_on_transition"}"#).await;
    assert!(m.remove_disk("op-e", &generation).await.is_err());
    let seen = poll_state_until(m, Duration::from_secs(10), |s| {
        s["shutdown"]["operation"]["phase"] == "data_safe"
    })
    .await;
    assert_eq!(
        seen.last().unwrap()["shutdown"]["operation"]["operation_id"],
        "op-e"
    );

    // A new process (faults from CELLD_SIM_FAULTS_FILE) whose removal fails: `failed` is
    // terminal and control-only too.
    bed.members[0].sigkill();
    let faults_file = bed.dir.join("faults.json");
    std::fs::write(
        &faults_file,
        r#"{"removal": "fail", "removal_delay_ms": 300}"#,
    )
    .unwrap();
    bed.members[0].env.insert(
        "CELLD_SIM_FAULTS_FILE".into(),
        faults_file.display().to_string(),
    );
    bed.members[0].start();
    bed.members[0].wait_ready(READY).await;
    let m = &bed.members[0];
    let generation2 = m.state().await["shutdown"]["runtime_generation"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(generation2, generation);
    assert_eq!(
        m.remove_disk("op-e", &generation).await.unwrap().status,
        409,
        "old generation"
    );
    assert_eq!(
        m.remove_disk("op-f", &generation2).await.unwrap().status,
        202
    );
    let seen = poll_state_until(m, Duration::from_secs(10), |s| {
        s["shutdown"]["operation"]["phase"] == "failed"
    })
    .await;
    let last = seen.last().unwrap();
    assert_eq!(last["shutdown"]["control_only"], true);
    assert!(last["shutdown"]["operation"]["blocker"].is_string());
    let r = m.remove_disk("op-f", &generation2).await.unwrap();
    assert_eq!(r.status, 202, "a terminal result is repeated with 202");

    // sigterm=ignore keeps the process alive; the crash switch ends it with the chosen code.
    m.set_faults(r#"{"sigterm": "ignore"}"#).await;
    m.signal("TERM");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(bed.members[0].running());
    bed.members[0]
        .set_faults(r#"{"crash": "exit:42@100"}"#)
        .await;
    let status = bed.members[0].wait_exit(Duration::from_secs(5));
    assert_eq!(exit_code(status), Some(42));
    bed.passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_ignores_conditional_writes_makes_startup_exit_7() {
    // A plain TCP "store" that answers 200 to everything: conditional writes are ignored.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = vec![0u8; 65536];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\netag: \"same\"\r\ncontent-length: 7\r\nconnection: close\r\n\r\nprobe-1")
                    .await;
            });
        }
    });
    let mut bed = Bed::new(
        "probe",
        BedOptions {
            durability: "bucket",
            members: 1,
            ..Default::default()
        },
    )
    .await;
    bed.members[0]
        .env
        .insert("S3_ENDPOINT".into(), format!("http://{addr}"));
    bed.members[0].start();
    let status = bed.members[0].wait_exit(Duration::from_secs(15));
    assert_eq!(exit_code(status), Some(7));
    assert!(bed.members[0].log_text().contains("store probe failed"));
    bed.passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_disk_stays_unready_until_the_followers_holding_its_data_answer() {
    let mut bed = Bed::new(
        "fresh-disk",
        BedOptions {
            flush_ms: 600_000,
            ..Default::default()
        },
    )
    .await;
    bed.start_all();
    bed.wait_all_ready(READY).await;
    let urls = bed.urls();
    let mut ledger = Ledger::new("fresh-disk-ledger");
    write_phase_fully(&mut ledger, &urls).await;

    // sim-0 loses its disk; sim-1, which follows sim-0, is down, and its name is gone from the
    // hosts file (a missing name is unreachable: no DNS fallback).
    bed.members[0].sigkill();
    bed.members[1].sigkill();
    bed.members[0].wipe_disk();
    let hosts = bed.dir.join("hosts");
    let full = std::fs::read_to_string(&hosts).unwrap();
    let without_sim1: String = full
        .lines()
        .filter(|l| !l.contains("sim-1."))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&hosts, &without_sim1).unwrap();
    bed.members[0].start();
    bed.members[1].start();
    bed.members[1].wait_ready(READY).await;

    // sim-1 is back but cannot be named: sim-0 must not serve from the store alone.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(bed.members[0].health().await, Some(503));
    assert_eq!(bed.members[0].info().await["phase"], "recovering");
    let cell0 = &ledger.acknowledged()[0];
    let r = common::get(
        bed.members[2].public(),
        &format!("/?cell={}&id={}", cell0.cell, cell0.id),
    )
    .await
    .unwrap();
    assert_eq!(
        r.status,
        503,
        "never answer from incomplete data: {}",
        String::from_utf8_lossy(&r.body)
    );

    // The name comes back (the file is re-read within a second): recovery completes, nothing lost.
    std::fs::write(&hosts, &full).unwrap();
    bed.members[0].wait_ready(READY).await;
    assert_ledger_passes(
        &ledger,
        &urls,
        "after sim-0 recovered from sim-1's fragments",
    )
    .await;
    assert!(
        bed.store
            .keys("log/")
            .iter()
            .all(|k| !k.ends_with(".loss.json")),
        "no loss record when a follower still held the data"
    );
    bed.passed();
}
