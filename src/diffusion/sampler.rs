//! Sampler configuration (TOML, `schema_version = 1`), read by `dpaudit analyze`, `sweep` and
//! `check`. Every table denies unknown keys; semantic errors name file, line and field.
//!
//! ```toml
//! schema_version = 1
//! name = "edm-cifar10-paper"
//! sampler = "edm-heun"          # ddim | ddpm | edm-heun | flow-euler: picks the step convention
//! # convention = "C"            # or the step convention A | B | C itself (see docs/diffusion.md)
//! delta = 1e-5
//! neighbouring = "add_remove"   # or "replace_one"
//!
//! [schedule]
//! kind = "edm"                  # edm | ddpm_linear | ddpm_cosine | flow_matching
//! sigma_min = 0.002
//! sigma_max = 80.0
//! rho = 7.0
//! levels = 50
//!
//! [privacy]
//! clip_norm = 1.0               # C
//! dataset_size = 50000          # |D|
//! subsample_rate = 1.0          # p in (0, 1]
//! samples = 1                   # S generated samples (composed S times)
//! switch_at = 0.0               # fraction of the steps run by a public denoiser first
//! # switch_step = 40            # or the index of the first private step
//! # stop_step = 45              # sampling stops after this many steps
//! # private_steps = 1           # how many steps the empirical denoiser runs after the switch
//! # stop_at = 0.05              # stop at the first noise level ≤ stop_at
//!
//! [density]
//! kind = "constant"             # or "trajectories" (data = "digits.csv.gz", ...)
//! beta = 1.0
//! ```

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use super::schedule::{Convention, Schedule};
use crate::error::{self, Error, Result};
use crate::events::Neighbouring;

/// The schema version this dpaudit reads.
pub const SCHEMA_VERSION: u32 = 1;

/// A whole sampler configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplerConfig {
    /// Format version; must be 1.
    pub schema_version: u32,
    #[serde(default)]
    /// Optional name shown in reports.
    pub name: Option<String>,
    #[serde(default)]
    /// Optional description shown in reports.
    pub description: Option<String>,
    /// The sampler that runs the schedule; when given without `convention` it decides the
    /// step convention ([`SamplerKind::convention`]).
    #[serde(default)]
    pub sampler: Option<SamplerKind>,
    /// Step convention (stated in every output). Required unless `sampler` names it.
    #[serde(default = "placeholder_convention")]
    pub convention: Convention,
    #[serde(default = "default_delta")]
    /// δ at which ε is reported.
    pub delta: f64,
    #[serde(default)]
    /// Neighbouring relation (default add/remove).
    pub neighbouring: Neighbouring,
    /// A diffusers `scheduler_config.json` (relative to this file) that gives the schedule
    /// instead of a `[schedule]` table (one or the other). Not serialised: outputs carry the
    /// `[schedule]` it resolves to.
    #[serde(default, skip_serializing)]
    pub scheduler_config: Option<PathBuf>,
    /// With `scheduler_config`: the number of inference steps (default: all training steps).
    #[serde(default, skip_serializing)]
    pub inference_steps: Option<usize>,
    /// `[schedule]`: the noise levels (filled from `scheduler_config` when that is given).
    #[serde(default = "placeholder_schedule")]
    pub schedule: Schedule,
    /// `[privacy]`: clipping, dataset size, subsampling.
    pub privacy: PrivacyConfig,
    /// `[density]`: p_t(x_t) in the per-step μ (default: constant β = 1, warned as
    /// `density.beta`).
    #[serde(default = "default_density")]
    pub density: DensityConfig,
    /// Directory of the file the config came from (relative data paths resolve against it).
    #[serde(skip)]
    pub base_dir: Option<PathBuf>,
    /// Privacy-relevant fields the file left out, with the default used (filled by the loaders).
    #[serde(skip)]
    pub defaulted: Vec<Defaulted>,
}

