//! `dpaudit check <config> --max-epsilon E [--delta D]`: the CI guard.
//!
//! Accounts a pipeline (an event file, or a diffusion sampler config), compares the budget with
//! the smallest **sound** ε (exact or upper bound; an estimate never decides), prints one verdict
//! line and exits 0 within budget, 1 over budget, 2 on bad input or when no sound accountant
//! applies. `--junit FILE` writes a JUnit XML result; `--format json` prints the report, whose
//! `verdicts[0].margin` is budget − sound ε.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::accountants::AccountantKind;
use crate::cli::common::{parse_accountants, Format};
use crate::cli::{EXIT_OK, EXIT_VIOLATED};
use crate::error::{Error, Result};
use crate::events::{DpEvent, EventFile, Neighbouring};
use crate::report::build::{self, AccountOptions};
use crate::report::{self, junit, output, progress, ExportFormat, OutputDir, Report, Status};

const EXAMPLES: &str = "\
Examples:
  # CI guard: exit 0 when the sound ε at δ = 1e-5 is at most 8, 1 when it is over.
  dpaudit check fixtures/events/edm-fullbatch-sigmamin0.002.toml --max-epsilon 8 --delta 1e-5

  Output (one line):
  PASS fixtures/events/edm-fullbatch-sigmamin0.002.toml: sound ε = 3.23818 (gdp exact) ≤ budget 8 at δ = 1e-5, margin 4.76182

  # Also write a JUnit result for the CI system, and every report format into reports/ci/
  # (the directory must exist; --force replaces files from an earlier run).
  dpaudit check fixtures/events/dpsgd-mnist-sigma0.8.toml --max-epsilon 1 --junit check.xml --out reports/ci

  # The verdict as JSON: verdicts[0].margin = budget − sound ε.
  dpaudit check fixtures/events/dpsgd-mnist-sigma0.8.toml --max-epsilon 1 --format json | jq .verdicts[0].margin

Exit codes: 0 within budget, 1 over budget, 2 bad input or no sound accountant applies.
The budget is always checked against a sound bound (exact or upper bound), never an estimate:
a CLT estimate inside the budget does not pass a pipeline whose sound bound is over it.";

#[derive(Debug, clap::Args)]
#[command(after_help = EXAMPLES)]
/// CI guard: exit 1 when a pipeline exceeds its ε budget.
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
    /// Write a JUnit XML result to FILE (also on bad input).
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// What to print on stdout: the verdict line (text) or the report (json, md, html, csv).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Write the report in every format (and its plots) into DIR, with stable file names.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Overwrite existing report/JUnit files.
    #[arg(long)]
    pub force: bool,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
    /// Skip the ε(δ)/trade-off curves and per-step tables (faster reports).
    #[arg(long)]
    pub no_plots: bool,
}

/// A pipeline ready to account.
#[derive(Debug, Clone)]
pub struct Pipeline {
    /// The event to account.
    pub event: DpEvent,
    /// The neighbouring relation it is accounted under.
    pub neighbouring: Neighbouring,
    /// δ stated by the file, if any.
    pub delta: Option<f64>,
    /// What kind of file it was (`event file`, `sampler config`).
    pub role: &'static str,
    /// Step convention or other assumptions the file states.
    pub step_convention: Option<String>,
}

/// Reads `path`, tells an event file from a sampler config by its keys, and returns the event
/// to account. Errors name the file (and line/field where known).
pub fn load_pipeline(path: &Path) -> Result<Pipeline> {
    let src = crate::error::read_to_string(path)?;
    let table: toml::Table = toml::from_str(&src).map_err(|e| crate::error::from_toml(path, &src, e))?;
    if table.contains_key("event") {
        let f = EventFile::load(path)?;
        return Ok(Pipeline {
            event: f.event,
            neighbouring: f.neighbouring,
            delta: f.delta,
            role: "event file",
            step_convention: None,
        });
    }
    if ["schedule", "privacy", "density", "convention"]
        .iter()
        .any(|k| table.contains_key(*k))
    {
        let cfg = crate::config::sampler::SamplerConfig::load(path)?;
        let acc = crate::diffusion::account::sampler_accounting(&cfg).map_err(|e| e.with_file(path))?;
        return Ok(Pipeline {
            event: acc.event,
            neighbouring: acc.neighbouring,
            delta: Some(acc.delta),
            role: "sampler config",
            step_convention: Some(acc.convention.describe().to_string()),
        });
    }
    let keys: Vec<&str> = table.keys().map(String::as_str).collect();
    Err(Error::input(format!(
        "cannot tell what this file describes (top-level keys: {}): an event file has `schema_version` and an \
[event] table; a sampler config has [schedule], [privacy] and [density]",
        if keys.is_empty() {
            "none".to_string()
        } else {
            keys.join(", ")
        }
    ))
    .with_file(path))
}

