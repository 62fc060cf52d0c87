//! The annotation codec (strict decoding, compact encoding) and the hash chain.
mod common;

use common::*;
use journal::*;

fn every_entry_type() -> Vec<(OperationId, EntryBody)> {
    let mut full = intent(OperationKind::Restart, 3, 3);
    full.token = Some("tok-7".into());
    full.image = Some("registry.example/celld@sha256:0123".into());
    full.reason = Some("Administrative".into());
    full.targets = vec![
        target("beta-0"),
        Target {
            pod: "beta-1".into(),
            ..Target::default()
        },
    ];
    full.predecessor_effect = Some(Effect::new(op(0), Step::Create));
    vec![
        (op(0), recovered(op(0), "create")),
        (op(1), EntryBody::Intent(full)),
        (op(1), issued(op(1), "proof/beta-0")),
        (op(1), proof(op(1), "beta-0")),
        (op(1), retired("data-beta-0")),
        (op(1), blocked("runtime \"failed\"\nsee /state")),
        (op(1), retried()),
        (op(1), stalled()),
        (op(1), observed()),
        (op(1), completed(CompletedOutcome::ClaimKept)),
        (op(2), intent_body(OperationKind::Scale, 3, 2)),
        (op(2), canceled(CancelReason::PredecessorChanged)),
        (op(3), intent_body(OperationKind::Scale, 3, 2)),
        (op(3), abandoned()),
    ]
}

#[test]
fn every_entry_type_round_trips_through_the_annotation() {
    let mut w = Writer::new();
    let bodies = every_entry_type();
    let types: std::collections::BTreeSet<EntryType> =
        bodies.iter().map(|(_, b)| b.entry_type()).collect();
    assert_eq!(
        types.len(),
        EntryType::ALL.len(),
        "the fixture covers every type"
    );
    for (o, b) in bodies {
        w.push(o, b);
    }
    let text = w.journal.document().encode();
    let doc = decode_document(&text).unwrap();
    assert_eq!(&doc, w.journal.document());
    assert_eq!(doc.encode(), text, "encoding is deterministic");
    chain::verify(&doc).unwrap();
    for e in doc.entries() {
        assert_eq!(&decode_entry(e.to_json()).unwrap(), e);
        assert_eq!(chain::recompute(e), e.hash());
    }
}

#[test]
fn the_canonical_form_sorts_keys_and_hashes_the_entry_without_its_hash() {
    let e = chain::seal(
        0,
        Hash::ZERO,
        NewEntry {
            at: t(0),
            op: op(1),
            // An entry from before installations were recorded: no `lease`, same hash.
            leader: Leader {
                lease: None,
                ..leader()
            },
            body: EntryBody::Observed(Observed {
                note: "rolled out \"ok\"".into(),
            }),
        },
    );
    let without_hash = format!(
        "{{\"at\":\"2026-11-29T10:00:00Z\",\"leader\":{{\"identity\":\"celld-operator-0\",\"leaseTransitions\":2}},\"note\":\"rolled out \\\"ok\\\"\",\"op\":\"{}\",\"prev\":\"{}\",\"seq\":1,\"type\":\"Observed\"}}",
        op(1),
        "0".repeat(64)
    );
    // Pinned: a change to the canonical form would break every stored chain.
    assert_eq!(
        e.hash().to_hex(),
        "f64fe7ed4d11a9a5a087ae89868bbda95a62507fb1a0b0d3d28876e082308aa4"
    );
    assert_eq!(chain::digest(without_hash.as_bytes()), e.hash());
    let with_hash = without_hash.replace(
        "\"leader\"",
        &format!("\"hash\":\"{}\",\"leader\"", e.hash()),
    );
    assert_eq!(e.to_json(), with_hash);
}

#[test]
fn the_writers_lease_is_part_of_the_hashed_leader_object() {
    let e = chain::seal(
        0,
        Hash::ZERO,
        NewEntry {
            at: t(0),
            op: op(1),
            leader: leader(),
            body: EntryBody::Observed(Observed { note: "ok".into() }),
        },
    );
    assert!(
        e.to_json().contains(
            "\"leader\":{\"identity\":\"celld-operator-0\",\"lease\":\"celld-test/celld-operator\",\"leaseTransitions\":2}"
        ),
        "{}",
        e.to_json()
    );
    let back = decode_entry(e.to_json()).unwrap();
    assert_eq!(
        back.leader().lease.as_deref(),
        Some("celld-test/celld-operator")
    );
    assert_eq!(chain::recompute(&back), e.hash());
    // Another installation's Lease is another hash: the field cannot be edited unnoticed.
    let other = chain::seal(
        0,
        Hash::ZERO,
        NewEntry {
            at: t(0),
            op: op(1),
            leader: Leader {
                lease: Some("other/celld-operator".into()),
                ..leader()
            },
            body: EntryBody::Observed(Observed { note: "ok".into() }),
        },
    );
    assert_ne!(other.hash(), e.hash());
}

