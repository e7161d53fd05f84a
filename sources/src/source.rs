//! Chunk sources: where a panel's values come from.
//!
//! # The generator
//!
//! [`Generated`] is counter-based: the value at global `(row, col)` is a pure function of
//! `(seed, row, col)`. Values come from the block streams of [`crate::stream`]: fixed global
//! blocks of 256 columns of a row, each a short multiply-free stream seeded by hashing the
//! block's counter, so a panel can be regenerated in any pass, by any actor on any rank or
//! device, and the values never depend on placement, chunking or rank count. Normal values
//! use the ziggurat of `rand_distr` fed by a short SplitMix64 stream started from the
//! element's word.
//!
//! # Genotypes with population structure
//!
//! Genotype row `i` is a variant with an ancestral allele frequency `p_i`. With
//! [`Generated::with_populations`] the samples are split into `k` contiguous blocks of
//! (nearly) equal size, and population `q` draws its own frequency from the Balding–Nichols
//! model, `p_iq ~ Beta(p_i(1−F)/F, (1−p_i)(1−F)/F)`: mean `p_i`, variance `F·p_i(1−p_i)`,
//! where `F` is Wright's fixation index F_ST. The Beta draw is fed by a stream derived from
//! `(seed, i, q)` by the counter hash, so it too is the same wherever it is made.
//! Contiguous blocks keep each row a few long runs of one frequency, which the vectorized
//! fill handles as it handles a whole row without structure.

use std::convert::Infallible;
use std::ops::Range;

use ndarray::{ArrayView2, ArrayViewMut2};
use rand_distr::{Beta, Distribution, StandardNormal};

use crate::error::SourceError;
use crate::panel::StoredPanels;

use crate::stream::{self, allele_threshold, counter_bits, Thresholds};
pub(crate) use crate::stream::{mix64, GAMMA, MAX_GENERATED_COLS, MAX_GENERATED_ROWS};

/// Maps the top 53 bits of `x` to a uniform f64 in [0, 1).
#[inline(always)]
pub(crate) fn unit_f64(x: u64) -> f64 {
    (x >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Distribution of generated values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dist {
    /// Uniform in [0, 1), like `da.random.random`.
    Uniform,
    /// Standard normal.
    Normal,
    /// Genotype dosages 0, 1, 2: row `i` is a variant with allele frequency
    /// `p_i ∈ [0.05, 0.5)` and each entry is Binomial(2, p_i).
    Genotype,
}

impl std::str::FromStr for Dist {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "uniform" => Ok(Dist::Uniform),
            "normal" => Ok(Dist::Normal),
            "genotype" => Ok(Dist::Genotype),
            other => Err(format!(
                "unknown distribution `{other}` (expected uniform, normal or genotype)"
            )),
        }
    }
}

impl std::fmt::Display for Dist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Dist::Uniform => "uniform",
            Dist::Normal => "normal",
            Dist::Genotype => "genotype",
        })
    }
}

/// A matrix whose row panels can be produced on demand, by any actor, any number of times.
pub trait PanelSource: Send + Sync {
    /// Shape `(rows, cols)` of the matrix this source yields (after any transposition).
    fn shape(&self) -> (u64, u64);
    /// Writes rows `rows` (all columns) into `out`, which has `rows.len()` rows and
    /// `shape().1` columns in any memory layout.
    fn fill(&self, rows: Range<u64>, out: ArrayViewMut2<'_, f64>) -> Result<(), SourceError>;
    /// Writes rows `rows`, columns `cols` into `out` (`rows.len() × cols.len()`, any
    /// layout): the tile the randomized passes multiply while it is still in cache. The
    /// default fills whole rows into a temporary and copies the tile out; sources that can
    /// produce a tile directly override it.
    fn fill_cols(
        &self,
        rows: Range<u64>,
        cols: Range<u64>,
        mut out: ArrayViewMut2<'_, f64>,
    ) -> Result<(), SourceError> {
        let (m, n) = PanelSource::shape(self);
        if cols.start > cols.end || cols.end > n || rows.end > m || rows.start > rows.end {
            return Err(SourceError::OutOfBounds {
                rows,
                cols: out.ncols(),
                shape: (m, n),
                what: PanelSource::describe(self),
            });
        }
        let mut whole = ndarray::Array2::zeros(((rows.end - rows.start) as usize, n as usize));
        self.fill(rows, whole.view_mut())?;
        out.assign(&whole.slice(ndarray::s![.., cols.start as usize..cols.end as usize]));
        Ok(())
    }
    /// [`PanelSource::fill_cols`] rounded to f32 (each value is the f64 value rounded). The
    /// default converts from an f64 tile; sources that can produce f32 directly override it.
    fn fill_cols_f32(
        &self,
        rows: Range<u64>,
        cols: Range<u64>,
        out: ArrayViewMut2<'_, f32>,
    ) -> Result<(), SourceError> {
        fill_cols_f32_rounded(self, rows, cols, out)
    }
    /// Rows `rows` (all columns) as a view of values this source already holds in memory,
    /// each row contiguous, for the passes to multiply where they lie instead of copying
    /// them into tiles first; `None` (the default) for a source that produces its values,
    /// or holds them in another layout.
    fn rows_in_memory(&self, rows: Range<u64>) -> Option<ArrayView2<'_, f64>> {
        let _ = rows;
        None
    }
    /// As [`PanelSource::rows_in_memory`], for a source that holds f32 values.
    fn rows_in_memory_f32(&self, rows: Range<u64>) -> Option<ArrayView2<'_, f32>> {
        let _ = rows;
        None
    }
    /// Short description for reports and errors.
    fn describe(&self) -> String;
    /// Where the value at (`row`, `col`) is stored, for errors about that value: the
    /// file, chunk or record that holds it. The default is the source's description.
    fn locate(&self, row: u64, col: u64) -> String {
        let _ = (row, col);
        self.describe()
    }
    /// True when producing a panel again costs less than keeping it in memory (a generator
    /// that outruns page faults on fresh memory): the plans then never make it resident.
    fn cheaper_to_reproduce(&self) -> bool {
        false
    }
    /// Storage-backed sources decode whole panels (bands of stored chunks); the kernels
    /// then read each panel once and cut tiles from it instead of calling `fill_cols`.
    fn stored(&self) -> Option<&dyn StoredPanels> {
        None
    }
    /// Whether the values are held as f32 (a float32 store, or a caller's f32 array):
    /// the passes then default to f32 tiles.
    fn holds_f32(&self) -> bool {
        self.stored()
            .is_some_and(|s| s.element_type() == crate::ElementType::F32)
    }
    /// Panel rows when the caller gives none: one band of stored chunks
    /// ([`StoredPanels::default_panel_rows`]), or every row for a source that produces
    /// any rows on demand (the plan splits them to fit the budget).
    fn preferred_panel_rows(&self) -> u64 {
        self.stored()
            .map_or(PanelSource::shape(self).0, |s| s.default_panel_rows())
    }
    /// The generator behind this source, when it is one: a GPU actor then produces the
    /// panels on its device instead of on the host.
    fn generated(&self) -> Option<&Generated> {
        None
    }
}

