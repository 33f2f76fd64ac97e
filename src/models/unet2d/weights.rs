//! The weights of a diffusers `UNet2DModel`: the tensors of its safetensors file handed out by
//! the names and shapes of the [`super::graph::Graph`], naming the missing, mis-shaped or
//! left-over tensor.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use candle_core::Tensor;

use crate::error::{Error, Result};

/// The tensors of a safetensors file, handed out by name with the expected shape; remembers
/// which were used so that leftovers can be reported.
pub struct WeightStore {
    tensors: HashMap<String, Tensor>,
    used: RefCell<BTreeSet<String>>,
    file: PathBuf,
}

impl WeightStore {
    /// Wraps already validated (f32, finite) tensors read from `file`.
    /// Attention projections saved under diffusers' old names are renamed to the current ones
    /// ([`super::graph::current_name`]).
    pub fn new(tensors: HashMap<String, Tensor>, file: &Path) -> Self {
        WeightStore {
            tensors: tensors
                .into_iter()
                .map(|(k, v)| (super::graph::current_name(&k), v))
                .collect(),
            used: RefCell::new(BTreeSet::new()),
            file: file.to_path_buf(),
        }
    }

    /// The tensor `name`, which must have `shape`.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let t = self.tensors.get(name).ok_or_else(|| {
            Error::input(format!(
                "tensor `{name}` is missing (the config's architecture needs it with shape {shape:?})"
            ))
            .with_file(&self.file)
        })?;
        if t.dims() != shape {
            return Err(Error::input(format!(
                "tensor `{name}` has shape {:?}, the config's architecture needs {shape:?} (shape mismatch)",
                t.dims()
            ))
            .with_file(&self.file));
        }
        self.used.borrow_mut().insert(name.to_string());
        Ok(t.clone())
    }

    /// Tensors in the file that the architecture did not use (sorted).
    pub fn unused(&self) -> Vec<String> {
        let used = self.used.borrow();
        let mut v: Vec<String> = self.tensors.keys().filter(|k| !used.contains(*k)).cloned().collect();
        v.sort();
        v
    }

    /// The file the tensors came from.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// Number of scalar values in every tensor of the file.
    pub fn parameters(&self) -> usize {
        self.tensors.values().map(|t| t.elem_count()).sum()
    }
}
