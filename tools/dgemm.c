/* DGEMM rate of this machine's OpenBLAS, for benches/run.sh.
 *
 *   cc -O2 tools/dgemm.c -o dgemm -lopenblas && ./dgemm [n] [threads] [reps]
 *
 * C = A * B for n x n float64 matrices (default n = 4000, 2 threads, best of 3 after one
 * warm-up call). Output: `name=value` lines; GFLOP/s counts 2 n^3 flops per call; `core` is
 * the kernels OpenBLAS chose (OPENBLAS_CORETYPE sets them).
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void openblas_set_num_threads(int num_threads);
char *openblas_get_corename(void);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 4000;
    int threads = argc > 2 ? atoi(argv[2]) : 2;
    int reps = argc > 3 ? atoi(argv[3]) : 3;
    if (n <= 0 || threads <= 0 || reps <= 0) {
        fprintf(stderr, "usage: dgemm [n] [threads] [reps]\n");
        return 2;
    }
    openblas_set_num_threads(threads);
    size_t len = (size_t)n * (size_t)n;
    double *a = malloc(len * sizeof(double));
    double *b = malloc(len * sizeof(double));
    double *c = malloc(len * sizeof(double));
    if (!a || !b || !c) {
        fprintf(stderr, "dgemm: cannot allocate three %d x %d matrices\n", n, n);
        return 1;
    }
    unsigned long long x = 88172645463325252ULL;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        a[i] = (double)(x >> 11) / 9007199254740992.0;
        b[i] = 1.0 - a[i];
        c[i] = 0.0;
    }
    double best = 1e30;
    for (int r = 0; r <= reps; r++) {
        double t = now();
        cblas_dgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0, a, n, b, n, 0.0, c, n);
        t = now() - t;
        if (r > 0 && t < best) /* call 0 is the warm-up */
            best = t;
    }
    printf("n=%d\n", n);
    printf("threads=%d\n", threads);
    printf("core=%s\n", openblas_get_corename());
    printf("seconds=%.4f\n", best);
    printf("gflops=%.1f\n", 2.0 * (double)n * (double)n * (double)n / best / 1e9);
    fprintf(stderr, "dgemm: checksum %g\n", c[len / 2]);
    free(a);
    free(b);
    free(c);
    return 0;
}
