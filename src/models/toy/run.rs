//! `dpaudit train` as one library call: a validated [`TrainPlan`] in; the checkpoint, its card,
//! the DP ledger (with the ε it spent) and the canaries file out ([`run`]).
//!
//! Privacy rules this module enforces:
//! * DP randomness (Poisson sampling, the examples' draws, the Gaussian noise) comes from the
//!   operating system's CSPRNG unless `seed` is given; then the card says
//!   [`RANDOMNESS_SEEDED`].
//! * `--init M` either composes M's ledger into the new one, or — when M has no ledger — is
//!   refused if M's trained-on rows overlap the private rows (by the split and row hashes of
//!   M's card).
//! * The card of a DP run publishes no unnoised statistic of the private rows: its loss
//!   evaluation uses the public rows.

use std::path::{Path, PathBuf};

use candle_core::Device;
use indicatif::ProgressBar;
use rand::TryRngCore;

use super::checkpoint::{self, Card};
use super::dp::{self, DpConfig, KnowledgeBase, PerSample, Retrieval};
use super::train::{self, TrainConfig};
use super::{Checkpoint, ModelConfig, Net, PIXELS};
use crate::data::digits::{indices_sha256, sha256_file, Part};
use crate::data::{Dataset, SplitManifest};
use crate::diffusion::schedule::table::{TrainingSchedule, TrainingScheduleConfig};
use crate::error::{Error, Result};
use crate::events::{DpEvent, EventFile, Neighbouring};
use crate::models::canary::{Canaries, CanaryKind, Defect, GradientCanaries, WhiteBoxRecorder};
use crate::models::card::{
    self, CanaryInfo, DataInfo, DpInfo, RapidInfo, TrainingInfo, RANDOMNESS_OS, RANDOMNESS_SEEDED,
};

/// RAPID's retrieval variant.
#[derive(Debug, Clone, Copy)]
pub struct RapidPlan {
    /// Non-DP pretraining steps on the first half of the public rows.
    pub pretrain_steps: usize,
    /// Query step k.
    pub k: usize,
    /// Value step v < k.
    pub v: usize,
}

/// DP-SGD settings of a plan.
#[derive(Debug, Clone, Copy)]
pub struct DpPlan {
    /// σ.
    pub noise_multiplier: f64,
    /// C.
    pub clip: f64,
    /// q.
    pub sample_rate: f64,
    /// δ of the ledger and of the ε the card records.
    pub delta: f64,
    /// Per-sample gradient method.
    pub per_sample: PerSample,
    /// RAPID.
    pub rapid: Option<RapidPlan>,
}

/// Everything a training run needs.
#[derive(Debug, Clone)]
pub struct TrainPlan {
    /// Data file.
    pub data: PathBuf,
    /// Split manifest.
    pub split: PathBuf,
    /// Part of the split trained on (the private rows).
    pub on: Part,
    /// Output stem.
    pub out: PathBuf,
    /// Model (ignored with `init`: the init's config wins).
    pub model: ModelConfig,
    /// Noise schedule.
    pub schedule: TrainingScheduleConfig,
    /// Optimiser steps.
    pub steps: usize,
    /// Batch size (non-DP).
    pub batch_size: usize,
    /// Learning rate.
    pub lr: f64,
    /// EMA decay.
    pub ema: f64,
    /// Lowest step trained.
    pub t_min: usize,
    /// Highest step trained (default T − 1; RAPID: v).
    pub t_max: Option<usize>,
    /// Starting checkpoint.
    pub init: Option<PathBuf>,
    /// `--seed` (None: randomness from the OS).
    pub seed: Option<u64>,
    /// Canaries for a one-run audit (0: none).
    pub canaries: usize,
    /// Input canaries (black-box) or gradient canaries (white-box, DP only).
    pub canary_kind: CanaryKind,
    /// With input canaries (`canary_kind` input): this many gradient canaries too, in the same
    /// run (`--canary-kind both`; 0: none).
    pub gradient_canaries: usize,
    /// A defect to train with (tests of the audit only; never a user flag).
    #[doc(hidden)]
    pub defect: Option<Defect>,
    /// DP-SGD.
    pub dp: Option<DpPlan>,
    /// The device to train on (`--device`; selected by `audit::train`, recorded in the card).
    pub device: crate::models::DeviceChoice,
    /// The command line recorded in the card.
    pub command: String,
    /// No progress bars.
    pub quiet: bool,
    /// Replace an earlier run's files of the same stem (`--force`).
    pub force: bool,
}

