//! PLD accountant speed. Anchor: dp_accounting 0.6.0 `PLDAccountant` (grid 1e-4, pessimistic
//! connect-the-dots, add/remove) on the same pipelines: `python3 scripts/compare_pld.py all`.
//!
//! Cases (must match scripts/compare_pld.py):
//! - `hetero_50x1e4`: 50 distinct Poisson-subsampled Gaussian steps (σ_j = 0.8 + 0.02 j,
//!   q_j = 0.001 + 0.00002 j), each composed 10⁴ times; ε at δ = 1e-5.
//! - `dpsgd_rapid`: σ = 1.0, q = 64/60000, 9375 steps (fixtures/reference/dpsgd.csv); ε at δ = 1e-5.
//!
//! Run: `cargo bench --bench pld` (the ε values are printed once before timing).

use criterion::{criterion_group, criterion_main, Criterion};
use dpaudit::accountants::pld::{PldAccountant, PldStep};
use std::hint::black_box;

fn hetero_steps() -> Vec<PldStep> {
    (0..50)
        .map(|j| PldStep {
            q: 0.001 + 0.00002 * j as f64,
            noise_multiplier: 0.8 + 0.02 * j as f64,
            count: 10_000,
        })
        .collect()
}

fn dpsgd_steps() -> Vec<PldStep> {
    vec![PldStep {
        q: 64.0 / 60000.0,
        noise_multiplier: 1.0,
        count: 9375,
    }]
}

fn bench(c: &mut Criterion) {
    let acc = PldAccountant::default();
    for (name, steps) in [("hetero_50x1e4", hetero_steps()), ("dpsgd_rapid", dpsgd_steps())] {
        let t0 = std::time::Instant::now();
        let pld = acc.compose_steps(&steps).unwrap();
        let eps = pld.epsilon(1e-5);
        eprintln!(
            "{name}: eps = {eps:.10} at delta = 1e-5 (one run {:.3} s, window {} points, fft {}, slack {:e})",
            t0.elapsed().as_secs_f64(),
            pld.directions.iter().map(|d| d.grid_points()).max().unwrap(),
            pld.directions.iter().map(|d| d.fft_len).max().unwrap(),
            pld.delta_floor()
        );
        let mut g = c.benchmark_group("pld");
        g.sample_size(10);
        g.bench_function(name, |b| {
            b.iter(|| black_box(acc.compose_steps(black_box(&steps)).unwrap().epsilon(1e-5)))
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
