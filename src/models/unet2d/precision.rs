//! `--precision fp32|tf32|bf16`: the arithmetic of the diffusers UNet forward on a GPU.
//!
//! * **fp32** (the default, and the only choice on the CPU): IEEE single precision in every
//!   product: cuDNN convolutions restricted to FMA kernels and cuBLAS without TF32, as PyTorch
//!   runs with `torch.backends.cudnn.allow_tf32 = False` (and its default matmul setting).
//! * **tf32**: convolutions and matrix products on tensor cores with inputs rounded to TF32
//!   (10-bit mantissa) and f32 accumulation; everything else f32. PyTorch's default for
//!   convolutions.
//! * **bf16**: weights and activations in bfloat16 (8-bit mantissa), f32 accumulation in the
//!   convolutions and products, group norm computed in f32.
//!
//! The choice is a value, not process state: the plan's `--precision` is carried by the loaded
//! checkpoint ([`crate::models::diffusers::DiffusersCheckpoint::precision`]) into every forward
//! ([`super::Unet2dModel::forward_at`]), so a run can score a sample again in fp32 through the
//! same weights and state the largest change (the `mia` report's `precision` fact). candle's
//! cuBLAS TF32 switch is process-wide inside candle; each forward sets it from its own value
//! ([`apply_gemm`]).
//! Layers call [`conv2d`] and [`linear`] instead of candle-nn's `forward`: at fp32 on the CPU
//! they are exactly candle-nn's.

use candle_core::{DType, Device, Tensor};
use candle_nn::{Conv2d, Linear, Module};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The arithmetic of the UNet forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// IEEE f32 throughout.
    #[default]
    Fp32,
    /// TF32 tensor-core convolutions and matrix products, f32 accumulation.
    Tf32,
    /// bfloat16 weights and activations, f32 accumulation, f32 group norm.
    Bf16,
}

impl Precision {
    /// The name as written on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::Bf16 => "bf16",
        }
    }

    /// The dtype of the activations and weights in the forward.
    pub fn dtype(self) -> DType {
        match self {
            Precision::Bf16 => DType::BF16,
            _ => DType::F32,
        }
    }
}

/// Sets candle's cuBLAS TF32 switch (process-wide inside candle) for a forward computing at `p`;
/// a no-op without the `cuda` feature.
pub fn apply_gemm(p: Precision) {
    #[cfg(feature = "cuda")]
    candle_core::cuda::set_gemm_reduced_precision_f32(p == Precision::Tf32);
    #[cfg(not(feature = "cuda"))]
    let _ = p;
}

/// Refuses tf32 and bf16 off a CUDA device (the CPU forward is f32 only).
pub fn check_device(p: Precision, device: &Device) -> Result<()> {
    if p != Precision::Fp32 && !device.is_cuda() {
        return Err(Error::field(
            "--precision",
            format!(
                "{} needs --device cuda (the CPU forward computes in fp32 only)",
                p.as_str()
            ),
        ));
    }
    Ok(())
}

fn cast(t: &Tensor, dt: DType) -> candle_core::Result<Tensor> {
    if t.dtype() == dt {
        Ok(t.clone())
    } else {
        t.to_dtype(dt)
    }
}

/// `c.forward(x)` in `x`'s dtype: on a CUDA device with the `cudnn` feature through cuDNN with
/// the math type of `p`, otherwise candle's convolution (weights cast to `x`'s dtype).
pub fn conv2d(c: &Conv2d, x: &Tensor, p: Precision) -> candle_core::Result<Tensor> {
    let dt = x.dtype();
    #[cfg(not(feature = "cudnn"))]
    let _ = p;
    #[cfg(feature = "cudnn")]
    if x.device().is_cuda() {
        let cfg = c.config();
        let op = super::cuda::cudnn_conv::CudnnConv2d {
            padding: cfg.padding,
            stride: cfg.stride,
            precision: match p {
                Precision::Fp32 => super::cuda::cudnn_conv::Math::Fp32,
                Precision::Tf32 => super::cuda::cudnn_conv::Math::Tf32,
                Precision::Bf16 => super::cuda::cudnn_conv::Math::Bf16,
            },
        };
        let y = x
            .contiguous()?
            .apply_op2_no_bwd(&cast(c.weight(), dt)?.contiguous()?, &op)?;
        return match c.bias() {
            Some(b) => y.broadcast_add(&cast(b, dt)?.reshape((1, (), 1, 1))?),
            None => Ok(y),
        };
    }
    if dt == c.weight().dtype() {
        return c.forward(x);
    }
    let b = c.bias().map(|b| cast(b, dt)).transpose()?;
    Conv2d::new(cast(c.weight(), dt)?, b, *c.config()).forward(x)
}

