//! A per-machine record of the cuDNN convolution algorithms chosen for each shape, so that a
//! run after the first skips cuDNN's algorithm search (feature `cudnn` uses it; the file format
//! and its reading are plain Rust and tested everywhere).
//!
//! cuDNN's heuristic choice (`cudnnGetConvolutionForwardAlgorithm_v7`) cost 0.1–0.2 s per run of
//! the diffusers UNet on an H100 (16 convolution shapes of models/mnist-ddpm, about 12 ms each),
//! a third of a 10,000-image PIA run; `DPAUDIT_CUDNN_ALGO=find` costs more. A PyTorch process
//! pays its search once; a `dpaudit` process per attack paid it every time.
//!
//! The record is a text file of lines `v1 <TAB> key <TAB> algorithm`, the key naming the GPU
//! (name and compute capability), the cuDNN version, how the choice was made (heuristic or
//! measured), the data type, the math type and the convolution's shape, so a choice is reused
//! only where it was made. Lines that do not parse are ignored; a later line for a key wins. The
//! choice changes no guarantee and no verdict: which algorithm runs changes scores only in their
//! last bits (on the same GPU the same record gives the same choice, so the same scores).
//!
//! Where: `DPAUDIT_CUDNN_RECORD` (a file; empty or `off`: no record), else
//! `$XDG_CACHE_HOME/dpaudit/cudnn-algorithms.tsv`, else `$HOME/.cache/dpaudit/…`; no record when
//! none is set. A record that cannot be read or written is skipped (one line on stderr), never
//! an error: it only saves time.
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// The first field of every line this version writes.
const VERSION: &str = "v1";

/// The record's file, from the environment (see the module's documentation).
pub fn path() -> Option<PathBuf> {
    path_from(
        std::env::var_os("DPAUDIT_CUDNN_RECORD"),
        std::env::var_os("XDG_CACHE_HOME"),
        std::env::var_os("HOME"),
    )
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

/// The choices in a record's text: key → algorithm (later lines win; malformed lines skipped).
pub fn parse(text: &str) -> HashMap<String, i32> {
    let mut m = HashMap::new();
    for line in text.lines() {
        let mut f = line.split('\t');
        let (Some(v), Some(k), Some(a), None) = (f.next(), f.next(), f.next(), f.next()) else {
            continue;
        };
        if v != VERSION || k.is_empty() {
            continue;
        }
        if let Ok(a) = a.trim().parse::<i32>() {
            m.insert(k.to_string(), a);
        }
    }
    m
}

/// One record line (keys never hold tabs or line breaks: they are replaced by spaces).
pub fn line(key: &str, algo: i32) -> String {
    let k: String = key
        .chars()
        .map(|c| if c == '\t' || c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    format!("{VERSION}\t{k}\t{algo}\n")
}

struct Record {
    path: Option<PathBuf>,
    map: HashMap<String, i32>,
    warned: bool,
}

fn record() -> &'static Mutex<Record> {
    static R: OnceLock<Mutex<Record>> = OnceLock::new();
    R.get_or_init(|| {
        let path = path();
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
        Mutex::new(Record { path, map, warned })
    })
}

fn read(p: &Path) -> crate::error::Result<HashMap<String, i32>> {
    let bytes = crate::limits::read_file_capped(p, "cuDNN algorithm record", crate::limits::TEXT_INPUT_BYTE)?;
    Ok(parse(&String::from_utf8_lossy(&bytes)))
}

/// The recorded algorithm for `key`, if any.
pub fn lookup(key: &str) -> Option<i32> {
    record().lock().unwrap_or_else(|p| p.into_inner()).map.get(key).copied()
}

/// Records `algo` for `key` (in memory, and appended to the file when there is one).
pub fn store(key: &str, algo: i32) {
    let mut r = record().lock().unwrap_or_else(|p| p.into_inner());
    if r.map.get(key) == Some(&algo) {
        return;
    }
    r.map.insert(key.to_string(), algo);
    let Some(p) = r.path.clone() else { return };
    let res = (|| -> std::io::Result<()> {
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir)?;
        }
        // One short line per append (O_APPEND), so concurrent runs interleave whole lines.
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&p)?;
        f.write_all(line(key, algo).as_bytes())
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
        let mut text = line("H100|cc9.0|cudnn91000|heuristic|f32|fma|[256,128,32,32]", 1);
        text += &line("k\twith\ttabs", 6);
        text += "garbage\nv0\told\t1\nv1\t\t3\nv1\tbad-algo\tx\nv1\ttoo\tmany\tfields\n";
        text += &line("H100|cc9.0|cudnn91000|heuristic|f32|fma|[256,128,32,32]", 7);
        let m = parse(&text);
        assert_eq!(m.len(), 2, "{m:?}");
        // A later line for the same key wins.
        assert_eq!(m["H100|cc9.0|cudnn91000|heuristic|f32|fma|[256,128,32,32]"], 7);
        assert_eq!(m["k with tabs"], 6);
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
}
