//! `mia` planned: the request (what the command line asked for) → the input path (an 8×8 card
//! or a diffusers folder, attacked whole or one shard of it, or a `--scores` file compared with
//! either) → the [`MiaPlan`] and the loaded [`Subject`] → the one attack chain
//! ([`pipeline::run`], [`pipeline::score`] for shards, [`pipeline::from_scores`]) → the report.
//! Every decision between the input paths is made here; the CLI only maps flags to a
//! [`Request`].

use std::path::{Path, PathBuf};

use crate::attacks::mechanism::OpacusSpec;
pub use crate::attacks::mia::ScoreOpts;
use crate::attacks::mia::{AttackKind, MetricOpts};
pub use crate::attacks::pipeline::MiaReport;
use crate::attacks::pipeline::{self, AuditKind, Basis, MiaPlan, PrecisionNote, Table2Opts};
use crate::attacks::scores;
pub use crate::attacks::scores::ScoreRecord;
use crate::attacks::shard::{DiffusersPart, MiaPart, PartInputs, PartPlan, PartRecord, ShardSpec, PART_SCHEMA};
use crate::attacks::subject::{self, Subject};
use crate::data::images::ImageSet;
use crate::data::{Dataset, SplitManifest};
use crate::error::{Error, Result};
use crate::models::diffusers::{unet_dir, DiffusersCheckpoint};
use crate::models::precision::Precision;
use crate::models::toy::Checkpoint;
use crate::models::{device, DeviceChoice};
use crate::report::{output, progress};

/// `--attack` when not given.
pub const DEFAULT_ATTACKS: [AttackKind; 4] = [
    AttackKind::Loss,
    AttackKind::Secmi,
    AttackKind::Pia,
    AttackKind::Empirical,
];
/// `--timesteps` when not given.
pub const DEFAULT_TIMESTEPS: [&str; 4] = ["10", "50", "100", "T/4"];

/// What a `mia` run was asked to do (one field per command-line flag).
#[derive(Debug, Clone)]
pub struct Request {
    /// Checkpoint card, weights or stem, or a diffusers folder.
    pub checkpoint: Option<PathBuf>,
    /// Per-record scores to read instead of attacking.
    pub scores: Option<PathBuf>,
    /// Where to write every per-record score.
    pub scores_out: Option<PathBuf>,
    /// Where to write every ROC point.
    pub roc_out: Option<PathBuf>,
    /// The audit with a valid ε lower bound.
    pub audit: Option<AuditKind>,
    /// Sampler config the empirical attack is compared with.
    pub sampler: Option<PathBuf>,
    /// Data file (default: the card's).
    pub data: Option<PathBuf>,
    /// Split manifest (default: the card's).
    pub split: Option<PathBuf>,
    /// Attacks (empty: [`DEFAULT_ATTACKS`]).
    pub attacks: Vec<AttackKind>,
    /// Step specs (empty: [`DEFAULT_TIMESTEPS`]).
    pub timesteps: Vec<String>,
    /// Attack knobs (noise draws, SecMI's k, PIA's norm, the empirical rate, the seed).
    pub score: ScoreOpts,
    /// Bootstrap resamples.
    pub bootstrap: usize,
    /// Level of the bootstrap intervals, and 1 − β of the audits.
    pub confidence: f64,
    /// δ of the guarantees and the audits.
    pub delta: f64,
    /// The null test.
    pub null_test: bool,
    /// Table-2 rates (None: no Table 2).
    pub table2_rates: Option<Vec<f64>>,
    /// Cosine-profile step specs.
    pub cosine: Vec<String>,
    /// `i/n`: score one shard into a part file.
    pub shard: Option<String>,
    /// `--out DIR` (the part file of a shard goes there).
    pub out_dir: Option<PathBuf>,
    /// Replace existing output files.
    pub force: bool,
    /// Progress: quiet, verbose.
    pub quiet: bool,
    /// `-v` count.
    pub verbose: u8,
    /// The backend: the device the model runs on.
    pub device: DeviceChoice,
    /// Diffusers: members and non-members drawn at random (seeded).
    pub max_examples: Option<usize>,
    /// Diffusers: images per forward pass (None: fitted on a GPU, else 64).
    pub batch_size: Option<usize>,
    /// Diffusers on a GPU: the arithmetic of the forward.
    pub precision: Precision,
    /// Diffusers: the training mechanism as a ledger file.
    pub ledger: Option<PathBuf>,
    /// Diffusers: the training mechanism in Opacus' terms.
    pub opacus: OpacusSpec,
    /// Diffusers: public keys the folder's release must be signed by.
    pub trust_keys: Vec<PathBuf>,
}

