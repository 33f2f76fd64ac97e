//! The one training orchestrator of both model families (the 8×8 toys in [`super::toy`], the
//! diffusers `UNet2DModel` in [`super::diffusers_train`]): a [`Plan`] in; the checks of the
//! plan, the canaries, Adam and the weight average ([`optim`]), the DP-SGD step (Poisson
//! sampling, per-sample clipping, Gaussian noise, the accountant's ledger), the non-private
//! loop, periodic checkpoints, and the output set — weights, card, ledger and canaries, written
//! at once ([`crate::report::output::commit_set`]) — out ([`run`]).
//!
//! What differs between the families is behind [`Family`]: the variables trained, the
//! per-sample gradients (ghost clipping or a loop for the toys; the hand-written CPU pass or
//! candle's batched pass for the UNet), a non-private batch gradient, the evaluation loss, the
//! weights file and the card. Each family's `setup` (data file format, model from `--init` or
//! fresh, what an `--init` without a ledger must prove) builds a [`Setup`].
//!
//! Privacy rules enforced here for both families:
//! * DP randomness (Poisson sampling, the examples' (t, ε), the Gaussian noise, the canaries'
//!   inclusion bits) comes from the operating system's CSPRNG unless `seed` is given; then the
//!   card says [`RANDOMNESS_SEEDED`].
//! * The ledger is the `--init` checkpoint's ledger composed with the events that ran, and it
//!   names the released weights by SHA-256.
//! * A DP run publishes no unnoised statistic of the private rows: its loss evaluation uses
//!   public rows.

pub mod optim;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};
use candle_nn::{AdamW, Optimizer};
use rand::{Rng, SeedableRng, TryRngCore};
use rand_chacha::{ChaCha20Rng, ChaCha8Rng};
use serde::{Deserialize, Serialize};

use crate::data::digits::{indices_sha256, sha256_file, sha256_hex, Part};
use crate::diffusion::schedule::table::{noisy, TrainingSchedule};
use crate::error::{Error, Result};
use crate::events::{DpEvent, EventBuilder, EventFile, Neighbouring};
use crate::models::canary::{Canaries, CanaryKind, Defect, GradientCanaries, WhiteBoxRecorder, GRADIENT_CANARY_NORM};
use crate::models::card::{CanaryInfo, DataInfo, DpInfo, TrainingInfo, RANDOMNESS_OS, RANDOMNESS_SEEDED};
use crate::models::dp::{normals, release_with, secret_rng};
use crate::report::export::fmt_num;

pub use optim::{adam, Ema};

/// How per-sample gradients are computed (`--per-sample`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PerSample {
    /// The family's fastest exact method: ghost clipping for the 8×8 MLP, the hand-written CPU
    /// pass or candle's batched pass for the UNet, else the loop.
    #[default]
    Auto,
    /// One backward pass with per-sample norms from layer activations (the 8×8 MLP only).
    Ghost,
    /// One backward pass per sample (any architecture; the reference).
    Loop,
}

/// DP-SGD settings of a plan.
#[derive(Debug, Clone, Copy)]
pub struct DpPlan {
    /// σ: the noise std is σ·C.
    pub noise_multiplier: f64,
    /// C.
    pub clip: f64,
    /// q.
    pub sample_rate: f64,
    /// δ of the ledger and of the ε the card records.
    pub delta: f64,
    /// Per-sample gradient method.
    pub per_sample: PerSample,
}

/// Everything a training run needs, whichever model family.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Data file.
    pub data: PathBuf,
    /// Split manifest.
    pub split: PathBuf,
    /// Part of the split trained on (the private rows).
    pub on: Part,
    /// Output: a stem (`<stem>.toml`, `<stem>.safetensors`, … for the 8×8 models) or a folder
    /// (diffusers).
    pub out: PathBuf,
    /// Optimiser steps.
    pub steps: usize,
    /// Batch size (non-DP); rows per per-sample-gradient chunk of candle's batched pass (DP).
    pub batch_size: usize,
    /// Adam learning rate.
    pub lr: f64,
    /// EMA decay.
    pub ema: f64,
    /// Lowest step trained.
    pub t_min: usize,
    /// Highest step trained (default T − 1).
    pub t_max: Option<usize>,
    /// Starting checkpoint.
    pub init: Option<PathBuf>,
    /// `--seed` (None: randomness from the OS).
    pub seed: Option<u64>,
    /// Input canaries (±1 images, audited black-box) for a one-run audit (0: none).
    pub canaries: usize,
    /// Gradient canaries (white-box, DP only; 0: none). With input canaries too, both audits
    /// measure the same training.
    pub gradient_canaries: usize,
    /// DP-SGD.
    pub dp: Option<DpPlan>,
    /// The device to train on (`--device`; selected by `audit::train`, recorded in the card).
    pub device: crate::models::DeviceChoice,
    /// The command line recorded in the card.
    pub command: String,
    /// No progress bars.
    pub quiet: bool,
    /// Replace an earlier run's files.
    pub force: bool,
    /// Rewrite `OUT/checkpoint/` every this many steps (None: no periodic checkpoints).
    pub checkpoint_every: Option<usize>,
    /// Sign every released set with this key (`--sign-key`, [`crate::provenance`]).
    pub sign_key: Option<ed25519_dalek::SigningKey>,
    /// A defect to train with (tests of the audit only; never a user flag).
    #[doc(hidden)]
    pub defect: Option<Defect>,
}

