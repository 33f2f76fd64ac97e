//! Integration tests: what a sweep's report shows, read back from its files: the plot (one line
//! per accountant and value of the other axes, x increasing, read from the SVG), the
//! conclusion's region against the report's own table, and σ_min on a DDPM schedule.

use super::common::{dpaudit, stderr};
use serde_json::Value;

/// Runs `sweep` with `--out DIR` and returns the report and the plot's SVG.
fn sweep_out(args: &[&str]) -> (Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    let mut a = vec!["sweep"];
    a.extend(args);
    a.extend(["--out", &d, "-q"]);
    let o = dpaudit(&a);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{args:?}: {}", stderr(&o));
    let rep: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("report.json")).unwrap()).unwrap();
    let id = rep["plots"][0]["id"].as_str().expect("a sweep plot").to_string();
    let svg = std::fs::read_to_string(dir.path().join(format!("plot-{id}.svg"))).unwrap();
    (rep, svg)
}

/// An attribute of an SVG element's text.
fn attr<'a>(el: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let i = el.find(&key)? + key.len();
    el[i..].split('"').next()
}

/// The lines of the plot area, read back from the SVG: per stroke colour, the points of its
/// open polylines (closed ones are markers) in document order, up to the legend box.
fn svg_lines(svg: &str) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut lines: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for el in svg.split('<').skip(1) {
        if el.starts_with("rect") && attr(el, "opacity") == Some("0.85") {
            break; // the legend's background: the legend's samples follow
        }
        if !el.starts_with("polyline") {
            continue;
        }
        let (Some(stroke), Some(points)) = (attr(el, "stroke"), attr(el, "points")) else {
            continue;
        };
        let pts: Vec<(f64, f64)> = points
            .split_whitespace()
            .map(|p| {
                let (x, y) = p.split_once(',').unwrap();
                (x.parse().unwrap(), y.parse().unwrap())
            })
            .collect();
        if pts.len() < 2 || pts.first() == pts.last() || stroke == "#5A5A5A" || stroke == "#000000" {
            continue; // a marker, the budget line or an axis
        }
        match lines.iter_mut().find(|l| l.0 == stroke) {
            Some(l) => l.1.extend(pts),
            None => lines.push((stroke.to_string(), pts)),
        }
    }
    lines
}

