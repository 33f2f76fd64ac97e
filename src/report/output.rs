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
//! * A command's output *set* (the report formats, ledger, outputs, card, weights, run.json) is
//!   committed as one transaction ([`commit_set`]): every file is written and synced in a
//!   staging folder `.dpaudit-tmp-set-*` inside the target folder, then a manifest
//!   (`.dpaudit-manifest.json`, or `.<stem>.dpaudit-manifest.json` for a `train` stem) naming
//!   every member with its SHA-256 is renamed into place, then each member. Every reader
//!   ([`verify_member`], called by [`crate::input::read_to_string`] and `dpaudit report`) checks
//!   the whole set against the manifest, so a set that a kill left half renamed (new ledger
//!   beside old outputs) is refused (exit 2), never read as valid. Staging folders left by a
//!   killed run are removed by the next commit of the same set and never count as outputs.
//! * Readers that are not dpaudit (a script reading `outputs.csv`) never see two runs mixed
//!   either: an `--out DIR` that holds only dpaudit's set (and `train --unet`'s `checkpoint/`)
//!   is committed by one exchange of the whole folder ([`swap_set`]: the old set stays whole
//!   until the new one is), and a folder shared with other files or a `train` stem set moves
//!   every old member aside before the first new one is renamed in (a kill leaves part of the
//!   new set, never old files beside new ones).
//! * Writers of one set are serialised by a lock file (`.dpaudit-lock`,
//!   `.<stem>.dpaudit-lock`): without `--force` a second writer is refused while the first
//!   holds it; with `--force` it waits, then replaces the whole set.
//! * Nothing replaces a non-regular file (a device such as `/dev/null` or `/dev/stdout`, a
//!   pipe: single-file outputs are written *into* a character device or pipe, never renamed
//!   over it; a directory or socket is refused) or a file this command read as input.
//!
//! For tests of torn outputs, the environment variable `DPAUDIT_INJECT_WRITE_FAILURE=<name>`
//! makes the write of any file whose name is `<name>` (or every file, with `*`) fail half-way
//! with "No space left on device", exactly as a full disk does. `DPAUDIT_FAULT_AT=<n>` ends the
//! process (exit 134, no clean-up, as a kill does) just before the n-th rename of a set commit
//! (1 = the manifest, 2… = the members in order).

use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::error::{Error, ErrorKind, Result};
use crate::input::is_input;
pub use crate::input::{
    manifest_name, note_input, released_line, verify_member, Manifest, ManifestEntry, MANIFEST_SUFFIX,
};

/// Environment variable that injects a write failure (see the module docs).
pub(crate) const INJECT_WRITE_FAILURE_ENV: &str = "DPAUDIT_INJECT_WRITE_FAILURE";

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
        refuse_link(dir)?;
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

    /// Writes every `(file name, bytes)` as one set ([`commit_set`]): all appear at once, or
    /// none. Refuses (before writing anything) when a target exists and `force` is off.
    /// Returns the written paths.
    pub(crate) fn write_files(&self, files: &[(String, Vec<u8>)]) -> Result<Vec<PathBuf>> {
        commit_set(&self.dir, None, files, self.force)
    }
}

/// True for the names a report writes into `--out DIR`.
pub(crate) fn is_report_file(name: &str) -> bool {
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

/// Refuses an output folder that is a symbolic link: a link at the place of a folder dpaudit
/// writes into (`--out DIR`, `OUT/checkpoint`, a `train` stem's folder) would send every file,
/// and with `--force` every replacement, to wherever it points; dpaudit writes through no link
/// it did not create. Only the last component is checked (a link higher up is the user's
/// layout).
pub fn refuse_link(dir: &Path) -> Result<()> {
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.file_type().is_symlink() => Err(Error::new(
            ErrorKind::Input,
            format!(
                "output folder `{}` is a symbolic link (to `{}`); dpaudit does not write through a link it did not create: remove it, or give the folder it points to",
                dir.display(),
                std::fs::read_link(dir).map(|t| t.display().to_string()).unwrap_or_default()
            ),
        )
        .with_file(dir)),
        _ => Ok(()),
    }
}