/// Runs `dpaudit check`; returns the exit code (0 within budget, 1 over, 2 bad input).
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
                if let Err(w) = output::write_atomic(j, xml.as_bytes(), args.force) {
                    eprintln!("warning: JUnit result not written: {w}");
                }
            }
            Err(e.into())
        }
    }
}

fn run_inner(args: &Args, start: Instant) -> Result<i32> {
    // Validate flags and output locations before any work.
    if !(args.max_epsilon.is_finite() && args.max_epsilon >= 0.0) {
        return Err(Error::field(
            "--max-epsilon",
            format!("must be a finite number ≥ 0, got {}", args.max_epsilon),
        ));
    }
    let kinds: Vec<AccountantKind> = parse_accountants(&args.accountant)?;
    let out_dir = args
        .out
        .as_deref()
        .map(|d| OutputDir::open(d, args.force))
        .transpose()?;
    if let Some(j) = &args.junit {
        check_target(j, args.force)?;
    }

    let pipeline = load_pipeline(&args.config)?;
    let delta = match (args.delta, pipeline.delta) {
        (Some(d), _) | (None, Some(d)) => d,
        (None, None) => {
            return Err(
                Error::field("--delta", "no δ given: pass --delta or set `delta` in the file").with_file(&args.config),
            )
        }
    };
    crate::accountants::check_delta(delta).map_err(|e| {
        if args.delta.is_some() {
            Error::field("--delta", e.message)
        } else {
            e.with_file(&args.config)
        }
    })?;

    let mut rep = Report::new(
        format!("Privacy budget check: {}", args.config.display()),
        report::command_line(),
    );
    rep.add_input(pipeline.role, &args.config)?;
    rep.assumptions.step_convention = pipeline.step_convention.clone();
    let curves = !args.no_plots && (args.out.is_some() || args.format != Format::Text);
    let work = kinds.len() as u64 * if curves { 2 } else { 1 };
    let pb = progress::bar(work, args.quiet, "check");
    build::account_event(
        &mut rep,
        &pipeline.event,
        pipeline.neighbouring,
        delta,
        &kinds,
        AccountOptions { curves },
        &mut |what| {
            pb.set_message(what.to_string());
            pb.inc(1);
        },
    )?;
    pb.finish_and_clear();
    let subject = format!("ε budget for {}", args.config.display());
    let verdict = build::budget_verdict(&mut rep, &subject, args.max_epsilon);
    rep.fact("budget ε", report::export::fmt_num(args.max_epsilon));
    rep.fact("δ", report::export::fmt_num(delta));
    if let Some(e) = verdict.epsilon {
        rep.fact("sound ε", report::export::fmt_num(e));
    }
    if let Some(m) = verdict.margin {
        rep.fact("margin (budget − sound ε)", report::export::fmt_num(m));
    }

    let line = verdict_line(&args.config, &verdict, delta);
    match args.format {
        Format::Text => println!("{line}"),
        f => {
            eprintln!("{line}");
            let fmt = match f {
                Format::Json => ExportFormat::Json,
                Format::Csv => ExportFormat::Csv,
                Format::Md => ExportFormat::Md,
                Format::Html => ExportFormat::Html,
                Format::Text => unreachable!("handled above"),
            };
            output::emit(None, &report::export(&rep, fmt)?, false)?;
        }
    }
    if let Some(dir) = &out_dir {
        report::write_all(&rep, dir)?;
    }
    if let Some(j) = &args.junit {
        let xml = junit::to_junit(&rep, "dpaudit check", start.elapsed().as_secs_f64());
        output::write_atomic(j, xml.as_bytes(), args.force)?;
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

/// Fails early when `path` cannot be written (missing directory, or existing file without --force).
fn check_target(path: &Path, force: bool) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(Error::input(format!(
            "cannot write `{}`: directory `{}` does not exist (create it first)",
            path.display(),
            dir.display()
        )));
    }
    if !force && path.exists() {
        return Err(Error::input(format!(
            "`{}` already exists; pass --force to overwrite it",
            path.display()
        )));
    }
    Ok(())
}

fn verdict_line(config: &Path, v: &report::Verdict, delta: f64) -> String {
    let f = report::export::fmt_num;
    match (v.status, v.epsilon, v.margin) {
        (Status::Pass | Status::Fail, Some(eps), Some(margin)) => format!(
            "{} {}: sound ε = {} ({} {}) {} budget {} at δ = {}, margin {}",
            v.status.as_str(),
            config.display(),
            f(eps),
            v.accountant.map(|a| a.as_str()).unwrap_or("?"),
            v.bound.map(|b| b.as_str().replace('_', " ")).unwrap_or_default(),
            if v.status == Status::Pass { "≤" } else { ">" },
            f(v.budget.unwrap_or(f64::NAN)),
            f(delta),
            f(margin)
        ),
        _ => format!("{} {}: {}", v.status.as_str(), config.display(), v.message),
    }
}
