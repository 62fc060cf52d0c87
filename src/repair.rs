//! A person's repairs of a fleet's journal, run by the CLI (docs/journal.md "Repairs"):
//! `journal restore --from-file EXPORT` writes a verified chain back to the annotation;
//! `journal adopt` resolves an `EffectMarkerMismatch`. (`restore --from-mirror` and `reset`
//! are consumed by the operator, which holds the mirror: see `reconcile/integrity.rs`.)
//!
//! Both writes are compare-and-swaps on the object just read, so a repair never lands on
//! a state the person did not see.

use std::io::Write;
use std::path::Path;

use journal::{Budget, Entry, Journal};
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;

use crate::api::keys::JOURNAL_ANNOTATION;
use crate::api::CelldFleet;
use crate::journal_store;
use crate::reconcile::workload;
use crate::render::uses_statefulset;

/// Reads a `journal export` (JSON Lines: `{"entry":{…},"fleetUID":"…"}`): the fleet UID and
/// its entries in seq order. Every line must name the same fleet.
pub fn parse_export(text: &str) -> Result<(String, Vec<Entry>), String> {
    let mut uid: Option<String> = None;
    let mut entries = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let line_no = n + 1;
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("line {line_no}: not JSON: {e}"))?;
        let fleet = value["fleetUID"]
            .as_str()
            .ok_or_else(|| format!("line {line_no}: no fleetUID"))?;
        match &uid {
            None => uid = Some(fleet.to_owned()),
            Some(u) if u != fleet => {
                return Err(format!(
                    "line {line_no}: entry of fleet {fleet}, but the export starts with fleet {u}; export one fleet"
                ))
            }
            Some(_) => {}
        }
        let entry = journal::decode_entry(&value["entry"].to_string())
            .map_err(|e| format!("line {line_no}: {e}"))?;
        entries.push(entry);
    }
    entries.sort_by_key(Entry::seq);
    let uid = uid.ok_or("the export holds no entries")?;
    Ok((uid, entries))
}

/// Whether `restored` may replace the fleet's current annotation: it must be damaged or
/// missing, or behind the restored chain (a rollback); a usable annotation that is not
/// behind is never overwritten.
pub fn may_replace(fleet: &CelldFleet, restored: &Journal) -> Result<(), String> {
    if !fleet.annotations().contains_key(JOURNAL_ANNOTATION) {
        return Ok(());
    }
    match journal_store::load(fleet) {
        Err(_) => Ok(()),
        Ok(current) if current.document().seq() < restored.document().seq() => Ok(()),
        Ok(current) => Err(format!(
            "the annotation verifies and is not behind the restored chain (seq {} >= {}); nothing to restore",
            current.document().seq(),
            restored.document().seq()
        )),
    }
}

/// `journal restore NS/FLEET --from-file EXPORT`.
pub async fn restore_from_file(
    out: &mut impl Write,
    (ns, name): (String, String),
    file: &Path,
    budget: Budget,
) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", file.display()))?;
    let (uid, entries) =
        parse_export(&text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let client = kube::Client::try_default().await?;
    let api: Api<CelldFleet> = Api::namespaced(client, &ns);
    let fleet = api.get(&name).await?;
    let fleet_uid = fleet.uid().unwrap_or_default();
    if uid != fleet_uid {
        anyhow::bail!(
            "{}: the export is the journal of fleet UID {uid}, but {ns}/{name} has UID {fleet_uid}; refusing to restore another fleet's chain",
            file.display()
        );
    }
    let restored = Journal::from_history(&uid, entries, budget)
        .map_err(|e| anyhow::anyhow!("{}: the chain cannot be restored: {e}", file.display()))?;
    may_replace(&fleet, &restored).map_err(|e| anyhow::anyhow!("{ns}/{name}: {e}"))?;
    let doc = restored.document();
    let patch = json!({"metadata": {
        "resourceVersion": fleet.resource_version(),
        "annotations": {JOURNAL_ANNOTATION: doc.encode()}
    }});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    writeln!(
        out,
        "{ns}/{name}: journal restored from {}: entries {}..{} (seq {}, compacted through {})",
        file.display(),
        doc.entries().first().map_or(0, Entry::seq),
        doc.seq(),
        doc.seq(),
        doc.compacted_through()
    )?;
    Ok(())
}