/// [`PanelSource::fill_cols_f32`] through an f64 tile: `src.fill_cols` (whose errors name
/// what is wrong), each value then rounded. The default, and the fallback of sources that
/// round directly only in some layouts.
pub fn fill_cols_f32_rounded<S: PanelSource + ?Sized>(
    src: &S,
    rows: Range<u64>,
    cols: Range<u64>,
    mut out: ArrayViewMut2<'_, f32>,
) -> Result<(), SourceError> {
    let mut tile = ndarray::Array2::<f64>::zeros(out.dim());
    src.fill_cols(rows, cols, tile.view_mut())?;
    out.zip_mut_with(&tile, |o, &v| *o = v as f32);
    Ok(())
}

/// A genotype matrix: variants (rows) × samples (columns) of dosages 0, 1, 2, with −1 for a
/// missing call. Sources report what is stored; values outside {−1, 0, 1, 2} are caught by
/// the kernels that read them, which name the variant and sample.
pub trait GenotypeSource: Send + Sync {
    /// `(variants, samples)`.
    fn shape(&self) -> (u64, u64);
    /// Writes the dosages of variants `rows` (all samples) into `out`
    /// (`rows.len() × samples`, row-major).
    fn fill_dosages(&self, rows: Range<u64>, out: ArrayViewMut2<'_, i8>)
        -> Result<(), SourceError>;
    /// Short description for reports and errors.
    fn describe(&self) -> String;
    /// Sample identifiers, when the source has them (the `.eigenvec` file uses them).
    fn sample_ids(&self) -> Option<Vec<String>> {
        None
    }
    /// The samples' family IDs, for a source that has them (a `.fam`'s first column): a
    /// sample is then named by its (FID, IID) pair, as PLINK names it.
    fn family_ids(&self) -> Option<Vec<String>> {
        None
    }
    /// Each sample's group, where the source knows one (a generated cohort's population),
    /// for plots.
    fn sample_groups(&self) -> Option<Vec<String>> {
        None
    }
    /// Passes each variant's identifier to `each`, in row order (`None` for a variant that
    /// has none, such as a VCF's `.`), and returns `Ok(true)`; `Ok(false)`, calling nothing,
    /// when the source has no identifiers. `--extract` and `--exclude` select variants by
    /// them.
    fn variant_ids(&self, each: &mut dyn FnMut(Option<&str>)) -> Result<bool, SourceError> {
        let _ = each;
        Ok(false)
    }
    /// Passes each variant's number of alleles to `each`, in row order, and returns
    /// `Ok(true)`; `Ok(false)`, calling nothing, when the source does not say (a PLINK 1
    /// fileset is biallelic by construction). A PCA skips the variants of more than two.
    fn variant_allele_counts(&self, each: &mut dyn FnMut(usize)) -> Result<bool, SourceError> {
        let _ = each;
        Ok(false)
    }
    /// Passes each variant's position on its chromosome to `each`, in row order, and
    /// returns `Ok(true)`; `Ok(false)`, calling nothing, when the source does not say.
    fn variant_positions(&self, each: &mut dyn FnMut(i64)) -> Result<bool, SourceError> {
        let _ = each;
        Ok(false)
    }
    /// Passes each variant's alleles to `each`, in row order, as `(counted, other)`: the
    /// allele whose copies the dosages count (a `.bim`'s fifth column, A1; a VCF's ALT),
    /// then the other (A2; REF). Returns `Ok(false)`, calling nothing, when the source
    /// does not say. Projection matches variants by ID and allele through them, as
    /// `plink2 --score` does.
    fn variant_alleles(&self, each: &mut dyn FnMut(&str, &str)) -> Result<bool, SourceError> {
        let _ = each;
        Ok(false)
    }
    /// Passes each variant's chromosome (contig) name to `each`, in row order, as the
    /// source names it (`1`, `chr1`, `X`, …), and returns `Ok(true)`; `Ok(false)`, calling
    /// nothing, when the source does not say. `--chr`, `--not-chr` and `--autosome` select
    /// variants by them.
    fn variant_chromosomes(&self, each: &mut dyn FnMut(&str)) -> Result<bool, SourceError> {
        let _ = each;
        Ok(false)
    }
    /// Storage-backed sources decode whole panels; see [`PanelSource::stored`].
    fn stored(&self) -> Option<&dyn StoredPanels> {
        None
    }
    /// Panel rows when the caller gives none; see [`PanelSource::preferred_panel_rows`].
    fn preferred_panel_rows(&self) -> u64 {
        self.stored()
            .map_or(GenotypeSource::shape(self).0, |s| s.default_panel_rows())
    }
    /// The generator behind this source; see [`PanelSource::generated`].
    fn generated(&self) -> Option<&Generated> {
        None
    }
}

/// A float matrix held in memory: for embedding codes that already hold their data, and
/// for tests.
#[derive(Clone, Debug)]
pub struct InMemoryMatrix {
    values: ndarray::Array2<f64>,
    name: String,
}

impl InMemoryMatrix {
    /// Wraps `values`; `name` appears in errors.
    pub fn new(values: ndarray::Array2<f64>, name: impl Into<String>) -> Self {
        InMemoryMatrix {
            values,
            name: name.into(),
        }
    }
}

impl PanelSource for InMemoryMatrix {
    fn shape(&self) -> (u64, u64) {
        let (m, n) = self.values.dim();
        (m as u64, n as u64)
    }

    fn fill(&self, rows: Range<u64>, out: ArrayViewMut2<'_, f64>) -> Result<(), SourceError> {
        let n = self.values.ncols() as u64;
        self.fill_cols(rows, 0..n, out)
    }

    fn fill_cols(
        &self,
        rows: Range<u64>,
        cols: Range<u64>,
        mut out: ArrayViewMut2<'_, f64>,
    ) -> Result<(), SourceError> {
        let (m, n) = PanelSource::shape(self);
        if rows.end > m
            || rows.start > rows.end
            || cols.end > n
            || cols.start > cols.end
            || out.dim()
                != (
                    (rows.end - rows.start) as usize,
                    (cols.end - cols.start) as usize,
                )
        {
            return Err(SourceError::OutOfBounds {
                rows,
                cols: out.ncols(),
                shape: (m, n),
                what: self.name.clone(),
            });
        }
        out.assign(&self.values.slice(ndarray::s![
            rows.start as usize..rows.end as usize,
            cols.start as usize..cols.end as usize
        ]));
        Ok(())
    }

