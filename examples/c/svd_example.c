/*
 * An MPI code that holds a tall matrix in row blocks and asks rankwise for its SVD.
 *
 *   mpirun -np 4 ./svd_example svd  ROWS COLS PANEL SEED DIST OUTDIR
 *   mpirun -np 4 ./svd_example rsvd ROWS COLS PANEL SEED DIST OUTDIR K OVERSAMPLE POWER SKETCH_SEED
 *   mpirun -np 4 ./svd_example rsvd-tol ROWS COLS PANEL SEED DIST OUTDIR K OVERSAMPLE TOL MAX_PASSES SKETCH_SEED
 *
 * Each rank fills its block with the values `rankwise svd --seed SEED --dist DIST`
 * generates (rankwise_generate), in row-major layout with a padded leading dimension,
 * then calls rankwise_tsqr_svd, rankwise_rsvd or rankwise_rsvd_tol on MPI_COMM_WORLD
 * (rsvd-tol: rank 0 also writes the residuals, R.bin, and prints whether every component
 * converged). Rank 0 writes S.bin
 * and Vt.bin (k x COLS, row-major); rank r writes U.<r>.bin, its rows of U (row-major):
 * raw little-endian doubles, to compare bit for bit with `rankwise … --out`.
 *
 * The rows go to the ranks in whole panels of PANEL rows (the last rank also takes the
 * ragged end), as rankwise requires: a panel never spans two ranks.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>
#include <rankwise.h>

static int write_file(const char *dir, const char *name, const double *v, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(v, sizeof(double), n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "svd_example: cannot write %s\n", path);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    int provided, rank, size;
    /* rankwise runs worker threads beside the MPI thread: FUNNELED at least. */
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int to_tol = argc == 13 && strcmp(argv[1], "rsvd-tol") == 0;
    int randomized = to_tol || (argc == 12 && strcmp(argv[1], "rsvd") == 0);
    if (!randomized && !(argc == 8 && strcmp(argv[1], "svd") == 0)) {
        if (rank == 0)
            fprintf(stderr, "usage: svd_example svd ROWS COLS PANEL SEED DIST OUTDIR\n"
                            "       svd_example rsvd ROWS COLS PANEL SEED DIST OUTDIR K "
                            "OVERSAMPLE POWER SKETCH_SEED\n"
                            "       svd_example rsvd-tol ROWS COLS PANEL SEED DIST OUTDIR K "
                            "OVERSAMPLE TOL MAX_PASSES SKETCH_SEED\n");
        MPI_Finalize();
        return 2;
    }
    int64_t rows = strtoll(argv[2], NULL, 10), cols = strtoll(argv[3], NULL, 10);
    int64_t panel = strtoll(argv[4], NULL, 10);
    uint64_t seed = strtoull(argv[5], NULL, 10);
    rankwise_dist dist = strcmp(argv[6], "normal") == 0 ? RANKWISE_DIST_NORMAL : RANKWISE_DIST_UNIFORM;
    const char *out = argv[7];

    /* Whole panels per rank, the last rank's block ending at the last row. */
    int64_t panels = (rows + panel - 1) / panel;
    int64_t first = panels * rank / size, last = panels * (rank + 1) / size;
    int64_t row0 = first * panel;
    int64_t row_end = rank == size - 1 ? rows : last * panel;
    int64_t rows_local = row_end - row0;

    int64_t k = randomized ? strtoll(argv[8], NULL, 10) : cols;
    rankwise_sizes sz;
    rankwise_status st = randomized ? rankwise_rsvd_query(rows_local, cols, k, RANKWISE_ROW_MAJOR, &sz)
                                    : rankwise_tsqr_svd_query(rows_local, cols, RANKWISE_ROW_MAJOR, &sz);
    if (st != RANKWISE_OK) {
        fprintf(stderr, "rank %d: query: %s\n", rank, rankwise_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }

    int64_t lda = cols + 3; /* a padded leading dimension, as codes with halo columns have */
    double *a = malloc(sizeof(double) * (size_t)(rows_local * lda + 1));
    double *s = malloc(sizeof(double) * (size_t)sz.s_len);
    double *u = malloc(sizeof(double) * (size_t)(sz.u_rows * sz.min_ldu + 1));
    double *vt = malloc(sizeof(double) * (size_t)(sz.vt_rows * sz.min_ldvt));
    double *residuals = malloc(sizeof(double) * (size_t)k);
    int32_t converged = -1;
    st = rankwise_generate(seed, dist, row0, rows_local, cols, a, lda, RANKWISE_ROW_MAJOR);
    if (st == RANKWISE_OK) {
        MPI_Fint comm = MPI_Comm_c2f(MPI_COMM_WORLD);
        if (to_tol)
            st = rankwise_rsvd_tol(comm, a, rows_local, cols, lda, RANKWISE_ROW_MAJOR, panel, k,
                                   strtoll(argv[9], NULL, 10), strtod(argv[10], NULL),
                                   strtoll(argv[11], NULL, 10), strtoull(argv[12], NULL, 10), s, u,
                                   sz.min_ldu, vt, sz.min_ldvt, residuals, &converged);
        else if (randomized)
            st = rankwise_rsvd(comm, a, rows_local, cols, lda, RANKWISE_ROW_MAJOR, panel, k,
                               strtoll(argv[9], NULL, 10), strtoll(argv[10], NULL, 10),
                               strtoull(argv[11], NULL, 10), s, u, sz.min_ldu, vt, sz.min_ldvt);
        else
            st = rankwise_tsqr_svd(comm, a, rows_local, cols, lda, RANKWISE_ROW_MAJOR, panel, s, u,
                                   sz.min_ldu, vt, sz.min_ldvt);
    }
    if (st != RANKWISE_OK) {
        fprintf(stderr, "rank %d: rankwise failed (%d): %s\n", rank, (int)st, rankwise_last_error());
        MPI_Finalize();
        return 1;
    }

    int failed = 0;
    char name[64];
    snprintf(name, sizeof name, "U.%d.bin", rank);
    failed |= write_file(out, name, u, (size_t)(rows_local * k));
    if (rank == 0) {
        failed |= write_file(out, "S.bin", s, (size_t)k);
        failed |= write_file(out, "Vt.bin", vt, (size_t)(k * cols));
        if (to_tol) {
            failed |= write_file(out, "R.bin", residuals, (size_t)k);
            double largest = 0;
            for (int64_t i = 0; i < k; i++)
                largest = residuals[i] > largest ? residuals[i] : largest;
            printf("converged %d, largest residual %.3g\n", (int)converged, largest);
        }
        printf("rankwise %s: %" PRId64 " x %" PRId64 " on %d ranks, s[0] = %.17g\n",
               rankwise_version(), rows, cols, size, s[0]);
    }
    free(a);
    free(s);
    free(u);
    free(vt);
    free(residuals);
    MPI_Finalize();
    return failed;
}
