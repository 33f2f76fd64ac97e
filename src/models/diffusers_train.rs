//! `dpaudit train --unet`: train a diffusers `UNet2DModel` (any `config.json` the loader reads,
//! or a named preset) on an image data set, without privacy or with DP-SGD as Opacus runs it,
//! and write a diffusers folder that `UNet2DModel.from_pretrained` loads unchanged
//! (`config.json`, `diffusion_pytorch_model.safetensors`, `scheduler_config.json`) with the
//! dpaudit card (`dpaudit-card.toml`), the ledger (`dpaudit-ledger.toml`, DP runs) and the
//! `training.json` record `mia` checks the split against.
//!
//! DP-SGD (Abadi et al. 2016, Algorithm 1, in Opacus' form): each step draws a Poisson sample
//! of the private rows (each independently with probability q), computes every sample's
//! gradient, clips it by Opacus' factor min(1, C/(‖g‖ + 10⁻⁶)), adds N(0, σ²C² I) to the sum and
//! divides by the expected batch size q·n ([`super::dp::release`]), then takes an Adam step. On
//! the CPU the per-sample gradients come from the hand-written pass of one sample at a time
//! ([`super::unet2d::grad_cpu`], samples in parallel); on CUDA, with `--per-sample loop` and for
//! architectures that pass does not cover, from candle's batched pass ([`super::unet2d::train`])
//! in chunks of `--batch-size` rows (memory only, like Opacus' `BatchMemoryManager`; the
//! released update is the same). The non-private path takes the gradient of the mean loss from
//! the same two sources. Each step is one `PoissonSampled { q, Gaussian { σ } }` event
//! under add/remove-one neighbours; the ledger records the steps that ran. Sampling, the
//! examples' (t, ε) and the noise come from the OS-keyed ChaCha20 CSPRNG
//! ([`super::dp::secret_rng`]) unless `--seed` is given.
//!
//! `--canaries m` adds m random ±1 images, each to the private rows with probability ½
//! ([`super::canary`]; Steinke, Nasr & Jagielski 2023, Algorithm 1), and writes them with their
//! inclusion bits to `canaries.csv` for `mia --audit one-run`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use rand::{Rng, SeedableRng, TryRngCore};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::canary::{Canaries, CanaryKind, GradientCanaries, WhiteBoxRecorder, GRADIENT_CANARY_NORM};
use super::card::{CanaryInfo, DataInfo, DpInfo, TrainingInfo, RANDOMNESS_OS, RANDOMNESS_SEEDED};
use super::diffusers::{read_weights, unet_dir, WEIGHTS};
use super::dp::normals;
use super::unet2d::grad_cpu::{unsupported, CpuGrad};
use super::unet2d::train::{clip_and_sum, TrainUnet};
use super::unet2d::{Unet2dConfig, Unet2dModel, WeightStore};
use crate::data::digits::{indices_sha256, sha256_file, sha256_hex, Part};
use crate::data::images::ImageSet;
use crate::data::SplitManifest;
use crate::diffusion::schedule::diffusers::SchedulerConfig;
use crate::diffusion::schedule::table::noisy;
use crate::diffusion::schedule::table::TrainingSchedule;
use crate::error::{Error, Result};
use crate::events::{DpEvent, EventBuilder, EventFile, Neighbouring};
use crate::report::export::fmt_num;

pub use super::folder::{CANARIES, CARD, GRADIENT_CANARIES, LEDGER, OBSERVATIONS, SCHEDULER, TRAINING};

pub use super::folder::{folder_files, folder_ledger};

/// The data file and split manifest a folder's card records (paths relative to the card, as
/// [`super::card::resolve_card_path`] reads them, shown without `dir/../`), each checked
/// against the SHA-256 the card records; `None` when the folder has no card. What `mia` uses when
/// `--data` and `--split` are not given.
pub fn card_data(unet_dir: &Path) -> Result<Option<(PathBuf, PathBuf)>> {
    let Some(card) = UnetCard::load(unet_dir)? else {
        return Ok(None);
    };
    let card_path = unet_dir.join(CARD);
    let mut out = Vec::new();
    for (field, value, sha) in [
        ("data.file", &card.data.file, &card.data.sha256),
        ("data.split", &card.data.split, &card.data.split_sha256),
    ] {
        let p = lexical(&super::card::resolve_card_path(&card_path, field, value)?);
        let got = sha256_file(&p)?;
        if &got != sha {
            return Err(Error::field(
                field,
                format!(
                    "{} has SHA-256 {got}, the card records {sha}: not the file this folder was trained with",
                    p.display()
                ),
            )
            .with_file(&card_path));
        }
        out.push(p);
    }
    let split = out.pop().expect("two paths");
    Ok(Some((out.pop().expect("two paths"), split)))
}

/// `p` with `name/..` pairs removed (lexically: a path the user can read, the same file unless a
/// symbolic link is crossed, which the SHA-256 check above catches).
pub fn lexical(p: &Path) -> PathBuf {
    use std::path::Component;
    let mut out: Vec<Component> = Vec::new();
    for c in p.components() {
        match (c, out.last()) {
            (Component::CurDir, _) => {}
            (Component::ParentDir, Some(Component::Normal(_))) => {
                out.pop();
            }
            _ => out.push(c),
        }
    }
    if out.is_empty() {
        PathBuf::from(".")
    } else {
        out.iter().collect()
    }
}

/// Named architectures: (name, config.json text, description).
pub const PRESETS: &[(&str, &str, &str)] = &[
    (
        "tiny",
        TINY,
        "28×28×1, blocks [8, 16], attention in the second block and the mid block (CI size)",
    ),
    (
        "mnist-ddpm",
        MNIST_DDPM,
        "28×28×1, blocks [16, 32]: the architecture of models/mnist-ddpm (176k parameters)",
    ),
    (
        "ddpm-cifar10",
        DDPM_CIFAR10,
        "32×32×3, blocks [128, 256, 256, 256], attention at 16×16: google/ddpm-cifar10-32's architecture (35.7M parameters)",
    ),
];

const TINY: &str = r#"{
  "_class_name": "UNet2DModel",
  "_diffusers_version": "0.42.1",
  "act_fn": "silu",
  "add_attention": true,
  "attention_head_dim": 4,
  "attn_norm_num_groups": null,
  "block_out_channels": [8, 16],
  "center_input_sample": false,
  "class_embed_type": null,
  "down_block_types": ["DownBlock2D", "AttnDownBlock2D"],
  "downsample_padding": 1,
  "downsample_type": "conv",
  "dropout": 0.0,
  "flip_sin_to_cos": true,
  "freq_shift": 0,
  "in_channels": 1,
  "layers_per_block": 1,
  "mid_block_scale_factor": 1,
  "mid_block_type": "UNetMidBlock2D",
  "norm_eps": 1e-05,
  "norm_num_groups": 4,
  "num_class_embeds": null,
  "num_train_timesteps": null,
  "out_channels": 1,
  "resnet_time_scale_shift": "default",
  "sample_size": 28,
  "time_embedding_dim": null,
  "time_embedding_type": "positional",
  "up_block_types": ["AttnUpBlock2D", "UpBlock2D"],
  "upsample_type": "conv"
}
"#;

