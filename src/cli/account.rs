//! `dpaudit account`: ε(δ) (or δ(ε)) of one event by every requested accountant.
//!
//! The event comes either from DP-SGD-style flags (`--noise-multiplier`, `--sample-rate`,
//! `--steps`) or from a TOML event file (`--event FILE`, format [`dpaudit::events::EventFile`]).
//! Accountants that cannot handle the event are listed with their reason; the command fails
//! (exit 2) only when none works. The headline is the smallest *sound* ε (never an estimate).
//! `--format json` writes the one report (schema: docs/schema/report.v2.json).

use std::path::PathBuf;

use super::common::{parse_accountants, Format, OutputArgs};
use dpaudit::audit::{self, Plan, Question, Source};
use dpaudit::config::dpsgd::{self, BatchSampling, Derived};
use dpaudit::error::{Error, Result};
use dpaudit::events::Neighbouring;
use dpaudit::events::{DpEvent, EventFile};
use dpaudit::report::progress::Progress;

/// `--neighbouring` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NeighbouringArg {
    /// Add or remove one record.
    AddRemove,
    /// Replace one record.
    ReplaceOne,
}

impl From<NeighbouringArg> for Neighbouring {
    fn from(n: NeighbouringArg) -> Self {
        match n {
            NeighbouringArg::AddRemove => Neighbouring::AddRemove,
            NeighbouringArg::ReplaceOne => Neighbouring::ReplaceOne,
        }
    }
}

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  # DP-SGD: 14062 steps, Poisson rate 0.004, noise multiplier 1.1, ε at δ = 1e-5 by every accountant
  dpaudit account --noise-multiplier 1.1 --sample-rate 0.004 --steps 14062 --delta 1e-5

  # δ at ε = 8 instead, as JSON
  dpaudit account --noise-multiplier 1.1 --sample-rate 0.004 --steps 14062 --epsilon 8 --format json

  # the same in users' words: 10 epochs, batch 64, N = 60000, Poisson sampling (steps and q are
  # derived as Opacus does and printed), and save the event for `dpaudit check`
  dpaudit account --noise-multiplier 0.8 --epochs 10 --batch-size 64 --dataset-size 60000 \\
      --delta 1e-5 --save-event mnist.toml

  # any event tree from a TOML file (see fixtures/events/), PLD and RDP only
  dpaudit account --event fixtures/events/heterogeneous.toml --delta 1e-5 --accountant pld,rdp

Exit codes: 0 ok; 2 bad flags/file, or no accountant supports the event.")]
/// Account a DP-SGD-style event from flags, or any event tree from a TOML file.
pub struct Args {
    /// Noise multiplier σ of the Gaussian step (noise std = σ × L2 sensitivity).
    #[arg(long, value_name = "SIGMA", allow_negative_numbers = true)]
    pub noise_multiplier: Option<f64>,
    /// Poisson sampling rate q in (0, 1] (default 1: full batch).
    #[arg(long, value_name = "Q", allow_negative_numbers = true)]
    pub sample_rate: Option<f64>,
    /// Number of steps (0 accounts nothing: ε = 0).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub steps: Option<u64>,
    /// DP-SGD in users' words (`--epochs --batch-size --dataset-size [--sampling]`).
    #[command(flatten)]
    pub run: TrainingRunArgs,
    /// Event tree from a TOML file (schema_version = 1) instead of the flags above.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["noise_multiplier", "sample_rate", "steps", "epochs"])]
    pub event: Option<PathBuf>,
    /// Also write the accounted event (with its neighbouring relation and δ) to FILE, in the
    /// event-file format that `dpaudit check` and `account --event` read.
    #[arg(long, value_name = "FILE")]
    pub save_event: Option<PathBuf>,
    /// δ at which ε is reported (may come from the event file).
    #[arg(long, allow_negative_numbers = true)]
    pub delta: Option<f64>,
    /// Report δ at this ε instead of ε at δ.
    #[arg(long, conflicts_with = "delta", allow_negative_numbers = true)]
    pub epsilon: Option<f64>,
    /// Neighbouring relation (default: the event file's, else add-remove).
    #[arg(long, value_enum)]
    pub neighbouring: Option<NeighbouringArg>,
    /// Accountants: gdp, clt, rdp, pld, all, or a comma-separated list.
    #[arg(long, default_value = "all")]
    pub accountant: String,
    /// Output grammar: --format, --out DIR, --force, -q, -v.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `--sampling` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SamplingArg {
    /// Poisson sampling at q = B/N for ⌊E·N/B⌋ steps (Opacus' get_noise_multiplier).
    Poisson,
    /// Poisson sampling as Opacus' PrivacyEngine runs it on a DataLoader: q = 1/⌈N/B⌉, E·⌈N/B⌉ steps.
    PoissonLoader,
    /// Shuffled fixed-size batches: each record once per epoch, no amplification claimed.
    Shuffle,
}

impl From<SamplingArg> for BatchSampling {
    fn from(s: SamplingArg) -> Self {
        match s {
            SamplingArg::Poisson => BatchSampling::Poisson,
            SamplingArg::PoissonLoader => BatchSampling::PoissonLoader,
            SamplingArg::Shuffle => BatchSampling::Shuffle,
        }
    }
}

/// DP-SGD in users' words: `--epochs --batch-size --dataset-size [--sampling]` (instead of
/// `--steps` and `--sample-rate`). Shared by `account`, `calibrate` and `check`.
#[derive(Debug, Clone, clap::Args)]
pub struct TrainingRunArgs {
    /// Epochs E (with --batch-size and --dataset-size: steps and q are derived).
    #[arg(long, value_name = "E", conflicts_with_all = ["steps", "sample_rate"])]
    pub epochs: Option<u64>,
    /// Batch size B (expected batch size under Poisson sampling).
    #[arg(long, value_name = "B", conflicts_with_all = ["steps", "sample_rate"])]
    pub batch_size: Option<u64>,
    /// Dataset size N.
    #[arg(long, value_name = "N", conflicts_with_all = ["steps", "sample_rate"])]
    pub dataset_size: Option<u64>,
    /// How batches are drawn (default poisson; see docs/accounting.md).
    #[arg(long, value_enum)]
    pub sampling: Option<SamplingArg>,
}

