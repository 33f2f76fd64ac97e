//! Every executor of the [`super::Graph`] against candle's inference forward, on every fixture
//! config (real diffusers weights) and every preset config (seeded random weights): the CPU
//! forward and the candle trainer's forward within 1e-5 relative L2; the per-sample gradients
//! of the hand-written CPU pass (where it covers the config) and of candle's batched pass
//! within 1e-4 relative of candle's one-backward-per-sample reference, parameter by parameter.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::grad_cpu::{coverage, CpuGrad};
use super::train::{per_sample_norms, PerSampleGrads, TrainUnet};
use super::{Graph, Unet2dConfig, Unet2dModel, WeightStore};

fn rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let d: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let n: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (d / n.max(1e-300)).sqrt()
}

fn host(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

/// A seeded batch of b images of `config` at side `side`, timesteps > 0, noise.
fn batch(config: &Unet2dConfig, b: usize, side: usize) -> (Vec<f32>, Vec<f64>, Vec<f32>) {
    let n = b * config.in_channels * side * side;
    let x: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin()).collect();
    let e: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.61 + 1.0).cos()).collect();
    let t: Vec<f64> = (0..b).map(|i| 3.0 + 211.0 * i as f64).collect();
    (x, t, e)
}

/// `got` equals `want` parameter by parameter within 1e-4 relative (a parameter whose gradient
/// is zero in exact arithmetic, within 1e-6 of the sample's norm).
fn grads_match(what: &str, got: &PerSampleGrads, want: &PerSampleGrads) {
    let norms = per_sample_norms(want).unwrap();
    let gn = per_sample_norms(got).unwrap();
    for (i, (a, b)) in gn.iter().zip(&norms).enumerate() {
        assert!((a - b).abs() <= 1e-4 * b, "{what} sample {i}: norm {a} vs {b}");
    }
    assert_eq!(got.len(), want.len(), "{what}");
    for ((n1, g1), (n2, g2)) in got.iter().zip(want) {
        assert_eq!(n1, n2, "{what}: parameter order");
        for (i, &sn) in norms.iter().enumerate() {
            let a = host(&g1.get(i).unwrap());
            let b = host(&g2.get(i).unwrap());
            let d: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| ((x - y) as f64).powi(2))
                .sum::<f64>()
                .sqrt();
            let nb: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum::<f64>().sqrt();
            assert!(
                d <= 1e-4 * nb + 1e-6 * sn,
                "{what}: {n1} sample {i}: error {d:e}, norm {nb:e}"
            );
        }
    }
}

/// Every executor on one config with the tensors `tensors`.
fn check(name: &str, config: &Unet2dConfig, tensors: HashMap<String, Tensor>, side: usize, grads: bool) {
    let g = Graph::new(config);
    assert!(g.skips_balance(), "{name}");
    let store = WeightStore::new(tensors.clone(), Path::new("w.safetensors"));
    let inf = Unet2dModel::new(config, &store).unwrap();
    let b = 2;
    let (x, t, e) = batch(config, b, side);
    let shape = (b, config.in_channels, side, side);
    let xt = Tensor::from_slice(&x, shape, &Device::Cpu).unwrap();
    let et = Tensor::from_slice(&e, shape, &Device::Cpu).unwrap();
    let reference = host(&inf.forward_candle(&xt, &t).unwrap());
    let cpu = inf.forward_host(&x, [b, config.in_channels, side, side], &t).unwrap();
    let r = rel(&cpu, &reference);
    assert!(r <= 1e-5, "{name}: CPU forward vs candle: {r:e}");
    let train = TrainUnet::from_tensors(config, tensors, Path::new("w.safetensors"), &Device::Cpu).unwrap();
    let tr = host(&train.forward(&xt, &t).unwrap());
    let r = rel(&tr, &reference);
    assert!(r <= 1e-5, "{name}: trainer forward vs candle: {r:e}");
    eprintln!("{name}: forwards equal");
    if !grads {
        return;
    }
    let loop_ref = train.per_sample_grads_loop(&xt, &t, &et).unwrap();
    let batched = train.per_sample_grads(&xt, &t, &et).unwrap();
    grads_match(&format!("{name}: batched candle"), &batched, &loop_ref);
    match coverage(&g) {
        Some(why) => eprintln!("{name}: CPU per-sample gradients do not cover {why}"),
        None => {
            let mut pass = CpuGrad::new(&train, [config.in_channels, side, side]).unwrap();
            let flat = pass.per_sample(&x, &t, &e).unwrap();
            let ours: PerSampleGrads = pass
                .layout()
                .iter()
                .map(|(n, off, dims)| {
                    let len: usize = dims.iter().product();
                    let rows: Vec<Tensor> = flat
                        .iter()
                        .map(|f| Tensor::from_slice(&f[*off..off + len], dims.as_slice(), &Device::Cpu).unwrap())
                        .collect();
                    (n.clone(), Tensor::stack(&rows, 0).unwrap())
                })
                .collect();
            grads_match(&format!("{name}: hand-written CPU"), &ours, &loop_ref);
        }
    }
    eprintln!("{name}: per-sample gradients equal");
}

#[test]
fn every_executor_equals_candle_on_every_fixture_config() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/diffusers");
    let mut seen = 0;
    for entry in std::fs::read_dir(&root).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.join("config.json").is_file() {
            continue;
        }
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
        let config = Unet2dConfig::parse(&text, &dir.join("config.json")).unwrap();
        let tensors: HashMap<String, Tensor> =
            candle_core::safetensors::load(dir.join(crate::models::diffusers::WEIGHTS), &Device::Cpu)
                .unwrap()
                .into_iter()
                .map(|(k, v)| (k, v.to_dtype(DType::F32).unwrap()))
                .collect();
        let side = config.sample_size.map_or(16, |(h, _)| h);
        check(&name, &config, tensors, side, true);
        seen += 1;
    }
    assert!(seen >= 4, "{seen} fixtures");
}

/// The presets with seeded weights; ddpm-cifar10's per-sample gradients (3.6 GB in candle's
/// batched pass) are in `grad_cpu`'s ignored test, its forwards here.
#[test]
fn every_executor_equals_candle_on_every_preset_config() {
    for (name, text, _) in crate::models::diffusers_train::PRESETS {
        let config = Unet2dConfig::parse(text, Path::new("config.json")).unwrap();
        let m = TrainUnet::random(&config, 7, &Device::Cpu).unwrap();
        let side = config.sample_size.map_or(16, |(h, _)| h);
        check(name, &config, m.tensors().unwrap(), side, *name != "ddpm-cifar10");
    }
}
