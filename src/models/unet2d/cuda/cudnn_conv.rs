//! cuDNN 2-D convolution forward with an explicit math type (feature `cudnn`).
//!
//! candle's own cuDNN path leaves the convolution descriptor at `CUDNN_DEFAULT_MATH`, which on
//! Ampere and later lets cuDNN run fp32 convolutions on tensor cores with TF32 inputs: not the
//! fp32 the report promises. This op sets the math type of `--precision` ([`Math`]) on every call
//! (`CUDNN_FMA_MATH` for fp32, as PyTorch does with `torch.backends.cudnn.allow_tf32 = False`;
//! `CUDNN_DEFAULT_MATH` for tf32; `CUDNN_TENSOR_OP_MATH` for bf16 data with f32 accumulation),
//! and caches, per shape, the descriptors with cuDNN's algorithm choice, so a call after the first
//! is one `cudnnConvolutionForward`. The choice is a pair, algorithm and math type: cuDNN picks its
//! kernel from both, so the descriptor is set to the math type cuDNN chose with the algorithm
//! (within what the precision allows) before it runs. How the choice is made
//! (heuristic or measured) and where it is kept: [`super::algo_record`].
//!
//! The crate denies `unsafe`; this module needs it for the cuDNN call itself and for the
//! uninitialised output and workspace buffers (cuDNN writes every output element with β = 0).
#![allow(unsafe_code)]

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::rc::Rc;
use std::sync::Arc;

use candle_core::cuda::cudarc;
use candle_core::cuda::{CudaDevice, CudaStorage, DeviceId};
use candle_core::{CpuStorage, CustomOp2, Layout, Shape, WithDType};
use cudarc::cudnn::{sys, ConvDescriptor, ConvForward, Cudnn, CudnnDataType, FilterDescriptor, TensorDescriptor};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, DeviceSlice, SyncOnDrop};

use super::algo_record::{Choice, Search};

/// The arithmetic cuDNN may use: `--precision` as this op sees it (the models' precision module
/// maps its setting here, so this module does not depend on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Math {
    /// IEEE fp32 (`CUDNN_FMA_MATH`).
    Fp32,
    /// TF32 tensor cores for f32 data (`CUDNN_DEFAULT_MATH`).
    Tf32,
    /// Tensor cores for bf16 data with f32 accumulation (`CUDNN_TENSOR_OP_MATH`).
    Bf16,
}

/// `y = conv2d(x, w)` (no bias), stride and padding equal in both directions, dilation 1.
pub struct CudnnConv2d {
    /// Zero padding on each side.
    pub padding: usize,
    /// Stride.
    pub stride: usize,
    /// Which arithmetic cuDNN may use.
    pub precision: Math,
}

/// How a shape's algorithm is chosen for `precision` when the record has none:
/// [`super::algo_record::search_for`] of `DPAUDIT_CUDNN_ALGO` (read once; a setting not
/// understood is warned about once), the precision and whether the record is kept in a file.
fn search_for(precision: Math) -> Search {
    static SETTING: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    static WARNED: std::sync::Once = std::sync::Once::new();
    let setting = SETTING.get_or_init(crate::diagnostics::cudnn_algo);
    let (search, warning) = super::algo_record::search_for(
        setting.as_deref(),
        precision == Math::Fp32,
        super::algo_record::on_file(),
    );
    if let Some(w) = warning {
        WARNED.call_once(|| eprintln!("{w}"));
    }
    search
}

/// (input dims, filter dims, padding, stride, math, data type) on a device.
type PlanKey = (DeviceId, ([i32; 4], [i32; 4], usize, usize, u8, u8));

/// One convolution shape's cuDNN descriptors and algorithm: built once, so that a call is one
/// `cudnnConvolutionForward` (no descriptor creation, setting and destruction per call).
struct Plan<T: CudnnDataType> {
    conv: ConvDescriptor<f32>,
    x: TensorDescriptor<T>,
    w: FilterDescriptor<T>,
    y: TensorDescriptor<T>,
    algo: sys::cudnnConvolutionFwdAlgo_t,
    ws: usize,
}

