//! Variants selected by chromosome (`chromosomes`, `not_chromosomes`, `autosomes_only`:
//! PLINK 2's `--chr`, `--not-chr` and `--autosome`), as PLINK 2 selects them.
//!
//! Names are compared after PLINK's normalization for the human chromosome set: a `chr`
//! prefix is dropped (any case), leading zeros of a number too, `23`, `24`, `25` and `26`
//! are `X`, `Y`, `XY` and `MT`, and `M` is `MT`. So `chr1`, `01` and `1` are one
//! chromosome, and a store whose contigs are `chrX` is selected by `--not-chr X`. Other
//! contig names (scaffolds, decoys) are compared as written, ASCII letters in upper case.

use std::collections::HashSet;

use rankwise_linalg::RowSelection;
use rankwise_sources::GenotypeSource;

use super::Names;
use crate::GenomicsError as Error;

/// A chromosome name as PLINK compares it (see the module's notes).
pub(crate) fn normalize(name: &str) -> String {
    let name = name.trim();
    let name = match name.get(..3) {
        Some(p) if p.eq_ignore_ascii_case("chr") && name.len() > 3 => &name[3..],
        _ => name,
    };
    let up = name.to_ascii_uppercase();
    let digits = up.trim_start_matches('0');
    if !up.is_empty() && up.bytes().all(|b| b.is_ascii_digit()) {
        return match digits {
            "23" => "X".into(),
            "24" => "Y".into(),
            "25" => "XY".into(),
            "26" => "MT".into(),
            "" => "0".into(),
            d => d.into(),
        };
    }
    match up.as_str() {
        "M" => "MT".into(),
        _ => up,
    }
}

/// The number of a normalized human chromosome (1–22, X 23, Y 24, XY 25, MT 26): the
/// ends of a range.
fn number(name: &str) -> Option<u32> {
    match name {
        "X" => Some(23),
        "Y" => Some(24),
        "XY" => Some(25),
        "MT" => Some(26),
        n => n.parse().ok().filter(|n| (1..=26).contains(n)),
    }
}

/// The number an end of a range names: as in PLINK 2, a number 0–26 (with or without a
/// `chr` prefix), not a letter code (`X-Y` is an error there too).
fn range_end(token: &str) -> Option<u32> {
    let name = normalize(token);
    let digits = token
        .trim()
        .bytes()
        .rev()
        .take_while(u8::is_ascii_digit)
        .count();
    let numeric = digits > 0 && digits + 3 >= token.trim().len();
    match name.as_str() {
        "0" if numeric => Some(0),
        _ if numeric => number(&name),
        _ => None,
    }
}

/// The name of chromosome number `n` (0–26).
fn name_of(n: u32) -> String {
    match n {
        23 => "X".into(),
        24 => "Y".into(),
        25 => "XY".into(),
        26 => "MT".into(),
        n => n.to_string(),
    }
}

/// The normalized chromosomes of a PLINK list: comma-separated names and ranges of
/// chromosome numbers (`1-4,22,X`, `0-2`, `23-26`).
pub(crate) fn parse_list(parameter: &'static str, list: &str) -> Result<HashSet<String>, Error> {
    let bad = |message: String| Error::Parameter { parameter, message };
    let mut out = HashSet::new();
    for item in list.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(bad(format!("{list:?} has an empty entry")));
        }
        match item.split_once('-') {
            None => {
                out.insert(normalize(item));
            }
            Some((a, b)) => {
                let (Some(a), Some(b)) = (range_end(a), range_end(b)) else {
                    return Err(bad(format!(
                        "{item:?}: a range runs between chromosome numbers (0–26; X, Y, XY \
                         and MT are 23–26)"
                    )));
                };
                if a > b {
                    return Err(bad(format!("{item:?} runs backwards")));
                }
                out.extend((a..=b).map(name_of));
            }
        }
    }
    Ok(out)
}

