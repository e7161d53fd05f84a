//! Criterion micro-benchmarks of rankwise's kernels, through the public API of the facade
//! crate only:
//!
//! * `generator/*`: the generator filling a 100,000 × 20 column-major panel
//!   (uniform and genotype values);
//! * `panel_factor/*`: `PanelFactor::compute` (block-by-block QR, fed by the generator, as
//!   in the SVD's first pass) of a 625,000 × 20 panel (the main job's panel) and of a
//!   20,000 × 200 panel;
//! * `rsvd_tiles/*`: the randomized passes' tile kernels: a 256 × 512 uniform tile from the
//!   generator (f64 and f32), 256 rows × 20,000 genotype dosages generated, a 256 × 512
//!   tile standardized from 2-bit codes (f64 and f32), and the tile GEMM `tile · Ω` with a
//!   25-column Ω (DGEMM and SGEMM), the fused products of 2-bit packed genotypes at a PCA's
//!   widths (24 and 20 columns, LOBPCG's; 8, block Lanczos's), and a fused range pass
//!   (`Y = T·Ω`, then `Yᵀ·T`) over float32 row blocks of 256 × 5,000 read from memory, with
//!   either kernel for `T·Ω`;
//! * `skinny_widths/*`: the tile products `T·Ω` (`ab`) and `Qᵀ·T` (`atb`) in f64 and f32
//!   at the sketch widths the passes use (10, 20, 24 and 44 columns), on a 256 × 512 tile
//!   whose rows are 520 values apart (as generated tiles are) and on one whose rows are
//!   512 apart (4 KiB in f64, as a stored panel of 512 columns);
//! * `allreduce/*`: `Comm::allreduce_sum_f64` of a 20 × 20 and a 200 × 200 buffer over a
//!   two-rank `Local` world, one thread per rank;
//! * `zarr_decode/*`: `ZarrMatrix::read_panel` of one band of 2,000 × 5,000 float32 chunks
//!   (Blosc lz4 + bitshuffle, Zarr v3, uniform values, as the Zarr benchmark's store) on one
//!   thread; the store is written by `rankwise gen`'s writer into a temporary directory at
//!   setup and removed afterwards.
//!
//! Run with `cargo bench --bench kernels` (about three minutes on two cores); pass a filter
//! to run one group, e.g. `cargo bench --bench kernels -- allreduce`.

use std::ops::Range;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use ndarray::{Array2, ArrayViewMut2, ShapeBuilder};
use rankwise::linalg::internals::kernels::Keep;
use rankwise::linalg::{LinalgError, PanelFactor};
use rankwise::sources::{Dist, Generated, PanelSource};
use rankwise::transports::{Comm, LocalWorld};

const SEED: u64 = 42;

/// Bytes of an `rows × cols` f64 matrix, for throughput figures.
fn f64_bytes(rows: usize, cols: usize) -> u64 {
    (rows * cols * 8) as u64
}

fn generator(c: &mut Criterion) {
    let (rows, cols) = (100_000usize, 20usize);
    let mut group = c.benchmark_group("generator");
    group.throughput(Throughput::Bytes(f64_bytes(rows, cols)));
    for dist in [Dist::Uniform, Dist::Genotype] {
        // The source is taller than the panel so that the panel sits at a non-zero offset.
        let source = Generated::new(10 * rows as u64, cols as u64, SEED, dist);
        let mut panel = Array2::<f64>::zeros((rows, cols).f());
        let start = 3 * rows as u64;
        group.bench_function(
            BenchmarkId::new(format!("fill_{dist}"), format!("{rows}x{cols}")),
            |b| {
                b.iter(|| {
                    source
                        .fill(start..start + rows as u64, panel.view_mut())
                        .expect("rows inside the source");
                    std::hint::black_box(panel[[rows - 1, cols - 1]])
                })
            },
        );
    }
    group.finish();
}

/// Factors rows `0..rows` of `source` the way the SVD's first pass does: the generator
/// writes each cache block straight into the factor's buffer, which goes back to the
/// thread's scratch pool afterwards.
fn factor_panel(source: &Generated, rows: usize, n: usize) -> f64 {
    let f = PanelFactor::compute(
        rows,
        n,
        Keep::Scratch,
        |range: Range<usize>, view: ArrayViewMut2<'_, f64>| {
            source
                .fill(range.start as u64..range.end as u64, view)
                .map_err(LinalgError::from)
        },
    )
    .expect("panel factor");
    let r00 = f.r[[0, 0]];
    f.recycle();
    r00
}

