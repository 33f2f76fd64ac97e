//! One DP-SGD step of `train --unet` on the MNIST UNet (the models/mnist-ddpm architecture,
//! 176,849 parameters) at the thread count rayon is given (`RAYON_NUM_THREADS`): the per-sample
//! gradients of a batch of 32 (x_t, t, ε), Opacus' clipping and
//! sum, Gaussian noise σC on the sum ÷ the expected batch, and the Adam step — what
//! `src/models/diffusers_train.rs` runs per chunk and step.
//!
//! * `dpsgd_step_mnist_b32`: the whole step as `train --unet` runs it on the CPU (the
//!   hand-written per-sample pass of `unet2d::grad_cpu`, clipping and sum included); throughput
//!   in per-sample gradients;
//! * `cpu_pass_clipped_sum_mnist_b32`: the hand-written pass alone (gradients, norms, clipped sum);
//! * `per_sample_grads_mnist_b32`: candle's batched backward pass alone (CUDA's path and the
//!   fallback for architectures the hand-written pass does not cover);
//! * `dpsgd_step_candle_mnist_b32`: the whole step on candle's batched pass.
//!
//! Quote the ratio against PyTorch printed by `scripts/bench_dpsgd_torch.py` (same CPU, same
//! threads; docs/models.md), not the absolute times.
//!
//!   RAYON_NUM_THREADS=1 cargo bench --bench dpsgd

use std::hint::black_box;

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use dpaudit::models::unet2d::grad_cpu::CpuGrad;
use dpaudit::models::unet2d::train::{clip_and_sum, TrainUnet};
use dpaudit::models::unet2d::Unet2dConfig;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const B: usize = 32;

fn batch(rng: &mut ChaCha8Rng) -> (Tensor, Vec<f64>, Tensor) {
    let n = B * 28 * 28;
    let x: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let e: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let t: Vec<f64> = (0..B).map(|_| rng.random_range(0..1000) as f64).collect();
    (
        Tensor::from_vec(x, (B, 1, 28, 28), &Device::Cpu).unwrap(),
        t,
        Tensor::from_vec(e, (B, 1, 28, 28), &Device::Cpu).unwrap(),
    )
}

fn bench(c: &mut Criterion) {
    let text = std::fs::read_to_string("models/mnist-ddpm/config.json").unwrap();
    let config = Unet2dConfig::parse(&text, std::path::Path::new("models/mnist-ddpm/config.json")).unwrap();
    let model = TrainUnet::random(&config, 0, &Device::Cpu).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let (x, t, e) = batch(&mut rng);
    let vars = model.vars();
    let names = model.names();
    let mut opt = AdamW::new(
        vars.clone(),
        ParamsAdamW {
            lr: 1e-3,
            weight_decay: 0.0,
            ..Default::default()
        },
    )
    .unwrap();
    let mut noise = ChaCha8Rng::seed_from_u64(2);
    let mut g = c.benchmark_group("dpsgd");
    g.sample_size(10);
    g.throughput(Throughput::Elements(B as u64));
    g.bench_function("per_sample_grads_mnist_b32", |bch| {
        bch.iter(|| black_box(model.per_sample_grads(&x, &t, &e).unwrap()))
    });
    let mut cpu = CpuGrad::new(&model, [1, 28, 28]).unwrap();
    let xh: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
    let eh: Vec<f32> = e.flatten_all().unwrap().to_vec1().unwrap();
    g.bench_function("cpu_pass_clipped_sum_mnist_b32", |bch| {
        bch.iter(|| black_box(cpu.clipped_sum(&xh, &t, &eh, Some(1.0), 1.0).unwrap()))
    });
    g.bench_function("dpsgd_step_mnist_b32", |bch| {
        bch.iter(|| {
            cpu.load(&model).unwrap();
            let r = cpu.clipped_sum(&xh, &t, &eh, Some(1.0), 1.0).unwrap();
            let sum = cpu.to_tensors(&r.sum, &Device::Cpu).unwrap();
            let mut released = dpaudit::models::dp::release(&sum, 1.0, B as f64, &mut noise).unwrap();
            let mut store = GradStore::default();
            for (name, v) in names.iter().zip(&vars) {
                store.insert(v.as_tensor(), released.remove(name).unwrap());
            }
            opt.step(&store).unwrap();
        })
    });
    g.bench_function("dpsgd_step_candle_mnist_b32", |bch| {
        bch.iter(|| {
            let grads = model.per_sample_grads(&x, &t, &e).unwrap();
            let (sum, _) = clip_and_sum(&grads, 1.0).unwrap();
            let mut released = dpaudit::models::dp::release(&sum, 1.0, B as f64, &mut noise).unwrap();
            let mut store = GradStore::default();
            for (name, v) in names.iter().zip(&vars) {
                store.insert(v.as_tensor(), released.remove(name).unwrap());
            }
            opt.step(&store).unwrap();
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    // No plots: criterion's plotters backend needs fonts the CI image does not have.
    config = Criterion::default().without_plots();
    targets = bench
}
criterion_main!(benches);
