//! Integration tests: the command blocks of README.md and docs/*.md run through the real binary,
//! so the documentation cannot drift from what the tool does.
//!
//! Markers (in the fence's info string, which Markdown renderers ignore after the language):
//!
//! * ```` ```sh runnable ```` — every command in the block runs with `sh -c` in a scratch
//!   directory that links the repository's `fixtures/`, `models/`, `reports/` and `docs/`, with
//!   the `dpaudit` under test first on `PATH`. Lines ending in `\` continue; lines starting with
//!   `#` are comments. A command must start with `dpaudit`, must not panic, and must exit 0, or
//!   the code its trailing `# exit N` comment names.
//! * ```` ```text output ```` or ```` ```json output ```` right after a runnable block (prose
//!   in between is fine) — a sample of what the block's last command prints on stdout:
//!   - `json`: every key of the sample must be in the output with a matching value (objects are
//!     matched key by key, a key `"..."` is ignored; each sample array element must match some
//!     output element; a string `"..."` matches anything and one ending in `...` matches by
//!     prefix);
//!   - `text`: every sample line must appear in the output, in order (a line `...` is skipped);
//!   - numbers match when they agree to the digits shown (|output − sample| ≤ half a unit in
//!     the sample's last digit), everything else exactly (runs of spaces count as one).

use super::common::root;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One runnable command.
#[derive(Debug)]
struct Cmd {
    line: usize,
    text: String,
    exit: i32,
}

/// A runnable block and the output sample that follows it, if any.
#[derive(Debug)]
struct Block {
    file: String,
    cmds: Vec<Cmd>,
    output: Option<(String, usize, String)>, // (kind, line, text)
}

/// Every Markdown file the tool documents itself in.
fn doc_files() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

fn parse_commands(file: &str, first_line: usize, body: &[&str]) -> Vec<Cmd> {
    let mut cmds = Vec::new();
    let mut cur = String::new();
    let mut start = 0;
    for (k, raw) in body.iter().enumerate() {
        let l = raw.trim();
        if cur.is_empty() && (l.is_empty() || l.starts_with('#')) {
            continue;
        }
        if cur.is_empty() {
            start = first_line + k;
        }
        if let Some(stripped) = l.strip_suffix('\\') {
            cur.push_str(stripped.trim_end());
            cur.push(' ');
            continue;
        }
        cur.push_str(l);
        let mut text = std::mem::take(&mut cur);
        let mut exit = 0;
        if let Some(pos) = text.rfind("# exit ") {
            exit = text[pos + 7..]
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("{file}:{start}: bad `# exit N` in {text}"));
            text.truncate(pos);
        }
        let text = text.trim().to_string();
        assert!(
            text.starts_with("dpaudit "),
            "{file}:{start}: a runnable command must start with `dpaudit`: {text}"
        );
        cmds.push(Cmd {
            line: start,
            text,
            exit,
        });
    }
    assert!(cur.is_empty(), "{file}: runnable block ends inside a continued line");
    cmds
}

/// The runnable blocks of one Markdown file.
fn blocks(path: &Path) -> Vec<Block> {
    let file = path.strip_prefix(root()).unwrap().display().to_string();
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out: Vec<Block> = Vec::new();
    let mut last_fence_was_runnable = false;
    let mut i = 0;
    while i < lines.len() {
        let t = lines[i].trim_start();
        if let Some(info) = t.strip_prefix("```") {
            let info: Vec<&str> = info.split_whitespace().collect();
            let open = i + 1; // 1-based line of the fence
            let mut j = i + 1;
            while j < lines.len() && !lines[j].trim_start().starts_with("```") {
                j += 1;
            }
            assert!(j < lines.len(), "{file}:{open}: unclosed code fence");
            let body = &lines[i + 1..j];
            if info.contains(&"runnable") {
                out.push(Block {
                    file: file.clone(),
                    cmds: parse_commands(&file, open + 1, body),
                    output: None,
                });
                last_fence_was_runnable = true;
            } else if info.contains(&"output") {
                assert!(
                    last_fence_was_runnable,
                    "{file}:{open}: an output block must follow a runnable block"
                );
                let kind = info.first().copied().unwrap_or("text").to_string();
                assert!(kind == "json" || kind == "text", "{file}:{open}: output kind {kind}");
                let b = out.last_mut().unwrap();
                assert!(
                    b.output.is_none(),
                    "{file}:{open}: two output blocks for one runnable block"
                );
                b.output = Some((kind, open, body.join("\n")));
                last_fence_was_runnable = false;
            } else {
                last_fence_was_runnable = false;
            }
            i = j + 1;
        } else {
            i += 1;
        }
    }
    out
}

