//! Panel kernels: the local QR of a row panel, small QRs and SVDs, the sign convention.
//!
//! # Why panels are factored block by block
//!
//! LAPACK's `dgeqrf` on a tall panel with few columns (n = 20) never reaches its blocked
//! code: it runs level-2 updates that stream the whole panel from memory once per column.
//! A panel is therefore factored as a small TSQR of its own: row blocks sized to stay in
//! cache ([`block_rows`]) are factored one after the other, straight after they are
//! generated (or decoded), and their R factors are stacked and factored once more. Each
//! block is factored by Cholesky QR at BLAS-3 speed where that reaches full accuracy, and
//! by Householder QR otherwise (`crate::cholqr`). The block boundaries depend only on the
//! panel's height and `n`, and the choice of method only on the block's values, so the
//! result depends only on the panel, never on placement.

use std::ops::Range;

use ndarray::{s, Array1, Array2, ArrayView2, ArrayViewMut2, ShapeBuilder};
use ndarray_linalg::{JobSvd, QRInto, SVDDCInto};

use crate::LinalgError;

/// Bytes of one row block, chosen to sit in a core's L2 cache with room for LAPACK's work.
const BLOCK_BYTES: usize = 256 * 1024;

/// Rows per cache block of a panel with `n` columns (at least `4n`: stacking the block R
/// factors shrinks the problem, and Cholesky QR takes blocks at least that tall).
pub(crate) fn block_rows(n: usize) -> usize {
    let rows = (BLOCK_BYTES / (8 * n.max(1))).max(4 * n).max(64);
    // A block is column-major with its height as leading dimension: a multiple of 512 rows
    // puts every column's row i in the same L1 set (4 KiB apart), and the kernels that
    // read 12 columns at once evict each other. Eight rows more break the alignment.
    // Measured with `svd --dist normal` of 2,097,152 × 32 (1,024-row blocks) on the 2-core
    // AMD EPYC (Zen 3) KVM guest: pass 1 3.3–3.6e-8 → 2.3–2.6e-8 core-seconds a value; 8
    // and 16 columns (4,096 and 2,048 rows) unchanged.
    if rows.is_multiple_of(512) {
        rows + 8
    } else {
        rows
    }
}

/// Columns from which [`PanelFactor::compute`] factors a panel whole (by Cholesky QR, or
/// LAPACK's blocked Householder QR where that refuses) instead of in row blocks of
/// [`block_rows`] whose R factors are stacked and factored again. Row blocks keep narrow
/// panels in cache; from about this width a whole panel's Cholesky QR runs at BLAS-3 speed
/// on its own and the stacked factors only add work. Measured with `rankwise svd` of
/// 102,400,000 values in two panels on the 2-core Intel Xeon (model 207) VM, 2026-11-28,
/// row blocks against whole panels: 2.08 s against 1.25 s at 64 columns, 4.41 s against
/// 2.00 s at 128, 6.75 s against 2.98 s at 256, 8.33 s against 5.72 s at 512; at 20
/// columns (10,000,000 × 20 in 16 panels) both took 1.3–1.6 s. (With Householder QR of
/// the blocks, before Cholesky QR, the break-even was about 640 columns.)
pub(crate) const WHOLE_PANEL_COLS: usize = 64;

/// Makes OpenBLAS single-threaded: rankwise's actors supply the parallelism, and a
/// single-threaded BLAS makes every kernel's result independent of the machine's load.
pub fn init_blas_threads() {
    extern "C" {
        fn openblas_set_num_threads(n: std::os::raw::c_int);
    }
    // SAFETY: a plain setter in OpenBLAS, safe to call at any time from any thread.
    unsafe { openblas_set_num_threads(1) };
}

/// The name of the kernels OpenBLAS chose for this CPU at load time (e.g. `Haswell`,
/// `SkylakeX`).
pub fn openblas_core() -> String {
    extern "C" {
        fn openblas_get_corename() -> *const std::os::raw::c_char;
    }
    // SAFETY: returns a pointer to a static NUL-terminated string of OpenBLAS's.
    let name = unsafe { openblas_get_corename() };
    if name.is_null() {
        return String::new();
    }
    // SAFETY: non-null, NUL-terminated, static.
    unsafe { std::ffi::CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}

/// The BLAS library as it describes itself (`OpenBLAS 0.3.21 DYNAMIC_ARCH … Haswell …`),
/// with the kernels it chose for this CPU, for run reports.
pub fn blas_library() -> String {
    extern "C" {
        fn openblas_get_config() -> *const std::os::raw::c_char;
    }
    // SAFETY: returns a pointer to a static NUL-terminated string of OpenBLAS's.
    let config = unsafe { openblas_get_config() };
    let config = if config.is_null() {
        "OpenBLAS".to_string()
    } else {
        // SAFETY: non-null, NUL-terminated, static.
        unsafe { std::ffi::CStr::from_ptr(config) }
            .to_string_lossy()
            .trim()
            .to_string()
    };
    let core = openblas_core();
    if core.is_empty() || config.contains(&core) {
        config
    } else {
        format!("{config} (kernels {core})")
    }
}

/// Whether OpenBLAS runs its AVX-512 kernels (SkylakeX and later), whose results depend on
/// where the operands lie in memory: with them, the same small QR or SVD computed by
/// another rank, at other addresses, can differ in the last bits, and runs with different
/// rank counts stop being bit-identical (see `rankwise::process::restart_with_layout_independent_kernels`).
pub(crate) fn openblas_layout_dependent() -> bool {
    let core = openblas_core().to_ascii_lowercase();
    ["skylakex", "cooperlake", "sapphirerapids"]
        .iter()
        .any(|c| core.contains(c))
}

/// The kernels OpenBLAS should run here, when they differ from those it chose: `Haswell`
/// (AVX2 and FMA) when it chose its layout-dependent AVX-512 kernels (their results
/// depend on the operands' memory layout), and also when it fell back to its generic SSE3 kernels
/// (`Prescott`) on a CPU with AVX2 and FMA that this OpenBLAS does not know by model.
/// Measured on a 2-core Intel Xeon KVM guest (AVX-512, family 6 model unknown to OpenBLAS
/// 0.3.21): `rankwise svd` of 10,000,000 × 20 took 3.0 s with `Prescott`, its choice, and
/// 1.9 s with `Haswell` (before the panels' Cholesky QR); see `benches/RESULTS.md`.
pub fn openblas_preferred_core() -> Option<&'static str> {
    if openblas_layout_dependent() {
        return Some("Haswell");
    }
    let core = openblas_core().to_ascii_lowercase();
    let generic = [
        "prescott",
        "core2",
        "katmai",
        "coppermine",
        "northwood",
        "banias",
    ]
    .iter()
    .any(|c| core == *c);
    #[cfg(target_arch = "x86_64")]
    let avx2 =
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
    #[cfg(not(target_arch = "x86_64"))]
    let avx2 = false;
    (generic && avx2).then_some("Haswell")
}

