//! `dpaudit check <config> --max-epsilon E [--delta D]`: the CI guard.
//!
//! Accounts a pipeline (an event file, or a diffusion sampler config), compares the budget with
//! the smallest **sound** ε (exact or upper bound; an estimate never decides), prints one verdict
//! line and exits 0 within budget, 1 over budget, 2 on bad input or when no sound accountant
//! applies. `--junit FILE` writes (and on a re-run replaces) a JUnit XML result; `--format json` prints the report, whose
//! `verdicts[0].margin` is budget − sound ε.

use std::path::PathBuf;
use std::time::Instant;

use crate::cli::common::{parse_accountants, Format, OutputArgs, Outputs};
use dpaudit::audit::check::{self, Checked, Source};
use dpaudit::audit::outcome::Verdict;
use dpaudit::audit::Input;
use dpaudit::error::{Error, Result};
use dpaudit::events::{DpEvent, Neighbouring};
use dpaudit::report::{output, progress};

const EXAMPLES: &str = "\
Examples:
  # CI guard: exit 0 when the sound ε at δ = 1e-5 is at most 8, 1 when it is over.
  dpaudit check fixtures/events/edm-fullbatch-sigmamin0.002.toml --max-epsilon 8 --delta 1e-5

  Output (one line):
  PASS fixtures/events/edm-fullbatch-sigmamin0.002.toml: sound ε = 3.23818 (gdp exact) ≤ budget 8 at δ = 1e-5, margin 4.76182

  # Also write a JUnit result for the CI system, and every report format into reports/ci/
  # (created when missing; --force replaces report files from an earlier run; the JUnit file is
  # replaced on every run, as CI tools expect).
  dpaudit check fixtures/events/dpsgd-mnist-sigma0.8.toml --max-epsilon 1 --junit check.xml --out reports/ci

  # Several pipelines at once: one verdict line and one JUnit test case each
  dpaudit check fixtures/events/dpsgd.toml fixtures/events/dpsgd-mnist-sigma0.8.toml --max-epsilon 8 --junit ci.xml

  # DP-SGD from flags, as Opacus users describe it (steps and q derived as Opacus does)
  dpaudit check --noise-multiplier 0.8 --epochs 10 --batch-size 64 --dataset-size 60000 --delta 1e-5 --max-epsilon 1

  # The verdict as JSON: verdicts[0].margin = budget − sound ε.
  dpaudit check fixtures/events/dpsgd-mnist-sigma0.8.toml --max-epsilon 1 --format json | jq .verdicts[0].margin

Exit codes: 0 within budget, 1 over budget, 2 bad input or no sound accountant applies.
The budget is always checked against a sound bound (exact or upper bound), never an estimate:
a CLT estimate inside the budget does not pass a pipeline whose sound bound is over it.";

#[derive(Debug, clap::Args)]
#[command(after_help = EXAMPLES)]
/// CI guard: exit 1 when a pipeline exceeds its ε budget.
pub struct Args {
    /// Event files (TOML with `schema_version` and `[event]`) or diffusion sampler configs;
    /// each is checked against the budget and becomes one JUnit test case.
    #[arg(value_name = "CONFIG")]
    pub configs: Vec<PathBuf>,
    /// DP-SGD from flags instead of a file: noise multiplier σ.
    #[arg(long, value_name = "SIGMA", allow_negative_numbers = true)]
    pub noise_multiplier: Option<f64>,
    /// DP-SGD from flags: Poisson sampling rate q (default 1).
    #[arg(long, value_name = "Q", allow_negative_numbers = true)]
    pub sample_rate: Option<f64>,
    /// DP-SGD from flags: number of steps.
    #[arg(long, value_name = "N")]
    pub steps: Option<u64>,
    /// DP-SGD in users' words (`--epochs --batch-size --dataset-size [--sampling]`).
    #[command(flatten)]
    pub run: super::account::TrainingRunArgs,
    /// The ε budget (nats). Checked against the smallest sound ε.
    #[arg(long, value_name = "E", allow_negative_numbers = true)]
    pub max_epsilon: f64,
    /// δ at which ε is computed (overrides the file's `delta`).
    #[arg(long, value_name = "D")]
    pub delta: Option<f64>,
    /// Accountants to run: gdp, clt, rdp, pld (comma-separated) or all.
    #[arg(long, default_value = "all")]
    pub accountant: String,
    /// Write a JUnit XML result to FILE (replaced on every run; also written on bad input).
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Output grammar: --format (text = the verdict line), --out DIR, --force, -q, -v.
    #[command(flatten)]
    pub output: OutputArgs,
    /// Skip the ε(δ)/trade-off curves and per-step tables (faster reports).
    #[arg(long)]
    pub no_plots: bool,
}

