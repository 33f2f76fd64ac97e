//! `dpaudit verify <claims.toml>`: a verdict per published claim.

use std::fmt::Write as _;
use std::path::PathBuf;

use serde::Serialize;

use crate::cli::common::Format;
use crate::cli::{EXIT_OK, EXIT_VIOLATED};
use crate::config::claims::ClaimsFile;
use crate::pipelines::{self, ClaimResult, Verdict};

const EXAMPLE: &str = "\
Examples:
  dpaudit verify fixtures/claims/dp-rdm.toml
  dpaudit verify fixtures/claims/rapid-scenarios.toml --format json --out reports/verify
  dpaudit verify fixtures/claims/dpagg-ti.toml --format csv

Verdicts: holds (with margin), holds only under <interpretation>, violated (by how much),
cannot be decided (what is missing). Only sound accountants decide (exact GDP, RDP, PLD);
CLT estimates never do. Exit codes: 0 no claim violated, 1 a claim is violated (or, with
--strict, not shown to hold under every interpretation), 2 bad input.";

#[derive(Debug, clap::Args)]
#[command(after_help = EXAMPLE)]
pub struct Args {
    /// Claims file(s) (TOML, schema_version = 1; tables [[rapid]], [[dp_rdm]], [[dpagg_ti]]).
    #[arg(required = true)]
    pub claims: Vec<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Write `verify.<ext>` into this folder instead of printing.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Exit 1 unless every claim holds under every interpretation.
    #[arg(long)]
    pub strict: bool,
}

