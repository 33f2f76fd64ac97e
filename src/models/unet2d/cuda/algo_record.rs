//! A per-machine record of the cuDNN convolution algorithms chosen for each shape, so that a
//! run after the first skips cuDNN's algorithm search (feature `cudnn` uses it; the file format,
//! its reading and the choice of search are plain Rust and tested everywhere).
//!
//! cuDNN's heuristic choice (`cudnnGetConvolutionForwardAlgorithm_v7`) cost 0.1–0.2 s per run of
//! the diffusers UNet on an H100 (16 convolution shapes of models/mnist-ddpm, about 12 ms each),
//! a third of a 10,000-image PIA run; measuring the algorithms (`cudnnFind…`) costs more. A
//! PyTorch process pays its search once; a `dpaudit` process per attack paid it every time.
//!
//! The record is a text file of lines `v2 <TAB> key <TAB> algorithm <TAB> math type`, the key
//! naming the GPU (name and compute capability), the cuDNN version, how the choice was made
//! (heuristic or measured), the data type, the math type the precision allows and the
//! convolution's shape, so a choice is reused only where it was made. The math type is the one
//! cuDNN chose with the algorithm (it may be narrower than the precision allows, e.g. IEEE fp32
//! products under tf32), which the convolution must run with: cuDNN picks its kernel from the
//! pair. Lines that do not parse, and `v1` lines (written before the math type was kept), are
//! ignored; a later line for a key wins. The choice changes no guarantee and no verdict: which
//! algorithm runs changes scores only in their last bits (on the same GPU the same record gives
//! the same choice, so the same scores).
//!
//! Where: `DPAUDIT_CUDNN_RECORD` (a file; empty or `off`: no record), else
//! `$XDG_CACHE_HOME/dpaudit/cudnn-algorithms.tsv`, else `$HOME/.cache/dpaudit/…`; no record when
//! none is set. A record that cannot be read or written is skipped (one line on stderr), never
//! an error: it only saves time. One that cannot be written counts as none, so fp32 takes the
//! heuristic rather than measuring again, perhaps differently, on every run.
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// The first field of every line this version writes.
const VERSION: &str = "v2";

/// One shape's choice: cuDNN's numbers of the algorithm (`cudnnConvolutionFwdAlgo_t`) and of
/// the math type it runs with (`cudnnMathType_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    /// The forward algorithm.
    pub algo: i32,
    /// The math type chosen with it.
    pub math: i32,
}

/// How a shape's algorithm is chosen when the record has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Search {
    /// cuDNN's heuristic (`cudnnGetConvolutionForwardAlgorithm_v7`; PyTorch's
    /// `cudnn.benchmark = False`): no convolution runs, the same choice every time.
    Heuristic,
    /// cuDNN's measurement (`cudnnFindConvolutionForwardAlgorithmEx`; PyTorch's
    /// `cudnn.benchmark = True`): every algorithm timed, the fastest kept.
    Measured,
}

impl Search {
    /// The word the record's key uses.
    pub fn word(self) -> &'static str {
        match self {
            Search::Heuristic => "heuristic",
            Search::Measured => "measured",
        }
    }
}

/// How to choose, from `DPAUDIT_CUDNN_ALGO` (`setting`), whether the precision is IEEE fp32 and
/// whether there is a record. `heuristic` and `find` force one way. Unset, empty or `auto`:
/// measured for fp32 when a record keeps the result (the measurement is paid once per machine,
/// GPU, cuDNN version and shape, and later runs take the same algorithms, so the same scores),
/// the heuristic otherwise. Why fp32 only: on the H100 (docs/attacks.md § On a GPU) the measured
/// choice made SecMI and PIA on the CIFAR-sized UNet at fp32 1.6–2.1× faster than the heuristic's,
/// and at tf32 it was slower. The second value is a warning for a setting not understood (then `auto`).
pub fn search_for(setting: Option<&str>, fp32: bool, recorded: bool) -> (Search, Option<String>) {
    let auto = if fp32 && recorded {
        Search::Measured
    } else {
        Search::Heuristic
    };
    match setting.map(str::trim) {
        None | Some("") | Some("auto") => (auto, None),
        Some("heuristic") => (Search::Heuristic, None),
        Some("find") => (Search::Measured, None),
        Some(other) => (
            auto,
            Some(format!(
                "warning: DPAUDIT_CUDNN_ALGO={other:?} is not one of auto, heuristic, find; using auto ({})",
                auto.word()
            )),
        ),
    }
}

