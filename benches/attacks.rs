//! Attack benchmarks: exact ROC + AUC over 800 scores, one bootstrap interval (1000 resamples),
//! the empirical denoiser over the 400 digits members for 800 queries, and the loss and SecMI
//! scores of the shipped checkpoint (MLP, 312,896 parameters) on 800 rows.
//!
//! Run: `cargo bench --bench attacks`. The end-to-end timing is `dpaudit mia` (docs/attacks.md).

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::path::Path;

use dpaudit::attacks::empirical::EmpiricalDenoiser;
use dpaudit::attacks::metrics;
use dpaudit::attacks::mia::{self, AttackKind, ScoreOpts};
use dpaudit::models::{Checkpoint, Dataset, SplitManifest, PIXELS};

fn bench(c: &mut Criterion) {
    let pos: Vec<f64> = (0..400).map(|i| ((i as f64) * 0.37).sin() + 0.3).collect();
    let neg: Vec<f64> = (0..400).map(|i| ((i as f64) * 0.91).sin()).collect();
    c.bench_function("roc_auc_800", |b| {
        b.iter(|| metrics::auc(&metrics::roc(black_box(&pos), black_box(&neg)).unwrap()))
    });
    c.bench_function("bootstrap_auc_800x1000", |b| {
        b.iter(|| metrics::bootstrap(&pos, &neg, 1000, 0.95, 1, |p, n| Ok(metrics::auc(&metrics::roc(p, n)?))).unwrap())
    });

    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let data = Dataset::load(&root.join("fixtures/data/digits.csv.gz")).unwrap();
    let split = SplitManifest::load(&root.join("fixtures/splits/digits.toml")).unwrap();
    let members = data.rows(&split.members);
    let rows: Vec<f32> = members.iter().chain(&data.rows(&split.nonmembers)).copied().collect();
    let emp = EmpiricalDenoiser::new(&members);
    c.bench_function("empirical_denoiser_400x800", |b| {
        b.iter(|| {
            let mut s = 0.0;
            for q in rows.chunks_exact(PIXELS) {
                s += emp.x0(black_box(q), 0.5, None)[0];
            }
            s
        })
    });

    let ck = Checkpoint::load(&root.join("models/digits-mlp.toml"), &candle_core::Device::Cpu).unwrap();
    let o = ScoreOpts::default();
    let mut g = c.benchmark_group("scores_800");
    g.sample_size(10);
    g.bench_function("loss_t50_4draws", |b| {
        b.iter(|| mia::scores(AttackKind::Loss, &ck, &members, &rows, 50, &o).unwrap())
    });
    g.bench_function("secmi_t100_k10", |b| {
        b.iter(|| mia::scores(AttackKind::Secmi, &ck, &members, &rows, 100, &o).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
