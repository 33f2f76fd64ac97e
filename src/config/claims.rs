//! Claims files: a published pipeline's stated settings and (ε, δ), one table per claim.
//!
//! ```toml
//! schema_version = 1
//!
//! [[dp_rdm]]
//! id = "cifar10-T1000"
//! source = "DP-RDM, Figure 15"
//! dataset = "CIFAR-10"
//! n = 50000
//! queries = 1000
//! q = 0.01
//! sigma = 0.05
//! k = 23
//! epsilon = 10.0
//! delta = 2e-5
//! ```
//!
//! Each pipeline has its own array (see [`TABLES`]: `[[dp_sgd]]`, `[[rapid]]`, `[[dp_rdm]]`,
//! `[[dpagg_ti]]`, `[[diffusion_sampling]]`) so that every
//! value keeps its position: a bad value (σ < 0, q > 1, k = 0, δ ≥ 1) is rejected while parsing
//! and the error names file, line and field.

use serde::{Deserialize, Deserializer, Serialize};
use std::path::Path;

use crate::error::{Error, Result};

/// The schema version this dpaudit reads.
pub const SCHEMA_VERSION: u32 = 1;

/// Every claim table a claims file may hold, as written in TOML (`[[dp_sgd]]`, …), with what
/// each describes. `verify --help` lists them; a test checks that the list matches the loader.
pub const TABLES: &[(&str, &str)] = &[
    (
        "dp_sgd",
        "plain DP-SGD in Opacus' words (epochs or steps, batch_size, dataset_size, sampling, noise_multiplier, clip)",
    ),
    ("rapid", "RAPID's DP-SGD with retrieval (Algorithm 2, Theorem 1)"),
    ("dp_rdm", "DP-RDM private retrieval (Algorithm 1, Theorem 3.1)"),
    ("dpagg_ti", "DPAgg-TI noisy centroid of embeddings"),
    (
        "diffusion_sampling",
        "diffusion sampling with the empirical denoiser (EDM schedule)",
    ),
];

macro_rules! checked_f64 {
    ($(#[$m:meta])* $name:ident, $ok:expr, $what:expr) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize)]
        #[serde(transparent)]
        pub struct $name(pub f64);
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
                let v = f64::deserialize(d)?;
                let ok: fn(f64) -> bool = $ok;
                if ok(v) {
                    Ok($name(v))
                } else {
                    Err(serde::de::Error::custom(format!("{}, got {v}", $what)))
                }
            }
        }
        impl $name {
            /// The validated value.
            pub fn get(self) -> f64 {
                self.0
            }
        }
    };
}

checked_f64!(
    /// A finite number > 0 (noise scales, epochs).
    Positive,
    |v| v.is_finite() && v > 0.0,
    "must be a finite number > 0"
);
checked_f64!(
    /// A sampling probability in (0, 1].
    Probability,
    |v| v > 0.0 && v <= 1.0,
    "must be a probability in (0, 1]"
);
checked_f64!(
    /// δ in (0, 1).
    Delta,
    |v| v > 0.0 && v < 1.0,
    "δ must be in (0, 1)"
);
checked_f64!(
    /// ε: finite and > 0.
    Epsilon,
    |v| v.is_finite() && v > 0.0,
    "ε must be finite and > 0"
);
checked_f64!(
    /// An interpolation weight in [0, 1].
    UnitInterval,
    |v| (0.0..=1.0).contains(&v),
    "must be in [0, 1]"
);

/// An integer ≥ 1 (dataset sizes, k, batch sizes, query counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Count(pub u64);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = i64::deserialize(d)?;
        if v >= 1 {
            Ok(Count(v as u64))
        } else {
            Err(serde::de::Error::custom(format!("must be an integer ≥ 1, got {v}")))
        }
    }
}

impl Count {
    /// The validated count.
    pub fn get(self) -> u64 {
        self.0
    }
}

/// A whole claims file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimsFile {
    /// Format version; must be 1.
    pub schema_version: u32,
    /// Free text shown at the top of reports.
    #[serde(default)]
    pub title: Option<String>,
    /// Plain DP-SGD claims (`[[dp_sgd]]`).
    #[serde(default)]
    pub dp_sgd: Vec<DpSgdClaim>,
    #[serde(default)]
    /// RAPID claims (`[[rapid]]`).
    pub rapid: Vec<RapidClaim>,
    #[serde(default)]
    /// DP-RDM claims (`[[dp_rdm]]`).
    pub dp_rdm: Vec<DpRdmClaim>,
    #[serde(default)]
    /// DPAgg-TI claims (`[[dpagg_ti]]`).
    pub dpagg_ti: Vec<DpaggTiClaim>,
    /// Diffusion-based sampling with the empirical denoiser (diffusion-sampling-privacy.md).
    #[serde(default)]
    pub diffusion_sampling: Vec<DiffusionSamplingClaim>,
}

