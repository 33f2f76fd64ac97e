//! Membership inference on diffusers checkpoints: the loss, SecMI and PIA attacks of
//! [`super::mia`] through the batched [`crate::models::eps::EpsPredictor`] interface, on an
//! image data set and split, with the same metrics and report as for dpaudit's own checkpoints.

use std::path::Path;

use indicatif::ProgressBar;

use super::mia::{self, AttackKind};
use super::pipeline::{evaluate_scores, Basis, Evaluated, MiaPlan, MiaReport, TargetInfo};
use super::scores::{self, ScoreSet};
use crate::error::{Error, Result};
use crate::models::data::indices_sha256;
use crate::models::diffusers::{DiffusersCheckpoint, DiffusersDenoiser};
use crate::models::images::ImageSet;
use crate::models::SplitManifest;

/// `training.json` beside a checkpoint (written by scripts/train_mnist_ddpm.py): what the model
/// was trained on, checked against the split.
#[derive(Debug, Clone, serde::Deserialize)]
struct TrainingRecord {
    #[serde(default)]
    members_sha256: Option<String>,
    #[serde(default)]
    steps: Option<u64>,
    #[serde(default)]
    rows: Option<usize>,
    #[serde(default)]
    command: Option<String>,
}

impl super::denoiser::Denoiser for DiffusersDenoiser<'_> {
    fn dim(&self) -> usize {
        crate::models::eps::EpsPredictor::dim(self)
    }
    fn alpha_bars(&self) -> &[f64] {
        &self.schedule.alpha_bars
    }
    fn predict_eps(&self, x: &[f32], t: &[usize]) -> Result<Vec<f32>> {
        crate::models::eps::EpsPredictor::predict_eps(self, x, t)
    }
}

/// Runs the plan's attacks on `den` (a loaded diffusers checkpoint) with the split's members and
/// non-members; `max_examples` keeps only the first that many of each (a reduced set for quick
/// runs). The empirical attack, audits and the Table-2/cosine extras are for 8×8 checkpoints
/// only. Without a stated mechanism (see [`run_with_basis`]) results have no theoretical limit.
/// Returns the report and every score record (for `--scores-out`; record ids are the data rows).
#[allow(clippy::too_many_arguments)]
pub fn run(
    ck: &DiffusersCheckpoint,
    den: &DiffusersDenoiser<'_>,
    images: &ImageSet,
    split: &SplitManifest,
    split_path: &Path,
    plan: &MiaPlan,
    max_examples: Option<usize>,
    device: &str,
    bar: Option<&ProgressBar>,
) -> Result<(MiaReport, Vec<scores::ScoreRecord>)> {
    run_with_basis(
        ck,
        den,
        images,
        split,
        split_path,
        plan,
        max_examples,
        device,
        bar,
        None,
    )
}

