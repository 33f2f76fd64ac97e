//! DP-SGD described the way its users describe it: epochs, batch size, dataset size and how the
//! batches are drawn. [`TrainingRun::derive`] turns that into the number of steps and the
//! sampling rate that the accountants need, and states the derivation in words.
//!
//! Conventions (Opacus 1.6, `opacus/accountants/utils.py::get_noise_multiplier` and
//! `opacus/privacy_engine.py::PrivacyEngine.make_private`; see docs/accounting.md):
//!
//! - [`BatchSampling::Poisson`]: every record joins each batch independently with probability
//!   q = B/N, and the run has T = ⌊E·N/B⌋ steps. This is Opacus' `get_noise_multiplier(epochs=E,
//!   sample_rate=q)`, which sets `steps = int(epochs / sample_rate)`, and the convention of
//!   dp_accounting's DP-SGD examples; computed here in exact integer arithmetic.
//! - [`BatchSampling::PoissonLoader`]: what Opacus' `PrivacyEngine.make_private(...,
//!   poisson_sampling=True)` records while it trains: it replaces the user's `DataLoader` (batch
//!   B, `drop_last=False`, so L = ⌈N/B⌉ batches) by a `DPDataLoader` with `sample_rate = 1/L`
//!   whose sampler yields L batches per epoch; the accountant hook records one step at q = 1/L per
//!   optimiser step, so T = E·L.
//! - [`BatchSampling::Shuffle`]: a shuffled permutation cut into ⌈N/B⌉ fixed-size batches per
//!   epoch (a plain `DataLoader(shuffle=True)`). Each record is in exactly one batch per epoch.
//!   Shuffling is not Poisson sampling, and no amplification is claimed: the sound event is E
//!   compositions of the Gaussian step (one per epoch that touches the record). Opacus with
//!   `poisson_sampling=False` still accounts these steps as if Poisson at q = 1/L, which is not a
//!   guarantee (Chua et al., "How Private are DP-SGD Implementations?", ICML 2024).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::events::DpEvent;
use crate::report::num::sig6;

/// How the batches of a DP-SGD run are drawn (`--sampling`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum BatchSampling {
    /// Poisson sampling at q = B/N for ⌊E·N/B⌋ steps (Opacus `get_noise_multiplier`).
    #[default]
    Poisson,
    /// Poisson sampling as Opacus' `PrivacyEngine` runs it over a `DataLoader`:
    /// q = 1/⌈N/B⌉ for E·⌈N/B⌉ steps.
    PoissonLoader,
    /// Shuffled fixed-size batches (each record once per epoch); accounted without amplification.
    Shuffle,
}

impl BatchSampling {
    /// The flag value as users write it.
    pub fn as_str(self) -> &'static str {
        match self {
            BatchSampling::Poisson => "poisson",
            BatchSampling::PoissonLoader => "poisson-loader",
            BatchSampling::Shuffle => "shuffle",
        }
    }
}

/// A DP-SGD run in users' words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrainingRun {
    /// Number of epochs E (passes over the data).
    pub epochs: u64,
    /// Batch size B (the expected batch size under Poisson sampling).
    pub batch_size: u64,
    /// Dataset size N.
    pub dataset_size: u64,
    /// How batches are drawn.
    pub sampling: BatchSampling,
}

/// Steps and sampling rate derived from a [`TrainingRun`], with the derivation in words.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Derived {
    /// The run the numbers come from.
    pub run: TrainingRun,
    /// Optimiser steps T that the run takes.
    pub steps: u64,
    /// Poisson sampling rate q of each step (1 for shuffled batches: no amplification claimed).
    pub sample_rate: f64,
    /// How many Gaussian steps touch one record, as accounted (T for Poisson, E for shuffle).
    pub accounted_steps: u64,
    /// One line per derivation step, for reports.
    pub derivation: Vec<String>,
}

fn ceil_div(a: u64, b: u64) -> u64 {
    a / b + u64::from(!a.is_multiple_of(b))
}

impl TrainingRun {
    /// Checks the numbers; errors name the flag.
    pub fn validate(&self) -> Result<()> {
        if self.epochs == 0 {
            return Err(Error::field("--epochs", "must be ≥ 1"));
        }
        if self.batch_size == 0 {
            return Err(Error::field("--batch-size", "must be ≥ 1"));
        }
        if self.dataset_size == 0 {
            return Err(Error::field("--dataset-size", "must be ≥ 1"));
        }
        if self.batch_size > self.dataset_size {
            return Err(Error::field(
                "--batch-size",
                format!(
                    "batch size {} is larger than the dataset size {}",
                    self.batch_size, self.dataset_size
                ),
            ));
        }
        if (self.epochs as u128) * (self.dataset_size as u128) / (self.batch_size as u128) > u64::MAX as u128 {
            return Err(Error::field("--epochs", "the number of steps does not fit in 64 bits"));
        }
        Ok(())
    }

