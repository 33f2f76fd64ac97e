//! Command line: one file per subcommand (clap derive). Each subcommand turns raw arguments
//! into a validated plan, calls the library's application layer (`dpaudit::audit`), prints or
//! writes its [`Outcome`](dpaudit::audit::Outcome) and returns its [`Verdict`]; [`exit_code`] is
//! the one place a status (or an error) becomes the process exit code.

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
use dpaudit::audit::outcome::Verdict;

/// The process exit code of a command's verdict, the only place one is decided: the verdict's
/// one documented mapping ([`Verdict::exit_code`], docs/reliability.md "Exit codes"): 0 holds
/// (or nothing judged); 1 a claim, budget or audit is violated, or a claim is not demonstrated
/// (`verify`); 2 usage or input error, or a question the input cannot answer (`check` with no
/// sound accountant).
pub fn exit_code(status: Verdict) -> i32 {
    status.exit_code()
}

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

/// Makes a closed stdout/stderr pipe end the process quietly with exit code 0 instead of a
/// panic: Rust ignores SIGPIPE, so `print!` to a pipe whose reader has exited (`dpaudit … | head`)
/// panics with "failed printing to stdout: Broken pipe". The reader has all it asked for, so
/// there is nothing to report. Every other panic goes to the previous hook unchanged. Called
/// once at the start of `main`.
pub fn install_broken_pipe_hook() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if payload.starts_with("failed printing to std") {
            if dpaudit::error::is_broken_pipe_message(payload) {
                std::process::exit(exit_code(Verdict::Holds));
            }
            // stdout or stderr cannot be written (a full disk, `/dev/full`, a closed
            // descriptor): say so where possible and fail as an output error, never a panic.
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "error: {payload}");
            std::process::exit(exit_code(Verdict::Unanswered));
        }
        previous(info);
    }));
}

/// Every option that takes a value accepts a negative number as that value (`--steps -1`,
/// `--timesteps -5`), in every subcommand: the number then reaches the flag's own validator,
/// which refuses it naming the flag (before, clap answered "unexpected argument '-1' found",
/// naming no flag). Anything else that starts with `-` is still an option.
fn numbers_may_be_negative(cmd: clap::Command) -> clap::Command {
    cmd.mut_args(|a| {
        if a.get_action().takes_values() {
            a.allow_negative_numbers(true)
        } else {
            a
        }
    })
    .mut_subcommands(numbers_may_be_negative)
}

/// Parses `args` and runs the command; returns the process exit code. Never panics on input.
pub fn main_with_args<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let parsed = numbers_may_be_negative(<Cli as clap::CommandFactory>::command())
        .try_get_matches_from(args)
        .and_then(|m| <Cli as clap::FromArgMatches>::from_arg_matches(&m));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => {
            // `--help` and `--version` are answers (stdout); anything else is a usage error.
            let status = if e.use_stderr() {
                Verdict::Unanswered
            } else {
                Verdict::Holds
            };
            let _ = e.print();
            return exit_code(status);
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
    let status = match result {
        Ok(status) => status,
        // The reader of stdout went away (`| head`): it has what it asked for; end quietly.
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            Verdict::Holds
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            Verdict::Unanswered
        }
    };
    exit_code(status)
}
