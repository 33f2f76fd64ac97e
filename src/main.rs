//! Thin binary: parse the command line ([`cli`], the only code that knows clap), run the
//! library's application layer (`dpaudit::audit`), map the outcome to an exit code
//! (0 ok, 1 a claim/budget is violated, 2 usage or input error).

#![forbid(unsafe_code)]

mod cli;

fn main() {
    cli::install_broken_pipe_hook();
    if let Some(note) = dpaudit::limits::configure_threads() {
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "note: {note}");
    }
    std::process::exit(cli::main_with_args(std::env::args_os()));
}