/// A report table's rows as column → cell maps.
fn table(rep: &Value, id: &str) -> Vec<std::collections::HashMap<String, Value>> {
    let t = rep["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == id)
        .unwrap();
    let cols: Vec<String> = t["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().or(c.as_str()).unwrap().to_string())
        .collect();
    t["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            cols.iter()
                .cloned()
                .zip(r.as_array().unwrap().iter().cloned())
                .collect()
        })
        .collect()
}

/// `x` as the report prints it (six significant digits).
fn sig6(x: f64) -> String {
    let v: f64 = format!("{x:.5e}").parse().unwrap();
    format!("{v}")
}

#[test]
fn two_axis_sweep_draws_one_increasing_line_per_accountant_and_rate() {
    let (rep, svg) = sweep_out(&[
        "fixtures/samplers/edm-cifar10-paper.toml",
        "--sigma-min",
        "0.01..1",
        "--points",
        "6",
        "--log",
        "--subsample-rate",
        "1,0.1,0.01",
        "--accountant",
        "gdp,rdp",
        "--max-epsilon",
        "10",
    ]);
    let plot = &rep["plots"][0];
    assert_eq!(
        plot["x"]["label"], "σ_min",
        "x is the axis given --points: {}",
        plot["x"]
    );
    assert_eq!(plot["x"]["scale"], "log");
    let lines = svg_lines(&svg);
    // 2 accountants × 3 rates, each its own colour, even where the gdp lines coincide.
    assert_eq!(lines.len(), 6, "{:?}", lines.iter().map(|l| &l.0).collect::<Vec<_>>());
    for (stroke, pts) in &lines {
        assert_eq!(pts.len(), 6, "{stroke}: {pts:?}");
        assert!(
            pts.windows(2).all(|w| w[1].0 > w[0].0),
            "{stroke}: x not increasing {pts:?}"
        );
    }
    // Every line has its own legend entry naming its accountant and rate.
    let names: Vec<&str> = plot["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    for a in ["gdp", "rdp"] {
        for p in ["1", "0.1", "0.01"] {
            let n = names
                .iter()
                .filter(|n| n.starts_with(a) && n.ends_with(&format!("p = {p}")))
                .count();
            assert_eq!(n, 1, "{a} at p = {p}: {names:?}");
        }
    }
    // The coinciding gdp lines (no amplification at p < 1) are named in the caption.
    assert!(
        plot["caption"].as_str().unwrap().contains("drawn over one another"),
        "{}",
        plot["caption"]
    );
}

#[test]
fn sweep_conclusion_states_the_region_its_table_shows() {
    let (rep, _) = sweep_out(&[
        "fixtures/samplers/edm-cifar10-paper.toml",
        "--sigma-min",
        "0.01..1",
        "--points",
        "6",
        "--log",
        "--subsample-rate",
        "1,0.1,0.01",
        "--accountant",
        "gdp,rdp,clt",
        "--max-epsilon",
        "20",
    ]);
    let verdict = rep["conclusion"]["verdict"].as_str().unwrap().to_string();
    let b = 20.0;
    // From the table: per rate, the σ_min whose smallest sound ε is within the budget, and the
    // accountant that gives it.
    let rows = table(&rep, "sweep");
    let mut per_rate: Vec<(f64, Vec<(f64, bool)>)> = Vec::new();
    let mut support = std::collections::BTreeSet::new();
    for r in &rows {
        let (p, s) = (r["subsample_rate"].as_f64().unwrap(), r["sigma_min"].as_f64().unwrap());
        let best = ["gdp", "rdp", "clt"]
            .iter()
            .filter(|a| matches!(r[&format!("{a}_kind")].as_str(), Some("exact" | "upper_bound")))
            .filter_map(|a| r[&format!("{a}_epsilon")].as_f64().map(|e| (e, *a)))
            .min_by(|x, y| x.0.total_cmp(&y.0));
        let meets = best.is_some_and(|(e, _)| e <= b);
        if let (true, Some((_, a))) = (meets, best) {
            support.insert(a);
        }
        match per_rate.iter_mut().find(|x| x.0 == p) {
            Some(x) => x.1.push((s, meets)),
            None => per_rate.push((p, vec![(s, meets)])),
        }
    }
    // The verdict's clauses: `at p = A and p = B: σ_min ≥ X`, or one region `for every p`.
    let body = verdict.split(" (").next().unwrap();
    let every = body.contains(" for every p");
    let body = if every { body } else { body.split_once(": ").unwrap().1 };
    let mut regions = std::collections::BTreeSet::new();
    for (p, mut pts) in per_rate {
        pts.sort_by(|x, y| x.0.total_cmp(&y.0));
        let first = pts
            .iter()
            .position(|x| x.1)
            .expect("some σ_min meets ε ≤ 10 at every p");
        assert!(
            pts[first..].iter().all(|x| x.1),
            "p = {p}: the region is not an upper set: {pts:?}"
        );
        let want = format!("σ_min ≥ {}", sig6(pts[first].0));
        regions.insert(want.clone());
        let clause = if every {
            body.strip_prefix("On the grid, ")
                .unwrap()
                .split(" meets ")
                .next()
                .unwrap()
        } else {
            body.split("; ")
                .find(|c| c.contains(&format!("p = {p}:")) || c.contains(&format!("p = {p} and")))
                .unwrap_or_else(|| panic!("no clause for p = {p} in {verdict}"))
        };
        assert!(clause.ends_with(&want), "p = {p}: `{clause}` vs {want} ({verdict})");
    }
    assert_eq!(every, regions.len() == 1, "{verdict}");
    assert!(regions.len() > 1, "the budget should split the rates: {verdict}");
    for a in support {
        assert!(verdict.contains(&format!("{a} (")), "{a} supports it: {verdict}");
    }
    assert!(
        !verdict.contains("clt ("),
        "an estimate never supports a region: {verdict}"
    );
}

#[test]
fn sigma_min_on_a_ddpm_schedule_sweeps_the_levels_reached_once_each() {
    let (rep, svg) = sweep_out(&[
        "fixtures/samplers/ddpm-linear-ddim50.toml",
        "--sigma-min",
        "0.01..1",
        "--points",
        "12",
        "--log",
        "--subsample-rate",
        "1,0.1",
        "--accountant",
        "gdp",
        "--max-epsilon",
        "0.005",
    ]);
    let rows = table(&rep, "sweep");
    let key = |r: &std::collections::HashMap<String, Value>| {
        (
            r["t_min"].as_f64().unwrap().to_bits(),
            r["subsample_rate"].as_f64().unwrap().to_bits(),
        )
    };
    let mut keys: Vec<_> = rows.iter().map(key).collect();
    let n = keys.len();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), n, "a level reached twice at the same p");
    assert!((10..24).contains(&n), "{n} rows");
    // Every row reaches a level at or below the σ_min it asked for (the first level ≤ σ_min),
    // except below the schedule's smallest level.
    let lowest = rows
        .iter()
        .map(|r| r["t_min"].as_f64().unwrap())
        .fold(f64::INFINITY, f64::min);
    for r in &rows {
        let (t, s) = (r["t_min"].as_f64().unwrap(), r["stop_at"].as_f64().unwrap());
        assert!(t <= s || t == lowest, "t_min {t} above σ_min {s}");
    }
    let warned = rep["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|w| w["code"] == "repeated_stop_level");
    assert!(warned, "{}", rep["warnings"]);
    let plot = &rep["plots"][0];
    assert!(plot["x"]["label"].as_str().unwrap().contains("t_min"), "{}", plot["x"]);
    let lines = svg_lines(&svg);
    assert_eq!(lines.len(), 2, "one gdp line per p");
    for (stroke, pts) in &lines {
        assert!(
            pts.windows(2).all(|w| w[1].0 > w[0].0),
            "{stroke}: repeated or decreasing x {pts:?}"
        );
    }
    assert!(
        rep["conclusion"]["verdict"].as_str().unwrap().contains("t_min ≥ "),
        "{}",
        rep["conclusion"]["verdict"]
    );
}

