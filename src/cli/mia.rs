//! `dpaudit mia`: arguments → [`MiaPlan`] → [`pipeline::run`] (or [`pipeline::from_scores`]) →
//! output and exit code. Scoring, comparisons and the violation decision live in the library.

use std::path::PathBuf;

use crate::cli::common::{Format, OutputArgs, Outputs};
use crate::cli::values::{AttackKind as AttackArg, AuditKind, DeviceChoice};
use dpaudit::attacks::mia::{AttackKind, MetricOpts, ScoreOpts};
use dpaudit::attacks::pipeline::{self, MiaPlan, Table2Opts};
use dpaudit::attacks::shard::{MiaPart, PartInputs, PartPlan, PartRecord, ShardSpec, PART_SCHEMA};
use dpaudit::attacks::{render, scores};
use dpaudit::audit::outcome::Status;
use dpaudit::error::Error;
use dpaudit::models::{device, Checkpoint, Dataset, SplitManifest};

const EXAMPLES: &str = "\
Examples:
  # All attacks on the shipped non-DP checkpoint, at steps 10, 50, 100 and T/4:
  dpaudit mia --checkpoint models/digits-mlp.toml

  # The DP (RAPID) checkpoint: each attack beside the limit of the mechanism it attacks (the
  # checkpoint's training ledger), plus the null test (labels shuffled at random):
  dpaudit mia --checkpoint models/digits-rapid.toml --null-test --format json > mia.json

  # A valid ε lower bound from one training run with canaries (train --canaries 200 first):
  dpaudit mia --checkpoint x.toml --audit one-run --attack loss,pia --timesteps 10,50,100

  # Scores out, and metrics recomputed from scores (from dpaudit or any other tool):
  dpaudit mia --checkpoint models/digits-mlp.toml --scores-out scores.csv
  dpaudit mia --scores scores.csv --checkpoint models/digits-mlp.toml

  # A diffusers folder trained elsewhere (e.g. with Opacus): state the mechanism, and every
  # attack is compared with its limit (a folder `train --unet --dp` wrote uses its own ledger):
  dpaudit mia --checkpoint models/mnist-ddpm --data fixtures/data/mnist/mnist-10k.u8.gz \
      --split fixtures/splits/mnist.toml --noise-multiplier 1.1 --train-batch-size 32 \
      --dataset-size 128 --epochs 50

  # Table-2-style comparison (diffusion-sampling-privacy §6.4):
  dpaudit mia --checkpoint models/digits-mlp.toml --table2 --attack loss --timesteps 10

Formats: text (default), csv (one row per attack and step), json, md and html (the shared report:
tables, the ROC against the limit of the attacked mechanism). --out DIR writes the report in every
format plus mia.json (the detailed record) and mia.csv. --roc-out writes every ROC point with the
TPR limit of the attacked mechanism.

Exit codes: 0 ok; 1 an audit's ε lower bound (one-run or many-runs) exceeds the accounted ε of
the same mechanism; 2 bad input. A single model's ASR never decides the exit code.";

