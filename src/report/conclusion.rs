//! The plain-language conclusion every report opens with: what was audited, the guarantee,
//! the verdict, and which numbers are estimates rather than guarantees.

use serde::{Deserialize, Serialize};

use super::num::fmt_num;
use super::{Cell, Report, Table};
use crate::accountants::sound;
use crate::accountants::{tradeoff, BoundKind};

/// Four sentences a reviewer reads first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Conclusion {
    /// What was audited.
    pub audited: String,
    /// The guarantee shown (a sound bound), or that none was shown.
    pub guarantee: String,
    /// The verdict on the budget or claims, or that none was checked.
    pub verdict: String,
    /// Which numbers are estimates or measurements, not guarantees.
    pub estimates: String,
}

fn kind_words(k: BoundKind) -> &'static str {
    k.noun_phrase()
}

/// What the report's guarantee rests on, for the "under: …" clause: the neighbouring relation,
/// the sampling, the step convention and every privacy setting left at its default.
pub fn under(r: &Report) -> String {
    let mut parts = Vec::new();
    match r.assumptions.neighbouring {
        Some(n) => parts.push(format!("{n} neighbouring datasets")),
        None => parts.push("the input's neighbouring relation".to_string()),
    }
    if let Some(s) = &r.assumptions.sampling {
        parts.push(format!("sampling: {s}"));
    }
    if let Some(c) = &r.assumptions.step_convention {
        parts.push(format!("step convention: {c}"));
    }
    for w in r.warnings.iter().filter(|w| w.code.starts_with("defaulted_")) {
        parts.push(format!(
            "default {}",
            w.message.split(';').next().unwrap_or(&w.message).trim()
        ));
    }
    for w in r.warnings.iter().filter(|w| w.code == "subsampled_normalisation") {
        parts.push(w.message.split(':').next().unwrap_or(&w.message).trim().to_string());
    }
    parts.join("; ")
}

/// The one line of scale a stated (ε, δ) guarantee carries: what it allows a membership-inference
/// attacker (Kairouz, Oh & Viswanath 2015, Thm 2.1; see `accountants::tradeoff`).
pub fn scale(epsilon: f64, delta: f64) -> String {
    format!(
        "What it allows an attacker: membership accuracy ≤ {}, TPR at 1 % FPR ≤ {}.",
        fmt_num(tradeoff::asr_limit_eps_delta(epsilon, delta)),
        fmt_num(tradeoff::tpr_limit_eps_delta(epsilon, delta, 0.01))
    )
}

/// What the report's sound numbers are about, as the subject of the guarantee sentence.
fn subject(r: &Report) -> String {
    let mechanism = r.sound_epsilon().and_then(|s| s.mechanism.clone());
    match (r.audit.as_str(), mechanism) {
        (_, Some(m)) => format!("The {m}"),
        ("run", _) => "The run".into(),
        ("train", _) => "The training run".into(),
        _ => "The pipeline".into(),
    }
}

fn cell_text(c: &Cell) -> String {
    match c {
        Cell::Int(i) => i.to_string(),
        Cell::Num(x) => fmt_num(*x),
        Cell::Text(t) => t.clone(),
        Cell::Empty => String::new(),
    }
}

/// The column `name` of `table`, per row.
fn column<'a>(t: &'a Table, name: &str) -> Option<Vec<&'a Cell>> {
    let i = t.columns.iter().position(|c| c.name == name)?;
    Some(t.rows.iter().filter_map(|row| row.get(i)).collect())
}

/// The outcome of every comparison in a `comparisons` table (measured number against the
/// guarantee of the mechanism it attacks), grouped by outcome.
fn comparisons_sentence(t: &Table) -> Option<String> {
    let what = column(t, "what")?;
    let outcome = column(t, "outcome")?;
    if what.is_empty() {
        return None;
    }
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for (w, o) in what.iter().zip(&outcome) {
        let o = cell_text(o);
        let w = cell_text(w);
        match groups.iter_mut().find(|(k, _)| *k == o) {
            Some((_, v)) => v.push(w),
            None => groups.push((o, vec![w])),
        }
    }
    let parts: Vec<String> = groups
        .iter()
        .map(|(o, ws)| format!("{o} ({}): {}", ws.len(), ws.join(", ")))
        .collect();
    Some(format!(
        "{} comparisons of a measured number with the guarantee of the mechanism it attacks — {}.",
        what.len(),
        parts.join("; ")
    ))
}

