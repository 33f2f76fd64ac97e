//! `dpaudit train`: train a small denoiser on a split of the digits data, with or without DP
//! (RAPID's Algorithm 2, optionally with its retrieval knowledge base), and write a checkpoint
//! (safetensors + card) and, for DP runs, the ledger of the DpEvent that ran.

use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::models::checkpoint::{self, Card, DataInfo, DpInfo, RapidInfo, TrainingInfo};
use crate::models::data::{indices_sha256, sha256_file, Part};
use crate::models::dp::{self, DpConfig, KnowledgeBase, PerSample, Retrieval};
use crate::models::schedule::ScheduleConfig;
use crate::models::train::{self, TrainConfig};
use crate::models::{device, Arch, Dataset, DeviceChoice, ModelConfig, Net, Schedule, SplitManifest};

const EXAMPLES: &str = "\
Examples:
  # The member/non-member/public split shipped in fixtures/splits/ (disjoint, hashed):
  dpaudit train --make-split fixtures/splits/digits.toml --members 400 --nonmembers 400 --seed 0

  # A non-DP MLP on the members (the shipped models/digits-mlp checkpoint):
  dpaudit train --split fixtures/splits/digits.toml --on members --arch mlp --hidden 256 --depth 3 \\
      --steps 20000 --batch-size 128 --lr 1e-3 --seed 0 --out models/digits-mlp

  # RAPID: pretrain on public rows, knowledge base (k = 600, v = 300), DP fine-tuning of steps ≤ v
  # on the members; writes models/digits-rapid.ledger.toml as well:
  dpaudit train --dp --rapid --pretrain-steps 4000 --rapid-k 600 --rapid-v 300 \\
      --noise-multiplier 8 --clip 1 --sample-rate 0.16 --steps 200 --lr 1e-3 --seed 0 \\
      --out models/digits-rapid
  dpaudit account --event models/digits-rapid.ledger.toml --delta 1e-5

Outputs: <out>.safetensors (EMA weights), <out>.toml (card: model, schedule, data and split
SHA-256, seed, steps, the exact command), <out>.ledger.toml for DP runs (an event file).";

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
    /// Output stem: writes <out>.safetensors and <out>.toml (and <out>.ledger.toml for DP runs);
    /// missing folders are created, existing files are refused before any work unless --force.
    #[arg(long, value_name = "STEM")]
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
    /// Batch size (non-DP; DP batches are Poisson samples at --sample-rate).
    #[arg(long, default_value_t = 128)]
    pub batch_size: usize,
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
    /// Start from the weights of this checkpoint (same model config).
    #[arg(long)]
    pub init: Option<PathBuf>,
    #[arg(long, default_value_t = 0)]
    /// Seed of initialisation, batches and noise.
    pub seed: u64,
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
    /// Poisson sampling rate q.
    #[arg(long, default_value_t = 0.16)]
    pub sample_rate: f64,
    /// δ written into the ledger.
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
}

fn bar(len: u64, quiet: bool, what: &str) -> indicatif::ProgressBar {
    crate::report::progress::bar(len, quiet, what)
}

