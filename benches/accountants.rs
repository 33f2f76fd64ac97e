//! Accountant benchmarks: GDP ε(δ), per-step CLT functionals, and the CLT summary of 50
//! heterogeneous subsampled steps (the diffusion sweep's inner loop).
//!
//! Run: `cargo bench --bench accountants`. Python anchors: `python3 scripts/bench_clt_python.py`.

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;

use dpaudit::accountants::{clt, gdp};

/// 50 steps with μ from an EDM-like schedule (1e-3 … 500) at rate p.
fn edm_like_steps(p: f64) -> Vec<(f64, f64, u64)> {
    (0..50)
        .map(|i| {
            let mu = 1e-3 * (5e5f64).powf(i as f64 / 49.0);
            (p, mu, 1)
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    c.bench_function("gdp_epsilon_for_delta_mu1", |b| {
        b.iter(|| gdp::epsilon_for_delta(black_box(1.0), black_box(1e-5)).unwrap())
    });
    c.bench_function("gdp_epsilon_for_delta_mu787", |b| {
        b.iter(|| gdp::epsilon_for_delta(black_box(787.6), black_box(1e-5)).unwrap())
    });
    for &(p, mu) in &[(0.01, 0.5), (0.01, 10.0), (1e-5, 3.0), (0.5, 400.0)] {
        c.bench_function(&format!("clt_step_functionals_p{p}_mu{mu}"), |b| {
            b.iter(|| clt::step_functionals(black_box(p), black_box(mu)))
        });
    }
    let steps = edm_like_steps(0.01);
    c.bench_function("clt_summary_50_heterogeneous_steps", |b| {
        b.iter(|| clt::clt_summary(black_box(&steps)).unwrap())
    });
    c.bench_function("clt_summary_50_steps_plus_epsilon", |b| {
        b.iter(|| {
            let s = clt::clt_summary(black_box(&steps)).unwrap();
            s.epsilon(1e-5).unwrap()
        })
    });
}

/// The diffusion sweep's load: 10,000 grid points × 50 steps, CLT summary + GDP ε(δ) each, on
/// the rayon pool (2 cores on CI machines). Requirement: < 2 s.
fn sweep_load(c: &mut Criterion) {
    use rayon::prelude::*;
    let mut g = c.benchmark_group("sweep_load");
    g.sample_size(10);
    let grid: Vec<f64> = (0..10_000).map(|i| 1e-3 * (1e3f64).powf(i as f64 / 9_999.0)).collect();
    g.bench_function("clt_summary_plus_eps_10000x50", |b| {
        b.iter(|| {
            grid.par_iter()
                .map(|&scale| {
                    let steps: Vec<(f64, f64, u64)> = edm_like_steps(0.01)
                        .into_iter()
                        .map(|(p, mu, n)| (p, (mu * scale).min(800.0), n))
                        .collect();
                    let s = clt::clt_summary(&steps).unwrap();
                    let full = gdp::epsilon_for_delta(s.mu, 1e-5).unwrap();
                    s.mu + full
                })
                .sum::<f64>()
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    // No plots: criterion's plotters backend needs system fonts (see ../shared/STACK.md).
    config = Criterion::default().without_plots();
    targets = bench, sweep_load
}
criterion_main!(benches);
