//! `DPAUDIT_TIMING=1`: where a run's time goes, as `timing: <what>: <seconds> s` lines on stderr
//! (opening the device, checkpoint loading and its parts, the data, each attack's scoring, every
//! UNet forward, the metrics). It is meant for
//! comparing dpaudit's phases with another tool's (scripts/compare_attacks_torch.py, the GPU
//! device runs) and is off by default. On a GPU it waits for the device after each UNet forward,
//! so that a forward's line is its own time; this slows the run slightly.
//! `DPAUDIT_TIMING=phases` writes the same lines without those of each forward, and so without
//! the waits: the phases' times are then those of an untimed run (an attack's line ends with
//! its scores copied back to the host, so it includes all of its device work).
//! `DPAUDIT_TIMING=kernels` adds, for the CUDA UNet forward, the GPU time of each kind of work
//! (convolutions, group norms, GEMMs, …) from CUDA events around every launch, summed over the
//! run and written after the scoring; the events themselves cost host time.
//! Every enabled mode also writes, after the checkpoint's loading and after each attack's
//! scoring, the host time of named parts inside that phase (`timing: within: …`): on a GPU,
//! building each convolution shape's cuDNN plan (and, within that, choosing its algorithm), a
//! first-use cost per shape that PyTorch's warm-up pays before its timed loop; for the loss
//! attack, drawing each draw's noise on the host and copying it to the device.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// True when `DPAUDIT_TIMING` is set to anything but empty or `0`.
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("DPAUDIT_TIMING").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// True when every UNet forward is timed (`DPAUDIT_TIMING` enabled and not `phases`; `kernels`
/// included, whose events are read after each forward anyway).
pub fn forwards() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| enabled() && std::env::var("DPAUDIT_TIMING").is_ok_and(|v| v != "phases"))
}

/// True for `DPAUDIT_TIMING=kernels` (GPU time per kind of kernel in the CUDA UNet forward).
pub fn kernels() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("DPAUDIT_TIMING").is_ok_and(|v| v == "kernels"))
}

/// GPU milliseconds and launches per kind of kernel (`DPAUDIT_TIMING=kernels`).
static KERNELS: Mutex<BTreeMap<&'static str, (f64, u64)>> = Mutex::new(BTreeMap::new());

/// Adds `ms` of GPU time to the kind `what`.
pub fn add_kernel_time(what: &'static str, ms: f64) {
    let mut m = KERNELS.lock().unwrap_or_else(|p| p.into_inner());
    let e = m.entry(what).or_insert((0.0, 0));
    e.0 += ms;
    e.1 += 1;
}

/// Writes the GPU time per kind of kernel so far (`timing: GPU kernels: …`), largest first,
/// and starts the sums again; nothing when none was recorded.
pub(crate) fn kernel_summary() {
    let mut m = KERNELS.lock().unwrap_or_else(|p| p.into_inner());
    if m.is_empty() {
        return;
    }
    let mut v: Vec<(&str, (f64, u64))> = m.iter().map(|(k, v)| (*k, *v)).collect();
    v.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
    let total: f64 = v.iter().map(|(_, (ms, _))| ms).sum();
    let parts: Vec<String> = v.iter().map(|(k, (ms, n))| format!("{k} {:.1} ms ({n})", ms)).collect();
    eprintln!("timing: GPU kernels: {} (total {total:.1} ms)", parts.join(", "));
    m.clear();
}

/// Host seconds and occurrences per named part of a phase (e.g. building a convolution shape's
/// cuDNN plan, the loss attack's noise), when timing is enabled.
static WITHIN: Mutex<BTreeMap<&'static str, (f64, u64)>> = Mutex::new(BTreeMap::new());

/// Charges the time since `since` to the part `what` (nothing when timing is off).
pub(crate) fn add_within_time(what: &'static str, since: Instant) {
    if !enabled() {
        return;
    }
    let mut m = WITHIN.lock().unwrap_or_else(|p| p.into_inner());
    let e = m.entry(what).or_insert((0.0, 0));
    e.0 += since.elapsed().as_secs_f64();
    e.1 += 1;
}

/// Writes the time per part so far (`timing: within: cuDNN plan 18 in 0.0950 s, …`: count,
/// then seconds in all) and starts the sums again; nothing when none was recorded.
pub(crate) fn within_summary() {
    let mut m = WITHIN.lock().unwrap_or_else(|p| p.into_inner());
    if m.is_empty() {
        return;
    }
    let parts: Vec<String> = m.iter().map(|(k, (s, n))| format!("{k} {n} in {s:.4} s")).collect();
    eprintln!("timing: within: {}", parts.join(", "));
    m.clear();
}

/// Writes `timing: {what}: {seconds since `since`} s` on stderr when enabled.
pub fn note(what: impl std::fmt::Display, since: Instant) {
    if enabled() {
        eprintln!("timing: {what}: {:.4} s", since.elapsed().as_secs_f64());
    }
}