thread_local! {
    static HANDLES: RefCell<HashMap<DeviceId, Arc<Cudnn>>> = RefCell::new(HashMap::new());
    static PLANS: RefCell<HashMap<PlanKey, Rc<dyn Any>>> = RefCell::new(HashMap::new());
    /// Each device's workspace, grown to the largest a plan needs: all of dpaudit's GPU work is
    /// on the device's one stream, so consecutive convolutions share it in stream order.
    static WORKSPACES: RefCell<HashMap<DeviceId, CudaSlice<u8>>> = RefCell::new(HashMap::new());
    /// Workspaces replaced by larger ones, kept alive for the graphs that captured them.
    static RETIRED: RefCell<Vec<CudaSlice<u8>>> = const { RefCell::new(Vec::new()) };
    /// Raw handles for choosing algorithms (cudarc exposes none), kept for the process.
    static RAW_HANDLES: RefCell<HashMap<DeviceId, sys::cudnnHandle_t>> = RefCell::new(HashMap::new());
}

/// This thread's cuDNN handle on `dev` (created on first use: loading cuDNN's libraries takes a
/// noticeable time, so the CUDA UNet forward creates it when the model is loaded).
pub(crate) fn handle(dev: &CudaDevice) -> candle_core::Result<Arc<Cudnn>> {
    let key = dev.id();
    HANDLES.with(|m| {
        if let Some(h) = m.borrow().get(&key) {
            return Ok(h.clone());
        }
        let h = Cudnn::new(dev.cuda_stream()).map_err(|e| candle_core::Error::Msg(format!("cuDNN: {e:?}")))?;
        m.borrow_mut().insert(key, h.clone());
        Ok(h)
    })
}

/// The algorithm numbered `a` in cuDNN's enumeration (a record's entry), if there is one.
fn algo_from_i32(a: i32) -> Option<sys::cudnnConvolutionFwdAlgo_t> {
    use sys::cudnnConvolutionFwdAlgo_t as A;
    Some(match a {
        0 => A::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
        1 => A::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
        2 => A::CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
        3 => A::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
        4 => A::CUDNN_CONVOLUTION_FWD_ALGO_FFT,
        5 => A::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
        6 => A::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
        7 => A::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
        _ => return None,
    })
}

/// The math type numbered `m` in cuDNN's enumeration (a record's entry), if there is one.
fn math_from_i32(m: i32) -> Option<sys::cudnnMathType_t> {
    use sys::cudnnMathType_t as M;
    Some(match m {
        0 => M::CUDNN_DEFAULT_MATH,
        1 => M::CUDNN_TENSOR_OP_MATH,
        2 => M::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION,
        3 => M::CUDNN_FMA_MATH,
        _ => return None,
    })
}

/// The algorithm record's key of one convolution (`super::algo_record`): the GPU (name and
/// compute capability), the cuDNN version, how the choice is made, data type, the math type the
/// precision allows, shape. `None` when the GPU cannot be named (then nothing is recorded or
/// reused).
#[allow(clippy::too_many_arguments)]
fn record_key(
    dev: &CudaDevice,
    xd: [i32; 4],
    wd: [i32; 4],
    padding: usize,
    stride: usize,
    math: sys::cudnnMathType_t,
    dtype: sys::cudnnDataType_t,
    how: Search,
) -> Option<String> {
    thread_local! {
        static GPU: RefCell<HashMap<DeviceId, Option<String>>> = RefCell::new(HashMap::new());
    }
    let gpu = GPU.with(|m| {
        m.borrow_mut()
            .entry(dev.id())
            .or_insert_with(|| {
                let ctx = dev.cuda_stream().context().clone();
                let name = ctx.name().ok()?;
                let (a, b) = ctx.compute_capability().ok()?;
                // SAFETY: a plain query of the loaded library's version.
                let v = unsafe { sys::cudnnGetVersion() };
                Some(format!("{name}|cc{a}.{b}|cudnn{v}"))
            })
            .clone()
    })?;
    Some(format!(
        "{gpu}|{}|data{}|math{}|x{xd:?}|w{wd:?}|pad{padding}|stride{stride}",
        how.word(),
        dtype as u32,
        math as u32
    ))
}

