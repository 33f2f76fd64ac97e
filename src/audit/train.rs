//! Training (`train`): every decision of the command between its flags and the trainers —
//! a new split manifest (`--make-split`), Opacus' flags resolved into q, steps and σ, the checks
//! of `--unet` runs before any work (signing key, trusted `--init`, existing outputs), the
//! device the plan names — and the shared [`Report`] of a trained checkpoint, built from its card
//! (what was trained, on which rows, how) and, for DP runs, the ledger of the DpEvent that ran.

use std::path::{Path, PathBuf};

use crate::data::digits::Part;
use crate::data::{Dataset, SplitManifest};
use crate::diffusion::schedule::table::TrainingScheduleConfig;
use crate::error::{Error, Result};
use crate::events::{DpEvent, Neighbouring};
use crate::models::toy::run::Rapid;
use crate::models::toy::ModelConfig;
use crate::models::train::{Plan as TrainPlan, Role};
use crate::models::unet2d::precision::Precision;
use crate::report::export::fmt_num;
use crate::report::{self, Conclusion, Report};

/// `train --make-split PATH`: a new member/non-member/public split manifest of `data`.
#[derive(Debug, Clone)]
pub struct SplitPlan {
    /// The data file (digits CSV, optionally .gz).
    pub data: PathBuf,
    /// Where the manifest is written.
    pub out: PathBuf,
    /// Members.
    pub members: usize,
    /// Non-members (the rest of the rows is public).
    pub nonmembers: usize,
    /// Seed of the draw (0 when not given).
    pub seed: Option<u64>,
    /// Replace an existing manifest.
    pub force: bool,
}

/// Writes the split manifest `plan` asks for (disjoint rows, hashed lists; an existing file is
/// refused unless `force`) and returns the line that says what was written.
pub fn make_split(plan: &SplitPlan) -> Result<String> {
    crate::report::output::check_file(&plan.out, plan.force)?;
    let data = Dataset::load(&plan.data)?;
    let seed = plan.seed.unwrap_or(0);
    let m = SplitManifest::random(
        &data,
        &plan.data.display().to_string(),
        plan.members,
        plan.nonmembers,
        seed,
    )?;
    if let Some(dir) = plan.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, &e))?;
    }
    crate::report::output::write_atomic(&plan.out, m.to_toml()?.as_bytes(), plan.force)?;
    Ok(format!(
        "wrote {}: {} members, {} non-members, {} public (seed {seed})\n",
        plan.out.display(),
        m.members.len(),
        m.nonmembers.len(),
        m.public.len(),
    ))
}

/// Loop lengths from flags, bounded before any data is read (docs/reliability.md): `--steps`
/// and, for RAPID, `--pretrain-steps`.
pub fn check_loop_lengths(steps: usize, pretrain_steps: Option<usize>) -> Result<()> {
    crate::limits::check_count("--steps", steps as u64, crate::limits::TRAIN_STEP)?;
    if let Some(p) = pretrain_steps {
        crate::limits::check_count("--pretrain-steps", p as u64, crate::limits::TRAIN_STEP)?;
    }
    Ok(())
}

/// The flags of `train` whose meaning depends on one another, as given: Opacus' conventions
/// (`--batch-size` as the expected batch under `--dp`, `--epochs`, `--target-epsilon`) and the
/// memory chunk of `--unet` runs.
#[derive(Debug, Clone)]
pub struct TrainFlags {
    /// `--unet` was given.
    pub unet: bool,
    /// `--dp`.
    pub dp: bool,
    /// `--batch-size`.
    pub batch: Option<usize>,
    /// `--max-physical-batch-size`.
    pub max_physical_batch_size: Option<usize>,
    /// `--sample-rate`.
    pub sample_rate: Option<f64>,
    /// `--epochs`.
    pub epochs: Option<f64>,
    /// `--target-epsilon`.
    pub target_epsilon: Option<f64>,
    /// `--steps`.
    pub steps: usize,
    /// `--noise-multiplier`.
    pub noise_multiplier: f64,
    /// `--delta`.
    pub delta: f64,
    /// `--split` (its trained-on part gives N, the private training rows).
    pub split: PathBuf,
    /// `--on`.
    pub on: Part,
    /// `-q`: the derivation is not noted on stderr.
    pub quiet: bool,
}

