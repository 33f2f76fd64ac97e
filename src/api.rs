//! Entry points for programs that embed dpaudit (the Python package in `python/` uses only
//! these): each runs the same chain as the command of the same name and returns its
//! [`Report`] (or stage result), so an embedding gives the same numbers, kinds, verdicts and
//! error messages (file, line, field) as the CLI. Inputs are validated here, once.

use std::path::Path;

use crate::accountants::calibrate::{DpSgd, SolveFor};
use crate::accountants::AccountantKind;
use crate::audit::{self, Input, Plan, Question, Source};
use crate::diffusion::account::Analysis;
use crate::diffusion::SamplerConfig;
use crate::error::{Error, Result};
use crate::events::{DpEvent, EventFile, Neighbouring};
use crate::report::progress::Progress;
use crate::report::Report;

/// Reads an event file or a sampler config (told apart by their keys), as `account`,
/// `check` and `calibrate` do.
pub fn load(path: &Path) -> Result<Input> {
    audit::load_file(path)
}

/// Parses the text of an event file (TOML; `name` stands for its path in messages) and
/// validates it exactly as [`EventFile::load`] does.
pub fn event_file_from_toml(src: &str, name: &str) -> Result<EventFile> {
    let path = Path::new(name);
    let f: EventFile = toml::from_str(src).map_err(|e| crate::error::from_toml(path, src, e))?;
    if f.schema_version != 1 {
        return Err(Error::field(
            "schema_version",
            format!("unsupported schema_version {} (this dpaudit reads 1)", f.schema_version),
        )
        .with_file(path));
    }
    f.event.validate().map_err(|e| e.with_file(path))?;
    Ok(f)
}

/// Parses and validates a sampler configuration given as TOML text.
pub fn sampler_from_toml(src: &str) -> Result<SamplerConfig> {
    SamplerConfig::from_toml_str(src)
}

/// `dpaudit account` on an event: ε at `delta` (or δ at `epsilon` when given) by each of
/// `accountants` (the CLI's `audit::account::execute`); accountants that cannot handle the event
/// are listed in `skipped`, and an event no accountant supports is the CLI's error.
pub fn account(
    event: &DpEvent,
    neighbouring: Neighbouring,
    delta: Option<f64>,
    epsilon: Option<f64>,
    accountants: &[AccountantKind],
) -> Result<Report> {
    if let Some(d) = delta {
        crate::accountants::check_delta(d)?;
    }
    if let Some(e) = epsilon {
        crate::accountants::check_epsilon(e)?;
    }
    let question = match (epsilon, delta) {
        (Some(_), Some(_)) => return Err(Error::field("epsilon", "give delta or epsilon, not both")),
        (Some(e), None) => Question::Delta { epsilon: e },
        (None, d) => Question::Epsilon { delta: d },
    };
    if accountants.is_empty() {
        return Err(Error::field("accountants", "no accountant given"));
    }
    let plan = audit::account::Plan {
        audit: Plan {
            command: "account",
            source: Source::Event {
                event: event.clone(),
                role: "python",
                over_approximates: None,
            },
            neighbouring: Some(neighbouring),
            question,
            accountants: accountants.to_vec(),
            curves: false,
        },
        derived: None,
    };
    Ok(audit::account::execute(&plan, &Progress::new(None, true, "account"))?.report)
}

