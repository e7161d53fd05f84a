//! BLAS for the passes' element types: `c = op(a)·b + beta·c`, row-major, by the skinny
//! kernels where an operand is narrow ([`crate::skinny`] says why) and by OpenBLAS
//! otherwise.

use cblas_sys::{cblas_dgemm, cblas_sgemm, CBLAS_LAYOUT, CBLAS_TRANSPOSE};
use ndarray::{ArrayView2, ArrayViewMut2};

use crate::real::Real;

/// The GEMM of an element type.
pub trait Blas: Real {
    /// `c = op(a)·b + beta·c` by BLAS, all row-major with the given leading dimensions.
    ///
    /// # Safety
    /// The pointers and leading dimensions must describe valid row-major matrices of the
    /// given shapes, `c` exclusively.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm(
        trans_a: bool,
        m: usize,
        n: usize,
        k: usize,
        a: *const Self,
        lda: usize,
        b: *const Self,
        ldb: usize,
        beta: Self,
        c: *mut Self,
        ldc: usize,
    );
}

/// `Blas` for an element type whose BLAS GEMM is `$cblas`: the two impls differ in that
/// call only.
macro_rules! impl_blas {
    ($t:ty, $cblas:ident) => {
        impl Blas for $t {
            unsafe fn gemm(
                trans_a: bool,
                m: usize,
                n: usize,
                k: usize,
                a: *const $t,
                lda: usize,
                b: *const $t,
                ldb: usize,
                beta: $t,
                c: *mut $t,
                ldc: usize,
            ) {
                // A narrow operand goes to the skinny kernels where they run (see
                // `crate::skinny` for why).
                // SAFETY (all calls): the caller's contract.
                let done = crate::skinny::isa().is_some_and(|isa| unsafe {
                    if trans_a {
                        crate::skinny::atb(isa, m, n, k, a, lda, b, ldb, beta, c, ldc)
                    } else {
                        crate::skinny::ab(isa, m, n, k, a, lda, b, ldb, beta, c, ldc)
                    }
                });
                if done {
                    return;
                }
                unsafe {
                    $cblas(
                        CBLAS_LAYOUT::CblasRowMajor,
                        trans(trans_a),
                        CBLAS_TRANSPOSE::CblasNoTrans,
                        m as i32,
                        n as i32,
                        k as i32,
                        1.0,
                        a,
                        lda as i32,
                        b,
                        ldb as i32,
                        beta,
                        c,
                        ldc as i32,
                    )
                }
            }
        }
    };
}

impl_blas!(f64, cblas_dgemm);
impl_blas!(f32, cblas_sgemm);

fn trans(t: bool) -> CBLAS_TRANSPOSE {
    if t {
        CBLAS_TRANSPOSE::CblasTrans
    } else {
        CBLAS_TRANSPOSE::CblasNoTrans
    }
}

/// Row stride of a row-major view (its rows contiguous).
fn row_major<T>(a: &ArrayView2<'_, T>) -> Option<usize> {
    let st = a.strides();
    (st[1] == 1 || a.ncols() <= 1).then(|| (st[0].max(1) as usize).max(a.ncols()))
}

/// `c = op(a)·b + beta·c` for row-major views (`op(a) = aᵀ` with `trans_a`).
pub fn gemm<T: Blas>(
    trans_a: bool,
    a: ArrayView2<'_, T>,
    b: ArrayView2<'_, T>,
    beta: T,
    mut c: ArrayViewMut2<'_, T>,
) {
    let (m, k) = if trans_a {
        (a.ncols(), a.nrows())
    } else {
        (a.nrows(), a.ncols())
    };
    let n = b.ncols();
    assert_eq!(b.nrows(), k, "GEMM inner dimensions");
    assert_eq!(c.dim(), (m, n), "GEMM output shape");
    if m == 0 || n == 0 {
        return;
    }
    let c_row_major = c.strides()[1] == 1 || n == 1;
    match (row_major(&a), row_major(&b), c_row_major) {
        (Some(lda), Some(ldb), true) if k > 0 => {
            let ldc = (c.strides()[0].max(1) as usize).max(n);
            // SAFETY: the shapes and leading dimensions describe the three row-major views
            // exactly (checked above), and the output view is exclusively borrowed.
            unsafe {
                T::gemm(
                    trans_a,
                    m,
                    n,
                    k,
                    a.as_ptr(),
                    lda,
                    b.as_ptr(),
                    ldb,
                    beta,
                    c.as_mut_ptr(),
                    ldc,
                )
            }
        }
        _ => {
            // Not reached by the passes (their operands are row-major); kept correct anyway.
            let prod = if trans_a { a.t().dot(&b) } else { a.dot(&b) };
            c.zip_mut_with(&prod, |x, &p| *x = *x * beta + p);
        }
    }
}
