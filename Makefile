# rankwise: the two commands are `make demo` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo
BIN := target/release/rankwise
# Tests that launch mpirun run as root in containers and on CI runners.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1

# Where `make install` puts the C library, its header, the Fortran module and rankwise.pc.
PREFIX ?= /usr/local

.PHONY: deps build python capi install bundle demo test test-gpu bench bench-gpu lint clean

deps:
	@scripts/install-deps.sh

# One build of the whole workspace (libraries, the C library, rankwise, the failure tests'
# rankwise-fault, the examples), with the features `make test` uses: a build with other
# features, or of one package alone, resolves its dependencies' features anew and compiles
# the whole stack again. The build includes the Python extension's crate, so that the
# wheel's build by maturin (`make python`, with the same features: python/Cargo.toml)
# reuses these artifacts; like maturin, it tells PyO3 not to link libpython.
TEST_FEATURES := rankwise/system-tests,rankwise-transports/system-tests
export PYO3_BUILD_EXTENSION_MODULE := 1

build: deps
	$(CARGO) build --release --workspace --lib --bins --examples --features $(TEST_FEATURES)

# The Python package's wheel (target/wheels/), built by maturin and installed into the
# test environment target/python-venv; `pip install target/wheels/rankwise-*.whl` installs
# it anywhere the system libraries are.
python: build
	scripts/python-venv.sh

# The C library (librankwise.so, librankwise.a) for codes that link rankwise.
capi: deps
	$(CARGO) build --release -p rankwise-capi

# lib/librankwise.{so,a}, lib/pkgconfig/rankwise.pc, include/rankwise.h and the Fortran
# module include/rankwise.f90 under PREFIX.
install: capi
	scripts/install-capi.sh $(PREFIX)

# A relocatable copy (bin/, lib/, env.sh) for machines without the Debian packages rankwise
# links: `make bundle DIR=/path/to/new/dir [TESTS=1]` (TESTS=1 adds the GPU test binary,
# which make test builds).
bundle: build
	scripts/bundle.sh $(DIR) $(if $(TESTS),--tests,)

# The main job on the embedded default: the exact SVD of a generated 10,000,000 × 20
# float64 matrix in one process.
demo: build
	$(BIN) svd --rows 10000000 --cols 20 --chunk-rows 625000 --check

# Everything in release mode: the multi-process tests run real mpirun jobs of the
# release binary (the failure tests of rankwise-fault, which `build` makes), and the
# accuracy tests use matrices up to 50,000 rows.
# The test processes that link OpenBLAS themselves (the library tests, the C and Fortran
# examples) use the kernels the rankwise binary uses (see keep_results_independent_of_layout
# in launch/src/cli.rs), so that their bits can be compared with the binary's.
# The pinned Python environments that tests use (zarr-python 3; sgkit 0.10 with zarr-python
# 2) are made while the build runs, the first time: the tests make them too, waiting on the
# scripts' locks, and report a failure with its reason.
test: export OPENBLAS_CORETYPE ?= Haswell
test: deps
	@mkdir -p target
	(scripts/zarr-venv.sh && scripts/sgkit-venv.sh) >target/test-venvs.log 2>&1 & \
	$(MAKE) --no-print-directory build && \
	$(CARGO) test --release --workspace --features $(TEST_FEATURES); \
	rc=$$?; wait; exit $$rc

# On a machine with an NVIDIA GPU: the GPU tests, where a missing GPU fails instead of
# skipping, and the units of the device crate (probe, kernels compiled by NVRTC) with the
# host check of the generator kernels.
test-gpu: build
	RANKWISE_REQUIRE_GPU=1 $(CARGO) test --release --features $(TEST_FEATURES) --test gpu -- --nocapture
	$(CARGO) test --release -p rankwise-device -- --nocapture
	$(CARGO) test --release -p rankwise-sources --test device_generator -- --nocapture

# On a machine with an NVIDIA GPU: tests/gpu.rs, then the 10M × 20k genotype rsvd on one GPU.
bench-gpu: build
	$(CARGO) test --release --features $(TEST_FEATURES) --test gpu --no-run
	bash benches/gpu.sh

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --features $(TEST_FEATURES) -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps

bench: build
	bash benches/run.sh $(if $(QUICK),--quick,)
	bash benches/write_u.sh $(if $(QUICK),--quick,)
	bash benches/rsvd.sh $(if $(QUICK),--quick,)
	bash benches/plink.sh $(if $(QUICK),--quick,)
	bash benches/zarr.sh $(if $(QUICK),--quick,)
	bash benches/reduce.sh $(if $(QUICK),--quick,)
	bash benches/slurm.sh $(if $(QUICK),--quick,)
	bash benches/transports.sh $(if $(QUICK),--quick,)
	bash benches/peers.sh $(if $(QUICK),--quick,)
	bash benches/object_store.sh $(if $(QUICK),--quick,)
	bash benches/python.sh $(if $(QUICK),--quick,)
	bash benches/sizing.sh $(if $(QUICK),--quick,)
	python3 benches/summary.py

clean:
	$(CARGO) clean
