//! `check`: inputs accounted against an ε budget. [`execute`] runs a whole `dpaudit check`
//! (one input: its report, verdict line and JUnit result; several inputs: one verdict line and
//! one JUnit test case each); [`run`] accounts one loaded input and adds its budget verdict
//! (the report, the verdict and the δ it was judged at).

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::accounting::{self, AccountOptions};
use crate::accountants::sound;
use crate::accountants::AccountantKind;
use crate::audit::{Input, Outcome};
use crate::error::{Error, Result};
use crate::report::{self, junit, progress, Report, Verdict};

/// Name of the flag-given pipeline in outputs and JUnit.
pub const FLAGS_NAME: &str = "dp-sgd (flags)";

/// One input of a check.
#[derive(Debug, Clone)]
pub enum Source {
    /// An event file or a diffusion sampler config.
    File(PathBuf),
    /// A DP-SGD pipeline given by flags, with the lines deriving it from users' words.
    Flags {
        /// The validated pipeline.
        input: Input,
        /// How steps and q were derived (empty when given directly).
        derivation: Vec<String>,
    },
    /// An event given by a program that embeds dpaudit (`api::check`), under `name`.
    Event {
        /// The validated event, its neighbouring relation and δ.
        input: Input,
        /// The name shown in the verdict line and report title.
        name: String,
    },
}

impl Source {
    /// The source to account: a diffusers training folder is checked by its DP ledger
    /// (`ledger.json` beside the weights); everything else as given.
    pub fn resolved(&self) -> Result<Source> {
        match self {
            Source::File(p) if p.is_dir() => crate::models::folder::folder_ledger(p).map(Source::File),
            other => Ok(other.clone()),
        }
    }

    /// The name shown in verdict lines and JUnit test cases.
    pub fn name(&self) -> String {
        match self {
            Source::File(p) => p.display().to_string(),
            Source::Flags { .. } => FLAGS_NAME.to_string(),
            Source::Event { name, .. } => name.clone(),
        }
    }
}

/// A validated `dpaudit check`.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The inputs, in order (empty: nothing to check, an input error).
    pub sources: Vec<Source>,
    /// `--delta`, when given (else each input's own δ).
    pub delta: Option<f64>,
    /// `--max-epsilon`, finite and ≥ 0.
    pub budget: f64,
    /// Accountants to run.
    pub accountants: Vec<AccountantKind>,
    /// Produce a JUnit XML result.
    pub junit: bool,
    /// Tables and plots besides the headline numbers (one input only).
    pub curves: bool,
    /// No progress bar.
    pub quiet: bool,
    /// Colour the one-input verdict line.
    pub color: bool,
    /// When the run started (JUnit's `time`).
    pub started: Instant,
}

/// What a check produced, before anything is printed or written.
#[derive(Debug)]
pub enum Checked {
    /// One input.
    One {
        /// Its report, coloured verdict line and status.
        outcome: Box<Outcome>,
        /// The verdict line without colour (shown on stderr when stdout carries the report).
        plain_line: String,
        /// The JUnit XML, when asked for.
        junit: Option<String>,
        /// Severe warnings, repeated on stderr after the report.
        severe: Vec<String>,
        /// Set when no sound accountant applies: the question is unanswered (exit 2).
        unanswered: Option<Error>,
    },
    /// Several inputs.
    Many {
        /// One verdict line (or `ERROR name: message` line) per input.
        text: String,
        /// Errors for stderr, one per input that could not be checked.
        errors: Vec<String>,
        /// The JUnit XML, when asked for.
        junit: Option<String>,
        /// Unanswered when any input could not be checked, else violated when any is over
        /// budget, else ok.
        status: sound::Verdict,
    },
}

/// The JUnit document for a one-input check that failed with `error` (bad input).
pub fn error_junit(plan_name: &str, error: &str, started: Instant) -> String {
    junit::error_junit("dpaudit check", plan_name, error, started.elapsed().as_secs_f64())
}

/// Runs `dpaudit check`: one input gives its report (with conclusion), several give one verdict
/// line each.
pub fn execute(plan: &Plan) -> Result<Checked> {
    let sources = plan.sources.iter().map(Source::resolved).collect::<Result<Vec<_>>>()?;
    let plan = &Plan {
        sources,
        ..plan.clone()
    };
    if plan.sources.len() > 1 {
        return Ok(execute_many(plan));
    }
    let source = plan.sources.first().ok_or_else(|| {
        Error::field(
            "CONFIG",
            "nothing to check: give one or more event/sampler files, or DP-SGD flags (--noise-multiplier …)",
        )
    })?;
    let name = source.name();
    let (mut rep, verdict, delta) = check_source(plan, source, plan.curves, plan.quiet)?;
    rep.audit = "check".into();
    rep.conclude();
    let mut line = super::text::verdict_line(&name, &verdict, Some(delta), plan.color);
    // The scale of the sound ε the verdict rests on: what it allows a membership attacker.
    if let Some(s) = rep.sound_epsilon() {
        line.push_str(&format!("  {}\n", crate::report::conclusion::scale(s.epsilon, s.delta)));
    }
    let plain_line = super::text::verdict_line(&name, &verdict, Some(delta), false);
    let junit = plan
        .junit
        .then(|| junit::to_junit(&rep, "dpaudit check", plan.started.elapsed().as_secs_f64()));
    let severe: Vec<String> = rep
        .warnings
        .iter()
        .filter(|w| w.severe)
        .map(|w| w.message.clone())
        .collect();
    let unanswered = (verdict.status == sound::Verdict::NotDemonstrated).then(|| inconclusive_error(&rep, &name));
    Ok(Checked::One {
        outcome: Box::new(Outcome::new(rep, line).with_status(verdict.status)),
        plain_line,
        junit,
        severe,
        unanswered,
    })
}