impl TrainingRunArgs {
    /// The derived steps and q, when the flags were given.
    pub fn derive(&self) -> Result<Option<Derived>> {
        dpsgd::from_flags(
            self.epochs,
            self.batch_size,
            self.dataset_size,
            self.sampling.map(BatchSampling::from),
        )?
        .map(|r| r.derive())
        .transpose()
    }
}

/// Writes `event` as an event file (`--save-event`).
pub(crate) fn save_event(
    path: &std::path::Path,
    event: &DpEvent,
    neighbouring: Neighbouring,
    delta: Option<f64>,
    comment: &str,
    force: bool,
) -> Result<()> {
    let f = EventFile {
        schema_version: 1,
        neighbouring,
        delta,
        event: event.clone(),
    };
    let text = f.to_toml(comment)?;
    dpaudit::report::output::write_atomic(path, text.as_bytes(), force).map_err(|e| e.with_field("--save-event"))
}

/// Checks a user-given number for a flag.
pub(crate) fn check_flag(flag: &str, v: f64, ok: bool, what: &str) -> Result<f64> {
    if v.is_nan() || !ok {
        return Err(Error::field(flag, format!("{what}, got {v}")));
    }
    Ok(v)
}

pub(crate) fn check_sigma(flag: &str, s: f64) -> Result<f64> {
    check_flag(flag, s, s.is_finite() && s > 0.0, "must be a finite number > 0")
}

pub(crate) fn check_q(flag: &str, q: f64) -> Result<f64> {
    check_flag(flag, q, q > 0.0 && q <= 1.0, "sampling rate must be in (0, 1]")
}

pub(crate) fn check_delta_flag(flag: &str, d: f64) -> Result<f64> {
    check_flag(flag, d, d > 0.0 && d < 1.0, "δ must be in (0, 1)")
}

pub(crate) fn check_epsilon_flag(flag: &str, e: f64) -> Result<f64> {
    check_flag(flag, e, e.is_finite() && e >= 0.0, "ε must be finite and ≥ 0")
}

/// Flags → a validated audit plan (nothing is read yet).
fn plan(args: &Args, derived: Option<&Derived>, curves: bool) -> Result<Plan> {
    let accountants = parse_accountants(&args.accountant)?;
    let source = match (&args.event, derived) {
        (Some(path), _) => Source::File(path.clone()),
        (None, Some(d)) => {
            let sigma = args.noise_multiplier.ok_or_else(|| {
                Error::field(
                    "--noise-multiplier",
                    "required with --epochs/--batch-size/--dataset-size",
                )
            })?;
            Source::Event {
                event: d.event(check_sigma("--noise-multiplier", sigma)?),
                role: "flags",
                over_approximates: d.over_approximates(),
            }
        }
        (None, None) => {
            let sigma = args.noise_multiplier.ok_or_else(|| {
                Error::field(
                    "--noise-multiplier",
                    "required (or give the whole event with --event FILE)",
                )
            })?;
            let noise_multiplier = check_sigma("--noise-multiplier", sigma)?;
            let sample_rate = check_q("--sample-rate", args.sample_rate.unwrap_or(1.0))?;
            let steps = args
                .steps
                .ok_or_else(|| Error::field("--steps", "required (or give the whole event with --event FILE)"))?;
            Source::DpSgd {
                noise_multiplier,
                sample_rate,
                steps,
            }
        }
    };
    let question = match (args.epsilon, args.delta) {
        (Some(e), _) => Question::Delta {
            epsilon: check_epsilon_flag("--epsilon", e)?,
        },
        (None, d) => Question::Epsilon {
            delta: d.map(|d| check_delta_flag("--delta", d)).transpose()?,
        },
    };
    Ok(Plan {
        command: "account",
        source,
        neighbouring: args.neighbouring.map(Neighbouring::from),
        question,
        accountants,
        curves,
    })
}

/// Runs `dpaudit account`.
pub fn run(args: Args) -> anyhow::Result<dpaudit::audit::outcome::Verdict> {
    let out = args.output.prepare(Format::Text, &["account.csv"])?;
    if let Some(p) = &args.save_event {
        dpaudit::report::output::check_file(p, out.force).map_err(|e| e.with_field("--save-event"))?;
    }
    let derived = args.run.derive()?;
    let plan = audit::account::Plan {
        audit: plan(&args, derived.as_ref(), out.dir.is_some() || out.format != Format::Text)?,
        derived,
    };
    let progress = Progress::new(Some(plan.audit.accountants.len() as u64), out.quiet, "account");
    let outcome = audit::account::execute(&plan, &progress);
    progress.finish();
    let outcome = outcome?;
    if let Some(p) = &args.save_event {
        let rep = &outcome.report;
        let comment = format!(
            "Event written by: {}{}",
            dpaudit::report::command_line(),
            plan.derived
                .as_ref()
                .map(|d| format!("\nDP-SGD run: {}", d.summary()))
                .unwrap_or_default()
        );
        let event = rep
            .event
            .clone()
            .ok_or_else(|| Error::input("no event was accounted"))?;
        let nb = rep.assumptions.neighbouring.unwrap_or_default();
        save_event(p, &event, nb, rep.delta, &comment, out.force)?;
    }
    Ok(out.emit(outcome)?)
}
