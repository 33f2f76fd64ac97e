//! diffusers checkpoints: `model eval` reproduces diffusers' own outputs (fixtures made by
//! scripts/make_diffusers_fixtures.py), `model info`, bad checkpoints, scheduler configs in the
//! sampler analysis, the MNIST data and split, and `mia` on the shipped MNIST DDPM.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use dpaudit::data::images::ImageSet;
use dpaudit::data::{npy, SplitManifest};

use super::common::{dpaudit, root, stderr, stdout};

const FIXTURES: &[&str] = &[
    "unet-28-c1-attn",
    "unet-32-c3-noattn",
    "unet-28-c1-fourier",
    "unet-32-c3-attn",
];

fn f32s(p: &Path) -> (Vec<usize>, Vec<f32>) {
    let a = npy::read(p).unwrap();
    (a.shape.clone(), a.to_f32().unwrap())
}

/// Every fixture's diffusers output is reproduced by `dpaudit model eval` within the issue's
/// tolerances: max abs error ≤ 1e-3 and relative L2 error ≤ 1e-4.
#[test]
fn model_eval_reproduces_every_diffusers_fixture() {
    let tmp = tempfile::tempdir().unwrap();
    for name in FIXTURES {
        let dir = root().join("fixtures/diffusers").join(name);
        let out = tmp.path().join(format!("{name}.npy"));
        let o = dpaudit(&[
            "model",
            "eval",
            "--checkpoint",
            dir.to_str().unwrap(),
            "--input",
            dir.join("input.npy").to_str().unwrap(),
            "--timesteps",
            dir.join("timesteps.npy").to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--batch",
            "2",
        ]);
        assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));
        let (shape, got) = f32s(&out);
        let (want_shape, want) = f32s(&dir.join("expected.npy"));
        assert_eq!(shape, want_shape, "{name}");
        let max_abs = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        let num: f64 = got.iter().zip(&want).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
        let den: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
        let rel_l2 = (num / den).sqrt();
        eprintln!("{name}: max abs {max_abs:e}, relative L2 {rel_l2:e}");
        assert!(max_abs <= 1e-3, "{name}: max abs error {max_abs}");
        assert!(rel_l2 <= 1e-4, "{name}: relative L2 error {rel_l2}");
    }
}

/// True in a `--features cudnn` build on a machine with a GPU; otherwise says why a test skips.
fn cudnn_gpu() -> bool {
    let gpu = cfg!(feature = "cudnn") && Device::new_cuda(0).is_ok();
    if !gpu {
        eprintln!("skipped: needs a build with --features cudnn and an NVIDIA GPU");
    }
    gpu
}

/// With `--features cudnn` and a GPU: `model eval --device cuda` through the CUDA UNet forward
/// (src/models/unet2d/cuda.rs) reproduces every diffusers fixture within the same tolerances,
/// and agrees with candle's kernels (`DPAUDIT_UNET_CUDA=candle`) and with its own GEMM attention
/// (`DPAUDIT_UNET_ATTENTION=gemm`, against the one-kernel attention) to 1e-4. Skipped otherwise.
#[test]
fn cuda_unet_forward_reproduces_diffusers_and_candle_kernels() {
    if !cudnn_gpu() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    for name in FIXTURES {
        let dir = root().join("fixtures/diffusers").join(name);
        let run = |path: &str| {
            let (path, attention) = path.split_once('+').unwrap_or((path, "fused"));
            let out = tmp.path().join(format!("{name}-{path}-{attention}.npy"));
            let o = std::process::Command::new(env!("CARGO_BIN_EXE_dpaudit"))
                .args(["model", "eval", "--checkpoint", dir.to_str().unwrap()])
                .args(["--input", dir.join("input.npy").to_str().unwrap()])
                .args(["--timesteps", dir.join("timesteps.npy").to_str().unwrap()])
                .args(["--out", out.to_str().unwrap(), "--batch", "2", "--device", "cuda"])
                .env("DPAUDIT_UNET_CUDA", path)
                .env("DPAUDIT_UNET_ATTENTION", attention)
                .current_dir(root())
                .output()
                .unwrap();
            assert_eq!(o.status.code(), Some(0), "{name} ({path}): {}", stderr(&o));
            f32s(&out).1
        };
        let (fused, candle) = (run("fused"), run("candle"));
        // Attention in one kernel (head dimension 8 here) against the GEMM path.
        let gemm_attention = run("fused+gemm");
        let (_, want) = f32s(&dir.join("expected.npy"));
        let max_abs = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        let rel_l2 = |a: &[f32], b: &[f32]| {
            let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
            (num / b.iter().map(|y| (*y as f64).powi(2)).sum::<f64>()).sqrt()
        };
        assert!(max_abs(&fused, &want) <= 1e-3, "{name}: {}", max_abs(&fused, &want));
        assert!(rel_l2(&fused, &want) <= 1e-4, "{name}: {}", rel_l2(&fused, &want));
        assert!(
            max_abs(&fused, &candle) <= 1e-4,
            "{name}: vs candle {}",
            max_abs(&fused, &candle)
        );
        assert!(
            max_abs(&fused, &gemm_attention) <= 1e-4,
            "{name}: vs GEMM attention {}",
            max_abs(&fused, &gemm_attention)
        );
    }
}

