//! The local mirror: a sled database at `--journal-dir` holding every entry this replica has
//! seen, including those compacted out of the annotation. A rebuildable cache and an audit
//! archive, never the authority.
//!
//! Layout (format `celld-journal-mirror/v2`; `v1` is the same without `archive/`):
//! - default tree, key `celld-journal-format`: the format marker. A directory without it is not
//!   opened (it is someone else's data, or not a sled database at all). A new mirror says `v1`
//!   and becomes `v2` just before its first archive segment is written, so an operator that
//!   reads only v1 can open it until then;
//! - tree `fleet/<fleet UID>`: each fleet's newest entries
//!   ([`MirrorOptions::live_entries`]): key = seq as 8 big-endian bytes, value = the entry's
//!   canonical JSON exactly as in the annotation (hash included);
//! - `archive/<fleet UID>/<first seq>.jsonl`: older entries, one per line, in segment files
//!   (see the `archive` module: sled's memory grows with the entries it holds, files' does not);
//! - tree `diverged`: key = fleet UID, a zero byte, seq (8 bytes BE), a unique id (8 bytes BE);
//!   value = `{"entry":<entry JSON>,"reason":"Diverged"|"Rollback"|"Reset"}`.
//!
//! Every write ends with a flush: the operator must not issue an effect before the entry that
//! decided it is durable here too. Retention keeps the newest `retention` seqs of each fleet
//! (entries with seq > head − retention; in the archive, whole segments, so up to
//! `live_entries` more).
//!
//! sled keeps the pages it reads and writes in its cache up to `cache_bytes`
//! ([`MirrorOptions::cache_bytes`]); sled's own default, 1 GiB, would let an operator's memory
//! grow with every entry it writes until that size.
//!
//! sled takes an exclusive lock on the directory: while the operator runs, the audit commands
//! cannot open its mirror ([`MirrorError::Locked`]); copy the directory or stop the replica.

mod archive;
pub mod plan;

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::chain;
use crate::codec::{decode_entry, DecodeError, Document};
use crate::model::{Entry, Hash, Seq};
use archive::{Archive, Segment};
use plan::{plan_reconcile, DivergeReason, MirrorAction, ReconcilePlan};

/// Default number of entries kept per fleet.
pub const DEFAULT_RETENTION: u64 = 10_000;

/// Default number of each fleet's newest entries held in sled; older ones are archived.
pub const DEFAULT_LIVE_ENTRIES: u64 = 256;

/// Default bound of sled's page cache, bytes (sled's own default is 1 GiB).
pub const DEFAULT_CACHE_BYTES: u64 = 8 * 1024 * 1024;

const MARKER_KEY: &[u8] = b"celld-journal-format";
/// A mirror without an archive (what operators before the archive wrote, and what a new mirror
/// is until its first segment): still written by this version, so an older operator can open it.
const MARKER_V1: &[u8] = b"celld-journal-mirror/v1";
/// A mirror with an archive: written before its first segment.
const MARKER_V2: &[u8] = b"celld-journal-mirror/v2";
const FLEET_TREE_PREFIX: &str = "fleet/";
const DIVERGED_TREE: &str = "diverged";
const SLED_DEFAULT_TREE: &[u8] = b"__sled__default";
/// Present in a mirror's directory while [`Mirror::open`] creates it (see there).
pub const CREATING: &str = ".celld-mirror-creating";
/// What a freshly formatted ext2/3/4 volume holds at its root.
const LOST_AND_FOUND: &str = "lost+found";

/// Makes the directory's entries (a file created or removed) durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Mirror settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MirrorOptions {
    /// Entries kept per fleet (at least 1).
    pub retention: u64,
    /// Bound of sled's page cache, bytes: the pages of entries recently read or written stay
    /// in memory up to this size (sled's accounting is approximate). What sled keeps besides
    /// (a record per page of every tree) is not bounded by it.
    pub cache_bytes: u64,
    /// Each fleet's newest entries held in sled (at least 4). When a fleet holds more, all but
    /// the newest quarter of them move to one archive segment file, which costs no memory
    /// (sled's memory grows with the number of entries it holds). Mirrors without a directory
    /// ([`Mirror::temporary`]) keep everything in sled.
    pub live_entries: u64,
}

impl Default for MirrorOptions {
    fn default() -> Self {
        MirrorOptions {
            retention: DEFAULT_RETENTION,
            cache_bytes: DEFAULT_CACHE_BYTES,
            live_entries: DEFAULT_LIVE_ENTRIES,
        }
    }
}

