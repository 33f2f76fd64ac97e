//! # dpaudit — privacy audit and accounting for diffusion-model pipelines
//!
//! ```text
//!  sampler config (TOML) ─┐
//!  claims file (TOML)  ───┼─► events::DpEvent ─► accountants ─► Evidence ─► verdicts ─┐
//!  pipeline run (data) ───┘   (what happened)    (gdp, clt,     (ε(δ), δ(ε),               ├─► report
//!  checkpoint + data ──────► attacks (MIA, audits) ─► empirical ASR / ε lower bound ────────┘
//! ```
//!
//! Each module owns one stage: [`config`] parses inputs, [`events`] describes what ran,
//! [`accountants`] turn events into (ε, δ) with a stated [`accountants::BoundKind`],
//! [`diffusion`] derives per-step sensitivities of diffusion sampling, [`pipelines`] maps published
//! mechanisms (RAPID, DP-RDM, DPAgg-TI) to events and runs them, [`attacks`] measures empirical
//! leakage, [`data`] reads the data sets and their splits, [`models`] trains denoisers (the 8×8
//! toys in `models::toy`, the diffusers UNet in `models::unet2d`), and [`report`] renders
//! everything.
//!
//! ## Library use
//!
//! Every accountant answers through the [`accountants::Accountant`] trait and says what kind of
//! number it returns; a sound kind is never below the truth:
//!
//! ```
//! use dpaudit::accountants::{gdp, Accountant, AccountantKind, BoundKind};
//! use dpaudit::events::{DpEvent, Neighbouring};
//!
//! // One full-batch Gaussian step with noise multiplier 1 is exactly 1-GDP
//! // (Dong, Roth & Su 2022), so its ε(δ) has a closed form (their Cor. 2.13).
//! let exact = gdp::epsilon_for_delta(1.0, 1e-5).unwrap();
//! let pld = AccountantKind::Pld.build();
//! let r = pld.epsilon(&DpEvent::gaussian(1.0), Neighbouring::AddRemove, 1e-5).unwrap();
//! assert_eq!(r.kind, BoundKind::UpperBound);
//! assert!(r.epsilon >= exact && r.epsilon <= exact * 1.01);
//!
//! // DP-SGD (σ = 1.1, q = 0.004, 14,062 steps): RDP and PLD are sound, the PLD the tighter one.
//! let ev = DpEvent::dpsgd(1.1, 0.004, 14_062);
//! let rdp = AccountantKind::Rdp.build().epsilon(&ev, Neighbouring::AddRemove, 1e-5).unwrap();
//! let pld = pld.epsilon(&ev, Neighbouring::AddRemove, 1e-5).unwrap();
//! assert!(rdp.kind.is_sound() && pld.kind.is_sound());
//! assert!(pld.epsilon <= rdp.epsilon);
//! ```

// `deny`, not `forbid`: `unsafe` is allowed only in the UNet's kernel folders,
// `models/unet2d/cpu/` (SIMD kernels) and `models/unet2d/cuda/` (CUDA, cuDNN, cuBLAS), plus two
// system calls outside them (`models::device`'s CUDA memory-pool set-up and
// `report::output`'s `renameat2`), and the accountants' copies compiled for an instruction set
// and called after detecting it (`numeric::dd`'s `feature_dispatch!`, which makes the
// double-word FMA copies and the AVX2 copies of the PLD's discretisation and Chernoff passes, and
// `numeric::normal_tail`'s AVX2 batched tails, with their vector stores); every block states its
// invariant in a `// SAFETY:` comment.
#![deny(unsafe_code)]
#![deny(missing_docs)]
// Crate-private helpers that only the model and attack code calls are unused in the candle-free
// build (feature `models` off, the Python extension); dead code is checked in the default build.
#![cfg_attr(not(feature = "models"), allow(dead_code))]

/// `eprintln!` that never panics: a diagnostic that cannot be written (stderr closed, on a full
/// disk or `/dev/full`) is dropped instead of aborting the command. Shadows the standard macro
/// for the whole crate (docs/reliability.md, "Standard streams").
macro_rules! eprintln {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stderr(), $($arg)*);
    }};
}

/// `eprint!` that never panics (see `eprintln!` above).
#[allow(unused_macros)]
macro_rules! eprint {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::write!(::std::io::stderr(), $($arg)*);
    }};
}

pub mod accountants;
pub mod api;
pub mod attacks;
pub mod audit;
pub mod config;
pub mod data;
pub mod diagnostics;
pub mod diffusion;
pub mod error;
pub mod events;
pub mod input;
pub mod limits;
pub mod models;
pub mod numeric;
pub mod pipelines;
pub mod provenance;
pub mod report;
pub mod timing;

pub use error::{Error, ErrorKind, Result};