/// The settings `analyze scheduler_config.json` takes from flags: everything a diffusers
/// scheduler file cannot say (see [`SamplerConfig::from_scheduler_json`]).
#[derive(Debug, Clone, Default)]
pub struct SchedulerFlags {
    /// `--dataset-size` |D| (required).
    pub dataset_size: Option<u64>,
    /// `--clip` C (default 1, warned).
    pub clip_norm: Option<f64>,
    /// `--samples` S (default 1, warned).
    pub samples: Option<u64>,
    /// `--sampler` (default: from the scheduler's `_class_name`, warned).
    pub sampler: Option<SamplerKind>,
    /// `--inference-steps` (default: all training steps, warned).
    pub inference_steps: Option<usize>,
    /// `--delta` (default 1e-5, warned).
    pub delta: Option<f64>,
}

/// A privacy-relevant field that took its default value.
#[derive(Debug, Clone, PartialEq)]
pub struct Defaulted {
    /// The field as users write it (`privacy.samples`).
    pub field: &'static str,
    /// The value used.
    pub value: String,
    /// Why it matters.
    pub meaning: &'static str,
}

/// Samplers a configuration can name instead of a step convention (docs/diffusion.md has the
/// table and the reasons).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SamplerKind {
    /// DDIM over a sub-sequence of DDPM timesteps (its stochastic η = 1 form).
    #[serde(rename = "ddim")]
    Ddim,
    /// DDPM ancestral sampling (Ho et al. 2020, Alg. 2).
    #[serde(rename = "ddpm")]
    Ddpm,
    /// EDM (Karras et al. 2022) with its final step to t = 0.
    #[serde(rename = "edm-heun")]
    EdmHeun,
    /// Flow matching / rectified flow integrated with Euler steps down to s = 0.
    #[serde(rename = "flow-euler")]
    FlowEuler,
}

impl SamplerKind {
    /// The name as written in configs.
    pub fn as_str(self) -> &'static str {
        match self {
            SamplerKind::Ddim => "ddim",
            SamplerKind::Ddpm => "ddpm",
            SamplerKind::EdmHeun => "edm-heun",
            SamplerKind::FlowEuler => "flow-euler",
        }
    }

    /// The step convention that matches the sampler (reasons in docs/diffusion.md):
    /// - `ddpm`, `ddim`: B. An ancestral step t_k → t_{k−1} draws from the Gaussian posterior,
    ///   whose μ in the variance-exploding form is 2C/(β|D|)·√(t_k² − t_{k−1}²)/(t_k t_{k−1});
    ///   that lies between convention A (t = t_k) and B (t = t_{k−1}), so B is the safe side.
    /// - `edm-heun`, `flow-euler`: C. Eq. (1) of the paper is an Euler step whose denoiser
    ///   weight 2Δt/t and noise √(2tΔt) are both taken at the start level (convention A's μ
    ///   exactly), and both samplers take a last step from the smallest level to t = 0 (EDM
    ///   appends t_N = 0; flow samplers end at s = 0), which C adds (paper §3.2).
    pub fn convention(self) -> Convention {
        match self {
            SamplerKind::Ddim | SamplerKind::Ddpm => Convention::B,
            SamplerKind::EdmHeun | SamplerKind::FlowEuler => Convention::C,
        }
    }
}

fn placeholder_convention() -> Convention {
    // Replaced after parsing: from `sampler`, or an error when neither key is given.
    Convention::C
}

fn placeholder_schedule() -> Schedule {
    // Replaced after parsing: `[schedule]` or `scheduler_config` is required (resolve_keys).
    Schedule::FlowMatching {
        s_min: 0.5,
        s_max: 0.5,
        levels: 0,
    }
}

fn default_density() -> DensityConfig {
    DensityConfig::Constant { beta: 1.0 }
}

fn default_delta() -> f64 {
    1e-5
}
fn one() -> f64 {
    1.0
}
fn one_u64() -> u64 {
    1
}

