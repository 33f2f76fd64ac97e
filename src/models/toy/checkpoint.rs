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

use super::{ModelConfig, Net};
use crate::data::digits::sha256_file;
use crate::diffusion::schedule::table::{TrainingSchedule, TrainingScheduleConfig};
use crate::models::canary::Canaries;
use crate::models::card::{
    resolve_card_path, white_box_canaries, CanaryInfo, CanaryKind, DataInfo, DpInfo, TrainingInfo,
};

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
    pub schedule: TrainingScheduleConfig,
    /// Training data and split.
    pub data: DataInfo,
    /// Training settings.
    pub training: TrainingInfo,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// DP-SGD settings (DP runs only).
    pub dp: Option<DpInfo>,
    /// Canaries of a one-run audit (input canaries, or gradient canaries alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canaries: Option<CanaryInfo>,
    /// The gradient canaries of a `--canary-kind both` run (beside the input canaries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gradient_canaries: Option<CanaryInfo>,
}

impl Card {
    /// The white-box gradient canaries (with their observations) the card names, if any.
    pub fn white_box_canaries(&self) -> Option<&CanaryInfo> {
        white_box_canaries(self.canaries.as_ref(), self.gradient_canaries.as_ref())
    }

    /// The input canaries (scored black-box) the card names, if any.
    pub fn input_canaries(&self) -> Option<&CanaryInfo> {
        self.canaries.as_ref().filter(|i| i.kind() == CanaryKind::Input)
    }
}

/// The card schema written by this dpaudit (1 is still read).
pub const CARD_SCHEMA: u32 = 2;

/// A loaded checkpoint.
pub struct Checkpoint {
    /// The card.
    pub card: Card,
    /// Path of the card.
    pub card_path: PathBuf,
    /// The network with its weights.
    pub net: Net,
    /// The materialised diffusion schedule.
    pub schedule: TrainingSchedule,
}

/// `<stem>.toml` for `path` given as the card, the weights, or the stem.
pub fn card_path(path: &Path) -> PathBuf {
    match path.extension().and_then(|e| e.to_str()) {
        Some("toml") => path.to_path_buf(),
        Some("safetensors") => path.with_extension("toml"),
        _ => PathBuf::from(format!("{}.toml", path.display())),
    }
}

/// The safetensors bytes of `net`'s weights.
pub fn weights_bytes(net: &Net) -> Result<Vec<u8>> {
    let tensors = net.params.tensors();
    let tmp = tempfile::Builder::new()
        .prefix(".dpaudit-tmp-")
        .suffix(".safetensors")
        .tempfile()
        .map_err(|e| Error::io(&std::env::temp_dir(), &e))?;
    candle_core::safetensors::save(&tensors, tmp.path()).map_err(|e| Error::model(e.to_string()))?;
    std::fs::read(tmp.path()).map_err(|e| Error::io(tmp.path(), &e))
}

/// Fills the card's weights fields from `weights` (the safetensors bytes) for `stem`.
pub fn describe_weights(stem_name: &str, weights: &[u8], net: &Net, card: &mut Card) {
    card.weights = format!("{stem_name}.safetensors");
    card.weights_sha256 = crate::report::sha256_hex(weights);
    card.parameters = net.params.count();
}

/// The card's file bytes.
pub fn card_bytes(card: &Card) -> Result<Vec<u8>> {
    let body = toml::to_string(card).map_err(|e| Error::input(e.to_string()))?;
    Ok(
        format!("# dpaudit checkpoint card: weights, model, data/split hashes and the command that made them.\n{body}")
            .into_bytes(),
    )
}

/// Writes `<stem>.safetensors` and `<stem>.toml` as one output set (both appear at once; see
/// [`crate::report::output::commit_set`]), replacing an earlier pair; fills in the weights file
/// name and hash.
pub fn save(stem: &Path, net: &Net, card: &mut Card) -> Result<PathBuf> {
    let (dir, name) = crate::models::train::stem_parts(stem)?;
    crate::report::output::create_out_dir(&dir)?;
    let weights = weights_bytes(net)?;
    describe_weights(&name, &weights, net, card);
    let files = vec![
        (card.weights.clone(), weights),
        (format!("{name}.toml"), card_bytes(card)?),
    ];
    let written = crate::report::output::commit_set(&dir, Some(&name), &files, true)?;
    Ok(written[1].clone())
}

