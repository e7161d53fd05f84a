//! PLINK 1 binary genotypes (`PREFIX.bed`, `.bim`, `.fam`): `pca --bed PREFIX`.
//!
//! # The format
//!
//! `.bed` starts with three bytes, `6c 1b 01` (the third says variant-major: one record per
//! variant), followed by one record per variant of ⌈samples / 4⌉ bytes, each sample's call
//! in two bits, the first sample in the lowest two bits of the first byte:
//!
//! | bits | call | dosage of the `.bim`'s first allele (A1, PLINK 2's ALT) |
//! |---|---|---|
//! | `00` | homozygous A1 | 2 |
//! | `01` | missing | −1 |
//! | `10` | heterozygous | 1 |
//! | `11` | homozygous A2 | 0 |
//!
//! The bits past the last sample of a record are padding. The `.bim` has one line per
//! variant and the `.fam` one per sample (its second column is the sample's ID): they give
//! the matrix's shape, which the `.bed`'s length must match exactly.
//!
//! # Why records are read, not mapped
//!
//! Every variant's record sits at a fixed offset, so any range of variants is one
//! positioned read (`pread`) into the reader's buffer: no chunk structure, and the
//! read-ahead's segments can be any number of rows ([`StoredPanels::partial_reads`]).

use std::io::{BufRead, BufReader};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use ndarray::ArrayViewMut2;

use crate::error::{BedError, SourceError};
use crate::panel::{ElementType, PanelBuffer, PanelValues, ReadStats, StoredPanels};
use crate::source::GenotypeSource;

/// `.bed`'s magic bytes, then its mode byte for variant-major records.
const MAGIC: [u8; 2] = [0x6c, 0x1b];
const VARIANT_MAJOR: u8 = 0x01;
const HEADER: u64 = 3;

/// Dosages of the four calls a byte holds, for every byte value.
const DOSAGES: [[i8; 4]; 256] = {
    let code = [2i8, -1, 1, 0];
    let mut t = [[0i8; 4]; 256];
    let mut b = 0;
    while b < 256 {
        let mut k = 0;
        while k < 4 {
            t[b][k] = code[(b >> (2 * k)) & 3];
            k += 1;
        }
        b += 1;
    }
    t
};

/// A PLINK 1 binary fileset of genotypes, read by variant ranges.
#[derive(Clone, Debug)]
pub struct BedGenotypes {
    bed: PathBuf,
    file: std::sync::Arc<std::fs::File>,
    variants: u64,
    samples: u64,
    sample_ids: Vec<String>,
    family_ids: Vec<String>,
}

/// The three paths of `prefix`, which may also be given as the `.bed` itself.
fn fileset(prefix: &Path) -> [PathBuf; 3] {
    let base = match prefix.extension().and_then(|e| e.to_str()) {
        Some("bed" | "bim" | "fam") => prefix.with_extension(""),
        _ => prefix.to_path_buf(),
    };
    ["bed", "bim", "fam"].map(|ext| {
        let mut p = base.clone().into_os_string();
        p.push(".");
        p.push(ext);
        PathBuf::from(p)
    })
}

fn open_text(path: &Path) -> Result<BufReader<std::fs::File>, BedError> {
    crate::files::open_regular(path)
        .map(|f| BufReader::with_capacity(1 << 20, f))
        .map_err(|source| BedError::Io {
            path: path.to_path_buf(),
            op: "open",
            source,
        })
}

fn read_error(path: &Path) -> impl FnOnce(std::io::Error) -> BedError + '_ {
    move |source| BedError::Io {
        path: path.to_path_buf(),
        op: "read",
        source,
    }
}

/// The non-blank lines of a text file, each passed to `each` with its number (from 1).
fn lines(path: &Path, mut each: impl FnMut(usize, &str)) -> Result<u64, BedError> {
    let mut count = 0u64;
    for (i, line) in open_text(path)?.lines().enumerate() {
        let line = line.map_err(read_error(path))?;
        if line.trim().is_empty() {
            continue;
        }
        each(i + 1, &line);
        count += 1;
    }
    Ok(count)
}

