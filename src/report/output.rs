//! Writing outputs safely, shared by every command: `--out DIR`, `--force`, stdout.
//!
//! * Every file is written atomically: a temporary file in the same directory, written, flushed
//!   and `fsync`ed, then renamed over the target (and the directory synced). A crash, a kill or
//!   a full disk never leaves a partial file at the final path; the error names the path.
//! * Existing outputs are refused (exit 2) *before any work* unless `--force`: a command calls
//!   [`OutputDir::create`] and [`OutputDir::refuse_existing`] (or [`check_file`]) while it
//!   validates its flags.
//! * `--out DIR` is created when missing.
//! * stdout: a closed pipe (`dpaudit … | head`) ends quietly ([`emit_stdout`]).
//!
//! For tests of torn outputs, the environment variable `DPAUDIT_INJECT_WRITE_FAILURE=<name>`
//! makes the write of any file whose name is `<name>` (or every file, with `*`) fail half-way
//! with "No space left on device", exactly as a full disk does.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{Error, ErrorKind, Result};

/// Environment variable that injects a write failure (see the module docs).
pub const INJECT_WRITE_FAILURE_ENV: &str = "DPAUDIT_INJECT_WRITE_FAILURE";

/// A checked output directory (`--out DIR`), with the `--force` choice.
#[derive(Debug, Clone)]
pub struct OutputDir {
    dir: PathBuf,
    force: bool,
}

impl OutputDir {
    /// Creates `dir` when missing, checks that it is a writable directory (by creating and
    /// removing a probe file). Call it before long work so a bad path fails fast.
    pub fn create(dir: &Path, force: bool) -> Result<Self> {
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!("output path `{}` exists and is not a directory", dir.display()),
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(dir).map_err(|e| {
                    Error::new(
                        ErrorKind::Io,
                        format!("cannot create output directory `{}`: {e}", dir.display()),
                    )
                })?;
            }
            Err(e) => {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!("output directory `{}` cannot be read: {e}", dir.display()),
                ))
            }
        }
        // Probe: the same operation a real write starts with.
        tempfile::Builder::new()
            .prefix(".dpaudit-probe-")
            .tempfile_in(dir)
            .map_err(|e| not_writable(dir, &e))?;
        Ok(OutputDir {
            dir: dir.to_path_buf(),
            force,
        })
    }

    /// Same as [`OutputDir::create`] (kept for callers written before directories were created).
    pub fn open(dir: &Path, force: bool) -> Result<Self> {
        Self::create(dir, force)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Whether existing files may be replaced.
    pub fn force(&self) -> bool {
        self.force
    }

    /// Refuses (exit 2) when the directory already holds a file a report writes
    /// (`report.json|md|html`, `report-*.csv`, `plot-*.svg|png`) or one of `extra` (names of the
    /// command's own files), unless `--force`. Call it before any work.
    pub fn refuse_existing(&self, extra: &[&str]) -> Result<()> {
        if self.force {
            return Ok(());
        }
        let mut found: Vec<String> = Vec::new();
        let entries = std::fs::read_dir(&self.dir).map_err(|e| Error::io(&self.dir, &e))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if is_report_file(&name) || extra.contains(&name.as_str()) {
                found.push(name);
            }
        }
        if found.is_empty() {
            return Ok(());
        }
        found.sort();
        let shown: Vec<String> = found.iter().take(3).map(|n| format!("`{n}`")).collect();
        let more = if found.len() > 3 {
            format!(" and {} more", found.len() - 3)
        } else {
            String::new()
        };
        Err(Error::new(
            ErrorKind::Io,
            format!(
                "output directory `{}` already holds {}{more} from an earlier run; pass --force to overwrite",
                self.dir.display(),
                shown.join(", ")
            ),
        ))
    }

    /// Writes every `(file name, bytes)` atomically. Refuses (before writing anything) when a
    /// target exists and `force` is off. Returns the written paths.
    pub fn write_files(&self, files: &[(String, Vec<u8>)]) -> Result<Vec<PathBuf>> {
        for (name, _) in files {
            check_file_name(name)?;
        }
        if !self.force {
            for (name, _) in files {
                let p = self.dir.join(name);
                if p.exists() {
                    return Err(exists_error(&p));
                }
            }
        }
        let mut out = Vec::with_capacity(files.len());
        for (name, bytes) in files {
            let p = self.dir.join(name);
            write_atomic(&p, bytes, self.force)?;
            out.push(p);
        }
        Ok(out)
    }
}

