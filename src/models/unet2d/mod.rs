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
//!   forward ([`cpu`]) on the host and to the CUDA forward ([`cuda`], feature `cudnn`) on a GPU.
//! * [`train`]: the trainable candle model with batched per-sample gradients.
//! * [`cpu`]: the CPU kernels (`cpu/kernels.rs`) and executors: the inference forward and the
//!   hand-written per-sample gradients ([`cpu::grad`]: the graph walked forward, then backward).
//! * [`cuda`]: the CUDA forward, its `.cu` kernels, the cuDNN convolutions and the record of
//!   cuDNN's algorithm choices.
//!
//! `unsafe` appears only under `cpu/` and `cuda/` (the kernels), each block with its
//! `// SAFETY:` invariant.
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
pub mod cpu;
pub mod cuda;
pub mod graph;
pub mod precision;
pub mod train;
pub mod weights;

pub use self::candle::{time_features, Unet2dModel};
pub use config::{
    Act, Resample, TimeEmbedding, Unet2dConfig, DOWN_BLOCKS, MAX_BLOCKS, MAX_LAYERS_PER_BLOCK, UP_BLOCKS,
};
/// The CPU per-sample-gradient pass (kept at this path for its callers).
pub use cpu::grad as grad_cpu;
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

/// Every executor of the [`super::Graph`] against candle's inference forward, on every fixture
/// config (real diffusers weights) and every preset config (seeded random weights): the CPU
/// forward and the candle trainer's forward within 1e-5 relative L2; the per-sample gradients
/// of the hand-written CPU pass (where it covers the config) and of candle's batched pass
/// within 1e-4 relative of candle's one-backward-per-sample reference, parameter by parameter.
#[cfg(test)]
mod tests {

    use std::collections::HashMap;
    use std::path::Path;

    use candle_core::{DType, Device, Tensor};

    use super::grad_cpu::{coverage, CpuGrad};
    use super::train::{per_sample_norms, PerSampleGrads, TrainUnet};
    use super::{Graph, Unet2dConfig, Unet2dModel, WeightStore};

    fn rel(a: &[f32], b: &[f32]) -> f64 {
        assert_eq!(a.len(), b.len());
        let d: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
        let n: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
        (d / n.max(1e-300)).sqrt()
    }

    fn host(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1().unwrap()
    }

