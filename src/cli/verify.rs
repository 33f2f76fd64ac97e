//! `dpaudit verify <claims.toml>`: a verdict per published claim.

use std::path::PathBuf;

use crate::cli::common::{Format, OutputArgs};
use dpaudit::audit::outcome::Verdict;
use dpaudit::audit::verify;

const EXAMPLE: &str = "\
Examples:
  dpaudit verify fixtures/claims/dp-sgd.toml      # plain DP-SGD claims in Opacus' words
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

/// The help text after the flags: every claim table the loader accepts, then the examples.
fn after_help() -> String {
    let mut s = String::from("Claim tables (one TOML array per kind; see fixtures/claims/):\n");
    for (t, what) in dpaudit::config::claims::TABLES {
        s.push_str(&format!(
            "  [[{t}]]{:pad$}{what}\n",
            "",
            pad = 22usize.saturating_sub(t.len() + 4)
        ));
    }
    s.push('\n');
    s.push_str(EXAMPLE);
    s
}

#[derive(Debug, clap::Args)]
#[command(after_help = after_help())]
/// Verify published privacy claims.
pub struct Args {
    /// Claims file(s) (TOML, schema_version = 1; the claim tables are listed below).
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
pub fn run(args: Args) -> anyhow::Result<Verdict> {
    // Bad output locations fail before any accounting.
    let out = args.output.prepare(Format::Text, &["verify.json", "verify.csv"])?;
    let progress = dpaudit::report::progress::Progress::new(Some(args.claims.len() as u64), out.quiet, "verify");
    let plan = verify::Plan {
        claims: args.claims,
        strict: args.strict,
    };
    let outcome = verify::execute(&plan, &progress)?;
    progress.finish();
    Ok(out.emit(outcome)?)
}