/// Creates the output folder `dir` (and its parents) when missing; a symbolic link at `dir` is
/// refused ([`refuse_link`]).
pub(crate) fn create_out_dir(dir: &Path) -> Result<()> {
    refuse_link(dir)?;
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, &e))?;
    refuse_link(dir)
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
    match target_kind(path)? {
        Target::Regular if !overwrite => Err(exists_error(path)),
        _ => Ok(()),
    }
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
    match target_kind(path)? {
        Target::Special => return write_into_special(path, bytes),
        Target::Fd(fd) => return write_into_fd(path, fd, bytes),
        Target::Regular if !force => return Err(exists_error(path)),
        _ => {}
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
pub(crate) fn file_permissions() -> std::fs::Permissions {
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

// ---------------------------------------------------------------------------------------------
// Inputs and targets

/// What an output path names now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// Nothing.
    Absent,
    /// A regular file (not an input of this command).
    Regular,
    /// A character device or a pipe (`/dev/null`, `/dev/stdout` on a terminal): written into,
    /// never replaced.
    Special,
    /// One of the process's own open files by name (`/dev/stdout`, `/dev/stderr`, `/dev/fd/N`,
    /// `/proc/self/fd/N`, or a link to one): written into that descriptor, never replaced, even
    /// when it is a redirected regular file (renaming over `/dev/stdout` would replace the
    /// system's link).
    Fd(u32),
}

/// The descriptor `path` names when it is one of the process's own open files by name (see
/// [`Target::Fd`]), following at most 8 symbolic links.
fn fd_alias(path: &Path) -> Option<u32> {
    let mut p = path.to_path_buf();
    for _ in 0..8 {
        let t = p.to_str()?;
        let n = match t {
            "/dev/stdin" => Some(0),
            "/dev/stdout" => Some(1),
            "/dev/stderr" => Some(2),
            _ => t
                .strip_prefix("/dev/fd/")
                .or_else(|| t.strip_prefix("/proc/self/fd/"))
                .and_then(|n| n.parse().ok()),
        };
        if n.is_some() {
            return n;
        }
        let next = std::fs::read_link(&p).ok()?;
        p = if next.is_absolute() {
            next
        } else {
            parent_dir(&p).join(next)
        };
    }
    None
}

/// Writes `bytes` into the open descriptor `fd` ([`Target::Fd`]): stdout and stderr through
/// the process's own handles (at their current position), another descriptor by opening its
/// name in place (no temporary file, no rename).
fn write_into_fd(path: &Path, fd: u32, bytes: &[u8]) -> Result<()> {
    let r = match fd {
        1 => {
            let mut o = std::io::stdout().lock();
            o.write_all(bytes).and_then(|_| o.flush())
        }
        2 => {
            let mut o = std::io::stderr().lock();
            o.write_all(bytes).and_then(|_| o.flush())
        }
        _ => return write_into_special(path, bytes),
    };
    r.map_err(|e| write_error(path, &e))
}

/// Classifies an output path; refuses a directory, block device, socket, or an input file.
fn target_kind(path: &Path) -> Result<Target> {
    if let Some(fd) = fd_alias(path) {
        return Ok(Target::Fd(fd));
    }
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        // A link is never replaced: one to a device or pipe is written into, any other refused.
        return match std::fs::metadata(path) {
            Ok(m) if m.file_type().is_char_device() || m.file_type().is_fifo() => Ok(Target::Special),
            _ => Err(Error::new(
                ErrorKind::Input,
                format!(
                    "output `{}` is a symbolic link (to `{}`); dpaudit never replaces a link nor writes through one it did not create: give the file it points to",
                    path.display(),
                    std::fs::read_link(path).map(|t| t.display().to_string()).unwrap_or_default()
                ),
            )),
        };
    }
    let m = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // A dangling symbolic link: renaming over it replaces the link, which is fine.
            return Ok(Target::Absent);
        }
        Err(e) => return Err(Error::io(path, &e)),
    };
    let ft = m.file_type();
    if ft.is_file() {
        if is_input(&m) {
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "`{}` is an input of this command; refusing to overwrite it with an output",
                    path.display()
                ),
            ));
        }
        return Ok(Target::Regular);
    }
    if ft.is_char_device() || ft.is_fifo() {
        return Ok(Target::Special);
    }
    Err(Error::new(
        ErrorKind::Io,
        format!(
            "output `{}` exists and is not a regular file (a directory, block device or socket); dpaudit never replaces it",
            path.display()
        ),
    ))
}