/// What `check` accounts: an event file or sampler config read exactly as the CLI reads it
/// (its δ, neighbouring relation and input warnings), or an event.
#[derive(Debug, Clone)]
pub enum CheckInput<'a> {
    /// A path, as `dpaudit check PATH` (a diffusers folder is checked by its ledger).
    File(&'a Path),
    /// An event under a neighbouring relation.
    Event(&'a DpEvent, Neighbouring),
}

/// `dpaudit check`: the smallest sound ε at δ (`delta`, else the file's) against `max_epsilon`,
/// by the CLI's one budget chain (`audit::check::execute`); the verdict is the report's first
/// entry of `verdicts`. Where the CLI exits 2 (bad input, or no sound accountant applies, so
/// the budget cannot be checked) this returns the same error.
pub fn check(
    input: CheckInput<'_>,
    delta: Option<f64>,
    max_epsilon: f64,
    accountants: &[AccountantKind],
) -> Result<Report> {
    if let Some(d) = delta {
        crate::accountants::check_delta(d)?;
    }
    crate::accountants::check_epsilon(max_epsilon).map_err(|e| Error::field("max_epsilon", e.message))?;
    if accountants.is_empty() {
        return Err(Error::field("accountants", "no accountant given"));
    }
    let source = match input {
        CheckInput::File(p) => audit::check::Source::File(p.to_path_buf()),
        CheckInput::Event(event, neighbouring) => {
            event.validate()?;
            audit::check::Source::Event {
                input: Input {
                    event: event.clone(),
                    neighbouring,
                    delta: None,
                    role: "python",
                    step_convention: None,
                    warnings: Vec::new(),
                    over_approximates: None,
                },
                name: "python".into(),
            }
        }
    };
    let plan = audit::check::Plan {
        sources: vec![source],
        delta,
        budget: max_epsilon,
        accountants: accountants.to_vec(),
        junit: false,
        curves: false,
        quiet: true,
        color: false,
        started: std::time::Instant::now(),
    };
    match audit::check::execute(&plan)? {
        audit::check::Checked::One {
            unanswered: Some(e), ..
        } => Err(e),
        audit::check::Checked::One { outcome, .. } => Ok(outcome.report),
        audit::check::Checked::Many { .. } => Err(Error::input("one input gives one report")),
    }
}

/// `dpaudit calibrate` for DP-SGD (the CLI's `audit::calibrate::execute`): the noise
/// multiplier, sampling rate or number of steps (`solve_for`; the other two from `fixed`) whose
/// ε at `delta` is at most `target`, by `primary` (falling back to another sound accountant
/// when `primary` certifies no value in range, with the reason as a warning). The report holds
/// the answer (`answers`), the accountant's result and the same warnings as the CLI's (a CLT
/// estimate, a fallback accountant).
pub fn calibrate(
    primary: AccountantKind,
    neighbouring: Neighbouring,
    delta: f64,
    target: f64,
    fixed: DpSgd,
    solve_for: SolveFor,
) -> Result<Report> {
    crate::accountants::check_delta(delta)?;
    crate::accountants::check_epsilon(target).map_err(|e| Error::field("target_epsilon", e.message))?;
    let request = audit::calibrate::DpSgdRequest {
        plan: audit::calibrate::Plan {
            accountant: primary,
            fixed,
            solve_for,
            target,
            delta,
            neighbouring,
        },
        derived: None,
    };
    Ok(audit::calibrate::execute(&request, &Progress::new(None, true, "calibrate"))?.report)
}

/// `dpaudit analyze` on a sampler configuration (`path` names it in messages and in the
/// report): the per-step analysis and the report.
pub fn analyze(cfg: &SamplerConfig, path: &Path, accountants: &[AccountantKind]) -> Result<(Analysis, Report)> {
    audit::analyze::analyze(cfg, path, accountants)
}

/// The white-box audit of a DP-SGD run whose noisy updates were observed at `included.len()`
/// gradient canaries (`observations`: [steps, m] row-major, each in units of the clip bound:
/// B·U_t[j]/C), against the ledger (σ, q, steps) at δ, by [`audit::white_box::audit`]: the same
/// estimators and the same verdict rule as `mia --audit one-run` on a checkpoint trained with
/// gradient canaries. Used by `dpaudit.opacus`.
pub fn white_box_audit(
    observations: &[f32],
    included: &[bool],
    mechanism: crate::attacks::white_box::LedgerMechanism,
    delta: f64,
    confidence: f64,
) -> Result<audit::white_box::WhiteBoxVerdict> {
    crate::accountants::check_delta(delta)?;
    audit::white_box::audit(observations, included, mechanism, delta, confidence)
}