fn cerr<E: std::fmt::Debug>(e: E) -> candle_core::Error {
    candle_core::Error::Msg(format!("cuDNN convolution: {e:?}"))
}

impl CudnnConv2d {
    fn math(&self) -> sys::cudnnMathType_t {
        match self.precision {
            Math::Fp32 => sys::cudnnMathType_t::CUDNN_FMA_MATH,
            Math::Tf32 => sys::cudnnMathType_t::CUDNN_DEFAULT_MATH,
            Math::Bf16 => sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
        }
    }

    /// Output dimensions of the convolution of an input `xd` with filters `wd`.
    fn out_dims(&self, xd: [i32; 4], wd: [i32; 4]) -> [i32; 4] {
        let (p, s) = (self.padding as i32, self.stride as i32);
        [
            xd[0],
            wd[0],
            (xd[2] + 2 * p - wd[2]) / s + 1,
            (xd[3] + 2 * p - wd[3]) / s + 1,
        ]
    }

    /// `y = α·conv(x, w) + β·y` on contiguous NCHW buffers described by `xd` and `wd`.
    #[allow(clippy::too_many_arguments)]
    fn run<T, X, W, Y>(
        &self,
        dev: &CudaDevice,
        x: &X,
        xd: [i32; 4],
        w: &W,
        wd: [i32; 4],
        (alpha, beta): (T, T),
        y: &mut Y,
    ) -> candle_core::Result<()>
    where
        T: CudnnDataType + WithDType + 'static,
        X: DevicePtr<T>,
        W: DevicePtr<T>,
        Y: DevicePtrMut<T>,
    {
        let key: PlanKey = (
            dev.id(),
            (xd, wd, self.padding, self.stride, self.precision as u8, T::DTYPE as u8),
        );
        let plan = match PLANS.with(|m| m.borrow().get(&key).cloned()) {
            Some(p) => p
                .downcast::<Plan<T>>()
                .map_err(|_| cerr("a cached plan of another data type"))?,
            None => {
                let t0 = std::time::Instant::now();
                let p = Rc::new(self.plan::<T>(dev, xd, wd)?);
                crate::timing::add_within_time("cuDNN plan", t0);
                PLANS.with(|m| m.borrow_mut().insert(key, p.clone()));
                p
            }
        };
        let op = ConvForward {
            conv: &plan.conv,
            x: &plan.x,
            w: &plan.w,
            y: &plan.y,
        };
        WORKSPACES.with(|m| -> candle_core::Result<()> {
            let mut m = m.borrow_mut();
            let grow = m.get(&key.0).is_none_or(|b| b.len() < plan.ws.max(1));
            if grow {
                let t0 = std::time::Instant::now();
                // SAFETY: cuDNN's scratch space; nothing reads it before cuDNN writes it.
                let b = unsafe { dev.cuda_stream().alloc::<u8>(plan.ws.max(1)) }.map_err(cerr)?;
                if let Some(old) = m.insert(key.0, b) {
                    // A captured CUDA graph may still point at it: kept, never freed.
                    RETIRED.with(|r| r.borrow_mut().push(old));
                }
                crate::timing::add_within_time("cuDNN workspace growth", t0);
            }
            let workspace = m.get_mut(&key.0).ok_or_else(|| cerr("no workspace"))?;
            // SAFETY: the descriptors describe exactly these contiguous NCHW buffers.
            unsafe {
                op.launch::<CudaSlice<u8>, _, _, _>(plan.algo, Some(workspace), (alpha, beta), x, w, y)
                    .map_err(cerr)?;
            }
            Ok(())
        })
    }