/// Parses a step spec (`10`, `T/4`) against a schedule.
pub type ParseT<'a> = &'a dyn Fn(&str) -> Result<usize>;

/// What [`execute`] produced.
pub enum MiaRun {
    /// The report, for the shared output writer (`--format`, `--out`).
    Report(Box<crate::audit::Outcome>),
    /// A shard's part file was written into `--out DIR`.
    Part,
}

impl Request {
    fn folder(&self) -> Option<&Path> {
        self.checkpoint.as_deref().filter(|p| unet_dir(p).is_some())
    }

    /// The combinations of flags refused before anything is read or written.
    pub fn check(&self) -> Result<()> {
        let stated = self.ledger.is_some() || !self.opacus.is_empty();
        if stated && self.folder().is_none() {
            return Err(Error::field(
                "--ledger",
                "--ledger and the Opacus-style flags state the mechanism of a diffusers checkpoint (a dpaudit checkpoint's card names its own ledger)",
            ));
        }
        if self.shard.is_some() {
            return Ok(());
        }
        if self.scores.is_some() {
            for (given, flag) in [
                (!self.attacks.is_empty(), "--attack"),
                (!self.timesteps.is_empty(), "--timesteps"),
            ] {
                if given {
                    return Err(Error::field(
                        flag,
                        "not with --scores: the scores file fixes the attacks and timesteps (its `attack` and `t` columns)",
                    ));
                }
            }
        }
        Ok(())
    }

    fn timestep_specs(&self) -> Vec<String> {
        if self.timesteps.is_empty() {
            DEFAULT_TIMESTEPS.iter().map(|s| s.to_string()).collect()
        } else {
            self.timesteps.clone()
        }
    }

    /// The plan; `parse_t` reads steps (None with --scores: the steps come from the file).
    pub fn plan(&self, parse_t: Option<ParseT<'_>>) -> Result<MiaPlan> {
        let steps = |v: &[String]| -> Result<Vec<usize>> {
            match parse_t {
                Some(f) => v.iter().map(|s| f(s)).collect(),
                None => Ok(Vec::new()),
            }
        };
        let s = &self.score;
        if !(self.confidence > 0.0 && self.confidence < 1.0) {
            return Err(Error::field("--confidence", "must be in (0, 1)"));
        }
        if !(self.delta > 0.0 && self.delta < 1.0) {
            return Err(Error::field("--delta", "must be in (0, 1)"));
        }
        if !(s.empirical_rate > 0.0 && s.empirical_rate <= 1.0) {
            return Err(Error::field("--empirical-sample-rate", "must be in (0, 1]"));
        }
        if let Some(r) = &self.table2_rates {
            if r.iter().any(|p| !(*p > 0.0 && *p <= 1.0)) {
                return Err(Error::field("--table2-rates", "rates must be in (0, 1]"));
            }
        }
        if !(s.pia_norm >= 1.0 && s.pia_norm.is_finite()) {
            return Err(Error::field("--pia-norm", "must be a finite p ≥ 1"));
        }
        if parse_t.is_some() {
            // Every draw is a model evaluation on every attacked record at every attacked step.
            let per_draw = crate::limits::MIA_DRAW.work * self.timestep_specs().len().max(1) as f64;
            crate::limits::check_count(
                "--noise-draws",
                s.noise_draws as u64,
                crate::limits::Cost::new(0.0, per_draw),
            )?;
        }
        Ok(MiaPlan {
            attacks: if self.attacks.is_empty() {
                DEFAULT_ATTACKS.to_vec()
            } else {
                self.attacks.clone()
            },
            timesteps: steps(&self.timestep_specs())?,
            score: self.score,
            metric: MetricOpts {
                bootstrap: self.bootstrap,
                level: self.confidence,
                delta: self.delta,
                seed: s.seed,
            },
            null_test: self.null_test,
            table2: self.table2_rates.as_ref().map(|r| Table2Opts {
                rates: r.clone(),
                ..Default::default()
            }),
            cosine_steps: steps(&self.cosine)?,
            audit: self.audit,
            sampler: match &self.sampler {
                Some(p) => Some(pipeline::sampler_basis(p, self.delta)?),
                None => None,
            },
            beta: 1.0 - self.confidence,
        })
    }

