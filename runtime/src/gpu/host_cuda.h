// The CUDA built-ins that kernels.cu uses, on host threads: the kernels compiled by a C++
// compiler run on the CPU, so their arithmetic, indexing and launch geometry can be checked
// against the CPU code where no GPU is present (runtime/src/gpu/host.rs). One host thread
// plays each thread of a block; the blocks of a grid run one after another.
//
// What it checks beyond the values: __syncthreads and warp shuffles wait for every thread
// of the block, and a shuffle over a full warp mask in a warp that is partial (the block is
// not a multiple of 32 threads) or has lost threads to an early return is reported as an
// error, as is a barrier that some threads never reach (after a timeout). Out-of-range
// accesses are not caught here: the callers surround their buffers with guard zones.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

struct uint3 {
    unsigned x, y, z;
};

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
// The same for every thread of a launch; launches are serialized (rw_host::launch_lock).
uint3 blockDim;
uint3 gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
// One launch at a time and one block at a time: a static is the block's shared memory.
#define __shared__ static

namespace rw_host {

// A barrier over the threads still running the current block: a thread that returns
// from the kernel leaves it (as on the device, exited threads do not hold up the others).
struct Barrier {
    std::mutex m;
    std::condition_variable cv;
    unsigned expected = 0, arrived = 0;
    unsigned long long generation = 0;
    bool timed_out = false;

    void reset(unsigned n) {
        std::lock_guard<std::mutex> l(m);
        expected = n;
        arrived = 0;
    }
    void release() {
        arrived = 0;
        generation++;
        cv.notify_all();
    }
    // False when the others did not come within the timeout (the caller reports it).
    bool wait() {
        std::unique_lock<std::mutex> l(m);
        unsigned long long g = generation;
        if (++arrived >= expected) {
            release();
            return true;
        }
        if (!cv.wait_for(l, std::chrono::seconds(20), [&] { return generation != g; })) {
            timed_out = true;
            release();
            return false;
        }
        return true;
    }
    void leave() {
        std::lock_guard<std::mutex> l(m);
        expected--;
        if (arrived > 0 && arrived >= expected) release();
    }
};

struct Launch {
    unsigned threads = 0;
    Barrier sync;     // __syncthreads and shuffles within a block
    Barrier between;  // all threads, between blocks
    std::vector<unsigned long long> slots;
    // Read by other threads' shuffles while its thread returns: atomic.
    std::unique_ptr<std::atomic<unsigned char>[]> exited;
    std::mutex error_lock;
    std::string error;

