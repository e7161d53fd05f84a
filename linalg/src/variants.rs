//! Which variants a PCA keeps: PLINK's `--maf`, `--geno` and `--hwe`, decided from each
//! variant's counts of calls, which the first pass takes anyway (on the host from decoded
//! rows, or on the device from generated codes), and `--extract`/`--exclude`, by the
//! variants' identifiers, decided before the first pass ([`RowSelection`]).
//!
//! # Why a filtered variant is not dropped
//!
//! A variant the filter excludes has a zero row, like a dropped (monomorphic) one, but it is
//! not among the `M` variants that scale the eigenvalues: PLINK 2 removes filtered variants
//! before `--pca`, and keeps the monomorphic ones it was given.
//!
//! # The Hardy–Weinberg exact test
//!
//! Given `n` called genotypes carrying `r` copies of the minor allele, the number of
//! heterozygotes `h` (of `r`'s parity) has the distribution of Wigginton, Cutler & Abecasis
//! (2005), with `P(h − 2)/P(h) = h(h − 1) / (4 (hom_r + 1)(hom_c + 1))`. It is log-concave:
//! the terms fall monotonically on both sides of the mode, so the walk starts at the mode
//! and stops on each side once the terms no longer change the sums in f64, a few standard
//! deviations (`~√n`) out, instead of visiting all `r/2 + 1` terms. The p-value is the mass
//! of the configurations no likelier than the observed one (relative tolerance
//! `TIE`, so that ties computed through different products are ties), with `midp` less
//! half the observed configuration's probability (Graffelman & Moreno 2013).

use std::sync::Arc;

use serde::{Serialize, Serializer};

use crate::layout::RowCounts;
use crate::LinalgError;

/// Relative tolerance under which two configurations' probabilities count as equal.
const TIE: f64 = 1e-12;

/// How the Hardy–Weinberg p-value is formed (PLINK's `--hwe P` and `--hwe P midp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HweP {
    /// The exact test's p-value.
    Exact,
    /// The mid-p value: the exact p-value less half the observed configuration's
    /// probability.
    MidP,
}

/// The rows a PCA keeps by their variants' identifiers (`--extract`, `--exclude`): one bit
/// per variant, every rank holding all of them (12.5 MB for 10⁸ variants).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowSelection {
    words: Vec<u64>,
    rows: u64,
    kept: u64,
    origin: String,
}

impl RowSelection {
    /// The selection of `rows` rows keeping those for which `keep` (called once per row, in
    /// order) is true; `origin` says how it was made (`--extract prune.in`), for messages.
    pub fn new(rows: u64, origin: impl Into<String>, mut keep: impl FnMut(u64) -> bool) -> Self {
        let mut s = RowSelection::builder(origin);
        for row in 0..rows {
            s.push(keep(row));
        }
        s
    }

    /// An empty selection that [`RowSelection::push`] extends row by row.
    pub fn builder(origin: impl Into<String>) -> Self {
        RowSelection {
            words: Vec::new(),
            rows: 0,
            kept: 0,
            origin: origin.into(),
        }
    }

    /// Appends a row, kept or not.
    pub fn push(&mut self, keep: bool) {
        if self.rows.is_multiple_of(64) {
            self.words.push(0);
        }
        if keep {
            *self.words.last_mut().expect("pushed above") |= 1 << (self.rows % 64);
            self.kept += 1;
        }
        self.rows += 1;
    }

    /// Rows in the selection, kept or not.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Whether row `row` is kept (rows past the selection's are not).
    pub fn contains(&self, row: u64) -> bool {
        row < self.rows && self.words[(row / 64) as usize] >> (row % 64) & 1 == 1
    }

    /// Rows kept.
    pub fn kept(&self) -> u64 {
        self.kept
    }

    /// How the selection was made.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The same selection, described by `origin`.
    pub fn with_origin(mut self, origin: impl Into<String>) -> Self {
        self.origin = origin.into();
        self
    }
}

/// A selection in a report: how it was made and how many rows it keeps, not its bits.
fn selection_summary<S: Serializer>(
    rows: &Option<Arc<RowSelection>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Summary<'a> {
        origin: &'a str,
        kept: u64,
    }
    rows.as_ref()
        .map(|r| Summary {
            origin: &r.origin,
            kept: r.kept,
        })
        .serialize(s)
}

