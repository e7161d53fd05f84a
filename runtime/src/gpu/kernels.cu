// rankwise device kernels, compiled at run time by NVRTC (runtime/src/gpu/device.rs).
//
// The generator kernels reproduce runtime/src/source.rs bit for bit: the same SplitMix64
// counter (key + (row * 2^24 + col) * GAMMA), the same mixing, the same mapping to [0, 1)
// and the same dosage draws. Population allele-frequency thresholds, whose Beta draws come
// from the host's samplers, arrive as a table computed on the host.
//
// Matrices are row-major: element (i, j) of a tile with leading dimension ld is at i*ld + j.

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned char u8;

#define GAMMA 0x9E3779B97F4A7C15ULL
#define MAX_GENERATED_COLS (1ULL << 24)
#define MISSING_KEY 0x6D155146C0DE0001ULL

__device__ __forceinline__ u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

__device__ __forceinline__ double unit_f64(u64 x) {
    return (double)(x >> 11) * (1.0 / 9007199254740992.0);
}

// Uniform values of rows row0 .. row0+h, columns col0 .. col0+w of the generated matrix,
// rounded to T. Grid: x over columns, y over rows (y may be smaller than h: rows are strided).
template <typename T>
__device__ void uniform(T* out, u64 key, u64 row0, u64 col0, u32 h, u32 w, u32 ld) {
    u32 j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= w) return;
    for (u32 i = blockIdx.y; i < h; i += gridDim.y) {
        u64 c = (row0 + i) * MAX_GENERATED_COLS + col0 + j;
        out[(u64)i * ld + j] = (T)unit_f64(mix64(key + c * GAMMA));
    }
}

extern "C" __global__ void uniform_f64(double* out, u64 key, u64 row0, u64 col0, u32 h,
                                       u32 w, u32 ld) {
    uniform<double>(out, key, row0, col0, h, w, ld);
}

extern "C" __global__ void uniform_f32(float* out, u64 key, u64 row0, u64 col0, u32 h, u32 w,
                                       u32 ld) {
    uniform<float>(out, key, row0, col0, h, w, ld);
}

// Genotype dosages of variants row0 .. row0+h (all n samples), 2-bit packed four per byte
// (low bits first; code 3 is a missing call), and per variant the count of each code
// (counts[4*i + code], which the caller zeroes). thresholds[i*pops + q] is the integer
// threshold of variant row0+i in population q (sample j is in population j*pops/n).
// Grid: x over packed bytes, y over variants (strided).
extern "C" __global__ void genotype_packed(u8* packed, u32* counts, const u64* thresholds,
                                           u64 key, u64 row0, u32 h, u32 n, u32 pops,
                                           u64 missing, u32 ld) {
    u32 b = blockIdx.x * blockDim.x + threadIdx.x;
    u32 bytes = (n + 3) / 4;
    for (u32 i = blockIdx.y; i < h; i += gridDim.y) {
        u32 c[4] = {0, 0, 0, 0};
        if (b < bytes) {
            u32 byte = 0;
            for (u32 k = 0; k < 4; k++) {
                u32 j = 4 * b + k;
                if (j >= n) break;
                u32 q = (u32)(((u64)j * pops) / n);
                u64 t = thresholds[(u64)i * pops + q];
                u64 x = mix64(key + ((row0 + i) * MAX_GENERATED_COLS + j) * GAMMA);
                u32 d = (u32)((x >> 32) < t) + (u32)((x & 0xFFFFFFFFULL) < t);
                if (missing != 0 && mix64(x ^ MISSING_KEY) < missing) d = 3;
                byte |= d << (2 * k);
                c[d] += 1;
            }
            packed[(u64)i * ld + b] = (u8)byte;
        }
        // Sum the block's counts: warp shuffles, then one atomic per warp and code.
        for (int code = 0; code < 4; code++) {
            u32 v = c[code];
            for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, off);
            if ((threadIdx.x & 31) == 0 && v != 0) atomicAdd(&counts[4 * i + code], v);
        }
    }
}

// Standardized tile from packed codes: out(i, j) = table[4*i + code(i, col0 + j)], the
// table holding each variant's standardized value of dosages 0, 1, 2 and of a missing call
// (computed on the host exactly as the CPU kernels do, then rounded to the tile's type).
template <typename T>
__device__ void standardize(T* out, const u8* packed, const T* table, u32 col0, u32 h, u32 w,
                            u32 pld, u32 ld) {
    u32 j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= w) return;
    u32 col = col0 + j;
    for (u32 i = blockIdx.y; i < h; i += gridDim.y) {
        u32 code = (packed[(u64)i * pld + (col >> 2)] >> (2 * (col & 3))) & 3;
        out[(u64)i * ld + j] = table[4 * i + code];
    }
}

extern "C" __global__ void standardize_f64(double* out, const u8* packed, const double* table,
                                           u32 col0, u32 h, u32 w, u32 pld, u32 ld) {
    standardize<double>(out, packed, table, col0, h, w, pld, ld);
}

extern "C" __global__ void standardize_f32(float* out, const u8* packed, const float* table,
                                           u32 col0, u32 h, u32 w, u32 pld, u32 ld) {
    standardize<float>(out, packed, table, col0, h, w, pld, ld);
}

// acc[i] += part[i]: single-precision products summed in double, as the CPU kernels do.
extern "C" __global__ void add_f32_to_f64(double* acc, const float* part, u64 len) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < len;
         i += (u64)gridDim.x * blockDim.x) {
        acc[i] += (double)part[i];
    }
}

extern "C" __global__ void add_f64(double* acc, const double* part, u64 len) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < len;
         i += (u64)gridDim.x * blockDim.x) {
        acc[i] += part[i];
    }
}

// *out += Σ x², summed in double per thread, per warp, then one atomic per warp.
template <typename T>
__device__ void sum_squares(const T* x, u64 len, double* out) {
    double s = 0.0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < len;
         i += (u64)gridDim.x * blockDim.x) {
        double v = (double)x[i];
        s += v * v;
    }
    for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xFFFFFFFFu, s, off);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, s);
}

extern "C" __global__ void sum_squares_f64(const double* x, u64 len, double* out) {
    sum_squares<double>(x, len, out);
}

extern "C" __global__ void sum_squares_f32(const float* x, u64 len, double* out) {
    sum_squares<float>(x, len, out);
}
