//! `rankwise gen`: a generated matrix written as a Zarr store, panel by panel, by the actors
//! that own the panels.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use rankwise_exec::format_bytes;
use rankwise_exec::{ChunkGrid, MemoryPlan, Placement, Runtime};
use rankwise_sources::{Dist, Generated, GenotypeSource, PanelSource};
use serde_json::json;

use super::{finish_output, injected_fault, open_collectively, CliError, RunArgs};
use crate::launcher::LaunchInfo;
use crate::report::seconds;
use rankwise::output::gen_store::{
    Codec, DType, GenLayout, GenStore, PanelWritten, Shuffle, ZarrFormat,
};
use rankwise::output::report::{peak_rss_bytes, RankReport, RunReport};

/// `rankwise gen`.
#[derive(Args, Debug, Clone)]
pub(super) struct GenArgs {
    /// The Zarr store to write (must not exist). Genotypes are a group with `call_dosage`
    /// (variants × samples) and `sample_id`; other values are an array at this path.
    #[arg(long)]
    out: PathBuf,
    /// Rows of the matrix (variants, for genotypes).
    #[arg(long)]
    rows: u64,
    /// Columns of the matrix (samples, for genotypes).
    #[arg(long)]
    cols: u64,
    /// Rows per stored chunk.
    #[arg(long)]
    chunk_rows: u64,
    /// Seed of the generator.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Distribution of the generated values: uniform, normal or genotype.
    #[arg(long, default_value = "uniform")]
    dist: Dist,
    /// Columns per stored chunk (default: all columns).
    #[arg(long)]
    chunk_cols: Option<u64>,
    /// Genotypes only: populations (contiguous blocks of samples with Balding–Nichols
    /// allele frequencies) [default: 1].
    #[arg(long)]
    populations: Option<u64>,
    /// Genotypes only: F_ST of the populations, in (0, 1) [default: 0.1].
    #[arg(long)]
    fst: Option<f64>,
    /// Genotypes only: fraction of calls stored missing (−1) [default: 0].
    #[arg(long)]
    missing: Option<f64>,
    /// Stored type [default: f64; i8 for genotypes]. Floats hold every distribution
    /// (f32 rounds); integers hold genotypes only.
    #[arg(long, value_enum)]
    dtype: Option<DType>,
    /// Zarr format.
    #[arg(long, value_enum, default_value = "v3")]
    format: ZarrFormat,
    /// Compression of the chunks.
    #[arg(long, value_enum, default_value = "blosc-lz4")]
    codec: Codec,
    /// Blosc shuffle [default: bit for the blosc codecs, none otherwise].
    #[arg(long, value_enum)]
    shuffle: Option<Shuffle>,
    /// Rows per shard (Zarr v3 sharding, a multiple of --chunk-rows); a shard spans all
    /// columns, so each panel of this many rows is one file.
    #[arg(long)]
    shard_rows: Option<u64>,
    #[command(flatten)]
    run: RunArgs,
    /// Print the report as JSON on stdout instead of the text summary.
    #[arg(long)]
    json: bool,
}

impl GenArgs {
    pub(super) fn run(&self) -> &RunArgs {
        &self.run
    }

