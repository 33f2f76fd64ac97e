// Kernels of the CUDA forward of the diffusers UNet2DModel (src/models/unet2d_cuda.rs).
// Compiled to PTX by build.rs with nvcc when the `cudnn` feature is on. Every tensor is f32,
// contiguous NCHW (or row-major [B, C] for per-image vectors). Element-wise kernels use a
// grid-stride loop over `n` elements; the launcher picks the grid.

#include <math.h>

#define GRID_STRIDE(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (long long)gridDim.x * blockDim.x)

__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }

// out[i] = v[(i / inner) % len] * scale   (a per-channel or per-column vector broadcast)
extern "C" __global__ void fill_bcast(float* out, const float* v, long long n, int inner, int len,
                                      float scale) {
    GRID_STRIDE(i, n) { out[i] = v[(i / inner) % len] * scale; }
}

// out[i] = (x[i] + v[(i / inner) % len]) * scale
extern "C" __global__ void add_bcast(float* out, const float* x, const float* v, long long n,
                                     int inner, int len, float scale) {
    GRID_STRIDE(i, n) { out[i] = (x[i] + v[(i / inner) % len]) * scale; }
}

// x[i] = silu(x[i])
extern "C" __global__ void silu_inplace(float* x, long long n) {
    GRID_STRIDE(i, n) { x[i] = silu(x[i]); }
}

// out[i] = x[i] * a + b
extern "C" __global__ void affine(float* out, const float* x, long long n, float a, float b) {
    GRID_STRIDE(i, n) { out[i] = x[i] * a + b; }
}

// Nearest ×2 upsampling: x is [P, H, W] planes, out [P, 2H, 2W]; n = P·4HW.
extern "C" __global__ void upsample2(float* out, const float* x, long long n, int h, int w) {
    GRID_STRIDE(i, n) {
        int w2 = 2 * w;
        long long r = i / w2;
        int j = (int)(i % w2);
        long long p = r / (2 * h);
        int y = (int)(r % (2 * h));
        out[i] = x[(p * h + y / 2) * w + j / 2];
    }
}

// Zero padding by one row at the bottom and one column at the right (diffusers' Downsample2D
// with padding 0): x is [P, H, W], out [P, H+1, W+1]; n = P·(H+1)(W+1).
extern "C" __global__ void pad_rb(float* out, const float* x, long long n, int h, int w) {
    GRID_STRIDE(i, n) {
        int w1 = w + 1;
        long long r = i / w1;
        int j = (int)(i % w1);
        long long p = r / (h + 1);
        int y = (int)(r % (h + 1));
        out[i] = (y < h && j < w) ? x[(p * h + y) * w + j] : 0.0f;
    }
}

// Channel concatenation of a [B, ca, HW] and b [B, cb, HW] into out [B, ca+cb, HW].
extern "C" __global__ void concat2(float* out, const float* a, const float* b, long long n,
                                   int ca, int cb, int hw) {
    GRID_STRIDE(i, n) {
        long long per = (long long)(ca + cb) * hw;
        long long img = i / per;
        long long rem = i - img * per;
        long long na = (long long)ca * hw;
        out[i] = rem < na ? a[img * na + rem] : b[img * (long long)cb * hw + (rem - na)];
    }
}

// Sum over the block; every thread gets the result. `red` holds 32 floats.
__device__ float block_sum(float v, float* red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    int nw = (blockDim.x + 31) >> 5;
    float s = 0.0f;
    for (int k = 0; k < nw; ++k) s += red[k];
    return s;
}

