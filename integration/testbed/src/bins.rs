//! The test bed's own binaries, built through cargo at start-up.
//!
//! `env!("CARGO_BIN_EXE_…")` only names binaries of the crate under test, so the test bed runs
//! `cargo build -p celld-sim -p celld-test-kubelet --message-format=json-render-diagnostics`
//! itself (same workspace, same profile as the running test executable) and takes the paths of
//! the built executables from cargo's JSON messages. Cargo is the one that knows the target
//! folder (`CARGO_TARGET_DIR`, `build.target-dir`), so nothing is guessed. When the binaries are
//! up to date this costs about a second.
//!
//! Overrides (skip the build): `CELLD_SIM_BIN` and `CELLD_TEST_KUBELET_BIN` (both must be set).
//! A failed build fails the test bed loudly: a skipped tier is a silent toy.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// Paths of the executables the test bed runs.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `celld-sim` as built (the test bed copies it before use).
    pub sim: PathBuf,
    /// `celld-test-kubelet`.
    pub kubelet: PathBuf,
}

/// Builds (or finds up to date) the simulator and the test kubelet.
pub fn build(repo: &Path) -> Result<Binaries> {
    if let (Some(sim), Some(kubelet)) = (
        std::env::var_os("CELLD_SIM_BIN"),
        std::env::var_os("CELLD_TEST_KUBELET_BIN"),
    ) {
        return Ok(Binaries {
            sim: PathBuf::from(sim),
            kubelet: PathBuf::from(kubelet),
        });
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.arg("build")
        .arg("--message-format=json-render-diagnostics")
        .arg("--manifest-path")
        .arg(repo.join("Cargo.toml"))
        .args(["-p", "celld-sim", "-p", "celld-test-kubelet"])
        .args(["--bin", "celld-sim", "--bin", "celld-test-kubelet"]);
    if let Some(profile) = running_profile() {
        cmd.args(["--profile", &profile]);
    }
    cmd.current_dir(repo)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    eprintln!(
        "celld-testbed: building celld-sim and celld-test-kubelet ({:?})",
        cmd
    );
    let mut child = cmd
        .spawn()
        .with_context(|| format!("running {}", Path::new(&cargo).display()))?;
    let stdout = child.stdout.take().context("cargo stdout")?;
    let mut sim = None;
    let mut kubelet = None;
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.context("reading cargo output")?;
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        let Some(exe) = msg["executable"].as_str() else {
            continue;
        };
        match msg["target"]["name"].as_str() {
            Some("celld-sim") => sim = Some(PathBuf::from(exe)),
            Some("celld-test-kubelet") => kubelet = Some(PathBuf::from(exe)),
            _ => {}
        }
    }
    let status = child.wait().context("waiting for cargo")?;
    if !status.success() {
        bail!(
            "`cargo build -p celld-sim -p celld-test-kubelet` failed with {status} (output above)"
        );
    }
    match (sim, kubelet) {
        (Some(sim), Some(kubelet)) => Ok(Binaries { sim, kubelet }),
        (sim, kubelet) => bail!(
            "cargo build succeeded but did not name both executables (celld-sim: {sim:?}, celld-test-kubelet: {kubelet:?})"
        ),
    }
}

/// The cargo profile of the running executable, from its folder
/// (`target/<profile dir>/deps/<test>`): `debug` → none (dev), anything else → that profile.
fn running_profile() -> Option<String> {
    let exe = std::env::current_exe().ok()?;
    let mut dir = exe.parent()?;
    if dir.file_name()? == "deps" {
        dir = dir.parent()?;
    }
    match dir.file_name()?.to_str()? {
        "debug" => None,
        other if dir.parent()?.join(".rustc_info.json").exists() || other == "release" => {
            Some(other.to_string())
        }
        _ => None,
    }
}
