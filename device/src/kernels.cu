// rankwise device kernels, compiled at run time by NVRTC (device/src/device.rs).
//
// The generator kernels reproduce sources/src/stream.rs bit for bit: row r's columns are
// grouped in blocks of 256, and block b is a stream of words from 8 interleaved
// xoroshiro128+ lanes (word w is output w / 8 of lane w % 8), lane l seeded with the
// SplitMix64 draws of counters c + 2l and c + 2l + 1, c = r * 2^24 + 256 b. Uniform values
// are word c % 256 as a mantissa in [1, 2) minus 1; a genotype at column c takes the 32-bit
// half c % 2 of word (c % 256) / 2 (two 16-bit allele draws against the variant's
// threshold) and, for a missing call, the same half of word 128 + (c % 256) / 2. Population
// allele thresholds, whose Beta draws come from the host's samplers, arrive as a table.
//
// Matrices are row-major: element (i, j) of a tile with leading dimension ld is at i*ld + j.

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned char u8;

#define GAMMA 0x9E3779B97F4A7C15ULL
#define MAX_GENERATED_COLS (1ULL << 24)
#define BLOCK_COLS 256
#define LANES 8

__device__ __forceinline__ u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

__device__ __forceinline__ u64 rotl(u64 x, int k) { return (x << k) | (x >> (64 - k)); }

// One lane of a block stream: seeded, then stepped once per output.
struct Lane {
    u64 s0, s1;
    __device__ __forceinline__ Lane(u64 key, u64 row, u64 block, u32 l) {
        u64 c = row * MAX_GENERATED_COLS + block * BLOCK_COLS + 2 * l;
        s0 = mix64(key + c * GAMMA);
        s1 = mix64(key + (c + 1) * GAMMA);
    }
    __device__ __forceinline__ u64 next() {
        u64 r = s0 + s1;
        u64 b = s1 ^ s0;
        s0 = rotl(s0, 24) ^ b ^ (b << 16);
        s1 = rotl(b, 37);
        return r;
    }
};

__device__ __forceinline__ double unit(u64 x) {
    return __longlong_as_double((long long)((x >> 12) | 0x3FF0000000000000ULL)) - 1.0;
}

