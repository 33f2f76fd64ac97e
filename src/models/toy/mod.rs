//! The 8×8 world: small ε-prediction denoisers for the digits data (candle), their training
//! (plain, and DP-SGD as RAPID's Algorithm 2 with its retrieval variant) and their checkpoints.
//!
//! * [`net`]: an MLP with a sinusoidal time embedding and a small UNet, with deterministic
//!   (seeded) initialisation.
//! * [`train`]: DDPM training with Adam and EMA weights.
//! * [`dp`]: RAPID's Algorithm 2 (Poisson sampling, per-sample clipping, Gaussian noise, Adam)
//!   and its retrieval variant; every run records its [`crate::events::DpEvent`].
//! * [`run`]: a whole `dpaudit train` run as one library call (plan → checkpoint, card, ledger).
//! * [`checkpoint`]: safetensors weights plus a TOML card (data and split hashes, seed, command).
//!
//! The noise schedule is [`crate::diffusion::schedule::table`], the data [`crate::data::digits`].

pub mod checkpoint;
pub mod dp;
pub mod net;
pub mod run;
pub mod train;

pub use crate::data::digits::{PIXELS, SIDE};
pub use checkpoint::{Card, Checkpoint};
pub use net::{Arch, ModelConfig, Net};