/// The UNet of Ho et al. (2020) for CIFAR-10 as diffusers ships it (google/ddpm-cifar10-32's
/// config.json): 35.7M parameters.
const DDPM_CIFAR10: &str = r#"{
  "_class_name": "UNet2DModel",
  "_diffusers_version": "0.42.1",
  "act_fn": "silu",
  "add_attention": true,
  "attention_head_dim": null,
  "attn_norm_num_groups": null,
  "block_out_channels": [128, 256, 256, 256],
  "center_input_sample": false,
  "class_embed_type": null,
  "down_block_types": ["DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"],
  "downsample_padding": 0,
  "downsample_type": "conv",
  "dropout": 0.0,
  "flip_sin_to_cos": false,
  "freq_shift": 1,
  "in_channels": 3,
  "layers_per_block": 2,
  "mid_block_scale_factor": 1,
  "mid_block_type": "UNetMidBlock2D",
  "norm_eps": 1e-06,
  "norm_num_groups": 32,
  "num_class_embeds": null,
  "num_train_timesteps": null,
  "out_channels": 3,
  "resnet_time_scale_shift": "default",
  "sample_size": 32,
  "time_embedding_dim": null,
  "time_embedding_type": "positional",
  "up_block_types": ["UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"],
  "upsample_type": "conv"
}
"#;

/// The architecture of the shipped `models/mnist-ddpm` (its own config.json, so the two cannot drift).
const MNIST_DDPM: &str = include_str!("../../models/mnist-ddpm/config.json");

/// The config.json text of a preset name, or of the file at that path.
pub fn config_text(spec: impl AsRef<std::ffi::OsStr>) -> Result<(String, String)> {
    let spec = spec.as_ref();
    if let Some((name, text, _)) = PRESETS.iter().find(|(n, _, _)| spec.to_str() == Some(*n)) {
        return Ok((text.to_string(), format!("preset `{name}`")));
    }
    let p = Path::new(spec);
    let p = if p.is_dir() {
        p.join("config.json")
    } else {
        p.to_path_buf()
    };
    if !p.is_file() {
        let names: Vec<&str> = PRESETS.iter().map(|p| p.0).collect();
        return Err(Error::field(
            "--unet",
            format!(
                "`{}` is neither a preset ({}) nor a config.json file",
                spec.to_string_lossy(),
                names.join(", ")
            ),
        ));
    }
    Ok((crate::input::read_to_string(&p)?, p.display().to_string()))
}

/// A diffusers `DDPMScheduler` config for the linear β schedule (T, β₁, β_T), ε-prediction.
pub fn scheduler_json(timesteps: usize, beta_start: f64, beta_end: f64) -> String {
    let v = serde_json::json!({
        "_class_name": "DDPMScheduler",
        "_diffusers_version": "0.42.1",
        "beta_end": beta_end,
        "beta_schedule": "linear",
        "beta_start": beta_start,
        "clip_sample": true,
        "clip_sample_range": 1.0,
        "num_train_timesteps": timesteps,
        "prediction_type": "epsilon",
        "steps_offset": 0,
        "thresholding": false,
        "timestep_spacing": "leading",
        "trained_betas": null,
        "variance_type": "fixed_small"
    });
    serde_json::to_string_pretty(&v).expect("plain JSON") + "\n"
}

/// The card of a trained diffusers folder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnetCard {
    /// Card schema.
    pub schema_version: u32,
    /// `diffusers UNet2DModel`.
    pub format: String,
    /// One-line architecture.
    pub architecture: String,
    /// Where the config came from (a preset or a file).
    pub config_source: String,
    /// SHA-256 of `config.json`.
    pub config_sha256: String,
    /// SHA-256 of the weights file.
    pub weights_sha256: String,
    /// SHA-256 of `scheduler_config.json`.
    pub scheduler_sha256: String,
    /// Trainable parameters.
    pub parameters: usize,
    /// Diffusion steps T.
    pub timesteps: usize,
    /// β₁.
    pub beta_start: f64,
    /// β_T.
    pub beta_end: f64,
    /// Data and split.
    pub data: DataInfo,
    /// How it was trained.
    pub training: TrainingInfo,
    /// DP-SGD settings and the ε spent (DP runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp: Option<DpInfo>,
    /// The canaries file of a `--canaries m` run (input canaries, or gradient canaries alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canaries: Option<CanaryInfo>,
    /// The gradient canaries of a `--canary-kind both` run (beside the input canaries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gradient_canaries: Option<CanaryInfo>,
}

impl UnetCard {
    /// Reads the card of a folder (None when the folder has none).
    pub fn load(dir: &Path) -> Result<Option<Self>> {
        let p = dir.join(CARD);
        if !p.is_file() {
            return Ok(None);
        }
        let text = crate::input::read_to_string(&p)?;
        toml::from_str(&text)
            .map(Some)
            .map_err(|e| Error::input(format!("not a dpaudit card: {}", e.message())).with_file(&p))
    }

    /// The card file's text: a one-line header, then the card as TOML.
    pub fn text(&self) -> Result<String> {
        Ok(format!(
            "# dpaudit card of a diffusers UNet2DModel folder: architecture, data/split hashes, training settings, the command, for DP runs the ε spent.\n{}",
            toml::to_string(self).map_err(|e| Error::input(e.to_string()))?
        ))
    }

    /// The white-box gradient canaries (with their observations) the card names, if any.
    pub fn white_box_canaries(&self) -> Option<&CanaryInfo> {
        super::card::white_box_canaries(self.canaries.as_ref(), self.gradient_canaries.as_ref())
    }

    /// The input canaries (scored black-box) the card names, if any.
    pub fn input_canaries(&self) -> Option<&CanaryInfo> {
        self.canaries.as_ref().filter(|i| i.kind() == CanaryKind::Input)
    }

    /// The canaries of the folder `dir` whose card this is (hash and count checked).
    pub fn canaries(&self, dir: &Path) -> Result<Canaries> {
        let info = self.input_canaries().ok_or_else(|| {
            Error::input("this folder was trained without canaries (train --unet … --canaries m for --audit one-run)")
                .with_file(dir.join(CARD))
        })?;
        Canaries::of_info(info, dir, &dir.join(CARD))
    }
}

/// DP-SGD settings.
#[derive(Debug, Clone, Copy)]
pub struct UnetDpPlan {
    /// σ.
    pub noise_multiplier: f64,
    /// C.
    pub clip: f64,
    /// q.
    pub sample_rate: f64,
    /// δ of the ε the card records.
    pub delta: f64,
    /// One backward pass per sample instead of the batched pass (the reference; slow).
    pub per_sample_loop: bool,
}

