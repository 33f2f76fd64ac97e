//! `dpaudit account`: ε(δ) (or δ(ε)) of one event by every requested accountant.
//!
//! The event comes either from DP-SGD-style flags (`--noise-multiplier`, `--sample-rate`,
//! `--steps`) or from a TOML event file (`--event FILE`, format [`crate::events::EventFile`]).
//! Accountants that cannot handle the event are listed with their reason; the command fails
//! (exit 2) only when none works. The headline is the smallest *sound* ε (never an estimate).
//! The JSON output is a stable, versioned contract: see docs/accounting.md.

use std::path::PathBuf;

use serde::Serialize;

use super::common::{parse_accountants, Format};
use crate::accountants::{AccountResult, AccountantKind};
use crate::config::dpsgd::{self, BatchSampling, Derived};
use crate::error::{Error, Result};
use crate::events::{DpEvent, EventFile, Neighbouring};

/// JSON schema version of `account` output.
pub const SCHEMA_VERSION: u32 = 1;

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
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
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
) -> Result<()> {
    let f = EventFile {
        schema_version: 1,
        neighbouring,
        delta,
        event: event.clone(),
    };
    let text = f.to_toml(comment)?;
    crate::report::output::write_atomic(path, text.as_bytes(), true).map_err(|e| e.with_field("--save-event"))
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

/// Output formats this command writes.
pub(crate) fn check_format(f: Format) -> Result<Format> {
    match f {
        Format::Text | Format::Json | Format::Csv => Ok(f),
        other => Err(Error::field(
            "--format",
            format!("{other:?} is not available here; use text, json or csv"),
        )),
    }
}

/// What to compute.
#[derive(Debug, Clone, Copy)]
enum Query {
    Epsilon { delta: f64 },
    Delta { epsilon: f64 },
}

/// The validated plan.
struct Plan {
    event: DpEvent,
    derived: Option<Derived>,
    save_event: Option<PathBuf>,
    neighbouring: Neighbouring,
    query: Query,
    accountants: Vec<AccountantKind>,
    format: Format,
}

fn plan(args: Args) -> Result<Plan> {
    let format = check_format(args.format)?;
    let accountants = parse_accountants(&args.accountant)?;
    let derived = args.run.derive()?;
    let (event, file_nb, file_delta) = match (&args.event, &derived) {
        (Some(path), _) => {
            let f = EventFile::load(path)?;
            (f.event, Some(f.neighbouring), f.delta)
        }
        (None, Some(d)) => {
            let sigma = args.noise_multiplier.ok_or_else(|| {
                Error::field(
                    "--noise-multiplier",
                    "required with --epochs/--batch-size/--dataset-size",
                )
            })?;
            (d.event(check_sigma("--noise-multiplier", sigma)?), None, None)
        }
        (None, None) => {
            let sigma = args.noise_multiplier.ok_or_else(|| {
                Error::field(
                    "--noise-multiplier",
                    "required (or give the whole event with --event FILE)",
                )
            })?;
            let sigma = check_sigma("--noise-multiplier", sigma)?;
            let q = check_q("--sample-rate", args.sample_rate.unwrap_or(1.0))?;
            let steps = args
                .steps
                .ok_or_else(|| Error::field("--steps", "required (or give the whole event with --event FILE)"))?;
            (DpEvent::dpsgd(sigma, q, steps), None, None)
        }
    };
    event.validate()?;
    let neighbouring = args
        .neighbouring
        .map(Neighbouring::from)
        .or(file_nb)
        .unwrap_or_default();
    let query = match (args.epsilon, args.delta.or(file_delta)) {
        (Some(e), _) => Query::Delta {
            epsilon: check_epsilon_flag("--epsilon", e)?,
        },
        (None, Some(d)) => Query::Epsilon {
            delta: check_delta_flag(if args.delta.is_some() { "--delta" } else { "delta" }, d)?,
        },
        (None, None) => {
            return Err(Error::field(
                "--delta",
                "required: give --delta (or `delta` in the event file), or --epsilon to ask for δ",
            ))
        }
    };
    Ok(Plan {
        event,
        derived,
        save_event: args.save_event.clone(),
        neighbouring,
        query,
        accountants,
        format,
    })
}

#[derive(Debug, Serialize)]
struct Unsupported {
    accountant: AccountantKind,
    reason: String,
}

#[derive(Debug, Serialize)]
struct Headline {
    accountant: AccountantKind,
    epsilon: f64,
    delta: f64,
    kind: crate::accountants::BoundKind,
}

/// The JSON document (schema_version 1).
#[derive(Debug, Serialize)]
struct Output {
    schema_version: u32,
    /// "epsilon" (ε at the given δ) or "delta" (δ at the given ε).
    query: &'static str,
    delta: Option<f64>,
    epsilon: Option<f64>,
    event: DpEvent,
    /// Steps and q derived from --epochs/--batch-size/--dataset-size, with the derivation.
    #[serde(skip_serializing_if = "Option::is_none")]
    derivation: Option<Derived>,
    neighbouring: Neighbouring,
    results: Vec<AccountResult>,
    unsupported: Vec<Unsupported>,
    /// The smallest sound ε (or δ) among the results; null when only estimates are available.
    headline: Option<Headline>,
}

fn account(plan: &Plan) -> Output {
    let mut results = Vec::new();
    let mut unsupported = Vec::new();
    for &k in &plan.accountants {
        let acc = k.build();
        let r = acc
            .supports(&plan.event, plan.neighbouring)
            .and_then(|_| match plan.query {
                Query::Epsilon { delta } => acc.epsilon(&plan.event, plan.neighbouring, delta),
                Query::Delta { epsilon } => acc.delta(&plan.event, plan.neighbouring, epsilon),
            });
        match r {
            Ok(r) => results.push(r),
            Err(e) => unsupported.push(Unsupported {
                accountant: k,
                reason: e.to_string(),
            }),
        }
    }
    let headline = match plan.query {
        Query::Epsilon { .. } => crate::accountants::sound::tightest_upper(&results),
        Query::Delta { .. } => crate::accountants::sound::tightest_upper_delta(&results),
    }
    .map(|r| Headline {
        accountant: r.accountant,
        epsilon: r.epsilon,
        delta: r.delta,
        kind: r.kind,
    });
    let (delta, epsilon, query) = match plan.query {
        Query::Epsilon { delta } => (Some(delta), None, "epsilon"),
        Query::Delta { epsilon } => (None, Some(epsilon), "delta"),
    };
    Output {
        schema_version: SCHEMA_VERSION,
        query,
        delta,
        epsilon,
        event: plan.event.clone(),
        derivation: plan.derived.clone(),
        neighbouring: plan.neighbouring,
        results,
        unsupported,
        headline,
    }
}

fn kind_words(k: crate::accountants::BoundKind) -> &'static str {
    match k {
        crate::accountants::BoundKind::Exact => "exact",
        crate::accountants::BoundKind::UpperBound => "upper bound",
        crate::accountants::BoundKind::Estimate => "ESTIMATE (not a guarantee)",
        crate::accountants::BoundKind::LowerBound => "lower bound",
        crate::accountants::BoundKind::DataDependent => "data-dependent: not a DP guarantee",
    }
}