/// How "switch after x % of the generation" picks the first private step (of `steps` steps).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SwitchRounding {
    /// ⌈x·steps⌉: the reading that reproduces the paper's Tables 3 and 4.
    #[default]
    Ceil,
    /// ⌊x·steps⌉ (round half up), as `dpaudit analyze` does for sampler configs.
    Round,
    /// ⌊x·steps⌋.
    Floor,
}

impl SwitchRounding {
    /// Index of the first private step.
    pub fn index(self, switch_at: f64, steps: usize) -> usize {
        let x = switch_at * steps as f64;
        // Products like 0.93·39 carry binary noise; snap to the nearest integer when within 1e-9.
        let x = if (x - x.round()).abs() < 1e-9 { x.round() } else { x };
        let i = match self {
            SwitchRounding::Ceil => x.ceil(),
            SwitchRounding::Round => x.round(),
            SwitchRounding::Floor => x.floor(),
        };
        (i as usize).min(steps)
    }
    /// `ceil`, `round`, `floor`.
    pub fn as_str(self) -> &'static str {
        match self {
            SwitchRounding::Ceil => "ceil",
            SwitchRounding::Round => "round",
            SwitchRounding::Floor => "floor",
        }
    }
}

/// What kind of number the paper printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PaperNumber {
    /// A GDP central-limit-theorem ε (an estimate, never a guarantee).
    #[default]
    CltEstimate,
    /// An exact full-batch GDP value (μ, or ε converted from μ).
    GdpExact,
}

/// Diffusion sampling with the empirical denoiser (diffusion-sampling-privacy.md §3, §4, §6,
/// App. D): per-step μ_t = f·√(2Δt/t³) with f = 2C/(β|D|), on an EDM/Karras schedule; a public
/// denoiser runs the first `switch_at` of the steps, then the empirical denoiser runs
/// `private_steps` steps (all remaining when omitted) on a Poisson(p) subsample; `samples`
/// generated samples compose.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiffusionSamplingClaim {
    /// Claim id.
    pub id: String,
    /// Paper and table/figure.
    pub source: String,
    /// Dataset.
    pub dataset: String,
    /// Private dataset size |D|.
    pub n: Count,
    /// EDM σ_min.
    pub sigma_min: Positive,
    /// EDM σ_max.
    pub sigma_max: Positive,
    /// EDM ρ.
    pub rho: Positive,
    /// Number of noise levels N.
    pub levels: Count,
    /// Step convention `A`, `B` or `C` (../shared/reference/README.md).
    pub convention: crate::diffusion::schedule::Convention,
    /// Sensitivity factor f = 2C/(β|D|) of μ_t = f·√(2Δt/t³).
    pub sensitivity_factor: Positive,
    /// Fraction of the steps run by the public denoiser before the switch (0 = all private).
    #[serde(default)]
    pub switch_at: Option<UnitInterval>,
    /// How the switch fraction becomes a step index (default `ceil`).
    #[serde(default)]
    pub switch_rounding: SwitchRounding,
    /// Steps run by the empirical denoiser after the switch (all remaining when omitted).
    #[serde(default)]
    pub private_steps: Option<Count>,
    /// Poisson subsampling rate p (1 = full batch).
    pub p: Probability,
    /// Generated samples (each composes the private steps once).
    pub samples: Count,
    /// The paper's ε. Omitted for a claim stated as μ only (Figure 6).
    #[serde(default)]
    pub epsilon: Option<Epsilon>,
    /// The paper's full-batch μ (Figure 6), when it states one.
    #[serde(default)]
    pub mu: Option<Positive>,
    /// Half a unit in the last digit the paper printed (default 5e-4: three decimals).
    #[serde(default)]
    pub rounding: Option<Positive>,
    /// What the paper's number is.
    #[serde(default)]
    pub paper_number: PaperNumber,
    /// δ.
    pub delta: Delta,
    /// Free text.
    #[serde(default)]
    pub notes: Option<String>,
}

