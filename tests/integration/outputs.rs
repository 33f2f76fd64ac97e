//! Integration tests: the one report contract and the output grammar, for every command through
//! the real binary. Every command's `--format json` validates against docs/schema/report.v2.json
//! and re-renders with `dpaudit report`; `--out DIR` is created when missing; existing outputs
//! are refused before any work without `--force`; writes are atomic (an injected disk-full
//! leaves nothing at the final path); `--junit` re-runs; `--help` lists exactly the formats
//! accepted; progress only on a terminal; closed pipes end quietly; floats without noise.

use super::common::{root, stderr, stdout};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Runs the real binary from the repository root with extra environment variables.
fn run_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dpaudit"));
    c.args(args).current_dir(root());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("spawn dpaudit")
}

fn run(args: &[&str]) -> Output {
    run_env(args, &[])
}

/// One fast, shipped-fixture invocation per command (without output flags). `{tmp}` is replaced
/// by a scratch folder (train writes a checkpoint stem there).
const COMMANDS: [(&str, &[&str]); 10] = [
    ("account", &["account", "--event", "fixtures/events/full_batch.toml"]),
    (
        "calibrate",
        &[
            "calibrate",
            "--target-epsilon",
            "2",
            "--steps",
            "10",
            "--delta",
            "1e-5",
            "--accountant",
            "gdp",
        ],
    ),
    (
        "check",
        &[
            "check",
            "fixtures/events/edm-fullbatch-sigmamin0.002.toml",
            "--max-epsilon",
            "8",
        ],
    ),
    (
        "analyze",
        &[
            "analyze",
            "fixtures/samplers/edm-cifar10-paper.toml",
            "--accountant",
            "gdp,clt",
        ],
    ),
    (
        "sweep",
        &[
            "sweep",
            "fixtures/samplers/edm-cifar10-paper.toml",
            "--sigma-min",
            "0.002..5",
            "--points",
            "4",
            "--log",
            "--max-epsilon",
            "50",
        ],
    ),
    ("verify", &["verify", "fixtures/claims/dpagg-ti.toml"]),
    ("run", &["run", "dpagg-ti", "fixtures/runs/dpagg-ti-digits.toml"]),
    (
        "mia",
        &[
            "mia",
            "--checkpoint",
            "models/digits-mlp.toml",
            "--attack",
            "loss",
            "--timesteps",
            "10",
            "--bootstrap",
            "20",
            "--noise-draws",
            "1",
            "--device",
            "cpu",
        ],
    ),
    (
        "train",
        &[
            "train",
            "--steps",
            "3",
            "--hidden",
            "8",
            "--depth",
            "1",
            "--time-dim",
            "8",
            "--device",
            "cpu",
            "--out",
            "{tmp}/m",
        ],
    ),
    ("model", &["model", "info", "fixtures/diffusers/unet-28-c1-attn"]),
];

fn args_for(cmd: &str, tmp: &Path) -> Vec<String> {
    let (_, a) = COMMANDS.iter().find(|(c, _)| *c == cmd).unwrap();
    a.iter()
        .map(|s| s.replace("{tmp}", &tmp.display().to_string()))
        .collect()
}

fn run_cmd(cmd: &str, tmp: &Path, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let mut a = args_for(cmd, tmp);
    a.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = a.iter().map(String::as_str).collect();
    run_env(&refs, env)
}

/// Exit 0 or 1 (1: a verdict failed), never 2 (usage/input error).
fn assert_ran(o: &Output, what: &str) {
    assert!(
        matches!(o.status.code(), Some(0) | Some(1)),
        "{what}: exit {:?}\n{}",
        o.status.code(),
        stderr(o)
    );
}

// ------------------------------------------------------------------ a small JSON Schema check

