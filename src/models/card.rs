//! The record a training run writes beside its weights, shared by the 8×8 cards
//! ([`super::toy::checkpoint::Card`]) and the diffusers folders' `dpaudit_card.toml`
//! ([`super::diffusers_train::UnetCard`]): the data and split with their hashes, the training
//! settings, the DP-SGD parameters and the canaries of a one-run audit, and how a card records
//! and resolves the paths it names (relative to the card's folder).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::data::digits::Part;
use crate::error::{Error, Result};

/// What the model was trained on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataInfo {
    /// Path of the data file, relative to the card's folder (cards before this version: relative
    /// to the working directory of the training run; both are read).
    pub file: String,
    /// SHA-256 of the data file.
    pub sha256: String,
    /// Path of the split manifest (relative like `file`).
    pub split: String,
    /// SHA-256 of the split manifest.
    pub split_sha256: String,
    /// Which part of the split was trained on.
    pub trained_on: Part,
    /// SHA-256 of the trained-on index list (equals the manifest's `<part>_sha256`).
    pub rows_sha256: String,
    /// Number of rows trained on.
    pub rows: usize,
}

pub use super::folder::{RANDOMNESS_OS, RANDOMNESS_SEEDED};

fn seeded_randomness() -> String {
    RANDOMNESS_SEEDED.to_string()
}

/// How it was trained.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingInfo {
    /// `--seed`, when given (then every draw, DP noise included, follows from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// [`RANDOMNESS_OS`] or [`RANDOMNESS_SEEDED`].
    #[serde(default = "seeded_randomness")]
    pub randomness: String,
    /// Optimiser steps.
    pub steps: usize,
    /// Batch size (expected batch size for DP runs).
    pub batch_size: usize,
    /// Learning rate.
    pub lr: f64,
    /// EMA decay of the saved weights (0: raw weights).
    pub ema_decay: f64,
    /// Smallest diffusion step trained on.
    pub t_min: usize,
    /// Largest diffusion step trained on.
    pub t_max: usize,
    /// Device used for training.
    pub device: String,
    /// The exact command line that produced this checkpoint.
    pub command: String,
    /// Denoising loss with fixed draws before training, on [`TrainingInfo::eval_on`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_loss_before: Option<f64>,
    /// The same after training.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_loss_after: Option<f64>,
    /// Rows of the loss evaluation: the training rows (non-DP runs) or public rows (DP runs: a
    /// statistic of the private rows would be released without noise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_on: Option<String>,
    /// Checkpoint the run started from (fine-tuning), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<String>,
    /// Set by `dpaudit model relocate`: the folder moved after training, and `command` names
    /// the folders where they are now (what a rerun would use), not where the run wrote them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relocated: Option<String>,
}

/// RAPID retrieval settings (when the DP run used the knowledge base).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RapidInfo {
    /// Query timestep k (key = features of x_k).
    pub k: usize,
    /// Value timestep v < k (the retrieved x̂_v starts the fine-tuned steps).
    pub v: usize,
    /// Non-DP pretraining steps on public rows.
    pub pretrain_steps: usize,
    /// Public rows used for pretraining / for the knowledge base.
    pub pretrain_rows: usize,
    /// Public rows in the knowledge base.
    pub kb_rows: usize,
}

/// DP-SGD parameters (RAPID Algorithm 2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DpInfo {
    /// Noise multiplier σ.
    pub noise_multiplier: f64,
    /// Per-sample clipping norm.
    pub clip: f64,
    /// Poisson sampling rate q.
    pub sample_rate: f64,
    /// DP iterations.
    pub steps: u64,
    /// δ of the accounted guarantee.
    pub delta: f64,
    /// Per-sample gradient method: `ghost` (one pass, the MLP), `batched` (candle, one pass),
    /// `hand-written` (the CPU pass of one sample at a time, `unet2d::grad_cpu`) or `loop`.
    pub per_sample: String,
    /// Ledger file (an `events::EventFile`) next to the card: this run's event, composed after
    /// the `--init` checkpoint's ledger when it has one.
    pub ledger: String,
    /// ε spent (the whole ledger) at `delta`: the tightest sound upper bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epsilon: Option<f64>,
    /// The accountant and kind of `epsilon`, e.g. "pld (upper_bound)".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epsilon_accountant: Option<String>,
    /// The `--init` checkpoint whose ledger the ledger composes (None: started fresh or from a
    /// checkpoint trained on data disjoint from the private rows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_ledger: Option<String>,
    /// SHA-256 of the ledger file (checked whenever the checkpoint is loaded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger_sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// RAPID retrieval settings, when used.
    pub rapid: Option<RapidInfo>,
}

/// What kind of canary a training run inserts (`train --canary-kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CanaryKind {
    /// Records with ±1 values (black-box: the audit attacks the released model).
    #[default]
    Input,
    /// Dirac gradient canaries observed in every noisy update (white-box, all iterates; Nasr et
    /// al. 2023, "Tight Auditing of Differentially Private Machine Learning", §4).
    Gradient,
}

