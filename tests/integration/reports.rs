//! Integration tests: reports. Golden outputs of every exporter on shipped fixtures
//! (`fixtures/golden/<case>/`; regenerate with `DPAUDIT_BLESS=1 cargo test --test integration
//! reports`), strict JSON read-back, self-contained HTML rendered by headless Chromium, and safe
//! output writing (`--out`, `--force`, read-only and missing directories).

use super::common::{bless, dpaudit, in_ci, read_csv, root, stderr, stdout};
use dpaudit::accountants::{AccountantKind, BoundKind};
use dpaudit::report::{self, plot, Cell, Column, ExportFormat, Report, Series, Table};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const CASES: [&str; 2] = ["check-edm-fullbatch", "sweep-clt-edm"];

fn case_dir(case: &str) -> PathBuf {
    root().join("fixtures/golden").join(case)
}

/// ε versus the subsampling rate p for the EDM sampler of fixtures/events/edm-fullbatch-…
/// (σ_min 0.002, C = √3072, convention A), straight from fixtures/reference/clt_edm.csv:
/// the Dong–Roth–Su CLT estimate and the exact PLD ε (both computed with scipy/dp_accounting,
/// see fixtures/reference/SOURCE.md). Exercises the sweep table and the ε-vs-axis plot with an
/// estimate drawn dashed beside a bound.
fn sweep_report() -> Report {
    let rows: Vec<_> = read_csv("fixtures/reference/clt_edm.csv")
        .into_iter()
        .filter(|r| r["sigma_min"] == "0.002" && r["C_label"] == "sqrt3072" && r["convention"] == "A_t_i")
        .collect();
    let mut pts: Vec<(f64, f64, f64, f64)> = rows
        .iter()
        .map(|r| {
            (
                r["p"].parse().unwrap(),
                r["clt_mu"].parse().unwrap(),
                r["clt_eps_delta_1e-5"].parse().unwrap(),
                r["exact_pld_eps_delta_1e-5"].parse().unwrap(),
            )
        })
        .collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut r = Report::new(
        "Subsampled EDM sampler: ε versus sampling rate (reference numbers)",
        "built by tests/integration/reports.rs::sweep_report from fixtures/reference/clt_edm.csv",
    );
    r.delta = Some(1e-5);
    r.assumptions.neighbouring = Some(dpaudit::events::Neighbouring::AddRemove);
    r.assumptions.sampling = Some("Poisson, rate p per step (swept)".into());
    r.assumptions.step_convention = Some("A: t = t_i, Δt = t_i − t_{i+1} (49 steps)".into());
    r.assumptions.other.push(report::Fact::new(
        "schedule",
        "EDM/Karras, σ_max 80, ρ 7, 50 levels, σ_min 0.002; |D| = 50000, β = 1, C = √3072",
    ));
    r.add_input("reference table", Path::new("fixtures/reference/clt_edm.csv"))
        .unwrap();
    // Paths relative to the repository root, as a user would give them.
    r.inputs[0].path = "fixtures/reference/clt_edm.csv".into();
    r.warn(
        "clt_below_exact",
        "the CLT estimate is below the exact PLD ε at every rate here: it is not a bound",
        false,
    );
    r.tables.push(Table {
        id: "sweep".into(),
        title: "ε at δ = 1e-5 per sampling rate".into(),
        columns: vec![
            Column::with_unit("p", "sampling rate"),
            Column::with_unit("clt_mu", "GDP μ"),
            Column::with_unit("clt_epsilon", "nats, estimate"),
            Column::with_unit("pld_epsilon", "nats, exact"),
        ],
        rows: pts
            .iter()
            .map(|&(p, mu, c, e)| vec![Cell::Num(p), Cell::Num(mu), Cell::Num(c), Cell::Num(e)])
            .collect(),
        note: Some("Source: fixtures/reference/clt_edm.csv (scipy + dp_accounting 0.6.0).".into()),
    });
    let xs: Vec<f64> = pts.iter().map(|p| p.0).collect();
    r.plots.push(plot::epsilon_vs_axis(
        "epsilon_vs_rate",
        "sampling rate p",
        "fraction of |D|",
        1e-5,
        vec![
            Series::for_accountant(
                AccountantKind::Pld,
                BoundKind::UpperBound,
                xs.clone(),
                pts.iter().map(|p| p.3).collect(),
            )
            .with_markers(),
            Series::for_accountant(
                AccountantKind::Clt,
                BoundKind::Estimate,
                xs.clone(),
                pts.iter().map(|p| p.2).collect(),
            )
            .with_markers(),
        ],
    ));
    let mu_half = pts.iter().find(|p| p.0 == 0.5).unwrap().1;
    r.plots.push(plot::tradeoff(vec![plot::gdp_tradeoff_series(
        &format!("clt (estimate) at p = 0.5, μ = {}", report::export::fmt_num(mu_half)),
        mu_half,
        BoundKind::Estimate,
    )]));
    // Every report carries its plain-language conclusion (derived from its content).
    r.conclude();
    r
}