    void fail(const std::string& what) {
        std::lock_guard<std::mutex> l(error_lock);
        if (error.empty()) error = what;
    }
};

inline Launch* current = nullptr;
inline std::mutex launch_lock;

inline unsigned flat_thread() {
    return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

inline std::string where() {
    char b[160];
    std::snprintf(b, sizeof b, "block (%u, %u, %u) thread %u", blockIdx.x, blockIdx.y,
                  blockIdx.z, flat_thread());
    return b;
}

inline void sync_or_fail(const char* what) {
    if (!current->sync.wait()) {
        current->fail(std::string(what) + " at " + where() +
                      ": not every thread of the block reached it");
    }
}

template <typename T>
T shfl_down(unsigned mask, T v, int off) {
    static_assert(sizeof(T) <= 8, "shuffled values are at most 8 bytes");
    Launch& L = *current;
    unsigned t = flat_thread();
    unsigned warp0 = t / 32 * 32;
    if (mask != 0xFFFFFFFFu) {
        L.fail("__shfl_down_sync with a partial mask at " + where() +
               " (the host check models full warps only)");
    } else if (warp0 + 32 > L.threads) {
        L.fail("__shfl_down_sync over a full mask in a partial warp at " + where() +
               ": the block is not a multiple of 32 threads");
    } else {
        for (unsigned k = warp0; k < warp0 + 32; k++) {
            if (L.exited[k]) {
                L.fail("__shfl_down_sync over a full mask at " + where() + " while thread " +
                       std::to_string(k) + " of its warp has returned");
                break;
            }
        }
    }
    unsigned long long bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    L.slots[t] = bits;
    sync_or_fail("__shfl_down_sync");
    unsigned lane = t - warp0;
    unsigned src = lane + (unsigned)off < 32 && warp0 + lane + off < L.threads ? t + off : t;
    bits = L.slots[src];
    sync_or_fail("__shfl_down_sync");
    T r;
    std::memcpy(&r, &bits, sizeof(T));
    return r;
}

template <typename A>
A param(void* p) {
    A a;
    std::memcpy(&a, p, sizeof(A));
    return a;
}

template <typename... A, std::size_t... I>
void call(void (*k)(A...), void** params, std::index_sequence<I...>) {
    k(param<A>(params[I])...);
}

// Runs kernel `k` over grid dims[0..3] of blocks dims[3..6], reading its parameters as
// cuLaunchKernel does (params[i] points at parameter i). Returns 0, or 1 with a message
// in err.
template <typename... A>
int launch(void (*k)(A...), const unsigned* dims, void** params, std::size_t nparams,
           char* err, std::size_t err_len) {
    std::lock_guard<std::mutex> serial(launch_lock);
    auto report = [&](const std::string& m) {
        std::snprintf(err, err_len, "%s", m.c_str());
        return 1;
    };
    if (nparams != sizeof...(A)) {
        return report("the kernel takes " + std::to_string(sizeof...(A)) +
                      " parameters, the launch passed " + std::to_string(nparams));
    }
    gridDim = {dims[0], dims[1], dims[2]};
    blockDim = {dims[3], dims[4], dims[5]};
    unsigned long long blocks = (unsigned long long)gridDim.x * gridDim.y * gridDim.z;
    unsigned threads = blockDim.x * blockDim.y * blockDim.z;
    if (blocks == 0 || threads == 0 || threads > 1024) {
        return report("invalid launch geometry: " + std::to_string(blocks) + " blocks of " +
                      std::to_string(threads) + " threads");
    }
    Launch L;
    L.threads = threads;
    L.slots.assign(threads, 0);
    L.exited.reset(new std::atomic<unsigned char>[threads]);
    for (unsigned t = 0; t < threads; t++) L.exited[t] = 0;
    L.sync.reset(threads);
    L.between.reset(threads);
    current = &L;
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (unsigned t = 0; t < threads; t++) {
        pool.emplace_back([&, t] {
            threadIdx = {t % blockDim.x, t / blockDim.x % blockDim.y,
                         t / (blockDim.x * blockDim.y)};
            for (unsigned long long b = 0; b < blocks; b++) {
                blockIdx = {(unsigned)(b % gridDim.x), (unsigned)(b / gridDim.x % gridDim.y),
                            (unsigned)(b / ((unsigned long long)gridDim.x * gridDim.y))};
                call(k, params, std::index_sequence_for<A...>{});
                L.exited[t] = 1;
                L.sync.leave();
                L.between.wait();
                if (t == 0) {
                    L.sync.reset(threads);
                    for (unsigned u = 0; u < threads; u++) L.exited[u] = 0;
                }
                L.between.wait();
            }
        });
    }
    for (auto& th : pool) th.join();
    current = nullptr;
    if (L.between.timed_out) L.fail("threads lost between blocks");
    if (!L.error.empty()) return report(L.error);
    return 0;
}

}  // namespace rw_host

inline void __syncthreads() { rw_host::sync_or_fail("__syncthreads"); }

template <typename T>
T __shfl_down_sync(unsigned mask, T v, int off) {
    return rw_host::shfl_down(mask, v, off);
}

inline unsigned atomicAdd(unsigned* p, unsigned v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}

inline int __popc(unsigned x) { return __builtin_popcount(x); }

inline double __longlong_as_double(long long x) {
    double d;
    std::memcpy(&d, &x, sizeof d);
    return d;
}

template <typename T>
T min(T a, T b) {
    return b < a ? b : a;
}

// Each kernel's entry point: rw_host_<name>(dims, params, nparams, err, err_len).
#define RW_HOST_EXPORT(name)                                                                \
    extern "C" int rw_host_##name(const unsigned* dims, void** params, std::size_t nparams, \
                                  char* err, std::size_t err_len) {                         \
        return rw_host::launch(name, dims, params, nparams, err, err_len);                  \
    }
