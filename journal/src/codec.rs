//! The annotation document (`celld.eric.dev/journal`) and the JSON form of entries.
//!
//! ```json
//! {"v":1,"fleetUID":"…","seq":42,"head":"<hex>","compactedThrough":17,"compactedHash":"<hex>","entries":[…]}
//! ```
//!
//! Decoding is strict, because the annotation is writable by anyone who can patch the fleet and a
//! mis-read journal could reissue an effect: input over [`HARD_MAX_BYTES`], invalid JSON, a
//! version other than 1, unknown fields, duplicate keys, missing fields, wrong JSON types, `null`,
//! non-integer or out-of-range numbers and malformed ids, hashes, steps, effects or timestamps are
//! all errors naming the path (e.g. `entries[3].targets[0].podUID`). Optional fields are omitted
//! when absent and, when present, must be non-empty strings, so every value has one spelling.
//!
//! Decoding checks form only; whether the chain links and the hashes match is
//! [`crate::chain::verify`]'s job, and whether the transitions are legal is the fold's.
//!
//! Encoding is compact: the envelope's keys in the order above, each entry in canonical form
//! (keys sorted, no whitespace; see [`crate::chain`]).

use std::collections::HashSet;

use chrono::{DateTime, SecondsFormat, Utc};

use crate::json::{self, Json};
use crate::model::*;

/// The only document format version this crate reads and writes.
pub const FORMAT_VERSION: u64 = 1;

/// Hard maximum size of the annotation value in bytes (128 KiB), whatever the configured budget:
/// the fleet's other annotations must still fit in Kubernetes' 256 KiB total.
pub const HARD_MAX_BYTES: usize = 128 * 1024;

/// Why an annotation (or a stored entry) could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The input is larger than [`HARD_MAX_BYTES`].
    #[error("journal annotation is {len} bytes, over the hard maximum of {max} bytes")]
    Oversize {
        /// Input size.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// Not one well-formed JSON value.
    #[error("journal is not valid JSON: {message}")]
    Syntax {
        /// The parser's message (with line and column).
        message: String,
    },
    /// `v` is not 1.
    #[error(
        "unsupported journal format version {found} (this operator reads version {FORMAT_VERSION})"
    )]
    UnsupportedVersion {
        /// The value found, as JSON text.
        found: String,
    },
    /// A field this format does not have.
    #[error("unknown field `{field}` in {path}")]
    UnknownField {
        /// Where.
        path: String,
        /// The field.
        field: String,
    },
    /// The same key twice in one object.
    #[error("duplicate key `{key}` in {path}")]
    DuplicateKey {
        /// Where.
        path: String,
        /// The key.
        key: String,
    },
    /// A required field is absent.
    #[error("missing field `{field}` in {path}")]
    MissingField {
        /// Where.
        path: String,
        /// The field.
        field: String,
    },
    /// A value of the wrong JSON type.
    #[error("{path}: expected {expected}, found {found}")]
    WrongType {
        /// Where.
        path: String,
        /// What the format wants.
        expected: &'static str,
        /// What the input has.
        found: &'static str,
    },
    /// A value of the right type that is not acceptable (range, form, emptiness).
    #[error("{path}: {problem}")]
    InvalidValue {
        /// Where.
        path: String,
        /// What is wrong.
        problem: String,
    },
}

/// The annotation document: a window of a fleet's chain, possibly compacted at the front.
///
/// Fields are read through accessors; documents are produced by decoding or by
/// [`crate::Journal`] appends, so the header always describes the entries it was built with
/// (a decoded document may still be inconsistent — [`crate::chain::verify`] says where).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    pub(crate) fleet_uid: String,
    pub(crate) seq: Seq,
    pub(crate) head: Hash,
    pub(crate) compacted_through: Seq,
    pub(crate) compacted_hash: Hash,
    pub(crate) holes: Vec<Hole>,
    pub(crate) entries: Vec<Entry>,
}

/// Entries `from..=through` compacted out of the middle of the document (whole finished
/// operations, e.g. cancellations, dropped so they cannot push the history that must stay out
/// of the annotation). `hash` is entry `through`'s hash: the entry after the hole links to
/// it, as the first entry links to `compactedHash`. Encoded as
/// `"holes":[{"from":…,"through":…,"hash":"…"}]`, only when there is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hole {
    /// First dropped seq.
    pub from: Seq,
    /// Last dropped seq.
    pub through: Seq,
    /// Hash of entry `through`.
    pub hash: Hash,
}

