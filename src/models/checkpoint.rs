//! Checkpoints: `<stem>.safetensors` (the weights, f32) and `<stem>.toml` (the card).
//!
//! The card records what is needed to trust and reproduce a model: architecture and schedule,
//! the data file and its SHA-256, the split manifest and its SHA-256, which part of the split
//! was trained on (and the hash of that index list), seed, steps, the exact command, and for DP
//! runs the mechanism parameters and the ledger file. Loading checks the weights' SHA-256 and that
//! every tensor matches the configured model exactly (name and shape); any mismatch is an error
//! (exit 2), never a silent partial load.

use std::path::{Path, PathBuf};

use candle_core::Device;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

use super::data::{sha256_file, Part};
use super::schedule::ScheduleConfig;
use super::{ModelConfig, Net, Schedule};

/// What the model was trained on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataInfo {
    /// Path of the data file.
    pub file: String,
    /// SHA-256 of the data file.
    pub sha256: String,
    /// Path of the split manifest.
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

/// How it was trained.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingInfo {
    /// Seed of the run.
    pub seed: u64,
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
    /// Denoising loss on fixed held-out draws before training.
    pub eval_loss_before: f64,
    /// The same loss after training.
    pub eval_loss_after: f64,
    /// Checkpoint the run started from (fine-tuning), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<String>,
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
    /// Per-sample gradient method: `ghost` (one pass) or `loop`.
    pub per_sample: String,
    /// Ledger file (an `events::EventFile`) next to the card.
    pub ledger: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// RAPID retrieval settings, when used.
    pub rapid: Option<RapidInfo>,
}

/// The checkpoint card.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Card {
    /// Format version.
    pub schema_version: u32,
    /// Weights file, relative to the card's folder.
    pub weights: String,
    /// SHA-256 of the safetensors file.
    pub weights_sha256: String,
    /// Number of trainable parameters.
    pub parameters: usize,
    /// Architecture.
    pub model: ModelConfig,
    /// Diffusion schedule.
    pub schedule: ScheduleConfig,
    /// Training data and split.
    pub data: DataInfo,
    /// Training settings.
    pub training: TrainingInfo,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// DP-SGD settings (DP runs only).
    pub dp: Option<DpInfo>,
}

/// A loaded checkpoint.
pub struct Checkpoint {
    /// The card.
    pub card: Card,
    /// Path of the card.
    pub card_path: PathBuf,
    /// The network with its weights.
    pub net: Net,
    /// The materialised diffusion schedule.
    pub schedule: Schedule,
}

/// `<stem>.toml` for `path` given as the card, the weights, or the stem.
pub fn card_path(path: &Path) -> PathBuf {
    match path.extension().and_then(|e| e.to_str()) {
        Some("toml") => path.to_path_buf(),
        Some("safetensors") => path.with_extension("toml"),
        _ => PathBuf::from(format!("{}.toml", path.display())),
    }
}

/// Writes `<stem>.safetensors` and `<stem>.toml`; fills in the weights file name and hash.
pub fn save(stem: &Path, net: &Net, card: &mut Card) -> Result<PathBuf> {
    let weights = PathBuf::from(format!("{}.safetensors", stem.display()));
    let card_file = PathBuf::from(format!("{}.toml", stem.display()));
    if let Some(dir) = weights.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, &e))?;
    }
    let tensors = net.params.tensors();
    // Atomic: written to a temporary file in the same folder, synced, then renamed.
    let dir = match weights.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let tmp = tempfile::Builder::new()
        .prefix(".dpaudit-tmp-")
        .suffix(".safetensors")
        .tempfile_in(dir)
        .map_err(|e| Error::io(dir, &e))?;
    candle_core::safetensors::save(&tensors, tmp.path())
        .map_err(|e| Error::model(e.to_string()).with_file(&weights))?;
    tmp.as_file().sync_all().map_err(|e| Error::io(&weights, &e))?;
    tmp.persist(&weights).map_err(|e| Error::io(&weights, &e.error))?;
    card.weights = weights.file_name().unwrap().to_string_lossy().into_owned();
    card.weights_sha256 = sha256_file(&weights)?;
    card.parameters = net.params.count();
    let body = toml::to_string(card).map_err(|e| Error::input(e.to_string()))?;
    let text =
        format!("# dpaudit checkpoint card: weights, model, data/split hashes and the command that made them.\n{body}");
    crate::report::output::write_atomic(&card_file, text.as_bytes(), true)?;
    Ok(card_file)
}

impl Checkpoint {
    /// Loads a checkpoint from its card (or weights file, or stem) onto `device`.
    pub fn load(path: &Path, device: &Device) -> Result<Self> {
        let card_path = card_path(path);
        let card: Card = crate::error::load_toml(&card_path)?;
        if card.schema_version != 1 {
            return Err(Error::field(
                "schema_version",
                format!(
                    "unsupported schema_version {} (this dpaudit reads 1)",
                    card.schema_version
                ),
            )
            .with_file(&card_path));
        }
        let dir = card_path.parent().unwrap_or(Path::new("."));
        let weights = dir.join(&card.weights);
        let sha = sha256_file(&weights)?;
        if sha != card.weights_sha256 {
            return Err(Error::field(
                "weights_sha256",
                format!(
                    "{} has SHA-256 {sha}, the card says {}",
                    weights.display(),
                    card.weights_sha256
                ),
            )
            .with_file(&card_path));
        }
        card.model.validate().map_err(|e| e.with_file(&card_path))?;
        let schedule = Schedule::new(card.schedule).map_err(|e| e.with_file(&card_path))?;
        let net = Net::new(&card.model, 0, device).map_err(|e| e.with_file(&card_path))?;
        let tensors = candle_core::safetensors::load(&weights, device)
            .map_err(|e| Error::model(format!("cannot read safetensors: {e}")).with_file(&weights))?;
        net.params.assign(&tensors).map_err(|e| e.with_file(&card_path))?;
        if net.params.count() != card.parameters {
            return Err(Error::field(
                "parameters",
                format!(
                    "card says {} parameters, the model has {}",
                    card.parameters,
                    net.params.count()
                ),
            )
            .with_file(&card_path));
        }
        Ok(Checkpoint {
            card,
            card_path,
            net,
            schedule,
        })
    }

    /// The card's folder (paths in the card are relative to it or to the working directory).
    pub fn dir(&self) -> &Path {
        self.card_path.parent().unwrap_or(Path::new("."))
    }
}