/// Everything a `train --unet` run needs.
#[derive(Debug, Clone)]
pub struct UnetTrainPlan {
    /// Image data (MNIST `.u8.gz`, `.npy`, PNG folder).
    pub data: PathBuf,
    /// Split manifest.
    pub split: PathBuf,
    /// Part trained on (the private rows).
    pub on: Part,
    /// `--unet`: a preset name or a config.json path, as the OS gave it (need not be UTF-8;
    /// ignored with `init`: its config wins).
    pub unet: std::ffi::OsString,
    /// Start from this diffusers folder's weights.
    pub init: Option<PathBuf>,
    /// Output folder.
    pub out: PathBuf,
    /// T.
    pub timesteps: usize,
    /// β₁.
    pub beta_start: f64,
    /// β_T.
    pub beta_end: f64,
    /// Optimiser steps.
    pub steps: usize,
    /// Batch size (non-DP); rows per per-sample-gradient chunk (DP, candle's batched pass).
    pub batch_size: usize,
    /// Adam learning rate.
    pub lr: f64,
    /// EMA decay.
    pub ema: f64,
    /// Lowest step trained.
    pub t_min: usize,
    /// Highest step trained (default T − 1).
    pub t_max: Option<usize>,
    /// Input canaries (±1 images, audited black-box) for a one-run audit (0: none).
    pub canaries: usize,
    /// Gradient canaries (white-box, DP only; 0: none). With input canaries too, both audits
    /// measure the same training.
    pub gradient_canaries: usize,
    /// `--seed` (None: the OS CSPRNG).
    pub seed: Option<u64>,
    /// DP-SGD.
    pub dp: Option<UnetDpPlan>,
    /// The device to train on (`--device`; selected by `audit::train`, recorded in the card).
    pub device: crate::models::DeviceChoice,
    /// The command line recorded in the card.
    pub command: String,
    /// No progress bar.
    pub quiet: bool,
    /// Replace an earlier run's files.
    pub force: bool,
    /// Rewrite `OUT/checkpoint/` every this many steps (None: no periodic checkpoints).
    pub checkpoint_every: Option<usize>,
    /// Sign every released set with this key (`--sign-key`, [`crate::provenance`]).
    pub sign_key: Option<ed25519_dalek::SigningKey>,
}

pub use super::folder::RELEASED;

/// `files` with the signature of `key` added (the signature is part of the same set).
fn signed(
    mut files: Vec<(String, Vec<u8>)>,
    key: Option<&ed25519_dalek::SigningKey>,
) -> Result<Vec<(String, Vec<u8>)>> {
    if let Some(k) = key {
        let sig = crate::provenance::sign_set(&files, k)?;
        files.push(sig);
    }
    Ok(files)
}

/// What a run wrote and spent.
#[derive(Debug, Clone)]
pub struct UnetTrainOutcome {
    /// The output folder.
    pub dir: PathBuf,
    /// The card.
    pub card: UnetCard,
    /// The whole ledger (DP runs).
    pub event: Option<DpEvent>,
    /// Lines for the user (stdout).
    pub lines: Vec<String>,
}

/// The files a run writes into its folder.
pub fn output_files(dp: bool, canaries: bool, gradient: bool, both: bool) -> Vec<&'static str> {
    let mut v = vec!["config.json", WEIGHTS, SCHEDULER, CARD, TRAINING];
    if dp {
        v.push(LEDGER);
    }
    if canaries || gradient {
        v.push(CANARIES);
    }
    if gradient {
        v.push(OBSERVATIONS);
    }
    if both {
        v.push(GRADIENT_CANARIES);
    }
    v
}

/// Exponential moving average of the parameters, as [`super::toy::train::Ema`]: updated every 10
/// steps with decay d¹⁰ and warm-up min(d, (1 + n)/(10 + n)).
struct Ema {
    decay: f64,
    shadow: Vec<Tensor>,
    step: usize,
}

impl Ema {
    const EVERY: usize = 10;
    fn new(m: &TrainUnet, decay: f64) -> Result<Self> {
        let shadow = m
            .vars()
            .iter()
            .map(|v| v.as_tensor().copy())
            .collect::<candle_core::Result<_>>()?;
        Ok(Ema { decay, shadow, step: 0 })
    }
    fn update(&mut self, m: &TrainUnet) -> Result<()> {
        self.step += 1;
        if self.decay == 0.0 || !self.step.is_multiple_of(Self::EVERY) {
            return Ok(());
        }
        self.fold(m, Self::EVERY)
    }
    /// Folds the current weights in for the last `k` steps.
    fn fold(&mut self, m: &TrainUnet, k: usize) -> Result<()> {
        self.shadow = self.folded(m, k)?;
        Ok(())
    }
    /// The average with the current weights folded in for the last `k` steps, the average
    /// itself unchanged.
    fn folded(&self, m: &TrainUnet, k: usize) -> Result<Vec<Tensor>> {
        let n = self.step as f64;
        let d = self.decay.min((1.0 + n) / (10.0 + n)).powi(k as i32);
        self.shadow
            .iter()
            .zip(m.vars())
            .map(|(s, v)| Ok(((s * d)? + (v.as_tensor().detach() * (1.0 - d))?)?))
            .collect()
    }
    /// The average as [`Ema::apply`] would write it now, without changing the average.
    fn snapshot(&self, m: &TrainUnet) -> Result<Vec<Tensor>> {
        if self.decay == 0.0 {
            return m.vars().iter().map(|v| Ok(v.as_tensor().copy()?)).collect();
        }
        match self.step % Self::EVERY {
            0 => Ok(self.shadow.clone()),
            pending => self.folded(m, pending),
        }
    }
    /// Writes the average into the model, first folding in the steps since the last update
    /// (a run shorter than 10 steps would otherwise release its initial weights).
    fn apply(&mut self, m: &TrainUnet) -> Result<()> {
        if self.decay == 0.0 {
            return Ok(());
        }
        let pending = self.step % Self::EVERY;
        if pending > 0 {
            self.fold(m, pending)?;
        }
        for (s, v) in self.shadow.iter().zip(m.vars()) {
            v.set(s)?;
        }
        Ok(())
    }
}

/// Progress for logs: when stderr is not a terminal (where the bar is not drawn) and the run is
/// not quiet, one line every 5 % of the steps with the elapsed time and the ETA, so a long run
/// in the background (e.g. `scripts/train_mnist_dp_ddpm.sh`) shows how far it is.
struct LogProgress {
    start: std::time::Instant,
    total: usize,
    every: usize,
    on: bool,
}

impl LogProgress {
    fn new(total: usize, quiet: bool) -> Self {
        use std::io::IsTerminal;
        LogProgress {
            start: std::time::Instant::now(),
            total,
            every: total.div_ceil(20).max(1),
            on: !quiet && !crate::report::progress::is_quiet() && !std::io::stderr().is_terminal(),
        }
    }
    /// After step `done` (1-based).
    fn step(&self, done: usize) {
        if !self.on || !(done.is_multiple_of(self.every) || done == self.total) {
            return;
        }
        let el = self.start.elapsed().as_secs_f64();
        let eta = el / done as f64 * (self.total - done) as f64;
        eprintln!("step {done}/{}: elapsed {:.0} s, ETA {:.0} s", self.total, el, eta);
    }
}

