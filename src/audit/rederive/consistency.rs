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
//!
//! What only the commands know (a `check` budget verdict, a `mia` report's attack limits) is
//! derived again by `audit::rederive`, which `dpaudit report` calls after this;
//! * each result of the GDP, RDP or PLD accountant is computed again from the report's own event,
//!   neighbouring relation and δ. GDP and RDP must agree to 0.1 % (relative; a report written by
//!   an earlier dpaudit may differ in its last digits: the shipped
//!   `reports/check-edm-cifar10-subsampled` differs by 3.4e-5). The PLD depends on
//!   discretisation flags a report does not record: it must agree within a factor 1.1. Both are
//!   far tighter than any change of the event (one step against 9,375);
//! * a result of any accountant needs the report's event and neighbouring relation to be derived
//!   again, a δ in (0, 1), and the same kind of number (exact, upper bound, estimate) as the
//!   accountant gives now: a report whose results cannot be derived again is refused, not trusted;
//! * a verdict that names an accountant needs a result of that accountant;
//! * an audit verdict (`mia`, `run`) fails exactly when its ε lower bound exceeds the accounted
//!   ε, which in `mia` must be the report's tightest sound result;
//! * in a `verify` report, each claim's verdict must follow its evidence (`holds`: an exact value or
//!   upper bound ≤ the claim; `violated`: an exact value or lower bound above it), agree with the
//!   claims table, and its evidence must be one of the claim's analyses;
//! * the conclusion, for every command whose conclusion is derived from the report's content
//!   (all but `sweep`, `train`, `run` and `calibrate`), must be the one derived again, sentence by
//!   sentence; for the others its verdict sentence must agree with the verdicts (no `PASS` beside
//!   a failed verdict, no `FAIL` when every verdict passed, in any letter case).

use crate::accountants::sound;
use crate::accountants::{AccountantKind, BoundKind};
use crate::error::{Error, Result};
use crate::events::DpEvent;
use crate::report::{Cell, Report, Table};

/// The error for a report that contradicts itself at `field`.
pub fn refuse(field: String, msg: String) -> Error {
    Error::field(
        field,
        format!("{msg}; the report contradicts itself and is not rendered"),
    )
}

/// `a` and `b` equal to `rel` (relative), or both the same non-finite value.
pub fn close(a: f64, b: f64, rel: f64) -> bool {
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
    check_verify_tables(rep)?;
    check_conclusion(rep)
}