/// `journal adopt NS/FLEET`: sets the workload's effect marker to the journal's last effect
/// (or removes it when the journal has none), with the workload's resourceVersion. The
/// operator then plans from the live spec as it is.
pub async fn adopt(out: &mut impl Write, (ns, name): (String, String)) -> anyhow::Result<()> {
    let client = kube::Client::try_default().await?;
    let fleet = Api::<CelldFleet>::namespaced(client.clone(), &ns)
        .get(&name)
        .await?;
    let journal = journal_store::load(&fleet).map_err(|e| {
        anyhow::anyhow!("{ns}/{name}: the journal does not verify ({e}); restore it first")
    })?;
    let sts = uses_statefulset(&fleet.spec);
    let kind = if sts { "StatefulSet" } else { "Deployment" };
    let Some(live) = workload::get(&client, &ns, &name, sts).await? else {
        anyhow::bail!("{ns}/{name}: {kind} {name} does not exist; nothing to adopt");
    };
    if !live.owned_by(&fleet.uid().unwrap_or_default()) {
        anyhow::bail!("{ns}/{name}: {kind} {name} is not owned by this fleet; it is never adopted");
    }
    let expected = journal.predecessor_effect().map(|e| e.to_string());
    let found = live.marker().map(str::to_owned);
    if found == expected {
        writeln!(
            out,
            "{ns}/{name}: {kind} {name} already carries the journal's last effect ({})",
            found.as_deref().unwrap_or("none")
        )?;
        return Ok(());
    }
    workload::set_marker_guarded(&client, &ns, &live, expected.as_deref()).await?;
    writeln!(
        out,
        "{ns}/{name}: {kind} {name} effect marker {} -> {}; the operator plans from its live spec",
        found.as_deref().unwrap_or("(none)"),
        expected.as_deref().unwrap_or("(none)")
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "5f0c9a6e-1b2c-4d3e-8f40-000000000001";

    fn export_of(n: u64) -> String {
        let mut journal = Journal::new(UID);
        for i in 0..n {
            let op = journal::OperationId::new_v4();
            let staged = journal
                .stage(
                    journal::NewEntry {
                        at: chrono::Utc::now(),
                        op,
                        leader: journal::Leader {
                            identity: "t".into(),
                            lease_transitions: 1,
                            lease: None,
                        },
                        body: journal::EntryBody::Recovered(journal::Recovered {
                            effect: format!("{op}/replicas").parse().unwrap(),
                            source: format!("test-{i}"),
                        }),
                    },
                    Budget::default(),
                )
                .unwrap();
            journal = staged.into_journal();
        }
        let mut out = Vec::new();
        journal::audit::export_entries(UID, journal.entries(), &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn an_export_reads_back_as_the_fleets_history() {
        let text = export_of(3);
        let (uid, entries) = parse_export(&text).unwrap();
        assert_eq!(uid, UID);
        assert_eq!(entries.len(), 3);
        let restored = Journal::from_history(&uid, entries, Budget::default()).unwrap();
        assert_eq!(restored.document().seq(), 3);
    }

    #[test]
    fn an_export_of_two_fleets_or_garbage_is_refused_with_the_line() {
        let mut text = export_of(2);
        text.push_str(&export_of(1).replace(UID, "5f0c9a6e-1b2c-4d3e-8f40-000000000002"));
        let err = parse_export(&text).unwrap_err();
        assert!(
            err.contains("line 3") && err.contains("export one fleet"),
            "{err}"
        );
        let err = parse_export("{nope").unwrap_err();
        assert!(err.contains("line 1"), "{err}");
        assert!(parse_export("\n").unwrap_err().contains("no entries"));
    }
}
