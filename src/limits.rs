//! Resource limits: every size taken from a file or a flag is checked here, before it becomes
//! memory or a loop.
//!
//! A size is refused when the memory it implies (estimated bytes) exceeds the memory cap, or
//! when the work it implies (estimated elementary operations) exceeds the work cap. Both caps
//! can be raised (or lowered) through environment variables:
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `DPAUDIT_MAX_MEMORY` | 4 GiB | bytes one input may make dpaudit allocate (`512M`, `16G`, `1T`, or plain bytes) |
//! | `DPAUDIT_MAX_WORK` | 2e11 | elementary operations one input may cost (about 1–10 minutes on one core) |
//!
//! The per-item costs below are deliberately generous estimates (they count every copy the
//! code makes), so an input that passes runs within the caps. A refusal is an input error
//! (exit code 2) naming the field, its value and the largest value that would pass. The full
//! table of limits is in docs/reliability.md.

use std::io::Read;
use std::path::Path;

use crate::error::{Error, Result};

/// Environment variable holding the memory cap (bytes, or with a K/M/G/T suffix).
pub(crate) const MEMORY_ENV: &str = "DPAUDIT_MAX_MEMORY";
/// Environment variable holding the work cap (elementary operations, e.g. `1e12`).
pub(crate) const WORK_ENV: &str = "DPAUDIT_MAX_WORK";
/// Default memory cap: 4 GiB (a sixth of the 24 GiB CI machines, shared by parallel jobs).
pub const DEFAULT_MEMORY: u64 = 4 << 30;
/// Default work cap: 2·10¹¹ elementary operations (≈ 1–10 minutes on one core).
pub const DEFAULT_WORK: f64 = 2e11;

/// Reads a cap from the environment: a positive number with an optional binary suffix
/// (K, M, G, T; `KiB`/`KB` spellings accepted). An unreadable value is an error naming the
/// variable, never a silent default.
fn env_cap(var: &str, default: f64, binary_suffix: bool) -> Result<f64> {
    let Ok(raw) = std::env::var(var) else {
        return Ok(default);
    };
    let s = raw.trim();
    let lower = s.to_ascii_lowercase();
    let (num, mult) = if binary_suffix {
        let stripped = lower.trim_end_matches("ib").trim_end_matches('b');
        match stripped.chars().last() {
            Some('k') => (&stripped[..stripped.len() - 1], 1024f64),
            Some('m') => (&stripped[..stripped.len() - 1], 1024f64.powi(2)),
            Some('g') => (&stripped[..stripped.len() - 1], 1024f64.powi(3)),
            Some('t') => (&stripped[..stripped.len() - 1], 1024f64.powi(4)),
            _ => (stripped, 1.0),
        }
    } else {
        (lower.as_str(), 1.0)
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v * mult),
        _ => Err(Error::field(
            var,
            format!("`{raw}` is not a positive size (examples: 8G, 512M, 1e12)"),
        )),
    }
}