    fn describe(&self) -> String {
        let (m, n) = self.values.dim();
        format!("{} ({m} × {n}, in memory)", self.name)
    }
}

/// A genotype matrix held in memory (`variants × samples`, dosages −1..=2): for embedding
/// codes that already hold their data, and for tests.
#[derive(Clone, Debug)]
pub struct InMemoryGenotypes {
    values: ndarray::Array2<i8>,
    name: String,
}

impl InMemoryGenotypes {
    /// Wraps `values` (variants × samples); `name` appears in errors.
    pub fn new(values: ndarray::Array2<i8>, name: impl Into<String>) -> Self {
        InMemoryGenotypes {
            values,
            name: name.into(),
        }
    }
}

impl GenotypeSource for InMemoryGenotypes {
    fn shape(&self) -> (u64, u64) {
        let (m, n) = self.values.dim();
        (m as u64, n as u64)
    }

    fn fill_dosages(
        &self,
        rows: Range<u64>,
        mut out: ArrayViewMut2<'_, i8>,
    ) -> Result<(), SourceError> {
        let (m, n) = GenotypeSource::shape(self);
        if rows.end > m
            || rows.start > rows.end
            || out.dim() != ((rows.end - rows.start) as usize, n as usize)
        {
            return Err(SourceError::OutOfBounds {
                rows,
                cols: out.ncols(),
                shape: (m, n),
                what: self.name.clone(),
            });
        }
        out.assign(
            &self
                .values
                .slice(ndarray::s![rows.start as usize..rows.end as usize, ..]),
        );
        Ok(())
    }

    fn describe(&self) -> String {
        let (m, n) = self.values.dim();
        format!("{} ({m} variants × {n} samples, in memory)", self.name)
    }
}

/// The counter-based generated matrix of shape `(rows, cols)`.
#[derive(Clone, Debug)]
pub struct Generated {
    rows: u64,
    cols: u64,
    seed: u64,
    dist: Dist,
    key: u64,
    /// Fraction of genotype calls reported missing (−1), as given.
    missing_rate: f64,
    /// Genotype populations (contiguous blocks of samples); 1 means no structure.
    populations: u64,
    /// F_ST of the Balding–Nichols draws (used only with more than one population).
    fst: f64,
    /// Key of the per-(variant, population) frequency streams.
    population_key: u64,
    /// Yield the transpose: panel rows are columns of the generated matrix.
    transposed: bool,
}

impl Generated {
    /// A generated `rows × cols` matrix. Panics never; shape limits are checked by the grid.
    pub fn new(rows: u64, cols: u64, seed: u64, dist: Dist) -> Self {
        Generated {
            rows,
            cols,
            seed,
            dist,
            key: mix64(seed ^ 0x005E_ED0F_4A4E_4B57),
            missing_rate: 0.0,
            populations: 1,
            fst: DEFAULT_FST,
            population_key: mix64(seed ^ POPULATION_KEY),
            transposed: false,
        }
    }

    /// Checks that a generated matrix of this (untransposed) shape fits the generator's
    /// index space: the counters give every row fewer than 2²⁴ columns.
    pub fn check_shape(rows: u64, cols: u64) -> Result<(), SourceError> {
        if rows > MAX_GENERATED_ROWS {
            return Err(SourceError::Option {
                parameter: "rows",
                message: format!("generated matrices have at most {MAX_GENERATED_ROWS} rows"),
            });
        }
        if cols > MAX_GENERATED_COLS - 1 {
            return Err(SourceError::Option {
                parameter: "cols",
                message: format!(
                    "generated matrices have at most {} columns",
                    MAX_GENERATED_COLS - 1
                ),
            });
        }
        Ok(())
    }

    /// Genotypes only: split the samples (columns of the untransposed matrix) into `k`
    /// contiguous populations (sample `j` belongs to population `j·k / samples`) whose allele
    /// frequencies drift from each variant's ancestral frequency by the Balding–Nichols
    /// model with fixation index `fst`. `k = 1` leaves the values exactly as without
    /// structure. Errors name the command-line options: `k` must be at least 1 and at most
    /// the number of samples, and `0 < fst < 1`.
    pub fn with_populations(mut self, k: u64, fst: f64) -> Result<Self, SourceError> {
        if k == 0 {
            return Err(SourceError::Option {
                parameter: "populations",
                message: "at least one population is needed".into(),
            });
        }
        if k > self.cols {
            return Err(SourceError::Option {
                parameter: "populations",
                message: format!(
                    "{k} populations need at least {k} samples, and there are {} (`cols`)",
                    self.cols
                ),
            });
        }
        if !(fst > 0.0 && fst < 1.0) {
            return Err(SourceError::Option {
                parameter: "fst",
                message: format!("{fst} is not a fixation index in (0, 1)"),
            });
        }
        self.populations = k;
        self.fst = fst;
        Ok(self)
    }

    /// Number of populations (1: no structure).
    pub fn populations(&self) -> u64 {
        self.populations
    }

    /// F_ST of the population frequencies (meaningful with more than one population).
    pub fn fst(&self) -> f64 {
        self.fst
    }

    /// The population of sample `sample` (a column of the untransposed matrix).
    #[inline]
    pub fn population_of(&self, sample: u64) -> u64 {
        // sample < 2²⁴ and populations ≤ samples < 2²⁴: the product fits easily.
        sample * self.populations / self.cols.max(1)
    }

    /// The first sample of population `q` (`samples` for `q = populations`).
    #[inline]
    pub fn population_start(&self, q: u64) -> u64 {
        // The least j with j·k / n ≥ q, i.e. ⌈q·n / k⌉.
        (q * self.cols).div_ceil(self.populations)
    }

    /// Allele frequency of variant `row` in population `q`: the ancestral frequency when
    /// there is no structure, else its Balding–Nichols draw, kept within
    /// [`POPULATION_FREQUENCY_MIN`, 1 − `POPULATION_FREQUENCY_MIN`].
    pub fn population_frequency(&self, row: u64, q: u64) -> f64 {
        let p = self.allele_frequency(row);
        if self.populations <= 1 {
            return p;
        }
        let draw = counter_bits(self.population_key, row, q);
        balding_nichols(p, self.fst, draw)
    }

    /// Genotypes only: report each call missing (−1) with probability `rate` (0 ≤ rate < 1),
    /// independently of its dosage draw.
    pub fn with_missing(mut self, rate: f64) -> Self {
        self.missing_rate = rate.clamp(0.0, 1.0);
        self
    }

    /// The missing-call rate.
    pub fn missing_rate(&self) -> f64 {
        self.missing_rate
    }

    /// The same values, seen transposed (`cols × rows`): used for short-and-fat matrices,
    /// whose SVD is computed through the transpose.
    pub fn transposed(mut self) -> Self {
        self.transposed = !self.transposed;
        self
    }