fn check_verdicts(rep: &Report) -> Result<()> {
    for (i, v) in rep.verdicts.iter().enumerate() {
        let f = |name: &str| format!("verdicts[{i}].{name}");
        for (name, x) in [("budget", v.budget), ("epsilon", v.epsilon()), ("margin", v.margin)] {
            if x.is_some_and(f64::is_nan) {
                return Err(refuse(f(name), "is NaN".into()));
            }
        }
        if let (Some(b), Some(e)) = (v.budget, v.epsilon()) {
            if v.status == sound::Verdict::Holds && e > b {
                return Err(refuse(
                    f("status"),
                    format!("is pass, but ε = {e} exceeds the budget {b}"),
                ));
            }
            if v.status == sound::Verdict::Violated && rep.audit == "check" && e <= b {
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
        if v.status == sound::Verdict::Holds && v.accountant().is_some() {
            if let Some(k) = v.bound() {
                if !k.is_sound() {
                    return Err(refuse(
                        f("bound"),
                        format!("is {}, but a pass needs a sound ε (exact or upper bound)", k.as_str()),
                    ));
                }
            }
        }
        // An audit's verdict (an ε lower bound against an accounted ε): fail exactly when the
        // lower bound exceeds it; in `mia`, the accounted ε is the report's tightest sound result.
        if v.bound() == Some(BoundKind::LowerBound) && rep.audit != "verify" {
            let (Some(b), Some(e)) = (v.budget, v.epsilon()) else {
                return Err(refuse(
                    f("epsilon"),
                    "an audit verdict needs its lower bound and the accounted ε".into(),
                ));
            };
            let want = if e > b {
                sound::Verdict::Violated
            } else {
                sound::Verdict::Holds
            };
            if v.status != want {
                return Err(refuse(
                    f("status"),
                    format!(
                        "is {}, but the ε lower bound {e} against the accounted ε {b} gives {}",
                        v.status.shouted(),
                        want.shouted()
                    ),
                ));
            }
            if rep.audit == "mia" {
                let sound = rep.sound_epsilon().map(|r| r.epsilon);
                if sound.is_none_or(|s| !close(s, b, 1e-9)) {
                    return Err(refuse(
                        f("budget"),
                        format!(
                            "is {b}, but the report's tightest sound result is {}",
                            sound.map_or("none".to_string(), |s| s.to_string())
                        ),
                    ));
                }
            }
        }
        if v.status == sound::Verdict::Holds
            && v.epsilon().is_none()
            && (v.accountant().is_some() || v.budget.is_some())
        {
            return Err(refuse(
                f("epsilon"),
                "is missing, but a pass needs the sound ε it rests on".into(),
            ));
        }
        if let (Some(acc), Some(e)) = (v.accountant(), v.epsilon()) {
            let same: Vec<_> = rep.results.iter().filter(|r| r.is_from(acc)).collect();
            if same.is_empty() && rep.audit != "verify" {
                return Err(refuse(
                    f("accountant"),
                    format!("names {}, but the report has no {} result", acc.as_str(), acc.as_str()),
                ));
            }
            if !same.is_empty()
                && v.bound().is_none_or(|k| k.is_sound())
                && !same
                    .iter()
                    .any(|r| close(r.epsilon, e, 1e-9) && v.bound().is_none_or(|k| k == r.kind))
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

/// The first field in which `v` differs from the verdict derived again (numbers to 1e-9).
pub(crate) fn same_verdict(
    v: &crate::report::Verdict,
    again: &crate::report::Verdict,
) -> std::result::Result<(), &'static str> {
    let num = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(x), Some(y)) => close(x, y, 1e-9),
        (None, None) => true,
        _ => false,
    };
    let diffs = [
        ("status", v.status == again.status),
        ("epsilon", num(v.epsilon(), again.epsilon())),
        ("delta", num(v.delta(), again.delta())),
        ("accountant", v.accountant() == again.accountant()),
        ("bound", v.bound() == again.bound()),
        ("margin", num(v.margin, again.margin)),
        ("message", v.message == again.message),
    ];
    match diffs.iter().find(|(_, same)| !same) {
        Some((name, _)) => Err(name),
        None => Ok(()),
    }
}

/// `ev` with every Poisson sampling step replaced by the event it samples for (full batch).
fn full_batch(ev: &DpEvent) -> DpEvent {
    match ev {
        DpEvent::PoissonSampled { event, .. } => full_batch(event),
        DpEvent::Composed { events } => DpEvent::Composed {
            events: events.iter().map(full_batch).collect(),
        },
        DpEvent::SelfComposed { event, count } => DpEvent::SelfComposed {
            event: Box::new(full_batch(event)),
            count: *count,
        },
        other => other.clone(),
    }
}

fn check_results(rep: &Report) -> Result<()> {
    for (i, r) in rep.results.iter().enumerate() {
        let field = |name: &str| format!("results[{i}].{name}");
        let who = r.source();
        if !(r.delta > 0.0 && r.delta < 1.0) {
            return Err(refuse(
                field("delta"),
                format!("{who} δ = {} is not in (0, 1)", r.delta),
            ));
        }
        if r.epsilon.is_nan() {
            return Err(refuse(field("epsilon"), format!("{who} ε is NaN")));
        }
        let (Some(event), Some(nb)) = (&rep.event, rep.assumptions.neighbouring) else {
            return Err(refuse(
                field("epsilon"),
                format!(
                    "{who} ε = {} cannot be derived again: the report has no {}",
                    r.epsilon,
                    if rep.event.is_none() {
                        "event"
                    } else {
                        "neighbouring relation (assumptions.neighbouring)"
                    }
                ),
            ));
        };
        // A guarantee that ignores subsampling amplification (`mia`'s checkpoint ledger, `analyze`
        // at p < 1): derived again the same way.
        let no_amplification = r.details.contains_key("no_amplification");
        let Some(acc) = r.accountant else {
            return Err(refuse(
                field("accountant"),
                format!(
                    "{who} ε = {} names no accountant, so it cannot be derived again",
                    r.epsilon
                ),
            ));
        };
        let again = if no_amplification {
            // The same accountant on the event with its Poisson sampling removed: a sound upper
            // bound (subsampling only adds privacy, C_p(G_μ) ≥ G_μ), labelled as one.
            acc.build().epsilon(&full_batch(event), nb, r.delta).map(|mut a| {
                a.kind = BoundKind::UpperBound;
                a
            })
        } else {
            acc.build().epsilon(event, nb, r.delta)
        };
        let again = again.map_err(|e| {
            refuse(
                field("epsilon"),
                format!(
                    "{who} ε = {} at δ = {}, but the report's own event cannot be accounted by {who} ({})",
                    r.epsilon, r.delta, e.message
                ),
            )
        })?;
        // An exact value reported as an upper bound is still sound (an over-approximating event).
        if again.kind != r.kind && !(again.kind == BoundKind::Exact && r.kind == BoundKind::UpperBound) {
            return Err(refuse(
                field("kind"),
                format!(
                    "is {}, but {who} gives {} for the report's own event",
                    r.kind.as_str(),
                    again.kind.as_str()
                ),
            ));
        }
        let ok = if r.is_from(AccountantKind::Pld) {
            // The PLD depends on discretisation flags a report does not record.
            let tol = 0.1;
            (r.epsilon == again.epsilon)
                || (r.epsilon.is_finite()
                    && again.epsilon.is_finite()
                    && r.epsilon <= (1.0 + tol) * again.epsilon + 1e-9
                    && again.epsilon <= (1.0 + tol) * r.epsilon + 1e-9)
        } else {
            close(r.epsilon, again.epsilon, 1e-3)
        };
        if !ok {
            return Err(refuse(
                field("epsilon"),
                format!(
                    "{who} ε = {} at δ = {}, but the report's own event gives ε = {}",
                    r.epsilon, r.delta, again.epsilon
                ),
            ));
        }
    }
    Ok(())
}

/// Commands whose conclusion is not [`crate::report::conclusion::derive`] of the report (they write their
/// own from what they computed).
const OWN_CONCLUSION: [&str; 4] = ["sweep", "train", "run", "calibrate"];

fn check_conclusion(rep: &Report) -> Result<()> {
    let Some(c) = &rep.conclusion else {
        return Ok(());
    };
    if !OWN_CONCLUSION.contains(&rep.audit.as_str()) {
        let again = crate::report::conclusion::derive(rep);
        for (name, stored, derived) in [
            ("audited", &c.audited, &again.audited),
            ("guarantee", &c.guarantee, &again.guarantee),
            ("verdict", &c.verdict, &again.verdict),
            ("estimates", &c.estimates, &again.estimates),
        ] {
            if stored != derived {
                return Err(refuse(
                    format!("conclusion.{name}"),
                    format!("says \"{stored}\", but the report's own content gives \"{derived}\""),
                ));
            }
        }
        return Ok(());
    }
    if rep.verdicts.is_empty() {
        return Ok(());
    }
    let any_fail = rep.verdicts.iter().any(|v| v.status == sound::Verdict::Violated);
    let all_pass = rep.verdicts.iter().all(|v| v.status == sound::Verdict::Holds);
    let says = c.verdict.trim_start().to_uppercase();
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

/// A number cell's value (integers too).
pub(crate) fn cell_num(c: &Cell) -> Option<f64> {
    match c {
        Cell::Num(x) => Some(*x),
        Cell::Int(i) => Some(*i as f64),
        _ => None,
    }
}

/// A cell as text.
pub(crate) fn cell_str(c: &Cell) -> String {
    match c {
        Cell::Text(t) => t.clone(),
        Cell::Int(i) => i.to_string(),
        Cell::Num(x) => x.to_string(),
        Cell::Empty => String::new(),
    }
}

/// `verify`: each verdict against its claims row and the claim's analyses (see the module docs).
fn check_verify_tables(rep: &Report) -> Result<()> {
    if rep.audit != "verify" {
        return Ok(());
    }
    let table = |id: &str| rep.tables.iter().find(|t| t.id == id);
    let (Some(claims), Some(analyses)) = (table("claims"), table("analyses")) else {
        return Err(refuse(
            "tables".into(),
            "a verify report needs its claims and analyses tables".into(),
        ));
    };
    let col = |t: &Table, name: &str| {
        t.columns
            .iter()
            .position(|c| c.name == name)
            .ok_or_else(|| refuse(format!("tables[{}]", t.id), format!("lacks the column `{name}`")))
    };
    let (cc, cv, ce, ca, ck, cb) = (
        col(claims, "claim")?,
        col(claims, "verdict")?,
        col(claims, "evidence ε")?,
        col(claims, "accountant")?,
        col(claims, "kind")?,
        col(claims, "claimed ε")?,
    );
    let (ac, ae, aa, ak) = (
        col(analyses, "claim")?,
        col(analyses, "ε")?,
        col(analyses, "accountant")?,
        col(analyses, "kind")?,
    );
    for (i, v) in rep.verdicts.iter().enumerate() {
        let f = |name: &str| format!("verdicts[{i}].{name}");
        let id = v.subject.rsplit_once(" (").map_or(v.subject.as_str(), |(id, _)| id);
        let Some(row) = claims.rows.iter().find(|r| cell_str(&r[cc]) == id) else {
            return Err(refuse(
                f("subject"),
                format!("names the claim `{id}`, which the claims table does not list"),
            ));
        };
        let word = v.status.as_str();
        let kind = v.bound().map(|k| k.as_str().to_string()).unwrap_or_default();
        let source = v
            .accountant()
            .map(|a| a.as_str().to_string())
            .or_else(|| v.source().map(String::from))
            .unwrap_or_default();
        let num_eq = |c: &Cell, x: Option<f64>| match (cell_num(c), x) {
            (Some(a), Some(b)) => close(a, b, 1e-12),
            (None, None) => true,
            _ => false,
        };
        if cell_str(&row[cv]) != word
            || !num_eq(&row[ce], v.epsilon())
            || !num_eq(&row[cb], v.budget)
            || cell_str(&row[ck]) != kind
            || cell_str(&row[ca]) != source
        {
            return Err(refuse(
                f("status"),
                format!(
                    "is {word} on ε = {:?} ({source}, {kind}), but the claims table's row for `{id}` differs",
                    v.epsilon()
                ),
            ));
        }
        let (Some(e), Some(b)) = (v.epsilon(), v.budget) else {
            if matches!(v.status, sound::Verdict::Holds | sound::Verdict::Violated) {
                return Err(refuse(
                    f("epsilon"),
                    "a holds or violated verdict needs its evidence ε and the claimed ε".into(),
                ));
            }
            continue;
        };
        let upper = matches!(v.bound(), Some(BoundKind::Exact | BoundKind::UpperBound));
        let lower = matches!(v.bound(), Some(BoundKind::Exact | BoundKind::LowerBound));
        let follows = match v.status {
            sound::Verdict::Holds => upper && e <= b,
            sound::Verdict::Violated => lower && e > b,
            sound::Verdict::NotDemonstrated | sound::Verdict::Unanswered => true,
        };
        if !follows {
            return Err(refuse(
                f("status"),
                format!("is {word}, but its evidence ε = {e} ({kind}) against the claimed ε = {b} does not show it"),
            ));
        }
        let found = analyses.rows.iter().any(|r| {
            cell_str(&r[ac]) == id && num_eq(&r[ae], Some(e)) && cell_str(&r[ak]) == kind && cell_str(&r[aa]) == source
        });
        if !found {
            return Err(refuse(
                f("epsilon"),
                format!("rests on ε = {e} ({source}, {kind}), which is not one of the analyses of `{id}`"),
            ));
        }
    }
    Ok(())
}