// Uniform values of rows row0 .. row0+h, columns col0 .. col0+w of the generated matrix,
// rounded to T. One thread per (block, lane) that the columns touch: grid x over those,
// y over rows (y may be smaller than h: rows are strided).
template <typename T>
__device__ void uniform(T* out, u64 key, u64 row0, u64 col0, u32 h, u32 w, u32 ld) {
    u32 x = blockIdx.x * blockDim.x + threadIdx.x;
    u64 first = col0 / BLOCK_COLS;
    u64 blocks = (col0 + w + BLOCK_COLS - 1) / BLOCK_COLS - first;
    if (x >= blocks * LANES) return;
    u64 block = first + x / LANES;
    u32 l = x % LANES;
    for (u32 i = blockIdx.y; i < h; i += gridDim.y) {
        Lane lane(key, row0 + i, block, l);
        for (u32 t = 0; t < BLOCK_COLS / LANES; t++) {
            u64 word = lane.next();
            u64 col = block * BLOCK_COLS + t * LANES + l;
            if (col >= col0 && col < col0 + w) out[(u64)i * ld + (col - col0)] = (T)unit(word);
        }
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
// (low bits first; code 3 is a missing call; padding codes 0), and per variant the count of
// each code (counts[4*i + code], which the caller zeroes). thresholds[i*pops + q] is the
// 16-bit allele threshold of variant row0+i in population q (sample j is in population
// j*pops/n); `missing` the 32-bit missing-call threshold. One thread per 256-sample block:
// grid x over blocks, y over variants (strided).
extern "C" __global__ void genotype_packed(u8* packed, u32* counts, const u64* thresholds,
                                           u64 key, u64 row0, u32 h, u32 n, u32 pops,
                                           u64 missing, u32 ld) {
    u32 b = blockIdx.x * blockDim.x + threadIdx.x;
    u32 blocks = (n + BLOCK_COLS - 1) / BLOCK_COLS;
    for (u32 i = blockIdx.y; i < h; i += gridDim.y) {
        u32 c[4] = {0, 0, 0, 0};
        if (b < blocks) {
            Lane lanes[LANES] = {
                Lane(key, row0 + i, b, 0), Lane(key, row0 + i, b, 1),
                Lane(key, row0 + i, b, 2), Lane(key, row0 + i, b, 3),
                Lane(key, row0 + i, b, 4), Lane(key, row0 + i, b, 5),
                Lane(key, row0 + i, b, 6), Lane(key, row0 + i, b, 7),
            };
            u32 codes[BLOCK_COLS / 16];  // column k of the block at bits 2(k % 16) of [k / 16]
            u32 first = b * BLOCK_COLS;
            u32 q = (u32)(((u64)first * pops) / n);
            u64 tq = thresholds[(u64)i * pops + q];
            // Steps 0 .. 15 of every lane are words 0 .. 127 (the alleles); with missing
            // calls, steps 16 .. 31 are words 128 .. 255 (a missing call sets code 3).
            u32 steps = missing != 0 ? BLOCK_COLS / LANES : BLOCK_COLS / (2 * LANES);
            for (u32 t = 0; t < steps; t++) {
                u32 g = t % (BLOCK_COLS / (2 * LANES));  // the 16 columns of this step
                bool alleles = t == g;
                if (alleles) codes[g] = 0;
#pragma unroll
                for (u32 l = 0; l < LANES; l++) {
                    u64 x = lanes[l].next();
                    u32 w = g * LANES + l;
#pragma unroll
                    for (u32 half = 0; half < 2; half++) {
                        u32 k = 2 * w + half;
                        u64 hw = (x >> (32 * half)) & 0xFFFFFFFFULL;
                        if (alleles) {
                            u64 th = tq;
                            // Padding columns of the last block (masked below) read the
                            // last sample's population: the table holds h·pops entries.
                            if (pops > 1) {
                                u32 col = min(first + k, n - 1);
                                th = thresholds[(u64)i * pops + (u32)(((u64)col * pops) / n)];
                            }
                            u32 d = (u32)((hw & 0xFFFF) < th) + (u32)((hw >> 16) < th);
                            codes[g] |= d << (2 * (k % 16));
                        } else if (hw < missing) {
                            codes[g] |= 3u << (2 * (k % 16));
                        }
                    }
                }
            }
            u32 bytes = (n + 3) / 4;
            for (u32 t = 0; t < BLOCK_COLS / 16; t++) {
                u32 v = codes[t];
                u32 col = first + 16 * t;
                if (col >= n) break;
                if (n - col < 16) v &= (1u << (2 * (n - col))) - 1;  // padding codes 0
                u32 lo = v & 0x55555555u, hi = (v >> 1) & 0x55555555u;
                c[1] += __popc(lo & ~hi);
                c[2] += __popc(hi & ~lo);
                c[3] += __popc(lo & hi);
                c[0] += min(16u, n - col) - __popc((lo | hi));
                for (u32 k = 0; k < 4; k++) {
                    u32 byte = 4 * (col / 16) + k;
                    if (byte < bytes) packed[(u64)i * ld + byte] = (u8)(v >> (8 * k));
                }
            }
        }
        // Sum the block's counts: warp shuffles, then one atomic per warp and code.
        for (int code = 0; code < 4; code++) {
            u32 v = c[code];
            for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, off);
            if ((threadIdx.x & 31) == 0 && v != 0) atomicAdd(&counts[4 * i + code], v);
        }
    }
}

// Decoded int8 dosages (a Zarr genotype chunk decoded on the device) as the packed codes
// genotype_packed writes: rows 0 .. h of dosages(i, j) at i*ldin + j, j < n, each value
// -1 (missing, code 3), 0, 1 or 2 taken as its low two bits, as the host's pack_row does,
// four per byte (low bits first, padding codes 0) at packed[i*ldout + j/4], with each
// row's count of every code added to counts[4*i + code] (zeroed by the caller). A value
// that is not a dosage lowers *bad to its index i*n + j (set to ~0 by the caller), so that
// the host can name the first one. One thread per 16 columns: grid x over groups of 16
// columns, y over rows (strided).
extern "C" __global__ void dosage_codes(u8* packed, u32* counts, u64* bad, const signed char* dosages,
                                        u32 h, u32 n, u32 ldin, u32 ldout) {
    u32 g = blockIdx.x * blockDim.x + threadIdx.x;
    u32 groups = (n + 15) / 16;
    u32 bytes = (n + 3) / 4;
    for (u32 i = blockIdx.y; i < h; i += gridDim.y) {
        u32 c[4] = {0, 0, 0, 0};
        if (g < groups) {
            u32 col = 16 * g;
            u32 v = 0;
            u32 width = min(16u, n - col);
            const signed char* row = dosages + (u64)i * ldin + col;
            for (u32 k = 0; k < width; k++) {
                int d = row[k];
                if (d < -1 || d > 2) atomicMin(bad, (u64)i * n + col + k);
                v |= ((u32)d & 3u) << (2 * k);
            }
            u32 lo = v & 0x55555555u, hi = (v >> 1) & 0x55555555u;
            c[1] = __popc(lo & ~hi);
            c[2] = __popc(hi & ~lo);
            c[3] = __popc(lo & hi);
            c[0] = width - __popc(lo | hi);
            for (u32 k = 0; k < 4; k++) {
                u32 byte = 4 * g + k;
                if (byte < bytes) packed[(u64)i * ldout + byte] = (u8)(v >> (8 * k));
            }
        }
        // Sum the row's counts: warp shuffles, then one atomic per warp and code.
        for (int code = 0; code < 4; code++) {
            u32 x = c[code];
            for (int off = 16; off > 0; off >>= 1) x += __shfl_down_sync(0xFFFFFFFFu, x, off);
            if ((threadIdx.x & 31) == 0 && x != 0) atomicAdd(&counts[4 * i + code], x);
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

// partial[block] = Σ x² of the values the block's threads visit, summed in double per
// thread, per warp, then over the block's warps in order: no atomics, so for one grid the
// sums are the same bits on every run (the host adds the blocks' partials in order).
template <typename T>
__device__ void sum_squares(const T* x, u64 len, double* partial) {
    __shared__ double warps[32];
    double s = 0.0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < len;
         i += (u64)gridDim.x * blockDim.x) {
        double v = (double)x[i];
        s += v * v;
    }
    for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xFFFFFFFFu, s, off);
    if ((threadIdx.x & 31) == 0) warps[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (u32 w = 0; w < (blockDim.x + 31) / 32; w++) t += warps[w];
        partial[blockIdx.x] = t;
    }
}

extern "C" __global__ void sum_squares_f64(const double* x, u64 len, double* partial) {
    sum_squares<double>(x, len, partial);
}

extern "C" __global__ void sum_squares_f32(const float* x, u64 len, double* partial) {
    sum_squares<float>(x, len, partial);
}

// out[i] = (float)x[i]: rows of Y rounded to the tiles' type for Yᵀ·T, as the CPU kernels
// round each row block of Y before multiplying it.
extern "C" __global__ void round_f64_to_f32(float* out, const double* x, u64 len) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < len;
         i += (u64)gridDim.x * blockDim.x) {
        out[i] = (float)x[i];
    }
}

