//! `dpaudit verify <claims.toml>`: a verdict per published claim.

use std::fmt::Write as _;
use std::path::PathBuf;

use serde::Serialize;

use crate::cli::common::{Format, OutputArgs};
use crate::cli::{EXIT_OK, EXIT_VIOLATED};
use crate::config::claims::ClaimsFile;
use crate::pipelines::{self, ClaimResult, Verdict};
use crate::report::{self, Cell, Column, Report, Status, Table};

const EXAMPLE: &str = "\
Examples:
  dpaudit verify fixtures/claims/dp-rdm.toml
  dpaudit verify fixtures/claims/rapid-scenarios.toml --format json
  dpaudit verify fixtures/claims/dp-rdm-cifar10.toml --out reports/verify --force   # md, html, csv, json
  (--out DIR is created when missing; files from an earlier run need --force)
  dpaudit verify fixtures/claims/dpagg-ti.toml --format csv

Verdicts, under the interpretation the paper states (adjacency, σ reading, sampling):
  holds             a sound upper bound (exact or upper_bound) at the claimed δ is ≤ the claimed ε
  violated          a sound lower bound at the claimed δ exceeds it (exact value, worst-case pair,
                    proven δ floor such as δ ≥ 1 − (1 − p)^T)
  not_demonstrated  neither: nothing sound supports or refutes the claim
Each verdict names its evidence (ε, accountant, kind) and the other interpretations under which
the claim holds. CLT estimates are shown and reproduced, never decide. Exit codes: 0 every claim
holds, 1 a claim is violated or not demonstrated (with --strict also when some other
interpretation does not hold), 2 bad input.";

#[derive(Debug, clap::Args)]
#[command(after_help = EXAMPLE)]
/// Verify published privacy claims.
pub struct Args {
    /// Claims file(s) (TOML, schema_version = 1; tables [[rapid]], [[dp_rdm]], [[dpagg_ti]]).
    #[arg(required = true)]
    pub claims: Vec<PathBuf>,
    /// Output grammar; --out DIR also receives the detailed verify.json and verify.csv.
    #[command(flatten)]
    pub output: OutputArgs,
    /// Also exit 1 when a claim fails under an interpretation other than the paper's.
    #[arg(long)]
    pub strict: bool,
}

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

/// Runs `dpaudit verify`.
pub fn run(args: Args) -> anyhow::Result<i32> {
    // Bad output locations fail before any accounting.
    let out = args.output.prepare(Format::Text, &["verify.json", "verify.csv"])?;
    let progress = crate::report::progress::Progress::new(Some(args.claims.len() as u64), out.quiet, "verify");
    let mut claims = Vec::new();
    let mut files = Vec::new();
    for p in &args.claims {
        progress.set_message(p.display().to_string());
        let f = ClaimsFile::load(p)?;
        let res = pipelines::verify_claims(&f).map_err(|e| e.with_file(p))?;
        claims.extend(res);
        files.push(p.display().to_string());
        progress.inc(1);
    }
    progress.finish();
    let mut summary = Summary::default();
    for c in &claims {
        match c.verdict {
            Verdict::Holds => summary.holds += 1,
            Verdict::Violated => summary.violated += 1,
            Verdict::NotDemonstrated => summary.not_demonstrated += 1,
        }
        if c.verdict == Verdict::Holds && c.interpretations.iter().any(|i| i.decision.verdict != Verdict::Holds) {
            summary.holds_not_under_every_interpretation += 1;
        }
    }
    let out_data = VerifyOutput { files, claims, summary };
    let mut rep = to_report(&out_data)?;
    rep.conclude();
    let detail = serde_json::to_vec_pretty(&out_data)?;
    out.finish_with_csv(
        &rep,
        &text(&out_data),
        "verify.csv",
        csv_rows(&out_data)?,
        vec![("verify.json".to_string(), detail)],
    )?;
    let s = &out_data.summary;
    let code =
        if s.violated > 0 || s.not_demonstrated > 0 || (args.strict && s.holds_not_under_every_interpretation > 0) {
            EXIT_VIOLATED
        } else {
            EXIT_OK
        };
    Ok(code)
}

