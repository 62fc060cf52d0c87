//! Image references → local programs.
//!
//! No image can be pulled on the test machines, so an image "exists" when the map file names a
//! local program for its repository. Map file format, one entry a line:
//!
//! ```text
//! # comment
//! celld.test/sim = ../../target/debug/celld-sim     # exact repository
//! registry.example/celld/* = /usr/local/bin/celld   # prefix match ("*" at the end only)
//! bench.example/celld = @noprocess                  # no process, Ready at once
//! ```
//!
//! Only the repository part of a reference is matched (the tag after the last `:` of the last path
//! segment and any `@digest` are dropped), so every tag and digest of a mapped repository runs the
//! same program. Relative program paths are resolved against the map file's folder. The image
//! [`NO_PROCESS_IMAGE`] is always mapped to no-process mode.

use std::path::{Path, PathBuf};

/// The reserved image that runs no process and is Ready at once (scale benchmarks).
pub const NO_PROCESS_IMAGE: &str = "celld.test/noprocess";

/// What an image resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageTarget {
    /// Run this program (the image's entrypoint).
    Program(PathBuf),
    /// Run nothing; the container is Running and Ready at once.
    NoProcess,
}

/// The repository part of an image reference: without `@digest` and without `:tag`.
pub fn repository(image: &str) -> &str {
    let without_digest = image.split_once('@').map_or(image, |(r, _)| r);
    let last_slash = without_digest.rfind('/').map_or(0, |i| i + 1);
    match without_digest[last_slash..].find(':') {
        Some(colon) => &without_digest[..last_slash + colon],
        None => without_digest,
    }
}

/// One line of the map file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    pattern: String,
    target: ImageTarget,
}

/// A parsed image map.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageMap {
    entries: Vec<Entry>,
}

impl ImageMap {
    /// Parses map-file text; `base` resolves relative program paths.
    pub fn parse(text: &str, base: &Path) -> Result<Self, String> {
        let mut entries = Vec::new();
        for (n, raw) in text.lines().enumerate() {
            let line = raw.split_once('#').map_or(raw, |(l, _)| l).trim();
            if line.is_empty() {
                continue;
            }
            let (pattern, program) = line
                .split_once('=')
                .ok_or_else(|| format!("line {}: expected `repository = program`", n + 1))?;
            let (pattern, program) = (pattern.trim(), program.trim());
            if pattern.is_empty() || program.is_empty() {
                return Err(format!("line {}: empty repository or program", n + 1));
            }
            let target = if program == "@noprocess" {
                ImageTarget::NoProcess
            } else {
                ImageTarget::Program(base.join(program))
            };
            entries.push(Entry {
                pattern: pattern.to_string(),
                target,
            });
        }
        Ok(Self { entries })
    }

    /// Reads the map file (re-read at every container start, so tests may edit it live).
    pub fn load(path: Option<&Path>) -> Result<Self, String> {
        let Some(path) = path else {
            return Ok(Self::default());
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading image map {}: {e}", path.display()))?;
        Self::parse(&text, path.parent().unwrap_or(Path::new(".")))
    }

    /// The target of an image, or `None` when the image is unmapped (→ `ErrImagePull`).
    pub fn resolve(&self, image: &str) -> Option<ImageTarget> {
        let repo = repository(image);
        if repo == NO_PROCESS_IMAGE {
            return Some(ImageTarget::NoProcess);
        }
        let exact = self.entries.iter().find(|e| e.pattern == repo);
        let prefix = || {
            self.entries.iter().find(|e| {
                e.pattern
                    .strip_suffix('*')
                    .is_some_and(|p| repo.starts_with(p))
            })
        };
        exact.or_else(prefix).map(|e| e.target.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_drops_tag_and_digest_but_keeps_registry_port() {
        assert_eq!(repository("celld.test/sim"), "celld.test/sim");
        assert_eq!(repository("celld.test/sim:1.2"), "celld.test/sim");
        assert_eq!(repository("celld.test/sim@sha256:abc"), "celld.test/sim");
        assert_eq!(
            repository("celld.test/sim:1.2@sha256:abc"),
            "celld.test/sim"
        );
        assert_eq!(
            repository("localhost:5000/celld/sim:v1"),
            "localhost:5000/celld/sim"
        );
        assert_eq!(repository("localhost:5000/celld"), "localhost:5000/celld");
    }

    #[test]
    fn map_resolves_exact_then_prefix_and_relative_paths() {
        let map = ImageMap::parse(
            "# fixtures\nregistry.example/* = /bin/false\nregistry.example/celld = ./sim # exact\nbench/x=@noprocess\n",
            Path::new("/fixtures"),
        )
        .unwrap();
        assert_eq!(
            map.resolve("registry.example/celld:1@sha256:00"),
            Some(ImageTarget::Program(PathBuf::from("/fixtures/./sim")))
        );
        assert_eq!(
            map.resolve("registry.example/other"),
            Some(ImageTarget::Program(PathBuf::from("/bin/false")))
        );
        assert_eq!(map.resolve("bench/x:2"), Some(ImageTarget::NoProcess));
        assert_eq!(
            map.resolve("celld.test/noprocess:any"),
            Some(ImageTarget::NoProcess)
        );
        assert_eq!(map.resolve("unmapped/image:1"), None);
    }

    #[test]
    fn map_rejects_lines_without_a_program() {
        assert!(ImageMap::parse("just-a-name\n", Path::new("/")).is_err());
        assert!(ImageMap::parse("a = \n", Path::new("/")).is_err());
    }
}