/// The record's file, from the environment (see the module's documentation).
pub fn path() -> Option<PathBuf> {
    let (record, xdg, home) = crate::diagnostics::cudnn_record_sources();
    path_from(record, xdg, home)
}

fn path_from(
    own: Option<std::ffi::OsString>,
    xdg: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    if let Some(v) = own {
        return (!v.is_empty() && v != "off").then(|| PathBuf::from(v));
    }
    let base = match (xdg, home) {
        (Some(x), _) if !x.is_empty() => PathBuf::from(x),
        (_, Some(h)) if !h.is_empty() => PathBuf::from(h).join(".cache"),
        _ => return None,
    };
    Some(base.join("dpaudit").join("cudnn-algorithms.tsv"))
}

/// The choices in a record's text: key → choice (later lines win; malformed lines and lines of
/// another version skipped).
pub fn parse(text: &str) -> HashMap<String, Choice> {
    let mut m = HashMap::new();
    for line in text.lines() {
        let mut f = line.split('\t');
        let (Some(v), Some(k), Some(a), Some(t), None) = (f.next(), f.next(), f.next(), f.next(), f.next()) else {
            continue;
        };
        if v != VERSION || k.is_empty() {
            continue;
        }
        if let (Ok(algo), Ok(math)) = (a.trim().parse::<i32>(), t.trim().parse::<i32>()) {
            m.insert(k.to_string(), Choice { algo, math });
        }
    }
    m
}

/// One record line (keys never hold tabs or line breaks: they are replaced by spaces).
pub fn line(key: &str, c: Choice) -> String {
    let k: String = key
        .chars()
        .map(|c| if c == '\t' || c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    format!("{VERSION}\t{k}\t{}\t{}\n", c.algo, c.math)
}

struct Record {
    path: Option<PathBuf>,
    map: HashMap<String, Choice>,
    warned: bool,
}

fn record() -> &'static Mutex<Record> {
    static R: OnceLock<Mutex<Record>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(open(path())))
}

/// The record at `path`: its choices when the file exists and can be read. A file that cannot
/// be appended to (its folder cannot be made, or it cannot be opened for appending) keeps
/// nothing, so it counts as no record ([`on_file`] is false, and `auto` takes the heuristic, the
/// same choice every run, rather than measuring again every run); its readable choices are still
/// used. Each problem is one note on stderr.
fn open(path: Option<PathBuf>) -> Record {
    let mut warned = false;
    let map = match &path {
        Some(p) if p.exists() => match read(p) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("note: cuDNN algorithm record not used: {e}");
                warned = true;
                HashMap::new()
            }
        },
        _ => HashMap::new(),
    };
    let path = match path {
        Some(p) => match appendable(&p) {
            Ok(()) => Some(p),
            Err(e) => {
                if !warned {
                    eprintln!(
                        "note: cuDNN algorithm record {} cannot be written ({e}): choices are not kept",
                        p.display()
                    );
                    warned = true;
                }
                None
            }
        },
        None => None,
    };
    Record { path, map, warned }
}

/// Whether `p` can take appended lines: its folder made if missing, the file opened for
/// appending (created empty if missing; nothing is written).
fn appendable(p: &Path) -> std::io::Result<()> {
    if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::OpenOptions::new().create(true).append(true).open(p).map(drop)
}

fn read(p: &Path) -> crate::error::Result<HashMap<String, Choice>> {
    let bytes = crate::limits::read_file_capped(p, "cuDNN algorithm record", crate::limits::TEXT_INPUT_BYTE)?;
    Ok(parse(&String::from_utf8_lossy(&bytes)))
}

/// Whether choices are kept in a file that can be written (so a measurement is paid once per
/// machine).
pub fn on_file() -> bool {
    record().lock().unwrap_or_else(|p| p.into_inner()).path.is_some()
}

/// The recorded choice for `key`, if any.
pub fn lookup(key: &str) -> Option<Choice> {
    record().lock().unwrap_or_else(|p| p.into_inner()).map.get(key).copied()
}

