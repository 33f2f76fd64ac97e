//! diffusers `scheduler_config.json` (`DDPMScheduler`, `DDIMScheduler`): the training noise
//! schedule (β schedule over `num_train_timesteps`), the sampling sub-sequence
//! (`timestep_spacing`, `steps_offset`), the model's `prediction_type` (ε, v or x₀) and clipping.
//!
//! Two uses:
//! * attacks need ᾱ_t and ε: [`SchedulerConfig::schedule`] gives the ᾱ table (β as in diffusers'
//!   `DDPMScheduler.__init__`), [`PredictionType::to_eps`] converts the model output to ε;
//! * `analyze`/`sweep` need the noise levels of sampling: [`SchedulerConfig::to_sampler_schedule`]
//!   maps the config onto dpaudit's own [`crate::diffusion::schedule::Schedule`], and
//!   [`sampler_toml_from_scheduler`] fills in a sampler TOML that names a scheduler file
//!   (`scheduler_config = "…"`) with the privacy settings the scheduler file cannot hold.

use std::path::Path;

use serde_json::Value;

use crate::diffusion::schedule::{Schedule as SamplerSchedule, Spacing};
use crate::error::{Error, Result};

use super::schedule::{Schedule, ScheduleConfig};

/// `beta_schedule` of a diffusers scheduler.
#[derive(Debug, Clone, PartialEq)]
pub enum BetaSchedule {
    /// β linear from `beta_start` to `beta_end` (Ho et al. 2020 §4).
    Linear,
    /// √β linear, squared (Stable Diffusion's `scaled_linear`).
    ScaledLinear,
    /// Cosine ᾱ (Nichol & Dhariwal 2021 eq. 17, s = 0.008, β ≤ 0.999): `squaredcos_cap_v2`.
    SquaredcosCapV2,
    /// β = sigmoid(linspace(−6, 6)) · (end − start) + start.
    Sigmoid,
    /// `trained_betas`: an explicit list.
    Trained(Vec<f64>),
}

/// What the model predicts (`prediction_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PredictionType {
    /// ε (the noise).
    Epsilon,
    /// v = √ᾱ ε − √(1−ᾱ) x₀ (Salimans & Ho 2022, §4).
    VPrediction,
    /// x₀ (the clean sample).
    Sample,
}

impl PredictionType {
    /// diffusers' name.
    pub fn as_str(self) -> &'static str {
        match self {
            PredictionType::Epsilon => "epsilon",
            PredictionType::VPrediction => "v_prediction",
            PredictionType::Sample => "sample",
        }
    }

    /// ε from the model output `out` at x_t with ᾱ = `abar`:
    /// v: ε = √ᾱ v + √(1−ᾱ) x_t (from x_t = √ᾱ x₀ + √(1−ᾱ) ε and v = √ᾱ ε − √(1−ᾱ) x₀);
    /// x₀: ε = (x_t − √ᾱ x̂₀)/√(1−ᾱ).
    pub fn to_eps(self, out: f32, x_t: f32, abar: f64) -> f32 {
        match self {
            PredictionType::Epsilon => out,
            PredictionType::VPrediction => (abar.sqrt() * out as f64 + (1.0 - abar).sqrt() * x_t as f64) as f32,
            PredictionType::Sample => ((x_t as f64 - abar.sqrt() * out as f64) / (1.0 - abar).sqrt()) as f32,
        }
    }
}

/// A parsed `scheduler_config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    /// `_class_name` (`DDPMScheduler` or `DDIMScheduler`).
    pub class_name: String,
    /// T.
    pub num_train_timesteps: usize,
    /// β₁.
    pub beta_start: f64,
    /// β_T.
    pub beta_end: f64,
    /// How β runs from start to end.
    pub beta_schedule: BetaSchedule,
    /// What the model predicts.
    pub prediction_type: PredictionType,
    /// Whether sampling clips x̂₀ to ±`clip_sample_range`.
    pub clip_sample: bool,
    /// The clipping range.
    pub clip_sample_range: f64,
    /// Dynamic thresholding (Imagen) during sampling.
    pub thresholding: bool,
    /// `leading`, `trailing` or `linspace`.
    pub timestep_spacing: Spacing,
    /// Added to every sampled timestep (leading spacing).
    pub steps_offset: usize,
    /// `rescale_betas_zero_snr`.
    pub rescale_betas_zero_snr: bool,
}

