//! Calibration (`calibrate`): the noise multiplier, sampling rate or number of steps that meets
//! a target ε, as the shared [`Report`] and a terminal summary.

use std::fmt::Write as _;

use std::path::PathBuf;

use serde::Serialize;

use crate::accountants::calibrate::{calibrate_dpsgd, calibrate_dpsgd_any, Calibration, DpSgd, SolveFor};
use crate::accountants::{AccountantKind, BoundKind};
use crate::config::dpsgd::Derived;
use crate::config::sampler::SamplerConfig;
use crate::diffusion::calibrate::{calibrate_sampler_with, SamplerCalibration, SamplerParam};
use crate::error::Result;
use crate::events::Neighbouring;
use crate::report::export::fmt_num;
use crate::report::progress::Progress;
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
/// The calibrated value in a terminal line: six significant digits rounded to the private side
/// (σ up, q down: the value shown still meets the target, ε being decreasing in σ and
/// increasing in q), the step count as it is. The report and JSON keep the full value.
fn value_line(solve_for: SolveFor, value: f64) -> String {
    let shown = match solve_for {
        SolveFor::Steps => return format!("{}", value as u64),
        _ => fmt_num(value),
    };
    let up = solve_for == SolveFor::NoiseMultiplier;
    match shown.parse::<f64>() {
        Ok(y) if value.is_finite() && value != 0.0 && ((up && y < value) || (!up && y > value)) => {
            let unit = 10f64.powi(value.abs().log10().floor() as i32 - 5);
            fmt_num(if up { y + unit } else { y - unit })
        }
        _ => shown,
    }
}

pub(crate) fn value_text(solve_for: SolveFor, value: f64) -> String {
    match solve_for {
        SolveFor::Steps => format!("{}", value as u64),
        _ => num::fmt(value),
    }
}

/// The report of a finished calibration.
pub(crate) fn to_report(plan: &Plan, c: &Calibration) -> Report {
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
    r.assumptions.sampling = c
        .event
        .components()
        .ok()
        .map(|c| super::accounting::describe_sampling(&c));
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
        .fact("accountant evaluations", c.evaluations.to_string())
        .fact(
            "steering evaluations (closed form, coarser grid)",
            c.steering_evaluations.to_string(),
        );
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
                c.result.kind.describe(),
                report::conclusion::under(&r),
                report::conclusion::scale(c.result.epsilon, plan.delta)
            )
        },
        verdict: if estimate {
            "No budget was checked: this is a calibration on a clt estimate, which cannot promise the target.".into()
        } else {
            "No budget was checked: this is a calibration, on the safe side of the target.".into()
        },
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
        value_line(plan.solve_for, c.value),
        fmt_num(c.result.epsilon),
        num::fmt(plan.target),
        num::fmt(plan.delta),
        plan.accountant.as_str(),
        c.result.kind.shouted()
    );
    if c.result.kind == BoundKind::Estimate {
        s.push_str("WARNING: the clt accountant gives an ESTIMATE, not a guarantee; use --accountant pld or rdp\n");
    }
    s
}

/// The report of a sampler calibration (`calibrate --sampler`): the value of the solved setting
/// that meets the target with a sound ε, the CLT's answer beside it, and the typed answer.
pub(crate) fn sampler_report(path: &std::path::Path, cfg: &SamplerConfig, c: &SamplerCalibration) -> Result<Report> {
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
            fmt_num(sound),
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

/// A validated DP-SGD calibration request (`calibrate` without `--sampler`).
#[derive(Debug, Clone)]
pub struct DpSgdRequest {
    /// What to solve for, with which accountant, target and fixed parameters.
    pub plan: Plan,
    /// The DP-SGD run in users' words the steps and q were derived from.
    pub derived: Option<Derived>,
}

/// The answer of a DP-SGD calibration, as the terminal text and CSV state it.
struct Answer<'a> {
    value: f64,
    kind: BoundKind,
    epsilon: f64,
    event: &'a crate::events::DpEvent,
    derivation: Option<&'a Derived>,
    warnings: &'a [String],
}