/// The non-blank lines of a `.bim`, counted in its bytes (up to 10⁸ of them, read by every
/// rank before it starts), checking each line's columns in the same scan: a line
/// without a variant ID, a base-pair position (digits) or both alleles is an error naming
/// the line. (Those columns were read only when the output was written: a broken `.bim`
/// passed a run without `--out`, and failed one with it at the end.)
fn count_bim_lines(path: &Path) -> Result<u64, BedError> {
    let mut reader = open_text(path)?;
    let (mut count, mut line_no) = (0u64, 1usize);
    // The current line: its fields so far, whether inside one, and whether the fourth
    // (the position) is digits so far.
    let (mut fields, mut inside, mut position_ok) = (0usize, false, true);
    let what = |fields: usize, position_ok: bool| -> Option<&'static str> {
        if fields < 2 {
            Some("no variant ID (second column)")
        } else if fields < 4 || !position_ok {
            Some("no base-pair position (fourth column)")
        } else if fields < 6 {
            Some("no alleles (fifth and sixth columns)")
        } else {
            None
        }
    };
    let bad = |no: usize, what: &str| BedError::Format {
        path: path.to_path_buf(),
        message: format!("line {no} has {what}"),
    };
    loop {
        let buf = reader.fill_buf().map_err(read_error(path))?;
        if buf.is_empty() {
            break;
        }
        for &b in buf {
            if b == b'\n' {
                if fields > 0 {
                    if let Some(what) = what(fields, position_ok) {
                        return Err(bad(line_no, what));
                    }
                    count += 1;
                }
                (fields, inside, position_ok) = (0, false, true);
                line_no += 1;
            } else if b.is_ascii_whitespace() {
                inside = false;
            } else {
                if !inside {
                    fields += 1;
                    inside = true;
                } else if fields == 4 && b == b'-' {
                    position_ok = false;
                }
                if fields == 4 && !(b.is_ascii_digit() || b == b'-') {
                    position_ok = false;
                }
            }
        }
        let n = buf.len();
        reader.consume(n);
    }
    if fields > 0 {
        if let Some(what) = what(fields, position_ok) {
            return Err(bad(line_no, what));
        }
        count += 1;
    }
    Ok(count)
}

impl BedGenotypes {
    /// Opens the fileset `PREFIX` (`PREFIX.bed`, `.bim`, `.fam`; `PREFIX.bed` also names
    /// it) and checks that the `.bed` is variant-major and exactly as long as the `.bim`'s
    /// variants and the `.fam`'s samples make it.
    pub fn open(prefix: &Path) -> Result<BedGenotypes, BedError> {
        let [bed, bim, fam] = fileset(prefix);
        let (mut sample_ids, mut family_ids) = (Vec::new(), Vec::new());
        let mut bad_fam = None;
        let samples = lines(&fam, |n, line| {
            let mut fields = line.split_whitespace();
            match (fields.next(), fields.next()) {
                (Some(fid), Some(iid)) => {
                    family_ids.push(fid.to_string());
                    sample_ids.push(iid.to_string());
                }
                _ => {
                    bad_fam.get_or_insert(n);
                }
            }
        })?;
        if let Some(n) = bad_fam {
            return Err(BedError::Format {
                path: fam,
                message: format!("line {n} has no second column (the sample ID)"),
            });
        }
        let variants = count_bim_lines(&bim)?;
        for (count, path, what) in [(samples, &fam, "samples"), (variants, &bim, "variants")] {
            if count == 0 {
                return Err(BedError::Format {
                    path: path.clone(),
                    message: format!("lists no {what}"),
                });
            }
        }
        let file = crate::files::open_regular(&bed).map_err(|source| BedError::Io {
            path: bed.clone(),
            op: "open",
            source,
        })?;
        let len = file
            .metadata()
            .map_err(|source| BedError::Io {
                path: bed.clone(),
                op: "stat",
                source,
            })?
            .len();
        let mut head = [0u8; 3];
        let got = if len >= HEADER {
            file.read_exact_at(&mut head, 0)
                .map_err(|source| BedError::Io {
                    path: bed.clone(),
                    op: "read the header",
                    source,
                })?;
            true
        } else {
            false
        };
        if !got || head[..2] != MAGIC {
            return Err(BedError::Format {
                path: bed,
                message: format!(
                    "not a PLINK .bed file (it starts {:02x?}, not 6c 1b)",
                    &head[..len.min(2) as usize]
                ),
            });
        }
        if head[2] != VARIANT_MAJOR {
            return Err(BedError::Format {
                path: bed,
                message: format!(
                    "mode byte {:#04x}: only variant-major .bed files (mode 0x01) are read; \
                     `plink --bfile PREFIX --make-bed` rewrites a sample-major one",
                    head[2]
                ),
            });
        }
        let record = samples.div_ceil(4);
        let want = HEADER + variants * record;
        if len != want {
            let why = if len < want {
                "truncated, or not this .bim's and .fam's"
            } else {
                "longer than that: not this .bim's and .fam's"
            };
            return Err(BedError::Format {
                path: bed,
                message: format!(
                    "{len} bytes, but {variants} variants ({}) × {samples} samples ({}) take \
                     {want} (3 + {variants} × {record}): {why}",
                    bim.display(),
                    fam.display()
                ),
            });
        }
        Ok(BedGenotypes {
            bed,
            file: std::sync::Arc::new(file),
            variants,
            samples,
            sample_ids,
            family_ids,
        })
    }

