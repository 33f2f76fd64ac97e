//! Small ε-prediction denoisers for 8×8 images (candle), their training (plain and DP), and
//! checkpoints.
//!
//! * [`net`]: an MLP with a sinusoidal time embedding and a small UNet, with deterministic
//!   (seeded) initialisation.
//! * [`schedule`]: the DDPM linear β schedule (Ho et al. 2020, §4: β₁ = 1e-4 … β_T = 0.02).
//! * [`data`]: the digits data set and member/non-member/public split manifests (disjoint,
//!   hashed).
//! * [`train`]: DDPM training with Adam and EMA weights.
//! * [`dp`]: DP-SGD as in RAPID's Algorithm 2 (Poisson sampling, per-sample clipping, Gaussian
//!   noise, Adam) and RAPID's retrieval variant; every run records its [`crate::events::DpEvent`].
//! * [`run`]: a whole `dpaudit train` run as one library call (plan → checkpoint, card, ledger).
//! * [`checkpoint`]: safetensors weights plus a TOML card (data and split hashes, seed, command).
//! * [`device`]: `--device auto|cpu|cuda`.
//! * [`unet2d`]: the diffusers `UNet2DModel` — its config, the typed graph every executor walks
//!   (the only producer of diffusers tensor names), its weights, and the executors: candle
//!   inference, the CPU forward, the CUDA forward, the candle trainer with batched per-sample
//!   gradients and the hand-written CPU per-sample gradients.
//! * [`diffusers`], [`scheduler`]: HuggingFace diffusers checkpoint folders and
//!   `scheduler_config.json` files (any image size and channel count).
//! * [`diffusers_train`]: `dpaudit train --unet` (plain or DP-SGD as Opacus runs it).
//! * [`images`]: image data sets (the shipped MNIST digits, PNG folders, `.npy` arrays) and
//!   their member/non-member splits; [`npy`]: `.npy` reading and writing.
//! * [`precision`]: `--precision fp32|tf32|bf16` of the UNet forward on a GPU (cuDNN
//!   convolutions with an explicit math type in `unet2d::cuda::cudnn_conv`, feature `cudnn`).
//!
//! The CPU kernels (`unet2d/cpu/kernels.rs`) and the CUDA code (`unet2d/cuda/`: the forward, its
//! `.cu`, cuDNN and the algorithm record) live under [`unet2d`]; `unsafe` appears only there
//! (and in [`device`]'s CUDA memory-pool set-up).

pub mod canary;
pub mod checkpoint;
pub mod data;
pub mod device;
pub mod diffusers;
pub mod diffusers_train;
pub mod dp;
pub mod images;
pub mod net;
pub mod npy;
/// `--precision` lives with the UNet it applies to; re-exported here for its callers outside
/// `models/`.
pub use unet2d::precision;
pub mod run;
pub mod schedule;
/// diffusers `scheduler_config.json` files are read in [`crate::diffusion::scheduler`].
pub use crate::diffusion::scheduler;
pub mod train;
pub mod unet2d;

pub use checkpoint::{Card, Checkpoint};
pub use data::{Dataset, SplitManifest};
pub use device::DeviceChoice;
pub use net::{Arch, ModelConfig, Net};
pub use schedule::Schedule;

/// Number of pixels of one image (8×8).
pub const PIXELS: usize = 64;
/// Side of one image.
pub const SIDE: usize = 8;