/// What [`TrainFlags`] resolve to: the batch the trainer uses, q, steps and σ.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainSizes {
    /// The batch of the trainer's passes (with `--unet --dp` the per-sample-gradient chunk).
    pub batch_size: usize,
    /// q.
    pub sample_rate: f64,
    /// Steps.
    pub steps: usize,
    /// σ.
    pub noise_multiplier: f64,
}

/// Resolves Opacus' flags into q, steps and σ ([`resolve_opacus`]) and the batch size; the
/// derivation is noted on stderr unless `quiet`. Errors name the flag.
pub fn resolve_flags(f: &TrainFlags) -> Result<TrainSizes> {
    let unet = f.unet;
    if f.max_physical_batch_size.is_some() && !unet {
        return Err(Error::field(
            "--max-physical-batch-size",
            "only with --unet (the per-sample-gradient chunk of its batched pass)",
        ));
    }
    // Opacus' meaning, for both model families: under --dp without --sample-rate, --batch-size is
    // the expected batch (q = B / N).
    let expected_batch = f.batch.filter(|_| f.dp && f.sample_rate.is_none());
    // --unet: the batch of its passes. Under --dp that is the per-sample-gradient chunk, named by
    // --max-physical-batch-size (Opacus' max_physical_batch_size). Given with --sample-rate,
    // --batch-size cannot be the expected batch (q is set): it is read as the chunk, as before
    // Opacus' meaning was adopted, and the reading is noted.
    let batch_size = if unet {
        match (f.max_physical_batch_size, expected_batch, f.batch) {
            (Some(m), _, _) => m,
            (None, Some(_), _) | (None, None, None) => 128,
            (None, None, Some(b)) => {
                if f.dp && !f.quiet {
                    crate::report::progress::note(&format!(
                        "--batch-size {b} with --sample-rate under --unet --dp: read as the per-sample-gradient \
                         chunk (--max-physical-batch-size {b}); without --sample-rate it is the expected batch \
                         (q = B / N, as in Opacus)"
                    ));
                }
                b
            }
        }
    } else {
        f.batch.unwrap_or(128)
    };
    let mut out = TrainSizes {
        batch_size,
        sample_rate: f.sample_rate.unwrap_or(0.16),
        steps: f.steps,
        noise_multiplier: f.noise_multiplier,
    };
    if f.epochs.is_none() && f.target_epsilon.is_none() && expected_batch.is_none() {
        return Ok(out);
    }
    if unet && !f.dp && f.epochs.is_some() {
        return Err(Error::field(
            "--epochs",
            "with --unet give --steps (or --dp with --sample-rate)",
        ));
    }
    // N: the private training rows (the trained-on part of the split).
    let rows = if f.dp && expected_batch.is_none() {
        usize::MAX
    } else {
        SplitManifest::load(&f.split)?.part(f.on).len()
    };
    if !f.dp {
        let e = f.epochs.expect("checked above");
        if !(e.is_finite() && e > 0.0) {
            return Err(Error::field("--epochs", format!("must be a positive number, got {e}")));
        }
        out.steps = ((e * rows as f64 / out.batch_size.max(1) as f64).ceil() as usize).max(1);
        crate::limits::check_count("--epochs", out.steps as u64, crate::limits::TRAIN_STEP)?;
        return Ok(out);
    }
    let flags = OpacusFlags {
        batch_size: expected_batch,
        epochs: f.epochs,
        target_epsilon: f.target_epsilon,
    };
    let r = resolve_opacus(flags, rows, out.sample_rate, out.steps, out.noise_multiplier, f.delta)?;
    if !f.quiet {
        for l in &r.lines {
            crate::report::progress::note(l);
        }
    }
    out.sample_rate = r.sample_rate;
    out.steps = r.steps;
    out.noise_multiplier = r.noise_multiplier;
    Ok(out)
}

