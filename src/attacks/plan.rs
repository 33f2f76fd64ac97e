//! What a membership-inference run is asked to do ([`MiaPlan`]), the guarantee an attack is
//! compared with ([`Basis`]), and the facts of a checkpoint the attack chain reads: the layer
//! below both the loaded model ([`super::subject`]) and the chain ([`super::pipeline`]).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::mia::{AttackKind, MetricOpts, ScoreOpts};
use super::theory::{self, Evidence};
use crate::data::{Dataset, SplitManifest};
use crate::error::{Error, Result};
use crate::events::{DpEvent, EventFile, Neighbouring};
use crate::models::card::{CanaryInfo, DpInfo};
use crate::models::toy::Checkpoint;

/// Settings of the Table-2-style comparison.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Table2Opts {
    /// Stopping steps, as written ("T", "3T/4", …).
    pub steps: Vec<String>,
    /// Subsampling rates p of the empirical-denoiser sampler.
    pub rates: Vec<f64>,
    /// Sampler stride (DDPM steps per sampler step).
    pub stride: usize,
    /// Clipping norm C of the sampler mechanism.
    pub clip: f64,
    /// Constant density p_t of the sampler mechanism.
    pub density: f64,
}

impl Default for Table2Opts {
    fn default() -> Self {
        Table2Opts {
            steps: vec!["T".into(), "3T/4".into(), "T/2".into(), "T/4".into()],
            rates: vec![1.0, 0.5, 0.01, 0.005],
            stride: 10,
            clip: 1.0,
            density: 1.0,
        }
    }
}

/// Which audit with a valid ε lower bound to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuditKind {
    /// Steinke, Nasr & Jagielski 2023: the canaries of one training run (`train --canaries m`).
    OneRun,
    /// Independent trials (one model per trial, e.g. K trainings with a target record in or
    /// out), from a scores file: held-out threshold, Clopper–Pearson.
    ManyRuns,
}

/// The guarantee an attack is compared with, and where it comes from.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Basis {
    /// What the guarantee covers, e.g. "training ledger models/x.ledger.toml".
    pub source: String,
    /// Sound guarantees (empty: none applies).
    pub guarantees: Vec<Evidence>,
    /// Accountants that could not give a sound bound, with the reason.
    pub skipped: Vec<String>,
    /// The accounted event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<DpEvent>,
    /// The neighbouring relation the guarantees hold under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub neighbouring: Option<Neighbouring>,
}

impl Basis {
    /// The tightest sound ε upper bound with its accountant.
    pub fn epsilon(&self) -> Option<(f64, String)> {
        theory::tightest(&self.guarantees, |g| g.epsilon)
    }
    /// One line: "pld ε = 1.08 at δ = 1e-5 (upper_bound) from <source>".
    pub fn describe(&self) -> String {
        match theory::tightest(&self.guarantees, |g| g.epsilon) {
            None => format!("no sound guarantee ({})", self.source),
            Some((e, src)) => {
                let g = self.guarantees.iter().find(|g| g.source() == src).expect("present");
                format!(
                    "{src} ε = {} at δ = {} ({}) from {}",
                    crate::report::export::fmt_num(e),
                    crate::report::export::fmt_num(g.delta),
                    g.kind.as_str(),
                    self.source
                )
            }
        }
    }
}

/// The guarantees of an event under `neighbouring` at `delta`.
pub fn basis_of_event(source: String, event: DpEvent, neighbouring: Neighbouring, delta: f64) -> Basis {
    let (guarantees, skipped) = theory::guarantees_for(&event, neighbouring, delta);
    Basis {
        source,
        guarantees,
        skipped,
        event: Some(event),
        neighbouring: Some(neighbouring),
    }
}

/// The training ledger of a checkpoint (None for a non-DP checkpoint).
pub fn checkpoint_basis(ck: &Checkpoint, delta: f64) -> Result<Option<Basis>> {
    let Some(dp) = &ck.card.dp else { return Ok(None) };
    let p = ck.dir().join(&dp.ledger);
    let f = EventFile::load(&p)?;
    Ok(Some(basis_of_event(
        format!("training ledger {}", p.display()),
        f.event,
        f.neighbouring,
        delta,
    )))
}