/// Estimates (and data-dependent numbers) listed in the report's tables: every row of a table
/// with a `kind` column whose kind is not a guarantee.
fn table_estimates(r: &Report) -> Vec<String> {
    let mut out = Vec::new();
    for t in &r.tables {
        let Some(kinds) = column(t, "kind") else { continue };
        let eps = column(t, "ε").or_else(|| column(t, "epsilon"));
        let who = column(t, "accountant").or_else(|| column(t, "method"));
        let first = column(t, &t.columns[0].name);
        for (i, k) in kinds.iter().enumerate() {
            let k = cell_text(k);
            if k != BoundKind::Estimate.as_str() && k != BoundKind::DataDependent.as_str() {
                continue;
            }
            let mut label = String::new();
            if let Some(f) = &first {
                label.push_str(&cell_text(f[i]));
            }
            if let Some(w) = &who {
                label = format!("{label} {}", cell_text(w[i])).trim().to_string();
            }
            if let Some(e) = &eps {
                label = format!("{label} (ε = {})", cell_text(e[i]));
            }
            if !out.contains(&label) {
                out.push(label);
            }
        }
    }
    out
}

/// The attacks table's number in column `name` of row `i`.
fn num_at(t: &Table, name: &str, i: usize) -> Option<f64> {
    let j = t.columns.iter().position(|c| c.name == name)?;
    match t.rows.get(i)?.get(j)? {
        Cell::Num(x) => Some(*x),
        Cell::Int(x) => Some(*x as f64),
        _ => None,
    }
}

/// Whether an attack of the attacks table attacks the trained checkpoint (every attack but the
/// one on the empirical-denoiser sampler).
fn attacks_checkpoint(name: &str) -> bool {
    name != "empirical"
}

/// TPR at 0.1 % FPR from which the conclusion calls members identifiable.
pub(crate) const IDENTIFIABLE_TPR: f64 = 0.9;

/// The measured result of a membership-inference report, from its attacks table: the strongest
/// attack (largest AUC) with its interval and TPR at low FPR, and what that means: members
/// identifiable (TPR at 0.1 % FPR ≥ 0.9), a signal above chance (AUC interval above 0.5), or
/// none distinguishable from chance.
fn measured_sentence(r: &Report) -> Option<String> {
    let t = r.tables.iter().find(|t| t.id == "attacks")?;
    let names = column(t, "attack")?;
    let steps = column(t, "t")?;
    let auc = |i| num_at(t, "AUC", i).unwrap_or(f64::NAN);
    let mut parts = Vec::new();
    for (on_checkpoint, target) in [(true, "the checkpoint"), (false, "the empirical-denoiser sampler")] {
        let Some(best) = (0..t.rows.len())
            .filter(|&i| attacks_checkpoint(&cell_text(names[i])) == on_checkpoint)
            .max_by(|&a, &b| auc(a).total_cmp(&auc(b)))
        else {
            continue;
        };
        let (a, lo, hi) = (auc(best), num_at(t, "AUC lo", best)?, num_at(t, "AUC hi", best)?);
        let (tpr1, tpr01) = (num_at(t, "TPR@1%FPR", best)?, num_at(t, "TPR@0.1%FPR", best)?);
        let pct = |x: f64| fmt_num((x * 1000.0).round() / 10.0);
        let meaning = if tpr01 >= IDENTIFIABLE_TPR {
            format!(
                "members identifiable: at 0.1 % false positives the attack flags {} % of the members",
                pct(tpr01)
            )
        } else if lo > 0.5 {
            format!(
                "membership leaks: the AUC interval lies above chance (0.5), though at 0.1 % false positives the attack flags only {} % of the members",
                pct(tpr01)
            )
        } else {
            "no membership signal distinguishable from chance at this sample size: the AUC interval includes 0.5"
                .to_string()
        };
        parts.push(format!(
            "Measured on {target}: the strongest attack, {} at t = {}, has AUC {a:.2} [{lo:.2}, {hi:.2}], TPR {tpr1:.2} at 1 % FPR and {tpr01:.2} at 0.1 % FPR: {meaning}.",
            cell_text(names[best]),
            cell_text(steps[best]),
        ));
    }
    (!parts.is_empty()).then(|| parts.join(" "))
}

/// The attacker line of a membership-inference report: the limits its comparisons use (the
/// attacks table's `ASR limit` and `TPR@1% limit` of the checkpoint's attacks), so that the
/// Guarantee and every comparison state one limit.
fn attack_limits_line(r: &Report) -> Option<String> {
    let t = r.tables.iter().find(|t| t.id == "attacks")?;
    let names = column(t, "attack")?;
    let i =
        (0..t.rows.len()).find(|&i| attacks_checkpoint(&cell_text(names[i])) && num_at(t, "ASR limit", i).is_some())?;
    Some(format!(
        "What it allows an attacker (the limit every comparison below uses): membership accuracy ≤ {}, TPR at 1 % FPR ≤ {}.",
        fmt_num(num_at(t, "ASR limit", i)?),
        fmt_num(num_at(t, "TPR@1% limit", i)?)
    ))
}

