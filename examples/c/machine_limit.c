/*
 * How close a randomized or exact SVD comes to the machine: each phase's rate against the
 * GEMM rate of the threads rankwise runs on, and its machine limit, its flops at that rate
 * plus the matrix bytes it read at the rate the same threads read them (what `rankwise
 * rsvd --machine-limit` and `rankwise svd --machine-limit` print).
 *
 *   mpirun -np 2 ./machine_limit ROWS COLS PANEL SEED K OVERSAMPLE POWER [svd]
 *
 * Each rank fills its whole panels of the matrix `rankwise rsvd --seed SEED` generates,
 * calls rankwise_rsvd (or, with `svd`, rankwise_tsqr_svd), then reads the call's phases
 * (rankwise_last_phases) and measures the machine's rates (rankwise_machine_gemm_peak, and
 * rankwise_tile_production_peak or, for `svd`, rankwise_production_peak; collective). The program is its own GEMM probe: started by
 * rankwise_machine_gemm_peak to measure OpenBLAS's other kernels, it answers through
 * rankwise_serve_gemm_probe before MPI_Init. Rank 0 prints the GEMM rates, then one line
 * per phase:
 *
 *   gemm <loaded> GFLOP/s loaded, <best> GFLOP/s best, <slower> GFLOP/s loaded when slower
 *
 *   phase <name>: <seconds> s, <GFLOP/s> GFLOP/s, <share> % of <peak> GFLOP/s; limit
 *   <limit> s, <share> % (<bytes> bytes at <GB/s> GB/s)
 *
 * (rate and shares "-" for a phase whose work is not counted).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>
#include <rankwise.h>

static int check(int rank, const char *what, rankwise_status st) {
    if (st != RANKWISE_OK)
        fprintf(stderr, "rank %d: %s failed (%d): %s\n", rank, what, (int)st, rankwise_last_error());
    return st != RANKWISE_OK;
}

int main(int argc, char **argv) {
    int probe = rankwise_serve_gemm_probe();
    if (probe >= 0)
        return probe;
    int provided, rank, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int exact = argc == 9 && strcmp(argv[8], "svd") == 0;
    if (argc != 8 && !exact) {
        if (rank == 0)
            fprintf(stderr, "usage: machine_limit ROWS COLS PANEL SEED K OVERSAMPLE POWER [svd]\n");
        MPI_Finalize();
        return 2;
    }
    int64_t rows = strtoll(argv[1], NULL, 10), cols = strtoll(argv[2], NULL, 10);
    int64_t panel = strtoll(argv[3], NULL, 10), k = strtoll(argv[5], NULL, 10);
    uint64_t seed = strtoull(argv[4], NULL, 10);
    int64_t panels = (rows + panel - 1) / panel;
    int64_t row0 = panels * rank / size * panel;
    int64_t row_end = rank == size - 1 ? rows : panels * (rank + 1) / size * panel;
    int64_t rows_local = row_end - row0;

    /* Before any decomposition there are no phases. */
    const rankwise_phase *phases = NULL;
    int64_t count = -1;
    if (check(rank, "rankwise_last_phases", rankwise_last_phases(&phases, &count)) || count != 0) {
        fprintf(stderr, "rank %d: %" PRId64 " phases before any call\n", rank, count);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }

    rankwise_sizes sz;
    if (exact ? check(rank, "rankwise_tsqr_svd_query",
                      rankwise_tsqr_svd_query(rows_local, cols, RANKWISE_ROW_MAJOR, &sz))
              : check(rank, "rankwise_rsvd_query",
                      rankwise_rsvd_query(rows_local, cols, k, RANKWISE_ROW_MAJOR, &sz)))
        MPI_Abort(MPI_COMM_WORLD, 1);
    double *a = malloc(sizeof(double) * (size_t)(rows_local * cols + 1));
    double *s = malloc(sizeof(double) * (size_t)sz.s_len);
    double *u = malloc(sizeof(double) * (size_t)(sz.u_rows * sz.min_ldu + 1));
    double *vt = malloc(sizeof(double) * (size_t)(sz.vt_rows * sz.min_ldvt));
    MPI_Fint comm = MPI_Comm_c2f(MPI_COMM_WORLD);
    int failed = check(rank, "rankwise_generate",
                       rankwise_generate(seed, RANKWISE_DIST_UNIFORM, row0, rows_local, cols, a, cols,
                                         RANKWISE_ROW_MAJOR));
    if (exact)
        failed = failed || check(rank, "rankwise_tsqr_svd",
                                 rankwise_tsqr_svd(comm, a, rows_local, cols, cols, RANKWISE_ROW_MAJOR,
                                                   panel, s, u, sz.min_ldu, vt, sz.min_ldvt));
    else
        failed = failed || check(rank, "rankwise_rsvd",
                                 rankwise_rsvd(comm, a, rows_local, cols, cols, RANKWISE_ROW_MAJOR, panel,
                                               k, strtoll(argv[6], NULL, 10), strtoll(argv[7], NULL, 10),
                                               1, s, u, sz.min_ldu, vt, sz.min_ldvt));
    double loaded = 0, peak = 0, slower = 0, production = 0;
    failed = failed || check(rank, "rankwise_last_phases", rankwise_last_phases(&phases, &count));
    /* Collective: every rank measures its threads at once. */
    failed = failed || check(rank, "rankwise_gemm_peak", rankwise_gemm_peak(comm, RANKWISE_F64, &loaded));
    failed = failed || check(rank, "rankwise_machine_gemm_peak",
                             rankwise_machine_gemm_peak(comm, RANKWISE_F64, NULL, &peak, &slower));
    /* Into the blocks the call's kernels read: the exact SVD's row blocks, or the
     * randomized passes' tiles. */
    if (exact)
        failed = failed || check(rank, "rankwise_production_peak",
                                 rankwise_production_peak(comm, a, rows_local, cols, cols,
                                                          RANKWISE_ROW_MAJOR, &production));
    else
        failed = failed || check(rank, "rankwise_tile_production_peak",
                                 rankwise_tile_production_peak(comm, a, rows_local, cols, cols,
                                                               RANKWISE_ROW_MAJOR, &production));
    if (failed)
        MPI_Abort(MPI_COMM_WORLD, 1);
    /* Each phase's bytes on all ranks together (every rank has the same phases). */
    int64_t *bytes = malloc(sizeof(int64_t) * (size_t)(count + 1));
    for (int64_t i = 0; i < count; i++)
        bytes[i] = phases[i].produced_bytes;
    MPI_Allreduce(MPI_IN_PLACE, bytes, (int)count, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("gemm %.2f GFLOP/s loaded, %.2f GFLOP/s best, %.2f GFLOP/s loaded when slower\n",
               loaded / 1e9, peak / 1e9, slower / 1e9);
        for (int64_t i = 0; i < count; i++) {
            const rankwise_phase *p = &phases[i];
            if ((p->flops > 0 || bytes[i] > 0) && p->seconds > 0) {
                double rate = p->flops / p->seconds;
                double limit = p->flops / peak + (double)bytes[i] / production;
                printf("phase %s: %.4f s, %.2f GFLOP/s, %.1f %% of %.2f GFLOP/s; limit %.4f s, "
                       "%.1f %% (%" PRId64 " bytes at %.2f GB/s)\n",
                       p->name, p->seconds, rate / 1e9, 100 * rate / peak, peak / 1e9, limit,
                       100 * limit / p->seconds, bytes[i], production / 1e9);
            } else {
                printf("phase %s: %.4f s, - GFLOP/s, - %% of %.2f GFLOP/s; limit - s, - %%\n",
                       p->name, p->seconds, peak / 1e9);
            }
        }
    }
    free(bytes);
    free(a);
    free(s);
    free(u);
    free(vt);
    MPI_Finalize();
    return failed;
}
