//! Fuzzing every input format with proptest: sampler TOML, claims TOML, event TOML, run
//! configs, model cards, safetensors headers, report JSON and CSV embeddings.
//!
//! Each generator starts from the shipped fixtures and replaces values with hostile ones
//! (NaN, ±∞, ±1e308, 5e-324, i64/u64 extremes, 10¹², wrong types) or corrupts bytes, then runs
//! the loader *and* the work the file leads to (accounting, the mechanism, the model build,
//! rendering), under small resource caps ([`dpaudit::limits::with_caps`]) so every accepted
//! input is also cheap. The oracle: no panic, no hang, and any result that comes back is
//! well-formed (finite where it must be, ε ≥ 0, δ in [0, 1], unit rows).
//!
//! Bounded for CI: `FUZZ_CASES` cases per format (default 48; a few seconds each in a debug
//! build). The longer campaign (docs/reliability.md):
//! `FUZZ_CASES=20000 cargo test --release --test integration fuzz -- --test-threads 2`.
//! A failing case is shrunk by proptest and printed; add it to `hostile.rs` as a regression test.

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use dpaudit::accountants::AccountantKind;
use dpaudit::config::claims::ClaimsFile;
use dpaudit::config::sampler::SamplerConfig;
use dpaudit::events::EventFile;
use dpaudit::limits;

use super::common::root;

/// Memory and work caps every fuzz case runs under (64 MiB, 10⁸ operations).
const CAP_MEMORY: f64 = 64.0 * 1024.0 * 1024.0;
const CAP_WORK: f64 = 1e8;

fn cases() -> u32 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(48)
}

fn runner(seed_name: &str) -> TestRunner {
    // Deterministic per format (the seed is derived from the name), so CI runs are repeatable.
    let mut seed = [0u8; 32];
    for (i, b) in seed_name.bytes().enumerate() {
        seed[i % 32] ^= b;
    }
    TestRunner::new_with_rng(
        Config {
            cases: cases(),
            failure_persistence: None,
            ..Config::default()
        },
        proptest::test_runner::TestRng::from_seed(proptest::test_runner::RngAlgorithm::ChaCha, &seed),
    )
}

/// Values a hostile user writes into a TOML file (as TOML source text).
fn hostile_toml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("nan".to_string()),
        Just("inf".to_string()),
        Just("-inf".to_string()),
        Just("0".to_string()),
        Just("-0.0".to_string()),
        Just("-1".to_string()),
        Just("1e308".to_string()),
        Just("-1e308".to_string()),
        Just("5e-324".to_string()),
        Just("1e-300".to_string()),
        Just("1e-160".to_string()),
        Just("1e300".to_string()),
        Just("18446744073709551615".to_string()),
        Just("9223372036854775807".to_string()),
        Just("-9223372036854775808".to_string()),
        Just("1000000000000".to_string()),
        Just("100000".to_string()),
        Just("1000000000000000000".to_string()),
        Just("\"x\"".to_string()),
        Just("[]".to_string()),
        Just("[1e308, -1e308]".to_string()),
        Just("true".to_string()),
        Just("{}".to_string()),
        (0u32..5000).prop_map(|v| v.to_string()),
        (-2.0f64..3.0).prop_map(|v| format!("{v:?}")),
        any::<i64>().prop_map(|v| v.to_string()),
        any::<f64>()
            .prop_filter("TOML float", |v| v.is_finite())
            .prop_map(|v| format!("{v:e}")),
    ]
}

/// Degenerate numbers that parse and often pass validation, so they reach the accountants and
/// mechanisms: noise too small to bound (σ = 1e-160, subnormal 5e-324, 0), ε far beyond any
/// grid (1e300), huge counts.
fn degenerate_number() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("1e-160".to_string()),
        Just("5e-324".to_string()),
        Just("0".to_string()),
        Just("1e300".to_string()),
        Just("1e7".to_string()),
        Just("1e-12".to_string()),
        Just("1000000000000".to_string()),
        Just("4294967296".to_string()),
        Just("1".to_string()),
    ]
}