/// A scratch directory that looks like the repository root to the documented commands.
fn scratch() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for name in ["fixtures", "models", "reports", "docs"] {
        std::os::unix::fs::symlink(root().join(name), d.path().join(name)).unwrap();
    }
    d
}

/// Runs `cmd` with `sh -c`; returns (exit code, stdout, stderr).
fn run(dir: &Path, cmd: &str) -> (Option<i32>, String, String) {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_dpaudit"));
    let path = std::env::join_paths(
        std::iter::once(bin.parent().unwrap().to_path_buf())
            .chain(std::env::var_os("PATH").iter().flat_map(std::env::split_paths)),
    )
    .unwrap();
    let out_file = dir.join(".stdout");
    let err_file = dir.join(".stderr");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .current_dir(dir)
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_file).unwrap())
        .stderr(std::fs::File::create(&err_file).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(600);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("`{cmd}` did not finish within 600 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let read = |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap()).into_owned();
    (status.code(), read(&out_file), read(&err_file))
}

/// Half a unit in the last digit of `x` as written by `{}` (shortest round trip).
fn shown_tolerance(x: f64) -> f64 {
    let s = format!("{}", x.abs());
    let (mantissa, exp) = match s.split_once(['e', 'E']) {
        Some((m, e)) => (m.to_string(), e.parse::<i32>().unwrap()),
        None => (s.clone(), 0),
    };
    let decimals = mantissa.split_once('.').map_or(0, |(_, d)| d.len()) as i32;
    0.5 * 10f64.powi(exp - decimals)
}

fn num_matches(got: f64, want: f64) -> bool {
    got == want || (got - want).abs() <= shown_tolerance(want) * (1.0 + 1e-12)
}

/// Does `got` contain everything in the sample `want`? (See the module docs.)
fn json_matches(got: &Value, want: &Value, at: &str, why: &mut String) -> bool {
    match (want, got) {
        (Value::String(w), _) if w == "..." => true,
        (Value::String(w), Value::String(g)) if w.ends_with("...") => {
            let ok = g.starts_with(w.trim_end_matches("...").trim_end());
            if !ok {
                *why = format!("{at}: `{g}` does not start with `{w}`");
            }
            ok
        }
        (Value::Object(w), Value::Object(g)) => {
            w.iter()
                .filter(|(k, _)| k.as_str() != "...")
                .all(|(k, wv)| match g.get(k) {
                    Some(gv) => json_matches(gv, wv, &format!("{at}.{k}"), why),
                    None => {
                        *why = format!("{at}: no key `{k}` in the output");
                        false
                    }
                })
        }
        (Value::Array(w), Value::Array(g)) => w.iter().enumerate().all(|(i, wv)| {
            let found = g
                .iter()
                .any(|gv| json_matches(gv, wv, &format!("{at}[{i}]"), &mut String::new()));
            if !found {
                *why = format!("{at}[{i}]: no output element matches {wv}");
            }
            found
        }),
        (Value::Number(w), Value::Number(g)) => {
            let ok = num_matches(g.as_f64().unwrap(), w.as_f64().unwrap());
            if !ok {
                *why = format!("{at}: output {g}, documented {w}");
            }
            ok
        }
        _ => {
            let ok = got == want;
            if !ok {
                *why = format!("{at}: output {got}, documented {want}");
            }
            ok
        }
    }
}

/// Splits a line into alternating text and number tokens.
fn tokens(line: &str) -> Vec<(bool, String)> {
    let b = line.as_bytes();
    let mut out: Vec<(bool, String)> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts_num = b[i].is_ascii_digit()
            || (b[i] == b'-'
                && i + 1 < b.len()
                && b[i + 1].is_ascii_digit()
                && (i == 0 || !b[i - 1].is_ascii_alphanumeric()));
        if starts_num {
            let mut j = i + 1;
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            if j + 1 < b.len() && b[j] == b'.' && b[j + 1].is_ascii_digit() {
                j += 1;
                while j < b.len() && b[j].is_ascii_digit() {
                    j += 1;
                }
            }
            if j + 1 < b.len() && (b[j] == b'e' || b[j] == b'E') {
                let mut k = j + 1;
                if k < b.len() && (b[k] == b'-' || b[k] == b'+') {
                    k += 1;
                }
                if k < b.len() && b[k].is_ascii_digit() {
                    while k < b.len() && b[k].is_ascii_digit() {
                        k += 1;
                    }
                    j = k;
                }
            }
            out.push((true, line[i..j].to_string()));
            i = j;
        } else {
            let mut j = i + 1;
            while j < b.len() && !b[j].is_ascii_digit() && b[j] != b'-' {
                j += 1;
            }
            // Stop before a '-' only when it starts a number.
            let text = line[i..j].split_whitespace().collect::<Vec<_>>().join(" ");
            match out.last_mut() {
                Some((false, t)) => {
                    t.push_str(&line[i..j]);
                    *t = t.split_whitespace().collect::<Vec<_>>().join(" ");
                }
                _ => out.push((false, text)),
            }
            i = j;
        }
    }
    out
}

