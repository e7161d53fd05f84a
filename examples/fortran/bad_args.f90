! Bad arguments from Fortran: each call returns its code, rankwise_error_message() names
! the argument, and nothing aborts. `mpirun -np 2 ./bad_args_f` prints one "ok" line per
! case and rank, and stops with status 1 if any case misbehaved.
program bad_args
  use mpi
  use, intrinsic :: iso_c_binding
  use rankwise
  implicit none
  integer, parameter :: rows = 40, cols = 4
  integer :: ierr, provided, rank, failures
  real(c_double) :: a(rows, cols), s(cols), u(rows, cols), vt(cols, cols)
  real(c_double) :: s0(0), u0(rows, 0), vt0(0, cols)
  real(c_double) :: peak
  type(c_ptr) :: phases_ptr
  type(rankwise_phase), pointer :: phases(:)
  integer(c_int64_t) :: count

  failures = 0
  rank = 0
  call expect('before MPI_Init', rankwise_svd(MPI_COMM_WORLD, a, 10_c_int64_t, s, u, vt), &
              RANKWISE_ERROR_MPI_NOT_READY, 'MPI is not initialized')
  call MPI_Init_thread(MPI_THREAD_FUNNELED, provided, ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call expect('fill', rankwise_fill_generated(7_c_int64_t, RANKWISE_DIST_NORMAL, &
              int(rank*rows, c_int64_t), a), RANKWISE_OK, '')

  call expect('communicator 12345', rankwise_svd(12345, a, 10_c_int64_t, s, u, vt), &
              RANKWISE_ERROR_INVALID_COMMUNICATOR, '`comm`')
  call expect('k = 0', rankwise_randomized_svd(MPI_COMM_WORLD, a, 10_c_int64_t, 1_c_int64_t, &
              1_c_int64_t, 5_c_int64_t, s0, u0, vt0), RANKWISE_ERROR_INVALID_ARGUMENT, '`k`')
  call expect('k = cols', rankwise_randomized_svd(MPI_COMM_WORLD, a, 10_c_int64_t, 0_c_int64_t, &
              1_c_int64_t, 5_c_int64_t, s, u, vt), RANKWISE_ERROR_INVALID_ARGUMENT, '`k`')
  call expect('negative panel rows', rankwise_svd(MPI_COMM_WORLD, a, -1_c_int64_t, s, u, vt), &
              RANKWISE_ERROR_INVALID_ARGUMENT, '`panel_rows`')
  call expect('lda < rows', rankwise_tsqr_svd(MPI_COMM_WORLD, a, int(rows, c_int64_t), &
              int(cols, c_int64_t), 3_c_int64_t, RANKWISE_COL_MAJOR, 10_c_int64_t, s, u, &
              int(rows, c_int64_t), vt, int(cols, c_int64_t)), RANKWISE_ERROR_INVALID_ARGUMENT, '`lda`')
  call expect('good call', rankwise_svd(MPI_COMM_WORLD, a, 10_c_int64_t, s, u, vt), RANKWISE_OK, '')
  ! The good call's phases, named and timed, and the machine limit.
  call expect('phases', rankwise_last_phases(phases_ptr, count), RANKWISE_OK, '')
  call c_f_pointer(phases_ptr, phases, [count])
  if (count < 2 .or. rankwise_phase_name(phases(1)) /= 'pass 1: produce panels + panel QR') then
    write (0, '(a,i0,a,i0)') 'rank ', rank, ': FAIL phases: ', count
    failures = failures + 1
  end if
  call expect('precision 7', rankwise_gemm_peak(MPI_COMM_WORLD, 7_c_int32_t, peak), &
              RANKWISE_ERROR_INVALID_ARGUMENT, '`precision`')
  call expect('machine limit', rankwise_gemm_peak(MPI_COMM_WORLD, RANKWISE_F64, peak), RANKWISE_OK, '')
  if (.not. peak > 1e8_c_double) then
    write (0, '(a,i0,a,es10.3)') 'rank ', rank, ': FAIL GEMM peak ', peak
    failures = failures + 1
  end if

  call MPI_Finalize(ierr)
  if (failures /= 0) stop 1
  write (*, '(a,i0,a)') 'rank ', rank, ': all cases behaved'

contains

  subroutine expect(what, got, want, names)
    character(len=*), intent(in) :: what, names
    integer(c_int32_t), intent(in) :: got, want
    character(len=:), allocatable :: message
    message = rankwise_error_message()
    if (got /= want .or. index(message, names) == 0) then
      write (0, '(a,i0,a,a,a,i0,a,i0,a,a)') 'rank ', rank, ': FAIL ', what, ': status ', got, &
        ' (want ', want, '), message: ', message
      failures = failures + 1
    else
      write (*, '(a,i0,a,a,a,a)') 'rank ', rank, ': ok ', what, ': ', message
    end if
  end subroutine

end program bad_args
