/* STREAM-like memory bandwidth of this machine, for benches/run.sh.
 *
 *   cc -O2 -fopenmp tools/membw.c -o membw && OMP_NUM_THREADS=2 ./membw [MiB per array] [reps]
 *
 * Three arrays of MiB each (default 1024, i.e. 1 GiB each) are first-touched in parallel,
 * then each kernel runs `reps` times (default 10) and its best rate is reported, counting
 * the bytes the kernel names (as STREAM does: a write counts once, write-allocate traffic
 * is not counted):
 *
 *   copy   c[i] = a[i]             16 bytes per element
 *   read   s += a[i] (+ b[i])      16 bytes per element (two streams read, nothing written)
 *   triad  a[i] = b[i] + q * c[i]  24 bytes per element
 *
 * Output: one `name=value` line per figure (GB = 1e9 bytes), for the harness to parse.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    long mib = argc > 1 ? atol(argv[1]) : 1024;
    int reps = argc > 2 ? atoi(argv[2]) : 10;
    if (mib <= 0 || reps <= 0) {
        fprintf(stderr, "usage: membw [MiB per array] [reps]\n");
        return 2;
    }
    long n = mib * 1024L * 1024L / (long)sizeof(double);
    double *a = malloc((size_t)n * sizeof(double));
    double *b = malloc((size_t)n * sizeof(double));
    double *c = malloc((size_t)n * sizeof(double));
    if (!a || !b || !c) {
        fprintf(stderr, "membw: cannot allocate 3 x %ld MiB\n", mib);
        return 1;
    }
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) {
        a[i] = 1.0;
        b[i] = 2.0;
        c[i] = 0.0;
    }
    double best_copy = 1e30, best_read = 1e30, best_triad = 1e30;
    double sink = 0.0;
    const double q = 3.0;
    for (int r = 0; r < reps; r++) {
        double t = now();
#pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++)
            c[i] = a[i];
        t = now() - t;
        if (t < best_copy)
            best_copy = t;

        double s = 0.0;
        t = now();
#pragma omp parallel for schedule(static) reduction(+ : s)
        for (long i = 0; i < n; i++)
            s += a[i] + b[i];
        t = now() - t;
        sink += s;
        if (t < best_read)
            best_read = t;

        t = now();
#pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++)
            a[i] = b[i] + q * c[i];
        t = now() - t;
        if (t < best_triad)
            best_triad = t;
    }
    double bytes = (double)n * sizeof(double);
    printf("threads=%d\n", omp_get_max_threads());
    printf("array_mib=%ld\n", mib);
    printf("reps=%d\n", reps);
    printf("copy_gbs=%.2f\n", 2.0 * bytes / best_copy / 1e9);
    printf("read_gbs=%.2f\n", 2.0 * bytes / best_read / 1e9);
    printf("triad_gbs=%.2f\n", 3.0 * bytes / best_triad / 1e9);
    /* Keeps the read kernel from being optimized away. */
    fprintf(stderr, "membw: checksum %g\n", sink + a[n / 2]);
    free(a);
    free(b);
    free(c);
    return 0;
}