    /// A seeded batch of b images of `config` at side `side`, timesteps > 0, noise.
    fn batch(config: &Unet2dConfig, b: usize, side: usize) -> (Vec<f32>, Vec<f64>, Vec<f32>) {
        let n = b * config.in_channels * side * side;
        let x: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin()).collect();
        let e: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.61 + 1.0).cos()).collect();
        let t: Vec<f64> = (0..b).map(|i| 3.0 + 211.0 * i as f64).collect();
        (x, t, e)
    }

    /// `got` equals `want` parameter by parameter within 1e-4 relative (a parameter whose gradient
    /// is zero in exact arithmetic, within 1e-6 of the sample's norm).
    fn grads_match(what: &str, got: &PerSampleGrads, want: &PerSampleGrads) {
        let norms = per_sample_norms(want).unwrap();
        let gn = per_sample_norms(got).unwrap();
        for (i, (a, b)) in gn.iter().zip(&norms).enumerate() {
            assert!((a - b).abs() <= 1e-4 * b, "{what} sample {i}: norm {a} vs {b}");
        }
        assert_eq!(got.len(), want.len(), "{what}");
        for ((n1, g1), (n2, g2)) in got.iter().zip(want) {
            assert_eq!(n1, n2, "{what}: parameter order");
            for (i, &sn) in norms.iter().enumerate() {
                let a = host(&g1.get(i).unwrap());
                let b = host(&g2.get(i).unwrap());
                let d: f64 = a
                    .iter()
                    .zip(&b)
                    .map(|(x, y)| ((x - y) as f64).powi(2))
                    .sum::<f64>()
                    .sqrt();
                let nb: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum::<f64>().sqrt();
                assert!(
                    d <= 1e-4 * nb + 1e-6 * sn,
                    "{what}: {n1} sample {i}: error {d:e}, norm {nb:e}"
                );
            }
        }
    }

    /// Every executor on one config with the tensors `tensors`.
    fn check(name: &str, config: &Unet2dConfig, tensors: HashMap<String, Tensor>, side: usize, grads: bool) {
        let g = Graph::new(config);
        assert!(g.skips_balance(), "{name}");
        let store = WeightStore::new(tensors.clone(), Path::new("w.safetensors"));
        let inf = Unet2dModel::new(config, &store).unwrap();
        let b = 2;
        let (x, t, e) = batch(config, b, side);
        let shape = (b, config.in_channels, side, side);
        let xt = Tensor::from_slice(&x, shape, &Device::Cpu).unwrap();
        let et = Tensor::from_slice(&e, shape, &Device::Cpu).unwrap();
        let reference = host(&inf.forward_candle(&xt, &t).unwrap());
        let cpu = inf.forward_host(&x, [b, config.in_channels, side, side], &t).unwrap();
        let r = rel(&cpu, &reference);
        assert!(r <= 1e-5, "{name}: CPU forward vs candle: {r:e}");
        let train = TrainUnet::from_tensors(config, tensors, Path::new("w.safetensors"), &Device::Cpu).unwrap();
        let tr = host(&train.forward(&xt, &t).unwrap());
        let r = rel(&tr, &reference);
        assert!(r <= 1e-5, "{name}: trainer forward vs candle: {r:e}");
        eprintln!("{name}: forwards equal");
        if !grads {
            return;
        }
        let loop_ref = train.per_sample_grads_loop(&xt, &t, &et).unwrap();
        let batched = train.per_sample_grads(&xt, &t, &et).unwrap();
        grads_match(&format!("{name}: batched candle"), &batched, &loop_ref);
        match coverage(&g) {
            Some(why) => eprintln!("{name}: CPU per-sample gradients do not cover {why}"),
            None => {
                let mut pass = CpuGrad::new(&train, [config.in_channels, side, side]).unwrap();
                let flat = pass.per_sample(&x, &t, &e).unwrap();
                let ours: PerSampleGrads = pass
                    .layout()
                    .iter()
                    .map(|(n, off, dims)| {
                        let len: usize = dims.iter().product();
                        let rows: Vec<Tensor> = flat
                            .iter()
                            .map(|f| Tensor::from_slice(&f[*off..off + len], dims.as_slice(), &Device::Cpu).unwrap())
                            .collect();
                        (n.clone(), Tensor::stack(&rows, 0).unwrap())
                    })
                    .collect();
                grads_match(&format!("{name}: hand-written CPU"), &ours, &loop_ref);
            }
        }
        eprintln!("{name}: per-sample gradients equal");
    }

    #[test]
    fn every_executor_equals_candle_on_every_fixture_config() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/diffusers");
        let mut seen = 0;
        for entry in std::fs::read_dir(&root).unwrap() {
            let dir = entry.unwrap().path();
            if !dir.join("config.json").is_file() {
                continue;
            }
            let name = dir.file_name().unwrap().to_string_lossy().to_string();
            let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
            let config = Unet2dConfig::parse(&text, &dir.join("config.json")).unwrap();
            let tensors: HashMap<String, Tensor> =
                candle_core::safetensors::load(dir.join(crate::models::diffusers::WEIGHTS), &Device::Cpu)
                    .unwrap()
                    .into_iter()
                    .map(|(k, v)| (k, v.to_dtype(DType::F32).unwrap()))
                    .collect();
            let side = config.sample_size.map_or(16, |(h, _)| h);
            check(&name, &config, tensors, side, true);
            seen += 1;
        }
        assert!(seen >= 4, "{seen} fixtures");
    }

    /// The presets with seeded weights; ddpm-cifar10's per-sample gradients (3.6 GB in candle's
    /// batched pass) are in `grad_cpu`'s ignored test, its forwards here.
    #[test]
    fn every_executor_equals_candle_on_every_preset_config() {
        for (name, text, _) in crate::models::diffusers_train::PRESETS {
            let config = Unet2dConfig::parse(text, Path::new("config.json")).unwrap();
            let m = TrainUnet::random(&config, 7, &Device::Cpu).unwrap();
            let side = config.sample_size.map_or(16, |(h, _)| h);
            check(name, &config, m.tensors().unwrap(), side, *name != "ddpm-cifar10");
        }
    }
}
