//! Soundness at the edges (issue 29, "Degenerate mechanisms are never certified" and "Schedules
//! equal to diffusers'"; issue 23, one loader for scheduler configs): each case through the real
//! binary, plus the diffusers timestep table and a property test of every accountant against a
//! proven lower bound down to σ = 5e-324.

use super::common::*;
use serde_json::Value;
use std::path::Path;

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

fn dpsgd_event(sigma: &str) -> String {
    format!(
        "schema_version = 1\nneighbouring = \"add_remove\"\ndelta = 1e-5\n\n[event]\ntype = \"self_composed\"\ncount = 10\n\n\
         [event.event]\ntype = \"poisson_sampled\"\nq = 0.01\n\n[event.event.event]\ntype = \"gaussian\"\nnoise_multiplier = {sigma}\n"
    )
}

// ---------------------------------------------------------------------------------------------
// 1. Degenerate mechanisms are never certified.

/// `check` on DP-SGD with noise too small to bound (σ = 1e-160, σ = 5e-324; flags and event
/// file) fails the budget with ε = ∞: it used to PASS with a sound ε = 0.
#[test]
fn check_never_passes_a_noiseless_mechanism() {
    let dir = tempfile::tempdir().unwrap();
    for sigma in ["1e-160", "5e-324"] {
        let o = dpaudit(&[
            "check",
            "--noise-multiplier",
            sigma,
            "--sample-rate",
            "0.01",
            "--steps",
            "10",
            "--delta",
            "1e-5",
            "--max-epsilon",
            "1",
        ]);
        let out = stdout(&o);
        assert_eq!(o.status.code(), Some(1), "σ = {sigma}: {out}{}", stderr(&o));
        assert!(out.contains("FAIL") && out.contains('∞'), "σ = {sigma}: {out}");
        let ev = write(dir.path(), "ev.toml", &dpsgd_event(sigma));
        let o = dpaudit(&["check", &ev, "--max-epsilon", "1"]);
        let out = stdout(&o);
        assert_eq!(o.status.code(), Some(1), "event σ = {sigma}: {out}{}", stderr(&o));
        assert!(out.contains("FAIL") && out.contains('∞'), "event σ = {sigma}: {out}");
    }
}

/// Every accountant answers ε = ∞ (with the `noise_below_certified_range` diagnostic) for a
/// noise multiplier below the certified range, in ε(δ) and δ(ε) (δ = 1); the headline is ∞.
#[test]
fn every_accountant_reports_infinity_below_the_certified_range() {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in [
        ("poisson.toml", dpsgd_event("5e-324")),
        (
            "full.toml",
            "schema_version = 1\ndelta = 1e-5\n[event]\ntype = \"gaussian\"\nnoise_multiplier = 1e-160\n".to_string(),
        ),
    ] {
        let ev = write(dir.path(), name, &text);
        let o = dpaudit(&["account", "--event", &ev, "--accountant", "all", "--format", "json"]);
        assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));
        let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
        let results = v["results"].as_array().unwrap();
        assert!(results.len() >= 3, "{name}: {results:?}");
        for r in results {
            assert_eq!(r["epsilon"], "inf", "{name}: {r}");
        }
        assert!(
            results.iter().any(|r| r["diagnostics"]
                .as_array()
                .is_some_and(|d| d.iter().any(|d| d["code"] == "noise_below_certified_range"))),
            "{name}: {results:?}"
        );
        let o = dpaudit(&[
            "account",
            "--event",
            &ev,
            "--accountant",
            "rdp",
            "--epsilon",
            "1",
            "--format",
            "json",
        ]);
        assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));
        let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
        for r in v["results"].as_array().unwrap() {
            assert_eq!(r["delta"].as_f64(), Some(1.0), "{name}: {r}");
        }
    }
}

fn verify_detail(file: &str) -> (i32, Value) {
    let dir = tempfile::tempdir().unwrap();
    let o = dpaudit(&["verify", file, "--out", dir.path().to_str().unwrap(), "-q"]);
    let code = o.status.code().unwrap();
    let detail = std::fs::read_to_string(dir.path().join("verify.json"))
        .unwrap_or_else(|e| panic!("{file}: exit {code}: {e}: {}", stderr(&o)));
    (code, serde_json::from_str(&detail).unwrap())
}