/// [`run`] with the guarantee of the training mechanism (the folder's dpaudit ledger, or a
/// stated one: [`super::mechanism::diffusers_basis`]): every attack is compared with its limit.
#[allow(clippy::too_many_arguments)]
pub fn run_with_basis(
    ck: &DiffusersCheckpoint,
    den: &DiffusersDenoiser<'_>,
    images: &ImageSet,
    split: &SplitManifest,
    split_path: &Path,
    plan: &MiaPlan,
    max_examples: Option<usize>,
    device: &str,
    bar: Option<&ProgressBar>,
    basis: Option<&Basis>,
) -> Result<(MiaReport, Vec<scores::ScoreRecord>)> {
    let start = std::time::Instant::now();
    images.check_split(split, split_path)?;
    if plan.table2.is_some() || !plan.cosine_steps.is_empty() || plan.audit.is_some() {
        return Err(Error::input(
            "--table2, --cosine and --audit are for dpaudit's own 8×8 checkpoints",
        ));
    }
    if plan.attacks.contains(&AttackKind::Empirical) {
        return Err(Error::field(
            "--attack",
            "the empirical attack is for 8×8 checkpoints; use loss, secmi or pia with a diffusers checkpoint",
        ));
    }
    let record_path = ck.dir.join("training.json");
    let record: Option<TrainingRecord> = if record_path.is_file() {
        let text = crate::input::read_to_string(&record_path)?;
        Some(
            serde_json::from_str(&text)
                .map_err(|e| Error::input(format!("not a training record: {e}")).with_file(&record_path))?,
        )
    } else {
        None
    };
    if let Some(h) = record.as_ref().and_then(|r| r.members_sha256.as_ref()) {
        if *h != indices_sha256(&split.members) {
            return Err(Error::input(
                "the split's `members` list does not hash to the training record's members_sha256: this is not the split the model was trained on",
            )
            .with_file(&record_path));
        }
    }
    let cap = |ix: &[usize]| -> Vec<usize> { ix.iter().take(max_examples.unwrap_or(usize::MAX)).copied().collect() };
    let member_ix = cap(&split.members);
    let nonmember_ix = cap(&split.nonmembers);
    let members = images.rows(&member_ix);
    let nonmembers = images.rows(&nonmember_ix);
    let ids: Vec<String> = member_ix.iter().chain(&nonmember_ix).map(|i| i.to_string()).collect();
    let labels: Vec<bool> = member_ix
        .iter()
        .map(|_| true)
        .chain(nonmember_ix.iter().map(|_| false))
        .collect();
    let mut records = Vec::new();
    // Progress counts images: the bar's (attack, step) units become images scored.
    let per_unit = ids.len() as u64;
    if let Some(b) = bar {
        let units = (plan.attacks.len() * plan.timesteps.len()) as u64;
        b.inc_length(units * per_unit.saturating_sub(1));
    }
    for &kind in &plan.attacks {
        for &t in &plan.timesteps {
            if let Some(b) = bar {
                b.set_message(format!("{} at t = {t}", kind.as_str()));
            }
            let mut s = mia::scores(kind, den, &[], &members, t, &plan.score)?;
            s.extend(mia::scores(kind, den, &[], &nonmembers, t, &plan.score)?);
            records.extend(scores::records(kind, t, ScoreSet::Split, &ids, &labels, &s));
            if let Some(b) = bar {
                b.inc(per_unit);
            }
        }
    }
    let name = ck.dir.display().to_string();
    let Evaluated {
        results,
        null_results,
        one_run,
        many_runs,
        comparisons,
    } = evaluate_scores(&records, plan, basis, Some(&name))?;
    let card = crate::models::diffusers_train::UnetCard::load(ck.config_path.parent().unwrap_or(&ck.dir))?;
    let report = MiaReport {
        schema: "dpaudit.mia/2".into(),
        target: Some(TargetInfo {
            checkpoint: name,
            arch: ck.model.config.describe(),
            parameters: ck.model.parameters,
            trained_on: "members".into(),
            train_rows: record.as_ref().and_then(|r| r.rows).unwrap_or(split.members.len()),
            steps: record.as_ref().and_then(|r| r.steps).unwrap_or(0) as usize,
            command: record
                .as_ref()
                .and_then(|r| r.command.clone())
                .unwrap_or_else(|| "(no training.json beside the checkpoint)".into()),
            randomness: card
                .as_ref()
                .map(|c| c.training.randomness.clone())
                .unwrap_or_else(|| "unknown (trained outside dpaudit)".into()),
            dp: card.and_then(|c| c.dp),
        }),
        scores_file: None,
        split: split_path.display().to_string(),
        data: images.path.display().to_string(),
        device: device.to_string(),
        seed: plan.score.seed,
        delta: plan.metric.delta,
        confidence: 1.0 - plan.metric.alpha,
        checkpoint_basis: basis.cloned(),
        sampler_basis: None,
        results,
        null_results,
        one_run,
        many_runs,
        comparisons,
        warnings: Vec::new(),
        cosine: Vec::new(),
        table2: None,
        elapsed_s: start.elapsed().as_secs_f64(),
    };
    Ok((report, records))
}
