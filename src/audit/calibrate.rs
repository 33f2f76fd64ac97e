//! Calibration (`calibrate`): the noise multiplier, sampling rate or number of steps that meets
//! a target ε, as the shared [`Report`] and a terminal summary.

use std::fmt::Write as _;

use crate::accountants::calibrate::{calibrate_dpsgd, Calibration, DpSgd, SolveFor};
use crate::accountants::{AccountantKind, BoundKind};
use crate::config::sampler::SamplerConfig;
use crate::diffusion::calibrate::SamplerCalibration;
use crate::error::Result;
use crate::events::Neighbouring;
use crate::report::export::fmt_num;
use crate::report::{self, num, Cell, Column, Conclusion, Report, Table};

/// A validated calibration plan.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The accountant inverted.
    pub accountant: AccountantKind,
    /// The fixed parameters (the solved one is ignored).
    pub fixed: DpSgd,
    /// What to solve for.
    pub solve_for: SolveFor,
    /// Target ε.
    pub target: f64,
    /// δ.
    pub delta: f64,
    /// Neighbouring relation.
    pub neighbouring: Neighbouring,
}

/// Runs the calibration and builds its report.
pub fn calibrate(plan: &Plan) -> Result<(Calibration, Report)> {
    let acc = plan.accountant.build();
    let c = calibrate_dpsgd(
        &*acc,
        plan.neighbouring,
        plan.delta,
        plan.target,
        plan.fixed,
        plan.solve_for,
    )?;
    let rep = to_report(plan, &c);
    Ok((c, rep))
}

/// The value as a user types it (steps as an integer).
pub fn value_text(solve_for: SolveFor, value: f64) -> String {
    match solve_for {
        SolveFor::Steps => format!("{}", value as u64),
        _ => num::fmt(value),
    }
}

/// The report of a finished calibration.
pub fn to_report(plan: &Plan, c: &Calibration) -> Report {
    let mut r = Report::new(
        format!(
            "Calibration: {} for ε ≤ {}",
            plan.solve_for.as_str(),
            num::fmt(plan.target)
        ),
        report::command_line(),
    )
    .for_command("calibrate");
    r.event = Some(c.event.clone());
    r.delta = Some(plan.delta);
    r.assumptions.neighbouring = Some(plan.neighbouring);
    r.assumptions.sampling = c.event.components().ok().map(|c| report::build::describe_sampling(&c));
    r.results.push(c.result.clone());
    // The answer as typed numbers: the whole calibrated run, and the ε it gives.
    let mut run = plan.fixed;
    match plan.solve_for {
        SolveFor::NoiseMultiplier => run.noise_multiplier = c.value,
        SolveFor::SampleRate => run.sample_rate = c.value,
        SolveFor::Steps => run.steps = c.value as u64,
    }
    r.answers.insert("noise_multiplier".into(), run.noise_multiplier);
    r.answers.insert("sample_rate".into(), run.sample_rate);
    r.answers.insert("steps".into(), run.steps as f64);
    r.answers.insert("epsilon".into(), c.result.epsilon);
    r.answers.insert("delta".into(), plan.delta);
    r.answers.insert("target_epsilon".into(), plan.target);
    let value = value_text(plan.solve_for, c.value);
    r.fact(plan.solve_for.as_str(), value.clone())
        .fact("target ε", num::fmt(plan.target))
        .fact("δ", num::fmt(plan.delta))
        .fact("ε at the calibrated value", fmt_num(c.result.epsilon))
        .fact("accountant evaluations", c.evaluations.to_string());
    r.tables.push(Table {
        id: "calibration".into(),
        title: "Calibrated parameter".into(),
        columns: vec![
            Column::new("solve_for"),
            Column::new("value"),
            Column::with_unit("target_epsilon", "nats"),
            Column::new("delta"),
            Column::new("accountant"),
            Column::new("kind"),
            Column::with_unit("epsilon", "nats"),
        ],
        rows: vec![vec![
            Cell::from(plan.solve_for.as_str()),
            match plan.solve_for {
                SolveFor::Steps => Cell::Int(c.value as i64),
                _ => Cell::Num(c.value),
            },
            Cell::Num(plan.target),
            Cell::Num(plan.delta),
            Cell::from(plan.accountant.as_str()),
            Cell::from(c.result.kind.as_str()),
            Cell::Num(c.result.epsilon),
        ]],
        note: Some("The value is on the safe side: re-accounted, its ε is at most the target.".into()),
    });
    let estimate = c.result.kind == BoundKind::Estimate;
    if estimate {
        r.warn(
            "estimate_not_a_bound",
            "the clt accountant gives an ESTIMATE (Dong, Roth & Su 2022, Thm 3.5), not a guarantee: the calibrated \
value may not meet the target; use --accountant pld or rdp for a sound answer",
            true,
        );
    }
    r.conclusion = Some(Conclusion {
        audited: format!(
            "Which {} makes a DP-SGD-style event meet ε ≤ {} at δ = {} ({} neighbouring).",
            plan.solve_for.as_str(),
            num::fmt(plan.target),
            num::fmt(plan.delta),
            plan.neighbouring
        ),
        guarantee: if estimate {
            format!(
                "None: {} = {value} gives an estimated ε = {} (clt), which is not a guarantee.",
                plan.solve_for.as_str(),
                fmt_num(c.result.epsilon)
            )
        } else {
            format!(
                "{} = {value} gives ε = {} at δ = {} ({}, {}) under: {}. {}",
                plan.solve_for.as_str(),
                fmt_num(c.result.epsilon),
                num::fmt(plan.delta),
                plan.accountant.as_str(),
                c.result.kind.as_str().replace('_', " "),
                report::conclusion::under(&r),
                report::conclusion::scale(c.result.epsilon, plan.delta)
            )
        },
        verdict: "No budget was checked: this is a calibration, on the safe side of the target.".into(),
        estimates: if estimate {
            "The clt number is an estimate, not a guarantee.".into()
        } else {
            "No estimates: the accountant's number is an exact value or an upper bound.".into()
        },
    });
    r
}

