//! `dpaudit run dpagg-ti|dp-rdm <config>`: execute a mechanism on embeddings, write its ledger,
//! and optionally audit the implementation.

use std::path::PathBuf;

use crate::cli::common::{Format, OutputArgs};
use crate::cli::values::Fault;
use dpaudit::audit::outcome::Verdict;
use dpaudit::audit::run::{self, Options, RUN_FILES};

const EXAMPLE: &str = "\
Examples:
  dpaudit run dpagg-ti fixtures/runs/dpagg-ti-digits.toml --out runs/dpagg --audit
  dpaudit run dp-rdm fixtures/runs/dp-rdm-digits.toml --out runs/rdm --seed 3
  dpaudit run dpagg-ti fixtures/runs/dpagg-ti-digits.toml --audit --inject-fault skip-normalisation

Writes into --out DIR (created when missing; existing files need --force): ledger.toml (an event file `dpaudit account/check` can read: what ran, under
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
    /// Seed of the sampling and noise (overrides the config's). Without one (here or in the
    /// config) the noise comes from the OS CSPRNG and two runs release different outputs; a
    /// seeded release is not private against anyone who knows the seed (its ledger, run.json
    /// and report say so).
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
    /// Output grammar; --out DIR also receives ledger.toml, outputs.csv and run.json.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Runs `dpaudit run`.
pub fn run(args: Args) -> anyhow::Result<Verdict> {
    let (c, mechanism) = match args.mechanism {
        Mechanism::DpaggTi(c) => (c, run::Mechanism::DpaggTi),
        Mechanism::DpRdm(c) => (c, run::Mechanism::DpRdm),
    };
    let out = c.output.prepare(Format::Text, &RUN_FILES)?;
    let plan = run::Plan {
        mechanism,
        options: Options {
            config: c.config.clone(),
            seed: c.seed,
            audit: c.audit,
            audit_runs: c.audit_runs,
            audit_trials: c.audit_trials,
            inject_fault: c.inject_fault.into(),
        },
    };
    let progress = dpaudit::report::progress::Progress::new(None, out.quiet, "run");
    progress.set_message(if c.audit { "running and auditing" } else { "running" });
    let outcome = run::execute(&plan)?;
    progress.finish();
    Ok(out.emit(outcome)?)
}