/// With `--features cudnn` and a GPU: every loss, SecMI and PIA score of `mia --device cuda` on
/// models/mnist-ddpm equals the CPU's within 2e-3 relative, record by record, both through the
/// CUDA forward with the attacks' kernels and through candle's kernels
/// (`DPAUDIT_UNET_CUDA=candle`), and replayed from CUDA graphs (`DPAUDIT_CUDA_GRAPH=1`: each
/// step's first batch captured, the others replayed). 40 records at `--batch-size 16` are three
/// forwards of 14, the last overlapping the one before (joined on the device). The loss
/// attack's noise is drawn on the host, so its scores compare too. Skipped otherwise.
#[test]
fn cuda_attack_scores_match_the_cpu_record_by_record() {
    if !cudnn_gpu() {
        return;
    }
    let run = |device: &str, path: &str| -> HashMap<(String, String, String), f64> {
        let (path, graph) = match path.split_once('+') {
            Some((p, "graph")) => (p, "1"),
            _ => (path, "0"),
        };
        let out = tempfile::tempdir().unwrap();
        let f = out.path().join("scores.csv");
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_dpaudit"))
            .args(super::common::MNIST_MIA)
            .args([
                "--attack",
                "loss,secmi,pia",
                "--timesteps",
                "50",
                "--max-examples",
                "20",
            ])
            .args(["--batch-size", "16", "--bootstrap", "10", "--quiet", "--device", device])
            .args(["--scores-out", f.to_str().unwrap()])
            .args(["--out", out.path().join("r").to_str().unwrap()])
            .env("DPAUDIT_UNET_CUDA", path)
            .env("DPAUDIT_CUDA_GRAPH", graph)
            .current_dir(root())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{device} ({path}): {}", stderr(&o));
        std::fs::read_to_string(&f)
            .unwrap()
            .lines()
            .skip(1)
            .map(|l| {
                let c: Vec<&str> = l.split(',').collect();
                let set = c.get(5).copied().unwrap_or("").to_string();
                ((c[2].to_string(), c[0].to_string(), set), c[4].parse::<f64>().unwrap())
            })
            .collect()
    };
    let cpu = run("cpu", "fused");
    assert_eq!(cpu.len(), 3 * 40);
    for path in ["fused", "candle", "fused+graph"] {
        let gpu = run("cuda", path);
        assert_eq!(gpu.len(), cpu.len(), "{path}");
        for (k, a) in &cpu {
            let b = gpu[k];
            assert!(
                (a - b).abs() <= 2e-3 * a.abs().max(b.abs()),
                "{path}: {k:?}: cpu {a} cuda {b}"
            );
        }
    }
}

/// PIA at t = 50 on the first 8 members and 8 non-members of the MNIST split at batch 4, with
/// `args` added and the environment changed by `env` (`None` removes a variable); returns
/// stderr and the report's results.
fn pia_on_16(args: &[&str], env: &[(&str, Option<&str>)]) -> (String, serde_json::Value) {
    let out = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_dpaudit"));
    cmd.args(super::common::MNIST_MIA)
        .args(["--attack", "pia", "--timesteps", "50", "--max-examples", "8"])
        .args(["--batch-size", "4", "--quiet", "--out", out.path().to_str().unwrap()])
        .args(args)
        .current_dir(root());
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let o = cmd.output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("mia.json")).unwrap()).unwrap();
    (stderr(&o), v["results"].clone())
}

/// Numbers equal within `tol` (absolute), everything else equal.
fn json_close(a: &serde_json::Value, b: &serde_json::Value, tol: f64) -> bool {
    use serde_json::Value as V;
    match (a, b) {
        (V::Number(x), V::Number(y)) => {
            (x.as_f64().unwrap_or(f64::NAN) - y.as_f64().unwrap_or(f64::NAN)).abs() <= tol || x == y
        }
        (V::Array(x), V::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_close(x, y, tol)),
        (V::Object(x), V::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| json_close(v, w, tol)))
        }
        _ => a == b,
    }
}

