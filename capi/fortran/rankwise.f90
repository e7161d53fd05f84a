! rankwise: the exact (TSQR) and randomized SVD of a tall matrix whose rows an MPI code
! already holds, and the genotype PCA of a file the ranks read, for Fortran 2008 codes
! (iso_c_binding over librankwise).
!
! Every rank holds a contiguous block of rows (rank 0 the first rows) as a column-major
! array a(rows_local, cols); the communicator is the Fortran handle itself (an integer
! communicator of `use mpi`, or comm%MPI_VAL of `use mpi_f08`). Rows of every rank but
! the last must be a multiple of panel_rows (see rankwise.h). Every function returns a
! status, RANKWISE_OK on success; rankwise_error_message() says why a call failed.
! MPI must be initialized with MPI_THREAD_FUNNELED or above (MPI_Init_thread).
module rankwise
  use, intrinsic :: iso_c_binding
  implicit none
  private

  integer(c_int32_t), parameter, public :: RANKWISE_OK = 0
  integer(c_int32_t), parameter, public :: RANKWISE_ERROR_NULL_POINTER = 1
  integer(c_int32_t), parameter, public :: RANKWISE_ERROR_INVALID_ARGUMENT = 2
  integer(c_int32_t), parameter, public :: RANKWISE_ERROR_MPI_NOT_READY = 3
  integer(c_int32_t), parameter, public :: RANKWISE_ERROR_INVALID_COMMUNICATOR = 4
  integer(c_int32_t), parameter, public :: RANKWISE_ERROR_INCONSISTENT = 5
  integer(c_int32_t), parameter, public :: RANKWISE_ERROR_OTHER_RANK = 6
  integer(c_int32_t), parameter, public :: RANKWISE_ERROR_MPI = 7
  integer(c_int32_t), parameter, public :: RANKWISE_ERROR_COMPUTE = 8
  integer(c_int32_t), parameter, public :: RANKWISE_ERROR_INTERNAL = 9
  integer(c_int32_t), parameter, public :: RANKWISE_ERROR_INPUT = 10
  integer(c_int32_t), parameter, public :: RANKWISE_ERROR_OUTPUT = 11
  integer(c_int32_t), parameter, public :: RANKWISE_ERROR_NOT_CONVERGED = 12
  integer(c_int32_t), parameter, public :: RANKWISE_COL_MAJOR = 0
  integer(c_int32_t), parameter, public :: RANKWISE_ROW_MAJOR = 1
  integer(c_int32_t), parameter, public :: RANKWISE_DIST_UNIFORM = 0
  integer(c_int32_t), parameter, public :: RANKWISE_DIST_NORMAL = 1
  integer(c_int32_t), parameter, public :: RANKWISE_F64 = 0
  integer(c_int32_t), parameter, public :: RANKWISE_F32 = 1

  !> Output sizes of one rank's call (rankwise_sizes of rankwise.h).
  type, bind(C), public :: rankwise_sizes
    integer(c_int64_t) :: s_len, u_rows, u_cols, vt_rows, vt_cols, min_ldu, min_ldvt, workspace_bytes
  end type

  public :: rankwise_svd, rankwise_randomized_svd, rankwise_fill_generated
  public :: rankwise_error_message
  ! The C functions themselves, for callers that pass leading dimensions or row-major data.
  public :: rankwise_tsqr_svd, rankwise_rsvd, rankwise_rsvd_tol, rankwise_generate, rankwise_last_error
  public :: rankwise_tsqr_svd_query, rankwise_rsvd_query
  ! The machine limit: the last call's phases, the GEMM rate of rankwise's threads and the
  ! rate they read the caller's matrix at.
  public :: rankwise_last_phases, rankwise_gemm_peak, rankwise_production_peak, rankwise_phase_name
  ! The same read rate into the randomized passes' tiles (rankwise_rsvd, rankwise_rsvd_tol).
  public :: rankwise_tile_production_peak
  ! The GEMM rate with OpenBLAS's best kernels, each measured in a process started as a
  ! probe program (one that calls rankwise_serve_gemm_probe first, before MPI_Init).
  public :: rankwise_machine_gemm_peak, rankwise_serve_gemm_probe

  !> The options of rankwise_pca (rankwise_pca_options of rankwise.h): fill them with
  !> rankwise_pca_options_init; the strings are c_loc of NUL-terminated character arrays, or
  !> c_null_ptr. rankwise_genotype_pca sets them from Fortran strings.
  type, bind(C), public :: rankwise_pca_options
    integer(c_int64_t) :: k
    real(c_double) :: tol
    integer(c_int64_t) :: max_passes
    integer(c_int64_t) :: seed
    real(c_double) :: maf, geno, hwe
    type(c_ptr) :: chromosomes, keep, extract
    integer(c_int64_t) :: panel_rows
    integer(c_int32_t) :: require_converged, zarr_format
    type(c_ptr) :: out
  end type

  ! The genotype PCA of a PLINK fileset or (VCF) Zarr store that every rank reads.
  public :: rankwise_genotype_pca
  public :: rankwise_pca_options_init, rankwise_pca, rankwise_pca_sizes, rankwise_pca_get, &
            rankwise_pca_free

  !> One phase of this thread's last decomposition (rankwise_phase of rankwise.h): its name
  !> (rankwise_phase_name), wall seconds on this rank, the flops of its products over the
  !> whole matrix (0 when not counted), and the bytes of matrix values this rank read into
  !> the kernels' blocks in it.
  type, bind(C), public :: rankwise_phase
    type(c_ptr) :: name
    real(c_double) :: seconds, flops
    integer(c_int64_t) :: produced_bytes
  end type

  interface
    function rankwise_tsqr_svd_query(rows_local, cols, layout, sizes) result(status) &
                                     bind(C, name="rankwise_tsqr_svd_query")
      import :: c_int32_t, c_int64_t, rankwise_sizes
      integer(c_int64_t), value :: rows_local, cols
      integer(c_int32_t), value :: layout
      type(rankwise_sizes), intent(out) :: sizes
      integer(c_int32_t) :: status
    end function

    function rankwise_rsvd_query(rows_local, cols, k, layout, sizes) result(status) &
                                 bind(C, name="rankwise_rsvd_query")
      import :: c_int32_t, c_int64_t, rankwise_sizes
      integer(c_int64_t), value :: rows_local, cols, k
      integer(c_int32_t), value :: layout
      type(rankwise_sizes), intent(out) :: sizes
      integer(c_int32_t) :: status
    end function

    function rankwise_tsqr_svd(comm, a, rows_local, cols, lda, layout, panel_rows, s, &
                               u_local, ldu, vt, ldvt) result(status) bind(C, name="rankwise_tsqr_svd")
      import :: c_int, c_int32_t, c_int64_t, c_double
      integer(c_int), value :: comm
      real(c_double), intent(in) :: a(*)
      integer(c_int64_t), value :: rows_local, cols, lda
      integer(c_int32_t), value :: layout
      integer(c_int64_t), value :: panel_rows
      real(c_double), intent(inout) :: s(*), u_local(*), vt(*)
      integer(c_int64_t), value :: ldu, ldvt
      integer(c_int32_t) :: status
    end function

    function rankwise_rsvd(comm, a, rows_local, cols, lda, layout, panel_rows, k, oversample, &
                           power_iters, seed, s, u_local, ldu, vt, ldvt) result(status) &
                           bind(C, name="rankwise_rsvd")
      import :: c_int, c_int32_t, c_int64_t, c_double
      integer(c_int), value :: comm
      real(c_double), intent(in) :: a(*)
      integer(c_int64_t), value :: rows_local, cols, lda
      integer(c_int32_t), value :: layout
      integer(c_int64_t), value :: panel_rows, k, oversample, power_iters
      ! uint64_t in C: seeds above huge(0_c_int64_t) are passed as their two's complement.
      integer(c_int64_t), value :: seed
      real(c_double), intent(inout) :: s(*), u_local(*), vt(*)
      integer(c_int64_t), value :: ldu, ldvt
      integer(c_int32_t) :: status
    end function

    ! residuals(k) out; converged = 1 when every residual met tol (rankwise.h has the rest).
    function rankwise_rsvd_tol(comm, a, rows_local, cols, lda, layout, panel_rows, k, oversample, &
                               tol, max_passes, seed, s, u_local, ldu, vt, ldvt, residuals, &
                               converged) result(status) bind(C, name="rankwise_rsvd_tol")
      import :: c_int, c_int32_t, c_int64_t, c_double
      integer(c_int), value :: comm
      real(c_double), intent(in) :: a(*)
      integer(c_int64_t), value :: rows_local, cols, lda
      integer(c_int32_t), value :: layout
      integer(c_int64_t), value :: panel_rows, k, oversample
      real(c_double), value :: tol
      integer(c_int64_t), value :: max_passes
      integer(c_int64_t), value :: seed
      real(c_double), intent(inout) :: s(*), u_local(*), vt(*)
      integer(c_int64_t), value :: ldu, ldvt
      real(c_double), intent(out) :: residuals(*)
      integer(c_int32_t), intent(out) :: converged
      integer(c_int32_t) :: status
    end function

    function rankwise_generate(seed, dist, row0, rows, cols, out, ld, layout) result(status) &
                               bind(C, name="rankwise_generate")
      import :: c_int32_t, c_int64_t, c_double
      integer(c_int64_t), value :: seed
      integer(c_int32_t), value :: dist
      integer(c_int64_t), value :: row0, rows, cols
      real(c_double), intent(inout) :: out(*)
      integer(c_int64_t), value :: ld
      integer(c_int32_t), value :: layout
      integer(c_int32_t) :: status
    end function

    function rankwise_last_phases(phases, count) result(status) bind(C, name="rankwise_last_phases")
      import :: c_ptr, c_int32_t, c_int64_t
      type(c_ptr), intent(out) :: phases
      integer(c_int64_t), intent(out) :: count
      integer(c_int32_t) :: status
    end function

    function rankwise_gemm_peak(comm, precision, flops_per_second) result(status) &
                                bind(C, name="rankwise_gemm_peak")
      import :: c_int, c_int32_t, c_double
      integer(c_int), value :: comm
      integer(c_int32_t), value :: precision
      real(c_double), intent(out) :: flops_per_second
      integer(c_int32_t) :: status
    end function

    !> -1, or the status to exit with when started as a probe.
    function rankwise_serve_gemm_probe() result(status) bind(C, name="rankwise_serve_gemm_probe")
      import :: c_int32_t
      integer(c_int32_t) :: status
    end function

    !> probe: c_loc of a NUL-terminated path, or c_null_ptr for this program.
    function rankwise_machine_gemm_peak(comm, precision, probe, flops_per_second, &
                                        loaded_flops_per_second) result(status) &
                                        bind(C, name="rankwise_machine_gemm_peak")
      import :: c_int, c_int32_t, c_double, c_ptr
      integer(c_int), value :: comm
      integer(c_int32_t), value :: precision
      type(c_ptr), value :: probe
      real(c_double), intent(out) :: flops_per_second, loaded_flops_per_second
      integer(c_int32_t) :: status
    end function

    function rankwise_production_peak(comm, a, rows_local, cols, lda, layout, bytes_per_second) &
                                      result(status) bind(C, name="rankwise_production_peak")
      import :: c_int, c_int32_t, c_int64_t, c_double
      integer(c_int), value :: comm
      real(c_double), intent(in) :: a(*)
      integer(c_int64_t), value :: rows_local, cols, lda
      integer(c_int32_t), value :: layout
      real(c_double), intent(out) :: bytes_per_second
      integer(c_int32_t) :: status
    end function

    function rankwise_tile_production_peak(comm, a, rows_local, cols, lda, layout, &
                                           bytes_per_second) &
                                           result(status) bind(C, name="rankwise_tile_production_peak")
      import :: c_int, c_int32_t, c_int64_t, c_double
      integer(c_int), value :: comm
      real(c_double), intent(in) :: a(*)
      integer(c_int64_t), value :: rows_local, cols, lda
      integer(c_int32_t), value :: layout
      real(c_double), intent(out) :: bytes_per_second
      integer(c_int32_t) :: status
    end function

    function rankwise_last_error() result(message) bind(C, name="rankwise_last_error")
      import :: c_ptr
      type(c_ptr) :: message
    end function

    function rankwise_pca_options_init(options) result(status) &
                                       bind(C, name="rankwise_pca_options_init")
      import :: c_int32_t, rankwise_pca_options
      type(rankwise_pca_options), intent(out) :: options
      integer(c_int32_t) :: status
    end function

    function rankwise_pca(comm, input, options, result) result(status) bind(C, name="rankwise_pca")
      import :: c_int, c_int32_t, c_char, c_ptr, rankwise_pca_options
      integer(c_int), value :: comm
      character(kind=c_char), intent(in) :: input(*)
      type(rankwise_pca_options), intent(in) :: options
      type(c_ptr), intent(out) :: result
      integer(c_int32_t) :: status
    end function

    function rankwise_pca_sizes(result, samples, k, variants_used) result(status) &
                                bind(C, name="rankwise_pca_sizes")
      import :: c_ptr, c_int32_t, c_int64_t
      type(c_ptr), value :: result
      integer(c_int64_t), intent(out) :: samples, k, variants_used
      integer(c_int32_t) :: status
    end function

    function rankwise_pca_get(result, eigenvalues, pcs, ldpcs, layout, residuals, converged) &
        result(status) bind(C, name="rankwise_pca_get")
      import :: c_ptr, c_int32_t, c_int64_t, c_double
      type(c_ptr), value :: result
      real(c_double), intent(out) :: eigenvalues(*), pcs(*)
      integer(c_int64_t), value :: ldpcs
      integer(c_int32_t), value :: layout
      real(c_double), intent(out) :: residuals(*)
      integer(c_int32_t), intent(out) :: converged
      integer(c_int32_t) :: status
    end function

    subroutine rankwise_pca_free(result) bind(C, name="rankwise_pca_free")
      import :: c_ptr
      type(c_ptr), value :: result
    end subroutine

    function c_strlen(s) result(n) bind(C, name="strlen")
      import :: c_ptr, c_size_t
      type(c_ptr), value :: s
      integer(c_size_t) :: n
    end function
  end interface