/// A factored panel: `panel = Q · R` with `Q = diag(Q̃_blocks) · Q_stack`.
#[derive(Debug)]
pub struct PanelFactor {
    /// `Q̃` of every row block, one after the other: block `j` is `b_j × k_j`, column-major,
    /// at `blocks[j].2`. A block factored by Cholesky QR keeps its last triangular factor
    /// out of `Q̃`: it is folded into the block's rows of `stack_q` instead.
    q: Vec<f64>,
    /// `(rows b_j, columns k_j, offset)` of each block in `q`.
    blocks: Vec<(usize, usize, usize)>,
    /// `Σ k_j × k`: the Q of the stacked block R factors, with each block's rows multiplied
    /// by its triangular factor (absent with a single block that has none).
    stack_q: Option<Array2<f64>>,
    /// The panel's R factor, `k × n` with `k = min(rows, n)`.
    pub r: Array2<f64>,
    /// With [`Keep::Solves`]: how each block's `Q̃` is made again from its values, in place
    /// of `q` (which is then empty).
    replay: Option<Vec<Replay>>,
}

/// How a row block's `Q̃` is made from its values.
#[derive(Debug)]
enum Replay {
    /// The triangular solves of its Cholesky QR ([`crate::cholqr::replay`]).
    Solves(Vec<Vec<f64>>),
    /// LAPACK's Householder QR, run again ([`qr_in_place`] takes the same path on the same
    /// values).
    Householder,
}

/// Whether a factor's Q buffer is kept past the pass or recycled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Kept between passes (resident): a fresh allocation, its pages populated at once.
    Kept,
    /// Returned to the worker thread's scratch pool after use.
    Scratch,
    /// Not kept: only each block's triangular solves (`n × n` each) are, from which
    /// [`PanelFactor::replay_into`] makes `Q̃` again from the panel's values produced again.
    /// For sources that produce a panel faster than the kernel provides fresh pages for
    /// its `Q` and the pass streams them back (generated matrices).
    Solves,
}

thread_local! {
    /// Buffers of one worker thread, reused panel after panel: large allocations made
    /// and freed per panel would otherwise go to mmap and page-fault on every touch.
    static POOL: std::cell::RefCell<Vec<Vec<f64>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The smallest buffer of this thread's pool that holds at least `len` values, with what
/// it held. The smallest, so that a block-sized request does not take the panel-sized
/// buffer the next panel needs (which then was allocated, faulted in and unmapped anew).
fn pooled(len: usize) -> Option<Vec<f64>> {
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        let i = (0..p.len())
            .filter(|&i| p[i].capacity() >= len)
            .min_by_key(|&i| p[i].capacity())?;
        Some(p.swap_remove(i))
    })
}

/// Returns a buffer to this thread's pool (an empty one, such as a factor of solves
/// gives back, is not kept: it would only take a place).
pub(crate) fn give_scratch(v: Vec<f64>) {
    if v.capacity() == 0 {
        return;
    }
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < 4 {
            p.push(v);
        }
    });
}

/// A zeroed allocation. (Transparent huge pages were tried for the kept factors: with the
/// common `defrag=madvise` setting a fault can stall for seconds in compaction, so the
/// kernels stay on ordinary pages and reuse buffers instead.)
fn alloc_zeroed(len: usize) -> Vec<f64> {
    vec![0.0f64; len]
}

/// [`alloc_zeroed`] with its pages populated at once (`MADV_POPULATE_WRITE`, Linux 5.14)
/// rather than faulted in one by one as the panel is produced into them: a panel's kept
/// factor is written once, whole, straight away.
pub(crate) fn alloc_populated(len: usize) -> Vec<f64> {
    let v = alloc_zeroed(len);
    #[cfg(target_os = "linux")]
    {
        let page = 4096usize;
        let start = (v.as_ptr() as usize).next_multiple_of(page);
        let end = (v.as_ptr() as usize + len * 8) / page * page;
        if end > start {
            // SAFETY: the range lies inside `v`'s allocation, page-aligned; populating
            // pages changes no values (they read as zero either way). A kernel without
            // MADV_POPULATE_WRITE returns EINVAL, and the pages fault in as before.
            unsafe {
                libc::madvise(
                    start as *mut libc::c_void,
                    end - start,
                    libc::MADV_POPULATE_WRITE,
                );
            }
        }
    }
    v
}

