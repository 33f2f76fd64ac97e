//! `check`: one input accounted against an ε budget — the report, the budget verdict and the δ
//! it was judged at. The CLI gives the loaded input and its flags; everything from δ onwards
//! (accounting, verdict, facts, conclusion inputs) happens here.

use std::path::Path;

use crate::accountants::AccountantKind;
use crate::audit::Input;
use crate::error::{Error, Result};
use crate::report::build::{self, AccountOptions};
use crate::report::{self, progress, Report, Verdict};

/// A validated check of one input.
#[derive(Debug, Clone)]
pub struct Plan<'a> {
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
pub fn run(plan: &Plan<'_>, input: &Input, derivation: &[String]) -> Result<(Report, Verdict, f64)> {
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
    build::account_event(
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
    let subject = format!("ε budget for {}", plan.name);
    let verdict = super::budget_verdict(&mut rep, &subject, plan.budget);
    rep.fact("budget ε", report::export::fmt_num(plan.budget));
    rep.fact("δ", report::export::fmt_num(delta));
    if let Some(e) = verdict.epsilon {
        rep.fact("sound ε", report::export::fmt_num(e));
    }
    if let Some(m) = verdict.margin {
        rep.fact("margin (budget − sound ε)", report::export::fmt_num(m));
    }
    Ok((rep, verdict, delta))
}
