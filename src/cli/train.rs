//! `dpaudit train`: arguments → [`train::Plan`] → [`dpaudit::audit::train::execute`] → exit code.
//! `--make-split`, Opacus' flags and the run itself (DP-SGD, RAPID, canaries, ledger, card)
//! live in the library.

use std::path::{Path, PathBuf};

use crate::cli::values::{Arch, DeviceChoice, Part, PerSample};
use dpaudit::audit::train::{Model, Plan, ToyPlan};
use dpaudit::diffusion::schedule::table::TrainingScheduleConfig;
use dpaudit::error::Error;
use dpaudit::models::toy::run::Rapid;
use dpaudit::models::toy::ModelConfig;
use dpaudit::models::train::{DpPlan, Plan as TrainPlan};

const EXAMPLES: &str = "\
Examples:
  # The member/non-member/public split shipped in fixtures/splits/ (disjoint, hashed):
  dpaudit train --make-split fixtures/splits/digits.toml --members 400 --nonmembers 400 --seed 0

  # A non-DP MLP on the members (the shipped models/digits-mlp checkpoint):
  dpaudit train --split fixtures/splits/digits.toml --on members --arch mlp --hidden 256 --depth 3 \\
      --steps 6000 --batch-size 128 --lr 1e-3 --seed 0 --out models/digits-mlp

  # RAPID: pretrain on public rows, knowledge base (k = 600, v = 300), DP fine-tuning of steps ≤ v
  # on the members; noise from the OS (no --seed); prints the ε spent:
  dpaudit train --dp --rapid --pretrain-steps 3000 --rapid-k 600 --rapid-v 300 \\
      --noise-multiplier 8 --clip 1 --sample-rate 0.16 --steps 200 --lr 2e-4 --out models/digits-rapid
  dpaudit account --event models/digits-rapid.ledger.toml --delta 1e-5

  # A diffusers UNet2DModel (preset or config.json) with DP-SGD on the shipped MNIST members;
  # writes a folder diffusers loads, with dpaudit-card.toml and dpaudit-ledger.toml:
  dpaudit train --unet mnist-ddpm --dp --noise-multiplier 1 --clip 1 --sample-rate 0.25 \
      --steps 2000 --lr 2e-3 --out models/mnist-dp-ddpm

  # A one-run audit: 200 canaries, then `dpaudit mia --checkpoint x.toml --audit one-run`:
  dpaudit train --dp --noise-multiplier 1 --sample-rate 0.1 --steps 500 --canaries 200 --out x

Outputs: <out>.safetensors (EMA weights), <out>.toml (card: model, schedule, data and split
SHA-256, randomness, steps, the exact command, for DP runs the ε spent), <out>.ledger.toml for DP
runs (an event file), <out>.canaries.csv with --canaries.";

#[derive(Debug, clap::Args)]
#[command(after_help = EXAMPLES)]
/// Train a small denoiser (optionally with DP).
pub struct Args {
    /// Data file (digits CSV, optionally .gz).
    #[arg(long, default_value = "fixtures/data/digits.csv.gz")]
    pub data: PathBuf,
    /// Split manifest.
    #[arg(long, default_value = "fixtures/splits/digits.toml")]
    pub split: PathBuf,
    /// Which rows of the split to train on (DP and RAPID runs use the members as private data).
    #[arg(long, value_enum, default_value = "members")]
    pub on: Part,
    /// Output folder (an existing folder, or a path ending in `/`): writes DIR/<name>.safetensors,
    /// DIR/<name>.toml (and .ledger.toml for DP runs), <name> being the folder's name. Any other
    /// path is a file stem (<out>.safetensors, <out>.toml), as before. Missing folders are
    /// created, existing files are refused before any work unless --force.
    #[arg(long, value_name = "DIR/ or STEM")]
    pub out: Option<PathBuf>,
    /// What to print on stdout when done: text, json, csv, md or html (the training report).
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub format: Option<crate::cli::common::Format>,
    /// Replace the checkpoint (or split manifest) from an earlier run.
    #[arg(long)]
    pub force: bool,
    /// More detail on stderr.
    #[arg(long, short, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// Write a new split manifest to this path and exit.
    #[arg(long, value_name = "PATH")]
    pub make_split: Option<PathBuf>,
    /// Members in a new split.
    #[arg(long, default_value_t = 400)]
    pub members: usize,
    /// Non-members in a new split (the rest is public).
    #[arg(long, default_value_t = 400)]
    pub nonmembers: usize,