/// The JSON input of a case; with DPAUDIT_BLESS=1 it is regenerated first.
fn case_json(case: &str) -> Vec<u8> {
    let path = case_dir(case).join("report.json");
    if bless() {
        std::fs::create_dir_all(case_dir(case)).unwrap();
        let bytes = match case {
            "check-edm-fullbatch" => {
                let o = dpaudit(&[
                    "check",
                    "fixtures/events/edm-fullbatch-sigmamin0.002.toml",
                    "--max-epsilon",
                    "8",
                    "--format",
                    "json",
                ]);
                assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
                o.stdout
            }
            "sweep-clt-edm" => report::to_json(&sweep_report()).unwrap().into_bytes(),
            _ => unreachable!(),
        };
        std::fs::write(&path, bytes).unwrap();
    }
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (run with DPAUDIT_BLESS=1)", path.display()))
}

fn first_difference(a: &str, b: &str) -> String {
    for (i, (x, y)) in a.lines().zip(b.lines()).enumerate() {
        if x != y {
            return format!("line {}:\n  got:      {x}\n  expected: {y}", i + 1);
        }
    }
    format!("lengths differ: {} vs {} lines", a.lines().count(), b.lines().count())
}

fn golden(case: &str, file: &str, got: &[u8]) {
    let path = case_dir(case).join(file);
    if bless() {
        std::fs::write(&path, got).unwrap();
        return;
    }
    let want = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (run with DPAUDIT_BLESS=1)", path.display()));
    if got != want.as_slice() {
        panic!(
            "{} differs from the golden file ({}); if intended, regenerate with DPAUDIT_BLESS=1",
            path.display(),
            first_difference(&String::from_utf8_lossy(got), &String::from_utf8_lossy(&want))
        );
    }
}

#[test]
fn golden_exporters_on_shipped_fixtures() {
    for case in CASES {
        let json = case_json(case);
        let r = report::from_json(&json).unwrap_or_else(|e| panic!("{case}: {e}"));
        // JSON → model → JSON is byte-identical.
        let back = report::to_json(&r).unwrap();
        assert!(
            back.as_bytes() == json.as_slice(),
            "{case}: JSON round trip: {}",
            first_difference(&back, &String::from_utf8_lossy(&json))
        );
        for (fmt, file) in [
            (ExportFormat::Md, "report.md"),
            (ExportFormat::Html, "report.html"),
            (ExportFormat::Csv, "report.csv"),
        ] {
            golden(case, file, &report::export(&r, fmt).unwrap());
        }
    }
}

