//! The mirror's archive: a fleet's older entries, moved out of sled in whole segments.
//!
//! sled's memory grows with the number of entries it holds, whatever their size (about 23 bytes
//! each: a record per page, and a leaf page holds 8 to 16 entries), so a mirror holding the
//! default retention of 10,000 entries for 1,000 fleets would hold about 240 MiB. sled therefore
//! keeps only each fleet's newest entries ([`super::MirrorOptions::live_entries`]); older ones
//! live in plain files that are opened only to write a segment, to audit, or to reconcile with
//! an annotation older than what sled holds. They cost no memory.
//!
//! Layout: `<mirror>/archive/<fleet dir>/<first seq, 20 digits>.jsonl`. A segment holds
//! consecutive entries, one canonical JSON entry per line (exactly the bytes the annotation and
//! sled hold, so the hash chain verifies across it). It is written to `<name>.tmp`, synced, and
//! renamed over its final name, then the directory is synced: a segment is whole or absent,
//! and rewriting one (cutting it at a rollback) replaces it in one step. The next segment's
//! first seq (or sled's oldest entry) ends it.
//!
//! A crash between writing a segment and removing its entries from sled leaves both holding
//! them (the same bytes): reads take the archive's entries below sled's oldest only, and the
//! next archiving rewrites the same segment and removes them.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::model::Seq;

/// The directory under the mirror's.
pub(crate) const ARCHIVE_DIR: &str = "archive";
const SEGMENT_SUFFIX: &str = ".jsonl";
const TMP_SUFFIX: &str = ".tmp";

/// One segment file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Segment {
    /// Its first entry's seq (from its name).
    pub first: Seq,
    /// The file.
    pub path: PathBuf,
}

/// The archive of a mirror at a path.
#[derive(Debug)]
pub(crate) struct Archive {
    dir: PathBuf,
    /// Bytes of every segment file (kept up to date by this process; summed at open).
    bytes: AtomicU64,
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// The directory name of a fleet: its UID when that is made of ASCII letters, digits and `-`
/// (every Kubernetes UID), otherwise `~` and the UID's bytes in hex (never a path separator,
/// `.` or `..`).
fn fleet_dir_name(fleet: &str) -> String {
    if !fleet.is_empty()
        && fleet
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        fleet.to_owned()
    } else {
        let mut out = String::with_capacity(1 + 2 * fleet.len());
        out.push('~');
        for b in fleet.bytes() {
            out.push_str(&format!("{b:02x}"));
        }
        out
    }
}