    /// The descriptors of one shape and cuDNN's algorithm and math type for them, with its
    /// workspace size, built on the shape's first call: from the record when it holds a choice
    /// for this GPU, cuDNN, search and shape that cuDNN still accepts, else chosen (heuristic or
    /// measured, [`search_for`]) and recorded.
    fn plan<T: CudnnDataType>(&self, dev: &CudaDevice, xd: [i32; 4], wd: [i32; 4]) -> candle_core::Result<Plan<T>> {
        let cudnn = handle(dev)?;
        let (p, s) = (self.padding as i32, self.stride as i32);
        let cap = self.math();
        // Data in T; products accumulated in f32 (PSEUDO_BFLOAT16 for bf16, FLOAT for f32).
        let mut conv = cudnn
            .create_conv2d::<f32>(
                [p, p],
                [s, s],
                [1, 1],
                sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
            )
            .map_err(cerr)?;
        conv.set_math_type(cap).map_err(cerr)?;
        let x = cudnn
            .create_4d_tensor::<T>(sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW, xd)
            .map_err(cerr)?;
        let w = cudnn
            .create_4d_filter::<T>(sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW, wd)
            .map_err(cerr)?;
        let y = cudnn
            .create_4d_tensor::<T>(sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW, self.out_dims(xd, wd))
            .map_err(cerr)?;
        // The workspace `algo` needs with the descriptor's math type as set now.
        let workspace = |conv: &ConvDescriptor<f32>, algo| {
            ConvForward {
                conv,
                x: &x,
                w: &w,
                y: &y,
            }
            .get_workspace_size(algo)
        };
        let search = search_for(self.precision);
        // A choice made for this GPU, cuDNN, search and shape by an earlier run
        // (`super::algo_record`), used when cuDNN still accepts it for these descriptors.
        let key = record_key(dev, xd, wd, self.padding, self.stride, cap, T::DATA_TYPE, search);
        let t0 = std::time::Instant::now();
        let recorded = key
            .as_deref()
            .and_then(super::algo_record::lookup)
            .and_then(|c| Some((algo_from_i32(c.algo)?, math_from_i32(c.math)?)))
            .filter(|&(_, m)| self.math_allowed(m));
        if let Some((algo, math)) = recorded {
            if conv.set_math_type(math).is_ok() {
                if let Ok(ws) = workspace(&conv, algo) {
                    crate::timing::add_within_time("cuDNN plan: algorithm from the record", t0);
                    return Ok(Plan {
                        conv,
                        x,
                        w,
                        y,
                        algo,
                        ws,
                    });
                }
            }
            conv.set_math_type(cap).map_err(cerr)?;
        }
        // SAFETY: raw cuDNN calls on descriptors and scratch buffers of the described sizes
        // (see there).
        let chosen = unsafe { self.choose::<T>(dev, xd, wd, search) };
        let (algo, math) = match chosen {
            Some(c) => c,
            // cudarc's heuristic pick, run with the precision's own math type (not recorded:
            // a later run tries the search again).
            None => (
                ConvForward {
                    conv: &conv,
                    x: &x,
                    w: &w,
                    y: &y,
                }
                .pick_algorithm()
                .map_err(cerr)?,
                cap,
            ),
        };
        conv.set_math_type(math).map_err(cerr)?;
        crate::timing::add_within_time("cuDNN plan: algorithm choice", t0);
        if let (Some(k), Some(_)) = (&key, chosen) {
            super::algo_record::store(
                k,
                Choice {
                    algo: algo as i32,
                    math: math as i32,
                },
            );
        }
        let t0 = std::time::Instant::now();
        let ws = workspace(&conv, algo).map_err(cerr)?;
        crate::timing::add_within_time("cuDNN plan: workspace size", t0);
        Ok(Plan {
            conv,
            x,
            w,
            y,
            algo,
            ws,
        })
    }