    /// Bytes per variant's record.
    fn record(&self) -> u64 {
        self.samples.div_ceil(4)
    }

    /// Reads the records of `rows` and writes their dosages into `out` (`rows.len() ×
    /// samples`, row-major), using `raw` for the records.
    fn decode(
        &self,
        rows: Range<u64>,
        raw: &mut Vec<u8>,
        out: &mut [i8],
    ) -> Result<u64, SourceError> {
        let record = self.record() as usize;
        let n = self.samples as usize;
        let bytes = (rows.end - rows.start) as usize * record;
        raw.clear();
        raw.resize(bytes, 0);
        self.file
            .read_exact_at(raw, HEADER + rows.start * record as u64)
            .map_err(|e| {
                SourceError::Bed(BedError::Io {
                    path: self.bed.clone(),
                    op: "read",
                    source: std::io::Error::new(
                        e.kind(),
                        format!("variants {}..{}: {e}", rows.start, rows.end),
                    ),
                })
            })?;
        for (rec, dst) in raw.chunks_exact(record).zip(out.chunks_exact_mut(n)) {
            let (whole, tail) = dst.split_at_mut(n / 4 * 4);
            for (b, d4) in rec.iter().zip(whole.chunks_exact_mut(4)) {
                d4.copy_from_slice(&DOSAGES[*b as usize]);
            }
            if !tail.is_empty() {
                let last = DOSAGES[rec[record - 1] as usize];
                tail.copy_from_slice(&last[..tail.len()]);
            }
        }
        Ok(bytes as u64)
    }
}

impl StoredPanels for BedGenotypes {
    fn chunk_rows(&self) -> u64 {
        1
    }

    /// Panels of at most 128 MiB of dosages, and at least 64 panels where there are enough
    /// variants, so that every actor of a job gets some.
    fn default_panel_rows(&self) -> u64 {
        ((128u64 << 20) / self.samples.max(1))
            .min(self.variants.div_ceil(64))
            .max(1)
    }

    fn element_type(&self) -> ElementType {
        ElementType::I8
    }

    fn partial_reads(&self) -> bool {
        true
    }

    fn buffer_bytes(&self, rows: u64) -> u64 {
        // The dosages and the records they were decoded from.
        rows * (self.samples + self.record())
    }

    fn stored_bytes(&self, rows: Range<u64>) -> u64 {
        (rows.end.min(self.variants).saturating_sub(rows.start)) * self.record()
    }

    fn read_panel(
        &self,
        rows: Range<u64>,
        buf: &mut PanelBuffer,
    ) -> Result<ReadStats, SourceError> {
        if rows.start >= rows.end || rows.end > self.variants {
            return Err(SourceError::OutOfBounds {
                rows,
                cols: self.samples as usize,
                shape: (self.variants, self.samples),
                what: self.bed.display().to_string(),
            });
        }
        let h = (rows.end - rows.start) as usize;
        let len = h * self.samples as usize;
        buf.rows = h;
        buf.cols = self.samples as usize;
        buf.values.resize(ElementType::I8, len);
        let PanelValues::I8(dst) = &mut buf.values else {
            unreachable!("resized to i8")
        };
        // The records land in the reader's byte scratch, kept from panel to panel.
        let stored = self.decode(rows, &mut buf.scratch.mask, dst)?;
        Ok(ReadStats {
            chunks: h as u64,
            stored_bytes: stored,
            decoded_bytes: len as u64,
        })
    }
}

impl GenotypeSource for BedGenotypes {
    fn shape(&self) -> (u64, u64) {
        (self.variants, self.samples)
    }

