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
//! * [`diffusers`], [`unet2d`], [`scheduler`]: HuggingFace diffusers `UNet2DModel` checkpoints
//!   and `scheduler_config.json` files (any image size and channel count).
//! * [`unet2d_train`], [`diffusers_train`]: the diffusers UNet trained in candle, with per-sample
//!   gradients in one batched pass, and `dpaudit train --unet` (plain or DP-SGD as Opacus runs it).
//! * [`unet2d_grad_cpu`]: the same gradients on the CPU by a hand-written forward and backward
//!   pass of one sample at a time (what `train --unet` runs on the CPU).
//! * [`images`]: image data sets (the shipped MNIST digits, PNG folders, `.npy` arrays) and
//!   their member/non-member splits; [`npy`]: `.npy` reading and writing.
//! * [`precision`]: `--precision fp32|tf32|bf16` of the UNet forward on a GPU (cuDNN
//!   convolutions with an explicit math type in `cudnn_conv`, feature `cudnn`).
//! * [`algo_record`]: the per-machine record of cuDNN's convolution algorithm choices.
//! * [`kernels`]: the CPU GEMM, exp and SiLU kernels of the diffusers UNet's CPU forward.

pub mod algo_record;
pub mod canary;
pub mod checkpoint;
#[cfg(feature = "cudnn")]
pub mod cudnn_conv;
pub mod data;
pub mod device;
pub mod diffusers;
pub mod diffusers_train;
pub mod dp;
pub mod images;
pub mod kernels;
pub mod net;
pub mod npy;
pub mod precision;
pub mod run;
pub mod schedule;
/// diffusers `scheduler_config.json` files are read in [`crate::diffusion::scheduler`].
pub use crate::diffusion::scheduler;
pub mod train;
pub mod unet2d;
pub mod unet2d_grad_cpu;
pub mod unet2d_train;

pub use checkpoint::{Card, Checkpoint};
pub use data::{Dataset, SplitManifest};
pub use device::DeviceChoice;
pub use net::{Arch, ModelConfig, Net};
pub use schedule::Schedule;

/// Number of pixels of one image (8×8).
pub const PIXELS: usize = 64;
/// Side of one image.
pub const SIDE: usize = 8;
