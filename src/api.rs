//! Entry points for programs that embed dpaudit (the Python package in `python/` uses only
//! these): each runs the same chain as the command of the same name and returns its
//! [`Report`] (or stage result), so an embedding gives the same numbers, kinds, verdicts and
//! error messages (file, line, field) as the CLI. Inputs are validated here, once.

use std::path::Path;

use crate::accountants::calibrate::{calibrate_dpsgd_any, Calibration, DpSgd, SolveFor};
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
/// `accountants`; accountants that cannot handle the event are listed in `skipped`.
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
    run(event, neighbouring, question, accountants, None)
}

/// `dpaudit check` on an event: the smallest sound ε at `delta` against `max_epsilon`; the
/// verdict is the report's first entry of `verdicts`.
pub fn check(
    event: &DpEvent,
    neighbouring: Neighbouring,
    delta: f64,
    max_epsilon: f64,
    accountants: &[AccountantKind],
) -> Result<Report> {
    crate::accountants::check_delta(delta)?;
    crate::accountants::check_epsilon(max_epsilon).map_err(|e| Error::field("max_epsilon", e.message))?;
    run(
        event,
        neighbouring,
        Question::Epsilon { delta: Some(delta) },
        accountants,
        Some(max_epsilon),
    )
}

fn run(
    event: &DpEvent,
    neighbouring: Neighbouring,
    question: Question,
    accountants: &[AccountantKind],
    budget: Option<f64>,
) -> Result<Report> {
    if accountants.is_empty() {
        return Err(Error::field("accountants", "no accountant given"));
    }
    let plan = Plan {
        command: if budget.is_some() { "check" } else { "account" },
        source: Source::Event {
            event: event.clone(),
            role: "python",
            over_approximates: None,
        },
        neighbouring: Some(neighbouring),
        question,
        accountants: accountants.to_vec(),
        budget,
        curves: false,
    };
    audit::audit(&plan, &Progress::new(None, true, "account"))
}

/// `dpaudit calibrate` for DP-SGD: the noise multiplier, sampling rate or number of steps
/// (`solve_for`; the other two from `fixed`) whose ε at `delta` is at most `target`, by
/// `primary` (falling back to another sound accountant when `primary` certifies no value in
/// range, with the reason).
pub fn calibrate(
    primary: AccountantKind,
    neighbouring: Neighbouring,
    delta: f64,
    target: f64,
    fixed: DpSgd,
    solve_for: SolveFor,
) -> Result<(Calibration, Option<String>)> {
    crate::accountants::check_delta(delta)?;
    crate::accountants::check_epsilon(target).map_err(|e| Error::field("target_epsilon", e.message))?;
    calibrate_dpsgd_any(primary, neighbouring, delta, target, fixed, solve_for)
}

/// `dpaudit analyze` on a sampler configuration (`path` names it in messages and in the
/// report): the per-step analysis and the report.
pub fn analyze(cfg: &SamplerConfig, path: &Path, accountants: &[AccountantKind]) -> Result<(Analysis, Report)> {
    audit::analyze::analyze(cfg, path, accountants)
}

/// The white-box audit of a DP-SGD run whose noisy updates were observed at `included.len()`
/// gradient canaries (`observations`: [steps, m] row-major, each in units of the clip bound:
/// B·U_t[j]/C), against the ledger (σ, q, steps) at δ: the same estimators and the same verdict
/// rule as `mia --audit one-run` on a checkpoint trained with gradient canaries (violated when
/// the largest lower bound exceeds the ledger's smallest sound ε). Used by `dpaudit.opacus`.
pub fn white_box_audit(
    observations: &[f32],
    included: &[bool],
    mechanism: crate::attacks::white_box::LedgerMechanism,
    delta: f64,
    confidence: f64,
) -> Result<WhiteBoxVerdict> {
    crate::accountants::check_delta(delta)?;
    let m = included.len();
    if m == 0 || !observations.len().is_multiple_of(m) {
        return Err(Error::field(
            "observations",
            format!("{} values are not whole steps of {m} canaries", observations.len()),
        ));
    }
    let steps = observations.len() / m;
    if steps as u64 != mechanism.steps {
        return Err(Error::field(
            "steps",
            format!(
                "the ledger says {} steps, the observations hold {steps}",
                mechanism.steps
            ),
        ));
    }
    let audit = crate::attacks::white_box::audit(observations, steps, included, &mechanism, delta, confidence)?;
    let event = mechanism.event(mechanism.noise_multiplier);
    let sound = crate::accountants::sound::sound_epsilon(&event, Neighbouring::AddRemove, delta);
    let ledger = sound.upper.as_ref().map(|u| (u.epsilon, u.source().to_string()));
    let violated = ledger.as_ref().is_some_and(|(e, _)| audit.epsilon_lower > *e);
    Ok(WhiteBoxVerdict {
        verdict: if violated {
            "violated".into()
        } else if ledger.is_some() {
            "consistent".into()
        } else {
            "no_guarantee".into()
        },
        ledger_epsilon: ledger.as_ref().map(|l| l.0),
        ledger_accountant: ledger.map(|l| l.1),
        audit,
    })
}

/// [`white_box_audit`]'s answer.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WhiteBoxVerdict {
    /// `violated` (a lower bound above the ledger's ε), `consistent`, or `no_guarantee`.
    pub verdict: String,
    /// The ledger's smallest sound ε at δ.
    pub ledger_epsilon: Option<f64>,
    /// The accountant and kind that gives it.
    pub ledger_accountant: Option<String>,
    /// Every estimator's result (threat model: white-box).
    pub audit: crate::attacks::white_box::WhiteBoxAudit,
}