/// Which variants a PCA keeps, as PLINK's `--maf`, `--geno`, `--hwe`, `--extract` and
/// `--exclude` decide: a variant whose minor allele frequency among its calls is below
/// `min_maf`, whose fraction of missing calls is above `max_missing`, whose Hardy–Weinberg
/// exact test p-value is below `min_hwe_p`, or whose row `rows` leaves out, is excluded (see
/// the module notes).
///
/// The frequencies are exact ratios of counts, each rounded once, so a variant exactly at a
/// threshold is kept, as PLINK 2 keeps it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VariantFilter {
    /// Smallest minor allele frequency kept, in `[0, 0.5]`; with 0 nothing is excluded for
    /// its frequency.
    pub min_maf: f64,
    /// Largest fraction of missing calls kept, in `[0, 1]`; with 1 nothing is excluded for
    /// its missing calls.
    pub max_missing: f64,
    /// Smallest Hardy–Weinberg p-value kept, in `[0, 1]`; with 0 no test is made.
    pub min_hwe_p: f64,
    /// How that p-value is formed.
    pub hwe: HweP,
    /// The rows kept by identifier, if a selection was made.
    #[serde(serialize_with = "selection_summary")]
    pub rows: Option<Arc<RowSelection>>,
}

impl VariantFilter {
    /// Keeps every variant.
    pub const NONE: VariantFilter = VariantFilter {
        min_maf: 0.0,
        max_missing: 1.0,
        min_hwe_p: 0.0,
        hwe: HweP::Exact,
        rows: None,
    };

    /// A filter of the given thresholds; each is checked against its range, and an error
    /// names the option at fault (`--maf`, `--geno`).
    pub fn new(min_maf: f64, max_missing: f64) -> Result<VariantFilter, LinalgError> {
        if !(0.0..=0.5).contains(&min_maf) {
            return Err(LinalgError::Option {
                parameter: "maf",
                message: format!("{min_maf} is not a minor allele frequency in [0, 0.5]"),
            });
        }
        if !(0.0..=1.0).contains(&max_missing) {
            return Err(LinalgError::Option {
                parameter: "geno",
                message: format!("{max_missing} is not a fraction of missing calls in [0, 1]"),
            });
        }
        Ok(VariantFilter {
            min_maf,
            max_missing,
            ..VariantFilter::NONE
        })
    }

    /// The same filter, also excluding variants whose Hardy–Weinberg p-value (formed as
    /// `how` says) is below `min_p`, a probability (an error names `--hwe` otherwise).
    pub fn with_hwe(self, min_p: f64, how: HweP) -> Result<VariantFilter, LinalgError> {
        if !(0.0..=1.0).contains(&min_p) {
            return Err(LinalgError::Option {
                parameter: "hwe",
                message: format!("{min_p} is not a p-value in [0, 1]"),
            });
        }
        Ok(VariantFilter {
            min_hwe_p: min_p,
            hwe: how,
            ..self
        })
    }

    /// The same filter, also excluding the rows `rows` leaves out.
    pub fn with_rows(self, rows: RowSelection) -> VariantFilter {
        VariantFilter {
            rows: Some(Arc::new(rows)),
            ..self
        }
    }

    /// Whether the filter keeps row `row` with these counts.
    pub fn keeps_row(&self, row: u64, counts: &RowCounts) -> bool {
        self.rows.as_ref().is_none_or(|r| r.contains(row)) && self.keeps(counts)
    }

    /// The parameters that set this filter (`` `maf` X `geno` Y `hwe` P `` and the
    /// selection's origin, those that exclude anything), for messages.
    pub fn options(&self) -> String {
        let mut options = Vec::new();
        if self.min_maf > 0.0 {
            options.push(format!("`maf` {}", self.min_maf));
        }
        if self.max_missing < 1.0 {
            options.push(format!("`geno` {}", self.max_missing));
        }
        if self.min_hwe_p > 0.0 {
            let midp = if self.hwe == HweP::MidP { " midp" } else { "" };
            options.push(format!("`hwe` {}{midp}", self.min_hwe_p));
        }
        if let Some(rows) = &self.rows {
            options.push(rows.origin.clone());
        }
        options.join(" ")
    }

    /// Whether the filter's thresholds keep the variant of these counts (the selection by
    /// identifier aside: [`VariantFilter::keeps_row`]). A variant without calls has no
    /// allele frequency: any `min_maf` above 0 excludes it.
    pub fn keeps(&self, counts: &RowCounts) -> bool {
        let [zeros, ones, twos] = counts.dosages;
        let calls = zeros + ones + twos;
        let samples = calls + counts.missing;
        if samples > 0 && counts.missing as f64 / samples as f64 > self.max_missing {
            return false;
        }
        if self.min_maf > 0.0 {
            let alleles = 2 * calls;
            let alt = ones + 2 * twos;
            let minor = alt.min(alleles - alt);
            if calls == 0 || (minor as f64 / alleles as f64) < self.min_maf {
                return false;
            }
        }
        !(self.min_hwe_p > 0.0 && hwe_p(counts.dosages, self.hwe) < self.min_hwe_p)
    }
}

impl Default for VariantFilter {
    fn default() -> Self {
        VariantFilter::NONE
    }
}