#[derive(Debug, clap::Args)]
#[command(after_help = EXAMPLES)]
/// Membership-inference attacks on a trained denoiser.
pub struct Args {
    /// Checkpoint card (<stem>.toml), weights (<stem>.safetensors) or stem. With --scores it only
    /// supplies the training ledger to compare with.
    #[arg(long, required_unless_present = "scores")]
    pub checkpoint: Option<PathBuf>,
    /// Read per-record scores from this CSV (record_id, member, attack, t, score[, set]) instead
    /// of attacking: metrics, intervals, audits and comparisons are computed from it.
    #[arg(long, value_name = "FILE.csv")]
    pub scores: Option<PathBuf>,
    /// Write every per-record score as CSV (record_id, member, attack, t, score, set).
    #[arg(long, value_name = "FILE.csv")]
    pub scores_out: Option<PathBuf>,
    /// An audit whose ε lower bound is valid: `one-run` (the checkpoint's canaries, from
    /// `train --canaries m`) or `many-runs` (a --scores file whose rows are independent trials).
    #[arg(long, value_enum)]
    pub audit: Option<AuditKind>,
    /// Sampler config whose accounting the `empirical` attack (on the empirical-denoiser sampler)
    /// is compared with; without it that attack has no guarantee to compare with.
    #[arg(long, value_name = "CONFIG.toml")]
    pub sampler: Option<PathBuf>,
    /// Data file (default: the card's).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Split manifest (default: the card's).
    #[arg(long)]
    pub split: Option<PathBuf>,
    /// Attacks, comma-separated [default: loss,secmi,pia,empirical]. Not with --scores (the
    /// file's `attack` column says which attacks ran).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub attack: Vec<AttackArg>,
    /// Steps to attack at: integers 0..T−1 or fractions of T up to T itself, the last step (T,
    /// 3T/4, T/2, T/4, 0.1T), comma-separated [default: 10,50,100,T/4]. Not with --scores (the
    /// file's `t` column says which steps were attacked).
    #[arg(long, value_delimiter = ',')]
    pub timesteps: Vec<String>,
    /// Noise draws averaged by the loss and empirical attacks (≥ 1).
    #[arg(long, default_value_t = 4, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub noise_draws: usize,
    /// SecMI's step k (≥ 1).
    #[arg(long, default_value_t = 10, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub secmi_k: usize,
    /// PIA's norm p (the authors' code uses 4).
    #[arg(long, default_value_t = 4.0)]
    pub pia_norm: f64,
    /// Poisson sampling rate of the empirical denoiser's data (1 = full batch). (Formerly
    /// --empirical-rate, still accepted.)
    #[arg(long = "empirical-sample-rate", alias = "empirical-rate", default_value_t = 1.0)]
    pub empirical_rate: f64,
    /// Bootstrap resamples for the intervals.
    #[arg(long, default_value_t = 1000)]
    pub bootstrap: usize,
    /// Confidence of the bootstrap intervals and of the audits' ε lower bounds.
    #[arg(long, default_value_t = 0.95)]
    pub confidence: f64,
    /// δ of the accounted guarantees and of the audits.
    #[arg(long, default_value_t = 1e-5)]
    pub delta: f64,
    /// Seed of the attacks' own noise draws and of the held-out split.
    #[arg(long, default_value_t = 0)]
    /// Seed of the noise draws, splits and bootstrap.
    pub seed: u64,
    /// Also run every attack with member labels shuffled at random (null test).
    #[arg(long)]
    pub null_test: bool,
    /// Add the Table-2-style comparison (t = T, 3T/4, T/2, T/4).
    #[arg(long)]
    pub table2: bool,
    /// Subsampling rates p of the sampler in the Table-2 comparison.
    #[arg(long, value_delimiter = ',', default_value = "1,0.5,0.01,0.005")]
    pub table2_rates: Vec<f64>,
    /// Steps of a cosine-similarity profile (the paper's Figure 1), comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub cosine: Vec<String>,
    /// Output grammar; --out DIR also receives mia.json and mia.csv (with --shard: the part file).
    #[command(flatten)]
    pub output: OutputArgs,
    /// Write every ROC point (with the theoretical TPR limit) as CSV.
    #[arg(long)]
    pub roc_out: Option<PathBuf>,
    /// Score only shard I of N (0-based, e.g. 3/8) and write a part file
    /// `mia-part-I-of-N.json` (scores with the inputs' hashes) into --out DIR; `dpaudit merge`
    /// turns the N parts into the report of one unsharded run.
    #[arg(long, value_name = "I/N")]
    pub shard: Option<String>,
    #[arg(long, value_enum, default_value = "auto")]
    /// Device to run the model on (auto: CUDA when built with it and present, else CPU).
    pub device: DeviceChoice,
    /// Diffusers checkpoints: attack a seeded random subset of N members and N non-members (the
    /// seed is --seed; the report names it and the rows drawn).
    #[arg(long)]
    pub max_examples: Option<usize>,
    /// Diffusers checkpoints: images per forward pass [default: 64 on the CPU; on a GPU the
    /// largest power of two that fits half its free memory].
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Diffusers checkpoints on a GPU: the arithmetic of the forward (tf32 and bf16 also score
    /// a sample again in fp32 and report the largest change).
    #[arg(long, value_enum, default_value = "fp32")]
    pub precision: crate::cli::values::Precision,
    /// How a diffusers checkpoint without a dpaudit ledger was trained.
    #[command(flatten)]
    pub mechanism: crate::cli::mechanism::MechanismArgs,
}

/// Parses a step spec (`10`, `T/4`) against a schedule.
pub(crate) type ParseT<'a> = &'a dyn Fn(&str) -> dpaudit::Result<usize>;

/// `--attack` when not given.
const DEFAULT_ATTACKS: [AttackArg; 4] = [AttackArg::Loss, AttackArg::Secmi, AttackArg::Pia, AttackArg::Empirical];
/// `--timesteps` when not given.
const DEFAULT_TIMESTEPS: [&str; 4] = ["10", "50", "100", "T/4"];

impl Args {
    /// The attacks asked for (the default set when `--attack` is not given).
    fn attacks(&self) -> Vec<AttackArg> {
        if self.attack.is_empty() {
            DEFAULT_ATTACKS.to_vec()
        } else {
            self.attack.clone()
        }
    }

