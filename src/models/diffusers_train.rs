//! `dpaudit train --unet`: train a diffusers `UNet2DModel` (any `config.json` the loader reads,
//! or a named preset) on an image data set, without privacy or with DP-SGD as Opacus runs it,
//! and write a diffusers folder that `UNet2DModel.from_pretrained` loads unchanged
//! (`config.json`, `diffusion_pytorch_model.safetensors`, `scheduler_config.json`) with the
//! dpaudit card (`dpaudit-card.toml`), the ledger (`dpaudit-ledger.toml`, DP runs) and the
//! `training.json` record `mia` checks the split against.
//!
//! This file is the diffusers family of the training orchestrator ([`super::train`], which owns
//! the plan, the DP-SGD step, Adam, the EMA and the folder's card, ledger and canaries): the
//! presets, the card, and [`UnetFamily`]'s gradients. On the CPU the per-sample gradients come
//! from the hand-written pass of one sample at a time ([`super::unet2d::grad_cpu`], samples in
//! parallel, clipped by Opacus' factor min(1, C/(‖g‖ + 10⁻⁶))); on CUDA, with `--per-sample loop`
//! and for architectures that pass does not cover, from candle's batched pass
//! ([`super::unet2d::train`]) in chunks of `--batch-size` rows (memory only, like Opacus'
//! `BatchMemoryManager`; the released update is the same). The non-private path takes the
//! gradient of the mean loss from the same two sources.
//!
//! `--canaries m` adds m random ±1 images, each to the private rows with probability ½
//! ([`super::canary`]; Steinke, Nasr & Jagielski 2023, Algorithm 1), and writes them with their
//! inclusion bits to `canaries.csv` for `mia --audit one-run`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::canary::{Canaries, CanaryKind};
use super::card::{CanaryInfo, DataInfo, DpInfo, TrainingInfo};
use super::diffusers::{read_weights, unet_dir, WEIGHTS};
use super::dp::normals;
use super::train::{self, ClippedSum, Examples, Family, Layout, PerSample, Plan, Release, Setup, Trained};
use super::unet2d::grad_cpu::{unsupported, CpuGrad};
use super::unet2d::train::{clip_and_sum, TrainUnet};
use super::unet2d::{Unet2dConfig, Unet2dModel, WeightStore};
use crate::data::digits::{indices_sha256, sha256_file, sha256_hex, Part};
use crate::data::images::ImageSet;
use crate::data::SplitManifest;
use crate::diffusion::schedule::diffusers::SchedulerConfig;
use crate::diffusion::schedule::table::noisy;
use crate::diffusion::schedule::table::{TrainingSchedule, TrainingScheduleConfig};
use crate::error::{Error, Result};
use crate::events::DpEvent;

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

pub use super::folder::RELEASED;
pub use super::train::CHECKPOINT_DIR;

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

/// A diffusers UNet in training: the model, its gradient path (the hand-written CPU pass where it
/// covers the architecture, else candle's batched pass or its per-sample loop) and the files of
/// its folder.
pub struct UnetFamily {
    model: TrainUnet,
    /// The model's variables with their names, in creation order (taken once).
    vars: Vec<(String, Var)>,
    schedule: TrainingSchedule,
    shape: [usize; 3],
    cpu_grad: Option<CpuGrad>,
    per_sample_loop: bool,
    /// Rows per chunk of candle's per-sample pass (memory only).
    chunk: usize,
    config_text: String,
    config_source: String,
    sched_text: String,
    timesteps: usize,
    beta_start: f64,
    beta_end: f64,
}

impl UnetFamily {
    fn shape4(&self, k: usize) -> (usize, usize, usize, usize) {
        (k, self.shape[0], self.shape[1], self.shape[2])
    }

    /// A gradient store of `grads` by the model's variable names.
    fn store(&self, mut grads: HashMap<String, Tensor>) -> Result<GradStore> {
        let mut store = GradStore::default();
        for (name, v) in &self.vars {
            let g = grads
                .remove(name)
                .ok_or_else(|| Error::model(format!("no gradient for `{name}`")))?;
            store.insert(v.as_tensor(), g);
        }
        Ok(store)
    }
}

impl Family for UnetFamily {
    type Card = UnetCard;
    const GRADIENT_CANARY_SALT: u64 = 0x6a7d_c4e1;
    const EVAL_ROWS: usize = 64;

    fn dim(&self) -> usize {
        self.shape.iter().product()
    }

    fn vars(&self) -> Vec<(String, Var)> {
        self.vars.clone()
    }

    fn schedule(&self) -> &TrainingSchedule {
        &self.schedule
    }

    fn describe(&self) -> String {
        format!(
            "{}, {} parameters",
            self.model.config.describe(),
            self.model.parameters()
        )
    }

