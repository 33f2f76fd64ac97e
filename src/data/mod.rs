//! Training and attack data on its own, below the models that use it.
//!
//! * [`digits`]: the 8×8 digits data set (`fixtures/data/digits.csv.gz`), the member/non-member/
//!   public split manifests every data set shares (disjoint, hashed) and the SHA-256 helpers a
//!   card records.
//! * [`images`]: image data sets of any size for diffusers checkpoints (the shipped MNIST digits,
//!   PNG folders, `.npy` arrays) and their splits.
//! * [`npy`]: `.npy` reading and writing.

pub mod digits;
pub mod images;
pub mod npy;

pub use digits::{Dataset, SplitManifest};