impl Plan {
    /// Checks the settings against a schedule of `t_len` steps; returns t_max. Errors name the
    /// flag.
    pub fn check(&self, t_len: usize) -> Result<usize> {
        if self.steps == 0 {
            return Err(Error::field("--steps", "must be ≥ 1"));
        }
        if self.batch_size == 0 {
            return Err(Error::field("--batch-size", "must be ≥ 1"));
        }
        crate::limits::check_count("--batch-size", self.batch_size as u64, crate::limits::BATCH_ROW)?;
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            return Err(Error::field("--lr", format!("must be > 0, got {}", self.lr)));
        }
        if !(0.0..1.0).contains(&self.ema) {
            return Err(Error::field("--ema", format!("must be in [0, 1), got {}", self.ema)));
        }
        let t_max = self.t_max.unwrap_or(t_len.saturating_sub(1));
        if self.t_min > t_max || t_max >= t_len {
            return Err(Error::field(
                "--t-max",
                format!("need t_min ≤ t_max < T = {t_len}, got {}..={t_max}", self.t_min),
            ));
        }
        if let Some(d) = &self.dp {
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

    /// The card's `training.randomness`.
    pub fn randomness(&self) -> &'static str {
        if self.seed.is_some() {
            RANDOMNESS_SEEDED
        } else {
            RANDOMNESS_OS
        }
    }

    /// The seed of the public randomness (initialisation, non-DP batches, RAPID's knowledge
    /// base): `seed`, or a fresh draw from the OS. Call once per run.
    pub fn public_seed(&self) -> u64 {
        self.seed
            .unwrap_or_else(|| rand::rngs::OsRng.try_next_u64().unwrap_or(0))
    }
}

/// The ledger an `--init` checkpoint brings (the event file at `path`), which must account
/// under add/remove-one neighbours like this run.
pub fn init_ledger(path: &Path) -> Result<(DpEvent, PathBuf)> {
    let f = EventFile::load(path)?;
    if f.neighbouring != Neighbouring::AddRemove {
        return Err(Error::field(
            "--init",
            format!("{} accounts under a different neighbouring relation", path.display()),
        ));
    }
    Ok((f.event, path.to_path_buf()))
}

/// The examples of one batch: x_t rows, their steps t and noise targets ε.
pub struct Examples {
    /// x_t rows.
    pub xt: Vec<f32>,
    /// Steps.
    pub t: Vec<usize>,
    /// Noise targets.
    pub eps: Vec<f32>,
}

impl Examples {
    /// Number of examples.
    pub fn len(&self) -> usize {
        self.t.len()
    }
    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.t.is_empty()
    }
    /// The DDPM examples of the rows `x0` (each `dim` floats): t ~ U{t.0..=t.1} for every row,
    /// then ε ~ N(0, I), from `rng`.
    pub fn draw<R: Rng + ?Sized>(
        schedule: &TrainingSchedule,
        x0: &[f32],
        dim: usize,
        t: (usize, usize),
        rng: &mut R,
    ) -> Examples {
        let n = x0.len() / dim;
        let t: Vec<usize> = (0..n).map(|_| rng.random_range(t.0..=t.1)).collect();
        let eps = normals(rng, n * dim);
        let xt = noisy(schedule, x0, &t, &eps);
        Examples { xt, t, eps }
    }
}

/// The file roles of a released set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The weights.
    Weights,
    /// The dpaudit card.
    Card,
    /// The DP ledger.
    Ledger,
    /// Input canaries (or gradient canaries alone).
    Canaries,
    /// Gradient canaries beside input canaries.
    GradientCanaries,
    /// The white-box observations.
    Observations,
}

/// Where a run's files go: `<stem>.<ext>` beside each other (the 8×8 models) or fixed names in
/// a folder (diffusers).
#[derive(Debug, Clone)]
pub struct Layout {
    /// The `--out` the user gave (file paths for the user are shown under it).
    pub out: PathBuf,
    /// The folder the files are written to (card paths are relative to it).
    pub dir: PathBuf,
    /// The stem of the files (None: a diffusers folder).
    pub stem: Option<String>,
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

impl Layout {
    /// `<stem>.toml`, … in the folder of `out` (`models/x` → `models/x.toml`).
    pub fn stem(out: &Path) -> Result<Layout> {
        let (dir, name) = stem_parts(out)?;
        Ok(Layout {
            out: out.to_path_buf(),
            dir,
            stem: Some(name),
        })
    }

    /// The diffusers file names in the folder `out`.
    pub fn folder(out: &Path) -> Layout {
        Layout {
            out: out.to_path_buf(),
            dir: out.to_path_buf(),
            stem: None,
        }
    }

