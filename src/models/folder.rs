//! The files of a diffusers folder as dpaudit writes and reads it (names, where the UNet, the
//! scheduler config and the DP ledger sit): plain paths, no tensors, so the accounting chain
//! (`check FOLDER`, reports listing a folder's inputs) needs no model code. Also the card's
//! `training.randomness` texts.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The weights file name diffusers writes.
pub const WEIGHTS: &str = "diffusion_pytorch_model.safetensors";

/// The dpaudit card beside the diffusers files.
pub const CARD: &str = "dpaudit-card.toml";
/// The DP ledger beside the diffusers files (an event file `account --event` reads).
pub const LEDGER: &str = "dpaudit-ledger.toml";
/// The training record `mia` checks the split against.
pub const TRAINING: &str = "training.json";
/// The scheduler config written beside the UNet.
pub const SCHEDULER: &str = "scheduler_config.json";
/// The canaries of a `--canaries m` run (contents and the secret inclusion bits).
pub const CANARIES: &str = "canaries.csv";
/// The gradient canaries of a `--canary-kind both` run (beside the input canaries in
/// [`CANARIES`]; alone, gradient canaries are written to [`CANARIES`]).
pub const GRADIENT_CANARIES: &str = "gradient-canaries.csv";
/// The white-box record of a `--canaries m --canary-kind gradient` run: every noisy update at
/// every gradient canary's coordinate, [steps, m] float32 in units of C.
pub const OBSERVATIONS: &str = "canary-observations.npy";

/// Every file a released folder may hold (what a signature must cover when present).
pub const RELEASED: [&str; 9] = [
    "config.json",
    WEIGHTS,
    SCHEDULER,
    CARD,
    TRAINING,
    LEDGER,
    CANARIES,
    GRADIENT_CANARIES,
    OBSERVATIONS,
];

/// The folder holding `config.json` for a diffusers checkpoint given as `path` (the UNet folder
/// itself, a pipeline folder with `unet/`, or the `config.json` file), or `None` when `path` is
/// not a diffusers checkpoint.
pub fn unet_dir(path: &Path) -> Option<PathBuf> {
    if path.is_file() && path.file_name().is_some_and(|n| n == "config.json") {
        return path.parent().map(Path::to_path_buf);
    }
    if path.join("config.json").is_file() {
        return Some(path.to_path_buf());
    }
    if path.join("unet").join("config.json").is_file() {
        return Some(path.join("unet"));
    }
    None
}

/// The scheduler config of a UNet folder: beside the UNet, beside the folder given, or in a
/// pipeline's `scheduler/`.
pub fn find_scheduler(unet_dir: &Path, dir: &Path) -> Option<PathBuf> {
    [
        unet_dir.join("scheduler_config.json"),
        dir.join("scheduler_config.json"),
        dir.join("scheduler").join("scheduler_config.json"),
        unet_dir.join("..").join("scheduler").join("scheduler_config.json"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

/// The files that identify what a diffusers folder holds, with their roles (`config`, `weights`,
/// `scheduler`, `card`, `ledger`), those that exist: what `model info` hashes and every report
/// on the folder lists among its inputs. A pipeline folder's are its `unet/` and `scheduler/`.
pub fn folder_files(dir: &Path) -> Vec<(&'static str, PathBuf)> {
    let Some(u) = unet_dir(dir) else {
        return Vec::new();
    };
    let mut v = vec![("config", u.join("config.json")), ("weights", u.join(WEIGHTS))];
    if let Some(s) = find_scheduler(&u, dir) {
        v.push(("scheduler", s));
    }
    for (role, name) in [("card", CARD), ("ledger", LEDGER)] {
        if let Some(p) = [u.join(name), dir.join(name)].into_iter().find(|p| p.is_file()) {
            v.push((role, p));
        }
    }
    v.retain(|(_, p)| p.is_file());
    v
}

/// The DP ledger of a diffusers folder (`dpaudit-ledger.toml` beside the UNet, or in the folder
/// given), the event file `check` and `account --event` read for it. A folder without one is an
/// error that says why (trained without DP, or outside dpaudit) and names the folder.
pub fn folder_ledger(dir: &Path) -> Result<PathBuf> {
    let u = unet_dir(dir).unwrap_or_else(|| dir.to_path_buf());
    [u.join(LEDGER), dir.join(LEDGER)]
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::input(format!(
                "a folder: dpaudit reads a diffusers folder's DP ledger ({LEDGER}), and there is none in it (a model trained without DP, or outside dpaudit, has no ledger; give an event file or a sampler config instead)"
            ))
            .with_file(dir)
        })
}

/// `training.randomness` of a run whose randomness came from the operating system's CSPRNG.
pub const RANDOMNESS_OS: &str = "os: drawn from the operating system's CSPRNG (not reproducible)";
/// `training.randomness` of a seeded run.
pub const RANDOMNESS_SEEDED: &str = "seeded: not private against anyone who knows the seed";