thread_local! {
    /// Caps set by [`with_caps`] for the current thread (tests and fuzzing), overriding the
    /// environment.
    static OVERRIDE: std::cell::Cell<Option<(f64, f64)>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with the given memory and work caps on this thread (the environment is not
/// touched, so parallel tests do not see each other's caps). Used by the fuzz harness so that
/// every input it accepts is also cheap to run.
pub fn with_caps<T>(memory_bytes: f64, work: f64, f: impl FnOnce() -> T) -> T {
    let before = OVERRIDE.with(|c| c.replace(Some((memory_bytes, work))));
    struct Restore(Option<(f64, f64)>);
    impl Drop for Restore {
        fn drop(&mut self) {
            OVERRIDE.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(before);
    f()
}

/// The memory cap in bytes (`DPAUDIT_MAX_MEMORY`, default [`DEFAULT_MEMORY`]).
pub(crate) fn memory_cap() -> Result<f64> {
    if let Some((m, _)) = OVERRIDE.with(|c| c.get()) {
        return Ok(m);
    }
    env_cap(MEMORY_ENV, DEFAULT_MEMORY as f64, true)
}

/// The work cap in elementary operations (`DPAUDIT_MAX_WORK`, default [`DEFAULT_WORK`]).
pub(crate) fn work_cap() -> Result<f64> {
    if let Some((_, w)) = OVERRIDE.with(|c| c.get()) {
        return Ok(w);
    }
    env_cap(WORK_ENV, DEFAULT_WORK, false)
}

/// Bytes in a human unit, for messages.
pub(crate) fn human_bytes(b: f64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = b;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0} {}", UNITS[i])
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// What one unit of a size costs: bytes held at once and elementary operations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    /// Bytes per unit (all copies the code keeps at the same time).
    pub bytes: f64,
    /// Elementary operations per unit.
    pub work: f64,
}

impl Cost {
    /// A cost of `bytes` per unit and `work` operations per unit.
    pub const fn new(bytes: f64, work: f64) -> Self {
        Cost { bytes, work }
    }
}

/// Checks that `value` units of something costing `per_unit` fit the caps; `field` is the name
/// the user wrote (`schedule.levels`, `--points`). The error states the value, the largest
/// value that passes and which cap decided.
pub fn check(field: &str, value: f64, per_unit: Cost) -> Result<()> {
    check_in(field, value, per_unit, memory_cap()?, work_cap()?)
}

/// [`check`] against explicit caps (for tests and callers holding the caps already).
pub fn check_in(field: &str, value: f64, per_unit: Cost, mem_cap: f64, work_cap: f64) -> Result<()> {
    if value.is_nan() || value < 0.0 {
        return Err(Error::field(field, format!("must be a size ≥ 0, got {value}")));
    }
    // The largest value that passes both caps (a refusal by one cap states it, not the other
    // cap's larger maximum).
    let max_of = |cap: f64, per: f64| if per > 0.0 { (cap / per).floor() } else { f64::INFINITY };
    let max = max_of(mem_cap, per_unit.bytes).min(max_of(work_cap, per_unit.work));
    let bytes = value * per_unit.bytes;
    if bytes > mem_cap {
        return Err(Error::field(
            field,
            format!(
                "{} is above the limit of {} (it would need about {} of memory, more than the cap of {}; \
                 raise the cap with {MEMORY_ENV}=<bytes, e.g. 16G> if this machine has it)",
                fmt_count(value),
                fmt_count(max),
                human_bytes(bytes),
                human_bytes(mem_cap)
            ),
        ));
    }
    let work = value * per_unit.work;
    if work > work_cap {
        return Err(Error::field(
            field,
            format!(
                "{} is above the limit of {} (about {work:.1e} operations, more than the cap of {work_cap:.1e}, \
                 i.e. minutes to hours of computing; raise the cap with {WORK_ENV}=<operations, e.g. 1e13>)",
                fmt_count(value),
                fmt_count(max)
            ),
        ));
    }
    Ok(())
}

/// Integers below 2⁵³ printed as integers, larger values in scientific notation.
fn fmt_count(v: f64) -> String {
    if v < 9.007_199_254_740_992e15 && v.fract() == 0.0 {
        format!("{}", v as u64)
    } else {
        format!("{v:e}")
    }
}

// ---------------------------------------------------------------------------------------------
// Per-item costs (one place; docs/reliability.md lists them).

/// One noise level of a sampler schedule: the level, its step, the per-step table row, plot
/// points and the accounted event (≈ 1 KiB all told); accounting a distinct step costs up to
/// ~10⁵ operations (RDP over its orders).
pub const SCHEDULE_LEVEL: Cost = Cost::new(1024.0, 1e5);
/// One training timestep of a DDPM schedule (β, ᾱ and derived tables: a few f64 each).
pub const SCHEDULE_TIMESTEP: Cost = Cost::new(64.0, 100.0);
/// One grid point of a sweep: a sampler configuration and its accounted row per accountant.
pub const SWEEP_POINT: Cost = Cost::new(4096.0, 1e6);
/// One node of an event tree (a component, its path string and its RDP state: accounting a
/// distinct part costs up to ~10⁵ operations over the RDP orders).
pub const EVENT_PART: Cost = Cost::new(512.0, 1e5);
/// One bootstrap resample, per score resampled (an index, a copy and a sort step).
pub const BOOTSTRAP_SCORE: Cost = Cost::new(0.0, 50.0);
/// One value of a tensor held in f32, with its gradient and two Adam moments (4 × 4 bytes).
pub const TRAINED_PARAMETER: Cost = Cost::new(16.0, 6.0);
/// One row of a training batch: the image, its noise, the noisy input and the prediction
/// (4 × 64 f32) plus the activations the backward pass keeps (budgeted at 16 KiB a row).
pub const BATCH_ROW: Cost = Cost::new(16384.0, 0.0);
/// One f64 coordinate of a released vector (kept in the run's outputs).
pub const RELEASED_COORDINATE: Cost = Cost::new(8.0, 8.0);
/// One (trajectory, record) cell of the empirical denoiser's B × N distance and weight
/// matrices (f64, three live copies).
pub const DENOISER_CELL: Cost = Cost::new(32.0, 0.0);
/// One (trajectory, record, coordinate, step) unit of empirical-denoiser work (a distance term
/// and a weighted sum term).
pub const DENOISER_STEP: Cost = Cost::new(0.0, 4.0);
/// One decompressed byte of a data file: the text and the parsed numbers (≈ 3 bytes each).
pub const DECOMPRESSED_BYTE: Cost = Cost::new(3.0, 10.0);

/// One value of a `--canaries` canary: the ±1 image (f32), its copy among the private rows, its
/// text in `canaries.csv` and the per-sample work of training on it.
pub const CANARY_VALUE: Cost = Cost::new(32.0, 100.0);

/// Checks `--canaries m` for canaries of `dim` values each ([`CANARY_VALUE`] per value), before
/// any canary is drawn; the error counts canaries.
pub(crate) fn check_canaries(m: usize, dim: usize) -> Result<()> {
    let d = dim.max(1) as f64;
    check(
        "--canaries",
        m as f64,
        Cost::new(CANARY_VALUE.bytes * d, CANARY_VALUE.work * d),
    )
}
/// One byte of a text input file (TOML, CSV, JSON) while it is parsed: the text, the parser's
/// document tree and the typed values (measured ≈ 45 bytes per byte for a TOML event file of
/// 10⁶ leaves; budgeted at 96).
pub const TEXT_INPUT_BYTE: Cost = Cost::new(96.0, 100.0);
/// One claim of a claims file: its parsed table, its accounting (several accountants, lower
/// bounds) and its report rows.
pub const CLAIM: Cost = Cost::new(65536.0, 1e7);
/// One distinct leaf of a PLD composition: its discretised loss distribution (typically
/// 10⁴–10⁵ grid points of 8 bytes, kept until the composition) and its transforms.
pub const PLD_LEAF: Cost = Cost::new(1048576.0, 1e7);
/// One grid point of a sweep with the PLD accountant (a composition per point; the other
/// accountants cost [`SWEEP_POINT`]).
pub const SWEEP_POINT_PLD: Cost = Cost::new(4096.0, 1e7);
/// One optimiser step of `train` (the smallest model's forward and backward pass on a batch:
/// at least 10⁵ operations).
pub const TRAIN_STEP: Cost = Cost::new(0.0, 1e5);
/// One noise draw at one attacked step of `mia` (a model evaluation on every attacked record:
/// at least 10⁷ operations).
pub const MIA_DRAW: Cost = Cost::new(0.0, 1e7);
/// One decoded pixel value of an image set: the decoded byte and its f32 (and a copy).
pub const IMAGE_VALUE: Cost = Cost::new(9.0, 10.0);
/// One byte of a binary input read whole (a data file, a `.npy` array, a PNG image, before it
/// is decoded: decoding has its own checks, e.g. [`IMAGE_VALUE`]) and hashed.
pub const BINARY_INPUT_BYTE: Cost = Cost::new(1.0, 8.0);
/// One byte of a diffusers weights file: the file's bytes and the decoded f32 values (twice
/// the stored bytes for F16/BF16), hashed and checked.
pub const WEIGHTS_FILE_BYTE: Cost = Cost::new(3.0, 8.0);
/// One byte of a file that is only hashed (streamed, so no memory): SHA-256 at ≥ 1 GB/s.
pub const HASHED_BYTE: Cost = Cost::new(0.0, 8.0);
/// Largest number of worker threads (`RAYON_NUM_THREADS` above it is lowered to it): more
/// threads than this only add stacks and scheduling.
pub const MAX_THREADS: usize = 256;

/// Reads a text input file, refusing one larger than the memory cap allows
/// ([`TEXT_INPUT_BYTE`]) before reading it, and reading at most that many bytes (a FIFO or
/// `/dev/zero` has no size to check). Errors name the file.
pub fn read_input_text(path: &Path) -> Result<String> {
    let buf = read_file_capped(path, "file size", TEXT_INPUT_BYTE)?;
    String::from_utf8(buf).map_err(|_| {
        Error::io(
            path,
            &std::io::Error::new(std::io::ErrorKind::InvalidData, "stream did not contain valid UTF-8"),
        )
    })
}

/// Reads a binary input file whole, refusing one whose size, at `per_byte` (every copy the
/// caller keeps), exceeds the caps before any byte is read (a sparse 1 TB file is refused, not
/// allocated), and reading at most what the memory cap allows (a FIFO or `/dev/zero` has no
/// size to check). `field` names the input in the error; errors name the file.
pub fn read_file_capped(path: &Path, field: &str, per_byte: Cost) -> Result<Vec<u8>> {
    let cap = memory_cap()?;
    let max_bytes = if per_byte.bytes > 0.0 {
        (cap / per_byte.bytes).floor()
    } else {
        f64::MAX
    };
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, &e))?;
    let mut buf = Vec::new();
    if let Ok(m) = file.metadata() {
        if m.is_file() {
            check(field, m.len() as f64, per_byte).map_err(|e| e.with_file(path))?;
            buf.reserve_exact(m.len() as usize);
        }
    }
    (&file)
        .take((max_bytes as u64).saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(|e| Error::io(path, &e))?;
    if buf.len() as f64 > max_bytes {
        return Err(Error::field(
            field,
            format!(
                "more than {} bytes were read, above the limit for this input (memory cap {}; \
                 raise it with {MEMORY_ENV}=<bytes, e.g. 16G>)",
                fmt_count(max_bytes),
                human_bytes(cap)
            ),
        )
        .with_file(path));
    }
    Ok(buf)
}

/// SHA-256 (lower-case hex) and length of a file, streamed (no more memory than a buffer). A
/// regular file whose hashing would exceed the work cap ([`HASHED_BYTE`]) is refused first.
pub fn hash_file_capped(path: &Path, field: &str) -> Result<(String, u64)> {
    use sha2::Digest;
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, &e))?;
    if let Ok(m) = file.metadata() {
        if m.is_file() {
            check(field, m.len() as f64, HASHED_BYTE).map_err(|e| e.with_file(path))?;
        }
    }
    let max_bytes = (work_cap()? / HASHED_BYTE.work).floor() as u64;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n_total = 0u64;
    loop {
        let n = match file.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io(path, &e)),
        };
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        n_total += n as u64;
        if n_total > max_bytes {
            return Err(Error::field(
                field,
                format!(
                    "more than {} bytes were read, above what the work cap allows hashing \
                     (raise it with {WORK_ENV}=<operations, e.g. 1e12>)",
                    fmt_count(max_bytes as f64)
                ),
            )
            .with_file(path));
        }
    }
    Ok((h.finalize().iter().map(|b| format!("{b:02x}")).collect(), n_total))
}