// Row-major tile rows (b × n, leading dimension n) into rows r0.. of a column-major panel
// of leading dimension ld: the layout cuSOLVER factors. Threads run along a tile row, so
// reads are coalesced; grid rows stride over the tile's rows.
extern "C" __global__ void rows_to_columns_f64(double* out, const double* tile, u64 r0, u32 b,
                                               u32 n, u64 ld) {
    u32 j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    for (u32 i = blockIdx.y; i < b; i += gridDim.y) {
        out[(u64)j * ld + r0 + i] = tile[(u64)i * n + j];
    }
}

// The top k rows of a column-major h × w matrix (leading dimension h) as a column-major k × w
// matrix: R after geqrf, with the Householder vectors below its diagonal, in one copy.
extern "C" __global__ void top_rows_f64(double* out, const double* a, u32 k, u32 w, u64 h) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= k) return;
    for (u32 j = blockIdx.y; j < w; j += gridDim.y) {
        out[(u64)j * k + i] = a[(u64)j * h + i];
    }
}

// Blosc frames decoded on the device. A frame's streams are decompressed by nvCOMP (or,
// stored, copied by copy_segments) to their bytes of `streams`, numbered as the decoded
// frame's; blosc_unshuffle then puts each block's bytes together from its concatenated
// streams, as sources/src/blosc.rs defines them (BloscLayout, BlockShuffle).

