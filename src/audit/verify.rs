//! `verify`: every published claim judged under each interpretation, as one [`Report`] with a
//! verdict per claim (PASS holds, FAIL violated, INCONCLUSIVE not demonstrated).

use std::fmt::Write as _;
use std::path::PathBuf;

use serde::Serialize;

use crate::accountants::sound;
use crate::config::claims::ClaimsFile;
use crate::error::Result;
use crate::pipelines::{self, ClaimResult, Verdict};
use crate::report::num::sig6;
use crate::report::progress::Progress;
use crate::report::{self, Cell, Column, Report, Table};

/// The serialised result of a verify run.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyOutput {
    /// The claims files read.
    pub files: Vec<String>,
    /// One result per claim.
    pub claims: Vec<ClaimResult>,
    /// Counts per verdict.
    pub summary: Summary,
}

/// Counts of verdicts (under each claim's stated interpretation).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    /// Claims that hold.
    pub holds: usize,
    /// Claims violated (a lower-bound witness exceeds them).
    pub violated: usize,
    /// Claims neither shown to hold nor violated.
    pub not_demonstrated: usize,
    /// Claims that hold under the stated interpretation but not under every other one.
    pub holds_not_under_every_interpretation: usize,
}

/// A validated `verify` request.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Claims files.
    pub claims: Vec<PathBuf>,
    /// A claim that holds under the paper's interpretation but not under some other also counts
    /// as violated.
    pub strict: bool,
}

/// `verify`: judges every claim; returns the report, the terminal text, `verify.csv` (one row
/// per claim, interpretation and analysis: the main table), `verify.json`, and the status:
/// violated when a claim is violated (or, with `strict`, fails under another interpretation),
/// else not demonstrated when a claim is neither shown to hold nor violated, else ok.
pub fn execute(plan: &Plan, progress: &Progress) -> Result<super::Outcome> {
    let (out, rep) = run(&plan.claims, progress)?;
    let detail = serde_json::to_vec_pretty(&out).map_err(|e| crate::Error::input(e.to_string()))?;
    let s = &out.summary;
    let status = if s.violated > 0 || (plan.strict && s.holds_not_under_every_interpretation > 0) {
        sound::Verdict::Violated
    } else if s.not_demonstrated > 0 {
        sound::Verdict::NotDemonstrated
    } else {
        sound::Verdict::Holds
    };
    let csv = csv_rows(&out)?;
    Ok(super::Outcome::new(rep, text(&out))
        .with_table("verify.csv", csv)
        .with_file("verify.json", detail)
        .with_status(status))
}

/// Reads and judges every claims file; returns the detailed output and its report (with its
/// conclusion).
pub fn run(paths: &[PathBuf], progress: &Progress) -> Result<(VerifyOutput, Report)> {
    let mut claims = Vec::new();
    let mut files = Vec::new();
    // Every file is read first: progress counts claims, the unit of work.
    let loaded = paths
        .iter()
        .map(|p| ClaimsFile::load(p).map(|f| (p, f)))
        .collect::<Result<Vec<_>>>()?;
    progress.set_length(loaded.iter().map(|(_, f)| f.claim_count() as u64).sum());
    for (p, f) in &loaded {
        progress.set_message(p.display().to_string());
        let res = pipelines::verify_claims_with(f, &|| progress.inc(1)).map_err(|e| e.with_file(p))?;
        claims.extend(res);
        files.push(p.display().to_string());
    }
    let mut summary = Summary::default();
    for c in &claims {
        match c.verdict {
            Verdict::Holds => summary.holds += 1,
            Verdict::Violated => summary.violated += 1,
            Verdict::NotDemonstrated | Verdict::Unanswered => summary.not_demonstrated += 1,
        }
        if c.verdict == Verdict::Holds && c.interpretations.iter().any(|i| i.decision.verdict != Verdict::Holds) {
            summary.holds_not_under_every_interpretation += 1;
        }
    }
    let out = VerifyOutput { files, claims, summary };
    let mut rep = to_report(&out)?;
    rep.conclude();
    Ok((out, rep))
}

