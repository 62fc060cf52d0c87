//! The hash chain.
//!
//! Each entry's `hash` is SHA-256 over the canonical JSON of the entry without its `hash` field
//! (keys sorted by UTF-8 bytes, no whitespace, integers in plain decimal, strings escaped only where
//! JSON requires it, timestamps as RFC 3339 UTC with `Z` and only as many fraction digits as
//! needed). `prev` is the hash of the previous entry: all zeros for seq 1, or the document's
//! `compactedHash` for the first entry left after compaction. The document's `head` is the hash of
//! its newest entry.

use sha2::{Digest, Sha256};

use crate::codec::{entry_json, Document};
use crate::model::{Entry, Hash, NewEntry, Seq};

/// Seals a decision onto a chain whose newest entry is `(prev_seq, prev_hash)` (use `(0, ZERO)`
/// for an empty chain): assigns `seq = prev_seq + 1`, `prev` and `hash`.
pub fn seal(prev_seq: Seq, prev_hash: Hash, entry: NewEntry) -> Entry {
    let seq = prev_seq + 1;
    let hash = hash_parts(&entry, seq, &prev_hash);
    Entry::from_parts(
        seq,
        entry.at,
        entry.op,
        entry.leader,
        prev_hash,
        hash,
        entry.body,
    )
}

fn hash_parts(entry: &NewEntry, seq: Seq, prev: &Hash) -> Hash {
    let text = entry_json(
        seq,
        &entry.at,
        &entry.op,
        &entry.leader,
        prev,
        None,
        &entry.body,
    );
    digest(text.as_bytes())
}

/// SHA-256 of bytes.
pub fn digest(bytes: &[u8]) -> Hash {
    Hash(Sha256::digest(bytes).into())
}

/// The hash `entry` should have, recomputed from its fields.
pub fn recompute(entry: &Entry) -> Hash {
    let text = entry_json(
        entry.seq(),
        &entry.at(),
        &entry.op(),
        entry.leader(),
        &entry.prev(),
        None,
        entry.body(),
    );
    digest(text.as_bytes())
}

/// The first thing wrong with a chain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {problem}", match seq { Some(s) => format!("entry {s}"), None => "document header".to_owned() })]
pub struct ChainError {
    /// The first bad entry's seq, or `None` for a problem in the document header.
    pub seq: Option<Seq>,
    /// What is wrong.
    pub problem: ChainProblem,
}

/// What is wrong with an entry or header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainProblem {
    /// The entry's seq does not follow its predecessor's.
    #[error("seq should be {expected} (entries are numbered consecutively)")]
    SeqGap {
        /// The seq the position calls for.
        expected: Seq,
    },
    /// `prev` is not the previous entry's hash (or `compactedHash`, or zeros for seq 1).
    #[error("prev is {found} but the previous hash is {expected}")]
    PrevMismatch {
        /// The previous entry's hash.
        expected: Hash,
        /// The entry's `prev`.
        found: Hash,
    },
    /// `hash` does not match the entry's content.
    #[error(
        "stored hash {stored} does not match the content's hash {computed} (the entry was changed)"
    )]
    HashMismatch {
        /// The entry's `hash`.
        stored: Hash,
        /// Recomputed.
        computed: Hash,
    },
    /// The header's `seq` is not the newest entry's.
    #[error("seq is {header} but the newest entry is {newest}")]
    HeadSeqMismatch {
        /// Header value.
        header: Seq,
        /// Newest entry's seq (or `compactedThrough` when there are no entries).
        newest: Seq,
    },
    /// The header's `head` is not the newest entry's hash.
    #[error("head is {header} but the newest entry's hash is {newest}")]
    HeadHashMismatch {
        /// Header value.
        header: Hash,
        /// Newest entry's hash (or `compactedHash`).
        newest: Hash,
    },
    /// `compactedHash` is set although nothing was compacted.
    #[error("compactedHash must be all zeros while compactedThrough is 0")]
    CompactedHashWithoutCompaction,
    /// A declared hole does not sit between two entries of the document (or holes overlap,
    /// are out of order, or lie outside the window).
    #[error("hole {from}..{through} does not match a gap between the document's entries")]
    StrayHole {
        /// Its first seq.
        from: Seq,
        /// Its last seq.
        through: Seq,
    },
}

