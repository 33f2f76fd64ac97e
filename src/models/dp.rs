//! The primitives of the DP-SGD step (RAPID's Algorithm 2, line 13, and Opacus' Poisson-sampled
//! DP-SGD): the CSPRNG of the private draws, the released update (Σᵢ clip_C(gᵢ) + N(0, σ²C² I))/B
//! with B = q·n the expected batch size, the ledger file naming the [`DpEvent`] that ran, and
//! the ε it spent. The training orchestrator's step loop ([`super::train::dp_sgd`]) calls these
//! for both model families.

use std::collections::HashMap;

use candle_core::Tensor;
use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

use crate::error::{Error, Result};
use crate::events::{DpEvent, EventFile, Neighbouring};

use super::canary::Defect;

pub use crate::numeric::normals;

/// A CSPRNG for DP randomness: ChaCha20 keyed with 32 bytes from the operating system
/// (`getrandom`) when `seed` is None, else seeded (reproducible, not secret).
pub fn secret_rng(seed: Option<u64>) -> ChaCha20Rng {
    match seed {
        Some(s) => ChaCha20Rng::seed_from_u64(s ^ 0xd1ff_5eed),
        None => ChaCha20Rng::from_os_rng(),
    }
}

/// The update DP-SGD releases for one batch (RAPID Alg. 2 line 13): (Σᵢ clip_C(gᵢ) + N(0, σ²C² I))
/// / B, with B = q·n the expected batch size, for every parameter; `noise` draws the Gaussian.
pub fn release<R: Rng + ?Sized>(
    sum: &HashMap<String, Tensor>,
    noise_std: f64,
    expected_batch: f64,
    noise: &mut R,
) -> Result<HashMap<String, Tensor>> {
    release_with(sum, noise_std, expected_batch, noise, None)
}

/// [`release`] with a test's [`Defect`] applied to the noise (σ halved, ÷B twice, or noise on
/// only the first half of the tensors by name); `None` is the correct mechanism.
#[doc(hidden)]
pub fn release_with<R: Rng + ?Sized>(
    sum: &HashMap<String, Tensor>,
    noise_std: f64,
    expected_batch: f64,
    noise: &mut R,
    defect: Option<Defect>,
) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::with_capacity(sum.len());
    // Draw in name order: a seeded run must give the same noise to the same parameter.
    let mut names: Vec<&String> = sum.keys().collect();
    names.sort();
    let half = names.len().div_ceil(2);
    for (k, name) in names.into_iter().enumerate() {
        let g = &sum[name];
        let std = match defect {
            Some(Defect::NoiseHalved) => noise_std / 2.0,
            Some(Defect::NoiseOverBatchTwice) => noise_std / expected_batch,
            Some(Defect::NoiseOnSomeTensors) if k >= half => 0.0,
            _ => noise_std,
        };
        let z = normals(noise, g.elem_count());
        let z = Tensor::from_vec(z, g.dims(), g.device())?;
        out.insert(name.clone(), ((g + (z * std)?)? / expected_batch)?);
    }
    Ok(out)
}

/// The ledger file: an [`EventFile`] (schema 1) that `dpaudit account --event` reads.
pub fn ledger_toml(event: &DpEvent, delta: f64, comment: &str) -> Result<String> {
    let f = EventFile {
        schema_version: 1,
        neighbouring: Neighbouring::AddRemove,
        delta: Some(delta),
        event: event.clone(),
    };
    let body = toml::to_string(&f).map_err(|e| Error::input(e.to_string()))?;
    let mut s = String::new();
    for line in comment.lines() {
        s.push_str("# ");
        s.push_str(line);
        s.push('\n');
    }
    s.push_str(&body);
    Ok(s)
}

/// The ε a training run spent: the tightest sound ε of its ledger's `event` at `delta`, with the
/// accountant and its bound kind (`"pld (upper_bound)"`), as every card records it.
pub fn spent_epsilon(event: &DpEvent, delta: f64) -> Option<(f64, String)> {
    let (gs, _) = crate::accountants::attack_limits::guarantees(event, delta);
    let best = crate::accountants::attack_limits::tightest(&gs, |g| g.epsilon)?;
    let kind = gs
        .iter()
        .find(|g| g.source() == best.1)
        .map(|g| g.kind.as_str())
        .unwrap_or("");
    Some((best.0, format!("{} ({kind})", best.1)))
}
