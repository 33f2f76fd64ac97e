//! The training mechanism of a checkpoint trained outside dpaudit, as its owner states it: a
//! ledger (an event file), or the settings an Opacus user knows (σ, the sampling rate or batch
//! and data set sizes, the steps or epochs). `mia` compares every attack with the limit of that
//! mechanism, exactly as for a dpaudit checkpoint with its own ledger.
//!
//! Opacus' Poisson data loader (`DPDataLoader.from_data_loader`) samples each row with
//! q = 1/len(data_loader) = 1/⌈N/B⌉ ≤ B/N and runs len(data_loader) steps per epoch. From
//! `--batch-size B --dataset-size N` this module takes q = B/N (never below Opacus' rate: the
//! bound can only be looser, never unsound), and from `--epochs E` the steps E·⌈N/B⌉ (or E·⌈1/q⌉
//! from `--sample-rate`): exactly the steps Opacus runs.

use std::path::{Path, PathBuf};

use super::pipeline::{basis_of_event, Basis};
use crate::error::{Error, Result};
use crate::events::{DpEvent, EventFile};

/// The Opacus-style statement of a DP-SGD run (every field optional; [`OpacusSpec::event`]
/// says which are missing).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OpacusSpec {
    /// σ.
    pub noise_multiplier: Option<f64>,
    /// q.
    pub sample_rate: Option<f64>,
    /// Expected (logical) batch size B.
    pub batch_size: Option<u64>,
    /// Data set size N.
    pub dataset_size: Option<u64>,
    /// Optimiser steps.
    pub steps: Option<u64>,
    /// Epochs.
    pub epochs: Option<u64>,
}

impl OpacusSpec {
    /// True when no flag was given.
    pub fn is_empty(&self) -> bool {
        *self == OpacusSpec::default()
    }

    /// `steps` × Poisson(q) ∘ Gaussian(σ); errors name the missing or conflicting flag.
    pub fn event(&self) -> Result<DpEvent> {
        let sigma = self
            .noise_multiplier
            .ok_or_else(|| Error::field("--noise-multiplier", "required to state a DP-SGD mechanism"))?;
        if !(sigma > 0.0 && sigma.is_finite()) {
            return Err(Error::field("--noise-multiplier", "must be a finite number > 0"));
        }
        let (q, per_epoch) = match (self.sample_rate, self.batch_size, self.dataset_size) {
            (Some(_), Some(_), _) => {
                return Err(Error::field(
                    "--sample-rate",
                    "give either --sample-rate or --train-batch-size with --dataset-size, not both",
                ))
            }
            (Some(q), None, _) => {
                if !(q > 0.0 && q <= 1.0) {
                    return Err(Error::field("--sample-rate", "must be in (0, 1]"));
                }
                (q, (1.0 / q).ceil() as u64)
            }
            (None, Some(b), Some(n)) => {
                if b == 0 || n == 0 || b > n {
                    return Err(Error::field(
                        "--train-batch-size",
                        format!("need 1 ≤ batch size ≤ data set size, got {b} and {n}"),
                    ));
                }
                (b as f64 / n as f64, n.div_ceil(b))
            }
            (None, Some(_), None) => {
                return Err(Error::field(
                    "--dataset-size",
                    "required with --train-batch-size (q = B/N)",
                ))
            }
            (None, None, _) => {
                return Err(Error::field(
                    "--sample-rate",
                    "required (or --train-batch-size with --dataset-size) to state a DP-SGD mechanism",
                ))
            }
        };
        let steps = match (self.steps, self.epochs) {
            (Some(_), Some(_)) => return Err(Error::field("--steps", "give either --steps or --epochs, not both")),
            (Some(s), None) => s,
            (None, Some(e)) => e
                .checked_mul(per_epoch)
                .ok_or_else(|| Error::field("--epochs", "too many steps"))?,
            (None, None) => {
                return Err(Error::field(
                    "--steps",
                    "required (or --epochs) to state a DP-SGD mechanism",
                ))
            }
        };
        if steps == 0 {
            return Err(Error::field("--steps", "must be ≥ 1"));
        }
        Ok(DpEvent::dpsgd(sigma, q, steps))
    }
}

/// The guarantee an attack on a diffusers folder is compared with: the folder's own dpaudit
/// ledger (`dpaudit-ledger.toml`) when present, else `--ledger FILE`, else the Opacus-style
/// flags; None when nothing states the mechanism. Stating a mechanism for a folder that has its
/// own ledger is refused (two statements of one training run).
pub fn diffusers_basis(
    folder: &Path,
    ledger: Option<&Path>,
    spec: &OpacusSpec,
    delta: f64,
    trusted: &[crate::provenance::VerifyingKey],
) -> Result<Option<Basis>> {
    let own = folder.join(crate::models::folder::LEDGER);
    if own.is_file() {
        if ledger.is_some() || !spec.is_empty() {
            return Err(Error::field(
                if ledger.is_some() {
                    "--ledger"
                } else {
                    "--noise-multiplier"
                },
                format!(
                    "{} has its own ledger {}; it states how the model was trained",
                    folder.display(),
                    own.display()
                ),
            ));
        }
        // Whether the release is signed, and by whom (with trusted keys: refused unless by one).
        let status = crate::provenance::verify_folder(folder, &crate::models::folder::RELEASED, trusted)?;
        let mut b = of_file(&own, "training ledger", delta)?;
        b.source = format!("{} ({})", b.source, status.describe());
        return Ok(Some(b));
    }
    if !trusted.is_empty() {
        return Err(Error::field(
            "--trust-key",
            format!(
                "{} has no ledger of its own to be signed; a stated mechanism (--ledger or the Opacus-style flags) is the trainer's word",
                folder.display()
            ),
        ));
    }
    match (ledger, spec.is_empty()) {
        (Some(_), false) => Err(Error::field(
            "--ledger",
            "give either --ledger or the Opacus-style flags (--noise-multiplier …), not both",
        )),
        (Some(p), true) => {
            let weights = folder.join(crate::models::folder::WEIGHTS);
            let what = ledger_describes(p, &weights)?;
            let mut b = of_file(p, "stated ledger", delta)?;
            b.source = format!("{} ({what})", b.source);
            Ok(Some(b))
        }
        (None, false) => {
            let ev = spec.event()?;
            Ok(Some(basis_of_event(
                format!("stated DP-SGD mechanism {}", describe(spec, &ev)),
                ev,
                crate::events::Neighbouring::AddRemove,
                delta,
            )))
        }
        (None, true) => Ok(None),
    }
}