/// Writes into a character device or pipe in place (no temporary file, no rename).
fn write_into_special(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| write_error(path, &e))?;
    f.write_all(bytes)
        .and_then(|_| f.flush())
        .map_err(|e| write_error(path, &e))
}

// ---------------------------------------------------------------------------------------------
// Output sets: staging, manifest, lock

/// Environment variable of the commit fault hook (see the module docs).
pub(crate) const FAULT_AT_ENV: &str = "DPAUDIT_FAULT_AT";

/// Exit code of a process ended by the fault hook.
pub const FAULT_EXIT: i32 = 134;

static COMMIT_STEPS: AtomicUsize = AtomicUsize::new(0);

/// Counts one rename of a set commit; ends the process at the step `DPAUDIT_FAULT_AT` names.
fn commit_step() {
    let n = COMMIT_STEPS.fetch_add(1, Ordering::SeqCst) + 1;
    if let Some(v) = std::env::var_os(FAULT_AT_ENV) {
        if v.to_str().and_then(|s| s.trim().parse::<usize>().ok()) == Some(n) {
            // As a kill: no destructor runs, no temporary file is removed.
            std::process::exit(FAULT_EXIT);
        }
    }
}

const STAGING_PREFIX: &str = ".dpaudit-tmp-set-";

fn lock_name(stem: Option<&str>) -> String {
    match stem {
        None => ".dpaudit-lock".into(),
        Some(s) => format!(".{s}.dpaudit-lock"),
    }
}

/// The lock of one output set, held while it is staged and committed.
struct SetLock {
    file: std::fs::File,
    path: PathBuf,
}

impl SetLock {
    /// Takes the lock: refused while another writer holds it unless `wait` (`--force`).
    fn acquire(path: PathBuf, wait: bool) -> Result<Self> {
        loop {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(|e| Error::io(&path, &e))?;
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    if !wait {
                        return Err(Error::new(
                            ErrorKind::Io,
                            format!(
                                "another dpaudit is writing the same outputs (lock `{}`); wait for it, or pass --force to wait and then replace its outputs",
                                path.display()
                            ),
                        ));
                    }
                    file.lock().map_err(|e| Error::io(&path, &e))?;
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(&path, &e)),
            }
            // The previous holder removes the file when done: hold the lock only if the path
            // still names the file we locked, else start again.
            let mine = file.metadata().map_err(|e| Error::io(&path, &e))?;
            match std::fs::metadata(&path) {
                Ok(now) if now.dev() == mine.dev() && now.ino() == mine.ino() => {
                    return Ok(SetLock { file, path });
                }
                _ => continue,
            }
        }
    }
}

impl Drop for SetLock {
    fn drop(&mut self) {
        // Remove the path only while it still names our file: after a whole-folder commit
        // ([`swap_set`]) the path is in the new folder, where another writer may hold its own.
        let mine = self.file.metadata().ok();
        let now = std::fs::symlink_metadata(&self.path).ok();
        if let (Some(a), Some(b)) = (mine, now) {
            if a.dev() == b.dev() && a.ino() == b.ino() {
                let _ = std::fs::remove_file(&self.path);
            }
        }
        let _ = self.file.unlock();
    }
}