    /// The layout, with every option checked; errors name the option.
    fn layout(&self) -> Result<GenLayout, CliError> {
        rankwise_sources::Generated::check_shape(self.rows, self.cols)?;
        ChunkGrid::new(self.rows, self.cols, self.chunk_rows)?;
        let genotypes = self.dist == Dist::Genotype;
        for (given, option) in [
            (self.populations.is_some(), "--populations"),
            (self.fst.is_some(), "--fst"),
            (self.missing.is_some(), "--missing"),
        ] {
            if given && !genotypes {
                return Err(CliError::Option {
                    option,
                    message: format!("only for --dist genotype, not {}", self.dist),
                });
            }
        }
        let missing = self.missing.unwrap_or(0.0);
        if !(0.0..1.0).contains(&missing) {
            return Err(CliError::Option {
                option: "--missing",
                message: format!("{missing} is not a fraction in [0, 1)"),
            });
        }
        let source = Generated::new(self.rows, self.cols, self.seed, self.dist)
            .with_missing(missing)
            .with_populations(
                self.populations.unwrap_or(1),
                self.fst.unwrap_or(rankwise_sources::DEFAULT_FST),
            )?;
        let layout = GenLayout {
            source,
            chunk_rows: self.chunk_rows,
            chunk_cols: self.chunk_cols.unwrap_or(self.cols),
            shard_rows: self.shard_rows,
            dtype: self
                .dtype
                .unwrap_or(if genotypes { DType::I8 } else { DType::F64 }),
            format: self.format,
            codec: self.codec,
            shuffle: self.shuffle.unwrap_or(if self.codec.shuffles() {
                Shuffle::Bit
            } else {
                Shuffle::None
            }),
        };
        layout.validate().map_err(|e| CliError::Option {
            option: super::flag_of(e.parameter),
            message: super::with_flags(&e.message),
        })?;
        Ok(layout)
    }
}

pub(super) fn gen_command(
    rt: &Runtime,
    launch: &LaunchInfo,
    a: &GenArgs,
) -> Result<Option<String>, CliError> {
    let start = Instant::now();
    injected_fault(rt, "start")?;
    // Every rank refuses bad options or a budget that cannot hold one write before the
    // output exists.
    let layout = a.layout()?;
    let placement = Placement::compute(layout.panels(), rt.world());
    for asg in &placement.assignments {
        let actor = &rt.world().ranks[asg.rank][asg.actor];
        MemoryPlan::decide(actor.memory, layout.workspace_bytes(), actor.threads, 0)?;
    }
    let output = open_collectively(
        rt,
        &a.out,
        |tmp| GenStore::create(&a.out, tmp, layout.clone()),
        |tmp| GenStore::open(&a.out, tmp, layout.clone()),
    )?;
    let result = write_store(rt, launch, a, &output.0, &placement, start);
    finish_output(rt, result, Some(output))
}

fn write_store(
    rt: &Runtime,
    launch: &LaunchInfo,
    a: &GenArgs,
    store: &Arc<GenStore>,
    placement: &Placement,
    start: Instant,
) -> Result<Option<String>, CliError> {
    let comm = rt.comm();
    let me = rt.rank();
    injected_fault(rt, "before-write")?;
    // One job per worker thread, its share of the actor's panels dealt round-robin, so
    // that each thread reuses one set of buffers for all of its chunks.
    let mine_only = placement.assignments.iter().filter(|asg| asg.rank == me);
    let inputs: Vec<Vec<Vec<usize>>> = mine_only
        .zip(rt.actors())
        .map(|(asg, actor)| {
            let threads = actor.threads().max(1);
            (0..threads)
                .map(|t| asg.panels.clone().skip(t).step_by(threads).collect())
                .filter(|share: &Vec<usize>| !share.is_empty())
                .collect()
        })
        .collect();
    let writing = Instant::now();
    let shared = Arc::clone(store);
    let written = rt.map(inputs, move |_, share| shared.write_panels(&share))?;
    let mut mine = PanelWritten::default();
    for w in written.into_iter().flatten() {
        let w = w?;
        mine.files += w.files;
        mine.stored_bytes += w.stored_bytes;
    }
    let write_seconds = writing.elapsed().as_secs_f64();
    injected_fault(rt, "after-write")?;
    let all = super::gather_rank_figures(
        rt,
        GenWork {
            files: mine.files,
            stored_bytes: mine.stored_bytes + store.metadata_bytes(),
            write_seconds,
        },
    )?;
    // Every rank's last chunk is written.
    let text = match all {
        Some(ranks) => {
            injected_fault(rt, "commit")?;
            store.commit()?;
            let report = report_json(rt, launch, a, store.layout(), placement, ranks, start);
            Some(if a.json {
                serde_json::to_string_pretty(&report).unwrap_or_default() + "\n"
            } else {
                let value = serde_json::to_value(&report).unwrap_or_default();
                summary_text(a, store.layout(), &value)
            })
        }
        None => None,
    };
    // Every rank learns whether rank 0 committed: a failure there is announced to all.
    comm.barrier()?;
    Ok(text)
}

