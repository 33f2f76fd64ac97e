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
pub use crate::models::canary;
pub mod denoiser;
pub mod empirical;
pub mod fdp;
pub mod mechanism;
pub mod metrics;
pub mod mia;
pub mod one_run;
pub mod pipeline;
pub mod plan;
pub mod render;
pub mod scores;
pub mod shard;
pub mod shard_spec;
pub mod subject;
pub mod theory;
pub mod white_box;
