! The genotype PCA of a PLINK fileset, a VCF Zarr store or a Zarr array of dosages from a
! Fortran MPI code:
!
!   mpirun -np 4 ./pca_example_f INPUT OUTDIR K SEED [CHROMOSOMES]
!
! Every rank calls rankwise_genotype_pca on MPI_COMM_WORLD and gets the same results; rank r
! writes OUTDIR/eigenval.<r>.bin (k doubles) and OUTDIR/pcs.<r>.bin (samples x k,
! column-major). Rank 0 prints the eigenvalues and whether every component converged.
program pca_example
  use mpi
  use, intrinsic :: iso_c_binding
  use rankwise
  implicit none
  integer :: ierr, provided, rank
  integer(c_int64_t) :: k, seed
  integer(c_int32_t) :: status
  character(len=4096) :: input, outdir, chromosomes, name
  real(c_double), allocatable :: eigenvalues(:), pcs(:, :), residuals(:)
  logical :: converged

  call MPI_Init_thread(MPI_THREAD_FUNNELED, provided, ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  if (command_argument_count() < 4) then
    if (rank == 0) write (0, '(a)') 'usage: pca_example_f INPUT OUTDIR K SEED [CHROMOSOMES]'
    call MPI_Finalize(ierr)
    stop 2
  end if
  call get_command_argument(1, input)
  call get_command_argument(2, outdir)
  k = int_arg(3)
  seed = int_arg(4)
  if (command_argument_count() >= 5) then
    call get_command_argument(5, chromosomes)
    status = rankwise_genotype_pca(MPI_COMM_WORLD, trim(input), k, eigenvalues, pcs, residuals, &
                                   converged, seed=seed, chromosomes=trim(chromosomes))
  else
    status = rankwise_genotype_pca(MPI_COMM_WORLD, trim(input), k, eigenvalues, pcs, residuals, &
                                   converged, seed=seed)
  end if
  if (status /= RANKWISE_OK) then
    write (0, '(a,i0,a,i0,a,a)') 'rank ', rank, ': rankwise_genotype_pca failed (', status, '): ', &
      rankwise_error_message()
    call MPI_Finalize(ierr)
    stop 1
  end if
  write (name, '(a,i0,a)') '/eigenval.', rank, '.bin'
  call write_file(trim(outdir)//trim(name), reshape(eigenvalues, [size(eigenvalues), 1]))
  write (name, '(a,i0,a)') '/pcs.', rank, '.bin'
  call write_file(trim(outdir)//trim(name), pcs)
  if (rank == 0) then
    write (*, '(a,i0,a,i0,a,l1)') 'rankwise (Fortran) PCA: ', size(pcs, 1), ' samples, ', &
      size(pcs, 2), ' components, converged ', converged
    write (*, '(a,*(es12.5,1x))') 'eigenvalues ', eigenvalues
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

end program pca_example