// Group norm of v = x + add, then optional scale/shift and SiLU, one block per (image, group):
//   v[b,c,p]  = x[b,c,p] + (add ? add[b·add_ld + c] : 0)
//   y[b,c,p]  = (v − mean_bg)/√(var_bg + eps)·gamma[c] + beta[c]         (diffusers GroupNorm)
//   y        ←  y·(1 + ss[b·2C + c]) + ss[b·2C + C + c]   when ss           (scale_shift time)
//   y        ←  silu(y)                                     when act
// mean and the biased variance are two-pass f32 sums over the group's C/G·HW values; when
// `cache` the values stay in shared memory (C/G·HW floats), otherwise they are read again.
extern "C" __global__ void group_norm(const float* x, float* y, const float* gamma,
                                      const float* beta, const float* add, int add_ld,
                                      const float* ss, int c, int g, int hw, float eps, int act,
                                      int cache) {
    extern __shared__ float buf[];
    __shared__ float red[32];
    int bg = blockIdx.x;
    int b = bg / g, gi = bg % g;
    int cpg = c / g;
    long long n = (long long)cpg * hw;
    long long base = ((long long)b * c + (long long)gi * cpg) * hw;
    const float* xp = x + base;
    float* yp = y + base;
    const float* ap = add ? add + (long long)b * add_ld + gi * cpg : nullptr;
    float s = 0.0f;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xp[i];
        if (ap) v += ap[i / hw];
        if (cache) buf[i] = v;
        s += v;
    }
    float mean = block_sum(s, red) / (float)n;
    float q = 0.0f;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
        float v = cache ? buf[i] : (xp[i] + (ap ? ap[i / hw] : 0.0f));
        float d = v - mean;
        q += d * d;
    }
    float var = block_sum(q, red) / (float)n;
    float rstd = rsqrtf(var + eps);
    const float* sp = ss ? ss + (long long)b * 2 * c : nullptr;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
        float v = cache ? buf[i] : (xp[i] + (ap ? ap[i / hw] : 0.0f));
        int ch = gi * cpg + (int)(i / hw);
        float o = (v - mean) * rstd * gamma[ch] + beta[ch];
        if (sp) o = o * (1.0f + sp[ch]) + sp[c + ch];
        if (act) o = silu(o);
        yp[i] = o;
    }
}

