//! `merge`: the part files of a sharded `mia` run, checked to belong together (same inputs by
//! SHA-256, same plan, every shard once), reassembled into the report of one unsharded run.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::attacks::pipeline::{self, MiaReport};
use crate::attacks::scores::ScoreRecord;
use crate::attacks::shard::{self, MiaPart};
use crate::data::{Dataset, SplitManifest};
use crate::error::{Error, Result};
use crate::models::device;
use crate::models::toy::Checkpoint;

/// A validated `merge` request.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Part files (`mia-part-<i>-of-<n>.json`).
    pub parts: Vec<PathBuf>,
    /// Checkpoint card (None: the path recorded in the parts).
    pub checkpoint: Option<PathBuf>,
    /// Data file (None: the path recorded in the parts).
    pub data: Option<PathBuf>,
    /// Split manifest (None: the path recorded in the parts).
    pub split: Option<PathBuf>,
    /// When the run started (the report's run time).
    pub started: Instant,
}

/// The merged run: its report and every score record, in the order one unsharded run produces
/// them.
#[derive(Debug)]
pub struct Merged {
    /// The report of the merged run.
    pub report: MiaReport,
    /// Every per-record score.
    pub records: Vec<ScoreRecord>,
}

/// Loads the parts, checks that they belong together and to the inputs (SHA-256), and assembles
/// the report of one unsharded run.
pub fn execute(plan: &Plan) -> Result<Merged> {
    let parts = plan
        .parts
        .iter()
        .map(|p| Ok((p.clone(), MiaPart::load(p)?)))
        .collect::<Result<Vec<_>>>()?;
    let mut merged = shard::merge(&parts)?;
    // Every guarantee is derived again from its event, never taken from the parts (the parts
    // agree with each other, which an edit of all of them keeps).
    let first = &plan.parts[0];
    if let Some(b) = &merged.plan.sampler {
        merged.plan.sampler = Some(rederived(b, merged.plan.delta, first, "plan.sampler")?);
    }
    if let Some(d) = &merged.plan.diffusers {
        return execute_diffusers(plan, &merged, d, parts.len());
    }
    let inputs = &merged.inputs;
    let card = checked(
        &plan.checkpoint,
        &inputs.checkpoint,
        &inputs.checkpoint_sha256,
        "the checkpoint card",
    )?;
    let data_path = checked(&plan.data, &inputs.data, &inputs.data_sha256, "the data file")?;
    let split_path = checked(&plan.split, &inputs.split, &inputs.split_sha256, "the split manifest")?;
    let dev = device::select(device::DeviceChoice::Cpu)?;
    let ck = Checkpoint::load(&card, &dev)?;
    let data = Dataset::load(&data_path)?;
    let split = SplitManifest::load(&split_path)?;
    merged.check_records(&ck, &data, &split)?;
    let mia_plan = merged.plan.to_plan();
    let subject = crate::attacks::subject::Subject::card(ck, data, split, &mia_plan)?;
    let report = pipeline::assemble(&subject, &mia_plan, "merged shards", &merged.records, plan.started)?;
    crate::report::progress::note(&format!(
        "merged {} parts, {} records",
        parts.len(),
        merged.records.len()
    ));
    Ok(Merged {
        report,
        records: merged.records,
    })
}