/// How the clipping norm C is scaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ClipScale {
    /// C is used as given (paper eq. 5).
    #[default]
    Absolute,
    /// C_t = clip_norm · (2πt²)^{−d/2} e^{−d/2}: the clip norm in units of the Gaussian density
    /// at the typical distance √d·t of a noisy point from its record (data-independent, so the
    /// sensitivity bound 2C_t/|D| still holds). Only with `density.kind = "trajectories"` (needs d).
    TypicalDensity,
}

/// `[privacy]`: what the private part of sampling is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrivacyConfig {
    /// Clipping norm C of v(x₀; x_t) (paper eq. 5). Also read as `clip` (the flags' word).
    #[serde(default = "one", alias = "clip")]
    pub clip_norm: f64,
    #[serde(default)]
    /// How the clipping norm scales with the noise level.
    pub clip_scale: ClipScale,
    /// |D|; required with a constant density, taken from the data file otherwise.
    #[serde(default)]
    pub dataset_size: Option<u64>,
    /// Poisson subsampling rate p ∈ (0, 1] of the empirical denoiser at every private step.
    /// Also read as `sample_rate` (the flags' word).
    #[serde(default = "one", alias = "sample_rate")]
    pub subsample_rate: f64,
    /// Number of generated samples S (each composes all private steps once).
    #[serde(default = "one_u64")]
    pub samples: u64,
    /// Fraction of the steps run first by a public (non-private) denoiser, in [0, 1).
    #[serde(default)]
    pub switch_at: f64,
    /// Index of the first private step (the steps before it run the public denoiser); the
    /// integer form of `switch_at`, which it replaces.
    #[serde(default)]
    pub switch_step: Option<usize>,
    /// Sampling stops after this many steps (steps with index ≥ `stop_step` do not run).
    #[serde(default)]
    pub stop_step: Option<usize>,
    /// Number of steps the empirical denoiser runs after the switch (default: all the rest).
    #[serde(default)]
    pub private_steps: Option<usize>,
    /// Early stop: sampling stops at the first noise level ≤ `stop_at`.
    #[serde(default)]
    pub stop_at: Option<f64>,
}

/// `[density]`: p_t(x_t) in μ_t = 2C/(p_t(x_t)|D|)·√(2Δt/t³).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum DensityConfig {
    /// p_t(x_t) ≡ β (the paper's §6 setting, β = 1; the default when left out, with a warning).
    Constant {
        /// The density β (> 0; default 1, with a warning).
        #[serde(default = "one")]
        beta: f64,
    },
    /// p_t(x_t) evaluated along real trajectories of the empirical denoiser on a data file.
    Trajectories(TrajectoryConfig),
}

/// Density from trajectories of the empirical denoiser.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrajectoryConfig {
    /// CSV (optionally .gz) of numeric rows, no header; relative to the config file.
    pub data: PathBuf,
    /// Use the first `columns` columns as the record (e.g. 64 for digits: drops the label).
    #[serde(default)]
    pub columns: Option<usize>,
    /// Affine map of the raw values [lo, hi] onto [−1, 1].
    #[serde(default)]
    pub value_range: Option<[f64; 2]>,
    /// Use only the first `max_rows` rows (keeps small analyses fast).
    #[serde(default)]
    pub max_rows: Option<usize>,
    /// Number of trajectories (min/median/max of μ_t are reported across them).
    #[serde(default = "default_trajectories")]
    pub trajectories: usize,
    #[serde(default)]
    /// Seed of the trajectories.
    pub seed: u64,
}

fn default_trajectories() -> usize {
    8
}

impl SamplerConfig {
    /// Reads, parses and validates a sampler configuration. Errors carry file, line and field.
    /// A TOML that names a diffusers `scheduler_config.json` instead of giving `[schedule]` goes
    /// through exactly the same parse, key resolution (`sampler`/`convention`, defaults and their
    /// warnings, unknown keys with their line) and validation; only the schedule comes from the
    /// scheduler file.
    pub fn load(path: impl AsRef<Path>) -> Result<SamplerConfig> {
        let path = path.as_ref();
        let src = crate::input::read_to_string(path)?;
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Self::finish(&src, Some(path), dir)
    }