/// On a GPU (a `cudnn` build), cuDNN's algorithm choices, each an (algorithm, math type) pair,
/// are written to the record (`DPAUDIT_CUDNN_RECORD`) by the first run and taken from it by the
/// next, which then searches for none and gives the same results. By default fp32 measures its
/// algorithms (a record keeps them) and tf32 takes the heuristic's; `DPAUDIT_CUDNN_ALGO=heuristic`
/// forces the heuristic under keys of its own; with the record off nothing is written and fp32
/// takes the heuristic. Skipped elsewhere.
#[test]
fn cudnn_algorithm_record_is_written_once_and_reused() {
    if !cudnn_gpu() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("algorithms.tsv");
    let rec = record.to_str().unwrap();
    let run = |rec: &str, algo: Option<&str>, precision: &str| {
        pia_on_16(
            &["--device", "cuda", "--precision", precision],
            &[
                ("DPAUDIT_TIMING", Some("phases")),
                ("DPAUDIT_CUDNN_RECORD", Some(rec)),
                ("DPAUDIT_CUDNN_ALGO", algo),
            ],
        )
    };
    let lines = || -> Vec<String> {
        std::fs::read_to_string(&record)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    };
    // Every line is `v2 ⇥ key ⇥ algorithm ⇥ math type`, both numbers in cuDNN's enumerations.
    let well_formed = |l: &str| {
        let f: Vec<&str> = l.split('\t').collect();
        f.len() == 4
            && f[0] == "v2"
            && f[2].parse::<u32>().is_ok_and(|a| a < 8)
            && f[3].parse::<u32>().is_ok_and(|m| m < 4)
    };
    // fp32, default: measured, recorded; the next run takes the record.
    let (first, a) = run(rec, None, "fp32");
    assert!(first.contains("cuDNN plan: algorithm choice "), "{first}");
    let measured = lines();
    assert!(!measured.is_empty(), "{first}");
    for l in &measured {
        assert!(well_formed(l) && l.contains("|measured|"), "{l}");
        // fp32 runs with IEEE products only (CUDNN_FMA_MATH = 3).
        assert!(l.ends_with("\t3"), "{l}");
    }
    let (second, b) = run(rec, None, "fp32");
    assert!(second.contains("cuDNN plan: algorithm from the record "), "{second}");
    assert!(!second.contains("cuDNN plan: algorithm choice "), "{second}");
    assert_eq!(a, b);
    assert_eq!(lines(), measured, "nothing new to record the second time");
    // The heuristic, forced: keys of its own, then reused.
    let (h1, c) = run(rec, Some("heuristic"), "fp32");
    assert!(h1.contains("cuDNN plan: algorithm choice "), "{h1}");
    let after = lines();
    assert!(after.len() > measured.len() && after.starts_with(&measured));
    for l in &after[measured.len()..] {
        assert!(well_formed(l) && l.contains("|heuristic|") && l.ends_with("\t3"), "{l}");
    }
    assert!(json_close(&a, &c, 1e-4), "measured {a}\nheuristic {c}");
    let (h2, d) = run(rec, Some("heuristic"), "fp32");
    assert!(!h2.contains("cuDNN plan: algorithm choice "), "{h2}");
    assert_eq!(c, d);
    assert_eq!(lines(), after);
    // Off: fp32 takes the heuristic (nothing would keep a measurement), the same choice as
    // recorded, and nothing is written.
    let (off, e) = run("off", None, "fp32");
    assert!(off.contains("cuDNN plan: algorithm choice "), "{off}");
    assert_eq!(c, e);
    assert_eq!(lines(), after);
    // tf32, default: the heuristic, recorded under tf32's math type (CUDNN_DEFAULT_MATH = 0).
    // (The run's fp32 re-scoring of a sample may add fp32 lines of its own batch shape.)
    let (t, _) = run(rec, None, "tf32");
    assert!(t.contains("cuDNN plan: algorithm choice "), "{t}");
    let tf32 = lines();
    let new = &tf32[after.len()..];
    assert!(new.iter().any(|l| l.contains("|math0|")), "{new:?}");
    for l in new {
        assert!(well_formed(l), "{l}");
        assert!(!l.contains("|math0|") || l.contains("|heuristic|"), "{l}");
    }
    // A setting not understood is named on stderr and the run goes on with `auto`.
    let (w, f) = run(rec, Some("fastest"), "fp32");
    assert!(w.contains("DPAUDIT_CUDNN_ALGO=\"fastest\""), "{w}");
    assert_eq!(a, f);
}