    /// Whether panels are the transpose of the generated matrix ([`Generated::transposed`]).
    pub fn is_transposed(&self) -> bool {
        self.transposed
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The distribution.
    pub fn dist(&self) -> Dist {
        self.dist
    }

    /// The key of the block streams ([`crate::stream`]; the device kernels generate from it).
    pub fn key(&self) -> u64 {
        self.key
    }

    /// The missing-call rate as the 32-bit threshold of [`stream::missing_threshold`].
    pub fn missing_threshold(&self) -> u64 {
        stream::missing_threshold(self.missing_rate)
    }

    /// The 16-bit allele thresholds ([`stream::allele_threshold`]) of variants `rows`, one
    /// per population (`populations()` per variant, variant-major), appended to `out`: the
    /// draws of a sample of population `q` are compared with its variant's threshold `q`.
    pub fn genotype_thresholds(&self, rows: Range<u64>, out: &mut Vec<u64>) {
        for row in rows {
            for q in 0..self.populations.max(1) {
                out.push(allele_threshold(self.population_frequency(row, q)));
            }
        }
    }

    /// The raw 64-bit word of element `(row, col)` of the untransposed matrix (the word a
    /// uniform or normal value is made from).
    #[inline]
    pub fn bits(&self, row: u64, col: u64) -> u64 {
        stream::element_word(self.key, row, col)
    }

    /// Value at `(row, col)` of the untransposed matrix.
    #[inline]
    pub fn value(&self, row: u64, col: u64) -> f64 {
        match self.dist {
            Dist::Uniform => stream::unit(self.bits(row, col)),
            Dist::Normal => normal_from(self.bits(row, col)),
            Dist::Genotype => self.genotype(row, col) as f64,
        }
    }

    /// Genotype dosage at `(row, col)` (row is the variant), −1 for a missing call. With
    /// populations each call makes its population's Beta draw again: use
    /// [`Generated::fill_genotype_rows`] for more than a few values.
    #[inline]
    pub fn genotype(&self, row: u64, col: u64) -> i8 {
        let t = allele_threshold(self.population_frequency(row, self.population_of(col)));
        match stream::genotype_code(self.key, row, col, t, self.missing_threshold()) {
            3 => -1,
            d => d as i8,
        }
    }

    /// The population boundaries (`populations() + 1` column starts, the last one the
    /// column count) for [`Thresholds::Populations`].
    fn population_starts(&self) -> Vec<u64> {
        (0..=self.populations)
            .map(|q| self.population_start(q))
            .collect()
    }

    /// The allele thresholds of variant `row`, one per population, into `t`.
    fn thresholds_of(&self, row: u64, t: &mut Vec<u64>) {
        t.clear();
        self.genotype_thresholds(row..row + 1, t);
    }

    /// Dosages of variants `rows`, samples `cols`, into `out` (row-major, `rows.len()`
    /// rows of `cols.len()`): the fast path of [`GenotypeSource::fill_dosages`].
    pub fn fill_genotype_rows(&self, rows: Range<u64>, cols: Range<u64>, out: &mut [i8]) {
        let w = (cols.end - cols.start) as usize;
        let starts = self.population_starts();
        let missing = self.missing_threshold();
        let mut t = Vec::new();
        for (li, row) in rows.enumerate() {
            let out = &mut out[li * w..(li + 1) * w];
            self.thresholds_of(row, &mut t);
            stream::dosage_row(self.key, row, cols.start, &starts, &t, missing, out);
        }
    }

    /// The dosages of variants `rows` (all samples), 2-bit packed four per byte (low bits
    /// first, code 3 a missing call, padding codes 0) into rows of `stride ≥ ⌈cols / 4⌉`
    /// bytes of `out`, and each variant's counts of codes 1, 2 and 3 appended to `counts`:
    /// the packed genotype panels of a PCA without an int8 copy or a counting pass.
    pub fn fill_packed_rows(
        &self,
        rows: Range<u64>,
        out: &mut [u8],
        stride: usize,
        counts: &mut Vec<[u64; 3]>,
    ) {
        let starts = self.population_starts();
        let missing = self.missing_threshold();
        let mut t = Vec::new();
        for (li, row) in rows.enumerate() {
            let out = &mut out[li * stride..(li + 1) * stride];
            self.thresholds_of(row, &mut t);
            counts.push(stream::packed_row(
                self.key, row, self.cols, &starts, &t, missing, out,
            ));
        }
    }

    /// Values at `(row, col0 + k·step)` of the untransposed matrix for `k` in
    /// `0..out.len()`: one row of a strided selection such as `x[::s, ::s]`. Each value is
    /// the same bits as [`Generated::value`] gives.
    pub fn fill_strided_row(
        &self,
        row: u64,
        col0: u64,
        step: u64,
        out: &mut [f64],
    ) -> Result<(), SourceError> {
        let last = (out.len() as u64)
            .checked_sub(1)
            .map(|k| k.checked_mul(step).and_then(|d| d.checked_add(col0)));
        let inside = match last {
            None => true,
            Some(Some(c)) => c < self.cols,
            Some(None) => false,
        };
        if step == 0 || row >= self.rows || !inside {
            return Err(SourceError::OutOfBounds {
                rows: row..row + 1,
                cols: out.len(),
                shape: (self.rows, self.cols),
                what: format!(
                    "{} (every {step}th column from {col0})",
                    PanelSource::describe(self)
                ),
            });
        }
        if step == 1 {
            self.fill_row(row, col0, out);
            return Ok(());
        }
        if step < STRIDED_ALONE_STEP {
            self.fill_strided_spans(row, col0, step as usize, out);
            return Ok(());
        }
        match self.dist {
            Dist::Genotype => {
                let starts = self.population_starts();
                let mut t = Vec::new();
                self.thresholds_of(row, &mut t);
                let th = Thresholds::new(&starts, &t);
                for (k, v) in out.iter_mut().enumerate() {
                    let col = col0 + k as u64 * step;
                    let t = th.threshold_of(col);
                    let code =
                        stream::genotype_code(self.key, row, col, t, self.missing_threshold());
                    *v = if code == 3 { -1.0 } else { code as f64 };
                }
            }
            _ => {
                for (k, v) in out.iter_mut().enumerate() {
                    *v = self.value(row, col0 + k as u64 * step);
                }
            }
        }
        Ok(())
    }

    /// [`Generated::fill_strided_row`] for a small step: the row's columns are made in
    /// spans of [`STRIDED_SPAN`] by the block streams' row fills and every `step`th kept.
    /// A value made alone costs up to `BLOCK_COLS / 8` generator steps to reach its place
    /// in its block's stream, so making the whole span and dropping the rest is cheaper
    /// while `step` is small (`reduce --step 2` ran 4.6× slower made value by value).
    fn fill_strided_spans(&self, row: u64, col0: u64, step: usize, out: &mut [f64]) {
        let per_span = (STRIDED_SPAN - 1) / step + 1;
        let mut words = [0u64; STRIDED_SPAN];
        let mut values = [0f64; STRIDED_SPAN];
        let mut codes = [0i8; STRIDED_SPAN];
        for (i, piece) in out.chunks_mut(per_span).enumerate() {
            let start = col0 + (i * per_span * step) as u64;
            let span = (piece.len() - 1) * step + 1;
            match self.dist {
                // Every value of the span, not its words then the kept ones: the row fill
                // converts in vector registers, which measured faster (0.51 s against
                // 0.86 s for reduce --step 2 of 50,000²).
                Dist::Uniform => {
                    stream::uniform_row(self.key, row, start, &mut values[..span]);
                    for (v, &x) in piece.iter_mut().zip(values.iter().step_by(step)) {
                        *v = x;
                    }
                }
                Dist::Normal => {
                    // Only the kept words pay for the normal transform.
                    stream::words_row(self.key, row, start, &mut words[..span]);
                    for (v, &x) in piece.iter_mut().zip(words.iter().step_by(step)) {
                        *v = normal_from(x);
                    }
                }
                Dist::Genotype => {
                    self.fill_genotype_rows(
                        row..row + 1,
                        start..start + span as u64,
                        &mut codes[..span],
                    );
                    for (v, &d) in piece.iter_mut().zip(codes.iter().step_by(step)) {
                        *v = d as f64;
                    }
                }
            }
        }
    }

    /// Allele frequency of variant `row` for [`Dist::Genotype`].
    #[inline]
    pub fn allele_frequency(&self, row: u64) -> f64 {
        // A column index no real matrix reaches gives each row its own draw.
        0.05 + 0.45 * unit_f64(counter_bits(self.key, row, MAX_GENERATED_COLS - 1))
    }

    /// Values of row `row` (untransposed), columns `col0..col0 + out.len()`.
    fn fill_row(&self, row: u64, col0: u64, out: &mut [f64]) {
        let mut view = ndarray::ArrayViewMut2::from_shape((1, out.len()), out)
            .expect("a row is a 1 × n matrix");
        self.fill_direct(row..row + 1, col0, view.view_mut());
    }

    /// Fills `out` with rows `rows`, columns `col0..col0 + out.ncols()` of the untransposed
    /// matrix, in whatever layout `out` has.
    fn fill_direct(&self, rows: Range<u64>, col0: u64, mut out: ArrayViewMut2<'_, f64>) {
        let (h, w) = out.dim();
        if self.dist == Dist::Uniform {
            if w <= 1 || out.strides()[1] == 1 {
                // Row-major, the rows contiguous but possibly apart (a padded tile).
                for (i, mut row) in out.rows_mut().into_iter().enumerate() {
                    let row = row.as_slice_mut().expect("a contiguous row");
                    stream::uniform_row(self.key, rows.start + i as u64, col0, row);
                }
                return;
            }
            if let Some(s) = out.view_mut().reversed_axes().as_slice_mut() {
                // Column-major (a transposed or Fortran-order panel).
                stream::uniform_cols(self.key, rows.start, h, col0, w, s, h);
                return;
            }
        }
        // Everything else is made row-major in one buffer, then copied in.
        let mut made = ndarray::Array2::<f64>::zeros((h, w));
        match self.dist {
            Dist::Uniform => {
                for (i, mut row) in made.rows_mut().into_iter().enumerate() {
                    let row = row.as_slice_mut().expect("standard layout");
                    stream::uniform_row(self.key, rows.start + i as u64, col0, row);
                }
            }
            Dist::Normal => {
                let mut words = vec![0u64; w];
                for (i, mut row) in made.rows_mut().into_iter().enumerate() {
                    stream::words_row(self.key, rows.start + i as u64, col0, &mut words);
                    for (v, &x) in row.iter_mut().zip(&words) {
                        *v = normal_from(x);
                    }
                }
            }
            Dist::Genotype => {
                let mut codes = vec![0i8; h * w];
                self.fill_genotype_rows(rows, col0..col0 + w as u64, &mut codes);
                for (v, &d) in made.iter_mut().zip(&codes) {
                    *v = d as f64;
                }
            }
        }
        out.assign(&made);
    }
}

/// Columns per span of [`Generated::fill_strided_row`]'s row fills (a multiple of the
/// streams' 256-column blocks; 68 KiB of scratch on the stack).
const STRIDED_SPAN: usize = 4096;

/// From this step on, [`Generated::fill_strided_row`] makes each kept value alone: a span
/// makes `step` values per kept one (vectorized, a fraction of a nanosecond each), and one
/// value alone costs two hashes and 16 generator steps on average (up to 32). Measured with
/// `rankwise reduce` on 20,000 × 400,000: spans win below about 48 for uniform values, 32
/// for genotypes and 24 for normal ones (whose transform dominates either way).
const STRIDED_ALONE_STEP: u64 = 32;

/// F_ST of [`Generated::with_populations`] when none is given.
pub const DEFAULT_FST: f64 = 0.1;

/// Population allele frequencies are kept at least this far from 0 and 1: a draw that fixes
/// an allele in every population would leave a monomorphic variant (which a PCA drops),
/// and very small Beta shapes give draws that underflow to exactly 0 or 1.
pub(crate) const POPULATION_FREQUENCY_MIN: f64 = 1e-3;

const POPULATION_KEY: u64 = 0x00B4_1D1E_6A1C_0F57;

/// One Balding–Nichols draw, `Beta(p(1−F)/F, (1−p)(1−F)/F)`, from the stream started at
/// `bits`; clamped to [`POPULATION_FREQUENCY_MIN`, 1 − `POPULATION_FREQUENCY_MIN`].
fn balding_nichols(p: f64, fst: f64, bits: u64) -> f64 {
    let s = (1.0 - fst) / fst;
    let x = match Beta::new(p * s, (1.0 - p) * s) {
        Ok(beta) => beta.sample(&mut ElementStream { state: bits }),
        // Both shapes are positive for 0 < p < 1 and 0 < F < 1; no drift is the safe answer
        // should that ever not hold.
        Err(_) => p,
    };
    // Shapes that overflow (F near 0) or vanish (F near 1) can make Cheng's samplers return
    // ∞/∞: no information about the drift, so stay at the ancestral frequency.
    if x.is_nan() {
        p
    } else {
        x.clamp(POPULATION_FREQUENCY_MIN, 1.0 - POPULATION_FREQUENCY_MIN)
    }
}

/// A short stream of 64-bit draws started from one element's draw, for rejection samplers.
struct ElementStream {
    state: u64,
}

impl rand_core::TryRng for ElementStream {
    type Error = Infallible;
    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok((self.try_next_u64()? >> 32) as u32)
    }
    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        self.state = self.state.wrapping_add(GAMMA);
        Ok(mix64(self.state))
    }
    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        for chunk in dst.chunks_mut(8) {
            let v = self.try_next_u64()?.to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        Ok(())
    }
}