/// `l.forward(x)` in `x`'s dtype (weights cast when they differ).
pub fn linear(l: &Linear, x: &Tensor) -> candle_core::Result<Tensor> {
    let dt = x.dtype();
    if dt == l.weight().dtype() {
        return l.forward(x);
    }
    let b = l.bias().map(|b| cast(b, dt)).transpose()?;
    Linear::new(cast(l.weight(), dt)?, b).forward(x)
}

/// Images per UNet forward that fit in `free_bytes` of device memory, for a model whose
/// largest feature map holds `channels` × `pixels` values per image, with `skips` bytes of
/// skip connections per image and an attention matrix of `attn` values per image: half the free
/// memory divided by an estimate of the peak per image (the skips, sixteen working feature maps
/// and three attention-sized buffers), a power of two in [1, 4096].
pub fn fit_batch(
    free_bytes: u64,
    bytes_per_value: usize,
    feature_values: usize,
    skip_values: usize,
    attn_values: usize,
) -> usize {
    let per_image = (bytes_per_value * (skip_values + 16 * feature_values + 3 * attn_values)).max(1) as u64;
    let n = (free_bytes / 2 / per_image).clamp(1, 4096);
    1usize << (63 - n.leading_zeros())
}

/// Free and total memory of the CUDA device `device` (bytes), `None` on the CPU.
pub fn device_memory(device: &Device) -> Option<(u64, u64)> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        return d
            .cuda_stream()
            .context()
            .mem_get_info()
            .ok()
            .map(|(f, t)| (f as u64, t as u64));
    }
    let _ = device;
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_batch_is_a_power_of_two_within_bounds() {
        // 80 GB free, 4-byte values, a 128×32×32 feature map, 1M skip values, 65k attention.
        let b = fit_batch(80_000_000_000, 4, 128 * 1024, 1_000_000, 65_536);
        assert!(b.is_power_of_two() && (1..=4096).contains(&b), "{b}");
        // per image 4·(1e6 + 16·131072 + 3·65536) = 13.2 MB: 40 GB / 13.2 MB ≈ 3040 → 2048.
        assert_eq!(b, 2048);
        assert_eq!(fit_batch(1_000_000_000, 4, 128 * 1024, 1_000_000, 65_536), 32);
        assert_eq!(fit_batch(0, 4, 1, 1, 1), 1);
    }

    #[test]
    fn tf32_and_bf16_are_refused_on_the_cpu() {
        assert!(check_device(Precision::Fp32, &Device::Cpu).is_ok());
        for p in [Precision::Tf32, Precision::Bf16] {
            let e = check_device(p, &Device::Cpu).unwrap_err().to_string();
            assert!(e.contains("--precision") && e.contains("--device cuda"), "{e}");
        }
    }

    #[test]
    fn layers_at_fp32_on_the_cpu_are_candle_nn() {
        let dev = Device::Cpu;
        let w = Tensor::arange(0f32, 54.0, &dev).unwrap().reshape((2, 3, 3, 3)).unwrap();
        let b = Tensor::new(&[0.5f32, -1.0], &dev).unwrap();
        let c = Conv2d::new(
            w,
            Some(b),
            candle_nn::Conv2dConfig {
                padding: 1,
                ..Default::default()
            },
        );
        let x = Tensor::arange(0f32, 48.0, &dev).unwrap().reshape((1, 3, 4, 4)).unwrap();
        let a: Vec<f32> = conv2d(&c, &x, Precision::Fp32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let e: Vec<f32> = c.forward(&x).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(a, e);
        let l = Linear::new(Tensor::ones((2, 4), DType::F32, &dev).unwrap(), None);
        let xl = Tensor::ones((3, 4), DType::F32, &dev).unwrap();
        assert_eq!(
            linear(&l, &xl).unwrap().to_vec2::<f32>().unwrap(),
            vec![vec![4.0f32; 2]; 3]
        );
    }
}
