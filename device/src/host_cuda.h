// The CUDA built-ins that kernels.cu uses, on the host: the kernels compiled by a C++
// compiler run on the CPU, so their arithmetic, indexing and launch geometry can be checked
// against the CPU code where no GPU is present (device/src/host.rs). The blocks of a
// grid run in order. Kernels whose threads never wait for each other run their threads one
// after another; the others (host.rs lists them) run each thread as a fiber (ucontext) on
// the calling thread, switched at every __syncthreads and warp shuffle, so a barrier is
// exact and costs a context switch rather than an OS thread's wake-up.
//
// What it checks beyond the values: a barrier in a kernel listed as not synchronizing, a
// full-mask shuffle in a partial warp (the block is not a multiple of 32 threads) or in a
// warp that has lost threads to an early return, and threads of a block waiting at
// different barriers are reported as errors. Out-of-range accesses are not caught here:
// the callers surround their buffers with guard zones.

#include <ucontext.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

struct uint3 {
    unsigned x, y, z;
};

// One launch at a time (rw_host::launch_lock), all of it on the launching thread.
uint3 threadIdx;
uint3 blockIdx;
uint3 blockDim;
uint3 gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
// One launch at a time and one block at a time: a static is the block's shared memory.
#define __shared__ static

namespace rw_host {

enum class State : unsigned char { Runnable, Waiting, Done };

struct Launch {
    unsigned threads = 0;
    // Threads one after another, no fibers: a barrier is an error.
    bool sequential = false;
    std::function<void()> body;
    // Fibers of the synchronizing kernels: one per thread of the block.
    ucontext_t scheduler;
    std::vector<ucontext_t> fibers;
    std::unique_ptr<char[]> stacks;
    std::vector<State> state;
    std::vector<const char*> waiting_at;
    unsigned running = 0;
    std::vector<unsigned long long> slots;
    std::string error;

    void fail(const std::string& what) {
        if (error.empty()) error = what;
    }
};

// Bytes of stack per fiber: the kernels keep a few hundred bytes of locals.
constexpr std::size_t STACK = 64 << 10;

inline Launch* current = nullptr;
inline const char* const SHUFFLE = "__shfl_down_sync";
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

inline void set_thread(unsigned t) {
    threadIdx = {t % blockDim.x, t / blockDim.x % blockDim.y, t / (blockDim.x * blockDim.y)};
}

// A barrier: the fiber waits until every thread of the block that has not returned waits
// too (as on the device, exited threads do not hold up the others).
inline void sync_or_fail(const char* what) {
    Launch& L = *current;
    if (L.sequential) {
        L.fail(std::string(what) + " at " + where() +
               " in a kernel that host.rs lists as not synchronizing");
        return;
    }
    unsigned t = L.running;
    L.state[t] = State::Waiting;
    L.waiting_at[t] = what;
    swapcontext(&L.fibers[t], &L.scheduler);
}

inline void fiber_entry() {
    Launch& L = *current;
    L.body();
    L.state[L.running] = State::Done;
    // Returning resumes the scheduler (uc_link).
}

// Runs the current block's threads as fibers until all have returned.
inline void run_block_fibers(Launch& L) {
    unsigned n = L.threads;
    for (unsigned t = 0; t < n; t++) {
        getcontext(&L.fibers[t]);
        L.fibers[t].uc_stack.ss_sp = L.stacks.get() + t * STACK;
        L.fibers[t].uc_stack.ss_size = STACK;
        L.fibers[t].uc_link = &L.scheduler;
        makecontext(&L.fibers[t], fiber_entry, 0);
        L.state[t] = State::Runnable;
        L.waiting_at[t] = nullptr;
    }
    for (;;) {
        for (unsigned t = 0; t < n; t++) {
            if (L.state[t] != State::Runnable) continue;
            L.running = t;
            set_thread(t);
            swapcontext(&L.scheduler, &L.fibers[t]);
        }
        const char* at = nullptr;
        for (unsigned t = 0; t < n; t++) {
            if (L.state[t] != State::Waiting) continue;
            set_thread(t);
            if (at != nullptr && std::strcmp(at, L.waiting_at[t]) != 0) {
                L.fail(std::string("threads of the block wait at different barriers (") + at +
                       ", " + L.waiting_at[t] + ") at " + where());
            }
            at = L.waiting_at[t];
            if (std::strcmp(at, SHUFFLE) == 0) {
                unsigned warp0 = t / 32 * 32;
                for (unsigned k = warp0; k < warp0 + 32 && k < n; k++) {
                    if (L.state[k] == State::Done) {
                        L.fail(std::string(SHUFFLE) + " over a full mask at " + where() +
                               " while thread " + std::to_string(k) +
                               " of its warp has returned");
                    }
                }
            }
            L.state[t] = State::Runnable;
        }
        if (at == nullptr) return;
    }
}

template <typename T>
T shfl_down(unsigned mask, T v, int off) {
    static_assert(sizeof(T) <= 8, "shuffled values are at most 8 bytes");
    Launch& L = *current;
    if (L.sequential) {
        sync_or_fail(SHUFFLE);
        return v;
    }
    unsigned t = flat_thread();
    unsigned warp0 = t / 32 * 32;
    if (mask != 0xFFFFFFFFu) {
        L.fail("__shfl_down_sync with a partial mask at " + where() +
               " (the host check models full warps only)");
    } else if (warp0 + 32 > L.threads) {
        L.fail("__shfl_down_sync over a full mask in a partial warp at " + where() +
               ": the block is not a multiple of 32 threads");
    }
    unsigned long long bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    L.slots[t] = bits;
    sync_or_fail(SHUFFLE);
    unsigned lane = t - warp0;
    unsigned src = lane + (unsigned)off < 32 && warp0 + lane + off < L.threads ? t + off : t;
    bits = L.slots[src];
    sync_or_fail(SHUFFLE);
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
int launch(void (*k)(A...), bool synchronizing, const unsigned* dims, void** params,
           std::size_t nparams, char* err, std::size_t err_len) {
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
    L.sequential = !synchronizing;
    L.body = [&] { call(k, params, std::index_sequence_for<A...>{}); };
    if (synchronizing) {
        L.fibers.resize(threads);
        L.stacks.reset(new char[threads * STACK]);
        L.state.assign(threads, State::Runnable);
        L.waiting_at.assign(threads, nullptr);
        L.slots.assign(threads, 0);
    }
    current = &L;
    for (unsigned long long b = 0; b < blocks && L.error.empty(); b++) {
        blockIdx = {(unsigned)(b % gridDim.x), (unsigned)(b / gridDim.x % gridDim.y),
                    (unsigned)(b / ((unsigned long long)gridDim.x * gridDim.y))};
        if (synchronizing) {
            run_block_fibers(L);
            continue;
        }
        for (unsigned t = 0; t < threads; t++) {
            set_thread(t);
            L.body();
        }
    }
    current = nullptr;
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

inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) {
    unsigned long long old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v < old &&
           !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
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
// `synchronizing`: whether its threads wait for each other (barriers, shuffles).
#define RW_HOST_EXPORT(name, synchronizing)                                                 \
    extern "C" int rw_host_##name(const unsigned* dims, void** params, std::size_t nparams, \
                                  char* err, std::size_t err_len) {                         \
        return rw_host::launch(name, synchronizing, dims, params, nparams, err, err_len);   \
    }