fn panel_factor(c: &mut Criterion) {
    let mut group = c.benchmark_group("panel_factor");
    // One 625,000 × 20 panel takes a few hundred milliseconds: a flat sampling plan keeps
    // the ten samples at one iteration each instead of criterion's 55.
    group.sampling_mode(SamplingMode::Flat);
    for (rows, n) in [(625_000usize, 20usize), (20_000, 200)] {
        let source = Generated::new(rows as u64, n as u64, SEED, Dist::Uniform);
        group.throughput(Throughput::Bytes(f64_bytes(rows, n)));
        group.bench_function(
            BenchmarkId::new("generated_uniform", format!("{rows}x{n}")),
            |b| b.iter(|| std::hint::black_box(factor_panel(&source, rows, n))),
        );
    }
    group.finish();
}

/// Rank 1 of a two-rank `Local` world, on its own thread: for each count it receives, it
/// takes part in that many allreduces of `len` values; a count of zero ends it.
struct Peer {
    go: mpsc::Sender<u64>,
    handle: Option<thread::JoinHandle<()>>,
}

impl Peer {
    fn start(comm: rankwise::transports::LocalComm, len: usize) -> Peer {
        let (go, rx) = mpsc::channel::<u64>();
        let handle = thread::spawn(move || {
            let mut buf = vec![1.0f64; len];
            while let Ok(iters) = rx.recv() {
                if iters == 0 {
                    break;
                }
                for _ in 0..iters {
                    comm.allreduce_sum_f64(&mut buf)
                        .expect("allreduce on rank 1");
                    buf.fill(1.0);
                }
            }
        });
        Peer {
            go,
            handle: Some(handle),
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.go.send(0);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn allreduce(c: &mut Criterion) {
    let mut group = c.benchmark_group("allreduce_local_2_ranks");
    for k in [20usize, 200] {
        let len = k * k;
        let mut world = LocalWorld::create(2);
        let peer = Peer::start(world.pop().expect("rank 1"), len);
        let me = world.pop().expect("rank 0");
        let mut buf = vec![1.0f64; len];
        group.throughput(Throughput::Bytes(f64_bytes(k, k)));
        group.bench_function(BenchmarkId::new("sum_f64", format!("{k}x{k}")), |b| {
            b.iter_custom(|iters| {
                peer.go.send(iters).expect("rank 1 is running");
                let t = Instant::now();
                for _ in 0..iters {
                    me.allreduce_sum_f64(&mut buf).expect("allreduce on rank 0");
                    buf.fill(1.0);
                }
                t.elapsed()
            })
        });
        drop(peer);
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

// What `criterion_group!` and `criterion_main!` expand to, written out so that the crate's
// `missing_docs` lint has no undocumented generated `pub fn` to complain about.
fn rsvd_tiles(c: &mut Criterion) {
    use rankwise::linalg::internals::fused;
    use rankwise::linalg::internals::tiles::{
        gemm, pack_row, row_scale, PackedTile, Tile, TileReal, TILE_COLS, TILE_ROWS,
    };
    let (b, w, n, l) = (TILE_ROWS, TILE_COLS, 20_000usize, 25usize);
    let mut group = c.benchmark_group("rsvd_tiles");
    let uniform = Generated::new(1 << 20, n as u64, SEED, Dist::Uniform);
    group.throughput(Throughput::Elements((b * w) as u64));
    let mut t64 = Array2::<f64>::zeros((b, w));
    let mut t32 = Array2::<f32>::zeros((b, w));
    group.bench_function(
        BenchmarkId::new("generate_uniform_f64", format!("{b}x{w}")),
        |bn| {
            bn.iter(|| {
                uniform
                    .fill_cols(4096..4096 + b as u64, 512..512 + w as u64, t64.view_mut())
                    .expect("inside");
                std::hint::black_box(t64[[0, 0]])
            })
        },
    );
    group.bench_function(
        BenchmarkId::new("generate_uniform_f32", format!("{b}x{w}")),
        |bn| {
            bn.iter(|| {
                uniform
                    .fill_cols_f32(4096..4096 + b as u64, 512..512 + w as u64, t32.view_mut())
                    .expect("inside");
                std::hint::black_box(t32[[0, 0]])
            })
        },
    );
    let geno = Generated::new(1 << 20, n as u64, SEED, Dist::Genotype).with_missing(0.02);
    let mut codes = vec![0i8; b * n];
    group.throughput(Throughput::Elements((b * n) as u64));
    group.bench_function(
        BenchmarkId::new("generate_genotypes", format!("{b}x{n}")),
        |bn| {
            bn.iter(|| {
                geno.fill_genotype_rows(4096..4096 + b as u64, 0..n as u64, &mut codes);
                std::hint::black_box(codes[0])
            })
        },
    );
    // Packed codes and per-variant counts straight from the generator (a PCA's first pass).
    let mut packed_rows = vec![0u8; b * n.div_ceil(4)];
    let mut counts = Vec::with_capacity(b);
    group.bench_function(
        BenchmarkId::new("generate_genotypes_packed", format!("{b}x{n}")),
        |bn| {
            bn.iter(|| {
                counts.clear();
                geno.fill_packed_rows(
                    4096..4096 + b as u64,
                    &mut packed_rows,
                    n.div_ceil(4),
                    &mut counts,
                );
                std::hint::black_box(counts[0])
            })
        },
    );
    // The same with 5 populations: a Beta draw per population and a run per population.
    let structured = geno
        .clone()
        .with_populations(5, 0.1)
        .expect("5 populations of 20,000 samples");
    group.bench_function(
        BenchmarkId::new("generate_genotypes_5_populations", format!("{b}x{n}")),
        |bn| {
            bn.iter(|| {
                structured.fill_genotype_rows(4096..4096 + b as u64, 0..n as u64, &mut codes);
                std::hint::black_box(codes[0])
            })
        },
    );
    // The codes again, whichever of the benchmarks above the filter ran: the products below
    // would otherwise meet monomorphic rows, which add nothing and are skipped.
    structured.fill_genotype_rows(4096..4096 + b as u64, 0..n as u64, &mut codes);
    let stride = n.div_ceil(4);
    let mut packed = vec![0u8; b * stride];
    let mut scales = Vec::new();
    for i in 0..b {
        pack_row(
            &codes[i * n..(i + 1) * n],
            &mut packed[i * stride..(i + 1) * stride],
        );
        scales.push(row_scale(&codes[i * n..(i + 1) * n]).expect("valid").0);
    }
    group.throughput(Throughput::Elements((b * w) as u64));
    group.bench_function(
        BenchmarkId::new("standardize_packed_f64", format!("{b}x{w}")),
        |bn| {
            bn.iter(|| {
                for i in 0..b {
                    let out = t64.row_mut(i).into_slice().expect("row-major");
                    f64::standardize_packed(&packed[i * stride + 128..], scales[i], out);
                }
                std::hint::black_box(t64[[0, 0]])
            })
        },
    );
    group.bench_function(
        BenchmarkId::new("standardize_packed_f32", format!("{b}x{w}")),
        |bn| {
            bn.iter(|| {
                for i in 0..b {
                    let out = t32.row_mut(i).into_slice().expect("row-major");
                    f32::standardize_packed(&packed[i * stride + 128..], scales[i], out);
                }
                std::hint::black_box(t32[[0, 0]])
            })
        },
    );
    let omega = Array2::<f64>::from_shape_fn((w, l), |(i, j)| ((i * 7 + j) % 11) as f64 - 5.0);
    let omega32 = omega.mapv(|x| x as f32);
    let mut y = Array2::<f64>::zeros((b, l));
    let mut y32 = Array2::<f32>::zeros((b, l));
    group.throughput(Throughput::Elements((2 * b * w * l) as u64));
    group.bench_function(
        BenchmarkId::new("dgemm_tile_omega_flops", format!("{b}x{w}x{l}")),
        |bn| {
            bn.iter(|| {
                gemm(false, t64.view(), omega.view(), 0.0, y.view_mut());
                std::hint::black_box(y[[0, 0]])
            })
        },
    );
    group.bench_function(
        BenchmarkId::new("sgemm_tile_omega_flops", format!("{b}x{w}x{l}")),
        |bn| {
            bn.iter(|| {
                gemm(false, t32.view(), omega32.view(), 0.0, y32.view_mut());
                std::hint::black_box(y32[[0, 0]])
            })
        },
    );
    // The projection pass's product: the basis rows of the tile, transposed, times the tile.
    let q = Array2::<f64>::from_shape_fn((b, l), |(i, j)| ((i * 5 + j) % 13) as f64 - 6.0);
    let q32 = q.mapv(|x| x as f32);
    let mut p = Array2::<f64>::zeros((l, w));
    let mut p32 = Array2::<f32>::zeros((l, w));
    group.bench_function(
        BenchmarkId::new("dgemm_qt_tile_flops", format!("{b}x{w}x{l}")),
        |bn| {
            bn.iter(|| {
                gemm(true, q.view(), t64.view(), 0.0, p.view_mut());
                std::hint::black_box(p[[0, 0]])
            })
        },
    );
    group.bench_function(
        BenchmarkId::new("sgemm_qt_tile_flops", format!("{b}x{w}x{l}")),
        |bn| {
            bn.iter(|| {
                gemm(true, q32.view(), t32.view(), 0.0, p32.view_mut());
                std::hint::black_box(p32[[0, 0]])
            })
        },
    );
    // The fused products of packed genotypes (f32 passes), over a whole row block of tiles
    // as the passes take them: 256 variants × 20,000 samples, Ω with the 4 probe columns.
    // `Qᵀ·T` runs on AVX-512F or AVX2 and FMA, `T·Ω` on AVX-512F only.
    if !fused::atb_available() {
        eprintln!("fused kernels skipped: this CPU has neither AVX-512F nor AVX2+FMA");
        group.finish();
        return;
    }
    let tables: Vec<[f32; 4]> = scales.iter().map(|s| s.table().map(|v| v as f32)).collect();
    let tile = |c0: usize| PackedTile {
        bytes: &packed[c0 / 4..],
        stride,
        rows: b,
        cols: w.min(n - c0),
        tables: &tables,
        scales: &scales,
    };
    // `pca -k 10`: l = 20 basis columns, plus 4 probe columns in the first pass (LOBPCG);
    // block Lanczos's passes, 8 columns each way.
    let omega_of =
        |c: usize| Array2::<f32>::from_shape_fn((n, c), |(i, j)| ((i * 7 + j) % 11) as f32 - 5.0);
    let basis_of =
        |c: usize| Array2::<f32>::from_shape_fn((b, c), |(i, j)| ((i * 5 + j) % 13) as f32 - 6.0);
    for (lw, lq) in [(24usize, 20usize), (8, 8)] {
        let omega_n = omega_of(lw);
        let layout = fused::OmegaLayout::new(omega_n.view());
        let basis = basis_of(lq);
        let mut yb = Array2::<f64>::zeros((b, lw));
        let mut bb = Array2::<f64>::zeros((lq, n));
        group.throughput(Throughput::Elements((2 * b * n * lw) as u64));
        if fused::available() {
            group.bench_function(
                BenchmarkId::new("fused_packed_omega_flops", format!("{b}x{n}x{lw}")),
                |bn| {
                    bn.iter(|| {
                        for c0 in (0..n).step_by(w) {
                            let t = tile(c0);
                            assert!(
                                fused::ab(&t, &layout, c0, yb.view_mut()),
                                "the fused kernels run"
                            );
                        }
                        std::hint::black_box(yb[[0, 0]])
                    })
                },
            );
        }
        group.throughput(Throughput::Elements((2 * b * n * lq) as u64));
        group.bench_function(
            BenchmarkId::new("fused_qt_packed_flops", format!("{b}x{n}x{lq}")),
            |bn| {
                bn.iter(|| {
                    for c0 in (0..n).step_by(w) {
                        let t = tile(c0);
                        let out = bb.slice_mut(ndarray::s![.., c0..c0 + t.cols]);
                        assert!(
                            fused::atb(&t, basis.view(), out),
                            "the fused kernels run here"
                        );
                    }
                    std::hint::black_box(bb[[0, 0]])
                })
            },
        );
    }
    let (lw, lq) = (24usize, 20usize);
    let omega_n = omega_of(lw);
    let basis = basis_of(lq);
    let mut yb = Array2::<f64>::zeros((b, lw));
    let mut bb = Array2::<f64>::zeros((lq, n));
    // The same two products by what runs without the fused kernels (each tile standardized
    // into scratch, the skinny kernel, an f64 addition), for an A/B in one run.
    let (mut scratch, mut values) = (Vec::new(), Vec::new());
    group.throughput(Throughput::Elements((2 * b * n * lw) as u64));
    group.bench_function(
        BenchmarkId::new("standardized_packed_omega_flops", format!("{b}x{n}x{lw}")),
        |bn| {
            bn.iter(|| {
                for c0 in (0..n).step_by(w) {
                    let t = tile(c0);
                    f32::ab_tile(
                        Tile::Packed(t),
                        omega_n.view(),
                        None,
                        c0,
                        yb.view_mut(),
                        &mut scratch,
                    );
                }
                std::hint::black_box(yb[[0, 0]])
            })
        },
    );
    group.throughput(Throughput::Elements((2 * b * n * lq) as u64));
    group.bench_function(
        BenchmarkId::new("standardized_qt_packed_flops", format!("{b}x{n}x{lq}")),
        |bn| {
            bn.iter(|| {
                for c0 in (0..n).step_by(w) {
                    let t = tile(c0);
                    let out = bb.slice_mut(ndarray::s![.., c0..c0 + t.cols]);
                    let dense = t.standardize::<f32>(&mut values);
                    f32::atb_tile(Tile::Dense(dense), basis.view(), out, &mut scratch);
                }
                std::hint::black_box(bb[[0, 0]])
            })
        },
    );
    // A fused range pass over float32 row blocks read from memory, as `rsvd --zarr` at
    // q = 0 takes a decoded band: each row block's tiles once for `Y = T·Ω` (24 columns),
    // then again for `W += Yᵀ·T` (20 rows, the skinny kernel and an f64 addition), over 25
    // row blocks (128 MB) in turn so that no block is in cache when its turn comes. `Y` by
    // the skinny kernel with an f64 addition after each tile (`skinny_ab`), or by the
    // dot-product kernel adding to f64 directly (`dot_ab`, what the passes use).
    let (cols, blocks) = (5_000usize, 25usize);
    let band = Array2::<f32>::from_shape_fn((blocks * b, cols), |(i, j)| {
        ((i * 131 + j * 71) % 1009) as f32 / 1009.0 - 0.5
    });
    let omega_c =
        Array2::<f32>::from_shape_fn((cols, lw), |(i, j)| ((i * 7 + j) % 11) as f32 - 5.0);
    let layout_c = fused::OmegaLayout::new(omega_c.view());
    let mut yc = Array2::<f64>::zeros((b, lw));
    let mut wc = Array2::<f64>::zeros((lq, cols));
    let mut y32 = Array2::<f32>::zeros((b, lq));
    group.throughput(Throughput::Elements((2 * b * cols * (lw + lq)) as u64));
    let kernels = [("skinny_ab", None), ("dot_ab", Some(&layout_c))];
    for (name, layout) in kernels
        .into_iter()
        .filter(|k| k.1.is_none() || fused::available())
    {
        let mut next = 0usize;
        let mut scratch = Vec::new();
        group.bench_function(
            BenchmarkId::new(
                format!("fused_pass_f32_{name}_flops"),
                format!("{b}x{cols}"),
            ),
            |bn| {
                bn.iter(|| {
                    let r0 = (next % blocks) * b;
                    next += 1;
                    let rows = band.slice(ndarray::s![r0..r0 + b, ..]);
                    yc.fill(0.0);
                    for c0 in (0..cols).step_by(w) {
                        let t = rows.slice(ndarray::s![.., c0..(c0 + w).min(cols)]);
                        let y = yc.view_mut();
                        f32::ab_tile(Tile::Dense(t), omega_c.view(), layout, c0, y, &mut scratch);
                    }
                    y32.zip_mut_with(&yc.slice(ndarray::s![.., ..lq]), |a, &v| *a = v as f32);
                    for c0 in (0..cols).step_by(w) {
                        let c1 = (c0 + w).min(cols);
                        let t = rows.slice(ndarray::s![.., c0..c1]);
                        let out = wc.slice_mut(ndarray::s![.., c0..c1]);
                        f32::atb_tile(Tile::Dense(t), y32.view(), out, &mut scratch);
                    }
                    std::hint::black_box(wc[[0, 0]])
                })
            },
        );
    }
    group.finish();
}

/// The tile products at the passes' sketch widths, in GFLOP/s (`Throughput::Elements` of
/// flops), for two distances between the tile's rows.
fn skinny_widths(c: &mut Criterion) {
    use rankwise::linalg::internals::tiles::gemm;
    let mut group = c.benchmark_group("skinny_widths");
    let (b, w) = (256usize, 512usize);
    for ld in [520usize, 512] {
        let big = Array2::<f64>::from_shape_fn((b, ld), |(i, j)| {
            ((i * 131 + j * 71) % 1009) as f64 / 1009.0 - 0.5
        });
        let big32 = big.mapv(|x| x as f32);
        let (t, t32) = (
            big.slice(ndarray::s![.., ..w]),
            big32.slice(ndarray::s![.., ..w]),
        );
        for l in [10usize, 20, 24, 44] {
            let omega =
                Array2::<f64>::from_shape_fn((w, l), |(i, j)| ((i * 7 + j) % 11) as f64 - 5.0);
            let q = Array2::<f64>::from_shape_fn((b, l), |(i, j)| ((i * 5 + j) % 13) as f64 - 6.0);
            let (omega32, q32) = (omega.mapv(|x| x as f32), q.mapv(|x| x as f32));
            let (mut y, mut p) = (Array2::<f64>::zeros((b, l)), Array2::<f64>::zeros((l, w)));
            let (mut y32, mut p32) = (Array2::<f32>::zeros((b, l)), Array2::<f32>::zeros((l, w)));
            group.throughput(Throughput::Elements((2 * b * w * l) as u64));
            let id = |what: &str| BenchmarkId::new(what, format!("{b}x{w}x{l}_ld{ld}"));
            group.bench_function(id("ab_f64"), |bn| {
                bn.iter(|| gemm(false, t, omega.view(), 0.0, y.view_mut()))
            });
            group.bench_function(id("atb_f64"), |bn| {
                bn.iter(|| gemm(true, q.view(), t, 0.0, p.view_mut()))
            });
            group.bench_function(id("ab_f32"), |bn| {
                bn.iter(|| gemm(false, t32, omega32.view(), 0.0, y32.view_mut()))
            });
            group.bench_function(id("atb_f32"), |bn| {
                bn.iter(|| gemm(true, q32.view(), t32, 0.0, p32.view_mut()))
            });
        }
    }
    group.finish();
}

/// A temporary directory removed when dropped, so that an interrupted benchmark's leftovers
/// are the only ones left behind.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn zarr_decode(c: &mut Criterion) {
    use rankwise::output::gen_store::{Codec, DType, GenLayout, GenStore, Shuffle, ZarrFormat};
    use rankwise::sources::ZarrMatrix;
    use rankwise::sources::{PanelBuffer, StoredPanels};

    let (band, cols, bands) = (2_000u64, 5_000u64, 3u64);
    let dir =
        TempDir(std::env::temp_dir().join(format!("rankwise-kernels-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    std::fs::create_dir_all(&dir.0).expect("temporary directory");
    let out = dir.0.join("f32-blosc-lz4-bitshuffle.zarr");
    let layout = GenLayout {
        source: Generated::new(bands * band, cols, SEED, Dist::Uniform),
        chunk_rows: band,
        chunk_cols: cols,
        shard_rows: None,
        dtype: DType::F32,
        format: ZarrFormat::V3,
        codec: Codec::BloscLz4,
        shuffle: Shuffle::Bit,
    };
    let panels: Vec<usize> = (0..layout.panels()).collect();
    let store = GenStore::create(&out, &dir.0.join("tmp"), layout).expect("create the store");
    store.write_panels(&panels).expect("write the chunks");
    store.commit().expect("commit the store");
    drop(store);
    let z = ZarrMatrix::open(out.to_str().expect("UTF-8 path")).expect("open the store");
    let mut buf = PanelBuffer::default();
    let rows = band..2 * band;
    let mut group = c.benchmark_group("zarr_decode");
    // One band takes tens of milliseconds: one iteration per sample, as for panel_factor.
    group.sampling_mode(SamplingMode::Flat);
    group.throughput(Throughput::Bytes(band * cols * 4));
    group.bench_function(
        BenchmarkId::new(
            "read_panel_f32_blosc_lz4_bitshuffle",
            format!("{band}x{cols}"),
        ),
        |b| {
            b.iter(|| {
                let stats = z
                    .read_panel(rows.clone(), &mut buf)
                    .expect("decode the band");
                std::hint::black_box(stats.decoded_bytes)
            })
        },
    );
    group.finish();
}

fn main() {
    let mut c = config().configure_from_args();
    generator(&mut c);
    rsvd_tiles(&mut c);
    skinny_widths(&mut c);
    panel_factor(&mut c);
    allreduce(&mut c);
    zarr_decode(&mut c);
    c.final_summary();
}