    /// The guarantee a diffusers folder is compared with: its own ledger, or the stated one.
    fn folder_basis(&self, udir: &Path) -> Result<Option<Basis>> {
        crate::attacks::mechanism::diffusers_basis(
            udir,
            self.ledger.as_deref(),
            &self.opacus,
            self.delta,
            &crate::provenance::load_trusted(&self.trust_keys)?,
        )
    }
}

/// A loaded subject with its plan and the files it was read from.
struct Loaded {
    subject: Subject,
    plan: MiaPlan,
    data_path: PathBuf,
    split_path: PathBuf,
    /// (images per forward, fitted to the GPU's memory) of a diffusers folder.
    batch: Option<(usize, bool)>,
}

/// Loads the checkpoint at `path` (a card or a diffusers folder) with its data and split, and
/// plans the run on its schedule.
fn load(req: &Request, path: &Path, dev: &candle_core::Device) -> Result<Loaded> {
    if unet_dir(path).is_none() {
        let ck = Checkpoint::load(path, dev)?;
        let plan = req.plan(Some(&|s: &str| ck.schedule.parse_timestep(s)))?;
        let data_path = match &req.data {
            Some(p) => p.clone(),
            None => ck.data_file()?,
        };
        let split_path = match &req.split {
            Some(p) => p.clone(),
            None => ck.split_file()?,
        };
        let data = Dataset::load(&data_path)?;
        let split = SplitManifest::load(&split_path)?;
        let subject = Subject::card(ck, data, split, &plan)?;
        return Ok(Loaded {
            subject,
            plan,
            data_path,
            split_path,
            batch: None,
        });
    }
    if req.batch_size == Some(0) || req.max_examples == Some(0) {
        return Err(Error::field(
            "--batch-size",
            "--batch-size and --max-examples must be ≥ 1",
        ));
    }
    crate::models::precision::check_device(req.precision, dev)?;
    let t0 = std::time::Instant::now();
    let mut ck = DiffusersCheckpoint::load(path, dev)?;
    // The plan's arithmetic travels with the loaded checkpoint into every forward.
    ck.precision = req.precision;
    crate::timing::note("load checkpoint", t0);
    crate::timing::within_summary();
    let udir = ck.config_path.parent().unwrap_or(path).to_path_buf();
    // Without --data/--split: the data and split the folder's card records.
    let card = match (&req.data, &req.split) {
        (Some(_), Some(_)) => None,
        _ => crate::models::diffusers_train::card_data(&udir)?,
    };
    let missing = |flag: &str, what: &str| {
        Error::field(
            flag,
            format!("required with a diffusers checkpoint that has no dpaudit card (dpaudit-card.toml) recording its {what}"),
        )
    };
    let data_path = req
        .data
        .clone()
        .or_else(|| card.as_ref().map(|c| c.0.clone()))
        .ok_or_else(|| missing("--data", "data"))?;
    let split_path = req
        .split
        .clone()
        .or_else(|| card.as_ref().map(|c| c.1.clone()))
        .ok_or_else(|| missing("--split", "split"))?;
    let t0 = std::time::Instant::now();
    let images = ImageSet::load(&data_path)?;
    let split = SplitManifest::load(&split_path)?;
    crate::timing::note("load data and split", t0);
    let basis = req.folder_basis(&udir)?;
    // `--batch-size`, else on a GPU the largest power of two that fits half its free memory
    // (announced), else 64.
    let fitted = match req.batch_size {
        Some(_) => None,
        None => ck.fit_batch(images.shape, req.precision),
    };
    let batch = req.batch_size.or(fitted.map(|f| f.0)).unwrap_or(64);
    if let Some((b, free)) = fitted {
        progress::note(&format!(
            "batch: {b} images per forward (fits half of the GPU's {:.1} GiB free)",
            free as f64 / (1u64 << 30) as f64
        ));
    }
    let mut plan = {
        let den = ck.denoiser(images.shape, batch)?;
        req.plan(Some(&|s: &str| den.schedule.parse_timestep(s)))?
    };
    if req.attacks.is_empty() && plan.attacks.contains(&AttackKind::Empirical) {
        // It attacks the sampler's denoiser (every member against every query), not the
        // UNet: asked for by name only.
        eprintln!("note: the empirical attack is not a default for a diffusers checkpoint (ask for it with --attack empirical)");
        plan.attacks.retain(|k| *k != AttackKind::Empirical);
    }
    let subject = Subject::diffusers(ck, batch, images, split, &split_path, &plan, req.max_examples, basis)?;
    Ok(Loaded {
        subject,
        plan,
        data_path,
        split_path,
        batch: Some((batch, fitted.is_some())),
    })
}