/// The accounting of an empirical-denoiser sampler configuration (diffusion-sampling-privacy
/// §3), for the `empirical` attack.
pub fn sampler_basis(path: &std::path::Path, delta: f64) -> Result<Basis> {
    let cfg = crate::config::sampler::SamplerConfig::load(path)?;
    let acc = crate::diffusion::account::sampler_accounting(&cfg).map_err(|e| e.with_file(path))?;
    Ok(basis_of_event(
        format!("sampler accounting of {}", path.display()),
        acc.event,
        acc.neighbouring,
        delta,
    ))
}

/// What to run.
#[derive(Debug, Clone)]
pub struct MiaPlan {
    /// Attacks.
    pub attacks: Vec<AttackKind>,
    /// Steps.
    pub timesteps: Vec<usize>,
    /// Attack knobs.
    pub score: ScoreOpts,
    /// Metric knobs.
    pub metric: MetricOpts,
    /// Also run every attack with labels shuffled at random.
    pub null_test: bool,
    /// The Table-2-style comparison.
    pub table2: Option<Table2Opts>,
    /// Steps of the Figure-1 cosine profile (empty: none).
    pub cosine_steps: Vec<usize>,
    /// The audit to run.
    pub audit: Option<AuditKind>,
    /// The sampler's accounting, for the empirical attack (None: no comparison for it).
    pub sampler: Option<Basis>,
    /// β of the audits' ε lower bounds: every audit verdict of the report holds together at
    /// confidence 1 − β (split between the black-box and the white-box one-run audits when both
    /// run, [`super::pipeline::audit_betas`]). Separate from the bootstrap intervals' level (`metric.level`).
    pub beta: f64,
}

/// Summary of the attacked checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetInfo {
    /// Card path.
    pub checkpoint: String,
    /// Architecture.
    pub arch: String,
    /// Parameter count.
    pub parameters: usize,
    /// Part of the split trained on.
    pub trained_on: String,
    /// Rows trained on (without canaries).
    pub train_rows: usize,
    /// Optimiser steps.
    pub steps: usize,
    /// The training command.
    pub command: String,
    /// How training randomness was drawn (a seeded run is not private against whoever knows the
    /// seed).
    pub randomness: String,
    /// DP parameters.
    #[serde(skip_serializing_if = "Option::is_none")]
    /// DP-SGD settings, for DP checkpoints.
    pub dp: Option<DpInfo>,
}

/// The member / non-member rows of a split for a checkpoint: checks the split is the one the
/// model was trained on; non-members exclude the canaries.
pub fn split_rows(ck: &Checkpoint, data: &Dataset, split: &SplitManifest) -> Result<(Vec<usize>, Vec<usize>)> {
    split.check_data(data)?;
    let trained_on = ck.card.data.trained_on;
    let member_ix = split.part(trained_on);
    if crate::data::digits::indices_sha256(member_ix) != ck.card.data.rows_sha256 {
        return Err(Error::input(format!(
            "the split's `{}` list does not hash to the card's data.rows_sha256: this is not the split the model was trained on",
            format!("{trained_on:?}").to_lowercase()
        ))
        .with_file(&ck.card_path));
    }
    if trained_on == crate::data::digits::Part::Nonmembers {
        return Err(Error::input(
            "the model was trained on the non-members; nothing to attack",
        ));
    }
    Ok((member_ix.to_vec(), split.nonmembers.clone()))
}

/// Key of a canary's noise stream: above every data row index.
pub const CANARY_KEY_BASE: u64 = 1 << 48;

/// What the report says about a dpaudit checkpoint card.
pub fn card_target(ck: &Checkpoint) -> TargetInfo {
    let c = &ck.card;
    TargetInfo {
        checkpoint: ck.card_path.display().to_string(),
        arch: format!("{:?}", c.model.arch).to_lowercase(),
        parameters: c.parameters,
        trained_on: format!("{:?}", c.data.trained_on).to_lowercase(),
        train_rows: c.data.rows,
        steps: c.training.steps,
        command: c.training.command.clone(),
        randomness: c.training.randomness.clone(),
        dp: c.dp.clone(),
    }
}

/// Where a card's gradient (white-box) canaries and DP settings are.
#[derive(Debug, Clone)]
pub struct WhiteBoxSource {
    /// The card's gradient canaries.
    pub canaries: CanaryInfo,
    /// Its DP-SGD settings.
    pub dp: Option<DpInfo>,
    /// The folder its files are in.
    pub dir: PathBuf,
    /// The card.
    pub card_path: PathBuf,
}