/// Fills the shared report model: one verdict per claim (PASS holds, FAIL violated,
/// INCONCLUSIVE holds only under some interpretations or undecided), warnings for failed
/// validity checks and findings, and tables of claims, analyses, checks and calibrations.
pub(crate) fn to_report(out: &VerifyOutput) -> Result<Report> {
    let mut r = Report::new(
        format!("dpaudit verify: {}", out.files.join(", ")),
        report::command_line(),
    )
    .for_command("verify");
    for f in &out.files {
        r.add_input("claims", std::path::Path::new(f))?;
    }
    let m = &out.summary;
    r.fact("claims", out.claims.len().to_string())
        .fact("hold", m.holds.to_string())
        .fact("violated", m.violated.to_string())
        .fact("not demonstrated", m.not_demonstrated.to_string());
    let mut claims = Table {
        id: "claims".into(),
        title: "Claims and verdicts".into(),
        columns: [
            "claim",
            "pipeline",
            "dataset",
            "source",
            "claimed ε",
            "δ",
            "verdict",
            "evidence ε",
            "accountant",
            "kind",
            "holds under",
            "detail",
        ]
        .iter()
        .map(|c| Column::new(c))
        .collect(),
        rows: vec![],
        note: Some(
            "holds needs a sound upper bound ≤ the claim, violated a sound lower bound above it; anything else is \
             not demonstrated. Estimates (CLT) never decide."
                .into(),
        ),
    };
    let mut analyses = Table {
        id: "analyses".into(),
        title: "ε per claim, interpretation and method".into(),
        columns: [
            "claim",
            "interpretation",
            "neighbouring",
            "sensitivity",
            "method",
            "ε",
            "δ",
            "accountant",
            "kind",
            "stated",
            "verdict",
            "note",
        ]
        .iter()
        .map(|c| Column::new(c))
        .collect(),
        rows: vec![],
        note: None,
    };
    let mut checks = Table {
        id: "checks".into(),
        title: "Validity-range checks".into(),
        columns: ["claim", "check", "ok", "message"]
            .iter()
            .map(|c| Column::new(c))
            .collect(),
        rows: vec![],
        note: None,
    };
    let mut cals = Table {
        id: "calibrations".into(),
        title: "Calibrations (what an omitted or alternative parameter would have to be)".into(),
        columns: ["claim", "what", "value", "description"]
            .iter()
            .map(|c| Column::new(c))
            .collect(),
        rows: vec![],
        note: None,
    };
    for c in &out.claims {
        // The verdict's evidence carries its own accountant and kind: they label the number.
        let ev = c.evidence.as_ref();
        r.verdicts.push(report::Verdict {
            subject: format!("{} ({})", c.id, c.pipeline),
            status: c.verdict,
            budget: Some(c.claimed_epsilon),
            // Stated at the claimed δ: an upper bound at δ' ≤ δ bounds ε at δ, a lower bound at
            // δ' ≥ δ bounds it from below (`SoundEpsilon::push`). Evidence no accountant gave (a
            // proven δ floor) names its own source.
            evidence: ev.map(|e| sound::Evidence {
                delta: c.claimed_delta,
                ..e.clone()
            }),
            margin: ev.map(|e| c.claimed_epsilon - e.epsilon),
            message: c.describe(),
        });
        claims.rows.push(vec![
            Cell::from(c.id.as_str()),
            Cell::from(c.pipeline.as_str()),
            Cell::from(c.dataset.as_str()),
            Cell::from(c.source.as_str()),
            Cell::from(c.claimed_epsilon),
            Cell::from(c.claimed_delta),
            Cell::from(c.verdict.as_str()),
            ev.map_or(Cell::Empty, |e| Cell::from(e.epsilon)),
            Cell::from(ev.map_or("", |e| e.source())),
            Cell::from(ev.map_or("", |e| e.kind.as_str())),
            Cell::from(c.holds_under.join(", ")),
            Cell::from(c.reason.as_str()),
        ]);
        for i in &c.interpretations {
            for a in &i.sound.analyses {
                analyses.rows.push(vec![
                    Cell::from(c.id.as_str()),
                    Cell::from(i.id.as_str()),
                    Cell::from(i.neighbouring.to_string()),
                    Cell::from(i.sensitivity.as_str()),
                    Cell::from(a.method.as_str()),
                    Cell::from(a.epsilon),
                    Cell::from(a.delta),
                    Cell::from(a.source()),
                    Cell::from(a.kind.as_str()),
                    Cell::from(if i.stated { "yes" } else { "no" }),
                    Cell::from(i.decision.verdict.as_str()),
                    Cell::from(a.note.as_str()),
                ]);
            }
        }
        for ch in &c.checks {
            checks.rows.push(vec![
                Cell::from(c.id.as_str()),
                Cell::from(ch.code.as_str()),
                Cell::from(if ch.ok { "yes" } else { "no" }),
                Cell::from(ch.message.as_str()),
            ]);
            if !ch.ok {
                r.warn(&ch.code, format!("{}: {}", c.id, ch.message), false);
            }
        }
        for f in &c.findings {
            r.warn("finding", format!("{}: {f}", c.id), false);
        }
        for k in &c.calibrations {
            cals.rows.push(vec![
                Cell::from(c.id.as_str()),
                Cell::from(k.what.as_str()),
                Cell::from(k.value),
                Cell::from(k.description.as_str()),
            ]);
        }
    }
    r.tables = vec![claims, analyses, checks];
    if !cals.rows.is_empty() {
        r.tables.push(cals);
    }
    Ok(r)
}