/// Runs `mia` as `req` asks: a shard's part file, the report of a scores file, or the attacks
/// on a checkpoint of either kind (the ROC and score files written as asked).
pub fn execute(req: &Request) -> Result<MiaRun> {
    req.check()?;
    if let Some(spec) = &req.shard {
        return shard(req, spec).map(|_| MiaRun::Part);
    }
    // Output locations are checked (and existing files refused) before the long run.
    for p in req.roc_out.iter().chain(&req.scores_out) {
        output::check_file(p, req.force)?;
    }
    let t0 = std::time::Instant::now();
    let dev = device::select(req.device)?;
    crate::timing::note("open device", t0);
    let dev_name = device::describe(&dev);
    let (report, records) = match (&req.scores, &req.checkpoint) {
        (Some(path), _) => from_scores(req, path, &dev)?,
        (None, Some(ck)) => attack(req, ck, &dev, &dev_name)?,
        (None, None) => return Err(Error::field("--checkpoint", "required without --scores")),
    };
    Ok(MiaRun::Report(Box::new(finish(
        &report,
        &records,
        req.roc_out.as_deref(),
        req.scores_out.as_deref(),
        req.force,
    )?)))
}

/// The attacks on the checkpoint at `path`, with the precision note of a GPU run.
fn attack(
    req: &Request,
    path: &Path,
    dev: &candle_core::Device,
    dev_name: &str,
) -> Result<(MiaReport, Vec<ScoreRecord>)> {
    let l = load(req, path, dev)?;
    progress::note(&format!("device: {dev_name}"));
    let p = &l.plan;
    let total = (p.attacks.len() * p.timesteps.len() + p.table2.as_ref().map_or(0, |t| t.steps.len())) as u64;
    let bar = progress::bar(total, req.quiet, "mia");
    let (mut report, records) = pipeline::run(&l.subject, p, dev_name, Some(&bar))?;
    bar.finish_and_clear();
    if let (Some((batch, batch_fitted)), false) = (l.batch, dev.is_cpu()) {
        let mut note = PrecisionNote {
            precision: req.precision,
            batch,
            batch_fitted,
            sample: 0,
            max_abs_score_change: None,
            max_rel_score_change: None,
        };
        if req.precision != Precision::Fp32 {
            // 16 members and 16 non-members (fewer with --max-examples) again in fp32.
            let sample = req.max_examples.unwrap_or(usize::MAX).min(16);
            let eps = l.subject.eps()?;
            let (n, abs, rel) = pipeline::fp32_score_change(&l.subject, eps.denoiser(), p, &records, sample)?;
            note.sample = n;
            note.max_abs_score_change = Some(abs);
            note.max_rel_score_change = Some(rel);
        }
        report.precision = Some(note);
    }
    Ok((report, records))
}

/// The report of a scores file, compared with the checkpoint's guarantee (a card's ledger, or
/// a diffusers folder's ledger or stated mechanism); a one-run audit's canary rows must be the
/// training run's canaries as the card records them.
fn from_scores(req: &Request, path: &Path, dev: &candle_core::Device) -> Result<(MiaReport, Vec<ScoreRecord>)> {
    let folder = req.folder();
    let ck = match (folder, &req.checkpoint) {
        (None, Some(p)) => Some(Checkpoint::load(p, dev)?),
        _ => None,
    };
    let file = scores::ScoresFile::load(path)?;
    let plan = req.plan(None)?;
    if plan.audit == Some(AuditKind::OneRun) {
        let want = match (folder, ck.as_ref()) {
            (Some(dir), _) => {
                let (c, card) = subject::folder_canaries(dir)?;
                Some((c, format!("the canaries file of {}", card.display())))
            }
            (None, Some(ck)) => Some((
                crate::models::canary::Canaries::of_checkpoint(ck)?,
                format!("the canaries file of {}", ck.card_path.display()),
            )),
            (None, None) => None,
        };
        file.check_canaries(want.as_ref().map(|(c, s)| (c, s.as_str())))?;
    }
    let recs = file.records;
    let name = path.display().to_string();
    let r = match folder {
        Some(dir) => {
            let basis = req.folder_basis(&unet_dir(dir).unwrap_or_else(|| dir.to_path_buf()))?;
            pipeline::from_scores_basis(&recs, &name, basis, Some(dir.display().to_string()), &plan)?
        }
        None => pipeline::from_scores(&recs, &name, ck.as_ref(), &plan)?,
    };
    Ok((r, recs))
}

