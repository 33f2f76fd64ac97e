//! `DPAUDIT_TIMING=1`: where a run's time goes, as `timing: <what>: <seconds> s` lines on stderr
//! (checkpoint loading, each attack's scoring, every UNet forward, the metrics). It is meant for
//! comparing dpaudit's phases with another tool's (scripts/compare_attacks_torch.py, the GPU
//! device runs) and is off by default. On a GPU it waits for the device after each UNet forward,
//! so that a forward's line is its own time; this slows the run slightly.
//! `DPAUDIT_TIMING=phases` writes the same lines without those of each forward, and so without
//! the waits: the phases' times are then those of an untimed run (an attack's line ends with
//! its scores copied back to the host, so it includes all of its device work).

use std::sync::OnceLock;
use std::time::Instant;

/// True when `DPAUDIT_TIMING` is set to anything but empty or `0`.
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("DPAUDIT_TIMING").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// True when every UNet forward is timed (`DPAUDIT_TIMING` enabled and not `phases`).
pub fn forwards() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| enabled() && std::env::var("DPAUDIT_TIMING").is_ok_and(|v| v != "phases"))
}

/// Writes `timing: {what}: {seconds since `since`} s` on stderr when enabled.
pub fn note(what: impl std::fmt::Display, since: Instant) {
    if enabled() {
        eprintln!("timing: {what}: {:.4} s", since.elapsed().as_secs_f64());
    }
}
