//! Privacy of diffusion sampling with the empirical denoiser
//! (../shared/seeds/diffusion-sampling-privacy.md, §3–4, §6, App. A and D).
//!
//! - [`schedule`]: EDM/Karras, DDPM linear and cosine (with DDIM sub-sequences), flow matching,
//!   all mapped to the variance-exploding form x_t = x₀ + t·ε; step conventions A/B/C; the ᾱ
//!   table of a trained denoiser ([`schedule::table`]) and diffusers `scheduler_config.json`
//!   files ([`schedule::diffusers`]): the one schedule module.
//! - [`sensitivity`]: μ_t = 2C/(p_t(x_t)|D|)·√(2Δt/t³) (§3.1) and which steps are private
//!   (hybrid public→empirical switch, early stop).
//! - [`denoiser`]: the empirical denoiser Ê[x₀|x_t; D] in candle (batched, log-sum-exp, clipping of
//!   v(x₀; x_t)) and a sampler that runs it, full batch or subsampled.
//! - [`account`]: per-step plan → [`crate::events::DpEvent`] → every accountant, CLT validity
//!   checks, critical-window view; [`sampler_accounting`] is the entry point for `dpaudit check`.
//! - [`sweep`]: parallel, deterministic grid sweeps over any combination of settings.
//! - [`calibrate`]: the t_min, rate, samples, switch step or clip that meets a target ε.

pub mod account;
pub mod calibrate;
#[cfg(feature = "models")]
pub mod denoiser;
pub mod sampler;
pub mod schedule;
pub mod sensitivity;
pub mod sweep;

pub use account::{analyze, plan, sampler_accounting, Analysis, SamplerAccounting};
pub use sampler::SamplerConfig;
pub use schedule::{Convention, Schedule};