/// The shipped `check` report (fixtures/golden/check-edm-fullbatch/report.json) against scipy:
/// its per-step μ_t are fixtures/reference/edm_perstep_sigmamin0.002.csv (convention A,
/// C = √3072), its final cumulative μ and the verdict's ε are the edm_fullbatch.csv row.
#[test]
fn check_golden_matches_reference_tables() {
    let r: serde_json::Value = serde_json::from_slice(&case_json("check-edm-fullbatch")).unwrap();
    let steps = r["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "steps")
        .unwrap();
    let rows = steps["rows"].as_array().unwrap();
    let want: Vec<f64> = read_csv("fixtures/reference/edm_perstep_sigmamin0.002.csv")
        .iter()
        .filter(|r| r["convention"] == "A_t_i")
        .map(|r| r["mu_step(C=sqrt3072)"].parse().unwrap())
        .collect();
    assert_eq!(rows.len(), want.len());
    for (row, w) in rows.iter().zip(&want) {
        let mu = row[1].as_f64().unwrap();
        assert!((mu - w).abs() <= 1e-9 * w, "{row}: μ_t {mu} vs {w}");
    }
    let fb = read_csv("fixtures/reference/edm_fullbatch.csv")
        .into_iter()
        .find(|r| r["sigma_min"] == "0.002" && r["C_label"] == "sqrt3072" && r["convention"] == "A_t_i")
        .unwrap();
    let total: f64 = fb["total_mu"].parse().unwrap();
    let eps: f64 = fb["eps_delta_1e-5"].parse().unwrap();
    let last = rows.last().unwrap();
    assert!((last[2].as_f64().unwrap() - total).abs() <= 1e-9 * total, "{last}");
    let v = &r["verdicts"][0];
    assert!((v["epsilon"].as_f64().unwrap() - eps).abs() <= 1e-9 * eps, "{v}");
    assert!((last[3].as_f64().unwrap() - eps).abs() <= 1e-9 * eps, "{last}");
    assert_eq!(v["bound"], "exact");
}

#[test]
fn sweep_fixture_matches_its_reference_source() {
    // The shipped sweep report is exactly what the reference CSV gives (no hand edits).
    let shipped = report::from_json(&case_json("sweep-clt-edm")).unwrap();
    let mut built = sweep_report();
    built.tool = shipped.tool.clone();
    let (a, b) = (report::to_json(&built).unwrap(), report::to_json(&shipped).unwrap());
    assert!(a == b, "{}", first_difference(&a, &b));
    assert!(built == shipped);
}

#[test]
fn report_command_reproduces_golden_markdown_and_html() {
    for case in CASES {
        let input = format!("fixtures/golden/{case}/report.json");
        for (fmt, file) in [
            ("md", "report.md"),
            ("html", "report.html"),
            ("csv", "report.csv"),
            ("json", "report.json"),
        ] {
            let o = dpaudit(&["report", &input, "--format", fmt]);
            assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
            let want = std::fs::read(case_dir(case).join(file)).unwrap();
            assert!(
                o.stdout == want,
                "{case} {fmt}: {}",
                first_difference(&stdout(&o), &String::from_utf8_lossy(&want))
            );
        }
    }
}

#[test]
fn json_is_read_back_strictly() {
    let d = tempfile::tempdir().unwrap();
    let json = std::fs::read_to_string(case_dir("check-edm-fullbatch").join("report.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
    v["verdicts"][0]["surprise"] = serde_json::json!(true);
    let p = d.path().join("r.json");
    std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    let o = dpaudit(&["report", p.to_str().unwrap(), "--format", "md"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unknown field `surprise`"), "{}", stderr(&o));
    assert!(stderr(&o).contains("r.json"), "{}", stderr(&o));

    let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
    v["schema_version"] = serde_json::json!(99);
    std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
    let o = dpaudit(&["report", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("schema_version 99"), "{}", stderr(&o));
}

/// No URL, no external resource, no script: the page renders offline exactly as shipped.
fn assert_self_contained(html: &str, what: &str) {
    let lower = html.to_ascii_lowercase();
    for needle in [
        "http://", "https://", "src=", "href=", "url(", "@import", "<script", "<link", "<iframe", "<img", "xlink",
    ] {
        assert!(!lower.contains(needle), "{what} contains `{needle}`");
    }
}

#[test]
fn html_has_no_external_references_and_inlines_every_plot() {
    for case in CASES {
        let r = report::from_json(&case_json(case)).unwrap();
        let html = report::to_html(&r).unwrap();
        assert_self_contained(&html, case);
        assert_eq!(html.matches("<svg").count(), r.plots.len(), "{case}");
        assert!(!r.plots.is_empty());
    }
}

/// The headless browser on PATH, if any.
fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|name| {
            std::env::var_os("PATH")
                .iter()
                .flat_map(std::env::split_paths)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
}

/// Renders the HTML report in headless Chromium and checks the screenshot: the page is not
/// blank and the plots (coloured lines from the report's palette) are drawn.
#[test]
fn html_report_renders_in_headless_chromium() {
    let Some(browser) = chromium() else {
        // Under CI=true (.ci/run installs Debian's `chromium`) a missing browser is a failure.
        assert!(
            !in_ci(),
            "CI=true but no `chromium` on PATH: .ci/run must install it (apt-get install -y chromium)"
        );
        eprintln!(
            "SKIPPED html_report_renders_in_headless_chromium: no `chromium`, `chromium-browser` or \
`google-chrome` on PATH (install Debian's `chromium` to run it; under CI=true this fails instead)"
        );
        return;
    };
    let r = report::from_json(&case_json("check-edm-fullbatch")).unwrap();
    let d = tempfile::tempdir().unwrap();
    let html = d.path().join("report.html");
    std::fs::write(&html, report::to_html(&r).unwrap()).unwrap();
    let profile = tempfile::tempdir().unwrap();
    let shot = d.path().join("shot.png");
    let mut child = std::process::Command::new(&browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--screenshot={}", shot.display()))
        .arg("--window-size=1200,6000")
        .arg(format!("file://{}", html.display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", browser.display()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium did not finish within 120 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        shot.is_file(),
        "chromium wrote no screenshot: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    if let Ok(dir) = std::env::var("DPAUDIT_KEEP_SCREENSHOT") {
        std::fs::copy(&shot, Path::new(&dir).join("report-screenshot.png")).unwrap();
    }
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (1200, 6000));
    let channels = info.color_type.samples();
    assert!(channels >= 3, "{:?}", info.color_type);
    let px = |x: u32, y: u32| -> (u8, u8, u8) {
        let i = ((y * info.width + x) as usize) * channels;
        (buf[i], buf[i + 1], buf[i + 2])
    };
    let (mut non_white, mut plot_blue, mut plot_orange) = (0usize, 0usize, 0usize);
    let mut colours = BTreeSet::new();
    for y in 0..info.height {
        for x in 0..info.width {
            let (r, g, b) = px(x, y);
            colours.insert((r, g, b));
            if (r as u32 + g as u32 + b as u32) < 720 {
                non_white += 1;
            }
            let near = |c: (i32, i32, i32)| {
                (r as i32 - c.0).abs() < 40 && (g as i32 - c.1).abs() < 40 && (b as i32 - c.2).abs() < 40
            };
            if near((0, 114, 178)) {
                plot_blue += 1;
            }
            if near((213, 94, 0)) {
                plot_orange += 1;
            }
        }
    }
    let total = (info.width * info.height) as usize;
    assert!(
        non_white * 100 > total,
        "page looks blank: {non_white} of {total} pixels not white"
    );
    assert!(colours.len() > 200, "only {} distinct colours", colours.len());
    // Plot lines: per-step μ, cumulative μ (blue), cumulative ε (orange).
    assert!(plot_blue > 1500, "plot lines missing: {plot_blue} blue pixels");
    assert!(plot_orange > 300, "plot lines missing: {plot_orange} orange pixels");
}

fn listing(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn out_dir_writes_all_formats_with_stable_names_and_needs_force_to_overwrite() {
    let d = tempfile::tempdir().unwrap();
    let input = "fixtures/golden/check-edm-fullbatch/report.json";
    let out = d.path().to_str().unwrap();
    let o = dpaudit(&["report", input, "--out", out, "--quiet"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r = report::from_json(&std::fs::read(root().join(input)).unwrap()).unwrap();
    let mut expected: BTreeSet<String> = [
        // The set's manifest (every member with its SHA-256: a mixed set is refused).
        ".dpaudit-manifest.json",
        "report.json",
        "report.md",
        "report.html",
        "report-results.csv",
        "report-verdicts.csv",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    for t in &r.tables {
        expected.insert(format!("report-{}.csv", t.id));
    }
    for p in &r.plots {
        expected.insert(format!("plot-{}.svg", p.id));
        expected.insert(format!("plot-{}.png", p.id));
    }
    assert_eq!(listing(d.path()), expected);
    // The Markdown in --out links the plot files beside it (stdout's Markdown inlines them).
    let md = std::fs::read_to_string(d.path().join("report.md")).unwrap();
    for p in &r.plots {
        let link = format!("](plot-{}.svg)", p.id);
        assert!(md.contains(&link), "report.md lacks {link}");
    }
    // PNG plots are real PNGs.
    let png = std::fs::read(d.path().join("plot-tradeoff.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");

    // A second run refuses to overwrite and changes nothing.
    std::fs::write(d.path().join("report.md"), "edited").unwrap();
    let o = dpaudit(&["report", input, "--out", out]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("pass --force"), "{}", stderr(&o));
    assert_eq!(std::fs::read(d.path().join("report.md")).unwrap(), b"edited");
    assert_eq!(listing(d.path()), expected, "no temporary files left behind");
    let o = dpaudit(&["report", input, "--out", out, "--force"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(d.path().join("report.md")).unwrap(),
        md,
        "--force rewrites the same report"
    );
}

#[test]
fn missing_output_directory_is_created() {
    let d = tempfile::tempdir().unwrap();
    let missing = d.path().join("missing").join("deeper");
    let input = "fixtures/golden/check-edm-fullbatch/report.json";
    let o = dpaudit(&["report", input, "--out", missing.to_str().unwrap(), "-q"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(missing.join("report.html").is_file());
    let file = d.path().join("other").join("r.html");
    let o = dpaudit(&["report", input, "--format", "html", "--output", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(file.is_file());
}

/// A directory nobody may write into. chmod 0555 is enough for ordinary users; root ignores
/// permission bits, so then sysfs (which refuses new files even to root) stands in.
fn read_only_dir(tmp: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let d = tmp.join("ro");
    std::fs::create_dir(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o555)).unwrap();
    if std::fs::write(d.join("probe"), "x").is_err() {
        return d;
    }
    std::fs::remove_file(d.join("probe")).unwrap();
    let sys = PathBuf::from("/sys");
    assert!(
        std::fs::write(sys.join("dpaudit-probe"), "x").is_err(),
        "running as root and /sys is writable: no read-only directory available"
    );
    sys
}

#[test]
fn read_only_output_directory_fails_clearly_and_leaves_no_partial_file() {
    let d = tempfile::tempdir().unwrap();
    let ro = read_only_dir(d.path());
    let before = listing(&ro);
    let input = "fixtures/golden/check-edm-fullbatch/report.json";
    let o = dpaudit(&["report", input, "--out", ro.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("is not writable"), "{}", stderr(&o));
    assert!(stderr(&o).contains(ro.to_str().unwrap()), "{}", stderr(&o));
    let o = dpaudit(&[
        "report",
        input,
        "--format",
        "html",
        "--output",
        ro.join("report.html").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("is not writable"), "{}", stderr(&o));
    assert_eq!(listing(&ro), before, "files appeared in the read-only directory");
    // Let the tempdir clean up.
    use std::os::unix::fs::PermissionsExt;
    if ro.starts_with(d.path()) {
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

#[test]
fn report_help_shows_a_worked_example() {
    let o = dpaudit(&["report", "--help"]);
    assert_eq!(o.status.code(), Some(0));
    let h = stdout(&o);
    assert!(
        h.contains("Examples:") && h.contains("dpaudit report result.json --format html"),
        "{h}"
    );
}