/// A plain DP-SGD claim in Opacus' vocabulary: a paper's "DP-SGD, B = 256, σ = 1, 50 epochs,
/// (10, 1e-5)". Steps and the sampling rate are derived as `dpaudit account --epochs
/// --batch-size --dataset-size --sampling` derives them ([`crate::config::dpsgd`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DpSgdClaim {
    /// Identifier of the claim in output.
    pub id: String,
    /// Paper and table/figure the numbers come from.
    pub source: String,
    /// Dataset the claim is about.
    #[serde(default)]
    pub dataset: String,
    /// Private training-set size N.
    pub dataset_size: Count,
    /// Batch size B (the expected batch size under Poisson sampling).
    pub batch_size: Count,
    /// Epochs E; give `epochs` or `steps`.
    #[serde(default)]
    pub epochs: Option<Count>,
    /// Optimiser steps T, when the paper states steps instead of epochs.
    #[serde(default)]
    pub steps: Option<Count>,
    /// How batches are drawn: `poisson` (default), `poisson-loader` or `shuffle`.
    #[serde(default)]
    pub sampling: crate::config::dpsgd::BatchSampling,
    /// Noise multiplier σ (noise std σ·C on the sum of clipped gradients). Omitted when the
    /// paper does not state it: then the σ the claim would need is calibrated.
    #[serde(default)]
    pub noise_multiplier: Option<Positive>,
    /// Clipping norm C (does not change ε: the noise scales with it).
    #[serde(default, alias = "max_grad_norm")]
    pub clip: Option<Positive>,
    /// Claimed ε.
    pub epsilon: Epsilon,
    /// Claimed δ.
    #[serde(alias = "target_delta")]
    pub delta: Delta,
    /// Free text.
    #[serde(default)]
    pub notes: Option<String>,
}

/// RAPID (DP-SGD fine-tuning with retrieval): Algorithm 2, Theorem 1, §5 privacy settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RapidClaim {
    /// Identifier of the claim in output.
    pub id: String,
    /// Paper and table/figure the numbers come from.
    pub source: String,
    /// Dataset the claim is about.
    pub dataset: String,
    /// Private training-set size N (q = batch_size / N).
    pub n: Count,
    /// Batch size of DP-SGD.
    pub batch_size: Count,
    /// Noise multiplier σ of Algorithm 2 (noise std C·σ/B on the mean gradient). Omitted when
    /// the paper does not state it.
    #[serde(default)]
    pub noise_multiplier: Option<Positive>,
    /// Training epochs (steps = ⌊epochs·N/B⌋). Omitted when the paper does not state it.
    #[serde(default)]
    pub epochs: Option<Positive>,
    /// Training steps, if stated directly (overrides `epochs`).
    #[serde(default)]
    pub steps: Option<Count>,
    /// Epoch counts to calibrate σ for when σ or epochs are not stated.
    #[serde(default)]
    pub calibrate_epochs: Vec<Positive>,
    /// Claimed ε.
    pub epsilon: Epsilon,
    /// Claimed δ.
    pub delta: Delta,
    /// Free text: what the paper omits, assumptions made in this transcription.
    #[serde(default)]
    pub notes: Option<String>,
}

/// DP-RDM (Algorithm 1 / Figure 4, Theorem 3.1).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DpRdmClaim {
    /// Identifier of the claim in output.
    pub id: String,
    /// Where the claim is published (paper, table).
    pub source: String,
    /// Dataset the claim is about.
    pub dataset: String,
    /// Private retrieval-set size n (δ = 1/n in the paper).
    pub n: Count,
    /// Number of answered queries T.
    pub queries: Count,
    /// Poisson subsampling rate of the retrieval set.
    pub q: Probability,
    /// Noise std σ added to the mean of the k unit-norm neighbours.
    pub sigma: Positive,
    /// Number of retrieved neighbours k.
    pub k: Count,
    /// Query interpolation λ (post-processing: does not change ε unless λ = 0).
    #[serde(default)]
    pub lambda: Option<UnitInterval>,
    /// Claimed ε.
    pub epsilon: Epsilon,
    /// Claimed δ.
    pub delta: Delta,
    #[serde(default)]
    /// Free-form notes shown with the verdict.
    pub notes: Option<String>,
}

