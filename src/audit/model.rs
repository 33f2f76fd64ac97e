//! `model info`: what a diffusers checkpoint folder holds (architecture, parameter count, file
//! hashes, scheduler), as the terminal text and the shared [`Report`] (one fact per line).

use std::path::Path;

use crate::error::Result;
use crate::models::diffusers::DiffusersCheckpoint;
use crate::report::{self, Report};

/// Loads the checkpoint at `dir` (on the CPU) and describes it.
pub fn info(dir: &Path) -> Result<super::Outcome> {
    let ck = DiffusersCheckpoint::load(dir, &candle_core::Device::Cpu)?;
    let text = ck.info();
    let mut r =
        Report::new(format!("dpaudit model info: {}", dir.display()), report::command_line()).for_command("model");
    r.add_input("config", &ck.config_path)?;
    for line in text.lines() {
        if let Some((k, v)) = line.split_once(": ") {
            r.fact(k.trim(), v.trim());
        }
    }
    r.conclude();
    Ok(super::Outcome::new(r, text))
}
