//! Work vectors kept for the next computation of the process.
//!
//! A fresh vector of a few hundred KiB or more is mapped by the allocator straight from the
//! kernel, and every 4 KiB page of it is faulted in and cleared on its first write (≈ 1–2 µs a
//! page). A calibration composes a PLD ten times or more, each with its own transform buffers of
//! up to a few MiB: those faults were ≈ 25 % of a whole `dpaudit calibrate` process's CPU time.
//! A [`Pool`] hands out vectors whose pages are already mapped; [`Pooled`] gives its vector back
//! when dropped. The contents are always set by [`Pool::take`], so a reused vector is
//! indistinguishable from a fresh one.

use std::ops::{Deref, DerefMut};
use std::sync::Mutex;

/// Most bytes a pool keeps (its smallest vectors are dropped first); a larger vector is not kept.
const POOL_MAX_BYTES: usize = 64 << 20;

/// Most vectors a pool keeps.
const POOL_MAX_VECTORS: usize = 16;

/// A set of free vectors of `T`.
pub(crate) struct Pool<T: 'static> {
    free: Mutex<Vec<Vec<T>>>,
}

impl<T: Copy + Send + 'static> Pool<T> {
    /// An empty pool (usable in a `static`).
    pub(crate) const fn new() -> Self {
        Pool {
            free: Mutex::new(Vec::new()),
        }
    }

    /// A vector of `n` copies of `fill`: the smallest free vector that holds `n` without growing,
    /// else the largest free one, grown (a large vector is moved by remapping its pages, so only
    /// the new part is faulted in), else a new one.
    pub(crate) fn take(&'static self, n: usize, fill: T) -> Pooled<T> {
        let reused = self.free.lock().ok().and_then(|mut free| {
            let fits = free
                .iter()
                .enumerate()
                .filter(|(_, v)| v.capacity() >= n)
                .min_by_key(|(_, v)| v.capacity())
                .map(|(i, _)| i);
            let best = fits.or_else(|| {
                free.iter()
                    .enumerate()
                    .max_by_key(|(_, v)| v.capacity())
                    .map(|(i, _)| i)
            })?;
            Some(free.swap_remove(best))
        });
        let mut v = reused.unwrap_or_default();
        v.clear();
        v.resize(n, fill);
        Pooled { v, pool: self }
    }

    fn put(&self, v: Vec<T>) {
        let bytes = |v: &Vec<T>| v.capacity() * std::mem::size_of::<T>();
        if v.capacity() == 0 || bytes(&v) > POOL_MAX_BYTES {
            return;
        }
        let Ok(mut free) = self.free.lock() else {
            return;
        };
        free.push(v);
        // Drop the smallest vectors while over either limit.
        while free.len() > POOL_MAX_VECTORS || free.iter().map(bytes).sum::<usize>() > POOL_MAX_BYTES {
            let smallest = free
                .iter()
                .enumerate()
                .min_by_key(|(_, v)| v.capacity())
                .map(|(i, _)| i)
                .unwrap_or(0);
            free.swap_remove(smallest);
        }
    }
}

/// A vector from a [`Pool`], given back to it when dropped.
pub(crate) struct Pooled<T: Copy + Send + 'static> {
    v: Vec<T>,
    pool: &'static Pool<T>,
}

impl<T: Copy + Send + 'static> Deref for Pooled<T> {
    type Target = Vec<T>;
    fn deref(&self) -> &Vec<T> {
        &self.v
    }
}

impl<T: Copy + Send + 'static> DerefMut for Pooled<T> {
    fn deref_mut(&mut self) -> &mut Vec<T> {
        &mut self.v
    }
}

impl<T: Copy + Send + 'static> Drop for Pooled<T> {
    fn drop(&mut self) {
        self.pool.put(std::mem::take(&mut self.v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static POOL: Pool<f64> = Pool::new();

    #[test]
    fn a_reused_vector_is_set_as_a_fresh_one_would_be() {
        let mut a = POOL.take(1000, 1.5);
        a.iter_mut().for_each(|x| *x = 7.0);
        let cap = a.capacity();
        drop(a);
        // The same storage comes back, holding what was asked for, not what it held.
        let b = POOL.take(10, 0.0);
        assert_eq!(b.capacity(), cap);
        assert_eq!(&b[..], &[0.0; 10]);
        // A request larger than every free vector grows the largest free one (none is free
        // here, so it gets a new one), filled as asked.
        let c = POOL.take(5000, 2.0);
        assert_eq!(c.len(), 5000);
        assert!(c.iter().all(|&x| x == 2.0));
        drop((b, c));
        // Over the byte limit (the 5,000-element vector grown past it): not kept.
        let big = POOL.take(POOL_MAX_BYTES / 8 + 1, 0.0);
        drop(big);
        let free = POOL.free.lock().unwrap();
        assert!(free.iter().all(|v| v.capacity() * 8 <= POOL_MAX_BYTES));
        assert!(free.len() <= POOL_MAX_VECTORS);
    }
}