fn render_text(o: &Output) -> String {
    let mut s = String::new();
    if let Some(d) = &o.derivation {
        s.push_str(&format!("DP-SGD run: {}\n", d.summary()));
        for l in &d.derivation {
            s.push_str(&format!("  {l}\n"));
        }
    }
    s.push_str(&format!("Event (neighbouring: {}):\n", o.neighbouring));
    for line in o.event.ledger().lines() {
        s.push_str(&format!("  {line}\n"));
    }
    let by_eps = o.query == "epsilon";
    match (o.delta, o.epsilon) {
        (Some(d), _) => s.push_str(&format!("ε at δ = {d:e}:\n")),
        (_, Some(e)) => s.push_str(&format!("δ at ε = {e}:\n")),
        _ => {}
    }
    for r in &o.results {
        let v = if by_eps {
            format!("ε = {:.6}", r.epsilon)
        } else {
            format!("δ = {:.6e}", r.delta)
        };
        s.push_str(&format!(
            "  {:<4} {v:<22} {}\n",
            r.accountant.as_str(),
            kind_words(r.kind)
        ));
        for d in &r.diagnostics {
            let tag = if d.severe { "WARNING" } else { "note" };
            s.push_str(&format!("         {tag} [{}]: {}\n", d.code, d.message));
        }
    }
    for u in &o.unsupported {
        s.push_str(&format!("  {:<4} unsupported: {}\n", u.accountant.as_str(), u.reason));
    }
    match &o.headline {
        Some(h) if by_eps => s.push_str(&format!(
            "Headline (smallest sound ε): ε = {:.6} at δ = {:e} ({}, {})\n",
            h.epsilon,
            h.delta,
            h.accountant.as_str(),
            kind_words(h.kind)
        )),
        Some(h) => s.push_str(&format!(
            "Headline (smallest sound δ): δ = {:.6e} at ε = {} ({}, {})\n",
            h.delta,
            h.epsilon,
            h.accountant.as_str(),
            kind_words(h.kind)
        )),
        None => s.push_str("Headline: no sound bound available (only estimates); do not use them as a guarantee\n"),
    }
    s
}