/// What `chromosomes`, `not_chromosomes` and `autosomes_only` keep, and whether the
/// variants on X, Y and MT are left out as PLINK 2's `--pca` leaves them out.
pub(crate) struct ChromosomeFilter {
    /// The first parameter given, for errors (`non_autosomes` when none is).
    parameter: &'static str,
    /// The parameters given, as the caller names them (`--chr 1-22 --not-chr 6`).
    origin: String,
    keep: Option<HashSet<String>>,
    drop: Option<HashSet<String>>,
    autosome: bool,
    /// Leave out X, Y and MT (PLINK 2's `--pca`: "Excluding N variants on non-autosomes
    /// from PCA"); XY (the pseudo-autosomal regions, diploid) and other contigs stay, as
    /// there.
    sex_and_mt_out: bool,
    /// How the caller names the parameter that keeps them.
    keeps_them: &'static str,
}

/// Whether a normalized chromosome name is X, Y or MT: those PLINK 2's `--pca` leaves out
/// (measured with plink2 v2.00a3.5: XY and unplaced contigs stay in).
fn sex_or_mt(name: &str) -> bool {
    matches!(name, "X" | "Y" | "MT")
}

impl ChromosomeFilter {
    /// The filter of the parameters given (named in `origin` by `names`); `None` when none
    /// is and X, Y and MT stay in (`sex_and_mt_out` false).
    pub(crate) fn new(
        chr: Option<&str>,
        not_chr: Option<&str>,
        autosome: bool,
        sex_and_mt_out: bool,
        names: Names,
    ) -> Result<Option<ChromosomeFilter>, Error> {
        let given = [
            ("autosomes_only", autosome.then_some("")),
            ("chromosomes", chr),
            ("not_chromosomes", not_chr),
        ];
        let parameter = given.iter().find(|(_, v)| v.is_some()).map(|(o, _)| *o);
        let parameter = match parameter {
            Some(p) => p,
            None if sex_and_mt_out => "non_autosomes",
            None => return Ok(None),
        };
        let origin = given
            .iter()
            .filter_map(|(o, v)| v.map(|v| format!("{} {v}", names(o)).trim_end().to_owned()))
            .collect::<Vec<_>>()
            .join(" ");
        Ok(Some(ChromosomeFilter {
            parameter,
            origin,
            keep: chr.map(|l| parse_list("chromosomes", l)).transpose()?,
            drop: not_chr
                .map(|l| parse_list("not_chromosomes", l))
                .transpose()?,
            autosome,
            sex_and_mt_out,
            keeps_them: names("non_autosomes"),
        }))
    }

    /// Whether a variant on chromosome `name` (as the source names it) is kept by the
    /// parameters given, and whether X, Y and MT being left out removes it then.
    fn admits(&self, name: &str) -> (bool, bool) {
        let name = normalize(name);
        let autosome = || number(&name).is_some_and(|n| n <= 22);
        let given = self.keep.as_ref().is_none_or(|k| k.contains(&name))
            && !self.drop.as_ref().is_some_and(|d| d.contains(&name))
            && (!self.autosome || autosome());
        let left_out = given && self.sex_and_mt_out && sex_or_mt(&name);
        (given && !left_out, left_out)
    }

    /// Whether only the default is in force (no `chromosomes`, `not_chromosomes` or
    /// `autosomes_only`).
    fn default_only(&self) -> bool {
        self.parameter == "non_autosomes"
    }

    /// The rows the filter keeps, one bit per variant of `source`, read from its
    /// chromosome names; `None` when only the default is in force and it leaves nothing
    /// out, or the source does not name chromosomes.
    pub(crate) fn select(
        &self,
        source: &dyn GenotypeSource,
    ) -> Result<Option<RowSelection>, Error> {
        let mut selection = RowSelection::builder(self.origin.clone());
        let mut left_out = false;
        let has = source.variant_chromosomes(&mut |c| {
            let (kept, out) = self.admits(c);
            left_out |= out;
            selection.push(kept);
        })?;
        let error = |message: String| Error::Parameter {
            parameter: self.parameter,
            message,
        };
        if !has {
            if self.default_only() {
                return Ok(None);
            }
            return Err(error(format!(
                "{} does not say which chromosome a variant is on (a PLINK fileset's .bim \
                 and a VCF Zarr store's variant_contig and contig_id do)",
                source.describe()
            )));
        }
        if selection.rows() != source.shape().0 {
            return Err(error(format!(
                "{} gave {} chromosome names for {} variants",
                source.describe(),
                selection.rows(),
                source.shape().0
            )));
        }
        if !left_out {
            return Ok((!self.default_only()).then_some(selection));
        }
        let note = format!(
            "X, Y and MT (left out as plink2 --pca leaves them out; {} keeps them)",
            self.keeps_them
        );
        let origin = match self.origin.as_str() {
            "" => note,
            o => format!("{o}; {note}"),
        };
        Ok(Some(selection.with_origin(origin)))
    }