/// `calibrate` (DP-SGD): solves with the plan's accountant, or the first sound one that
/// certifies a value in range (named in a warning); the report, the terminal text and
/// `calibrate.csv`. Warnings (a CLT estimate, a fallback accountant) are also printed on stderr.
pub fn execute(request: &DpSgdRequest, progress: &Progress) -> Result<super::Outcome> {
    let Plan {
        accountant: kind,
        fixed,
        solve_for,
        target,
        delta,
        neighbouring,
    } = request.plan.clone();
    let derived = request.derived.clone();
    let mut warnings = Vec::new();
    if kind == AccountantKind::Clt {
        let w = "the clt accountant gives an ESTIMATE (DRS Thm 3.5), not a guarantee: the calibrated value \
                 may not meet the target; use --accountant pld or rdp for a sound answer"
            .to_string();
        eprintln!("WARNING: {w}");
        warnings.push(w);
    }
    progress.set_message(format!("solving for {}", solve_for.as_str()));
    // What any sound accountant can certify: when `kind` finds nothing in range, the others
    // are tried and the answer names the accountant that certified it.
    let (c, fallback) = calibrate_dpsgd_any(kind, neighbouring, delta, target, fixed, solve_for)?;
    if let Some(w) = &fallback {
        eprintln!("warning: {w}");
        warnings.push(w.clone());
    }
    // The accountant that answered (a PLD that fell back names RDP); the plan's when no
    // accountant did, which the calibration search never returns.
    let kind = c.result.accountant.unwrap_or(kind);
    let mut rep = to_report(
        &Plan {
            accountant: kind,
            fixed,
            solve_for,
            target,
            delta,
            neighbouring,
        },
        &c,
    );
    if let Some(w) = &fallback {
        rep.warn("calibration_fallback_accountant", w, false);
    }
    if let Some(d) = &derived {
        rep.assumptions.other.extend(
            d.derivation
                .iter()
                .map(|l| report::Fact::new("DP-SGD derivation", l.clone())),
        );
    }
    let out = Answer {
        value: c.value,
        kind: c.result.kind,
        epsilon: c.result.epsilon,
        event: &c.event,
        derivation: derived.as_ref(),
        warnings: &warnings,
    };
    let csv = format!(
        "solve_for,value,target_epsilon,delta,accountant,kind,epsilon\n{},{},{},{},{},{},{}\n",
        solve_for.as_str(),
        out.value,
        target,
        delta,
        kind.as_str(),
        out.kind.as_str(),
        out.epsilon
    );
    let mut text = String::new();
    {
        use std::fmt::Write as _;
        let v = value_line(solve_for, out.value);
        if let Some(d) = &out.derivation {
            let _ = writeln!(text, "DP-SGD run: {}", d.summary());
            for l in &d.derivation {
                let _ = writeln!(text, "  {l}");
            }
        }
        let _ = writeln!(text, "Event:");
        for line in out.event.ledger().lines() {
            let _ = writeln!(text, "  {line}");
        }
        let _ = writeln!(
            text,
            "{} = {v}  gives ε = {} ≤ target {target} at δ = {delta:e} ({}, {})",
            solve_for.as_str(),
            crate::report::num::sig6(out.epsilon),
            kind.as_str(),
            out.kind.shouted()
        );
        for w in out.warnings {
            let _ = writeln!(text, "WARNING: {w}");
        }
    }
    Ok(super::Outcome::new(rep, text).with_table("calibrate.csv", csv.into_bytes()))
}

/// A validated sampler calibration request (`calibrate --sampler CONFIG`).
#[derive(Debug, Clone)]
pub struct SamplerPlan {
    /// The sampler configuration (TOML).
    pub config: PathBuf,
    /// The setting to solve for.
    pub param: SamplerParam,
    /// Target ε.
    pub target: f64,
    /// Overrides the configuration's δ.
    pub delta: Option<f64>,
    /// The accountants whose smallest sound bound answers (the CLT is shown beside).
    pub accountants: Vec<AccountantKind>,
}