fn text(out: &VerifyOutput) -> String {
    let mut s = String::new();
    for c in &out.claims {
        let _ = writeln!(
            s,
            "claim {} [{}] {} — claimed (ε = {}, δ = {})\n  source: {}\n  verdict: {}",
            c.id,
            c.pipeline,
            c.dataset,
            sig6(c.claimed_epsilon),
            sig6(c.claimed_delta),
            c.source,
            c.describe()
        );
        if let Some(rep) = &c.reproduction {
            let _ = writeln!(
                s,
                "  paper's number: {} ({}, {}); recomputed {} [{}]",
                rep.paper,
                rep.accountant.as_str(),
                rep.kind.as_str(),
                sig6(rep.computed),
                if rep.within_rounding {
                    "within the paper's rounding"
                } else {
                    "NOT within the paper's rounding"
                }
            );
        }
        for i in &c.interpretations {
            let _ = writeln!(
                s,
                "  interpretation {}{} ({}; {}; {}{}): {} — {}",
                i.id,
                if i.stated { " [the paper's]" } else { "" },
                i.neighbouring,
                i.sensitivity,
                i.sampling,
                if i.sigma_reading.is_empty() {
                    String::new()
                } else {
                    format!("; {}", i.sigma_reading)
                },
                i.description,
                i.decision.verdict
            );
            for a in &i.sound.analyses {
                let _ = writeln!(
                    s,
                    "    {:<20} ε = {:>11} at δ = {}  [{}, {}]{}",
                    a.method,
                    sig6(a.epsilon),
                    sig6(a.delta),
                    a.source(),
                    a.kind.as_str(),
                    if a.note.is_empty() {
                        String::new()
                    } else {
                        format!("  — {}", a.note)
                    }
                );
            }
            for u in &i.sound.unavailable {
                let _ = writeln!(s, "    (unavailable) {u}");
            }
        }
        for ch in &c.checks {
            let _ = writeln!(
                s,
                "  check {} {}: {}",
                if ch.ok { "ok  " } else { "WARN" },
                ch.code,
                ch.message
            );
        }
        for f in &c.findings {
            let _ = writeln!(s, "  finding: {f}");
        }
        for k in &c.calibrations {
            let _ = writeln!(s, "  calibration {} = {}: {}", k.what, sig6(k.value), k.description);
        }
        s.push('\n');
    }
    let m = &out.summary;
    let _ = writeln!(
        s,
        "summary: {} hold, {} violated, {} not demonstrated ({} hold under the paper's interpretation but not under every other)",
        m.holds, m.violated, m.not_demonstrated, m.holds_not_under_every_interpretation
    );
    s
}

fn csv_rows(out: &VerifyOutput) -> crate::Result<Vec<u8>> {
    let mut w = crate::report::csv_out::Csv::new();
    w.row([
        "claim",
        "pipeline",
        "dataset",
        "claimed_epsilon",
        "claimed_delta",
        "verdict",
        "interpretation",
        "method",
        "epsilon",
        "delta",
        "accountant",
        "kind",
        "stated",
        "interpretation_verdict",
    ])?;
    for c in &out.claims {
        for i in &c.interpretations {
            for a in &i.sound.analyses {
                w.row([
                    c.id.as_str(),
                    c.pipeline.as_str(),
                    c.dataset.as_str(),
                    &c.claimed_epsilon.to_string(),
                    &c.claimed_delta.to_string(),
                    c.verdict.as_str(),
                    i.id.as_str(),
                    a.method.as_str(),
                    &a.epsilon.to_string(),
                    &a.delta.to_string(),
                    a.accountant.map_or("", |k| k.as_str()),
                    a.kind.as_str(),
                    &i.stated.to_string(),
                    i.decision.verdict.as_str(),
                ])?;
            }
        }
        if c.interpretations.is_empty() {
            w.row([
                c.id.as_str(),
                &c.pipeline,
                &c.dataset,
                &c.claimed_epsilon.to_string(),
                &c.claimed_delta.to_string(),
                c.verdict.as_str(),
                "",
                "",
                "",
                "",
                "",
                "",
                "",
                "",
            ])?;
        }
    }
    w.into_bytes()
}
