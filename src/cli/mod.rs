//! Command line: one file per subcommand (clap derive). Each subcommand turns raw arguments
//! into a validated plan, calls the library, and returns an exit code.

pub mod account;
pub mod analyze;
pub mod calibrate;
pub mod check;
pub mod common;
pub mod completions;
pub mod mechanism;
pub mod merge;
pub mod mia;
pub mod model;
pub mod report;
pub mod run;
pub mod sweep;
pub mod train;
pub mod train_unet;
pub mod values;
pub mod verify;

use clap::{Parser, Subcommand};

/// Exit code: everything as claimed / within budget.
pub const EXIT_OK: i32 = 0;
/// Exit code: a claim or budget is violated.
pub const EXIT_VIOLATED: i32 = 1;
/// Exit code: usage or input error.
pub const EXIT_USAGE: i32 = 2;

#[derive(Debug, Parser)]
#[command(
    name = "dpaudit",
    version,
    about = "Privacy audit and accounting for diffusion-model pipelines",
    long_about = "dpaudit answers \"how private is this, really?\" for diffusion sampling configurations, \
published DP pipelines (RAPID, DP-RDM, DPAgg-TI) and trained denoisers.\n\n\
Exit codes: 0 ok, 1 a claim or budget is violated, 2 usage or input error."
)]
/// The parsed command line.
pub struct Cli {
    #[command(subcommand)]
    /// The subcommand to run.
    pub command: Command,
}

#[derive(Debug, Subcommand)]
/// The subcommands.
pub enum Command {
    /// Account a DP-SGD-style event from flags, or any event tree from a TOML file.
    Account(account::Args),
    /// Find the noise multiplier, sampling rate or steps that meet a target ε.
    Calibrate(calibrate::Args),
    /// Per-step privacy analysis of a diffusion sampler configuration.
    Analyze(analyze::Args),
    /// Sweep a sampler configuration over a grid of settings.
    Sweep(sweep::Args),
    /// CI guard: exit 1 when a pipeline exceeds its ε budget.
    Check(check::Args),
    /// Re-render a JSON report as Markdown, HTML or CSV.
    Report(report::Args),
    /// Verify published privacy claims.
    Verify(verify::Args),
    /// Execute a DP mechanism on data and write its ledger.
    Run(run::Args),
    /// Train a small denoiser (optionally with DP).
    Train(train::Args),
    /// Membership-inference attacks on a trained denoiser.
    Mia(mia::Args),
    /// Run or describe a diffusers checkpoint (UNet2DModel).
    Model(model::Args),
    /// Merge the part files of a sharded `mia` run into one report.
    Merge(merge::Args),
    /// Generate shell completions.
    Completions(completions::Args),
}

/// Parses `args` and runs the command; returns the process exit code. Never panics on input.
pub fn main_with_args<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_USAGE } else { EXIT_OK };
            let _ = e.print();
            return code;
        }
    };
    let result = match cli.command {
        Command::Account(a) => account::run(a),
        Command::Calibrate(a) => calibrate::run(a),
        Command::Analyze(a) => analyze::run(a),
        Command::Sweep(a) => sweep::run(a),
        Command::Check(a) => check::run(a),
        Command::Report(a) => report::run(a),
        Command::Verify(a) => verify::run(a),
        Command::Run(a) => run::run(a),
        Command::Train(a) => train::run(a),
        Command::Mia(a) => mia::run(a),
        Command::Model(a) => model::run(a),
        Command::Merge(a) => merge::run(a),
        Command::Completions(a) => completions::run(a),
    };
    match result {
        Ok(code) => code,
        // The reader of stdout went away (`| head`): it has what it asked for; end quietly.
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            EXIT_OK
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            e.downcast_ref::<dpaudit::Error>()
                .map(|e| e.exit_code())
                .unwrap_or(EXIT_USAGE)
        }
    }
}