/// `calibrate --sampler`: loads the configuration (defaulted settings noted on stderr) and
/// solves; the report, the terminal text, `calibrate.csv` and `calibrate.json`.
pub fn execute_sampler(plan: &SamplerPlan, progress: &Progress) -> Result<super::Outcome> {
    let path = plan.config.as_path();
    let param = plan.param;
    let mut cfg = SamplerConfig::load(path)?;
    cfg.warn_defaults(path);
    if let Some(d) = plan.delta {
        cfg.delta = d;
    }
    let tick = |x: f64| {
        progress.set_message(format!("{} = {}", param.as_str(), crate::report::num::sig6(x)));
        progress.inc(1);
    };
    let c =
        calibrate_sampler_with(&cfg, param, plan.target, &plan.accountants, &tick).map_err(|e| e.with_file(path))?;
    let detail = serde_json::to_vec_pretty(&SamplerOutput {
        schema_version: SCHEMA_VERSION,
        config: path.display().to_string(),
        calibration: &c,
    })
    .map_err(|e| crate::Error::input(e.to_string()))?;
    let mut csv = String::from("solve_for,answer,value,epsilon,accountant,kind,past_value,past_epsilon\n");
    let row = |csv: &mut String, name: &str, s: &crate::diffusion::calibrate::Search| {
        csv.push_str(&format!(
            "{},{name},{},{},{},{},{},{}\n",
            param.as_str(),
            s.meets.value,
            s.meets.epsilon,
            s.meets.line.accountant.as_str(),
            s.meets.line.kind().map(|k| k.as_str()).unwrap_or(""),
            s.past.as_ref().map(|p| p.value.to_string()).unwrap_or_default(),
            s.past.as_ref().map(|p| p.epsilon.to_string()).unwrap_or_default()
        ));
    };
    row(&mut csv, "sound", &c.sound);
    if let Some(e) = &c.clt {
        row(&mut csv, "clt_estimate", e);
    }
    let text = render_sampler_text(path, &cfg, &c);
    let rep = sampler_report(path, &cfg, &c)?;
    Ok(super::Outcome::new(rep, text)
        .with_table("calibrate.csv", csv.into_bytes())
        .with_file("calibrate.json", detail))
}

/// JSON schema version of `calibrate.json`.
const SCHEMA_VERSION: u32 = 1;

/// JSON document of a sampler calibration.
#[derive(Debug, Serialize)]
struct SamplerOutput<'a> {
    schema_version: u32,
    config: String,
    #[serde(flatten)]
    calibration: &'a SamplerCalibration,
}

fn render_sampler_text(path: &std::path::Path, cfg: &SamplerConfig, c: &SamplerCalibration) -> String {
    use std::fmt::Write as _;
    let f = crate::report::export::fmt_num;
    // ε in full (shortest round-trip): a rounded 8 next to "≤ 8" would hide which side it is on.
    let e = |x: f64| format!("{x}");
    let name = c.param.as_str();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Sampler {} ({}), step convention {}",
        path.display(),
        cfg.schedule.describe(),
        cfg.convention.describe()
    );
    let _ = writeln!(
        s,
        "Target ε = {} at δ = {} ({})",
        f(c.target_epsilon),
        f(c.delta),
        cfg.neighbouring
    );
    let m = &c.sound.meets;
    let _ = writeln!(
        s,
        "{name} = {}  gives ε = {} ≤ target ({}, {}; re-analysed)",
        f(m.value),
        e(m.epsilon),
        m.line.accountant.as_str(),
        m.line.kind().map(|k| k.as_str()).unwrap_or("?")
    );
    match &c.sound.past {
        Some(p) => {
            let _ = writeln!(
                s,
                "  one step past: {name} = {} gives ε = {} > target",
                f(p.value),
                f(p.epsilon)
            );
        }
        None => {
            let _ = writeln!(s, "  the whole range of {name} meets the target");
        }
    }
    match (&c.clt, &c.clt_note) {
        (Some(c_), _) => {
            let _ = writeln!(
                s,
                "CLT estimate (not a guarantee): {name} = {} gives ε ≈ {} ({})",
                f(c_.meets.value),
                e(c_.meets.epsilon),
                c_.meets.line.status
            );
        }
        (None, Some(n)) => {
            let _ = writeln!(s, "CLT estimate: {n}");
        }
        _ => {}
    }
    s
}