    /// The same layout in the sub-folder `name` of its folder (periodic checkpoints).
    fn within(&self, name: &str) -> Layout {
        let dir = self.dir.join(name);
        Layout {
            out: match &self.stem {
                Some(s) => dir.join(s),
                None => dir.clone(),
            },
            dir,
            stem: self.stem.clone(),
        }
    }

    /// The file name of `role`.
    pub fn name(&self, role: Role) -> String {
        use crate::models::folder as f;
        match &self.stem {
            Some(stem) => {
                let ext = match role {
                    Role::Weights => "safetensors",
                    Role::Card => "toml",
                    Role::Ledger => "ledger.toml",
                    Role::Canaries => "canaries.csv",
                    Role::GradientCanaries => "gradient-canaries.csv",
                    Role::Observations => "canary-observations.npy",
                };
                format!("{stem}.{ext}")
            }
            None => match role {
                Role::Weights => f::WEIGHTS,
                Role::Card => f::CARD,
                Role::Ledger => f::LEDGER,
                Role::Canaries => f::CANARIES,
                Role::GradientCanaries => f::GRADIENT_CANARIES,
                Role::Observations => f::OBSERVATIONS,
            }
            .to_string(),
        }
    }

    /// The path of `role` as the user named the output (`<out>.toml`, `<out>/dpaudit-card.toml`).
    pub fn path(&self, role: Role) -> PathBuf {
        match &self.stem {
            Some(stem) => {
                let name = self.name(role);
                PathBuf::from(format!("{}{}", self.out.display(), &name[stem.len()..]))
            }
            None => self.out.join(self.name(role)),
        }
    }
}

/// What a family's `setup` gives the orchestrator.
pub struct Setup {
    /// SHA-256 of the data file.
    pub data_sha256: String,
    /// The trained-on rows' indices in the data file.
    pub private_ix: Vec<usize>,
    /// Those rows, `dim` floats each.
    pub private: Vec<f32>,
    /// The split's public rows (the loss evaluation of DP runs).
    pub public: Vec<f32>,
    /// The `--init` checkpoint's ledger, with its path.
    pub init_ledger: Option<(DpEvent, PathBuf)>,
    /// Why an `--init` checkpoint without a ledger has nothing to compose (the ledger's comment).
    pub init_note: Option<String>,
    /// The highest step trained.
    pub t_max: usize,
    /// The seed of the public randomness ([`Plan::public_seed`]).
    pub public_seed: u64,
}

/// What the orchestrator hands a family to write its card: the parts every card holds.
pub struct Release<'a> {
    /// Where the set goes.
    pub layout: &'a Layout,
    /// Steps that ran.
    pub steps: usize,
    /// Data and split.
    pub data: DataInfo,
    /// How it was trained.
    pub training: TrainingInfo,
    /// DP-SGD settings and the ε spent.
    pub dp: Option<DpInfo>,
    /// Input canaries, or gradient canaries alone.
    pub canaries: Option<CanaryInfo>,
    /// Gradient canaries beside input canaries.
    pub gradient_canaries: Option<CanaryInfo>,
    /// The weights file's bytes.
    pub weights: Vec<u8>,
}

/// Σᵢ clip_C(gᵢ) by parameter name, and the per-sample norms ‖gᵢ‖.
pub type ClippedSum = (HashMap<String, Tensor>, Vec<f64>);

/// The family-specific parts of a training run.
pub trait Family {
    /// The card the family writes.
    type Card;
    /// Salt of the gradient canaries' draw from the seed (kept per family so that seeded runs
    /// reproduce the canaries of earlier releases).
    const GRADIENT_CANARY_SALT: u64;
    /// Rows of the loss evaluation at most.
    const EVAL_ROWS: usize;
    /// Floats per data row.
    fn dim(&self) -> usize;
    /// The trained variables with their names, in a fixed order.
    fn vars(&self) -> Vec<(String, Var)>;
    /// The noise schedule.
    fn schedule(&self) -> &TrainingSchedule;
    /// One line: the architecture and its parameter count.
    fn describe(&self) -> String;
    /// How the DP mechanism is known in the literature (the ledger's comment).
    fn mechanism(&self) -> &'static str;
    /// How per-sample gradients are computed (the card's `dp.per_sample`).
    fn per_sample(&self) -> &'static str;
    /// The executor of the gradients as the run chose it (`dp`: per-sample gradients), recorded
    /// in the report as the plan's backend.
    fn backend(&self, dp: bool) -> &'static str;
    /// The examples of a Poisson batch `x0` from the trainer's sampling stream (RAPID's
    /// retrieval variant replaces the noise targets).
    fn examples(&self, x0: &[f32], t: (usize, usize), rng: &mut ChaCha20Rng) -> Result<Examples> {
        Ok(Examples::draw(self.schedule(), x0, self.dim(), t, rng))
    }
    /// Σᵢ clip_C(gᵢ) of the examples' losses and every ‖gᵢ‖.
    fn clipped_sum(&mut self, ex: &Examples, clip: f64) -> Result<ClippedSum>;
    /// The gradient of the mean loss of a non-private batch of `batch` rows of `x0` drawn from
    /// `rng`, and that loss when it is known without extra work.
    fn plain_grads(
        &mut self,
        x0: &[f32],
        batch: usize,
        t: (usize, usize),
        rng: &mut ChaCha8Rng,
    ) -> Result<(GradStore, Option<f64>)>;
    /// The denoising loss of `rows` on fixed draws from `seed`.
    fn eval_loss(&self, rows: &[f32], t: (usize, usize), seed: u64) -> Result<f64>;
    /// The weights file's bytes.
    fn weights(&self) -> Result<Vec<u8>>;
    /// The card and the family's files of the set (weights, card, configs) in `r.layout`.
    #[allow(clippy::type_complexity)]
    fn card(&self, plan: &Plan, r: Release) -> Result<(Self::Card, Vec<(String, Vec<u8>)>)>;
}