/// Verifies a document: every entry's seq, `prev` and `hash`, then `seq` and `head`.
/// Returns the first problem, in seq order.
pub fn verify(doc: &Document) -> Result<(), ChainError> {
    if doc.compacted_through() == 0 && !doc.compacted_hash().is_zero() {
        return Err(ChainError {
            seq: None,
            problem: ChainProblem::CompactedHashWithoutCompaction,
        });
    }
    verify_linked(
        doc.entries(),
        Some((doc.compacted_through(), doc.compacted_hash())),
        doc.holes(),
    )?;
    let (newest_seq, newest_hash) = match doc.entries().last() {
        Some(e) => (e.seq(), e.hash()),
        None => (doc.compacted_through(), doc.compacted_hash()),
    };
    if doc.seq() != newest_seq {
        return Err(ChainError {
            seq: None,
            problem: ChainProblem::HeadSeqMismatch {
                header: doc.seq(),
                newest: newest_seq,
            },
        });
    }
    if doc.head() != newest_hash {
        return Err(ChainError {
            seq: None,
            problem: ChainProblem::HeadHashMismatch {
                header: doc.head(),
                newest: newest_hash,
            },
        });
    }
    Ok(())
}

/// Verifies consecutive entries. `start` is the `(seq, hash)` the first entry must follow; with
/// `None` (a mirror whose oldest entries were dropped by retention) the first entry's seq and
/// `prev` are taken as given and only its hash is checked. Links use the *stored* hashes, so one
/// altered entry is reported once, at its own seq.
pub fn verify_entries(entries: &[Entry], start: Option<(Seq, Hash)>) -> Result<(), ChainError> {
    verify_linked(entries, start, &[])
}

/// [`verify_entries`] across declared `holes` (in seq order): an entry may follow a hole
/// `from..=through` when its seq is `through + 1` and its `prev` is the hole's hash. Every
/// hole must be such a gap.
fn verify_linked(
    entries: &[Entry],
    start: Option<(Seq, Hash)>,
    holes: &[crate::codec::Hole],
) -> Result<(), ChainError> {
    let mut previous = start;
    let mut next_hole = 0;
    for entry in entries {
        if let Some((prev_seq, mut prev_hash)) = previous {
            if let Some(h) = holes.get(next_hole) {
                if h.from == prev_seq + 1 && h.through + 1 == entry.seq() && h.from <= h.through {
                    prev_hash = h.hash;
                    next_hole += 1;
                    previous = Some((h.through, h.hash));
                }
            }
            let prev_seq = previous.map_or(prev_seq, |(s, _)| s);
            if entry.seq() != prev_seq + 1 {
                return Err(ChainError {
                    seq: Some(entry.seq()),
                    problem: ChainProblem::SeqGap {
                        expected: prev_seq + 1,
                    },
                });
            }
            if entry.prev() != prev_hash {
                return Err(ChainError {
                    seq: Some(entry.seq()),
                    problem: ChainProblem::PrevMismatch {
                        expected: prev_hash,
                        found: entry.prev(),
                    },
                });
            }
        } else if entry.seq() == 1 && !entry.prev().is_zero() {
            return Err(ChainError {
                seq: Some(1),
                problem: ChainProblem::PrevMismatch {
                    expected: Hash::ZERO,
                    found: entry.prev(),
                },
            });
        }
        let computed = recompute(entry);
        if computed != entry.hash() {
            return Err(ChainError {
                seq: Some(entry.seq()),
                problem: ChainProblem::HashMismatch {
                    stored: entry.hash(),
                    computed,
                },
            });
        }
        previous = Some((entry.seq(), entry.hash()));
    }
    if let Some(h) = holes.get(next_hole) {
        return Err(ChainError {
            seq: None,
            problem: ChainProblem::StrayHole {
                from: h.from,
                through: h.through,
            },
        });
    }
    Ok(())
}