/// Sets up the worker-thread pool once, at start: `RAYON_NUM_THREADS` (or the number of CPUs)
/// lowered to [`MAX_THREADS`], and a pool that cannot be started (too many threads for the
/// process's limits) retried with fewer threads down to one, so a thread count from the
/// environment never panics. Returns a note for the user when the count was lowered.
pub fn configure_threads() -> Option<String> {
    let asked = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut n = asked.unwrap_or(cpus).min(MAX_THREADS);
    let mut note = asked
        .filter(|&a| a > MAX_THREADS)
        .map(|a| format!("RAYON_NUM_THREADS={a} is above the limit of {MAX_THREADS} threads; using {MAX_THREADS}"));
    // The global pool can be built only once (a failed attempt cannot be retried), so a count
    // above the CPUs is first tried on a throw-away pool and halved until threads start.
    if n > cpus {
        let first = n;
        while n > 1 && rayon::ThreadPoolBuilder::new().num_threads(n).build().is_err() {
            n = (n / 2).max(1);
        }
        if n < first {
            note = Some(format!(
                "could not start {first} worker threads (process limits); using {n}"
            ));
        }
    }
    if rayon::ThreadPoolBuilder::new().num_threads(n).build_global().is_err() {
        note = Some(format!("could not start {n} worker threads; work runs on fewer"));
    }
    note
}

