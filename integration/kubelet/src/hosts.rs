//! The kubelet's hosts file: the only name resolution the members use (`CELLD_SIM_HOSTS_FILE`).
//!
//! Entries:
//! - `127.0.0.1 localhost`;
//! - the static names (by default `minio.celld-test-store.svc` and its `.cluster.local` form → the
//!   store IP; the store or its fault proxy must listen on `<store-ip>:9000`);
//! - for every live Pod incarnation with `spec.hostname` and `spec.subdomain`:
//!   `<hostname>.<subdomain>.<namespace>.svc` and `….svc.cluster.local` → its current Pod IP.
//!   When two incarnations claim the same name (a zombie's Pod and its replacement), the newer one
//!   (later creation timestamp, then later registration) wins. Unlike cluster DNS, no headless
//!   Service with that name is required and readiness is ignored (as with
//!   `publishNotReadyAddresses: true`).
//!
//! The file is written whole to a temporary file and renamed over the old one, so readers never
//! see a partial file.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// The object store's service name (docs/runtime.md "The member environment").
pub const STORE_NAME: &str = "minio.celld-test-store.svc";

/// One Pod incarnation's DNS entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodHostEntry {
    /// `<hostname>.<subdomain>.<namespace>.svc`
    pub name: String,
    /// Current Pod IP.
    pub ip: Ipv4Addr,
    /// Creation timestamp (seconds) used to pick the newest incarnation, then a sequence number.
    pub order: (i64, u64),
}

/// The desired hosts-file contents, kept in memory and rendered on change.
#[derive(Debug)]
pub struct HostsFile {
    path: PathBuf,
    statics: BTreeMap<String, Ipv4Addr>,
    pods: HashMap<String, PodHostEntry>,
    last_written: Option<String>,
}

impl HostsFile {
    /// A hosts file at `path` with static entries.
    pub fn new(path: PathBuf, statics: BTreeMap<String, Ipv4Addr>) -> Self {
        Self {
            path,
            statics,
            pods: HashMap::new(),
            last_written: None,
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Adds or replaces the entry of a Pod incarnation (keyed by Pod UID).
    pub fn set(&mut self, uid: &str, entry: PodHostEntry) {
        self.pods.insert(uid.to_string(), entry);
    }

    /// Drops a Pod incarnation's entry.
    pub fn remove(&mut self, uid: &str) {
        self.pods.remove(uid);
    }

    /// The file text for the current entries.
    pub fn render(&self) -> String {
        let mut out = String::from(
            "# written by celld-test-kubelet; do not edit (rewritten on every Pod change)\n127.0.0.1 localhost\n",
        );
        for (name, ip) in &self.statics {
            out.push_str(&format!("{ip} {name}\n"));
        }
        let mut newest: BTreeMap<&str, &PodHostEntry> = BTreeMap::new();
        for entry in self.pods.values() {
            let keep = newest
                .get(entry.name.as_str())
                .is_none_or(|current| entry.order > current.order);
            if keep {
                newest.insert(&entry.name, entry);
            }
        }
        for (name, entry) in newest {
            out.push_str(&format!("{} {name} {name}.cluster.local\n", entry.ip));
        }
        out
    }

    /// Writes the file if its text changed (temporary file + rename).
    pub fn write(&mut self) -> std::io::Result<()> {
        let text = self.render();
        if self.last_written.as_deref() == Some(text.as_str()) {
            return Ok(());
        }
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, &text)?;
        std::fs::rename(&tmp, &self.path)?;
        self.last_written = Some(text);
        Ok(())
    }
}

/// The static entries for the store name (with and without `.cluster.local`) plus extra ones.
pub fn static_entries(
    store_ip: Ipv4Addr,
    extra: &[(String, Ipv4Addr)],
) -> BTreeMap<String, Ipv4Addr> {
    let mut map = BTreeMap::new();
    map.insert(STORE_NAME.to_string(), store_ip);
    map.insert(format!("{STORE_NAME}.cluster.local"), store_ip);
    for (name, ip) in extra {
        map.insert(name.clone(), *ip);
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_incarnation_of_a_name_wins_and_store_name_is_static() {
        let statics = static_entries(Ipv4Addr::new(127, 0, 0, 2), &[]);
        let mut hosts = HostsFile::new(PathBuf::from("/nonexistent"), statics);
        let name = "m-0.m-peers.ns.svc".to_string();
        hosts.set(
            "old",
            PodHostEntry {
                name: name.clone(),
                ip: Ipv4Addr::new(127, 1, 0, 1),
                order: (100, 1),
            },
        );
        hosts.set(
            "new",
            PodHostEntry {
                name,
                ip: Ipv4Addr::new(127, 1, 0, 7),
                order: (101, 2),
            },
        );
        let text = hosts.render();
        assert!(text.contains("127.0.0.2 minio.celld-test-store.svc\n"));
        assert!(text.contains("127.0.0.2 minio.celld-test-store.svc.cluster.local\n"));
        assert!(text.contains("127.1.0.7 m-0.m-peers.ns.svc m-0.m-peers.ns.svc.cluster.local\n"));
        assert!(!text.contains("127.1.0.1"));
        hosts.remove("new");
        assert!(hosts.render().contains("127.1.0.1 m-0.m-peers.ns.svc "));
    }

    #[test]
    fn write_replaces_the_file_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hosts");
        let mut hosts = HostsFile::new(path.clone(), static_entries(Ipv4Addr::LOCALHOST, &[]));
        hosts.write().unwrap();
        assert!(std::fs::read_to_string(&path)
            .unwrap()
            .contains("127.0.0.1 minio.celld-test-store.svc\n"));
        assert!(!path.with_extension("tmp").exists());
    }
}
