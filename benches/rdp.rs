//! RDP accountant speed: a 10⁶-step DP-SGD event (Poisson q = 0.001 ∘ Gaussian σ = 1) at δ = 1e-5,
//! the case `scripts/compare_rdp.py` also runs through dp_accounting 0.6.0.
//! Run: `cargo bench --bench rdp`.
//!
//! Probe mode (used by scripts/compare_rdp.py): with `RDP_COMPARE_CASES='[[σ, q, steps, δ], …]'`
//! in the environment, prints one JSON object per case (ε by the default accountant, its order,
//! ε on dp_accounting's grid, and the median wall time of the default `epsilon` call) and exits.

use criterion::Criterion;
use dpaudit::accountants::rdp::{dp_accounting_orders, rdp_curve, RdpAccountant};
use dpaudit::accountants::Accountant;
use dpaudit::events::{DpEvent, Neighbouring};
use std::hint::black_box;
use std::time::Instant;

fn bench(c: &mut Criterion) {
    let ev = DpEvent::dpsgd(1.0, 0.001, 1_000_000);
    let default = RdpAccountant::default();
    c.bench_function("rdp_epsilon_dpsgd_1e6_steps_default", |b| {
        b.iter(|| default.epsilon(black_box(&ev), Neighbouring::AddRemove, 1e-5).unwrap())
    });
    // Best order fractional (8.07) and near 1 (2.02): the cases where skipping orders behind
    // lower bounds matters most.
    for (name, s, q, t) in [
        ("rdp_epsilon_dpsgd_sigma0.8_mnist_default", 0.8, 64.0 / 60000.0, 9375u64),
        ("rdp_epsilon_dpsgd_sigma1.1_1e6_steps_default", 1.1, 0.004, 1_000_000),
    ] {
        let ev = DpEvent::dpsgd(s, q, t);
        c.bench_function(name, |b| {
            b.iter(|| default.epsilon(black_box(&ev), Neighbouring::AddRemove, 1e-5).unwrap())
        });
    }
    let compat = RdpAccountant::dp_accounting_compatible();
    c.bench_function("rdp_epsilon_dpsgd_1e6_steps_dp_accounting_grid", |b| {
        b.iter(|| compat.epsilon(black_box(&ev), Neighbouring::AddRemove, 1e-5).unwrap())
    });
    let comps = ev.components().unwrap();
    let orders = dp_accounting_orders();
    c.bench_function("rdp_curve_dp_accounting_grid", |b| {
        b.iter(|| rdp_curve(black_box(&comps), Neighbouring::AddRemove, &orders).unwrap())
    });
    c.bench_function("rdp_delta_dpsgd_1e6_steps_default", |b| {
        b.iter(|| default.delta(black_box(&ev), Neighbouring::AddRemove, 6.5).unwrap())
    });
}

fn probe(cases: &str) {
    let cases: Vec<(f64, f64, u64, f64)> = serde_json::from_str(cases).expect("JSON list of [sigma, q, steps, delta]");
    let acc = RdpAccountant::default();
    let compat = RdpAccountant::dp_accounting_compatible();
    for (s, q, t, d) in cases {
        let ev = DpEvent::dpsgd(s, q, t);
        let r = acc.epsilon(&ev, Neighbouring::AddRemove, d).expect("rdp");
        let c = compat.epsilon(&ev, Neighbouring::AddRemove, d).expect("rdp");
        let mut times = Vec::new();
        for _ in 0..200 {
            let t0 = Instant::now();
            black_box(acc.epsilon(black_box(&ev), Neighbouring::AddRemove, d).unwrap());
            times.push(t0.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let o = serde_json::json!({
            "eps": r.epsilon, "order": r.details["rdp_order"], "eps_compat": c.epsilon,
            "order_compat": c.details["rdp_order"], "seconds": times[times.len() / 2],
        });
        println!("{o}");
    }
}

fn main() {
    if let Ok(cases) = std::env::var("RDP_COMPARE_CASES") {
        probe(&cases);
        return;
    }
    let mut c = Criterion::default().without_plots().configure_from_args();
    bench(&mut c);
    c.final_summary();
}