/// The device a plan names, selected and noted on stderr (`device: …`), with the name its card
/// records.
fn select_device(choice: crate::models::DeviceChoice) -> Result<(candle_core::Device, String)> {
    let dev = crate::models::device::select(choice)?;
    let name = crate::models::device::describe(&dev);
    crate::report::progress::note(&format!("device: {name}"));
    Ok((dev, name))
}

/// What an 8×8 run trains.
#[derive(Debug, Clone, Copy)]
pub struct ToyPlan {
    /// Model (ignored with `--init`: the init's config wins).
    pub model: ModelConfig,
    /// Noise schedule.
    pub schedule: TrainingScheduleConfig,
    /// RAPID's retrieval variant (DP runs).
    pub rapid: Option<Rapid>,
}

/// What a `train --unet` run trains.
#[derive(Debug, Clone)]
pub struct UnetPlan {
    /// `--unet`: a preset name or a config.json path, as the OS gave it (need not be UTF-8;
    /// ignored with `--init`: its config wins).
    pub unet: std::ffi::OsString,
    /// The DDPM scheduler's linear β schedule (T, β₁, β_T).
    pub schedule: TrainingScheduleConfig,
}

/// The model family a training plan trains, with what it needs beyond [`Plan`].
#[derive(Debug, Clone)]
pub enum Model {
    /// The 8×8 MLP/UNet (`<stem>.safetensors` and its card).
    Toy(ToyPlan),
    /// A diffusers `UNet2DModel` (`train --unet`: a diffusers folder).
    Unet(UnetPlan),
}

/// `train`'s plan: the orchestrator's plan and the model family.
#[derive(Debug, Clone)]
pub struct Plan {
    /// What every training run needs.
    pub train: TrainPlan,
    /// The family and its settings.
    pub model: Model,
}

/// Runs `train` on the plan's device: trains (DP-SGD when the plan says so), writes the weights
/// with their card, ledger and canaries, and returns the report with the training log as its
/// terminal text.
pub fn execute(plan: &Plan) -> Result<super::Outcome> {
    let (device, device_name) = select_device(plan.train.device)?;
    let (rep, lines) = match &plan.model {
        Model::Toy(toy) => {
            let o =
                crate::models::toy::run::run(&plan.train, &toy.model, toy.schedule, toy.rapid, &device, &device_name)?;
            let card_path = o.layout.path(Role::Card);
            let ledger = o.card.dp.as_ref().map(|dp| dp.ledger.clone()).unwrap_or_default();
            let c = &o.card;
            let r = report(
                &Written {
                    model: "A denoiser",
                    attack: "checkpoint",
                    place: &card_path,
                    input: ("checkpoint card", card_path.clone()),
                    architecture: None,
                    parameters: c.parameters,
                    data: &c.data,
                    training: &c.training,
                    dp: c.dp.as_ref(),
                    ledger,
                    account_with_event: true,
                },
                o.event.as_ref(),
                o.backend,
            )?;
            (r, o.lines)
        }
        Model::Unet(unet) => {
            let o = crate::models::diffusers_train::run(&plan.train, &unet.unet, unet.schedule, &device, &device_name)?;
            let (c, dir) = (&o.card, &o.layout.dir);
            let r = report(
                &Written {
                    model: "A diffusers UNet2DModel",
                    attack: "folder",
                    place: dir,
                    input: ("card", dir.join(crate::models::folder::CARD)),
                    architecture: Some(&c.architecture),
                    parameters: c.parameters,
                    data: &c.data,
                    training: &c.training,
                    dp: c.dp.as_ref(),
                    ledger: dir.join(crate::models::folder::LEDGER).display().to_string(),
                    account_with_event: false,
                },
                o.event.as_ref(),
                o.backend,
            )?;
            (r, o.lines)
        }
    };
    let mut text = String::new();
    for l in &lines {
        text.push_str(l.trim_end());
        text.push('\n');
    }
    Ok(super::Outcome::new(rep, text))
}

