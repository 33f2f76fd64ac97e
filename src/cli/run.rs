//! `dpaudit run dpagg-ti|dp-rdm <config>`: execute a mechanism on embeddings, write its ledger,
//! and optionally audit the implementation.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::accountants::AccountantKind;
use crate::cli::common::Format;
use crate::cli::{EXIT_OK, EXIT_VIOLATED};
use crate::events::{DpEvent, Neighbouring};
use crate::pipelines::audit::{self, DistinguishingReport, SensitivityReport};
use crate::pipelines::mechanisms::{self, DpRdmConfig, DpaggTi, DpaggTiConfig, Fault};

const EXAMPLE: &str = "\
Examples:
  dpaudit run dpagg-ti fixtures/runs/dpagg-ti-digits.toml --out runs/dpagg --audit
  dpaudit run dp-rdm fixtures/runs/dp-rdm-digits.toml --out runs/rdm --seed 3
  dpaudit run dpagg-ti fixtures/runs/dpagg-ti-digits.toml --audit --inject-fault skip-normalisation

Writes into --out: ledger.toml (an event file `dpaudit account/check` can read: what ran, under
which neighbouring relation and δ), outputs.csv (the released vectors) and run.json (metadata,
ε spent, refusals, audit results). Queries or releases past the budget are refused.
--audit runs (a) a sensitivity check (replace one record at random positions, largest change
vs the claimed bound) and (b) a distinguishing audit (empirical ε lower bound, Clopper–Pearson,
must stay below the accounted ε). Exit 1 when an audit fails, 2 on bad input.";

#[derive(Debug, clap::Args)]
#[command(after_help = EXAMPLE)]
/// Execute a DP mechanism on data and write its ledger.
pub struct Args {
    #[command(subcommand)]
    /// The mechanism to run.
    pub mechanism: Mechanism,
}

#[derive(Debug, clap::Subcommand)]
/// The mechanisms `dpaudit run` can execute.
pub enum Mechanism {
    /// DPAgg-TI: noisy centroid of m subsampled, normalised embeddings.
    #[command(name = "dpagg-ti", after_help = EXAMPLE)]
    DpaggTi(Common),
    /// DP-RDM: private k-NN retrieval with a noisy mean per query.
    #[command(name = "dp-rdm", after_help = EXAMPLE)]
    DpRdm(Common),
}

#[derive(Debug, clap::Args)]
/// Arguments shared by every mechanism.
pub struct Common {
    /// Mechanism config (TOML, schema_version = 1).
    pub config: PathBuf,
    /// Folder for ledger.toml, outputs.csv, run.json.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Seed (overrides the config's).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Run the sensitivity and distinguishing audits.
    #[arg(long)]
    pub audit: bool,
    /// Runs per side of the distinguishing audit.
    #[arg(long, default_value_t = 4000)]
    pub audit_runs: usize,
    /// Trials of the sensitivity check.
    #[arg(long, default_value_t = 500)]
    pub audit_trials: usize,
    /// Inject a known bug (to see the audits catch it). DPAgg-TI only.
    #[arg(long, value_enum, default_value_t = Fault::None)]
    pub inject_fault: Fault,
    /// Summary format on stdout (text or json).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

#[derive(Debug, Serialize)]
struct RunReport<R: Serialize> {
    mechanism: &'static str,
    config: String,
    run: R,
    #[serde(skip_serializing_if = "Option::is_none")]
    sensitivity: Option<SensitivityReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    distinguishing: Option<DistinguishingReport>,
    fault: Fault,
}

/// Runs `dpaudit run`; returns the exit code.
pub fn run(args: Args) -> anyhow::Result<i32> {
    match args.mechanism {
        Mechanism::DpaggTi(c) => run_dpagg(c),
        Mechanism::DpRdm(c) => run_rdm(c),
    }
}

fn write_outputs(dir: &Path, rows: &[Vec<f64>], json: &[u8]) -> crate::Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| crate::Error::io(dir, &e))?;
    let mut s = String::new();
    if let Some(r) = rows.first() {
        let head: Vec<String> = (0..r.len()).map(|i| format!("e{i}")).collect();
        s.push_str(&head.join(","));
        s.push('\n');
    }
    for r in rows {
        let v: Vec<String> = r.iter().map(|x| format!("{x:.17e}")).collect();
        s.push_str(&v.join(","));
        s.push('\n');
    }
    mechanisms::write_atomic(&dir.join("outputs.csv"), s.as_bytes())?;
    mechanisms::write_atomic(&dir.join("run.json"), json)
}

