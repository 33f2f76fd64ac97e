//! Feedback on stderr: progress bars with an ETA for long work, notes (`-v`), colour.
//!
//! Progress is drawn on stderr as a bar when stderr is a terminal and `-q` was not given, and
//! only once the work has run for [`SHOW_AFTER`] (short commands never flash a bar), so stdout
//! stays machine-readable. When stderr is not a terminal (a CI log, a pipe), a plain line such
//! as `verify: 3/6 claims (50%), 2.0s elapsed, ETA 2.0s` is written every
//! [`line_interval`] (5 s; `DPAUDIT_PROGRESS_INTERVAL` in seconds overrides it) unless `-q`.
//! Progress counts the unit of work ([`unit_of`]: claims, grid points, steps, images); the ETA
//! is elapsed × remaining / done, and unknown ("?") until one unit is done. Colour follows the `NO_COLOR` convention
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
pub(crate) fn is_quiet() -> bool {
    VERBOSITY.load(Ordering::Relaxed) == 0
}

/// True with `-v` (or more).
pub(crate) fn is_verbose() -> bool {
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
pub(crate) fn paint(word: &str, tone: Tone, color: bool) -> String {
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

/// True when progress is written as plain lines: stderr is not a terminal and `-q` was not given.
pub(crate) fn lines_enabled(quiet: bool) -> bool {
    !quiet && !is_quiet() && !std::io::stderr().is_terminal()
}

/// The time between two plain progress lines: 5 s, or `DPAUDIT_PROGRESS_INTERVAL` seconds.
pub fn line_interval() -> Duration {
    std::env::var("DPAUDIT_PROGRESS_INTERVAL")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map_or(Duration::from_secs(5), |s| Duration::from_secs_f64(s.max(0.01)))
}

/// The unit of work a command's progress counts, by the command's label.
pub fn unit_of(what: &str) -> &'static str {
    match what {
        "verify" => "claims",
        "sweep" => "grid points",
        "train" | "dp-sgd" => "steps",
        "mia" | "mia shard" => "images scored",
        "account" | "check" => "accountants",
        "calibrate" => "evaluations",
        _ => "units",
    }
}

/// Remaining time at the average rate so far: elapsed × (len − pos) / pos; `None` before the
/// first unit is done (no rate is known) or when the total is unknown.
pub(crate) fn eta(pos: u64, len: Option<u64>, elapsed: Duration) -> Option<Duration> {
    let len = len?;
    if pos == 0 {
        return None;
    }
    let left = len.saturating_sub(pos);
    Some(elapsed.mul_f64(left as f64 / pos as f64))
}

/// A duration for people: `0.4s`, `12s`, `3m05s`, `1h02m`.
pub fn human(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 10.0 {
        format!("{s:.1}s")
    } else if s < 60.0 {
        format!("{}s", s as u64)
    } else if s < 3600.0 {
        format!("{}m{:02}s", s as u64 / 60, s as u64 % 60)
    } else {
        format!("{}h{:02}m", s as u64 / 3600, (s as u64 % 3600) / 60)
    }
}

/// One plain progress line (no newline): `verify: 3/6 claims (50%), 2.0s elapsed, ETA 2.0s — msg`.
pub fn line(what: &str, pos: u64, len: Option<u64>, elapsed: Duration, msg: &str) -> String {
    let unit = unit_of(what);
    let mut s = match len {
        Some(n) if n > 0 => format!(
            "{what}: {pos}/{n} {unit} ({}%), {} elapsed, ETA {}",
            (pos.min(n) * 100) / n,
            human(elapsed),
            eta(pos, Some(n), elapsed).map_or("?".to_string(), human)
        ),
        _ if pos == 0 => format!("{what}: {} elapsed", human(elapsed)),
        _ => format!("{what}: {pos} {unit} done, {} elapsed", human(elapsed)),
    };
    if !msg.is_empty() {
        s.push_str(" — ");
        s.push_str(msg);
    }
    s
}

/// Writes a plain progress line for `pb` every [`line_interval`] until it finishes (for stderr
/// that is not a terminal).
fn spawn_lines(pb: &ProgressBar, what: &str) {
    // A weak handle: a bar dropped without `finish` stops its lines too.
    let weak = pb.downgrade();
    let what = what.to_string();
    let every = line_interval();
    std::thread::spawn(move || loop {
        std::thread::sleep(every);
        let Some(pb) = weak.upgrade() else { break };
        if pb.is_finished() {
            break;
        }
        let len = pb.length().filter(|n| *n > 0);
        eprintln!("{}", line(&what, pb.position(), len, pb.elapsed(), &pb.message()));
    });
}

/// The bar template: position over the total in the unit of work, elapsed time, honest ETA.
fn bar_style(what: &str) -> Option<ProgressStyle> {
    let unit = unit_of(what);
    let t = format!("{{prefix}} [{{bar:30}}] {{pos}}/{{len}} {unit} {{msg}} (elapsed {{elapsed}}, ETA {{honest_eta}})");
    ProgressStyle::with_template(&t).ok().map(|s| {
        s.progress_chars("=> ").with_key(
            "honest_eta",
            |st: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = write!(
                    w,
                    "{}",
                    eta(st.pos(), st.len(), st.elapsed()).map_or("?".to_string(), human)
                );
            },
        )
    })
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
        let style = if len.is_some() {
            bar_style(what)
        } else {
            ProgressStyle::with_template("{prefix} {spinner} {msg} (elapsed {elapsed})")
                .ok()
                .map(|s| s.progress_chars("=> "))
        };
        if let Some(style) = style {
            bar.set_style(style);
        }
        bar.set_prefix(what.to_string());
        let enabled = enabled(quiet);
        if lines_enabled(quiet) {
            spawn_lines(&bar, what);
        }
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
    pub(crate) fn set_length(&self, len: u64) {
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
        let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::hidden());
        if lines_enabled(quiet) {
            spawn_lines(&pb, what);
        }
        return pb;
    }
    let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Some(style) = bar_style(what) {
        pb.set_style(style);
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
    fn eta_is_unknown_until_a_unit_is_done_then_proportional() {
        assert_eq!(eta(0, Some(10), Duration::from_secs(30)), None);
        assert_eq!(eta(5, None, Duration::from_secs(30)), None);
        assert_eq!(eta(2, Some(10), Duration::from_secs(4)), Some(Duration::from_secs(16)));
        assert_eq!(eta(10, Some(10), Duration::from_secs(4)), Some(Duration::ZERO));
        let l = line("verify", 3, Some(6), Duration::from_secs(2), "");
        assert_eq!(l, "verify: 3/6 claims (50%), 2.0s elapsed, ETA 2.0s");
        assert_eq!(human(Duration::from_secs(185)), "3m05s");
        assert!(line("sweep", 0, Some(4), Duration::from_secs(1), "x").ends_with("ETA ? — x"));
    }

    #[test]
    fn paint_is_plain_without_colour() {
        assert_eq!(paint("PASS", Tone::Good, false), "PASS");
        assert_eq!(paint("FAIL", Tone::Bad, true), "\x1b[1;31mFAIL\x1b[0m");
    }
}