/// `DPAUDIT_TIMING=1` says on stderr where a `mia` run's time goes (opening the device, loading
/// the checkpoint in its parts and the data, every UNet forward,
/// each attack's scoring, the metrics) and changes nothing in its results; `phases` leaves out
/// the forwards; without it no timing line appears.
#[test]
fn timing_lines_say_where_a_mia_run_spends_its_time() {
    let run = |timing: &str| pia_on_16(&[], &[("DPAUDIT_TIMING", Some(timing))]);
    // `--device auto` runs on the GPU when this build has CUDA and one is present (the runs are
    // quiet, so stderr does not name the device).
    let on_gpu = Device::new_cuda(0).is_ok();
    let (on, with) = run("1");
    let (off, without) = run("0");
    assert_eq!(with, without);
    assert!(!off.contains("timing:"), "{off}");
    for phase in [
        "open device",
        "load checkpoint: read weights",
        "load checkpoint: sha256 and host tensors",
        "load checkpoint: tensors to the device",
        "load checkpoint: model",
        "load checkpoint",
        "load data and split",
    ] {
        assert!(on.contains(&format!("timing: {phase}: ")), "{phase}: {on}");
    }
    assert!(on.contains("timing: pia at t = 50, 16 records: "), "{on}");
    assert!(on.contains("timing: metrics and report: "), "{on}");
    // On a GPU (a cudnn build where `auto` finds one), the cuDNN plans built for the batch's
    // shapes are first-use setup inside the attack's phase; the CPU has none.
    assert_eq!(
        on_gpu && cfg!(feature = "cudnn"),
        on.contains("timing: within: cuDNN plan "),
        "{on}"
    );
    // 16 records at batch 4, two forwards each batch (PIA); on a GPU each line also says how
    // long the host took to queue the forward (`batch 4 (queued in … s): … s`).
    let forwards = |s: &str| {
        s.matches("timing: UNet forward, batch 4: ").count()
            + s.matches("timing: UNet forward, batch 4 (queued in ").count()
    };
    let gpu = on_gpu && cfg!(feature = "cudnn");
    assert_eq!(forwards(&on), 8, "{on}");
    // `phases`: the same phase lines, no line (and no wait) per forward.
    let (phases, same) = run("phases");
    assert_eq!(same, without);
    assert!(phases.contains("timing: pia at t = 50, 16 records: "), "{phases}");
    assert!(phases.contains("timing: metrics and report: "), "{phases}");
    assert!(!phases.contains("UNet forward"), "{phases}");
    // `kernels` (GPU time per kind of kernel of the CUDA forward): nothing to add on the CPU,
    // same results.
    let (kernels, same) = run("kernels");
    assert_eq!(same, without);
    assert_eq!(forwards(&kernels), 8, "{kernels}");
    assert_eq!(kernels.contains("timing: GPU kernels: "), gpu, "{kernels}");
    // The loss attack's host part, its noise: one entry per draw (4 by default).
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_dpaudit"))
        .args(super::common::MNIST_MIA)
        .args([
            "--attack",
            "loss",
            "--timesteps",
            "50",
            "--max-examples",
            "4",
            "--quiet",
        ])
        .env("DPAUDIT_TIMING", "phases")
        .current_dir(root())
        .output()
        .unwrap();
    let loss = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{loss}");
    let want = if on_gpu {
        "loss: noise drawn and copied in 4 in "
    } else {
        "loss: noise drawn 4 in "
    };
    assert!(loss.contains("timing: within: ") && loss.contains(want), "{loss}");
}

/// `model info` states the architecture, the parameter count diffusers reports
/// (fixtures/diffusers/versions.json, from `sum(p.numel())`) and the weights' SHA-256.
#[test]
fn model_info_states_architecture_parameters_and_hashes() {
    let versions: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("fixtures/diffusers/versions.json")).unwrap())
            .unwrap();
    for name in FIXTURES {
        let dir = root().join("fixtures/diffusers").join(name);
        let o = dpaudit(&["model", "info", dir.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let s = stdout(&o);
        let n = versions["models"][name].as_u64().unwrap();
        assert!(s.contains(&format!("parameters: {n}\n")), "{name}: {s}");
        assert!(s.contains("architecture: UNet2DModel"), "{s}");
        let sha = dpaudit::data::digits::sha256_file(&dir.join("diffusion_pytorch_model.safetensors")).unwrap();
        assert!(s.contains(&sha), "{s}");
    }
}

fn copy_fixture(name: &str, to: &Path) -> PathBuf {
    let src = root().join("fixtures/diffusers").join(name);
    let dst = to.join(name);
    std::fs::create_dir_all(&dst).unwrap();
    for f in [
        "config.json",
        "diffusion_pytorch_model.safetensors",
        "scheduler_config.json",
    ] {
        std::fs::copy(src.join(f), dst.join(f)).unwrap();
    }
    dst
}

fn weights(dir: &Path) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(dir.join("diffusion_pytorch_model.safetensors"), &Device::Cpu).unwrap()
}

fn save(dir: &Path, w: &HashMap<String, Tensor>) {
    candle_core::safetensors::save(w, dir.join("diffusion_pytorch_model.safetensors")).unwrap();
}

fn info_fails(dir: &Path, file: &str, needle: &str) {
    let o = dpaudit(&["model", "info", dir.to_str().unwrap()]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains(file), "names the file {file}: {e}");
    assert!(e.contains(needle), "names {needle}: {e}");
    assert!(!e.contains("panicked"), "{e}");
}