/// Reads a safetensors file of model weights (size checked against the memory cap first),
/// see [`parse_weights`].
pub fn read_weights(path: &Path, device: &Device) -> Result<std::collections::HashMap<String, candle_core::Tensor>> {
    let bytes = crate::limits::read_file_capped(path, "weights", crate::limits::Cost::new(2.0, 1.0))?;
    parse_weights(&bytes, device).map_err(|e| e.with_file(path))
}

/// Parses safetensors bytes into named tensors. Every tensor must be F32 (what dpaudit's
/// models hold: another dtype is refused, never cast silently) and every value finite (NaN or
/// infinite weights are refused: they would train or score to NaN).
pub fn parse_weights(bytes: &[u8], device: &Device) -> Result<std::collections::HashMap<String, candle_core::Tensor>> {
    let tensors = candle_core::safetensors::load_buffer(bytes, device)
        .map_err(|e| Error::model(format!("cannot read safetensors: {e}")))?;
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    for name in names {
        let t = &tensors[name];
        if t.dtype() != candle_core::DType::F32 {
            return Err(Error::model(format!(
                "tensor `{name}` has dtype {}; dpaudit weights are f32 (convert the checkpoint, e.g. with \
                 `tensor.float()` in PyTorch, rather than have it cast silently)",
                t.dtype().as_str()
            )));
        }
        let values = t.flatten_all()?.to_vec1::<f32>()?;
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(Error::model(format!(
                "tensor `{name}` holds a non-finite value ({}) at flat index {i}: the weights are corrupt \
                 (a diverged training run?)",
                values[i]
            )));
        }
    }
    Ok(tensors)
}

impl Checkpoint {
    /// Loads a checkpoint from its card (or weights file, or stem) onto `device`.
    pub fn load(path: &Path, device: &Device) -> Result<Self> {
        let card_path = card_path(path);
        let card: Card = crate::input::load_toml(&card_path)?;
        if !(1..=CARD_SCHEMA).contains(&card.schema_version) {
            return Err(Error::field(
                "schema_version",
                format!(
                    "unsupported schema_version {} (this dpaudit reads 1 and 2)",
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
        if let Some(dp) = &card.dp {
            if let Some(want) = &dp.ledger_sha256 {
                let ledger = dir.join(&dp.ledger);
                let got = sha256_file(&ledger).ok();
                if got.as_deref() != Some(want.as_str()) {
                    return Err(Error::field(
                        "dp.ledger_sha256",
                        format!(
                            "the card's DP ledger {} {}, the card says {want}: the card and its ledger disagree (ε and steps would be wrong)",
                            ledger.display(),
                            got.map_or_else(|| "is missing".to_string(), |g| format!("has SHA-256 {g}"))
                        ),
                    )
                    .with_file(&card_path));
                }
            }
        }
        card.model.validate().map_err(|e| e.with_file(&card_path))?;
        let schedule = TrainingSchedule::new(card.schedule).map_err(|e| e.with_file(&card_path))?;
        let net = Net::new(&card.model, 0, device).map_err(|e| e.with_file(&card_path))?;
        let tensors = read_weights(&weights, device)?;
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

    /// The data file the card records (`data.file`), see [`resolve_card_path`].
    pub fn data_file(&self) -> Result<PathBuf> {
        resolve_card_path(&self.card_path, "data.file", &self.card.data.file)
    }

    /// The split manifest the card records (`data.split`), see [`resolve_card_path`].
    pub fn split_file(&self) -> Result<PathBuf> {
        resolve_card_path(&self.card_path, "data.split", &self.card.data.split)
    }
}

/// The canaries of an 8×8 checkpoint (the card type is this module's; the canaries file is
/// [`crate::models::canary`]'s).
impl Canaries {
    /// The canaries of a checkpoint trained with `--canaries` (hash checked against the card).
    pub fn of_checkpoint(ck: &Checkpoint) -> Result<Self> {
        let info = ck.card.canaries.as_ref().ok_or_else(|| {
            Error::input("this checkpoint was trained without canaries (train with --canaries m for --audit one-run)")
                .with_file(&ck.card_path)
        })?;
        if info.kind() == CanaryKind::Gradient {
            return Err(Error::field(
                "canaries.kind",
                "these are gradient canaries: they have no records to attack; `mia --audit one-run` audits them from their observations (white-box)",
            )
            .with_file(&ck.card_path));
        }
        Self::of_info(info, ck.dir(), &ck.card_path)
    }
}