/// The audits' sentence: each audit's ε lower bound with its threat model (white-box: every
/// noisy update seen; black-box: the released model only) against the accounted ε, and one
/// sentence on whether the training is consistent with its ledger.
fn audit_sentence(r: &Report) -> Option<String> {
    let audits: Vec<&super::Verdict> = r
        .verdicts
        .iter()
        .filter(|v| v.bound() == Some(BoundKind::LowerBound) && v.source().is_some_and(|s| s.contains("audit")))
        .collect();
    let first = audits.first()?;
    let parts: Vec<String> = audits
        .iter()
        .map(|v| {
            let src = v.source().unwrap_or("audit");
            let threat = if src.contains("white-box") {
                "white-box"
            } else {
                "black-box"
            };
            let name = src.split(" (").next().unwrap_or(src);
            format!(
                "{name} ({threat}) ε ≥ {}",
                v.epsilon().map_or("none".to_string(), fmt_num)
            )
        })
        .collect();
    let ledger = first.budget.map_or(String::new(), |b| format!(" {}", fmt_num(b)));
    let fail = audits.iter().any(|v| v.status == sound::Verdict::Violated);
    let weak = audits.iter().all(|v| v.status.status_word() == "inconclusive");
    Some(format!(
        "Audits: {}, against the accounted ε{ledger}. {}",
        parts.join("; "),
        if fail {
            "The training does not deliver its ledger: an audit's lower bound exceeds the accounted ε."
        } else if weak {
            "Not demonstrated either way: no audit here could have shown an ε as large as the accounted one, so none tests the ledger."
        } else {
            "The training is consistent with its ledger: no audit's lower bound exceeds the accounted ε."
        }
    ))
}

/// The models that verdicts rest on: every row of the `checks` table whose check is named
/// `*_model` states the model its claim's verdicts are about (e.g. `per_step_gaussian_model`:
/// the per-step Gaussian model of a diffusion sampler, whose worst-case pair is not shown
/// attainable by the real mechanism). One sentence per stated model, naming how many of the
/// report's FAIL verdicts rest on it (a lower bound of the model, not of the mechanism), so a
/// conclusion never reads as a verdict about the real mechanism where it is one about a stated
/// abstraction.
fn model_sentence(r: &Report) -> Option<String> {
    let t = r.tables.iter().find(|t| t.id == "checks")?;
    let (claims, checks, messages) = (column(t, "claim")?, column(t, "check")?, column(t, "message")?);
    let mut models: Vec<(String, Vec<String>)> = Vec::new();
    for ((c, k), m) in claims.iter().zip(&checks).zip(&messages) {
        if !cell_text(k).ends_with("_model") {
            continue;
        }
        let (c, m) = (cell_text(c), cell_text(m));
        match models.iter_mut().find(|(x, _)| *x == m) {
            Some((_, v)) => v.push(c),
            None => models.push((m, vec![c])),
        }
    }
    let mut out = Vec::new();
    for (model, claims) in models {
        let about = |v: &super::Verdict| {
            claims
                .iter()
                .any(|c| v.subject == *c || v.subject.starts_with(&format!("{c} (")))
        };
        let fail = r
            .verdicts
            .iter()
            .filter(|v| v.status == sound::Verdict::Violated && about(v))
            .count();
        if fail == 0 {
            continue;
        }
        out.push(format!(
            "{fail} of the FAIL verdicts {} about a stated model, not shown for the real mechanism: {}.",
            if fail == 1 { "is a verdict" } else { "are verdicts" },
            model.trim_end_matches('.')
        ));
    }
    (!out.is_empty()).then(|| out.join(" "))
}