impl CanaryKind {
    /// `input` / `gradient`.
    pub fn as_str(self) -> &'static str {
        match self {
            CanaryKind::Input => "input",
            CanaryKind::Gradient => "gradient",
        }
    }
}

/// Canaries of a one-run audit (`train --canaries m`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CanaryInfo {
    /// The canaries file next to the card (contents and the secret inclusion bits).
    pub file: String,
    /// SHA-256 of that file.
    pub sha256: String,
    /// m.
    pub count: usize,
    /// `gradient` for white-box gradient canaries (absent: input canaries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<CanaryKind>,
    /// White-box observations file ([steps, m] float32 `.npy`: every noisy update at every
    /// canary's coordinate, in units of C).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observations: Option<String>,
    /// SHA-256 of the observations file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observations_sha256: Option<String>,
}

impl CanaryInfo {
    /// The kind of canaries (input when the card says nothing).
    pub fn kind(&self) -> CanaryKind {
        self.kind.unwrap_or_default()
    }
}

/// The white-box gradient canaries a card names (its `gradient_canaries`, or its `canaries` when
/// those are gradient canaries alone), if any. Shared by the 8×8 and the diffusers cards.
pub fn white_box_canaries<'a>(
    canaries: Option<&'a CanaryInfo>,
    gradient_canaries: Option<&'a CanaryInfo>,
) -> Option<&'a CanaryInfo> {
    gradient_canaries
        .or(canaries)
        .filter(|i| i.kind() == CanaryKind::Gradient)
}

/// `p` made absolute (against the working directory) and normalised without touching the file
/// system: `.` dropped, `a/..` folded.
fn absolute(p: &Path) -> PathBuf {
    use std::path::Component;
    let joined = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_default().join(p)
    };
    let mut out = PathBuf::new();
    for c in joined.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// `path` as a card records it: relative to the card's folder `card_dir`, so that the card still
/// works after its folder is moved together with (or relative to) the files it names. Falls
/// back to the absolute path when no relative path exists (another drive).
pub fn card_relative(path: &Path, card_dir: &Path) -> String {
    let (p, base) = (absolute(path), absolute(card_dir));
    let pc: Vec<_> = p.components().collect();
    let bc: Vec<_> = base.components().collect();
    let common = pc.iter().zip(&bc).take_while(|(a, b)| a == b).count();
    if common == 0 {
        return p.display().to_string();
    }
    let mut rel = PathBuf::new();
    for _ in common..bc.len() {
        rel.push("..");
    }
    for c in &pc[common..] {
        rel.push(c.as_os_str());
    }
    if rel.as_os_str().is_empty() {
        ".".into()
    } else {
        rel.display().to_string()
    }
}

/// A path recorded in a card (`value` of `field`), resolved: relative to the card's folder first
/// (how this dpaudit writes it), then as written (older cards recorded paths relative to the
/// working directory of the training run, or absolute). When neither exists the error names the
/// card file, the field and both places looked at.
pub fn resolve_card_path(card_path: &Path, field: &str, value: &str) -> Result<PathBuf> {
    let dir = card_path.parent().unwrap_or(Path::new("."));
    let near = dir.join(value);
    if near.exists() {
        return Ok(near);
    }
    let as_written = PathBuf::from(value);
    if as_written.exists() {
        return Ok(as_written);
    }
    Err(Error::field(
        field,
        format!(
            "`{value}` not found: looked for {} (relative to the card's folder) and {} (relative to the working \
             directory); move the file with the card, or give it on the command line",
            near.display(),
            as_written.display()
        ),
    )
    .with_file(card_path))
}

#[cfg(test)]
mod path_tests {
    use super::*;

    #[test]
    fn card_relative_paths() {
        assert_eq!(card_relative(Path::new("/a/b/c.csv"), Path::new("/a/x")), "../b/c.csv");
        assert_eq!(card_relative(Path::new("/a/x/c.csv"), Path::new("/a/x")), "c.csv");
        assert_eq!(card_relative(Path::new("/a/./x/../c.csv"), Path::new("/a")), "c.csv");
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            card_relative(Path::new("fixtures/data/digits.csv.gz"), &cwd.join("out")),
            "../fixtures/data/digits.csv.gz"
        );
    }

    #[test]
    fn resolution_prefers_the_card_folder_and_names_the_field() {
        let d = tempfile::tempdir().unwrap();
        let card = d.path().join("m.toml");
        std::fs::write(d.path().join("x.csv"), "1").unwrap();
        assert_eq!(
            resolve_card_path(&card, "data.file", "x.csv").unwrap(),
            d.path().join("x.csv")
        );
        assert_eq!(
            resolve_card_path(&card, "data.file", "Cargo.toml").unwrap(),
            PathBuf::from("Cargo.toml")
        );
        let e = resolve_card_path(&card, "data.split", "nope.toml").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("data.split"));
        assert_eq!(e.file.as_deref(), Some(card.as_path()));
    }
}
