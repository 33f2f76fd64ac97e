//! Reading input files. Every text input is read through [`read_to_string`]: its size is checked
//! against the memory cap first ([`crate::limits::read_input_text`]), and when it belongs to a
//! dpaudit output set (a folder with a `.dpaudit-manifest.json`, see `report::output`), the whole
//! set must match its manifest ([`verify_member`]) so that a mixed set is never read as valid. The
//! files read are remembered ([`note_input`]) so that no output of the same command replaces them.
//!
//! This module depends only on [`crate::error`] and [`crate::limits`], so every stage can read its
//! inputs without a module cycle.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Reads a whole text input file, size-checked against the memory cap and, for a member of an
/// output set, checked against the set's manifest. Errors name the file.
pub fn read_to_string(path: &Path) -> Result<String> {
    verify_member(path)?;
    crate::limits::read_input_text(path)
}

/// Parses a TOML input file into `T` with file/line/field context on failure.
pub(crate) fn load_toml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let src = read_to_string(path)?;
    toml::from_str(&src).map_err(|e| crate::error::from_toml(path, &src, e))
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// (device, inode) of every file this process read as input (see [`note_input`]).
static INPUTS: Mutex<Vec<FileId>> = Mutex::new(Vec::new());

/// A file's identity: device, inode and change time (an inode number alone is reused once its
/// file is deleted, so a later, unrelated file could pass for an input).
type FileId = (u64, u64, i64, i64);

fn file_id(m: &std::fs::Metadata) -> FileId {
    (m.dev(), m.ino(), m.ctime(), m.ctime_nsec())
}

/// Records `path` as an input of this command: no output may replace it.
pub fn note_input(path: &Path) {
    if let Ok(m) = std::fs::metadata(path) {
        if let Ok(mut v) = INPUTS.lock() {
            if !v.contains(&file_id(&m)) {
                v.push(file_id(&m));
            }
        }
    }
}

/// Takes `path` off this command's inputs, so that it may be replaced: only for the command
/// whose job is to rewrite a file it read, in place (`model relocate`: a folder's card, ledger
/// and training record).
#[cfg(feature = "models")]
pub(crate) fn rewrite_in_place(path: &Path) {
    if let (Ok(m), Ok(mut v)) = (std::fs::metadata(path), INPUTS.lock()) {
        v.retain(|id| *id != file_id(&m));
    }
}

pub(crate) fn is_input(m: &std::fs::Metadata) -> bool {
    INPUTS.lock().map(|v| v.contains(&file_id(m))).unwrap_or(false)
}

/// Name suffix of every manifest.
pub const MANIFEST_SUFFIX: &str = "dpaudit-manifest.json";
/// The manifest of an output set: every member with its SHA-256.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Format version (1).
    pub dpaudit_manifest: u32,
    /// The members, in commit order.
    pub files: Vec<ManifestEntry>,
}

/// One member of an output set.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestEntry {
    /// File name (in the manifest's folder).
    pub name: String,
    /// Lower-case hex SHA-256 of its bytes.
    pub sha256: String,
    /// Size in bytes.
    pub bytes: u64,
}

/// The manifest file name of a set: `.dpaudit-manifest.json` for a `--out DIR` set,
/// `.<stem>.dpaudit-manifest.json` for a stem (`train --out models/x` → `.x.dpaudit-manifest.json`).
pub fn manifest_name(stem: Option<&str>) -> String {
    match stem {
        None => format!(".{MANIFEST_SUFFIX}"),
        Some(s) => format!(".{s}.{MANIFEST_SUFFIX}"),
    }
}

/// Reads a manifest (small, JSON).
fn read_manifest(path: &Path) -> Result<Manifest> {
    let text = crate::limits::read_input_text(path)?;
    serde_json::from_str(&text).map_err(|e| Error::input(format!("not a dpaudit output manifest: {e}")).with_file(path))
}

/// SHA-256 (hex) of a file, streamed under the work cap ([`crate::limits::hash_file_capped`]).
pub(crate) fn file_sha256(path: &Path) -> Result<String> {
    Ok(crate::limits::hash_file_capped(path, "file size")?.0)
}

/// The comment line (without `# `) by which a ledger names the release it describes:
/// `released: <file> sha256 <hex>`. [`verify_member`] checks it whenever the ledger is read.
pub fn released_line(file: &str, bytes: &[u8]) -> String {
    format!("released: {file} sha256 {}", sha256_hex(bytes))
}

/// One `# released: <file> sha256 <hex>` line of a ledger's header: the file it names, that
/// file's SHA-256 and the line (1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// The file name (beside the ledger).
    pub name: String,
    /// Its SHA-256 (hex).
    pub sha256: String,
    /// The ledger line.
    pub line: usize,
}

