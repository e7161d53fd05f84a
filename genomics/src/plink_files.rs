//! PLINK 2 compatible `.eigenvec` / `.eigenval` text files of a PCA.
//!
//! The genotype matrix is variants × samples, so the principal components are per sample:
//! `pcs` is always `n_samples × k`.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use ndarray::ArrayView2;

/// An error writing one of the PCA output files; every variant names the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum PcaFileError {
    /// Creating or writing the file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file being written.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: io::Error,
    },
    /// Two inputs that must describe the same samples have different lengths.
    #[error("{}: {what}: expected {expected}, got {found}", path.display())]
    LengthMismatch {
        /// The file that was to be written.
        path: PathBuf,
        /// Which input has the wrong length.
        what: &'static str,
        /// The length implied by the other input.
        expected: usize,
        /// The length found.
        found: usize,
    },
    /// A sample ID that cannot be written to a whitespace-delimited PLINK file.
    #[error(
        "{}: sample {index} has ID {id:?}, which is empty or contains whitespace",
        path.display()
    )]
    InvalidSampleId {
        /// The file that was to be written.
        path: PathBuf,
        /// Position of the sample in `sample_ids`.
        index: usize,
        /// The offending ID.
        id: String,
    },
    /// The principal-component matrix has no columns, so there is nothing to plot.
    #[error("{}: no principal components to plot", path.display())]
    NoComponents {
        /// The plot file that was to be written.
        path: PathBuf,
    },
    /// Drawing or encoding the plot failed.
    #[error("{}: plotting failed: {message}", path.display())]
    Plot {
        /// The plot file being written.
        path: PathBuf,
        /// The plotting backend's error, as text.
        message: String,
    },
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> PcaFileError + '_ {
    move |source| PcaFileError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Creates `path`, lets `body` write to it through a buffer, and flushes, naming `path` on error.
fn write_text(
    path: &Path,
    body: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>,
) -> Result<(), PcaFileError> {
    let file = File::create(path).map_err(io_error(path))?;
    let mut out = BufWriter::new(file);
    body(&mut out).map_err(io_error(path))?;
    out.flush().map_err(io_error(path))?;
    out.into_inner()
        .map_err(|e| io_error(path)(e.into_error()))?
        .sync_all()
        .map_err(io_error(path))
}

/// Writes a PLINK 2 compatible `.eigenvec` file.
///
/// The first line is `#FID\tIID\tPC1\tPC2…\tPCk` where `family_ids` are given (as `plink2
/// --pca` writes them for a `.fam` input), else `#IID\tPC1…` (as for a VCF); then one
/// tab-separated line per sample: its IDs and its `k` component values. `pcs` is
/// `n_samples × k`, row `i` belonging to `sample_ids[i]`. Values are written with Rust's
/// shortest round-trip `Display` for `f64` (plain decimal, as PLINK 2 writes), so parsing
/// the file back gives the exact same `f64`s.
///
/// # Errors
/// [`PcaFileError::LengthMismatch`] if `sample_ids.len()` (or `family_ids.len()`) is not
/// the number of rows of `pcs`, [`PcaFileError::InvalidSampleId`] for an empty ID or one
/// containing whitespace, and [`PcaFileError::Io`] if the file cannot be created or
/// written. Nothing is written on the first two.
pub fn write_eigenvec(
    path: &Path,
    family_ids: Option<&[String]>,
    sample_ids: &[String],
    pcs: ArrayView2<'_, f64>,
) -> Result<(), PcaFileError> {
    let columns = [
        (
            "number of sample IDs (rows of the PC matrix)",
            Some(sample_ids),
        ),
        ("number of family IDs (rows of the PC matrix)", family_ids),
    ];
    for (what, ids) in columns {
        let Some(ids) = ids else { continue };
        if ids.len() != pcs.nrows() {
            return Err(PcaFileError::LengthMismatch {
                path: path.to_path_buf(),
                what,
                expected: pcs.nrows(),
                found: ids.len(),
            });
        }
        if let Some((index, id)) = ids
            .iter()
            .enumerate()
            .find(|(_, id)| id.is_empty() || id.chars().any(char::is_whitespace))
        {
            return Err(PcaFileError::InvalidSampleId {
                path: path.to_path_buf(),
                index,
                id: id.clone(),
            });
        }
    }
    write_text(path, |out| {
        write!(
            out,
            "{}",
            if family_ids.is_some() {
                "#FID\tIID"
            } else {
                "#IID"
            }
        )?;
        for c in 1..=pcs.ncols() {
            write!(out, "\tPC{c}")?;
        }
        writeln!(out)?;
        for (i, (id, row)) in sample_ids.iter().zip(pcs.rows()).enumerate() {
            if let Some(f) = family_ids {
                write!(out, "{}\t", f[i])?;
            }
            write!(out, "{id}")?;
            for v in row {
                write!(out, "\t{v}")?;
            }
            writeln!(out)?;
        }
        Ok(())
    })
}