#[inline]
fn normal_from(bits: u64) -> f64 {
    let mut stream = ElementStream { state: bits };
    StandardNormal.sample(&mut stream)
}

impl PanelSource for Generated {
    fn generated(&self) -> Option<&Generated> {
        Some(self)
    }

    fn shape(&self) -> (u64, u64) {
        if self.transposed {
            (self.cols, self.rows)
        } else {
            (self.rows, self.cols)
        }
    }

    fn fill(&self, rows: Range<u64>, out: ArrayViewMut2<'_, f64>) -> Result<(), SourceError> {
        let (m, n) = PanelSource::shape(self);
        if rows.end > m
            || rows.start > rows.end
            || out.nrows() as u64 != rows.end - rows.start
            || out.ncols() as u64 != n
        {
            return Err(SourceError::OutOfBounds {
                rows,
                cols: out.ncols(),
                shape: (m, n),
                what: PanelSource::describe(self),
            });
        }
        if self.transposed {
            // Panel rows are columns `rows` of the generated matrix: fill the transposed view.
            self.fill_direct(0..self.rows, rows.start, out.reversed_axes());
        } else {
            self.fill_direct(rows, 0, out);
        }
        Ok(())
    }

    fn fill_cols(
        &self,
        rows: Range<u64>,
        cols: Range<u64>,
        out: ArrayViewMut2<'_, f64>,
    ) -> Result<(), SourceError> {
        let (m, n) = PanelSource::shape(self);
        if rows.end > m
            || rows.start > rows.end
            || cols.end > n
            || cols.start > cols.end
            || out.nrows() as u64 != rows.end - rows.start
            || out.ncols() as u64 != cols.end - cols.start
        {
            return Err(SourceError::OutOfBounds {
                rows,
                cols: out.ncols(),
                shape: (m, n),
                what: PanelSource::describe(self),
            });
        }
        if self.transposed {
            self.fill_direct(cols, rows.start, out.reversed_axes());
        } else {
            self.fill_direct(rows, cols.start, out);
        }
        Ok(())
    }