/// Edits of a TOML source: replace the values of some `key = value` lines with hostile values
/// (`Value`), with degenerate numbers (`Degenerate`, numeric lines only) or with the value
/// scaled (`Scale`, numeric lines only: plausible inputs that pass the parser and exercise the
/// work behind it); drop a line; flip a byte.
#[derive(Debug, Clone)]
enum Edit {
    Value(usize, String),
    Degenerate(usize, String),
    Scale(usize, f64),
    Drop(usize),
    Byte(usize, u8),
}

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    prop::collection::vec(
        prop_oneof![
            2 => (any::<usize>(), hostile_toml_value()).prop_map(|(i, v)| Edit::Value(i, v)),
            3 => (any::<usize>(), degenerate_number()).prop_map(|(i, v)| Edit::Degenerate(i, v)),
            6 => (any::<usize>(), prop_oneof![Just(0.5), Just(0.9), Just(1.1), Just(2.0), Just(10.0), Just(1e-3)])
                .prop_map(|(i, f)| Edit::Scale(i, f)),
            1 => any::<usize>().prop_map(Edit::Drop),
            1 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Byte(i, b)),
        ],
        1..4,
    )
}

/// Counts the cases of one fuzzer that get past the parser to the work (accountant, mechanism,
/// model, renderer), and asserts at the end that at least a quarter did: a fuzzer whose inputs
/// all die in the parser tests only the parser.
struct Reach {
    name: &'static str,
    cases: std::sync::atomic::AtomicUsize,
    reached: std::sync::atomic::AtomicUsize,
}