/// Checks a count given as `u64`/`usize` against `per_unit`.
pub fn check_count(field: &str, value: u64, per_unit: Cost) -> Result<()> {
    check(field, value as f64, per_unit)
}

/// Checks the product of several sizes (e.g. grid axes, trajectories × records × dimension);
/// the product is computed in floating point so it cannot overflow.
pub(crate) fn check_product(field: &str, factors: &[u64], per_unit: Cost) -> Result<()> {
    let v = factors.iter().fold(1.0f64, |a, &f| a * f as f64);
    check(field, v, per_unit)
}

/// Reads at most the bytes the memory cap allows for a (possibly decompressed) text stream,
/// so a small gzip file that inflates to gigabytes is refused before it is held in memory.
/// `path` names the file in errors.
pub(crate) fn read_text_capped(reader: impl Read, path: &Path) -> Result<String> {
    let cap = memory_cap()?;
    let max_bytes = (cap / DECOMPRESSED_BYTE.bytes).floor() as u64;
    let Some(buf) = read_at_most(reader, max_bytes, 0).map_err(|e| Error::io(path, &e))? else {
        return Err(Error::input(format!(
            "the data is larger than {} once decompressed (the limit for a memory cap of {}; \
             raise it with {MEMORY_ENV}=<bytes, e.g. 16G>)",
            human_bytes(max_bytes as f64),
            human_bytes(cap)
        ))
        .with_file(path));
    };
    String::from_utf8(buf).map_err(|_| Error::input("not UTF-8 text").with_file(path))
}