/// What a training report states, read from either family's card (the 8×8 toys' `Card`, the
/// diffusers folder's `UnetCard`).
struct Written<'a> {
    /// The conclusion's subject ("A denoiser", "A diffusers UNet2DModel").
    model: &'a str,
    /// What `dpaudit mia` attacks ("checkpoint", "folder").
    attack: &'a str,
    /// Where the model went (the card, or the folder).
    place: &'a Path,
    /// The input the report names: label and path.
    input: (&'a str, PathBuf),
    /// The diffusers architecture, when there is one.
    architecture: Option<&'a str>,
    parameters: usize,
    data: &'a crate::models::card::DataInfo,
    training: &'a crate::models::card::TrainingInfo,
    dp: Option<&'a crate::models::card::DpInfo>,
    /// The ledger as the report names it.
    ledger: String,
    /// The ledger is an event file that `dpaudit account --event` reads (the toys' ledger);
    /// the folder's ledger is checked through the folder.
    account_with_event: bool,
}

/// The report of a training run of either family: the training facts (size, rows, optimiser,
/// device, backend, precision, randomness, losses), the ledger as the report's event, and the
/// conclusion.
fn report(w: &Written, ledger: Option<&DpEvent>, backend: &str) -> Result<Report> {
    let mut r = Report::new(format!("Training: {}", w.place.display()), report::command_line()).for_command("train");
    r.seed = w.training.seed;
    r.add_input(w.input.0, &w.input.1)?;
    if let Some(a) = w.architecture {
        r.fact("architecture", a.to_string());
    }
    training_facts(&mut r, w.parameters, w.data, w.training);
    // Training computes in fp32 on every backend (the fp32 per-sample gradients and Adam);
    // the forward's precision choice (`--precision`) belongs to `mia` and `model eval`.
    r.fact("backend", backend).fact("precision", Precision::Fp32.as_str());
    let guarantee = match (w.dp, ledger) {
        (Some(dp), Some(ev)) => {
            r.event = Some(ev.clone());
            r.delta = Some(dp.delta);
            r.assumptions.neighbouring = Some(Neighbouring::AddRemove);
            r.assumptions.sampling = Some(format!("Poisson, q = {}", fmt_num(dp.sample_rate)));
            r.fact("noise multiplier σ", fmt_num(dp.noise_multiplier))
                .fact("clip norm C", fmt_num(dp.clip))
                .fact("ledger", w.ledger.clone());
            let spent = match (dp.epsilon, &dp.epsilon_accountant) {
                (Some(e), Some(acc)) => {
                    format!("ε = {} at δ = {} ({acc}, upper bound); ", fmt_num(e), fmt_num(dp.delta))
                }
                _ => String::new(),
            };
            let how = if w.account_with_event {
                format!(
                    ": account it with `dpaudit account --event {} --delta {}` for every accountant",
                    w.ledger,
                    fmt_num(dp.delta)
                )
            } else {
                String::new()
            };
            format!(
                "{spent}Trained with DP-SGD (σ = {}, C = {}, q = {}, {} steps); the ledger {} records the event{how}.",
                fmt_num(dp.noise_multiplier),
                fmt_num(dp.clip),
                fmt_num(dp.sample_rate),
                dp.steps,
                w.ledger,
            )
        }
        _ => "None: trained without differential privacy.".into(),
    };
    r.conclusion = Some(Conclusion {
        audited: format!(
            "{} trained on {} rows ({}), written to `{}`.",
            w.model,
            w.data.rows,
            w.data.file,
            w.place.display()
        ),
        guarantee,
        verdict: format!(
            "No budget or claim was checked; attack the {} with `dpaudit mia`.",
            w.attack
        ),
        estimates: "The losses are measurements on fixed evaluation draws, not privacy numbers.".into(),
    });
    Ok(r)
}