    fn fill_cols_f32(
        &self,
        rows: Range<u64>,
        cols: Range<u64>,
        mut out: ArrayViewMut2<'_, f32>,
    ) -> Result<(), SourceError> {
        let (m, n) = PanelSource::shape(self);
        let rows_contiguous = out.ncols() <= 1 || out.strides()[1] == 1;
        let fast = self.dist == Dist::Uniform && !self.transposed && rows_contiguous;
        if !fast || rows.end > m || cols.end > n || cols.start > cols.end {
            let mut tile = ndarray::Array2::<f64>::zeros(out.dim());
            self.fill_cols(rows, cols, tile.view_mut())?;
            out.zip_mut_with(&tile, |o, &v| *o = v as f32);
            return Ok(());
        }
        if out.nrows() as u64 != rows.end - rows.start
            || out.ncols() as u64 != cols.end - cols.start
        {
            return Err(SourceError::OutOfBounds {
                rows,
                cols: out.ncols(),
                shape: (m, n),
                what: PanelSource::describe(self),
            });
        }
        for (li, mut row) in out.rows_mut().into_iter().enumerate() {
            stream::uniform_row_f32(
                self.key,
                rows.start + li as u64,
                cols.start,
                row.as_slice_mut().expect("a contiguous row"),
            );
        }
        Ok(())
    }

    fn cheaper_to_reproduce(&self) -> bool {
        // Uniform values come at several GB/s per core; the others are slower than memory.
        self.dist == Dist::Uniform
    }

    fn describe(&self) -> String {
        format!(
            "generated {} × {} {} matrix (seed {}){}",
            self.rows,
            self.cols,
            self.dist,
            self.seed,
            if self.transposed { ", transposed" } else { "" }
        )
    }
}

impl GenotypeSource for Generated {
    fn generated(&self) -> Option<&Generated> {
        Some(self)
    }

    /// `population 1` … `population K` of a cohort generated with `K > 1` populations.
    fn sample_groups(&self) -> Option<Vec<String>> {
        (self.populations > 1).then(|| {
            (0..self.cols)
                .map(|j| format!("population {}", self.population_of(j) + 1))
                .collect()
        })
    }

    fn shape(&self) -> (u64, u64) {
        PanelSource::shape(self)
    }

    fn fill_dosages(
        &self,
        rows: Range<u64>,
        mut out: ArrayViewMut2<'_, i8>,
    ) -> Result<(), SourceError> {
        let (m, n) = PanelSource::shape(self);
        if self.dist != Dist::Genotype
            || rows.end > m
            || rows.start > rows.end
            || out.dim() != ((rows.end - rows.start) as usize, n as usize)
        {
            return Err(SourceError::OutOfBounds {
                rows,
                cols: out.ncols(),
                shape: (m, n),
                what: PanelSource::describe(self),
            });
        }
        if self.transposed {
            // Panel rows are samples: make each variant's run over them, then scatter it.
            let mut run = vec![0i8; out.nrows()];
            for (j, mut col) in out.columns_mut().into_iter().enumerate() {
                self.fill_genotype_rows(j as u64..j as u64 + 1, rows.clone(), &mut run);
                col.assign(&ndarray::aview1(&run));
            }
            return Ok(());
        }
        match out.as_slice_mut() {
            Some(s) => self.fill_genotype_rows(rows, 0..n, s),
            None => {
                for ((i, j), v) in out.indexed_iter_mut() {
                    *v = self.genotype(rows.start + i as u64, j as u64);
                }
            }
        }
        Ok(())
    }