/// DPAgg-TI (noisy centroid of m subsampled, normalised embeddings; eqs. 3, 6, 7).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DpaggTiClaim {
    /// Identifier of the claim in output.
    pub id: String,
    /// Where the claim is published (paper, table).
    pub source: String,
    /// Dataset the claim is about.
    pub dataset: String,
    /// Private dataset size n.
    pub n: Count,
    /// Subsample size m (sampled without replacement).
    pub m: Count,
    /// Claimed ε.
    pub epsilon: Epsilon,
    /// Claimed δ.
    pub delta: Delta,
    /// Noise std of the centroid. When omitted, the paper's eq. (6) with Δ = 2 over a centroid
    /// of m gives σ = (2/m)·√(2 ln(1.25/δ))/ε.
    #[serde(default)]
    pub sigma: Option<Positive>,
    /// ℓ₂ sensitivity of the *sum* of embeddings under replace-one (2 for unit vectors).
    #[serde(default)]
    pub sum_sensitivity: Option<Positive>,
    #[serde(default)]
    /// Free-form notes shown with the verdict.
    pub notes: Option<String>,
}

/// Finds the key on `line` (1-based) of `src`: the text before `=`.
fn key_on_line(src: &str, line: usize) -> Option<String> {
    let text = src.lines().nth(line.checked_sub(1)?)?;
    let (k, _) = text.split_once('=')?;
    let k = k.trim();
    (!k.is_empty() && !k.starts_with('[')).then(|| k.to_string())
}

/// Which array/index a line belongs to, e.g. `dp_rdm[2]`.
fn table_at_line(src: &str, line: usize) -> Option<String> {
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    let mut current = None;
    for (i, l) in src.lines().enumerate() {
        if i + 1 > line {
            break;
        }
        let t = l.trim();
        if let Some(name) = t.strip_prefix("[[").and_then(|r| r.strip_suffix("]]")) {
            let c = counts.entry(name.trim().to_string()).or_insert(0);
            current = Some(format!("{}[{}]", name.trim(), *c));
            *c += 1;
        }
    }
    current
}

impl ClaimsFile {
    /// Parses a claims file; errors carry file, line and field (`dp_rdm[2].sigma`).
    pub fn parse(path: &Path, src: &str) -> Result<ClaimsFile> {
        let f: ClaimsFile = toml::from_str(src).map_err(|e| {
            let msg = e.message().to_string();
            let mut err = crate::error::from_toml(path, src, e);
            let field = if let Some(rest) = msg.strip_prefix("missing field `") {
                rest.split('`').next().map(str::to_string)
            } else if let Some(rest) = msg.strip_prefix("unknown field `") {
                rest.split('`').next().map(str::to_string)
            } else {
                err.line.and_then(|l| key_on_line(src, l))
            };
            if let Some(f) = field {
                let full = match err.line.and_then(|l| table_at_line(src, l)) {
                    Some(t) => format!("{t}.{f}"),
                    None => f,
                };
                err = err.with_field(full);
            }
            err
        })?;
        if f.schema_version != SCHEMA_VERSION {
            let line = src
                .lines()
                .position(|l| l.trim_start().starts_with("schema_version"))
                .map(|i| i + 1);
            let mut e = Error::field(
                "schema_version",
                format!(
                    "unsupported schema_version {} (this dpaudit reads {SCHEMA_VERSION})",
                    f.schema_version
                ),
            )
            .with_file(path);
            if let Some(l) = line {
                e = e.with_line(l);
            }
            return Err(e);
        }
        let n = f.dp_sgd.len() + f.rapid.len() + f.dp_rdm.len() + f.dpagg_ti.len() + f.diffusion_sampling.len();
        if n == 0 {
            let names: Vec<String> = TABLES.iter().map(|(t, _)| format!("[[{t}]]")).collect();
            return Err(Error::input(format!("no claims: add a table ({})", names.join(", "))).with_file(path));
        }
        crate::limits::check_count("claims (number of claim tables)", n as u64, crate::limits::CLAIM)
            .map_err(|e| e.with_file(path))?;
        f.check_semantics(path, src)?;
        Ok(f)
    }

    /// The number of claims in the file (all tables).
    pub fn claim_count(&self) -> usize {
        self.dp_sgd.len() + self.rapid.len() + self.dp_rdm.len() + self.dpagg_ti.len() + self.diffusion_sampling.len()
    }