/// Removes staging folders of `stem`'s set left by a killed writer (only called under the
/// set's lock, so no live writer owns them).
fn clean_debris(dir: &Path, stem: Option<&str>) {
    let prefix = format!("{STAGING_PREFIX}{}-", stem.unwrap_or(""));
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(&prefix) && e.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Commits `files` into `dir` as one output set (see the module docs): under the set's lock,
/// refuses existing members without `force` (and non-regular or input files always), stages
/// and syncs every file, renames the manifest, then every member. `stem` names a stem set
/// (`train`), None the `--out DIR` set. Returns the written paths.
pub fn commit_set(dir: &Path, stem: Option<&str>, files: &[(String, Vec<u8>)], force: bool) -> Result<Vec<PathBuf>> {
    for (name, _) in files {
        check_file_name(name)?;
    }
    refuse_link(dir)?;
    if !dir.is_dir() {
        return Err(Error::new(
            ErrorKind::Io,
            format!("cannot write into `{}`: it is not a directory", dir.display()),
        ));
    }
    let _lock = SetLock::acquire(dir.join(lock_name(stem)), force)?;
    clean_debris(dir, stem);
    for (name, _) in files {
        let p = dir.join(name);
        match target_kind(&p)? {
            Target::Absent => {}
            Target::Regular if force => {}
            Target::Regular => return Err(exists_error(&p)),
            Target::Special | Target::Fd(_) => {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!(
                        "output `{}` is a device or pipe; dpaudit never replaces it",
                        p.display()
                    ),
                ))
            }
        }
    }
    let mname = manifest_name(stem);
    let old = old_members(dir, &mname, files, force);
    if stem.is_none() {
        if let Some(out) = swap_set(dir, files, &mname, &old)? {
            return Ok(out);
        }
    }
    let staging = tempfile::Builder::new()
        .prefix(&format!("{STAGING_PREFIX}{}-", stem.unwrap_or("")))
        .tempdir_in(dir)
        .map_err(|e| not_writable(dir, &e))?;
    let staged_manifest = stage_files(staging.path(), dir, files, &mname)?;
    sync_dir(staging.path());
    // From here the set changes: first the manifest (the old set stops reading as valid), then
    // every member of the old set is moved aside (so no path shows an old file beside a new
    // one, to any reader), then the new members (the new set reads as valid once the last is
    // in place). A kill in between leaves a part of the new set, never a mix of two runs.
    commit_step();
    std::fs::rename(&staged_manifest, dir.join(&mname)).map_err(|e| write_error(&dir.join(&mname), &e))?;
    if !old.is_empty() {
        let aside = staging.path().join(".replaced");
        std::fs::create_dir(&aside).map_err(|e| not_writable(dir, &e))?;
        for name in &old {
            commit_step();
            match std::fs::rename(dir.join(name), aside.join(name)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(write_error(&dir.join(name), &e)),
            }
        }
    }
    let mut out = Vec::with_capacity(files.len());
    for (name, _) in files {
        let p = dir.join(name);
        commit_step();
        std::fs::rename(staging.path().join(name), &p).map_err(|e| write_error(&p, &e))?;
        out.push(p);
    }
    sync_dir(dir);
    drop(staging);
    Ok(out)
}

/// The members of the set now in `dir` that a commit of `files` replaces: every name of
/// `files` that exists as a regular file, and with `force` every regular file the set's
/// current manifest (`mname`) names (names that are not plain file names are ignored).
fn old_members(dir: &Path, mname: &str, files: &[(String, Vec<u8>)], force: bool) -> Vec<String> {
    let mut names: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
    if let Some(m) = std::fs::read(dir.join(mname))
        .ok()
        .filter(|_| force)
        .and_then(|b| serde_json::from_slice::<Manifest>(&b).ok())
    {
        for e in m.files {
            if check_file_name(&e.name).is_ok() && e.name != mname && !names.contains(&e.name) {
                names.push(e.name);
            }
        }
    }
    names.retain(|n| std::fs::symlink_metadata(dir.join(n)).is_ok_and(|m| m.file_type().is_file()));
    names
}

/// Subfolders of an `--out DIR` that dpaudit itself writes there (`train --unet`'s periodic
/// checkpoint, see [`commit_folder`]) and that a whole-folder commit carries over.
const OWNED_SUBFOLDERS: [&str; 1] = ["checkpoint"];

/// Prefix of the staging folder of a whole-folder set commit ([`swap_set`]), beside the folder.
const SWAP_STAGING_PREFIX: &str = ".dpaudit-tmp-outset-";