fn err(path: &Path, key: &str, msg: impl Into<String>) -> Error {
    Error::field(key, msg).with_file(path)
}

impl SchedulerConfig {
    /// Reads a `scheduler_config.json`.
    pub fn load(path: &Path) -> Result<Self> {
        let text = crate::error::read_to_string(path)?;
        Self::parse(&text, path)
    }

    /// Parses the text of a `scheduler_config.json`; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let v: Value = serde_json::from_str(text).map_err(|e| {
            Error::input(format!("not valid JSON: {e}"))
                .with_file(path)
                .with_line(e.line())
        })?;
        let o = v
            .as_object()
            .ok_or_else(|| Error::input("scheduler_config.json must be a JSON object").with_file(path))?;
        let class_name = match o.get("_class_name").and_then(Value::as_str) {
            Some(c @ ("DDPMScheduler" | "DDIMScheduler")) => c.to_string(),
            Some(c) => {
                return Err(err(
                    path,
                    "_class_name",
                    format!("`{c}` is not supported (DDPMScheduler, DDIMScheduler)"),
                ))
            }
            None => {
                return Err(err(
                    path,
                    "_class_name",
                    "missing (expected DDPMScheduler or DDIMScheduler)",
                ))
            }
        };
        let num = |k: &str, d: f64| -> Result<f64> {
            match o.get(k) {
                None => Ok(d),
                Some(v) => v
                    .as_f64()
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| err(path, k, format!("expected a number, got {v}"))),
            }
        };
        let flag = |k: &str, d: bool| -> Result<bool> {
            match o.get(k) {
                None => Ok(d),
                Some(v) => v
                    .as_bool()
                    .ok_or_else(|| err(path, k, format!("expected true or false, got {v}"))),
            }
        };
        let string = |k: &str, d: &str| -> Result<String> {
            match o.get(k) {
                None => Ok(d.to_string()),
                Some(v) => v
                    .as_str()
                    .map(str::to_string)
                    .ok_or_else(|| err(path, k, format!("expected a string, got {v}"))),
            }
        };
        let t = num("num_train_timesteps", 1000.0)?;
        if !((2.0..=1e6).contains(&t) && t.fract() == 0.0) {
            return Err(err(
                path,
                "num_train_timesteps",
                format!("must be an integer in 2..=1000000, got {t}"),
            ));
        }
        let t = t as usize;
        let beta_start = num("beta_start", 0.0001)?;
        let beta_end = num("beta_end", 0.02)?;
        let trained = match o.get("trained_betas") {
            None | Some(Value::Null) => None,
            Some(Value::Array(a)) => {
                let b: Option<Vec<f64>> = a.iter().map(Value::as_f64).collect();
                let b = b.ok_or_else(|| err(path, "trained_betas", "expected a list of numbers"))?;
                if b.len() != t {
                    return Err(err(
                        path,
                        "trained_betas",
                        format!("{} values for num_train_timesteps = {t}", b.len()),
                    ));
                }
                Some(b)
            }
            Some(v) => return Err(err(path, "trained_betas", format!("expected a list or null, got {v}"))),
        };
        let beta_schedule = match trained {
            Some(b) => BetaSchedule::Trained(b),
            None => match string("beta_schedule", "linear")?.as_str() {
                "linear" => BetaSchedule::Linear,
                "scaled_linear" => BetaSchedule::ScaledLinear,
                "squaredcos_cap_v2" => BetaSchedule::SquaredcosCapV2,
                "sigmoid" => BetaSchedule::Sigmoid,
                s => {
                    return Err(err(
                        path,
                        "beta_schedule",
                        format!("`{s}` is not supported (linear, scaled_linear, squaredcos_cap_v2, sigmoid)"),
                    ))
                }
            },
        };
        if matches!(
            beta_schedule,
            BetaSchedule::Linear | BetaSchedule::ScaledLinear | BetaSchedule::Sigmoid
        ) && !(beta_start > 0.0 && beta_start <= beta_end && beta_end < 1.0)
        {
            return Err(err(
                path,
                "beta_start",
                format!("need 0 < beta_start ≤ beta_end < 1, got {beta_start} and {beta_end}"),
            ));
        }
        let prediction_type = match string("prediction_type", "epsilon")?.as_str() {
            "epsilon" => PredictionType::Epsilon,
            "v_prediction" => PredictionType::VPrediction,
            "sample" => PredictionType::Sample,
            s => {
                return Err(err(
                    path,
                    "prediction_type",
                    format!("`{s}` is not supported (epsilon, v_prediction, sample)"),
                ))
            }
        };
        let timestep_spacing = match string("timestep_spacing", "leading")?.as_str() {
            "leading" => Spacing::Leading,
            "trailing" => Spacing::Trailing,
            "linspace" => Spacing::Linspace,
            s => {
                return Err(err(
                    path,
                    "timestep_spacing",
                    format!("`{s}` is not supported (leading, trailing, linspace)"),
                ))
            }
        };
        let steps_offset = num("steps_offset", 0.0)?;
        if !(steps_offset >= 0.0 && steps_offset.fract() == 0.0 && steps_offset < t as f64) {
            return Err(err(
                path,
                "steps_offset",
                format!("must be an integer in 0..{t}, got {steps_offset}"),
            ));
        }
        let clip_sample_range = num("clip_sample_range", 1.0)?;
        Ok(SchedulerConfig {
            class_name,
            num_train_timesteps: t,
            beta_start,
            beta_end,
            beta_schedule,
            prediction_type,
            clip_sample: flag("clip_sample", true)?,
            clip_sample_range,
            thresholding: flag("thresholding", false)?,
            timestep_spacing,
            steps_offset: steps_offset as usize,
            rescale_betas_zero_snr: flag("rescale_betas_zero_snr", false)?,
        })
    }

    /// diffusers' name of the β schedule.
    pub fn beta_schedule_name(&self) -> &'static str {
        match self.beta_schedule {
            BetaSchedule::Linear => "linear",
            BetaSchedule::ScaledLinear => "scaled_linear",
            BetaSchedule::SquaredcosCapV2 => "squaredcos_cap_v2",
            BetaSchedule::Sigmoid => "sigmoid",
            BetaSchedule::Trained(_) => "trained_betas",
        }
    }

    /// β_t for t = 0..T−1 as diffusers computes them (in f64).
    pub fn betas(&self) -> Vec<f64> {
        let t = self.num_train_timesteps;
        let lin = |a: f64, b: f64| -> Vec<f64> { (0..t).map(|i| a + (b - a) * i as f64 / (t - 1) as f64).collect() };
        let mut betas = match &self.beta_schedule {
            BetaSchedule::Linear => lin(self.beta_start, self.beta_end),
            BetaSchedule::ScaledLinear => lin(self.beta_start.sqrt(), self.beta_end.sqrt())
                .into_iter()
                .map(|b| b * b)
                .collect(),
            BetaSchedule::SquaredcosCapV2 => crate::diffusion::schedule::cosine_betas(0.008, 0.999, t),
            BetaSchedule::Sigmoid => lin(-6.0, 6.0)
                .into_iter()
                .map(|x| 1.0 / (1.0 + (-x).exp()) * (self.beta_end - self.beta_start) + self.beta_start)
                .collect(),
            BetaSchedule::Trained(b) => b.clone(),
        };
        if self.rescale_betas_zero_snr {
            // Lin et al. 2024, Algorithm 1: shift and scale √ᾱ so that ᾱ_T = 0.
            let ab = crate::diffusion::schedule::alpha_bar_from_betas(&betas);
            let mut s: Vec<f64> = ab.iter().map(|a| a.sqrt()).collect();
            let (s0, st) = (s[0], s[t - 1]);
            for v in &mut s {
                *v = (*v - st) * s0 / (s0 - st);
            }
            let abar: Vec<f64> = s.iter().map(|v| v * v).collect();
            betas = (0..t)
                .map(|i| {
                    if i == 0 {
                        1.0 - abar[0]
                    } else {
                        1.0 - abar[i] / abar[i - 1]
                    }
                })
                .collect();
        }
        betas
    }

    /// The ᾱ table for attacks (0-indexed steps, as [`Schedule`]).
    pub fn schedule(&self, path: &Path) -> Result<Schedule> {
        let betas = self.betas();
        if let Some((i, b)) = betas.iter().enumerate().find(|(_, b)| !(**b > 0.0 && **b < 1.0)) {
            return Err(err(
                path,
                "beta_schedule",
                format!("β at step {i} is {b}, outside (0, 1)"),
            ));
        }
        let mut alpha_bars = Vec::with_capacity(betas.len());
        let mut acc = 1.0f64;
        for b in &betas {
            acc *= 1.0 - b;
            alpha_bars.push(acc);
        }
        Ok(Schedule {
            config: ScheduleConfig {
                timesteps: self.num_train_timesteps,
                beta_start: betas[0],
                beta_end: betas[betas.len() - 1],
            },
            betas,
            alpha_bars,
        })
    }

    /// dpaudit's sampler schedule for sampling with `levels` inference steps (default: all T).
    /// Supported: linear and `squaredcos_cap_v2` β with `steps_offset = 0`.
    pub fn to_sampler_schedule(&self, levels: Option<usize>, path: &Path) -> Result<SamplerSchedule> {
        if self.steps_offset != 0 {
            return Err(err(
                path,
                "steps_offset",
                format!(
                    "steps_offset = {} is not supported by the sampler analysis yet (only 0)",
                    self.steps_offset
                ),
            ));
        }
        if self.rescale_betas_zero_snr {
            return Err(err(
                path,
                "rescale_betas_zero_snr",
                "zero-terminal-SNR schedules have ᾱ_T = 0 (infinite noise level); not supported by the sampler analysis",
            ));
        }
        let timesteps = self.num_train_timesteps;
        let spacing = self.timestep_spacing;
        match self.beta_schedule {
            BetaSchedule::Linear => Ok(SamplerSchedule::DdpmLinear {
                beta_start: self.beta_start,
                beta_end: self.beta_end,
                timesteps,
                levels,
                spacing,
            }),
            BetaSchedule::SquaredcosCapV2 => Ok(SamplerSchedule::DdpmCosine {
                s: 0.008,
                max_beta: 0.999,
                timesteps,
                levels,
                spacing,
            }),
            _ => Err(err(
                path,
                "beta_schedule",
                "the sampler analysis supports linear and squaredcos_cap_v2 β schedules (scaled_linear, sigmoid and trained_betas: not yet)",
            )),
        }
    }
}

