//! The audit core: input → events → accountants → sound ε and verdicts → Report, in one screen.
//!
//! ```text
//!  event file / sampler config / flags ─► DpEvent ─► accountants ─► sound ε ─► verdict ─► Report
//!        (load)                         (what ran)  (each: ε, kind)  (never an   (budget)   (md, html,
//!                                                                     estimate)              csv, json)
//! ```
//!
//! [`audit`] is the whole chain for `account`, and [`check::run`] the one budget chain (`check`,
//! from the CLI and from Python alike); the other commands run the same
//! stages through their own stage modules and build the same [`Report`]: [`analyze`]
//! (diffusion sampling), [`calibrate`], [`sweep`], [`run`] (mechanisms on data) and the
//! verify/mia/train stages in `pipelines`, `attacks` and `models`. Every command's report opens
//! with the plain-language conclusion ([`Report::conclude`]), and every command ends in one
//! [`Outcome`] (report, text, files, its [`sound::Verdict`]); the verdict's one mapping to the
//! exit code is [`sound::Verdict::exit_code`].

pub mod account;
pub mod accounting;
pub mod analyze;
pub mod calibrate;
pub mod check;
#[cfg(feature = "models")]
pub mod merge;
#[cfg(feature = "models")]
pub mod mia;
#[cfg(feature = "models")]
pub mod model;
pub mod outcome;
#[cfg(feature = "models")]
pub mod rederive;
pub mod run;
pub mod sweep;
pub mod text;
#[cfg(feature = "models")]
pub mod train;
pub mod verify;
pub mod white_box;

use std::path::{Path, PathBuf};

use crate::accountants::{sound, AccountantKind};
use crate::error::{Error, Result};
use crate::events::{DpEvent, EventFile, Neighbouring};
use crate::report::progress::Progress;
use crate::report::{self, Report, Verdict};
use accounting::AccountOptions;

pub use outcome::Outcome;

/// Where the event comes from.
#[derive(Debug, Clone)]
pub enum Source {
    /// An event file or a diffusion sampler config, told apart by their keys.
    File(PathBuf),
    /// An event built from flags (e.g. DP-SGD in epochs, batch and dataset size).
    Event {
        /// The event.
        event: DpEvent,
        /// How it was given (`flags`).
        role: &'static str,
        /// Why the event only over-approximates what ran (see [`Input::over_approximates`]).
        over_approximates: Option<String>,
    },
    /// A DP-SGD-style event from flags: `steps` Poisson-sampled Gaussian steps.
    DpSgd {
        /// Noise std / sensitivity.
        noise_multiplier: f64,
        /// Poisson rate q in (0, 1].
        sample_rate: f64,
        /// Number of steps.
        steps: u64,
    },
}

/// What to ask the accountants.
#[derive(Debug, Clone, Copy)]
pub enum Question {
    /// ε at δ (δ from the flag, else from the file).
    Epsilon {
        /// `--delta`, when given.
        delta: Option<f64>,
    },
    /// δ at ε.
    Delta {
        /// `--epsilon`.
        epsilon: f64,
    },
}

/// A validated accounting plan (built by `account` from its flags, and by the Python `account`).
#[derive(Debug, Clone)]
pub struct Plan {
    /// The command name recorded in the report (`account`).
    pub command: &'static str,
    /// The input.
    pub source: Source,
    /// Overrides the file's neighbouring relation.
    pub neighbouring: Option<Neighbouring>,
    /// ε at δ, or δ at ε.
    pub question: Question,
    /// Accountants to run.
    pub accountants: Vec<AccountantKind>,
    /// Tables and plots besides the headline numbers.
    pub curves: bool,
}

/// The accounting chain: input → events → accountants → Report (a budget is judged by
/// [`check::run`], the one budget chain).
pub fn audit(plan: &Plan, progress: &Progress) -> Result<Report> {
    // 1. Input: the file (hashed into the report) or the flags.
    let input = load(&plan.source)?;
    let mut rep = Report::new(title(plan), report::command_line()).for_command(plan.command);
    if let Source::File(path) = &plan.source {
        rep.add_input(input.role, path)?;
    }
    rep.assumptions.step_convention = input.step_convention.clone();
    for w in &input.warnings {
        rep.warn(&w.code, w.message.clone(), w.severe);
    }
    // 2. Events: what ran, under which neighbouring relation.
    let neighbouring = plan.neighbouring.unwrap_or(input.neighbouring);
    // 3. Accountants: each gives ε (or δ) with its kind (exact, upper bound, estimate).
    let tick = &mut |what: &str| {
        progress.set_message(what.to_string());
        progress.inc(1);
    };
    match plan.question {
        Question::Epsilon { delta } => {
            let delta = resolve_delta(delta, input.delta, &plan.source)?;
            let opts = AccountOptions { curves: plan.curves };
            accounting::account_event(
                &mut rep,
                &input.event,
                neighbouring,
                delta,
                &plan.accountants,
                opts,
                tick,
            )?;
        }
        Question::Delta { epsilon } => {
            accounting::account_delta(&mut rep, &input.event, neighbouring, epsilon, &plan.accountants, tick)?
        }
    }
    if let Some(why) = &input.over_approximates {
        mark_over_approximation(&mut rep, why);
    }
    // 4. Report: opens with the plain-language conclusion.
    rep.conclude();
    Ok(rep)
}