/// What a run wrote and spent.
#[derive(Debug, Clone)]
pub struct TrainOutcome {
    /// The card.
    pub card_path: PathBuf,
    /// The card's contents.
    pub card: Card,
    /// The ledger file (DP runs).
    pub ledger_path: Option<PathBuf>,
    /// The whole ledger (DP runs).
    pub event: Option<DpEvent>,
    /// Lines for the user (stdout).
    pub lines: Vec<String>,
}

fn bar(len: u64, quiet: bool, what: &str) -> ProgressBar {
    crate::report::progress::bar(len, quiet, what)
}

/// The ledger an `--init` checkpoint brings, after checking it may be used at all.
fn init_cost(
    ck: &Checkpoint,
    init_path: &Path,
    data: &Dataset,
    private_ix: &[usize],
) -> Result<Option<(DpEvent, PathBuf)>> {
    if let Some(dp) = &ck.card.dp {
        let p = ck.dir().join(&dp.ledger);
        let f = EventFile::load(&p)?;
        if f.neighbouring != Neighbouring::AddRemove {
            return Err(Error::field(
                "--init",
                format!("{} accounts under a different neighbouring relation", p.display()),
            ));
        }
        return Ok(Some((f.event, p)));
    }
    // No ledger: allowed only if its training rows are provably disjoint from the private rows.
    let refuse = |why: String| {
        Err(Error::field(
            "--init",
            format!(
                "{} has no DP ledger and {why}; its privacy cost cannot be composed. Start from a checkpoint trained on public rows or one with a ledger",
                init_path.display()
            ),
        ))
    };
    if ck.card.data.sha256 != data.sha256 {
        // A different data file: none of these private rows was trained on.
        return Ok(None);
    }
    let split_path = ck.split_file().unwrap_or_else(|_| PathBuf::from(&ck.card.data.split));
    let Ok(sha) = sha256_file(&split_path) else {
        return refuse(format!(
            "its split {} cannot be read to check for overlap",
            split_path.display()
        ));
    };
    if sha != ck.card.data.split_sha256 {
        return refuse(format!(
            "its split {} does not hash to its card's split_sha256",
            split_path.display()
        ));
    }
    let split = SplitManifest::load(&split_path)?;
    let rows = split.part(ck.card.data.trained_on);
    if indices_sha256(rows) != ck.card.data.rows_sha256 {
        return refuse("its trained-on rows do not hash to its card's rows_sha256".into());
    }
    let overlap = rows.iter().filter(|i| private_ix.contains(i)).count();
    if overlap > 0 {
        return refuse(format!("was trained without DP on {overlap} of the private rows"));
    }
    Ok(None)
}