/// What `train --unet` checks before any work.
#[derive(Debug, Clone, Copy)]
pub struct UnetPreflight<'a> {
    /// `--sign-key`: the Ed25519 secret key file.
    pub sign_key: Option<&'a Path>,
    /// `--trust-key`: the public keys an `--init` folder must be signed by.
    pub trust_key: &'a [PathBuf],
    /// `--init`.
    pub init: Option<&'a Path>,
    /// The output folder.
    pub out: &'a Path,
    /// `--dp` (a ledger is written).
    pub dp: bool,
    /// Input canaries.
    pub input_canaries: usize,
    /// Gradient canaries.
    pub gradient_canaries: usize,
    /// `--checkpoint-every`.
    pub checkpoint_every: Option<usize>,
    /// `--force`.
    pub force: bool,
}

/// The checks of a `train --unet` run before any work: reads the signing key, checks the
/// `--init` folder's signature against the trusted keys, refuses existing outputs (unless
/// `force`) and a symbolic link at an output folder (it would send the set, with `--force` its
/// replacements, elsewhere). Returns the signing key.
pub fn prepare_unet(p: &UnetPreflight) -> Result<Option<ed25519_dalek::SigningKey>> {
    use crate::models::diffusers_train::{output_files, CHECKPOINT_DIR, RELEASED};
    let sign_key = match p.sign_key {
        Some(k) => Some(crate::provenance::load_secret(k).map_err(|e| e.with_field("--sign-key"))?),
        None => None,
    };
    let trusted = crate::provenance::load_trusted(p.trust_key)?;
    if let (Some(init), false) = (p.init, trusted.is_empty()) {
        let dir = crate::models::diffusers::unet_dir(init).unwrap_or_else(|| init.to_path_buf());
        let st = crate::provenance::verify_folder(&dir, &RELEASED, &trusted)?;
        crate::report::progress::note(&format!("--init {}: {}", dir.display(), st.describe()));
    }
    let (inputs, gradient) = (p.input_canaries > 0, p.gradient_canaries > 0);
    crate::report::output::refuse_link(p.out)?;
    for f in output_files(p.dp, inputs, gradient, inputs && gradient) {
        crate::report::output::check_file(&p.out.join(f), p.force)?;
    }
    if sign_key.is_some() {
        crate::report::output::check_file(&p.out.join(crate::provenance::SIGNATURE), p.force)?;
    }
    match p.checkpoint_every {
        Some(0) => return Err(Error::field("--checkpoint-every", "must be ≥ 1")),
        Some(_) => {
            let dir = p.out.join(CHECKPOINT_DIR);
            crate::report::output::refuse_link(&dir)?;
            // The folder itself appears only with the first checkpoint, whole (one rename).
            if dir.is_dir() {
                for f in output_files(p.dp, inputs, gradient, inputs && gradient) {
                    crate::report::output::check_file(&dir.join(f), p.force)?;
                }
            }
        }
        None => {}
    }
    Ok(sign_key)
}

/// The facts every training report states: size, rows, optimiser, device, randomness, and the
/// denoising loss where it was measured (DP runs publish no loss measured on the private rows: it
/// is outside the ledger).
fn training_facts(
    r: &mut Report,
    parameters: usize,
    data: &crate::models::card::DataInfo,
    training: &crate::models::card::TrainingInfo,
) {
    r.fact("parameters", parameters.to_string())
        .fact("trained on", format!("{} rows of {}", data.rows, data.file))
        .fact("optimiser steps", training.steps.to_string())
        .fact("learning rate", fmt_num(training.lr))
        .fact("device", training.device.clone())
        .fact("randomness", training.randomness.clone());
    if let (Some(b), Some(a)) = (training.eval_loss_before, training.eval_loss_after) {
        let on = training.eval_on.clone().unwrap_or_default();
        r.fact(format!("denoising loss before ({on})"), fmt_num(b))
            .fact(format!("denoising loss after ({on})"), fmt_num(a));
    }
}