fn line_matches(got: &str, want: &str) -> bool {
    let (g, w) = (tokens(got), tokens(want));
    g.len() == w.len()
        && g.iter().zip(&w).all(|((gn, gt), (wn, wt))| match (gn, wn) {
            (true, true) => {
                let (gv, wv): (f64, f64) = (gt.parse().unwrap(), wt.parse().unwrap());
                // Tolerance from the text as written (keeps trailing zeros: "0.50" → 0.005).
                let decimals = wt
                    .split(['e', 'E'])
                    .next()
                    .unwrap()
                    .split_once('.')
                    .map_or(0, |(_, d)| d.len()) as i32;
                let exp: i32 = wt.split_once(['e', 'E']).map_or(0, |(_, e)| e.parse().unwrap());
                gv == wv || (gv - wv).abs() <= 0.5 * 10f64.powi(exp - decimals) * (1.0 + 1e-12)
            }
            (false, false) => gt.trim() == wt.trim(),
            _ => false,
        })
}

fn check_output(b: &Block, kind: &str, at: usize, sample: &str, stdout: &str) {
    let last = &b.cmds.last().unwrap().text;
    match kind {
        "json" => {
            let want: Value = serde_json::from_str(sample)
                .unwrap_or_else(|e| panic!("{}:{at}: the documented JSON does not parse: {e}", b.file));
            let got: Value = serde_json::from_str(stdout)
                .unwrap_or_else(|e| panic!("{}:{at}: `{last}` printed no JSON ({e}):\n{stdout}", b.file));
            let mut why = String::new();
            assert!(
                json_matches(&got, &want, "$", &mut why),
                "{}:{at}: the documented output of `{last}` has drifted: {why}\n--- actual ---\n{stdout}",
                b.file
            );
        }
        _ => {
            let mut out = stdout.lines();
            for w in sample.lines().filter(|l| !l.trim().is_empty() && l.trim() != "...") {
                assert!(
                    out.any(|g| line_matches(g, w)),
                    "{}:{at}: the documented output of `{last}` has drifted: no line (in order) matches\n  {w}\n--- actual ---\n{stdout}",
                    b.file
                );
            }
        }
    }
}

