//! The PCA's figure (PNG) written beside its outputs: PC1/PC2, PC3/PC4 and a scree plot,
//! coloured by group.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::OnceLock;

use ndarray::ArrayView2;
use plotters::prelude::*;
use rankwise::genomics::plink_files::PcaFileError;

/// Font family name under which the run-time font is registered with plotters.
const FONT_FAMILY: &str = "sans-serif";

/// TrueType fonts tried, in order, for the plot's text (Debian's `fonts-dejavu-core` first).
const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// Loads and registers a font with plotters once per process; whether one is available.
fn font_available() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        FONT_CANDIDATES.iter().any(|candidate| {
            let Ok(bytes) = std::fs::read(candidate) else {
                return false;
            };
            // plotters keeps `&'static` font data; this runs at most once per process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font(FONT_FAMILY, FontStyle::Normal, bytes).is_ok()
        })
    })
}

/// One panel's size in pixels; the figure puts its panels side by side.
const PANEL_SIZE: (u32, u32) = (600, 560);

/// Legends are drawn only up to this many groups; beyond it they would hide the points.
const MAX_LEGEND_GROUPS: usize = 20;

/// Samples to colour by group: each sample's index into `names`.
pub(crate) struct Groups<'a> {
    /// Each sample's group.
    pub(crate) of_sample: &'a [usize],
    /// The groups' names, for the legend.
    pub(crate) names: &'a [String],
}

/// The figure's panels for `k` components, `scree` when the explained variances are known.
fn panels(k: usize, scree: bool) -> usize {
    1 + usize::from(k >= 4) + usize::from(scree && k >= 2)
}

/// The figure's size in pixels for `k` components.
pub(crate) fn figure_size(k: usize, scree: bool) -> (u32, u32) {
    (PANEL_SIZE.0 * panels(k, scree) as u32, PANEL_SIZE.1)
}

/// Writes a PNG figure of the PCA, one point per sample: PC1 (x) against PC2 (y), PC3
/// against PC4 when there are four or more components, and a scree plot of the variance
/// each component explains (`explained`, fractions of the total, one per component; empty
/// to leave the scree and the axes' percentages out). With one component the scatter shows
/// PC1 (y) against the sample index (x).
///
/// `groups`, if given, colours the points by group, with a legend of the groups' names (up
/// to 20 groups) on the first panel.
///
/// Text (title, axis descriptions, tick labels, legend) is rendered with a TrueType font
/// loaded at run time, by default `/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf` from
/// Debian's `fonts-dejavu-core` (no fontconfig needed). If no such font is found, the
/// figure is still written, with points and mesh but **without any text**, rather than
/// failing.
///
/// # Errors
/// [`PcaFileError::NoComponents`] if `pcs` has no columns, [`PcaFileError::LengthMismatch`] if
/// `groups` does not have one entry per sample (or names a group it lacks), and
/// [`PcaFileError::Plot`] if drawing or writing the PNG fails (e.g. the directory does not
/// exist).
pub(crate) fn plot_pcs(
    path: &Path,
    pcs: ArrayView2<'_, f64>,
    explained: &[f64],
    title: &str,
    groups: Option<&Groups<'_>>,
) -> Result<(), PcaFileError> {
    draw_plot(path, pcs, explained, title, groups, font_available())
}

/// Data range of `values` (finite ones), padded by 5% so points do not sit on the frame.
fn padded_range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if lo > hi {
        return -1.0..1.0;
    }
    let pad = if hi > lo {
        (hi - lo) * 0.05
    } else {
        lo.abs().max(1.0) * 0.05
    };
    (lo - pad)..(hi + pad)
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

