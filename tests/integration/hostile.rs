//! Hostile inputs, through the real binary where a user would meet them: sizes from files and
//! flags refused before allocation (under `ulimit -v`, so an allocation attempt would abort),
//! super-linear work removed (a 100,000-part event, an unbounded release loop), non-finite
//! values and wrong dtypes refused, closed pipes ending quietly, and δ that underflows reported
//! as a bound. Regression tests for what the fuzzer (fuzz.rs) finds go here too.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::common::{root, stderr, stdout};

/// Virtual memory the child may use (KiB): 3 GiB. Enough to start (candle maps its
/// libraries), far less than any of the sizes below would allocate.
const ULIMIT_KB: u64 = 3 * 1024 * 1024;

/// Runs dpaudit under `ulimit -v` (Linux `sh`), from the repository root, with a time limit;
/// extra environment variables in `env`.
fn limited(args: &[&str], env: &[(&str, &str)], limit: Duration) -> (Output, Duration) {
    limited_to(ULIMIT_KB, args, env, limit)
}

/// [`limited`] under a virtual-memory limit of `kb` KiB.
fn limited_to(kb: u64, args: &[&str], env: &[(&str, &str)], limit: Duration) -> (Output, Duration) {
    let exe = env!("CARGO_BIN_EXE_dpaudit");
    let mut script = format!("ulimit -v {kb}; exec '{exe}'");
    for a in args {
        script.push_str(&format!(" '{}'", a.replace('\'', "'\\''")));
    }
    let start = Instant::now();
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(&script).current_dir(root());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sh");
    let pid = child.id();
    // Watchdog: a hang fails the test instead of hanging the suite.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        if rx.recv_timeout(limit).is_err() {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
        }
    });
    let out = child.wait_with_output().expect("wait");
    let _ = tx.send(());
    (out, start.elapsed())
}