/// Every runnable block of README.md and docs/*.md runs as documented and prints what its
/// output sample shows.
#[test]
fn documented_commands_run_as_documented() {
    let all: Vec<Block> = doc_files().iter().flat_map(|p| blocks(p)).collect();
    let n_cmds: usize = all.iter().map(|b| b.cmds.len()).sum();
    // The README's examples and at least one block in each of these guides are runnable.
    for f in [
        "README.md",
        "docs/accounting.md",
        "docs/diffusion.md",
        "docs/reports.md",
        "docs/attacks.md",
    ] {
        assert!(all.iter().any(|b| b.file == f), "{f} has no runnable block");
    }
    assert!(all.iter().any(|b| b.output.is_some()), "no output sample is checked");
    let mut ran = 0;
    for b in &all {
        let dir = scratch();
        let mut last_stdout = String::new();
        for c in &b.cmds {
            let (code, out, err) = run(dir.path(), &c.text);
            assert!(
                !err.contains("panicked"),
                "{}:{}: `{}` panicked:\n{err}",
                b.file,
                c.line,
                c.text
            );
            assert_eq!(
                code,
                Some(c.exit),
                "{}:{}: `{}` exited {code:?}, documented {} (mark other codes with `# exit N`)\nstderr:\n{err}",
                b.file,
                c.line,
                c.text,
                c.exit
            );
            last_stdout = out;
            ran += 1;
        }
        if let Some((kind, at, sample)) = &b.output {
            check_output(b, kind, *at, sample, &last_stdout);
        }
    }
    assert_eq!(ran, n_cmds);
    eprintln!("ran {ran} documented commands from {} runnable blocks", all.len());
}

/// The checker itself: a drifted number, a missing key and a wrong exit code are caught.
#[test]
fn doc_checker_catches_drift() {
    let sample: Value =
        serde_json::from_str(r#"{"results": [{"accountant": "pld", "epsilon": 2.9}], "...": 0}"#).unwrap();
    let good: Value = serde_json::from_str(
        r#"{"results": [{"accountant": "rdp", "epsilon": 3.1}, {"accountant": "pld", "epsilon": 2.94}]}"#,
    )
    .unwrap();
    let drift: Value = serde_json::from_str(r#"{"results": [{"accountant": "pld", "epsilon": 2.216}]}"#).unwrap();
    let mut why = String::new();
    assert!(json_matches(&good, &sample, "$", &mut why), "{why}");
    assert!(!json_matches(&drift, &sample, "$", &mut why));
    assert!(why.contains("no output element matches"), "{why}");
    let missing: Value = serde_json::from_str(r#"{"other": 1}"#).unwrap();
    assert!(!json_matches(&missing, &sample, "$", &mut why));
    assert!(line_matches("gdp  ε = 2.5487 (exact)", "gdp ε = 2.549 (exact)"));
    assert!(!line_matches("gdp  ε = 2.5587 (exact)", "gdp ε = 2.549 (exact)"));
    assert!(!line_matches("rdp  ε = 2.549 (exact)", "gdp ε = 2.549 (exact)"));
    assert!(line_matches("δ = 1e-5, μ = -0.25", "δ = 1e-5, μ = -0.250"));
    let cmds = parse_commands(
        "x.md",
        1,
        &["# a comment", "dpaudit check a.toml \\", "  --max-epsilon 1   # exit 1"],
    );
    assert_eq!(cmds.len(), 1);
    assert_eq!(cmds[0].exit, 1);
    assert_eq!(cmds[0].text, "dpaudit check a.toml --max-epsilon 1");
    let dir = scratch();
    let (code, _, _) = run(
        dir.path(),
        "dpaudit check fixtures/events/dpsgd-mnist-sigma0.8.toml --max-epsilon 0.01",
    );
    assert_eq!(code, Some(1), "a documented `# exit 0` would be caught");
}
