//! Feedback on stderr: progress bars with an ETA for long work, notes (`-v`), colour.
//!
//! Progress is drawn on stderr only when stderr is a terminal and `-q` was not given, and only
//! once the work has run for [`SHOW_AFTER`] (short commands never flash a bar), so stdout stays
//! machine-readable and logs stay clean. Colour follows the `NO_COLOR` convention
//! (<https://no-color.org>): any non-empty value turns it off; it is also off when the stream is
//! not a terminal.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// Work shorter than this shows no progress.
pub const SHOW_AFTER: Duration = Duration::from_secs(1);

/// Verbosity set once by the command line: 0 quiet, 1 normal, 2+ verbose.
static VERBOSITY: AtomicU8 = AtomicU8::new(1);

/// Records `-q` / `-v` for the whole process (called once by the command line).
pub fn set_verbosity(quiet: bool, verbose: u8) {
    let level = if quiet { 0 } else { 1u8.saturating_add(verbose) };
    VERBOSITY.store(level, Ordering::Relaxed);
}

/// True with `-q`.
pub fn is_quiet() -> bool {
    VERBOSITY.load(Ordering::Relaxed) == 0
}

/// True with `-v` (or more).
pub fn is_verbose() -> bool {
    VERBOSITY.load(Ordering::Relaxed) >= 2
}

/// A note for the user on stderr (`wrote …`, `device: …`), silenced by `-q`.
pub fn note(msg: &str) {
    if !is_quiet() {
        eprintln!("{msg}");
    }
}

/// A detail shown only with `-v`.
pub fn detail(msg: &str) {
    if is_verbose() {
        eprintln!("{msg}");
    }
}

/// True when colour may be used on stdout: a terminal and no `NO_COLOR`.
pub fn color_stdout() -> bool {
    no_color_unset() && std::io::stdout().is_terminal()
}

fn no_color_unset() -> bool {
    std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// `word` in bold green/red/yellow (ANSI) when `color`, plain otherwise.
pub fn paint(word: &str, tone: Tone, color: bool) -> String {
    if !color {
        return word.to_string();
    }
    let code = match tone {
        Tone::Good => "1;32",
        Tone::Bad => "1;31",
        Tone::Unsure => "1;33",
    };
    format!("\x1b[{code}m{word}\x1b[0m")
}

/// The tone of a verdict word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    /// Holds / pass.
    Good,
    /// Violated / fail.
    Bad,
    /// Not demonstrated / inconclusive.
    Unsure,
}

/// True when progress may be drawn: stderr is a terminal and `-q` was not given.
pub fn enabled(quiet: bool) -> bool {
    !quiet && !is_quiet() && std::io::stderr().is_terminal()
}

/// A progress bar over `len` units (or a spinner when `len` is `None`), drawn on stderr once
/// the work has run for [`SHOW_AFTER`], with elapsed time and ETA.
#[derive(Debug, Clone)]
pub struct Progress {
    bar: ProgressBar,
    start: Instant,
    enabled: bool,
}

impl Progress {
    /// A bar over `len` units of work described by `what`; hidden unless [`enabled`].
    pub fn new(len: Option<u64>, quiet: bool, what: &str) -> Self {
        let bar = match len {
            Some(n) => ProgressBar::with_draw_target(Some(n), ProgressDrawTarget::hidden()),
            None => ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden()),
        };
        let template = if len.is_some() {
            "{prefix} [{bar:30}] {pos}/{len} {msg} (elapsed {elapsed}, ETA {eta})"
        } else {
            "{prefix} {spinner} {msg} (elapsed {elapsed})"
        };
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(what.to_string());
        let enabled = enabled(quiet);
        if enabled {
            // Shown only when the work outlasts SHOW_AFTER; ticking keeps elapsed/ETA current.
            let b = bar.clone();
            std::thread::spawn(move || {
                std::thread::sleep(SHOW_AFTER);
                if !b.is_finished() {
                    b.set_draw_target(ProgressDrawTarget::stderr());
                    b.enable_steady_tick(Duration::from_millis(200));
                }
            });
        }
        Progress {
            bar,
            start: Instant::now(),
            enabled,
        }
    }

    fn maybe_show(&self) {
        if self.enabled && self.bar.is_hidden() && self.start.elapsed() >= SHOW_AFTER {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
        }
    }

    /// Marks `n` more units done.
    pub fn inc(&self, n: u64) {
        self.maybe_show();
        self.bar.inc(n);
    }

    /// Sets what is being done now.
    pub fn set_message(&self, msg: impl Into<String>) {
        self.maybe_show();
        self.bar.set_message(msg.into());
    }

    /// Changes the total.
    pub fn set_length(&self, len: u64) {
        self.bar.set_length(len);
    }

    /// The underlying bar, for library functions that take an `indicatif::ProgressBar`. It is
    /// shown (on a terminal) right away.
    pub fn bar(&self) -> &ProgressBar {
        if self.enabled && self.bar.is_hidden() {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
        }
        &self.bar
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if !self.bar.is_finished() {
            self.bar.finish_and_clear();
        }
    }
}

/// A bar over `len` units of work, hidden unless [`enabled`], with elapsed time and ETA.
/// Shown immediately (for work known to be long); prefer [`Progress`].
pub fn bar(len: u64, quiet: bool, what: &str) -> ProgressBar {
    if !enabled(quiet) {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} (elapsed {elapsed}, ETA {eta})")
    {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_prefix(what.to_string());
    pb
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiet_bars_are_hidden() {
        assert!(bar(3, true, "x").is_hidden());
        let p = Progress::new(Some(3), true, "x");
        p.inc(1);
        assert!(p.bar.is_hidden());
    }

    #[test]
    fn paint_is_plain_without_colour() {
        assert_eq!(paint("PASS", Tone::Good, false), "PASS");
        assert_eq!(paint("FAIL", Tone::Bad, true), "\x1b[1;31mFAIL\x1b[0m");
    }
}