    /// Reads and parses a claims file.
    pub fn load(path: &Path) -> Result<ClaimsFile> {
        let src = crate::input::read_to_string(path)?;
        Self::parse(path, &src)
    }

    /// Cross-field checks that a single value's type cannot express.
    fn check_semantics(&self, path: &Path, src: &str) -> Result<()> {
        let locate = |table: &str, idx: usize, field: &str| -> Option<usize> {
            // Line of `field` inside the idx-th [[table]].
            let mut seen = 0usize;
            let mut inside = false;
            for (i, l) in src.lines().enumerate() {
                let t = l.trim();
                if t.starts_with('[') {
                    inside = t == format!("[[{table}]]") && {
                        seen += 1;
                        seen == idx + 1
                    };
                    continue;
                }
                if inside && key_on_line(src, i + 1).as_deref() == Some(field) {
                    return Some(i + 1);
                }
            }
            None
        };
        let fail = |table: &str, idx: usize, field: &str, msg: String| -> Error {
            let mut e = Error::field(format!("{table}[{idx}].{field}"), msg).with_file(path);
            if let Some(l) = locate(table, idx, field) {
                e = e.with_line(l);
            }
            e
        };
        let mut ids = std::collections::BTreeSet::new();
        let all_ids = self
            .dp_sgd
            .iter()
            .enumerate()
            .map(|(i, c)| ("dp_sgd", i, &c.id))
            .chain(self.rapid.iter().enumerate().map(|(i, c)| ("rapid", i, &c.id)))
            .chain(self.dp_rdm.iter().enumerate().map(|(i, c)| ("dp_rdm", i, &c.id)))
            .chain(self.dpagg_ti.iter().enumerate().map(|(i, c)| ("dpagg_ti", i, &c.id)))
            .chain(
                self.diffusion_sampling
                    .iter()
                    .enumerate()
                    .map(|(i, c)| ("diffusion_sampling", i, &c.id)),
            );
        for (t, i, id) in all_ids {
            if !ids.insert(id.clone()) {
                return Err(fail(t, i, "id", format!("duplicate claim id `{id}`")));
            }
        }
        for (i, c) in self.dp_sgd.iter().enumerate() {
            if c.batch_size.get() > c.dataset_size.get() {
                return Err(fail(
                    "dp_sgd",
                    i,
                    "batch_size",
                    format!(
                        "batch size {} exceeds dataset_size = {}",
                        c.batch_size.get(),
                        c.dataset_size.get()
                    ),
                ));
            }
            match (c.epochs, c.steps) {
                (Some(_), Some(_)) => {
                    return Err(fail("dp_sgd", i, "steps", "give `epochs` or `steps`, not both".into()))
                }
                (None, None) => {
                    return Err(fail(
                        "dp_sgd",
                        i,
                        "epochs",
                        "missing: give `epochs` (or `steps`)".into(),
                    ))
                }
                _ => {}
            }
        }
        for (i, c) in self.rapid.iter().enumerate() {
            if c.batch_size.get() > c.n.get() {
                return Err(fail(
                    "rapid",
                    i,
                    "batch_size",
                    format!("batch size {} exceeds n = {}", c.batch_size.get(), c.n.get()),
                ));
            }
        }
        for (i, c) in self.dpagg_ti.iter().enumerate() {
            if c.m.get() > c.n.get() {
                return Err(fail(
                    "dpagg_ti",
                    i,
                    "m",
                    format!("subsample size {} exceeds n = {}", c.m.get(), c.n.get()),
                ));
            }
        }
        for (i, c) in self.diffusion_sampling.iter().enumerate() {
            if c.levels.get() < 2 {
                return Err(fail(
                    "diffusion_sampling",
                    i,
                    "levels",
                    "needs at least 2 noise levels".into(),
                ));
            }
            if c.sigma_min.get() >= c.sigma_max.get() {
                return Err(fail(
                    "diffusion_sampling",
                    i,
                    "sigma_min",
                    format!(
                        "σ_min = {} must be below σ_max = {}",
                        c.sigma_min.get(),
                        c.sigma_max.get()
                    ),
                ));
            }
            if c.epsilon.is_none() && c.mu.is_none() {
                return Err(fail(
                    "diffusion_sampling",
                    i,
                    "epsilon",
                    "a claim needs `epsilon` or `mu`".into(),
                ));
            }
            if c.switch_at.is_some_and(|s| s.get() >= 1.0) {
                return Err(fail(
                    "diffusion_sampling",
                    i,
                    "switch_at",
                    "must be below 1 (some step must run the empirical denoiser)".into(),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"schema_version = 1

[[dp_rdm]]
id = "a"
source = "s"
dataset = "CIFAR-10"
n = 50000
queries = 1
q = 0.01
sigma = 0.05
k = 13
epsilon = 10.0
delta = 2e-5
"#;

    #[test]
    fn tables_list_every_array_the_loader_accepts() {
        // serde names every accepted key when it meets an unknown one.
        let e = err("schema_version = 1\n[[bogus]]\nid = \"x\"\n");
        let msg = e.to_string();
        let expected = msg.split("expected one of").nth(1).unwrap_or_else(|| panic!("{msg}"));
        let mut keys: Vec<&str> = expected
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|k| *k != "schema_version" && *k != "title")
            .collect();
        keys.sort();
        let mut tables: Vec<&str> = TABLES.iter().map(|(t, _)| *t).collect();
        tables.sort();
        assert_eq!(keys, tables, "{msg}");
    }

    #[test]
    fn dp_sgd_needs_epochs_or_steps() {
        let base = "schema_version = 1\n[[dp_sgd]]\nid = \"a\"\nsource = \"s\"\ndataset_size = 60000\nbatch_size = 256\nnoise_multiplier = 1.0\nepsilon = 10.0\ndelta = 1e-5\n";
        let f = ClaimsFile::parse(
            Path::new("c.toml"),
            &format!("{base}epochs = 50\nsampling = \"shuffle\"\n"),
        )
        .unwrap();
        assert_eq!(f.dp_sgd[0].sampling, crate::config::dpsgd::BatchSampling::Shuffle);
        assert_eq!(err(base).field.as_deref(), Some("dp_sgd[0].epochs"));
        let e = err(&format!("{base}epochs = 5\nsteps = 10\n"));
        assert_eq!((e.field.as_deref(), e.line), (Some("dp_sgd[0].steps"), Some(11)), "{e}");
        let e = err(&format!("{base}epochs = 5\nsampling = \"random\"\n"));
        assert_eq!(e.field.as_deref(), Some("dp_sgd[0].sampling"), "{e}");
        let e = err(&base
            .replace("batch_size = 256", "batch_size = 70000")
            .replace("delta = 1e-5", "delta = 1e-5\nepochs = 1"));
        assert_eq!(e.field.as_deref(), Some("dp_sgd[0].batch_size"), "{e}");
    }

    fn err(src: &str) -> Error {
        ClaimsFile::parse(Path::new("c.toml"), src).unwrap_err()
    }

    #[test]
    fn parses_good_file() {
        let f = ClaimsFile::parse(Path::new("c.toml"), GOOD).unwrap();
        assert_eq!(f.dp_rdm[0].k.get(), 13);
    }

    #[test]
    fn bad_values_name_file_line_field() {
        let e = err(&GOOD.replace("q = 0.01", "q = 1.5"));
        assert_eq!((e.line, e.field.as_deref()), (Some(9), Some("dp_rdm[0].q")), "{e}");
        assert!(e.to_string().starts_with("c.toml:9: field `dp_rdm[0].q`"), "{e}");
        let e = err(&GOOD.replace("sigma = 0.05", "sigma = -0.05"));
        assert_eq!((e.line, e.field.as_deref()), (Some(10), Some("dp_rdm[0].sigma")), "{e}");
        let e = err(&GOOD.replace("k = 13", "k = 0"));
        assert_eq!(e.field.as_deref(), Some("dp_rdm[0].k"), "{e}");
        let e = err(&GOOD.replace("delta = 2e-5", "delta = 1.0"));
        assert_eq!((e.line, e.field.as_deref()), (Some(13), Some("dp_rdm[0].delta")), "{e}");
        let e = err(&GOOD.replace("k = 13\n", ""));
        assert_eq!(e.field.as_deref(), Some("dp_rdm[0].k"), "{e}");
        assert!(e.line.is_some(), "{e}");
        let e = err(&GOOD.replace("k = 13", "k = 13\nkk = 1"));
        assert_eq!(e.field.as_deref(), Some("dp_rdm[0].kk"), "{e}");
        let e = err(&GOOD.replace("schema_version = 1", "schema_version = 7"));
        assert_eq!((e.line, e.field.as_deref()), (Some(1), Some("schema_version")), "{e}");
    }
}
