//! Re-deriving a JSON report instead of trusting it (`dpaudit report`).
//!
//! A report read back from JSON may have been edited, truncated or mixed from two runs. Before
//! it is rendered, every status and number that follows from others is derived again and a
//! report that disagrees with itself is refused (exit 2, naming the field):
//!
//! * each verdict: `pass` needs a sound ε (exact or upper bound, never an estimate or a lower
//!   bound) with ε ≤ budget; `margin` must be budget − ε; a `check` budget verdict `fail`
//!   needs ε > budget;
//! * each verdict's ε must be the ε of a result of the same accountant at its δ;
//! * each result of the GDP, RDP or PLD accountant is computed again from the report's own event,
//!   neighbouring relation and δ. GDP and RDP must agree to 0.1 % (relative; a report written by
//!   an earlier dpaudit may differ in its last digits: the shipped
//!   `reports/check-edm-cifar10-subsampled` differs by 3.4e-5). The PLD depends on
//!   discretisation flags a report does not record: it must agree within a factor 1.1. Both are
//!   far tighter than any change of the event (one step against 9,375);
//! * the conclusion's verdict sentence must agree with the verdicts (no `PASS` beside a failed
//!   verdict, no `FAIL` when every verdict passed).

use super::{Report, Status};
use crate::accountants::AccountantKind;
use crate::error::{Error, Result};

fn refuse(field: String, msg: String) -> Error {
    Error::field(
        field,
        format!("{msg}; the report contradicts itself and is not rendered"),
    )
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    if a == b {
        return true;
    }
    if !(a.is_finite() && b.is_finite()) {
        return false;
    }
    (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-300)
}

/// Checks `rep` (see the module docs). `Ok` when every derived value agrees.
pub fn check(rep: &Report) -> Result<()> {
    check_results(rep)?;
    check_verdicts(rep)?;
    check_conclusion(rep)
}

fn check_verdicts(rep: &Report) -> Result<()> {
    for (i, v) in rep.verdicts.iter().enumerate() {
        let f = |name: &str| format!("verdicts[{i}].{name}");
        for (name, x) in [("budget", v.budget), ("epsilon", v.epsilon), ("margin", v.margin)] {
            if x.is_some_and(f64::is_nan) {
                return Err(refuse(f(name), "is NaN".into()));
            }
        }
        if let (Some(b), Some(e)) = (v.budget, v.epsilon) {
            if v.status == Status::Pass && e > b {
                return Err(refuse(
                    f("status"),
                    format!("is pass, but ε = {e} exceeds the budget {b}"),
                ));
            }
            if v.status == Status::Fail && rep.audit == "check" && e <= b {
                return Err(refuse(
                    f("status"),
                    format!("is fail, but ε = {e} is within the budget {b}"),
                ));
            }
            if let Some(m) = v.margin {
                if !close(m, b - e, 1e-9) {
                    return Err(refuse(f("margin"), format!("is {m}, but budget − ε = {}", b - e)));
                }
            }
        }
        // Only budget-style verdicts (with an accountant) are judged on a sound ε.
        if v.status == Status::Pass && v.accountant.is_some() {
            if let Some(k) = v.bound {
                if !k.is_sound() {
                    return Err(refuse(
                        f("bound"),
                        format!("is {}, but a pass needs a sound ε (exact or upper bound)", k.as_str()),
                    ));
                }
            }
        }
        if let (Some(acc), Some(e)) = (v.accountant, v.epsilon) {
            let same: Vec<_> = rep.results.iter().filter(|r| r.accountant == acc).collect();
            if !same.is_empty()
                && v.bound.is_none_or(|k| k.is_sound())
                && !same.iter().any(|r| close(r.epsilon, e, 1e-9))
            {
                return Err(refuse(
                    f("epsilon"),
                    format!(
                        "is {e}, but the report's {} result says ε = {}",
                        acc.as_str(),
                        same[0].epsilon
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn check_results(rep: &Report) -> Result<()> {
    let (Some(event), Some(nb)) = (&rep.event, rep.assumptions.neighbouring) else {
        return Ok(());
    };
    for (i, r) in rep.results.iter().enumerate() {
        let tol = match r.accountant {
            AccountantKind::Gdp | AccountantKind::Rdp => 1e-3,
            AccountantKind::Pld => 0.1,
            _ => continue,
        };
        if !(r.kind.is_sound() && r.delta > 0.0 && r.delta < 1.0) {
            continue;
        }
        // An accountant that cannot account the event here (limits, unsupported) is no evidence.
        let Ok(again) = r.accountant.build().epsilon(event, nb, r.delta) else {
            continue;
        };
        if again.kind != r.kind {
            continue;
        }
        let ok = if r.accountant == AccountantKind::Pld {
            (r.epsilon == again.epsilon)
                || (r.epsilon.is_finite()
                    && again.epsilon.is_finite()
                    && r.epsilon <= (1.0 + tol) * again.epsilon + 1e-9
                    && again.epsilon <= (1.0 + tol) * r.epsilon + 1e-9)
        } else {
            close(r.epsilon, again.epsilon, tol)
        };
        if !ok {
            return Err(refuse(
                format!("results[{i}].epsilon"),
                format!(
                    "{} ε = {} at δ = {}, but the report's own event gives ε = {}",
                    r.accountant.as_str(),
                    r.epsilon,
                    r.delta,
                    again.epsilon
                ),
            ));
        }
    }
    Ok(())
}

fn check_conclusion(rep: &Report) -> Result<()> {
    let Some(c) = &rep.conclusion else {
        return Ok(());
    };
    if rep.verdicts.is_empty() {
        return Ok(());
    }
    let any_fail = rep.verdicts.iter().any(|v| v.status == Status::Fail);
    let all_pass = rep.verdicts.iter().all(|v| v.status == Status::Pass);
    let says = c.verdict.trim_start();
    if says.starts_with("PASS") && !all_pass {
        return Err(refuse(
            "conclusion.verdict".into(),
            "says PASS, but not every verdict passed".into(),
        ));
    }
    if says.starts_with("FAIL") && !any_fail {
        return Err(refuse(
            "conclusion.verdict".into(),
            "says FAIL, but no verdict failed".into(),
        ));
    }
    Ok(())
}