/// Defaults used for what a scheduler file cannot say, with the name each is written under.
const DEFAULTS: &[(&str, &str, &str)] = &[
    ("", "convention", "\"A\""),
    ("", "delta", "1e-5"),
    ("privacy", "clip_norm", "1.0"),
    ("privacy", "subsample_rate", "1.0"),
    ("privacy", "samples", "1"),
];

/// Turns a sampler TOML that names a diffusers scheduler (`scheduler_config = "path"`, with an
/// optional `inference_steps = N`) into a complete sampler TOML table: the `[schedule]` table is
/// built from the scheduler file, and every privacy setting the TOML leaves out gets its default,
/// returned as a warning line. `dir` resolves the relative scheduler path. Returns `None` when the
/// TOML does not name a scheduler file.
pub fn sampler_toml_from_scheduler(
    table: &mut toml::Table,
    dir: &Path,
    toml_path: &Path,
) -> Result<Option<Vec<String>>> {
    let Some(v) = table.remove("scheduler_config") else {
        return Ok(None);
    };
    let rel = v.as_str().ok_or_else(|| {
        err(
            toml_path,
            "scheduler_config",
            "expected a path to a scheduler_config.json",
        )
    })?;
    let levels = match table.remove("inference_steps") {
        None => None,
        Some(v) => Some(v.as_integer().filter(|&n| n >= 2).ok_or_else(|| {
            err(
                toml_path,
                "inference_steps",
                format!("expected an integer ≥ 2, got {v}"),
            )
        })? as usize),
    };
    if table.contains_key("schedule") {
        return Err(err(
            toml_path,
            "schedule",
            "give either scheduler_config or a [schedule] table, not both",
        ));
    }
    let p = dir.join(rel);
    let sc = SchedulerConfig::load(&p)?;
    let sched = sc.to_sampler_schedule(levels, &p)?;
    let sched_val = toml::Value::try_from(&sched).map_err(|e| Error::input(e.to_string()).with_file(&p))?;
    table.insert("schedule".into(), sched_val);
    let mut warnings = Vec::new();
    if levels.is_none() {
        warnings.push(format!(
            "inference_steps not given: sampling uses all {} training steps",
            sc.num_train_timesteps
        ));
    }
    if sc.prediction_type != PredictionType::Epsilon {
        warnings.push(format!(
            "{}: prediction_type = \"{}\" (the per-step analysis depends only on the noise levels)",
            p.display(),
            sc.prediction_type.as_str()
        ));
    }
    table.entry("schema_version").or_insert(toml::Value::Integer(1));
    for (section, key, default) in DEFAULTS {
        let t: &mut toml::Table = if section.is_empty() {
            &mut *table
        } else {
            table
                .entry(section.to_string())
                .or_insert(toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .ok_or_else(|| err(toml_path, section, "expected a table"))?
        };
        if !t.contains_key(*key) {
            let val: toml::Value = toml::from_str::<toml::Table>(&format!("x = {default}"))
                .map_err(|e| Error::input(e.to_string()))?
                .remove("x")
                .unwrap();
            t.insert(key.to_string(), val);
            let name = if section.is_empty() {
                key.to_string()
            } else {
                format!("{section}.{key}")
            };
            warnings.push(format!("{name} not given: using the default {default}"));
        }
    }
    if !table.contains_key("density") {
        let mut d = toml::Table::new();
        d.insert("kind".into(), "constant".into());
        d.insert("beta".into(), toml::Value::Float(1.0));
        table.insert("density".into(), toml::Value::Table(d));
        warnings.push("density not given: using a constant density β = 1 (the paper's §6 setting)".into());
    }
    let needs_d = table
        .get("density")
        .and_then(|d| d.get("kind"))
        .and_then(|k| k.as_str())
        == Some("constant");
    let has_d = table.get("privacy").and_then(|p| p.get("dataset_size")).is_some();
    if needs_d && !has_d {
        return Err(err(
            toml_path,
            "privacy.dataset_size",
            "required: a scheduler file does not say how many training records |D| there are",
        ));
    }
    Ok(Some(warnings))
}

/// Loads a sampler configuration whose TOML (`src`, read from `path`) names a diffusers
/// scheduler file; prints the defaults it used as warnings on stderr. `None` when the TOML does
/// not name one (it is then an ordinary sampler configuration).
pub fn load_sampler_config(path: &Path, src: &str) -> Result<Option<crate::config::sampler::SamplerConfig>> {
    let Ok(mut table) = toml::from_str::<toml::Table>(src) else {
        // Not parseable as a table: let the ordinary loader report the syntax error.
        return Ok(None);
    };
    if !table.contains_key("scheduler_config") {
        return Ok(None);
    }
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let warnings = sampler_toml_from_scheduler(&mut table, &dir, path)?.unwrap_or_default();
    for w in &warnings {
        eprintln!("warning: {}: {w}", path.display());
    }
    let mut cfg: crate::config::sampler::SamplerConfig = toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| Error::input(e.message().to_string()).with_file(path))?;
    cfg.base_dir = Some(dir);
    cfg.validate().map_err(|e| e.with_file(path))?;
    Ok(Some(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v_and_sample_predictions_convert_to_the_same_eps() {
        // x_t = √ᾱ x₀ + √(1−ᾱ) ε for known x₀, ε; each parameterisation's exact output maps back.
        let (x0, eps, abar) = (0.3f64, -1.2f64, 0.7f64);
        let xt = abar.sqrt() * x0 + (1.0 - abar).sqrt() * eps;
        let v = abar.sqrt() * eps - (1.0 - abar).sqrt() * x0;
        for (ty, out) in [
            (PredictionType::Epsilon, eps),
            (PredictionType::VPrediction, v),
            (PredictionType::Sample, x0),
        ] {
            let e = ty.to_eps(out as f32, xt as f32, abar);
            assert!((e as f64 - eps).abs() < 1e-6, "{ty:?}: {e}");
        }
    }

    #[test]
    fn linear_betas_match_the_ddpm_schedule() {
        let sc = SchedulerConfig::parse(
            r#"{"_class_name": "DDPMScheduler", "beta_start": 0.0001, "beta_end": 0.02, "beta_schedule": "linear", "num_train_timesteps": 1000}"#,
            Path::new("s.json"),
        )
        .unwrap();
        let ours = Schedule::new(ScheduleConfig::default()).unwrap();
        let theirs = sc.schedule(Path::new("s.json")).unwrap();
        for (a, b) in ours.alpha_bars.iter().zip(&theirs.alpha_bars) {
            assert!((a - b).abs() < 1e-15);
        }
    }

    #[test]
    fn rejects_unknown_schedule_names() {
        let e = SchedulerConfig::parse(
            r#"{"_class_name": "DDPMScheduler", "beta_schedule": "exotic"}"#,
            Path::new("s.json"),
        )
        .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("beta_schedule"));
        let e =
            SchedulerConfig::parse(r#"{"_class_name": "EulerDiscreteScheduler"}"#, Path::new("s.json")).unwrap_err();
        assert!(e.to_string().contains("not supported"), "{e}");
    }
}