    /// The step specs asked for (the default set when `--timesteps` is not given).
    fn timestep_specs(&self) -> Vec<String> {
        if self.timesteps.is_empty() {
            DEFAULT_TIMESTEPS.iter().map(|s| s.to_string()).collect()
        } else {
            self.timesteps.clone()
        }
    }
}

/// The plan; `parse_t` reads steps (None with --scores: the steps come from the file).
pub(crate) fn plan(a: &Args, parse_t: Option<ParseT<'_>>) -> anyhow::Result<MiaPlan> {
    let steps = |v: &[String]| -> dpaudit::Result<Vec<usize>> {
        match parse_t {
            Some(f) => v.iter().map(|s| f(s)).collect(),
            None => Ok(Vec::new()),
        }
    };
    if !(a.confidence > 0.0 && a.confidence < 1.0) {
        return Err(Error::field("--confidence", "must be in (0, 1)").into());
    }
    if !(a.delta > 0.0 && a.delta < 1.0) {
        return Err(Error::field("--delta", "must be in (0, 1)").into());
    }
    if !(a.empirical_rate > 0.0 && a.empirical_rate <= 1.0) {
        return Err(Error::field("--empirical-sample-rate", "must be in (0, 1]").into());
    }
    if a.table2_rates.iter().any(|p| !(*p > 0.0 && *p <= 1.0)) {
        return Err(Error::field("--table2-rates", "rates must be in (0, 1]").into());
    }
    if !(a.pia_norm >= 1.0 && a.pia_norm.is_finite()) {
        return Err(Error::field("--pia-norm", "must be a finite p ≥ 1").into());
    }
    if parse_t.is_some() {
        // Every draw is a model evaluation on every attacked record at every attacked step.
        let per_draw = dpaudit::limits::MIA_DRAW.work * a.timestep_specs().len().max(1) as f64;
        dpaudit::limits::check_count(
            "--noise-draws",
            a.noise_draws as u64,
            dpaudit::limits::Cost::new(0.0, per_draw),
        )?;
    }
    Ok(MiaPlan {
        attacks: a.attacks().into_iter().map(Into::into).collect(),
        timesteps: steps(&a.timestep_specs())?,
        score: ScoreOpts {
            noise_draws: a.noise_draws,
            secmi_k: a.secmi_k,
            pia_norm: a.pia_norm,
            empirical_rate: a.empirical_rate,
            seed: a.seed,
        },
        metric: MetricOpts {
            bootstrap: a.bootstrap,
            level: a.confidence,
            delta: a.delta,
            alpha: 1.0 - a.confidence,
            seed: a.seed,
        },
        null_test: a.null_test,
        table2: a.table2.then(|| Table2Opts {
            rates: a.table2_rates.clone(),
            ..Default::default()
        }),
        cosine_steps: steps(&a.cosine)?,
        audit: a.audit.map(Into::into),
        sampler: match &a.sampler {
            Some(p) => Some(pipeline::sampler_basis(p, a.delta)?),
            None => None,
        },
    })
}

/// A loaded diffusers folder with its data, split, plan and stated or recorded mechanism.
struct DiffusersRun {
    ck: dpaudit::models::diffusers::DiffusersCheckpoint,
    images: dpaudit::models::images::ImageSet,
    split: SplitManifest,
    data_path: PathBuf,
    split_path: PathBuf,
    basis: Option<pipeline::Basis>,
}

impl DiffusersRun {
    fn load(a: &Args, dir: &std::path::Path, dev: &candle_core::Device) -> anyhow::Result<Self> {
        use dpaudit::models::{diffusers::DiffusersCheckpoint, images::ImageSet};
        if a.batch_size == Some(0) || a.max_examples == Some(0) {
            return Err(Error::field("--batch-size", "--batch-size and --max-examples must be ≥ 1").into());
        }
        let prec: dpaudit::models::precision::Precision = a.precision.into();
        dpaudit::models::precision::check_device(prec, dev)?;
        dpaudit::models::precision::set(prec);
        let t0 = std::time::Instant::now();
        let ck = DiffusersCheckpoint::load(dir, dev)?;
        dpaudit::timing::note("load checkpoint", t0);
        dpaudit::timing::within_summary();
        // Without --data/--split: the data and split the folder's card records.
        let card = match (&a.data, &a.split) {
            (Some(_), Some(_)) => None,
            _ => dpaudit::models::diffusers_train::card_data(ck.config_path.parent().unwrap_or(dir))?,
        };
        let data_path = a
            .data
            .clone()
            .or_else(|| card.as_ref().map(|c| c.0.clone()))
            .ok_or_else(|| {
                Error::field(
                "--data",
                "required with a diffusers checkpoint that has no dpaudit card (dpaudit-card.toml) recording its data",
            )
            })?;
        let split_path = a
            .split
            .clone()
            .or_else(|| card.as_ref().map(|c| c.1.clone()))
            .ok_or_else(|| {
                Error::field(
                "--split",
                "required with a diffusers checkpoint that has no dpaudit card (dpaudit-card.toml) recording its split",
            )
            })?;
        let t0 = std::time::Instant::now();
        let images = ImageSet::load(&data_path)?;
        let split = SplitManifest::load(&split_path)?;
        dpaudit::timing::note("load data and split", t0);
        let basis = dpaudit::attacks::mechanism::diffusers_basis(
            ck.config_path.parent().unwrap_or(dir),
            a.mechanism.ledger.as_deref(),
            &a.mechanism.spec(),
            a.delta,
            &a.mechanism.trusted()?,
        )?;
        Ok(DiffusersRun {
            ck,
            images,
            split,
            data_path,
            split_path,
            basis,
        })
    }