impl Document {
    /// The document of a fleet that has no entries yet.
    pub fn empty(fleet_uid: impl Into<String>) -> Document {
        Document {
            fleet_uid: fleet_uid.into(),
            seq: 0,
            head: Hash::ZERO,
            compacted_through: 0,
            compacted_hash: Hash::ZERO,
            holes: Vec::new(),
            entries: Vec::new(),
        }
    }

    /// The fleet's UID (a copied annotation from another fleet is refused on load).
    pub fn fleet_uid(&self) -> &str {
        &self.fleet_uid
    }
    /// Seq of the newest entry (or `compactedThrough` when none is left; 0 when empty).
    pub fn seq(&self) -> Seq {
        self.seq
    }
    /// Hash of the newest entry.
    pub fn head(&self) -> Hash {
        self.head
    }
    /// The last seq dropped by compaction (0 if none).
    pub fn compacted_through(&self) -> Seq {
        self.compacted_through
    }
    /// The hash of entry `compactedThrough` (zeros if none was dropped).
    pub fn compacted_hash(&self) -> Hash {
        self.compacted_hash
    }
    /// The entries, oldest first.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Ranges compacted out of the middle, in seq order.
    pub fn holes(&self) -> &[Hole] {
        &self.holes
    }

    /// The compact JSON text stored in the annotation.
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(self.encoded_len());
        out.push_str(&header(
            &self.fleet_uid,
            self.seq,
            &self.head,
            self.compacted_through,
            &self.compacted_hash,
            &self.holes,
        ));
        for (i, e) in self.entries.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(e.to_json());
        }
        out.push_str("]}");
        out
    }

    /// The length in bytes of [`Document::encode`]'s output, computed without building it.
    pub fn encoded_len(&self) -> usize {
        encoded_len_parts(
            &self.fleet_uid,
            self.seq,
            &self.head,
            self.compacted_through,
            &self.compacted_hash,
            &self.holes,
            self.entries.iter().map(|e| e.to_json().len()),
        )
    }
}

/// The envelope up to and including `"entries":[`.
fn header(fleet_uid: &str, seq: Seq, head: &Hash, ct: Seq, ch: &Hash, holes: &[Hole]) -> String {
    let mut out = String::with_capacity(256);
    out.push_str("{\"v\":1,\"fleetUID\":");
    json::write_string(fleet_uid, &mut out);
    out.push_str(&format!(
        ",\"seq\":{seq},\"head\":\"{head}\",\"compactedThrough\":{ct},\"compactedHash\":\"{ch}\","
    ));
    if !holes.is_empty() {
        out.push_str("\"holes\":[");
        for (i, h) in holes.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&format!(
                "{{\"from\":{},\"through\":{},\"hash\":\"{}\"}}",
                h.from, h.through, h.hash
            ));
        }
        out.push_str("],");
    }
    out.push_str("\"entries\":[");
    out
}

/// Encoded size of a document with this header and these entry sizes.
pub(crate) fn encoded_len_parts(
    fleet_uid: &str,
    seq: Seq,
    head: &Hash,
    ct: Seq,
    ch: &Hash,
    holes: &[Hole],
    entry_lens: impl Iterator<Item = usize>,
) -> usize {
    let mut n: usize = 0;
    let mut total = header(fleet_uid, seq, head, ct, ch, holes).len() + 2;
    for len in entry_lens {
        total += len;
        n += 1;
    }
    total + n.saturating_sub(1)
}

