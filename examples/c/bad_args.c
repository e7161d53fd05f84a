/*
 * Bad arguments to rankwise: each call returns its error code, rankwise_last_error()
 * names the argument, and nothing aborts. Run it with `mpirun -np 2 ./bad_args`; it
 * prints one "ok" line per case and rank, and exits 0 when every case behaved.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>
#include <rankwise.h>

#define ROWS 40 /* rows per rank */
#define COLS 4

static int rank = 0, failures = 0;

static void expect(const char *what, rankwise_status got, rankwise_status want, const char *names) {
    const char *msg = rankwise_last_error();
    if (got != want || (names && !strstr(msg, names))) {
        fprintf(stderr, "rank %d: FAIL %s: status %d (want %d), message \"%s\" (want it to name %s)\n",
                rank, what, (int)got, (int)want, msg, names ? names : "-");
        failures++;
    } else {
        printf("rank %d: ok %s: %s\n", rank, what, msg);
    }
}

int main(int argc, char **argv) {
    static double a[ROWS * COLS], s[COLS], u[ROWS * COLS], vt[COLS * COLS], res[COLS];
    int32_t converged = -1;
    int provided, size;
    MPI_Fint world = 0;

    /* Before MPI_Init: no abort, a code that says so. */
    expect("before MPI_Init",
           rankwise_tsqr_svd(world, a, ROWS, COLS, ROWS, RANKWISE_COL_MAJOR, 10, s, u, ROWS, vt, COLS),
           RANKWISE_ERROR_MPI_NOT_READY, "MPI is not initialized");

    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    world = MPI_Comm_c2f(MPI_COMM_WORLD);
    const int64_t R = ROWS, C = COLS, L = RANKWISE_COL_MAJOR;
    rankwise_generate(7, RANKWISE_DIST_NORMAL, R * rank, R, C, a, R, RANKWISE_COL_MAJOR);

    expect("null a", rankwise_tsqr_svd(world, NULL, R, C, R, L, 10, s, u, R, vt, C),
           RANKWISE_ERROR_NULL_POINTER, "`a`");
    expect("null s", rankwise_tsqr_svd(world, a, R, C, R, L, 10, NULL, u, R, vt, C),
           RANKWISE_ERROR_NULL_POINTER, "`s`");
    expect("null u_local", rankwise_tsqr_svd(world, a, R, C, R, L, 10, s, NULL, R, vt, C),
           RANKWISE_ERROR_NULL_POINTER, "`u_local`");
    expect("null vt", rankwise_tsqr_svd(world, a, R, C, R, L, 10, s, u, R, NULL, C),
           RANKWISE_ERROR_NULL_POINTER, "`vt`");
    expect("negative rows", rankwise_tsqr_svd(world, a, -5, C, R, L, 10, s, u, R, vt, C),
           RANKWISE_ERROR_INVALID_ARGUMENT, "`rows_local`");
    expect("negative cols", rankwise_tsqr_svd(world, a, R, -1, R, L, 10, s, u, R, vt, C),
           RANKWISE_ERROR_INVALID_ARGUMENT, "`cols`");
    expect("negative panel rows", rankwise_tsqr_svd(world, a, R, C, R, L, -10, s, u, R, vt, C),
           RANKWISE_ERROR_INVALID_ARGUMENT, "`panel_rows`");
    expect("lda < rows", rankwise_tsqr_svd(world, a, R, C, R - 1, L, 10, s, u, R, vt, C),
           RANKWISE_ERROR_INVALID_ARGUMENT, "`lda`");
    expect("ldu < rows", rankwise_tsqr_svd(world, a, R, C, R, L, 10, s, u, 3, vt, C),
           RANKWISE_ERROR_INVALID_ARGUMENT, "`ldu`");
    expect("ldvt < k", rankwise_tsqr_svd(world, a, R, C, R, L, 10, s, u, R, vt, 2),
           RANKWISE_ERROR_INVALID_ARGUMENT, "`ldvt`");
    expect("unknown layout", rankwise_tsqr_svd(world, a, R, C, R, 3, 10, s, u, R, vt, C),
           RANKWISE_ERROR_INVALID_ARGUMENT, "`layout`");
    expect("k = 0", rankwise_rsvd(world, a, R, C, R, L, 10, 0, 1, 1, 1, s, u, R, vt, C),
           RANKWISE_ERROR_INVALID_ARGUMENT, "`k`");
    expect("k = cols", rankwise_rsvd(world, a, R, C, R, L, 10, C, 0, 1, 1, s, u, R, vt, C),
           RANKWISE_ERROR_INVALID_ARGUMENT, "`k`");
    expect("k + oversample > cols", rankwise_rsvd(world, a, R, C, R, L, 10, 2, 5, 1, 1, s, u, R, vt, C),
           RANKWISE_ERROR_INVALID_ARGUMENT, "`oversample`");
    expect("negative power iterations", rankwise_rsvd(world, a, R, C, R, L, 10, 2, 1, -1, 1, s, u, R, vt, C),
           RANKWISE_ERROR_INVALID_ARGUMENT, "`power_iters`");
    expect("negative tolerance",
           rankwise_rsvd_tol(world, a, R, C, R, L, 10, 2, 1, -1e-6, 20, 1, s, u, R, vt, C, res, &converged),
           RANKWISE_ERROR_INVALID_ARGUMENT, "`tol`");
    expect("one pass",
           rankwise_rsvd_tol(world, a, R, C, R, L, 10, 2, 1, 1e-6, 1, 1, s, u, R, vt, C, res, &converged),
           RANKWISE_ERROR_INVALID_ARGUMENT, "`max_passes`");
    expect("null residuals",
           rankwise_rsvd_tol(world, a, R, C, R, L, 10, 2, 1, 1e-6, 20, 1, s, u, R, vt, C, NULL, &converged),
           RANKWISE_ERROR_NULL_POINTER, "`residuals`");
    expect("null converged",
           rankwise_rsvd_tol(world, a, R, C, R, L, 10, 2, 1, 1e-6, 20, 1, s, u, R, vt, C, res, NULL),
           RANKWISE_ERROR_NULL_POINTER, "`converged`");
    expect("communicator 12345", rankwise_tsqr_svd(12345, a, R, C, R, L, 10, s, u, R, vt, C),
           RANKWISE_ERROR_INVALID_COMMUNICATOR, "`comm`");
    expect("communicator -1", rankwise_tsqr_svd(-1, a, R, C, R, L, 10, s, u, R, vt, C),
           RANKWISE_ERROR_INVALID_COMMUNICATOR, "`comm`");
    expect("MPI_COMM_NULL", rankwise_tsqr_svd(MPI_Comm_c2f(MPI_COMM_NULL), a, R, C, R, L, 10, s, u, R, vt, C),
           RANKWISE_ERROR_INVALID_COMMUNICATOR, "`comm`");
    /* A handle of a communicator that was freed names nothing any more. */
    MPI_Comm freed;
    MPI_Comm_dup(MPI_COMM_WORLD, &freed);
    MPI_Fint freed_handle = MPI_Comm_c2f(freed);
    MPI_Comm_free(&freed);
    expect("freed communicator", rankwise_tsqr_svd(freed_handle, a, R, C, R, L, 10, s, u, R, vt, C),
           RANKWISE_ERROR_INVALID_COMMUNICATOR, "`comm`");
    expect("null sizes", rankwise_tsqr_svd_query(R, C, L, NULL), RANKWISE_ERROR_NULL_POINTER, "`sizes`");
    expect("unknown distribution", rankwise_generate(1, 9, 0, R, C, a + 0, R, L),
           RANKWISE_ERROR_INVALID_ARGUMENT, "`dist`");

    /* Only the last rank is wrong: it names its argument, the others name it as the cause. */
    int last = rank == size - 1;
    expect("one rank's null a",
           rankwise_tsqr_svd(world, last ? NULL : a, R, C, R, L, 10, s, u, R, vt, C),
           last ? RANKWISE_ERROR_NULL_POINTER : RANKWISE_ERROR_OTHER_RANK,
           last ? "`a`" : "failed");
    expect("ranks disagree on cols",
           rankwise_tsqr_svd(world, a, R, last ? C - 1 : C, R, L, 10, s, u, R, vt, C),
           size > 1 ? RANKWISE_ERROR_INCONSISTENT : RANKWISE_OK, size > 1 ? "`cols`" : NULL);
    expect("ranks make different calls",
           last ? rankwise_rsvd(world, a, R, C, R, L, 10, 2, 1, 1, 3, s, u, R, vt, C)
                : rankwise_tsqr_svd(world, a, R, C, R, L, 10, s, u, R, vt, C),
           size > 1 ? RANKWISE_ERROR_INCONSISTENT : RANKWISE_OK, size > 1 ? "rankwise_rsvd" : NULL);
    expect("ranks disagree on tol",
           rankwise_rsvd_tol(world, a, R, C, R, L, 10, 2, 1, last ? 1e-5 : 1e-6, 20, 1, s, u, R, vt, C,
                             res, &converged),
           size > 1 ? RANKWISE_ERROR_INCONSISTENT : RANKWISE_OK, size > 1 ? "`tol`" : NULL);
    expect("rows not a multiple of panel_rows",
           rankwise_tsqr_svd(world, a, R, C, R, L, 15, s, u, R, vt, C),
           size > 1 ? RANKWISE_ERROR_INCONSISTENT : RANKWISE_OK, size > 1 ? "`panel_rows`" : NULL);
    expect("fewer rows than columns", rankwise_tsqr_svd(world, a, 0, C, R, L, 10, s, u, R, vt, C),
           RANKWISE_ERROR_INCONSISTENT, "`rows_local`");

    /* The machine limit: a bad or disagreeing precision and NULL outputs are errors on
     * every rank (no rank waits in the probe); the phases of a failed call are none. */
    const rankwise_phase *phases = NULL;
    int64_t count = -1;
    double peak = 0;
    expect("precision 7", rankwise_gemm_peak(world, 7, &peak), RANKWISE_ERROR_INVALID_ARGUMENT,
           "`precision`");
    expect("ranks disagree on precision",
           rankwise_gemm_peak(world, last ? RANKWISE_F32 : RANKWISE_F64, &peak),
           size > 1 ? RANKWISE_ERROR_INCONSISTENT : RANKWISE_OK, size > 1 ? "`precision`" : NULL);
    expect("null flops_per_second", rankwise_gemm_peak(world, RANKWISE_F64, last ? NULL : &peak),
           last ? RANKWISE_ERROR_NULL_POINTER : (size > 1 ? RANKWISE_ERROR_OTHER_RANK : RANKWISE_OK),
           last ? "`flops_per_second`" : NULL);
    expect("null bytes_per_second (tiles)",
           rankwise_tile_production_peak(world, a, R, C, R, L, last ? NULL : &peak),
           last ? RANKWISE_ERROR_NULL_POINTER : (size > 1 ? RANKWISE_ERROR_OTHER_RANK : RANKWISE_OK),
           last ? "`bytes_per_second`" : NULL);
    expect("lda < rows (tiles)", rankwise_tile_production_peak(world, a, R, C, R - 1, L, &peak),
           RANKWISE_ERROR_INVALID_ARGUMENT, "`lda`");
    expect("null phases", rankwise_last_phases(NULL, &count), RANKWISE_ERROR_NULL_POINTER, "`phases`");
    expect("phases of a failed call", rankwise_last_phases(&phases, &count), RANKWISE_OK, NULL);
    if (count != 0) {
        fprintf(stderr, "rank %d: FAIL %lld phases after a failed call\n", rank, (long long)count);
        failures++;
    }

    /* The PCA: bad options name the option, on every rank; a missing input names the file
     * on every rank (its own error, or the rank that reported it first); nothing hangs. */
    rankwise_pca_options po;
    rankwise_pca_result *pr = NULL;
    expect("null options to init", rankwise_pca_options_init(NULL), RANKWISE_ERROR_NULL_POINTER,
           "`options`");
    rankwise_pca_options_init(&po);
    expect("pca null input", rankwise_pca(world, NULL, &po, &pr), RANKWISE_ERROR_NULL_POINTER, "`input`");
    expect("pca null result", rankwise_pca(world, "x.bed", &po, NULL), RANKWISE_ERROR_NULL_POINTER,
           "`result`");
    po.k = 0;
    expect("pca k = 0", rankwise_pca(world, "x.bed", &po, &pr), RANKWISE_ERROR_INVALID_ARGUMENT, "`k`");
    rankwise_pca_options_init(&po);
    po.maf = 0.7;
    expect("pca maf 0.7", rankwise_pca(world, "x.bed", &po, &pr), RANKWISE_ERROR_INVALID_ARGUMENT, "`maf`");
    rankwise_pca_options_init(&po);
    po.zarr_format = 4;
    expect("pca zarr_format 4", rankwise_pca(world, "x.bed", &po, &pr), RANKWISE_ERROR_INVALID_ARGUMENT,
           "`zarr_format`");
    rankwise_pca_options_init(&po);
    po.keep = "/nonexistent/keep.txt";
    expect("pca missing keep file", rankwise_pca(world, "x.bed", &po, &pr),
           RANKWISE_ERROR_INVALID_ARGUMENT, "/nonexistent/keep.txt");
    rankwise_pca_options_init(&po);
    po.k = last ? 5 : 4;
    expect("ranks disagree on the PCA's k", rankwise_pca(world, "x.bed", &po, &pr),
           size > 1 ? RANKWISE_ERROR_INCONSISTENT : RANKWISE_ERROR_INPUT, size > 1 ? "`k`" : "x");
    rankwise_pca_options_init(&po);
    expect("ranks disagree on the PCA's input",
           rankwise_pca(world, last ? "/nonexistent/b" : "/nonexistent/a", &po, &pr),
           size > 1 ? RANKWISE_ERROR_INCONSISTENT : RANKWISE_ERROR_INPUT, size > 1 ? "`input`" : "/nonexistent");
    {
        rankwise_status st = rankwise_pca(world, "/nonexistent/cohort", &po, &pr);
        /* Every rank finds it missing; the first to announce it names it for the others. */
        expect("pca missing input", st,
               st == RANKWISE_ERROR_OTHER_RANK ? RANKWISE_ERROR_OTHER_RANK : RANKWISE_ERROR_INPUT,
               "/nonexistent/cohort");
    }
    if (pr != NULL) {
        fprintf(stderr, "rank %d: FAIL a failed rankwise_pca set its result\n", rank);
        failures++;
    }
    int64_t n_samples = -1;
    expect("pca sizes of NULL", rankwise_pca_sizes(NULL, &n_samples, NULL, NULL),
           RANKWISE_ERROR_NULL_POINTER, "`result`");
    expect("pca get of NULL", rankwise_pca_get(NULL, NULL, NULL, 0, L, NULL, NULL),
           RANKWISE_ERROR_NULL_POINTER, "`result`");
    if (rankwise_pca_sample_id(NULL, 0) != NULL || !strstr(rankwise_last_error(), "`result`")) {
        fprintf(stderr, "rank %d: FAIL sample ID of a NULL result\n", rank);
        failures++;
    }
    rankwise_pca_free(NULL);

    /* After all of that, a good call still works. */
    expect("good call", rankwise_tsqr_svd(world, a, R, C, R, L, 10, s, u, R, vt, C), RANKWISE_OK, NULL);
    expect("good randomized call",
           rankwise_rsvd(world, a, R, C, R, L, 10, 2, 1, 1, 3, s, u, R, vt, C), RANKWISE_OK, NULL);
    /* Defaults (0, 0) on a 80 x 4 normal matrix: every component converges, and says so. */
    converged = -1;
    expect("good call to a tolerance",
           rankwise_rsvd_tol(world, a, R, C, R, L, 10, 2, 1, 0, 0, 3, s, u, R, vt, C, res, &converged),
           RANKWISE_OK, NULL);
    if (converged != 1 || !(res[0] <= 1e-6 && res[1] <= 1e-6)) {
        fprintf(stderr, "rank %d: FAIL converged %d, residuals %g %g\n", rank, (int)converged, res[0], res[1]);
        failures++;
    }
    /* The good call's phases: named, timed, and its passes' products counted. */
    expect("phases of a good call", rankwise_last_phases(&phases, &count), RANKWISE_OK, NULL);
    int counted = 0;
    for (int64_t i = 0; i < count; i++) {
        if (!phases[i].name || !phases[i].name[0] || !(phases[i].seconds >= 0)) {
            fprintf(stderr, "rank %d: FAIL phase %lld unnamed or untimed\n", rank, (long long)i);
            failures++;
        }
        counted += phases[i].flops > 0;
    }
    if (count < 2 || counted < 1) {
        fprintf(stderr, "rank %d: FAIL %lld phases, %d with flops\n", rank, (long long)count, counted);
        failures++;
    }
    expect("machine limit", rankwise_gemm_peak(world, RANKWISE_F64, &peak), RANKWISE_OK, NULL);
    if (!(peak > 1e8)) {
        fprintf(stderr, "rank %d: FAIL GEMM peak %g flop/s\n", rank, peak);
        failures++;
    }

    /* The communicator passed is the one used: on a communicator of this rank alone, its
     * 40 rows are the whole matrix, whatever the other ranks do meanwhile. */
    MPI_Comm alone;
    MPI_Comm_split(MPI_COMM_WORLD, rank, 0, &alone);
    expect("call on a communicator of one rank",
           rankwise_tsqr_svd(MPI_Comm_c2f(alone), a, R, C, R, L, 0, s, u, R, vt, C), RANKWISE_OK, NULL);
    MPI_Comm_free(&alone);

    MPI_Finalize();
    if (failures == 0)
        printf("rank %d: all cases behaved\n", rank);
    return failures ? 1 : 0;
}