/// Commits the `--out DIR` set `files` by one exchange of the whole folder, when `dir` holds
/// nothing but dpaudit's own files: this set's members old and new (`old`), its manifest, lock
/// files, staging debris and the folders of [`OWNED_SUBFOLDERS`] (carried over as hard links,
/// the files are never rewritten in place). The new folder is staged beside `dir` and takes
/// its place in one `renameat2(RENAME_EXCHANGE)`, so any reader, dpaudit or not, sees the whole
/// old set or the whole new one, and the old set stays in place until the new one is complete.
/// Returns None (nothing changed) when `dir` holds anything else — a folder the user shares
/// with other files keeps them, and is committed file by file by [`commit_set`] — or when the
/// parent folder cannot take the staging folder or the exchange is unavailable.
fn swap_set(dir: &Path, files: &[(String, Vec<u8>)], mname: &str, old: &[String]) -> Result<Option<Vec<PathBuf>>> {
    let Some(name) = dir.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return Ok(None);
    };
    if name == "." || name == ".." {
        return Ok(None);
    }
    let mut carry: Vec<String> = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, &e))?;
    for e in entries {
        let e = e.map_err(|e| Error::io(dir, &e))?;
        let n = e.file_name().to_string_lossy().into_owned();
        let ours = files.iter().any(|(f, _)| *f == n)
            || old.contains(&n)
            || n == mname
            || n == lock_name(None)
            || n.starts_with(".dpaudit-probe-")
            || n.starts_with(&format!("{STAGING_PREFIX}-"))
            || OWNED_SUBFOLDERS
                .iter()
                .any(|c| n.starts_with(&format!("{FOLDER_STAGING_PREFIX}{c}-")));
        if ours {
            continue;
        }
        if OWNED_SUBFOLDERS.contains(&n.as_str()) && e.file_type().is_ok_and(|t| t.is_dir()) {
            carry.push(n);
            continue;
        }
        // The lock of an owned subfolder: stale (a killed writer's) unless someone holds it.
        let stale_lock = OWNED_SUBFOLDERS.iter().any(|c| n == format!(".{c}.dpaudit-lock"))
            && std::fs::File::open(e.path()).is_ok_and(|f| f.try_lock().is_ok());
        if stale_lock {
            continue;
        }
        return Ok(None);
    }
    let parent = parent_dir(dir);
    // Staging folders of this folder's set left by a killed writer (we hold the set's lock).
    let prefix = format!("{SWAP_STAGING_PREFIX}{name}-");
    if let Ok(entries) = std::fs::read_dir(parent) {
        for e in entries.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with(&prefix) && e.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let Ok(staging) = tempfile::Builder::new().prefix(&prefix).tempdir_in(parent) else {
        return Ok(None);
    };
    if let Ok(m) = std::fs::metadata(dir) {
        let _ = std::fs::set_permissions(staging.path(), m.permissions());
    }
    stage_files(staging.path(), dir, files, mname)?;
    for c in &carry {
        if link_tree(&dir.join(c), &staging.path().join(c)).is_err() {
            return Ok(None);
        }
    }
    sync_dir(staging.path());
    // The one step that changes what readers see.
    commit_step();
    if exchange(staging.path(), dir).is_err() {
        return Ok(None);
    }
    sync_dir(parent);
    // `staging` now holds the old folder (and the lock file we hold), removed on drop.
    drop(staging);
    Ok(Some(files.iter().map(|(n, _)| dir.join(n)).collect()))
}

/// Recreates the folder `from` at `to` with hard links of its files (and copies of its
/// symbolic links); anything else (a device, a socket) is an error.
fn link_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir(to)?;
    std::fs::set_permissions(to, std::fs::metadata(from)?.permissions())?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let t = e.file_type()?;
        let dst = to.join(e.file_name());
        if t.is_dir() {
            link_tree(&e.path(), &dst)?;
        } else if t.is_file() {
            std::fs::hard_link(e.path(), &dst)?;
        } else if t.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(e.path())?, &dst)?;
        } else {
            return Err(std::io::Error::from(std::io::ErrorKind::Unsupported));
        }
    }
    Ok(())
}

/// Writes and syncs `files` and their manifest (named `mname`) into the staging folder
/// `staging` of a commit into `dir` (errors name the final path in `dir`); returns the staged
/// manifest's path. Shared by [`commit_set`] and [`commit_folder`].
fn stage_files(staging: &Path, dir: &Path, files: &[(String, Vec<u8>)], mname: &str) -> Result<PathBuf> {
    let mut entries = Vec::with_capacity(files.len());
    for (name, bytes) in files {
        let p = dir.join(name);
        let written = std::fs::File::create(staging.join(name)).and_then(|mut f| {
            if injected_failure(&p) {
                f.write_all(&bytes[..bytes.len() / 2])?;
                return Err(std::io::Error::from_raw_os_error(28));
            }
            f.write_all(bytes)?;
            f.sync_all()
        });
        written.map_err(|e| write_error(&p, &e))?;
        entries.push(ManifestEntry {
            name: name.clone(),
            sha256: super::sha256_hex(bytes),
            bytes: bytes.len() as u64,
        });
    }
    let manifest = Manifest {
        dpaudit_manifest: 1,
        files: entries,
    };
    let mbytes = serde_json::to_vec_pretty(&manifest).map_err(|e| Error::input(format!("manifest: {e}")))?;
    let staged_manifest = staging.join(mname);
    std::fs::File::create(&staged_manifest)
        .and_then(|mut f| {
            f.write_all(&mbytes)?;
            f.sync_all()
        })
        .map_err(|e| write_error(&dir.join(mname), &e))?;
    Ok(staged_manifest)
}