    /// The batched denoiser: `--batch-size`, else on a GPU the largest power of two that fits half
    /// its free memory (announced), else 64. Returns it with the batch and whether it was fitted.
    fn denoiser(&self, a: &Args) -> anyhow::Result<(dpaudit::models::diffusers::DiffusersDenoiser<'_>, usize, bool)> {
        let fitted = match a.batch_size {
            Some(_) => None,
            None => self.ck.fit_batch(self.images.shape, a.precision.into()),
        };
        let batch = a.batch_size.or(fitted.map(|f| f.0)).unwrap_or(64);
        if let Some((b, free)) = fitted {
            dpaudit::report::progress::note(&format!(
                "batch: {b} images per forward (fits half of the GPU's {:.1} GiB free)",
                free as f64 / (1u64 << 30) as f64
            ));
        }
        Ok((self.ck.denoiser(self.images.shape, batch)?, batch, fitted.is_some()))
    }

    /// The plan, with the empirical attack dropped (warned) when it came from the defaults.
    fn plan(&self, a: &Args, den: &dpaudit::models::diffusers::DiffusersDenoiser<'_>) -> anyhow::Result<MiaPlan> {
        let mut p = plan(a, Some(&|s: &str| den.schedule.parse_timestep(s)))?;
        if a.attack.is_empty() && p.attacks.contains(&AttackKind::Empirical) {
            // It attacks the sampler's denoiser (every member against every query), not the
            // UNet: asked for by name only.
            eprintln!("note: the empirical attack is not a default for a diffusers checkpoint (ask for it with --attack empirical)");
            p.attacks.retain(|k| *k != AttackKind::Empirical);
        }
        Ok(p)
    }
}

/// A diffusers checkpoint folder: images and split from flags, scores through the batched UNet.
fn run_diffusers(
    a: &Args,
    dir: &std::path::Path,
    dev: &candle_core::Device,
    dev_name: &str,
) -> anyhow::Result<(pipeline::MiaReport, Vec<scores::ScoreRecord>)> {
    let r = DiffusersRun::load(a, dir, dev)?;
    let (den, batch, batch_fitted) = r.denoiser(a)?;
    let p = r.plan(a, &den)?;
    dpaudit::report::progress::note(&format!("device: {dev_name}"));
    let bar = dpaudit::report::progress::bar((p.attacks.len() * p.timesteps.len()) as u64, a.output.quiet, "mia");
    let (mut report, records) = dpaudit::attacks::diffusers::run_with_basis(
        &r.ck,
        &den,
        &r.images,
        &r.split,
        &r.split_path,
        &p,
        a.max_examples,
        dev_name,
        Some(&bar),
        r.basis.as_ref(),
    )?;
    bar.finish_and_clear();
    if !dev.is_cpu() {
        let mut note = pipeline::PrecisionNote {
            precision: a.precision.into(),
            batch,
            batch_fitted,
            sample: 0,
            max_abs_score_change: None,
            max_rel_score_change: None,
        };
        if dpaudit::models::precision::Precision::from(a.precision) != dpaudit::models::precision::Precision::Fp32 {
            // 16 members and 16 non-members (fewer with --max-examples) again in fp32.
            let sample = a.max_examples.unwrap_or(usize::MAX).min(16);
            let (n, abs, rel) =
                dpaudit::attacks::diffusers::fp32_score_change(&den, &r.images, &r.split, &p, &records, sample)?;
            note.sample = n;
            note.max_abs_score_change = Some(abs);
            note.max_rel_score_change = Some(rel);
        }
        report.precision = Some(note);
    }
    Ok((report, records))
}

/// Runs `dpaudit mia`.
pub fn run(a: Args) -> anyhow::Result<Status> {
    let diffusers_folder = a
        .checkpoint
        .as_deref()
        .is_some_and(|p| dpaudit::models::diffusers::unet_dir(p).is_some());
    if !a.mechanism.is_empty() && !diffusers_folder {
        return Err(Error::field(
            "--ledger",
            "--ledger and the Opacus-style flags state the mechanism of a diffusers checkpoint (a dpaudit checkpoint's card names its own ledger)",
        )
        .into());
    }
    if let Some(spec) = &a.shard {
        return run_shard(&a, spec);
    }
    if a.scores.is_some() {
        for (given, flag) in [
            (!a.attack.is_empty(), "--attack"),
            (!a.timesteps.is_empty(), "--timesteps"),
        ] {
            if given {
                return Err(Error::field(
                    flag,
                    "not with --scores: the scores file fixes the attacks and timesteps (its `attack` and `t` columns)",
                )
                .into());
            }
        }
    }
    // Output locations are checked (and existing files refused) before the long run.
    let out = a.output.prepare(Format::Text, &["mia.json", "mia.csv"])?;
    for p in a.roc_out.iter().chain(&a.scores_out) {
        dpaudit::report::output::check_file(p, out.force)?;
    }
    let t0 = std::time::Instant::now();
    let dev = device::select(a.device.into())?;
    dpaudit::timing::note("open device", t0);
    let dev_name = device::describe(&dev);
    // A diffusers folder (config.json + safetensors + scheduler_config.json) takes its own path.
    let diffusers = a
        .checkpoint
        .as_deref()
        .filter(|p| dpaudit::models::diffusers::unet_dir(p).is_some());
    let ck = match diffusers {
        Some(_) => None,
        None => a.checkpoint.as_ref().map(|p| Checkpoint::load(p, &dev)).transpose()?,
    };
    let (report, records) = match &a.scores {
        None if diffusers.is_some() => run_diffusers(&a, diffusers.unwrap(), &dev, &dev_name)?,
        Some(path) => {
            let file = scores::ScoresFile::load(path)?;
            let plan = plan(&a, None)?;
            if plan.audit == Some(dpaudit::attacks::pipeline::AuditKind::OneRun) {
                // The canary rows must be the training run's canaries, as the card records them
                // (the same canaries `mia --checkpoint … --audit one-run` scores itself).
                let want = match (diffusers, ck.as_ref()) {
                    (Some(dir), _) => {
                        let (c, card) = dpaudit::attacks::diffusers::folder_canaries(dir)?;
                        Some((c, format!("the canaries file of {}", card.display())))
                    }
                    (None, Some(ck)) => Some((
                        dpaudit::models::canary::Canaries::of_checkpoint(ck)?,
                        format!("the canaries file of {}", ck.card_path.display()),
                    )),
                    (None, None) => None,
                };
                file.check_canaries(want.as_ref().map(|(c, s)| (c, s.as_str())))?;
            }
            let recs = file.records;
            let r = match diffusers {
                // A diffusers folder supplies its ledger (or the stated mechanism) to compare with.
                Some(dir) => {
                    let basis = dpaudit::attacks::mechanism::diffusers_basis(
                        &dpaudit::models::diffusers::unet_dir(dir).unwrap_or_else(|| dir.to_path_buf()),
                        a.mechanism.ledger.as_deref(),
                        &a.mechanism.spec(),
                        a.delta,
                        &a.mechanism.trusted()?,
                    )?;
                    pipeline::from_scores_basis(
                        &recs,
                        &path.display().to_string(),
                        basis,
                        Some(dir.display().to_string()),
                        &plan,
                    )?
                }
                None => pipeline::from_scores(&recs, &path.display().to_string(), ck.as_ref(), &plan)?,
            };
            (r, recs)
        }
        None => {
            let ck = ck.as_ref().expect("clap requires --checkpoint without --scores");
            dpaudit::report::progress::note(&format!("device: {dev_name}"));
            let plan = plan(&a, Some(&|s: &str| ck.schedule.parse_timestep(s)))?;
            let data = Dataset::load(&match &a.data {
                Some(p) => p.clone(),
                None => ck.data_file()?,
            })?;
            let split = SplitManifest::load(&match &a.split {
                Some(p) => p.clone(),
                None => ck.split_file()?,
            })?;
            let total =
                (plan.attacks.len() * plan.timesteps.len() + plan.table2.as_ref().map_or(0, |t| t.steps.len())) as u64;
            let bar = dpaudit::report::progress::bar(total, a.output.quiet, "mia");
            let out = pipeline::run(ck, &data, &split, &plan, &dev_name, Some(&bar))?;
            bar.finish_and_clear();
            out
        }
    };
    emit(&report, &records, &out, a.roc_out.as_ref(), a.scores_out.as_ref())
}

/// Writes `report` (stdout in `--format`, `--out DIR`, and the ROC / score files asked for) and
/// returns its status (violated when a comparison fails); shared by `mia` and `merge`.
pub(crate) fn emit(
    report: &pipeline::MiaReport,
    records: &[scores::ScoreRecord],
    out: &Outputs,
    roc_out: Option<&PathBuf>,
    scores_out: Option<&PathBuf>,
) -> anyhow::Result<Status> {
    let status = out.emit(dpaudit::audit::mia::outcome(report, &dpaudit::report::command_line())?)?;
    if let Some(p) = roc_out {
        dpaudit::report::output::write_atomic(p, render::roc_csv(report)?.as_bytes(), out.force)?;
        dpaudit::report::progress::note(&format!("wrote {}", p.display()));
    }
    if let Some(p) = scores_out {
        dpaudit::report::output::write_atomic(p, scores::to_csv(records)?.as_bytes(), out.force)?;
        dpaudit::report::progress::note(&format!("wrote {}", p.display()));
    }
    let violations = report.violations();
    for c in &violations {
        eprintln!("{}: {} ({}; basis: {})", c.what, c.outcome, c.measured, c.basis);
    }
    Ok(status)
}

/// `mia --shard i/n`: scores one shard and writes its part file into `--out DIR`.
fn run_shard(a: &Args, spec: &str) -> anyhow::Result<Status> {
    let spec: ShardSpec = spec.parse()?;
    if a.scores.is_some() {
        return Err(Error::field(
            "--shard",
            "shards score a checkpoint; merge parts with `dpaudit merge`, not --scores",
        )
        .into());
    }
    for (given, flag) in [
        (a.roc_out.is_some(), "--roc-out"),
        (a.scores_out.is_some(), "--scores-out"),
    ] {
        if given {
            return Err(Error::field(flag, "not with --shard: give it to `dpaudit merge`").into());
        }
    }
    let card = a
        .checkpoint
        .as_ref()
        .ok_or_else(|| Error::field("--checkpoint", "required with --shard"))?;
    let dir = a
        .output
        .out
        .as_ref()
        .ok_or_else(|| Error::field("--out", "--shard needs --out DIR (the part file is written there)"))?;
    dpaudit::report::progress::set_verbosity(a.output.quiet, a.output.verbose);
    dpaudit::report::output::create_out_dir(dir)?;
    let path = dir.join(spec.file_name());
    dpaudit::report::output::check_file(&path, a.output.force)?;
    let dev = device::select(a.device.into())?;
    dpaudit::report::progress::note(&format!(
        "device: {}   shard {}/{}",
        device::describe(&dev),
        spec.index,
        spec.count
    ));
    if let Some(udir) = dpaudit::models::diffusers::unet_dir(card) {
        return shard_diffusers(a, spec, &udir, &dev, &path);
    }
    let ck = Checkpoint::load(card, &dev)?;
    let plan = plan(a, Some(&|s: &str| ck.schedule.parse_timestep(s)))?;
    let part_plan = PartPlan::of(&plan)?;
    let data_path = match &a.data {
        Some(p) => p.clone(),
        None => ck.data_file()?,
    };
    let split_path = match &a.split {
        Some(p) => p.clone(),
        None => ck.split_file()?,
    };
    let data = Dataset::load(&data_path)?;
    let split = SplitManifest::load(&split_path)?;
    let inputs = PartInputs::of(&ck.card_path, &data_path, &split_path)?;
    let total = (plan.attacks.len() * plan.timesteps.len()) as u64;
    let bar = dpaudit::report::progress::bar(total, a.output.quiet, "mia shard");
    let recs = pipeline::score_checkpoint_shard(&ck, &data, &split, &plan, Some(&bar), Some(spec))?;
    bar.finish_and_clear();
    let part = MiaPart {
        schema: PART_SCHEMA.into(),
        shard: spec,
        inputs,
        plan: part_plan,
        records: recs.iter().map(|(p, r)| PartRecord::new(*p, r)).collect(),
    };
    let text = serde_json::to_string(&part)? + "\n";
    dpaudit::report::output::write_atomic(&path, text.as_bytes(), a.output.force)?;
    dpaudit::report::progress::note(&format!("wrote {} ({} records)", path.display(), part.records.len()));
    Ok(Status::Ok)
}

/// `mia --shard i/n` on a diffusers folder: the records of one shard of the unsharded run, with
/// the folder's content hash, `--max-examples` and the mechanism in the part file.
fn shard_diffusers(
    a: &Args,
    spec: ShardSpec,
    udir: &std::path::Path,
    dev: &candle_core::Device,
    path: &std::path::Path,
) -> anyhow::Result<Status> {
    let r = DiffusersRun::load(a, udir, dev)?;
    let (den, _, _) = r.denoiser(a)?;
    let plan = r.plan(a, &den)?;
    let mut part_plan = PartPlan::of(&plan)?;
    part_plan.diffusers = Some(dpaudit::attacks::shard::DiffusersPart {
        max_examples: a.max_examples,
        basis: r.basis.clone(),
    });
    let rows =
        dpaudit::attacks::diffusers::attacked_rows(&r.ck, &r.images, &r.split, &r.split_path, &plan, a.max_examples)?;
    let inputs = PartInputs::of(udir, &r.data_path, &r.split_path)?;
    let total = (plan.attacks.len() * plan.timesteps.len()) as u64;
    let bar = dpaudit::report::progress::bar(total, a.output.quiet, "mia shard");
    let recs = dpaudit::attacks::diffusers::score_shard(&den, &r.images, &rows, &plan, Some(&bar), Some(spec))?;
    bar.finish_and_clear();
    let part = MiaPart {
        schema: PART_SCHEMA.into(),
        shard: spec,
        inputs,
        plan: part_plan,
        records: recs.iter().map(|(p, r)| PartRecord::new(*p, r)).collect(),
    };
    let text = serde_json::to_string(&part)? + "\n";
    dpaudit::report::output::write_atomic(path, text.as_bytes(), a.output.force)?;
    dpaudit::report::progress::note(&format!("wrote {} ({} records)", path.display(), part.records.len()));
    Ok(Status::Ok)
}