/// Opacus' way of stating a DP-SGD training: the expected batch size (`--batch-size`, so
/// q = B / N), epochs (`--epochs`, so steps = ⌈E / q⌉) and a target ε (`--target-epsilon`, σ
/// calibrated by the one calibration search, PLD first, landing on the safe side).
#[derive(Debug, Clone, Copy, Default)]
pub struct OpacusFlags {
    /// Expected batch size B under Poisson sampling.
    pub batch_size: Option<usize>,
    /// Epochs E.
    pub epochs: Option<f64>,
    /// Target ε at the run's δ.
    pub target_epsilon: Option<f64>,
}

/// What the Opacus flags resolve to: the sampling rate, steps and noise multiplier, with one
/// line per derived value saying how it was derived.
#[derive(Debug, Clone, PartialEq)]
pub struct OpacusResolved {
    /// q.
    pub sample_rate: f64,
    /// Steps.
    pub steps: usize,
    /// σ.
    pub noise_multiplier: f64,
    /// How each derived value was found.
    pub lines: Vec<String>,
}

/// Resolves [`OpacusFlags`] against `rows` private training rows, with `sample_rate`, `steps`
/// and `noise_multiplier` the values given otherwise (or their defaults). Errors name the flag.
pub fn resolve_opacus(
    flags: OpacusFlags,
    rows: usize,
    sample_rate: f64,
    steps: usize,
    noise_multiplier: f64,
    delta: f64,
) -> Result<OpacusResolved> {
    use crate::accountants::calibrate::{calibrate_dpsgd_any, DpSgd, SolveFor};
    let mut lines = Vec::new();
    let mut q = sample_rate;
    if let Some(b) = flags.batch_size {
        if b == 0 || b > rows {
            return Err(Error::field(
                "--batch-size",
                format!("the expected batch must be in 1..={rows} (the private training rows)"),
            ));
        }
        q = b as f64 / rows as f64;
        lines.push(format!(
            "sample rate q = B/N = {b}/{rows} = {} (--batch-size is the expected batch under Poisson sampling, as in Opacus)",
            fmt_num(q)
        ));
    }
    let mut n = steps;
    if let Some(e) = flags.epochs {
        if !(e.is_finite() && e > 0.0) {
            return Err(Error::field("--epochs", format!("must be a positive number, got {e}")));
        }
        let s = (e / q).ceil();
        crate::limits::check_count("--epochs", s as u64, crate::limits::TRAIN_STEP)?;
        n = (s as usize).max(1);
        lines.push(format!("steps = ⌈E/q⌉ = ⌈{}/{}⌉ = {n}", fmt_num(e), fmt_num(q)));
    }
    let mut sigma = noise_multiplier;
    if let Some(t) = flags.target_epsilon {
        if !(t.is_finite() && t > 0.0) {
            return Err(Error::field(
                "--target-epsilon",
                format!("must be a positive number, got {t}"),
            ));
        }
        let fixed = DpSgd {
            noise_multiplier: 1.0,
            sample_rate: q,
            steps: n as u64,
        };
        let (c, why) = calibrate_dpsgd_any(
            crate::accountants::AccountantKind::Pld,
            Neighbouring::AddRemove,
            delta,
            t,
            fixed,
            SolveFor::NoiseMultiplier,
        )
        .map_err(|e| e.with_field("--target-epsilon"))?;
        sigma = c.value;
        lines.push(format!(
            "noise multiplier σ = {} calibrated for ε ≤ {} at δ = {} (q = {}, {n} steps): ε = {} ({}, {}){}",
            fmt_num(sigma),
            fmt_num(t),
            fmt_num(delta),
            fmt_num(q),
            fmt_num(c.result.epsilon),
            c.result.source(),
            c.result.kind.as_str(),
            why.map_or(String::new(), |w| format!("; {w}"))
        ));
    }
    Ok(OpacusResolved {
        sample_rate: q,
        steps: n,
        noise_multiplier: sigma,
        lines,
    })
}