/// Terminal summary.
pub fn text(plan: &Plan, c: &Calibration) -> String {
    let mut s = String::from("Event:\n");
    for line in c.event.ledger().lines() {
        let _ = writeln!(s, "  {line}");
    }
    let _ = writeln!(
        s,
        "{} = {}  gives ε = {} ≤ target {} at δ = {} ({}, {})",
        plan.solve_for.as_str(),
        value_text(plan.solve_for, c.value),
        fmt_num(c.result.epsilon),
        num::fmt(plan.target),
        num::fmt(plan.delta),
        plan.accountant.as_str(),
        match c.result.kind {
            BoundKind::Estimate => "ESTIMATE, not a guarantee".to_string(),
            k => k.as_str().replace('_', " "),
        }
    );
    if c.result.kind == BoundKind::Estimate {
        s.push_str("WARNING: the clt accountant gives an ESTIMATE, not a guarantee; use --accountant pld or rdp\n");
    }
    s
}

/// The report of a sampler calibration (`calibrate --sampler`): the value of the solved setting
/// that meets the target with a sound ε, the CLT's answer beside it, and the typed answer.
pub fn sampler_report(path: &std::path::Path, cfg: &SamplerConfig, c: &SamplerCalibration) -> Result<Report> {
    let param = c.param;
    let mut rep = Report::new(
        format!("Calibration: {} of {}", param.as_str(), path.display()),
        report::command_line(),
    )
    .for_command("calibrate");
    rep.add_input("sampler config", path)?;
    rep.delta = Some(cfg.delta);
    rep.assumptions.neighbouring = Some(cfg.neighbouring);
    rep.assumptions.step_convention = Some(cfg.convention.describe().to_string());
    for w in super::sampler_warnings(cfg) {
        rep.warn(&w.code, w.message, w.severe);
    }
    rep.fact(param.as_str(), num::fmt(c.sound.meets.value))
        .fact("target ε", num::fmt(c.target_epsilon))
        .fact("sound ε at that value", num::fmt(c.sound.meets.epsilon));
    rep.answers
        .insert(param.as_str().replace('-', "_"), c.sound.meets.value);
    rep.answers.insert("epsilon".into(), c.sound.meets.epsilon);
    rep.answers.insert("delta".into(), cfg.delta);
    rep.answers.insert("target_epsilon".into(), c.target_epsilon);
    let sound = c.sound.meets.epsilon;
    rep.conclusion = Some(Conclusion {
        audited: format!(
            "Which {} makes the sampler `{}` meet ε ≤ {} at δ = {}.",
            param.as_str(),
            path.display(),
            num::fmt(c.target_epsilon),
            num::fmt(cfg.delta)
        ),
        guarantee: format!(
            "{} = {} gives a sound ε = {} ({}) under: {}. {}",
            param.as_str(),
            num::fmt(c.sound.meets.value),
            num::fmt(sound),
            c.sound.meets.line.accountant.as_str(),
            report::conclusion::under(&rep),
            report::conclusion::scale(sound, cfg.delta)
        ),
        verdict: "No budget was checked: this is a calibration, on the safe side of the target.".into(),
        estimates: if c.clt.is_some() {
            "The CLT answer is shown beside it as an estimate, never a guarantee.".into()
        } else {
            "No estimates.".into()
        },
    });
    Ok(rep)
}