    /// Steps and q under the run's sampling convention (see the module documentation).
    pub fn derive(&self) -> Result<Derived> {
        self.validate()?;
        let (e, b, n) = (self.epochs, self.batch_size, self.dataset_size);
        let loader_len = ceil_div(n, b);
        let mut lines = Vec::new();
        let (steps, q, accounted) = match self.sampling {
            BatchSampling::Poisson => {
                // ⌊E·N/B⌋ in exact integer arithmetic (Opacus: int(epochs / sample_rate)).
                let t = ((e as u128) * (n as u128) / (b as u128)) as u64;
                let q = b as f64 / n as f64;
                lines.push(format!(
                    "Poisson sampling: q = B/N = {b}/{n} = {}; steps T = ⌊E·N/B⌋ = ⌊{e}·{n}/{b}⌋ = {t}",
                    sig6(q)
                ));
                lines.push(
                    "convention: Opacus get_noise_multiplier(epochs=E, sample_rate=q) sets steps = int(epochs / sample_rate) \
                     (opacus/accountants/utils.py); dp_accounting's DP-SGD examples count the same way"
                        .to_string(),
                );
                // Opacus computes int(epochs / (B/N)) in floating point, which can land one step
                // below the exact count; the exact count is the larger one (ε can only rise).
                let opacus = (e as f64 / q) as u64;
                if opacus != t {
                    lines.push(format!(
                        "Opacus' floating-point int(epochs / sample_rate) gives {opacus} here (rounding); dpaudit counts the exact {t}"
                    ));
                }
                if !(e as u128 * n as u128).is_multiple_of(b as u128) {
                    lines.push(format!(
                        "E·N/B = {} is not a whole number: the fractional last step is not run and not counted",
                        (e as f64) * (n as f64) / (b as f64)
                    ));
                }
                (t, q, t)
            }
            BatchSampling::PoissonLoader => {
                // DPDataLoader.from_data_loader: sample_rate = 1/L; its UniformWithReplacementSampler
                // yields int(1/sample_rate) batches (floating point: L − 1 for some L, e.g. 93);
                // make_private then records q = 1/len(dp_loader) per optimiser step.
                let per_epoch = (1.0 / (1.0 / loader_len as f64)) as u64;
                let t = e.saturating_mul(per_epoch);
                let q = 1.0 / per_epoch as f64;
                lines.push(format!(
                    "Poisson sampling over a DataLoader: L = ⌈N/B⌉ = ⌈{n}/{b}⌉ = {loader_len} batches; Opacus' DPDataLoader runs \
                     int(1/(1/L)) = {per_epoch} batches per epoch and records q = 1/{per_epoch} = {} per step; steps T = E·{per_epoch} = {e}·{per_epoch} = {t}",
                    sig6(q)
                ));
                if per_epoch != loader_len {
                    lines.push(format!(
                        "int(1/(1/{loader_len})) = {per_epoch} in floating point: Opacus runs one batch fewer per epoch and records \
                         q = 1/{per_epoch}, slightly above the sampler's real 1/{loader_len} (ε can only be higher)"
                    ));
                }
                lines.push(
                    "convention: Opacus PrivacyEngine.make_private(poisson_sampling=True): DPDataLoader.from_data_loader sets \
                     sample_rate = 1/len(data_loader) (opacus/data_loader.py), UniformWithReplacementSampler yields int(1/sample_rate) \
                     batches (opacus/utils/uniform_sampler.py), and the accountant hook records one step at 1/len(dp_loader) per \
                     optimiser step (opacus/privacy_engine.py)"
                        .to_string(),
                );
                (t, q, t)
            }
            BatchSampling::Shuffle => {
                let t = e.saturating_mul(loader_len);
                lines.push(format!(
                    "shuffled fixed-size batches: L = ⌈N/B⌉ = ⌈{n}/{b}⌉ = {loader_len} batches per epoch, steps T = E·L = {t}; \
                     each record is in exactly one batch per epoch"
                ));
                lines.push(format!(
                    "accounted without amplification: {e} Gaussian steps per record (one per epoch); shuffling is not Poisson \
                     sampling, and Opacus' accounting of it as Poisson at q = 1/L = {} is not a guarantee",
                    sig6(1.0 / loader_len as f64)
                ));
                (t, 1.0, e)
            }
        };
        Ok(Derived {
            run: *self,
            steps,
            sample_rate: q,
            accounted_steps: accounted,
            derivation: lines,
        })
    }
}

impl Derived {
    /// The event of the run with noise multiplier σ: T × Poisson(q) ∘ Gaussian(σ), or for
    /// shuffled batches E × Gaussian(σ).
    pub fn event(&self, noise_multiplier: f64) -> DpEvent {
        DpEvent::dpsgd(noise_multiplier, self.sample_rate, self.accounted_steps)
    }