/// `verify` never says `holds` for a DP-RDM claim with σ = 5e-324 or a RAPID claim with noise
/// multiplier 5e-324 (both used to hold, the DP-RDM one printing a sound ε = 0 beside a lower
/// bound of 709.8); no `holds` anywhere in the record rests on a finite ε.
#[test]
fn verify_never_holds_for_a_noiseless_claim() {
    let dir = tempfile::tempdir().unwrap();
    let claims = write(
        dir.path(),
        "claims.toml",
        "schema_version = 1\ntitle = \"noiseless\"\n\n[[dp_rdm]]\nid = \"rdm\"\nsource = \"test\"\ndataset = \"x\"\n\
         n = 50000\nqueries = 10\nq = 0.01\nsigma = 5e-324\nk = 16\nlambda = 1.0\nepsilon = 10\ndelta = 2e-05\n\n\
         [[rapid]]\nid = \"rapid\"\nsource = \"test\"\ndataset = \"x\"\nn = 60000\nbatch_size = 64\n\
         noise_multiplier = 5e-324\nsteps = 1000\nepsilon = 10.0\ndelta = 1e-05\n",
    );
    let (code, v) = verify_detail(&claims);
    assert_eq!(code, 1, "{v}");
    let claims = v["claims"].as_array().unwrap();
    assert_eq!(claims.len(), 2);
    for c in claims {
        assert_ne!(c["verdict"], "holds", "{}", c["id"]);
        for i in c["interpretations"].as_array().unwrap() {
            assert_ne!(i["decision"]["verdict"], "holds", "{}: {}", c["id"], i["decision"]);
        }
    }
}

/// `train --dp` with noise multiplier 1e-160 never writes ε = 0 into its card or ledger.
#[test]
fn train_with_noiseless_dp_never_records_zero_epsilon() {
    let dir = tempfile::tempdir().unwrap();
    let stem = dir.path().join("m");
    let o = dpaudit(&[
        "train",
        "--hidden",
        "16",
        "--depth",
        "1",
        "--time-dim",
        "8",
        "--batch-size",
        "32",
        "--steps",
        "3",
        "--seed",
        "1",
        "--device",
        "cpu",
        "--quiet",
        "--dp",
        "--noise-multiplier",
        "1e-160",
        "--out",
        stem.to_str().unwrap(),
    ]);
    let code = o.status.code();
    if code == Some(2) {
        assert!(stderr(&o).contains("noise"), "{}", stderr(&o));
        return;
    }
    assert!(code == Some(0) || code == Some(1), "{}", stderr(&o));
    // The card states the ε of the run; the ledger holds the event (re-accounted: ∞).
    let text = std::fs::read_to_string(dir.path().join("m.toml")).unwrap();
    let v: toml::Value = toml::from_str(&text).unwrap();
    let mut eps = Vec::new();
    collect_key(&v, "epsilon", &mut eps);
    assert!(!eps.is_empty(), "{text}");
    for e in eps {
        assert!(e.is_infinite(), "card ε = {e}: {text}");
    }
    let ledger = dir.path().join("m.ledger.toml");
    let o = dpaudit(&[
        "account",
        "--event",
        ledger.to_str().unwrap(),
        "--accountant",
        "all",
        "--format",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    for r in v["results"].as_array().unwrap() {
        assert_eq!(r["epsilon"], "inf", "{r}");
    }
}

fn collect_key(v: &toml::Value, key: &str, out: &mut Vec<f64>) {
    match v {
        toml::Value::Table(t) => {
            for (k, x) in t {
                if k == key {
                    if let Some(f) = x.as_float().or_else(|| x.as_integer().map(|i| i as f64)) {
                        out.push(f);
                    }
                }
                collect_key(x, key, out);
            }
        }
        toml::Value::Array(a) => a.iter().for_each(|x| collect_key(x, key, out)),
        _ => {}
    }
}

/// `run dp-rdm` with σ = 1e-160 answers no query (the first would cost ε = ∞ > budget) instead
/// of answering 200 and reporting "epsilon spent = 0".
#[test]
fn dp_rdm_run_with_noiseless_sigma_answers_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let src = std::fs::read_to_string(root().join("fixtures/runs/dp-rdm-digits.toml")).unwrap();
    let src = src
        .replace(
            "../embeddings/",
            &format!("{}/", root().join("fixtures/embeddings").display()),
        )
        .replace("sigma = 0.25", "sigma = 1e-160");
    let cfg = write(dir.path(), "rdm.toml", &src);
    let out = dir.path().join("out");
    let o = dpaudit(&["run", "dp-rdm", &cfg, "--out", out.to_str().unwrap()]);
    if o.status.code() == Some(2) {
        assert!(stderr(&o).contains("sigma"), "{}", stderr(&o));
        return;
    }
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let run: Value = serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["run"]["answered"].as_u64(), Some(0), "{}", run["run"]);
    assert_eq!(run["run"]["refused"].as_u64(), Some(200), "{}", run["run"]);
}

