//! diffusers `scheduler_config.json` (`DDPMScheduler`, `DDIMScheduler`): the training noise
//! schedule (β schedule over `num_train_timesteps`), the sampling sub-sequence
//! (`timestep_spacing`, `steps_offset`), the model's `prediction_type` (ε, v or x₀) and clipping.
//!
//! Two uses:
//! * attacks need ᾱ_t and ε: [`SchedulerConfig::schedule`] gives the ᾱ table (β as in diffusers'
//!   `DDPMScheduler.__init__`), [`PredictionType::to_eps`] converts the model output to ε;
//! * `analyze`/`sweep` need the noise levels of sampling: [`SchedulerConfig::to_sampler_schedule`]
//!   maps the config onto dpaudit's own [`crate::diffusion::schedule::Schedule`]; a sampler TOML
//!   that names a scheduler file (`scheduler_config = "…"`) is read by the one sampler loader,
//!   [`crate::config::sampler::SamplerConfig::load`], with the same keys, defaults and errors as
//!   a TOML with its own `[schedule]`.

use std::path::Path;

use serde_json::Value;

use super::{Schedule as SamplerSchedule, Spacing};
use crate::error::{Error, Result};

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
    /// `algorithm_type` of a DPM-Solver config (named in its refusal).
    pub algorithm: Option<String>,
}

fn err(path: &Path, key: &str, msg: impl Into<String>) -> Error {
    Error::field(key, msg).with_file(path)
}

impl SchedulerConfig {
    /// Reads a `scheduler_config.json`.
    pub fn load(path: &Path) -> Result<Self> {
        let text = crate::input::read_to_string(path)?;
        Self::parse(&text, path)
    }

