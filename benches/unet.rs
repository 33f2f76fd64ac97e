//! The diffusers UNet forward on the CPU (`Unet2dModel::forward_host`, src/models/unet2d/cpu/forward.rs)
//! against candle's kernels on the same model (`forward_candle`), at the thread count rayon is
//! given (`RAYON_NUM_THREADS`):
//!
//! * `unet_forward_cifar32_b4`: the DDPM-CIFAR10 architecture (google/ddpm-cifar10-32's config:
//!   blocks 128-256-256-256, attention at 16 × 16, 35.7M parameters; 12.44 GFLOP per image by
//!   PyTorch's FlopCounterMode) with seeded random weights, batch 4;
//! * `unet_forward_mnist_b64`: models/mnist-ddpm (176,849 parameters, 0.118 GFLOP per image),
//!   batch 64.
//!
//! * `conv3x3_32ch_14x14_b10`: one of models/mnist-ddpm's 3 × 3 convolutions (32 → 32 channels,
//!   14 × 14, a task's 10 images) as the CPU forward runs it (`direct`: `kernels::conv3x3`) and as
//!   im2col + GEMM (`im2col_gemm`: the column matrix, then `kernels::sgemm`); on an AVX-512 CPU
//!   also the direct convolution's AVX2 tiles (`direct_avx2`); throughput in multiply-adds.
//!
//! Throughput is in images (multiply-adds for the convolution); quote the cpu/candle ratio and, against PyTorch, the ratios printed by
//! `scripts/compare_attacks_torch.py` (docs/attacks.md).
//!
//!   cargo bench --bench unet            (RAYON_NUM_THREADS=1 for the single-thread figures)

use std::collections::HashMap;
use std::hint::black_box;
use std::path::Path;

use candle_core::{Device, Tensor};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use dpaudit::models::diffusers::DiffusersCheckpoint;
use dpaudit::models::unet2d::{Unet2dConfig, Unet2dModel, WeightStore};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const CIFAR_CONFIG: &str = r#"{
  "_class_name": "UNet2DModel", "act_fn": "silu", "add_attention": true, "attention_head_dim": null,
  "attn_norm_num_groups": null, "block_out_channels": [128, 256, 256, 256], "center_input_sample": false,
  "class_embed_type": null, "down_block_types": ["DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"],
  "downsample_padding": 0, "downsample_type": "conv", "dropout": 0.0, "flip_sin_to_cos": false, "freq_shift": 1,
  "in_channels": 3, "layers_per_block": 2, "mid_block_scale_factor": 1, "mid_block_type": "UNetMidBlock2D",
  "norm_eps": 1e-06, "norm_num_groups": 32, "num_class_embeds": null, "num_train_timesteps": null,
  "out_channels": 3, "resnet_time_scale_shift": "default", "sample_size": 32, "time_embedding_dim": null,
  "time_embedding_type": "positional",
  "up_block_types": ["UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"], "upsample_type": "conv"
}"#;

/// The CIFAR architecture with seeded uniform weights (±1/√fan-in, biases 0.01). The tensor names
/// and shapes come from the model builder itself: each build attempt names the first missing
/// tensor and its shape, which is then added.
fn cifar_model() -> Unet2dModel {
    let path = Path::new("ddpm-cifar10-random/config.json");
    let config = Unet2dConfig::parse(CIFAR_CONFIG, path).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for _ in 0..2000 {
        let store = WeightStore::new(tensors.clone(), path);
        match Unet2dModel::new(&config, &store) {
            Ok(m) => return m,
            Err(e) => {
                let msg = e.to_string();
                let name = msg
                    .split('`')
                    .nth(1)
                    .expect("missing-tensor error names the tensor")
                    .to_string();
                let dims = msg
                    .split("shape [")
                    .nth(1)
                    .and_then(|s| s.split(']').next())
                    .expect("shape");
                let shape: Vec<usize> = dims.split(',').map(|d| d.trim().parse().unwrap()).collect();
                let n: usize = shape.iter().product();
                let fan_in: usize = shape.iter().skip(1).product::<usize>().max(1);
                let vals: Vec<f32> = if shape.len() == 1 && name.ends_with("weight") {
                    vec![1.0; n]
                } else if shape.len() == 1 {
                    vec![0.01; n]
                } else {
                    let a = 1.0 / (fan_in as f32).sqrt();
                    (0..n).map(|_| rng.random_range(-a..a)).collect()
                };
                tensors.insert(name, Tensor::from_vec(vals, shape, &Device::Cpu).unwrap());
            }
        }
    }
    panic!("the CIFAR architecture did not build");
}