/// Derives the conclusion from a report's content: every sentence is computed from the
/// report's own results, verdicts and tables.
pub fn derive(r: &Report) -> Conclusion {
    let audited = if r.inputs.is_empty() {
        format!("{}.", r.title.trim_end_matches('.'))
    } else {
        let inputs: Vec<String> = r.inputs.iter().map(|i| format!("{} `{}`", i.role, i.path)).collect();
        format!("{} (from {}).", r.title.trim_end_matches('.'), inputs.join(", "))
    };
    let guarantee = match r.sound_epsilon() {
        Some(s) if s.epsilon.is_infinite() && !s.non_private_note().is_empty() => format!(
            "{} has no differential-privacy guarantee: ε = ∞ at every δ < 1 ({} from the {} accountant){}.",
            subject(r),
            kind_words(s.kind),
            s.source(),
            s.non_private_note()
        ),
        Some(s) => format!(
            "{} is (ε = {}, δ = {})-differentially private under: {}: {} from the {} accountant. {}",
            subject(r),
            fmt_num(s.epsilon),
            fmt_num(s.delta),
            under(r),
            kind_words(s.kind),
            s.source(),
            attack_limits_line(r).unwrap_or_else(|| scale(s.epsilon, s.delta))
        ),
        None if r.audit == "mia" && r.tables.iter().any(|t| t.id == "attacks") => {
            "No privacy guarantee applies to the attacked model: the report holds no accounted ε for it, so no limit bounds the attacks.".into()
        }
        None if r.event.is_some() => {
            "No guarantee was shown: no sound accountant (exact value or upper bound) could account this event.".into()
        }
        None if !r.verdicts.is_empty() => {
            "Each subject is judged below on its own evidence: holds on a sound upper bound (an exact value or an upper bound), violated on a sound lower bound (an exact value or a lower bound), otherwise not demonstrated.".into()
        }
        None => "This report computes no privacy guarantee.".into(),
    };
    let comparisons = r
        .tables
        .iter()
        .find(|t| t.id == "comparisons")
        .and_then(comparisons_sentence);
    let verdict = match (r.verdicts.as_slice(), comparisons) {
        ([], Some(c)) => c,
        ([], None) => "No budget or claim was checked, so there is no verdict.".into(),
        ([v], _) => format!("{}: {}", v.status.shouted(), v.message.trim_end_matches('.')) + ".",
        (vs, _) => {
            let n = |s: &str| vs.iter().filter(|v| v.status.status_word() == s).count();
            format!(
                "{} subjects: {} PASS, {} FAIL, {} INCONCLUSIVE (not demonstrated either way).",
                vs.len(),
                n("pass"),
                n("fail"),
                n("inconclusive")
            )
        }
    };
    let verdict = match model_sentence(r) {
        Some(m) => format!("{verdict} {m}"),
        None => verdict,
    };
    let verdict = match audit_sentence(r) {
        Some(a) => format!("{verdict} {a}"),
        None => verdict,
    };
    let verdict = match measured_sentence(r) {
        Some(m) => format!("{verdict} {m}"),
        None => verdict,
    };
    let mut estimates: Vec<String> = r
        .results
        .iter()
        .filter(|x| matches!(x.kind, BoundKind::Estimate | BoundKind::DataDependent))
        .map(|x| format!("{} (ε = {})", x.source(), fmt_num(x.epsilon)))
        .collect();
    for e in table_estimates(r) {
        if !estimates.contains(&e) {
            estimates.push(e);
        }
    }
    let measured = r.tables.iter().any(|t| t.id == "attacks" || t.id == "audits");
    let labelled_tables = r.tables.iter().any(|t| column(t, "kind").is_some());
    let mut estimates = if estimates.is_empty() {
        if r.results.is_empty() && labelled_tables {
            "The accountant numbers are in the tables, each labelled with its kind; none is an estimate.".into()
        } else if r.results.is_empty() && !measured {
            "No accountant numbers appear in this report.".into()
        } else if r.results.is_empty() {
            "No accountant number here is an estimate.".into()
        } else {
            "Every accountant number here is an exact value or an upper bound; none is an estimate.".into()
        }
    } else {
        format!(
            "{} {} an estimate, not a guarantee, and never decides a verdict.",
            estimates.join(", "),
            if estimates.len() == 1 { "is" } else { "are each" }
        )
    };
    if measured {
        estimates.push_str(" Attack and audit numbers are measurements on this data, not guarantees.");
    }
    Conclusion {
        audited,
        guarantee,
        verdict,
        estimates,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accountants::{AccountantKind, Evidence};

    #[test]
    fn names_the_sound_bound_and_the_estimate() {
        let mut r = Report::new("Privacy budget check: x.toml", "dpaudit check x.toml");
        r.results
            .push(Evidence::of(AccountantKind::Clt, 0.5, 1e-5, BoundKind::Estimate));
        r.results
            .push(Evidence::of(AccountantKind::Pld, 0.8, 1e-5, BoundKind::UpperBound));
        let c = derive(&r);
        assert!(
            c.guarantee.contains("ε = 0.8") && c.guarantee.contains("pld"),
            "{}",
            c.guarantee
        );
        assert!(c.estimates.contains("clt (ε = 0.5) is an estimate"), "{}", c.estimates);
        assert!(c.verdict.contains("no verdict"), "{}", c.verdict);
    }
}
