//! `dpaudit calibrate` (placeholder).

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<i32> {
    Err(crate::Error::input("`calibrate` is not yet implemented").into())
}