/// Missing config keys, unknown block types, shape mismatches, wrong dtypes, NaN weights, and
/// missing or extra tensors all exit 2 naming the file and the key or tensor.
#[test]
fn bad_checkpoints_exit_2_naming_file_and_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let name = "unet-28-c1-attn";
    let cfg = |d: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(d.join("config.json")).unwrap()).unwrap()
    };
    let put = |d: &Path, v: &serde_json::Value| std::fs::write(d.join("config.json"), v.to_string()).unwrap();

    let d = copy_fixture(name, &tmp.path().join("missing-key"));
    let mut v = cfg(&d);
    v.as_object_mut().unwrap().remove("block_out_channels");
    put(&d, &v);
    info_fails(&d, "config.json", "block_out_channels");

    let d = copy_fixture(name, &tmp.path().join("unknown-block"));
    let mut v = cfg(&d);
    v["down_block_types"][1] = "CrossAttnDownBlock2D".into();
    put(&d, &v);
    info_fails(&d, "config.json", "down_block_types[1]");

    let tensor = "down_blocks.0.resnets.0.conv1.weight";
    let d = copy_fixture(name, &tmp.path().join("shape"));
    let mut w = weights(&d);
    let t = w[tensor].narrow(0, 0, 8).unwrap();
    w.insert(tensor.into(), t);
    save(&d, &w);
    info_fails(&d, "diffusion_pytorch_model.safetensors", tensor);

    let d = copy_fixture(name, &tmp.path().join("dtype"));
    let mut w = weights(&d);
    let t = w[tensor].to_dtype(DType::I64).unwrap();
    w.insert(tensor.into(), t);
    save(&d, &w);
    info_fails(&d, "diffusion_pytorch_model.safetensors", tensor);

    let d = copy_fixture(name, &tmp.path().join("nan"));
    let mut w = weights(&d);
    let t = (&w["mid_block.attentions.0.to_q.weight"] * f64::NAN).unwrap();
    w.insert("mid_block.attentions.0.to_q.weight".into(), t);
    save(&d, &w);
    info_fails(
        &d,
        "diffusion_pytorch_model.safetensors",
        "mid_block.attentions.0.to_q.weight",
    );

    let d = copy_fixture(name, &tmp.path().join("missing-tensor"));
    let mut w = weights(&d);
    w.remove("conv_out.bias");
    save(&d, &w);
    info_fails(&d, "diffusion_pytorch_model.safetensors", "conv_out.bias");

    let d = copy_fixture(name, &tmp.path().join("extra-tensor"));
    let mut w = weights(&d);
    let t = w["conv_out.bias"].clone();
    w.insert("conv_out.extra".into(), t);
    save(&d, &w);
    info_fails(&d, "diffusion_pytorch_model.safetensors", "conv_out.extra");
}

/// The per-step μ of a diffusers scheduler config (ᾱ in float32, as diffusers computes it) against
/// the native float64 schedule's: equal to float32's precision (≤ 1e-4 relative), not bit for bit.
fn assert_f32_close(native: &[f64], scheduler: &[f64]) {
    assert_eq!(native.len(), scheduler.len());
    for (i, (a, b)) in native.iter().zip(scheduler).enumerate() {
        let rel = (a - b).abs() / a.abs();
        assert!(
            rel <= 1e-4,
            "step {i}: native {a} / scheduler config {b} ({rel:e} relative)"
        );
    }
}