    /// Parses from a string (no file context; relative paths resolve against `.`).
    pub fn from_toml_str(src: &str) -> Result<SamplerConfig> {
        Self::finish(src, None, PathBuf::from("."))
    }

    fn finish(src: &str, path: Option<&Path>, dir: PathBuf) -> Result<SamplerConfig> {
        let mut cfg: SamplerConfig = match path {
            Some(p) => toml::from_str(src).map_err(|e| parse_error(p, src, e))?,
            None => toml::from_str(src).map_err(|e| error::from_toml(Path::new("<string>"), src, e))?,
        };
        cfg.base_dir = Some(dir);
        // Errors from the scheduler file already name that file (and its key): keep them.
        let here = |e: Error| match (e.file.is_some(), path) {
            (true, _) => e,
            (false, Some(p)) => locate(e, src).with_file(p),
            (false, None) => locate(e, src),
        };
        cfg.resolve_keys(src).map_err(here)?;
        cfg.validate().map_err(here)?;
        Ok(cfg)
    }

    /// True when `path` is a diffusers `scheduler_config.json` rather than a sampler TOML: by its
    /// `.json` extension, else by content (the first non-blank character is `{`, which no
    /// sampler TOML starts with).
    pub(crate) fn is_scheduler_json(path: &Path) -> bool {
        if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("json")) {
            return true;
        }
        let Ok(f) = std::fs::File::open(path) else { return false };
        let mut head = Vec::with_capacity(256);
        use std::io::Read as _;
        if f.take(256).read_to_end(&mut head).is_err() {
            return false;
        }
        let text = String::from_utf8_lossy(&head);
        let text = text.trim_start_matches('\u{feff}');
        text.trim_start().starts_with('{')
    }

    /// The sampler analysis of a diffusers `scheduler_config.json` given directly (`analyze
    /// scheduler_config.json --dataset-size N …`): the schedule from the file, everything the file
    /// cannot say from `flags`, through the same loader as a sampler TOML that names the file.
    /// `--dataset-size` is required; each other setting left out takes its default and is listed
    /// in [`Self::defaulted`] under its flag (`--sampler` defaults to the scheduler's class:
    /// DDIMScheduler → ddim, DDPMScheduler → ddpm).
    pub fn from_scheduler_json(path: &Path, flags: &SchedulerFlags) -> Result<SamplerConfig> {
        let sc = super::schedule::diffusers::SchedulerConfig::load(path)?;
        let n = flags.dataset_size.ok_or_else(|| {
            Error::field(
                "--dataset-size",
                "required with a scheduler_config.json: the size |D| of the private data set the denoiser is built from",
            )
            .with_file(path)
        })?;
        let (sampler, sampler_defaulted) = match flags.sampler {
            Some(k) => (k, false),
            None if sc.class_name == "DDIMScheduler" => (SamplerKind::Ddim, true),
            None => (SamplerKind::Ddpm, true),
        };
        let mut t = toml::Table::new();
        let file = path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        t.insert("schema_version".into(), 1.into());
        t.insert("scheduler_config".into(), file.into());
        t.insert("sampler".into(), sampler.as_str().into());
        if let Some(k) = flags.inference_steps {
            t.insert("inference_steps".into(), (k as i64).into());
        }
        if let Some(d) = flags.delta {
            t.insert("delta".into(), d.into());
        }
        let mut privacy = toml::Table::new();
        privacy.insert("dataset_size".into(), (n as i64).into());
        if let Some(c) = flags.clip_norm {
            privacy.insert("clip_norm".into(), c.into());
        }
        if let Some(k) = flags.samples {
            privacy.insert("samples".into(), (k as i64).into());
        }
        t.insert("privacy".into(), privacy.into());
        let src = toml::to_string(&t).map_err(|e| Error::input(e.to_string()))?;
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut cfg = Self::finish(&src, None, dir).map_err(|mut e| {
            // Errors about the flags' values name the flag, not a line of the in-memory TOML.
            if e.file.is_none() {
                e.line = None;
                e = e.with_file(path);
            }
            e
        })?;
        for d in &mut cfg.defaulted {
            d.field = match d.field {
                "privacy.clip_norm" => "--clip",
                "privacy.samples" => "--samples",
                "inference_steps" => "--inference-steps",
                "delta" => "--delta",
                other => other,
            };
        }
        if sampler_defaulted {
            cfg.defaulted.insert(
                0,
                Defaulted {
                    field: "--sampler",
                    value: sampler.as_str().to_string(),
                    meaning: "from the scheduler's _class_name; it sets the step convention",
                },
            );
        }
        Ok(cfg)
    }

    /// After parsing: the step convention from `sampler` when `convention` is left out (an
    /// error when both are), and the list of privacy-relevant fields that took defaults.
    fn resolve_keys(&mut self, src: &str) -> Result<()> {
        self.defaulted.clear();
        let table: toml::Table = toml::from_str(src).map_err(|e| Error::input(e.message().to_string()))?;
        let has = |t: &str, k: &str| -> bool {
            if t.is_empty() {
                return table.contains_key(k);
            }
            table
                .get(t)
                .and_then(|v| v.as_table())
                .is_some_and(|x| x.contains_key(k))
        };
        match (has("", "schedule"), self.scheduler_config.clone()) {
            (true, Some(_)) => {
                return Err(Error::field(
                    "scheduler_config",
                    "give either scheduler_config or a [schedule] table, not both",
                ))
            }
            (false, None) => {
                return Err(Error::field(
                    "schedule",
                    "missing: give a [schedule] table or scheduler_config = \"path/to/scheduler_config.json\"",
                ))
            }
            (true, None) => {
                if self.inference_steps.is_some() {
                    return Err(Error::field(
                        "inference_steps",
                        "only with scheduler_config (with a [schedule] table, give schedule.levels)",
                    ));
                }
            }
            (false, Some(rel)) => {
                if let Some(n) = self.inference_steps.filter(|&n| n < 2) {
                    return Err(Error::field(
                        "inference_steps",
                        format!("expected an integer ≥ 2, got {n}"),
                    ));
                }
                let p = self.resolve(&rel);
                let sc = super::schedule::diffusers::SchedulerConfig::load(&p)?;
                self.schedule = sc.to_sampler_schedule(self.inference_steps, &p)?;
                if self.inference_steps.is_none() {
                    self.defaulted.push(Defaulted {
                        field: "inference_steps",
                        value: format!("{}", sc.num_train_timesteps),
                        meaning: "sampling runs every training step of the scheduler",
                    });
                }
            }
        }
        if !has("", "convention") {
            match self.sampler {
                Some(s) => self.convention = s.convention(),
                None => return Err(Error::field(
                    "convention",
                    "missing: name the sampler (sampler = \"ddim\" | \"ddpm\" | \"edm-heun\" | \"flow-euler\") or the \
                         step convention (convention = \"A\" | \"B\" | \"C\"); see docs/diffusion.md",
                )),
            }
        }
        if !has("", "delta") {
            self.defaulted.push(Defaulted {
                field: "delta",
                value: format!("{}", self.delta),
                meaning: "δ of the reported (ε, δ)",
            });
        }
        if !has("privacy", "samples") {
            self.defaulted.push(Defaulted {
                field: "privacy.samples",
                value: format!("{}", self.privacy.samples),
                meaning:
                    "number of generated samples S; every sample composes all private steps again, so ε grows with S",
            });
        }
        if !has("privacy", "clip_norm") {
            self.defaulted.push(Defaulted {
                field: "privacy.clip_norm",
                value: format!("{}", self.privacy.clip_norm),
                meaning: "clipping norm C of v(x₀; x_t); μ_t is proportional to C",
            });
        }
        if let DensityConfig::Constant { beta } = self.density {
            if !has("density", "beta") {
                self.defaulted.push(Defaulted {
                    field: "density.beta",
                    value: format!("{beta}"),
                    meaning: "constant density β = p_t(x_t); μ_t is proportional to 1/β",
                });
            }
        }
        Ok(())
    }

    /// One warning line per defaulted privacy-relevant field.
    pub fn default_warnings(&self) -> Vec<String> {
        self.defaulted
            .iter()
            .map(|d| {
                format!(
                    "{} not set: using the default {} ({}); set it explicitly",
                    d.field, d.value, d.meaning
                )
            })
            .collect()
    }

    /// Prints [`Self::default_warnings`] to stderr, prefixed with the config's name.
    pub fn warn_defaults(&self, path: &Path) {
        for w in self.default_warnings() {
            eprintln!("warning: {}: {w}", path.display());
        }
    }

    /// Checks every value once; errors name the field as `table.key`.
    pub fn validate(&self) -> Result<()> {
        self.validate_before_rate()?;
        Self::validate_rate(self.privacy.subsample_rate)?;
        Self::validate_samples(self.privacy.samples)?;
        self.validate_after_samples()
    }

    /// The checks of [`Self::validate`] before the subsampling rate's (they read neither p nor S).
    pub(crate) fn validate_before_rate(&self) -> Result<()> {
        if self.schema_version != SCHEMA_VERSION {
            return Err(Error::field(
                "schema_version",
                format!(
                    "unsupported schema_version {} (this dpaudit reads {SCHEMA_VERSION})",
                    self.schema_version
                ),
            ));
        }
        if !(self.delta > 0.0 && self.delta < 1.0) {
            return Err(Error::field(
                "delta",
                format!("δ must be in (0, 1), got {}", self.delta),
            ));
        }
        self.schedule.validate().map_err(|e| e.with_field("schedule"))?;
        let p = &self.privacy;
        let bad = |f: &str, m: String| Err(Error::field(format!("privacy.{f}"), m));
        if !(p.clip_norm.is_finite() && p.clip_norm > 0.0) {
            return bad(
                "clip_norm",
                format!("C must be a finite number > 0, got {}", p.clip_norm),
            );
        }
        Ok(())
    }

    /// The subsampling-rate check of [`Self::validate`].
    pub(crate) fn validate_rate(subsample_rate: f64) -> Result<()> {
        if !(subsample_rate > 0.0 && subsample_rate <= 1.0) {
            return Err(Error::field(
                "privacy.subsample_rate",
                format!("p must be in (0, 1], got {subsample_rate}"),
            ));
        }
        Ok(())
    }

    /// The sample-count check of [`Self::validate`].
    pub(crate) fn validate_samples(samples: u64) -> Result<()> {
        if samples == 0 {
            return Err(Error::field("privacy.samples", "S must be ≥ 1"));
        }
        Ok(())
    }

    /// The checks of [`Self::validate`] after the sample count's (they read neither p nor S).
    pub(crate) fn validate_after_samples(&self) -> Result<()> {
        let p = &self.privacy;
        let bad = |f: &str, m: String| Err(Error::field(format!("privacy.{f}"), m));
        if !(p.switch_at >= 0.0 && p.switch_at < 1.0) {
            return bad("switch_at", format!("must be in [0, 1), got {}", p.switch_at));
        }
        if p.switch_step.is_some() && p.switch_at != 0.0 {
            return bad(
                "switch_step",
                "give either switch_step (a step index) or switch_at (a fraction), not both".into(),
            );
        }
        if p.stop_step == Some(0) {
            return bad("stop_step", "must be ≥ 1 (a run of zero steps releases nothing)".into());
        }
        if p.private_steps == Some(0) {
            return bad("private_steps", "must be ≥ 1 (omit it for all remaining steps)".into());
        }
        if let Some(s) = p.stop_at {
            if !(s.is_finite() && s >= 0.0) {
                return bad("stop_at", format!("must be a finite noise level ≥ 0, got {s}"));
            }
        }
        if let Some(n) = p.dataset_size {
            if n < 2 {
                return bad("dataset_size", format!("|D| must be ≥ 2, got {n}"));
            }
        }
        match &self.density {
            DensityConfig::Constant { beta } => {
                if !(beta.is_finite() && *beta > 0.0) {
                    return Err(Error::field(
                        "density.beta",
                        format!("β must be finite and > 0, got {beta}"),
                    ));
                }
                if p.dataset_size.is_none() {
                    return bad(
                        "dataset_size",
                        "|D| is required with a constant density (missing key)".into(),
                    );
                }
                if p.clip_scale == ClipScale::TypicalDensity {
                    return bad(
                        "clip_scale",
                        "\"typical_density\" needs the data dimension: use density.kind = \"trajectories\"".into(),
                    );
                }
            }
            DensityConfig::Trajectories(t) => {
                if t.trajectories == 0 {
                    return Err(Error::field("density.trajectories", "must be ≥ 1"));
                }
                if let Some([lo, hi]) = t.value_range {
                    if !(lo.is_finite() && hi.is_finite() && lo < hi) {
                        return Err(Error::field(
                            "density.value_range",
                            format!("need lo < hi, got [{lo}, {hi}]"),
                        ));
                    }
                }
                if t.columns == Some(0) || t.max_rows.is_some_and(|m| m < 2) {
                    return Err(Error::field("density.columns", "columns must be ≥ 1 and max_rows ≥ 2"));
                }
            }
        }
        Ok(())
    }

    /// Path of a data file named in the config, resolved against the config's directory.
    pub fn resolve(&self, p: &Path) -> PathBuf {
        match &self.base_dir {
            Some(b) if p.is_relative() => b.join(p),
            _ => p.to_path_buf(),
        }
    }

    /// A short name for outputs.
    pub(crate) fn display_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| "sampler".into())
    }
}

