//! The diffusers `UNet2DModel` (the unconditional DDPM UNet of Ho et al. 2020 as implemented in
//! HuggingFace diffusers), built from its `config.json` and loaded from
//! `diffusion_pytorch_model.safetensors` under diffusers' own tensor names.
//!
//! One definition, several executors:
//!
//! * [`config`]: `config.json` parsing, defaults and limits ([`Unet2dConfig`]).
//! * [`graph`]: the config as a typed graph of ops in execution order, each carrying its
//!   diffusers tensor names and shapes — the only producer of tensor names and the only wiring
//!   of the down → mid → up path.
//! * [`weights`]: the safetensors tensors handed out by the graph's names and shapes.
//! * [`candle`]: inference with candle's kernels ([`Unet2dModel`]), which dispatches to the CPU
//!   forward ([`cpu`]) on the host and to the CUDA forward (`cuda`, feature `cudnn`) on a GPU.
//! * [`train`]: the trainable candle model with batched per-sample gradients; [`grad_cpu`]: the
//!   hand-written CPU per-sample gradients (the graph walked forward, then backward).
//! * [`Unsupported`]: what an executor does not cover, as a typed reason.
//!
//! Supported: `DownBlock2D`, `AttnDownBlock2D`, `UpBlock2D`, `AttnUpBlock2D`, `UNetMidBlock2D`
//! (with or without attention, or no mid block), `ResnetBlock2D` with `default` or `scale_shift`
//! time conditioning, `positional` (sinusoidal) or `fourier` (Gaussian Fourier projection) time
//! embeddings, `conv` or `resnet` down/upsampling, any channel counts, group counts and image
//! size (divisible by 2 per downsampling). The wiring follows the diffusers source
//! (`unets/unet_2d.py`, `unet_2d_blocks.py`, `resnet.py`, `attention_processor.py`,
//! `embeddings.py`).

pub mod candle;
pub mod config;
mod cpu;
#[cfg(feature = "cudnn")]
mod cuda;
pub mod grad_cpu;
pub mod graph;
pub mod train;
pub mod weights;

pub use self::candle::{time_features, Unet2dModel};
pub use config::{
    Act, Resample, TimeEmbedding, Unet2dConfig, DOWN_BLOCKS, MAX_BLOCKS, MAX_LAYERS_PER_BLOCK, UP_BLOCKS,
};
/// One plane of an im2col, shared with the CPU gradient pass.
pub(crate) use cpu::im2col_plane;
pub use graph::Graph;
pub use weights::WeightStore;

/// Why an executor does not run a config (printed by `dpaudit model info`); an executor that
/// does not cover a config says so with one of these, never by silently running another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unsupported {
    /// An activation other than SiLU.
    Activation(Act),
    /// A Fourier time embedding.
    FourierTime,
    /// `scale_shift` time conditioning.
    ScaleShift,
    /// ResNet down/upsampling.
    ResnetResampling,
    /// The build has no such executor (e.g. no `cudnn` feature).
    NotBuilt(&'static str),
}

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unsupported::Activation(a) => write!(f, "activation {a:?} (only SiLU)"),
            Unsupported::FourierTime => write!(f, "a Fourier time embedding (only positional)"),
            Unsupported::ScaleShift => write!(f, "`scale_shift` time conditioning (only `default`)"),
            Unsupported::ResnetResampling => write!(f, "ResNet down/upsampling (only convolutional)"),
            Unsupported::NotBuilt(why) => write!(f, "not in this build ({why})"),
        }
    }
}

/// The executors of a [`Graph`] and what each does not cover on `config` (`None`: covered).
pub fn executors(config: &Unet2dConfig) -> Vec<(&'static str, Option<Unsupported>)> {
    let g = Graph::new(config);
    vec![
        ("candle inference", None),
        ("CPU forward", None),
        ("CUDA forward", cuda_unsupported(&g)),
        ("candle trainer (batched per-sample gradients)", None),
        ("CPU per-sample gradients", grad_cpu::coverage(&g)),
    ]
}

/// What the CUDA forward does not cover: SiLU, positional time embeddings and convolutional
/// resampling only.
pub fn cuda_unsupported(g: &Graph) -> Option<Unsupported> {
    if !cfg!(feature = "cudnn") {
        return Some(Unsupported::NotBuilt("feature `cudnn`"));
    }
    cuda_coverage(g)
}

/// [`cuda_unsupported`] regardless of the build's features.
pub(crate) fn cuda_coverage(g: &Graph) -> Option<Unsupported> {
    for op in &g.ops {
        match op {
            graph::Op::Time(t) if t.fourier.is_some() => return Some(Unsupported::FourierTime),
            graph::Op::Resnet(r) if r.act != Act::Silu => return Some(Unsupported::Activation(r.act)),
            graph::Op::Resnet(r) if r.updown != graph::Updown::None => return Some(Unsupported::ResnetResampling),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests;
