//! What the simulator relies on from the test store (s3s-fs 0.14.1), checked against the real
//! server through the simulator's own S3 client.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use celld_sim::config::Config;
use celld_sim::faults::Faults;
use celld_sim::hosts::Hosts;
use celld_sim::store::{Cond, Store, StoreError};
use common::{Bed, BedOptions};

fn client(bed: &Bed, secret: &str) -> Store {
    client_locking_in(bed, secret, "cas-locks")
}

fn client_locking_in(bed: &Bed, secret: &str, lock_dir: &str) -> Store {
    let endpoint = format!("http://{}", bed.store.addr);
    let locks = bed.dir.join(lock_dir).display().to_string();
    let env = [
        ("CELLD_NODE", "contract"),
        ("CELLD_ADDR", "127.0.0.1:0"),
        ("CELLD_INTERNAL_ADDR", "127.0.0.1:0"),
        ("CELLD_BUCKET", "s3://celld-test"),
        ("CELLD_DURABILITY", "bucket"),
        ("CELLD_WATCH", "/nonexistent"),
        ("S3_ENDPOINT", endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "celld-test"),
        ("AWS_SECRET_ACCESS_KEY", secret),
        ("CELLD_SIM_LOCK_DIR", locks.as_str()),
    ];
    let cfg = Config::from_lookup(|k| {
        env.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    })
    .unwrap();
    Store::new(
        &cfg,
        Arc::new(Hosts::new(bed.dir.join("no-hosts-file"))),
        Arc::new(Faults::default()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3s_fs_honours_conditional_writes_and_ranged_reads() {
    let mut bed = Bed::new(
        "contract",
        BedOptions {
            members: 0,
            ..Default::default()
        },
    )
    .await;
    let store = client(&bed, "celld-test-secret");

    let e1 = store
        .put("k/obj", Bytes::from_static(b"probe-1"), Cond::Absent)
        .await
        .unwrap();
    assert!(matches!(
        store
            .put("k/obj", Bytes::from_static(b"probe-2"), Cond::Absent)
            .await,
        Err(StoreError::PreconditionFailed)
    ));
    let e3 = store
        .put(
            "k/obj",
            Bytes::from_static(b"probe-3"),
            Cond::Matches(e1.clone()),
        )
        .await
        .unwrap();
    assert_ne!(e1, e3);
    assert!(matches!(
        store
            .put("k/obj", Bytes::from_static(b"probe-4"), Cond::Matches(e1))
            .await,
        Err(StoreError::PreconditionFailed)
    ));
    assert!(matches!(
        store
            .put(
                "k/absent",
                Bytes::from_static(b"x"),
                Cond::Matches(e3.clone())
            )
            .await,
        Err(StoreError::PreconditionFailed)
    ));
    let obj = store.get("k/obj").await.unwrap().unwrap();
    assert_eq!(&obj.body[..], b"probe-3");
    assert_eq!(obj.etag, e3);
    assert_eq!(
        &store.get_range("k/obj", 2, 4).await.unwrap().unwrap()[..],
        b"obe"
    );
    assert_eq!(store.list("k/").await.unwrap(), vec!["k/obj".to_string()]);
    store.delete("k/obj").await.unwrap();
    assert!(store.get("k/obj").await.unwrap().is_none());

    let wrong = client(&bed, "wrong-secret");
    assert!(matches!(
        wrong.get("k/obj").await,
        Err(StoreError::Unexpected { status: 403, .. })
    ));
    bed.passed();
}

/// s3s-fs checks the precondition and then writes, with nothing held in between: concurrent
/// conditional creates of one key can all succeed. This test shows it with raw requests, then
/// proves that the simulator's conditional writes (per-key host lock, plus the verification read
/// of `put_checked`) let exactly one writer win.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_conditional_creates_race_in_s3s_fs_but_the_simulator_has_one_winner() {
    let mut bed = Bed::new(
        "race",
        BedOptions {
            members: 0,
            ..Default::default()
        },
    )
    .await;
    let writers = 8;
    let rounds = 5;

    // Writers that share no lock: s3s-fs alone decides.
    let unlocked: Vec<Arc<Store>> = (0..writers)
        .map(|i| {
            Arc::new(client_locking_in(
                &bed,
                "celld-test-secret",
                &format!("locks-{i}"),
            ))
        })
        .collect();
    let mut raw_winners = Vec::new();
    for round in 0..rounds {
        let key = format!("race/raw-{round}");
        let tasks: Vec<_> = unlocked
            .iter()
            .enumerate()
            .map(|(i, store)| {
                let store = store.clone();
                let key = key.clone();
                tokio::spawn(async move {
                    store
                        .put(&key, Bytes::from(format!("writer-{i}")), Cond::Absent)
                        .await
                        .is_ok()
                })
            })
            .collect();
        let mut wins = 0;
        for t in tasks {
            wins += t.await.unwrap() as usize;
        }
        raw_winners.push(wins);
    }
    eprintln!(
        "s3s-fs alone: If-None-Match creates answered 200, per round of {writers} concurrent writers: {raw_winners:?}"
    );

    // The simulator's writers share the host lock folder: exactly one create wins, with and
    // without the verification read.
    let shared = Arc::new(client(&bed, "celld-test-secret"));
    for (checked, label) in [(false, "locked"), (true, "checked")] {
        for round in 0..rounds {
            let key = format!("race/{label}-{round}");
            let tasks: Vec<_> = (0..writers)
                .map(|i| {
                    let store = shared.clone();
                    let key = key.clone();
                    tokio::spawn(async move {
                        let value = serde_json::json!({ "writer": i });
                        if checked {
                            store.put_checked(&key, &value, Cond::Absent).await.is_ok()
                        } else {
                            store.put_json(&key, &value, Cond::Absent).await.is_ok()
                        }
                    })
                })
                .collect();
            let mut wins = 0;
            for t in tasks {
                wins += t.await.unwrap() as usize;
            }
            assert_eq!(wins, 1, "{label} round {round}: {wins} winners");
        }
    }
    bed.passed();
}