fn schema() -> serde_json::Value {
    let p = root().join("docs/schema/report.v2.json");
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

/// Validates `v` against the subset of JSON Schema 2020-12 the report schema uses: `type`,
/// `const`, `enum`, `oneOf`, `$ref` to `#/$defs/…`, `properties`, `required`,
/// `additionalProperties` (false or a schema), `items`, `minimum` and the two `pattern`s.
/// Returns the first violation with its JSON path.
fn validate(
    v: &serde_json::Value,
    s: &serde_json::Value,
    root_schema: &serde_json::Value,
    path: &str,
) -> Result<(), String> {
    use serde_json::Value;
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        let name = r
            .strip_prefix("#/$defs/")
            .unwrap_or_else(|| panic!("unsupported $ref {r}"));
        return validate(v, &root_schema["$defs"][name], root_schema, path);
    }
    if let Some(c) = s.get("const") {
        if v != c {
            return Err(format!("{path}: expected {c}, got {v}"));
        }
    }
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        if !e.contains(v) {
            return Err(format!("{path}: {v} is not one of {e:?}"));
        }
    }
    if let Some(alts) = s.get("oneOf").and_then(Value::as_array) {
        let ok = alts
            .iter()
            .filter(|a| validate(v, a, root_schema, path).is_ok())
            .count();
        if ok != 1 {
            let why: Vec<String> = alts
                .iter()
                .filter_map(|a| validate(v, a, root_schema, path).err())
                .collect();
            return Err(format!(
                "{path}: matches {ok} of {} alternatives ({})",
                alts.len(),
                why.join("; ")
            ));
        }
    }
    if let Some(t) = s.get("type").and_then(Value::as_str) {
        let ok = match t {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "number" => v.is_number(),
            "integer" => v.is_i64() || v.is_u64(),
            "boolean" => v.is_boolean(),
            "null" => v.is_null(),
            other => panic!("unsupported type {other}"),
        };
        if !ok {
            return Err(format!("{path}: expected {t}, got {v}"));
        }
    }
    if let (Some(min), Some(x)) = (s.get("minimum").and_then(Value::as_f64), v.as_f64()) {
        if x < min {
            return Err(format!("{path}: {x} < minimum {min}"));
        }
    }
    if let (Some(p), Some(x)) = (s.get("pattern").and_then(Value::as_str), v.as_str()) {
        let ok = match p {
            "^[a-z0-9_-]{1,64}$" => {
                (1..=64).contains(&x.len())
                    && x.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
            }
            "^[0-9a-f]{64}$" => x.len() == 64 && x.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)),
            other => panic!("unsupported pattern {other}"),
        };
        if !ok {
            return Err(format!("{path}: `{x}` does not match {p}"));
        }
    }
    if let Some(obj) = v.as_object() {
        if let Some(req) = s.get("required").and_then(Value::as_array) {
            for r in req {
                let r = r.as_str().unwrap();
                if !obj.contains_key(r) {
                    return Err(format!("{path}: missing required `{r}`"));
                }
            }
        }
        let props = s.get("properties").and_then(Value::as_object);
        for (k, x) in obj {
            match props.and_then(|p| p.get(k)) {
                Some(ps) => validate(x, ps, root_schema, &format!("{path}.{k}"))?,
                None => match s.get("additionalProperties") {
                    Some(Value::Bool(false)) => return Err(format!("{path}: unexpected field `{k}`")),
                    Some(ap @ Value::Object(_)) => validate(x, ap, root_schema, &format!("{path}.{k}"))?,
                    _ => {}
                },
            }
        }
    }
    if let (Some(arr), Some(items)) = (v.as_array(), s.get("items")) {
        for (i, x) in arr.iter().enumerate() {
            validate(x, items, root_schema, &format!("{path}[{i}]"))?;
        }
    }
    Ok(())
}

#[test]
fn schema_validator_rejects_what_the_schema_forbids() {
    // The validator itself must be able to fail, or the contract test below proves nothing.
    let s = schema();
    let mut good = serde_json::json!({
        "schema_version": 2, "title": "t", "command": "dpaudit x",
        "tool": {"name": "dpaudit", "version": "0"},
        "results": [{"accountant": "gdp", "epsilon": "inf", "delta": 1e-5, "kind": "exact"}]
    });
    validate(&good, &s, &s, "$").unwrap();
    good["results"][0]["kind"] = serde_json::json!("guess");
    assert!(validate(&good, &s, &s, "$").unwrap_err().contains("results[0].kind"));
    good["results"][0]["kind"] = serde_json::json!("exact");
    good["schema_version"] = serde_json::json!(1);
    assert!(validate(&good, &s, &s, "$").is_err());
    good["schema_version"] = serde_json::json!(2);
    good["surprise"] = serde_json::json!(true);
    assert!(validate(&good, &s, &s, "$").unwrap_err().contains("surprise"));
}