    fn mechanism(&self) -> &'static str {
        "DP-SGD as Opacus runs it"
    }

    fn per_sample(&self) -> &'static str {
        match (&self.cpu_grad, self.per_sample_loop) {
            (_, true) => "loop",
            (Some(_), false) => "hand-written",
            (None, false) => "batched",
        }
    }

    fn backend(&self, dp: bool) -> &'static str {
        gradient_path(self.cpu_grad.is_some(), self.per_sample_loop, dp)
    }

    fn clipped_sum(&mut self, ex: &Examples, clip: f64) -> Result<ClippedSum> {
        let device = self.model.device().clone();
        if let Some(g) = self.cpu_grad.as_mut() {
            // All rows at once: the pass holds one sample per thread, never the batch.
            g.load(&self.model)?;
            let tf: Vec<f64> = ex.t.iter().map(|&v| v as f64).collect();
            let r = g.clipped_sum(&ex.xt, &tf, &ex.eps, Some(clip), 1.0)?;
            return Ok((g.to_tensors(&r.sum, &device)?, r.norms));
        }
        // Per-sample gradients and clipping, chunk by chunk.
        let dim = self.dim();
        let m = ex.len();
        let mut sum: HashMap<String, Tensor> = HashMap::with_capacity(self.vars.len());
        for (name, v) in &self.vars {
            sum.insert(name.clone(), v.as_tensor().zeros_like()?);
        }
        let mut norms = Vec::with_capacity(m);
        for s in (0..m).step_by(self.chunk) {
            let k = self.chunk.min(m - s);
            let x = Tensor::from_slice(&ex.xt[s * dim..(s + k) * dim], self.shape4(k), &device)?;
            let e = Tensor::from_slice(&ex.eps[s * dim..(s + k) * dim], self.shape4(k), &device)?;
            let tf: Vec<f64> = ex.t[s..s + k].iter().map(|&v| v as f64).collect();
            let g = if self.per_sample_loop {
                self.model.per_sample_grads_loop(&x, &tf, &e)?
            } else {
                self.model.per_sample_grads(&x, &tf, &e)?
            };
            let (part, n) = clip_and_sum(&g, clip)?;
            norms.extend(n);
            for (name, p) in part {
                let acc = sum
                    .remove(&name)
                    .ok_or_else(|| Error::model(format!("no sum for `{name}`")))?;
                sum.insert(name, (acc + p)?);
            }
        }
        Ok((sum, norms))
    }

    fn plain_grads(
        &mut self,
        x0: &[f32],
        b: usize,
        t_range: (usize, usize),
        rng: &mut ChaCha8Rng,
    ) -> Result<(GradStore, Option<f64>)> {
        let dim = self.dim();
        let n = x0.len() / dim;
        let idx: Vec<usize> = (0..b).map(|_| rng.random_range(0..n)).collect();
        let mut xb = Vec::with_capacity(b * dim);
        for &i in &idx {
            xb.extend_from_slice(&x0[i * dim..(i + 1) * dim]);
        }
        let t: Vec<usize> = (0..b).map(|_| rng.random_range(t_range.0..=t_range.1)).collect();
        let eps = normals(rng, b * dim);
        let xt = noisy(&self.schedule, &xb, &t, &eps);
        let tf: Vec<f64> = t.iter().map(|&v| v as f64).collect();
        let device = self.model.device().clone();
        if let Some(g) = self.cpu_grad.as_mut() {
            // ∇ of the mean loss: the per-sample gradients, each weighted 1/b.
            g.load(&self.model)?;
            let r = g.clipped_sum(&xt, &tf, &eps, None, 1.0 / b as f64)?;
            let grads = g.to_tensors(&r.sum, &device)?;
            return Ok((self.store(grads)?, None));
        }
        let x = Tensor::from_vec(xt, self.shape4(b), &device)?;
        let e = Tensor::from_vec(eps, self.shape4(b), &device)?;
        let loss = self.model.per_sample_loss(&x, &tf, &e)?.mean_all()?;
        Ok((loss.backward()?, None))
    }

    fn eval_loss(&self, rows: &[f32], t: (usize, usize), seed: u64) -> Result<f64> {
        eval_loss(&self.model, &self.schedule, rows, self.shape, t, seed)
    }

    fn weights(&self) -> Result<Vec<u8>> {
        self.model.safetensors_bytes()
    }

    fn card(&self, plan: &Plan, r: Release) -> Result<(UnetCard, Vec<(String, Vec<u8>)>)> {
        let config_bytes = self.config_text.as_bytes().to_vec();
        let card = UnetCard {
            schema_version: 1,
            format: "diffusers UNet2DModel".into(),
            architecture: self.model.config.describe(),
            config_source: self.config_source.clone(),
            config_sha256: sha256_hex(&config_bytes),
            weights_sha256: sha256_hex(&r.weights),
            scheduler_sha256: sha256_hex(self.sched_text.as_bytes()),
            parameters: self.model.parameters(),
            timesteps: self.timesteps,
            beta_start: self.beta_start,
            beta_end: self.beta_end,
            data: r.data,
            training: r.training,
            dp: r.dp,
            canaries: r.canaries,
            gradient_canaries: r.gradient_canaries,
        };
        let record = serde_json::json!({
            "trained_on": format!("{:?}", plan.on).to_lowercase(),
            "split": plan.split.display().to_string(),
            "members_sha256": card.data.rows_sha256,
            "data_sha256": card.data.sha256,
            "rows": card.data.rows,
            "canaries": card.canaries.as_ref().map(|c| c.count),
            "steps": r.steps,
            "command": plan.command,
            "dp": card.dp.as_ref().map(|d| serde_json::json!({
                "noise_multiplier": d.noise_multiplier, "clip": d.clip, "sample_rate": d.sample_rate,
                "steps": d.steps, "ledger": LEDGER })),
        });
        let files = vec![
            ("config.json".into(), config_bytes),
            (WEIGHTS.into(), r.weights),
            (SCHEDULER.into(), self.sched_text.as_bytes().to_vec()),
            (CARD.into(), card.text()?.into_bytes()),
            (
                TRAINING.into(),
                (serde_json::to_string_pretty(&record).map_err(|e| Error::input(e.to_string()))? + "\n").into_bytes(),
            ),
        ];
        Ok((card, files))
    }
}