/// Reads a stream (e.g. a decompressor) to its end, counting what it yields: `None` as soon as
/// it has yielded more than `max_bytes`, having held at most `max_bytes` plus one read buffer.
/// The buffer grows geometrically but never past `max_bytes` (`read_to_end` doubles it, so a
/// stream just over half a limit could reserve twice its size); `hint` (e.g. a gzip trailer's
/// declared size) sizes it once, and is only a hint: the stream decides the length.
pub(crate) fn read_at_most(mut reader: impl Read, max_bytes: u64, hint: u64) -> std::io::Result<Option<Vec<u8>>> {
    const CHUNK: usize = 1 << 16;
    let max = usize::try_from(max_bytes).unwrap_or(usize::MAX);
    let mut buf: Vec<u8> = Vec::with_capacity(usize::try_from(hint).unwrap_or(0).min(max));
    let mut chunk = vec![0u8; CHUNK];
    loop {
        let n = match reader.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Ok(Some(buf));
        }
        if n > max - buf.len() {
            return Ok(None);
        }
        if buf.capacity() - buf.len() < n {
            let want = buf.capacity().saturating_mul(2).max(buf.len() + n).max(CHUNK).min(max);
            buf.reserve_exact(want - buf.len());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_reads_and_hashes_are_capped_even_without_a_size() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("w.bin");
        std::fs::write(&p, vec![7u8; 4096]).unwrap();
        // Within the caps: the bytes, and the streamed hash equals the hash of the bytes.
        let got = with_caps(1e6, 1e9, || read_file_capped(&p, "file size", BINARY_INPUT_BYTE)).unwrap();
        assert_eq!(got, vec![7u8; 4096]);
        let (h, n) = with_caps(1e6, 1e9, || hash_file_capped(&p, "file size")).unwrap();
        use sha2::Digest;
        let want: String = sha2::Sha256::digest(&got).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!((h, n), (want, 4096));
        // A regular file above the caps is refused by its size, naming the file.
        let e = with_caps(4000.0, 1e9, || read_file_capped(&p, "file size", BINARY_INPUT_BYTE)).unwrap_err();
        assert!(
            e.to_string().contains("file size") && e.to_string().contains("w.bin"),
            "{e}"
        );
        let e = with_caps(1e6, 8.0 * 4000.0, || hash_file_capped(&p, "file size")).unwrap_err();
        assert!(e.to_string().contains(WORK_ENV), "{e}");
        // A device without a size (endless zeros) is cut off at the cap, not read forever.
        let zero = Path::new("/dev/zero");
        let e = with_caps((1u64 << 20) as f64, 1e9, || {
            read_file_capped(zero, "file size", BINARY_INPUT_BYTE)
        })
        .unwrap_err();
        assert!(e.to_string().contains("more than 1048576 bytes were read"), "{e}");
        let e = with_caps(1e6, 8.0 * (1 << 20) as f64, || hash_file_capped(zero, "file size")).unwrap_err();
        assert!(e.to_string().contains("more than 1048576 bytes were read"), "{e}");
    }

    #[test]
    fn streams_are_cut_at_the_limit_without_reserving_past_it() {
        let data = vec![1u8; 300_000];
        let got = read_at_most(&data[..], 300_000, 0).unwrap().unwrap();
        assert_eq!(got.len(), 300_000);
        assert!(got.capacity() <= 300_000, "{}", got.capacity());
        assert!(read_at_most(&data[..], 299_999, 0).unwrap().is_none());
        // A hint above the limit reserves only the limit.
        let got = read_at_most(&data[..10], 100, u64::MAX).unwrap().unwrap();
        assert_eq!((got.len(), got.capacity()), (10, 100));
        // An endless stream stops at the limit.
        assert!(read_at_most(std::io::repeat(0), 1 << 20, 0).unwrap().is_none());
    }

    #[test]
    fn refusal_names_field_value_and_limit() {
        let e = check_in("schedule.levels", 1e12, SCHEDULE_LEVEL, 4.0 * 1024f64.powi(3), 2e11).unwrap_err();
        let s = e.to_string();
        assert!(
            s.starts_with("field `schedule.levels`: 1000000000000 is above the limit of 2000000"),
            "{s}"
        );
        assert!(s.contains(MEMORY_ENV), "{s}");
        let e = check_in("--bootstrap", 1e9, Cost::new(0.0, 1e3), 1e12, 2e11).unwrap_err();
        let s = e.to_string();
        assert!(s.contains("above the limit of 200000000"), "{s}");
        assert!(s.contains(WORK_ENV), "{s}");
    }

    #[test]
    fn sizes_within_caps_pass_and_nan_fails() {
        assert!(check_in("x", 1000.0, SCHEDULE_LEVEL, 1e9, 1e11).is_ok());
        assert!(check_in("x", f64::NAN, SCHEDULE_LEVEL, 1e9, 1e11).is_err());
        assert!(check_in("x", f64::INFINITY, SCHEDULE_LEVEL, 1e9, 1e11).is_err());
    }

    #[test]
    fn capped_reader_refuses_large_streams() {
        let small = read_text_capped(&b"1,2\n3,4\n"[..], Path::new("a.csv")).unwrap();
        assert_eq!(small, "1,2\n3,4\n");
    }

    #[test]
    fn human_units() {
        assert_eq!(human_bytes(512.0), "512 B");
        assert_eq!(human_bytes(4.0 * 1024f64.powi(3)), "4.0 GiB");
    }
}
