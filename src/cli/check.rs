//! `dpaudit check <config> --max-epsilon E [--delta D]`: the CI guard.
//!
//! Accounts a pipeline (an event file, or a diffusion sampler config), compares the budget with
//! the smallest **sound** ε (exact or upper bound; an estimate never decides), prints one verdict
//! line and exits 0 within budget, 1 over budget, 2 on bad input or when no sound accountant
//! applies. `--junit FILE` writes (and on a re-run replaces) a JUnit XML result; `--format json` prints the report, whose
//! `verdicts[0].margin` is budget − sound ε.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::cli::common::{parse_accountants, Format, OutputArgs, Outputs};
use dpaudit::accountants::AccountantKind;
use dpaudit::audit::outcome::Status as Answer;
use dpaudit::audit::{Input, Outcome};
use dpaudit::error::{Error, Result};
use dpaudit::events::{DpEvent, Neighbouring};
use dpaudit::report::{self, junit, output, progress, Report, Status};

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
    /// Output grammar: --format (text = the verdict line), --out DIR, --force, -q, -v.
    #[command(flatten)]
    pub output: OutputArgs,
    /// Skip the ε(δ)/trade-off curves and per-step tables (faster reports).
    #[arg(long)]
    pub no_plots: bool,
}

/// The DP-SGD pipeline given by flags (`--noise-multiplier` with `--steps [--sample-rate]` or
/// `--epochs --batch-size --dataset-size [--sampling]`), if any.
fn flag_pipeline(args: &Args) -> Result<Option<(Input, Vec<String>)>> {
    let derived = args.run.derive()?;
    if args.noise_multiplier.is_none() && derived.is_none() && args.steps.is_none() && args.sample_rate.is_none() {
        return Ok(None);
    }
    let sigma = super::account::check_sigma(
        "--noise-multiplier",
        args.noise_multiplier
            .ok_or_else(|| Error::field("--noise-multiplier", "required for a DP-SGD check from flags"))?,
    )?;
    let (event, lines) = match derived {
        Some(d) => {
            let mut lines = vec![format!("DP-SGD run: {}", d.summary())];
            lines.extend(d.derivation.iter().cloned());
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
    Ok(Some((
        Input {
            event,
            neighbouring: Neighbouring::AddRemove,
            delta: None,
            role: "DP-SGD flags",
            step_convention: None,
            warnings: Vec::new(),
        },
        lines,
    )))
}

/// Name of the flag-given pipeline in outputs and JUnit.
const FLAGS_NAME: &str = "dp-sgd (flags)";

/// Runs `dpaudit check`; returns its status (ok within budget, violated over it, unanswered on
/// bad input or when no sound accountant applies).
pub fn run(args: Args) -> anyhow::Result<Answer> {
    let start = Instant::now();
    // Output locations first: existing reports are refused before any work.
    let out = args.output.prepare(Format::Text, &[])?;
    let has_flags = match flag_pipeline(&args) {
        Ok(f) => f.is_some(),
        Err(e) => return Err(e.into()),
    };
    let n_inputs = args.configs.len() + usize::from(has_flags);
    if n_inputs > 1 {
        return run_many(&args, &out, start);
    }
    let name = args
        .configs
        .first()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| FLAGS_NAME.to_string());
    match run_inner(&args, &out, start) {
        Ok(status) => Ok(status),
        Err(e) => {
            if let Some(j) = &args.junit {
                let xml = junit::error_junit("dpaudit check", &name, &e.to_string(), start.elapsed().as_secs_f64());
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

/// Validates the flags shared by every input.
fn common_checks(args: &Args) -> Result<Vec<AccountantKind>> {
    if !(args.max_epsilon.is_finite() && args.max_epsilon >= 0.0) {
        return Err(Error::field(
            "--max-epsilon",
            format!("must be a finite number ≥ 0, got {}", args.max_epsilon),
        ));
    }
    let kinds: Vec<AccountantKind> = parse_accountants(&args.accountant)?;
    if let Some(j) = &args.junit {
        output::check_file(j, true)?;
    }
    Ok(kinds)
}

/// Loads one input: a file, or the DP-SGD flags (`path` = None).
fn load_input(args: &Args, path: Option<&Path>) -> Result<(Input, Vec<String>)> {
    match path {
        Some(p) => {
            // The audit core's loader, with the sampler defaults a CI log should show as warnings.
            let pl = dpaudit::audit::load_file_with(p, true)?;
            Ok((pl, Vec::new()))
        }
        None => flag_pipeline(args)?.ok_or_else(|| {
            Error::field(
                "CONFIG",
                "nothing to check: give one or more event/sampler files, or DP-SGD flags (--noise-multiplier …)",
            )
        }),
    }
}

/// Accounts one input and adds its budget verdict (the application layer's `check`).
fn check_one(
    args: &Args,
    kinds: &[AccountantKind],
    path: Option<&Path>,
    curves: bool,
    quiet: bool,
) -> Result<(Report, report::Verdict, f64)> {
    let name = path
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| FLAGS_NAME.to_string());
    let (pipeline, derivation) = load_input(args, path)?;
    let plan = dpaudit::audit::check::Plan {
        name,
        path,
        delta_flag: args.delta,
        budget: args.max_epsilon,
        accountants: kinds,
        curves,
        quiet,
    };
    dpaudit::audit::check::run(&plan, &pipeline, &derivation)
}

fn inconclusive_error(rep: &Report, name: &str) -> Error {
    let reasons: Vec<String> = rep
        .skipped
        .iter()
        .map(|s| format!("{}: {}", s.accountant.as_str(), s.reason))
        .collect();
    Error::unsupported(format!(
        "no sound accountant could account this pipeline, so the budget cannot be checked ({})",
        reasons.join("; ")
    ))
    .with_file(name)
}

/// Several inputs: one verdict line each (stdout), one JUnit test case each. Unanswered when any
/// input could not be checked, else violated when any is over budget, else ok.
fn run_many(args: &Args, out: &Outputs, start: Instant) -> anyhow::Result<Answer> {
    let kinds = common_checks(args)?;
    if out.format != Format::Text || out.dir.is_some() {
        return Err(Error::field(
            "--format",
            "with several inputs, check prints one verdict line each and writes --junit; \
             run check on one input for --format/--out reports",
        )
        .into());
    }
    let mut inputs: Vec<Option<&Path>> = args.configs.iter().map(|p| Some(p.as_path())).collect();
    if flag_pipeline(args)?.is_some() {
        inputs.push(None);
    }
    let mut reports: Vec<(String, std::result::Result<Report, String>)> = Vec::new();
    let mut status = Answer::Ok;
    for path in inputs {
        let name = path
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| FLAGS_NAME.to_string());
        match check_one(args, &kinds, path, false, true) {
            Ok((rep, verdict, delta)) => {
                output::emit_stdout(
                    dpaudit::audit::text::verdict_line(&name, &verdict, Some(delta), false).as_bytes(),
                )?;
                match verdict.status {
                    Status::Pass | Status::Fail => status = status.worst(Answer::of_verdict(verdict.status)),
                    Status::Inconclusive => {
                        eprintln!("error: {}", inconclusive_error(&rep, &name));
                        status = Answer::Unanswered;
                    }
                }
                reports.push((name, Ok(rep)));
            }
            Err(e) => {
                output::emit_stdout(format!("ERROR {name}: {e}\n").as_bytes())?;
                eprintln!("error: {e}");
                status = Answer::Unanswered;
                reports.push((name, Err(e.to_string())));
            }
        }
    }
    if let Some(j) = &args.junit {
        let items: Vec<(String, junit::Checked<'_>)> = reports
            .iter()
            .map(|(n, r)| {
                (
                    n.clone(),
                    match r {
                        Ok(rep) => junit::Checked::Report(rep),
                        Err(m) => junit::Checked::Error(m.clone()),
                    },
                )
            })
            .collect();
        let xml = junit::to_junit_many(&items, "dpaudit check", start.elapsed().as_secs_f64());
        output::write_atomic(j, xml.as_bytes(), true)?;
    }
    Ok(status)
}

fn run_inner(args: &Args, out: &Outputs, start: Instant) -> Result<Answer> {
    let kinds = common_checks(args)?;
    let path = args.configs.first().map(PathBuf::as_path);
    let name = path
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| FLAGS_NAME.to_string());
    let curves = !args.no_plots && (out.dir.is_some() || out.format != Format::Text);
    let (mut rep, verdict, delta) = check_one(args, &kinds, path, curves, out.quiet)?;
    rep.audit = "check".into();
    rep.conclude();
    let line = dpaudit::audit::text::verdict_line(&name, &verdict, Some(delta), progress::color_stdout());
    if out.format != Format::Text {
        // The verdict stays visible when stdout carries the report.
        eprint!(
            "{}",
            dpaudit::audit::text::verdict_line(&name, &verdict, Some(delta), false)
        );
    }
    let junit_xml = args
        .junit
        .as_ref()
        .map(|j| (j, junit::to_junit(&rep, "dpaudit check", start.elapsed().as_secs_f64())));
    let severe: Vec<String> = rep
        .warnings
        .iter()
        .filter(|w| w.severe)
        .map(|w| w.message.clone())
        .collect();
    let inconclusive = (verdict.status == Status::Inconclusive).then(|| inconclusive_error(&rep, &name));
    let status = out.emit(Outcome::new(rep, line).with_status(Answer::of_verdict(verdict.status)))?;
    if let Some((j, xml)) = junit_xml {
        output::write_atomic(j, xml.as_bytes(), true)?;
    }
    for w in severe {
        eprintln!("warning: {w}");
    }
    match inconclusive {
        Some(e) => Err(e),
        None => Ok(status),
    }
}