contains

  !> The name of a phase that rankwise_last_phases gave (c_f_pointer(phases, p, [count])).
  function rankwise_phase_name(phase) result(name)
    type(rankwise_phase), intent(in) :: phase
    character(len=:), allocatable :: name
    character(kind=c_char), pointer :: chars(:)
    integer :: i, n
    n = int(c_strlen(phase%name))
    call c_f_pointer(phase%name, chars, [n])
    allocate (character(len=n) :: name)
    do i = 1, n
      name(i:i) = chars(i)
    end do
  end function

  !> The exact SVD a = u * diag(s) * vt of the matrix whose row blocks a(:, :) the ranks of
  !> comm hold: s(cols), u(rows_local, cols) (this rank's rows), vt(cols, cols).
  function rankwise_svd(comm, a, panel_rows, s, u, vt) result(status)
    integer, intent(in) :: comm
    real(c_double), intent(in), contiguous :: a(:, :)
    integer(c_int64_t), intent(in) :: panel_rows
    real(c_double), intent(out), contiguous :: s(:), u(:, :), vt(:, :)
    integer(c_int32_t) :: status
    status = rankwise_tsqr_svd(int(comm, c_int), a, size(a, 1, c_int64_t), size(a, 2, c_int64_t), &
                               max(1_c_int64_t, size(a, 1, c_int64_t)), RANKWISE_COL_MAJOR, panel_rows, &
                               s, u, max(1_c_int64_t, size(u, 1, c_int64_t)), vt, &
                               max(1_c_int64_t, size(vt, 1, c_int64_t)))
  end function

  !> The rank-k randomized SVD: k = size(s); u(rows_local, k), vt(k, cols).
  function rankwise_randomized_svd(comm, a, panel_rows, oversample, power_iters, seed, s, u, vt) &
      result(status)
    integer, intent(in) :: comm
    real(c_double), intent(in), contiguous :: a(:, :)
    integer(c_int64_t), intent(in) :: panel_rows, oversample, power_iters, seed
    real(c_double), intent(out), contiguous :: s(:), u(:, :), vt(:, :)
    integer(c_int32_t) :: status
    status = rankwise_rsvd(int(comm, c_int), a, size(a, 1, c_int64_t), size(a, 2, c_int64_t), &
                           max(1_c_int64_t, size(a, 1, c_int64_t)), RANKWISE_COL_MAJOR, panel_rows, &
                           size(s, 1, c_int64_t), oversample, power_iters, seed, &
                           s, u, max(1_c_int64_t, size(u, 1, c_int64_t)), vt, &
                           max(1_c_int64_t, size(vt, 1, c_int64_t)))
  end function

  !> Fills out(:, :) with rows row0 + 1 .. row0 + size(out, 1) (row0 counts from 0) of the
  !> matrix `rankwise … --seed seed --dist dist` generates.
  function rankwise_fill_generated(seed, dist, row0, out) result(status)
    integer(c_int64_t), intent(in) :: seed, row0
    integer(c_int32_t), intent(in) :: dist
    real(c_double), intent(out), contiguous :: out(:, :)
    integer(c_int32_t) :: status
    status = rankwise_generate(seed, dist, row0, size(out, 1, c_int64_t), size(out, 2, c_int64_t), &
                               out, max(1_c_int64_t, size(out, 1, c_int64_t)), RANKWISE_COL_MAJOR)
  end function

  !> The genotype PCA of input (a PLINK prefix, a VCF Zarr store or a Zarr array of
  !> dosages), as `rankwise pca` computes it, on every rank of comm: eigenvalues(k), pcs(samples,
  !> k), each component's residual, and converged (.true. when every residual met tol).
  !> Optional: seed (as `--sketch-seed`), chromosomes (PLINK's --chr list), out (publish the
  !> results as `rankwise pca --out` does). Collective: every rank passes the same values.
  function rankwise_genotype_pca(comm, input, k, eigenvalues, pcs, residuals, converged, seed, &
                                 chromosomes, out) result(status)
    integer, intent(in) :: comm
    character(len=*), intent(in) :: input
    integer(c_int64_t), intent(in) :: k
    real(c_double), allocatable, intent(out) :: eigenvalues(:), pcs(:, :), residuals(:)
    logical, intent(out) :: converged
    integer(c_int64_t), intent(in), optional :: seed
    character(len=*), intent(in), optional :: chromosomes, out
    integer(c_int32_t) :: status
    type(rankwise_pca_options) :: options
    character(kind=c_char), allocatable, target :: input_c(:), chromosomes_c(:), out_c(:)
    type(c_ptr) :: result
    integer(c_int64_t) :: samples, kk, variants
    integer(c_int32_t) :: all_met
    converged = .false.
    status = rankwise_pca_options_init(options)
    if (status /= RANKWISE_OK) return
    options%k = k
    if (present(seed)) options%seed = seed
    call c_string(input, input_c)
    if (present(chromosomes)) then
      call c_string(chromosomes, chromosomes_c)
      options%chromosomes = c_loc(chromosomes_c)
    end if
    if (present(out)) then
      call c_string(out, out_c)
      options%out = c_loc(out_c)
    end if
    status = rankwise_pca(int(comm, c_int), input_c, options, result)
    if (status /= RANKWISE_OK) return
    status = rankwise_pca_sizes(result, samples, kk, variants)
    if (status == RANKWISE_OK) then
      allocate (eigenvalues(kk), pcs(samples, kk), residuals(kk))
      status = rankwise_pca_get(result, eigenvalues, pcs, max(1_c_int64_t, samples), &
                                RANKWISE_COL_MAJOR, residuals, all_met)
      converged = all_met == 1
    end if
    call rankwise_pca_free(result)
  end function

  ! s as a NUL-terminated C string.
  subroutine c_string(s, c)
    character(len=*), intent(in) :: s
    character(kind=c_char), allocatable, intent(out) :: c(:)
    integer :: i
    allocate (c(len_trim(s) + 1))
    do i = 1, len_trim(s)
      c(i) = s(i:i)
    end do
    c(len_trim(s) + 1) = c_null_char
  end subroutine

  !> The message of the last failed rankwise call on this thread.
  function rankwise_error_message() result(message)
    character(len=:), allocatable :: message
    type(c_ptr) :: p
    character(kind=c_char), pointer :: chars(:)
    integer :: i, n
    p = rankwise_last_error()
    n = int(c_strlen(p))
    call c_f_pointer(p, chars, [n])
    allocate (character(len=n) :: message)
    do i = 1, n
      message(i:i) = chars(i)
    end do
  end function

end module rankwise