fn title(plan: &Plan) -> String {
    match &plan.source {
        Source::File(p) => format!("Privacy accounting: {}", p.display()),
        _ => "Privacy accounting: DP-SGD-style event".into(),
    }
}

/// δ from the flag, else from the file; the error names where it came from.
fn resolve_delta(flag: Option<f64>, file: Option<f64>, source: &Source) -> Result<f64> {
    let named = |e: Error| match source {
        Source::File(p) if flag.is_none() => e.with_file(p),
        _ => e,
    };
    let delta = match (flag, file) {
        (Some(d), _) | (None, Some(d)) => d,
        (None, None) => {
            return Err(named(Error::field(
                "--delta",
                "no δ given: pass --delta (or set `delta` in the file), or --epsilon to ask for δ",
            )))
        }
    };
    crate::accountants::check_delta(delta).map_err(|e| {
        if flag.is_some() {
            Error::field("--delta", e.message)
        } else {
            named(e)
        }
    })?;
    Ok(delta)
}

/// The input-level warnings of a sampler config, exactly as `analyze` lists them (its analysis
/// with no accountant: defaulted privacy fields, subsample normalisation, data-dependent density).
pub(crate) fn sampler_warnings(cfg: &crate::config::sampler::SamplerConfig) -> Vec<crate::accountants::Diagnostic> {
    crate::diffusion::account::analyze(cfg, &[])
        .map(|a| a.warnings)
        .unwrap_or_default()
}

/// An input ready to account.
#[derive(Debug, Clone)]
pub struct Input {
    /// The event that ran.
    pub event: DpEvent,
    /// The neighbouring relation the input states (add/remove by default).
    pub neighbouring: Neighbouring,
    /// δ stated by the input, if any.
    pub delta: Option<f64>,
    /// What kind of input it was (`event file`, `sampler config`, `flags`).
    pub role: &'static str,
    /// Step convention or other assumptions the input states.
    pub step_convention: Option<String>,
    /// Warnings the input carries whichever command reads it (a sampler config's defaulted
    /// privacy fields, its subsample normalisation): the same list `analyze` shows.
    pub warnings: Vec<crate::accountants::Diagnostic>,
    /// Why the event only over-approximates what ran (shuffled batches accounted as full-batch
    /// steps): its exact values are then upper bounds ([`mark_over_approximation`]).
    pub over_approximates: Option<String>,
}

/// Relabels the report's exact values as upper bounds, with a warning saying why: the event
/// accounted over-approximates the mechanism, so its exact ε is only an upper bound on the
/// mechanism's (and no number of it is a lower bound).
pub(crate) fn mark_over_approximation(report: &mut Report, why: &str) {
    let mut any = false;
    for r in &mut report.results {
        if r.kind == crate::accountants::BoundKind::Exact {
            r.kind = crate::accountants::BoundKind::UpperBound;
            any = true;
        }
    }
    report.warn(
        "event_over_approximates",
        format!(
            "the accounted event over-approximates the mechanism ({why}){}",
            if any {
                ": its exact values are upper bounds on the mechanism's ε"
            } else {
                ""
            }
        ),
        false,
    );
}

/// Reads an input: an event file or a sampler config (told apart by their keys), or flags.
pub fn load(source: &Source) -> Result<Input> {
    match source {
        Source::File(path) => load_file(path),
        Source::Event {
            event,
            role,
            over_approximates,
        } => {
            event.validate()?;
            Ok(Input {
                event: event.clone(),
                neighbouring: Neighbouring::default(),
                delta: None,
                role,
                step_convention: None,
                warnings: Vec::new(),
                over_approximates: over_approximates.clone(),
            })
        }
        Source::DpSgd {
            noise_multiplier,
            sample_rate,
            steps,
        } => {
            let event = DpEvent::dpsgd(*noise_multiplier, *sample_rate, *steps);
            event.validate()?;
            Ok(Input {
                event,
                neighbouring: Neighbouring::default(),
                delta: None,
                role: "flags",
                step_convention: None,
                warnings: Vec::new(),
                over_approximates: None,
            })
        }
    }
}

/// Reads `path`, tells an event file from a sampler config by its keys, and returns the event
/// to account. Errors name the file (and line/field where known).
pub(crate) fn load_file(path: &Path) -> Result<Input> {
    load_file_with(path, false)
}