/// Issue 47, item 3: with the default accountants (gdp, clt) a subsampled sampler's gdp column is
/// the full-batch bound; RDP's sound bound is smaller, so the verdict names rdp, the number of grid
/// points where it is smaller (counted here from a sweep that runs rdp), and the region of a budget
/// by rdp alone, which is the region that sweep states.
#[test]
fn default_accountants_name_rdp_where_its_sound_bound_is_smaller() {
    let base = [
        "fixtures/samplers/edm-cifar10-subsampled.toml",
        "--sigma-min",
        "0.002..1",
        "--points",
        "5",
        "--log",
    ];
    // The sweep with rdp run: its table gives rdp's and gdp's ε at each point.
    let with_rdp = |budget: &str| {
        let mut a = base.to_vec();
        a.extend(["--accountant", "gdp,clt,rdp", "--max-epsilon", budget]);
        sweep_out(&a).0
    };
    let rep = with_rdp("1");
    let rows = table(&rep, "sweep");
    let eps = |r: &std::collections::HashMap<String, Value>, a: &str| {
        matches!(r[&format!("{a}_kind")].as_str(), Some("exact" | "upper_bound"))
            .then(|| r[&format!("{a}_epsilon")].as_f64())
            .flatten()
    };
    let smaller = rows
        .iter()
        .filter(|r| match (eps(r, "rdp"), eps(r, "gdp")) {
            (Some(x), Some(y)) => x < y,
            (Some(_), None) => true,
            _ => false,
        })
        .count();
    assert!(smaller > 0, "rdp should be smaller somewhere: {rows:?}");
    assert!(
        !rep["conclusion"]["verdict"]
            .as_str()
            .unwrap()
            .contains("not among those run"),
        "rdp was run"
    );
    // A budget between rdp's and gdp's ε at the middle point: the two regions differ there.
    let mid = &rows[rows.len() / 2];
    let (r_mid, g_mid) = (eps(mid, "rdp").unwrap(), eps(mid, "gdp").unwrap());
    assert!(r_mid < g_mid, "{r_mid} vs {g_mid}");
    let budget = format!("{}", (r_mid * g_mid).sqrt());
    let mut a = base.to_vec();
    a.extend(["--max-epsilon", budget.as_str()]);
    let verdict = sweep_out(&a).0["conclusion"]["verdict"].as_str().unwrap().to_string();
    let want = format!(
        "The rdp accountant, not among those run (gdp, clt), gives a smaller sound ε at {smaller} of {} grid points",
        rows.len()
    );
    assert!(verdict.contains(&want), "{verdict}\nwants: {want}");
    assert!(verdict.ends_with("(add it: --accountant gdp,clt,rdp)."), "{verdict}");
    if smaller == rows.len() {
        let theirs = with_rdp(&budget)["conclusion"]["verdict"].as_str().unwrap().to_string();
        let head = &theirs[..theirs.find(" grid points").unwrap()];
        let region = head[..head.rfind(" (").unwrap()]
            .strip_prefix("On the grid, ")
            .unwrap()
            .to_string();
        assert!(
            verdict.contains(&format!(", and by rdp alone {region} (add it")),
            "{verdict}\nvs the sweep with rdp: {theirs}"
        );
    }
}