// Softmax of each row of length `len` in place, one warp per row.
extern "C" __global__ void softmax_rows(float* x, long long rows, int len) {
    long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    float* p = x + row * len;
    float m = -INFINITY;
    for (int j = lane; j < len; j += 32) m = fmaxf(m, p[j]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float s = 0.0f;
    for (int j = lane; j < len; j += 32) {
        float e = expf(p[j] - m);
        p[j] = e;
        s += e;
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    float inv = 1.0f / s;
    for (int j = lane; j < len; j += 32) p[j] *= inv;
}

// out[b, k, p] = x[b, k, p] / t[b]  (Fourier time embedding's output division)
extern "C" __global__ void div_rows(float* x, const float* t, long long n, long long per) {
    GRID_STRIDE(i, n) { x[i] = x[i] / t[i / per]; }
}

// ---- The attacks' arithmetic on device-resident batches (src/attacks/mia.rs), with the
// host's rounding: IEEE round-to-nearest intrinsics, so nvcc fuses no multiply-add.

// x_t = sa·x0 + sb·e in f32 (attacks::denoiser::noisy: f32 products, then their sum).
extern "C" __global__ void noisy_f32(float* out, const float* x0, const float* e, long long n,
                                     float sa, float sb) {
    GRID_STRIDE(i, n) { out[i] = __fadd_rn(__fmul_rn(sa, x0[i]), __fmul_rn(sb, e[i])); }
}

// One deterministic DDIM step in f64 given ε (attacks::mia::ddim_step):
// x̂0 = (x − sn·ε)/ss, out = f32(ts·x̂0 + tn·ε).
extern "C" __global__ void ddim_f64(float* out, const float* x, const float* e, long long n,
                                    double ss, double sn, double ts, double tn) {
    GRID_STRIDE(i, n) {
        double ev = (double)e[i];
        double x0 = __ddiv_rn(__dsub_rn((double)x[i], __dmul_rn(sn, ev)), ss);
        out[i] = __double2float_rn(__dadd_rn(__dmul_rn(ts, x0), __dmul_rn(tn, ev)));
    }
}

// out[r] = Σ_j |a[r, j] − b[r, j]|^p / dim in f64, one block per row (attacks::mia::row_lp);
// mode 2: d·d, mode 4: (d·d)·(d·d), else pow(d, p).
extern "C" __global__ void row_lp(double* out, const float* a, const float* b, long long rows,
                                  int dim, double p, int mode) {
    long long r = blockIdx.x;
    if (r >= rows) return;
    const float* x = a + r * dim;
    const float* y = b + r * dim;
    double s = 0.0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        double d = fabs(__dsub_rn((double)x[j], (double)y[j]));
        double v = mode == 2 ? __dmul_rn(d, d)
                 : mode == 4 ? __dmul_rn(__dmul_rn(d, d), __dmul_rn(d, d))
                             : pow(d, p);
        s = __dadd_rn(s, v);
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    __shared__ double part[32];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    if (lane == 0) part[wid] = s;
    __syncthreads();
    if (wid == 0) {
        int nw = (blockDim.x + 31) >> 5;
        s = lane < nw ? part[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
        if (lane == 0) out[r] = s / (double)dim;
    }
}

// ---- Attention for small heads in one kernel (head dimension D = 8, 16, 32 or 64): for each
// (image, head) and query p, o[:, p] = Σ_q softmax_q(q_p·k_q·scale)·v_q with an online softmax
// (running maximum and sum, rescaled when the maximum grows), so the l × l score matrix is never
// written. qkv is [B, 3·heads·D, l] (q, k, v stacked along channels, as the stacked GEMM writes
// it); o is [B, heads·D, l], the layout the output projection reads. grid.x = B·heads, grid.y =
// ⌈l / ATT_TQ⌉, ATT_TQ threads, one query each; keys and values pass through shared memory in
// tiles of ATT_TK.
#define ATT_TQ 128
#define ATT_TK 64

template <int D>
__device__ __forceinline__ void attn_small_impl(float* __restrict__ o, const float* __restrict__ qkv,
                                                int heads, int l, float scale) {
    __shared__ float ks[D * ATT_TK];
    __shared__ float vs[D * ATT_TK];
    const int bh = blockIdx.x;
    const int img = bh / heads, hd = bh - img * heads;
    const int inner = heads * D;
    const float* base = qkv + (long long)img * 3 * inner * l;
    const float* Q = base + (long long)(hd * D) * l;
    const float* K = base + (long long)(inner + hd * D) * l;
    const float* V = base + (long long)(2 * inner + hd * D) * l;
    const int p = blockIdx.y * ATT_TQ + threadIdx.x;
    const bool live = p < l;
    float q[D], acc[D];
#pragma unroll
    for (int e = 0; e < D; ++e) {
        q[e] = live ? Q[(long long)e * l + p] : 0.0f;
        acc[e] = 0.0f;
    }
    float m = -INFINITY, sum = 0.0f;
    for (int t0 = 0; t0 < l; t0 += ATT_TK) {
        const int tk = min(ATT_TK, l - t0);
        __syncthreads();  // every thread is done with the previous tile
        for (int i = threadIdx.x; i < D * ATT_TK; i += blockDim.x) {
            const int e = i / ATT_TK, j = i - e * ATT_TK;
            if (j < tk) {
                ks[i] = K[(long long)e * l + t0 + j];
                vs[i] = V[(long long)e * l + t0 + j];
            }
        }
        __syncthreads();
        if (live) {
            for (int j = 0; j < tk; ++j) {
                float s = 0.0f;
#pragma unroll
                for (int e = 0; e < D; ++e) s = fmaf(q[e], ks[e * ATT_TK + j], s);
                s *= scale;
                if (s > m) {
                    const float c = expf(m - s);  // 0 for the first key (m = −∞)
                    sum *= c;
#pragma unroll
                    for (int e = 0; e < D; ++e) acc[e] *= c;
                    m = s;
                }
                const float w = expf(s - m);
                sum += w;
#pragma unroll
                for (int e = 0; e < D; ++e) acc[e] = fmaf(w, vs[e * ATT_TK + j], acc[e]);
            }
        }
    }
    if (live) {
        const float inv = 1.0f / sum;
        float* O = o + (long long)img * inner * l + (long long)(hd * D) * l;
#pragma unroll
        for (int e = 0; e < D; ++e) O[(long long)e * l + p] = acc[e] * inv;
    }
}

extern "C" __global__ void attn_small_d8(float* o, const float* qkv, int heads, int l, float scale) {
    attn_small_impl<8>(o, qkv, heads, l, scale);
}
extern "C" __global__ void attn_small_d16(float* o, const float* qkv, int heads, int l, float scale) {
    attn_small_impl<16>(o, qkv, heads, l, scale);
}
extern "C" __global__ void attn_small_d32(float* o, const float* qkv, int heads, int l, float scale) {
    attn_small_impl<32>(o, qkv, heads, l, scale);
}
extern "C" __global__ void attn_small_d64(float* o, const float* qkv, int heads, int l, float scale) {
    attn_small_impl<64>(o, qkv, heads, l, scale);
}