/// Mean denoising loss on `rows` with one fixed (t, ε) draw per row from `seed`.
fn eval_loss(
    m: &TrainUnet,
    schedule: &TrainingSchedule,
    rows: &[f32],
    shape: [usize; 3],
    t_range: (usize, usize),
    seed: u64,
) -> Result<f64> {
    let d: usize = shape.iter().product();
    let n = rows.len() / d;
    if n == 0 {
        return Ok(f64::NAN);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xe7a1);
    let t: Vec<usize> = (0..n).map(|_| rng.random_range(t_range.0..=t_range.1)).collect();
    let eps = normals(&mut rng, n * d);
    let xt = noisy(schedule, rows, &t, &eps);
    let mut total = 0.0;
    if m.device().is_cpu() {
        // On the CPU through the inference UNet's batch-parallel forward (`unet2d/cpu/forward.rs`), built
        // from the current weights: the same function as candle's forward of `m` (equal to 1e-5,
        // `saved_weights_load_into_the_inference_unet_with_equal_outputs`) at a fraction of its
        // time, which a short run otherwise spends mostly here.
        let store = WeightStore::new(m.tensors()?, Path::new("(the weights being trained)"));
        let inf = Unet2dModel::new(&m.config, &store)?;
        for s in (0..n).step_by(64) {
            let k = 64.min(n - s);
            let tf: Vec<f64> = t[s..s + k].iter().map(|&v| v as f64).collect();
            let pred = inf.forward_host(&xt[s * d..(s + k) * d], [k, shape[0], shape[1], shape[2]], &tf)?;
            for (p, e) in pred.chunks_exact(d).zip(eps[s * d..(s + k) * d].chunks_exact(d)) {
                let se: f64 = p.iter().zip(e).map(|(&a, &b)| ((a - b) as f64).powi(2)).sum();
                total += se / d as f64;
            }
        }
        return Ok(total / n as f64);
    }
    for s in (0..n).step_by(32) {
        let k = 32.min(n - s);
        let x = Tensor::from_slice(&xt[s * d..(s + k) * d], (k, shape[0], shape[1], shape[2]), m.device())?;
        let e = Tensor::from_slice(&eps[s * d..(s + k) * d], (k, shape[0], shape[1], shape[2]), m.device())?;
        let tf: Vec<f64> = t[s..s + k].iter().map(|&v| v as f64).collect();
        let l: Vec<f32> = m.per_sample_loss(&x, &tf, &e)?.detach().to_vec1()?;
        total += l.iter().map(|&v| v as f64).sum::<f64>();
    }
    Ok(total / n as f64)
}

fn check_plan(plan: &UnetTrainPlan, t_len: usize) -> Result<usize> {
    if plan.steps == 0 {
        return Err(Error::field("--steps", "must be ≥ 1"));
    }
    if plan.batch_size == 0 {
        return Err(Error::field("--batch-size", "must be ≥ 1"));
    }
    crate::limits::check_count("--batch-size", plan.batch_size as u64, crate::limits::BATCH_ROW)?;
    if !(plan.lr > 0.0 && plan.lr.is_finite()) {
        return Err(Error::field("--lr", format!("must be > 0, got {}", plan.lr)));
    }
    if !(0.0..1.0).contains(&plan.ema) {
        return Err(Error::field("--ema", format!("must be in [0, 1), got {}", plan.ema)));
    }
    let t_max = plan.t_max.unwrap_or(t_len - 1);
    if plan.t_min > t_max || t_max >= t_len {
        return Err(Error::field(
            "--t-max",
            format!("need t_min ≤ t_max < T = {t_len}, got {}..={t_max}", plan.t_min),
        ));
    }
    if let Some(d) = &plan.dp {
        if !(d.noise_multiplier > 0.0 && d.noise_multiplier.is_finite()) {
            return Err(Error::field("--noise-multiplier", "must be a finite number > 0"));
        }
        if !(d.clip > 0.0 && d.clip.is_finite()) {
            return Err(Error::field("--clip", "must be a finite number > 0"));
        }
        if !(d.sample_rate > 0.0 && d.sample_rate <= 1.0) {
            return Err(Error::field("--sample-rate", "must be in (0, 1]"));
        }
        if !(d.delta > 0.0 && d.delta < 1.0) {
            return Err(Error::field("--delta", "must be in (0, 1)"));
        }
    }
    Ok(t_max)
}

/// Whether the folder `dir` (without a ledger) was trained by dpaudit from random weights on
/// exactly the public rows of this split and data (its card's split, data and trained-rows
/// hashes, no `--init`, no canaries): such weights are a function of rows disjoint from every
/// private row, so a DP run may start from them at no privacy cost to the private rows (public
/// pretraining, then DP fine-tuning), and whose weights and config are the files its card
/// hashed. Returns the reason it qualifies, or None.
fn public_only(dir: &Path, images: &ImageSet, split: &SplitManifest, split_path: &Path) -> Result<Option<String>> {
    let Some(card) = UnetCard::load(dir)? else {
        return Ok(None);
    };
    let d = &card.data;
    // The card speaks for these files only if they are the ones it hashed.
    let files_match = sha256_file(&dir.join(WEIGHTS))? == card.weights_sha256
        && sha256_file(&dir.join("config.json"))? == card.config_sha256;
    let ok = files_match
        && d.trained_on == Part::Public
        && d.sha256 == images.sha256
        && d.split_sha256 == sha256_file(split_path)?
        && d.rows_sha256 == indices_sha256(&split.public)
        && card.training.init.is_none()
        && card.canaries.is_none()
        && card.gradient_canaries.is_none()
        && card.dp.is_none();
    Ok(ok.then(|| {
        format!(
            "trained from scratch on this split's {} public rows only (its card's hashes match): no ledger to compose; the private rows' ledger starts here",
            split.public.len()
        )
    }))
}