/// Whether the ledger `ledger` describes the attacked `weights`: a ledger that names what it
/// released (`# released: <file> sha256 <hex>`, as every dpaudit ledger does) must name these
/// weights by their SHA-256, else it is refused (it describes another training run); a ledger
/// that names no release is the trainer's word and says so.
pub fn ledger_describes(ledger: &Path, weights: &Path) -> Result<&'static str> {
    let named = crate::input::released_entries(ledger);
    if named.is_empty() {
        return Ok("names no released weights: the trainer's word that it describes these");
    }
    let got = crate::input::file_sha256(weights)?;
    if named.iter().any(|r| r.sha256 == got) {
        return Ok("names these weights by their SHA-256");
    }
    let r = &named[0];
    let mut e = Error::field(
        "--ledger",
        format!(
            "the ledger describes the release `{}` with SHA-256 {}, but the attacked weights `{}` have SHA-256 {got}: it is the ledger of other weights",
            r.name,
            r.sha256,
            weights.display()
        ),
    )
    .with_file(ledger);
    e.line = Some(r.line);
    Err(e)
}

fn of_file(p: &Path, what: &str, delta: f64) -> Result<Basis> {
    let f = EventFile::load(p)?;
    Ok(basis_of_event(
        format!("{what} {}", p.display()),
        f.event,
        f.neighbouring,
        delta,
    ))
}

fn describe(spec: &OpacusSpec, ev: &DpEvent) -> String {
    let mut parts = Vec::new();
    if let Some(s) = spec.noise_multiplier {
        parts.push(format!("σ = {s}"));
    }
    match (spec.sample_rate, spec.batch_size, spec.dataset_size) {
        (Some(q), _, _) => parts.push(format!("q = {q}")),
        (None, Some(b), Some(n)) => parts.push(format!("q = B/N = {b}/{n}")),
        _ => {}
    }
    if let Some(e) = spec.epochs {
        parts.push(format!("{e} epochs"));
    }
    format!("({}: {})", parts.join(", "), ev.ledger().lines().next().unwrap_or(""))
}

/// The path of a diffusers folder's own ledger, when it has one.
pub fn own_ledger(folder: &Path) -> Option<PathBuf> {
    let p = folder.join(crate::models::folder::LEDGER);
    p.is_file().then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(
        sigma: Option<f64>,
        q: Option<f64>,
        b: Option<u64>,
        n: Option<u64>,
        steps: Option<u64>,
        epochs: Option<u64>,
    ) -> OpacusSpec {
        OpacusSpec {
            noise_multiplier: sigma,
            sample_rate: q,
            batch_size: b,
            dataset_size: n,
            steps,
            epochs,
        }
    }

    /// Opacus' step count: ⌈N/B⌉ steps per epoch; q = B/N.
    #[test]
    fn opacus_flags_give_the_dpsgd_event_opacus_runs() {
        let e = spec(Some(1.1), None, Some(32), Some(100), None, Some(3))
            .event()
            .unwrap();
        assert_eq!(e, DpEvent::dpsgd(1.1, 0.32, 12));
        let e = spec(Some(2.0), Some(0.01), None, None, Some(500), None)
            .event()
            .unwrap();
        assert_eq!(e, DpEvent::dpsgd(2.0, 0.01, 500));
        let e = spec(Some(2.0), Some(0.3), None, None, None, Some(2)).event().unwrap();
        assert_eq!(e, DpEvent::dpsgd(2.0, 0.3, 8));
    }

    /// Every missing or conflicting flag is named.
    #[test]
    fn incomplete_or_conflicting_flags_are_named() {
        let named = |s: OpacusSpec, flag: &str| {
            let e = s.event().unwrap_err().to_string();
            assert!(e.contains(flag), "{e} does not name {flag}");
        };
        named(spec(None, Some(0.1), None, None, Some(1), None), "--noise-multiplier");
        named(spec(Some(1.0), None, None, None, Some(1), None), "--sample-rate");
        named(spec(Some(1.0), None, Some(4), None, Some(1), None), "--dataset-size");
        named(
            spec(Some(1.0), Some(0.1), Some(4), Some(9), Some(1), None),
            "--sample-rate",
        );
        named(spec(Some(1.0), Some(0.1), None, None, None, None), "--steps");
        named(spec(Some(1.0), Some(0.1), None, None, Some(1), Some(1)), "--steps");
        named(spec(Some(1.0), Some(1.5), None, None, Some(1), None), "--sample-rate");
        named(
            spec(Some(1.0), None, Some(10), Some(9), Some(1), None),
            "--train-batch-size",
        );
        named(
            spec(Some(-1.0), Some(0.1), None, None, Some(1), None),
            "--noise-multiplier",
        );
    }
}