fn render_csv(o: &Output) -> Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let io = |e: csv::Error| Error::input(format!("csv: {e}"));
    w.write_record([
        "accountant",
        "status",
        "epsilon",
        "delta",
        "kind",
        "sound",
        "headline",
        "reason",
    ])
    .map_err(io)?;
    for r in &o.results {
        let head = o.headline.as_ref().is_some_and(|h| h.accountant == r.accountant);
        w.write_record([
            r.accountant.as_str().to_string(),
            "ok".into(),
            format!("{:e}", r.epsilon),
            format!("{:e}", r.delta),
            r.kind.as_str().into(),
            r.kind.is_sound().to_string(),
            head.to_string(),
            String::new(),
        ])
        .map_err(io)?;
    }
    for u in &o.unsupported {
        w.write_record([
            u.accountant.as_str(),
            "unsupported",
            "",
            "",
            "",
            "",
            "false",
            u.reason.as_str(),
        ])
        .map_err(io)?;
    }
    let bytes = w.into_inner().map_err(|e| Error::input(format!("csv: {e}")))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Runs `dpaudit account`; returns the exit code.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let plan = plan(args)?;
    let out = account(&plan);
    if out.results.is_empty() {
        let reasons: Vec<String> = out
            .unsupported
            .iter()
            .map(|u| format!("{}: {}", u.accountant.as_str(), u.reason))
            .collect();
        return Err(Error::unsupported(format!(
            "no accountant supports this event:\n  {}",
            reasons.join("\n  ")
        ))
        .into());
    }
    if let Some(p) = &plan.save_event {
        let delta = match plan.query {
            Query::Epsilon { delta } => Some(delta),
            Query::Delta { .. } => None,
        };
        let comment = format!(
            "Event written by: {}{}",
            crate::report::command_line(),
            plan.derived
                .as_ref()
                .map(|d| format!("\nDP-SGD run: {}", d.summary()))
                .unwrap_or_default()
        );
        save_event(p, &plan.event, plan.neighbouring, delta, &comment)?;
    }
    let text = match plan.format {
        Format::Json => serde_json::to_string_pretty(&out)? + "\n",
        Format::Csv => render_csv(&out)?,
        _ => render_text(&out),
    };
    print!("{text}");
    Ok(super::EXIT_OK)
}