impl Reach {
    fn new(name: &'static str) -> Self {
        Reach {
            name,
            cases: Default::default(),
            reached: Default::default(),
        }
    }
    fn case(&self) {
        self.cases.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn reached(&self) {
        self.reached.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn assert_quarter(&self) {
        let c = self.cases.load(std::sync::atomic::Ordering::Relaxed);
        let r = self.reached.load(std::sync::atomic::Ordering::Relaxed);
        eprintln!(
            "fuzz {}: {r} of {c} cases reached the work behind the parser",
            self.name
        );
        assert!(
            4 * r >= c,
            "fuzz {}: only {r} of {c} cases got past the parser (need a quarter)",
            self.name
        );
    }
}

fn apply(src: &str, edits: &[Edit]) -> String {
    let mut lines: Vec<String> = src.lines().map(str::to_string).collect();
    for e in edits {
        let kv: Vec<usize> = lines
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.trim_start().starts_with('#') && l.contains(" = "))
            .map(|(i, _)| i)
            .collect();
        match e {
            Edit::Value(i, v) if !kv.is_empty() => {
                let at = kv[i % kv.len()];
                let key = lines[at].split(" = ").next().unwrap_or("").to_string();
                lines[at] = format!("{key} = {v}");
            }
            Edit::Degenerate(i, _) | Edit::Scale(i, _) if !kv.is_empty() => {
                // Numeric lines only (the value parses as a number); others are left alone.
                let num: Vec<usize> = kv
                    .iter()
                    .copied()
                    .filter(|&at| {
                        let v = lines[at].split(" = ").nth(1).unwrap_or("").trim();
                        v.parse::<f64>().is_ok_and(f64::is_finite)
                    })
                    .collect();
                if num.is_empty() {
                    continue;
                }
                let at = num[i % num.len()];
                let mut parts = lines[at].splitn(2, " = ");
                let key = parts.next().unwrap_or("").to_string();
                let old = parts.next().unwrap_or("").trim().to_string();
                let new = match e {
                    Edit::Degenerate(_, v) => v.clone(),
                    Edit::Scale(_, f) => {
                        let x: f64 = old.parse().unwrap_or(1.0);
                        if old.contains(['.', 'e', 'E']) {
                            format!("{:?}", x * f)
                        } else {
                            format!("{}", ((x * f).round() as i64).max(1))
                        }
                    }
                    _ => unreachable!(),
                };
                lines[at] = format!("{key} = {new}");
            }
            Edit::Drop(i) if !lines.is_empty() => {
                let at = i % lines.len();
                lines.remove(at);
            }
            Edit::Byte(i, b) => {
                let mut bytes = lines.join("\n").into_bytes();
                if !bytes.is_empty() {
                    let at = i % bytes.len();
                    bytes[at] = *b;
                }
                let s = String::from_utf8_lossy(&bytes).into_owned();
                lines = s.lines().map(str::to_string).collect();
            }
            _ => {}
        }
    }
    lines.join("\n") + "\n"
}

fn fixtures(dir: &str) -> Vec<(PathBuf, String)> {
    let mut v: Vec<(PathBuf, String)> = std::fs::read_dir(root().join(dir))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .map(|p| {
            let s = std::fs::read_to_string(&p).unwrap();
            (p, s)
        })
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no fixtures in {dir}");
    v
}

fn check_result(r: &dpaudit::accountants::Evidence) -> Result<(), TestCaseError> {
    prop_assert!(!r.epsilon.is_nan() && r.epsilon >= 0.0, "ε = {}", r.epsilon);
    prop_assert!((0.0..=1.0).contains(&r.delta), "δ = {}", r.delta);
    Ok(())
}

#[test]
fn fuzz_sampler_toml() {
    let bases = fixtures("fixtures/samplers");
    let mut r = runner("sampler");
    let reach = Reach::new("sampler");
    r.run(&(0..bases.len(), edits()), |(b, e)| {
        reach.case();
        let (path, src) = &bases[b];
        let text = apply(src, &e);
        let res = SamplerConfig::from_toml_str(&text);
        if let Ok(mut cfg) = res {
            cfg.base_dir = path.parent().map(Path::to_path_buf);
            let out = limits::with_caps(CAP_MEMORY, CAP_WORK, || {
                // Cheap accountants only; PLD is exercised by the event fuzzer on small counts.
                if cfg.schedule.n_levels() > 2000 {
                    return Ok(None);
                }
                reach.reached();
                dpaudit::diffusion::account::analyze(&cfg, &[AccountantKind::Gdp, AccountantKind::Rdp]).map(Some)
            });
            if let Ok(Some(a)) = out {
                for line in &a.accountants {
                    if let Some(eps) = line.epsilon() {
                        prop_assert!(!eps.is_nan() && eps >= 0.0, "{:?}: ε = {eps}", line.accountant);
                    }
                }
            }
        }
        Ok(())
    })
    .unwrap();
    reach.assert_quarter();
}

#[test]
fn fuzz_claims_toml() {
    // One claim per base (the file's header and one `[[table]]`, at most 3 per fixture), so a
    // case that reaches verification verifies one claim, not a whole paper's table.
    let mut bases = Vec::new();
    for (path, src) in fixtures("fixtures/claims") {
        let mut header = String::new();
        let mut blocks: Vec<String> = Vec::new();
        for line in src.lines() {
            if line.starts_with("[[") {
                blocks.push(String::new());
            }
            match blocks.last_mut() {
                Some(b) => b.push_str(line),
                None => header.push_str(line),
            }
            match blocks.last_mut() {
                Some(b) => b.push('\n'),
                None => header.push('\n'),
            }
        }
        let step = blocks.len().div_ceil(3).max(1);
        for b in blocks.iter().step_by(step) {
            bases.push((path.clone(), format!("{header}{b}")));
        }
    }
    let mut r = runner("claims");
    let reach = Reach::new("claims");
    r.run(&(0..bases.len(), edits()), |(b, e)| {
        reach.case();
        let (path, src) = &bases[b];
        let text = apply(src, &e);
        if let Ok(f) = ClaimsFile::parse(path, &text) {
            reach.reached();
            let _ = limits::with_caps(CAP_MEMORY, CAP_WORK, || dpaudit::pipelines::verify_claims(&f));
        }
        Ok(())
    })
    .unwrap();
    reach.assert_quarter();
}

#[test]
fn fuzz_event_toml() {
    let bases = fixtures("fixtures/events");
    let mut r = runner("events");
    let reach = Reach::new("events");
    r.run(&(0..bases.len(), edits()), |(b, e)| {
        reach.case();
        let (_, src) = &bases[b];
        let text = apply(src, &e);
        let Ok(f) = toml::from_str::<EventFile>(&text) else {
            return Ok(());
        };
        if f.event.validate().is_err() {
            return Ok(());
        }
        let Ok(comps) = f.event.components() else {
            return Ok(());
        };
        reach.reached();
        let small = comps.iter().all(|c| c.count <= 10_000) && comps.len() <= 8;
        let delta = f.delta.filter(|d| *d > 0.0 && *d < 1.0).unwrap_or(1e-5);
        for kind in AccountantKind::ALL {
            if kind == AccountantKind::Pld && !small {
                continue;
            }
            let acc = kind.build();
            if acc.supports(&f.event, f.neighbouring).is_err() {
                continue;
            }
            if let Ok(res) = acc.epsilon(&f.event, f.neighbouring, delta) {
                check_result(&res)?;
            }
            if let Ok(res) = acc.delta(&f.event, f.neighbouring, 1.0) {
                check_result(&res)?;
            }
        }
        Ok(())
    })
    .unwrap();
    reach.assert_quarter();
}

#[test]
fn fuzz_run_configs() {
    use dpaudit::pipelines::mechanisms::{run_dp_rdm, run_dpagg_ti, DpRdmConfig, DpaggTiConfig};
    let bases = fixtures("fixtures/runs");
    let emb = root().join("fixtures/embeddings");
    let dir = tempfile::tempdir().unwrap();
    let mut r = runner("runs");
    let reach = Reach::new("runs");
    r.run(&(0..bases.len(), edits()), |(b, e)| {
        reach.case();
        let (path, src) = &bases[b];
        let text = apply(src, &e).replace("\"../embeddings/", &format!("\"{}/", emb.display()));
        let p = dir.path().join(path.file_name().unwrap());
        std::fs::write(&p, &text).unwrap();
        limits::with_caps(CAP_MEMORY, CAP_WORK, || {
            if text.contains("embeddings =") {
                if let Ok((c, mech)) = DpaggTiConfig::load(&p) {
                    reach.reached();
                    if let Ok((run, _)) = run_dpagg_ti(&mech, c.releases.get(), c.budget_epsilon.map(|e| e.get()), 1) {
                        assert!(run.released + run.refused == c.releases.get());
                        assert!(run.outputs.iter().flatten().all(|v| v.is_finite()));
                    }
                }
            } else if let Ok((c, mech, q)) = DpRdmConfig::load(&p) {
                reach.reached();
                let delta = c.delta.map_or(1.0 / mech.private.len() as f64, |d| d.get());
                let _ = run_dp_rdm(&mech, &q, c.budget_epsilon.get(), delta, c.accountant, 1);
            }
        });
        Ok(())
    })
    .unwrap();
    reach.assert_quarter();
}

#[test]
fn fuzz_model_cards() {
    use dpaudit::models::toy::checkpoint::Card;
    let src = std::fs::read_to_string(root().join("models/digits-mlp.toml")).unwrap();
    let mut r = runner("cards");
    let reach = Reach::new("cards");
    r.run(&edits(), |e| {
        reach.case();
        let text = apply(&src, &e);
        let Ok(card) = toml::from_str::<Card>(&text) else {
            return Ok(());
        };
        limits::with_caps(CAP_MEMORY, CAP_WORK, || {
            if card.model.validate().is_ok() {
                reach.reached();
                // Validation passed: the parameter budget holds, so building is cheap.
                let net = dpaudit::models::toy::Net::new(&card.model, 0, &candle_core::Device::Cpu);
                assert!(net.is_ok(), "a validated model must build: {:?}", card.model);
            }
            let _ = dpaudit::diffusion::schedule::table::TrainingSchedule::new(card.schedule);
        });
        Ok(())
    })
    .unwrap();
    reach.assert_quarter();
}

/// A safetensors file from a header (JSON text) and a data section.
fn safetensors_bytes(header: &str, data: &[u8]) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend_from_slice(data);
    v
}