/// [`load_file`], also printing (on stderr) the sampler settings that were left at their
/// defaults when `warn_defaults` (what `check` does, so that a CI log shows them).
pub(crate) fn load_file_with(path: &Path, warn_defaults: bool) -> Result<Input> {
    let src = crate::input::read_to_string(path)?;
    let table: toml::Table = toml::from_str(&src).map_err(|e| crate::error::from_toml(path, &src, e))?;
    if table.contains_key("event") {
        let f = EventFile::load(path)?;
        f.event.validate().map_err(|e| e.with_file(path))?;
        return Ok(Input {
            event: f.event,
            neighbouring: f.neighbouring,
            delta: f.delta,
            role: "event file",
            step_convention: None,
            warnings: Vec::new(),
            over_approximates: None,
        });
    }
    if [
        "schedule",
        "scheduler_config",
        "privacy",
        "density",
        "convention",
        "sampler",
    ]
    .iter()
    .any(|k| table.contains_key(*k))
    {
        let cfg = crate::config::sampler::SamplerConfig::load(path)?;
        if warn_defaults {
            cfg.warn_defaults(path);
        }
        let acc = crate::diffusion::account::sampler_accounting(&cfg).map_err(|e| e.with_file(path))?;
        return Ok(Input {
            event: acc.event,
            neighbouring: acc.neighbouring,
            delta: Some(acc.delta),
            role: "sampler config",
            step_convention: Some(acc.convention.describe().to_string()),
            warnings: sampler_warnings(&cfg),
            over_approximates: None,
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

/// Compares `budget` with the smallest sound ε in the report (never an estimate) and adds the
/// verdict. Not demonstrated (`inconclusive`) when no sound accountant produced a result.
pub fn budget_verdict(report: &mut Report, subject: &str, budget: f64) -> Verdict {
    use crate::report::Series;
    let v = budget_verdict_of(report, subject, budget);
    if v.status == sound::Verdict::Violated {
        if let Some(est) = report
            .results
            .iter()
            .find(|r| !r.kind.is_sound() && r.epsilon <= budget)
        {
            let msg = format!(
                "the {} estimate ε = {} is within the budget, but an estimate is not a guarantee: the sound bound exceeds it",
                est.source(),
                crate::report::export::fmt_num(est.epsilon)
            );
            report.warn("estimate_within_budget", msg, true);
        }
    }
    // The budget as a dotted line on the ε(δ) plot.
    if let Some(p) = report.plots.iter_mut().find(|p| p.id == "epsilon_vs_delta") {
        let xs: Vec<f64> = p.series.iter().flat_map(|s| s.x.iter().copied()).collect();
        let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if lo.is_finite() && hi.is_finite() {
            p.series.push(
                Series::new(
                    format!("budget ε = {}", crate::report::num::fmt(budget)),
                    vec![lo, hi],
                    vec![budget, budget],
                )
                .with_style(crate::report::LineStyle::Dotted),
            );
        }
    }
    report.verdicts.push(v.clone());
    v
}

/// The verdict [`budget_verdict`] adds, computed from the report's results alone (what
/// `dpaudit report` derives again from a report read back).
pub(crate) fn budget_verdict_of(report: &Report, subject: &str, budget: f64) -> Verdict {
    match report.sound_epsilon() {
        Some(r) => {
            let pass = r.epsilon <= budget;
            let margin = budget - r.epsilon;
            Verdict {
                subject: subject.to_string(),
                status: if pass {
                    sound::Verdict::Holds
                } else {
                    sound::Verdict::Violated
                },
                budget: Some(budget),
                evidence: Some(r.cited()),
                margin: Some(margin),
                message: format!(
                    "sound ε = {} ({} {}) {} budget {}{}",
                    crate::report::export::fmt_num(r.epsilon),
                    r.source(),
                    r.kind.describe(),
                    if pass { "≤" } else { ">" },
                    crate::report::export::fmt_num(budget),
                    r.non_private_note()
                ),
            }
        }
        None => Verdict {
            subject: subject.to_string(),
            status: sound::Verdict::NotDemonstrated,
            budget: Some(budget),
            evidence: None,
            margin: None,
            message: "no sound accountant (exact or upper bound) could account this event".into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::accounting::{account_event, AccountOptions};

    #[test]
    fn full_batch_report_has_gdp_verdict_and_plots() {
        // 4 steps of μ = 0.5 compose to μ = 1 (DRS Cor. 3.3); ε(1e-5) of 1-GDP = 4.377178095681224
        // (fixtures/reference/gdp_conv.csv, closed form + brentq in log space).
        let ev = DpEvent::repeat(DpEvent::gdp(0.5), 4);
        let mut r = Report::new("t", "x");
        account_event(
            &mut r,
            &ev,
            Neighbouring::AddRemove,
            1e-5,
            &[AccountantKind::Gdp],
            AccountOptions { curves: true },
            &mut |_| {},
        )
        .unwrap();
        let v = budget_verdict(&mut r, "budget", 4.0);
        assert!((v.epsilon().unwrap() - 4.377178095681224).abs() < 1e-9, "{v:?}");
        assert_eq!(v.status, sound::Verdict::Violated);
        assert!(v.margin.unwrap() < 0.0);
        let v = budget_verdict(&mut r, "budget", 5.0);
        assert_eq!(v.status, sound::Verdict::Holds);
        let ids: Vec<&str> = r.plots.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["per_step_mu", "cumulative", "epsilon_vs_delta", "tradeoff"]);
        r.validate().unwrap();
    }
}
