//! The interface attacks need from a denoiser: batched ε-prediction on flat images.

use crate::error::Result;

/// A batched ε-prediction denoiser on images of one fixed shape (C, H, W), given as flat
/// row-major rows of C·H·W values in the model's data range (usually [−1, 1]).
pub trait EpsPredictor {
    /// (C, H, W) of one image.
    fn sample_shape(&self) -> [usize; 3];

    /// Values per image, C·H·W.
    fn dim(&self) -> usize {
        self.sample_shape().iter().product()
    }

    /// ε̂(x_t, t) for `x` holding `t.len()` rows of [`EpsPredictor::dim`] values, one timestep
    /// per row (0-indexed DDPM steps). Implementations batch internally so memory stays bounded.
    fn predict_eps(&self, x: &[f32], t: &[usize]) -> Result<Vec<f32>>;
}

impl EpsPredictor for super::Net {
    fn sample_shape(&self) -> [usize; 3] {
        [1, super::SIDE, super::SIDE]
    }

    fn predict_eps(&self, x: &[f32], t: &[usize]) -> Result<Vec<f32>> {
        self.predict(x, t)
    }
}