/// The `# released:` lines at the top of the ledger `path` (comment lines come first; 64 KiB is
/// far more than any ledger header). Names with a path separator or a leading `.` are skipped.
pub(crate) fn released_entries(path: &Path) -> Vec<Released> {
    let Ok(f) = std::fs::File::open(path) else {
        return Vec::new();
    };
    let mut head = String::new();
    let _ = std::io::Read::read_to_string(&mut std::io::Read::take(f, 1 << 16), &mut head);
    let mut out = Vec::new();
    for (i, line) in head.lines().enumerate() {
        let Some(rest) = line.strip_prefix("# released: ") else {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            break;
        };
        let mut it = rest.split_whitespace();
        let (Some(name), Some("sha256"), Some(want)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if name.contains('/') || name.contains('\\') || name.starts_with('.') {
            continue;
        }
        out.push(Released {
            name: name.to_string(),
            sha256: want.to_string(),
            line: i + 1,
        });
    }
    out
}

/// Checks every `# released: <file> sha256 <hex>` comment line at the top of `path`.
fn verify_released(path: &Path) -> Result<()> {
    for Released { name, sha256, line } in released_entries(path) {
        let want = sha256.as_str();
        let i = line - 1;
        let p = parent_dir(path).join(&name);
        let got = file_sha256(&p).ok();
        if got.as_deref() != Some(want) {
            let mut e = Error::field(
                "released",
                format!(
                    "this ledger describes `{}` with SHA-256 {want}, but {}: the ledger and the release disagree",
                    p.display(),
                    match got {
                        None => "that file is missing".to_string(),
                        Some(g) => format!("it has SHA-256 {g}"),
                    }
                ),
            )
            .with_file(path);
            e.line = Some(i + 1);
            return Err(e);
        }
    }
    Ok(())
}

/// Before a file is read as input: when a manifest in its folder lists it, every member of that
/// set must be present with the manifest's SHA-256, else the set is mixed or incomplete (a run
/// was killed between renames, or two runs wrote into one place) and is refused (exit 2,
/// naming the first member that differs). Also records `path` as an input ([`note_input`]).
pub fn verify_member(path: &Path) -> Result<()> {
    note_input(path);
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return Ok(());
    };
    if name.ends_with(".toml") {
        verify_released(path)?;
    }
    let dir = parent_dir(path);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for e in entries.flatten() {
        let mname = e.file_name().to_string_lossy().into_owned();
        if !(mname.starts_with('.') && mname.ends_with(MANIFEST_SUFFIX)) {
            continue;
        }
        let mpath = dir.join(&mname);
        let m = read_manifest(&mpath)?;
        if !m.files.iter().any(|f| f.name == name) {
            continue;
        }
        for f in &m.files {
            let p = dir.join(&f.name);
            let got = file_sha256(&p).ok();
            if got.as_deref() != Some(f.sha256.as_str()) {
                let what = match got {
                    None => "is missing from",
                    Some(_) => "differs from",
                };
                return Err(Error::field(
                    "sha256",
                    format!(
                        "`{}` {what} the output set recorded in `{}` that `{}` belongs to: the set is mixed or incomplete (a run was interrupted between renames, or two runs wrote into one place); rerun the command that wrote it",
                        p.display(),
                        mpath.display(),
                        path.display()
                    ),
                )
                .with_file(path));
            }
        }
    }
    Ok(())
}

/// Parses JSON as Python's `json` module reads it, as diffusers writes its configs
/// (`json.dumps` with its default `allow_nan=True`): the bare literals `NaN`, `Infinity` and
/// `-Infinity` outside strings are values. serde_json has no non-finite number, so each such
/// value becomes the string `"NaN"`, `"Infinity"` or `"-Infinity"`: a reader that needs the
/// number sees a string and says so; every other key reads as before. Line numbers in errors
/// are unchanged (the text only gains two quote characters per literal, on its line).
pub fn parse_python_json(text: &str) -> serde_json::Result<serde_json::Value> {
    match serde_json::from_str(text) {
        Ok(v) => Ok(v),
        Err(e) => {
            let quoted = quote_python_literals(text);
            if quoted == text {
                return Err(e);
            }
            serde_json::from_str(&quoted)
        }
    }
}

/// [`parse_python_json`]'s rewrite: `NaN`, `Infinity`, `-Infinity` outside strings, between
/// JSON delimiters, become strings.
fn quote_python_literals(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len() + 16);
    let (mut i, mut start, mut in_str) = (0usize, 0usize, false);
    let boundary = |c: Option<&u8>| c.is_none_or(|c| !(c.is_ascii_alphanumeric() || *c == b'_' || *c == b'.'));
    while i < b.len() {
        let c = b[i];
        if in_str {
            if c == b'\\' {
                i += 2;
                continue;
            }
            if c == b'"' {
                in_str = false;
            }
            i += 1;
            continue;
        }
        if c == b'"' {
            in_str = true;
            i += 1;
            continue;
        }
        let before = if i == 0 { None } else { b.get(i - 1) };
        let lit = ["-Infinity", "Infinity", "NaN"]
            .into_iter()
            .find(|l| b[i..].starts_with(l.as_bytes()) && boundary(before) && boundary(b.get(i + l.len())));
        match lit {
            Some(l) => {
                out.push_str(&text[start..i]);
                out.push('"');
                out.push_str(l);
                out.push('"');
                i += l.len();
                start = i;
            }
            None => i += 1,
        }
    }
    out.push_str(&text[start..]);
    out
}

#[cfg(test)]
mod python_json_tests {
    use super::parse_python_json;

    #[test]
    fn reads_python_literals_outside_strings_only() {
        let v = parse_python_json(r#"{"a": -Infinity, "b": [NaN, Infinity], "c": "NaN -Infinity", "d": 1.5}"#).unwrap();
        assert_eq!(v["a"], "-Infinity");
        assert_eq!(v["b"][0], "NaN");
        assert_eq!(v["b"][1], "Infinity");
        assert_eq!(v["c"], "NaN -Infinity");
        assert_eq!(v["d"], 1.5);
        assert!(parse_python_json(r#"{"a": Infinityx}"#).is_err());
        assert!(parse_python_json(r#"{"a": nan}"#).is_err());
    }
}