    fn fill_dosages(
        &self,
        rows: Range<u64>,
        mut out: ArrayViewMut2<'_, i8>,
    ) -> Result<(), SourceError> {
        let (m, n) = (self.variants, self.samples);
        if rows.start > rows.end
            || rows.end > m
            || out.dim() != ((rows.end - rows.start) as usize, n as usize)
        {
            return Err(SourceError::OutOfBounds {
                rows,
                cols: out.ncols(),
                shape: (m, n),
                what: self.bed.display().to_string(),
            });
        }
        if rows.is_empty() {
            return Ok(());
        }
        let mut raw = Vec::new();
        match out.as_slice_mut() {
            Some(dst) => self.decode(rows, &mut raw, dst).map(|_| ()),
            None => {
                let mut tmp = vec![0i8; out.len()];
                self.decode(rows, &mut raw, &mut tmp)?;
                for (d, s) in out.iter_mut().zip(tmp) {
                    *d = s;
                }
                Ok(())
            }
        }
    }

    fn describe(&self) -> String {
        format!(
            "PLINK .bed {} ({} variants × {} samples, variant-major)",
            self.bed.display(),
            self.variants,
            self.samples
        )
    }

    fn sample_ids(&self) -> Option<Vec<String>> {
        Some(self.sample_ids.clone())
    }

    /// The `.fam`'s first column.
    fn family_ids(&self) -> Option<Vec<String>> {
        Some(self.family_ids.clone())
    }

    /// The `.bim`'s second column.
    fn variant_ids(&self, each: &mut dyn FnMut(Option<&str>)) -> Result<bool, SourceError> {
        self.bim_column(1, "variant ID (second column)", each)
    }

    /// The fourth column (base-pair coordinate).
    fn variant_positions(&self, each: &mut dyn FnMut(i64)) -> Result<bool, SourceError> {
        self.bim_lines("base-pair position (fourth column)", |line| {
            match line.split_whitespace().nth(3).map(str::parse::<i64>) {
                Some(Ok(p)) => {
                    each(p);
                    true
                }
                _ => false,
            }
        })
    }

    /// A1 (the fifth column, whose copies the dosages count) and A2 (the sixth).
    fn variant_alleles(&self, each: &mut dyn FnMut(&str, &str)) -> Result<bool, SourceError> {
        self.bim_lines("alleles (fifth and sixth columns)", |line| {
            let mut f = line.split_whitespace().skip(4);
            match (f.next(), f.next()) {
                (Some(a1), Some(a2)) => {
                    each(a1, a2);
                    true
                }
                _ => false,
            }
        })
    }

    fn variant_chromosomes(&self, each: &mut dyn FnMut(&str)) -> Result<bool, SourceError> {
        self.bim_column(0, "chromosome (first column)", &mut |c| {
            each(c.unwrap_or(""))
        })
    }

    fn stored(&self) -> Option<&dyn StoredPanels> {
        Some(self)
    }
}

impl BedGenotypes {
    /// Passes column `column` of every `.bim` line to `each` (`None` where a line lacks
    /// it, which is then an error naming the line and `what`).
    fn bim_column(
        &self,
        column: usize,
        what: &str,
        each: &mut dyn FnMut(Option<&str>),
    ) -> Result<bool, SourceError> {
        self.bim_lines(what, |line| {
            let field = line.split_whitespace().nth(column);
            each(field);
            field.is_some()
        })
    }

