//! `dpaudit train`: arguments → [`TrainPlan`] → [`dpaudit::models::run::run`] → exit code.
//! The run itself (DP-SGD, RAPID, canaries, ledger, card) lives in the library.

use std::path::{Path, PathBuf};

use crate::cli::values::{Arch, DeviceChoice, Part, PerSample};
use dpaudit::error::Error;
use dpaudit::models::run::{DpPlan, RapidPlan, TrainPlan};
use dpaudit::models::schedule::ScheduleConfig;
use dpaudit::models::{device, Dataset, ModelConfig, SplitManifest};

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
    /// MNIST; --batch-size is the DP per-sample-gradient chunk of candle's batched pass (CUDA, and
    /// architectures the CPU pass does not cover); --init takes a diffusers folder.
    #[arg(long, value_name = "CONFIG|PRESET")]
    pub unet: Option<std::ffi::OsString>,
}

/// Runs `dpaudit train`.
pub fn run(mut a: Args) -> anyhow::Result<dpaudit::audit::outcome::Verdict> {
    // Output locations are checked (and existing files refused) before any work.
    let outputs = crate::cli::common::OutputArgs {
        format: a.format,
        out: None,
        force: a.force,
        quiet: a.quiet,
        verbose: a.verbose,
    }
    .prepare(crate::cli::common::Format::Text, &[])?;
    // Loop lengths from flags are bounded before any data is read (docs/reliability.md).
    dpaudit::limits::check_count("--steps", a.steps as u64, dpaudit::limits::TRAIN_STEP)?;
    if a.rapid {
        dpaudit::limits::check_count("--pretrain-steps", a.pretrain_steps as u64, dpaudit::limits::TRAIN_STEP)?;
    }
    if let Some(out) = &a.make_split {
        dpaudit::report::output::check_file(out, a.force)?;
        let data = Dataset::load(&a.data)?;
        let seed = a.seed.unwrap_or(0);
        let m = SplitManifest::random(&data, &a.data.display().to_string(), a.members, a.nonmembers, seed)?;
        if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, &e))?;
        }
        dpaudit::report::output::write_atomic(out, m.to_toml()?.as_bytes(), a.force)?;
        dpaudit::report::output::emit_stdout(
            format!(
                "wrote {}: {} members, {} non-members, {} public (seed {seed})\n",
                out.display(),
                m.members.len(),
                m.nonmembers.len(),
                m.public.len(),
            )
            .as_bytes(),
        )?;
        return Ok(dpaudit::audit::outcome::Verdict::Holds);
    }
    opacus(&mut a)?;
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
    let dev = device::select(a.device.into())?;
    let dev_name = device::describe(&dev);
    dpaudit::report::progress::note(&format!("device: {dev_name}"));
    let plan = TrainPlan {
        data: a.data,
        split: a.split,
        on: a.on.into(),
        out,
        model: ModelConfig {
            arch: a.arch.into(),
            hidden: a.hidden,
            depth: a.depth,
            time_dim: a.time_dim,
            channels: a.channels,
        },
        schedule: ScheduleConfig {
            timesteps: a.timesteps,
            beta_start: a.beta_start,
            beta_end: a.beta_end,
        },
        steps: a.steps,
        batch_size: a.batch_size,
        lr: a.lr,
        ema: a.ema,
        t_min: a.t_min,
        t_max: a.t_max,
        init: a.init,
        seed: a.seed,
        canaries: a.canaries,
        canary_kind: a.canary_kind.into(),
        gradient_canaries,
        defect: None,
        dp: a.dp.then_some(DpPlan {
            noise_multiplier: a.noise_multiplier,
            clip: a.clip,
            sample_rate: a.sample_rate,
            delta: a.delta,
            per_sample: a.per_sample.into(),
            rapid: a.rapid.then_some(RapidPlan {
                pretrain_steps: a.pretrain_steps,
                k: a.rapid_k,
                v: a.rapid_v,
            }),
        }),
        command: dpaudit::report::command_line(),
        quiet: a.quiet,
        force: a.force,
    };
    Ok(outputs.emit(dpaudit::audit::train::execute(&plan, &dev, &dev_name)?)?)
}

/// Opacus' flags (--batch-size as the expected batch under --dp, --epochs, --target-epsilon)
/// resolved into q, steps and σ ([`dpaudit::audit::train::resolve_opacus`]); the derivation is
/// noted on stderr unless -q.
fn opacus(a: &mut Args) -> dpaudit::error::Result<()> {
    use dpaudit::audit::train::{resolve_opacus, OpacusFlags};
    let unet = a.unet.is_some();
    if a.max_physical_batch_size.is_some() && !unet {
        return Err(Error::field(
            "--max-physical-batch-size",
            "only with --unet (the per-sample-gradient chunk of its batched pass)",
        ));
    }
    // --unet: --batch-size stays the batch of its passes (the memory chunk under --dp), which
    // --max-physical-batch-size names explicitly.
    a.batch_size = if unet {
        a.max_physical_batch_size.or(a.batch).unwrap_or(128)
    } else {
        a.batch.unwrap_or(128)
    };
    a.sample_rate = a.sample_rate_flag.unwrap_or(0.16);
    // Opacus' meaning: under --dp without --sample-rate, --batch-size is the expected batch.
    let expected_batch = a.batch.filter(|_| a.dp && !unet && a.sample_rate_flag.is_none());
    if a.epochs.is_none() && a.target_epsilon.is_none() && expected_batch.is_none() {
        return Ok(());
    }
    if unet && !a.dp && a.epochs.is_some() {
        return Err(Error::field(
            "--epochs",
            "with --unet give --steps (or --dp with --sample-rate)",
        ));
    }
    // N: the private training rows (the trained-on part of the split).
    let rows = if a.dp && expected_batch.is_none() {
        usize::MAX
    } else {
        SplitManifest::load(&a.split)?.part(a.on.into()).len()
    };
    if !a.dp {
        let e = a.epochs.expect("checked above");
        if !(e.is_finite() && e > 0.0) {
            return Err(Error::field("--epochs", format!("must be a positive number, got {e}")));
        }
        a.steps = ((e * rows as f64 / a.batch_size.max(1) as f64).ceil() as usize).max(1);
        dpaudit::limits::check_count("--epochs", a.steps as u64, dpaudit::limits::TRAIN_STEP)?;
        return Ok(());
    }
    let flags = OpacusFlags {
        batch_size: expected_batch,
        epochs: a.epochs,
        target_epsilon: a.target_epsilon,
    };
    let r = resolve_opacus(flags, rows, a.sample_rate, a.steps, a.noise_multiplier, a.delta)?;
    if !a.quiet {
        for l in &r.lines {
            dpaudit::report::progress::note(l);
        }
    }
    a.sample_rate = r.sample_rate;
    a.steps = r.steps;
    a.noise_multiplier = r.noise_multiplier;
    Ok(())
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