    #[arg(long, value_enum, default_value = "mlp")]
    /// Network architecture.
    pub arch: Arch,
    /// MLP width.
    #[arg(long, default_value_t = 256)]
    pub hidden: usize,
    /// MLP hidden layers.
    #[arg(long, default_value_t = 3)]
    pub depth: usize,
    /// Sinusoidal time-embedding size.
    #[arg(long, default_value_t = 64)]
    pub time_dim: usize,
    /// UNet base channels.
    #[arg(long, default_value_t = 16)]
    pub channels: usize,
    /// Diffusion steps T (linear β from 1e-4 to 0.02).
    #[arg(long, default_value_t = 1000)]
    pub timesteps: usize,
    #[arg(long, default_value_t = 1e-4)]
    /// β at the first diffusion step.
    pub beta_start: f64,
    #[arg(long, default_value_t = 0.02)]
    /// β at the last diffusion step.
    pub beta_end: f64,

    /// Optimiser steps (DP: iterations of Algorithm 2).
    #[arg(long, default_value_t = 20000)]
    pub steps: usize,
    /// Batch size (default 128). With --dp it is the expected batch under Poisson sampling, as
    /// in Opacus: q = B / N for N private training rows (instead of --sample-rate).
    #[arg(long = "batch-size", value_name = "B")]
    pub batch: Option<usize>,
    /// The batch the trainer uses (resolved from --batch-size, or with --unet --dp from
    /// --max-physical-batch-size).
    #[arg(skip = 128usize)]
    pub batch_size: usize,
    /// With --unet --dp: the per-sample-gradient chunk of candle's batched pass (memory only; it
    /// does not change what is trained or accounted), Opacus' max_physical_batch_size. Default 128.
    #[arg(long, value_name = "B")]
    pub max_physical_batch_size: Option<usize>,
    /// Epochs E instead of --steps: with --dp steps = ⌈E / q⌉, else ⌈E · N / B⌉.
    #[arg(long, conflicts_with = "steps")]
    pub epochs: Option<f64>,
    /// With --dp: calibrate the noise multiplier so that the run's ε at --delta is at most this
    /// (the calibration search of `dpaudit calibrate`, PLD first), instead of --noise-multiplier.
    #[arg(long, requires = "dp", conflicts_with = "noise_multiplier")]
    pub target_epsilon: Option<f64>,
    #[arg(long, default_value_t = 1e-3)]
    /// Learning rate (Adam).
    pub lr: f64,
    /// EMA decay of the saved weights (0: raw weights).
    #[arg(long, default_value_t = 0.999)]
    pub ema: f64,
    /// Train only on steps ≥ this.
    #[arg(long, default_value_t = 0)]
    pub t_min: usize,
    /// Train only on steps ≤ this (default T−1; RAPID: v).
    #[arg(long)]
    pub t_max: Option<usize>,
    /// Start from the weights of this checkpoint (its model config wins). With --dp its ledger is
    /// composed into the new one; a checkpoint without a ledger that trained on any of the
    /// private rows is refused.
    #[arg(long)]
    pub init: Option<PathBuf>,
    /// With --unet: every N steps, rewrite <out>/checkpoint/ with the folder the run would
    /// release at that step (EMA weights, card, and for --dp the ledger of the steps so far), so
    /// a long run that stops early leaves a usable, accounted model. Resume with
    /// `--init <out>/checkpoint --steps <the rest>` (the ledgers compose; Adam and EMA restart).
    #[arg(long, value_name = "N")]
    pub checkpoint_every: Option<usize>,
    /// With --unet: sign the released folder (weights, card, ledger, canaries, config) with this
    /// Ed25519 secret key file (`dpaudit model keygen`): `dpaudit-signature.toml` is written in
    /// the same set. Readers verify it with --trust-key.
    #[arg(long, value_name = "KEY")]
    pub sign_key: Option<PathBuf>,
    /// With --unet --init: the --init folder must be signed by one of these public keys
    /// (repeatable); a public-only folder is then accepted on its signer's word, not on its card.
    #[arg(long, value_name = "PUBKEY")]
    pub trust_key: Vec<PathBuf>,
    /// Seed every draw (weights, batches, DP sampling and noise) for a reproducible run. The
    /// card then says "seeded: not private against anyone who knows the seed". Without it, DP
    /// randomness comes from the operating system's CSPRNG.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Canaries for a one-run audit (`mia --audit one-run`): m random images, each added to the
    /// private rows with probability ½; writes <out>.canaries.csv.
    #[arg(long, default_value_t = 0)]
    pub canaries: usize,
    /// What the canaries are: `input` (records of ±1 values, audited black-box from the
    /// released model) or `gradient` (with --dp: Dirac gradient canaries of norm 2C, clipped to
    /// C like any record, observed in every noisy update: the white-box audit; also writes
    /// <out>.canary-observations.npy); `both` (with --unet --dp): m of each in the same run, so
    /// the black-box and the white-box audit measure one training.
    #[arg(long, value_enum, default_value = "input")]
    pub canary_kind: CanaryKindArg,
    /// With --canary-kind both: the number of gradient canaries (default: --canaries). Input
    /// canaries are trained on like rows (they cost training time); gradient canaries cost
    /// only their observations, so a run can afford many more of them.
    #[arg(long)]
    pub gradient_canaries: Option<usize>,
    #[arg(long, value_enum, default_value = "auto")]
    /// Device to train on (auto: CUDA when built with it and present, else CPU).
    pub device: DeviceChoice,
    /// No progress bars or notes on stderr.
    #[arg(long, short, conflicts_with = "verbose")]
    pub quiet: bool,