    /// Passes every `.bim` line to `each`, which says whether the line has what it reads
    /// (`what`): the first that does not is an error naming its line, as is a `.bim` whose
    /// count of variants changed since the fileset was opened.
    fn bim_lines(
        &self,
        what: &str,
        mut each: impl FnMut(&str) -> bool,
    ) -> Result<bool, SourceError> {
        let bim = &fileset(&self.bed)[1];
        let mut bad = None;
        let count = lines(bim, |no, line| {
            if !each(line) {
                bad.get_or_insert(no);
            }
        })?;
        let message = match bad {
            Some(no) => format!("line {no} has no {what}"),
            None if count != self.variants => format!(
                "{count} variants now, {} when the fileset was opened",
                self.variants
            ),
            None => return Ok(true),
        };
        Err(BedError::Format {
            path: bim.clone(),
            message,
        }
        .into())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Writes a fileset `dir/g` of `dosages` (variants × samples, −1 missing) the way PLINK
    /// lays it out, variants named `v{i}` and samples `s{j}`, and returns its prefix.
    pub(crate) fn write(dir: &Path, dosages: &[Vec<i8>]) -> PathBuf {
        let prefix = dir.join("g");
        let n = dosages[0].len();
        let mut bed = vec![0x6c, 0x1b, 0x01];
        for row in dosages {
            let mut rec = vec![0u8; n.div_ceil(4)];
            for (j, &d) in row.iter().enumerate() {
                let code = match d {
                    2 => 0b00,
                    -1 => 0b01,
                    1 => 0b10,
                    _ => 0b11,
                };
                rec[j / 4] |= code << (2 * (j % 4));
            }
            // PLINK leaves the padding bits zero; any value must be ignored.
            if !n.is_multiple_of(4) {
                *rec.last_mut().unwrap() |= 0b11 << 6;
            }
            bed.extend(rec);
        }
        std::fs::write(prefix.with_extension("bed"), bed).unwrap();
        let bim: String = (0..dosages.len())
            .map(|i| format!("1\tv{i}\t0\t{}\tA\tG\n", i + 1))
            .collect();
        std::fs::write(prefix.with_extension("bim"), bim).unwrap();
        let fam: String = (0..n).map(|j| format!("f{j} s{j} 0 0 0 -9\n")).collect();
        std::fs::write(prefix.with_extension("fam"), fam).unwrap();
        prefix
    }

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rankwise-bed-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn draw(variants: usize, samples: usize, seed: u64) -> Vec<Vec<i8>> {
        let mut s = seed;
        (0..variants)
            .map(|_| {
                (0..samples)
                    .map(|_| {
                        s = crate::source::mix64(s.wrapping_add(0x9E37_79B9_7F4A_7C15));
                        [-1i8, 0, 1, 2][(s % 4) as usize]
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn records_decode_to_the_dosages_written_for_every_sample_count() {
        for samples in 1..=9 {
            let dir = scratch(&format!("decode-{samples}"));
            let want = draw(7, samples, samples as u64);
            let prefix = write(&dir, &want);
            let g = BedGenotypes::open(&prefix).unwrap();
            assert_eq!(GenotypeSource::shape(&g), (7, samples as u64));
            assert_eq!(
                g.sample_ids().unwrap()[samples - 1],
                format!("s{}", samples - 1)
            );
            assert_eq!(
                g.family_ids().unwrap()[samples - 1],
                format!("f{}", samples - 1)
            );
            let mut out = ndarray::Array2::<i8>::zeros((4, samples));
            g.fill_dosages(2..6, out.view_mut()).unwrap();
            for i in 0..4 {
                assert_eq!(
                    out.row(i).to_vec(),
                    want[2 + i],
                    "{samples} samples, row {i}"
                );
            }
            let mut buf = PanelBuffer::default();
            let stats = g.read_panel(0..7, &mut buf).unwrap();
            assert_eq!(stats.stored_bytes, 7 * samples.div_ceil(4) as u64);
            let d = buf.dosages().unwrap();
            assert_eq!(d, want.concat().as_slice());
            // The `.bed` path names the same fileset.
            assert!(BedGenotypes::open(&prefix.with_extension("bed")).is_ok());
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// The `.bim`'s second column, in order, blank lines skipped; a line without one, or a
    /// `.bim` changed since the fileset was opened, is an error naming the `.bim`.
    #[test]
    fn variant_chromosomes_are_the_bims_first_column() {
        let dir = scratch("chroms");
        let prefix = write(&dir, &draw(4, 6, 2));
        let bim = prefix.with_extension("bim");
        let text = std::fs::read_to_string(&bim).unwrap();
        let renamed = text
            .replace("1\tv1\t", "chr2\tv1\t")
            .replace("1\tv3\t", "X\tv3\t");
        std::fs::write(&bim, renamed).unwrap();
        let g = BedGenotypes::open(&prefix).unwrap();
        let mut names = Vec::new();
        assert!(g
            .variant_chromosomes(&mut |c| names.push(c.to_owned()))
            .unwrap());
        assert_eq!(names, ["1", "chr2", "1", "X"]);
        std::fs::write(&bim, format!("{text}1\tv4\t0\t5\tA\tG\n")).unwrap();
        let e = g.variant_chromosomes(&mut |_| {}).unwrap_err().to_string();
        assert!(e.contains("5 variants now, 4 when"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn variant_ids_are_the_bims_second_column() {
        let dir = scratch("ids");
        let prefix = write(&dir, &draw(5, 6, 1));
        let g = BedGenotypes::open(&prefix).unwrap();
        let mut ids = Vec::new();
        assert!(g
            .variant_ids(&mut |id| ids.push(id.map(str::to_owned)))
            .unwrap());
        let want: Vec<_> = (0..5).map(|i| Some(format!("v{i}"))).collect();
        assert_eq!(ids, want);
        let bim = prefix.with_extension("bim");
        let text = std::fs::read_to_string(&bim).unwrap();
        std::fs::write(
            &bim,
            text.replace("1\tv2\t0\t3\tA\tG\n", "\n1\tv2\t0\t3\tA\tG\n\n"),
        )
        .unwrap();
        ids.clear();
        assert!(g
            .variant_ids(&mut |id| ids.push(id.map(str::to_owned)))
            .unwrap());
        assert_eq!(ids, want, "blank lines");
        for (broken, says) in [
            (
                text.replace("1\tv3\t0\t4\tA\tG", "1"),
                "line 4 has no variant ID",
            ),
            (
                format!("{text}1\tv5\t0\t6\tA\tG\n"),
                "6 variants now, 5 when",
            ),
        ] {
            std::fs::write(&bim, broken).unwrap();
            let err = g.variant_ids(&mut |_| {}).unwrap_err().to_string();
            assert!(
                err.contains(&bim.display().to_string()) && err.contains(says),
                "{err}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn bim_lines_are_counted_as_the_fam_lines_are_read_and_checked() {
        let dir = scratch("count");
        let v = "1 v 0 10 A G";
        for text in [
            String::new(),
            "\n\n".into(),
            format!("{v}\n"),
            v.into(),
            format!("{v}\n\n  \n{v}"),
            format!("{v}\r\n{v}\r\n"),
            format!(" {v} \n\t{v}\n\n"),
        ] {
            let p = dir.join("t");
            std::fs::write(&p, &text).unwrap();
            let want = lines(&p, |_, _| {}).unwrap();
            assert_eq!(count_bim_lines(&p).unwrap(), want, "{text:?}");
        }
        for (line, what) in [
            ("1", "no variant ID"),
            ("1 v 0", "no base-pair position"),
            ("1 v 0 abc A G", "no base-pair position"),
            ("1 v 0 1-2 A G", "no base-pair position"),
            ("1 v 0 10 A", "no alleles"),
        ] {
            let p = dir.join("t");
            std::fs::write(&p, format!("{v}\n\n{line}\n{v}\n")).unwrap();
            let e = count_bim_lines(&p).unwrap_err().to_string();
            assert!(e.contains(&format!("line 3 has {what}")), "{line:?}: {e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn bad_filesets_are_refused_naming_the_file() {
        let dir = scratch("bad");
        let prefix = write(&dir, &draw(5, 10, 3));
        let bed = prefix.with_extension("bed");
        let good = std::fs::read(&bed).unwrap();
        let err = |bytes: &[u8]| {
            std::fs::write(&bed, bytes).unwrap();
            BedGenotypes::open(&prefix).unwrap_err().to_string()
        };
        let e = err(&good[..good.len() - 1]);
        assert!(e.contains("g.bed: 17 bytes, but 5 variants"), "{e}");
        assert!(e.contains("truncated"), "{e}");
        let e = err(&[&[0x6c, 0x1b, 0x00], &good[3..]].concat());
        assert!(e.contains("g.bed: mode byte 0x00"), "{e}");
        let e = err(b"#fileformat=VCF");
        assert!(e.contains("g.bed: not a PLINK .bed file"), "{e}");
        let e = err(&[0x6c]);
        assert!(e.contains("not a PLINK .bed file"), "{e}");
        std::fs::write(&bed, &good).unwrap();
        std::fs::write(prefix.with_extension("fam"), "onlyone\n").unwrap();
        let e = BedGenotypes::open(&prefix).unwrap_err().to_string();
        assert!(e.contains("g.fam: line 1 has no second column"), "{e}");
        std::fs::remove_file(prefix.with_extension("fam")).unwrap();
        let e = BedGenotypes::open(&prefix).unwrap_err().to_string();
        assert!(e.contains("g.fam: open: "), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