/// Runs the plan on `device` (described as `device_name` in the card).
pub fn run(plan: &TrainPlan, device: &Device, device_name: &str) -> Result<TrainOutcome> {
    // The card's folder: the paths it records are relative to it.
    let card_dir = checkpoint::stem_parts(&plan.out)?.0;
    let data = Dataset::load(&plan.data)?;
    let split = SplitManifest::load(&plan.split)?;
    split.check_data(&data).map_err(|e| e.with_file(&plan.split))?;
    let schedule = TrainingSchedule::new(plan.schedule)?;
    let mut lines = Vec::new();
    // Public randomness (initialisation, non-DP batches, knowledge base): the seed, or the OS.
    let public_seed = plan
        .seed
        .unwrap_or_else(|| rand::rngs::OsRng.try_next_u64().unwrap_or(0));
    let private_ix = split.part(plan.on).to_vec();
    let mut model_cfg = plan.model;
    let mut init_ledger = None;
    let net = match &plan.init {
        Some(p) => {
            let ck = Checkpoint::load(p, device)?;
            if ck.card.schedule != plan.schedule {
                return Err(Error::field(
                    "--init",
                    format!(
                        "{} uses a different noise schedule ({:?})",
                        p.display(),
                        ck.card.schedule
                    ),
                ));
            }
            if plan.dp.is_some() {
                init_ledger = init_cost(&ck, p, &data, &private_ix)?;
            }
            model_cfg = ck.card.model;
            ck.net
        }
        None => Net::new(&model_cfg, public_seed, device)?,
    };
    crate::limits::check_canaries(plan.canaries, PIXELS)?;
    let (input_m, gradient_m) = match plan.canary_kind {
        CanaryKind::Gradient => (0, plan.canaries),
        CanaryKind::Input => (plan.canaries, plan.gradient_canaries),
    };
    let gradient = gradient_m > 0;
    if gradient {
        crate::limits::check_canaries(gradient_m, 1)?;
        // The white-box record: one float per canary and step, held until the set is written.
        crate::limits::check_canaries(gradient_m, plan.steps)?;
    }
    if gradient && plan.dp.is_none() {
        return Err(Error::field(
            "--canary-kind",
            "gradient canaries are observed in DP-SGD's noisy updates: train with --dp (or use --canary-kind input)",
        ));
    }
    // White-box gradient canaries: distinct parameter coordinates, each included with
    // probability ½ (secret unless seeded).
    let mut recorder = if gradient {
        let shapes: Vec<(String, usize)> = net
            .params
            .vars
            .iter()
            .map(|(k, v)| (k.clone(), v.as_tensor().elem_count()))
            .collect();
        let mut rng = crate::models::dp::secret_rng(plan.seed.map(|s| s ^ 0x67ad_c4a7));
        Some(WhiteBoxRecorder::new(GradientCanaries::generate(
            gradient_m, &shapes, &mut rng,
        )?))
    } else {
        None
    };
    // Canaries: random ±1 images, each included with probability ½ (secret unless seeded).
    let canaries = (input_m > 0).then(|| {
        let mut rng = crate::models::dp::secret_rng(plan.seed.map(|s| s ^ 0xca7a_71e5));
        Canaries::generate(input_m, PIXELS, &mut rng)
    });
    let mut x0 = data.rows(&private_ix);
    if let Some(c) = &canaries {
        x0.extend(c.included_rows());
    }
    let n_private = x0.len() / PIXELS;
    let t_max = plan.t_max.unwrap_or(schedule.len() - 1);
    if !plan.quiet {
        eprintln!(
            "model: {}, {} parameters; training on {} {} rows{}",
            format!("{:?}", model_cfg.arch).to_lowercase(),
            net.params.count(),
            private_ix.len(),
            format!("{:?}", plan.on).to_lowercase(),
            canaries
                .as_ref()
                .map(|c| format!(" + {} canaries (of {})", n_private - private_ix.len(), c.len()))
                .unwrap_or_default()
        );
    }

    let mut dp_info = None;
    let mut ledger = None;
    let (eval, eval_on, steps, t_min, t_max, batch) = match &plan.dp {
        Some(d) => {
            let (rag_parts, t_max) = match &d.rapid {
                Some(r) => {
                    if plan.t_max.is_some() {
                        return Err(Error::field(
                            "--t-max",
                            "RAPID fine-tunes steps ≤ --rapid-v; do not also give --t-max",
                        ));
                    }
                    if !(r.v < r.k && r.k < schedule.len()) {
                        return Err(Error::field(
                            "--rapid-k",
                            format!("need v < k < T, got k = {}, v = {}", r.k, r.v),
                        ));
                    }
                    let public = &split.public;
                    if public.len() < 2 {
                        return Err(Error::input("RAPID needs public rows in the split").with_file(&plan.split));
                    }
                    let (pre, refr) = public.split_at(public.len() / 2);
                    if plan.init.is_none() && r.pretrain_steps > 0 {
                        let b = bar(r.pretrain_steps as u64, plan.quiet, "pretrain");
                        let cfg = TrainConfig {
                            steps: r.pretrain_steps,
                            batch_size: plan.batch_size,
                            lr: plan.lr,
                            ema_decay: plan.ema,
                            seed: public_seed ^ 0x9e7,
                            t_min: 0,
                            t_max: schedule.len() - 1,
                        };
                        let l = train::train(&net, &schedule, &data.rows(pre), &cfg, Some(&b))?;
                        b.finish_and_clear();
                        eprintln!(
                            "pretrained on {} public rows: loss {:.4} -> {:.4}",
                            pre.len(),
                            l.eval_loss_before,
                            l.eval_loss_after
                        );
                    }
                    // A frozen deep copy of the pretrained model (`Net::clone` would share variables).
                    let frozen = Net::new(&model_cfg, 0, device)?;
                    train::copy_params(&frozen, &net)?;
                    let kb = KnowledgeBase::build(&frozen, &schedule, &data.rows(refr), r.k, r.v, public_seed)?;
                    eprintln!(
                        "knowledge base: {} trajectories (key at k = {}, value at v = {})",
                        kb.len(),
                        kb.k,
                        kb.v
                    );
                    let info = RapidInfo {
                        k: r.k,
                        v: r.v,
                        pretrain_steps: if plan.init.is_none() { r.pretrain_steps } else { 0 },
                        pretrain_rows: pre.len(),
                        kb_rows: refr.len(),
                    };
                    (Some((frozen, kb, info)), r.v)
                }
                None => (None, t_max),
            };
            let cfg = DpConfig {
                noise_multiplier: d.noise_multiplier,
                clip: d.clip,
                sample_rate: d.sample_rate,
                steps: plan.steps as u64,
                lr: plan.lr,
                ema_decay: plan.ema,
                seed: plan.seed,
                delta: d.delta,
                t_min: plan.t_min,
                t_max,
                per_sample: d.per_sample,
            };
            let public_rows = data.rows(&split.public);
            let b = bar(plan.steps as u64, plan.quiet, "dp-sgd");
            let rag = rag_parts.as_ref().map(|(f, kb, _)| Retrieval { kb, pretrained: f });
            let hooks = dp::Hooks {
                white_box: recorder.as_mut(),
                defect: plan.defect,
            };
            let run = dp::dp_train_with(
                &net,
                &schedule,
                &x0,
                &cfg,
                rag.as_ref(),
                Some(&public_rows),
                Some(&b),
                hooks,
            )?;
            b.finish_and_clear();
            let method = match (d.per_sample, net.supports_probe()) {
                (PerSample::Loop, _) | (PerSample::Auto, false) => "loop",
                _ => "ghost",
            };
            let ledger_path = PathBuf::from(format!("{}.ledger.toml", plan.out.display()));
            // The whole ledger: the init's, then this run's.
            let event = match &init_ledger {
                Some((ev, _)) => DpEvent::Composed {
                    events: vec![ev.clone(), run.event.clone()],
                },
                None => run.event.clone(),
            };
            let eps_text = crate::models::dp::spent_epsilon(&event, d.delta);
            dp_info = Some(DpInfo {
                noise_multiplier: d.noise_multiplier,
                clip: d.clip,
                sample_rate: d.sample_rate,
                steps: plan.steps as u64,
                delta: d.delta,
                per_sample: method.into(),
                ledger: ledger_path
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                epsilon: eps_text.as_ref().map(|e| e.0),
                epsilon_accountant: eps_text.as_ref().map(|e| e.1.clone()),
                init_ledger: init_ledger.as_ref().map(|(_, p)| card::card_relative(p, &card_dir)),
                rapid: rag_parts.map(|(_, _, info)| info),
                ledger_sha256: None,
            });
            lines.push(match &eps_text {
                Some((e, acc)) => format!(
                    "ε spent: {} at δ = {} ({acc}; the whole ledger{})",
                    crate::report::export::fmt_num(*e),
                    crate::report::export::fmt_num(d.delta),
                    if init_ledger.is_some() {
                        ", composed with the --init ledger"
                    } else {
                        ""
                    }
                ),
                None => "ε spent: no sound accountant supports this ledger".to_string(),
            });
            if !plan.quiet {
                eprintln!(
                    "mean Poisson batch: {:.1} (expected {:.1})",
                    run.mean_batch,
                    d.sample_rate * n_private as f64
                );
            }
            ledger = Some((ledger_path, event));
            (
                run.eval,
                "public rows (a loss on the private rows would be released without noise)",
                plan.steps,
                plan.t_min,
                t_max,
                (d.sample_rate * n_private as f64).round() as usize,
            )
        }
        None => {
            let cfg = TrainConfig {
                steps: plan.steps,
                batch_size: plan.batch_size,
                lr: plan.lr,
                ema_decay: plan.ema,
                seed: public_seed,
                t_min: plan.t_min,
                t_max,
            };
            let b = bar(plan.steps as u64, plan.quiet, "train");
            let log = train::train(&net, &schedule, &x0, &cfg, Some(&b))?;
            b.finish_and_clear();
            (
                Some((log.eval_loss_before, log.eval_loss_after)),
                "training rows",
                plan.steps,
                plan.t_min,
                t_max,
                plan.batch_size,
            )
        }
    };
    // Every output of the run is rendered first, then committed as one set (weights, ledger,
    // canaries, card: all appear at once, see `report::output::commit_set`).
    let (out_dir, stem_name) = checkpoint::stem_parts(&plan.out)?;
    crate::report::output::create_out_dir(&out_dir)?;
    let stem_file = |ext: &str| format!("{stem_name}.{ext}");
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let weights = checkpoint::weights_bytes(&net)?;
    let weights_name = stem_file("safetensors");
    let weights_released = crate::report::output::released_line(&weights_name, &weights);
    files.push((weights_name, weights.clone()));
    let canary_info = match &canaries {
        Some(c) => {
            let name = stem_file("canaries.csv");
            let bytes = c.to_csv().into_bytes();
            lines.push(format!(
                "wrote {} ({} canaries; the inclusion bits are the audit's secret: keep the file from whoever the audit models)",
                out_dir.join(&name).display(),
                c.len()
            ));
            let info = CanaryInfo {
                file: name.clone(),
                sha256: crate::report::sha256_hex(&bytes),
                count: c.len(),
                kind: None,
                observations: None,
                observations_sha256: None,
            };
            files.push((name, bytes));
            Some(info)
        }
        None => None,
    };
    // Gradient canaries: `<stem>.canaries.csv` alone, `<stem>.gradient-canaries.csv` beside
    // input canaries.
    let gradient_info = match &recorder {
        Some(wb) => {
            let name = stem_file(if canary_info.is_some() {
                "gradient-canaries.csv"
            } else {
                "canaries.csv"
            });
            let bytes = wb.canaries.to_csv().into_bytes();
            let obs_name = stem_file("canary-observations.npy");
            let obs = wb.observations_npy();
            lines.push(format!(
                "wrote {} ({} gradient canaries; the inclusion bits are the audit's secret) and {} ({} noisy updates observed at every canary: the white-box audit's record)",
                out_dir.join(&name).display(),
                wb.canaries.len(),
                out_dir.join(&obs_name).display(),
                wb.steps
            ));
            let info = CanaryInfo {
                file: name.clone(),
                sha256: crate::report::sha256_hex(&bytes),
                count: wb.canaries.len(),
                kind: Some(CanaryKind::Gradient),
                observations: Some(obs_name.clone()),
                observations_sha256: Some(crate::report::sha256_hex(&obs)),
            };
            files.push((name, bytes));
            files.push((obs_name, obs));
            Some(info)
        }
        None => None,
    };
    let (canary_info, gradient_info) = match canary_info {
        Some(i) => (Some(i), gradient_info),
        None => (gradient_info, None),
    };
    let randomness = if plan.seed.is_some() {
        RANDOMNESS_SEEDED
    } else {
        RANDOMNESS_OS
    };
    let mut ledger_path = None;
    let mut event = None;
    let mut ledger_lines = Vec::new();
    if let (Some((p, ev)), Some(d)) = (ledger, &plan.dp) {
        let text = crate::models::dp::ledger_toml(
            &ev,
            d.delta,
            &format!(
                "DpEvent that ran in `{}`{}\n(RAPID Algorithm 2: Poisson sampling q, clipping C = {}, Gaussian noise σ·C, add/remove-one neighbours)\nrandomness: {randomness}\n{weights_released}",
                plan.command,
                init_ledger
                    .as_ref()
                    .map(|(_, p)| format!(", after the ledger of --init ({})", p.display()))
                    .unwrap_or_default(),
                d.clip
            ),
        )?;
        if let Some(info) = dp_info.as_mut() {
            info.ledger_sha256 = Some(crate::report::sha256_hex(text.as_bytes()));
        }
        files.push((stem_file("ledger.toml"), text.into_bytes()));
        ledger_lines.push(format!(
            "wrote {} — account it with: dpaudit account --event {} --delta {}",
            p.display(),
            p.display(),
            crate::numeric::format::fmt_num(d.delta)
        ));
        ledger_lines.push(ev.ledger());
        ledger_path = Some(p);
        event = Some(ev);
    }
    let mut card = Card {
        schema_version: checkpoint::CARD_SCHEMA,
        weights: String::new(),
        weights_sha256: String::new(),
        parameters: 0,
        model: model_cfg,
        schedule: plan.schedule,
        data: DataInfo {
            file: card::card_relative(&plan.data, &card_dir),
            sha256: data.sha256.clone(),
            split: card::card_relative(&plan.split, &card_dir),
            split_sha256: sha256_file(&plan.split)?,
            trained_on: plan.on,
            rows_sha256: indices_sha256(&private_ix),
            rows: private_ix.len(),
        },
        training: TrainingInfo {
            seed: plan.seed,
            randomness: randomness.to_string(),
            steps,
            batch_size: batch,
            lr: plan.lr,
            ema_decay: plan.ema,
            t_min,
            t_max,
            device: device_name.to_string(),
            command: plan.command.clone(),
            eval_loss_before: eval.map(|e| e.0),
            eval_loss_after: eval.map(|e| e.1),
            eval_on: eval.map(|_| eval_on.to_string()),
            init: plan.init.as_ref().map(|p| card::card_relative(p, &card_dir)),
            relocated: None,
        },
        dp: dp_info,
        canaries: canary_info,
        gradient_canaries: gradient_info,
    };
    checkpoint::describe_weights(&stem_name, &weights, &net, &mut card);
    let card_name = stem_file("toml");
    files.push((card_name.clone(), checkpoint::card_bytes(&card)?));
    crate::report::output::commit_set(&out_dir, Some(&stem_name), &files, plan.force)?;
    let card_path = PathBuf::from(format!("{}.toml", plan.out.display()));
    if let Some((b, a)) = eval {
        lines.push(format!(
            "denoising loss on the {eval_on} (fixed evaluation draws): {b:.4} -> {a:.4}"
        ));
    }
    if plan.seed.is_some() {
        lines.push(format!("training randomness: {RANDOMNESS_SEEDED}"));
    }
    lines.push(format!("wrote {} and {}", card_path.display(), card.weights));
    lines.extend(ledger_lines);
    Ok(TrainOutcome {
        card_path,
        card,
        ledger_path,
        event,
        lines,
    })
}
