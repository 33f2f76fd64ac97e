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
pub fn run(args: Args) -> anyhow::Result<dpaudit::audit::outcome::Verdict> {
    let mut cmd = super::Cli::command();
    // Generated into memory, then written through the writer every command uses (a full disk
    // or a closed stdout is an error naming stdout, or a quiet end for a closed pipe; never a
    // panic).
    let mut buf: Vec<u8> = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "dpaudit", &mut buf);
    dpaudit::report::output::emit_stdout(&buf)?;
    Ok(dpaudit::audit::outcome::Verdict::Holds)
}