/// What a run wrote and spent.
#[derive(Debug, Clone)]
pub struct Trained<C> {
    /// Where the files went.
    pub layout: Layout,
    /// The card.
    pub card: C,
    /// The whole ledger (DP runs).
    pub event: Option<DpEvent>,
    /// The executor of the gradients ([`Family::backend`]).
    pub backend: &'static str,
    /// Lines for the user (stdout).
    pub lines: Vec<String>,
}

/// The sub-folder of `--out`'s folder that `--checkpoint-every N` rewrites every N steps.
pub const CHECKPOINT_DIR: &str = "checkpoint";

/// A progress bar.
fn bar(len: u64, quiet: bool, what: &str) -> indicatif::ProgressBar {
    crate::report::progress::bar(len, quiet, what)
}

/// Progress for logs: when stderr is not a terminal (where the bar is not drawn) and the run is
/// not quiet, one line every 5 % of the steps with the elapsed time and the ETA, so a long run
/// in the background shows how far it is.
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

/// The settings of a run of DP-SGD steps.
#[derive(Debug, Clone, Copy)]
pub struct DpSteps {
    /// σ, C, q.
    pub dp: DpPlan,
    /// Steps.
    pub steps: usize,
    /// Steps t trained.
    pub t: (usize, usize),
    /// `--seed` (None: the OS CSPRNG).
    pub seed: Option<u64>,
    /// A test's defect.
    pub defect: Option<Defect>,
}

/// What a run of DP-SGD steps did.
pub struct DpRun {
    /// The events that ran, one per step.
    pub ledger: EventBuilder,
    /// Mean realised Poisson batch size.
    pub mean_batch: f64,
}

/// The hooks of a DP-SGD run besides training: a white-box recorder and a callback after each
/// step (progress, periodic checkpoints).
pub struct Hooks<'a, F> {
    /// Gradient canaries to insert and observe.
    pub white_box: Option<&'a mut WhiteBoxRecorder>,
    /// Called after every step with the family, the step count, the average, the ledger so far
    /// and the recorder.
    #[allow(clippy::type_complexity)]
    pub after: Box<dyn FnMut(&F, usize, &Ema, &EventBuilder, Option<&WhiteBoxRecorder>) -> Result<()> + 'a>,
}

impl<F> Default for Hooks<'_, F> {
    fn default() -> Self {
        Hooks {
            white_box: None,
            after: Box::new(|_, _, _, _, _| Ok(())),
        }
    }
}