/// A mirror failure.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    /// A filesystem error around the directory.
    #[error("journal mirror {path}: {source}")]
    Io {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The path exists and is not a directory.
    #[error("journal mirror {path} is not a directory")]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// The directory holds files that are not a sled database.
    #[error("journal mirror {path} is not empty and is not a journal mirror (found {found}); refusing to write into it")]
    ForeignDirectory {
        /// The directory.
        path: PathBuf,
        /// Some of what is there.
        found: String,
    },
    /// A sled database without this crate's marker.
    #[error("journal mirror {path} is a sled database but not a celld journal mirror (no format marker); refusing to use it")]
    NotAMirror {
        /// The directory.
        path: PathBuf,
    },
    /// A mirror of another format version.
    #[error(
        "journal mirror {path} has format {found:?}, this operator reads celld-journal-mirror/v1 and v2"
    )]
    UnsupportedFormat {
        /// The directory.
        path: PathBuf,
        /// The marker found.
        found: String,
    },
    /// Another process holds the database.
    #[error("journal mirror {path} is in use by another process (sled holds an exclusive lock); stop it or copy the directory")]
    Locked {
        /// The directory.
        path: PathBuf,
    },
    /// The database files are damaged.
    #[error("journal mirror {path} is corrupt: {message}; move it aside and rebuild it from the annotations")]
    Corrupt {
        /// The directory.
        path: PathBuf,
        /// sled's message.
        message: String,
    },
    /// A sled operation failed.
    #[error("journal mirror: {0}")]
    Sled(String),
    /// Reading or writing the mirror's files failed (a full disk, an I/O error). sled accepts
    /// no write after a failed one, even once the disk has room again: every later write and
    /// flush of this `Mirror` fails the same way until the directory is opened again.
    #[error("journal mirror: its disk failed ({0}); no write is accepted until the mirror is opened again")]
    DiskFailed(String),
    /// A stored value is not a valid entry.
    #[error("journal mirror: fleet {fleet} entry at seq {seq} is unreadable: {error}")]
    CorruptEntry {
        /// The fleet.
        fleet: String,
        /// The key's seq.
        seq: Seq,
        /// The decode error.
        error: DecodeError,
    },
    /// An append does not continue the mirror's chain; reconcile with the annotation instead.
    #[error("journal mirror: fleet {fleet} entry {seq} does not continue the mirror (newest is {head_seq}); reconcile the mirror with the annotation")]
    OutOfSync {
        /// The fleet.
        fleet: String,
        /// The entry's seq.
        seq: Seq,
        /// The mirror's newest seq.
        head_seq: Seq,
    },
    /// A fleet UID that cannot name a tree.
    #[error("journal mirror: invalid fleet UID {0:?}")]
    InvalidFleetUid(String),
    /// A document to rebuild from does not verify.
    #[error("journal mirror: the annotation of fleet {fleet} does not verify: {error}")]
    InvalidDocument {
        /// The fleet.
        fleet: String,
        /// The chain error.
        error: chain::ChainError,
    },
}

impl From<sled::Error> for MirrorError {
    fn from(e: sled::Error) -> Self {
        match e {
            sled::Error::Io(_) => MirrorError::DiskFailed(e.to_string()),
            e => MirrorError::Sled(e.to_string()),
        }
    }
}

/// An entry kept aside in the `diverged` tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DivergedEntry {
    /// Why it was moved.
    pub reason: DivergeReason,
    /// The entry.
    pub entry: Entry,
}

/// The result of [`Mirror::rebuild`].
#[derive(Debug)]
pub struct Rebuilt {
    /// The fresh mirror.
    pub mirror: Mirror,
    /// Where the previous directory was moved, if there was one.
    pub set_aside: Option<PathBuf>,
    /// Entries written.
    pub entries: usize,
}

/// The sled mirror.
#[derive(Debug)]
pub struct Mirror {
    db: sled::Db,
    diverged: sled::Tree,
    retention: u64,
    path: Option<PathBuf>,
    /// Open handles of the fleet trees, keyed by fleet UID: every fleet tree the database
    /// holds (read once at open) and every one created since. Exact, because trees are never
    /// dropped and sled's directory lock keeps other processes out. Saves `head` and
    /// `entries_from` a scan of all tree names (O(fleets)) on every reconcile.
    fleet_trees: Mutex<HashMap<String, sled::Tree>>,
    /// Older entries, out of sled (none for a temporary mirror).
    archive: Option<Archive>,
    live_entries: u64,
    /// The marker says v2 (set before the first segment is written).
    archive_format: AtomicBool,
    /// Per fleet, the seq its oldest segment ends before (`None`: no archive), read from the
    /// directory the first time it is needed: retention looks at the files only once that
    /// segment is wholly older than what it keeps. Archiving never moves that end (a new
    /// segment begins where sled began); a trim or a move to `diverged` forgets it.
    archive_trim_at: Mutex<HashMap<String, Option<Seq>>>,
}

fn seq_key(seq: Seq) -> [u8; 8] {
    seq.to_be_bytes()
}

fn key_seq(key: &[u8]) -> Option<Seq> {
    Some(Seq::from_be_bytes(key.try_into().ok()?))
}

fn validate_fleet_uid(fleet: &str) -> Result<(), MirrorError> {
    if fleet.is_empty() || fleet.len() > 253 || fleet.chars().any(|c| c.is_control()) {
        return Err(MirrorError::InvalidFleetUid(fleet.to_owned()));
    }
    Ok(())
}

impl Mirror {
    /// Opens the mirror at `path`, creating it when the directory is absent or empty
    /// (`lost+found`, which a freshly formatted volume holds, does not count).
    ///
    /// A new mirror is created in place, so `path` may be a volume's mount point and its parent
    /// read-only (the chart mounts the volume at `--journal-dir` under a read-only root file
    /// system). The creation is bracketed by a file, [`CREATING`]: written before sled's
    /// files, removed once the format marker is on disk. A creation that was interrupted
    /// leaves it, and the next open completes it (the database holds nothing but what the
    /// creation wrote); a sled database without the marker and without that file is still
    /// never one of ours. Refuses a path that is a
    /// file, a non-empty directory that is not a sled database, a sled database without the
    /// marker, another format version, a database locked by another process, and damaged
    /// files — each with its own [`MirrorError`].
    pub fn open(path: impl AsRef<Path>, options: MirrorOptions) -> Result<Mirror, MirrorError> {
        Self::open_inner(path.as_ref(), options, true)
    }

