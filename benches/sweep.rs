//! Sweep speed: 10,000 grid points of the paper's EDM schedule (50 levels, 49 private steps):
//! 1,000 σ_min values × 10 subsampling rates, GDP + CLT columns (the default sweep).
//! Acceptance: < 2 s on 2 cores.
//!
//!   cargo bench --bench sweep
//!
//! Also: `gdp_10000_points` (GDP column only; anchor: numpy's vectorised arithmetic on the same grid,
//! scripts/compare_accounting.py sweep) and `pld_1000_points` (a sound PLD bound at every point of
//! a 1,000-point σ_min sweep at p = 0.5). Probe mode: `SWEEP_COMPARE=1` prints one JSON object
//! (GDP sweep median seconds) and exits; `SWEEP_PLD=1` times the PLD and RDP sweeps once each.

use std::time::Instant;

use criterion::Criterion;
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
                .any(|l| l.accountant == AccountantKind::Clt && l.epsilon().is_some())
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

fn cfg() -> SamplerConfig {
    SamplerConfig::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/samplers/edm-cifar10-subsampled.toml"
    ))
    .unwrap()
}

fn gdp_spec() -> SweepSpec {
    SweepSpec {
        accountants: vec![AccountantKind::Gdp],
        ..spec(1000)
    }
}

fn bound_spec(a: AccountantKind) -> SweepSpec {
    SweepSpec {
        sigma_min: sweep::grid(0.002, 5.0, 1000, true).unwrap(),
        accountants: vec![a],
        ..Default::default()
    }
}

fn probe() {
    let cfg = cfg();
    let s = gdp_spec();
    let mut times = Vec::new();
    let mut n = 0;
    for _ in 0..7 {
        let t = Instant::now();
        n = sweep::run(&cfg, &s, &|| {}).unwrap().len();
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    println!(
        "{}",
        serde_json::json!({"points": n, "sigma_points": 1000, "rates": 10, "seconds": times[3],
            "threads": rayon::current_num_threads()})
    );
}

fn bound_sweeps() {
    let cfg = cfg();
    for a in [AccountantKind::Pld, AccountantKind::Rdp] {
        let t = Instant::now();
        let rows = sweep::run(&cfg, &bound_spec(a), &|| {}).unwrap();
        let finite = rows
            .iter()
            .filter(|r| r.accountants.iter().any(|l| l.epsilon().is_some_and(f64::is_finite)))
            .count();
        println!(
            "{}",
            serde_json::json!({"accountant": a.as_str(), "points": rows.len(), "finite": finite,
                "seconds": t.elapsed().as_secs_f64(), "threads": rayon::current_num_threads()})
        );
    }
}

fn bench_more(c: &mut Criterion) {
    let cfg = cfg();
    let mut g = c.benchmark_group("sweep");
    g.sample_size(10);
    let s = gdp_spec();
    g.bench_function("gdp_10000_points", |b| b.iter(|| sweep::run(&cfg, &s, &|| {}).unwrap()));
    for a in [AccountantKind::Pld, AccountantKind::Rdp] {
        let s = bound_spec(a);
        g.bench_function(format!("{}_1000_points", a.as_str()), |b| {
            b.iter(|| sweep::run(&cfg, &s, &|| {}).unwrap())
        });
    }
    g.finish();
}

fn main() {
    if std::env::var_os("SWEEP_COMPARE").is_some() {
        probe();
        return;
    }
    if std::env::var_os("SWEEP_PLD").is_some() {
        bound_sweeps();
        return;
    }
    let mut c = Criterion::default().without_plots().configure_from_args();
    bench(&mut c);
    bench_more(&mut c);
    c.final_summary();
}
