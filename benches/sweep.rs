//! Sweep speed: 10,000 grid points of the paper's EDM schedule (50 levels, 49 private steps):
//! 1,000 σ_min values × 10 subsampling rates, GDP + CLT columns (the default sweep).
//! Acceptance: < 2 s on 2 cores.
//!
//!   cargo bench --bench sweep

use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion};
use dpaudit::accountants::AccountantKind;
use dpaudit::diffusion::sweep::{self, SweepSpec};
use dpaudit::diffusion::SamplerConfig;

fn spec(points: usize) -> SweepSpec {
    SweepSpec {
        sigma_min: sweep::grid(0.002, 5.0, points, true).unwrap(),
        subsample_rate: vec![0.5, 0.1, 0.05, 0.01, 0.005, 0.001, 5e-4, 1e-4, 5e-5, 2e-5],
        accountants: vec![AccountantKind::Gdp, AccountantKind::Clt],
        ..Default::default()
    }
}

fn bench(c: &mut Criterion) {
    let cfg = SamplerConfig::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/samplers/edm-cifar10-subsampled.toml"
    ))
    .unwrap();
    let full = spec(1000);
    let t = Instant::now();
    let rows = sweep::run(&cfg, &full, &|| {}).unwrap();
    let secs = t.elapsed().as_secs_f64();
    let clt_ok = rows
        .iter()
        .filter(|r| {
            r.accountants
                .iter()
                .any(|l| l.accountant == AccountantKind::Clt && l.epsilon.is_some())
        })
        .count();
    eprintln!(
        "sweep: {} grid points × 49 steps (gdp + clt) in {secs:.3} s on {} threads; {clt_ok} points with a CLT number",
        rows.len(),
        rayon::current_num_threads()
    );
    let mut g = c.benchmark_group("sweep");
    g.sample_size(10);
    g.bench_function("edm_10000_points_gdp_clt", |b| {
        b.iter(|| sweep::run(&cfg, &full, &|| {}).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