/// The serialised result of a verify run.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyOutput {
    pub files: Vec<String>,
    pub claims: Vec<ClaimResult>,
    pub summary: Summary,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    pub holds: usize,
    pub holds_only_under: usize,
    pub violated: usize,
    pub undecided: usize,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let mut claims = Vec::new();
    let mut files = Vec::new();
    for p in &args.claims {
        let f = ClaimsFile::load(p)?;
        let res = pipelines::verify_claims(&f).map_err(|e| e.with_file(p))?;
        claims.extend(res);
        files.push(p.display().to_string());
    }
    let mut summary = Summary::default();
    for c in &claims {
        match c.verdict {
            Verdict::Holds { .. } => summary.holds += 1,
            Verdict::HoldsOnlyUnder { .. } => summary.holds_only_under += 1,
            Verdict::Violated { .. } => summary.violated += 1,
            Verdict::Undecided { .. } => summary.undecided += 1,
        }
    }
    let out = VerifyOutput { files, claims, summary };
    let (bytes, ext) = render(&out, args.format)?;
    match &args.out {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| crate::Error::io(dir, &e))?;
            let p = dir.join(format!("verify.{ext}"));
            pipelines::mechanisms::write_atomic(&p, &bytes)?;
            eprintln!("wrote {}", p.display());
        }
        None => {
            use std::io::Write;
            std::io::stdout().write_all(&bytes)?;
        }
    }
    let s = &out.summary;
    let code = if s.violated > 0 || (args.strict && (s.holds_only_under > 0 || s.undecided > 0)) {
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
        Format::Md => (markdown(out).into_bytes(), "md"),
        Format::Html => (html(out).into_bytes(), "html"),
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
            c.verdict.describe()
        );
        for i in &c.interpretations {
            let _ = writeln!(
                s,
                "  interpretation {} ({}; {}): {}",
                i.id, i.neighbouring, i.sensitivity, i.description
            );
            for a in &i.analyses {
                let _ = writeln!(
                    s,
                    "    {:<34} ε = {:>14} at δ = {:.3e}  [{}{}]{}",
                    a.method,
                    fmt_eps(a.epsilon),
                    a.delta,
                    a.kind.as_str(),
                    if a.sound { ", sound" } else { ", NOT a bound here" },
                    if a.note.is_empty() {
                        String::new()
                    } else {
                        format!("  — {}", a.note)
                    }
                );
            }
            for u in &i.unavailable {
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
        "summary: {} hold, {} hold only under some interpretation, {} violated, {} undecided",
        m.holds, m.holds_only_under, m.violated, m.undecided
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
        "kind",
        "sound",
    ])
    .map_err(err)?;
    for c in &out.claims {
        for i in &c.interpretations {
            for a in &i.analyses {
                w.write_record([
                    c.id.as_str(),
                    &c.pipeline,
                    &c.dataset,
                    &c.claimed_epsilon.to_string(),
                    &c.claimed_delta.to_string(),
                    c.verdict.label(),
                    &i.id,
                    &a.method,
                    &a.epsilon.to_string(),
                    &a.delta.to_string(),
                    a.kind.as_str(),
                    &a.sound.to_string(),
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
                c.verdict.label(),
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

fn markdown(out: &VerifyOutput) -> String {
    let mut s = String::from("# dpaudit verify\n\n");
    let _ = writeln!(s, "Files: {}\n", out.files.join(", "));
    s.push_str("| claim | pipeline | dataset | claimed (ε, δ) | verdict |\n|---|---|---|---|---|\n");
    for c in &out.claims {
        let _ = writeln!(
            s,
            "| {} | {} | {} | ({}, {:.3e}) | {} |",
            c.id,
            c.pipeline,
            c.dataset,
            c.claimed_epsilon,
            c.claimed_delta,
            c.verdict.describe()
        );
    }
    for c in &out.claims {
        let _ = writeln!(
            s,
            "\n## {}\n\nSource: {}. Verdict: **{}**.\n",
            c.id,
            c.source,
            c.verdict.describe()
        );
        for i in &c.interpretations {
            let _ = writeln!(
                s,
                "**{}** — {} ({}, {})\n",
                i.id, i.description, i.neighbouring, i.sensitivity
            );
            s.push_str("| method | ε | δ | kind | sound | note |\n|---|---|---|---|---|---|\n");
            for a in &i.analyses {
                let _ = writeln!(
                    s,
                    "| {} | {} | {:.3e} | {} | {} | {} |",
                    a.method,
                    fmt_eps(a.epsilon),
                    a.delta,
                    a.kind.as_str(),
                    a.sound,
                    a.note
                );
            }
            s.push('\n');
        }
        for ch in &c.checks {
            let _ = writeln!(
                s,
                "- {} `{}`: {}",
                if ch.ok { "ok" } else { "**warning**" },
                ch.code,
                ch.message
            );
        }
        for f in &c.findings {
            let _ = writeln!(s, "- finding: {f}");
        }
        for k in &c.calibrations {
            let _ = writeln!(s, "- calibration `{}` = {:.6}: {}", k.what, k.value, k.description);
        }
    }
    s
}

fn esc(t: &str) -> String {
    t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn html(out: &VerifyOutput) -> String {
    let mut s = String::from(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>dpaudit verify</title></head><body>\n<h1>dpaudit verify</h1>\n",
    );
    s.push_str("<table border=\"1\"><tr><th>claim</th><th>pipeline</th><th>dataset</th><th>ε</th><th>δ</th><th>verdict</th></tr>\n");
    for c in &out.claims {
        let _ = writeln!(
            s,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.3e}</td><td>{}</td></tr>",
            esc(&c.id),
            esc(&c.pipeline),
            esc(&c.dataset),
            c.claimed_epsilon,
            c.claimed_delta,
            esc(&c.verdict.describe())
        );
    }
    s.push_str("</table>\n");
    for c in &out.claims {
        let _ = writeln!(s, "<h2>{}</h2><p>{}</p>", esc(&c.id), esc(&c.source));
        for i in &c.interpretations {
            let _ = writeln!(s, "<h3>{}</h3><p>{}</p><ul>", esc(&i.id), esc(&i.description));
            for a in &i.analyses {
                let _ = writeln!(
                    s,
                    "<li>{}: ε = {} at δ = {:.3e} ({}, sound: {})</li>",
                    esc(&a.method),
                    fmt_eps(a.epsilon),
                    a.delta,
                    a.kind.as_str(),
                    a.sound
                );
            }
            s.push_str("</ul>\n");
        }
        s.push_str("<ul>");
        for ch in &c.checks {
            let _ = writeln!(
                s,
                "<li>{} {}: {}</li>",
                if ch.ok { "ok" } else { "WARNING" },
                esc(&ch.code),
                esc(&ch.message)
            );
        }
        for f in &c.findings {
            let _ = writeln!(s, "<li>finding: {}</li>", esc(f));
        }
        s.push_str("</ul>\n");
    }
    s.push_str("</body></html>\n");
    s
}