fn command_line() -> String {
    crate::report::command_line()
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

/// The files a training run writes for `--out STEM`.
fn stem_files(stem: &Path) -> [PathBuf; 3] {
    ["safetensors", "toml", "ledger.toml"].map(|ext| PathBuf::from(format!("{}.{ext}", stem.display())))
}

/// Runs `dpaudit train`.
pub fn run(a: Args) -> anyhow::Result<i32> {
    // Output locations are checked (and existing files refused) before any work.
    let outputs = crate::cli::common::OutputArgs {
        format: a.format,
        out: None,
        force: a.force,
        quiet: a.quiet,
        verbose: a.verbose,
    }
    .prepare(crate::cli::common::Format::Text, &[])?;
    if let Some(out) = &a.make_split {
        crate::report::output::check_file(out, a.force)?;
    } else if let Some(stem) = &a.out {
        for p in stem_files(stem) {
            crate::report::output::check_file(&p, a.force)?;
        }
    }
    if let Some(out) = &a.make_split {
        let data = Dataset::load(&a.data)?;
        let m = SplitManifest::random(&data, &path_str(&a.data), a.members, a.nonmembers, a.seed)?;
        crate::report::output::write_atomic(out, m.to_toml()?.as_bytes(), a.force)?;
        crate::report::output::emit_stdout(
            format!(
                "wrote {}: {} members, {} non-members, {} public (seed {})\n",
                out.display(),
                m.members.len(),
                m.nonmembers.len(),
                m.public.len(),
                a.seed
            )
            .as_bytes(),
        )?;
        return Ok(crate::cli::EXIT_OK);
    }
    let Some(out) = a.out.clone() else {
        return Err(Error::field("--out", "give an output stem, e.g. --out models/digits-mlp").into());
    };
    let dev = device::select(a.device)?;
    let dev_name = device::describe(&dev);
    eprintln!("device: {dev_name}");
    let data = Dataset::load(&a.data)?;
    let split = SplitManifest::load(&a.split)?;
    split.check_data(&data).map_err(|e| e.with_file(&a.split))?;
    let sched_cfg = ScheduleConfig {
        timesteps: a.timesteps,
        beta_start: a.beta_start,
        beta_end: a.beta_end,
    };
    let schedule = Schedule::new(sched_cfg)?;
    let mut model_cfg = ModelConfig {
        arch: a.arch,
        hidden: a.hidden,
        depth: a.depth,
        time_dim: a.time_dim,
        channels: a.channels,
    };
    // Start point: a fresh net or the weights of --init (whose config wins; it must match).
    let net = match &a.init {
        Some(p) => {
            let ck = crate::models::Checkpoint::load(p, &dev)?;
            if ck.card.schedule != sched_cfg {
                return Err(Error::field(
                    "--init",
                    format!(
                        "{} uses a different noise schedule (T = {}, β from {} to {}); pass the same --timesteps, --beta-start and --beta-end",
                        p.display(),
                        ck.card.schedule.timesteps,
                        ck.card.schedule.beta_start,
                        ck.card.schedule.beta_end
                    ),
                )
                .into());
            }
            model_cfg = ck.card.model;
            ck.net
        }
        None => Net::new(&model_cfg, a.seed, &dev)?,
    };
    let rows_ix = split.part(a.on).to_vec();
    let x0 = data.rows(&rows_ix);
    let t_max = a.t_max.unwrap_or(schedule.len() - 1);
    eprintln!(
        "model: {}, {} parameters; training on {} {} rows",
        format!("{:?}", model_cfg.arch).to_lowercase(),
        net.params.count(),
        rows_ix.len(),
        format!("{:?}", a.on).to_lowercase()
    );

    let mut dp_info = None;
    let mut ledger = None;
    let (log, steps, t_min, t_max, batch) = if a.dp {
        let (rag_parts, t_max) = if a.rapid {
            if a.t_max.is_some() {
                return Err(Error::field(
                    "--t-max",
                    "RAPID fine-tunes steps ≤ --rapid-v; do not also give --t-max",
                )
                .into());
            }
            if !(a.rapid_v < a.rapid_k && a.rapid_k < schedule.len()) {
                return Err(Error::field(
                    "--rapid-k",
                    format!("need v < k < T, got k = {}, v = {}", a.rapid_k, a.rapid_v),
                )
                .into());
            }
            let public = &split.public;
            if public.len() < 2 {
                return Err(Error::input("RAPID needs public rows in the split")
                    .with_file(&a.split)
                    .into());
            }
            let (pre, refr) = public.split_at(public.len() / 2);
            let pre_x = data.rows(pre);
            if a.init.is_none() && a.pretrain_steps > 0 {
                let b = bar(a.pretrain_steps as u64, a.quiet, "pretrain");
                let cfg = TrainConfig {
                    steps: a.pretrain_steps,
                    batch_size: a.batch_size,
                    lr: a.lr,
                    ema_decay: a.ema,
                    seed: a.seed ^ 0x9e7,
                    t_min: 0,
                    t_max: schedule.len() - 1,
                };
                let l = train::train(&net, &schedule, &pre_x, &cfg, Some(&b))?;
                b.finish_and_clear();
                eprintln!(
                    "pretrained on {} public rows: loss {:.4} -> {:.4}",
                    pre.len(),
                    l.eval_loss_before,
                    l.eval_loss_after
                );
            }
            // A frozen deep copy of the pretrained model (`Net::clone` would share variables).
            let frozen = {
                let f = Net::new(&model_cfg, 0, &dev)?;
                train::copy_params(&f, &net)?;
                f
            };
            let kb = KnowledgeBase::build(&frozen, &schedule, &data.rows(refr), a.rapid_k, a.rapid_v, a.seed)?;
            eprintln!(
                "knowledge base: {} trajectories (key at k = {}, value at v = {})",
                kb.len(),
                kb.k,
                kb.v
            );
            (
                Some((
                    frozen,
                    kb,
                    RapidInfo {
                        k: a.rapid_k,
                        v: a.rapid_v,
                        pretrain_steps: if a.init.is_none() { a.pretrain_steps } else { 0 },
                        pretrain_rows: pre.len(),
                        kb_rows: refr.len(),
                    },
                )),
                a.rapid_v,
            )
        } else {
            (None, t_max)
        };
        let cfg = DpConfig {
            noise_multiplier: a.noise_multiplier,
            clip: a.clip,
            sample_rate: a.sample_rate,
            steps: a.steps as u64,
            lr: a.lr,
            ema_decay: a.ema,
            seed: a.seed,
            delta: a.delta,
            t_min: a.t_min,
            t_max,
            per_sample: a.per_sample,
        };
        let b = bar(a.steps as u64, a.quiet, "dp-sgd");
        let rag = rag_parts.as_ref().map(|(f, kb, _)| Retrieval { kb, pretrained: f });
        let run = dp::dp_train(&net, &schedule, &x0, &cfg, rag.as_ref(), Some(&b))?;
        b.finish_and_clear();
        let method = match (a.per_sample, net.supports_probe()) {
            (PerSample::Loop, _) | (PerSample::Auto, false) => "loop",
            _ => "ghost",
        };
        let ledger_path = PathBuf::from(format!("{}.ledger.toml", out.display()));
        dp_info = Some(DpInfo {
            noise_multiplier: a.noise_multiplier,
            clip: a.clip,
            sample_rate: a.sample_rate,
            steps: a.steps as u64,
            delta: a.delta,
            per_sample: method.into(),
            ledger: ledger_path.file_name().unwrap().to_string_lossy().into_owned(),
            rapid: rag_parts.map(|(_, _, info)| info),
        });
        eprintln!(
            "mean Poisson batch: {:.1} (expected {:.1})",
            run.mean_batch,
            a.sample_rate * rows_ix.len() as f64
        );
        ledger = Some((ledger_path, run.event.clone()));
        (
            run.log,
            a.steps,
            a.t_min,
            t_max,
            (a.sample_rate * rows_ix.len() as f64).round() as usize,
        )
    } else {
        if a.rapid {
            return Err(Error::field("--rapid", "needs --dp").into());
        }
        let cfg = TrainConfig {
            steps: a.steps,
            batch_size: a.batch_size,
            lr: a.lr,
            ema_decay: a.ema,
            seed: a.seed,
            t_min: a.t_min,
            t_max,
        };
        let b = bar(a.steps as u64, a.quiet, "train");
        let log = train::train(&net, &schedule, &x0, &cfg, Some(&b))?;
        b.finish_and_clear();
        (log, a.steps, a.t_min, t_max, a.batch_size)
    };

    let mut card = Card {
        schema_version: 1,
        weights: String::new(),
        weights_sha256: String::new(),
        parameters: 0,
        model: model_cfg,
        schedule: sched_cfg,
        data: DataInfo {
            file: path_str(&a.data),
            sha256: data.sha256.clone(),
            split: path_str(&a.split),
            split_sha256: sha256_file(&a.split)?,
            trained_on: a.on,
            rows_sha256: indices_sha256(&rows_ix),
            rows: rows_ix.len(),
        },
        training: TrainingInfo {
            seed: a.seed,
            steps,
            batch_size: batch,
            lr: a.lr,
            ema_decay: a.ema,
            t_min,
            t_max,
            device: dev_name.clone(),
            command: command_line(),
            eval_loss_before: log.eval_loss_before,
            eval_loss_after: log.eval_loss_after,
            init: a.init.as_ref().map(|p| path_str(p)),
        },
        dp: dp_info,
    };
    let card_path = checkpoint::save(&out, &net, &mut card)?;
    let mut text = format!(
        "denoising loss (fixed evaluation draws): {} -> {}\nwrote {} and {}\n",
        crate::report::export::fmt_num(log.eval_loss_before),
        crate::report::export::fmt_num(log.eval_loss_after),
        card_path.display(),
        card.weights
    );
    let mut ledger_event = None;
    if let Some((p, ev)) = ledger {
        let text_ledger = dp::ledger_toml(
            &ev,
            a.delta,
            &format!(
                "DpEvent that ran in `{}`\n(RAPID Algorithm 2: Poisson sampling q, clipping C = {}, Gaussian noise σ·C, add/remove-one neighbours)",
                command_line(),
                a.clip
            ),
        )?;
        crate::report::output::write_atomic(&p, text_ledger.as_bytes(), true)?;
        text.push_str(&format!(
            "wrote {} — account it with: dpaudit account --event {} --delta {}\n{}",
            p.display(),
            p.display(),
            a.delta,
            ev.ledger()
        ));
        ledger_event = Some(ev);
    }
    let rep = crate::audit::train::report(&card, &card_path, ledger_event.as_ref())?;
    outputs.finish(&rep, &text, Vec::new())?;
    Ok(crate::cli::EXIT_OK)
}