    /// The parameters given, as the caller names them.
    pub(crate) fn origin(&self) -> &str {
        &self.origin
    }

    /// The first parameter given.
    pub(crate) fn parameter(&self) -> &'static str {
        self.parameter
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_normalized_as_plink_compares_them() {
        for (given, want) in [
            ("1", "1"),
            ("chr1", "1"),
            ("CHR01", "1"),
            ("01", "1"),
            ("23", "X"),
            ("chrX", "X"),
            ("x", "X"),
            ("24", "Y"),
            ("25", "XY"),
            ("chrM", "MT"),
            ("26", "MT"),
            ("mt", "MT"),
            ("0", "0"),
            ("chr", "CHR"),
            ("scaffold_7", "SCAFFOLD_7"),
            ("chré", "é"),
        ] {
            assert_eq!(normalize(given), want, "{given}");
        }
    }

    #[test]
    fn lists_expand_ranges_of_numbered_chromosomes() {
        let set = |l: &str| {
            let mut v: Vec<String> = parse_list("chromosomes", l).unwrap().into_iter().collect();
            v.sort();
            v
        };
        assert_eq!(set("1-3,chr22"), ["1", "2", "22", "3"]);
        assert_eq!(set("22-24"), ["22", "X", "Y"]);
        assert_eq!(set("0-1,chr25"), ["0", "1", "XY"]);
        assert_eq!(set("chrX, MT"), ["MT", "X"]);
        for bad in [
            "",
            "1,,2",
            "3-1",
            "1-scaffold",
            "X-1",
            "22-X",
            "1-27",
            "chr1-chrY",
        ] {
            let e = parse_list("chromosomes", bad).unwrap_err().to_string();
            assert!(e.contains("chromosomes"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_options_keep_what_plink_keeps() {
        let cli = |p: &str| match p {
            "autosomes_only" => "--autosome",
            "chromosomes" => "--chr",
            "non_autosomes" => "--include-non-autosomes",
            _ => "--not-chr",
        };
        let f = |chr, not, auto| {
            ChromosomeFilter::new(chr, not, auto, false, cli)
                .unwrap()
                .unwrap()
        };
        let names = ["1", "chr2", "22", "X", "chrY", "XY", "MT", "0", "scaffold"];
        let kept = |f: &ChromosomeFilter| -> Vec<&str> {
            names.iter().copied().filter(|n| f.admits(n).0).collect()
        };
        assert_eq!(kept(&f(None, None, true)), ["1", "chr2", "22"]);
        assert_eq!(kept(&f(Some("2-23"), None, false)), ["chr2", "22", "X"]);
        assert_eq!(
            kept(&f(None, Some("1,24-26,0"), false)),
            ["chr2", "22", "X", "scaffold"]
        );
        assert_eq!(kept(&f(Some("1-2,X"), Some("2"), true)), ["1"]);
        assert!(ChromosomeFilter::new(None, None, false, false, cli)
            .unwrap()
            .is_none());
        assert_eq!(
            f(Some("1-4"), Some("3"), true).origin(),
            "--autosome --chr 1-4 --not-chr 3"
        );
        // By default X, Y and MT are left out, as plink2 --pca leaves them out; XY and
        // other contigs stay, and the options given still apply.
        let pca = ChromosomeFilter::new(None, None, false, true, cli)
            .unwrap()
            .unwrap();
        assert_eq!(kept(&pca), ["1", "chr2", "22", "XY", "0", "scaffold"]);
        assert_eq!(pca.admits("chrX"), (false, true));
        let both = ChromosomeFilter::new(Some("2-23"), None, false, true, cli)
            .unwrap()
            .unwrap();
        assert_eq!(kept(&both), ["chr2", "22"]);
        assert_eq!(
            both.admits("1"),
            (false, false),
            "--chr left it out, not the default"
        );
    }
}