    /// Train with DP-SGD (RAPID Algorithm 2): Poisson sampling, clipping, Gaussian noise, Adam.
    #[arg(long)]
    pub dp: bool,
    /// σ: noise std = σ·C.
    #[arg(long, default_value_t = 1.0)]
    pub noise_multiplier: f64,
    /// Per-sample gradient norm bound C.
    #[arg(long, default_value_t = 1.0)]
    pub clip: f64,
    /// Poisson sampling rate q (default 0.16, or B / N from --batch-size).
    #[arg(long = "sample-rate", value_name = "Q")]
    pub sample_rate_flag: Option<f64>,
    /// The sampling rate the trainer uses (resolved from --sample-rate or --batch-size).
    #[arg(skip = 0.16f64)]
    pub sample_rate: f64,
    /// δ of the ledger and of the ε the card records.
    #[arg(long, default_value_t = 1e-5)]
    pub delta: f64,
    /// Per-sample gradients: auto (one pass for the MLP), ghost, loop.
    #[arg(long, value_enum, default_value = "auto")]
    pub per_sample: PerSample,
    /// RAPID retrieval variant: pretrain on public rows, build the knowledge base, DP-fine-tune
    /// steps ≤ v on the members.
    #[arg(long, requires = "dp")]
    pub rapid: bool,
    /// Non-DP pretraining steps on the first half of the public rows (RAPID).
    #[arg(long, default_value_t = 4000)]
    pub pretrain_steps: usize,
    /// RAPID query step k.
    #[arg(long, default_value_t = 600)]
    pub rapid_k: usize,
    /// RAPID value step v (< k).
    #[arg(long, default_value_t = 300)]
    pub rapid_v: usize,
    /// Train a diffusers UNet2DModel instead: a config.json (or its folder) or a preset (`tiny`,
    /// `mnist-ddpm`, `ddpm-cifar10`). --out is then a folder that diffusers' from_pretrained loads (config.json,
    /// diffusion_pytorch_model.safetensors, scheduler_config.json) with dpaudit-card.toml,
    /// training.json and, with --dp, dpaudit-ledger.toml; --data/--split default to the shipped
    /// MNIST; under --dp --batch-size is the expected batch (q = B / N, as in Opacus) and
    /// --max-physical-batch-size the per-sample-gradient chunk of candle's batched pass (CUDA, and
    /// architectures the CPU pass does not cover); --init takes a diffusers folder.
    #[arg(long, value_name = "CONFIG|PRESET")]
    pub unet: Option<std::ffi::OsString>,
}