/// Counts never saturate: 2⁶⁵ GDP steps (2⁶² × 8, nested: TOML integers stop at 2⁶³ − 1) are
/// refused naming the count (they used to give the ε of 2⁶⁴ − 1 steps, labelled exact);
/// 2⁶⁴ − 1 = (2³² − 1)(2³² + 1) steps are still accounted.
#[test]
fn step_counts_beyond_u64_are_refused_not_saturated() {
    let dir = tempfile::tempdir().unwrap();
    let nested = |outer: &str, inner: &str| {
        format!(
            "schema_version = 1\ndelta = 1e-5\n[event]\ntype = \"self_composed\"\ncount = {outer}\n[event.event]\n\
             type = \"self_composed\"\ncount = {inner}\n[event.event.event]\ntype = \"gaussian\"\nnoise_multiplier = 1e9\n"
        )
    };
    let big = write(dir.path(), "big.toml", &nested("4611686018427387904", "8"));
    let o = dpaudit(&["account", "--event", &big, "--accountant", "gdp"]);
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    assert!(stderr(&o).contains("count"), "{}", stderr(&o));
    let max = write(dir.path(), "max.toml", &nested("4294967295", "4294967297"));
    let o = dpaudit(&["account", "--event", &max, "--accountant", "gdp", "--format", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let mu = v["results"][0]["details"]["mu"].as_f64().unwrap();
    assert!(rel(mu, (u64::MAX as f64).sqrt() / 1e9) < 1e-12, "{mu}");
}

// ---------------------------------------------------------------------------------------------
// 2. Schedules equal to diffusers'.

/// Every row of fixtures/reference/diffusers_timesteps.csv (diffusers 0.42.1 `set_timesteps`,
/// T ∈ {1000, 4000}, every spacing, steps_offset 0 and 1, every step count with a tie): our
/// timesteps are exactly diffusers' (sha256 of the list, and the list itself where stored), and
/// the sampler analysis uses them or, where diffusers runs an out-of-range timestep (−1 from
/// numpy's arange length, T from steps_offset) or not S steps, refuses them.
#[test]
fn timesteps_equal_diffusers_on_every_fixture_row() {
    use dpaudit::diffusion::schedule::{ddim_timesteps, diffusers_timesteps, Spacing};
    use sha2::{Digest, Sha256};
    let mut rdr = csv::ReaderBuilder::new()
        .comment(Some(b'#'))
        .from_path(root().join("fixtures/reference/diffusers_timesteps.csv"))
        .unwrap();
    let (mut rows, mut ties, mut refused) = (0, 0, 0);
    for r in rdr.records() {
        let r = r.unwrap();
        let t: usize = r[0].parse().unwrap();
        let spacing = match &r[1] {
            "leading" => Spacing::Leading,
            "trailing" => Spacing::Trailing,
            "linspace" => Spacing::Linspace,
            other => panic!("{other}"),
        };
        let offset: usize = r[2].parse().unwrap();
        let s: usize = r[3].parse().unwrap();
        let n: usize = r[4].parse().unwrap();
        ties += usize::from(r[5].parse::<usize>().unwrap() > 0);
        let ours = diffusers_timesteps(t, s, spacing, offset);
        let joined = ours.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(" ");
        let at = format!("T = {t}, {spacing:?}, offset {offset}, S = {s}");
        if !r[9].is_empty() {
            assert_eq!(joined, &r[9], "{at}");
        }
        assert_eq!(ours.len(), n, "{at}");
        assert_eq!(ours[0].to_string(), &r[6], "{at}");
        assert_eq!(ours[n - 1].to_string(), &r[7], "{at}");
        let digest: String = Sha256::digest(joined.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(digest, &r[8], "{at}");
        let valid = n == s && ours.iter().all(|&k| k >= 0 && (k as usize) < t);
        match ddim_timesteps(t, s, spacing, offset) {
            Ok(v) => {
                assert!(valid, "{at}: accepted a schedule diffusers runs out of range");
                let mut want: Vec<usize> = ours.iter().map(|&k| k as usize).collect();
                want.reverse();
                assert_eq!(v, want, "{at}");
            }
            Err(e) => {
                assert!(!valid || s < 2, "{at}: refused a valid schedule: {e}");
                refused += 1;
            }
        }
        rows += 1;
    }
    assert!(
        rows > 5000 && ties > 2000 && refused > 600,
        "{rows} rows, {ties} with ties, {refused} refused"
    );
}

fn sampler_toml(schedule: &str, sampler: Option<&str>) -> String {
    let head = sampler.map(|s| format!("sampler = \"{s}\"\n")).unwrap_or_default();
    format!(
        "{head}{schedule}schema_version = 1\ndelta = 1e-5\n\n[privacy]\nclip_norm = 1.0\ndataset_size = 50000\nsamples = 1\n\n\
         [density]\nkind = \"constant\"\nbeta = 1.0\n"
    )
}

fn analyze_gdp(path: &str) -> (i32, String, String) {
    let o = dpaudit(&["analyze", path, "--accountant", "gdp", "--format", "json"]);
    (o.status.code().unwrap(), stdout(&o), stderr(&o))
}

/// A diffusers scheduler_config.json is analysed with ᾱ computed as diffusers computes it (float32
/// β and cumulative product, docs/diffusion.md), a native TOML with the float64 schedule: the two
/// agree to float32's precision, at most 7.2e-5 relative in μ, not bit for bit. A small ε moves more
/// than its μ (0.0300409 against 0.0300369, 1.4e-4, at 100 leading steps): ε is compared to 1e-3.
fn assert_f32_close(native: f64, scheduler: f64, at: &str) {
    let rel = (native - scheduler).abs() / native.abs().max(f64::MIN_POSITIVE);
    assert!(
        rel <= 1e-3,
        "{at}: native {native} / scheduler config {scheduler} ({rel:e} relative)"
    );
}

fn headline(json: &str) -> f64 {
    let v: Value = serde_json::from_str(json).unwrap();
    let r = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["accountant"] == "gdp")
        .unwrap_or_else(|| panic!("{v}"));
    r["epsilon"].as_f64().unwrap()
}

/// The same schedule through a diffusers scheduler_config.json and written natively gives the
/// same ε for every `sampler` value (and the same exit 2 naming `convention` when neither
/// `sampler` nor `convention` is given): the scheduler path used to ignore `sampler` and use
/// convention A (ε 0.328 against 2.040 for sampler = "ddpm"). Also with trailing spacing
/// (diffusers' ties) and steps_offset = 1.
#[test]
fn scheduler_config_and_native_toml_resolve_keys_the_same() {
    let dir = tempfile::tempdir().unwrap();
    for (spacing, offset, steps) in [("leading", 0, 100), ("trailing", 0, 80), ("leading", 1, 50)] {
        let json = write(
            dir.path(),
            &format!("sched-{spacing}-{offset}.json"),
            &format!(
                "{{\"_class_name\": \"DDPMScheduler\", \"beta_start\": 0.0001, \"beta_end\": 0.02, \"beta_schedule\": \
                 \"linear\", \"num_train_timesteps\": 1000, \"timestep_spacing\": \"{spacing}\", \"steps_offset\": {offset}}}"
            ),
        );
        let offset_line = if offset == 0 {
            String::new()
        } else {
            format!("steps_offset = {offset}\n")
        };
        let native_schedule = format!(
            "\n[schedule]\nkind = \"ddpm_linear\"\nbeta_start = 0.0001\nbeta_end = 0.02\ntimesteps = 1000\nlevels = {steps}\n\
             spacing = \"{spacing}\"\n{offset_line}\n"
        );
        let via_json = format!("scheduler_config = {json:?}\ninference_steps = {steps}\n");
        let mut seen = Vec::new();
        for sampler in [Some("ddim"), Some("ddpm"), Some("edm-heun"), Some("flow-euler"), None] {
            // A [schedule] table must follow the top-level keys: put it after them.
            let native = sampler_toml("", sampler) + &native_schedule;
            let native = write(dir.path(), "native.toml", &native);
            let sched = write(dir.path(), "sched.toml", &sampler_toml(&via_json, sampler));
            let (cn, on, en) = analyze_gdp(&native);
            let (cs, os, es) = analyze_gdp(&sched);
            let at = format!("{spacing} offset {offset} S = {steps}, sampler {sampler:?}");
            assert_eq!(cn, cs, "{at}: native {en} / scheduler {es}");
            match sampler {
                Some(_) => {
                    assert_eq!(cn, 0, "{at}: {en}");
                    let (a, b) = (headline(&on), headline(&os));
                    assert_f32_close(a, b, &at);
                    seen.push(a);
                }
                None => {
                    assert_eq!(cn, 2, "{at}");
                    assert!(
                        en.contains("convention") && es.contains("convention"),
                        "{at}: {en} / {es}"
                    );
                }
            }
        }
        // ddim/ddpm (convention B) differ from edm-heun/flow-euler (convention C).
        assert_eq!(seen[0], seen[1]);
        assert!((seen[0] - seen[2]).abs() > 1e-3 * seen[0], "{seen:?}");
    }
}

/// The case: T = 1000 linear β, 100 leading steps, sampler = "ddpm" through the shipped
/// scheduler_config.json is accounted with the ddpm sampler's convention (B, as natively), not
/// with convention A (which gave an ε about 6× smaller in the issue: 0.328 against 2.040).
#[test]
fn scheduler_config_with_sampler_ddpm_is_not_convention_a() {
    let dir = tempfile::tempdir().unwrap();
    let json = root().join("fixtures/samplers/diffusers/scheduler_config.json");
    let body = |extra: &str| {
        format!(
            "scheduler_config = {:?}\ninference_steps = 100\n{extra}schema_version = 1\ndelta = 1e-5\n[privacy]\n\
             clip_norm = 1.0\ndataset_size = 50000\nsamples = 1\n[density]\nkind = \"constant\"\nbeta = 1.0\n",
            json.to_str().unwrap()
        )
    };
    let ddpm = write(dir.path(), "ddpm.toml", &body("sampler = \"ddpm\"\n"));
    let a = write(dir.path(), "a.toml", &body("convention = \"A\"\n"));
    let b = write(dir.path(), "b.toml", &body("convention = \"B\"\n"));
    let (c1, o1, e1) = analyze_gdp(&ddpm);
    let (c2, o2, _) = analyze_gdp(&a);
    let (c3, o3, _) = analyze_gdp(&b);
    assert_eq!((c1, c2, c3), (0, 0, 0), "{e1}");
    assert_eq!(headline(&o1), headline(&o3));
    assert!(
        headline(&o1) > 2.0 * headline(&o2),
        "{} vs {}",
        headline(&o1),
        headline(&o2)
    );
}

/// An unknown key in a scheduler TOML is an error with its line and field, like a native one;
/// so are a TOML giving both scheduler_config and [schedule], and a missing schema_version.
#[test]
fn scheduler_toml_unknown_key_is_an_error_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let json = root().join("fixtures/samplers/diffusers/scheduler_config.json");
    let p = write(
        dir.path(),
        "s.toml",
        &format!(
            "scheduler_config = {:?}\ninference_steps = 20\nsampler = \"ddim\"\nschema_version = 1\n\
             [privacy]\ndataset_size = 1000\nclip_nrom = 2.0\n",
            json.to_str().unwrap()
        ),
    );
    let o = dpaudit(&["analyze", &p]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("clip_nrom") && e.contains("s.toml:7:"), "{e}");
    let p = write(
        dir.path(),
        "both.toml",
        &format!(
            "scheduler_config = {:?}\nsampler = \"ddim\"\nschema_version = 1\n[schedule]\nkind = \"edm\"\nsigma_min = 0.002\n\
             sigma_max = 80.0\nrho = 7.0\nlevels = 10\n[privacy]\ndataset_size = 1000\n",
            json.to_str().unwrap()
        ),
    );
    let o = dpaudit(&["analyze", &p]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("scheduler_config"), "{}", stderr(&o));
}

/// diffusers' trailing spacing of 61 out of 1000 steps runs 62 timesteps, the last one −1 (numpy's
/// float arange): a sampler config asking for it is refused naming `levels`, not silently shifted.
#[test]
fn schedules_diffusers_would_run_out_of_range_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "s.toml",
        &(sampler_toml("", Some("ddim"))
            + "\n[schedule]\nkind = \"ddpm_linear\"\nbeta_start = 0.0001\nbeta_end = 0.02\ntimesteps = 1000\nlevels = 61\nspacing = \"trailing\"\n"),
    );
    let o = dpaudit(&["analyze", &p, "--accountant", "gdp"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("levels") && stderr(&o).contains("down to -1"),
        "{}",
        stderr(&o)
    );
}