/// Writes a PLINK 2 style `.eigenval` file: one eigenvalue per line, in the given order, with
/// Rust's shortest round-trip `Display` for `f64`.
///
/// # Errors
/// [`PcaFileError::Io`] if the file cannot be created or written.
pub fn write_eigenval(path: &Path, eigenvalues: &[f64]) -> Result<(), PcaFileError> {
    write_text(path, |out| {
        for v in eigenvalues {
            writeln!(out, "{v}")?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fresh, uniquely named directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            static COUNTER: AtomicUsize = AtomicUsize::new(0);
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!(
                "rankwise-plink-files-{}-{tag}-{n}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("create temp dir");
            TempDir(dir)
        }
        fn join(&self, name: &str) -> PathBuf {
            self.0.join(name)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Awkward values: tiny, huge, negative zero, irrational-ish, subnormal.
    fn sample_pcs(n: usize, k: usize) -> Array2<f64> {
        Array2::from_shape_fn((n, k), |(i, j)| {
            let base = ((i * 7 + j * 13) as f64 + 0.1).sqrt() * if i % 2 == 0 { 1.0 } else { -1.0 };
            match (i + j) % 5 {
                0 => base / 3.0,
                1 => base * 1e-300,
                2 => base * 1e300,
                3 => base / 7.0e5,
                _ => base,
            }
        })
    }

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("sample_{i}")).collect()
    }

    #[test]
    fn eigenvec_round_trips_bit_exactly() {
        let dir = TempDir::new("eigenvec");
        let path = dir.join("out.eigenvec");
        let mut pcs = sample_pcs(6, 3);
        pcs[[0, 0]] = -0.0;
        pcs[[1, 1]] = f64::MIN_POSITIVE / 4.0;
        pcs[[2, 2]] = 0.1 + 0.2;
        let sample_ids = ids(6);
        write_eigenvec(&path, None, &sample_ids, pcs.view()).expect("write eigenvec");

        let text = std::fs::read_to_string(&path).expect("read back");
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("#IID\tPC1\tPC2\tPC3"));
        let mut rows = 0;
        for (i, line) in lines.enumerate() {
            let fields: Vec<&str> = line.split('\t').collect();
            assert_eq!(fields.len(), 4, "line {line:?}");
            assert_eq!(fields[0], sample_ids[i]);
            for (j, field) in fields[1..].iter().enumerate() {
                let v: f64 = field.parse().expect("parse value");
                assert_eq!(v.to_bits(), pcs[[i, j]].to_bits(), "row {i} col {j}");
            }
            rows += 1;
        }
        assert_eq!(rows, 6);
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn eigenval_round_trips_bit_exactly() {
        let dir = TempDir::new("eigenval");
        let path = dir.join("out.eigenval");
        let values = [123.456789012345, 1.0 / 3.0, 2.5e-17, 7.0, 0.0];
        write_eigenval(&path, &values).expect("write eigenval");
        let text = std::fs::read_to_string(&path).expect("read back");
        let parsed: Vec<f64> = text
            .lines()
            .map(|l| l.parse().expect("parse value"))
            .collect();
        assert_eq!(parsed.len(), values.len());
        for (a, b) in parsed.iter().zip(&values) {
            assert_eq!(a.to_bits(), b.to_bits());
        }
    }

    #[test]
    fn eigenvec_rejects_mismatched_lengths() {
        let dir = TempDir::new("mismatch");
        let path = dir.join("out.eigenvec");
        let err = write_eigenvec(&path, None, &ids(4), sample_pcs(5, 2).view()).unwrap_err();
        assert!(
            matches!(
                err,
                PcaFileError::LengthMismatch {
                    expected: 5,
                    found: 4,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("out.eigenvec"), "{err}");
        assert!(!path.exists(), "nothing written on a length mismatch");
    }

    #[test]
    fn eigenvec_rejects_whitespace_ids() {
        let dir = TempDir::new("badid");
        let path = dir.join("out.eigenvec");
        let mut sample_ids = ids(3);
        sample_ids[1] = "a b".to_string();
        let err = write_eigenvec(&path, None, &sample_ids, sample_pcs(3, 2).view()).unwrap_err();
        assert!(
            matches!(err, PcaFileError::InvalidSampleId { index: 1, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("out.eigenvec"), "{err}");
    }
}