/// True for the names a report writes into `--out DIR`.
pub fn is_report_file(name: &str) -> bool {
    matches!(name, "report.json" | "report.md" | "report.html")
        || (name.starts_with("report-") && name.ends_with(".csv"))
        || (name.starts_with("plot-") && (name.ends_with(".svg") || name.ends_with(".png")))
}

fn not_writable(dir: &Path, e: &std::io::Error) -> Error {
    Error::new(
        ErrorKind::Io,
        format!("output directory `{}` is not writable: {e}", dir.display()),
    )
}

fn exists_error(p: &Path) -> Error {
    Error::new(
        ErrorKind::Io,
        format!("`{}` already exists; pass --force to overwrite it", p.display()),
    )
}

fn check_file_name(name: &str) -> Result<()> {
    if name.is_empty() || name.contains('/') || name.contains('\\') || name.starts_with('.') {
        return Err(Error::input(format!("invalid output file name `{name}`")));
    }
    Ok(())
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Checks, before any work, that the single file `path` can be written: its directory is
/// created when missing, and an existing `path` is refused unless `overwrite`.
pub fn check_file(path: &Path, overwrite: bool) -> Result<()> {
    if path.is_dir() {
        return Err(Error::new(
            ErrorKind::Io,
            format!("output `{}` is a directory; give a file name", path.display()),
        ));
    }
    let dir = parent_dir(path);
    if !dir.is_dir() {
        std::fs::create_dir_all(dir).map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!(
                    "cannot create directory `{}` for `{}`: {e}",
                    dir.display(),
                    path.display()
                ),
            )
        })?;
    }
    if !overwrite && path.exists() {
        return Err(exists_error(path));
    }
    Ok(())
}

fn injected_failure(path: &Path) -> bool {
    match std::env::var_os(INJECT_WRITE_FAILURE_ENV) {
        Some(v) => v == "*" || path.file_name().is_some_and(|n| n == v.as_os_str()),
        None => false,
    }
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory is written,
/// `fsync`ed and renamed over `path`, then the directory is synced. Without `force`, an
/// existing `path` is an error and is left untouched (also when it appears while we write: the
/// final rename refuses to clobber). On any failure no partial file remains and the error names
/// `path`. The directory must exist ([`check_file`] / [`OutputDir::create`] create it).
pub fn write_atomic(path: &Path, bytes: &[u8], force: bool) -> Result<()> {
    let dir = parent_dir(path);
    if !dir.is_dir() {
        return Err(Error::new(
            ErrorKind::Io,
            format!(
                "cannot write `{}`: directory `{}` does not exist",
                path.display(),
                dir.display()
            ),
        ));
    }
    if !force && path.exists() {
        return Err(exists_error(path));
    }
    let mut tmp = tempfile::Builder::new()
        .prefix(".dpaudit-tmp-")
        .permissions(file_permissions())
        .tempfile_in(dir)
        .map_err(|e| not_writable(dir, &e))?;
    // On error, `tmp` is dropped and the temporary file removed.
    let written = if injected_failure(path) {
        tmp.write_all(&bytes[..bytes.len() / 2])
            .and_then(|_| Err(std::io::Error::from_raw_os_error(28)))
    } else {
        tmp.write_all(bytes)
    };
    written
        .and_then(|_| tmp.flush())
        .and_then(|_| tmp.as_file().sync_all())
        .map_err(|e| write_error(path, &e))?;
    let persisted = if force {
        tmp.persist(path).map(|_| ())
    } else {
        tmp.persist_noclobber(path).map(|_| ())
    };
    persisted.map_err(|e| {
        if e.error.kind() == std::io::ErrorKind::AlreadyExists {
            exists_error(path)
        } else {
            write_error(path, &e.error)
        }
    })?;
    // Make the rename durable; a directory that cannot be opened for syncing is not an error.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Permissions for a file dpaudit creates: read/write for all, less the process's umask (as
/// any file `open(2)` creates; a temporary file alone would be 0600 whatever the umask).
pub fn file_permissions() -> std::fs::Permissions {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::Permissions::from_mode(0o666)
    }
    #[cfg(not(unix))]
    {
        std::fs::File::open(".")
            .and_then(|f| f.metadata())
            .map(|m| {
                let mut p = m.permissions();
                p.set_readonly(false);
                p
            })
            .expect("the current directory has metadata")
    }
}

fn write_error(path: &Path, e: &std::io::Error) -> Error {
    Error::new(
        ErrorKind::Io,
        format!(
            "cannot write `{}`: {e}; nothing was written to `{}`",
            path.display(),
            path.display()
        ),
    )
}

/// Set once stdout turned out to be a closed pipe: later output is dropped.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes `bytes` to stdout. A closed pipe (the reader went away, as `head` does) is not an
/// error: the output is dropped quietly and the command finishes with its own exit code.
pub fn emit_stdout(bytes: &[u8]) -> Result<()> {
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|_| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            STDOUT_CLOSED.store(true, Ordering::Relaxed);
            Ok(())
        }
        Err(e) => Err(Error::io(Path::new("<stdout>"), &e)),
    }
}