/// DP-SGD (Abadi et al. 2016, Algorithm 1; RAPID's Algorithm 2; Opacus' Poisson-sampled form)
/// on the private rows `x0`: each step draws a Poisson sample of the rows (each independently
/// with probability q), its examples, every example's clipped gradient ([`Family::clipped_sum`]),
/// adds N(0, σ²C² I) to the sum and divides by the expected batch q·n
/// ([`crate::models::dp::release`]), takes an Adam step and updates the average. Each step is
/// one `PoissonSampled { q, Gaussian { σ } }` event under add/remove-one neighbours (the sum of
/// clipped gradients has L2 sensitivity C); the ledger records the steps that ran. Gradient
/// canaries join the sum as clipped records (each included one Poisson-sampled at q from the
/// sampling stream) and every released update is observed at their coordinates.
pub fn dp_sgd<F: Family>(
    fam: &mut F,
    x0: &[f32],
    s: &DpSteps,
    opt: &mut AdamW,
    ema: &mut Ema,
    mut hooks: Hooks<'_, F>,
    bar: Option<&indicatif::ProgressBar>,
) -> Result<DpRun> {
    let d = s.dp;
    let dim = fam.dim();
    let n = x0.len() / dim;
    if n == 0 {
        return Err(Error::input("no private rows"));
    }
    let q_run = if s.defect == Some(Defect::SampleRateDoubled) {
        (2.0 * d.sample_rate).min(1.0)
    } else {
        d.sample_rate
    };
    let clip_run = if s.defect == Some(Defect::ClippingSkipped) {
        f64::INFINITY
    } else {
        d.clip
    };
    let mut rng = secret_rng(s.seed.map(|v| v ^ 0x5a3b));
    let mut noise_rng = secret_rng(s.seed);
    let step_event = if d.sample_rate >= 1.0 {
        DpEvent::gaussian(d.noise_multiplier)
    } else {
        DpEvent::poisson(d.sample_rate, DpEvent::gaussian(d.noise_multiplier))
    };
    let expected = d.sample_rate * n as f64;
    let std = d.noise_multiplier * d.clip;
    let vars = fam.vars();
    let log_every = (s.steps / 50).max(1);
    let (mut acc, mut acc_n, mut total_batch) = (0.0f64, 0usize, 0usize);
    let mut ledger = EventBuilder::new();
    let mut rows = Vec::new();
    for step in 1..=s.steps {
        // Poisson sampling.
        rows.clear();
        for i in 0..n {
            if rng.random::<f64>() < q_run {
                rows.extend_from_slice(&x0[i * dim..(i + 1) * dim]);
            }
        }
        let ex = fam.examples(&rows, s.t, &mut rng)?;
        total_batch += ex.len();
        // Per-sample gradients and clipping.
        let (mut sum, norms) = fam.clipped_sum(&ex, clip_run)?;
        if let Some(wb) = hooks.white_box.as_deref() {
            let raw = GRADIENT_CANARY_NORM * d.clip;
            wb.inject(&mut sum, q_run, d.clip, 1.0 / (raw / clip_run).max(1.0), &mut rng)?;
        }
        // Gaussian noise σC on the sum, ÷ q·n, Adam.
        let mut released = release_with(&sum, std, expected, &mut noise_rng, s.defect)?;
        drop(sum);
        if let Some(wb) = hooks.white_box.as_deref_mut() {
            wb.observe(&released, expected / d.clip)?;
        }
        let mut store = GradStore::default();
        for (name, v) in &vars {
            let g = released
                .remove(name)
                .ok_or_else(|| Error::model(format!("no gradient for `{name}`")))?;
            store.insert(v.as_tensor(), g);
        }
        opt.step(&store)?;
        ema.update()?;
        ledger.push(step_event.clone());
        if !norms.is_empty() {
            acc += norms.iter().sum::<f64>() / norms.len() as f64;
            acc_n += 1;
        }
        if let Some(bar) = bar {
            if step % log_every == 0 || step == s.steps {
                bar.set_message(format!("mean ‖g‖ {:.3}", acc / acc_n.max(1) as f64));
                acc = 0.0;
                acc_n = 0;
            }
            bar.inc(1);
        }
        (hooks.after)(&*fam, step, ema, &ledger, hooks.white_box.as_deref())?;
    }
    Ok(DpRun {
        ledger,
        mean_batch: total_batch as f64 / s.steps as f64,
    })
}

/// Non-private training: `steps` Adam steps on the gradient of the mean loss of batches of
/// `batch` rows of `x0` ([`Family::plain_grads`]), the average updated after each; `after` is
/// called after every step.
#[allow(clippy::too_many_arguments)]
pub fn plain<F: Family>(
    fam: &mut F,
    x0: &[f32],
    steps: usize,
    batch: usize,
    t: (usize, usize),
    seed: u64,
    opt: &mut AdamW,
    ema: &mut Ema,
    bar: Option<&indicatif::ProgressBar>,
    mut after: impl FnMut(&F, usize, &Ema) -> Result<()>,
) -> Result<()> {
    if x0.is_empty() {
        return Err(Error::input("no training rows"));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7a11);
    let log_every = (steps / 50).max(1);
    let (mut acc, mut acc_n) = (0.0f64, 0usize);
    for step in 1..=steps {
        let (grads, loss) = fam.plain_grads(x0, batch, t, &mut rng)?;
        opt.step(&grads)?;
        ema.update()?;
        if let Some(l) = loss {
            acc += l;
            acc_n += 1;
        }
        if let Some(bar) = bar {
            if acc_n > 0 && (step % log_every == 0 || step == steps) {
                bar.set_message(format!("loss {:.4}", acc / acc_n as f64));
                acc = 0.0;
                acc_n = 0;
            }
            bar.inc(1);
        }
        after(&*fam, step, ema)?;
    }
    Ok(())
}