fn bench(c: &mut Criterion) {
    let model = cifar_model();
    let b = 4;
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let x: Vec<f32> = (0..b * 3 * 32 * 32).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let t: Vec<f64> = (0..b).map(|i| (100 + 250 * i) as f64).collect();
    let xt = Tensor::from_slice(&x, (b, 3, 32, 32), &Device::Cpu).unwrap();
    let mut g = c.benchmark_group("unet_forward_cifar32_b4");
    g.sample_size(10);
    g.throughput(Throughput::Elements(b as u64));
    g.bench_function("cpu", |bch| {
        bch.iter(|| model.forward_host(black_box(&x), [b, 3, 32, 32], &t).unwrap())
    });
    g.bench_function("candle", |bch| {
        bch.iter(|| model.forward_candle(black_box(&xt), &t).unwrap())
    });
    g.finish();

    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let unet = DiffusersCheckpoint::load(&root.join("models/mnist-ddpm"), &Device::Cpu).unwrap();
    let b = 64;
    let x: Vec<f32> = (0..b * 28 * 28).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let t: Vec<f64> = (0..b).map(|i| (i * 15) as f64).collect();
    let xt = Tensor::from_slice(&x, (b, 1, 28, 28), &Device::Cpu).unwrap();
    let mut g = c.benchmark_group("unet_forward_mnist_b64");
    g.sample_size(10);
    g.throughput(Throughput::Elements(b as u64));
    g.bench_function("cpu", |bch| {
        bch.iter(|| unet.model.forward_host(black_box(&x), [b, 1, 28, 28], &t).unwrap())
    });
    g.bench_function("candle", |bch| {
        bch.iter(|| unet.model.forward_candle(black_box(&xt), &t).unwrap())
    });
    g.finish();

    conv3x3(c, &mut rng);
}

/// The direct 3 × 3 convolution against im2col + GEMM on the same data (channel-major
/// [c][image][y][x], as the CPU forward keeps its feature maps).
fn conv3x3(c: &mut Criterion, rng: &mut ChaCha8Rng) {
    use dpaudit::models::unet2d::cpu::kernels::{conv3x3, conv3x3_on, conv3x3_scratch, sgemm, Direct3x3, Isa, Mat};
    let (cin, cout, nb, h, w) = (32, 32, 10, 14, 14);
    let hw = h * w;
    let x: Vec<f32> = (0..cin * nb * hw).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let wt: Vec<f32> = (0..cout * cin * 9).map(|_| rng.random_range(-0.1f32..0.1)).collect();
    let d = Direct3x3::new(&wt, cout, cin);
    let mut pad = vec![0f32; conv3x3_scratch(cin, h, w)];
    let mut out = vec![0f32; cout * nb * hw];
    let mut col = vec![0f32; cin * 9 * nb * hw];
    let mut g = c.benchmark_group("conv3x3_32ch_14x14_b10");
    g.sample_size(20);
    g.throughput(Throughput::Elements((cout * cin * 9 * nb * hw) as u64));
    g.bench_function("direct", |bch| {
        bch.iter(|| conv3x3(&d, black_box(&x), nb, h, w, &mut out, &mut pad))
    });
    // The AVX2 + FMA tiles (what a CPU without AVX-512 runs), when this CPU has AVX-512.
    if Isa::best() == Isa::Avx512 {
        g.bench_function("direct_avx2", |bch| {
            bch.iter(|| conv3x3_on(Isa::Avx2, &d, black_box(&x), nb, h, w, &mut out, &mut pad))
        });
    }
    g.bench_function("im2col_gemm", |bch| {
        bch.iter(|| {
            let n = nb * hw;
            for ci in 0..cin {
                for tap in 0..9 {
                    let (dy, dx) = (tap / 3, tap % 3);
                    let row = &mut col[(ci * 9 + tap) * n..][..n];
                    for b in 0..nb {
                        let src = &x[(ci * nb + b) * hw..][..hw];
                        // Row by row: the in-range run copied, the padding columns zeroed.
                        for y in 0..h {
                            let dst = &mut row[b * hw + y * w..][..w];
                            let iy = y + dy;
                            if iy < 1 || iy > h {
                                dst.fill(0.0);
                                continue;
                            }
                            let s = &src[(iy - 1) * w..][..w];
                            match dx {
                                0 => {
                                    dst[0] = 0.0;
                                    dst[1..].copy_from_slice(&s[..w - 1]);
                                }
                                1 => dst.copy_from_slice(s),
                                _ => {
                                    dst[..w - 1].copy_from_slice(&s[1..]);
                                    dst[w - 1] = 0.0;
                                }
                            }
                        }
                    }
                }
            }
            sgemm(
                cout,
                n,
                cin * 9,
                &mut out,
                n,
                true,
                Mat::rows(&wt, cin * 9),
                Mat::rows(black_box(&col), n),
                1.0,
            );
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    // No plots: criterion's plotters backend needs system fonts (see ../shared/STACK.md).
    config = Criterion::default().without_plots();
    targets = bench
}
criterion_main!(benches);