/// Runs the plan on `device` (described as `device_name` in the card).
pub fn run(plan: &UnetTrainPlan, device: &Device, device_name: &str) -> Result<UnetTrainOutcome> {
    let images = ImageSet::load(&plan.data)?;
    let split = SplitManifest::load(&plan.split)?;
    images.check_split(&split, &plan.split)?;
    let sched_text = scheduler_json(plan.timesteps, plan.beta_start, plan.beta_end);
    let sched_cfg =
        SchedulerConfig::parse(&sched_text, Path::new(SCHEDULER)).map_err(|e| e.with_field("--timesteps"))?;
    let schedule = sched_cfg.schedule(Path::new(SCHEDULER))?;
    let t_max = check_plan(plan, schedule.len())?;
    let public_seed = plan
        .seed
        .unwrap_or_else(|| rand::rngs::OsRng.try_next_u64().unwrap_or(0));
    // The model: the init folder's config and weights, or the preset / config file, initialised.
    let mut init_ledger: Option<(DpEvent, PathBuf)> = None;
    let (config_text, config_source, config_file, model) = match &plan.init {
        Some(dir) => {
            let udir = unet_dir(dir).ok_or_else(|| {
                Error::field(
                    "--init",
                    format!("{} is not a diffusers folder (no config.json)", dir.display()),
                )
            })?;
            let cpath = udir.join("config.json");
            let text = crate::input::read_to_string(&cpath)?;
            let config = Unet2dConfig::parse(&text, &cpath)?;
            let wpath = udir.join(WEIGHTS);
            let (tensors, _, _) = read_weights(&wpath, device)?;
            let m = TrainUnet::from_tensors(&config, tensors, &wpath, device)?;
            let lpath = udir.join(LEDGER);
            if lpath.is_file() {
                let f = EventFile::load(&lpath)?;
                if f.neighbouring != Neighbouring::AddRemove {
                    return Err(Error::field(
                        "--init",
                        format!("{} accounts under a different neighbouring relation", lpath.display()),
                    ));
                }
                init_ledger = Some((f.event, lpath));
            } else if plan.dp.is_some() {
                match public_only(&udir, &images, &split, &plan.split)? {
                    Some(why) => eprintln!("--init {}: {why}", udir.display()),
                    None => {
                        return Err(Error::field(
                            "--init",
                            format!(
                                "{} has no {LEDGER}: whatever it was trained on cannot be composed into this run's ledger. Start without --init, from a folder dpaudit trained (with its ledger), or from one dpaudit trained from scratch on this split's public rows (--on public)",
                                udir.display()
                            ),
                        ))
                    }
                }
            }
            (text, format!("--init {}", udir.display()), Some(cpath), m)
        }
        None => {
            let (text, source) = config_text(&plan.unet)?;
            let path = PathBuf::from(if source.starts_with("preset") {
                "config.json"
            } else {
                &source
            });
            let config = Unet2dConfig::parse(&text, &path)?;
            let m = TrainUnet::random(&config, public_seed, device)?;
            let file = (!source.starts_with("preset")).then_some(path);
            (text, source, file, m)
        }
    };
    let config = model.config.clone();
    let [c, h, w] = images.shape;
    if c != config.in_channels || config.out_channels != c {
        // The config is what disagrees with the data it is asked to train on: the error names
        // the config file and its field (a preset: --unet), and the data file as the reason.
        let field = if c != config.in_channels {
            "in_channels"
        } else {
            "out_channels"
        };
        let message = format!(
            "the UNet maps {} to {} channels, but the images of {} have {c} channel{}",
            config.in_channels,
            config.out_channels,
            plan.data.display(),
            if c == 1 { "" } else { "s" }
        );
        return Err(match config_file {
            Some(f) => Error::field(field, message).with_file(&f),
            None => Error::field("--unet", format!("{config_source}: {message}")),
        });
    }
    let f = 1usize << config.downsamplings();
    if h % f != 0 || w % f != 0 {
        return Err(Error::input(format!(
            "images of {h}×{w} are not divisible by {f} (the UNet downsamples {} times)",
            config.downsamplings()
        ))
        .with_file(&plan.data));
    }
    let dim = c * h * w;
    let private_ix = split.part(plan.on).to_vec();
    if private_ix.is_empty() {
        return Err(Error::input(format!("the split has no {:?} rows", plan.on)).with_file(&plan.split));
    }
    let mut x0 = images.rows(&private_ix);
    let gradient = plan.gradient_canaries > 0;
    // White-box gradient canaries (Nasr et al. 2023): distinct parameter coordinates, each
    // included with probability ½ and then Poisson-sampled like every private row, so the
    // ledger is unchanged; every noisy update is observed at their coordinates.
    let mut recorder = if gradient {
        if plan.dp.is_none() {
            return Err(Error::field(
                "--canary-kind",
                "gradient canaries are observed in DP-SGD's noisy updates: train with --dp (or use --canary-kind input)",
            ));
        }
        let shapes: Vec<(String, usize)> = model
            .names()
            .into_iter()
            .zip(model.vars())
            .map(|(n, v)| (n, v.as_tensor().elem_count()))
            .collect();
        crate::limits::check_canaries(plan.gradient_canaries, 1)?;
        // The white-box record: one float per canary and step, held until the set is written.
        crate::limits::check_canaries(plan.gradient_canaries, plan.steps)?;
        let mut rng = super::dp::secret_rng(plan.seed.map(|s| s ^ 0x6a7d_c4e1));
        Some(WhiteBoxRecorder::new(GradientCanaries::generate(
            plan.gradient_canaries,
            &shapes,
            &mut rng,
        )?))
    } else {
        None
    };
    // Input canaries: random ±1 images, each included with probability ½ (secret unless seeded).
    crate::limits::check_canaries(plan.canaries, dim)?;
    let canaries = (plan.canaries > 0).then(|| {
        let mut rng = super::dp::secret_rng(plan.seed.map(|s| s ^ 0xca7a_71e5));
        Canaries::generate(plan.canaries, dim, &mut rng)
    });
    if let Some(c) = &canaries {
        x0.extend(c.included_rows());
    }
    let n = x0.len() / dim;
    let public_rows: Vec<f32> = images.rows(&split.public.iter().take(64).copied().collect::<Vec<_>>());
    // DP runs publish no loss on the private rows (it would be released without noise).
    let (eval_rows, eval_on) = if plan.dp.is_some() {
        (
            public_rows,
            "public rows (a loss on the private rows would be released without noise)",
        )
    } else {
        (x0[..dim * private_ix.len().min(64)].to_vec(), "training rows")
    };
    let eval_seed = plan.seed.unwrap_or(0);
    let before = eval_loss(
        &model,
        &schedule,
        &eval_rows,
        images.shape,
        (plan.t_min, t_max),
        eval_seed,
    )?;
    if !plan.quiet {
        eprintln!(
            "model: {}, {} parameters; training on {} {} rows of {}{}",
            config.describe(),
            model.parameters(),
            private_ix.len(),
            format!("{:?}", plan.on).to_lowercase(),
            plan.data.display(),
            canaries
                .as_ref()
                .map(|c| format!(" + {} canaries (of {})", n - private_ix.len(), c.len()))
                .unwrap_or_default()
                + &recorder
                    .as_ref()
                    .map(|wb| format!(
                        " + {} gradient canaries (of {}; white-box)",
                        wb.canaries.included.iter().filter(|&&b| b).count(),
                        wb.canaries.len()
                    ))
                    .unwrap_or_default()
        );
    }
    let folder = Folder {
        plan,
        images: &images,
        private_ix: &private_ix,
        config_text: &config_text,
        config_source: &config_source,
        config: &config,
        parameters: model.parameters(),
        sched_text: &sched_text,
        schedule: &schedule,
        canaries: canaries.as_ref(),
        n,
        t_max,
        device_name,
        init_ledger: init_ledger.as_ref(),
        eval_rows: &eval_rows,
        eval_on,
        eval_seed,
        before,
        per_sample: match &plan.dp {
            Some(d) if d.per_sample_loop => "loop",
            _ if device.is_cpu() && unsupported(&config).is_none() => "hand-written",
            _ => "batched",
        },
    };
    let vars = model.vars();
    let names = model.names();
    let mut opt = AdamW::new(
        vars.clone(),
        ParamsAdamW {
            lr: plan.lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        },
    )?;
    let mut ema = Ema::new(&model, plan.ema)?;
    let bar = crate::report::progress::bar(
        plan.steps as u64,
        plan.quiet,
        if plan.dp.is_some() { "dp-sgd" } else { "train" },
    );
    let shape4 = |k: usize| (k, c, h, w);
    // The gradient path, decided once: the hand-written pass on the CPU for the architectures
    // it covers ([`super::unet2d::grad_cpu`]), else candle's batched pass (CUDA, `--per-sample loop`,
    // other blocks).
    let mut cpu_grad = if device.is_cpu() && !plan.dp.is_some_and(|d| d.per_sample_loop) {
        match unsupported(&config) {
            None => Some(CpuGrad::new(&model, images.shape)?),
            Some(why) => {
                crate::report::progress::note(&format!("the hand-written CPU gradient pass does not cover {why}"));
                None
            }
        }
    } else {
        None
    };
    crate::report::progress::note(&format!(
        "{}: {}",
        if plan.dp.is_some() {
            "per-sample gradients"
        } else {
            "gradients"
        },
        match (&cpu_grad, plan.dp.is_some_and(|d| d.per_sample_loop)) {
            (Some(_), _) => "hand-written CPU pass",
            (None, true) => "candle, one backward pass per sample",
            (None, false) if plan.dp.is_some() => "candle batched pass",
            (None, false) => "candle backward",
        }
    ));
    let log = LogProgress::new(plan.steps, plan.quiet);
    let mut ledger = EventBuilder::new();
    let mut total_batch = 0usize;
    match &plan.dp {
        Some(d) => {
            let mut rng = super::dp::secret_rng(plan.seed.map(|s| s ^ 0x5a3b));
            let mut noise_rng = super::dp::secret_rng(plan.seed);
            let step_event = if d.sample_rate >= 1.0 {
                DpEvent::gaussian(d.noise_multiplier)
            } else {
                DpEvent::poisson(d.sample_rate, DpEvent::gaussian(d.noise_multiplier))
            };
            let expected = d.sample_rate * n as f64;
            for step in 0..plan.steps {
                // Poisson sampling.
                let rows: Vec<usize> = (0..n).filter(|_| rng.random::<f64>() < d.sample_rate).collect();
                let m = rows.len();
                total_batch += m;
                let mut xb = Vec::with_capacity(m * dim);
                for &i in &rows {
                    xb.extend_from_slice(&x0[i * dim..(i + 1) * dim]);
                }
                let t: Vec<usize> = (0..m).map(|_| rng.random_range(plan.t_min..=t_max)).collect();
                let eps = normals(&mut rng, m * dim);
                let xt = noisy(&schedule, &xb, &t, &eps);
                // Per-sample gradients and clipping, chunk by chunk.
                let mut sum: HashMap<String, Tensor> = HashMap::with_capacity(vars.len());
                if let Some(g) = cpu_grad.as_mut() {
                    // All rows at once: the pass holds one sample per thread, never the batch.
                    g.load(&model)?;
                    let tf: Vec<f64> = t.iter().map(|&v| v as f64).collect();
                    let r = g.clipped_sum(&xt, &tf, &eps, Some(d.clip), 1.0)?;
                    sum = g.to_tensors(&r.sum, device)?;
                } else {
                    for (name, v) in names.iter().zip(&vars) {
                        sum.insert(name.clone(), v.as_tensor().zeros_like()?);
                    }
                }
                for s in (0..m).step_by(plan.batch_size).filter(|_| cpu_grad.is_none()) {
                    let k = plan.batch_size.min(m - s);
                    let x = Tensor::from_slice(&xt[s * dim..(s + k) * dim], shape4(k), device)?;
                    let e = Tensor::from_slice(&eps[s * dim..(s + k) * dim], shape4(k), device)?;
                    let tf: Vec<f64> = t[s..s + k].iter().map(|&v| v as f64).collect();
                    let g = if d.per_sample_loop {
                        model.per_sample_grads_loop(&x, &tf, &e)?
                    } else {
                        model.per_sample_grads(&x, &tf, &e)?
                    };
                    let (part, _) = clip_and_sum(&g, d.clip)?;
                    for (name, p) in part {
                        let acc = sum
                            .remove(&name)
                            .ok_or_else(|| Error::model(format!("no sum for `{name}`")))?;
                        sum.insert(name, (acc + p)?);
                    }
                }
                // Gradient canaries join the sum as clipped records (norm 2C clipped to C), each
                // included one Poisson-sampled at q from the trainer's sampling stream.
                if let Some(wb) = recorder.as_ref() {
                    let scale = 1.0 / GRADIENT_CANARY_NORM.max(1.0);
                    wb.inject(&mut sum, d.sample_rate, d.clip, scale, &mut rng)?;
                }
                // Gaussian noise σC on the sum, ÷ q·n, Adam.
                let mut released = super::dp::release(&sum, d.noise_multiplier * d.clip, expected, &mut noise_rng)?;
                if let Some(wb) = recorder.as_mut() {
                    wb.observe(&released, expected / d.clip)?;
                }
                let mut store = GradStore::default();
                for (name, v) in names.iter().zip(&vars) {
                    let g = released
                        .remove(name)
                        .ok_or_else(|| Error::model(format!("no gradient for `{name}`")))?;
                    store.insert(v.as_tensor(), g);
                }
                opt.step(&store)?;
                ema.update(&model)?;
                ledger.push(step_event.clone());
                bar.inc(1);
                log.step(step + 1);
                folder.checkpoint(&model, &ema, step + 1, &ledger, recorder.as_ref())?;
            }
        }
        None => {
            let mut rng = ChaCha8Rng::seed_from_u64(public_seed ^ 0x7a11);
            let b = plan.batch_size;
            for step in 0..plan.steps {
                let idx: Vec<usize> = (0..b).map(|_| rng.random_range(0..n)).collect();
                let mut xb = Vec::with_capacity(b * dim);
                for &i in &idx {
                    xb.extend_from_slice(&x0[i * dim..(i + 1) * dim]);
                }
                let t: Vec<usize> = (0..b).map(|_| rng.random_range(plan.t_min..=t_max)).collect();
                let eps = normals(&mut rng, b * dim);
                let xt = noisy(&schedule, &xb, &t, &eps);
                let tf: Vec<f64> = t.iter().map(|&v| v as f64).collect();
                if let Some(g) = cpu_grad.as_mut() {
                    // ∇ of the mean loss: the per-sample gradients, each weighted 1/b.
                    g.load(&model)?;
                    let r = g.clipped_sum(&xt, &tf, &eps, None, 1.0 / b as f64)?;
                    let mut grads = g.to_tensors(&r.sum, device)?;
                    let mut store = GradStore::default();
                    for (name, v) in names.iter().zip(&vars) {
                        let gt = grads
                            .remove(name)
                            .ok_or_else(|| Error::model(format!("no gradient for `{name}`")))?;
                        store.insert(v.as_tensor(), gt);
                    }
                    opt.step(&store)?;
                } else {
                    let x = Tensor::from_vec(xt, shape4(b), device)?;
                    let e = Tensor::from_vec(eps, shape4(b), device)?;
                    let loss = model.per_sample_loss(&x, &tf, &e)?.mean_all()?;
                    opt.step(&loss.backward()?)?;
                }
                ema.update(&model)?;
                total_batch += b;
                bar.inc(1);
                log.step(step + 1);
                folder.checkpoint(&model, &ema, step + 1, &ledger, None)?;
            }
        }
    }
    bar.finish_and_clear();
    if let Some(d) = plan.dp.as_ref().filter(|_| !plan.quiet) {
        eprintln!(
            "mean Poisson batch: {:.1} (expected {:.1})",
            total_batch as f64 / plan.steps as f64,
            d.sample_rate * n as f64
        );
    }
    ema.apply(&model)?;
    let after = folder.eval(&model)?;
    let weights = model.safetensors_bytes()?;
    let (card, event, mut lines, files) =
        folder.files(&plan.out, plan.steps, &ledger, weights, after, recorder.as_ref())?;
    let files = signed(files, plan.sign_key.as_ref())?;
    crate::report::output::create_out_dir(&plan.out)?;
    crate::report::output::commit_set(&plan.out, None, &files, plan.force)?;
    lines.push(format!(
        "denoising loss on the {} (fixed evaluation draws): {:.4} -> {after:.4}",
        folder.eval_on, folder.before
    ));
    if plan.seed.is_some() {
        lines.push(format!("training randomness: {RANDOMNESS_SEEDED}"));
    }
    let names_written: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    lines.push(format!("wrote {} ({})", plan.out.display(), names_written.join(", ")));
    if let (Some(d), Some(ev)) = (&plan.dp, &event) {
        let p = plan.out.join(LEDGER);
        lines.push(format!(
            "account the ledger with: dpaudit account --event {} --delta {}",
            p.display(),
            d.delta
        ));
        lines.push(ev.ledger());
    }
    Ok(UnetTrainOutcome {
        dir: plan.out.clone(),
        card,
        event,
        lines,
    })
}