fn run_dpagg(a: Common) -> anyhow::Result<i32> {
    let (cfg, mut mech) = DpaggTiConfig::load(&a.config)?;
    if a.inject_fault != Fault::None {
        let raw = crate::pipelines::embeddings::Embeddings::load_csv(
            &a.config.parent().unwrap_or(Path::new(".")).join(&cfg.embeddings),
        )?;
        mech = DpaggTi::new(
            &raw,
            cfg.m.get() as usize,
            cfg.epsilon.get(),
            cfg.delta.map(|d| d.get()),
            cfg.sigma_rule,
            cfg.sigma.map(|s| s.get()),
            a.inject_fault,
        )?;
    }
    let seed = a.seed.unwrap_or(cfg.seed);
    let (run, budget) = mechanisms::run_dpagg_ti(&mech, cfg.releases.get(), cfg.budget_epsilon.map(|e| e.get()), seed)?;
    let (sens, dist) = if a.audit {
        let s = audit::dpagg_ti_sensitivity(&mech, a.audit_trials, seed ^ 0x5e45);
        // Accounted upper bound of one release: exact Gaussian ε (no amplification credit).
        let upper = crate::accountants::AccountantKind::Gdp
            .build()
            .epsilon(
                &DpEvent::gaussian(mech.noise_multiplier),
                Neighbouring::ReplaceOne,
                mech.delta,
            )?
            .epsilon;
        let d = audit::dpagg_ti_distinguishing(&mech, a.audit_runs, upper, 0.05, seed ^ 0xd157)?;
        (Some(s), Some(d))
    } else {
        (None, None)
    };
    let failed = sens.as_ref().is_some_and(|s| !s.ok) || dist.as_ref().is_some_and(|d| d.violation);
    let header = format!(
        "dpaudit run dpagg-ti {}\nn = {}, m = {}, sigma = {}, noise_multiplier = {} (sensitivity 2/m), seed = {}\n\
         released = {}, refused = {}, epsilon charged (gdp, no amplification) = {}",
        a.config.display(),
        run.n,
        run.m,
        run.sigma,
        run.noise_multiplier,
        seed,
        run.released,
        run.refused,
        run.epsilon_spent
    );
    let rows = run.outputs.clone();
    let rep = RunReport {
        mechanism: "dpagg-ti",
        config: a.config.display().to_string(),
        run,
        sensitivity: sens,
        distinguishing: dist,
        fault: a.inject_fault,
    };
    finish(&a, &rep, &rows, &budget.event_file(), &header)?;
    Ok(if failed { EXIT_VIOLATED } else { EXIT_OK })
}

fn run_rdm(a: Common) -> anyhow::Result<i32> {
    let (cfg, mech, queries) = DpRdmConfig::load(&a.config)?;
    if a.inject_fault != Fault::None {
        return Err(crate::Error::field("--inject-fault", "only DPAgg-TI has injectable faults").into());
    }
    let seed = a.seed.unwrap_or(cfg.seed);
    let delta = cfg.delta.map_or(1.0 / mech.private.len() as f64, |d| d.get());
    let accountant: AccountantKind = cfg.accountant;
    let (run, budget) = mechanisms::run_dp_rdm(&mech, &queries, cfg.budget_epsilon.get(), delta, accountant, seed)?;
    let sens = a
        .audit
        .then(|| audit::dp_rdm_sensitivity(&mech, &queries.rows, a.audit_trials, seed ^ 0x5e45));
    let failed = sens.as_ref().is_some_and(|s| !s.ok);
    let header = format!(
        "dpaudit run dp-rdm {}\nn = {}, k = {}, q = {}, sigma = {}, lambda = {}, noise_multiplier = {} (Theorem 3.1, 2/k), seed = {}\n\
         answered = {}, refused = {}, epsilon spent ({}) = {} of budget {}",
        a.config.display(),
        run.n,
        run.k,
        run.q,
        run.sigma,
        run.lambda,
        run.noise_multiplier,
        seed,
        run.answered,
        run.refused,
        accountant.as_str(),
        run.epsilon_spent,
        run.budget_epsilon
    );
    let rows: Vec<Vec<f64>> = run.answers.iter().map(|x| x.z.clone()).collect();
    let rep = RunReport {
        mechanism: "dp-rdm",
        config: a.config.display().to_string(),
        run,
        sensitivity: sens,
        distinguishing: None,
        fault: Fault::None,
    };
    finish(&a, &rep, &rows, &budget.event_file(), &header)?;
    Ok(if failed { EXIT_VIOLATED } else { EXIT_OK })
}

fn finish<R: Serialize>(
    a: &Common,
    rep: &RunReport<R>,
    rows: &[Vec<f64>],
    ledger: &crate::events::EventFile,
    header: &str,
) -> anyhow::Result<()> {
    let json = serde_json::to_vec_pretty(rep)?;
    if let Some(dir) = &a.out {
        mechanisms::write_ledger(dir, ledger, header)?;
        write_outputs(dir, rows, &json)?;
    }
    match a.format {
        Format::Json => println!("{}", String::from_utf8_lossy(&json)),
        _ => {
            let mut s = String::new();
            let _ = writeln!(s, "{header}");
            if let Some(sr) = &rep.sensitivity {
                let _ = writeln!(
                    s,
                    "sensitivity check: largest change {:.6} vs claimed bound {:.6} over {} trials (ratio {:.3}) → {}",
                    sr.max_change,
                    sr.claimed_bound,
                    sr.trials,
                    sr.ratio,
                    if sr.ok { "ok" } else { "EXCEEDS THE CLAIMED SENSITIVITY" }
                );
            }
            if let Some(d) = &rep.distinguishing {
                let o = &d.outcome;
                let _ = writeln!(
                    s,
                    "distinguishing audit: {} runs per side, FP {}/{} FN {}/{}, ε_lower = {:.4} ({}% confidence) vs accounted ε_upper = {:.4} → {}",
                    d.runs_per_side,
                    o.false_positives,
                    o.test_out,
                    o.false_negatives,
                    o.test_in,
                    o.epsilon_lower,
                    o.confidence * 100.0,
                    d.epsilon_upper,
                    if d.violation { "LEAKS MORE THAN ACCOUNTED" } else { "consistent" }
                );
            }
            let _ = writeln!(s, "ledger:\n{}", ledger.event.ledger());
            print!("{s}");
        }
    }
    Ok(())
}