#[test]
fn decoding_accepts_any_key_order_and_whitespace() {
    let mut w = Writer::new();
    w.scale(op(1), 3, 4);
    let doc = w.journal.document();
    let pretty = serde_json::to_string_pretty(
        &serde_json::from_str::<serde_json::Value>(&doc.encode()).unwrap(),
    )
    .unwrap();
    assert_eq!(&decode_document(&pretty).unwrap(), doc);
}

#[test]
fn the_empty_document_has_zero_seq_and_hashes() {
    let doc = Document::empty(FLEET);
    let text = doc.encode();
    assert_eq!(
        text,
        format!(
            "{{\"v\":1,\"fleetUID\":\"{FLEET}\",\"seq\":0,\"head\":\"{z}\",\"compactedThrough\":0,\"compactedHash\":\"{z}\",\"entries\":[]}}",
            z = "0".repeat(64)
        )
    );
    assert_eq!(decode_document(&text).unwrap(), doc);
    assert_eq!(doc.encoded_len(), text.len());
}

// ---- strict decoding ----

fn valid_text() -> String {
    let mut w = Writer::new();
    let mut i = intent(OperationKind::Scale, 3, 2);
    i.targets = vec![target("beta-2")];
    w.push(op(0xabc), EntryBody::Intent(i));
    w.push(op(0xabc), proof(op(0xabc), "beta-2"));
    w.journal.document().encode()
}

fn decode_err(text: &str) -> DecodeError {
    decode_document(text).expect_err("decoding should fail")
}

#[test]
fn oversize_input_is_rejected_before_parsing() {
    let text = " ".repeat(HARD_MAX_BYTES + 1);
    assert_eq!(
        decode_err(&text),
        DecodeError::Oversize {
            len: HARD_MAX_BYTES + 1,
            max: HARD_MAX_BYTES
        }
    );
}

#[test]
fn invalid_json_is_a_syntax_error() {
    for text in ["", "{", "{\"v\":1,}", "[1,2]x", "nul"] {
        assert!(
            matches!(decode_err(text), DecodeError::Syntax { .. }),
            "{text:?}"
        );
    }
}

