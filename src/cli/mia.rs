//! `dpaudit mia`: flags → [`mia::Request`] → [`mia::execute`] (the plan, the input path and the
//! one attack chain, in `audit::mia`) → the shared output writer and the exit code.

use std::path::PathBuf;

use crate::cli::common::{Format, OutputArgs, Outputs};
use crate::cli::values::{AttackKind as AttackArg, AuditKind, DeviceChoice};
use dpaudit::audit::mia::plan::{MiaReport, ScoreOpts, ScoreRecord};
use dpaudit::audit::mia::{self, MiaRun};
use dpaudit::audit::outcome::Verdict;

/// The examples, formats and exit codes of `mia --help`.
const EXAMPLES: &str = include_str!("mia_examples.txt");

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

/// The request the flags state.
fn request(a: Args) -> mia::Request {
    let opacus = a.mechanism.spec();
    mia::Request {
        checkpoint: a.checkpoint,
        scores: a.scores,
        scores_out: a.scores_out,
        roc_out: a.roc_out,
        audit: a.audit.map(Into::into),
        sampler: a.sampler,
        data: a.data,
        split: a.split,
        attacks: a.attack.into_iter().map(Into::into).collect(),
        timesteps: a.timesteps,
        score: ScoreOpts {
            noise_draws: a.noise_draws,
            secmi_k: a.secmi_k,
            pia_norm: a.pia_norm,
            empirical_rate: a.empirical_rate,
            seed: a.seed,
        },
        bootstrap: a.bootstrap,
        confidence: a.confidence,
        delta: a.delta,
        null_test: a.null_test,
        table2_rates: a.table2.then_some(a.table2_rates),
        cosine: a.cosine,
        shard: a.shard,
        out_dir: a.output.out.clone(),
        force: a.output.force,
        quiet: a.output.quiet,
        verbose: a.output.verbose,
        device: a.device.into(),
        max_examples: a.max_examples,
        batch_size: a.batch_size,
        precision: a.precision.into(),
        ledger: a.mechanism.ledger,
        opacus,
        trust_keys: a.mechanism.trust_key,
    }
}

/// Runs `dpaudit mia`.
pub fn run(a: Args) -> anyhow::Result<Verdict> {
    let output = a.output.clone();
    let req = request(a);
    req.check()?;
    // Output locations are checked (and existing files refused) before the long run; a shard
    // writes only its part file.
    let out = match req.shard {
        None => Some(output.prepare(Format::Text, &["mia.json", "mia.csv"])?),
        Some(_) => None,
    };
    match (mia::execute(&req)?, out) {
        (MiaRun::Report(o), Some(out)) => Ok(out.emit(*o)?),
        _ => Ok(Verdict::Holds),
    }
}

/// Writes `report` (stdout in `--format`, `--out DIR`, and the ROC / score files asked for) and
/// returns its status (violated when a comparison fails); shared by `mia` and `merge`.
pub(crate) fn emit(
    report: &MiaReport,
    records: &[ScoreRecord],
    out: &Outputs,
    roc_out: Option<&PathBuf>,
    scores_out: Option<&PathBuf>,
) -> anyhow::Result<Verdict> {
    let o = mia::finish(
        report,
        records,
        roc_out.map(|p| p.as_path()),
        scores_out.map(|p| p.as_path()),
        out.force,
    )?;
    Ok(out.emit(o)?)
}
