//! Attack benchmarks: exact ROC + AUC over 800 scores, one bootstrap interval (1000 resamples),
//! one attack's metrics on 10,000 scores (`mia::evaluate`, 200 resamples per interval),
//! the empirical denoiser over the 400 digits members for 800 queries, and the loss and SecMI
//! scores of the shipped checkpoint (MLP, 312,896 parameters) on 800 rows, and the diffusers
//! UNet forward of models/mnist-ddpm (batch 64, 28×28): the CPU forward against candle's kernels
//! (`unet_forward_mnist64/cpu` vs `/candle`; quote their ratio), plus SecMI (t = 100, k = 10)
//! and PIA on 32 + 32 MNIST images through it.
//!
//! Run: `cargo bench --bench attacks`. The end-to-end timing is `dpaudit mia` (docs/attacks.md).

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::path::Path;

use dpaudit::attacks::empirical::EmpiricalDenoiser;
use dpaudit::attacks::metrics;
use dpaudit::attacks::mia::{self, AttackKind, ScoreOpts};
use dpaudit::data::images::ImageSet;
use dpaudit::data::{Dataset, SplitManifest};
use dpaudit::models::diffusers::DiffusersCheckpoint;
use dpaudit::models::toy::{Checkpoint, PIXELS};

fn bench(c: &mut Criterion) {
    let pos: Vec<f64> = (0..400).map(|i| ((i as f64) * 0.37).sin() + 0.3).collect();
    let neg: Vec<f64> = (0..400).map(|i| ((i as f64) * 0.91).sin()).collect();
    c.bench_function("roc_auc_800", |b| {
        b.iter(|| metrics::auc(&metrics::roc(black_box(&pos), black_box(&neg)).unwrap()))
    });
    c.bench_function("bootstrap_auc_800x1000", |b| {
        b.iter(|| metrics::bootstrap(&pos, &neg, 1000, 0.95, 1, |p, n| Ok(metrics::auc(&metrics::roc(p, n)?))).unwrap())
    });
    // What one attack's metrics cost at the GPU comparison's size (10,000 MNIST records, 200
    // resamples): `mia::evaluate`, three bootstraps, and once more for the shuffled-label test.
    let pos10: Vec<f64> = (0..5000)
        .map(|i| ((i as f64) * 0.37).sin() + 0.01 * (i % 7) as f64)
        .collect();
    let neg10: Vec<f64> = (0..5000).map(|i| ((i as f64) * 0.91).sin()).collect();
    let mo = mia::MetricOpts {
        bootstrap: 200,
        level: 0.95,
        delta: 1e-5,
        seed: 0,
    };
    c.bench_function("evaluate_10000x200", |b| {
        b.iter(|| mia::evaluate(AttackKind::Pia, 100, black_box(&pos10), black_box(&neg10), &mo, &[]).unwrap())
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

    let dev = candle_core::Device::Cpu;
    let unet = DiffusersCheckpoint::load(&root.join("models/mnist-ddpm"), &dev).unwrap();
    let images = ImageSet::load(&root.join("fixtures/data/mnist/mnist-10k.u8.gz")).unwrap();
    let msplit = SplitManifest::load(&root.join("fixtures/splits/mnist.toml")).unwrap();
    let ix: Vec<usize> = msplit
        .members
        .iter()
        .take(32)
        .chain(msplit.nonmembers.iter().take(32))
        .copied()
        .collect();
    let x = images.rows(&ix);
    let t: Vec<f64> = (0..64).map(|i| (i * 15) as f64).collect();
    let shape = [64, 1, 28, 28];
    let xt = candle_core::Tensor::from_slice(&x, (64, 1, 28, 28), &dev).unwrap();
    let mut g = c.benchmark_group("unet_forward_mnist64");
    g.sample_size(10);
    g.bench_function("cpu", |b| {
        b.iter(|| unet.model.forward_host(black_box(&x), shape, &t).unwrap())
    });
    g.bench_function("candle", |b| {
        b.iter(|| unet.model.forward_candle(black_box(&xt), &t).unwrap())
    });
    g.finish();
    let den = unet.denoiser(images.shape, 64).unwrap();
    let mut g = c.benchmark_group("diffusers_scores_mnist64");
    g.sample_size(10);
    g.bench_function("secmi_t100_k10", |b| {
        b.iter(|| mia::scores(AttackKind::Secmi, &den, &[], &x, 100, &o).unwrap())
    });
    g.bench_function("pia_t100", |b| {
        b.iter(|| mia::scores(AttackKind::Pia, &den, &[], &x, 100, &o).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