    /// Parses the text of a `scheduler_config.json`; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let v: Value = crate::input::parse_python_json(text).map_err(|e| {
            Error::input(format!("not valid JSON: {e}"))
                .with_file(path)
                .with_line(e.line())
        })?;
        let o = v
            .as_object()
            .ok_or_else(|| Error::input("scheduler_config.json must be a JSON object").with_file(path))?;
        // Every scheduler class carries the training schedule (β over num_train_timesteps) that
        // attacks need; which classes the sampler analysis covers is decided in
        // [`Self::sampler_support`].
        let class_name = match o.get("_class_name").and_then(Value::as_str) {
            Some(c) if c.ends_with("Scheduler") => c.to_string(),
            Some(c) => {
                return Err(err(
                    path,
                    "_class_name",
                    format!("`{c}` is not a diffusers scheduler class (expected e.g. DDPMScheduler or DDIMScheduler)"),
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
            algorithm: o.get("algorithm_type").and_then(Value::as_str).map(str::to_string),
        })
    }

    /// diffusers' name of the β schedule.
    pub(crate) fn beta_schedule_name(&self) -> &'static str {
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
            BetaSchedule::SquaredcosCapV2 => super::cosine_betas(0.008, 0.999, t),
            BetaSchedule::Sigmoid => lin(-6.0, 6.0)
                .into_iter()
                .map(|x| 1.0 / (1.0 + (-x).exp()) * (self.beta_end - self.beta_start) + self.beta_start)
                .collect(),
            BetaSchedule::Trained(b) => b.clone(),
        };
        if self.rescale_betas_zero_snr {
            // Lin et al. 2024, Algorithm 1: shift and scale √ᾱ so that ᾱ_T = 0.
            let ab = super::alpha_bar_from_betas(&betas);
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

    /// Whether the sampler analysis covers this scheduler class: DDPMScheduler (ancestral) and
    /// DDIMScheduler (analysed as η = 1) are; every other class is refused with the reason and
    /// the way out. The per-step analysis needs fresh Gaussian noise in each step (a Gaussian
    /// mechanism per step); a deterministic ODE sampler adds none after the initial noise, so it
    /// has no finite per-step μ.
    pub(crate) fn sampler_support(&self, path: &Path) -> Result<()> {
        let c = self.class_name.as_str();
        let ode = "each step is a deterministic update of the probability-flow ODE that adds no fresh noise, so no step is a Gaussian mechanism and no finite per-step μ exists (only the initial noise x_T is random, and the analysis does not cover a privacy argument resting on it alone)";
        let way_out = "Way out: if the pipeline can sample ancestrally, set `_class_name` to \"DDPMScheduler\" (same β schedule; the sampler analysed is DDPM's ancestral step, which adds noise every step) or use a DDIMScheduler config (analysed as η = 1); `mia` attacks on the UNet need only the β schedule and accept this file as it is";
        let reason = match c {
            "DDPMScheduler" | "DDIMScheduler" => return Ok(()),
            "EulerDiscreteScheduler" => format!(
                "the Euler sampler with its default s_churn = 0 (diffusers adds noise only when s_churn > 0 is passed to each step call, which the config does not record): {ode}"
            ),
            "DPMSolverMultistepScheduler" | "DPMSolverSinglestepScheduler" | "DEISMultistepScheduler" | "UniPCMultistepScheduler" => format!(
                "a multistep exponential-integrator ODE solver ({}): {ode}; its SDE variants reuse earlier denoiser outputs in each step, outside the one-step form the per-step formula assumes",
                self.algorithm.as_deref().unwrap_or("its algorithm_type")
            ),
            "PNDMScheduler" | "LMSDiscreteScheduler" | "HeunDiscreteScheduler" | "KDPM2DiscreteScheduler" => format!(
                "a deterministic (pseudo) linear-multistep or Runge–Kutta ODE sampler: {ode}"
            ),
            _ => "the per-step analysis covers ancestral samplers only (DDPMScheduler, DDIMScheduler as η = 1); this class's step is not analysed".to_string(),
        };
        Err(err(
            path,
            "_class_name",
            format!("`{c}` is not analysed: {reason}. {way_out}."),
        ))
    }

    /// dpaudit's sampler schedule for sampling with `levels` inference steps (default: all T),
    /// with the scheduler's `timestep_spacing` and `steps_offset` (timesteps exactly as diffusers'
    /// `set_timesteps`, see [`crate::diffusion::schedule::diffusers_timesteps`]).
    /// Supported: linear, `scaled_linear` and `squaredcos_cap_v2` β.
    pub fn to_sampler_schedule(&self, levels: Option<usize>, path: &Path) -> Result<SamplerSchedule> {
        self.sampler_support(path)?;
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
                steps_offset: self.steps_offset,
                diffusers_float32: true,
            }),
            BetaSchedule::ScaledLinear => Ok(SamplerSchedule::DdpmScaledLinear {
                beta_start: self.beta_start,
                beta_end: self.beta_end,
                timesteps,
                levels,
                spacing,
                steps_offset: self.steps_offset,
                diffusers_float32: true,
            }),
            BetaSchedule::SquaredcosCapV2 => Ok(SamplerSchedule::DdpmCosine {
                s: 0.008,
                max_beta: 0.999,
                timesteps,
                levels,
                spacing,
                steps_offset: self.steps_offset,
                diffusers_float32: true,
            }),
            _ => Err(err(
                path,
                "beta_schedule",
                "the sampler analysis supports linear, scaled_linear and squaredcos_cap_v2 β schedules (sigmoid and trained_betas: not yet)",
            )),
        }
    }
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
    fn rejects_unknown_schedule_names() {
        let e = SchedulerConfig::parse(
            r#"{"_class_name": "DDPMScheduler", "beta_schedule": "exotic"}"#,
            Path::new("s.json"),
        )
        .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("beta_schedule"));
        let sc = SchedulerConfig::parse(r#"{"_class_name": "EulerDiscreteScheduler"}"#, Path::new("s.json")).unwrap();
        let e = sc.to_sampler_schedule(None, Path::new("s.json")).unwrap_err();
        assert!(e.to_string().contains("no finite per-step μ"), "{e}");
        assert!(SchedulerConfig::parse(r#"{"_class_name": "Euler"}"#, Path::new("s.json")).is_err());
    }
}