/// The DP-SGD pipeline given by flags (`--noise-multiplier` with `--steps [--sample-rate]` or
/// `--epochs --batch-size --dataset-size [--sampling]`), if any.
fn flag_pipeline(args: &Args) -> Result<Option<Source>> {
    let derived = args.run.derive()?;
    if args.noise_multiplier.is_none() && derived.is_none() && args.steps.is_none() && args.sample_rate.is_none() {
        return Ok(None);
    }
    let sigma = super::account::check_sigma(
        "--noise-multiplier",
        args.noise_multiplier
            .ok_or_else(|| Error::field("--noise-multiplier", "required for a DP-SGD check from flags"))?,
    )?;
    let mut over_approximates = None;
    let (event, derivation) = match derived {
        Some(d) => {
            let mut lines = vec![format!("DP-SGD run: {}", d.summary())];
            lines.extend(d.derivation.iter().cloned());
            over_approximates = d.over_approximates();
            (d.event(sigma), lines)
        }
        None => {
            let steps = args.steps.ok_or_else(|| {
                Error::field(
                    "--steps",
                    "required (or give --epochs, --batch-size and --dataset-size)",
                )
            })?;
            let q = super::account::check_q("--sample-rate", args.sample_rate.unwrap_or(1.0))?;
            (DpEvent::dpsgd(sigma, q, steps), Vec::new())
        }
    };
    event.validate()?;
    Ok(Some(Source::Flags {
        input: Input {
            event,
            neighbouring: Neighbouring::AddRemove,
            delta: None,
            role: "DP-SGD flags",
            step_convention: None,
            warnings: Vec::new(),
            over_approximates,
        },
        derivation,
    }))
}

/// Runs `dpaudit check`; returns its status (ok within budget, violated over it, unanswered on
/// bad input or when no sound accountant applies).
pub fn run(args: Args) -> anyhow::Result<Verdict> {
    let started = Instant::now();
    // Output locations first: existing reports are refused before any work.
    let out = args.output.prepare(Format::Text, &[])?;
    let flags = flag_pipeline(&args)?;
    // A diffusers folder is checked by its DP ledger (resolved by `audit::check`).
    let mut sources: Vec<Source> = args.configs.iter().cloned().map(Source::File).collect();
    sources.extend(flags);
    if sources.len() > 1 {
        let plan = plan(&args, &out, sources, started)?;
        if out.format != Format::Text || out.dir.is_some() {
            return Err(Error::field(
                "--format",
                "with several inputs, check prints one verdict line each and writes --junit; \
                 run check on one input for --format/--out reports",
            )
            .into());
        }
        return Ok(emit(&args, &out, check::execute(&plan)?)?);
    }
    let name = sources
        .first()
        .map(Source::name)
        .unwrap_or_else(|| check::FLAGS_NAME.to_string());
    let checked = plan(&args, &out, sources, started).and_then(|plan| check::execute(&plan));
    match checked {
        Ok(c) => Ok(emit(&args, &out, c)?),
        Err(e) => {
            if let Some(j) = &args.junit {
                let xml = check::error_junit(&name, &e.to_string(), started);
                // The input error is what the user needs to see; a JUnit write failure is secondary.
                let written = output::check_file(j, true).and_then(|_| output::write_atomic(j, xml.as_bytes(), true));
                if let Err(w) = written {
                    eprintln!("warning: JUnit result not written: {w}");
                }
            }
            Err(e.into())
        }
    }
}

/// The validated plan: the flags shared by every input.
fn plan(args: &Args, out: &Outputs, sources: Vec<Source>, started: Instant) -> Result<check::Plan> {
    if !(args.max_epsilon.is_finite() && args.max_epsilon >= 0.0) {
        return Err(Error::field(
            "--max-epsilon",
            format!("must be a finite number ≥ 0, got {}", args.max_epsilon),
        ));
    }
    let accountants = parse_accountants(&args.accountant)?;
    if let Some(j) = &args.junit {
        output::check_file(j, true)?;
    }
    Ok(check::Plan {
        sources,
        delta: args.delta,
        budget: args.max_epsilon,
        accountants,
        junit: args.junit.is_some(),
        curves: !args.no_plots && (out.dir.is_some() || out.format != Format::Text),
        quiet: out.quiet,
        color: progress::color_stdout(),
        started,
    })
}

/// Prints and writes what the check produced; returns its status.
fn emit(args: &Args, out: &Outputs, checked: Checked) -> Result<Verdict> {
    match checked {
        Checked::Many {
            text,
            errors,
            junit,
            status,
        } => {
            output::emit_stdout(text.as_bytes())?;
            for e in errors {
                eprintln!("error: {e}");
            }
            if let (Some(j), Some(xml)) = (&args.junit, junit) {
                output::write_atomic(j, xml.as_bytes(), true)?;
            }
            Ok(status)
        }
        Checked::One {
            outcome,
            plain_line,
            junit,
            severe,
            unanswered,
        } => {
            if out.format != Format::Text {
                // The verdict stays visible when stdout carries the report.
                eprint!("{plain_line}");
            }
            let status = out.emit(*outcome)?;
            if let (Some(j), Some(xml)) = (&args.junit, junit) {
                output::write_atomic(j, xml.as_bytes(), true)?;
            }
            for w in severe {
                eprintln!("warning: {w}");
            }
            match unanswered {
                Some(e) => Err(e),
                None => Ok(status),
            }
        }
    }
}