/// A buffer of `len` values from this thread's pool, whose values are unspecified: for
/// callers that write every value before reading it (skips zeroing a reused buffer).
pub(crate) fn take_scratch_for_overwrite(len: usize) -> Vec<f64> {
    match pooled(len) {
        Some(mut v) => {
            if v.len() >= len {
                v.truncate(len);
            } else {
                v.resize(len, 0.0);
            }
            v
        }
        None => alloc_zeroed(len),
    }
}

fn lapack_error(what: &str, info: i32) -> LinalgError {
    LinalgError::Lapack(format!("{what} returned info = {info}"))
}

/// A row block's QR in place: `R`, the triangular factor left out of `Q̃` (if any), and how
/// `Q̃` is made again ([`qr_in_place`]).
type BlockQr = (Array2<f64>, Option<Array2<f64>>, Replay);

/// Thin QR in place of the column-major `m × n` matrix at `a` (lda = m): returns R
/// (`k × n`) and leaves `Q̃` (`m × k`) in the first `m·k` values, with `Q = Q̃·T` for the
/// returned `T` (`k × k`), or `Q = Q̃` without one. Cholesky QR ([`crate::cholqr`]) where it
/// reaches full accuracy, else `dgeqrf` then `dorgqr`.
fn qr_in_place(
    a: &mut [f64],
    m: usize,
    n: usize,
    work: &mut Vec<f64>,
) -> Result<BlockQr, LinalgError> {
    if let Some(f) = crate::cholqr::cholesky_qr(a, m, n) {
        return Ok((f.r, Some(f.t), Replay::Solves(f.solves)));
    }
    let k = m.min(n);
    let mut tau = vec![0.0f64; k.max(1)];
    let (mi, ni, ki) = (m as i32, n as i32, k as i32);
    let lda = (m as i32).max(1);
    let mut info = 0i32;
    let lwork = (64 * n.max(1)) as i32;
    if work.len() < lwork as usize {
        work.resize(lwork as usize, 0.0);
    }
    // SAFETY: `a` holds m·n values with leading dimension m, `tau` holds k, `work` lwork.
    unsafe {
        lapack_sys::dgeqrf_(
            &mi,
            &ni,
            a.as_mut_ptr(),
            &lda,
            tau.as_mut_ptr(),
            work.as_mut_ptr(),
            &lwork,
            &mut info,
        );
    }
    if info != 0 {
        return Err(lapack_error("dgeqrf", info));
    }
    let mut r = Array2::<f64>::zeros((k, n).f());
    for c in 0..n {
        for i in 0..=c.min(k.saturating_sub(1)) {
            if i < k {
                r[[i, c]] = a[i + c * m];
            }
        }
    }
    // SAFETY: as above; dorgqr overwrites the first k columns with Q.
    unsafe {
        lapack_sys::dorgqr_(
            &mi,
            &ki,
            &ki,
            a.as_mut_ptr(),
            &lda,
            tau.as_ptr(),
            work.as_mut_ptr(),
            &lwork,
            &mut info,
        );
    }
    if info != 0 {
        return Err(lapack_error("dorgqr", info));
    }
    Ok((r, None, Replay::Householder))
}