/// A TOML error with file and line; inside tagged tables (`[schedule]`, `[density]`) the parser
/// only knows the table's span, so an unknown key is looked up by name after it.
fn parse_error(path: &Path, src: &str, err: toml::de::Error) -> Error {
    let msg = err.message().to_string();
    let start = err.span().map(|s| s.start.min(src.len()));
    let mut e = error::from_toml(path, src, err);
    if let (Some(rest), Some(start)) = (msg.strip_prefix("unknown field `"), start) {
        if let Some(key) = rest.split('`').next() {
            let first = src[..start].matches('\n').count();
            for (i, line) in src.lines().enumerate().skip(first) {
                if i > first && line.trim_start().starts_with('[') {
                    break;
                }
                if line.split_once('=').is_some_and(|(k, _)| k.trim() == key) {
                    e.line = Some(i + 1);
                    break;
                }
            }
            e = e.with_field(key.to_string());
        }
    }
    e
}

/// Adds the line of the offending key to a validation error, found by scanning the source
/// for `key =` inside the right `[table]`.
fn locate(e: Error, src: &str) -> Error {
    let Some(field) = e.field.clone() else { return e };
    let (table, key) = match field.rsplit_once('.') {
        Some((t, k)) => (t.to_string(), k.to_string()),
        None => (String::new(), field.clone()),
    };
    let mut current = String::new();
    let mut table_line = None;
    for (i, line) in src.lines().enumerate() {
        let l = line.trim();
        if l.starts_with('[') {
            current = l.trim_matches(|c| c == '[' || c == ']').trim().to_string();
            if current == table {
                table_line = Some(i + 1);
            }
            continue;
        }
        if current == table {
            if let Some((k, _)) = l.split_once('=') {
                if k.trim() == key {
                    return e.with_line(i + 1);
                }
            }
        }
    }
    match table_line {
        Some(l) => e.with_line(l),
        None => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAPER: &str = r#"
schema_version = 1
convention = "C"
[schedule]
kind = "edm"
sigma_min = 0.002
sigma_max = 80.0
rho = 7.0
levels = 50
[privacy]
clip_norm = 1.0
dataset_size = 50000
[density]
kind = "constant"
beta = 1.0
"#;

    #[test]
    fn parses_and_defaults() {
        let c = SamplerConfig::from_toml_str(PAPER).unwrap();
        assert_eq!(c.privacy.subsample_rate, 1.0);
        assert_eq!(c.privacy.samples, 1);
        assert_eq!(c.delta, 1e-5);
    }

    #[test]
    fn semantic_errors_name_line_and_field() {
        let bad = PAPER.replace("sigma_min = 0.002", "sigma_min = 100.0");
        let e = SamplerConfig::from_toml_str(&bad).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("schedule.sigma_min"));
        assert_eq!(e.line, Some(6));
        let bad = PAPER.replace("dataset_size = 50000", "dataset_size = 50000\nsubsample_rate = 0.0");
        let e = SamplerConfig::from_toml_str(&bad).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("privacy.subsample_rate"));
        assert_eq!(e.line, Some(13));
    }

    #[test]
    fn sampler_names_give_the_convention() {
        for (name, conv) in [
            ("ddim", Convention::B),
            ("ddpm", Convention::B),
            ("edm-heun", Convention::C),
            ("flow-euler", Convention::C),
        ] {
            let src = PAPER.replace("convention = \"C\"", &format!("sampler = \"{name}\""));
            let c = SamplerConfig::from_toml_str(&src).unwrap();
            assert_eq!(c.convention, conv, "{name}");
            assert_eq!(c.sampler.map(SamplerKind::as_str), Some(name));
        }
        // An explicit convention wins over the sampler's.
        let src = PAPER.replace("convention = \"C\"", "sampler = \"ddpm\"\nconvention = \"A\"");
        assert_eq!(SamplerConfig::from_toml_str(&src).unwrap().convention, Convention::A);
        // Neither: an error naming `convention`.
        let e = SamplerConfig::from_toml_str(&PAPER.replace("convention = \"C\"", "")).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("convention"));
        assert!(SamplerConfig::from_toml_str(&PAPER.replace("convention = \"C\"", "sampler = \"euler\"")).is_err());
    }

    #[test]
    fn defaulted_privacy_fields_are_listed() {
        let c = SamplerConfig::from_toml_str(PAPER).unwrap();
        let f: Vec<&str> = c.defaulted.iter().map(|d| d.field).collect();
        assert_eq!(f, vec!["delta", "privacy.samples"]);
        let src = PAPER
            .replace("clip_norm = 1.0\n", "samples = 1\n")
            .replace("beta = 1.0\n", "")
            .replace("convention = \"C\"", "convention = \"C\"\ndelta = 1e-5");
        let c = SamplerConfig::from_toml_str(&src).unwrap();
        let f: Vec<&str> = c.defaulted.iter().map(|d| d.field).collect();
        assert_eq!(f, vec!["privacy.clip_norm", "density.beta"]);
        assert_eq!(c.density, DensityConfig::Constant { beta: 1.0 });
        assert!(c.default_warnings()[0].starts_with("privacy.clip_norm not set: using the default 1"));
    }

    #[test]
    fn unknown_keys_rejected() {
        let bad = PAPER.replace("rho = 7.0", "rho = 7.0\nsteps = 3");
        assert!(SamplerConfig::from_toml_str(&bad).is_err());
        let bad = PAPER.replace("clip_norm = 1.0", "clipnorm = 1.0");
        let e = SamplerConfig::from_toml_str(&bad).unwrap_err();
        assert!(e.to_string().contains("clipnorm"), "{e}");
    }
}