/// [`plot_pcs`] with the font decision made by the caller (`with_text == false` draws no text).
fn draw_plot(
    path: &Path,
    pcs: ArrayView2<'_, f64>,
    explained: &[f64],
    title: &str,
    groups: Option<&Groups<'_>>,
    with_text: bool,
) -> Result<(), PcaFileError> {
    let k = pcs.ncols();
    if k == 0 {
        return Err(PcaFileError::NoComponents {
            path: path.to_path_buf(),
        });
    }
    if let Some(g) = groups {
        let bad =
            g.of_sample.len() != pcs.nrows() || g.of_sample.iter().any(|&i| i >= g.names.len());
        if bad {
            return Err(PcaFileError::LengthMismatch {
                path: path.to_path_buf(),
                what: "number of group labels (rows of the PC matrix)",
                expected: pcs.nrows(),
                found: g.of_sample.len(),
            });
        }
    }
    let plot_error = |e: &dyn std::fmt::Display| PcaFileError::Plot {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let scree = explained.len() == k;
    let root = BitMapBackend::new(path, figure_size(k, scree)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_error(&e))?;
    let body = if with_text {
        root.titled(title, (FONT_FAMILY, 24))
            .map_err(|e| plot_error(&e))?
    } else {
        root.clone()
    };
    let areas = body.split_evenly((1, panels(k, scree)));
    let mut areas = areas.iter();
    let axis = |c: usize| match explained.get(c) {
        Some(f) if scree => format!("PC{} ({:.2} % of variance)", c + 1, 100.0 * f),
        _ => format!("PC{}", c + 1),
    };
    let first = areas.next().expect("one panel at least");
    if k >= 2 {
        let points: Vec<(f64, f64)> = pcs.rows().into_iter().map(|r| (r[0], r[1])).collect();
        scatter(
            first,
            &points,
            (&axis(0), &axis(1)),
            groups,
            with_text,
            true,
        )
    } else {
        let points: Vec<(f64, f64)> = (pcs.column(0).iter().enumerate())
            .map(|(i, &v)| (i as f64, v))
            .collect();
        scatter(
            first,
            &points,
            ("Sample", &axis(0)),
            groups,
            with_text,
            true,
        )
    }
    .map_err(|e| plot_error(&e))?;
    if k >= 4 {
        let points: Vec<(f64, f64)> = pcs.rows().into_iter().map(|r| (r[2], r[3])).collect();
        let area = areas.next().expect("a panel for PC3/PC4");
        scatter(
            area,
            &points,
            (&axis(2), &axis(3)),
            groups,
            with_text,
            false,
        )
        .map_err(|e| plot_error(&e))?;
    }
    if let Some(area) = areas.next() {
        scree_plot(area, explained, with_text).map_err(|e| plot_error(&e))?;
    }
    root.present().map_err(|e| plot_error(&e))?;
    Ok(())
}

/// A scatter of `points` on `area`, coloured by `groups`, with their legend if `legend`.
fn scatter(
    area: &Area<'_>,
    points: &[(f64, f64)],
    (x_desc, y_desc): (&str, &str),
    groups: Option<&Groups<'_>>,
    with_text: bool,
    legend: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let x_range = padded_range(points.iter().map(|p| p.0));
    let y_range = padded_range(points.iter().map(|p| p.1));
    let mut builder = ChartBuilder::on(area);
    builder.margin(15);
    if with_text {
        builder.x_label_area_size(45).y_label_area_size(70);
    }
    let mut chart = builder.build_cartesian_2d(x_range, y_range)?;
    let mut mesh = chart.configure_mesh();
    mesh.light_line_style(RGBColor(230, 230, 230));
    if with_text {
        mesh.x_desc(x_desc)
            .y_desc(y_desc)
            .axis_desc_style((FONT_FAMILY, 16))
            .label_style((FONT_FAMILY, 12));
    }
    mesh.draw()?;
    let finite = |&(x, y): &(f64, f64)| x.is_finite() && y.is_finite();
    let Some(g) = groups else {
        let style = Palette99::pick(0).filled();
        chart.draw_series(
            points
                .iter()
                .copied()
                .filter(finite)
                .map(|p| Circle::new(p, 3, style)),
        )?;
        return Ok(());
    };
    let present: BTreeSet<usize> = g.of_sample.iter().copied().collect();
    let legend = legend && with_text && present.len() <= MAX_LEGEND_GROUPS;
    for &group in &present {
        let style = Palette99::pick(group).filled();
        let series = chart.draw_series(
            points
                .iter()
                .zip(g.of_sample)
                .filter(|&(p, &s)| s == group && finite(p))
                .map(|(&p, _)| Circle::new(p, 3, style)),
        )?;
        if legend {
            series
                .label(g.names[group].clone())
                .legend(move |(x, y)| Circle::new((x, y), 4, style));
        }
    }
    if legend {
        chart
            .configure_series_labels()
            .label_font((FONT_FAMILY, 12))
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    Ok(())
}

/// The variance each component explains, in % of the total, against its number.
fn scree_plot(
    area: &Area<'_>,
    explained: &[f64],
    with_text: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let percent: Vec<(f64, f64)> = explained
        .iter()
        .enumerate()
        .map(|(i, f)| ((i + 1) as f64, 100.0 * f))
        .collect();
    let top = percent.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-12);
    let mut builder = ChartBuilder::on(area);
    builder.margin(15);
    if with_text {
        builder.x_label_area_size(45).y_label_area_size(70);
    }
    let mut chart =
        builder.build_cartesian_2d(0.5..(explained.len() as f64 + 0.5), 0.0..top * 1.1)?;
    let mut mesh = chart.configure_mesh();
    mesh.light_line_style(RGBColor(230, 230, 230));
    // Components are whole numbers: ticks between them stay unlabelled.
    let whole = |x: &f64| {
        let r = x.round();
        if (x - r).abs() < 1e-9 && r >= 1.0 {
            format!("PC{r}")
        } else {
            String::new()
        }
    };
    if with_text {
        mesh.x_desc("component")
            .x_labels(2 * explained.len() + 1)
            .x_label_formatter(&whole)
            .y_desc("% of variance")
            .axis_desc_style((FONT_FAMILY, 16))
            .label_style((FONT_FAMILY, 12));
    }
    mesh.draw()?;
    let line = RGBColor(60, 60, 60);
    chart.draw_series(LineSeries::new(
        percent.iter().copied(),
        line.stroke_width(2),
    ))?;
    chart.draw_series(percent.iter().map(|&p| Circle::new(p, 4, line.filled())))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;
    use rankwise::genomics::plink_files::{write_eigenval, write_eigenvec};
    use std::fs::File;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fresh, uniquely named directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            static COUNTER: AtomicUsize = AtomicUsize::new(0);
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!(
                "rankwise-pca-files-{}-{tag}-{n}",
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

    /// The RGB pixels of the PNG at `path`, row by row, and its width and height.
    fn decode_png(path: &Path) -> (u32, u32, Vec<[u8; 3]>) {
        let file = File::open(path).expect("open png");
        let mut reader = png::Decoder::new(std::io::BufReader::new(file))
            .read_info()
            .expect("a PNG header");
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).expect("PNG image data");
        assert_eq!(info.bit_depth, png::BitDepth::Eight, "{}", path.display());
        let step = match info.color_type {
            png::ColorType::Rgb => 3,
            png::ColorType::Rgba => 4,
            other => panic!("{}: colour type {other:?}", path.display()),
        };
        let pixels = buf[..info.buffer_size()]
            .chunks_exact(step)
            .map(|p| [p[0], p[1], p[2]])
            .collect();
        (info.width, info.height, pixels)
    }

    /// The figure at `path` has `size`, and is drawn: a white background, the mesh and
    /// several other colours, and each of `groups` (Palette99 indices, the points' fills)
    /// on at least `min_pixels` pixels spread over the figure (not only a legend's marks).
    /// The callers ask for 5 pixels per point: a filled circle of radius 3 measured 37 to
    /// 39 pixels, and a legend's mark is one circle of radius 4.
    fn assert_png(path: &Path, size: (u32, u32), groups: &[usize], min_pixels: usize) {
        let (w, h, pixels) = decode_png(path);
        assert_eq!((w, h), size, "{}", path.display());
        let distinct: BTreeSet<[u8; 3]> = pixels.iter().copied().collect();
        assert!(
            distinct.len() >= 3 + groups.len(),
            "{}: {} colours",
            path.display(),
            distinct.len()
        );
        let white = pixels.iter().filter(|&&p| p == [255, 255, 255]).count();
        assert!(
            white > pixels.len() / 2,
            "{}: {white} white pixels of {}",
            path.display(),
            pixels.len()
        );
        let (mut x0, mut x1) = (u32::MAX, 0);
        for &g in groups {
            let c = Palette99::pick(g).to_rgba();
            let fill = [c.0, c.1, c.2];
            let mut count = 0;
            for (i, _) in pixels.iter().enumerate().filter(|(_, &p)| p == fill) {
                count += 1;
                let x = i as u32 % w;
                (x0, x1) = (x0.min(x), x1.max(x));
            }
            assert!(
                count >= min_pixels,
                "{}: group {g} ({fill:?}) on {count} pixels, fewer than {min_pixels}",
                path.display()
            );
        }
        // The points span the x range (padded 5 % each side) of a panel most of its width.
        assert!(
            x1 - x0 >= PANEL_SIZE.0 / 2,
            "{}: points only between x = {x0} and {x1}",
            path.display()
        );
    }

    /// Three populations' names.
    fn names() -> Vec<String> {
        ["AFR", "EUR", "EAS"].map(String::from).to_vec()
    }

    /// Explained variances for `k` components, falling.
    fn explained(k: usize) -> Vec<f64> {
        (0..k).map(|i| 0.2 / (i + 1) as f64).collect()
    }

    #[test]
    fn plot_rejects_mismatched_labels() {
        let dir = TempDir::new("badlabels");
        let path = dir.join("pcs.png");
        let names = names();
        let groups = Groups {
            of_sample: &[0, 1],
            names: &names,
        };
        let err = plot_pcs(&path, sample_pcs(5, 2).view(), &[], "t", Some(&groups)).unwrap_err();
        assert!(
            matches!(
                err,
                PcaFileError::LengthMismatch {
                    expected: 5,
                    found: 2,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("pcs.png"), "{err}");
    }

    fn clustered_pcs(n: usize) -> (Array2<f64>, Vec<usize>) {
        let labels: Vec<usize> = (0..n).map(|i| i % 3).collect();
        let pcs = Array2::from_shape_fn((n, 4), |(i, j)| {
            let g = labels[i] as f64;
            let jitter = ((i * 31 + j * 17) % 23) as f64 / 23.0 - 0.5;
            match j {
                0 => g * 3.0 + jitter * 0.8,
                1 => (g - 1.0).powi(2) * 2.0 + jitter,
                _ => jitter,
            }
        });
        (pcs, labels)
    }

    #[test]
    fn plot_writes_png_without_labels() {
        let dir = TempDir::new("plot");
        let path = dir.join("pcs.png");
        let (pcs, _) = clustered_pcs(60);
        plot_pcs(&path, pcs.view(), &explained(4), "Genotype PCA", None).expect("plot");
        // PC1/PC2, PC3/PC4 and the scree: three panels.
        assert_eq!(figure_size(4, true), (3 * PANEL_SIZE.0, PANEL_SIZE.1));
        assert_png(&path, figure_size(4, true), &[0], 2 * 60 * 5);
    }

    #[test]
    fn plot_writes_png_with_labels() {
        let dir = TempDir::new("plot-labels");
        let path = dir.join("pcs.png");
        let (pcs, labels) = clustered_pcs(60);
        let names = names();
        let groups = Groups {
            of_sample: &labels,
            names: &names,
        };
        let two = pcs.slice(ndarray::s![.., ..2]);
        plot_pcs(&path, two, &explained(2), "by population", Some(&groups)).expect("plot");
        assert_png(&path, figure_size(2, true), &[0, 1, 2], 20 * 5);
        // Without the explained variances: the scatter alone.
        plot_pcs(&path, two, &[], "by population", Some(&groups)).expect("plot");
        assert_png(&path, PANEL_SIZE, &[0, 1, 2], 20 * 5);
    }

    #[test]
    fn plot_writes_png_with_single_component() {
        let dir = TempDir::new("plot-1pc");
        let path = dir.join("pc1.png");
        let (pcs, labels) = clustered_pcs(40);
        let one = pcs.slice(ndarray::s![.., ..1]);
        plot_pcs(&path, one, &explained(1), "PC1 only", None).expect("plot without labels");
        assert_png(&path, figure_size(1, true), &[0], 40 * 5);
        let names = names();
        let groups = Groups {
            of_sample: &labels,
            names: &names,
        };
        plot_pcs(&path, one, &[], "PC1 only", Some(&groups)).expect("plot with labels");
        assert_png(&path, figure_size(1, false), &[0, 1, 2], 13 * 5);
    }

    #[test]
    fn plot_without_text_needs_no_font() {
        // Run alone (`cargo test plot::tests::plot_without_text`) this also shows that the
        // text-less path never asks plotters for a font: none is registered in that process.
        let dir = TempDir::new("plot-notext");
        let path = dir.join("pcs.png");
        let (pcs, labels) = clustered_pcs(30);
        let names = names();
        let groups = Groups {
            of_sample: &labels,
            names: &names,
        };
        draw_plot(
            &path,
            pcs.view(),
            &explained(4),
            "ignored",
            Some(&groups),
            false,
        )
        .expect("plot");
        assert_png(&path, figure_size(4, true), &[0, 1, 2], 10 * 5);
    }

    #[test]
    fn plot_rejects_zero_components() {
        let dir = TempDir::new("plot-0pc");
        let path = dir.join("pcs.png");
        let pcs = Array2::<f64>::zeros((3, 0));
        let err = plot_pcs(&path, pcs.view(), &[], "t", None).unwrap_err();
        assert!(matches!(err, PcaFileError::NoComponents { .. }), "{err:?}");
        assert!(err.to_string().contains("pcs.png"), "{err}");
    }

    #[test]
    fn missing_directory_errors_name_the_path() {
        let dir = TempDir::new("missing");
        let missing = dir.join("no/such/dir");
        let (pcs, _) = clustered_pcs(10);

        let path = missing.join("x.eigenvec");
        let err = write_eigenvec(&path, None, &ids(10), pcs.view()).unwrap_err();
        assert!(matches!(err, PcaFileError::Io { .. }), "{err:?}");
        assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");

        let path = missing.join("x.eigenval");
        let err = write_eigenval(&path, &[1.0, 2.0]).unwrap_err();
        assert!(matches!(err, PcaFileError::Io { .. }), "{err:?}");
        assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");

        let path = missing.join("x.png");
        let err = plot_pcs(&path, pcs.view(), &[], "t", None).unwrap_err();
        assert!(matches!(err, PcaFileError::Plot { .. }), "{err:?}");
        assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");
    }
}