/// Prefix of the staging folder of a whole-folder commit ([`commit_folder`]), beside the folder.
const FOLDER_STAGING_PREFIX: &str = ".dpaudit-tmp-folder-";

/// Commits `files` as the whole content of the folder `dir` (a folder dpaudit owns entirely,
/// such as `OUT/checkpoint/`), by one rename of a folder: every file and the manifest are
/// written and synced in a staging folder beside `dir`, which then takes `dir`'s place in one
/// step — `rename` when `dir` is absent, an atomic exchange (`renameat2(RENAME_EXCHANGE)`)
/// when it exists, after which the old folder is removed. So any reader, dpaudit or not, sees
/// either the whole old folder or the whole new one at `dir`, never a mix, and the old folder
/// is replaced only once its successor is complete (a kill while the successor is staged
/// leaves the old one as it was). Where the exchange is unavailable (another OS or a file
/// system without it) the old folder is first renamed aside (`dir` is then briefly absent,
/// never mixed). Writers are serialised by a lock file beside `dir`; staging folders left by
/// a killed writer are removed by the next commit.
pub fn commit_folder(dir: &Path, files: &[(String, Vec<u8>)]) -> Result<Vec<PathBuf>> {
    for (name, _) in files {
        check_file_name(name)?;
    }
    refuse_link(dir)?;
    let parent = parent_dir(dir);
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| Error::new(ErrorKind::Io, format!("`{}` has no folder name", dir.display())))?;
    std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, &e))?;
    let _lock = SetLock::acquire(parent.join(format!(".{name}.dpaudit-lock")), true)?;
    let prefix = format!("{FOLDER_STAGING_PREFIX}{name}-");
    if let Ok(entries) = std::fs::read_dir(parent) {
        for e in entries.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with(&prefix) && e.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    if std::fs::symlink_metadata(dir).is_ok_and(|m| !m.is_dir()) {
        return Err(Error::new(
            ErrorKind::Io,
            format!("cannot replace `{}`: it is not a directory", dir.display()),
        ));
    }
    // Mode 0777 less the umask, as a folder made by create_dir_all (a tempdir is 0700).
    let staging = tempfile::Builder::new()
        .prefix(&prefix)
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o777))
        .tempdir_in(parent)
        .map_err(|e| not_writable(parent, &e))?;
    stage_files(staging.path(), dir, files, &manifest_name(None))?;
    sync_dir(staging.path());
    // The one step that changes what readers see.
    commit_step();
    let staged = staging.keep();
    let swapped = if dir.exists() {
        match exchange(&staged, dir) {
            Ok(()) => true,
            Err(_) => {
                // No atomic exchange here: the old folder aside, then the new one in place.
                let aside = tempfile::Builder::new()
                    .prefix(&prefix)
                    .tempdir_in(parent)
                    .map_err(|e| not_writable(parent, &e))?
                    .keep();
                std::fs::rename(dir, &aside).map_err(|e| write_error(dir, &e))?;
                std::fs::rename(&staged, dir).map_err(|e| write_error(dir, &e))?;
                let _ = std::fs::remove_dir_all(&aside);
                false
            }
        }
    } else {
        std::fs::rename(&staged, dir).map_err(|e| write_error(dir, &e))?;
        false
    };
    sync_dir(parent);
    if swapped {
        // `staged` now holds the old folder.
        let _ = std::fs::remove_dir_all(&staged);
    }
    Ok(files.iter().map(|(n, _)| dir.join(n)).collect())
}

/// Atomically exchanges the folders `a` and `b` (Linux `renameat2(RENAME_EXCHANGE)`).
#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let ca = std::ffi::CString::new(a.as_os_str().as_bytes())?;
    let cb = std::ffi::CString::new(b.as_os_str().as_bytes())?;
    // SAFETY: both arguments are NUL-terminated paths that live across the call; renameat2
    // reads them and touches no other memory of this process.
    #[allow(unsafe_code)]
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// No atomic exchange on this OS: the caller renames the old folder aside instead.
#[cfg(not(target_os = "linux"))]
fn exchange(_a: &Path, _b: &Path) -> std::io::Result<()> {
    Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
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