    /// Math types a chosen algorithm may run with at this precision: fp32 only IEEE products
    /// (`CUDNN_FMA_MATH`), never TF32; tf32 and bf16 also tensor cores, never a conversion to a
    /// narrower data type (`CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION`).
    fn math_allowed(&self, m: sys::cudnnMathType_t) -> bool {
        use sys::cudnnMathType_t as M;
        match self.precision {
            Math::Fp32 => m == M::CUDNN_FMA_MATH,
            Math::Tf32 | Math::Bf16 => matches!(m, M::CUDNN_FMA_MATH | M::CUDNN_DEFAULT_MATH | M::CUDNN_TENSOR_OP_MATH),
        }
    }

    /// cuDNN's choice for one shape, as an (algorithm, math type) pair: the first of cuDNN's
    /// ranking that succeeded and has a math type this precision allows
    /// ([`Self::math_allowed`]); when measured, also deterministic (repeating it repeats its
    /// result; the heuristic's first pair is taken as cudarc's `pick_algorithm` takes it). The pair matters: PyTorch's note
    /// "behavior of cudnnFind and cudnnGet" (aten/src/ATen/native/cudnn/Conv_v7.cpp) records that
    /// cuDNN runs a slower kernel when the algorithm runs with another math type than the one it
    /// was ranked with, and cudarc's `pick_algorithm` returns the algorithm alone.
    ///
    /// * [`Search::Heuristic`]: `cudnnGetConvolutionForwardAlgorithm_v7` (no convolution runs).
    /// * [`Search::Measured`]: `cudnnFindConvolutionForwardAlgorithmEx` on zeroed scratch
    ///   buffers, with a workspace of at most 1 GiB and a quarter of the free memory, twice: the
    ///   first pass loads every algorithm's kernels (CUDA loads modules lazily, at a kernel's
    ///   first launch), the second's timings rank them. Which algorithm is fastest is itself a
    ///   timing, so two machines may choose differently and their scores differ in the last
    ///   bits; the record keeps one machine's choice.
    ///
    /// `None` when none qualifies or a call fails (the caller falls back to cudarc's heuristic
    /// pick). A separate handle and raw descriptors, because cudarc exposes neither the raw
    /// descriptors nor Find.
    ///
    /// # Safety
    /// Called on the device's thread with its context current (as every call of this module).
    unsafe fn choose<T: CudnnDataType>(
        &self,
        dev: &CudaDevice,
        xd: [i32; 4],
        wd: [i32; 4],
        search: Search,
    ) -> Option<(sys::cudnnConvolutionFwdAlgo_t, sys::cudnnMathType_t)> {
        use std::ptr::null_mut;
        use sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS as OK;
        /// Destroys what was created, on every return.
        struct RawDesc {
            x: sys::cudnnTensorDescriptor_t,
            y: sys::cudnnTensorDescriptor_t,
            w: sys::cudnnFilterDescriptor_t,
            c: sys::cudnnConvolutionDescriptor_t,
        }
        impl Drop for RawDesc {
            fn drop(&mut self) {
                // SAFETY: each handle was created by this function (or is null and skipped).
                unsafe {
                    if !self.c.is_null() {
                        sys::cudnnDestroyConvolutionDescriptor(self.c);
                    }
                    if !self.w.is_null() {
                        sys::cudnnDestroyFilterDescriptor(self.w);
                    }
                    if !self.y.is_null() {
                        sys::cudnnDestroyTensorDescriptor(self.y);
                    }
                    if !self.x.is_null() {
                        sys::cudnnDestroyTensorDescriptor(self.x);
                    }
                }
            }
        }
        let mut r = RawDesc {
            x: null_mut(),
            y: null_mut(),
            w: null_mut(),
            c: null_mut(),
        };
        let stream = dev.cuda_stream();
        let yd = self.out_dims(xd, wd);
        let nchw = sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW;
        let (p, st) = (self.padding as i32, self.stride as i32);
        // Each call only after the ones before it succeeded.
        macro_rules! ok {
            ($e:expr) => {
                if $e != OK {
                    return None;
                }
            };
        }
        // One raw handle per device and thread, on the device's stream, kept for the process.
        let h = RAW_HANDLES.with(|m| {
            let mut m = m.borrow_mut();
            if let Some(&h) = m.get(&dev.id()) {
                return Some(h);
            }
            let mut h: sys::cudnnHandle_t = null_mut();
            if sys::cudnnCreate(&mut h) != OK || sys::cudnnSetStream(h, stream.cu_stream() as _) != OK {
                return None;
            }
            m.insert(dev.id(), h);
            Some(h)
        })?;
        let tensor = |d: &mut sys::cudnnTensorDescriptor_t, n: [i32; 4]| {
            sys::cudnnCreateTensorDescriptor(d) == OK
                && sys::cudnnSetTensor4dDescriptor(*d, nchw, T::DATA_TYPE, n[0], n[1], n[2], n[3]) == OK
        };
        if !(tensor(&mut r.x, xd) && tensor(&mut r.y, yd)) {
            return None;
        }
        ok!(sys::cudnnCreateFilterDescriptor(&mut r.w));
        ok!(sys::cudnnSetFilter4dDescriptor(
            r.w,
            T::DATA_TYPE,
            nchw,
            wd[0],
            wd[1],
            wd[2],
            wd[3]
        ));
        ok!(sys::cudnnCreateConvolutionDescriptor(&mut r.c));
        ok!(sys::cudnnSetConvolution2dDescriptor(
            r.c,
            p,
            p,
            st,
            st,
            1,
            1,
            sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
            sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
        ));
        // The precision's math type bounds what cuDNN considers.
        ok!(sys::cudnnSetConvolutionMathType(r.c, self.math()));
        let mut perf: [sys::cudnnConvolutionFwdAlgoPerf_t; 8] = std::mem::zeroed();
        let mut n: std::ffi::c_int = 0;
        match search {
            Search::Heuristic => {
                ok!(sys::cudnnGetConvolutionForwardAlgorithm_v7(
                    h,
                    r.x,
                    r.w,
                    r.c,
                    r.y,
                    perf.len() as std::ffi::c_int,
                    &mut n,
                    perf.as_mut_ptr(),
                ));
            }
            Search::Measured => {
                let count = |d: [i32; 4]| d.iter().map(|&v| v.max(0) as usize).product::<usize>();
                let bytes = std::mem::size_of::<T>();
                let free = stream.context().mem_get_info().map(|(f, _)| f).unwrap_or(0);
                let ws_len = (free / 4).min(1 << 30);
                let x = stream.alloc_zeros::<u8>(count(xd) * bytes).ok()?;
                let w = stream.alloc_zeros::<u8>(count(wd) * bytes).ok()?;
                let mut y = stream.alloc_zeros::<u8>(count(yd) * bytes).ok()?;
                // Scratch only cuDNN writes before reading.
                let mut ws = stream.alloc::<u8>(ws_len.max(1)).ok()?;
                let (xp, _gx) = x.device_ptr(&stream);
                let (wp, _gw) = w.device_ptr(&stream);
                let (yp, _gy) = y.device_ptr_mut(&stream);
                let (wsp, _gws) = ws.device_ptr_mut(&stream);
                // Pass 1 loads the kernels; pass 2's timings rank the algorithms.
                for _ in 0..2 {
                    ok!(sys::cudnnFindConvolutionForwardAlgorithmEx(
                        h,
                        r.x,
                        xp as *const c_void,
                        r.w,
                        wp as *const c_void,
                        r.c,
                        r.y,
                        yp as *mut c_void,
                        perf.len() as std::ffi::c_int,
                        &mut n,
                        perf.as_mut_ptr(),
                        wsp as *mut c_void,
                        ws_len.max(1),
                    ));
                }
                stream.synchronize().ok()?;
            }
        }
        perf[..(n.max(0) as usize).min(perf.len())]
            .iter()
            .find(|q| {
                q.status == OK
                    && (search == Search::Heuristic || q.determinism == sys::cudnnDeterminism_t::CUDNN_DETERMINISTIC)
                    && self.math_allowed(q.mathType)
            })
            .map(|q| (q.algo, q.mathType))
    }