/// Trains `fam` as `plan` says on the rows `setup` holds, on the device named `device_name`,
/// and writes the set (weights, card, ledger, canaries) at once.
pub fn run<F: Family>(
    plan: &Plan,
    mut fam: F,
    setup: Setup,
    layout: Layout,
    device_name: &str,
) -> Result<Trained<F::Card>> {
    let dim = fam.dim();
    let t_range = (plan.t_min, setup.t_max);
    crate::limits::check_canaries(plan.canaries, dim)?;
    let gradient = plan.gradient_canaries > 0;
    if gradient && plan.dp.is_none() {
        return Err(Error::field(
            "--canary-kind",
            "gradient canaries are observed in DP-SGD's noisy updates: train with --dp (or use --canary-kind input)",
        ));
    }
    // White-box gradient canaries (Nasr et al. 2023): distinct parameter coordinates, each
    // included with probability ½ (secret unless seeded) and then Poisson-sampled like every
    // private row, so the ledger is unchanged; every noisy update is observed at them.
    let mut recorder = if gradient {
        crate::limits::check_canaries(plan.gradient_canaries, 1)?;
        // The white-box record: one float per canary and step, held until the set is written.
        crate::limits::check_canaries(plan.gradient_canaries, plan.steps)?;
        let shapes: Vec<(String, usize)> = fam
            .vars()
            .into_iter()
            .map(|(n, v)| (n, v.as_tensor().elem_count()))
            .collect();
        let mut rng = secret_rng(plan.seed.map(|s| s ^ F::GRADIENT_CANARY_SALT));
        Some(WhiteBoxRecorder::new(GradientCanaries::generate(
            plan.gradient_canaries,
            &shapes,
            &mut rng,
        )?))
    } else {
        None
    };
    // Input canaries: random ±1 images, each included with probability ½ (secret unless seeded).
    let canaries = (plan.canaries > 0).then(|| {
        let mut rng = secret_rng(plan.seed.map(|s| s ^ 0xca7a_71e5));
        Canaries::generate(plan.canaries, dim, &mut rng)
    });
    let k = setup.private_ix.len();
    if k == 0 {
        return Err(Error::input(format!("the split has no {:?} rows", plan.on)).with_file(&plan.split));
    }
    let mut x0 = setup.private;
    if let Some(c) = &canaries {
        x0.extend(c.included_rows());
    }
    let n = x0.len() / dim;
    if !plan.quiet {
        eprintln!(
            "model: {}; training on {k} {} rows of {}{}{}",
            fam.describe(),
            format!("{:?}", plan.on).to_lowercase(),
            plan.data.display(),
            canaries
                .as_ref()
                .map(|c| format!(" + {} canaries (of {})", n - k, c.len()))
                .unwrap_or_default(),
            recorder
                .as_ref()
                .map(|wb| format!(
                    " + {} gradient canaries (of {}; white-box)",
                    wb.canaries.included.iter().filter(|&&b| b).count(),
                    wb.canaries.len()
                ))
                .unwrap_or_default()
        );
    }
    // DP runs publish no loss on the private rows (it would be released without noise).
    let (eval_rows, eval_on) = if plan.dp.is_some() {
        let m = (setup.public.len() / dim).min(F::EVAL_ROWS);
        (
            &setup.public[..m * dim],
            "public rows (a loss on the private rows would be released without noise)",
        )
    } else {
        (&x0[..k.min(F::EVAL_ROWS) * dim], "training rows")
    };
    let ctx = Context {
        plan,
        layout: &layout,
        setup_sha256: &setup.data_sha256,
        private_ix: &setup.private_ix,
        canaries: canaries.as_ref(),
        n,
        t_range,
        device_name,
        init_ledger: setup.init_ledger.as_ref(),
        init_note: setup.init_note.as_deref(),
        eval_rows,
        eval_on,
        eval_seed: plan.seed.unwrap_or(0),
        before: None,
    };
    let before = ctx.eval(&fam)?;
    let ctx = Context { before, ..ctx };
    let vars: Vec<Var> = fam.vars().into_iter().map(|(_, v)| v).collect();
    let mut opt = adam(vars.clone(), plan.lr)?;
    let mut ema = Ema::new(vars.clone(), plan.ema)?;
    let b = bar(
        plan.steps as u64,
        plan.quiet,
        if plan.dp.is_some() { "dp-sgd" } else { "train" },
    );
    let log = LogProgress::new(plan.steps, plan.quiet);
    let ledger = match &plan.dp {
        Some(d) => {
            let s = DpSteps {
                dp: *d,
                steps: plan.steps,
                t: t_range,
                seed: plan.seed,
                defect: plan.defect,
            };
            let ctx = &ctx;
            let log = &log;
            let hooks = Hooks {
                white_box: recorder.as_mut(),
                after: Box::new(move |fam: &F, done, ema: &Ema, ledger: &EventBuilder, wb| {
                    log.step(done);
                    ctx.checkpoint(fam, ema, done, ledger, wb)
                }),
            };
            let run = dp_sgd(&mut fam, &x0, &s, &mut opt, &mut ema, hooks, Some(&b))?;
            if !plan.quiet {
                eprintln!(
                    "mean Poisson batch: {:.1} (expected {:.1})",
                    run.mean_batch,
                    d.sample_rate * n as f64
                );
            }
            run.ledger
        }
        None => {
            let empty = EventBuilder::new();
            plain(
                &mut fam,
                &x0,
                plan.steps,
                plan.batch_size,
                t_range,
                setup.public_seed,
                &mut opt,
                &mut ema,
                Some(&b),
                |fam, done, ema| {
                    log.step(done);
                    ctx.checkpoint(fam, ema, done, &empty, None)
                },
            )?;
            empty
        }
    };
    b.finish_and_clear();
    ema.apply()?;
    let after = ctx.eval(&fam)?;
    let weights = fam.weights()?;
    let (card, event, mut lines, files) =
        ctx.files(&fam, &layout, plan.steps, &ledger, weights, after, recorder.as_ref())?;
    let files = signed(files, plan.sign_key.as_ref())?;
    crate::report::output::create_out_dir(&layout.dir)?;
    crate::report::output::commit_set(&layout.dir, layout.stem.as_deref(), &files, plan.force)?;
    if let (Some(b), Some(a)) = (ctx.before, after) {
        lines.push(format!(
            "denoising loss on the {} (fixed evaluation draws): {b:.4} -> {a:.4}",
            ctx.eval_on
        ));
    }
    if plan.seed.is_some() {
        lines.push(format!("training randomness: {RANDOMNESS_SEEDED}"));
    }
    lines.push(format!(
        "wrote {} and {}",
        layout.path(Role::Card).display(),
        layout.path(Role::Weights).display()
    ));
    if let (Some(d), Some(ev)) = (&plan.dp, &event) {
        let p = layout.path(Role::Ledger);
        lines.push(format!(
            "wrote {} — account it with: dpaudit account --event {} --delta {}",
            p.display(),
            p.display(),
            fmt_num(d.delta)
        ));
        lines.push(ev.ledger());
    }
    Ok(Trained {
        layout,
        card,
        event,
        backend: fam.backend(plan.dp.is_some()),
        lines,
    })
}

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

