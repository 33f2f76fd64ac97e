//! What `dpaudit report` derives again with the commands' own rules, after
//! [`consistency::check`] (which knows only the report model):
//!
//! * a budget verdict (`dpaudit check`) is derived again from the results and its budget
//!   ([`super::budget_verdict_of`]), every field and its message;
//! * in a `mia` report, the theoretical limits of the attacks on the checkpoint (ASR, TPR at 1 %
//!   FPR) are derived again from its results, each comparison's measured text from the attacks
//!   table and its outcome from the attack's held-out ASR interval against that limit; every
//!   attack has its comparison, every audit compared with an accounted ε its verdict, and the
//!   one-run verdict rests on the one-run table's largest lower bound. The measurements
//!   themselves (scores, AUC, counts) need the scores: `mia --scores` derives them again.

pub mod consistency;

use crate::accountants::sound;
use crate::accountants::sound::Evidence;
use crate::attacks::mia::{AttackKind, Target};
use crate::error::Result;
use crate::report::num::fmt_num;
use crate::report::{Report, Table};
use consistency::{cell_num, cell_str, close, refuse, same_verdict};

/// Checks `rep` (see the module docs): the mia tables' cells first (the facts the sentences
/// are derived from, so a forged cell is named as such, not as the sentence it contradicts),
/// then the report model's rules, then the budget verdicts.
pub fn check(rep: &Report) -> Result<()> {
    check_mia_tables(rep)?;
    consistency::check(rep)?;
    check_budget_verdicts(rep)
}

/// Each budget verdict (no `source`, a budget; not `verify`'s claims) derived again.
fn check_budget_verdicts(rep: &Report) -> Result<()> {
    if rep.audit == "verify" {
        return Ok(());
    }
    for (i, v) in rep.verdicts.iter().enumerate() {
        let (None, Some(b)) = (v.source(), v.budget) else {
            continue;
        };
        let again = super::budget_verdict_of(rep, &v.subject, b);
        same_verdict(v, &again).map_err(|name| {
            refuse(
                format!("verdicts[{i}].{name}"),
                format!(
                    "does not follow from the report's results and the budget {b}: they give \"{}: {}\"",
                    again.status.shouted(),
                    again.message
                ),
            )
        })?;
    }
    Ok(())
}

