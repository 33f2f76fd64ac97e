//! `dpaudit completions <shell>`: shell completions generated from the clap definition.

use clap::CommandFactory;

#[derive(Debug, clap::Args)]
#[command(after_help = "Example:\n  dpaudit completions bash > /etc/bash_completion.d/dpaudit")]
/// Generate shell completions.
pub struct Args {
    /// bash, zsh, fish, elvish or powershell
    pub shell: clap_complete::Shell,
}

/// Prints the completion script for the chosen shell.
pub fn run(args: Args) -> anyhow::Result<dpaudit::audit::outcome::Status> {
    let mut cmd = super::Cli::command();
    clap_complete::generate(args.shell, &mut cmd, "dpaudit", &mut std::io::stdout());
    Ok(dpaudit::audit::outcome::Status::Ok)
}