#[test]
fn fuzz_safetensors_headers() {
    use dpaudit::models::toy::checkpoint::parse_weights;
    let dtypes = prop_oneof![
        Just("F32"),
        Just("F64"),
        Just("I32"),
        Just("I64"),
        Just("U8"),
        Just("BF16"),
        Just("F16"),
        Just("BOOL"),
        Just("X")
    ];
    let dim = prop_oneof![0u64..5, Just(u32::MAX as u64), Just(u64::MAX), Just(1u64 << 40)];
    let shape = prop::collection::vec(dim, 0..4);
    let offsets = (0u64..64, prop_oneof![0u64..64, Just(u64::MAX), Just(1u64 << 62)]);
    let data = prop::collection::vec(
        prop_oneof![
            Just(0x7fc0_0000u32),
            Just(0x7f80_0000u32),
            any::<u32>(),
            Just(1.0f32.to_bits())
        ],
        0..16,
    );
    let mut r = runner("safetensors");
    let reach = Reach::new("safetensors");
    // Modes 0–1: the header as generated (mostly inconsistent); 2: a consistent F32 header
    // around the generated values (NaN/∞ included); 3–4: consistent and finite, so the weights
    // reach the model's checks.
    r.run(
        &(dtypes, shape, offsets, data, any::<bool>(), any::<u64>(), 0u8..5),
        |(dt, shape, (a, b), mut data, garble, len, mode)| {
            reach.case();
            let (dt, shape, a, b, garble) = if mode >= 2 {
                if mode >= 3 {
                    for v in &mut data {
                        if !f32::from_bits(*v).is_finite() {
                            *v = 1.0f32.to_bits();
                        }
                    }
                }
                ("F32", vec![data.len() as u64], 0, 4 * data.len() as u64, false)
            } else {
                (dt, shape, a, b, garble)
            };
            let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
            let header = format!(r#"{{"w":{{"dtype":"{dt}","shape":{shape:?},"data_offsets":[{a},{b}]}}}}"#);
            let mut file = safetensors_bytes(&header, &bytes);
            if garble {
                // A header length that lies.
                file[..8].copy_from_slice(&len.to_le_bytes());
            }
            if let Ok(t) = parse_weights(&file, &candle_core::Device::Cpu) {
                reach.reached();
                for v in t.values() {
                    prop_assert_eq!(v.dtype(), candle_core::DType::F32);
                    let vals = v.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                    prop_assert!(vals.iter().all(|x| x.is_finite()));
                }
            }
            Ok(())
        },
    )
    .unwrap();
    reach.assert_quarter();
}

/// Hostile JSON numbers for report fields.
fn hostile_json_number() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        6 => (0.0f64..10.0).prop_map(|v| serde_json::json!(v)),
        1 => Just(serde_json::json!(1e300)),
        1 => Just(serde_json::json!(1e-160)),
        1 => Just(serde_json::json!(1e308)),
        1 => Just(serde_json::json!(-1e308)),
        1 => Just(serde_json::json!(5e-324)),
        1 => Just(serde_json::json!(0.0)),
        1 => Just(serde_json::json!(-1.0)),
        1 => Just(serde_json::json!(u64::MAX)),
        1 => Just(serde_json::json!(i64::MIN)),
        1 => Just(serde_json::json!("x")),
        1 => Just(serde_json::Value::Null),
        1 => any::<f64>()
            .prop_filter("JSON number", |v| v.is_finite())
            .prop_map(|v| serde_json::json!(v)),
    ]
}