/// Asserts exit code 2 with an error naming `field` (and the word "limit"), quickly.
fn assert_refused(out: &Output, took: Duration, field: &str) {
    let err = stderr(out);
    assert_eq!(
        out.status.code(),
        Some(2),
        "expected exit 2 (refusal), got {:?} after {took:?}\nstderr: {err}",
        out.status
    );
    assert!(err.contains(field), "error does not name `{field}`: {err}");
    assert!(err.contains("limit"), "error does not state the limit: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(took < Duration::from_secs(20), "refusal took {took:?}");
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn edm(levels: &str) -> String {
    format!(
        "schema_version = 1\nconvention = \"C\"\n[schedule]\nkind = \"edm\"\nsigma_min = 0.002\nsigma_max = 80.0\n\
         rho = 7.0\nlevels = {levels}\n[privacy]\nclip_norm = 1.0\ndataset_size = 50000\n[density]\n\
         kind = \"constant\"\nbeta = 1.0\n"
    )
}

const SECS_60: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Sizes from files and flags: refused before allocation.

#[test]
fn schedule_levels_near_i64_max_is_refused_not_a_capacity_overflow_panic() {
    let d = tempfile::tempdir().unwrap();
    let p = write(d.path(), "s.toml", &edm("9223372036854775807"));
    let (out, took) = limited(&["analyze", p.to_str().unwrap()], &[], SECS_60);
    assert_refused(&out, took, "schedule.levels");
}

#[test]
fn schedule_levels_1e12_and_ddpm_timesteps_1e12_are_refused_under_ulimit() {
    let d = tempfile::tempdir().unwrap();
    let p = write(d.path(), "s.toml", &edm("1000000000000"));
    let (out, took) = limited(&["analyze", p.to_str().unwrap()], &[], SECS_60);
    assert_refused(&out, took, "schedule.levels");
    assert!(stderr(&out).contains("1000000000000"), "{}", stderr(&out));
    let ddpm = "schema_version = 1\nconvention = \"C\"\n[schedule]\nkind = \"ddpm_linear\"\nbeta_start = 0.0001\n\
                beta_end = 0.02\ntimesteps = 1000000000000\nlevels = 50\n[privacy]\ndataset_size = 50000\n\
                [density]\nkind = \"constant\"\nbeta = 1.0\n";
    let p = write(d.path(), "d.toml", ddpm);
    let (out, took) = limited(&["analyze", p.to_str().unwrap()], &[], SECS_60);
    assert_refused(&out, took, "schedule.timesteps");
}

#[test]
fn density_trajectories_1e9_is_refused_before_the_denoiser_allocates() {
    let d = tempfile::tempdir().unwrap();
    let data = root().join("fixtures/data/digits.csv.gz");
    let cfg = format!(
        "schema_version = 1\nconvention = \"C\"\n[schedule]\nkind = \"edm\"\nsigma_min = 0.002\nsigma_max = 80.0\n\
         rho = 7.0\nlevels = 10\n[privacy]\nclip_norm = 1.0\n[density]\nkind = \"trajectories\"\n\
         data = \"{}\"\ncolumns = 64\nvalue_range = [0.0, 16.0]\ntrajectories = 1000000000\n",
        data.display()
    );
    let p = write(d.path(), "t.toml", &cfg);
    let (out, took) = limited(&["analyze", p.to_str().unwrap()], &[], SECS_60);
    assert_refused(&out, took, "density.trajectories");
}

#[test]
fn gzip_that_inflates_past_the_cap_is_refused_naming_the_file() {
    let d = tempfile::tempdir().unwrap();
    // 200 MB of "0," compresses to a few hundred KB; with a 64 MiB memory cap the decompressed
    // text may be at most ~21 MiB.
    let gz = d.path().join("bomb.csv.gz");
    let mut enc = flate2::write::GzEncoder::new(std::fs::File::create(&gz).unwrap(), flate2::Compression::fast());
    let chunk = "0,".repeat(1 << 20);
    for _ in 0..100 {
        enc.write_all(chunk.as_bytes()).unwrap();
    }
    enc.finish().unwrap();
    assert!(std::fs::metadata(&gz).unwrap().len() < 3 << 20);
    let cfg = format!(
        "schema_version = 1\nconvention = \"C\"\n[schedule]\nkind = \"edm\"\nsigma_min = 0.002\nsigma_max = 80.0\n\
         rho = 7.0\nlevels = 10\n[privacy]\nclip_norm = 1.0\n[density]\nkind = \"trajectories\"\n\
         data = \"{}\"\n",
        gz.display()
    );
    let p = write(d.path(), "t.toml", &cfg);
    let (out, took) = limited(
        &["analyze", p.to_str().unwrap()],
        &[("DPAUDIT_MAX_MEMORY", "64M")],
        SECS_60,
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("bomb.csv.gz") && err.contains("decompressed"), "{err}");
    assert!(took < Duration::from_secs(20), "{took:?}");
}

/// A gzip bomb of MNIST records (800 MB of zeros in under a megabyte) is counted as it
/// inflates and refused at the image-set limit the memory cap allows, having held no more
/// than that: under a 256 MiB cap it runs in a 700 MiB address space. Before, it was
/// inflated up to 785 MB whatever the cap (an allocation abort under that limit, 1.37 GB peak
/// in the campaign) and then refused as "not a whole number of records".
#[test]
fn an_mnist_gzip_bomb_is_refused_at_the_limit_before_it_is_inflated() {
    let d = tempfile::tempdir().unwrap();
    let gz = d.path().join("bomb.u8.gz");
    let mut enc = flate2::write::GzEncoder::new(std::fs::File::create(&gz).unwrap(), flate2::Compression::fast());
    let chunk = vec![0u8; 1 << 20];
    for _ in 0..800 {
        enc.write_all(&chunk).unwrap();
    }
    enc.finish().unwrap();
    let gz_s = gz.to_str().unwrap();
    let args = [
        "mia",
        "--checkpoint",
        "models/mnist-ddpm",
        "--data",
        gz_s,
        "--split",
        "fixtures/splits/mnist.toml",
        "--quiet",
    ];
    let (out, took) = limited_to(700 * 1024, &args, &[("DPAUDIT_MAX_MEMORY", "256M")], SECS_60);
    assert_refused(&out, took, "images (pixel values)");
    let err = stderr(&out);
    assert!(err.contains("bomb.u8.gz") && err.contains("decompressed"), "{err}");
    // 256 MiB / 9 B per value / 784 values = 38,043 images.
    assert!(err.contains("above the limit of 38043"), "{err}");
    // At the default cap (4 GiB: 477,218,588 values, 608,697 images) the bomb is refused in a
    // 1 GiB address space.
    let (out, took) = limited_to(1024 * 1024, &args, &[], SECS_60);
    assert_refused(&out, took, "images (pixel values)");
    assert!(stderr(&out).contains("above the limit of 608697"), "{}", stderr(&out));
}

/// A sparse file of `len` bytes (no disk used): a size a user's file system can claim.
fn sparse(path: &Path, len: u64) -> PathBuf {
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
    path.to_path_buf()
}

#[test]
fn sparse_terabyte_weights_and_data_files_are_refused_before_they_are_read() {
    let d = tempfile::tempdir().unwrap();
    // A diffusers folder whose weights file claims 1 TB: refused by its size (before, the read
    // buffer's allocation aborted the process).
    let fx = root().join("fixtures/diffusers/unet-28-c1-attn");
    let ckpt = d.path().join("ckpt");
    std::fs::create_dir(&ckpt).unwrap();
    for f in ["config.json", "scheduler_config.json"] {
        std::fs::copy(fx.join(f), ckpt.join(f)).unwrap();
    }
    let weights = sparse(&ckpt.join("diffusion_pytorch_model.safetensors"), 1 << 40);
    let out_npy = d.path().join("o.npy");
    let (out, took) = limited(
        &[
            "model",
            "eval",
            "--checkpoint",
            ckpt.to_str().unwrap(),
            "--input",
            fx.join("input.npy").to_str().unwrap(),
            "--timesteps",
            fx.join("timesteps.npy").to_str().unwrap(),
            "--out",
            out_npy.to_str().unwrap(),
        ],
        &[],
        SECS_60,
    );
    assert_refused(&out, took, "weights file size");
    assert!(stderr(&out).contains(weights.to_str().unwrap()), "{}", stderr(&out));
    assert!(!out_npy.exists());
    // Image data that claims 1 TB, for an attack on a real checkpoint: refused by its size.
    let data = sparse(&d.path().join("images.npy"), 1 << 40);
    let (out, took) = limited(
        &[
            "mia",
            "--checkpoint",
            "models/mnist-ddpm",
            "--data",
            data.to_str().unwrap(),
            "--split",
            "fixtures/splits/mnist.toml",
            "--attack",
            "loss",
            "--timesteps",
            "10",
        ],
        &[],
        SECS_60,
    );
    assert_refused(&out, took, "file size");
    assert!(stderr(&out).contains(data.to_str().unwrap()), "{}", stderr(&out));
}

/// A copy of the shipped card in `dir` whose model section is replaced, pointing at `weights`.
fn card_with(dir: &Path, weights: &Path, sha: &str, edit: impl Fn(String) -> String) -> PathBuf {
    let src = std::fs::read_to_string(root().join("models/digits-mlp.toml")).unwrap();
    let mut out = String::new();
    for line in src.lines() {
        let l = if line.starts_with("weights = ") {
            format!("weights = \"{}\"", weights.display())
        } else if line.starts_with("weights_sha256 = ") {
            format!("weights_sha256 = \"{sha}\"")
        } else if line.starts_with("file = ") {
            format!("file = \"{}\"", root().join("fixtures/data/digits.csv.gz").display())
        } else if line.starts_with("split = ") {
            format!("split = \"{}\"", root().join("fixtures/splits/digits.toml").display())
        } else {
            line.to_string()
        };
        out.push_str(&l);
        out.push('\n');
    }
    let p = dir.join("card.toml");
    std::fs::write(&p, edit(out)).unwrap();
    p
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn model_card_with_hidden_8192_depth_64_fails_the_parameter_budget() {
    let d = tempfile::tempdir().unwrap();
    let w = root().join("models/digits-mlp.safetensors");
    let sha = sha256_hex(&std::fs::read(&w).unwrap());
    let card = card_with(d.path(), &w, &sha, |s| {
        s.replace("hidden = 256", "hidden = 8192")
            .replace("depth = 3", "depth = 64")
    });
    assert!(std::fs::read_to_string(&card).unwrap().contains("hidden = 8192"));
    let (out, took) = limited(
        &[
            "mia",
            "--checkpoint",
            card.to_str().unwrap(),
            "--attack",
            "loss",
            "--timesteps",
            "10",
        ],
        &[],
        SECS_60,
    );
    assert_refused(&out, took, "model.hidden");
    assert!(stderr(&out).contains("depth = 64"), "{}", stderr(&out));
}

#[test]
fn sweep_points_1e9_is_refused() {
    let (out, took) = limited(
        &[
            "sweep",
            "fixtures/samplers/edm-cifar10-paper.toml",
            "--sigma-min",
            "0.002..5",
            "--points",
            "1000000000",
        ],
        &[],
        SECS_60,
    );
    assert_refused(&out, took, "--points");
}

#[test]
fn train_timesteps_1e12_and_batch_size_1e9_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let stem = d.path().join("m");
    let (out, took) = limited(
        &[
            "train",
            "--out",
            stem.to_str().unwrap(),
            "--timesteps",
            "1000000000000",
            "--steps",
            "1",
        ],
        &[],
        SECS_60,
    );
    assert_refused(&out, took, "timesteps");
    let (out, took) = limited(
        &[
            "train",
            "--out",
            stem.to_str().unwrap(),
            "--batch-size",
            "1000000000",
            "--steps",
            "1",
        ],
        &[],
        SECS_60,
    );
    assert_refused(&out, took, "--batch-size");
}

#[test]
fn mia_bootstrap_1e12_is_refused_before_any_attack_runs() {
    let (out, took) = limited(
        &[
            "mia",
            "--checkpoint",
            "models/digits-mlp.toml",
            "--attack",
            "loss",
            "--timesteps",
            "10",
            "--bootstrap",
            "1000000000000",
        ],
        &[],
        SECS_60,
    );
    assert_refused(&out, took, "--bootstrap");
}

#[test]
fn run_audit_runs_1e12_is_refused() {
    let (out, took) = limited(
        &[
            "run",
            "dpagg-ti",
            "fixtures/runs/dpagg-ti-digits.toml",
            "--audit",
            "--audit-runs",
            "1000000000000",
        ],
        &[],
        SECS_60,
    );
    assert_refused(&out, took, "--audit-runs");
}

/// A shipped report with its first plot's points replaced by `xs`/`ys` on the given scales.
fn report_with_plot(dir: &Path, xs: &[f64], ys: &[f64], x_scale: &str, y_scale: &str) -> PathBuf {
    let src = std::fs::read(root().join("reports/check-dpsgd-mnist/report.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&src).unwrap();
    let plot = &mut v["plots"][0];
    plot["x"]["scale"] = serde_json::json!(x_scale);
    plot["y"]["scale"] = serde_json::json!(y_scale);
    let s = &mut plot["series"][0];
    s["x"] = serde_json::json!(xs);
    s["y"] = serde_json::json!(ys);
    let p = dir.join("report.json");
    std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
    p
}

#[test]
fn report_plots_spanning_the_whole_f64_range_render_or_refuse_quickly() {
    let d = tempfile::tempdir().unwrap();
    for (xs, ys, sx, sy) in [
        (vec![1e-308, 1.0, 1e308], vec![1e-308, 1e-5, 1e308], "log", "log"),
        (vec![-1e308, 0.0, 1e308], vec![-1e308, 1.0, 1e308], "linear", "linear"),
        (vec![5e-324, 1e308], vec![1.0, 2.0], "log", "linear"),
    ] {
        let rep = report_with_plot(d.path(), &xs, &ys, sx, sy);
        let out_dir = d.path().join(format!("out-{sx}-{sy}"));
        std::fs::create_dir_all(&out_dir).unwrap();
        let (out, took) = limited(
            &[
                "report",
                rep.to_str().unwrap(),
                "--out",
                out_dir.to_str().unwrap(),
                "--force",
            ],
            &[],
            SECS_60,
        );
        let err = stderr(&out);
        assert!(
            out.status.code() == Some(0) || (out.status.code() == Some(2) && err.contains("plot")),
            "{sx}/{sy}: {:?} after {took:?}: {err}",
            out.status
        );
        assert!(!err.contains("panicked"), "{err}");
        assert!(took < Duration::from_secs(30), "{sx}/{sy}: {took:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// No super-linear surprises.

/// CPU time this thread has run (Linux `/proc/thread-self/schedstat`, first field in ns).
fn thread_cpu() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

fn many_part_event(n: usize) -> String {
    let mut s = String::from("schema_version = 1\ndelta = 1e-5\n[event]\ntype = \"composed\"\n");
    for i in 0..n {
        s.push_str(&format!(
            "[[event.events]]\ntype = \"gaussian\"\nnoise_multiplier = {}\n",
            1000.0 + i as f64 * 0.001
        ));
    }
    s
}

#[test]
fn a_100k_part_composed_event_is_collected_and_accounted_in_under_a_second() {
    use dpaudit::accountants::AccountantKind;
    let f: dpaudit::events::EventFile = toml::from_str(&many_part_event(100_000)).unwrap();
    // CPU time of this thread (the test machine may be shared by many builds; wall time would
    // measure the load, not the algorithm). Falls back to wall time off Linux.
    let start = Instant::now();
    let cpu0 = thread_cpu();
    let comps = f.event.components().unwrap();
    let r = AccountantKind::Gdp
        .build()
        .epsilon(&f.event, f.neighbouring, 1e-5)
        .unwrap();
    let took = match (cpu0, thread_cpu()) {
        (Some(a), Some(b)) => b - a,
        _ => start.elapsed(),
    };
    assert_eq!(comps.len(), 100_000, "distinct parts stay distinct");
    assert!(r.epsilon.is_finite() && r.epsilon > 0.0);
    assert!(took < Duration::from_secs(1), "accounting 100k parts took {took:?}");
    // Equal parts still merge: the same 100k parts twice give the same components, doubled.
    let twice = dpaudit::events::DpEvent::Composed {
        events: vec![f.event.clone(), f.event.clone()],
    };
    let c2 = twice.components().unwrap();
    assert_eq!(c2.len(), 100_000);
    assert!(c2.iter().all(|c| c.count == 2));
}

#[test]
fn a_100k_part_event_file_through_the_cli_finishes() {
    let d = tempfile::tempdir().unwrap();
    let p = write(d.path(), "e.toml", &many_part_event(100_000));
    let (out, took) = limited(
        &[
            "account",
            "--event",
            p.to_str().unwrap(),
            "--accountant",
            "gdp",
            "--delta",
            "1e-5",
        ],
        &[],
        SECS_60,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(took < Duration::from_secs(30), "{took:?}");
}

#[test]
fn dpagg_ti_with_1e18_releases_and_a_budget_ends_and_counts_the_refusals() {
    let d = tempfile::tempdir().unwrap();
    let src = std::fs::read_to_string(root().join("fixtures/runs/dpagg-ti-digits.toml")).unwrap();
    let emb = root().join("fixtures/embeddings/digits-proj16-label3.csv");
    let cfg = src.replace("releases = 5", "releases = 1000000000000000000").replace(
        "\"../embeddings/digits-proj16-label3.csv\"",
        &format!("\"{}\"", emb.display()),
    );
    assert!(cfg.contains("releases = 1000000000000000000") && cfg.contains("budget_epsilon"));
    let p = write(d.path(), "run.toml", &cfg);
    let out_dir = d.path().join("out");
    let (out, took) = limited(
        &[
            "run",
            "dpagg-ti",
            p.to_str().unwrap(),
            "--out",
            out_dir.to_str().unwrap(),
            "--format",
            "json",
        ],
        &[],
        SECS_60,
    );
    assert_eq!(out.status.code(), Some(0), "{:?} {}", out.status, stderr(&out));
    assert!(took < Duration::from_secs(30), "{took:?}");
    // stdout is the shared report; the counts are in the detailed record run.json.
    let _: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("{e}: {}", stdout(&out)));
    let detail = std::fs::read_to_string(out_dir.join("run.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&detail).unwrap();
    let text = v.to_string();
    // released + refused = 1e18 (the budget admits only a few).
    let find = |k: &str| -> u64 {
        fn walk(v: &serde_json::Value, k: &str) -> Option<u64> {
            match v {
                serde_json::Value::Object(o) => o
                    .get(k)
                    .and_then(|x| x.as_u64())
                    .or_else(|| o.values().find_map(|x| walk(x, k))),
                serde_json::Value::Array(a) => a.iter().find_map(|x| walk(x, k)),
                _ => None,
            }
        }
        walk(&v, k).unwrap_or_else(|| panic!("no `{k}` in {text}"))
    };
    let (released, refused) = (find("released"), find("refused"));
    assert!((1..100).contains(&released), "released {released}");
    assert_eq!(released + refused, 1_000_000_000_000_000_000);
}

#[test]
fn dpagg_ti_with_1e18_releases_and_no_budget_is_refused_by_the_limits() {
    use dpaudit::pipelines::embeddings::Embeddings;
    use dpaudit::pipelines::mechanisms::{run_dpagg_ti, DpaggTi, Fault, SigmaRule};
    let raw = Embeddings::load_csv(&root().join("fixtures/embeddings/digits-proj16-label3.csv")).unwrap();
    let mech = DpaggTi::new(&raw, 16, 1.0, None, SigmaRule::Classic, None, Fault::None).unwrap();
    let start = Instant::now();
    let e = run_dpagg_ti(&mech, 1_000_000_000_000_000_000, None, 1).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("releases"));
    assert!(e.message.contains("limit"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(1));
}

// ---------------------------------------------------------------------------------------------
// Values: non-finite numbers and wrong dtypes.

#[test]
fn mia_timesteps_nan_t_is_refused_not_read_as_step_zero() {
    for bad in ["nanT", "infT", "T/nan", "NaNT/4", "-0.5T"] {
        let flag = format!("--timesteps={bad}");
        let (out, took) = limited(
            &[
                "mia",
                "--checkpoint",
                "models/digits-mlp.toml",
                "--attack",
                "loss",
                &flag,
            ],
            &[],
            SECS_60,
        );
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains("--timesteps") && err.contains(bad), "{bad}: {err}");
        assert!(took < Duration::from_secs(20));
    }
}

/// Writes the shipped weights with every tensor passed through `f`, and a card for them.
fn weights_variant(dir: &Path, f: impl Fn(&str, candle_core::Tensor) -> candle_core::Tensor) -> PathBuf {
    let dev = candle_core::Device::Cpu;
    let t = candle_core::safetensors::load(root().join("models/digits-mlp.safetensors"), &dev).unwrap();
    let t: std::collections::HashMap<String, candle_core::Tensor> = t
        .into_iter()
        .map(|(k, v)| {
            let v2 = f(&k, v);
            (k, v2)
        })
        .collect();
    let w = dir.join("w.safetensors");
    candle_core::safetensors::save(&t, &w).unwrap();
    let sha = sha256_hex(&std::fs::read(&w).unwrap());
    card_with(dir, &w, &sha, |s| s)
}

#[test]
fn i32_weights_are_refused_naming_the_dtype() {
    let d = tempfile::tempdir().unwrap();
    let card = weights_variant(d.path(), |_, v| v.to_dtype(candle_core::DType::I32).unwrap());
    let (out, _) = limited(
        &[
            "mia",
            "--checkpoint",
            card.to_str().unwrap(),
            "--attack",
            "loss",
            "--timesteps",
            "10",
        ],
        &[],
        SECS_60,
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("dtype i32") && err.contains("f32"), "{err}");
}

#[test]
fn train_init_from_nan_weights_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let card = weights_variant(d.path(), |k, v| {
        if k.starts_with("output") {
            (v * f64::NAN).unwrap()
        } else {
            v
        }
    });
    let stem = d.path().join("out");
    let (out, _) = limited(
        &[
            "train",
            "--init",
            card.to_str().unwrap(),
            "--out",
            stem.to_str().unwrap(),
            "--steps",
            "1",
        ],
        &[],
        SECS_60,
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("non-finite"), "{err}");
    assert!(
        !stem.with_extension("toml").exists(),
        "a checkpoint was written from NaN weights"
    );
}

#[test]
fn embeddings_of_1e308_keep_their_direction_when_normalised() {
    use dpaudit::pipelines::embeddings::{norm, Embeddings};
    let e = Embeddings::new(vec![
        vec![1e308, 1e308, 0.0],
        vec![-1e308, 0.0, 0.0],
        vec![5e-324, 0.0, 5e-324],
    ])
    .unwrap();
    let u = e.normalised().unwrap();
    let h = std::f64::consts::FRAC_1_SQRT_2;
    assert!(
        (u.rows[0][0] - h).abs() < 1e-15 && (u.rows[0][1] - h).abs() < 1e-15,
        "{:?}",
        u.rows[0]
    );
    assert_eq!(u.rows[1], vec![-1.0, 0.0, 0.0]);
    assert!((u.rows[2][0] - h).abs() < 1e-15, "{:?}", u.rows[2]);
    assert!(u.rows.iter().all(|r| (norm(r) - 1.0).abs() < 1e-15));
    assert_eq!(norm(&[1e308, 1e308]), 1e308 * std::f64::consts::SQRT_2);
}

#[test]
fn rdp_and_gdp_delta_that_underflows_is_a_positive_upper_bound_not_zero() {
    for acc in ["rdp", "gdp"] {
        let o = super::common::dpaudit(&[
            "account",
            "--noise-multiplier",
            "0.5",
            "--steps",
            "1",
            "--epsilon",
            "2000",
            "--accountant",
            acc,
            "--format",
            "json",
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        let text = v.to_string();
        let r = v["results"]
            .as_array()
            .and_then(|a| a.iter().find(|r| r["accountant"] == acc))
            .unwrap_or_else(|| panic!("no {acc} result in {text}"));
        let delta = r["delta"].as_f64().unwrap();
        assert!(delta > 0.0, "{acc}: δ = {delta} reported for a positive true δ: {r}");
        assert!(delta < 1e-300, "{acc}: δ = {delta}");
        assert_ne!(r["kind"], "exact", "{acc}: a rounded δ is not exact: {r}");
    }
}

// ---------------------------------------------------------------------------------------------
// Closed pipes.

#[test]
fn a_closed_stdout_pipe_ends_quietly_without_a_panic() {
    for args in [
        vec!["analyze", "fixtures/samplers/edm-cifar10-paper.toml"],
        vec![
            "account",
            "--noise-multiplier",
            "1.1",
            "--sample-rate",
            "0.004",
            "--steps",
            "1000",
            "--delta",
            "1e-5",
        ],
        vec!["report", "reports/check-dpsgd-mnist/report.json", "--format", "md"],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_dpaudit"))
            .args(&args)
            .current_dir(root())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The reader goes away before anything is written (as `| head -0` would).
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = stderr(&out);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!err.contains("Broken pipe"), "{args:?}: {err}");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
    }
}

// ---------------------------------------------------------------------------------------------
// Regressions found by the fuzz harness (fuzz.rs).

/// fuzz_run_configs: `epsilon = 5e-324` made the classic σ infinite and the release panicked
/// in `Normal::new` ("σ validated > 0: BadVariance").
#[test]
fn dpagg_ti_with_a_subnormal_epsilon_is_an_input_error_not_a_panic() {
    let d = tempfile::tempdir().unwrap();
    let src = std::fs::read_to_string(root().join("fixtures/runs/dpagg-ti-digits.toml")).unwrap();
    let emb = root().join("fixtures/embeddings/digits-proj16-label3.csv");
    let cfg = src.replace("epsilon = 1.0", "epsilon = 5e-324").replace(
        "\"../embeddings/digits-proj16-label3.csv\"",
        &format!("\"{}\"", emb.display()),
    );
    assert!(cfg.contains("epsilon = 5e-324"));
    let p = write(d.path(), "run.toml", &cfg);
    let out_dir = d.path().join("out");
    let (out, _) = limited(
        &[
            "run",
            "dpagg-ti",
            p.to_str().unwrap(),
            "--out",
            out_dir.to_str().unwrap(),
        ],
        &[],
        SECS_60,
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("epsilon") && !err.contains("panicked"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Issue 29 (trust at the edges): leaks, crashes, aborts and unbounded work.

/// Runs dpaudit through `sh -c` with a prefix (`umask 022;`, redirections) and the arguments.
fn shell(prefix: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let exe = env!("CARGO_BIN_EXE_dpaudit");
    let mut script = format!("{prefix} '{exe}'");
    for a in args {
        script.push_str(&format!(" '{}'", a.replace('\'', "'\\''")));
    }
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(&script).current_dir(root());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("spawn sh")
}

/// A sampler config whose trajectory data path points at a system file: the error names the
/// file, the line and the column, but quotes none of the file's text.
#[test]
fn a_data_path_pointing_at_a_system_file_does_not_print_its_lines() {
    let d = tempfile::tempdir().unwrap();
    let src = std::fs::read_to_string(root().join("fixtures/samplers/digits-trajectories.toml")).unwrap();
    let mut tried = 0;
    for target in ["/etc/passwd", "/etc/hostname", "/proc/self/environ", "/etc/os-release"] {
        let Ok(bytes) = std::fs::read(target) else {
            continue;
        };
        if bytes.is_empty() {
            continue;
        }
        tried += 1;
        let cfg = src.replace("../data/digits.csv.gz", target);
        assert!(cfg.contains(target));
        let p = write(d.path(), "leak.toml", &cfg);
        let out = super::common::dpaudit(&["analyze", p.to_str().unwrap()]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{target}: {err}");
        assert!(err.contains(target), "the error names the file: {err}");
        let text = String::from_utf8_lossy(&bytes);
        for piece in text.split(['\n', '\0']).map(str::trim).filter(|l| l.len() >= 2) {
            assert!(!err.contains(piece), "{target}: the error quotes `{piece}`: {err}");
        }
        // The first token too (a user name, a host name, a variable name).
        let first = text.split([':', '=', '\n', '\0', ' ']).next().unwrap_or("").trim();
        if first.len() >= 2 {
            assert!(!err.contains(first), "{target}: the error quotes `{first}`: {err}");
        }
    }
    assert!(tried >= 2, "no readable system file to try");
}

/// A claims file whose text fields carry HTML and spreadsheet formulas: the Markdown and HTML
/// reports escape them, the CSV tables neutralise formula cells.
#[test]
fn report_formats_escape_html_and_formulas_from_input_fields() {
    let d = tempfile::tempdir().unwrap();
    let src = std::fs::read_to_string(root().join("fixtures/claims/dpagg-ti.toml")).unwrap();
    let hostile = src
        .replacen("id = \"eve-m4-eps0.1\"", "id = \"<script>alert(1)</script>\"", 1)
        .replacen(
            "dataset = \"@eveismyname\"",
            "dataset = \"=HYPERLINK(\\\"http://x\\\")\"",
            1,
        )
        .replacen(
            "title = \"DPAgg-TI, Tables 2 and 3\"",
            "title = \"<img src=x onerror=alert(1)> ```\"",
            1,
        )
        .replacen(
            "source = \"DPAgg-TI, Table 2; σ by eq. (6), amplification eq. (3)\"",
            "source = \"+1+cmd|' /C calc'!A0\"",
            1,
        );
    assert!(hostile.contains("<script>") && hostile.contains("=HYPERLINK") && hostile.contains("<img"));
    let p = write(d.path(), "claims.toml", &hostile);
    let out_dir = d.path().join("out");
    let out = super::common::dpaudit(&["verify", p.to_str().unwrap(), "--out", out_dir.to_str().unwrap()]);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", stderr(&out));
    let md = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    assert!(!md.contains("<script"), "raw <script> in Markdown");
    assert!(!md.contains("<img"), "raw <img> in Markdown");
    assert!(md.contains("&lt;script>"), "the id is still shown, escaped");
    let html = std::fs::read_to_string(out_dir.join("report.html")).unwrap();
    assert!(!html.contains("<script") && !html.contains("<img"), "raw tag in HTML");
    let mut formulas = 0;
    for e in std::fs::read_dir(&out_dir).unwrap().flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "csv") {
            continue;
        }
        let mut rdr = csv::ReaderBuilder::new().has_headers(false).from_path(&path).unwrap();
        for rec in rdr.records() {
            for cell in rec.unwrap().iter() {
                let looks_numeric = cell.parse::<f64>().is_ok();
                assert!(
                    looks_numeric || !cell.starts_with(['=', '+', '-', '@']),
                    "{}: formula cell `{cell}`",
                    path.display()
                );
                formulas += usize::from(cell.starts_with("'="));
            }
        }
    }
    assert!(formulas >= 1, "the formula cell is kept, prefixed with a quote");
}

/// Report files are created with the process's umask, like any other file.
#[test]
fn report_files_honour_the_umask() {
    use std::os::unix::fs::PermissionsExt as _;
    for (umask, want) in [("022", 0o644), ("077", 0o600), ("002", 0o664)] {
        let d = tempfile::tempdir().unwrap();
        let out_dir = d.path().join("out");
        let o = shell(
            &format!("umask {umask}; exec"),
            &[
                "check",
                "fixtures/events/dpsgd.toml",
                "--max-epsilon",
                "10",
                "--out",
                out_dir.to_str().unwrap(),
            ],
            &[],
        );
        assert!(matches!(o.status.code(), Some(0 | 1)), "{}", stderr(&o));
        let mut n = 0;
        for e in std::fs::read_dir(&out_dir).unwrap().flatten() {
            let mode = e.metadata().unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, want, "umask {umask}: {} is {mode:o}", e.path().display());
            n += 1;
        }
        assert!(n >= 2, "no report files written");
    }
}

fn eps_delta_event(eps: &str, count: u64) -> String {
    format!(
        "schema_version = 1\nneighbouring = \"add_remove\"\ndelta = 1e-5\n[event]\ntype = \"self_composed\"\n\
         count = {count}\n[event.event]\ntype = \"epsilon_delta\"\nepsilon = {eps}\ndelta = 1e-7\n"
    )
}

/// accountants/pld.rs: an (ε, δ) leaf sized its grid 2ε/h: ε ≥ 1e300 overflowed the index
/// (panic), ε = 1e7 asked for 1.6 TB (abort). Now losses above the grid's range go to +∞.
#[test]
fn epsilon_delta_leaves_with_huge_epsilon_neither_panic_nor_allocate() {
    let d = tempfile::tempdir().unwrap();
    for eps in ["1e300", "1e7", "1.7976931348623157e308", "250"] {
        let p = write(d.path(), "ed.toml", &eps_delta_event(eps, 10));
        let (out, took) = limited(&["account", "--event", p.to_str().unwrap()], &[], SECS_60);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(0), "ε = {eps}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        let text = stdout(&out);
        assert!(text.contains("pld"), "ε = {eps}: {text}");
        assert!(took < Duration::from_secs(20), "ε = {eps}: {took:?}");
        // Never a sound ε below the leaf's own ε.
        for line in text
            .lines()
            .filter(|l| l.contains("upper bound") || l.contains("exact"))
        {
            if let Some(v) = line.split("ε = ").nth(1).and_then(|r| r.split_whitespace().next()) {
                if let Ok(x) = v.parse::<f64>() {
                    assert!(x >= 250.0, "ε = {eps}: sound ε {x} below the leaf's ε: {line}");
                }
            }
        }
    }
}

/// env.rs unwrap: a file name that is not UTF-8 panicked in `std::env::args()`.
#[test]
fn non_utf8_file_names_are_handled() {
    use std::os::unix::ffi::OsStrExt as _;
    let d = tempfile::tempdir().unwrap();
    let name = std::ffi::OsStr::from_bytes(b"ev\xff.toml");
    let p = d.path().join(name);
    std::fs::copy(root().join("fixtures/events/dpsgd.toml"), &p).unwrap();
    let saved = d.path().join(std::ffi::OsStr::from_bytes(b"saved\xfe.toml"));
    let out = Command::new(env!("CARGO_BIN_EXE_dpaudit"))
        .arg("check")
        .arg(&p)
        .args(["--max-epsilon", "10", "--format", "json"])
        .current_dir(root())
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(0), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_dpaudit"))
        .args(["account", "--event"])
        .arg(&p)
        .arg("--save-event")
        .arg(&saved)
        .current_dir(root())
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(saved.exists());
}

/// stdout or stderr on a full device: an output error (exit 2), never a panic (101).
#[test]
fn stdout_or_stderr_on_dev_full_is_an_error_not_a_panic() {
    if !Path::new("/dev/full").exists() {
        return;
    }
    let ok = ["account", "--event", "fixtures/events/dpsgd.toml"];
    let o = shell("exec >/dev/full", &ok, &[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("No space left"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // stderr full: the result still goes to stdout; an input error is still exit 2.
    let o = shell("exec 2>/dev/full", &ok, &[]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains("Headline"));
    let o = shell("exec 2>/dev/full", &["account", "--event", "no-such-file.toml"], &[]);
    assert_eq!(o.status.code(), Some(2));
    // A command with progress notes on stderr (`-v`) finishes.
    let o = shell(
        "exec 2>/dev/full",
        &["analyze", "fixtures/samplers/edm-cifar10-paper.toml", "-v"],
        &[],
    );
    assert_eq!(o.status.code(), Some(0));
}

/// `RAYON_NUM_THREADS=5000` under a memory limit panicked building the thread pool.
#[test]
fn a_huge_thread_count_is_lowered_not_a_panic() {
    for n in ["5000", "100000"] {
        let (out, _) = limited(
            &["account", "--event", "fixtures/events/dpsgd.toml"],
            &[("RAYON_NUM_THREADS", n)],
            SECS_60,
        );
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(0), "{n}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(err.contains("limit of 256 threads"), "the lowering is stated: {err}");
        assert!(stdout(&out).contains("Headline"));
    }
}

/// CRC-32 (IEEE) of a PNG chunk's type and data.
fn crc32(bytes: &[u8]) -> u32 {
    let mut c = 0xffff_ffffu32;
    for &b in bytes {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 { 0xedb8_8320 ^ (c >> 1) } else { c >> 1 };
        }
    }
    !c
}

/// A PNG whose header declares `w` × `h` RGB pixels (the data is a few bytes of zlib).
fn png_declaring(w: u32, h: u32) -> Vec<u8> {
    let mut v = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut chunk = |kind: &[u8], data: &[u8]| {
        v.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let mut body = kind.to_vec();
        body.extend_from_slice(data);
        v.extend_from_slice(&body);
        v.extend_from_slice(&crc32(&body).to_be_bytes());
    };
    let mut ihdr = w.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(b"IHDR", &ihdr);
    chunk(b"IDAT", &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01]);
    chunk(b"IEND", &[]);
    v
}

/// A PNG folder "bomb": tiny files whose headers declare 60,000 × 60,000 pixels (10 GB to
/// decode), or many images that add up past the cap: refused before decoding.
#[test]
fn a_png_folder_bomb_is_refused_before_decoding() {
    let d = tempfile::tempdir().unwrap();
    let big = d.path().join("big");
    std::fs::create_dir(&big).unwrap();
    std::fs::write(big.join("a.png"), png_declaring(60_000, 60_000)).unwrap();
    let many = d.path().join("many");
    std::fs::create_dir(&many).unwrap();
    for i in 0..64 {
        std::fs::write(many.join(format!("{i:03}.png")), png_declaring(4096, 4096)).unwrap();
    }
    for (dir, env) in [(&big, vec![]), (&many, vec![("DPAUDIT_MAX_MEMORY", "256M")])] {
        let (out, took) = limited(
            &[
                "mia",
                "--checkpoint",
                "models/mnist-ddpm",
                "--data",
                dir.to_str().unwrap(),
                "--split",
                "fixtures/splits/mnist.toml",
            ],
            &env,
            SECS_60,
        );
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{}: {err}", dir.display());
        assert!(err.contains("limit"), "{err}");
        assert!(!err.contains("panicked") && !err.contains("memory allocation"), "{err}");
        assert!(took < Duration::from_secs(30), "{took:?}");
    }
}

/// A composed event of 10⁶ distinct Gaussian leaves (46 MB of TOML) is refused by its file
/// size before it is parsed (parsing holds ≈ 45 bytes per byte); one of 20,000 distinct
/// leaves passes the tree limit, is accounted by GDP, and the PLD groups its leaves on a
/// dominating ladder (docs/pld.md, "Many distinct steps") instead of discretising 20,000 grids:
/// it says so, and its bound is not below the exact GDP value.
#[test]
fn a_million_leaf_event_is_bounded() {
    let d = tempfile::tempdir().unwrap();
    let event = |n: usize| {
        let mut s = String::with_capacity(n * 48);
        s.push_str("schema_version = 1\ndelta = 1e-5\n[event]\ntype = \"composed\"\nevents = [\n");
        for i in 0..n {
            s.push_str(&format!(
                "{{type=\"gaussian\",noise_multiplier={}}},\n",
                1.0 + i as f64 * 1e-6
            ));
        }
        s.push_str("]\n");
        s
    };
    let p = write(d.path(), "million.toml", &event(1_000_000));
    let (out, took) = limited(&["account", "--event", p.to_str().unwrap()], &[], SECS_60);
    assert_refused(&out, took, "file size");
    let p = write(d.path(), "many.toml", &event(20_000));
    let (out, took) = limited(&["account", "--event", p.to_str().unwrap()], &[], SECS_60);
    let err = stderr(&out);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(text.contains("pld_leaves_grouped"), "{text}");
    let eps_of = |a: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(a) && l.contains("ε ="))
            .unwrap_or_else(|| panic!("no {a} line: {text}"));
        line.split("ε =")
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(eps_of("pld") >= eps_of("gdp"), "{text}");
    assert!(text.contains("Headline"), "{text}");
    assert!(took < Duration::from_secs(30), "{took:?}");
}

#[test]
fn train_steps_1e18_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let o = d.path().join("m");
    let (out, took) = limited(
        &["train", "--steps", "1000000000000000000", "--out", o.to_str().unwrap()],
        &[],
        SECS_60,
    );
    assert_refused(&out, took, "--steps");
}

#[test]
fn mia_noise_draws_1e9_is_refused() {
    let mut args = super::common::MNIST_MIA.to_vec();
    args.extend_from_slice(&["--noise-draws", "1000000000", "--attack", "loss"]);
    let (out, took) = limited(&args, &[], SECS_60);
    assert_refused(&out, took, "--noise-draws");
}

#[test]
fn a_100k_point_pld_sweep_is_refused() {
    let (out, took) = limited(
        &[
            "sweep",
            "fixtures/samplers/edm-cifar10-subsampled.toml",
            "--sigma-min",
            "0.002..5",
            "--points",
            "100000",
            "--accountant",
            "pld",
        ],
        &[],
        SECS_60,
    );
    assert_refused(&out, took, "--points");
}

#[test]
fn a_100k_claim_file_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let mut s = String::from("schema_version = 1\ntitle = \"many\"\n");
    for i in 0..100_000 {
        s.push_str(&format!(
            "[[dpagg_ti]]\nid = \"c{i}\"\nsource = \"s\"\ndataset = \"d\"\nn = 158\nm = 4\nepsilon = 1.0\ndelta = 0.006\n"
        ));
    }
    let p = write(d.path(), "claims.toml", &s);
    let (out, took) = limited(&["verify", p.to_str().unwrap()], &[], SECS_60);
    assert_refused(&out, took, "claims");
}