/// Every command's `--format json` is one report (schema_version 2) that validates against the
/// shipped schema, opens with a conclusion, and renders with `dpaudit report` to md, html, csv.
#[test]
fn every_command_writes_one_report_that_validates_and_rerenders() {
    let s = schema();
    let tmp = tempfile::tempdir().unwrap();
    for (cmd, _) in COMMANDS {
        let o = run_cmd(cmd, tmp.path(), &["--format", "json", "--force"], &[]);
        assert_ran(&o, cmd);
        let v: serde_json::Value =
            serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{cmd}: not JSON: {e}\n{}", stdout(&o)));
        validate(&v, &s, &s, "$").unwrap_or_else(|e| panic!("{cmd}: {e}"));
        assert_eq!(v["audit"], cmd, "{cmd}");
        assert!(
            !v["conclusion"]["guarantee"].as_str().unwrap_or_default().is_empty(),
            "{cmd}: no conclusion"
        );
        let f = tmp.path().join(format!("{cmd}.json"));
        std::fs::write(&f, &o.stdout).unwrap();
        for fmt in ["md", "html", "csv", "text"] {
            let r = run(&["report", f.to_str().unwrap(), "--format", fmt]);
            assert_eq!(r.status.code(), Some(0), "{cmd} → {fmt}: {}", stderr(&r));
            assert!(!r.stdout.is_empty(), "{cmd} → {fmt}: empty");
            if fmt == "md" {
                assert!(stdout(&r).contains("## Conclusion"), "{cmd}: {}", stdout(&r));
            }
        }
    }
}

