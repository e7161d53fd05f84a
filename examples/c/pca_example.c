/*
 * The genotype PCA of a PLINK fileset, a VCF Zarr store or a Zarr array of dosages from an
 * MPI code, through rankwise_pca:
 *
 *   mpirun -np 4 ./pca_example INPUT OUTDIR [K [OUT [CHROMOSOMES [SEED]]]]
 *
 * Every rank calls rankwise_pca with the same arguments (OUT: also publish the results as
 * `rankwise pca --out OUT` does; "-" for none; SEED: the starting block's, as `rankwise pca
 * --sketch-seed`) and gets the same results; each writes
 * OUTDIR/eigenval.RANK.bin (k doubles), OUTDIR/pcs.RANK.bin (samples x k, row-major
 * doubles), OUTDIR/residuals.RANK.bin and OUTDIR/ids.RANK.txt. Rank 0 prints the
 * eigenvalues and whether every component converged. A failure prints rankwise's message
 * on every rank and exits 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>
#include <rankwise.h>

static int write_doubles(const char *dir, const char *name, int rank, const double *v, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%d.bin", dir, name, rank);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(v, sizeof *v, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "rank %d: cannot write %s\n", rank, path);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    int provided, rank;
    if (argc < 3) {
        fprintf(stderr, "usage: %s INPUT OUTDIR [K [OUT [CHROMOSOMES [SEED]]]]\n", argv[0]);
        return 2;
    }
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);

    rankwise_pca_options options;
    rankwise_pca_options_init(&options);
    if (argc > 3)
        options.k = atoll(argv[3]);
    if (argc > 4 && strcmp(argv[4], "-") != 0)
        options.out = argv[4];
    if (argc > 5 && strcmp(argv[5], "-") != 0)
        options.chromosomes = argv[5];
    if (argc > 6)
        options.seed = strtoull(argv[6], NULL, 10);

    rankwise_pca_result *result = NULL;
    rankwise_status status = rankwise_pca(MPI_Comm_c2f(MPI_COMM_WORLD), argv[1], &options, &result);
    if (status != RANKWISE_OK) {
        fprintf(stderr, "rank %d: rankwise_pca failed (status %d): %s\n", rank, (int)status,
                rankwise_last_error());
        MPI_Finalize();
        return 1;
    }
    int64_t samples = 0, k = 0, variants = 0;
    rankwise_pca_sizes(result, &samples, &k, &variants);
    double *eigenvalues = malloc(k * sizeof(double));
    double *residuals = malloc(k * sizeof(double));
    double *pcs = malloc(samples * k * sizeof(double));
    int32_t converged = -1;
    status = rankwise_pca_get(result, eigenvalues, pcs, k, RANKWISE_ROW_MAJOR, residuals, &converged);
    int failed = status != RANKWISE_OK;
    failed |= write_doubles(argv[2], "eigenval", rank, eigenvalues, k);
    failed |= write_doubles(argv[2], "pcs", rank, pcs, samples * k);
    failed |= write_doubles(argv[2], "residuals", rank, residuals, k);
    char path[4096];
    snprintf(path, sizeof path, "%s/ids.%d.txt", argv[2], rank);
    FILE *ids = fopen(path, "w");
    for (int64_t i = 0; ids && i < samples; i++)
        fprintf(ids, "%s\n", rankwise_pca_sample_id(result, i));
    failed |= !ids || fclose(ids) != 0;
    if (rank == 0) {
        printf("%lld samples, %lld variants used, %lld components, %s\n", (long long)samples,
               (long long)variants, (long long)k, converged ? "all converged" : "NOT all converged");
        for (int64_t i = 0; i < k; i++)
            printf("PC%lld eigenvalue %.6g residual %.2e\n", (long long)(i + 1), eigenvalues[i],
                   residuals[i]);
    }
    rankwise_pca_free(result);
    free(eigenvalues);
    free(residuals);
    free(pcs);
    MPI_Finalize();
    return failed;
}
