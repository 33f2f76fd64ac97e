//! RDP accountant speed: a 10⁶-step DP-SGD event (Poisson q = 0.001 ∘ Gaussian σ = 1) at δ = 1e-5,
//! the same case `scripts/compare_rdp.py` runs through dp_accounting 0.6.0.
//! Run: `cargo bench --bench rdp`.

use criterion::{criterion_group, criterion_main, Criterion};
use dpaudit::accountants::rdp::{dp_accounting_orders, rdp_curve, RdpAccountant};
use dpaudit::accountants::Accountant;
use dpaudit::events::{DpEvent, Neighbouring};
use std::hint::black_box;

fn bench(c: &mut Criterion) {
    let ev = DpEvent::dpsgd(1.0, 0.001, 1_000_000);
    let default = RdpAccountant::default();
    c.bench_function("rdp_epsilon_dpsgd_1e6_steps_default", |b| {
        b.iter(|| default.epsilon(black_box(&ev), Neighbouring::AddRemove, 1e-5).unwrap())
    });
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

criterion_group!(benches, bench);
criterion_main!(benches);
