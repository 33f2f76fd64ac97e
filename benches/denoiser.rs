//! Empirical denoiser throughput (N = 50,000 records × d = 3,072, B = 64 queries, f32) against
//! the plain candle matmul of the same shape on this machine.
//!
//! One denoiser call does two matmuls of 2·B·d·N flops each (Q·Xᵀ and the weighted mean, run as
//! Xᵀ·Wᵀ) plus O(B·N) elementwise work; its GFLOP/s counts those 4·B·d·N flops. The baseline is
//! one Q·Xᵀ matmul (2·B·d·N flops). Target: denoiser GFLOP/s ≥ 60 % of the matmul's.
//!
//!   cargo bench --bench denoiser            (DPAUDIT_BENCH_N=5000 for a quick run)

use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use dpaudit::diffusion::denoiser::EmpiricalDenoiser;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn setup() -> (EmpiricalDenoiser, Tensor, Vec<f64>, usize, usize, usize) {
    let n: usize = std::env::var("DPAUDIT_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000);
    let (d, b) = (3072usize, 64usize);
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let vals: Vec<f32> = (0..n * d).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let x = Tensor::from_vec(vals, (n, d), &Device::Cpu).unwrap();
    let den = EmpiricalDenoiser::from_tensor(&x).unwrap();
    drop(x);
    let q: Vec<f64> = (0..b * d).map(|_| rng.random_range(-1.5..1.5)).collect();
    let qt = Tensor::from_vec(q.iter().map(|v| *v as f32).collect::<Vec<f32>>(), (b, d), &Device::Cpu).unwrap();
    (den, qt, q, n, d, b)
}

fn median_secs(mut f: impl FnMut(), reps: usize) -> f64 {
    f();
    let mut v: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v[reps / 2]
}

fn bench(c: &mut Criterion) {
    let (den, qt, q, n, d, b) = setup();
    let flops_mm = 2.0 * (b * d * n) as f64;
    let mm = || {
        let _ = qt.matmul(den.records_t()).unwrap().to_dtype(DType::F32).unwrap();
    };
    let dn = || {
        let _ = den.denoise(&q, 0.5, None, None).unwrap();
    };
    let dc = || {
        let _ = den.denoise(&q, 0.5, Some(-2000.0), None).unwrap();
    };
    let t_mm = median_secs(mm, 5);
    let t_dn = median_secs(dn, 5);
    let t_dc = median_secs(dc, 5);
    let g_mm = flops_mm / t_mm / 1e9;
    let g_dn = 2.0 * flops_mm / t_dn / 1e9;
    let g_dc = 2.0 * flops_mm / t_dc / 1e9;
    eprintln!(
        "N = {n}, d = {d}, B = {b}: matmul Q·Xᵀ {:.3} s = {g_mm:.1} GFLOP/s; denoiser {:.3} s = {g_dn:.1} GFLOP/s ({:.0} % of matmul); \
         clipped denoiser {:.3} s = {g_dc:.1} GFLOP/s ({:.0} %)",
        t_mm,
        t_dn,
        100.0 * g_dn / g_mm,
        t_dc,
        100.0 * g_dc / g_mm
    );
    let mut g = c.benchmark_group("empirical_denoiser");
    g.sample_size(10);
    g.throughput(Throughput::Elements(flops_mm as u64));
    g.bench_function("matmul_q_xt", |bch| bch.iter(mm));
    g.throughput(Throughput::Elements(2 * flops_mm as u64));
    g.bench_function("denoise_b64", |bch| bch.iter(dn));
    g.bench_function("denoise_b64_clipped", |bch| bch.iter(dc));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