    fn describe(&self) -> String {
        let mut s = PanelSource::describe(self);
        if self.populations > 1 {
            s += &format!(", {} populations (F_ST {})", self.populations, self.fst);
        }
        let missing = self.missing_rate();
        if missing > 0.0 {
            s += &format!(", {:.1} % missing calls", 100.0 * missing);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array2, ShapeBuilder};

    fn dense(g: &Generated, rows: Range<u64>, fortran: bool) -> Array2<f64> {
        let n = PanelSource::shape(g).1 as usize;
        let len = (rows.end - rows.start) as usize;
        let mut a = if fortran {
            Array2::zeros((len, n).f())
        } else {
            Array2::zeros((len, n))
        };
        g.fill(rows, a.view_mut()).unwrap();
        a
    }

    /// The dosage of genotype `(i, j)` from its definition: two 16-bit draws, each an
    /// alternative allele when below `p` rounded to a multiple of 2⁻¹⁶.
    fn expected_dosage(g: &Generated, i: u64, j: u64, p: f64) -> i8 {
        let c = (j % 256) as usize;
        let h = stream::word(g.key(), i, j / 256, c / 2) >> (32 * (c % 2)) & 0xFFFF_FFFF;
        let q = (p * 65_536.0).round() / 65_536.0;
        let (a, b) = ((h & 0xFFFF) as f64 / 65_536.0, (h >> 16) as f64 / 65_536.0);
        (a < q) as i8 + (b < q) as i8
    }

    #[test]
    fn values_do_not_depend_on_panel_split_or_layout() {
        for dist in [Dist::Uniform, Dist::Normal, Dist::Genotype] {
            let g = Generated::new(37, 5, 11, dist);
            let whole = dense(&g, 0..37, true);
            for (cut, fortran) in [(1u64, false), (13, true), (36, false)] {
                let top = dense(&g, 0..cut, fortran);
                let bottom = dense(&g, cut..37, !fortran);
                for i in 0..37usize {
                    for j in 0..5usize {
                        let v = if (i as u64) < cut {
                            top[[i, j]]
                        } else {
                            bottom[[i - cut as usize, j]]
                        };
                        assert_eq!(v.to_bits(), whole[[i, j]].to_bits(), "{dist} ({i},{j})");
                        assert_eq!(v.to_bits(), g.value(i as u64, j as u64).to_bits());
                    }
                }
            }
        }
    }

    /// `fill_strided_row` of `len` values against [`Generated::value`], bit for bit.
    fn assert_strided_row_is_elementwise(
        g: &Generated,
        row: u64,
        col0: u64,
        step: u64,
        len: usize,
        context: &str,
    ) {
        let mut out = vec![f64::NAN; len];
        g.fill_strided_row(row, col0, step, &mut out).unwrap();
        for (k, v) in out.iter().enumerate() {
            let want = g.value(row, col0 + k as u64 * step);
            assert_eq!(
                v.to_bits(),
                want.to_bits(),
                "{} ({row}, {col0}+{k}·{step}) {context}",
                g.dist
            );
        }
    }

    /// `reduce --step 2` made each kept value alone, walking its block's stream up to its
    /// column every time (4.6× slower than making whole spans). The spans must still give
    /// the element-wise values, across span and block boundaries and on both sides of the
    /// step where values are made alone again.
    #[test]
    fn strided_rows_made_in_spans_are_the_elementwise_values() {
        let mut seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(7, |d| d.as_nanos() as u64);
        let first = seed;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        for dist in [Dist::Uniform, Dist::Normal, Dist::Genotype] {
            let cols = 9_000 + next(12_000);
            let g = Generated::new(5, cols, 3 + next(1_000), dist);
            for step in [2, 3, 7, STRIDED_ALONE_STEP - 1, STRIDED_ALONE_STEP, 200] {
                let col0 = next(300);
                let row = next(5);
                let len = ((cols - 1 - col0) / step + 1) as usize;
                let context = format!("{cols} columns, seed {first}");
                assert_strided_row_is_elementwise(&g, row, col0, step, len, &context);
            }
        }
    }

    #[test]
    fn strided_rows_are_the_elementwise_values() {
        for dist in [Dist::Uniform, Dist::Normal, Dist::Genotype] {
            let g = Generated::new(11, 40, 9, dist);
            for (row, col0, step, len) in
                [(0u64, 0u64, 1u64, 40usize), (3, 1, 2, 20), (10, 5, 7, 5)]
            {
                assert_strided_row_is_elementwise(&g, row, col0, step, len, "");
            }
            let mut empty: [f64; 0] = [];
            assert!(g.fill_strided_row(0, 40, 3, &mut empty).is_ok());
            let mut out = vec![0.0; 15];
            assert!(g.fill_strided_row(0, 0, 3, &mut out).is_err(), "column 42");
            assert!(
                g.fill_strided_row(11, 0, 3, &mut out[..1]).is_err(),
                "row 11"
            );
            assert!(
                g.fill_strided_row(0, 0, 0, &mut out[..1]).is_err(),
                "step 0"
            );
            assert!(
                g.fill_strided_row(0, 1, u64::MAX, &mut out[..2]).is_err(),
                "overflow"
            );
        }
    }

    #[test]
    fn transpose_yields_the_same_values() {
        let g = Generated::new(6, 9, 3, Dist::Normal);
        let t = g.clone().transposed();
        assert_eq!(PanelSource::shape(&t), (9, 6));
        let a = dense(&t, 2..7, false);
        for r in 0..5usize {
            for c in 0..6usize {
                assert_eq!(a[[r, c]], g.value(c as u64, r as u64 + 2));
            }
        }
    }

    #[test]
    fn moments_are_plausible() {
        let n = 200_000u64;
        for (dist, mean, var) in [(Dist::Uniform, 0.5, 1.0 / 12.0), (Dist::Normal, 0.0, 1.0)] {
            let g = Generated::new(n, 1, 7, dist);
            let a = dense(&g, 0..n, true);
            let m = a.mean().unwrap();
            let v = a.mapv(|x| (x - m) * (x - m)).mean().unwrap();
            assert!((m - mean).abs() < 0.01, "{dist} mean {m}");
            assert!((v - var).abs() < 0.02 * var.max(0.1), "{dist} var {v}");
        }
        let g = Generated::new(1, n, 7, Dist::Genotype);
        let p = g.allele_frequency(0);
        let a = dense(&g, 0..1, false);
        assert!(a.iter().all(|&x| x == 0.0 || x == 1.0 || x == 2.0));
        let m = a.mean().unwrap();
        assert!(
            (m - 2.0 * p).abs() < 0.01,
            "genotype mean {m} vs 2p {}",
            2.0 * p
        );
    }

    #[test]
    fn fast_genotype_rows_match_elementwise_definition() {
        for missing in [0.0, 0.15] {
            let g = Generated::new(9, 603, 5, Dist::Genotype).with_missing(missing);
            let mut fast = vec![0i8; 9 * 590];
            g.fill_genotype_rows(0..9, 13..603, &mut fast);
            let mut seen_missing = 0;
            for i in 0..9u64 {
                let p = g.allele_frequency(i);
                for j in 13..603u64 {
                    let v = fast[(i * 590 + j - 13) as usize];
                    assert_eq!(v, g.genotype(i, j));
                    if v < 0 {
                        seen_missing += 1;
                    } else {
                        assert_eq!(v, expected_dosage(&g, i, j, p));
                    }
                }
            }
            assert_eq!(seen_missing > 0, missing > 0.0);
        }
    }

    #[test]
    fn one_population_is_exactly_no_structure() {
        for missing in [0.0, 0.2] {
            let plain = Generated::new(23, 41, 9, Dist::Genotype).with_missing(missing);
            let one = plain.clone().with_populations(1, 0.4).unwrap();
            let (mut a, mut b) = (vec![0i8; 23 * 41], vec![0i8; 23 * 41]);
            plain.fill_genotype_rows(0..23, 0..41, &mut a);
            one.fill_genotype_rows(0..23, 0..41, &mut b);
            assert_eq!(a, b);
            for i in 0..23 {
                assert_eq!(one.population_frequency(i, 0), plain.allele_frequency(i));
                for j in 0..41 {
                    assert_eq!(one.genotype(i, j), plain.genotype(i, j));
                }
            }
        }
    }

    #[test]
    fn populations_are_contiguous_nonempty_blocks() {
        for (n, k) in [
            (1u64, 1u64),
            (10, 3),
            (10, 10),
            (203, 7),
            (1000, 999),
            (97, 2),
        ] {
            let g = Generated::new(1, n, 0, Dist::Genotype)
                .with_populations(k, 0.1)
                .unwrap();
            assert_eq!((g.population_start(0), g.population_start(k)), (0, n));
            for q in 0..k {
                let (a, b) = (g.population_start(q), g.population_start(q + 1));
                assert!(a < b, "n {n} k {k}: population {q} is empty");
                assert!((a..b).all(|j| g.population_of(j) == q), "n {n} k {k} q {q}");
            }
        }
    }

    #[test]
    fn structured_rows_match_elementwise_definition_and_layouts() {
        for missing in [0.0, 0.15] {
            let g = Generated::new(9, 603, 5, Dist::Genotype)
                .with_missing(missing)
                .with_populations(7, 0.2)
                .unwrap();
            // Column ranges that start and end inside populations and blocks.
            for cols in [0..603u64, 13..603, 30..31, 28..59, 250..520] {
                let w = (cols.end - cols.start) as usize;
                let mut fast = vec![0i8; 9 * w];
                g.fill_genotype_rows(0..9, cols.clone(), &mut fast);
                for i in 0..9u64 {
                    for j in cols.clone() {
                        let v = fast[i as usize * w + (j - cols.start) as usize];
                        assert_eq!(v, g.genotype(i, j), "({i}, {j})");
                        if v >= 0 {
                            let p = g.population_frequency(i, g.population_of(j));
                            assert_eq!(v, expected_dosage(&g, i, j, p));
                        }
                    }
                }
            }
            // The f64 panel paths (both layouts, transposed) give the same values.
            let whole = dense(&g, 0..9, true);
            let rows = dense(&g, 2..7, false);
            let t = dense(&g.clone().transposed(), 40..90, true);
            for i in 0..9usize {
                for j in 0..603usize {
                    let v = g.genotype(i as u64, j as u64) as f64;
                    assert_eq!(whole[[i, j]], v);
                    if (2..7).contains(&i) {
                        assert_eq!(rows[[i - 2, j]], v);
                    }
                    if (40..90).contains(&j) {
                        assert_eq!(t[[j - 40, i]], v);
                    }
                }
            }
        }
    }

    #[test]
    fn balding_nichols_frequencies_have_the_model_moments() {
        // Over many variants: E[p_q − p] = 0 and E[(p_q − p)²] = F·p(1 − p).
        let variants = 20_000u64;
        for fst in [0.05, 0.1, 0.3] {
            let g = Generated::new(variants, 4, 17, Dist::Genotype)
                .with_populations(4, fst)
                .unwrap();
            let (mut diff, mut sq, mut want, mut count) = (0.0, 0.0, 0.0, 0.0);
            for i in 0..variants {
                let p = g.allele_frequency(i);
                for q in 0..4 {
                    let pq = g.population_frequency(i, q);
                    assert!(
                        (POPULATION_FREQUENCY_MIN..=1.0 - POPULATION_FREQUENCY_MIN).contains(&pq)
                    );
                    diff += pq - p;
                    sq += (pq - p) * (pq - p);
                    want += fst * p * (1.0 - p);
                    count += 1.0;
                }
            }
            let mean = diff / count;
            let ratio = sq / want;
            assert!(mean.abs() < 0.002, "F {fst}: mean drift {mean}");
            assert!(
                (ratio - 1.0).abs() < 0.05,
                "F {fst}: variance ratio {ratio}"
            );
            // Populations differ from each other (the draws are not shared).
            assert_ne!(g.population_frequency(0, 0), g.population_frequency(0, 1));
        }
        // Extreme fixation indices still give frequencies in range.
        for fst in [1e-300, 1e-12, 0.999_999, 1.0 - f64::EPSILON] {
            let g = Generated::new(2000, 3, 5, Dist::Genotype)
                .with_populations(3, fst)
                .unwrap();
            for i in 0..2000 {
                let pq = g.population_frequency(i, i % 3);
                assert!(
                    (POPULATION_FREQUENCY_MIN..=1.0 - POPULATION_FREQUENCY_MIN).contains(&pq),
                    "F {fst}: {pq}"
                );
            }
        }
    }

    #[test]
    fn population_options_are_checked() {
        let g = Generated::new(10, 5, 1, Dist::Genotype);
        let e = g.clone().with_populations(0, 0.1).unwrap_err().to_string();
        assert!(e.starts_with("`populations`:"), "{e}");
        let e = g.clone().with_populations(6, 0.1).unwrap_err().to_string();
        assert!(e.starts_with("`populations`:") && e.contains("5"), "{e}");
        for fst in [0.0, 1.0, -0.5, f64::NAN] {
            let e = g.clone().with_populations(2, fst).unwrap_err().to_string();
            assert!(e.starts_with("`fst`:"), "{e}");
        }
        assert_eq!(g.with_populations(5, 0.5).unwrap().populations(), 5);
    }

    #[test]
    fn column_tiles_match_whole_rows() {
        for dist in [Dist::Uniform, Dist::Normal, Dist::Genotype] {
            for g in [
                Generated::new(11, 17, 3, dist),
                Generated::new(17, 11, 3, dist).transposed(),
            ] {
                let whole = dense(&g, 2..9, false);
                let mut tile = Array2::zeros((7, 5));
                g.fill_cols(2..9, 4..9, tile.view_mut()).unwrap();
                assert_eq!(tile, whole.slice(ndarray::s![.., 4..9]));
            }
        }
    }

    #[test]
    fn f32_tiles_are_the_f64_values_rounded() {
        for g in [
            Generated::new(9, 40, 2, Dist::Uniform),
            Generated::new(9, 40, 2, Dist::Normal),
            Generated::new(40, 9, 2, Dist::Uniform).transposed(),
        ] {
            let mut a = Array2::<f64>::zeros((5, 30));
            let mut b = Array2::<f32>::zeros((5, 30));
            g.fill_cols(3..8, 7..37, a.view_mut()).unwrap();
            g.fill_cols_f32(3..8, 7..37, b.view_mut()).unwrap();
            assert_eq!(b, a.mapv(|x| x as f32));
        }
    }

    #[test]
    fn different_seeds_differ() {
        let a = Generated::new(4, 4, 1, Dist::Uniform);
        let b = Generated::new(4, 4, 2, Dist::Uniform);
        assert_ne!(a.value(0, 0), b.value(0, 0));
    }

    #[test]
    fn out_of_bounds_is_an_error() {
        let g = Generated::new(4, 3, 1, Dist::Uniform);
        let mut a = Array2::zeros((2, 3));
        assert!(g.fill(3..5, a.view_mut()).is_err());
    }
}