fn report_json(
    rt: &Runtime,
    launch: &LaunchInfo,
    a: &GenArgs,
    layout: &GenLayout,
    placement: &Placement,
    ranks: Vec<RankReport<GenWork>>,
    start: Instant,
) -> RunReport<serde_json::Value, GenWork> {
    let stored: u64 = ranks.iter().map(|r| r.work.stored_bytes).sum();
    let files: u64 = ranks.iter().map(|r| r.work.files).sum();
    let uncompressed = layout.uncompressed_bytes();
    let elapsed = start.elapsed().as_secs_f64();
    let (rows, cols) = layout.shape();
    let body = json!({
        "out": a.out,
        "array": layout.matrix_path().trim_start_matches('/'),
        "sample_id": layout.is_genotypes(),
        "shape": [rows, cols],
        "chunks": layout.chunk_shape(),
        "shard_rows": layout.shard_rows.map(|_| layout.panel_rows()),
        "dtype": layout.dtype,
        "format": layout.format,
        "codec": layout.codec,
        "shuffle": layout.shuffle,
        "attributes": layout.generator_attributes(),
        "panels": layout.panels(),
        "panel_rows": layout.panel_rows(),
        "placement": placement,
        "files": files,
        "stored_bytes": stored,
        "uncompressed_bytes": uncompressed,
        "compression_ratio": uncompressed as f64 / stored.max(1) as f64,
        "gb_per_s": uncompressed as f64 / elapsed / 1e9,
        "stored_gb_per_s": stored as f64 / elapsed / 1e9,
    });
    RunReport {
        command: "gen".into(),
        body,
        run: super::run_info(rt, launch, start),
        seconds: elapsed,
        per_rank: ranks,
    }
}

/// One rank's share of a generated store.
#[derive(serde::Serialize, serde::Deserialize)]
struct GenWork {
    /// Files it wrote.
    files: u64,
    /// Bytes it stored (rank 0's include the metadata).
    stored_bytes: u64,
    /// Its seconds writing.
    write_seconds: f64,
}

fn summary_text(a: &GenArgs, layout: &GenLayout, r: &serde_json::Value) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let g = &layout.source;
    let what = if layout.is_genotypes() {
        GenotypeSource::describe(g)
    } else {
        PanelSource::describe(g)
    };
    let _ = writeln!(s, "rankwise gen: {what}");
    let [cr, cc] = layout.chunk_shape();
    let shards = match layout.shard_rows {
        Some(_) => format!(" in shards of {} rows", layout.panel_rows()),
        None => String::new(),
    };
    let codec = match layout.codec {
        c if c.shuffles() => format!("{c} ({}-shuffle)", layout.shuffle),
        c => c.to_string(),
    };
    let _ = writeln!(
        s,
        "  zarr {}, {}, chunks {cr} × {cc}{shards}, {codec}; {} panels of {} rows on {} \
         rank(s), {} actor(s), transport {}",
        layout.format,
        layout.dtype,
        layout.panels(),
        layout.panel_rows(),
        r["ranks"],
        r["actors"],
        r["transport"].as_str().unwrap_or("?"),
    );
    let num = |k: &str| r[k].as_f64().unwrap_or(0.0);
    let _ = writeln!(
        s,
        "wrote {} uncompressed as {} stored in {} files ({:.2}×) in {}: {:.3} GB/s \
         uncompressed, {:.3} GB/s stored; peak RSS rank 0 {}",
        format_bytes(num("uncompressed_bytes") as u64),
        format_bytes(num("stored_bytes") as u64),
        r["files"],
        num("compression_ratio"),
        seconds(num("seconds")),
        num("gb_per_s"),
        num("stored_gb_per_s"),
        peak_rss_bytes()
            .map(format_bytes)
            .unwrap_or_else(|| "unknown".into())
    );
    let _ = writeln!(
        s,
        "output: {}{}",
        a.out.display(),
        if layout.is_genotypes() {
            " (call_dosage, sample_id)"
        } else {
            ""
        }
    );
    s
}