/// What every set a run writes (the final one and each periodic checkpoint) is built from: the
/// run's fixed context, so that a checkpoint is exactly the set the run would have written had
/// it been asked for that many steps.
struct Context<'a> {
    plan: &'a Plan,
    layout: &'a Layout,
    setup_sha256: &'a str,
    private_ix: &'a [usize],
    canaries: Option<&'a Canaries>,
    /// Private rows including the included canaries.
    n: usize,
    t_range: (usize, usize),
    device_name: &'a str,
    init_ledger: Option<&'a (DpEvent, PathBuf)>,
    init_note: Option<&'a str>,
    eval_rows: &'a [f32],
    eval_on: &'a str,
    eval_seed: u64,
    before: Option<f64>,
}

impl Context<'_> {
    /// The evaluation loss of the current weights (fixed draws; None without rows).
    fn eval<F: Family>(&self, fam: &F) -> Result<Option<f64>> {
        if self.eval_rows.is_empty() {
            return Ok(None);
        }
        fam.eval_loss(self.eval_rows, self.t_range, self.eval_seed).map(Some)
    }

    /// The files of the set in `layout` after `steps` steps whose events are in `ledger`: the
    /// whole ledger (the init's composed with this run's), the canaries and the family's files.
    /// Returns the card, the whole event, the lines for the user and the files.
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    fn files<F: Family>(
        &self,
        fam: &F,
        layout: &Layout,
        steps: usize,
        ledger: &EventBuilder,
        weights: Vec<u8>,
        after: Option<f64>,
        white_box: Option<&WhiteBoxRecorder>,
    ) -> Result<(F::Card, Option<DpEvent>, Vec<String>, Vec<(String, Vec<u8>)>)> {
        let plan = self.plan;
        let dir = &layout.dir;
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
        let randomness = plan.randomness();
        let mut files: Vec<(String, Vec<u8>)> = Vec::new();
        let mut dp_info = None;
        if let (Some(d), Some(ev)) = (&plan.dp, &event) {
            let eps = crate::models::dp::spent_epsilon(ev, d.delta);
            let text = crate::models::dp::ledger_toml(
                ev,
                d.delta,
                &format!(
                    "DpEvent that ran in `{}`{}{}\n({}: Poisson sampling q = {}, per-sample clipping C = {}, Gaussian noise σ·C with σ = {}, add/remove-one neighbours)\nrandomness: {randomness}\n{}",
                    plan.command,
                    if steps < plan.steps {
                        format!(" (its first {steps} of {} steps: a periodic checkpoint)", plan.steps)
                    } else {
                        String::new()
                    },
                    match (self.init_ledger, &plan.init) {
                        (Some((_, p)), _) => format!(", after the ledger of --init ({})", p.display()),
                        (None, Some(p)) => format!(
                            ", from --init {} ({}: nothing to compose)",
                            p.display(),
                            self.init_note.unwrap_or("trained on rows disjoint from the private rows")
                        ),
                        (None, None) => String::new(),
                    },
                    fam.mechanism(),
                    d.sample_rate,
                    d.clip,
                    d.noise_multiplier,
                    crate::report::output::released_line(&layout.name(Role::Weights), &weights)
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
                per_sample: fam.per_sample().into(),
                ledger: layout.name(Role::Ledger),
                epsilon: eps.as_ref().map(|e| e.0),
                epsilon_accountant: eps.as_ref().map(|e| e.1.clone()),
                init_ledger: self
                    .init_ledger
                    .map(|(_, p)| crate::models::card::card_relative(p, dir)),
                rapid: None,
                ledger_sha256: Some(sha256_hex(text.as_bytes())),
            });
            files.push((layout.name(Role::Ledger), text.into_bytes()));
        }
        let canary_info = match self.canaries {
            Some(c) => {
                let name = layout.name(Role::Canaries);
                let bytes = c.to_csv().into_bytes();
                lines.push(format!(
                    "{} canaries ({} included) in {}: the inclusion bits are the audit's secret; keep the file from whoever the audit models",
                    c.len(),
                    self.n - self.private_ix.len(),
                    dir.join(&name).display()
                ));
                let info = CanaryInfo {
                    file: name.clone(),
                    sha256: sha256_hex(&bytes),
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
        // Gradient canaries: in the canaries file alone, in the gradient canaries file beside
        // input canaries.
        let gradient_info = match white_box {
            Some(wb) => {
                let name = layout.name(if canary_info.is_some() {
                    Role::GradientCanaries
                } else {
                    Role::Canaries
                });
                let obs_name = layout.name(Role::Observations);
                let bytes = wb.canaries.to_csv().into_bytes();
                let obs = wb.observations_npy();
                lines.push(format!(
                    "{} gradient canaries ({} included) in {} and {} ({} noisy updates observed at every canary: the white-box audit's record); the inclusion bits are the audit's secret",
                    wb.canaries.len(),
                    wb.canaries.included.iter().filter(|&&b| b).count(),
                    dir.join(&name).display(),
                    dir.join(&obs_name).display(),
                    wb.steps
                ));
                let info = CanaryInfo {
                    file: name.clone(),
                    sha256: sha256_hex(&bytes),
                    count: wb.canaries.len(),
                    kind: Some(CanaryKind::Gradient),
                    observations: Some(obs_name.clone()),
                    observations_sha256: Some(sha256_hex(&obs)),
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
        let release = Release {
            layout,
            steps,
            data: DataInfo {
                file: crate::models::card::card_relative(&plan.data, dir),
                sha256: self.setup_sha256.to_string(),
                split: crate::models::card::card_relative(&plan.split, dir),
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
                    Some(d) => (d.sample_rate * self.n as f64).round() as usize,
                    None => plan.batch_size,
                },
                lr: plan.lr,
                ema_decay: plan.ema,
                t_min: self.t_range.0,
                t_max: self.t_range.1,
                device: self.device_name.to_string(),
                command: plan.command.clone(),
                eval_loss_before: self.before.zip(after).map(|e| e.0),
                eval_loss_after: self.before.zip(after).map(|e| e.1),
                eval_on: self.before.zip(after).map(|_| self.eval_on.to_string()),
                init: plan.init.as_ref().map(|p| crate::models::card::card_relative(p, dir)),
                relocated: None,
            },
            dp: dp_info,
            canaries: canary_info,
            gradient_canaries: gradient_info,
            weights,
        };
        let (card, family_files) = fam.card(plan, release)?;
        files.extend(family_files);
        Ok((card, event, lines, files))
    }

    /// After step `done` of a `--checkpoint-every N` run (N | done, done < steps): rewrites
    /// `checkpoint/` beside the output with the set the run would release now — the average so
    /// far (the weights being trained are left as they are), and the ledger of the `done` steps
    /// that ran, so that a run stopped at any point leaves a ledger that covers every released
    /// weight file. Resume with `--init <checkpoint> --steps <the rest>` (the ledger is
    /// composed; Adam's moments and the average restart from the checkpoint's weights).
    fn checkpoint<F: Family>(
        &self,
        fam: &F,
        ema: &Ema,
        done: usize,
        ledger: &EventBuilder,
        white_box: Option<&WhiteBoxRecorder>,
    ) -> Result<()> {
        if !matches!(self.plan.checkpoint_every, Some(k) if k > 0 && done.is_multiple_of(k) && done < self.plan.steps) {
            return Ok(());
        }
        let vars: Vec<Var> = fam.vars().into_iter().map(|(_, v)| v).collect();
        let saved: Vec<Tensor> = vars
            .iter()
            .map(|v| v.as_tensor().copy())
            .collect::<candle_core::Result<_>>()?;
        for (v, s) in vars.iter().zip(ema.snapshot()?) {
            v.set(&s)?;
        }
        let written = (|| -> Result<()> {
            let weights = fam.weights()?;
            let after = self.eval(fam)?;
            let layout = self.layout.within(CHECKPOINT_DIR);
            let (_, _, _, files) = self.files(fam, &layout, done, ledger, weights, after, white_box)?;
            let files = signed(files, self.plan.sign_key.as_ref())?;
            // One rename of the whole folder: the previous checkpoint stays whole until this
            // one is complete, and no reader sees a mix of the two.
            crate::report::output::commit_folder(&layout.dir, &files)?;
            eprintln!(
                "checkpoint after step {done}/{}: {} (resume with --init {} --steps {})",
                self.plan.steps,
                layout.dir.display(),
                layout.out.display(),
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