fn step_mus(config: &str) -> Vec<f64> {
    let o = dpaudit(&["analyze", config, "--accountant", "gdp", "--format", "json"]);
    assert_eq!(o.status.code(), Some(0), "{config}: {}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    // The report's `steps` table (schema v2): the `mu` column of every row.
    let t = v["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "steps")
        .expect("steps table");
    let col = t["columns"]
        .as_array()
        .unwrap()
        .iter()
        .position(|c| c == "mu" || c["name"] == "mu")
        .expect("mu column");
    t["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[col].as_f64().unwrap())
        .collect()
}

/// A sampler TOML naming a diffusers scheduler_config.json (DDPMScheduler, linear β, leading
/// spacing, 50 inference steps) is analysed to the per-step μ of the equivalent dpaudit
/// TOML (fixtures/samplers/ddpm-linear-ddim50.toml), to float32's precision: the scheduler path
/// computes ᾱ in float32 as diffusers does.
#[test]
fn scheduler_config_gives_the_same_per_step_mu_as_the_dpaudit_toml() {
    let ours = step_mus("fixtures/samplers/ddpm-linear-ddim50.toml");
    let theirs = step_mus("fixtures/samplers/diffusers-ddpm-ddim50.toml");
    assert!(ours.len() > 10);
    assert_f32_close(&ours, &theirs);
}

/// Leaving privacy settings out of a scheduler TOML prints each default as a warning, exactly as
/// for a native TOML; leaving out |D| is an error naming the field, and leaving out both
/// `sampler` and `convention` is an error naming `convention` (it used to default to convention A).
#[test]
fn scheduler_toml_defaults_are_warned_and_dataset_size_is_required() {
    let tmp = tempfile::tempdir().unwrap();
    let sched = root().join("fixtures/samplers/diffusers/scheduler_config.json");
    let p = tmp.path().join("s.toml");
    std::fs::write(
        &p,
        format!(
            "scheduler_config = {:?}\ninference_steps = 20\nsampler = \"ddim\"\nschema_version = 1\n[privacy]\ndataset_size = 1000\n",
            sched.to_str().unwrap()
        ),
    )
    .unwrap();
    let o = dpaudit(&["analyze", p.to_str().unwrap(), "--accountant", "gdp"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let e = stderr(&o);
    for w in ["privacy.clip_norm", "privacy.samples", "delta", "density.beta"] {
        assert!(e.contains(&format!("warning: {}: {w}", p.display())), "{w}: {e}");
    }
    std::fs::write(
        &p,
        format!(
            "scheduler_config = {:?}\nsampler = \"ddim\"\nschema_version = 1\n[privacy]\nclip_norm = 1.0\n",
            sched.to_str().unwrap()
        ),
    )
    .unwrap();
    let o = dpaudit(&["analyze", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("privacy.dataset_size"), "{}", stderr(&o));
    std::fs::write(
        &p,
        format!(
            "scheduler_config = {:?}\nschema_version = 1\n[privacy]\ndataset_size = 1000\n",
            sched.to_str().unwrap()
        ),
    )
    .unwrap();
    let o = dpaudit(&["analyze", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("convention"), "{}", stderr(&o));
}

/// The shipped MNIST digits load with the label counts their README states, and the shipped
/// split is consistent with them.
#[test]
fn mnist_fixture_loads_with_documented_counts_and_split() {
    let s = ImageSet::load(&root().join("fixtures/data/mnist/mnist-10k.u8.gz")).unwrap();
    assert_eq!(s.len(), 10_000);
    assert_eq!(s.shape, [1, 28, 28]);
    let mut counts = [0usize; 10];
    for &l in s.labels.as_ref().unwrap() {
        counts[l as usize] += 1;
    }
    // fixtures/data/mnist/README.md
    assert_eq!(counts, [1001, 1127, 991, 1032, 980, 863, 1014, 1070, 944, 978]);
    let all: Vec<usize> = (0..s.len()).collect();
    assert!(s.rows(&all).iter().all(|&v| (-1.0..=1.0).contains(&v)));
    let split_path = root().join("fixtures/splits/mnist.toml");
    let split = SplitManifest::load(&split_path).unwrap();
    s.check_split(&split, &split_path).unwrap();
    assert_eq!((split.members.len(), split.nonmembers.len()), (128, 128));
}

/// `dpaudit mia` on the shipped non-DP MNIST DDPM (models/mnist-ddpm, a diffusers folder trained
/// on the 128 members of fixtures/splits/mnist.toml by scripts/train_mnist_ddpm.py, 6462 steps):
/// SecMI's AUC interval lies above 0.5, on a reduced example set (64 members, 64 non-members) so
/// that it runs in CI time on 2 cores. The loss attack on the same examples, the strongest signal
/// of a model that memorised its 128 members, is near 1.
#[test]
fn mia_on_the_mnist_diffusers_checkpoint_finds_membership_with_secmi() {
    let out = tempfile::tempdir().unwrap();
    let o = super::common::mnist_mia(&[
        "--attack",
        "secmi",
        "--attack",
        "loss",
        "--timesteps",
        "50",
        "--max-examples",
        "64",
        "--bootstrap",
        "200",
        "--out",
        out.path().to_str().unwrap(),
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // The detailed record (mia.json) beside the report.
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("mia.json")).unwrap()).unwrap();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    let secmi = results.iter().find(|r| r["attack"] == "secmi").unwrap();
    assert_eq!(secmi["members"], 64);
    assert_eq!(secmi["nonmembers"], 64);
    let lo = secmi["auc_ci"]["lo"].as_f64().unwrap();
    assert!(
        lo > 0.5,
        "SecMI AUC interval {} does not lie above 0.5",
        secmi["auc_ci"]
    );
    let loss = results.iter().find(|r| r["attack"] == "loss").unwrap();
    let auc = loss["auc"].as_f64().unwrap();
    assert!(auc > 0.9, "loss-attack AUC {auc} on a memorising model");
}

/// `mia --scores-out` on a diffusers checkpoint writes every score (one row per record, attack
/// and step, ids the data rows), and `mia --scores` on that file reproduces the run's AUC.
#[test]
fn mia_scores_out_on_the_mnist_diffusers_checkpoint_round_trips() {
    let out = tempfile::tempdir().unwrap();
    let f = out.path().join("scores.csv");
    let (d1, d2) = (out.path().join("run"), out.path().join("again"));
    let common = ["--bootstrap", "50", "--quiet"];
    let mut a = vec![
        "--out",
        d1.to_str().unwrap(),
        "--attack",
        "pia,secmi",
        "--timesteps",
        "20",
        "--max-examples",
        "12",
        "--scores-out",
        f.to_str().unwrap(),
    ];
    a.extend_from_slice(&common);
    let o = super::common::mnist_mia(&a);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let detail = |d: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(d.join("mia.json")).unwrap()).unwrap()
    };
    let first = detail(&d1);
    let rows = std::fs::read_to_string(&f).unwrap();
    assert!(rows.starts_with("record_id,member,attack,t,score"), "{rows}");
    assert_eq!(rows.lines().count(), 1 + 2 * 24, "{rows}");
    let split = SplitManifest::load(&root().join("fixtures/splits/mnist.toml")).unwrap();
    // Ids are data rows: every member row is one of the split's members (a random 12 of them).
    let member_ids: Vec<usize> = rows
        .lines()
        .skip(1)
        .filter(|l| l.split(',').nth(1) == Some("1"))
        .map(|l| l.split(',').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(member_ids.len(), 2 * 12, "{rows}");
    assert!(member_ids.iter().all(|i| split.members.contains(i)), "{rows}");
    let mut b = vec!["mia", "--scores", f.to_str().unwrap(), "--out", d2.to_str().unwrap()];
    b.extend_from_slice(&common);
    let o = dpaudit(&b);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let second = detail(&d2);
    let aucs = |v: &serde_json::Value| -> Vec<(String, f64)> {
        v["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["attack"].as_str().unwrap().to_string(), r["auc"].as_f64().unwrap()))
            .collect()
    };
    assert_eq!(aucs(&first).len(), 2);
    assert_eq!(aucs(&first), aucs(&second));
}

/// A diffusers checkpoint needs --data and --split (there is no card to default them from).
#[test]
fn mia_on_a_diffusers_checkpoint_requires_data_and_split() {
    let o = dpaudit(&["mia", "--checkpoint", "models/mnist-ddpm", "--quiet"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--data"), "{}", stderr(&o));
}

/// A Stable-Diffusion DDIMScheduler config (scaled_linear β 0.00085..0.012, steps_offset = 1,
/// leading spacing) given directly to `analyze` with 50 inference steps is analysed (to float32 precision) to
/// the per-step μ of the same schedule written natively (fixtures/samplers/sd-ddim50.toml); its
/// trailing-spacing twin gives other steps. Every setting left out is warned under its flag;
/// a missing --dataset-size is exit 2 naming the flag, and the flags are refused with a TOML.
#[test]
fn stable_diffusion_scheduler_config_analyses_to_the_native_per_step_mu() {
    let sd = "fixtures/samplers/diffusers/sd-ddim-scheduler_config.json";
    let flags = [
        "--dataset-size",
        "50000",
        "--clip",
        "1",
        "--samples",
        "100",
        "--inference-steps",
        "50",
        "--delta",
        "1e-5",
    ];
    let mus = |config: &str, extra: &[&str]| -> (Vec<f64>, String) {
        let mut a = vec!["analyze", config, "--accountant", "gdp", "--format", "json"];
        a.extend_from_slice(extra);
        let o = dpaudit(&a);
        assert_eq!(o.status.code(), Some(0), "{config}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        let t = v["tables"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["id"] == "steps")
            .unwrap();
        let col = t["columns"]
            .as_array()
            .unwrap()
            .iter()
            .position(|c| c == "mu" || c["name"] == "mu")
            .unwrap();
        let mu = t["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r[col].as_f64().unwrap())
            .collect();
        (mu, stderr(&o))
    };
    let native = step_mus("fixtures/samplers/sd-ddim50.toml");
    let (direct, warn) = mus(sd, &flags);
    assert_eq!(native.len(), 49, "50 levels: 49 DDIM steps between them");
    assert_f32_close(&native, &direct);
    // Only the sampler (from _class_name) and the density are defaulted here, and warned.
    assert!(warn.contains("--sampler not set: using the default ddim"), "{warn}");
    assert!(!warn.contains("--clip not set"), "{warn}");
    let (trailing, _) = mus(
        "fixtures/samplers/diffusers/sd-ddim-trailing-scheduler_config.json",
        &flags,
    );
    assert_eq!(trailing.len(), 49);
    assert_ne!(trailing, native);
    // Detected by content too: the same file without the .json extension.
    let tmp = tempfile::tempdir().unwrap();
    let plain = tmp.path().join("scheduler_config");
    std::fs::copy(root().join(sd), &plain).unwrap();
    let (by_content, _) = mus(plain.to_str().unwrap(), &flags);
    assert_eq!(by_content, direct);
    // Every default warned under its flag (the trailing twin: with every one of the 1000 steps,
    // the leading config's steps_offset = 1 would index ᾱ out of range and is refused).
    let (_, warn) = mus(
        "fixtures/samplers/diffusers/sd-ddim-trailing-scheduler_config.json",
        &["--dataset-size", "50000"],
    );
    for f in [
        "--sampler",
        "--clip",
        "--samples",
        "--inference-steps",
        "--delta",
        "density.beta",
    ] {
        assert!(warn.contains(&format!("{f} not set")), "{f}: {warn}");
    }
    let o = dpaudit(&["analyze", sd]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--dataset-size"), "{}", stderr(&o));
    let o = dpaudit(&["analyze", "fixtures/samplers/sd-ddim50.toml", "--dataset-size", "10"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--dataset-size"), "{}", stderr(&o));
}

/// ᾱ_t of the linear, scaled_linear and squaredcos_cap_v2 schedules at every training step, and
/// the 50 DDIM timesteps of the Stable-Diffusion configs, equal diffusers'
/// (fixtures/reference/diffusers_alphas_cumprod.csv, scripts/gen_diffusers_schedules.py):
/// The f64 schedule (`SchedulerConfig::betas`, what the attacks use) agrees with diffusers' float32
/// ᾱ to f32 rounding at T = 1000 (≤ 1e-6 relative; ≤ 2e-5 for the cosine schedule's last steps,
/// where ᾱ ≈ 1e-9); the sampler schedule read from a scheduler config (`diffusers_float32`)
/// equals diffusers' ᾱ bit for bit at T = 1000 and T = 250.
#[test]
fn alphas_cumprod_and_sd_timesteps_equal_diffusers() {
    use dpaudit::diffusion::schedule::diffusers::SchedulerConfig;
    use dpaudit::diffusion::schedule::{alpha_bar_from_betas, ddim_timesteps};
    let text = std::fs::read_to_string(root().join("fixtures/reference/diffusers_alphas_cumprod.csv")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (mut n_ab, mut n_ts) = (0, 0);
    let mut ours: std::collections::HashMap<String, (Vec<f64>, Vec<f64>)> = Default::default();
    for line in text.lines().filter(|l| !l.starts_with('#')).skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        match f[0] {
            "alphas_cumprod" => {
                let (name, b0, b1, big_t) = (f[1], f[2], f[3], f[4]);
                let (ab, ab32) = ours.entry(format!("{name} {big_t}")).or_insert_with(|| {
                    let p = tmp.path().join(format!("{name}-{big_t}.json"));
                    std::fs::write(
                        &p,
                        format!(
                            r#"{{"_class_name": "DDIMScheduler", "beta_schedule": "{name}", "beta_start": {b0}, "beta_end": {b1}, "num_train_timesteps": {big_t}}}"#
                        ),
                    )
                    .unwrap();
                    let sc = SchedulerConfig::load(&p).unwrap();
                    let sampler = sc.to_sampler_schedule(None, &p).unwrap();
                    (alpha_bar_from_betas(&sc.betas()), sampler.alpha_bar().unwrap())
                });
                let t: usize = f[5].parse().unwrap();
                let theirs: f64 = f[6].parse().unwrap();
                // float32 as diffusers computes it: the same float32 value.
                assert_eq!(
                    ab32[t] as f32, theirs as f32,
                    "{name} T = {big_t} t = {t}: float32 ᾱ {} diffusers {theirs}",
                    ab32[t]
                );
                assert_eq!(ab32[t], ab32[t] as f32 as f64, "{name} t = {t}: not a float32 value");
                if big_t == "1000" {
                    let tol = if name == "squaredcos_cap_v2" { 2e-5 } else { 1e-6 };
                    let rel = (ab[t] / theirs - 1.0).abs();
                    assert!(
                        rel <= tol,
                        "{name} t = {t}: ours {} diffusers {theirs} (rel {rel:e})",
                        ab[t]
                    );
                }
                n_ab += 1;
            }
            "timesteps" => {
                let sc = SchedulerConfig::load(&root().join("fixtures/samplers/diffusers").join(f[1])).unwrap();
                let steps: usize = f[5].parse().unwrap();
                let mut ts =
                    ddim_timesteps(sc.num_train_timesteps, steps, sc.timestep_spacing, sc.steps_offset).unwrap();
                ts.reverse();
                let joined = ts.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(" ");
                assert_eq!(joined, f[6], "{}", f[1]);
                n_ts += 1;
            }
            other => panic!("{other}"),
        }
    }
    assert_eq!((n_ab, n_ts), (3750, 2));
}

/// `mia --table2 --cosine` on the shipped diffusers DDPM (seed 004's Table 2 and Figure 1 at
/// 28 × 28): the same one chain as for dpaudit's own checkpoints, with the empirical denoiser
/// over the attacked members. Four Table-2 rows (T, 3T/4, T/2, T/4), each with the theoretical ASR
/// of the empirical-denoiser sampler at every rate and the numerical ASR of SecMI, the loss and
/// the empirical attack; the cosine of the two denoising directions is near 1 at high noise
/// (every denoiser predicts the data mean there) and far from 1 near the data.
#[test]
fn table2_and_cosine_run_on_the_mnist_diffusers_checkpoint() {
    let out = tempfile::tempdir().unwrap();
    let o = super::common::mnist_mia(&[
        "--attack",
        "loss",
        "--timesteps",
        "50",
        "--max-examples",
        "8",
        "--secmi-k",
        "100",
        "--table2",
        "--cosine",
        "10,500",
        "--bootstrap",
        "50",
        "--out",
        out.path().to_str().unwrap(),
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("mia.json")).unwrap()).unwrap();
    let rows = v["table2"]["rows"].as_array().unwrap();
    let labels: Vec<&str> = rows.iter().map(|r| r["label"].as_str().unwrap()).collect();
    assert_eq!(labels, ["T", "3T/4", "T/2", "T/4"], "{}", v["table2"]);
    for r in rows {
        let th = r["theoretical_asr"].as_array().unwrap();
        assert_eq!(th.len(), 4, "{r}");
        for a in th {
            let a = a.as_f64().unwrap();
            assert!((0.5..=1.0).contains(&a), "{r}");
        }
        for k in ["asr_secmi", "asr_loss", "asr_empirical", "cosine"] {
            assert!(r[k].as_f64().unwrap().is_finite(), "{k}: {r}");
        }
    }
    // The sampler's per-step μ grows as sampling proceeds, so the theoretical ASR at p = 1 does.
    let p1: Vec<f64> = rows.iter().map(|r| r["theoretical_asr"][0].as_f64().unwrap()).collect();
    assert!(p1.windows(2).all(|w| w[0] <= w[1]), "{p1:?}");
    let cos = v["cosine"].as_array().unwrap();
    assert_eq!(cos.len(), 2, "{}", v["cosine"]);
    let (near, far) = (
        cos[0]["cosine_mean"].as_f64().unwrap(),
        cos[1]["cosine_mean"].as_f64().unwrap(),
    );
    assert!(far > 0.95 && near < far, "cosine at t = 10: {near}, at t = 500: {far}");
    assert!(
        v["table2"]["note"].as_str().unwrap().contains("|D| = 8"),
        "{}",
        v["table2"]["note"]
    );
}