/// The Hardy–Weinberg exact test's p-value for the genotype counts `[hom, het, hom]` (either
/// homozygote first), formed as `how` says; 1 without calls.
pub fn hwe_p(counts: [u64; 3], how: HweP) -> f64 {
    let [a, het, b] = counts;
    let (hom_r, hom_c) = (a.min(b), a.max(b));
    let n = hom_r + het + hom_c;
    if n == 0 {
        return 1.0;
    }
    let rare = 2 * hom_r + het;
    let hets_at = |h: u64| ((rare - h) / 2, n - (rare + h) / 2);
    // The mode, `r(2n − r)/(2n)` heterozygotes, moved to `r`'s parity.
    let mut mode = (rare as u128 * (2 * n - rare) as u128 / (2 * n) as u128) as u64;
    if mode % 2 != rare % 2 {
        mode += 1;
    }
    // P(h − 2)/P(h) and P(h + 2)/P(h).
    let down = |h: u64| {
        let (r, c) = hets_at(h);
        (h as f64 * (h - 1) as f64) / (4.0 * (r + 1) as f64 * (c + 1) as f64)
    };
    let up = |h: u64| {
        let (r, c) = hets_at(h);
        (4.0 * r as f64 * c as f64) / ((h + 2) as f64 * (h + 1) as f64)
    };
    // The observed configuration's probability relative to the mode's.
    let mut observed = 1.0f64;
    let mut h = mode;
    while h > het && observed > 0.0 {
        observed *= down(h);
        h -= 2;
    }
    while h < het && observed > 0.0 {
        observed *= up(h);
        h += 2;
    }
    if observed == 0.0 {
        // Below f64's range next to the mode: below any threshold.
        return 0.0;
    }
    let limit = observed * (1.0 + TIE);
    let (mut total, mut tail) = (1.0f64, if limit >= 1.0 { 1.0 } else { 0.0 });
    // Each side from the mode outward, until its terms change neither sum.
    for side in [Side::Down, Side::Up] {
        let (mut h, mut p) = (mode, 1.0f64);
        loop {
            p *= match side {
                Side::Down if h >= 2 => down(h),
                Side::Up if h + 2 <= rare => up(h),
                _ => break,
            };
            h = match side {
                Side::Down => h - 2,
                Side::Up => h + 2,
            };
            total += p;
            if p <= limit {
                tail += p;
            }
            // Past the limit the terms only shrink: stop once they are lost in both sums.
            if p <= limit && p < total * f64::EPSILON * f64::EPSILON && p < tail * f64::EPSILON {
                break;
            }
        }
    }
    let p = match how {
        HweP::Exact => tail / total,
        HweP::MidP => (tail - 0.5 * observed) / total,
    };
    p.min(1.0)
}

/// Direction of the walk away from the mode.
#[derive(Clone, Copy)]
enum Side {
    Down,
    Up,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Rng;

    #[test]
    fn variant_filter_keeps_variants_on_its_thresholds() {
        // 20 samples, 2 missing (0.1), 36 alleles with 9 of the minor one (0.25), whichever
        // allele it is.
        for dosages in [[9, 9, 0], [0, 9, 9]] {
            let counts = RowCounts {
                dosages,
                missing: 2,
            };
            let f = |maf, geno| VariantFilter::new(maf, geno).unwrap().keeps(&counts);
            assert!(f(0.25, 0.1));
            assert!(!f(0.2501, 0.1));
            assert!(!f(0.25, 0.0999));
            assert!(f(0.0, 1.0) && f(0.5 * 0.5, 1.0));
        }
        let none = RowCounts {
            dosages: [0, 0, 0],
            missing: 7,
        };
        assert!(VariantFilter::NONE.keeps(&none));
        assert!(!VariantFilter::new(0.01, 1.0).unwrap().keeps(&none));
        assert!(!VariantFilter::new(0.0, 0.99).unwrap().keeps(&none));
        let hwe = |p| VariantFilter::NONE.with_hwe(p, HweP::Exact).unwrap();
        assert!(hwe(1.0).keeps(&none), "no calls: p = 1");
        let mono = RowCounts {
            dosages: [0, 0, 30],
            missing: 0,
        };
        assert!(VariantFilter::new(0.0, 0.0).unwrap().keeps(&mono));
        assert!(!VariantFilter::new(1e-9, 1.0).unwrap().keeps(&mono));
        assert!(hwe(1.0).keeps(&mono), "monomorphic: p = 1");
        // Every sample heterozygous: far from equilibrium.
        let hets = RowCounts {
            dosages: [0, 40, 0],
            missing: 0,
        };
        assert!(!hwe(1e-6).keeps(&hets) && hwe(1e-12).keeps(&hets));
        for (r, option) in [
            (VariantFilter::new(0.6, 1.0), "maf"),
            (VariantFilter::new(-0.1, 1.0), "maf"),
            (VariantFilter::new(f64::NAN, 1.0), "maf"),
            (VariantFilter::new(0.1, 1.5), "geno"),
            (VariantFilter::new(0.1, f64::NAN), "geno"),
            (VariantFilter::NONE.with_hwe(1.5, HweP::Exact), "hwe"),
            (VariantFilter::NONE.with_hwe(f64::NAN, HweP::MidP), "hwe"),
        ] {
            match r {
                Err(LinalgError::Option { parameter, .. }) => assert_eq!(parameter, option),
                other => panic!("{option}: {other:?}"),
            }
        }
    }