impl PanelFactor {
    /// Factors the panel of `rows` rows and `n` columns whose row blocks `fill` writes.
    pub fn compute<F>(
        rows: usize,
        n: usize,
        keep: Keep,
        mut fill: F,
    ) -> Result<PanelFactor, LinalgError>
    where
        F: FnMut(Range<usize>, ArrayViewMut2<'_, f64>) -> Result<(), LinalgError>,
    {
        let b = if n >= WHOLE_PANEL_COLS {
            rows.max(1)
        } else {
            block_rows(n)
        };
        // Block j's values start where block j−1's Q ends; the last block may need n·n more.
        // Keeping only the solves, every block is made in the same block-sized buffer.
        let solves = keep == Keep::Solves;
        let len = if solves {
            b.min(rows) * n
        } else {
            rows * n + n * n
        };
        // Every block's values are written by `fill` before they are read (a source fills
        // all the rows it is asked for), and the slack past the blocks is never read.
        let mut q = match keep {
            Keep::Kept => alloc_populated(len),
            Keep::Scratch | Keep::Solves => take_scratch_for_overwrite(len),
        };
        let mut blocks = Vec::with_capacity(rows.div_ceil(b));
        let mut rs = Vec::with_capacity(blocks.capacity());
        let mut ts = Vec::with_capacity(blocks.capacity());
        let mut replay = Vec::with_capacity(if solves { blocks.capacity() } else { 0 });
        let mut work = Vec::new();
        let mut start = 0;
        let mut off = 0;
        while start < rows {
            let end = (start + b).min(rows);
            let h = end - start;
            let at = if solves { 0 } else { off };
            let region = &mut q[at..at + h * n];
            let view =
                ArrayViewMut2::from_shape((h, n).f(), region).expect("block fits its region");
            if let Err(e) = fill(start..end, view) {
                if keep != Keep::Kept {
                    give_scratch(q);
                }
                return Err(e);
            }
            let (r, t, how) = qr_in_place(&mut q[at..at + h * n], h, n, &mut work)?;
            rs.push(r);
            ts.push(t);
            if solves {
                replay.push(how);
            }
            let kj = h.min(n);
            blocks.push((h, kj, at));
            off += h * kj;
            start = end;
        }
        let replay = solves.then(|| {
            give_scratch(std::mem::take(&mut q));
            replay
        });
        if blocks.len() <= 1 {
            let r = rs.pop().unwrap_or_else(|| Array2::zeros((0, n)));
            return Ok(PanelFactor {
                q,
                blocks,
                stack_q: ts.pop().flatten(),
                r,
                replay,
            });
        }
        let stacked = stack_rows(&rs.iter().map(|r| r.view()).collect::<Vec<_>>());
        let (mut sq, r) = qr(stacked)?;
        let mut soff = 0;
        for (&(_, kj, _), t) in blocks.iter().zip(&ts) {
            if let Some(t) = t {
                let rows = s![soff..soff + kj, ..];
                let folded = t.dot(&sq.slice(rows));
                sq.slice_mut(rows).assign(&folded);
            }
            soff += kj;
        }
        Ok(PanelFactor {
            q,
            blocks,
            stack_q: Some(sq),
            r,
            replay,
        })
    }

    /// The factor of a panel whose thin QR was computed elsewhere (on its GPU actor's
    /// device): `q` is `Q`, `rows × k` column-major, and `r` is `R`, `k × n`.
    pub fn from_explicit(q: Vec<f64>, rows: usize, r: Array2<f64>) -> PanelFactor {
        let k = r.nrows();
        debug_assert_eq!(q.len(), rows * k);
        PanelFactor {
            q,
            blocks: vec![(rows, k, 0)],
            stack_q: None,
            r,
            replay: None,
        }
    }

    /// Rows of the panel.
    pub fn rows(&self) -> usize {
        self.blocks.iter().map(|b| b.0).sum()
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        let s = self.stack_q.as_ref().map_or(0, |q| q.len());
        let solves: usize = self.replay.iter().flatten().map(Replay::len).sum();
        ((self.q.len() + s + self.r.len() + solves) * 8) as u64
    }

    /// Whether this factor keeps only its blocks' solves (`Keep::Solves`): its `Q` is then
    /// applied by [`PanelFactor::replay_into`] from the panel's values, not by
    /// [`PanelFactor::apply_into`].
    pub fn replays(&self) -> bool {
        self.replay.is_some()
    }

    /// The small matrix block `j` of `Q` applies to `c`: `c` itself, or its rows of
    /// `stack_q` times `c`.
    fn block_c(&self, soff: usize, kj: usize, c: &ArrayView2<'_, f64>) -> Array2<f64> {
        let cj = match &self.stack_q {
            Some(sq) => sq.slice(s![soff..soff + kj, ..]).dot(c),
            None => c.to_owned(),
        };
        if cj.is_standard_layout() {
            cj
        } else {
            cj.as_standard_layout().into_owned()
        }
    }

    /// `Q · c` for `c` of shape `k × l`, written block by block into `out` (`rows × l`).
    /// The factor must hold its `Q` (not [`PanelFactor::replays`]).
    pub fn apply_into(&self, c: ArrayView2<'_, f64>, mut out: ArrayViewMut2<'_, f64>) {
        assert!(
            !self.replays(),
            "a factor of solves is applied by replay_into"
        );
        let c = c.as_standard_layout();
        let c = c.view();
        let mut row = 0;
        let mut soff = 0;
        for &(h, kj, off) in &self.blocks {
            let cj = self.block_c(soff, kj, &c);
            let qj = &self.q[off..off + h * kj];
            block_product(qj, h, kj, cj.view(), out.slice_mut(s![row..row + h, ..]));
            row += h;
            soff += kj;
        }
    }

    /// [`PanelFactor::apply_into`] for a factor of solves (`Keep::Solves`): each block's
    /// values are produced again by `fill` (as in [`PanelFactor::compute`]) into one
    /// block-sized buffer, made into `Q̃` by the block's own solves (or its Householder QR
    /// again), and multiplied at once. The same bits as the factor kept whole would give.
    pub fn replay_into<F>(
        &self,
        mut fill: F,
        c: ArrayView2<'_, f64>,
        mut out: ArrayViewMut2<'_, f64>,
    ) -> Result<(), LinalgError>
    where
        F: FnMut(Range<usize>, ArrayViewMut2<'_, f64>) -> Result<(), LinalgError>,
    {
        let Some(replay) = &self.replay else {
            self.apply_into(c, out);
            return Ok(());
        };
        let n = self.r.ncols();
        let c = c.as_standard_layout();
        let c = c.view();
        let most = self.blocks.iter().map(|b| b.0).max().unwrap_or(0);
        let mut buf = take_scratch_for_overwrite(most * n);
        let mut work = Vec::new();
        let (mut row, mut soff) = (0, 0);
        let mut made = || -> Result<(), LinalgError> {
            for (&(h, kj, _), how) in self.blocks.iter().zip(replay) {
                let a = &mut buf[..h * n];
                fill(
                    row..row + h,
                    ArrayViewMut2::from_shape((h, n).f(), &mut *a).expect("block shape"),
                )?;
                match how {
                    Replay::Solves(rs) => crate::cholqr::replay(a, h, n, rs),
                    Replay::Householder => {
                        qr_in_place(a, h, n, &mut work)?;
                    }
                }
                let cj = self.block_c(soff, kj, &c);
                block_product(
                    &a[..h * kj],
                    h,
                    kj,
                    cj.view(),
                    out.slice_mut(s![row..row + h, ..]),
                );
                row += h;
                soff += kj;
            }
            Ok(())
        };
        let done = made();
        give_scratch(buf);
        done
    }

    /// `Q · c` as a new column-major array.
    pub fn apply(&self, c: ArrayView2<'_, f64>) -> Array2<f64> {
        let mut out = Array2::zeros((self.rows(), c.ncols()).f());
        self.apply_into(c, out.view_mut());
        out
    }

    /// Gives the Q buffer back to this thread's scratch pool.
    pub fn recycle(self) {
        give_scratch(self.q);
    }
}

impl Replay {
    /// Values held.
    fn len(&self) -> usize {
        match self {
            Replay::Solves(rs) => rs.iter().map(Vec::len).sum(),
            Replay::Householder => 0,
        }
    }
}

/// `U_j = Q̃_j·c_j` for the column-major `h × kj` block `qj` and the row-major `kj × l`
/// matrix `cj`, into `uj` (`h × l`).
fn block_product(
    qj: &[f64],
    h: usize,
    kj: usize,
    cj: ArrayView2<'_, f64>,
    mut uj: ArrayViewMut2<'_, f64>,
) {
    let l = cj.ncols();
    debug_assert!(cj.is_standard_layout());
    // `U_j = Q̃_j·c_j` read as `U_jᵀ = c_jᵀ·Q̃_jᵀ`: both `Q̃_j` and a column-major `U`
    // are the row-major transposes the skinny kernel takes, so it reads `Q̃_j` where
    // it lies, once per 12 columns of `U`, without BLAS's packing and its zeroing of
    // `U` (`dgemm_beta`). Measured on the 2-core Intel Xeon VM (AVX-512), `svd` of
    // 10,000,000 × 20: see `benches/RESULTS.md`, issue 38 notes.
    let ld = uj.strides()[1];
    let done = h > 0
        && l > 0
        && uj.strides()[0] == 1
        && ld >= h as isize
        // SAFETY: `cj` is `kj × l` row-major (standard layout, ld l); `qj` holds the
        // `h × kj` column-major block, i.e. `kj × h` row-major with ld h; `uj` is
        // `h × l` column-major with ld `ld` ≥ h, i.e. `l × h` row-major, exclusive
        // and apart from both; `isa()` runs here.
        && crate::skinny::isa().is_some_and(|isa| unsafe {
            crate::skinny::atb(
                isa,
                l,
                h,
                kj,
                cj.as_ptr(),
                l,
                qj.as_ptr(),
                h,
                0.0,
                uj.as_mut_ptr(),
                ld as usize,
            )
        });
    if !done {
        let qj = ArrayView2::from_shape((h, kj).f(), qj).expect("block shape");
        ndarray::linalg::general_mat_mul(1.0, &qj, &cj, 0.0, &mut uj);
    }
}

/// Thin QR: `a = q · r` with `q` of shape `m × k`, `r` of shape `k × n`, `k = min(m, n)`.
pub fn qr(a: Array2<f64>) -> Result<(Array2<f64>, Array2<f64>), LinalgError> {
    if a.nrows() == 0 {
        return Ok((Array2::zeros((0, 0)), Array2::zeros((0, a.ncols()))));
    }
    a.qr_into()
        .map_err(|e| LinalgError::Lapack(format!("QR: {e}")))
}

/// The `Q` of two stacked upper triangular factors, `[a; b] = Q·r` with `a` `n × n` and `b`
/// `kb × n` upper trapezoidal, kept as LAPACK's compact block reflectors (`dtpqrt`): `V`
/// (`kb × n`, upper trapezoidal: the reflectors' rows below `a`) and `T` (`nb × n`).
///
/// A dense QR of the stacked `2n × n` matrix (`dgeqrf`, then `dorgqr` to form `Q`) does
/// about `6.7·n³` flops where the zeros below both triangles leave `dtpqrt` about
/// `0.67·n³`, and applying the reflectors to `[C; 0]` on the way down (`dtpmqrt`) costs
/// a little less than the two products with an explicit `Q` did. Measured: see
/// [`stacked_triangles_qr`].
pub(crate) struct StackedQ {
    n: usize,
    kb: usize,
    nb: usize,
    v: Vec<f64>,
    t: Vec<f64>,
}

/// Block size of the compact reflectors (`dtpqrt`'s NB): LAPACK's usual blocking width.
const STACKED_NB: usize = 32;

/// The QR of `[a; b]` for an `n × n` upper triangular `a` and a `kb × n` upper
/// trapezoidal `b` (what the reduction tree merges: two R factors), as compact reflectors
/// and the `n × n` R. Only the upper triangles (trapezoid) of `a` and `b` are read.
///
/// The exact SVD's tree on one rank of the 2-core Intel Xeon guest (`svd --dist normal
/// --json`, two runs each, alternating with the dense QR's build), its merges up and down:
///
/// | run | merges | dense QR, explicit `Q` | these |
/// |---|---|---|---|
/// | `--rows 200000 --cols 400 --chunk-rows 12500` | 15 | 0.45–0.47 s | 0.14 s |
/// | `--rows 100000 --cols 512 --chunk-rows 6250` | 15 | 1.03–1.07 s | 0.26 s |
/// | `--rows 20000 --cols 1000 --chunk-rows 2000` | 9 | 3.62–4.45 s | 1.17–1.18 s |
///
/// The way up became 6–8 times faster and the way down 1.3 times; the whole runs 3.8–4.3 →
/// 3.6–3.7 s, 4.1–4.2 → 3.1–3.3 s and 6.5–7.4 → 4.0–4.5 s, with the same `--check`
/// residual and orthogonality (4.2e-15 and 3.6e-15 at 1,000 columns).
pub(crate) fn stacked_triangles_qr(
    a: ArrayView2<'_, f64>,
    b: ArrayView2<'_, f64>,
) -> Result<(StackedQ, Array2<f64>), LinalgError> {
    let n = a.ncols();
    let kb = b.nrows();
    debug_assert!(a.nrows() == n && b.ncols() == n && kb <= n && n > 0);
    let nb = STACKED_NB.min(n);
    // Column-major copies: `a` (lda n) and `b` (ldb kb, at least 1).
    let ldb = kb.max(1);
    let mut ac = vec![0.0f64; n * n];
    let mut v = vec![0.0f64; ldb * n];
    for c in 0..n {
        for i in 0..=c {
            ac[i + c * n] = a[[i, c]];
        }
        for i in 0..kb.min(c + 1) {
            v[i + c * ldb] = b[[i, c]];
        }
    }
    let mut t = vec![0.0f64; nb * n];
    let mut work = vec![0.0f64; nb * n];
    let (ni, kbi, nbi, ldbi) = (n as i32, kb as i32, nb as i32, ldb as i32);
    let mut info = 0i32;
    // SAFETY: `ac` is n × n (lda n), `v` kb × n (ldb ≥ max(1, kb)), `t` nb × n (ldt nb),
    // `work` nb·n values, as dtpqrt documents for M = L = kb, N = n, NB = nb ≤ n.
    unsafe {
        lapack_sys::dtpqrt_(
            &kbi,
            &ni,
            &kbi,
            &nbi,
            ac.as_mut_ptr(),
            &ni,
            v.as_mut_ptr(),
            &ldbi,
            t.as_mut_ptr(),
            &nbi,
            work.as_mut_ptr(),
            &mut info,
        );
    }
    if info != 0 {
        return Err(lapack_error("dtpqrt", info));
    }
    let mut r = Array2::<f64>::zeros((n, n).f());
    for c in 0..n {
        for i in 0..=c {
            r[[i, c]] = ac[i + c * n];
        }
    }
    Ok((StackedQ { n, kb, nb, v, t }, r))
}

impl StackedQ {
    /// `Q·[c; 0]` for an `n × l` block `c`, split as the stacked factors were: the top
    /// `n × l` and the bottom `kb × l`.
    pub(crate) fn apply(
        &self,
        c: ArrayView2<'_, f64>,
    ) -> Result<(Array2<f64>, Array2<f64>), LinalgError> {
        let (n, kb, nb) = (self.n, self.kb, self.nb);
        let l = c.ncols();
        debug_assert_eq!(c.nrows(), n);
        let mut top = Array2::<f64>::zeros((n, l).f());
        top.assign(&c);
        let mut bottom = Array2::<f64>::zeros((kb, l).f());
        if l == 0 {
            return Ok((top, bottom));
        }
        let ldb = kb.max(1);
        let mut work = vec![0.0f64; nb * l];
        let (ni, kbi, li, nbi, ldbi) = (n as i32, kb as i32, l as i32, nb as i32, ldb as i32);
        let mut info = 0i32;
        let (side, trans) = (b'L' as std::os::raw::c_char, b'N' as std::os::raw::c_char);
        // SAFETY: `top` is n × l column-major (lda n), `bottom` kb × l column-major (ldb ≥
        // max(1, kb)), `v` and `t` as dtpqrt left them for K = n reflectors of M = L = kb
        // rows, `work` nb·l values, as dtpmqrt documents for SIDE = 'L'.
        unsafe {
            lapack_sys::dtpmqrt_(
                &side,
                &trans,
                &kbi,
                &li,
                &ni,
                &kbi,
                &nbi,
                self.v.as_ptr(),
                &ldbi,
                self.t.as_ptr(),
                &nbi,
                top.as_mut_ptr(),
                &ni,
                bottom.as_mut_ptr(),
                &ldbi,
                work.as_mut_ptr(),
                &mut info,
            );
        }
        if info != 0 {
            return Err(lapack_error("dtpmqrt", info));
        }
        Ok((top, bottom))
    }
}

/// Stacks matrices with the same column count on top of each other (column-major result).
pub fn stack_rows(parts: &[ArrayView2<'_, f64>]) -> Array2<f64> {
    let n = parts.first().map_or(0, |p| p.ncols());
    let rows: usize = parts.iter().map(|p| p.nrows()).sum();
    let mut out = Array2::zeros((rows, n).f());
    let mut r = 0;
    for p in parts {
        out.slice_mut(s![r..r + p.nrows(), ..]).assign(p);
        r += p.nrows();
    }
    out
}

/// `(u, σ, vᵀ)` of a thin SVD.
pub(crate) type Svd = (Array2<f64>, Array1<f64>, Array2<f64>);

/// Thin SVD of a small replicated matrix (`k × n`, `k ≤ n` or not): `(u, σ, vᵀ)` with σ
/// descending, signs fixed by [`fix_signs`].
pub(crate) fn small_svd(a: ArrayView2<'_, f64>) -> Result<Svd, LinalgError> {
    let (m, n) = a.dim();
    if m == 0 || n == 0 {
        let k = m.min(n);
        return Ok((
            Array2::zeros((m, k)),
            Array1::zeros(k),
            Array2::zeros((k, n)),
        ));
    }
    let owned = a.to_owned();
    let (u, s, vt) = owned
        .svddc_into(JobSvd::Some)
        .map_err(|e| LinalgError::Lapack(format!("SVD: {e}")))?;
    let mut u = u.ok_or_else(|| LinalgError::Lapack("SVD returned no U".into()))?;
    let mut vt = vt.ok_or_else(|| LinalgError::Lapack("SVD returned no Vᵀ".into()))?;
    fix_signs(&mut u, &mut vt);
    Ok((u, s, vt))
}

/// The sign convention: in each row of `vt`, the entry of largest magnitude (the first one
/// on ties) is made positive, and the matching column of `u` flips with it. `vt` is the
/// factor every rank holds whole, so every rank agrees without communication.
pub(crate) fn fix_signs(u: &mut Array2<f64>, vt: &mut Array2<f64>) {
    for i in 0..vt.nrows() {
        let row = vt.row(i);
        let mut best = 0;
        for (j, v) in row.iter().enumerate() {
            if v.abs() > row[best].abs() {
                best = j;
            }
        }
        if !row.is_empty() && row[best] < 0.0 {
            vt.row_mut(i).mapv_inplace(|x| -x);
            if i < u.ncols() {
                u.column_mut(i).mapv_inplace(|x| -x);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::normal as random;

    /// The structured QR of two stacked triangles, on fresh shapes (the lower one square or
    /// shorter): its `Q` applied to `[I; 0]` is orthonormal, times `R` it gives the pair
    /// back, `R` is upper triangular, and it matches the dense QR's up to each row's sign.
    #[test]
    fn stacked_triangles_factor_as_the_dense_qr_does() {
        let mut rng = crate::testing::Rng::fresh();
        for _ in 0..8 {
            let n = 1 + rng.below(90);
            let kb = 1 + rng.below(n);
            let upper = |rows: usize, seed: u64| {
                let mut x = random(rows, n, seed);
                for i in 0..rows {
                    for c in 0..i.min(n) {
                        x[[i, c]] = 0.0;
                    }
                }
                x
            };
            let (a, b) = (upper(n, rng.next()), upper(kb, rng.next()));
            // Garbage below the diagonals is not read.
            let (mut ag, mut bg) = (a.clone(), b.clone());
            for i in 1..n {
                ag[[i, 0]] = 7.0;
            }
            if kb > 1 {
                bg[[kb - 1, 0]] = -3.0;
            }
            let (q, r) = stacked_triangles_qr(ag.view(), bg.view()).unwrap();
            let (top, bottom) = q.apply(Array2::<f64>::eye(n).view()).unwrap();
            assert_eq!(
                (top.dim(), bottom.dim(), r.dim()),
                ((n, n), (kb, n), (n, n))
            );
            let scale = 1e-13 * (n as f64);
            let gram = top.t().dot(&top) + bottom.t().dot(&bottom);
            let off = (&gram - &Array2::<f64>::eye(n))
                .iter()
                .fold(0.0f64, |m, x| m.max(x.abs()));
            assert!(off < scale, "n {n} kb {kb}: orthogonality {off:e}");
            let norm = a.iter().chain(b.iter()).fold(0.0f64, |m, x| m.max(x.abs()));
            let back = (&top.dot(&r) - &a)
                .iter()
                .chain((&bottom.dot(&r) - &b).iter())
                .fold(0.0f64, |m, x| m.max(x.abs()));
            assert!(
                back < scale * norm,
                "n {n} kb {kb}: backward error {back:e}"
            );
            for i in 0..n {
                for c in 0..i {
                    assert_eq!(r[[i, c]], 0.0);
                }
            }
            let (_, dense) = qr(stack_rows(&[a.view(), b.view()])).unwrap();
            for i in 0..n {
                let sign = if (dense[[i, i]] < 0.0) == (r[[i, i]] < 0.0) {
                    1.0
                } else {
                    -1.0
                };
                for c in i..n {
                    let d = (sign * r[[i, c]] - dense[[i, c]]).abs();
                    assert!(
                        d < scale * norm,
                        "n {n} kb {kb}: R[{i}, {c}] differs by {d:e}"
                    );
                }
            }
        }
    }

    /// A factor made from an explicit column-major `Q` (as a GPU actor's cuSOLVER QR gives
    /// it) applies that `Q`, on fresh shapes, tall and wide.
    #[test]
    fn explicit_factors_apply_their_q() {
        let mut rng = crate::testing::Rng::fresh();
        for _ in 0..6 {
            let m = 1 + rng.below(3000);
            let n = 1 + rng.below(40);
            let y = random(m, n, rng.next());
            let (q, r) = qr(y.clone()).unwrap();
            let k = q.ncols();
            let colmajor: Vec<f64> = q.t().iter().copied().collect();
            let f = PanelFactor::from_explicit(colmajor, m, r.clone());
            assert_eq!((f.rows(), f.r.dim()), (m, (k, n)));
            let c = random(k, 3, rng.next());
            let got = f.apply(c.view());
            let want = q.dot(&c);
            let diff = (&got - &want).iter().fold(0f64, |a, v| a.max(v.abs()));
            assert!(diff < 1e-12 * (k as f64), "{m} × {n}: ‖Qc − Q·c‖∞ {diff}");
            let back = f.apply(f.r.view());
            let err = (&back - &y).iter().fold(0f64, |a, v| a.max(v.abs()));
            assert!(err < 1e-12 * (m as f64), "{m} × {n}: ‖QR − Y‖∞ {err}");
        }
    }

    /// Panels factored in row blocks and panels factored whole (from
    /// [`WHOLE_PANEL_COLS`] columns) both give `Q·R = A` with `Q` orthonormal: fixed edge
    /// shapes, and fresh ones on both sides of the width.
    #[test]
    fn blocked_panel_factor_reconstructs_the_panel() {
        let mut rng = crate::testing::Rng::fresh();
        let mut shapes = vec![(1usize, 1usize), (3, 5), (5000, 20), (700, 64), (129, 3)];
        for _ in 0..3 {
            let n = WHOLE_PANEL_COLS - 40 + rng.below(80);
            shapes.push((n / 2 + rng.below(3 * n), n));
            let n = 1 + rng.below(100);
            shapes.push((1 + rng.below(6000), n));
        }
        for (m, n) in shapes {
            let a = random(m, n, rng.next());
            let f = PanelFactor::compute(m, n, Keep::Scratch, |r, mut out| {
                out.assign(&a.slice(s![r, ..]));
                Ok(())
            })
            .unwrap();
            let q = f.apply(Array2::eye(f.r.nrows()).view());
            let back = q.dot(&f.r);
            let err = (&back - &a).mapv(|x| x * x).sum().sqrt() / a.mapv(|x| x * x).sum().sqrt();
            assert!(err < 1e-13, "{m}x{n}: {err}");
            let qtq = q.t().dot(&q) - Array2::<f64>::eye(q.ncols());
            assert!(qtq.iter().all(|x| x.abs() < 1e-13), "{m}x{n}");
            let whole = f.blocks.len() == 1;
            assert!(
                whole || n < WHOLE_PANEL_COLS,
                "{m}x{n}: {} blocks",
                f.blocks.len()
            );
        }
    }

    /// A factor of solves ([`Keep::Solves`]) makes, by replay, the bits of the factor kept
    /// whole, for blocks factored by one Cholesky QR step (normal values), by two (graded
    /// columns, κ about 10³), by shifted Cholesky QR (κ about 10¹⁰) and by Householder QR (a
    /// zero column), on fresh shapes.
    #[test]
    fn a_factor_of_solves_replays_the_kept_factors_bits() {
        let mut rng = crate::testing::Rng::fresh();
        for case in 0..4 {
            let n = 2 + rng.below(30);
            let m = 2 * block_rows(n) + rng.below(3 * block_rows(n));
            let mut a = random(m, n, rng.next());
            match case {
                1 => {
                    for j in 0..n {
                        let scale = 10f64.powf(-10.0 * j as f64 / (n - 1) as f64);
                        a.column_mut(j).mapv_inplace(|x| x * scale);
                    }
                }
                2 => a.column_mut(rng.below(n)).fill(0.0),
                3 => {
                    for j in 0..n {
                        let scale = 10f64.powf(-3.0 * j as f64 / (n - 1) as f64);
                        a.column_mut(j).mapv_inplace(|x| x * scale);
                    }
                }
                _ => {}
            }
            let fill = |r: Range<usize>, mut out: ArrayViewMut2<'_, f64>| {
                out.assign(&a.slice(s![r, ..]));
                Ok(())
            };
            let kept = PanelFactor::compute(m, n, Keep::Kept, fill).unwrap();
            let solves = PanelFactor::compute(m, n, Keep::Solves, fill).unwrap();
            assert!(solves.replays() && !kept.replays());
            assert!(solves.q.is_empty(), "a factor of solves keeps no Q");
            let how = solves.replay.as_ref().unwrap();
            let path = |p: fn(&Replay) -> bool| how.iter().any(p);
            match case {
                0 => assert!(path(|r| matches!(r, Replay::Solves(v) if v.is_empty()))),
                1 => assert!(path(|r| matches!(r, Replay::Solves(v) if v.len() == 2))),
                3 => assert!(path(|r| matches!(r, Replay::Solves(v) if v.len() == 1))),
                _ => assert!(path(|r| matches!(r, Replay::Householder))),
            }
            let bits = |x: &Array2<f64>| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&kept.r), bits(&solves.r), "case {case}, {m} × {n}: R");
            let c = random(kept.r.nrows(), 1 + rng.below(12), rng.next());
            let want = kept.apply(c.view());
            let mut got = Array2::zeros(want.raw_dim().f());
            solves.replay_into(fill, c.view(), got.view_mut()).unwrap();
            assert_eq!(bits(&want), bits(&got), "case {case}, {m} × {n}: Q·c");
        }
    }

    #[test]
    fn svd_signs_are_fixed() {
        let a = random(6, 4, 9);
        let (u, s, vt) = small_svd(a.view()).unwrap();
        for i in 0..vt.nrows() {
            let row = vt.row(i);
            let big = row
                .iter()
                .fold(0.0f64, |m, x| if x.abs() > m.abs() { *x } else { m });
            assert!(big > 0.0);
        }
        let back = (&u * &s).dot(&vt);
        assert!((&back - &a).iter().all(|x| x.abs() < 1e-13));
        assert!(s.windows(2).into_iter().all(|w| w[0] >= w[1]));
    }
}