/// The sub-folder of `--out` that `--checkpoint-every N` rewrites every N steps.
pub const CHECKPOINT_DIR: &str = "checkpoint";

/// What every folder a run writes (the final one and each periodic checkpoint) is built from:
/// the run's fixed context, so that a checkpoint is exactly the folder the run would have
/// written had it been asked for that many steps.
struct Folder<'a> {
    plan: &'a UnetTrainPlan,
    images: &'a ImageSet,
    private_ix: &'a [usize],
    config_text: &'a str,
    config_source: &'a str,
    config: &'a Unet2dConfig,
    parameters: usize,
    sched_text: &'a str,
    schedule: &'a TrainingSchedule,
    canaries: Option<&'a Canaries>,
    /// Private rows including the included canaries.
    n: usize,
    t_max: usize,
    device_name: &'a str,
    init_ledger: Option<&'a (DpEvent, PathBuf)>,
    eval_rows: &'a [f32],
    eval_on: &'a str,
    eval_seed: u64,
    before: f64,
    /// How the per-sample gradients are computed (the card's `dp.per_sample`).
    per_sample: &'static str,
}

impl Folder<'_> {
    /// The evaluation loss of the model's current weights (fixed draws).
    fn eval(&self, m: &TrainUnet) -> Result<f64> {
        eval_loss(
            m,
            self.schedule,
            self.eval_rows,
            self.images.shape,
            (self.plan.t_min, self.t_max),
            self.eval_seed,
        )
    }

    /// The files of the folder `dir` after `steps` steps of this run whose events are in
    /// `ledger`: the card, the whole ledger (the init's composed with this run's), the
    /// canaries, the diffusers files. Returns the card, the whole event, the lines for the
    /// user and the files.
    #[allow(clippy::type_complexity)]
    fn files(
        &self,
        dir: &Path,
        steps: usize,
        ledger: &EventBuilder,
        weights: Vec<u8>,
        after: f64,
        white_box: Option<&WhiteBoxRecorder>,
    ) -> Result<(UnetCard, Option<DpEvent>, Vec<String>, Vec<(String, Vec<u8>)>)> {
        let plan = self.plan;
        let n = self.n;
        let mut lines = Vec::new();
        // The whole ledger: the init's, then this run's.
        let event = plan.dp.as_ref().map(|_| {
            let ev = ledger.build();
            match self.init_ledger {
                Some((prev, _)) => DpEvent::Composed {
                    events: vec![prev.clone(), ev],
                },
                None => ev,
            }
        });
        let randomness = if plan.seed.is_some() {
            RANDOMNESS_SEEDED
        } else {
            RANDOMNESS_OS
        };
        let mut files: Vec<(String, Vec<u8>)> = Vec::new();
        let mut dp_info = None;
        if let (Some(d), Some(ev)) = (&plan.dp, &event) {
            let eps = super::dp::spent_epsilon(ev, d.delta);
            let text = super::dp::ledger_toml(
                ev,
                d.delta,
                &format!(
                    "DpEvent that ran in `{}`{}{}\n(DP-SGD as Opacus runs it: Poisson sampling q = {}, per-sample clipping C = {}, Gaussian noise σ·C with σ = {}, add/remove-one neighbours)\nrandomness: {randomness}\n{}",
                    plan.command,
                    if steps < plan.steps {
                        format!(" (its first {steps} of {} steps: a periodic checkpoint)", plan.steps)
                    } else {
                        String::new()
                    },
                    match (self.init_ledger, &plan.init) {
                        (Some((_, p)), _) => format!(", after the ledger of --init ({})", p.display()),
                        (None, Some(p)) => format!(
                            ", from --init {} (trained on the split's public rows only: nothing to compose)",
                            p.display()
                        ),
                        (None, None) => String::new(),
                    },
                    d.sample_rate,
                    d.clip,
                    d.noise_multiplier,
                    crate::report::output::released_line(WEIGHTS, &weights)
                ),
            )?;
            lines.push(match &eps {
                Some((e, acc)) => format!(
                    "ε spent: {} at δ = {} ({acc}; the whole ledger{})",
                    fmt_num(*e),
                    fmt_num(d.delta),
                    if self.init_ledger.is_some() {
                        ", composed with the --init ledger"
                    } else {
                        ""
                    }
                ),
                None => "ε spent: no sound accountant supports this ledger".to_string(),
            });
            dp_info = Some(DpInfo {
                noise_multiplier: d.noise_multiplier,
                clip: d.clip,
                sample_rate: d.sample_rate,
                steps: steps as u64,
                delta: d.delta,
                per_sample: self.per_sample.into(),
                ledger: LEDGER.into(),
                epsilon: eps.as_ref().map(|e| e.0),
                epsilon_accountant: eps.as_ref().map(|e| e.1.clone()),
                init_ledger: self.init_ledger.map(|(_, p)| super::card::card_relative(p, dir)),
                rapid: None,
                ledger_sha256: Some(sha256_hex(text.as_bytes())),
            });
            files.push((LEDGER.into(), text.into_bytes()));
        }
        let canary_info = match self.canaries {
            Some(c) => {
                let bytes = c.to_csv().into_bytes();
                lines.push(format!(
                    "{} canaries ({} included) in {}: the inclusion bits are the audit's secret; keep the file from whoever the audit models",
                    c.len(),
                    n - self.private_ix.len(),
                    dir.join(CANARIES).display()
                ));
                let info = CanaryInfo {
                    file: CANARIES.into(),
                    sha256: sha256_hex(&bytes),
                    count: c.len(),
                    kind: None,
                    observations: None,
                    observations_sha256: None,
                };
                files.push((CANARIES.into(), bytes));
                Some(info)
            }
            None => None,
        };
        // Gradient canaries: in CANARIES alone, in GRADIENT_CANARIES beside input canaries.
        let gradient_info = match white_box {
            Some(wb) => {
                let name = if canary_info.is_some() {
                    GRADIENT_CANARIES
                } else {
                    CANARIES
                };
                let bytes = wb.canaries.to_csv().into_bytes();
                let obs = wb.observations_npy();
                lines.push(format!(
                    "{} gradient canaries ({} included) in {} and {} ({} noisy updates observed at every canary: the white-box audit's record); the inclusion bits are the audit's secret",
                    wb.canaries.len(),
                    wb.canaries.included.iter().filter(|&&b| b).count(),
                    dir.join(name).display(),
                    dir.join(OBSERVATIONS).display(),
                    wb.steps
                ));
                let info = CanaryInfo {
                    file: name.into(),
                    sha256: sha256_hex(&bytes),
                    count: wb.canaries.len(),
                    kind: Some(CanaryKind::Gradient),
                    observations: Some(OBSERVATIONS.into()),
                    observations_sha256: Some(sha256_hex(&obs)),
                };
                files.push((name.into(), bytes));
                files.push((OBSERVATIONS.into(), obs));
                Some(info)
            }
            None => None,
        };
        let (canary_info, gradient_info) = match canary_info {
            Some(i) => (Some(i), gradient_info),
            None => (gradient_info, None),
        };
        let config_bytes = self.config_text.as_bytes().to_vec();
        let card = UnetCard {
            schema_version: 1,
            format: "diffusers UNet2DModel".into(),
            architecture: self.config.describe(),
            config_source: self.config_source.to_string(),
            config_sha256: sha256_hex(&config_bytes),
            weights_sha256: sha256_hex(&weights),
            scheduler_sha256: sha256_hex(self.sched_text.as_bytes()),
            parameters: self.parameters,
            timesteps: plan.timesteps,
            beta_start: plan.beta_start,
            beta_end: plan.beta_end,
            data: DataInfo {
                file: super::card::card_relative(&plan.data, dir),
                sha256: self.images.sha256.clone(),
                split: super::card::card_relative(&plan.split, dir),
                split_sha256: sha256_file(&plan.split)?,
                trained_on: plan.on,
                rows_sha256: indices_sha256(self.private_ix),
                rows: self.private_ix.len(),
            },
            training: TrainingInfo {
                seed: plan.seed,
                randomness: randomness.to_string(),
                steps,
                batch_size: match &plan.dp {
                    Some(d) => (d.sample_rate * n as f64).round() as usize,
                    None => plan.batch_size,
                },
                lr: plan.lr,
                ema_decay: plan.ema,
                t_min: plan.t_min,
                t_max: self.t_max,
                device: self.device_name.to_string(),
                command: plan.command.clone(),
                eval_loss_before: Some(self.before),
                eval_loss_after: Some(after),
                eval_on: Some(self.eval_on.to_string()),
                init: plan.init.as_ref().map(|p| super::card::card_relative(p, dir)),
                relocated: None,
            },
            dp: dp_info,
            canaries: canary_info,
            gradient_canaries: gradient_info,
        };
        let record = serde_json::json!({
            "trained_on": format!("{:?}", plan.on).to_lowercase(),
            "split": plan.split.display().to_string(),
            "members_sha256": indices_sha256(self.private_ix),
            "data_sha256": self.images.sha256,
            "rows": self.private_ix.len(),
            "canaries": self.canaries.map(|c| c.len()).or(white_box.map(|w| w.canaries.len())),
            "steps": steps,
            "command": plan.command,
            "dp": card.dp.as_ref().map(|d| serde_json::json!({
                "noise_multiplier": d.noise_multiplier, "clip": d.clip, "sample_rate": d.sample_rate,
                "steps": d.steps, "ledger": LEDGER })),
        });
        files.push(("config.json".into(), config_bytes));
        files.push((WEIGHTS.into(), weights));
        files.push((SCHEDULER.into(), self.sched_text.as_bytes().to_vec()));
        files.push((CARD.into(), card.text()?.into_bytes()));
        files.push((
            TRAINING.into(),
            (serde_json::to_string_pretty(&record).map_err(|e| Error::input(e.to_string()))? + "\n").into_bytes(),
        ));
        Ok((card, event, lines, files))
    }

    /// After step `done` of a `--checkpoint-every N` run (N | done, done < steps): rewrites
    /// `OUT/checkpoint/` with the folder the run would release now — the EMA weights so far
    /// (the model's own weights are left as they are), and the ledger of the `done` steps that
    /// ran, so that a run stopped at any point leaves a ledger that covers every released
    /// weight file. Resume with `--init OUT/checkpoint --steps <the rest>` (the ledger is
    /// composed; Adam's moments and the EMA restart from the checkpoint's weights).
    fn checkpoint(
        &self,
        m: &TrainUnet,
        ema: &Ema,
        done: usize,
        ledger: &EventBuilder,
        white_box: Option<&WhiteBoxRecorder>,
    ) -> Result<()> {
        if !matches!(self.plan.checkpoint_every, Some(k) if k > 0 && done.is_multiple_of(k) && done < self.plan.steps) {
            return Ok(());
        }
        let vars = m.vars();
        let saved: Vec<Tensor> = vars
            .iter()
            .map(|v| v.as_tensor().copy())
            .collect::<candle_core::Result<_>>()?;
        for (v, s) in vars.iter().zip(ema.snapshot(m)?) {
            v.set(&s)?;
        }
        let written = (|| -> Result<()> {
            let weights = m.safetensors_bytes()?;
            let after = self.eval(m)?;
            let dir = self.plan.out.join(CHECKPOINT_DIR);
            let (_, _, _, files) = self.files(&dir, done, ledger, weights, after, white_box)?;
            let files = signed(files, self.plan.sign_key.as_ref())?;
            // One rename of the whole folder: the previous checkpoint stays whole until this
            // one is complete, and no reader sees a mix of the two.
            crate::report::output::commit_folder(&dir, &files)?;
            eprintln!(
                "checkpoint after step {done}/{}: {} (resume with --init {} --steps {})",
                self.plan.steps,
                dir.display(),
                dir.display(),
                self.plan.steps - done
            );
            Ok(())
        })();
        for (v, s) in vars.iter().zip(&saved) {
            v.set(s)?;
        }
        written
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every preset parses, and `ddpm-cifar10` builds with google/ddpm-cifar10-32's 35,746,307
    /// parameters (the count diffusers reports for that checkpoint).
    #[test]
    fn presets_build_with_their_parameter_counts() {
        for (name, _, _) in PRESETS {
            let (text, _) = config_text(name).unwrap();
            let config = Unet2dConfig::parse(&text, Path::new("config.json")).unwrap();
            // The count the size limit checks before building is the built model's.
            let m = TrainUnet::random(&config, 0, &Device::Cpu).unwrap();
            assert_eq!(config.parameter_count(), m.parameters() as f64, "{name}");
        }
        let (text, _) = config_text("ddpm-cifar10").unwrap();
        let config = Unet2dConfig::parse(&text, Path::new("config.json")).unwrap();
        let m = TrainUnet::random(&config, 0, &Device::Cpu).unwrap();
        assert_eq!(m.parameters(), 35_746_307);
    }
}