    /// Why [`Derived::event`] only over-approximates the run (shuffled batches accounted as
    /// full-batch steps with no amplification), or None when it is the run's event.
    pub fn over_approximates(&self) -> Option<String> {
        (self.run.sampling == BatchSampling::Shuffle).then(|| {
            "shuffled batches accounted as full-batch Gaussian steps with no amplification, which can only overstate ε"
                .to_string()
        })
    }

    /// The derivation as one line of text.
    pub fn summary(&self) -> String {
        if self.run.sampling == BatchSampling::Shuffle {
            return format!(
                "{} epochs × batch {} of N = {} (shuffle sampling) → {} steps; each record is in one batch per epoch \
                 ({} Gaussian steps accounted, no amplification)",
                self.run.epochs, self.run.batch_size, self.run.dataset_size, self.steps, self.accounted_steps
            );
        }
        format!(
            "{} epochs × batch {} of N = {} ({} sampling) → {} steps at q = {}",
            self.run.epochs,
            self.run.batch_size,
            self.run.dataset_size,
            self.run.sampling.as_str(),
            self.steps,
            sig6(self.sample_rate)
        )
    }
}

/// Builds a [`TrainingRun`] from optional flags: all of `--epochs`, `--batch-size` and
/// `--dataset-size` or none of them (then `None`). A partial set is an error naming the missing
/// flag.
pub fn from_flags(
    epochs: Option<u64>,
    batch_size: Option<u64>,
    dataset_size: Option<u64>,
    sampling: Option<BatchSampling>,
) -> Result<Option<TrainingRun>> {
    match (epochs, batch_size, dataset_size) {
        (None, None, None) => {
            if sampling.is_some() {
                return Err(Error::field(
                    "--sampling",
                    "needs --epochs, --batch-size and --dataset-size",
                ));
            }
            Ok(None)
        }
        (Some(e), Some(b), Some(n)) => {
            let run = TrainingRun {
                epochs: e,
                batch_size: b,
                dataset_size: n,
                sampling: sampling.unwrap_or_default(),
            };
            run.validate()?;
            Ok(Some(run))
        }
        (e, b, _) => {
            let missing = if e.is_none() {
                "--epochs"
            } else if b.is_none() {
                "--batch-size"
            } else {
                "--dataset-size"
            };
            Err(Error::field(
                missing,
                "required: --epochs, --batch-size and --dataset-size go together",
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(e: u64, b: u64, n: u64, s: BatchSampling) -> Derived {
        TrainingRun {
            epochs: e,
            batch_size: b,
            dataset_size: n,
            sampling: s,
        }
        .derive()
        .unwrap()
    }

    #[test]
    fn poisson_matches_the_reference_rows() {
        // fixtures/reference/dpsgd.csv: N = 60000, batch 64 → q = 0.0010666666666666667, T = 9375 / 46875;
        // N = 50000 → q = 0.00128, T = 7812 / 39062.
        let d = run(10, 64, 60_000, BatchSampling::Poisson);
        assert_eq!((d.steps, d.sample_rate), (9375, 0.0010666666666666667));
        assert_eq!(run(50, 64, 60_000, BatchSampling::Poisson).steps, 46875);
        let d = run(10, 64, 50_000, BatchSampling::Poisson);
        assert_eq!((d.steps, d.sample_rate), (7812, 0.00128));
        assert_eq!(run(50, 64, 50_000, BatchSampling::Poisson).steps, 39062);
        // int(100 / (100/2994)) = 2993 in floating point; the exact count is 2994.
        let d = run(100, 100, 2994, BatchSampling::Poisson);
        assert_eq!(d.steps, 2994);
        assert!(
            d.derivation.iter().any(|l| l.contains("gives 2993")),
            "{:?}",
            d.derivation
        );
    }

    #[test]
    fn loader_and_shuffle_count_loader_batches() {
        // ⌈60000/256⌉ = 235 batches per epoch.
        let d = run(30, 256, 60_000, BatchSampling::PoissonLoader);
        assert_eq!((d.steps, d.sample_rate), (30 * 235, 1.0 / 235.0));
        // Opacus' int(1/(1/93)) = 92: one batch fewer per epoch, recorded at q = 1/92.
        let d = run(2, 64, 93 * 64, BatchSampling::PoissonLoader);
        assert_eq!((d.steps, d.sample_rate), (2 * 92, 1.0 / 92.0));
        let d = run(30, 256, 60_000, BatchSampling::Shuffle);
        assert_eq!((d.steps, d.sample_rate, d.accounted_steps), (7050, 1.0, 30));
        assert_eq!(d.event(2.0), DpEvent::dpsgd(2.0, 1.0, 30));
    }

    #[test]
    fn partial_flags_name_the_missing_one() {
        let e = from_flags(Some(1), None, Some(10), None).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("--batch-size"));
        let e = from_flags(Some(1), Some(20), Some(10), None).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("--batch-size"));
        assert!(from_flags(None, None, None, None).unwrap().is_none());
        assert!(from_flags(None, None, None, Some(BatchSampling::Shuffle)).is_err());
    }
}