/// Decodes the annotation value. Checks form only (see the module docs).
pub fn decode_document(input: &str) -> Result<Document, DecodeError> {
    if input.len() > HARD_MAX_BYTES {
        return Err(DecodeError::Oversize {
            len: input.len(),
            max: HARD_MAX_BYTES,
        });
    }
    let value = json::parse(input).map_err(|e| DecodeError::Syntax {
        message: e.to_string(),
    })?;
    let mut doc = Fields::new(value, "the document".to_owned())?;
    // The version first: a newer format should say so, not trip over its new fields.
    match doc.take("v") {
        None => return Err(doc.missing("v")),
        Some(Json::Int(1)) => {}
        Some(other) => {
            return Err(DecodeError::UnsupportedVersion {
                found: json::canonical(&other),
            })
        }
    }
    let fleet_uid = doc.req_nonempty_str("fleetUID")?;
    let seq = doc.req_seq("seq", 0)?;
    let head = doc.req_parsed::<Hash>("head")?;
    let compacted_through = doc.req_seq("compactedThrough", 0)?;
    let compacted_hash = doc.req_parsed::<Hash>("compactedHash")?;
    let holes = match doc.take("holes") {
        None => Vec::new(),
        Some(Json::Arr(items)) if !items.is_empty() => items
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                let mut h = Fields::new(v, format!("holes[{i}]"))?;
                let hole = Hole {
                    from: h.req_seq("from", 1)?,
                    through: h.req_seq("through", 1)?,
                    hash: h.req_parsed::<Hash>("hash")?,
                };
                h.finish()?;
                Ok(hole)
            })
            .collect::<Result<Vec<_>, DecodeError>>()?,
        Some(_) => {
            return Err(doc.invalid(
                "holes",
                "must be a non-empty array of {from, through, hash} objects (or absent)",
            ))
        }
    };
    let entries_json = doc.req_array("entries")?;
    doc.finish()?;
    let entries = entries_json
        .into_iter()
        .enumerate()
        .map(|(i, v)| entry_from_json(v, format!("entries[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Document {
        fleet_uid,
        seq,
        head,
        compacted_through,
        compacted_hash,
        holes,
        entries,
    })
}

/// Decodes one entry from its JSON text (the mirror's values, `export` lines).
pub fn decode_entry(input: &str) -> Result<Entry, DecodeError> {
    if input.len() > HARD_MAX_BYTES {
        return Err(DecodeError::Oversize {
            len: input.len(),
            max: HARD_MAX_BYTES,
        });
    }
    let value = json::parse(input).map_err(|e| DecodeError::Syntax {
        message: e.to_string(),
    })?;
    entry_from_json(value, "the entry".to_owned())
}

