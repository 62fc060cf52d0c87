//! Everything the simulator keeps under `CELLD_WATCH`: the disk's identity, an exclusive lock,
//! leader logs (one per session) and the fragments this node follows for other leaders.
//!
//! ```text
//! disk.json                      {node, disk_incarnation, created_ms}
//! lock                           flock held by the one process using this disk
//! log/<session>.log              leader log: JSON lines of Entry, fsynced per append
//! log/<session>.flushed          highest seq uploaded to the store
//! fragments/<session>.log        entries followed for another leader, fsynced per append
//! fragments/<session>.meta.json  {leader, covered_seq, sealed, dropped}
//! ```
//!
//! All calls are blocking file I/O; callers run them through [`blocking`].

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::{now_ms, Entry};

/// Runs blocking disk work without stalling the async workers.
pub fn blocking<R>(f: impl FnOnce() -> R) -> R {
    tokio::task::block_in_place(f)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Writes a small file atomically and durably (tmp, fsync, rename, fsync dir).
pub fn write_durable(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

#[derive(Serialize, Deserialize)]
struct DiskIdentity {
    node: String,
    disk_incarnation: String,
    created_ms: u64,
}

/// Reads or creates `disk.json`; a fresh disk gets a new incarnation.
pub fn identity(root: &Path, node: &str) -> io::Result<(String, bool)> {
    fs::create_dir_all(root)?;
    let path = root.join("disk.json");
    if let Ok(bytes) = fs::read(&path) {
        if let Ok(id) = serde_json::from_slice::<DiskIdentity>(&bytes) {
            return Ok((id.disk_incarnation, false));
        }
    }
    let id = DiskIdentity {
        node: node.to_string(),
        disk_incarnation: uuid::Uuid::new_v4().simple().to_string(),
        created_ms: now_ms(),
    };
    write_durable(&path, &serde_json::to_vec(&id).expect("identity json"))?;
    Ok((id.disk_incarnation, true))
}

/// Takes the disk's exclusive lock; `None` while another live process holds it.
pub fn try_lock(root: &Path) -> io::Result<Option<File>> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(root.join("lock"))?;
    match f.try_lock() {
        Ok(()) => Ok(Some(f)),
        Err(fs::TryLockError::WouldBlock) => Ok(None),
        Err(fs::TryLockError::Error(e)) => Err(e),
    }
}

fn read_entries(path: &Path) -> io::Result<Vec<Entry>> {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for line in BufReader::new(f).lines() {
        let line = line?;
        // A torn last line (crash mid-append) was never acknowledged: skip it.
        if let Ok(e) = serde_json::from_str::<Entry>(&line) {
            out.push(e);
        }
    }
    Ok(out)
}

fn append_lines(file: &mut File, entries: &[Entry]) -> io::Result<()> {
    let mut buf = Vec::new();
    for e in entries {
        serde_json::to_writer(&mut buf, e).expect("entry json");
        buf.push(b'\n');
    }
    file.write_all(&buf)?;
    file.sync_data()
}

/// Sessions with a leader log on this disk.
pub fn local_sessions(root: &Path) -> io::Result<Vec<String>> {
    let dir = root.join("log");
    let mut out = Vec::new();
    match fs::read_dir(&dir) {
        Ok(rd) => {
            for e in rd {
                let name = e?.file_name().to_string_lossy().to_string();
                if let Some(s) = name.strip_suffix(".log") {
                    out.push(s.to_string());
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    out.sort();
    Ok(out)
}

/// The entries of a session's leader log on this disk, if the log exists.
pub fn read_session_log(root: &Path, session: &str) -> io::Result<Option<Vec<Entry>>> {
    let path = root.join("log").join(format!("{session}.log"));
    if !path.exists() {
        return Ok(None);
    }
    read_entries(&path).map(Some)
}

/// Forgets a session's leader log once the store holds all of it.
pub fn remove_session_log(root: &Path, session: &str) -> io::Result<()> {
    if !root.join("log").is_dir() {
        return Ok(());
    }
    for ext in ["log", "flushed"] {
        match fs::remove_file(root.join("log").join(format!("{session}.{ext}"))) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    sync_dir(&root.join("log"))
}

/// The current session's leader log.
pub struct LeaderLog {
    file: File,
    flushed_path: PathBuf,
    entries: Vec<Entry>,
    flushed: u64,
}

impl LeaderLog {
    pub fn create(root: &Path, session: &str) -> io::Result<LeaderLog> {
        let dir = root.join("log");
        fs::create_dir_all(&dir)?;
        let path = dir.join(format!("{session}.log"));
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        sync_dir(&dir)?;
        Ok(LeaderLog {
            file,
            flushed_path: dir.join(format!("{session}.flushed")),
            entries: Vec::new(),
            flushed: 0,
        })
    }

    /// Appends and fsyncs one entry.
    pub fn append(&mut self, cell: &str, epoch: u64, id: &str) -> io::Result<Entry> {
        let entry = Entry {
            seq: self.entries.last().map(|e| e.seq + 1).unwrap_or(1),
            cell: cell.to_string(),
            epoch,
            id: id.to_string(),
        };
        append_lines(&mut self.file, std::slice::from_ref(&entry))?;
        self.entries.push(entry.clone());
        Ok(entry)
    }

    pub fn unflushed(&self) -> Vec<Entry> {
        self.entries
            .iter()
            .filter(|e| e.seq > self.flushed)
            .cloned()
            .collect()
    }

    /// Every entry of the session.
    pub fn all(&self) -> Vec<Entry> {
        self.entries.clone()
    }

    pub fn flushed(&self) -> u64 {
        self.flushed
    }

    pub fn last_seq(&self) -> u64 {
        self.entries.last().map(|e| e.seq).unwrap_or(0)
    }

    pub fn set_flushed(&mut self, seq: u64) -> io::Result<()> {
        if seq > self.flushed {
            write_durable(&self.flushed_path, seq.to_string().as_bytes())?;
            self.flushed = seq;
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct FragmentMeta {
    leader: String,
    covered_seq: u64,
    sealed: bool,
    dropped: bool,
}

struct Fragment {
    meta: FragmentMeta,
    entries: BTreeMap<u64, Entry>,
    file: Option<File>,
}

/// What a follower answers to a fetch.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FragmentAnswer {
    /// The follower ever had a fragment of this session on this disk.
    pub known: bool,
    pub entries: Vec<Entry>,
    pub covered_seq: u64,
    pub sealed: bool,
    pub dropped: bool,
}

/// Why an append was refused.
#[derive(Debug)]
pub enum AppendRefused {
    Sealed,
    Io(io::Error),
}

/// Fragments held for other leaders.
pub struct Fragments {
    dir: PathBuf,
    sessions: HashMap<String, Fragment>,
}

impl Fragments {
    pub fn load(root: &Path) -> io::Result<Fragments> {
        let dir = root.join("fragments");
        fs::create_dir_all(&dir)?;
        let mut sessions = HashMap::new();
        for e in fs::read_dir(&dir)? {
            let name = e?.file_name().to_string_lossy().to_string();
            let Some(session) = name.strip_suffix(".meta.json") else {
                continue;
            };
            let meta: FragmentMeta = match fs::read(dir.join(&name))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
            {
                Some(m) => m,
                None => continue,
            };
            let entries = read_entries(&dir.join(format!("{session}.log")))?
                .into_iter()
                .filter(|e| e.seq > meta.covered_seq)
                .map(|e| (e.seq, e))
                .collect();
            sessions.insert(
                session.to_string(),
                Fragment {
                    meta,
                    entries,
                    file: None,
                },
            );
        }
        Ok(Fragments { dir, sessions })
    }

    fn save_meta(&self, session: &str) -> io::Result<()> {
        let f = &self.sessions[session];
        write_durable(
            &self.dir.join(format!("{session}.meta.json")),
            &serde_json::to_vec(&f.meta).expect("meta json"),
        )
    }

    /// Appends and fsyncs entries of `leader`'s `session`.
    pub fn append(
        &mut self,
        leader: &str,
        session: &str,
        entries: &[Entry],
    ) -> Result<(), AppendRefused> {
        if !self.sessions.contains_key(session) {
            self.sessions.insert(
                session.to_string(),
                Fragment {
                    meta: FragmentMeta {
                        leader: leader.to_string(),
                        ..Default::default()
                    },
                    entries: BTreeMap::new(),
                    file: None,
                },
            );
            self.save_meta(session).map_err(AppendRefused::Io)?;
        }
        let dir = self.dir.clone();
        let frag = self.sessions.get_mut(session).expect("inserted above");
        if frag.meta.sealed || frag.meta.dropped {
            return Err(AppendRefused::Sealed);
        }
        if frag.file.is_none() {
            let path = dir.join(format!("{session}.log"));
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(AppendRefused::Io)?;
            sync_dir(&dir).map_err(AppendRefused::Io)?;
            frag.file = Some(f);
        }
        append_lines(frag.file.as_mut().expect("opened above"), entries)
            .map_err(AppendRefused::Io)?;
        for e in entries {
            frag.entries.insert(e.seq, e.clone());
        }
        Ok(())
    }

    /// Everything held for `session`; with `seal`, later appends are refused (a recovering node
    /// seals before it reads, so a fenced leader cannot add behind its back).
    pub fn fetch(&mut self, session: &str, seal: bool) -> io::Result<FragmentAnswer> {
        let Some(frag) = self.sessions.get_mut(session) else {
            if seal {
                // Remember the seal even without data, so a late append cannot start a fragment.
                self.sessions.insert(
                    session.to_string(),
                    Fragment {
                        meta: FragmentMeta {
                            sealed: true,
                            ..Default::default()
                        },
                        entries: BTreeMap::new(),
                        file: None,
                    },
                );
                self.save_meta(session)?;
            }
            return Ok(FragmentAnswer {
                known: false,
                entries: vec![],
                covered_seq: 0,
                sealed: seal,
                dropped: false,
            });
        };
        let known = !frag.meta.leader.is_empty();
        if seal && !frag.meta.sealed {
            frag.meta.sealed = true;
            self.save_meta(session)?;
        }
        let frag = &self.sessions[session];
        Ok(FragmentAnswer {
            known,
            entries: frag.entries.values().cloned().collect(),
            covered_seq: frag.meta.covered_seq,
            sealed: frag.meta.sealed,
            dropped: frag.meta.dropped,
        })
    }

    /// The leader flushed up to `seq`: those entries no longer need this copy.
    pub fn cover(&mut self, session: &str, seq: u64) -> io::Result<()> {
        let Some(frag) = self.sessions.get_mut(session) else {
            return Ok(());
        };
        if seq <= frag.meta.covered_seq {
            return Ok(());
        }
        frag.meta.covered_seq = seq;
        frag.entries.retain(|s, _| *s > seq);
        self.save_meta(session)
    }

    /// The session is complete in the store: drop the entries, keep a tombstone.
    pub fn drop_session(&mut self, session: &str) -> io::Result<()> {
        let Some(frag) = self.sessions.get_mut(session) else {
            return Ok(());
        };
        frag.meta.dropped = true;
        frag.meta.sealed = true;
        frag.entries.clear();
        frag.file = None;
        match fs::remove_file(self.dir.join(format!("{session}.log"))) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        self.save_meta(session)
    }

    pub fn seal(&mut self, session: &str) -> io::Result<()> {
        self.fetch(session, true).map(|_| ())
    }

    /// Sessions with entries still held (not dropped), with their leader and entries.
    pub fn held(&self) -> Vec<(String, String, Vec<Entry>)> {
        let mut out: Vec<_> = self
            .sessions
            .iter()
            .filter(|(_, f)| !f.meta.dropped && !f.meta.leader.is_empty())
            .map(|(s, f)| {
                (
                    s.clone(),
                    f.meta.leader.clone(),
                    f.entries.values().cloned().collect(),
                )
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Entries held and not yet covered by their leader's flush.
    pub fn entry_count(&self) -> usize {
        self.sessions.values().map(|f| f.entries.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: u64) -> Entry {
        Entry {
            seq,
            cell: "c".into(),
            epoch: 1,
            id: format!("id{seq}"),
        }
    }

    #[test]
    fn fragments_survive_a_reload_and_sealing_refuses_appends() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = Fragments::load(dir.path()).unwrap();
        f.append("a", "a.s1", &[entry(1), entry(2)]).unwrap();
        f.cover("a.s1", 1).unwrap();
        drop(f);
        let mut f = Fragments::load(dir.path()).unwrap();
        let ans = f.fetch("a.s1", true).unwrap();
        assert!(ans.known);
        assert_eq!(ans.entries, vec![entry(2)]);
        assert_eq!(ans.covered_seq, 1);
        assert!(matches!(
            f.append("a", "a.s1", &[entry(3)]),
            Err(AppendRefused::Sealed)
        ));
        // A seal on an unknown session is remembered too.
        assert!(!f.fetch("b.s1", true).unwrap().known);
        assert!(matches!(
            f.append("b", "b.s1", &[entry(1)]),
            Err(AppendRefused::Sealed)
        ));
    }

    #[test]
    fn leader_log_replays_after_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = LeaderLog::create(dir.path(), "n.s1").unwrap();
        log.append("c1", 3, "x").unwrap();
        log.append("c2", 1, "y").unwrap();
        log.set_flushed(1).unwrap();
        assert_eq!(log.unflushed().len(), 1);
        let entries = read_session_log(dir.path(), "n.s1").unwrap().unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(
            local_sessions(dir.path()).unwrap(),
            vec!["n.s1".to_string()]
        );
        remove_session_log(dir.path(), "n.s1").unwrap();
        assert!(read_session_log(dir.path(), "n.s1").unwrap().is_none());
    }

    #[test]
    fn identity_is_stable_until_the_disk_is_wiped() {
        let dir = tempfile::tempdir().unwrap();
        let (a, fresh) = identity(dir.path(), "n").unwrap();
        assert!(fresh);
        let (b, fresh) = identity(dir.path(), "n").unwrap();
        assert!(!fresh);
        assert_eq!(a, b);
        let lock = try_lock(dir.path()).unwrap();
        assert!(lock.is_some());
    }
}
