#!/usr/bin/env bash
# Installs the Debian packages rankwise builds and tests against. Idempotent: when
# everything is present it only asks dpkg and returns in a fraction of a second.
set -euo pipefail

packages=(
  build-essential   # cc for -sys crates
  pkg-config        # finds hwloc, UCX, OpenBLAS
  libclang-dev      # bindgen (rsmpi's MPI bindings, rankwise-ucx-sys)
  libopenmpi-dev    # MPI headers and libmpi
  openmpi-bin       # mpirun for the multi-process tests
  gfortran          # mpifort's compiler, for the Fortran module and example of the C library
                    # (libopenmpi-dev only recommends it)
  libucx-dev        # UCX transport (1.13+: ucp.h, libucp)
  libhwloc-dev      # topology (hwlocality)
  libudev-dev       # hwloc's PCI discovery
  libopenblas-dev   # BLAS and LAPACK for ndarray-linalg
  fonts-dejavu-core # DejaVuSans.ttf for the text of `rankwise pca` plots (no fontconfig)
  python3-venv      # python3 -m venv: zarr-python for the Zarr interop tests, Dask for benches
  slurmctld         # the one-node Slurm of slurm/local-cluster.sh (tests/slurm.rs, benches/slurm.sh)
  slurmd
  slurm-client      # sbatch, srun, squeue, scontrol, sinfo
  munge             # Slurm's authentication daemon
  libpmix-dev       # libpmix.so, which srun's pmix plugin loads to start Debian's OpenMPI ranks
  shellcheck        # lints slurm/ and scripts/ (tests/slurm.rs)
  plink2            # PLINK 2: writes the .bed filesets of tests/plink.rs and checks our PCA; benches/plink.sh
  iproute2          # ip and tc: the namespace nodes of tools/netns-cluster.sh (tests/multinode.rs)
)
if [ "${RANKWISE_EXTRA_PACKAGES:-}" != "" ]; then
  read -r -a extra <<<"$RANKWISE_EXTRA_PACKAGES"
  packages+=("${extra[@]}")
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  if [ "$status" != "install ok installed" ]; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done" >&2
