//! Attacks on trained denoisers and on the empirical-denoiser sampler, their metrics, the
//! theoretical limits the accounting implies, and the audits whose ε lower bounds are valid.
//!
//! ```text
//!  checkpoint + split ─► mia::scores (loss, SecMI, PIA, empirical) ─► metrics (exact ROC, AUC,
//!  TPR@FPR, held-out & oracle ASR, bootstrap) ─┐
//!  training ledger / sampler config ─► theory (ASR and TPR limits) ─┤
//!  canaries of one run ─► one_run (Steinke et al. 2023) ─────────────┼─► pipeline::MiaReport
//!  independent runs ─► audit (Clopper–Pearson, held-out threshold) ──┘
//! ```

pub mod audit;
/// Canary records are inserted by training: [`crate::models::canary`].
#[cfg(feature = "models")]
pub use crate::models::canary;
#[cfg(feature = "models")]
pub mod denoiser;
#[cfg(feature = "models")]
pub mod empirical;
pub mod fdp;
#[cfg(feature = "models")]
pub mod mechanism;
pub mod metrics;
#[cfg(feature = "models")]
pub mod mia;
pub mod one_run;
#[cfg(feature = "models")]
pub mod pipeline;
#[cfg(feature = "models")]
pub mod plan;
#[cfg(feature = "models")]
pub mod render;
#[cfg(feature = "models")]
pub mod scores;
#[cfg(feature = "models")]
pub mod shard;
pub mod shard_spec;
#[cfg(feature = "models")]
pub mod subject;
pub mod theory;
pub mod white_box;