    #[test]
    fn row_selections_hold_the_rows_pushed_kept() {
        let mut rng = Rng::fresh();
        for _ in 0..20 {
            let rows = rng.below(300) as u64;
            let keep: Vec<bool> = (0..rows).map(|_| rng.below(2) == 1).collect();
            let s = RowSelection::new(rows, "`extract` t", |r| keep[r as usize]);
            assert_eq!(s.rows(), rows);
            assert_eq!(s.kept(), keep.iter().filter(|&&k| k).count() as u64);
            assert_eq!(s.origin(), "`extract` t");
            for r in 0..rows + 70 {
                assert_eq!(
                    s.contains(r),
                    r < rows && keep[r as usize],
                    "row {r} of {rows}"
                );
            }
        }
    }

    /// The whole distribution, every term from `h = 0` or 1 up to `r`, as Wigginton et al.
    /// give it: the p-values the walk from the mode must reproduce.
    fn every_term(counts: [u64; 3], how: HweP) -> f64 {
        let [a, het, b] = counts;
        let (hom_r, hom_c) = (a.min(b), a.max(b));
        let n = hom_r + het + hom_c;
        let rare = 2 * hom_r + het;
        let mut probs = vec![0.0f64; rare as usize + 1];
        let first = rare % 2;
        probs[first as usize] = 1.0;
        let mut h = first;
        while h + 2 <= rare {
            let (r, c) = ((rare - h) / 2, n - (rare + h) / 2);
            probs[h as usize + 2] =
                probs[h as usize] * 4.0 * r as f64 * c as f64 / ((h + 2) * (h + 1)) as f64;
            h += 2;
        }
        let total: f64 = probs.iter().sum();
        let obs = probs[het as usize];
        let tail: f64 = probs
            .iter()
            .skip(first as usize)
            .step_by(2)
            .filter(|&&p| p <= obs * (1.0 + TIE))
            .sum();
        match how {
            HweP::Exact => tail / total,
            HweP::MidP => (tail - 0.5 * obs) / total,
        }
        .min(1.0)
    }

    #[test]
    fn hwe_p_values_are_those_of_the_whole_distribution() {
        let mut rng = Rng::fresh();
        for round in 0..400 {
            let n = 1 + rng.below([10, 60, 300][round % 3]) as u64;
            let q = rng.below(1001) as f64 / 1000.0;
            // Hardy–Weinberg proportions, or an excess of one class.
            let het = match rng.below(3) {
                0 => (2.0 * q * (1.0 - q) * n as f64) as u64,
                1 => rng.below(n as usize + 1) as u64,
                _ => 0,
            };
            let a = rng.below((n - het) as usize + 1) as u64;
            let counts = [a, het, n - het - a];
            for how in [HweP::Exact, HweP::MidP] {
                let (got, want) = (hwe_p(counts, how), every_term(counts, how));
                assert!(
                    (got - want).abs() <= 1e-12 * want.max(1e-300),
                    "{counts:?} {how:?}: {got} vs {want}"
                );
                assert!(got <= 1.0 && (got > 0.0 || how == HweP::MidP && want == 0.0));
            }
        }
    }

    /// Counts of a million samples: the walk visits a few thousand terms, not half a
    /// million, and its p-values behave (1 at equilibrium, tiny far from it, symmetric in
    /// the homozygotes).
    #[test]
    fn hwe_p_values_of_biobank_sized_counts() {
        let p = hwe_p([250_000, 500_000, 250_000], HweP::Exact);
        assert!(p > 0.9, "{p}");
        let p = hwe_p([260_000, 480_000, 260_000], HweP::Exact);
        assert!(p < 1e-100, "{p}");
        for counts in [[1, 2_000, 997_999], [640_000, 320_000, 40_000]] {
            let flipped = [counts[2], counts[1], counts[0]];
            assert_eq!(
                hwe_p(counts, HweP::Exact),
                hwe_p(flipped, HweP::Exact),
                "{counts:?}"
            );
        }
        assert!(hwe_p([0, 1_000_000, 0], HweP::Exact) == 0.0);
    }
}