// segs[3s..3s+3] = (source offset, destination offset, bytes): dst[d..d+len] = src[s..s+len].
// Grid rows stride over the segments, threads along each.
extern "C" __global__ void copy_segments(u8* dst, const u8* src, const u64* segs, u32 nsegs) {
    for (u32 s = blockIdx.y; s < nsegs; s += gridDim.y) {
        u64 from = segs[3 * s], to = segs[3 * s + 1], len = segs[3 * s + 2];
        for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < len;
             i += (u64)gridDim.x * blockDim.x) {
            dst[to + i] = src[from + i];
        }
    }
}

// The 8 × 8 bit matrix of x transposed: bit c of byte r becomes bit r of byte c.
__device__ __forceinline__ u64 transpose_bits8(u64 x) {
    u64 t = (x ^ (x >> 7)) & 0x00AA00AA00AA00AAULL;
    x = x ^ t ^ (t << 7);
    t = (x ^ (x >> 14)) & 0x0000CCCC0000CCCCULL;
    x = x ^ t ^ (t << 14);
    t = (x ^ (x >> 28)) & 0x00000000F0F0F0F0ULL;
    return x ^ t ^ (t << 28);
}

// blocks[4b..4b+4] = (first byte in `streams`, first byte in `out`, bytes, kind): kind 0
// as is, 1 byte-shuffled (typesize planes of n bytes), 2 bit-shuffled (8·typesize rows of
// n/8 bytes, n a multiple of 8); bytes past the block's last whole value are as they are.
// Grid rows stride over the blocks, threads along each: for bit shuffle, one thread per
// (byte j, group of 8 values), reading one byte of each of the 8 rows of byte j
// (consecutive threads, consecutive bytes).
extern "C" __global__ void blosc_unshuffle(u8* out, const u8* streams, const u64* blocks,
                                           u32 nblocks, u32 typesize) {
    u64 first = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u32 b = blockIdx.y; b < nblocks; b += gridDim.y) {
        u64 size = blocks[4 * b + 2], kind = blocks[4 * b + 3];
        const u8* s = streams + blocks[4 * b];
        u8* o = out + blocks[4 * b + 1];
        u64 n = size / typesize, whole = kind == 0 ? 0 : n * typesize;
        for (u64 i = whole + first; i < size; i += stride) o[i] = s[i];
        if (kind == 1) {
            for (u64 x = first; x < whole; x += stride) {
                u64 i = x / typesize, j = x % typesize;
                o[x] = s[j * n + i];
            }
        } else if (kind == 2) {
            u64 groups = n / 8;
            for (u64 x = first; x < groups * typesize; x += stride) {
                u64 j = x / groups, g = x % groups;
                u64 word = 0;
                for (u32 k = 0; k < 8; k++) word |= (u64)s[(8 * j + k) * groups + g] << (8 * k);
                word = transpose_bits8(word);
                for (u32 r = 0; r < 8; r++) o[(8 * g + r) * typesize + j] = (u8)(word >> (8 * r));
            }
        }
    }
}