/// `--help` lists the formats; every listed format is accepted by every command.
#[test]
fn format_listing_equals_formats_accepted() {
    let tmp = tempfile::tempdir().unwrap();
    for (cmd, args) in COMMANDS {
        let sub: Vec<&str> = match cmd {
            "run" | "model" => args[..2].to_vec(),
            _ => vec![args[0]],
        };
        let mut help = sub.clone();
        help.push("-h");
        let h = stdout(&run(&help));
        let line = h
            .lines()
            .skip_while(|l| !l.contains("--format <FORMAT>"))
            .find(|l| l.contains("possible values:"))
            .unwrap_or_else(|| panic!("{cmd}: --format lists no values:\n{h}"));
        let listed: Vec<String> = line
            .split("possible values:")
            .nth(1)
            .unwrap()
            .trim()
            .trim_end_matches(']')
            .split(',')
            .map(|s| s.trim().to_string())
            .collect();
        assert_eq!(listed, ["text", "json", "csv", "md", "html"], "{cmd}");
        for f in &listed {
            let o = run_cmd(cmd, tmp.path(), &["--format", f, "--force"], &[]);
            assert_ran(&o, &format!("{cmd} --format {f}"));
            assert!(!o.stdout.is_empty(), "{cmd} --format {f}: nothing on stdout");
        }
        let o = run_cmd(cmd, tmp.path(), &["--format", "pdf"], &[]);
        assert_eq!(o.status.code(), Some(2), "{cmd}");
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|r| {
            r.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// `--out DIR` into a folder that does not exist yet creates it, and the Markdown written there
/// links only images that were written beside it.
#[test]
fn out_into_a_missing_folder_creates_it_and_markdown_images_exist() {
    let tmp = tempfile::tempdir().unwrap();
    for (cmd, _) in COMMANDS {
        if cmd == "train" {
            continue; // --out is a checkpoint stem (tested below)
        }
        let dir = tmp.path().join("new").join(cmd);
        let o = run_cmd(cmd, tmp.path(), &["--out", dir.to_str().unwrap(), "-q"], &[]);
        assert_ran(&o, cmd);
        let files = names(&dir);
        for f in ["report.json", "report.md", "report.html"] {
            assert!(files.contains(&f.to_string()), "{cmd}: {files:?}");
        }
        let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
        for link in md.split("](").skip(1) {
            let target = link.split(')').next().unwrap();
            assert!(
                dir.join(target).is_file(),
                "{cmd}: report.md links {target}, not written"
            );
        }
    }
    // train: the stem's folder is created.
    let stem = tmp.path().join("models-new").join("m");
    let mut a = args_for("train", tmp.path());
    let n = a.len();
    a[n - 1] = stem.display().to_string();
    let refs: Vec<&str> = a.iter().map(String::as_str).collect();
    let o = run(&refs);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stem.with_extension("toml").is_file());
    // Markdown on stdout stands alone: plots inline, no links to files that were never written.
    let o = run(&["analyze", "fixtures/samplers/edm-cifar10-paper.toml", "--format", "md"]);
    let md = stdout(&o);
    assert!(md.contains("](data:image/svg+xml;base64,"), "{md}");
    assert!(!md.contains("](plot-"), "{md}");
}

/// Existing outputs are refused (exit 2, naming the file and --force) before any work: with a
/// missing input, the refusal still comes first; the old file is untouched. --force replaces it.
#[test]
fn existing_outputs_are_refused_before_any_work_without_force() {
    let tmp = tempfile::tempdir().unwrap();
    for (cmd, _) in COMMANDS {
        let dir = tmp.path().join(format!("refuse-{cmd}"));
        std::fs::create_dir_all(&dir).unwrap();
        let (flag, target) = if cmd == "train" {
            ("--out", dir.join("m"))
        } else {
            ("--out", dir.clone())
        };
        let old = if cmd == "train" {
            dir.join("m.toml")
        } else {
            dir.join("report.json")
        };
        std::fs::write(&old, "old").unwrap();
        let mut a = args_for(cmd, tmp.path());
        if cmd == "train" {
            let n = a.len();
            a.truncate(n - 2);
        }
        a.extend([flag.to_string(), target.display().to_string()]);
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        let o = run(&refs);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {}", stderr(&o));
        assert!(stderr(&o).contains("--force"), "{cmd}: {}", stderr(&o));
        assert_eq!(std::fs::read_to_string(&old).unwrap(), "old", "{cmd}");
        // Before any work: a nonexistent input is not even read.
        let mut bad = a.clone();
        for x in bad.iter_mut() {
            if x.starts_with("fixtures/") || x.starts_with("models/") {
                *x = "fixtures/does-not-exist.toml".into();
            }
        }
        let refs: Vec<&str> = bad.iter().map(String::as_str).collect();
        let o = run(&refs);
        assert_eq!(o.status.code(), Some(2), "{cmd}");
        assert!(
            stderr(&o).contains("--force") && !stderr(&o).contains("does-not-exist"),
            "{cmd}: {}",
            stderr(&o)
        );
        // --force replaces it.
        a.push("--force".into());
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        let o = run(&refs);
        assert_ran(&o, cmd);
        assert_ne!(std::fs::read_to_string(&old).unwrap_or_default(), "old", "{cmd}");
    }
    // The command's own files count as outputs too.
    let dir = tmp.path().join("run-own");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("ledger.toml"), "mine").unwrap();
    let o = run(&[
        "run",
        "dpagg-ti",
        "fixtures/runs/dpagg-ti-digits.toml",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(dir.join("ledger.toml")).unwrap(), "mine");
}

fn no_temp_files(dir: &Path) {
    let left: Vec<String> = names(dir).into_iter().filter(|n| n.starts_with(".dpaudit-")).collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

/// A write that fails half-way (an injected "No space left on device") exits 2 naming the file
/// and leaves nothing at the final path and no temporary file, for every command that writes.
#[test]
fn a_failed_write_leaves_no_torn_file_for_every_command() {
    let tmp = tempfile::tempdir().unwrap();
    for (cmd, _) in COMMANDS {
        let (extra, target): (Vec<String>, PathBuf) = if cmd == "train" {
            let stem = tmp.path().join("torn-train").join("m");
            (vec![], stem.with_extension("toml"))
        } else {
            let dir = tmp.path().join(format!("torn-{cmd}"));
            (vec!["--out".into(), dir.display().to_string()], dir.join("report.json"))
        };
        let mut a = args_for(cmd, tmp.path());
        if cmd == "train" {
            let n = a.len();
            a[n - 1] = target.with_extension("").display().to_string();
        }
        a.extend(extra);
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        let name = target.file_name().unwrap().to_str().unwrap();
        let o = run_env(&refs, &[("DPAUDIT_INJECT_WRITE_FAILURE", name)]);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(name) && stderr(&o).contains("No space left on device"),
            "{cmd}: {}",
            stderr(&o)
        );
        assert!(!target.exists(), "{cmd}: torn {} left behind", target.display());
        no_temp_files(target.parent().unwrap());
    }
    // --junit, --roc-out and --make-split are written the same way.
    let j = tmp.path().join("j.xml");
    let o = run_env(
        &[
            "check",
            "fixtures/events/dpsgd.toml",
            "--max-epsilon",
            "8",
            "--junit",
            j.to_str().unwrap(),
        ],
        &[("DPAUDIT_INJECT_WRITE_FAILURE", "j.xml")],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(!j.exists());
    let split = tmp.path().join("split.toml");
    let o = run_env(
        &["train", "--make-split", split.to_str().unwrap()],
        &[("DPAUDIT_INJECT_WRITE_FAILURE", "split.toml")],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(!split.exists());
    no_temp_files(tmp.path());
}

/// A really full disk (a 64 KiB tmpfs): the error names the file, nothing torn is left. Needs
/// permission to mount; skipped with a reason otherwise.
#[test]
fn a_full_disk_leaves_no_torn_file() {
    let mnt = tempfile::tempdir().unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(mnt.path())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN)");
        return;
    }
    let dir = mnt.path().join("out");
    let o = run(&[
        "check",
        "fixtures/events/edm-fullbatch-sigmamin0.002.toml",
        "--max-epsilon",
        "8",
        "--out",
        dir.to_str().unwrap(),
    ]);
    let left = names(&dir);
    // Whatever reached its final name is complete: a report.json there parses.
    let json = std::fs::read(dir.join("report.json")).ok();
    let _ = Command::new("umount").arg(mnt.path()).status();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("No space left on device"), "{}", stderr(&o));
    assert!(!left.iter().any(|n| n.starts_with(".dpaudit-")), "{left:?}");
    if let Some(j) = json {
        dpaudit::report::from_json(&j).expect("report.json on the full disk is complete");
    }
}

/// `--junit FILE` is replaced on a CI re-run (no --force needed) and the budget is still
/// checked: the second run's verdict (over budget, exit 1) is what the file says.
#[test]
fn junit_rerun_overwrites_and_still_checks_the_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let j = tmp.path().join("ci").join("check.xml");
    let edm = "fixtures/events/edm-fullbatch-sigmamin0.002.toml";
    let o = run(&["check", edm, "--max-epsilon", "8", "--junit", j.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!std::fs::read_to_string(&j).unwrap().contains("<failure"));
    let o = run(&["check", edm, "--max-epsilon", "1", "--junit", j.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(std::fs::read_to_string(&j).unwrap().contains("<failure"));
    no_temp_files(j.parent().unwrap());
}

/// Runs `cmd` under a pseudo-terminal (util-linux `script`), returning what the terminal saw.
fn on_terminal(cmd: &str, env: &[(&str, &str)]) -> Option<String> {
    if Command::new("script").arg("--version").output().is_err() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "`script` (util-linux) is required under CI=true"
        );
        eprintln!("skipped: `script` (util-linux) is not installed");
        return None;
    }
    let mut c = Command::new("script");
    c.args(["-qec", cmd, "/dev/null"]).current_dir(root());
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    Some(String::from_utf8_lossy(&o.stdout).into_owned())
}

const SLOW_SWEEP: &str =
    "sweep fixtures/samplers/edm-cifar10-paper.toml --sigma-min 0.002..5 --points 8 --log --subsample-rate 1,0.5 --accountant gdp,clt,rdp --format text";

/// Progress (with an ETA) is drawn on a terminal for work over a second, never when stderr is
/// a pipe, and not with -q.
#[test]
fn progress_with_eta_on_a_terminal_and_off_when_piped_or_quiet() {
    let bin = env!("CARGO_BIN_EXE_dpaudit");
    let Some(tty) = on_terminal(&format!("{bin} {SLOW_SWEEP} >/dev/null"), &[]) else {
        return;
    };
    assert!(tty.contains("ETA"), "no progress on a terminal: {tty:?}");
    let quiet = on_terminal(&format!("{bin} {SLOW_SWEEP} -q >/dev/null"), &[]).unwrap();
    assert!(!quiet.contains("ETA"), "-q still draws progress: {quiet:?}");
    let args: Vec<&str> = SLOW_SWEEP.split(' ').collect();
    let o = run(&args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // Piped: never a bar (no carriage returns); progress, if the work is long, as plain lines.
    let err = stderr(&o);
    assert!(!err.contains('\r') && !err.contains('\x1b'), "{err}");
    assert!(
        err.lines()
            .filter(|l| l.contains("ETA"))
            .all(|l| l.starts_with("sweep: ")),
        "{err}"
    );
}

/// When stderr is not a terminal, long work writes a plain line every interval (here 0.02 s
/// through `DPAUDIT_PROGRESS_INTERVAL`) in the unit of work, with the ETA unknown (`?`) until
/// a unit is done; `-q` writes none.
#[test]
fn progress_lines_when_piped_count_the_unit_of_work() {
    let args = ["verify", "fixtures/claims/dp-sgd.toml"];
    let o = run_env(&args, &[("DPAUDIT_PROGRESS_INTERVAL", "0.02")]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("verify: ")).collect();
    assert!(!lines.is_empty(), "no progress line in a pipe: {err:?}");
    for l in &lines {
        assert!(l.contains("/6 claims (") && l.contains("elapsed, ETA "), "{l}");
        if l.starts_with("verify: 0/") {
            assert!(l.contains("ETA ?"), "an ETA before any claim is done: {l}");
        }
    }
    assert!(!err.contains('\r'), "{err:?}");
    let mut q = args.to_vec();
    q.push("-q");
    let o = run_env(&q, &[("DPAUDIT_PROGRESS_INTERVAL", "0.02")]);
    assert!(!stderr(&o).contains("verify: "), "{}", stderr(&o));
}

/// Colour only on a terminal, and never with NO_COLOR.
#[test]
fn verdict_colour_follows_no_color() {
    fn has_sgr(s: &str) -> bool {
        s.split("\x1b[").skip(1).any(|rest| {
            let params: String = rest.chars().take_while(|c| c.is_ascii_digit() || *c == ';').collect();
            rest[params.len()..].starts_with('m')
        })
    }
    let bin = env!("CARGO_BIN_EXE_dpaudit");
    let cmd = format!("{bin} check fixtures/events/edm-fullbatch-sigmamin0.002.toml --max-epsilon 8");
    let Some(tty) = on_terminal(&cmd, &[]) else { return };
    assert!(tty.contains("\x1b[1;32mPASS"), "{tty:?}");
    let plain = on_terminal(&cmd, &[("NO_COLOR", "1")]).unwrap();
    // NO_COLOR removes colour (SGR sequences); the progress bar may still clear its line.
    assert!(plain.contains("PASS") && !has_sgr(&plain), "{plain:?}");
    let piped = run(&[
        "check",
        "fixtures/events/edm-fullbatch-sigmamin0.002.toml",
        "--max-epsilon",
        "8",
    ]);
    assert!(!stdout(&piped).contains('\x1b'));
}

/// A reader that goes away (`dpaudit … | head -0`) ends the command quietly with its own exit
/// code, no panic, no "Broken pipe" message.
#[test]
fn a_closed_pipe_ends_quietly() {
    for args in [
        vec![
            "sweep",
            "fixtures/samplers/edm-cifar10-paper.toml",
            "--sigma-min",
            "0.002..5",
            "--points",
            "50",
        ],
        vec![
            "check",
            "fixtures/events/edm-fullbatch-sigmamin0.002.toml",
            "--max-epsilon",
            "1",
            "--format",
            "md",
        ],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_dpaudit"))
            .args(&args)
            .current_dir(root())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{args:?}: {err}"
        );
        let want = if args[0] == "check" { 1 } else { 0 };
        assert_eq!(o.status.code(), Some(want), "{args:?}: {err}");
    }
}

/// Numbers read as given: a linear grid 0.1..1 prints 0.2, 0.3, … (not 0.30000000000000004) in
/// CSV, text and JSON tables.
#[test]
fn floats_print_without_arithmetic_noise() {
    let base = [
        "sweep",
        "fixtures/samplers/edm-cifar10-paper.toml",
        "--sigma-min",
        "0.1..1",
        "--points",
        "10",
    ];
    for fmt in ["csv", "text", "json", "md"] {
        let mut a = base.to_vec();
        a.extend(["--format", fmt, "--accountant", "gdp"]);
        let o = run(&a);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let s = stdout(&o);
        for noisy in ["0000000000", "9999999999"] {
            assert!(!s.contains(noisy), "{fmt}: arithmetic noise in output:\n{s}");
        }
        assert!(s.contains("0.3") && s.contains("0.7"), "{fmt}: {s}");
    }
}

/// Headless Chromium, or `None` (with the reason printed) when it is not installed; under
/// `CI=true` a missing browser fails the test.
fn chromium() -> Option<PathBuf> {
    let found = ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|name| {
            std::env::var_os("PATH")
                .iter()
                .flat_map(std::env::split_paths)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        });
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "headless Chromium is required under CI=true: apt-get install -y chromium"
        );
        eprintln!("skipped: no chromium on PATH (apt-get install -y chromium)");
    }
    found
}

