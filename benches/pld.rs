//! PLD accountant speed. Anchors: dp_accounting 0.6.0 `PLDAccountant` (pessimistic
//! connect-the-dots, add/remove) and prv_accountant 0.2.0 on the same pipelines:
//! `python3 scripts/compare_accounting.py` prints the ratio table (outside CI).
//!
//! Cases (must match scripts/compare_accounting.py):
//! - `hetero_50x1e4`: 50 distinct Poisson-subsampled Gaussian steps (σ_j = 0.8 + 0.02 j,
//!   q_j = 0.001 + 0.00002 j), each composed 10⁴ times; ε at δ = 1e-5.
//! - `hetero_1000x1e3`: 1,000 distinct steps (σ_j = 0.8 + 0.001 j, q_j = 0.001 + 0.000001 j),
//!   each composed 10³ times; ε at δ = 1e-5.
//! - `dpsgd_rapid`: σ = 1.0, q = 64/60000, 9375 steps (fixtures/reference/dpsgd.csv); ε at δ = 1e-5.
//! - `long_1e6`, `long_1e7`, `long_1e8`: σ = 1.1, q = 0.004, 10⁶ / 10⁷ / 10⁸ steps (long horizons,
//!   fixtures/reference/pld_long_horizon.csv); ε at δ = 1e-5. Run only these with
//!   `cargo bench --bench pld -- long`.
//!
//! Run: `cargo bench --bench pld` (the ε values are printed once before timing).
//! Probe mode (used by the compare script): with `PLD_COMPARE=1` in the environment, prints one
//! JSON object per case (ε, median wall seconds of `compose_steps` + `epsilon` over a few runs)
//! and exits.

use criterion::Criterion;
use dpaudit::accountants::pld::{PldAccountant, PldStep};
use std::hint::black_box;
use std::time::Instant;

/// The heterogeneous case with `n` distinct steps (see the module doc).
pub fn hetero_steps(n: usize) -> Vec<PldStep> {
    let (ds, dq, count) = if n == 50 {
        (0.02, 0.00002, 10_000)
    } else {
        (0.001, 0.000001, 1_000)
    };
    (0..n)
        .map(|j| PldStep {
            q: 0.001 + dq * j as f64,
            noise_multiplier: 0.8 + ds * j as f64,
            count,
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

/// DP-SGD over a long horizon: σ = 1.1, q = 0.004, `count` steps.
fn long_steps(count: u64) -> Vec<PldStep> {
    vec![PldStep {
        q: 0.004,
        noise_multiplier: 1.1,
        count,
    }]
}

fn cases() -> Vec<(&'static str, Vec<PldStep>)> {
    vec![
        ("hetero_50x1e4", hetero_steps(50)),
        ("hetero_1000x1e3", hetero_steps(1000)),
        ("dpsgd_rapid", dpsgd_steps()),
        ("long_1e6", long_steps(1_000_000)),
        ("long_1e7", long_steps(10_000_000)),
        ("long_1e8", long_steps(100_000_000)),
    ]
}

fn bench(c: &mut Criterion) {
    let acc = PldAccountant::default();
    // The ε line of a case is printed only when criterion's filter (first free argument) selects it.
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-') && a != "pld");
    for (name, steps) in cases() {
        if filter
            .as_deref()
            .is_some_and(|f| !name.contains(f) && !format!("pld/{name}").contains(f))
        {
            continue;
        }
        let t0 = Instant::now();
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

fn probe() {
    let acc = PldAccountant::default();
    for (name, steps) in cases() {
        let mut times = Vec::new();
        let mut eps = f64::NAN;
        for _ in 0..3 {
            let t0 = Instant::now();
            eps = black_box(acc.compose_steps(black_box(&steps)).unwrap().epsilon(1e-5));
            times.push(t0.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let o = serde_json::json!({"case": name, "eps": eps, "seconds": times[1],
            "threads": rayon::current_num_threads()});
        println!("{o}");
    }
}

fn main() {
    if std::env::var_os("PLD_COMPARE").is_some() {
        probe();
        return;
    }
    let mut c = Criterion::default().without_plots().configure_from_args();
    bench(&mut c);
    c.final_summary();
}