/// The gradient path a run takes: the hand-written CPU pass (`cpu`), candle's per-sample loop
/// (`per_sample_loop`), candle's batched per-sample pass (`dp`) or candle's backward.
fn gradient_path(cpu: bool, per_sample_loop: bool, dp: bool) -> &'static str {
    match (cpu, per_sample_loop) {
        (true, _) => "hand-written CPU pass",
        (false, true) => "candle, one backward pass per sample",
        (false, false) if dp => "candle batched pass",
        (false, false) => "candle backward",
    }
}

/// The family and the rows of `plan` on `device`: the images and split, the scheduler config,
/// the UNet (the `--init` folder's config and weights with its ledger, or the preset / config
/// file initialised from the public seed) and its gradient path.
pub fn setup(
    plan: &Plan,
    unet: &std::ffi::OsStr,
    betas: TrainingScheduleConfig,
    device: &Device,
) -> Result<(UnetFamily, Setup)> {
    let images = ImageSet::load(&plan.data)?;
    let split = SplitManifest::load(&plan.split)?;
    images.check_split(&split, &plan.split)?;
    let sched_text = scheduler_json(betas.timesteps, betas.beta_start, betas.beta_end);
    let sched_cfg =
        SchedulerConfig::parse(&sched_text, Path::new(SCHEDULER)).map_err(|e| e.with_field("--timesteps"))?;
    let schedule = sched_cfg.schedule(Path::new(SCHEDULER))?;
    let t_max = plan.check(schedule.len())?;
    let public_seed = plan.public_seed();
    // The model: the init folder's config and weights, or the preset / config file, initialised.
    let mut init_ledger: Option<(DpEvent, PathBuf)> = None;
    let mut init_note = None;
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
                init_ledger = Some(train::init_ledger(&lpath)?);
            } else if plan.dp.is_some() {
                match public_only(&udir, &images, &split, &plan.split)? {
                    Some(why) => {
                        eprintln!("--init {}: {why}", udir.display());
                        init_note = Some("trained on the split's public rows only".to_string());
                    }
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
            let (text, source) = config_text(unet)?;
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
    let private_ix = split.part(plan.on).to_vec();
    // The gradient path, decided once: the hand-written pass on the CPU for the architectures
    // it covers ([`super::unet2d::grad_cpu`]), else candle's batched pass (CUDA, `--per-sample
    // loop`, other blocks).
    let per_sample_loop = plan.dp.is_some_and(|d| d.per_sample == PerSample::Loop);
    let cpu_grad = if device.is_cpu() && !per_sample_loop {
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
        gradient_path(cpu_grad.is_some(), per_sample_loop, plan.dp.is_some())
    ));
    let public_ix: Vec<usize> = split.public.iter().take(UnetFamily::EVAL_ROWS).copied().collect();
    let setup = Setup {
        data_sha256: images.sha256.clone(),
        private: images.rows(&private_ix),
        public: images.rows(&public_ix),
        private_ix,
        init_ledger,
        init_note,
        t_max,
        public_seed,
    };
    let fam = UnetFamily {
        vars: model.names().into_iter().zip(model.vars()).collect(),
        model,
        schedule,
        shape: images.shape,
        cpu_grad,
        per_sample_loop,
        chunk: plan.batch_size,
        config_text,
        config_source,
        sched_text,
        timesteps: betas.timesteps,
        beta_start: betas.beta_start,
        beta_end: betas.beta_end,
    };
    Ok((fam, setup))
}

/// Trains the diffusers UNet `unet` (a preset name or a config.json path, as the OS gave it;
/// ignored with `--init`: its config wins) with a DDPM scheduler of linear `betas`, as `plan`
/// says, on `device` (described as `device_name` in the card), and writes the folder with its
/// card, ledger and canaries.
pub fn run(
    plan: &Plan,
    unet: &std::ffi::OsStr,
    betas: TrainingScheduleConfig,
    device: &Device,
    device_name: &str,
) -> Result<Trained<UnetCard>> {
    let (fam, setup) = setup(plan, unet, betas, device)?;
    train::run(plan, fam, setup, Layout::folder(&plan.out), device_name)
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
