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
    /// Canaries of a one-run audit (input canaries, or gradient canaries alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canaries: Option<CanaryInfo>,
    /// The gradient canaries of a `--canary-kind both` run (beside the input canaries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gradient_canaries: Option<CanaryInfo>,
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

/// The stem's folder and file name (`models/x` → (`models`, `x`)).
pub fn stem_parts(stem: &Path) -> Result<(PathBuf, String)> {
    let dir = match stem.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = stem
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| !n.is_empty() && !n.starts_with('.'))
        .ok_or_else(|| Error::field("--out", format!("`{}` is not a usable output stem", stem.display())))?;
    Ok((dir, name.to_string()))
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
    let (dir, name) = stem_parts(stem)?;
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
        let schedule = Schedule::new(card.schedule).map_err(|e| e.with_file(&card_path))?;
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
