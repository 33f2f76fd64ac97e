//! `dpaudit verify <claims.toml>`: a verdict per published claim.

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::cli::common::{Format, OutputArgs};
use crate::cli::{EXIT_OK, EXIT_VIOLATED};
use dpaudit::audit::verify::{self, VerifyOutput};

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

/// Runs `dpaudit verify`.
pub fn run(args: Args) -> anyhow::Result<i32> {
    // Bad output locations fail before any accounting.
    let out = args.output.prepare(Format::Text, &["verify.json", "verify.csv"])?;
    let progress = dpaudit::report::progress::Progress::new(Some(args.claims.len() as u64), out.quiet, "verify");
    let (out_data, rep) = verify::run(&args.claims, &progress)?;
    progress.finish();
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

fn csv_rows(out: &VerifyOutput) -> dpaudit::Result<Vec<u8>> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let err = |e: csv::Error| dpaudit::Error::input(e.to_string());
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
                use dpaudit::report::export::csv_text;
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
    w.into_inner().map_err(|e| dpaudit::Error::input(e.to_string()))
}