    /// Opens an existing mirror without creating one (for the audit commands).
    pub fn open_existing(path: impl AsRef<Path>) -> Result<Mirror, MirrorError> {
        Self::open_inner(path.as_ref(), MirrorOptions::default(), false)
    }

    fn open_inner(
        path: &Path,
        options: MirrorOptions,
        create: bool,
    ) -> Result<Mirror, MirrorError> {
        let io = |source| MirrorError::Io {
            path: path.to_owned(),
            source,
        };
        let empty = if path.exists() {
            if !path.is_dir() {
                return Err(MirrorError::NotADirectory {
                    path: path.to_owned(),
                });
            }
            let names = Self::names(path).map_err(io)?;
            if names.iter().any(|n| n == CREATING) {
                if !create {
                    return Err(io(std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "no journal mirror here (its creation was interrupted)",
                    )));
                }
                Self::finish_creation(path, &names)?;
                false
            } else {
                let looks_like_sled = path.join("conf").is_file() && path.join("db").is_file();
                if !names.is_empty() && !looks_like_sled {
                    let mut shown: Vec<String> = names.into_iter().take(5).collect();
                    shown.sort();
                    return Err(MirrorError::ForeignDirectory {
                        path: path.to_owned(),
                        found: shown.join(", "),
                    });
                }
                names.is_empty()
            }
        } else {
            true
        };
        if empty {
            if !create {
                return Err(io(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no journal mirror here",
                )));
            }
            Self::create_in_place(path)?;
        }
        let db = Self::open_sled(path, options.cache_bytes)?;
        if !Self::has_marker(&db, path)? {
            // Mirrors get their marker before their creation file is removed (see
            // `create_in_place`), so an empty database without either was never one of ours —
            // or was damaged so badly that sled recovered it to nothing. Either way it is not
            // silently taken over.
            return Err(MirrorError::Corrupt {
                path: path.to_owned(),
                message: "the database holds nothing, not even the format marker".to_owned(),
            });
        }
        Self::from_db(db, options, Some(path.to_owned()))
    }

    /// Whether `db` carries this format's marker (`true`) or holds nothing at all (`false`,
    /// a database sled has just created). Another format's marker is
    /// [`MirrorError::UnsupportedFormat`]; content without a marker is
    /// [`MirrorError::NotAMirror`].
    fn has_marker(db: &sled::Db, path: &Path) -> Result<bool, MirrorError> {
        match db.get(MARKER_KEY)? {
            Some(v) if v.as_ref() == MARKER_V1 || v.as_ref() == MARKER_V2 => Ok(true),
            Some(v) => Err(MirrorError::UnsupportedFormat {
                path: path.to_owned(),
                found: String::from_utf8_lossy(&v).into_owned(),
            }),
            None if db.is_empty()
                && db
                    .tree_names()
                    .iter()
                    .all(|n| n.as_ref() == SLED_DEFAULT_TREE) =>
            {
                Ok(false)
            }
            None => Err(MirrorError::NotAMirror {
                path: path.to_owned(),
            }),
        }
    }

    /// The names in `path`, `lost+found` left out.
    fn names(path: &Path) -> std::io::Result<Vec<String>> {
        Ok(std::fs::read_dir(path)?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != LOST_AND_FOUND)
            .collect())
    }

    /// Creates a mirror with its marker in `path` (absent or empty), between the creation of
    /// [`CREATING`] and its removal, each made durable with a sync of the directory.
    fn create_in_place(path: &Path) -> Result<(), MirrorError> {
        let io = |source| MirrorError::Io {
            path: path.to_owned(),
            source,
        };
        std::fs::create_dir_all(path).map_err(io)?;
        std::fs::File::create(path.join(CREATING))
            .and_then(|f| f.sync_all())
            .map_err(io)?;
        sync_dir(path).map_err(io)?;
        Self::finish_creation(path, &[CREATING.to_owned()])
    }

    /// Completes a creation begun by [`Self::create_in_place`] (now, or by a process that
    /// stopped before it removed [`CREATING`]): the directory was empty when it began, so it
    /// holds only sled's files (`conf`, `db`, `snap.*`, `blobs`), and the database holds
    /// nothing or the marker. Anything else is someone's, and is refused and left as it is.
    /// sled's lock keeps out a process that is creating it right now
    /// ([`MirrorError::Locked`]).
    fn finish_creation(path: &Path, names: &[String]) -> Result<(), MirrorError> {
        let io = |source| MirrorError::Io {
            path: path.to_owned(),
            source,
        };
        let sleds =
            |n: &str| matches!(n, "conf" | "db" | "blobs" | CREATING) || n.starts_with("snap.");
        let mut foreign: Vec<String> = names.iter().filter(|n| !sleds(n)).cloned().collect();
        if !foreign.is_empty() {
            foreign.sort();
            foreign.truncate(5);
            return Err(MirrorError::ForeignDirectory {
                path: path.to_owned(),
                found: foreign.join(", "),
            });
        }
        {
            let db = Self::open_sled(path, DEFAULT_CACHE_BYTES)?;
            if !Self::has_marker(&db, path)? {
                db.insert(MARKER_KEY, MARKER_V1)?;
            }
            db.flush()?;
        }
        std::fs::remove_file(path.join(CREATING)).map_err(io)?;
        sync_dir(path).map_err(io)
    }

    /// Opens the sled database, waiting up to 2 s for a lock held by a handle that is being
    /// dropped: sled releases its file lock only when its background flusher thread lets go of
    /// the database, which can lag the last `Db` drop (seen as a flaky reopen in tests, and
    /// possible when a replica restarts in place). A lock still held after that is a live
    /// owner and reported as [`MirrorError::Locked`].
    fn open_sled(path: &Path, cache_bytes: u64) -> Result<sled::Db, MirrorError> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            match Self::open_sled_once(path, cache_bytes) {
                Err(MirrorError::Locked { .. }) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                other => return other,
            }
        }
    }

    fn open_sled_once(path: &Path, cache_bytes: u64) -> Result<sled::Db, MirrorError> {
        let config = sled::Config::new().path(path).cache_capacity(cache_bytes);
        // sled 0.34 can panic instead of erroring on some damaged files.
        match catch_unwind(AssertUnwindSafe(|| config.open())) {
            Ok(Ok(db)) => Ok(db),
            Ok(Err(e)) => {
                let message = e.to_string();
                if message.contains("could not acquire lock") {
                    Err(MirrorError::Locked {
                        path: path.to_owned(),
                    })
                } else {
                    Err(MirrorError::Corrupt {
                        path: path.to_owned(),
                        message,
                    })
                }
            }
            Err(panic) => Err(MirrorError::Corrupt {
                path: path.to_owned(),
                message: panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "sled panicked while opening".to_owned()),
            }),
        }
    }

    /// A mirror in a temporary location that disappears when dropped (tests, benchmarks).
    pub fn temporary(options: MirrorOptions) -> Result<Mirror, MirrorError> {
        let db = sled::Config::new()
            .temporary(true)
            .cache_capacity(options.cache_bytes)
            .open()?;
        db.insert(MARKER_KEY, MARKER_V1)?;
        Self::from_db(db, options, None)
    }

    fn from_db(
        db: sled::Db,
        options: MirrorOptions,
        path: Option<PathBuf>,
    ) -> Result<Mirror, MirrorError> {
        let archive = match &path {
            Some(p) => Some(Archive::open(p).map_err(|source| MirrorError::Io {
                path: p.clone(),
                source,
            })?),
            None => None,
        };
        let archive_format = db.get(MARKER_KEY)?.is_some_and(|v| v.as_ref() == MARKER_V2);
        let diverged = db.open_tree(DIVERGED_TREE)?;
        let mut fleet_trees = HashMap::new();
        for name in db.tree_names() {
            let Some(fleet) = std::str::from_utf8(&name)
                .ok()
                .and_then(|n| n.strip_prefix(FLEET_TREE_PREFIX))
            else {
                continue;
            };
            fleet_trees.insert(fleet.to_owned(), db.open_tree(&name)?);
        }
        Ok(Mirror {
            db,
            diverged,
            retention: options.retention.max(1),
            path,
            fleet_trees: Mutex::new(fleet_trees),
            archive,
            live_entries: options.live_entries.max(4),
            archive_format: AtomicBool::new(archive_format),
            archive_trim_at: Mutex::new(HashMap::new()),
        })
    }

    /// The directory, unless temporary.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The handle cache. A panic while it was held (none of the code under the lock panics)
    /// would leave the map itself intact, so poisoning is ignored.
    fn fleet_trees(&self) -> MutexGuard<'_, HashMap<String, sled::Tree>> {
        self.fleet_trees
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `fleet`'s tree, created if absent.
    fn tree(&self, fleet: &str) -> Result<sled::Tree, MirrorError> {
        validate_fleet_uid(fleet)?;
        let mut trees = self.fleet_trees();
        if let Some(tree) = trees.get(fleet) {
            return Ok(tree.clone());
        }
        let tree = self.db.open_tree(format!("{FLEET_TREE_PREFIX}{fleet}"))?;
        trees.insert(fleet.to_owned(), tree.clone());
        Ok(tree)
    }

    /// `fleet`'s tree if it exists (never creates one: reads of an unknown fleet leave no
    /// trace).
    fn existing_tree(&self, fleet: &str) -> Option<sled::Tree> {
        self.fleet_trees().get(fleet).cloned()
    }

    /// Fleet UIDs that have a tree, sorted.
    pub fn fleets(&self) -> Vec<String> {
        let mut out: Vec<String> = self.fleet_trees().keys().cloned().collect();
        out.sort();
        out
    }

    fn decode(fleet: &str, key: &[u8], value: &[u8]) -> Result<Entry, MirrorError> {
        let seq = key_seq(key).unwrap_or(0);
        let text = std::str::from_utf8(value).map_err(|e| MirrorError::CorruptEntry {
            fleet: fleet.to_owned(),
            seq,
            error: DecodeError::Syntax {
                message: e.to_string(),
            },
        })?;
        let entry = decode_entry(text).map_err(|error| MirrorError::CorruptEntry {
            fleet: fleet.to_owned(),
            seq,
            error,
        })?;
        if entry.seq() != seq {
            return Err(MirrorError::CorruptEntry {
                fleet: fleet.to_owned(),
                seq,
                error: DecodeError::InvalidValue {
                    path: "seq".to_owned(),
                    problem: format!("stored under key {seq} but says {}", entry.seq()),
                },
            });
        }
        Ok(entry)
    }

    /// The newest entry's seq and hash.
    pub fn head(&self, fleet: &str) -> Result<Option<(Seq, Hash)>, MirrorError> {
        let Some(tree) = self.existing_tree(fleet) else {
            return Ok(None);
        };
        self.head_of(fleet, &tree)
    }

    /// The newest entry in sled, or — when sled holds none of `fleet`'s (a move to `diverged`
    /// was interrupted) — in its archive.
    fn head_of(&self, fleet: &str, tree: &sled::Tree) -> Result<Option<(Seq, Hash)>, MirrorError> {
        if let Some((k, v)) = tree.last()? {
            let e = Self::decode(fleet, &k, &v)?;
            return Ok(Some((e.seq(), e.hash())));
        }
        let Some((segment, end)) = self.segments_with_ends(fleet, None)?.pop() else {
            return Ok(None);
        };
        Ok(self
            .read_segment(fleet, &segment, 0, end)?
            .last()
            .map(|(e, _)| (e.seq(), e.hash())))
    }

    fn archive_io(&self, source: std::io::Error) -> MirrorError {
        let path = self
            .path
            .clone()
            .unwrap_or_default()
            .join(archive::ARCHIVE_DIR);
        match source.kind() {
            // A full disk or a failed device, as sled's own I/O errors.
            std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
                MirrorError::Io { path, source }
            }
            _ => MirrorError::DiskFailed(format!("{}: {source}", path.display())),
        }
    }

    /// `fleet`'s segments with the seq each ends before: the next one's first seq, or `live`
    /// (sled's oldest) for the newest, so a segment whose entries sled (or a later segment)
    /// also holds after an interrupted move counts only once.
    fn segments_with_ends(
        &self,
        fleet: &str,
        live: Option<Seq>,
    ) -> Result<Vec<(Segment, Seq)>, MirrorError> {
        let Some(archive) = &self.archive else {
            return Ok(Vec::new());
        };
        let segments = archive.segments(fleet).map_err(|e| self.archive_io(e))?;
        let ends: Vec<Seq> = segments
            .iter()
            .skip(1)
            .map(|s| s.first)
            .chain(std::iter::once(live.unwrap_or(Seq::MAX)))
            .collect();
        Ok(segments.into_iter().zip(ends).collect())
    }

    /// Decodes a segment's lines, checking that seqs increase; keeps those in `from..end`.
    fn read_segment(
        &self,
        fleet: &str,
        segment: &Segment,
        from: Seq,
        end: Seq,
    ) -> Result<Vec<(Entry, Vec<u8>)>, MirrorError> {
        let lines = Archive::read(segment).map_err(|e| self.archive_io(e))?;
        let mut out = Vec::with_capacity(lines.len());
        let mut expected = segment.first;
        for line in lines {
            let entry = Self::decode(fleet, &seq_key(expected), &line).or_else(|_| {
                // Not the seq it should hold (a gap the mirror was backfilled across): still
                // an entry, as long as seqs increase.
                let text = std::str::from_utf8(&line).unwrap_or("");
                match decode_entry(text) {
                    Ok(e) if e.seq() >= expected => Ok(e),
                    Ok(e) => Err(MirrorError::CorruptEntry {
                        fleet: fleet.to_owned(),
                        seq: expected,
                        error: DecodeError::InvalidValue {
                            path: "seq".to_owned(),
                            problem: format!(
                                "archive segment {} holds seq {} after seq {}",
                                segment.path.display(),
                                e.seq(),
                                expected.saturating_sub(1)
                            ),
                        },
                    }),
                    Err(error) => Err(MirrorError::CorruptEntry {
                        fleet: fleet.to_owned(),
                        seq: expected,
                        error,
                    }),
                }
            })?;
            expected = entry.seq() + 1;
            if entry.seq() >= end {
                break;
            }
            if entry.seq() >= from {
                out.push((entry, line));
            }
        }
        Ok(out)
    }

    /// Archived entries of `fleet` with `from` ≤ seq < `below` (sled's oldest; `None`: no
    /// bound), oldest first.
    fn archived(
        &self,
        fleet: &str,
        from: Seq,
        below: Option<Seq>,
    ) -> Result<Vec<Entry>, MirrorError> {
        let mut out = Vec::new();
        for (segment, end) in self.segments_with_ends(fleet, below)? {
            if end <= from {
                continue;
            }
            out.extend(
                self.read_segment(fleet, &segment, from, end)?
                    .into_iter()
                    .map(|(e, _)| e),
            );
        }
        Ok(out)
    }

    /// Every entry of `fleet`, oldest first.
    pub fn entries(&self, fleet: &str) -> Result<Vec<Entry>, MirrorError> {
        self.entries_from(fleet, 0)
    }

    /// Entries of `fleet` with seq ≥ `from`, oldest first.
    pub fn entries_from(&self, fleet: &str, from: Seq) -> Result<Vec<Entry>, MirrorError> {
        let Some(tree) = self.existing_tree(fleet) else {
            return Ok(Vec::new());
        };
        let live = tree.first()?.and_then(|(k, _)| key_seq(&k));
        let mut out = if live.is_none_or(|l| from < l) {
            self.archived(fleet, from, live)?
        } else {
            Vec::new()
        };
        for kv in tree.range(seq_key(from)..) {
            let (k, v) = kv?;
            out.push(Self::decode(fleet, &k, &v)?);
        }
        Ok(out)
    }

    /// Appends sealed entries of `fleet` (each must continue the mirror's newest entry; an entry
    /// already held with the same hash is skipped, so repeating an append is harmless), applies
    /// retention, and flushes.
    pub fn append(&self, fleet: &str, entries: &[Entry]) -> Result<(), MirrorError> {
        let tree = self.tree(fleet)?;
        let mut head = self.head_of(fleet, &tree)?;
        for e in entries {
            match head {
                Some((hs, hh)) if e.seq() == hs + 1 && e.prev() == hh => {}
                Some((hs, _)) if e.seq() <= hs => {
                    let same = match tree.get(seq_key(e.seq()))? {
                        Some(v) => v.as_ref() == e.to_json().as_bytes(),
                        None => self
                            .archived(fleet, e.seq(), Some(e.seq() + 1))?
                            .first()
                            .is_some_and(|a| a.to_json() == e.to_json()),
                    };
                    if same {
                        continue;
                    }
                    return Err(MirrorError::OutOfSync {
                        fleet: fleet.to_owned(),
                        seq: e.seq(),
                        head_seq: hs,
                    });
                }
                Some((hs, _)) => {
                    return Err(MirrorError::OutOfSync {
                        fleet: fleet.to_owned(),
                        seq: e.seq(),
                        head_seq: hs,
                    })
                }
                None => {}
            }
            tree.insert(seq_key(e.seq()), e.to_json().as_bytes())?;
            head = Some((e.seq(), e.hash()));
        }
        if let Some((hs, _)) = head {
            self.settle(fleet, &tree, hs)?;
        }
        self.db.flush()?;
        Ok(())
    }

    /// Mirrors a committed append of `entries` (one or more, in seq order, written by one
    /// compare-and-swap): appends them, or — when the mirror does not continue to them (an
    /// earlier append's response was lost, or the process stopped before mirroring) —
    /// reconciles with `document`, the annotation just written, which backfills. Returns the
    /// plan when a reconcile was needed (publish its signals).
    pub fn record(
        &self,
        document: &Document,
        entries: &[Entry],
    ) -> Result<Option<ReconcilePlan>, MirrorError> {
        match self.append(document.fleet_uid(), entries) {
            Ok(()) => Ok(None),
            Err(MirrorError::OutOfSync { .. }) => self.reconcile(document).map(Some),
            Err(e) => Err(e),
        }
    }

    /// Retention and archiving once `fleet`'s newest entry is `head_seq` (the caller flushes).
    /// Retention keeps the entries with seq > head − retention: in sled one by one, in the
    /// archive whole segments (a segment goes once all its entries are older). Then, when sled
    /// holds more than `live_entries` of the fleet's entries, all but the newest quarter move
    /// to one segment, written and synced before they leave sled.
    fn settle(&self, fleet: &str, tree: &sled::Tree, head_seq: Seq) -> Result<(), MirrorError> {
        let floor = (head_seq + 1).saturating_sub(self.retention).max(1);
        if floor > 1 {
            let old: Vec<sled::IVec> = tree
                .range(..seq_key(floor))
                .keys()
                .collect::<Result<_, _>>()?;
            if !old.is_empty() {
                let mut batch = sled::Batch::default();
                for k in old {
                    batch.remove(k);
                }
                tree.apply_batch(batch)?;
            }
        }
        let Some(archive) = &self.archive else {
            return Ok(());
        };
        let live = tree.first()?.and_then(|(k, _)| key_seq(&k));
        if self.trim_at(fleet, live)?.is_some_and(|end| end <= floor) {
            let mut next = None;
            for (segment, end) in self.segments_with_ends(fleet, live)? {
                if end <= floor {
                    archive.remove(&segment).map_err(|e| self.archive_io(e))?;
                } else {
                    next.get_or_insert(end);
                }
            }
            self.archive_trim_at().insert(fleet.to_owned(), next);
        }
        let (Some(first), Some(last)) = (live, tree.last()?.and_then(|(k, _)| key_seq(&k))) else {
            return Ok(());
        };
        if last - first < self.live_entries {
            return Ok(());
        }
        let held: Vec<(sled::IVec, sled::IVec)> = tree.iter().collect::<Result<_, _>>()?;
        if held.len() as u64 <= self.live_entries {
            return Ok(());
        }
        let keep = (self.live_entries / 4).max(1) as usize;
        let moving = &held[..held.len() - keep];
        let Some(first_moved) = moving.first().and_then(|(k, _)| key_seq(k)) else {
            return Ok(());
        };
        self.mark_archive_format()?;
        let values: Vec<&[u8]> = moving.iter().map(|(_, v)| v.as_ref()).collect();
        archive
            .write(fleet, first_moved, &values)
            .map_err(|e| self.archive_io(e))?;
        if let (Some(known), Some((k, _))) = (
            self.archive_trim_at().get_mut(fleet),
            held.get(held.len() - keep),
        ) {
            // The first segment: it ends where sled now begins.
            known.get_or_insert(key_seq(k).unwrap_or(Seq::MAX));
        }
        let mut batch = sled::Batch::default();
        for (k, _) in moving {
            batch.remove(k.clone());
        }
        tree.apply_batch(batch)?;
        Ok(())
    }

    fn archive_trim_at(&self) -> MutexGuard<'_, HashMap<String, Option<Seq>>> {
        self.archive_trim_at
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The seq `fleet`'s oldest segment ends before, `live` being sled's oldest (the
    /// directory is read once per fleet, see `archive_trim_at`).
    fn trim_at(&self, fleet: &str, live: Option<Seq>) -> Result<Option<Seq>, MirrorError> {
        if let Some(known) = self.archive_trim_at().get(fleet) {
            return Ok(*known);
        }
        let end = self
            .segments_with_ends(fleet, live)?
            .first()
            .map(|(_, end)| *end);
        self.archive_trim_at().insert(fleet.to_owned(), end);
        Ok(end)
    }

    /// Makes the marker say v2 (durably) before the first segment is written: an operator that
    /// reads v1 only must not open a mirror whose older entries it would not see.
    fn mark_archive_format(&self) -> Result<(), MirrorError> {
        if !self.archive_format.load(Ordering::Acquire) {
            self.db.insert(MARKER_KEY, MARKER_V2)?;
            self.db.flush()?;
            self.archive_format.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Keeps `bytes` (an entry's stored JSON) aside in the `diverged` tree.
    fn keep_aside(
        &self,
        fleet: &str,
        seq: Seq,
        bytes: &[u8],
        reason: DivergeReason,
    ) -> Result<(), MirrorError> {
        let mut key = Vec::with_capacity(fleet.len() + 17);
        key.extend_from_slice(fleet.as_bytes());
        key.push(0);
        key.extend_from_slice(&seq.to_be_bytes());
        key.extend_from_slice(&self.db.generate_id()?.to_be_bytes());
        let mut value = Vec::with_capacity(bytes.len() + 32);
        value.extend_from_slice(b"{\"entry\":");
        value.extend_from_slice(bytes);
        value.extend_from_slice(format!(",\"reason\":\"{}\"}}", reason.as_str()).as_bytes());
        self.diverged.insert(key, value)?;
        Ok(())
    }

    /// Moves `fleet`'s entries with seq in `from..=through` to `diverged`, from sled and from
    /// the archive. Everything moved is kept aside and flushed first, then the segments are cut
    /// (a kept part is written before the old file goes), then sled's entries removed: a crash
    /// in between duplicates, never loses.
    fn move_to_diverged(
        &self,
        fleet: &str,
        tree: &sled::Tree,
        from: Seq,
        through: Seq,
        reason: DivergeReason,
    ) -> Result<(), MirrorError> {
        type Cut = (Segment, Vec<Vec<u8>>, Option<(Seq, Vec<Vec<u8>>)>);
        let live = tree.first()?.and_then(|(k, _)| key_seq(&k));
        let mut cuts: Vec<Cut> = Vec::new();
        let mut moved: Vec<(Seq, Vec<u8>)> = Vec::new();
        if self.archive.is_some() && live.is_none_or(|l| from < l) {
            for (segment, end) in self.segments_with_ends(fleet, live)? {
                if end <= from || segment.first > through {
                    continue;
                }
                let mut before = Vec::new();
                let mut after: Option<(Seq, Vec<Vec<u8>>)> = None;
                for (entry, line) in self.read_segment(fleet, &segment, 0, end)? {
                    let seq = entry.seq();
                    if seq < from {
                        before.push(line);
                    } else if seq <= through {
                        moved.push((seq, line));
                    } else {
                        after.get_or_insert_with(|| (seq, Vec::new())).1.push(line);
                    }
                }
                cuts.push((segment, before, after));
            }
        }
        let live_moved: Vec<(sled::IVec, sled::IVec)> = tree
            .range(seq_key(from)..=seq_key(through))
            .collect::<Result<_, _>>()?;
        if moved.is_empty() && live_moved.is_empty() {
            return Ok(());
        }
        for (seq, bytes) in &moved {
            self.keep_aside(fleet, *seq, bytes, reason)?;
        }
        for (k, v) in &live_moved {
            self.keep_aside(fleet, key_seq(k).unwrap_or(0), v, reason)?;
        }
        self.db.flush()?;
        if let Some(archive) = &self.archive {
            for (segment, before, after) in cuts {
                if let Some((first, lines)) = after {
                    let lines: Vec<&[u8]> = lines.iter().map(Vec::as_slice).collect();
                    archive
                        .write(fleet, first, &lines)
                        .map_err(|e| self.archive_io(e))?;
                }
                if before.is_empty() {
                    archive.remove(&segment).map_err(|e| self.archive_io(e))?;
                } else {
                    let lines: Vec<&[u8]> = before.iter().map(Vec::as_slice).collect();
                    archive
                        .write(fleet, segment.first, &lines)
                        .map_err(|e| self.archive_io(e))?;
                }
            }
            self.archive_trim_at().remove(fleet);
        }
        let mut batch = sled::Batch::default();
        for (k, _) in live_moved {
            batch.remove(k);
        }
        tree.apply_batch(batch)?;
        Ok(())
    }

    /// Plans ([`plan_reconcile`]) and applies the reconcile of `fleet`'s mirror with its
    /// annotation; returns the plan (its `signals` are the Events to publish). Call on start and
    /// on gaining the lease, before driving any operation.
    pub fn reconcile(&self, annotation: &Document) -> Result<ReconcilePlan, MirrorError> {
        let fleet = annotation.fleet_uid();
        // Same newest entry: the hash chain makes every earlier one the same too (the mirror
        // only takes entries that continue its chain, or the annotation's own), so nothing is
        // read further back — in particular not the archive.
        if annotation.seq() > 0 && self.head(fleet)? == Some((annotation.seq(), annotation.head()))
        {
            return Ok(ReconcilePlan::default());
        }
        let from = annotation.compacted_through();
        let held: Vec<(Seq, Hash)> = self
            .entries_from(fleet, from)?
            .iter()
            .map(|e| (e.seq(), e.hash()))
            .collect();
        let plan = plan_reconcile(&held, annotation);
        self.apply(fleet, &plan)?;
        Ok(plan)
    }

    /// Applies a plan to `fleet`'s tree and flushes.
    pub fn apply(&self, fleet: &str, plan: &ReconcilePlan) -> Result<(), MirrorError> {
        if plan.actions.is_empty() {
            return Ok(());
        }
        let tree = self.tree(fleet)?;
        for action in &plan.actions {
            match action {
                MirrorAction::MoveToDiverged {
                    from,
                    through,
                    reason,
                } => self.move_to_diverged(fleet, &tree, *from, *through, *reason)?,
                MirrorAction::Write(e) => {
                    tree.insert(seq_key(e.seq()), e.to_json().as_bytes())?;
                }
            }
        }
        if let Some((hs, _)) = self.head_of(fleet, &tree)? {
            self.settle(fleet, &tree, hs)?;
        }
        self.db.flush()?;
        Ok(())
    }

    /// `journal reset`: moves every entry `fleet` holds to the `diverged` tree (reason
    /// `Reset`; kept, never deleted), so a new journal starting again at seq 1 is not taken
    /// for a rollback. Returns how many entries were set aside.
    pub fn set_aside(&self, fleet: &str) -> Result<usize, MirrorError> {
        let held = self.entries(fleet)?;
        let (Some(first), Some(last)) = (held.first(), held.last()) else {
            return Ok(0);
        };
        let plan = ReconcilePlan {
            actions: vec![MirrorAction::MoveToDiverged {
                from: first.seq(),
                through: last.seq(),
                reason: DivergeReason::Reset,
            }],
            signals: Vec::new(),
        };
        self.apply(fleet, &plan)?;
        Ok(held.len())
    }

    /// Entries of `fleet` kept aside in the `diverged` tree, by seq.
    pub fn diverged(&self, fleet: &str) -> Result<Vec<DivergedEntry>, MirrorError> {
        validate_fleet_uid(fleet)?;
        let mut prefix = fleet.as_bytes().to_vec();
        prefix.push(0);
        let mut out = Vec::new();
        for kv in self.diverged.scan_prefix(&prefix) {
            let (k, v) = kv?;
            let seq = key_seq(&k[prefix.len()..prefix.len() + 8]).unwrap_or(0);
            let corrupt = |problem: &str| MirrorError::CorruptEntry {
                fleet: fleet.to_owned(),
                seq,
                error: DecodeError::InvalidValue {
                    path: "diverged".to_owned(),
                    problem: problem.to_owned(),
                },
            };
            let text = std::str::from_utf8(&v).map_err(|_| corrupt("not UTF-8"))?;
            let Some((entry_text, reason)) = [
                DivergeReason::Diverged,
                DivergeReason::Rollback,
                DivergeReason::Reset,
            ]
            .into_iter()
            .find_map(|r| {
                text.strip_suffix(&format!(",\"reason\":\"{}\"}}", r.as_str()))
                    .map(|t| (t, r))
            }) else {
                return Err(corrupt("no reason"));
            };
            let entry_text = entry_text
                .strip_prefix("{\"entry\":")
                .ok_or_else(|| corrupt("no entry"))?;
            let entry = Self::decode(fleet, &seq.to_be_bytes(), entry_text.as_bytes())?;
            out.push(DivergedEntry { reason, entry });
        }
        Ok(out)
    }

    /// Flushes to disk.
    pub fn flush(&self) -> Result<(), MirrorError> {
        self.db.flush()?;
        Ok(())
    }

    /// The mirror's size on disk in bytes (sled's log and snapshot files): it grows with the
    /// history held, about 0.8 KB per entry (docs/operations.md "Sizing the journal mirror").
    pub fn size_on_disk(&self) -> Result<u64, MirrorError> {
        Ok(self.db.size_on_disk()? + self.archive.as_ref().map_or(0, Archive::bytes))
    }

    /// Rebuilds a mirror at `path` from annotation documents (each must verify). An existing
    /// non-empty directory (e.g. a corrupt mirror) is first renamed to
    /// `<path>.set-aside-<unix seconds>` and kept.
    pub fn rebuild(
        path: impl AsRef<Path>,
        documents: &[Document],
        options: MirrorOptions,
    ) -> Result<Rebuilt, MirrorError> {
        let path = path.as_ref();
        for doc in documents {
            chain::verify(doc).map_err(|error| MirrorError::InvalidDocument {
                fleet: doc.fleet_uid().to_owned(),
                error,
            })?;
            validate_fleet_uid(doc.fleet_uid())?;
        }
        let mut set_aside = None;
        let non_empty = path.is_dir()
            && std::fs::read_dir(path)
                .map_err(|source| MirrorError::Io {
                    path: path.to_owned(),
                    source,
                })?
                .next()
                .is_some();
        if non_empty || (path.exists() && !path.is_dir()) {
            let stamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let mut aside = path.as_os_str().to_owned();
            aside.push(format!(".set-aside-{stamp}"));
            let aside = PathBuf::from(aside);
            std::fs::rename(path, &aside).map_err(|source| MirrorError::Io {
                path: path.to_owned(),
                source,
            })?;
            set_aside = Some(aside);
        }
        let mirror = Mirror::open(path, options)?;
        let mut entries = 0;
        for doc in documents {
            let tree = mirror.tree(doc.fleet_uid())?;
            for e in doc.entries() {
                tree.insert(seq_key(e.seq()), e.to_json().as_bytes())?;
                entries += 1;
            }
            if let Some(last) = doc.entries().last() {
                mirror.settle(doc.fleet_uid(), &tree, last.seq())?;
            }
        }
        mirror.flush()?;
        Ok(Rebuilt {
            mirror,
            set_aside,
            entries,
        })
    }
}