/// Runs `dpaudit train`.
pub fn run(mut a: Args) -> anyhow::Result<dpaudit::audit::outcome::Verdict> {
    use dpaudit::audit::train;
    // Output locations are checked (and existing files refused) before any work.
    let outputs = crate::cli::common::OutputArgs {
        format: a.format,
        out: None,
        force: a.force,
        quiet: a.quiet,
        verbose: a.verbose,
    }
    .prepare(crate::cli::common::Format::Text, &[])?;
    train::check_loop_lengths(a.steps, a.rapid.then_some(a.pretrain_steps))?;
    if let Some(out) = &a.make_split {
        let wrote = train::make_split(&train::SplitPlan {
            data: a.data.clone(),
            out: out.clone(),
            members: a.members,
            nonmembers: a.nonmembers,
            seed: a.seed,
            force: a.force,
        })?;
        dpaudit::report::output::emit_stdout(wrote.as_bytes())?;
        return Ok(dpaudit::audit::outcome::Verdict::Holds);
    }
    let sizes = train::resolve_flags(&train::TrainFlags {
        unet: a.unet.is_some(),
        dp: a.dp,
        batch: a.batch,
        max_physical_batch_size: a.max_physical_batch_size,
        sample_rate: a.sample_rate_flag,
        epochs: a.epochs,
        target_epsilon: a.target_epsilon,
        steps: a.steps,
        noise_multiplier: a.noise_multiplier,
        delta: a.delta,
        split: if a.unet.is_some() {
            crate::cli::train_unet::data_and_split(&a).1
        } else {
            a.split.clone()
        },
        on: a.on.into(),
        quiet: a.quiet,
    })?;
    (a.batch_size, a.sample_rate, a.steps, a.noise_multiplier) =
        (sizes.batch_size, sizes.sample_rate, sizes.steps, sizes.noise_multiplier);
    if let Some(unet) = a.unet.clone() {
        return crate::cli::train_unet::run(a, &unet, outputs);
    }
    if a.checkpoint_every.is_some() {
        return Err(Error::field(
            "--checkpoint-every",
            "periodic checkpoints are written by `train --unet` runs",
        )
        .into());
    }
    for (given, flag) in [
        (a.sign_key.is_some(), "--sign-key"),
        (!a.trust_key.is_empty(), "--trust-key"),
    ] {
        if given {
            return Err(Error::field(flag, "signed provenance is written and checked by `train --unet` runs").into());
        }
    }
    let Some(out) = a.out.clone().map(folder_or_stem) else {
        return Err(Error::field("--out", "give an output folder, e.g. --out models/digits-mlp/").into());
    };
    if a.gradient_canaries.is_some() && !matches!(a.canary_kind, CanaryKindArg::Both) {
        return Err(Error::field(
            "--gradient-canaries",
            "sets the gradient canaries of --canary-kind both (with one kind, --canaries is the count)",
        )
        .into());
    }
    let both = a.canaries > 0 && matches!(a.canary_kind, CanaryKindArg::Both);
    let gradient_canaries = if both {
        a.gradient_canaries.unwrap_or(a.canaries)
    } else {
        0
    };
    let gradient = a.canaries > 0 && matches!(a.canary_kind, CanaryKindArg::Gradient | CanaryKindArg::Both);
    for p in stem_files(&out, a.dp, a.canaries > 0, gradient, both) {
        dpaudit::report::output::check_file(&p, a.force)?;
    }
    if a.rapid && !a.dp {
        return Err(Error::field("--rapid", "needs --dp").into());
    }
    let (canaries, gradient_canaries) = match a.canary_kind {
        CanaryKindArg::Input => (a.canaries, 0),
        CanaryKindArg::Gradient => (0, a.canaries),
        CanaryKindArg::Both => (a.canaries, gradient_canaries),
    };
    let plan = Plan {
        train: train_plan(
            &a,
            (a.data.clone(), a.split.clone()),
            out,
            (canaries, gradient_canaries),
            None,
        ),
        model: Model::Toy(ToyPlan {
            model: ModelConfig {
                arch: a.arch.into(),
                hidden: a.hidden,
                depth: a.depth,
                time_dim: a.time_dim,
                channels: a.channels,
            },
            schedule: schedule_config(&a),
            rapid: (a.dp && a.rapid).then_some(Rapid {
                pretrain_steps: a.pretrain_steps,
                k: a.rapid_k,
                v: a.rapid_v,
            }),
        }),
    };
    Ok(outputs.emit(train::execute(&plan)?)?)
}