fn numbers_mut(v: &mut serde_json::Value, out: &mut Vec<*mut serde_json::Value>) {
    match v {
        serde_json::Value::Number(_) => out.push(v as *mut _),
        serde_json::Value::Array(a) => a.iter_mut().for_each(|x| numbers_mut(x, out)),
        serde_json::Value::Object(o) => o.values_mut().for_each(|x| numbers_mut(x, out)),
        _ => {}
    }
}

/// Replaces the `i`-th number (in document order) of `v` with `new`.
fn replace_number(v: &mut serde_json::Value, i: usize, new: serde_json::Value) {
    fn walk(v: &mut serde_json::Value, left: &mut usize, new: &serde_json::Value) -> bool {
        match v {
            serde_json::Value::Number(_) => {
                if *left == 0 {
                    *v = new.clone();
                    return true;
                }
                *left -= 1;
                false
            }
            serde_json::Value::Array(a) => a.iter_mut().any(|x| walk(x, left, new)),
            serde_json::Value::Object(o) => o.values_mut().any(|x| walk(x, left, new)),
            _ => false,
        }
    }
    let mut left = i;
    walk(v, &mut left, &new);
}

#[test]
fn fuzz_report_json() {
    let mut bases = Vec::new();
    for e in std::fs::read_dir(root().join("reports")).unwrap().flatten() {
        let p = e.path().join("report.json");
        if p.exists() {
            bases.push(std::fs::read(&p).unwrap());
        }
    }
    bases.sort();
    assert!(!bases.is_empty(), "no reports/*/report.json to start from");
    let mut r = runner("report");
    let reach = Reach::new("report");
    r.run(
        &(
            0..bases.len(),
            prop::collection::vec((any::<usize>(), hostile_json_number()), 1..4),
        ),
        |(b, subs)| {
            reach.case();
            let mut v: serde_json::Value = serde_json::from_slice(&bases[b]).unwrap();
            let mut ptrs = Vec::new();
            numbers_mut(&mut v, &mut ptrs);
            let n = ptrs.len().max(1);
            for (i, new) in subs {
                replace_number(&mut v, i % n, new);
            }
            let bytes = serde_json::to_vec(&v).unwrap();
            if let Ok(rep) = dpaudit::report::from_json(&bytes) {
                reach.reached();
                let _ = dpaudit::report::export(&rep, dpaudit::report::ExportFormat::Md);
                for plot in &rep.plots {
                    let _ = dpaudit::report::plot::render_svg(plot);
                }
            }
            Ok(())
        },
    )
    .unwrap();
    reach.assert_quarter();
}