#[test]
fn another_format_version_is_rejected_first() {
    let e = decode_err(r#"{"v":2,"somethingNew":true}"#);
    assert_eq!(e, DecodeError::UnsupportedVersion { found: "2".into() });
    assert!(e.to_string().contains("version 2"));
    assert!(matches!(
        decode_err(r#"{"v":"1"}"#),
        DecodeError::UnsupportedVersion { .. }
    ));
    assert!(matches!(
        decode_err(r#"{"fleetUID":"x"}"#),
        DecodeError::MissingField { field, .. } if field == "v"
    ));
}

#[test]
fn a_non_object_document_is_a_wrong_type() {
    assert_eq!(
        decode_err("[]"),
        DecodeError::WrongType {
            path: "the document".into(),
            expected: "an object",
            found: "an array"
        }
    );
}

#[test]
fn unknown_fields_are_named_with_their_path() {
    let text = valid_text();
    let cases = [
        (
            text.replacen("{\"v\":1,", "{\"v\":1,\"extra\":1,", 1),
            "the document",
            "extra",
        ),
        (
            text.replacen(
                "\"type\":\"Intent\"",
                "\"type\":\"Intent\",\"step\":\"replicas\"",
                1,
            ),
            "entries[0] (an Intent entry)",
            "step",
        ),
        (
            text.replacen(
                "\"pod\":\"beta-2\"",
                "\"pod\":\"beta-2\",\"node\":\"n1\"",
                1,
            ),
            "entries[0].targets[0]",
            "node",
        ),
        (
            text.replacen(
                "\"leaseTransitions\":2",
                "\"leaseTransitions\":2,\"term\":1",
                1,
            ),
            "entries[0].leader",
            "term",
        ),
        (
            text.replacen(
                "\"phase\":\"data_safe\"",
                "\"phase\":\"data_safe\",\"x\":null",
                1,
            ),
            "entries[1].proof",
            "x",
        ),
    ];
    for (input, path, field) in cases {
        assert_eq!(
            decode_err(&input),
            DecodeError::UnknownField {
                path: path.into(),
                field: field.into()
            }
        );
    }
}

#[test]
fn duplicate_keys_are_rejected_with_their_path() {
    let text = valid_text();
    let cases = [
        (
            text.replacen("{\"v\":1,", "{\"v\":1,\"v\":1,", 1),
            "the document",
            "v",
        ),
        (
            text.replacen("\"seq\":2,\"type\"", "\"seq\":2,\"seq\":2,\"type\"", 1),
            "entries[1]",
            "seq",
        ),
        (
            text.replacen(
                "\"pod\":\"beta-2\"",
                "\"pod\":\"beta-2\",\"pod\":\"beta-3\"",
                1,
            ),
            "entries[0].targets[0]",
            "pod",
        ),
    ];
    for (input, path, key) in cases {
        assert_eq!(
            decode_err(&input),
            DecodeError::DuplicateKey {
                path: path.into(),
                key: key.into()
            },
            "{input}"
        );
    }
}

#[test]
fn missing_fields_are_named() {
    let text = valid_text();
    let no_hash = text.replacen("\"head\":", "\"heda\":", 1);
    assert!(matches!(
        decode_err(&no_hash),
        DecodeError::MissingField { field, .. } if field == "head"
    ));
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 4));
    let text = w.journal.document().encode();
    let cut = text.replacen("\"deadline\":\"2026-11-29T10:30:00Z\",", "", 1);
    assert_eq!(
        decode_err(&cut),
        DecodeError::MissingField {
            path: "entries[0] (an Intent entry)".into(),
            field: "deadline".into()
        }
    );
}

#[test]
fn wrong_types_are_named_with_what_was_expected() {
    let text = valid_text();
    let cases = [
        (
            text.replacen("\"seq\":2,\"head\"", "\"seq\":\"2\",\"head\"", 1),
            "seq",
            "an integer",
            "a string",
        ),
        (
            text.replacen("\"from\":3", "\"from\":3.0", 1),
            "entries[0].from",
            "an integer",
            "a non-integer number",
        ),
        (
            text.replacen("\"controlOnly\":true", "\"controlOnly\":\"true\"", 1),
            "entries[1].proof.controlOnly",
            "a boolean",
            "a string",
        ),
        (
            text.replacen("\"podIP\":\"10.0.0.7\"", "\"podIP\":null", 1),
            "entries[0].targets[0].podIP",
            "a string",
            "null",
        ),
        (
            text.replacen("\"targets\":[", "\"targets\":{\"a\":[", 1)
                .replacen("}],\"to\"", "}]},\"to\"", 1),
            "entries[0].targets",
            "an array",
            "an object",
        ),
    ];
    for (input, path, expected, found) in cases {
        assert_eq!(
            decode_err(&input),
            DecodeError::WrongType {
                path: path.into(),
                expected,
                found
            },
            "{input}"
        );
    }
}

#[test]
fn invalid_values_are_named_with_the_problem() {
    let text = valid_text();
    let cases = [
        text.replacen("\"from\":3", "\"from\":-1", 1),
        text.replacen("\"seq\":1,", "\"seq\":0,", 1),
        text.replacen("\"podIP\":\"10.0.0.7\"", "\"podIP\":\"\"", 1),
        text.replacen("\"pod\":\"beta-2\"", "\"pod\":\"\"", 1),
        text.replacen("\"type\":\"Intent\"", "\"type\":\"Started\"", 1),
        text.replacen("\"kind\":\"Scale\"", "\"kind\":\"scale\"", 1),
        text.replacen(
            "\"deadline\":\"2026-11-29T10:30:00Z\"",
            "\"deadline\":\"tomorrow\"",
            1,
        ),
        text.replacen(
            &op(0xabc).to_string(),
            &op(0xabc).to_string().to_uppercase(),
            1,
        ),
        text.replacen(&"0".repeat(64), &"0".repeat(63), 1),
        text.replacen(&"0".repeat(64), &"A".repeat(64), 1),
        text.replacen(
            "\"leaseTransitions\":2",
            "\"leaseTransitions\":99999999999",
            1,
        ),
    ];
    for input in cases {
        assert!(
            matches!(decode_err(&input), DecodeError::InvalidValue { .. }),
            "{input} gave {:?}",
            decode_document(&input)
        );
    }
}

#[test]
fn malformed_steps_and_effects_are_invalid_values() {
    let mut w = Writer::new();
    w.push(op(1), intent_body(OperationKind::Scale, 3, 4));
    w.push(op(1), issued(op(1), "replicas"));
    let text = w.journal.document().encode();
    for (from, to) in [
        ("\"step\":\"replicas\"", "\"step\":\"scale\""),
        (
            &format!("\"effect\":\"{}/replicas\"", op(1)) as &str,
            "\"effect\":\"replicas\"",
        ),
    ] {
        let e = decode_err(&text.replacen(from, to, 1));
        assert!(matches!(e, DecodeError::InvalidValue { .. }), "{e}");
    }
}

#[test]
fn decode_errors_read_as_sentences() {
    let text = valid_text().replacen(
        "\"pod\":\"beta-2\"",
        "\"pod\":\"beta-2\",\"node\":\"n1\"",
        1,
    );
    assert_eq!(
        decode_err(&text).to_string(),
        "unknown field `node` in entries[0].targets[0]"
    );
}

#[test]
fn an_entry_that_would_not_read_back_is_not_staged() {
    let mut w = Writer::new();
    let mut i = intent(OperationKind::Restart, 3, 3);
    i.token = Some(String::new());
    let entry = w.new_entry(op(1), EntryBody::Intent(i));
    let e = w.journal.stage(entry, Budget::default()).unwrap_err();
    assert!(
        matches!(e, StageError::Unencodable(DecodeError::InvalidValue { .. })),
        "{e}"
    );
}

// ---- chain verification ----

#[test]
fn a_changed_entry_is_reported_at_its_own_seq() {
    let mut w = Writer::new();
    w.scale(op(1), 3, 4);
    let text = w.journal.document().encode();
    let tampered = text.replacen("\"to\":4", "\"to\":5", 1);
    let doc = decode_document(&tampered).unwrap();
    let e = chain::verify(&doc).unwrap_err();
    assert_eq!(e.seq, Some(1));
    assert!(matches!(e.problem, ChainProblem::HashMismatch { .. }));
    assert!(e.to_string().starts_with("entry 1: stored hash"));
    assert!(matches!(
        Journal::load(Some(&tampered), FLEET),
        Err(LoadError::Chain(_))
    ));
}

#[test]
fn a_broken_prev_link_is_reported() {
    let entries = raw_chain(vec![
        (op(1), intent_body(OperationKind::Scale, 3, 4)),
        (op(1), issued(op(1), "replicas")),
    ]);
    let mut other = raw_chain(vec![
        (op(2), intent_body(OperationKind::Scale, 1, 2)),
        (op(2), issued(op(2), "replicas")),
    ]);
    let spliced = vec![entries[0].clone(), other.remove(1)];
    let doc = decode_document(&document_text(FLEET, (0, Hash::ZERO), &spliced)).unwrap();
    let e = chain::verify(&doc).unwrap_err();
    assert_eq!(e.seq, Some(2));
    assert!(matches!(e.problem, ChainProblem::PrevMismatch { .. }));
}

#[test]
fn a_gap_in_seq_is_reported() {
    let entries = raw_chain(vec![
        (op(1), intent_body(OperationKind::Scale, 3, 4)),
        (op(1), issued(op(1), "replicas")),
        (op(1), observed()),
    ]);
    let gapped = vec![entries[0].clone(), entries[2].clone()];
    let doc = decode_document(&document_text(FLEET, (0, Hash::ZERO), &gapped)).unwrap();
    assert_eq!(
        chain::verify(&doc).unwrap_err(),
        ChainError {
            seq: Some(3),
            problem: ChainProblem::SeqGap { expected: 2 }
        }
    );
}

#[test]
fn a_wrong_head_is_reported_in_the_header() {
    let mut w = Writer::new();
    w.scale(op(1), 3, 4);
    let doc = w.journal.document();
    let text = doc.encode().replacen(
        &format!("\"head\":\"{}\"", doc.head()),
        &format!("\"head\":\"{}\"", "1".repeat(64)),
        1,
    );
    let e = chain::verify(&decode_document(&text).unwrap()).unwrap_err();
    assert_eq!(e.seq, None);
    assert!(matches!(e.problem, ChainProblem::HeadHashMismatch { .. }));
    let text = doc
        .encode()
        .replacen("\"seq\":4,\"head\"", "\"seq\":5,\"head\"", 1);
    let e = chain::verify(&decode_document(&text).unwrap()).unwrap_err();
    assert!(matches!(
        e.problem,
        ChainProblem::HeadSeqMismatch {
            header: 5,
            newest: 4
        }
    ));
}

#[test]
fn a_compacted_hash_without_compaction_is_reported() {
    let text = Document::empty(FLEET).encode().replacen(
        &format!("\"compactedHash\":\"{}\"", "0".repeat(64)),
        &format!("\"compactedHash\":\"{}\"", "2".repeat(64)),
        1,
    );
    let e = chain::verify(&decode_document(&text).unwrap()).unwrap_err();
    assert_eq!(e.problem, ChainProblem::CompactedHashWithoutCompaction);
}

#[test]
fn a_document_of_another_fleet_is_refused() {
    let mut w = Writer::new();
    w.scale(op(1), 3, 4);
    let text = w.journal.document().encode();
    assert_eq!(
        Journal::load(Some(&text), "other-fleet").unwrap_err(),
        LoadError::ForeignFleet {
            expected: "other-fleet".into(),
            found: FLEET.into()
        }
    );
}

#[test]
fn a_hash_valid_document_with_an_illegal_transition_is_refused() {
    let entries = raw_chain(vec![
        (op(1), intent_body(OperationKind::Scale, 3, 4)),
        (op(1), issued(op(1), "replicas")),
        (op(1), canceled(CancelReason::RequestChanged)),
    ]);
    let text = document_text(FLEET, (0, Hash::ZERO), &entries);
    match Journal::load(Some(&text), FLEET) {
        Err(LoadError::Transition { seq: 3, error }) => {
            assert!(matches!(error, TransitionError::CancelAfterIssue { .. }))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn no_annotation_is_an_empty_journal() {
    let j = Journal::load(None, FLEET).unwrap();
    assert_eq!(j.document(), &Document::empty(FLEET));
}

#[test]
fn the_fuzzing_seed_documents_are_valid_journals() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/decode_document");
    let mut documents = 0;
    for file in std::fs::read_dir(dir).unwrap() {
        let path = file.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        if path.file_name().unwrap() == "entry.json" {
            decode_entry(&text).unwrap();
            continue;
        }
        let doc = decode_document(&text).unwrap();
        Journal::load(Some(&text), doc.fleet_uid()).unwrap();
        documents += 1;
    }
    assert_eq!(documents, 3);
}

#[test]
fn a_re_asked_proof_records_the_members_new_identity_and_older_issued_entries_keep_their_hashes() {
    let seal_issued = |target: Option<Target>| {
        chain::seal(
            0,
            Hash::ZERO,
            NewEntry {
                at: t(0),
                op: op(1),
                leader: leader(),
                body: EntryBody::Issued(Issued {
                    step: Step::Proof("beta-2".into()),
                    effect: Effect::new(op(1), Step::Proof("beta-2".into())),
                    decided_on_resource_version: None,
                    result_resource_version: None,
                    replayed: false,
                    target,
                }),
            },
        )
    };
    let plain = seal_issued(None);
    assert!(
        !plain.to_json().contains("\"target\""),
        "{}",
        plain.to_json()
    );
    let again = seal_issued(Some(Target {
        pod: "beta-2".into(),
        pod_uid: Some("uid-new".into()),
        pod_ip: Some("127.0.0.9".into()),
        runtime_generation: Some("gen-2".into()),
        ..Target::default()
    }));
    assert!(
        again.to_json().contains(
            "\"target\":{\"pod\":\"beta-2\",\"podIP\":\"127.0.0.9\",\"podUID\":\"uid-new\",\"runtimeGeneration\":\"gen-2\"}"
        ),
        "{}",
        again.to_json()
    );
    assert_ne!(plain.hash(), again.hash());
    let back = decode_entry(again.to_json()).unwrap();
    assert_eq!(back, again);
    assert_eq!(chain::recompute(&back), again.hash());
    // Unknown keys inside the target are refused, as everywhere else.
    let bad = again.to_json().replace("\"podIP\"", "\"podIp\"");
    assert!(decode_entry(&bad).is_err());
}