/// `--out`: a folder (an existing one, or a path ending in `/`) receives `<folder>/<name>.toml`,
/// `.safetensors`, … where `<name>` is the folder's own name, like every other command's
/// `--out DIR`; any other path is the stem of those files, as before.
fn folder_or_stem(p: PathBuf) -> PathBuf {
    let text = p.to_string_lossy();
    let folder = text.ends_with('/') || text.ends_with(std::path::MAIN_SEPARATOR) || p.is_dir();
    if !folder {
        return p;
    }
    let name = p
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| "model".into());
    p.join(name)
}

/// The files a training run writes for `--out STEM`.
fn stem_files(stem: &Path, dp: bool, canaries: bool, gradient: bool, both: bool) -> Vec<PathBuf> {
    let mut exts = vec!["safetensors", "toml"];
    if dp {
        exts.push("ledger.toml");
    }
    if canaries {
        exts.push("canaries.csv");
    }
    if gradient {
        exts.push("canary-observations.npy");
    }
    if both {
        exts.push("gradient-canaries.csv");
    }
    exts.iter()
        .map(|ext| PathBuf::from(format!("{}.{ext}", stem.display())))
        .collect()
}

/// `--canary-kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CanaryKindArg {
    /// Records of ±1 values (black-box audit).
    Input,
    /// Dirac gradient canaries observed in every noisy update (white-box audit; needs --dp).
    Gradient,
    /// m input and m gradient canaries in one run (--unet --dp).
    Both,
}

impl From<CanaryKindArg> for dpaudit::models::canary::CanaryKind {
    fn from(k: CanaryKindArg) -> Self {
        match k {
            CanaryKindArg::Input => Self::Input,
            CanaryKindArg::Gradient => Self::Gradient,
            // Both: the input canaries' kind; the gradient ones are counted apart.
            CanaryKindArg::Both => Self::Input,
        }
    }
}

/// The family-independent part of a `train` plan (the orchestrator's [`TrainPlan`]) from the
/// arguments: data and split, the output, the (input, gradient) canary counts, and the signing
/// key (`train --unet` only).
pub(crate) fn train_plan(
    a: &Args,
    (data, split): (PathBuf, PathBuf),
    out: PathBuf,
    (canaries, gradient_canaries): (usize, usize),
    sign_key: Option<ed25519_dalek::SigningKey>,
) -> TrainPlan {
    TrainPlan {
        data,
        split,
        on: a.on.into(),
        out,
        steps: a.steps,
        batch_size: a.batch_size,
        lr: a.lr,
        ema: a.ema,
        t_min: a.t_min,
        t_max: a.t_max,
        init: a.init.clone(),
        seed: a.seed,
        canaries,
        gradient_canaries,
        dp: a.dp.then_some(DpPlan {
            noise_multiplier: a.noise_multiplier,
            clip: a.clip,
            sample_rate: a.sample_rate,
            delta: a.delta,
            per_sample: a.per_sample.into(),
        }),
        device: a.device.into(),
        command: dpaudit::report::command_line(),
        quiet: a.quiet,
        force: a.force,
        checkpoint_every: a.checkpoint_every,
        sign_key,
        defect: None,
    }
}

/// The training noise schedule of `--timesteps`, `--beta-start`, `--beta-end`.
pub(crate) fn schedule_config(a: &Args) -> TrainingScheduleConfig {
    TrainingScheduleConfig {
        timesteps: a.timesteps,
        beta_start: a.beta_start,
        beta_end: a.beta_end,
    }
}