/// Writes to `path` atomically when given, otherwise to stdout ([`emit_stdout`]).
pub fn emit(path: Option<&Path>, bytes: &[u8], force: bool) -> Result<()> {
    match path {
        Some(p) => write_atomic(p, bytes, force),
        None => emit_stdout(bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_overwrite_without_force_and_leaves_no_temp() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.md");
        write_atomic(&p, b"one", false).unwrap();
        let e = write_atomic(&p, b"two", false).unwrap_err();
        assert!(e.to_string().contains("--force"), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"one");
        write_atomic(&p, b"two", true).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn write_files_checks_all_targets_first() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("b.csv"), "old").unwrap();
        let out = OutputDir::create(d.path(), false).unwrap();
        let e = out
            .write_files(&[("a.md".into(), b"a".to_vec()), ("b.csv".into(), b"b".to_vec())])
            .unwrap_err();
        assert!(e.to_string().contains("b.csv"), "{e}");
        assert!(!d.path().join("a.md").exists());
    }

    #[test]
    fn missing_directory_is_created() {
        let d = tempfile::tempdir().unwrap();
        let missing = d.path().join("a").join("b");
        let out = OutputDir::create(&missing, false).unwrap();
        assert!(missing.is_dir());
        out.refuse_existing(&[]).unwrap();
        check_file(&d.path().join("c").join("x.xml"), false).unwrap();
        assert!(d.path().join("c").is_dir());
    }

    #[test]
    fn refuse_existing_names_report_files_and_extras_only() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("notes.txt"), "mine").unwrap();
        let out = OutputDir::create(d.path(), false).unwrap();
        out.refuse_existing(&["ledger.toml"]).unwrap();
        std::fs::write(d.path().join("plot-tradeoff.png"), "old").unwrap();
        let e = out.refuse_existing(&[]).unwrap_err();
        assert!(
            e.to_string().contains("plot-tradeoff.png") && e.to_string().contains("--force"),
            "{e}"
        );
        OutputDir::create(d.path(), true).unwrap().refuse_existing(&[]).unwrap();
    }

    #[test]
    fn report_file_names() {
        for n in [
            "report.json",
            "report.md",
            "report.html",
            "report-steps.csv",
            "plot-cumulative.svg",
        ] {
            assert!(is_report_file(n), "{n}");
        }
        for n in ["report.txt", "notes.md", "plot.svg", "ledger.toml"] {
            assert!(!is_report_file(n), "{n}");
        }
    }
}