/// `mia`: the checkpoint attacks' limits and the comparisons' outcomes (see the module docs).
fn check_mia_tables(rep: &Report) -> Result<()> {
    if rep.audit != "mia" {
        return Ok(());
    }
    let gs: Vec<Evidence> = rep
        .results
        .iter()
        .filter(|r| r.kind.is_sound())
        .map(Evidence::cited)
        .collect();
    let limits = crate::attacks::mia::limits(&gs);
    let col = |t: &Table, name: &str| t.columns.iter().position(|c| c.name == name);
    // Per attack row: "attack at t = N", the held-out ASR interval's lower end, the measured
    // text, the target.
    let mut attack_rows: Vec<(String, f64, String, Option<Target>)> = Vec::new();
    for t in rep.tables.iter().filter(|t| t.id == "attacks" || t.id == "null-test") {
        let (Some(ia), Some(it), Some(ih), Some(il), Some(ip)) = (
            col(t, "attack"),
            col(t, "t"),
            col(t, "ASR held-out"),
            col(t, "ASR limit"),
            col(t, "TPR@1% limit"),
        ) else {
            return Err(refuse(
                format!("tables[{}]", t.id),
                "lacks the columns of an attacks table".into(),
            ));
        };
        for (k, row) in t.rows.iter().enumerate() {
            let attack = cell_str(&row[ia]);
            let Ok(kind) = attack.parse::<AttackKind>() else {
                return Err(refuse(
                    format!("tables[{}].rows[{k}]", t.id),
                    format!("names an unknown attack `{attack}`"),
                ));
            };
            if kind.target() != Target::Checkpoint {
                continue;
            }
            for (ic, want, name) in [
                (il, limits.as_ref().map(|l| l.asr), "ASR limit"),
                (ip, limits.as_ref().map(|l| l.tpr_at_1pct), "TPR@1% limit"),
            ] {
                let ok = match (cell_num(&row[ic]), want) {
                    (Some(x), Some(y)) => close(x, y, 1e-9),
                    (None, None) => true,
                    _ => false,
                };
                if !ok {
                    return Err(refuse(
                        format!("tables[{}].rows[{k}].{name}", t.id),
                        format!(
                            "is {}, but the report's results give {}",
                            cell_str(&row[ic]),
                            want.map_or("no limit".to_string(), |w| w.to_string())
                        ),
                    ));
                }
            }
        }
        if t.id != "attacks" {
            continue;
        }
        // What each attack's comparison row must say it measured (pipeline::evaluate_scores).
        let (Some(io), Some(iu)) = (col(t, "ASR oracle"), col(t, "AUC")) else {
            return Err(refuse(
                "tables[attacks]".into(),
                "lacks the columns ASR oracle, AUC".into(),
            ));
        };
        for (k, row) in t.rows.iter().enumerate() {
            let num = |i: usize| row.get(i).and_then(cell_num);
            let (Some(asr), Some(lo), Some(hi), Some(oracle), Some(auc)) =
                (num(ih), num(ih + 1), num(ih + 2), num(io), num(iu))
            else {
                return Err(refuse(
                    format!("tables[attacks].rows[{k}]"),
                    "lacks a number of the held-out ASR, its interval, the oracle ASR or the AUC".into(),
                ));
            };
            let r4 = |x: f64| fmt_num((x * 1e4).round() / 1e4);
            let measured = format!(
                "empirical ASR at the held-out threshold {} [{}, {}] (oracle {}, AUC {})",
                r4(asr),
                r4(lo),
                r4(hi),
                r4(oracle),
                r4(auc)
            );
            let attack = cell_str(&row[ia]);
            let target = attack.parse::<AttackKind>().map(|a| a.target()).ok();
            attack_rows.push((
                format!("{} at t = {}", attack, cell_str(&row[it])),
                lo,
                measured,
                target,
            ));
        }
    }
    let Some(t) = rep.tables.iter().find(|t| t.id == "comparisons") else {
        return Ok(());
    };
    let (Some(iw), Some(il), Some(io)) = (col(t, "what"), col(t, "limit"), col(t, "outcome")) else {
        return Err(refuse(
            "tables[comparisons]".into(),
            "lacks the columns what, limit, outcome".into(),
        ));
    };
    let Some(im) = col(t, "measured") else {
        return Err(refuse("tables[comparisons]".into(), "lacks the column measured".into()));
    };
    let whats: Vec<String> = t.rows.iter().map(|row| cell_str(&row[iw])).collect();
    if let Some((w, ..)) = attack_rows.iter().find(|(w, ..)| !whats.contains(w)) {
        return Err(refuse(
            "tables[comparisons]".into(),
            format!("has no row for the attack `{w}` of the attacks table"),
        ));
    }
    for (k, row) in t.rows.iter().enumerate() {
        let what = cell_str(&row[iw]);
        let field = |name: &str| format!("tables[comparisons].rows[{k}].{name}");
        let Some((_, lo, measured, target)) = attack_rows.iter().find(|(w, ..)| *w == what) else {
            // An audit's row: its verdict must exist and agree.
            if let Some(limit) = cell_num(&row[il]) {
                let outcome = cell_str(&row[io]);
                let Some(v) = rep.verdicts.iter().find(|v| v.source() == Some(what.as_str())) else {
                    if what.contains(" at t = ") {
                        return Err(refuse(
                            field("what"),
                            format!("`{what}` has no row in the attacks table"),
                        ));
                    }
                    return Err(refuse(field("what"), format!("the audit `{what}` has no verdict")));
                };
                // The one-run audit's lower bound is the largest of its candidates'.
                if what.starts_with("one-run audit") {
                    if let Some(ot) = rep.tables.iter().find(|t| t.id == "one-run") {
                        let best = ot.columns.iter().position(|c| c.name.starts_with("ε lower")).map(|i| {
                            ot.rows
                                .iter()
                                .filter_map(|r| r.get(i).and_then(cell_num))
                                .fold(0.0, f64::max)
                        });
                        if best.is_none_or(|b| v.epsilon().is_none_or(|e| !close(e, b, 1e-9))) {
                            return Err(refuse(
                                field("what"),
                                format!(
                                    "the one-run audit's verdict rests on ε lower bound {}, but the one-run table's largest is {}",
                                    v.epsilon().map_or("none".to_string(), |e| e.to_string()),
                                    best.map_or("none".to_string(), |b| b.to_string())
                                ),
                            ));
                        }
                    }
                }
                let fail = outcome.starts_with("VIOLATION");
                if fail != (v.status == sound::Verdict::Violated) || v.budget.is_none_or(|b| !close(b, limit, 1e-9)) {
                    return Err(refuse(
                        field("outcome"),
                        format!(
                            "says \"{outcome}\" against the limit {limit}, but the audit's verdict is {} against {}",
                            v.status.shouted(),
                            v.budget.map_or("none".to_string(), |b| b.to_string())
                        ),
                    ));
                }
            }
            continue;
        };
        if cell_str(&row[im]) != *measured {
            return Err(refuse(
                field("measured"),
                format!(
                    "says \"{}\", but the attacks table gives \"{measured}\"",
                    cell_str(&row[im])
                ),
            ));
        }
        if *target != Some(Target::Checkpoint) {
            continue;
        }
        let lo = *lo;
        let limit = cell_num(&row[il]);
        let want_limit = limits.as_ref().map(|l| l.asr);
        let same = match (limit, want_limit) {
            (Some(x), Some(y)) => close(x, y, 1e-9),
            (None, None) => true,
            _ => false,
        };
        if !same {
            return Err(refuse(
                field("limit"),
                format!(
                    "is {}, but the report's results give {}",
                    cell_str(&row[il]),
                    want_limit.map_or("no limit".to_string(), |w| w.to_string())
                ),
            ));
        }
        let outcome = cell_str(&row[io]);
        let want = match limit {
            None => "no guarantee",
            Some(l) if lo > l => "above the limit",
            Some(_) => "below the limit",
        };
        if !outcome.starts_with(want) {
            return Err(refuse(
                field("outcome"),
                format!("says \"{outcome}\", but the held-out ASR interval's lower end {lo} against the limit gives \"{want}\""),
            ));
        }
    }
    Ok(())
}
