//! # dpaudit — privacy audit and accounting for diffusion-model pipelines
//!
//! ```text
//!  sampler config (TOML) ─┐
//!  claims file (TOML)  ───┼─► events::DpEvent ─► accountants ─► AccountResult ─► verdicts ─┐
//!  pipeline run (data) ───┘   (what happened)    (gdp, clt,     (ε(δ), δ(ε),               ├─► report
//!  checkpoint + data ──────► attacks (MIA, audits) ─► empirical ASR / ε lower bound ────────┘
//! ```
//!
//! Each module owns one stage: [`config`] parses inputs, [`events`] describes what ran,
//! [`accountants`] turn events into (ε, δ) with a stated [`accountants::BoundKind`],
//! [`diffusion`] derives per-step sensitivities of diffusion sampling, [`pipelines`] maps published
//! mechanisms (RAPID, DP-RDM, DPAgg-TI) to events and runs them, [`attacks`] measures empirical
//! leakage, [`models`] trains small denoisers, and [`report`] renders everything.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod accountants;
pub mod attacks;
pub mod audit;
pub mod cli;
pub mod config;
pub mod diffusion;
pub mod error;
pub mod events;
pub mod limits;
pub mod models;
pub mod numeric;
pub mod pipelines;
pub mod report;

pub use error::{Error, ErrorKind, Result};