#[test]
fn fuzz_csv_embeddings() {
    use dpaudit::pipelines::embeddings::{norm, Embeddings};
    let cell = prop_oneof![
        24 => (-5.0f64..5.0).prop_map(|v| v.to_string()),
        1 => Just("1e-160".to_string()),
        1 => Just("nan".to_string()),
        1 => Just("inf".to_string()),
        1 => Just("1e308".to_string()),
        1 => Just("-1e308".to_string()),
        1 => Just("5e-324".to_string()),
        1 => Just("0".to_string()),
        1 => Just("".to_string()),
        1 => Just("x".to_string()),
        1 => Just("1e309".to_string()),
        1 => any::<f64>().prop_map(|v| format!("{v:e}")),
        1 => (-5.0f64..5.0).prop_map(|v| v.to_string()),
    ];
    // Rows of one width per case (ragged rows are one hostile mode among many, not the rule).
    let rows = (1usize..6, any::<bool>()).prop_flat_map(move |(w, ragged)| {
        let width = if ragged { 1..6 } else { w..w + 1 };
        prop::collection::vec(prop::collection::vec(cell.clone(), width), 1..8)
    });
    let mut r = runner("csv");
    let reach = Reach::new("csv");
    r.run(&(rows, any::<bool>()), |(rows, header)| {
        reach.case();
        let mut text = String::new();
        if header {
            text.push_str("a,b,c\n");
        }
        for row in rows {
            text.push_str(&row.join(","));
            text.push('\n');
        }
        if let Ok(e) = Embeddings::parse_csv(&text) {
            reach.reached();
            if let Ok(u) = e.normalised() {
                for row in &u.rows {
                    let n = norm(row);
                    prop_assert!((n - 1.0).abs() < 1e-9, "row {row:?} has norm {n}");
                }
            }
        }
        Ok(())
    })
    .unwrap();
    reach.assert_quarter();
}
