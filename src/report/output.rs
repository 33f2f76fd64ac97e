//! Writing outputs safely, shared by every command: `--out DIR` and `--force`.
//!
//! * Every file is written atomically: a temporary file in the same directory, flushed and
//!   synced, then renamed over the target. A failure leaves no partial file behind.
//! * An existing file is not overwritten without `force` (`--force`); with several files, all
//!   targets are checked before the first is written.
//! * A missing or unwritable directory fails fast, before any long computation, with a message
//!   naming the directory ([`OutputDir::open`]).

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, ErrorKind, Result};

/// A checked output directory (`--out DIR`), with the `--force` choice.
#[derive(Debug, Clone)]
pub struct OutputDir {
    dir: PathBuf,
    force: bool,
}

impl OutputDir {
    /// Checks that `dir` exists, is a directory and is writable (by creating and removing a
    /// probe file). Call it before long work so a bad path fails fast.
    pub fn open(dir: &Path, force: bool) -> Result<Self> {
        let meta = std::fs::metadata(dir).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::new(
                    ErrorKind::Io,
                    format!("output directory `{}` does not exist (create it first)", dir.display()),
                )
            } else {
                Error::new(
                    ErrorKind::Io,
                    format!("output directory `{}` cannot be read: {e}", dir.display()),
                )
            }
        })?;
        if !meta.is_dir() {
            return Err(Error::new(
                ErrorKind::Io,
                format!("output path `{}` is not a directory", dir.display()),
            ));
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

    /// The output directory or file.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Whether existing files may be overwritten.
    pub fn force(&self) -> bool {
        self.force
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

/// Writes `bytes` to `path` atomically (temporary file in the same directory + rename). Without
/// `force`, an existing `path` is an error and is left untouched (also when it appears while we
/// write: the final rename refuses to clobber). On any failure no partial file remains.
pub fn write_atomic(path: &Path, bytes: &[u8], force: bool) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(Error::new(
            ErrorKind::Io,
            format!(
                "cannot write `{}`: directory `{}` does not exist (create it first)",
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
        .tempfile_in(dir)
        .map_err(|e| not_writable(dir, &e))?;
    // On error, `tmp` is dropped and the temporary file removed.
    tmp.write_all(bytes)
        .and_then(|_| tmp.as_file().sync_all())
        .map_err(|e| Error::io(path, &e))?;
    let persisted = if force {
        tmp.persist(path).map(|_| ())
    } else {
        tmp.persist_noclobber(path).map(|_| ())
    };
    persisted.map_err(|e| {
        if e.error.kind() == std::io::ErrorKind::AlreadyExists {
            exists_error(path)
        } else {
            Error::io(path, &e.error)
        }
    })
}

/// Writes to `path` atomically when given, otherwise to stdout.
pub fn emit(path: Option<&Path>, bytes: &[u8], force: bool) -> Result<()> {
    match path {
        Some(p) => write_atomic(p, bytes, force),
        None => {
            let mut out = std::io::stdout().lock();
            match out.write_all(bytes).and_then(|_| out.flush()) {
                // The reader closed the pipe (`| head`): it has all it wanted; end quietly.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                r => r.map_err(|e| Error::io(Path::new("<stdout>"), &e)),
            }
        }
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
        let out = OutputDir::open(d.path(), false).unwrap();
        let e = out
            .write_files(&[("a.md".into(), b"a".to_vec()), ("b.csv".into(), b"b".to_vec())])
            .unwrap_err();
        assert!(e.to_string().contains("b.csv"), "{e}");
        assert!(!d.path().join("a.md").exists());
    }

    #[test]
    fn missing_directory_is_named() {
        let d = tempfile::tempdir().unwrap();
        let missing = d.path().join("nope");
        let e = OutputDir::open(&missing, false).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        let e = write_atomic(&missing.join("x"), b"x", false).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        assert!(!missing.exists());
    }
}