/// Screenshots `html` (a file) at 1200×2000 and returns (width, height, RGB pixels).
fn screenshot(browser: &Path, html: &Path) -> (u32, u32, Vec<(u8, u8, u8)>) {
    let profile = tempfile::tempdir().unwrap();
    let shot = html.with_extension("png");
    let o = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            "--disable-sync",
            "--hide-scrollbars",
            "--window-size=1200,3200",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", html.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(shot.is_file(), "no screenshot: {}", String::from_utf8_lossy(&o.stderr));
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let ch = info.color_type.samples();
    let px = buf[..info.buffer_size()]
        .chunks(ch)
        .map(|c| (c[0], c[1], c[2]))
        .collect();
    (info.width, info.height, px)
}

/// One HTML report per command renders in headless Chromium: the page is not blank, the
/// conclusion box (blue rule) is drawn at the top, and pages with plots show coloured lines.
#[test]
fn html_report_of_every_command_renders_in_chromium() {
    let Some(browser) = chromium() else { return };
    let tmp = tempfile::tempdir().unwrap();
    for (cmd, _) in COMMANDS {
        let o = run_cmd(cmd, tmp.path(), &["--format", "html", "--force"], &[]);
        assert_ran(&o, cmd);
        let html = tmp.path().join(format!("{cmd}.html"));
        std::fs::write(&html, &o.stdout).unwrap();
        let (w, h, px) = screenshot(&browser, &html);
        assert_eq!((w, h), (1200, 3200), "{cmd}");
        let near = |p: &(u8, u8, u8), c: (i32, i32, i32)| {
            (p.0 as i32 - c.0).abs() < 30 && (p.1 as i32 - c.1).abs() < 30 && (p.2 as i32 - c.2).abs() < 30
        };
        let non_white = px
            .iter()
            .filter(|p| (p.0 as u32 + p.1 as u32 + p.2 as u32) < 720)
            .count();
        assert!(non_white * 100 > px.len(), "{cmd}: page looks blank");
        // The conclusion's left rule (#0969da) sits in the first screen.
        let top = &px[..(w as usize * 700)];
        let rule = top.iter().filter(|p| near(p, (9, 105, 218))).count();
        assert!(rule > 200, "{cmd}: no conclusion box at the top ({rule} blue pixels)");
        if stdout(&o).contains("<svg") {
            let plot = px
                .iter()
                .filter(|p| near(p, (0, 114, 178)) || near(p, (213, 94, 0)) || near(p, (0, 158, 115)))
                .count();
            assert!(plot > 300, "{cmd}: plot lines missing ({plot} coloured pixels)");
        }
        if let Ok(dir) = std::env::var("DPAUDIT_KEEP_SCREENSHOT") {
            std::fs::copy(html.with_extension("png"), Path::new(&dir).join(format!("{cmd}.png"))).unwrap();
        }
    }
}