/// Several inputs: one verdict line each, one JUnit test case each.
fn execute_many(plan: &Plan) -> Checked {
    let mut reports: Vec<(String, std::result::Result<Report, String>)> = Vec::new();
    let mut text = String::new();
    let mut errors = Vec::new();
    let mut status = sound::Verdict::Holds;
    for source in &plan.sources {
        let name = source.name();
        match check_source(plan, source, false, true) {
            Ok((rep, verdict, delta)) => {
                text.push_str(&super::text::verdict_line(&name, &verdict, Some(delta), false));
                match verdict.status {
                    sound::Verdict::Holds | sound::Verdict::Violated => status = status.worst(verdict.status),
                    sound::Verdict::NotDemonstrated | sound::Verdict::Unanswered => {
                        errors.push(inconclusive_error(&rep, &name).to_string());
                        status = sound::Verdict::Unanswered;
                    }
                }
                reports.push((name, Ok(rep)));
            }
            Err(e) => {
                text.push_str(&format!("ERROR {name}: {e}\n"));
                errors.push(e.to_string());
                status = sound::Verdict::Unanswered;
                reports.push((name, Err(e.to_string())));
            }
        }
    }
    let junit = plan.junit.then(|| {
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
        junit::to_junit_many(&items, "dpaudit check", plan.started.elapsed().as_secs_f64())
    });
    Checked::Many {
        text,
        errors,
        junit,
        status,
    }
}

/// Loads and checks one source.
fn check_source(plan: &Plan, source: &Source, curves: bool, quiet: bool) -> Result<(Report, Verdict, f64)> {
    let name = source.name();
    let (path, loaded, derivation) = match source {
        Source::File(p) => {
            // The audit core's loader, with the sampler defaults a CI log should show as warnings.
            (Some(p.as_path()), super::load_file_with(p, true)?, &[][..])
        }
        Source::Flags { input, derivation } => (None, input.clone(), derivation.as_slice()),
        Source::Event { input, .. } => (None, input.clone(), &[][..]),
    };
    let one = One {
        name,
        path,
        delta_flag: plan.delta,
        budget: plan.budget,
        accountants: &plan.accountants,
        curves,
        quiet,
    };
    run(&one, &loaded, derivation)
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

/// A validated check of one input.
#[derive(Debug, Clone)]
pub struct One<'a> {
    /// The name shown in verdict lines (`path` or the flags' name).
    pub name: String,
    /// The input file (None: DP-SGD flags).
    pub path: Option<&'a Path>,
    /// `--delta`, when given.
    pub delta_flag: Option<f64>,
    /// `--max-epsilon`.
    pub budget: f64,
    /// Accountants to run.
    pub accountants: &'a [AccountantKind],
    /// Tables and plots besides the headline numbers.
    pub curves: bool,
    /// No progress bar.
    pub quiet: bool,
}

/// Accounts `input` (with the DP-SGD `derivation` lines when it came from flags) and adds its
/// budget verdict. Returns the report, the verdict and the δ it was judged at.
pub fn run(plan: &One<'_>, input: &Input, derivation: &[String]) -> Result<(Report, Verdict, f64)> {
    let path = plan.path;
    let delta = match (plan.delta_flag, input.delta) {
        (Some(d), _) | (None, Some(d)) => d,
        (None, None) => {
            let e = Error::field("--delta", "no δ given: pass --delta or set `delta` in the file");
            return Err(match path {
                Some(p) => e.with_file(p),
                None => e,
            });
        }
    };
    crate::accountants::check_delta(delta).map_err(|e| match (plan.delta_flag.is_some(), path) {
        (true, _) | (false, None) => Error::field("--delta", e.message),
        (false, Some(p)) => e.with_file(p),
    })?;

    let mut rep = Report::new(format!("Privacy budget check: {}", plan.name), report::command_line());
    match path {
        Some(p) => {
            rep.add_input(input.role, p)?;
        }
        None => {
            for l in derivation {
                rep.assumptions
                    .other
                    .push(report::Fact::new("DP-SGD derivation", l.clone()));
            }
        }
    }
    rep.assumptions.step_convention = input.step_convention.clone();
    for w in &input.warnings {
        rep.warn(&w.code, w.message.clone(), w.severe);
    }
    let work = plan.accountants.len() as u64 * if plan.curves { 2 } else { 1 };
    let pb = progress::bar(work, plan.quiet, "check");
    accounting::account_event(
        &mut rep,
        &input.event,
        input.neighbouring,
        delta,
        plan.accountants,
        AccountOptions { curves: plan.curves },
        &mut |what| {
            pb.set_message(what.to_string());
            pb.inc(1);
        },
    )?;
    pb.finish_and_clear();
    if let Some(why) = &input.over_approximates {
        super::mark_over_approximation(&mut rep, why);
    }
    let subject = format!("ε budget for {}", plan.name);
    let verdict = super::budget_verdict(&mut rep, &subject, plan.budget);
    rep.fact("budget ε", report::export::fmt_num(plan.budget));
    rep.fact("δ", report::export::fmt_num(delta));
    if let Some(e) = verdict.epsilon() {
        rep.fact("sound ε", report::export::fmt_num(e));
    }
    if let Some(m) = verdict.margin {
        rep.fact("margin (budget − sound ε)", report::export::fmt_num(m));
    }
    Ok((rep, verdict, delta))
}