/// Records `choice` for `key` (in memory, and appended to the file when there is one).
pub fn store(key: &str, choice: Choice) {
    let mut r = record().lock().unwrap_or_else(|p| p.into_inner());
    if r.map.get(key) == Some(&choice) {
        return;
    }
    r.map.insert(key.to_string(), choice);
    let Some(p) = r.path.clone() else { return };
    let res = (|| -> std::io::Result<()> {
        // One short line per append (O_APPEND), so concurrent runs interleave whole lines.
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&p)?;
        f.write_all(line(key, choice).as_bytes())
    })();
    if let Err(e) = res {
        if !r.warned {
            eprintln!("note: cuDNN algorithm record {} not written: {e}", p.display());
            r.warned = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_lines_round_trip_and_malformed_lines_are_skipped() {
        let c = |algo, math| Choice { algo, math };
        let key = "H100|cc9.0|cudnn91000|measured|data0|math3|x[256, 128, 32, 32]";
        let mut text = line(key, c(1, 3));
        text += &line("k\twith\ttabs", c(6, 0));
        // Earlier versions' lines (v1 kept no math type), missing or extra fields, bad numbers.
        text += "garbage\nv1\told\t1\nv0\told\t1\t3\nv2\t\t3\t3\nv2\tbad-algo\tx\t3\n";
        text += "v2\tbad-math\t1\t\nv2\ttoo\tmany\tfields\t1\t3\nv2\tshort\t1\n";
        text += &line(key, c(7, 1));
        let m = parse(&text);
        assert_eq!(m.len(), 2, "{m:?}");
        // A later line for the same key wins.
        assert_eq!(m[key], c(7, 1));
        assert_eq!(m["k with tabs"], c(6, 0));
        assert!(line(key, c(7, 1)).starts_with("v2\t"));
        assert!(line(key, c(7, 1)).ends_with("\t7\t1\n"));
    }

    #[test]
    fn fp32_measures_its_algorithms_when_a_record_keeps_them() {
        use Search::{Heuristic, Measured};
        // Unset, empty or auto: measured only for fp32 with a record.
        for s in [None, Some(""), Some("auto"), Some(" auto ")] {
            assert_eq!(search_for(s, true, true), (Measured, None), "{s:?}");
            assert_eq!(search_for(s, true, false), (Heuristic, None), "{s:?}");
            assert_eq!(search_for(s, false, true), (Heuristic, None), "{s:?}");
            assert_eq!(search_for(s, false, false), (Heuristic, None), "{s:?}");
        }
        // Forced either way, whatever the precision and record.
        for (fp32, rec) in [(true, true), (true, false), (false, true), (false, false)] {
            assert_eq!(search_for(Some("heuristic"), fp32, rec), (Heuristic, None));
            assert_eq!(search_for(Some("find"), fp32, rec), (Measured, None));
        }
        // Not understood: auto, with a warning naming the setting and what is used.
        let (s, w) = search_for(Some("fastest"), true, true);
        assert_eq!(s, Measured);
        let w = w.unwrap();
        assert!(w.contains("\"fastest\"") && w.contains("auto (measured)"), "{w}");
        assert_eq!(search_for(Some("FIND"), false, true).0, Heuristic);
    }

    #[test]
    fn record_path_follows_the_environment() {
        let s = |v: &str| Some(std::ffi::OsString::from(v));
        assert_eq!(
            path_from(s("/r/x.tsv"), s("/x"), s("/h")),
            Some(PathBuf::from("/r/x.tsv"))
        );
        assert_eq!(path_from(s("off"), s("/x"), s("/h")), None);
        assert_eq!(path_from(s(""), s("/x"), s("/h")), None);
        assert_eq!(
            path_from(None, s("/x"), s("/h")),
            Some(PathBuf::from("/x/dpaudit/cudnn-algorithms.tsv"))
        );
        assert_eq!(
            path_from(None, None, s("/h")),
            Some(PathBuf::from("/h/.cache/dpaudit/cudnn-algorithms.tsv"))
        );
        assert_eq!(path_from(None, None, None), None);
    }

    #[test]
    fn a_record_that_cannot_be_written_keeps_nothing_and_counts_as_none() {
        let dir = tempfile::tempdir().unwrap();
        let c = Choice { algo: 6, math: 3 };
        // Missing folders are made; the file is created empty, and its choices come back.
        let p = dir.path().join("a/b/record.tsv");
        let r = open(Some(p.clone()));
        assert_eq!(r.path.as_deref(), Some(p.as_path()));
        assert!(r.map.is_empty() && !r.warned);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "");
        std::fs::write(&p, line("k", c)).unwrap();
        assert_eq!(open(Some(p.clone())).map["k"], c);
        // Below a plain file no folder can be made: no record, one note.
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, "x").unwrap();
        let r = open(Some(blocker.join("record.tsv")));
        assert!(r.path.is_none() && r.map.is_empty() && r.warned);
        // A folder in place of the file cannot be opened for appending.
        let r = open(Some(dir.path().join("a")));
        assert!(r.path.is_none() && r.warned);
        assert!(open(None).path.is_none());
    }
}