/// The merge of a diffusers folder's parts: records checked against the attacked rows (split,
/// `--max-examples`, canaries), the report assembled as one unsharded run's.
fn execute_diffusers(plan: &Plan, merged: &shard::Merged, d: &shard::DiffusersPart, n_parts: usize) -> Result<Merged> {
    use crate::models::diffusers::{unet_dir, DiffusersCheckpoint};
    let inputs = &merged.inputs;
    let given = plan
        .checkpoint
        .as_ref()
        .map(|p| unet_dir(p).unwrap_or_else(|| p.clone()));
    let folder = checked(
        &given,
        &inputs.checkpoint,
        &inputs.checkpoint_sha256,
        "the diffusers folder",
    )?;
    let data_path = checked(&plan.data, &inputs.data, &inputs.data_sha256, "the data file")?;
    let split_path = checked(&plan.split, &inputs.split, &inputs.split_sha256, "the split manifest")?;
    // The guarantee: a folder's own ledger (covered by the folder's hash) is read again and must
    // be the event the parts were compared with; a stated mechanism's guarantees are derived
    // again from the parts' event.
    let basis = match (&d.basis, crate::attacks::mechanism::own_ledger(&folder)) {
        (_, Some(_)) => {
            let own = crate::attacks::mechanism::diffusers_basis(
                &folder,
                None,
                &crate::attacks::mechanism::OpacusSpec::default(),
                merged.plan.delta,
                &[],
            )?;
            let part_event = d.basis.as_ref().and_then(|b| b.event.as_ref());
            let own_event = own.as_ref().and_then(|b| b.event.as_ref());
            if part_event != own_event
                || d.basis.as_ref().and_then(|b| b.neighbouring) != own.as_ref().and_then(|b| b.neighbouring)
            {
                return Err(Error::field(
                    "plan.diffusers.basis.event",
                    format!(
                        "is not the event of the folder's own ledger {}: the parts were not compared with the ledger of these weights",
                        folder.join(crate::models::folder::LEDGER).display()
                    ),
                )
                .with_file(&plan.parts[0]));
            }
            own
        }
        (Some(b), None) => Some(rederived(b, merged.plan.delta, &plan.parts[0], "plan.diffusers.basis")?),
        (None, None) => None,
    };
    let dev = device::select(device::DeviceChoice::Cpu)?;
    let ck = DiffusersCheckpoint::load(&folder, &dev)?;
    let images = crate::data::images::ImageSet::load(&data_path)?;
    let split = SplitManifest::load(&split_path)?;
    let mia_plan = merged.plan.to_plan();
    // The batch size does not enter the report: nothing is scored again.
    let subject = crate::attacks::subject::Subject::diffusers(
        ck,
        64,
        images,
        split,
        &split_path,
        &mia_plan,
        d.max_examples,
        basis,
    )?;
    subject
        .rows
        .check_records(&merged.records, &merged.positions, &mia_plan)?;
    let report = pipeline::assemble(&subject, &mia_plan, "merged shards", &merged.records, plan.started)?;
    crate::report::progress::note(&format!("merged {n_parts} parts, {} records", merged.records.len()));
    Ok(Merged {
        report,
        records: merged.records.clone(),
    })
}

/// `b`'s guarantees derived again from its event at `delta` by the function every command uses
/// ([`pipeline::basis_of_event`]); a guarantee without an event to derive it from is refused,
/// naming the part file and field.
fn rederived(b: &pipeline::Basis, delta: f64, part: &Path, field: &str) -> Result<pipeline::Basis> {
    match (&b.event, b.neighbouring) {
        (Some(ev), Some(nb)) => Ok(pipeline::basis_of_event(b.source.clone(), ev.clone(), nb, delta)),
        _ if b.guarantees.is_empty() => Ok(pipeline::Basis {
            skipped: Vec::new(),
            ..b.clone()
        }),
        _ => Err(Error::field(
            field,
            format!(
                "states guarantees ({}) without the event and neighbouring relation they are derived from",
                b.describe()
            ),
        )
        .with_file(part)),
    }
}

/// The input at `given` (else `recorded`), refused unless its SHA-256 is `want`.
fn checked(given: &Option<PathBuf>, recorded: &Path, want: &str, what: &str) -> Result<PathBuf> {
    let path = given.clone().unwrap_or_else(|| recorded.to_path_buf());
    let got = shard::input_sha256(&path)?;
    if got != want {
        return Err(
            Error::input(format!("{what} has SHA-256 {got}; the parts were computed from {want}")).with_file(&path),
        );
    }
    Ok(path)
}