// ---------------------------------------------------------------------------------------------
// 5. Property: every sound ε is at least a proven lower bound, down to σ = 5e-324.

use dpaudit::accountants::sound::{lower_witnesses, sound_epsilon, Verdict};
use dpaudit::accountants::{AccountantKind, BoundKind, MIN_CERTIFIED_NOISE_MULTIPLIER};
use dpaudit::events::{DpEvent, Neighbouring};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, rng_seed: RngSeed::Fixed(0x4544_4745), failure_persistence: None, ..ProptestConfig::default() })]

    /// For σ log-uniform in [5e-324, 1e3], q log-uniform in [1e-4, 1] (q = 1 one time in four)
    /// and 1 ≤ T ≤ 2000: every sound ε of gdp, rdp and pld is ≥ the largest proven lower bound of
    /// the same mechanism (the worst-case pair's exact δ, or the threshold test's δ floor, which
    /// tends to the nearly blatant 1 − (1 − q)^T), ∞ below the certified noise range, and a claim
    /// just under the lower bound is never `holds`.
    #[test]
    fn sound_epsilon_is_never_below_a_proven_lower_bound(
        log_sigma in -323.3f64..3.0,
        log_q in -4.0f64..0.0,
        full in 0u8..4,
        steps in 1u64..2000,
    ) {
        let sigma = 10f64.powf(log_sigma).max(5e-324);
        let q = if full == 0 { 1.0 } else { 10f64.powf(log_q) };
        let delta = 1e-5;
        let event = DpEvent::dpsgd(sigma, q, steps);
        let nb = Neighbouring::AddRemove;
        let lower = lower_witnesses(&event, nb, delta)
            .iter()
            .filter(|e| e.kind == BoundKind::LowerBound)
            .map(|e| e.epsilon)
            .fold(0.0f64, f64::max);
        for kind in [AccountantKind::Gdp, AccountantKind::Rdp, AccountantKind::Pld] {
            let acc = kind.build();
            if acc.supports(&event, nb).is_err() {
                continue;
            }
            let r = acc.epsilon(&event, nb, delta).unwrap();
            prop_assert!(r.kind.is_sound() || r.kind == BoundKind::Estimate);
            prop_assert!(!r.epsilon.is_nan(), "{kind:?} σ = {sigma:e}: NaN");
            prop_assert!(r.epsilon >= lower, "{kind:?} σ = {sigma:e}, q = {q}, T = {steps}: ε = {} < lower bound {lower}", r.epsilon);
            if sigma < MIN_CERTIFIED_NOISE_MULTIPLIER {
                prop_assert!(r.epsilon.is_infinite(), "{kind:?} σ = {sigma:e}: ε = {}", r.epsilon);
            }
            // δ(ε) at ε = 0 is at least the nearly blatant floor of a sharp step.
            let d = acc.delta(&event, nb, 0.0).unwrap();
            prop_assert!(d.delta >= 0.0 && d.delta <= 1.0, "{kind:?}: δ = {}", d.delta);
        }
        let s = sound_epsilon(&event, nb, delta);
        if let Some(u) = &s.upper {
            prop_assert!(u.epsilon >= lower, "upper {} < lower {lower}", u.epsilon);
        }
        if lower > 0.0 {
            prop_assert_ne!(s.decide(lower * (1.0 - 1e-6)).verdict, Verdict::Holds);
        }
        if sigma < MIN_CERTIFIED_NOISE_MULTIPLIER {
            prop_assert!(s.upper.as_ref().is_none_or(|u| u.epsilon.is_infinite()));
            prop_assert_ne!(s.decide(1e300).verdict, Verdict::Holds);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 3. Trivially true claims hold, with their reason.

/// A DPAgg-TI claim with δ ≥ m/n holds (any release on m of n sampled records is (0, m/n)-DP),
/// with the `trivial_delta` evidence and a finding that says it guarantees nothing; the same
/// claim at δ just below m/n with a noise this small does not hold.
#[test]
fn dpagg_ti_claim_with_delta_above_the_rate_is_trivially_true() {
    let dir = tempfile::tempdir().unwrap();
    let claim = |delta: &str| {
        format!(
            "schema_version = 1\ntitle = \"t\"\n\n[[dpagg_ti]]\nid = \"trivial\"\nsource = \"test\"\ndataset = \"x\"\n\
             n = 10\nm = 5\nsigma = 0.001\nepsilon = 0.01\ndelta = {delta}\n"
        )
    };
    let (code, v) = verify_detail(&write(dir.path(), "t.toml", &claim("0.5")));
    let c = &v["claims"][0];
    assert_eq!(code, 0, "{c}");
    assert_eq!(c["verdict"], "holds", "{c}");
    assert_eq!(c["evidence"]["method"], "trivial_delta", "{c}");
    assert!(c["findings"].to_string().contains("trivially true"), "{c}");
    let (code, v) = verify_detail(&write(dir.path(), "u.toml", &claim("0.49")));
    assert_eq!(code, 1);
    assert_ne!(v["claims"][0]["verdict"], "holds", "{}", v["claims"][0]);
}

/// A `laplace` leaf in an event file: pld (the exact Laplace PLD) and rdp (Mironov
/// 2017 Prop. 6) give sound ε no larger than the pure composition k/b; gdp and clt refuse it
/// with a reason naming the Laplace mechanism; a Poisson-subsampled Laplace is accounted by the
/// pld (the exact subsampled Laplace PLD) and refused by the rdp with its reason.
#[test]
fn laplace_leaf_is_accounted_by_pld_and_rdp_and_refused_by_gdp_and_clt() {
    let dir = tempfile::tempdir().unwrap();
    let ev = write(
        dir.path(),
        "lap.toml",
        "schema_version = 1\ndelta = 1e-5\n[event]\ntype = \"self_composed\"\ncount = 3\n[event.event]\ntype = \"laplace\"\n\
         noise_multiplier = 2.0\n",
    );
    let o = dpaudit(&["account", "--event", &ev, "--accountant", "all", "--format", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let mut seen = Vec::new();
    for r in v["results"].as_array().unwrap() {
        let e = r["epsilon"].as_f64().unwrap();
        // Pure composition gives 3/b = 1.5; the PLD's grid (interval 1e-4) may add a little.
        assert!(e > 0.0 && e <= 1.5 + 1e-3, "{r}");
        assert_eq!(r["kind"], "upper_bound", "{r}");
        seen.push(r["accountant"].as_str().unwrap().to_string());
    }
    assert!(
        seen.contains(&"pld".to_string()) && seen.contains(&"rdp".to_string()),
        "{seen:?}"
    );
    let text = dpaudit(&["account", "--event", &ev, "--accountant", "all"]);
    let out = stdout(&text);
    assert!(out.contains("gdp  unsupported") && out.contains("Laplace"), "{out}");
    assert!(out.contains("clt  unsupported"), "{out}");
    let sampled = write(
        dir.path(),
        "lap-q.toml",
        "schema_version = 1\ndelta = 1e-5\n[event]\ntype = \"self_composed\"\ncount = 100\n[event.event]\n\
         type = \"poisson_sampled\"\nq = 0.01\n[event.event.event]\ntype = \"laplace\"\nnoise_multiplier = 1.0\n",
    );
    let o = dpaudit(&["account", "--event", &sampled, "--accountant", "all"]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert!(out.contains("rdp  unsupported") && out.contains("Laplace"), "{out}");
    assert!(out.contains("Headline") && out.contains("(pld"), "{out}");
}

/// Stable-Diffusion scheduler configs (issue 25 item 5): `scaled_linear` β with `steps_offset = 1`
/// and `leading` spacing, and `squaredcos_cap_v2` with `trailing`, analyse to the same per-step ε
/// as the schedule written natively (to float32 precision: ᾱ is computed as diffusers does).
#[test]
fn stable_diffusion_scheduler_configs_match_native_schedules() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "{\"_class_name\": \"DDIMScheduler\", \"beta_start\": 0.00085, \"beta_end\": 0.012, \"beta_schedule\": \
             \"scaled_linear\", \"num_train_timesteps\": 1000, \"timestep_spacing\": \"leading\", \"steps_offset\": 1, \
             \"prediction_type\": \"epsilon\"}",
            "[schedule]\nkind = \"ddpm_scaled_linear\"\nbeta_start = 0.00085\nbeta_end = 0.012\ntimesteps = 1000\n\
             levels = 50\nspacing = \"leading\"\nsteps_offset = 1\n",
        ),
        (
            "{\"_class_name\": \"DDPMScheduler\", \"beta_schedule\": \"squaredcos_cap_v2\", \"num_train_timesteps\": 1000, \
             \"timestep_spacing\": \"trailing\"}",
            "[schedule]\nkind = \"ddpm_cosine\"\ntimesteps = 1000\nlevels = 50\nspacing = \"trailing\"\n",
        ),
    ];
    for (i, (json, native)) in cases.iter().enumerate() {
        let j = write(dir.path(), &format!("s{i}.json"), json);
        let a = write(
            dir.path(),
            "a.toml",
            &(sampler_toml(
                &format!("scheduler_config = {j:?}\ninference_steps = 50\n"),
                Some("ddim"),
            )),
        );
        let b = write(dir.path(), "b.toml", &(sampler_toml("", Some("ddim")) + "\n" + native));
        let (ca, oa, ea) = analyze_gdp(&a);
        let (cb, ob, eb) = analyze_gdp(&b);
        assert_eq!((ca, cb), (0, 0), "case {i}: {ea} / {eb}");
        assert_f32_close(headline(&ob), headline(&oa), &format!("case {i}"));
    }
}

/// Under replace-one with Poisson sampling the PLD's headline rests on the clipped-sum pair, an
/// assumption the RDP bound does not make: the headline restates it ("under: …").
#[test]
fn replace_one_headline_restates_the_pld_assumption() {
    let o = dpaudit(&[
        "account",
        "--noise-multiplier",
        "2",
        "--sample-rate",
        "0.01",
        "--steps",
        "1000",
        "--delta",
        "1e-5",
        "--neighbouring",
        "replace-one",
    ]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    let head = out.lines().position(|l| l.starts_with("Headline")).expect("headline");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[head].contains("(pld"), "{out}");
    assert!(
        lines[head + 1].starts_with("  under:") && lines[head + 1].contains("clipped sum"),
        "{out}"
    );
}

/// `calibrate` finds what any sound accountant certifies: where the default pld finds no σ up to
/// 10⁶ (it used to stop with "unreachable even at σ = 1e6"), the rdp bound's σ is returned,
/// labelled rdp, with a warning saying why. Since the PLD grid follows the ε scale (docs/pld.md,
/// "Tiny ε") the PLD certifies this target itself (σ 72,505 against RDP's 77,233; dp_accounting
/// 0.6.0 at grid 1e-7 gives ε 0.00099970 at that σ): then its σ must be no larger than RDP's.
#[test]
fn calibrate_falls_back_to_any_accountant_that_certifies_the_target() {
    let run = |extra: &[&str]| -> (Value, String) {
        let mut args = vec![
            "calibrate",
            "--target-epsilon",
            "0.001",
            "--sample-rate",
            "0.5",
            "--steps",
            "1000",
            "--delta",
            "1e-10",
            "--format",
            "json",
        ];
        args.extend_from_slice(extra);
        let o = dpaudit(&args);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        (serde_json::from_str(&stdout(&o)).unwrap(), stderr(&o))
    };
    let (v, err) = run(&[]);
    let r = &v["results"][0];
    assert!(r["epsilon"].as_f64().unwrap() <= 0.001, "{r}");
    let (w, _) = run(&["--accountant", "rdp"]);
    let sigma = |v: &Value| -> f64 {
        let s = v.to_string();
        let i = s.find("\"noise_multiplier\":").expect("noise_multiplier") + "\"noise_multiplier\":".len();
        s[i..].split([',', '}']).next().unwrap().trim().parse().unwrap()
    };
    if r["accountant"] == "rdp" {
        assert!(err.contains("the rdp accountant"), "{err}");
        assert!(v.to_string().contains("calibration_fallback_accountant"), "{v}");
        // The same σ as calibrating with rdp directly.
        assert_eq!(w["results"][0]["epsilon"], r["epsilon"]);
    } else {
        assert_eq!(r["accountant"], "pld", "{r}");
        assert!(!v.to_string().contains("calibration_fallback_accountant"), "{v}");
        assert!(
            sigma(&v) <= sigma(&w) * (1.0 + 1e-9),
            "pld σ {} vs rdp σ {}",
            sigma(&v),
            sigma(&w)
        );
    }
}