    #[allow(clippy::too_many_arguments)]
    fn launch<T: CudnnDataType + WithDType + DeviceRepr + 'static>(
        &self,
        dev: &CudaDevice,
        x: &CudaSlice<T>,
        xl: &Layout,
        w: &CudaSlice<T>,
        wl: &Layout,
        xd: [i32; 4],
        wd: [i32; 4],
    ) -> candle_core::Result<(CudaSlice<T>, [usize; 4])> {
        let yd = self.out_dims(xd, wd);
        let n: usize = yd.iter().map(|&v| v as usize).product();
        let stream = dev.cuda_stream();
        // SAFETY: cuDNN writes every element of `y` (β = 0).
        let mut y = unsafe { stream.alloc::<T>(n) }.map_err(cerr)?;
        let xv = x.slice(xl.start_offset()..);
        let wv = w.slice(wl.start_offset()..);
        self.run(dev, &xv, xd, &wv, wd, (T::from_f64(1.0), T::from_f64(0.0)), &mut y)?;
        Ok((y, yd.map(|v| v as usize)))
    }

    /// `y = α·conv(x, w) + β·y` on raw f32 device pointers (contiguous NCHW, `xd` and `wd` their
    /// dimensions, `y` sized for the output) on `dev`'s stream: the CUDA UNet forward's call,
    /// which folds biases and residuals into β.
    ///
    /// # Safety
    /// `x`, `w` and `y` must point to live device buffers of at least the described sizes on
    /// `dev`'s context, used only on its stream.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_raw(
        &self,
        dev: &CudaDevice,
        x: u64,
        xd: [i32; 4],
        w: u64,
        wd: [i32; 4],
        (alpha, beta): (f32, f32),
        y: u64,
    ) -> candle_core::Result<()> {
        let stream = dev.cuda_stream();
        let count = |d: [i32; 4]| d.iter().map(|&v| v as usize).product::<usize>();
        let xr = Raw {
            ptr: x,
            len: count(xd),
            stream: &stream,
        };
        let wr = Raw {
            ptr: w,
            len: count(wd),
            stream: &stream,
        };
        let mut yr = Raw {
            ptr: y,
            len: count(self.out_dims(xd, wd)),
            stream: &stream,
        };
        self.run(dev, &xr, xd, &wr, wd, (alpha, beta), &mut yr)
    }
}