/// Renders the output in a format; returns (bytes, file extension).
pub fn render(out: &VerifyOutput, format: Format) -> crate::Result<(Vec<u8>, &'static str)> {
    Ok(match format {
        Format::Json => (
            serde_json::to_vec_pretty(out).map_err(|e| crate::Error::input(e.to_string()))?,
            "json",
        ),
        Format::Csv => (csv_rows(out)?, "csv"),
        Format::Text => (text(out).into_bytes(), "txt"),
        Format::Md => (
            crate::report::export(&to_report(out)?, crate::report::ExportFormat::Md)?,
            "md",
        ),
        Format::Html => (
            crate::report::export(&to_report(out)?, crate::report::ExportFormat::Html)?,
            "html",
        ),
    })
}

fn fmt_eps(e: f64) -> String {
    if e.is_infinite() {
        "∞".into()
    } else if e >= 1000.0 {
        format!("{e:.1}")
    } else {
        format!("{e:.6}")
    }
}

fn text(out: &VerifyOutput) -> String {
    let mut s = String::new();
    for c in &out.claims {
        let _ = writeln!(
            s,
            "claim {} [{}] {} — claimed (ε = {}, δ = {:.3e})\n  source: {}\n  verdict: {}",
            c.id,
            c.pipeline,
            c.dataset,
            c.claimed_epsilon,
            c.claimed_delta,
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
                fmt_eps(rep.computed),
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
                    "    {:<34} ε = {:>14} at δ = {:.3e}  [{}, {}]{}",
                    a.method,
                    fmt_eps(a.epsilon),
                    a.delta,
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
            let _ = writeln!(s, "  calibration {} = {:.6}: {}", k.what, k.value, k.description);
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
    let mut w = csv::Writer::from_writer(Vec::new());
    let err = |e: csv::Error| crate::Error::input(e.to_string());
    w.write_record([
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
    ])
    .map_err(err)?;
    for c in &out.claims {
        for i in &c.interpretations {
            for a in &i.sound.analyses {
                use crate::report::export::csv_text;
                w.write_record([
                    csv_text(&c.id).as_str(),
                    &csv_text(&c.pipeline),
                    &csv_text(&c.dataset),
                    &c.claimed_epsilon.to_string(),
                    &c.claimed_delta.to_string(),
                    c.verdict.as_str(),
                    &csv_text(&i.id),
                    &csv_text(&a.method),
                    &a.epsilon.to_string(),
                    &a.delta.to_string(),
                    a.accountant.map_or("", |k| k.as_str()),
                    a.kind.as_str(),
                    &i.stated.to_string(),
                    i.decision.verdict.as_str(),
                ])
                .map_err(err)?;
            }
        }
        if c.interpretations.is_empty() {
            w.write_record([
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
            ])
            .map_err(err)?;
        }
    }
    w.into_inner().map_err(|e| crate::Error::input(e.to_string()))
}

/// Fills the shared report model: one verdict per claim (PASS holds, FAIL violated,
/// INCONCLUSIVE holds only under some interpretations or undecided), warnings for failed
/// validity checks and findings, and tables of claims, analyses, checks and calibrations.
pub fn to_report(out: &VerifyOutput) -> crate::Result<Report> {
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
        let status = match c.verdict {
            Verdict::Holds => Status::Pass,
            Verdict::Violated => Status::Fail,
            Verdict::NotDemonstrated => Status::Inconclusive,
        };
        // The verdict's evidence carries its own accountant and kind: they label the number.
        let ev = c.evidence.as_ref();
        r.verdicts.push(report::Verdict {
            subject: format!("{} ({})", c.id, c.pipeline),
            status,
            budget: Some(c.claimed_epsilon),
            epsilon: ev.map(|e| e.epsilon),
            delta: Some(c.claimed_delta),
            accountant: ev.and_then(|e| e.accountant),
            bound: ev.map(|e| e.kind),
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