impl Archive {
    /// The archive of the mirror at `mirror_dir` (nothing is created until a segment is
    /// written); sums the size of what it holds.
    pub fn open(mirror_dir: &Path) -> std::io::Result<Archive> {
        let dir = mirror_dir.join(ARCHIVE_DIR);
        let mut bytes = 0;
        match std::fs::read_dir(&dir) {
            Ok(fleets) => {
                for fleet in fleets {
                    let fleet = fleet?;
                    if !fleet.file_type()?.is_dir() {
                        continue;
                    }
                    for file in std::fs::read_dir(fleet.path())? {
                        bytes += file?.metadata()?.len();
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(Archive {
            dir,
            bytes: AtomicU64::new(bytes),
        })
    }

    /// Bytes of the segment files.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    fn fleet_dir(&self, fleet: &str) -> PathBuf {
        self.dir.join(fleet_dir_name(fleet))
    }

    /// `fleet`'s segments, oldest first (none when it has no archive). Leftover `.tmp` files
    /// of an interrupted write are not segments.
    pub fn segments(&self, fleet: &str) -> std::io::Result<Vec<Segment>> {
        let dir = self.fleet_dir(fleet);
        let listing = match std::fs::read_dir(&dir) {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for file in listing {
            let file = file?;
            let name = file.file_name();
            let Some(first) = name
                .to_str()
                .and_then(|n| n.strip_suffix(SEGMENT_SUFFIX))
                .and_then(|n| n.parse::<Seq>().ok())
            else {
                continue;
            };
            out.push(Segment {
                first,
                path: file.path(),
            });
        }
        out.sort_by_key(|s| s.first);
        Ok(out)
    }

    /// Every line of a segment (the caller decodes and checks each entry).
    pub fn read(segment: &Segment) -> std::io::Result<Vec<Vec<u8>>> {
        BufReader::new(std::fs::File::open(&segment.path)?)
            .split(b'\n')
            .collect()
    }

    /// Writes `entries` (consecutive, `first` the seq of the first) as the segment named by
    /// `first`, replacing one of that name whole: temporary file, sync, rename, sync of the
    /// directory.
    pub fn write(&self, fleet: &str, first: Seq, entries: &[&[u8]]) -> std::io::Result<()> {
        let dir = self.fleet_dir(fleet);
        if !dir.is_dir() {
            let new_archive = !self.dir.is_dir();
            std::fs::create_dir_all(&dir)?;
            if new_archive {
                sync_dir(self.dir.parent().unwrap_or(&self.dir))?;
            }
            sync_dir(&self.dir)?;
        }
        let name = format!("{first:020}{SEGMENT_SUFFIX}");
        let path = dir.join(&name);
        let tmp = dir.join(format!("{name}{TMP_SUFFIX}"));
        let mut len = 0u64;
        {
            let mut file = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
            for (i, e) in entries.iter().enumerate() {
                if i > 0 {
                    file.write_all(b"\n")?;
                    len += 1;
                }
                file.write_all(e)?;
                len += e.len() as u64;
            }
            file.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        }
        let replaced = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        std::fs::rename(&tmp, &path)?;
        sync_dir(&dir)?;
        self.bytes.fetch_add(len, Ordering::Relaxed);
        self.bytes
            .fetch_sub(replaced.min(self.bytes()), Ordering::Relaxed);
        Ok(())
    }

    /// Removes a segment (the directory synced after).
    pub fn remove(&self, segment: &Segment) -> std::io::Result<()> {
        let len = std::fs::metadata(&segment.path)
            .map(|m| m.len())
            .unwrap_or(0);
        std::fs::remove_file(&segment.path)?;
        if let Some(dir) = segment.path.parent() {
            sync_dir(dir)?;
        }
        self.bytes
            .fetch_sub(len.min(self.bytes()), Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fleet_uid_names_its_directory_and_nothing_else_escapes() {
        assert_eq!(
            fleet_dir_name("0b6c5e3a-1f2d-4c1b-9a55-7e3f9d2c1a00"),
            "0b6c5e3a-1f2d-4c1b-9a55-7e3f9d2c1a00"
        );
        assert_eq!(fleet_dir_name(".."), "~2e2e");
        assert_eq!(fleet_dir_name("a/b"), "~612f62");
        assert_eq!(fleet_dir_name(""), "~");
    }

    #[test]
    fn a_segment_reads_back_with_its_seqs_and_replaces_whole() {
        let dir = tempfile::tempdir().unwrap();
        let a = Archive::open(dir.path()).unwrap();
        assert_eq!(a.segments("f").unwrap(), Vec::new());
        a.write("f", 7, &[b"one", b"two", b"three"]).unwrap();
        a.write("f", 10, &[b"four"]).unwrap();
        let segs = a.segments("f").unwrap();
        assert_eq!(
            segs.iter().map(|s| s.first).collect::<Vec<_>>(),
            vec![7, 10]
        );
        assert_eq!(
            Archive::read(&segs[0]).unwrap(),
            vec![b"one".to_vec(), b"two".to_vec(), b"three".to_vec()]
        );
        assert_eq!(a.bytes(), 13 + 4);
        a.write("f", 7, &[b"one"]).unwrap();
        assert_eq!(Archive::read(&segs[0]).unwrap(), vec![b"one".to_vec()]);
        assert_eq!(a.bytes(), 3 + 4);
        assert_eq!(Archive::open(dir.path()).unwrap().bytes(), 3 + 4);
        a.remove(&segs[1]).unwrap();
        assert_eq!(a.segments("f").unwrap().len(), 1);
        assert_eq!(a.bytes(), 3);
        // A write that stopped before its rename leaves a `.tmp`, never a segment.
        std::fs::write(segs[0].path.with_extension("jsonl.tmp"), b"half").unwrap();
        assert_eq!(a.segments("f").unwrap().len(), 1);
    }
}