pub(crate) fn format_time(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// Canonical JSON of an entry; without `hash` when `hash` is `None` (the text that is hashed).
pub(crate) fn entry_json(
    seq: Seq,
    at: &DateTime<Utc>,
    op: &OperationId,
    leader: &Leader,
    prev: &Hash,
    hash: Option<&Hash>,
    body: &EntryBody,
) -> String {
    let mut fields = vec![
        ("seq".to_owned(), Json::Int(seq.into())),
        ("at".to_owned(), Json::Str(format_time(at))),
        ("op".to_owned(), Json::Str(op.to_string())),
        (
            "type".to_owned(),
            Json::Str(body.entry_type().as_str().to_owned()),
        ),
        (
            "leader".to_owned(),
            Json::obj()
                .str("identity", &leader.identity)
                .int("leaseTransitions", leader.lease_transitions)
                .opt_str("lease", leader.lease.as_deref())
                .build(),
        ),
        ("prev".to_owned(), Json::Str(prev.to_hex())),
    ];
    if let Some(h) = hash {
        fields.push(("hash".to_owned(), Json::Str(h.to_hex())));
    }
    if let Json::Obj(payload) = body_json(body) {
        fields.extend(payload);
    }
    json::canonical(&Json::Obj(fields))
}

fn body_json(body: &EntryBody) -> Json {
    let b = Json::obj();
    match body {
        EntryBody::Intent(i) => b
            .str("kind", i.kind.as_str())
            .int("from", i.from)
            .int("to", i.to)
            .opt_str("token", i.token.as_deref())
            .opt_str("image", i.image.as_deref())
            .opt_str("reason", i.reason.as_deref())
            .str("deadline", &format_time(&i.deadline))
            .field(
                "targets",
                Json::Arr(i.targets.iter().map(target_json).collect()),
            )
            .opt_str("workloadUID", i.workload_uid.as_deref())
            .opt_str(
                "predecessorEffect",
                i.predecessor_effect
                    .as_ref()
                    .map(|e| e.to_string())
                    .as_deref(),
            )
            .build(),
        EntryBody::Issued(i) => b
            .str("step", &i.step.to_string())
            .str("effect", &i.effect.to_string())
            .opt_str(
                "decidedOnResourceVersion",
                i.decided_on_resource_version.as_deref(),
            )
            .opt_str(
                "resultResourceVersion",
                i.result_resource_version.as_deref(),
            )
            .bool("replayed", i.replayed)
            .opt_field("target", i.target.as_ref().map(target_json))
            .build(),
        EntryBody::ProofCaptured(p) => b
            .str("member", &p.member)
            .field("proof", proof_json(&p.proof))
            .build(),
        EntryBody::ClaimRetired(c) => b
            .str("claim", &c.claim)
            .str("claimUID", &c.claim_uid)
            .opt_str("claimResourceVersion", c.claim_resource_version.as_deref())
            .build(),
        EntryBody::Observed(o) => b.str("note", &o.note).build(),
        EntryBody::Completed(c) => b.str("outcome", c.outcome.as_str()).build(),
        EntryBody::Canceled(c) => b.str("reason", c.reason.as_str()).build(),
        EntryBody::Blocked(x) => b.str("blocker", &x.blocker).build(),
        EntryBody::Stalled(s) => b.str("deadline", &format_time(&s.deadline)).build(),
        EntryBody::Abandoned(p) | EntryBody::Retried(p) => b
            .str("by", &p.by)
            .opt_str("reason", p.reason.as_deref())
            .build(),
        EntryBody::Recovered(r) => b
            .str("effect", &r.effect.to_string())
            .str("source", &r.source)
            .build(),
    }
}

fn target_json(t: &Target) -> Json {
    Json::obj()
        .str("pod", &t.pod)
        .opt_str("podUID", t.pod_uid.as_deref())
        .opt_str("podIP", t.pod_ip.as_deref())
        .opt_str("runtimeGeneration", t.runtime_generation.as_deref())
        .opt_str("claim", t.claim.as_deref())
        .opt_str("claimUID", t.claim_uid.as_deref())
        .opt_str("claimResourceVersion", t.claim_resource_version.as_deref())
        .build()
}

fn target_from(mut t: Fields) -> Result<Target, DecodeError> {
    let target = Target {
        pod: t.req_nonempty_str("pod")?,
        pod_uid: t.opt_str("podUID")?,
        pod_ip: t.opt_str("podIP")?,
        runtime_generation: t.opt_str("runtimeGeneration")?,
        claim: t.opt_str("claim")?,
        claim_uid: t.opt_str("claimUID")?,
        claim_resource_version: t.opt_str("claimResourceVersion")?,
    };
    t.finish()?;
    Ok(target)
}

fn proof_json(p: &Proof) -> Json {
    Json::obj()
        .str("operationId", &p.operation_id)
        .str("expectedGeneration", &p.expected_generation)
        .str("phase", &p.phase)
        .bool("controlOnly", p.control_only)
        .opt_str("blocker", p.blocker.as_deref())
        .str("observedAt", &format_time(&p.observed_at))
        .build()
}

fn entry_from_json(value: Json, path: String) -> Result<Entry, DecodeError> {
    let mut f = Fields::new(value, path)?;
    let entry_type = f.req_parsed::<EntryType>("type")?;
    f.context = Some(entry_type.as_str());
    let seq = f.req_seq("seq", 1)?;
    let at = f.req_time("at")?;
    let op = f.req_parsed::<OperationId>("op")?;
    let leader = {
        let mut l = f.req_object("leader")?;
        let identity = l.req_nonempty_str("identity")?;
        let lease_transitions = l.req_int("leaseTransitions", 0, u32::MAX.into())? as u32;
        let lease = l.opt_str("lease")?;
        l.finish()?;
        Leader {
            identity,
            lease_transitions,
            lease,
        }
    };
    let prev = f.req_parsed::<Hash>("prev")?;
    let hash = f.req_parsed::<Hash>("hash")?;
    let body = match entry_type {
        EntryType::Intent => {
            let kind = f.req_parsed("kind")?;
            let from = f.req_int("from", 0, i32::MAX.into())? as i32;
            let to = f.req_int("to", 0, i32::MAX.into())? as i32;
            let targets_path = f.field_path("targets");
            let targets = f
                .req_array("targets")?
                .into_iter()
                .enumerate()
                .map(|(i, v)| target_from(Fields::new(v, format!("{targets_path}[{i}]"))?))
                .collect::<Result<Vec<_>, DecodeError>>()?;
            EntryBody::Intent(Intent {
                kind,
                from,
                to,
                token: f.opt_str("token")?,
                image: f.opt_str("image")?,
                reason: f.opt_str("reason")?,
                deadline: f.req_time("deadline")?,
                targets,
                workload_uid: f.opt_str("workloadUID")?,
                predecessor_effect: f.opt_parsed("predecessorEffect")?,
            })
        }
        EntryType::Issued => EntryBody::Issued(Issued {
            step: f.req_parsed("step")?,
            effect: f.req_parsed("effect")?,
            decided_on_resource_version: f.opt_str("decidedOnResourceVersion")?,
            result_resource_version: f.opt_str("resultResourceVersion")?,
            replayed: f.req_bool("replayed")?,
            target: match f.take("target") {
                None => None,
                Some(v) => Some(target_from(Fields::new(v, f.field_path("target"))?)?),
            },
        }),
        EntryType::ProofCaptured => {
            let member = f.req_nonempty_str("member")?;
            let mut p = f.req_object("proof")?;
            let proof = Proof {
                operation_id: p.req_nonempty_str("operationId")?,
                expected_generation: p.req_nonempty_str("expectedGeneration")?,
                phase: p.req_nonempty_str("phase")?,
                control_only: p.req_bool("controlOnly")?,
                blocker: p.opt_str("blocker")?,
                observed_at: p.req_time("observedAt")?,
            };
            p.finish()?;
            EntryBody::ProofCaptured(ProofCaptured { member, proof })
        }
        EntryType::ClaimRetired => EntryBody::ClaimRetired(ClaimRetired {
            claim: f.req_nonempty_str("claim")?,
            claim_uid: f.req_nonempty_str("claimUID")?,
            claim_resource_version: f.opt_str("claimResourceVersion")?,
        }),
        EntryType::Observed => EntryBody::Observed(Observed {
            note: f.req_str("note")?,
        }),
        EntryType::Completed => EntryBody::Completed(Completed {
            outcome: f.req_parsed("outcome")?,
        }),
        EntryType::Canceled => EntryBody::Canceled(Canceled {
            reason: f.req_parsed("reason")?,
        }),
        EntryType::Blocked => EntryBody::Blocked(Blocked {
            blocker: f.req_nonempty_str("blocker")?,
        }),
        EntryType::Stalled => EntryBody::Stalled(Stalled {
            deadline: f.req_time("deadline")?,
        }),
        EntryType::Abandoned | EntryType::Retried => {
            let action = PersonAction {
                by: f.req_nonempty_str("by")?,
                reason: f.opt_str("reason")?,
            };
            if entry_type == EntryType::Abandoned {
                EntryBody::Abandoned(action)
            } else {
                EntryBody::Retried(action)
            }
        }
        EntryType::Recovered => EntryBody::Recovered(Recovered {
            effect: f.req_parsed("effect")?,
            source: f.req_nonempty_str("source")?,
        }),
    };
    f.finish()?;
    Ok(Entry::from_parts(seq, at, op, leader, prev, hash, body))
}

/// The fields of one JSON object being decoded; each is taken at most once, and whatever is
/// left at [`Fields::finish`] is an unknown field.
struct Fields {
    path: String,
    /// The entry type, for messages about entries ("in entries[3] (a Blocked entry)").
    context: Option<&'static str>,
    pairs: Vec<Option<(String, Json)>>,
}

/// Largest integer accepted for sequence numbers: status reports them as int64.
const MAX_SEQ: i128 = i64::MAX as i128;

impl Fields {
    fn new(value: Json, path: String) -> Result<Fields, DecodeError> {
        let pairs = match value {
            Json::Obj(pairs) => pairs,
            other => {
                return Err(DecodeError::WrongType {
                    path,
                    expected: "an object",
                    found: other.type_name(),
                })
            }
        };
        let mut seen = HashSet::with_capacity(pairs.len());
        for (key, _) in &pairs {
            if !seen.insert(key.as_str()) {
                return Err(DecodeError::DuplicateKey {
                    path,
                    key: truncate_for_message(key),
                });
            }
        }
        Ok(Fields {
            path,
            context: None,
            pairs: pairs.into_iter().map(Some).collect(),
        })
    }

    fn where_(&self) -> String {
        match self.context {
            Some(t) => {
                let article = if t.starts_with(['A', 'E', 'I', 'O', 'U']) {
                    "an"
                } else {
                    "a"
                };
                format!("{} ({article} {t} entry)", self.path)
            }
            None => self.path.clone(),
        }
    }

    fn field_path(&self, key: &str) -> String {
        if self.path == "the document" || self.path == "the entry" {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    fn take(&mut self, key: &str) -> Option<Json> {
        let slot = self
            .pairs
            .iter_mut()
            .find(|p| matches!(p, Some((k, _)) if k == key))?;
        slot.take().map(|(_, v)| v)
    }

    fn missing(&self, key: &str) -> DecodeError {
        DecodeError::MissingField {
            path: self.where_(),
            field: key.to_owned(),
        }
    }

    fn req(&mut self, key: &str) -> Result<Json, DecodeError> {
        self.take(key).ok_or_else(|| self.missing(key))
    }

    fn wrong(&self, key: &str, expected: &'static str, found: &Json) -> DecodeError {
        DecodeError::WrongType {
            path: self.field_path(key),
            expected,
            found: found.type_name(),
        }
    }

    fn invalid(&self, key: &str, problem: impl Into<String>) -> DecodeError {
        DecodeError::InvalidValue {
            path: self.field_path(key),
            problem: problem.into(),
        }
    }

    fn req_str(&mut self, key: &str) -> Result<String, DecodeError> {
        match self.req(key)? {
            Json::Str(s) => Ok(s),
            other => Err(self.wrong(key, "a string", &other)),
        }
    }

    fn req_nonempty_str(&mut self, key: &str) -> Result<String, DecodeError> {
        let s = self.req_str(key)?;
        if s.is_empty() {
            return Err(self.invalid(key, "must not be empty"));
        }
        Ok(s)
    }

    fn opt_str(&mut self, key: &str) -> Result<Option<String>, DecodeError> {
        match self.take(key) {
            None => Ok(None),
            Some(Json::Str(s)) if s.is_empty() => Err(self.invalid(
                key,
                "must not be empty (omit the field when there is no value)",
            )),
            Some(Json::Str(s)) => Ok(Some(s)),
            Some(other) => Err(self.wrong(key, "a string", &other)),
        }
    }

    fn req_parsed<T>(&mut self, key: &str) -> Result<T, DecodeError>
    where
        T: std::str::FromStr<Err = ParseError>,
    {
        let s = self.req_str(key)?;
        s.parse().map_err(|e: ParseError| self.invalid(key, e.0))
    }

    fn opt_parsed<T>(&mut self, key: &str) -> Result<Option<T>, DecodeError>
    where
        T: std::str::FromStr<Err = ParseError>,
    {
        match self.opt_str(key)? {
            None => Ok(None),
            Some(s) => s
                .parse()
                .map(Some)
                .map_err(|e: ParseError| self.invalid(key, e.0)),
        }
    }

    fn req_int(&mut self, key: &str, min: i128, max: i128) -> Result<i128, DecodeError> {
        match self.req(key)? {
            Json::Int(n) if n >= min && n <= max => Ok(n),
            Json::Int(n) => Err(self.invalid(key, format!("{n} is outside {min}..={max}"))),
            other => Err(self.wrong(key, "an integer", &other)),
        }
    }

    fn req_seq(&mut self, key: &str, min: i128) -> Result<Seq, DecodeError> {
        Ok(self.req_int(key, min, MAX_SEQ)? as Seq)
    }

    fn req_bool(&mut self, key: &str) -> Result<bool, DecodeError> {
        match self.req(key)? {
            Json::Bool(b) => Ok(b),
            other => Err(self.wrong(key, "a boolean", &other)),
        }
    }

    fn req_time(&mut self, key: &str) -> Result<DateTime<Utc>, DecodeError> {
        let s = self.req_str(key)?;
        DateTime::parse_from_rfc3339(&s)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|e| {
                self.invalid(
                    key,
                    format!(
                        "`{}` is not an RFC 3339 timestamp ({e})",
                        truncate_for_message(&s)
                    ),
                )
            })
    }

    fn req_array(&mut self, key: &str) -> Result<Vec<Json>, DecodeError> {
        match self.req(key)? {
            Json::Arr(items) => Ok(items),
            other => Err(self.wrong(key, "an array", &other)),
        }
    }

    fn req_object(&mut self, key: &str) -> Result<Fields, DecodeError> {
        let value = self.req(key)?;
        Fields::new(value, self.field_path(key))
    }

    fn finish(self) -> Result<(), DecodeError> {
        match self.pairs.iter().flatten().next() {
            None => Ok(()),
            Some((key, _)) => Err(DecodeError::UnknownField {
                path: self.where_(),
                field: truncate_for_message(key),
            }),
        }
    }
}