/// `mia --shard i/n`: scores one shard of the checkpoint (either kind) and writes its part file
/// (scores with the inputs' hashes; a diffusers folder's `--max-examples` and mechanism) into
/// `--out DIR`.
fn shard(req: &Request, spec: &str) -> Result<()> {
    let spec: ShardSpec = spec.parse()?;
    if req.scores.is_some() {
        return Err(Error::field(
            "--shard",
            "shards score a checkpoint; merge parts with `dpaudit merge`, not --scores",
        ));
    }
    for (given, flag) in [
        (req.roc_out.is_some(), "--roc-out"),
        (req.scores_out.is_some(), "--scores-out"),
    ] {
        if given {
            return Err(Error::field(flag, "not with --shard: give it to `dpaudit merge`"));
        }
    }
    let card = req
        .checkpoint
        .as_ref()
        .ok_or_else(|| Error::field("--checkpoint", "required with --shard"))?;
    let dir = req
        .out_dir
        .as_ref()
        .ok_or_else(|| Error::field("--out", "--shard needs --out DIR (the part file is written there)"))?;
    progress::set_verbosity(req.quiet, req.verbose);
    output::create_out_dir(dir)?;
    let path = dir.join(spec.file_name());
    output::check_file(&path, req.force)?;
    let dev = device::select(req.device)?;
    progress::note(&format!(
        "device: {}   shard {}/{}",
        device::describe(&dev),
        spec.index,
        spec.count
    ));
    let folder = unet_dir(card);
    let l = load(req, folder.as_deref().unwrap_or(card), &dev)?;
    let mut part_plan = PartPlan::of(&l.plan)?;
    if folder.is_some() {
        part_plan.diffusers = Some(DiffusersPart {
            max_examples: req.max_examples,
            basis: l.subject.basis.clone(),
        });
    }
    let inputs = PartInputs::of(&l.subject.path(), &l.data_path, &l.split_path)?;
    let total = (l.plan.attacks.len() * l.plan.timesteps.len()) as u64;
    let bar = progress::bar(total, req.quiet, "mia shard");
    let eps = l.subject.eps()?;
    let recs = pipeline::score(&l.subject, eps.denoiser(), &l.plan, Some(&bar), Some(spec))?;
    bar.finish_and_clear();
    let part = MiaPart {
        schema: PART_SCHEMA.into(),
        shard: spec,
        inputs,
        plan: part_plan,
        records: recs.iter().map(|(p, r)| PartRecord::new(*p, r)).collect(),
    };
    let text = serde_json::to_string(&part).map_err(|e| Error::input(e.to_string()))? + "\n";
    output::write_atomic(&path, text.as_bytes(), req.force)?;
    progress::note(&format!("wrote {} ({} records)", path.display(), part.records.len()));
    Ok(())
}

/// The outcome of `report` (for the shared output writer), after writing the ROC and score
/// files asked for and naming each violation on stderr; shared by `mia` and `merge`.
pub fn finish(
    report: &MiaReport,
    records: &[ScoreRecord],
    roc_out: Option<&Path>,
    scores_out: Option<&Path>,
    force: bool,
) -> Result<crate::audit::Outcome> {
    let outcome = super::outcome(report, &crate::report::command_line())?;
    if let Some(p) = roc_out {
        output::write_atomic(p, crate::attacks::render::roc_csv(report)?.as_bytes(), force)?;
        progress::note(&format!("wrote {}", p.display()));
    }
    if let Some(p) = scores_out {
        output::write_atomic(p, scores::to_csv(records)?.as_bytes(), force)?;
        progress::note(&format!("wrote {}", p.display()));
    }
    for c in report.violations() {
        eprintln!("{}: {} ({}; basis: {})", c.what, c.outcome, c.measured, c.basis);
    }
    Ok(outcome)
}
