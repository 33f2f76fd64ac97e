//! Progress bars for long work (indicatif), silent with `--quiet` or when stdout is not a
//! terminal (CI logs, pipes, tests). Bars draw on stderr so stdout stays machine-readable.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// True when progress should be drawn.
pub fn enabled(quiet: bool) -> bool {
    !quiet && std::io::stdout().is_terminal() && std::io::stderr().is_terminal()
}

/// A bar over `len` units of work, hidden unless [`enabled`].
pub fn bar(len: u64, quiet: bool, what: &str) -> ProgressBar {
    if !enabled(quiet) {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed})") {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_prefix(what.to_string());
    pb
}

#[cfg(test)]
mod tests {
    #[test]
    fn quiet_bars_are_hidden() {
        assert!(super::bar(3, true, "x").is_hidden());
    }
}
