! A Fortran MPI code that holds a tall matrix in row blocks and asks rankwise for its SVD.
!
!   mpirun -np 4 ./svd_example_f svd  ROWS COLS PANEL SEED DIST OUTDIR
!   mpirun -np 4 ./svd_example_f rsvd ROWS COLS PANEL SEED DIST OUTDIR K OVERSAMPLE POWER SKETCH_SEED
!   mpirun -np 4 ./svd_example_f rsvd-tol ROWS COLS PANEL SEED DIST OUTDIR K OVERSAMPLE TOL MAX_PASSES SKETCH_SEED
!
! The same program as examples/c/svd_example.c, with column-major arrays: each rank fills
! its block with the values `rankwise svd --seed SEED --dist DIST` generates, then calls
! rankwise_svd, rankwise_randomized_svd or rankwise_rsvd_tol on MPI_COMM_WORLD. Rank 0 writes
! S.bin and Vt.bin (k x COLS, row-major), and for rsvd-tol the residuals (R.bin); rank r
! writes U.<r>.bin (its rows of U, row-major).
!
! With RANKWISE_EXAMPLE_RATES set, rank 0 also prints the call's phase count and the
! machine's rates that make each phase's machine limit (as examples/c/machine_limit.c does):
!
!   rates: PHASES phases, gemm LOADED GFLOP/s loaded, BEST GFLOP/s best, reads R GB/s
!
! The program is then its own probe of OpenBLAS's other kernels: rankwise_machine_gemm_peak
! starts it again, and it answers through rankwise_serve_gemm_probe before MPI_Init.
program svd_example
  use mpi
  use, intrinsic :: iso_c_binding
  use rankwise
  implicit none
  integer :: ierr, provided, rank, nranks, nargs
  integer(c_int64_t) :: rows, cols, panel, seed, panels, first, last, row0, row_end, rows_local, k
  integer(c_int64_t) :: oversample, power_iters, sketch_seed, max_passes
  integer(c_int32_t) :: dist, status, converged
  real(c_double) :: tol
  character(len=4096) :: arg, outdir, method
  real(c_double), allocatable :: a(:, :), s(:), u(:, :), vt(:, :), residuals(:)
  logical :: randomized, to_tol
  type(rankwise_sizes) :: sizes
  integer(c_int32_t) :: probe
  integer(c_int64_t) :: phase_count
  type(c_ptr) :: phases
  real(c_double) :: loaded, best, slower, reads
  integer :: rates

  ! Started as rankwise_machine_gemm_peak's probe: answer, and end before MPI_Init.
  probe = rankwise_serve_gemm_probe()
  if (probe >= 0) call exit(int(probe))
  call get_environment_variable('RANKWISE_EXAMPLE_RATES', status=rates)

  ! rankwise runs worker threads beside the MPI thread: FUNNELED at least.
  call MPI_Init_thread(MPI_THREAD_FUNNELED, provided, ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
  nargs = command_argument_count()
  call get_command_argument(1, method)
  to_tol = nargs == 12 .and. method == 'rsvd-tol'
  randomized = to_tol .or. (nargs == 11 .and. method == 'rsvd')
  if (.not. randomized .and. .not. (nargs == 7 .and. method == 'svd')) then
    if (rank == 0) write (0, '(a)') 'usage: svd_example_f svd|rsvd|rsvd-tol ROWS COLS PANEL SEED DIST ' // &
      'OUTDIR [K OVERSAMPLE POWER SKETCH_SEED | K OVERSAMPLE TOL MAX_PASSES SKETCH_SEED]'
    call MPI_Finalize(ierr)
    stop 2
  end if
  rows = int_arg(2)
  cols = int_arg(3)
  panel = int_arg(4)
  seed = int_arg(5)
  call get_command_argument(6, arg)
  dist = RANKWISE_DIST_UNIFORM
  if (arg == 'normal') dist = RANKWISE_DIST_NORMAL
  call get_command_argument(7, outdir)

  ! Whole panels per rank, the last rank's block ending at the last row.
  panels = (rows + panel - 1)/panel
  first = panels*rank/nranks
  last = panels*(rank + 1)/nranks
  row0 = first*panel
  row_end = last*panel
  if (rank == nranks - 1) row_end = rows
  rows_local = row_end - row0

  k = cols
  if (to_tol) then
    k = int_arg(8)
    oversample = int_arg(9)
    call get_command_argument(10, arg)
    read (arg, *) tol
    max_passes = int_arg(11)
    sketch_seed = int_arg(12)
  else if (randomized) then
    k = int_arg(8)
    oversample = int_arg(9)
    power_iters = int_arg(10)
    sketch_seed = int_arg(11)
  end if
  ! The query gives the output shapes (and checks the arguments) before anything is allocated.
  if (randomized) then
    status = rankwise_rsvd_query(rows_local, cols, k, RANKWISE_COL_MAJOR, sizes)
  else
    status = rankwise_tsqr_svd_query(rows_local, cols, RANKWISE_COL_MAJOR, sizes)
  end if
  if (status /= RANKWISE_OK) then
    write (0, '(a,a)') 'query: ', rankwise_error_message()
    call MPI_Abort(MPI_COMM_WORLD, 1, ierr)
  end if
  allocate (a(rows_local, cols), s(sizes%s_len), u(sizes%u_rows, sizes%u_cols), &
            vt(sizes%vt_rows, sizes%vt_cols), residuals(k))
  status = rankwise_fill_generated(seed, dist, row0, a)
  if (status == RANKWISE_OK) then
    if (to_tol) then
      ! The C function itself: column-major, leading dimensions from the query.
      status = rankwise_rsvd_tol(MPI_COMM_WORLD, a, rows_local, cols, max(rows_local, 1_c_int64_t), &
                                 RANKWISE_COL_MAJOR, panel, k, oversample, tol, max_passes, &
                                 sketch_seed, s, u, sizes%min_ldu, vt, sizes%min_ldvt, residuals, &
                                 converged)
    else if (randomized) then
      status = rankwise_randomized_svd(MPI_COMM_WORLD, a, panel, oversample, power_iters, &
                                       sketch_seed, s, u, vt)
    else
      status = rankwise_svd(MPI_COMM_WORLD, a, panel, s, u, vt)
    end if
  end if
  if (status /= RANKWISE_OK) then
    write (0, '(a,i0,a,i0,a,a)') 'rank ', rank, ': rankwise failed (', status, '): ', &
      rankwise_error_message()
    call MPI_Finalize(ierr)
    stop 1
  end if

  if (rates == 0) then
    ! Collective, on every rank: the phases of the call above, the GEMM rate of rankwise's
    ! threads (loaded kernels, and the best OpenBLAS kernels) and the rate they read this
    ! matrix into the blocks the call's kernels work on.
    status = rankwise_last_phases(phases, phase_count)
    if (status == RANKWISE_OK) status = rankwise_gemm_peak(MPI_COMM_WORLD, RANKWISE_F64, loaded)
    if (status == RANKWISE_OK) status = rankwise_machine_gemm_peak(MPI_COMM_WORLD, RANKWISE_F64, &
                                                                    c_null_ptr, best, slower)
    if (status == RANKWISE_OK) then
      if (randomized .or. to_tol) then
        status = rankwise_tile_production_peak(MPI_COMM_WORLD, a, rows_local, cols, &
                                               max(rows_local, 1_c_int64_t), RANKWISE_COL_MAJOR, reads)
      else
        status = rankwise_production_peak(MPI_COMM_WORLD, a, rows_local, cols, &
                                          max(rows_local, 1_c_int64_t), RANKWISE_COL_MAJOR, reads)
      end if
    end if
    if (status /= RANKWISE_OK) then
      write (0, '(a,i0,a,a)') 'rank ', rank, ': rates failed: ', rankwise_error_message()
      call MPI_Finalize(ierr)
      stop 1
    end if
    if (rank == 0) write (*, '(a,i0,a,f0.2,a,f0.2,a,f0.2,a)') 'rates: ', phase_count, &
      ' phases, gemm ', loaded / 1e9, ' GFLOP/s loaded, ', best / 1e9, ' GFLOP/s best, reads ', &
      reads / 1e9, ' GB/s'
  end if

  write (arg, '(a,i0,a)') 'U.', rank, '.bin'
  call write_file(trim(outdir)//'/'//trim(arg), transpose(u))
  if (rank == 0) then
    call write_file(trim(outdir)//'/S.bin', reshape(s, [size(s), 1]))
    call write_file(trim(outdir)//'/Vt.bin', transpose(vt))
    if (to_tol) then
      call write_file(trim(outdir)//'/R.bin', reshape(residuals, [size(residuals), 1]))
      write (*, '(a,i0,a,es10.3)') 'converged ', converged, ', largest residual ', maxval(residuals)
    end if
    write (*, '(a,i0,a,i0,a,i0,a,es25.17)') 'rankwise (Fortran): ', rows, ' x ', cols, ' on ', &
      nranks, ' ranks, s(1) = ', s(1)
  end if
  call MPI_Finalize(ierr)

contains

  function int_arg(i) result(v)
    integer, intent(in) :: i
    integer(c_int64_t) :: v
    character(len=64) :: text
    call get_command_argument(i, text)
    read (text, *) v
  end function

  ! Writes the values of x in array element order as raw doubles.
  subroutine write_file(path, x)
    character(len=*), intent(in) :: path
    real(c_double), intent(in) :: x(:, :)
    integer :: unit
    open (newunit=unit, file=path, access='stream', form='unformatted', status='replace')
    write (unit) x
    close (unit)
  end subroutine

end program svd_example
