//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// Path of the repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs the real `dpaudit` binary with `args` from the repository root.
pub fn dpaudit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dpaudit"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("spawn dpaudit")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Reads a CSV with a header from `fixtures/` into rows of (column → string) maps.
pub fn read_csv(rel: &str) -> Vec<std::collections::HashMap<String, String>> {
    let mut rdr = csv::Reader::from_path(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    let headers = rdr.headers().unwrap().clone();
    rdr.records()
        .map(|r| {
            let r = r.unwrap();
            headers
                .iter()
                .zip(r.iter())
                .map(|(h, v)| (h.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

/// Relative difference |a − b| / max(|b|, tiny).
pub fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-300)
}

/// The one bless switch: `DPAUDIT_BLESS=1` rewrites golden files from the current output
/// instead of comparing (see fixtures/golden/README.md). Any other value, or none, compares.
pub fn bless() -> bool {
    std::env::var("DPAUDIT_BLESS").is_ok_and(|v| v == "1")
}

/// True when running in CI (`CI=true`): tests that need an outside program must run there
/// instead of skipping.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// `dpaudit mia` on the shipped MNIST diffusers checkpoint with its data and split; callers
/// append the rest of the command line.
pub const MNIST_MIA: [&str; 7] = [
    "mia",
    "--checkpoint",
    "models/mnist-ddpm",
    "--data",
    "fixtures/data/mnist/mnist-10k.u8.gz",
    "--split",
    "fixtures/splits/mnist.toml",
];

/// Runs [`MNIST_MIA`] followed by `rest`.
pub fn mnist_mia(rest: &[&str]) -> Output {
    let mut args = MNIST_MIA.to_vec();
    args.extend_from_slice(rest);
    dpaudit(&args)
}

/// A certified lower bound on the true ε(δ) of Poisson(p) ∘ Gaussian(μ) steps `(p, μ, count)`
/// under add/remove: the lower-bound PLD (docs/pld.md, "Lower-bound PLD") on a grid fine enough
/// for `near`, the value under test (≈ near/2000, within [1e-9, 1e-4]); 0 where it certifies
/// nothing. The floor for a PLD upper bound where dp_accounting's grid-1e-4 value is not one: at
/// tiny ε the refined grid beats that value (docs/pld.md, "Tiny ε").
pub fn certified_floor(steps: &[(f64, f64, u64)], delta: f64, near: f64) -> f64 {
    use dpaudit::accountants::pld_lower::epsilon_lower;
    use dpaudit::accountants::sound::PairStep;
    let pairs: Vec<PairStep> = steps.iter().map(|&(p, mu, count)| PairStep { p, mu, count }).collect();
    let h = (near / 2000.0).clamp(1e-9, 1e-4);
    epsilon_lower(&pairs, delta, h).map_or(0.0, |l| l.epsilon)
}