/// A raw f32 device pointer that cuDNN reads or writes (buffers the CUDA UNet forward manages;
/// every use is on the one stream, so no event tracking is needed).
struct Raw<'a> {
    ptr: u64,
    len: usize,
    stream: &'a Arc<CudaStream>,
}

impl DeviceSlice<f32> for Raw<'_> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }
}

impl DevicePtr<f32> for Raw<'_> {
    fn device_ptr<'b>(&'b self, _: &'b CudaStream) -> (cudarc::driver::sys::CUdeviceptr, SyncOnDrop<'b>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

impl DevicePtrMut<f32> for Raw<'_> {
    fn device_ptr_mut<'b>(&'b mut self, _: &'b CudaStream) -> (cudarc::driver::sys::CUdeviceptr, SyncOnDrop<'b>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

impl CustomOp2 for CudnnConv2d {
    fn name(&self) -> &'static str {
        "dpaudit-cudnn-conv2d"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        Err(candle_core::Error::Msg(
            "the cuDNN convolution runs on CUDA tensors only".into(),
        ))
    }

    fn cuda_fwd(
        &self,
        xs: &CudaStorage,
        xl: &Layout,
        ws: &CudaStorage,
        wl: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        use candle_core::cuda::CudaStorageSlice as S;
        if !xl.is_contiguous() || !wl.is_contiguous() {
            return Err(candle_core::Error::Msg(
                "cuDNN convolution: inputs must be contiguous".into(),
            ));
        }
        let dims4 = |l: &Layout| -> candle_core::Result<[i32; 4]> {
            let d = l.shape().dims4()?;
            Ok([d.0 as i32, d.1 as i32, d.2 as i32, d.3 as i32])
        };
        let (xd, wd) = (dims4(xl)?, dims4(wl)?);
        if xd[1] != wd[1] {
            return Err(candle_core::Error::Msg(format!(
                "cuDNN convolution: {} input channels, filter expects {}",
                xd[1], wd[1]
            )));
        }
        let dev = xs.device.clone();
        match (&xs.slice, &ws.slice) {
            (S::F32(x), S::F32(w)) => {
                let (y, yd) = self.launch(&dev, x, xl, w, wl, xd, wd)?;
                Ok((CudaStorage::wrap_cuda_slice(y, dev), Shape::from(yd.to_vec())))
            }
            (S::BF16(x), S::BF16(w)) => {
                let (y, yd) = self.launch(&dev, x, xl, w, wl, xd, wd)?;
                Ok((CudaStorage::wrap_cuda_slice(y, dev), Shape::from(yd.to_vec())))
            }
            _ => Err(candle_core::Error::Msg(
                "cuDNN convolution: input and filter must both be f32 or both bf16".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sys::cudnnMathType_t as M;

    /// The record's numbers are cuDNN's own enumerations (a record written by one build is read
    /// by another), and each precision bounds the math types its convolutions may run with.
    #[test]
    fn record_numbers_are_cudnns_and_precisions_bound_the_math_types() {
        for a in 0..8 {
            assert_eq!(algo_from_i32(a).map(|x| x as i32), Some(a));
        }
        assert!(algo_from_i32(8).is_none() && algo_from_i32(-1).is_none());
        for m in 0..4 {
            assert_eq!(math_from_i32(m).map(|x| x as i32), Some(m));
        }
        assert!(math_from_i32(4).is_none() && math_from_i32(-1).is_none());
        assert_eq!(M::CUDNN_FMA_MATH as i32, 3);
        assert_eq!(M::CUDNN_DEFAULT_MATH as i32, 0);
        let conv = |precision| CudnnConv2d {
            padding: 1,
            stride: 1,
            precision,
        };
        let all = [
            M::CUDNN_DEFAULT_MATH,
            M::CUDNN_TENSOR_OP_MATH,
            M::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION,
            M::CUDNN_FMA_MATH,
        ];
        let allowed = |p: Math| all.into_iter().filter(|&m| conv(p).math_allowed(m)).collect::<Vec<_>>();
        // fp32: IEEE products only, never TF32.
        assert_eq!(allowed(Math::Fp32), vec![M::CUDNN_FMA_MATH]);
        // tf32 and bf16: tensor cores too, never a conversion to a narrower type.
        for p in [Math::Tf32, Math::Bf16] {
            assert_eq!(
                allowed(p),
                vec![M::CUDNN_DEFAULT_MATH, M::CUDNN_TENSOR_OP_MATH, M::CUDNN_FMA_MATH]
            );
        }
        // Each precision's own math type (what cuDNN is asked to consider) is allowed.
        for p in [Math::Fp32, Math::Tf32, Math::Bf16] {
            assert!(conv(p).math_allowed(conv(p).math()), "{p:?}");
        }
    }
}
