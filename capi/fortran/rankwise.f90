! rankwise: the exact (TSQR) and randomized SVD of a tall matrix whose rows an MPI code
! already holds, for Fortran 2008 codes (iso_c_binding over librankwise).
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
  ! The machine limit: the last call's phases and the GEMM rate of rankwise's threads.
  public :: rankwise_last_phases, rankwise_gemm_peak, rankwise_phase_name

  !> One phase of this thread's last decomposition (rankwise_phase of rankwise.h): its name
  !> (rankwise_phase_name), wall seconds on this rank, and the flops of its products over
  !> the whole matrix (0 when not counted).
  type, bind(C), public :: rankwise_phase
    type(c_ptr) :: name
    real(c_double) :: seconds, flops
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

    function rankwise_last_error() result(message) bind(C, name="rankwise_last_error")
      import :: c_ptr
      type(c_ptr) :: message
    end function

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
