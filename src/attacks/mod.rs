//! Attacks on trained denoisers and on the empirical-denoiser sampler, their metrics, and the
//! theoretical limits the accounting implies; [`audit`] holds the reusable Clopper–Pearson /
//! empirical-ε machinery used by the mechanism audits.
//!
//! ```text
//!  checkpoint + split ─► mia::scores (loss, SecMI, PIA, empirical) ─► metrics (exact ROC, AUC,
//!  TPR@FPR, held-out & oracle ASR, bootstrap, ε lower bound) ─┐
//!  card's DP ledger ─► accountants ─► theory (ASR and TPR limits) ─┴─► pipeline::MiaReport
//! ```

pub mod audit;
pub mod diffusers;
pub mod empirical;
pub mod metrics;
pub mod mia;
pub mod pipeline;
pub mod theory;
