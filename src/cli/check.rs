//! `dpaudit check <config> --max-epsilon E [--delta D]`: the CI guard.
//!
//! Accounts a pipeline (an event file, or a diffusion sampler config), compares the budget with
//! the smallest **sound** ε (exact or upper bound; an estimate never decides), prints one verdict
//! line and exits 0 within budget, 1 over budget, 2 on bad input or when no sound accountant
//! applies. `--junit FILE` writes (and replaces) a JUnit XML result; `--format json` prints the
//! report, whose `verdicts[0].margin` is budget − sound ε.

use std::path::PathBuf;
use std::time::Instant;

use crate::audit::{self, Plan, Question, Source};
use crate::cli::common::{parse_accountants, Format, OutputArgs};
use crate::cli::{EXIT_OK, EXIT_VIOLATED};
use crate::error::{Error, Result};
use crate::report::progress::{self, Progress};
use crate::report::{junit, output, Status};

const EXAMPLES: &str = "\
Examples:
  # CI guard: exit 0 when the sound ε at δ = 1e-5 is at most 8, 1 when it is over.
  dpaudit check fixtures/events/edm-fullbatch-sigmamin0.002.toml --max-epsilon 8 --delta 1e-5

  Output (one line):
  PASS fixtures/events/edm-fullbatch-sigmamin0.002.toml: sound ε = 3.23818 (gdp exact) ≤ budget 8 at δ = 1e-5, margin 4.76182

  # Also write a JUnit result for the CI system (replaced on every run, as CI tools expect),
  # and every report format into reports/ci/ (created when missing; --force replaces files
  # from an earlier run).
  dpaudit check fixtures/events/dpsgd-mnist-sigma0.8.toml --max-epsilon 1 --junit check.xml --out reports/ci

  # The verdict as JSON: verdicts[0].margin = budget − sound ε.
  dpaudit check fixtures/events/dpsgd-mnist-sigma0.8.toml --max-epsilon 1 --format json | jq .verdicts[0].margin

Exit codes: 0 within budget, 1 over budget, 2 bad input or no sound accountant applies.
The budget is always checked against a sound bound (exact or upper bound), never an estimate:
a CLT estimate inside the budget does not pass a pipeline whose sound bound is over it.";

#[derive(Debug, clap::Args)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// Event file (TOML with `schema_version` and `[event]`) or diffusion sampler config.
    pub config: PathBuf,
    /// The ε budget (nats). Checked against the smallest sound ε.
    #[arg(long, value_name = "E")]
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
    #[command(flatten)]
    pub output: OutputArgs,
    /// Skip the ε(δ)/trade-off curves and per-step tables (faster reports).
    #[arg(long)]
    pub no_plots: bool,
}

/// Runs `dpaudit check`; a JUnit result is written whatever the outcome.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let start = Instant::now();
    match run_inner(&args, start) {
        Ok(code) => Ok(code),
        Err(e) => {
            if let Some(j) = &args.junit {
                let xml = junit::error_junit(
                    "dpaudit check",
                    &args.config.display().to_string(),
                    &e.to_string(),
                    start.elapsed().as_secs_f64(),
                );
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

fn run_inner(args: &Args, start: Instant) -> Result<i32> {
    // Flags and output locations are checked before any work.
    if !(args.max_epsilon.is_finite() && args.max_epsilon >= 0.0) {
        return Err(Error::field(
            "--max-epsilon",
            format!("must be a finite number ≥ 0, got {}", args.max_epsilon),
        ));
    }
    let out = args.output.prepare(Format::Text, &[])?;
    if let Some(j) = &args.junit {
        output::check_file(j, true)?;
    }
    let plan = Plan {
        command: "check",
        source: Source::File(args.config.clone()),
        neighbouring: None,
        question: Question::Epsilon { delta: args.delta },
        accountants: parse_accountants(&args.accountant)?,
        budget: Some(args.max_epsilon),
        curves: !args.no_plots && (out.dir.is_some() || out.format != Format::Text),
    };
    let units = plan.accountants.len() as u64 * if plan.curves { 2 } else { 1 };
    let progress = Progress::new(Some(units), out.quiet, "check");
    let rep = audit::audit(&plan, &progress)?;
    progress.finish();
    let verdict = rep
        .verdicts
        .first()
        .cloned()
        .ok_or_else(|| Error::input("no verdict"))?;
    let subject = args.config.display().to_string();
    let line = audit::text::verdict_line(&subject, &verdict, rep.delta, progress::color_stdout());
    if out.format != Format::Text {
        // The verdict stays visible when stdout carries the report.
        eprint!("{}", audit::text::verdict_line(&subject, &verdict, rep.delta, false));
    }
    out.finish(&rep, &line, Vec::new())?;
    if let Some(j) = &args.junit {
        let xml = junit::to_junit(&rep, "dpaudit check", start.elapsed().as_secs_f64());
        output::write_atomic(j, xml.as_bytes(), true)?;
    }
    for w in rep.warnings.iter().filter(|w| w.severe) {
        eprintln!("warning: {}", w.message);
    }
    match verdict.status {
        Status::Pass => Ok(EXIT_OK),
        Status::Fail => Ok(EXIT_VIOLATED),
        Status::Inconclusive => {
            let reasons: Vec<String> = rep
                .skipped
                .iter()
                .map(|s| format!("{}: {}", s.accountant.as_str(), s.reason))
                .collect();
            Err(Error::unsupported(format!(
                "no sound accountant could account this pipeline, so the budget cannot be checked ({})",
                reasons.join("; ")
            ))
            .with_file(&args.config))
        }
    }
}
