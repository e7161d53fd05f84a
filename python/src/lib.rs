//! `rankwise._rankwise`: the Python package's native module, a thin client of the `rankwise`
//! library. The package (`rankwise/__init__.py`) turns numpy arrays, Zarr arrays, dask
//! arrays and xarray Datasets into one of three inputs and calls [`run`]:
//!
//! * a specification string (a Zarr array or store path or URL, a VCF Zarr store, a PLINK
//!   prefix), opened by [`rankwise::open`];
//! * a float64 or float32 numpy array, read in place ([`rankwise::memory::rows_in_place`]);
//! * an int8 numpy array of dosages ([`rankwise::memory::dosages_in_place`]);
//! * a function that computes rows of a float matrix on demand, one panel at a time
//!   ([`rankwise::memory::rows_pulled`]): a dask array with no Zarr origin.
//!
//! The work runs on a thread of its own while the interpreter waits without the GIL: other
//! Python threads keep running, Ctrl-C interrupts the run ([`rankwise::exec::Interrupter`])
//! and raises `KeyboardInterrupt` once the actors stop, and a progress callback is called
//! on the interpreter's thread.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, RecvTimeoutError};
use numpy::{
    IntoPyArray, PyArray2, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyFileNotFoundError, PyKeyboardInterrupt, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use rankwise::exec::{Interrupter, Progress, RuntimeError};
use rankwise::genomics::{IdList, PcaParams, Selection};
use rankwise::linalg::{GemmProbe, HweP, LinalgError, MachineGemm, SvdOptions, VariantFilter};
use rankwise::output::group::ZarrFormat;
use rankwise::sources::RemoteOptions;
use rankwise::{Error, Method, Precision, Runtime, SolverChoice, Values};

/// How often the waiting interpreter looks for a signal and calls the progress callback.
const POLL: Duration = Duration::from_millis(50);
/// The progress callback's period.
const PROGRESS_EVERY: Duration = Duration::from_millis(500);

/// What the call reads: a specification, or a numpy buffer lent for the call.
enum Source {
    Spec(String),
    Matrix(Buffer),
    Dosages(Buffer, Option<Vec<String>>),
    Calls(Buffer3, Option<Buffer3>, Option<Vec<String>>),
    Pulled(Arc<PyPuller>, u64, u64),
}

/// A Python function `fetch(start, stop)` that returns rows `start..stop` of this rank's
/// block as a 2-D float64 array: called on the actors' read threads, each holding the GIL
/// only while the function runs and its result is copied.
struct PyPuller {
    fetch: Py<PyAny>,
    cols: usize,
    what: String,
    /// The first exception the function raised: the cause of the call's error.
    raised: Mutex<Option<PyErr>>,
}

impl rankwise::memory::RowPuller for PyPuller {
    fn pull(&self, rows: std::ops::Range<u64>, out: &mut [f64]) -> Result<(), String> {
        let h = (rows.end - rows.start) as usize;
        Python::attach(|py| {
            let copied = (|| -> PyResult<()> {
                let a = self.fetch.call1(py, (rows.start, rows.end))?;
                let a = a.bind(py).cast::<PyArray2<f64>>().map_err(|_| {
                    PyTypeError::new_err(format!(
                        "fetch({}, {}) returned {}, not a 2-D float64 array",
                        rows.start,
                        rows.end,
                        a.bind(py)
                            .get_type()
                            .name()
                            .map_or("?".to_string(), |n| n.to_string())
                    ))
                })?;
                let ro = a.try_readonly()?;
                let v = ro.as_array();
                if v.dim() != (h, self.cols) {
                    return Err(PyValueError::new_err(format!(
                        "fetch({}, {}) returned {:?} values, not {h} × {}",
                        rows.start,
                        rows.end,
                        v.dim(),
                        self.cols
                    )));
                }
                for (dst, src) in out.chunks_exact_mut(self.cols).zip(v.rows()) {
                    for (d, s) in dst.iter_mut().zip(src) {
                        *d = *s;
                    }
                }
                Ok(())
            })();
            copied.map_err(|e| {
                let message = e.to_string();
                self.raised
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(e);
                message
            })
        })
    }

    fn describe(&self) -> String {
        self.what.clone()
    }
}

/// A 3-D numpy array of bytes (VCF Zarr's `call_genotype` or its mask): address, shape
/// and byte strides.
#[derive(Clone, Copy)]
struct Buffer3 {
    ptr: usize,
    shape: (usize, usize, usize),
    strides: [isize; 3],
}

fn buffer3(a: &Bound<'_, PyUntypedArray>, what: &str) -> PyResult<Buffer3> {
    if a.ndim() != 3 || a.dtype().itemsize() != 1 {
        return Err(value_error(
            what,
            format!(
                "{} dimensions of {}: variants × samples × ploidy of int8 (bool for the mask)",
                a.ndim(),
                a.dtype()
            ),
        ));
    }
    let (shape, strides) = (a.shape(), a.strides());
    // SAFETY: reading the array object's data pointer field.
    let ptr = unsafe { (*a.as_array_ptr()).fields.data } as usize;
    Ok(Buffer3 {
        ptr,
        shape: (shape[0], shape[1], shape[2]),
        strides: [strides[0], strides[1], strides[2]],
    })
}

/// A numpy array's address, shape and element strides; the array stays borrowed (and
/// alive) on the interpreter's thread until the work has finished.
#[derive(Clone, Copy)]
struct Buffer {
    ptr: usize,
    rows: usize,
    cols: usize,
    strides: (isize, isize),
    /// The values are float32 (a matrix; else float64) or int8 (dosages).
    elem: usize,
}

/// The options of a call, read from the keyword dictionary.
struct Job {
    command: Command,
    solver: SolverChoice,
    require_converged: bool,
    /// `svd`, `rsvd`, `pca`: measure the machine's rates after the run (`machine_limit`).
    machine_limit: bool,
    /// With `machine_limit`: this interpreter loading this module, as the process that
    /// measures OpenBLAS's other kernels.
    gemm_probe: Option<rankwise::linalg::GemmProbe>,
    check: bool,
    filter: VariantFilter,
    selection: Selection,
    panel_rows: u64,
    /// `pca`: where to write the projection files; `project`: where to read them.
    weights: Option<String>,
    /// `pca`: the result group to publish, with PLINK 2's side files beside it.
    out: Option<String>,
    /// Its Zarr format (3, or 2 for sgkit 0.10).
    zarr_format: Option<u8>,
    /// `calibrate`: matrix values per measurement.
    values: Option<u64>,
}

#[derive(Clone, Copy, PartialEq)]
enum Command {
    Svd,
    Rsvd,
    Pca,
    Project,
    Calibrate,
}

/// The results of a call, as plain values (sent from the work thread).
enum Outcome {
    Svd {
        s: Vec<f64>,
        wt: ndarray::Array2<f64>,
        local: rankwise::LocalRows,
        transposed: bool,
        /// This rank's phases, each with its flops and the bytes it produced.
        timings: Vec<rankwise::linalg::PhaseTiming>,
        /// The machine's GEMM rate (FLOP/s) and production rate (bytes/s), all ranks
        /// together (`machine_limit`).
        peaks: Option<(MachineGemm, f64)>,
    },
    Rsvd {
        result: Box<rankwise::RsvdResult>,
        local: rankwise::LocalRows,
        /// The machine's GEMM rate (FLOP/s) and the rate its tiles are produced at
        /// (bytes/s, 8 a value), all ranks together (`machine_limit`).
        peaks: Option<(MachineGemm, f64)>,
    },
    Pca {
        pca: Box<rankwise::genomics::Pca>,
        /// The machine's GEMM rate in the solver's precision (`machine_limit`), FLOP/s,
        /// all ranks together.
        peak: Option<MachineGemm>,
    },
    Project(Box<rankwise::genomics::projection::Projection>),
    /// The rates `calibrate` measured, as the JSON `rankwise calibrate` writes.
    Calibrate(String),
}

/// A failure of the work, with what Python needs to pick its exception.
struct Failure {
    error: Error,
    rank: usize,
}

fn value_error(parameter: &str, message: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("`{parameter}`: {message}"))
}

fn get<'py, T: FromPyObjectOwned<'py>>(
    d: &Bound<'py, PyDict>,
    key: &str,
    used: &mut Vec<String>,
) -> PyResult<Option<T>> {
    used.push(key.to_string());
    match d.get_item(key)? {
        Some(v) if !v.is_none() => v
            .extract::<T>()
            .map(Some)
            .map_err(|e| value_error(key, e.into())),
        _ => Ok(None),
    }
}

fn id_list(ids: Option<Vec<String>>, what: &str) -> Option<IdList> {
    ids.map(|ids| {
        let mut l = IdList::new(ids);
        l.origin = format!("`{what}` ({} IDs)", l.ids.len());
        l
    })
}

fn parse_job(command: &str, o: &Bound<'_, PyDict>) -> PyResult<Job> {
    let command = match command {
        "svd" => Command::Svd,
        "rsvd" => Command::Rsvd,
        "pca" => Command::Pca,
        "project" => Command::Project,
        "calibrate" => Command::Calibrate,
        other => return Err(value_error("command", format!("unknown command {other:?}"))),
    };
    let mut used = Vec::new();
    let d = SolverChoice::default();
    let method = match get::<String>(o, "method", &mut used)?.as_deref() {
        None | Some("auto") => None,
        Some("lobpcg") => Some(Method::Lobpcg),
        Some("lanczos") => Some(Method::Lanczos),
        Some("subspace") => Some(Method::SubspaceIteration),
        Some("block-krylov") | Some("block_krylov") => Some(Method::BlockKrylov),
        Some(other) => {
            return Err(value_error(
                "method",
                format!(
                    "{other:?} is none of \"lobpcg\", \"lanczos\", \"subspace\", \"block-krylov\""
                ),
            ))
        }
    };
    let precision = match get::<String>(o, "precision", &mut used)?.as_deref() {
        None | Some("auto") => None,
        Some("f64") | Some("float64") => Some(Precision::F64),
        Some("f32") | Some("float32") => Some(Precision::F32),
        Some(other) => {
            return Err(value_error(
                "precision",
                format!("{other:?} is none of \"auto\", \"f32\", \"f64\""),
            ))
        }
    };
    let solver = SolverChoice {
        k: get(o, "k", &mut used)?.unwrap_or(d.k),
        oversample: get(o, "oversample", &mut used)?.unwrap_or(d.oversample),
        power_iters: get(o, "power_iters", &mut used)?,
        method,
        tol: get(o, "tol", &mut used)?.unwrap_or(d.tol),
        max_passes: get(o, "max_passes", &mut used)?.unwrap_or(d.max_passes),
        precision,
        seed: get(o, "seed", &mut used)?.unwrap_or(d.seed),
        probes: get(o, "probes", &mut used)?.unwrap_or(d.probes),
    };
    let mut filter = VariantFilter::NONE;
    if let Some(maf) = get::<f64>(o, "maf", &mut used)? {
        filter.min_maf = maf;
    }
    if let Some(geno) = get::<f64>(o, "geno", &mut used)? {
        filter.max_missing = geno;
    }
    if let Some(hwe) = get::<f64>(o, "hwe", &mut used)? {
        filter.min_hwe_p = hwe;
    }
    if get::<bool>(o, "hwe_midp", &mut used)?.unwrap_or(false) {
        filter.hwe = HweP::MidP;
    }
    let selection = Selection {
        keep: id_list(get(o, "keep", &mut used)?, "keep"),
        remove: id_list(get(o, "remove", &mut used)?, "remove"),
        extract: id_list(get(o, "extract", &mut used)?, "extract"),
        exclude: id_list(get(o, "exclude", &mut used)?, "exclude"),
        chromosomes: get(o, "chromosomes", &mut used)?,
        not_chromosomes: get(o, "not_chromosomes", &mut used)?,
        autosomes_only: get(o, "autosome", &mut used)?.unwrap_or(false),
        non_autosomes: get(o, "non_autosomes", &mut used)?.unwrap_or(false),
    };
    let job = Job {
        command,
        solver,
        require_converged: get(o, "require_converged", &mut used)?.unwrap_or(false),
        machine_limit: get(o, "machine_limit", &mut used)?.unwrap_or(false),
        gemm_probe: None,
        check: get(o, "check", &mut used)?.unwrap_or(false),
        filter,
        selection,
        panel_rows: get(o, "panel_rows", &mut used)?.unwrap_or(0),
        weights: get(o, "weights", &mut used)?,
        out: get(o, "out", &mut used)?,
        zarr_format: get(o, "zarr_format", &mut used)?,
        values: get(o, "values", &mut used)?,
    };
    for key in o.keys() {
        let key: String = key.extract()?;
        if !used.contains(&key) {
            return Err(PyTypeError::new_err(format!(
                "unexpected keyword argument {key:?}"
            )));
        }
    }
    Ok(job)
}

/// The world of the call: actors, budget, and the host's communicator (a Fortran handle).
struct WorldArgs {
    world: rankwise::World,
    comm: Option<i32>,
}

fn parse_world(w: &Bound<'_, PyDict>) -> PyResult<WorldArgs> {
    let mut used = Vec::new();
    let mut world = rankwise::World::embedded();
    if let Some(n) = get::<usize>(w, "actors", &mut used)? {
        world = world.actors(n);
    }
    if let Some(n) = get::<usize>(w, "threads_per_actor", &mut used)? {
        world = world.threads_per_actor(n);
    }
    if let Some(b) = get::<u64>(w, "memory_per_actor", &mut used)? {
        world = world.memory_per_actor(b);
    }
    if let Some(p) = get::<bool>(w, "pin", &mut used)? {
        world = world.pin(p);
    }
    if let Some(d) = get::<String>(w, "device", &mut used)? {
        let choice = d
            .parse::<rankwise::DeviceChoice>()
            .map_err(|message| value_error("device", message))?;
        world = world.device(choice);
    }
    let comm = get::<i32>(w, "comm", &mut used)?;
    // Each call's settings start from the process's defaults (the environment's), not
    // from the last call's: an `endpoint_url` given once does not stay.
    static BASELINE: std::sync::OnceLock<RemoteOptions> = std::sync::OnceLock::new();
    let mut remote = BASELINE.get_or_init(RemoteOptions::current).clone();
    if let Some(url) = get::<String>(w, "endpoint_url", &mut used)? {
        remote.endpoint_url = Some(url);
    }
    if let Some(n) = get::<usize>(w, "io_concurrency", &mut used)? {
        remote.concurrency = n.max(1);
    }
    if let Some(n) = get::<usize>(w, "io_retries", &mut used)? {
        remote.retries = n;
    }
    RemoteOptions::set_default(remote);
    for key in w.keys() {
        let key: String = key.extract()?;
        if !used.contains(&key) {
            return Err(PyTypeError::new_err(format!(
                "unexpected keyword argument {key:?}"
            )));
        }
    }
    Ok(WorldArgs { world, comm })
}

/// Reads a 2-D numpy array's buffer: its element strides must be non-negative multiples of
/// the element size (numpy's own arrays and their transposes are).
fn buffer(a: &Bound<'_, PyUntypedArray>, elem: usize) -> PyResult<Buffer> {
    if a.ndim() != 2 {
        return Err(value_error("a", format!("{} dimensions, not 2", a.ndim())));
    }
    let shape = a.shape();
    let strides = a.strides();
    let mut el = [0isize; 2];
    for i in 0..2 {
        if strides[i] < 0 || strides[i] % elem as isize != 0 {
            return Err(value_error(
                "a",
                format!("byte strides {strides:?} cannot be read in place: pass a copy"),
            ));
        }
        el[i] = strides[i] / elem as isize;
    }
    // SAFETY: reading the array object's data pointer field.
    let ptr = unsafe { (*a.as_array_ptr()).fields.data } as usize;
    if !ptr.is_multiple_of(elem) {
        // The values are read as `elem`-byte numbers in place, which needs them aligned.
        return Err(value_error(
            "a",
            format!("its data is not aligned to its {elem}-byte elements: pass a copy"),
        ));
    }
    Ok(Buffer {
        ptr,
        rows: shape[0],
        cols: shape[1],
        strides: (el[0], el[1]),
        elem,
    })
}

/// What the interpreter's thread and the work thread share while the work runs.
#[derive(Default)]
struct Shared {
    interrupter: Mutex<Option<Interrupter>>,
    progress: Mutex<Option<Arc<Progress>>>,
    interrupted: std::sync::atomic::AtomicBool,
}

fn build_runtime(world: &WorldArgs) -> Result<Runtime, Error> {
    match world.comm {
        None => world.world.build(),
        Some(fint) => {
            rankwise::host_mpi::mpi_ready().map_err(host_error)?;
            let dup = rankwise::host_mpi::duplicate(fint).map_err(host_error)?;
            world.world.build_on(dup)
        }
    }
}

fn host_error(e: rankwise::host_mpi::HostMpiError) -> Error {
    Error::Parameter {
        parameter: "comm",
        message: e.to_string(),
    }
}

/// This interpreter, loading this module from its file without the package (the
/// package's `_EXTENSION_ALONE`, whose import would choose the kernels the probe is to
/// measure) and calling `serve_gemm_probe`: how [`rankwise::linalg::machine_gemm_peak`]
/// measures the kernels OpenBLAS would load with another `OPENBLAS_CORETYPE`. `None`
/// where the interpreter or the file is unknown (an embedded interpreter), and the limit
/// is then the loaded kernels' rate.
fn gemm_probe(py: Python<'_>) -> Option<GemmProbe> {
    let exe: String = py
        .import("sys")
        .ok()?
        .getattr("executable")
        .ok()?
        .extract()
        .ok()?;
    let file: String = (py.import("rankwise._rankwise").ok()?)
        .getattr("__file__")
        .ok()?
        .extract()
        .ok()?;
    let load: String = (py.import("rankwise").ok()?)
        .getattr("_EXTENSION_ALONE")
        .ok()?
        .extract()
        .ok()?;
    let code = load + "sys.exit(x.serve_gemm_probe())\n";
    (!exe.is_empty()).then(|| GemmProbe::new(exe, ["-c", code.as_str(), file.as_str()]))
}

/// `gemm_peak_flops` (the machine's GEMM rate), `gemm_kernels` (the kernels that reach it)
/// and `gemm_loaded_flops` (the rate of the kernels this process runs, where the best are
/// others) of a call with `machine_limit`; `None` each without.
fn gemm_items(d: &Bound<'_, PyDict>, gemm: Option<MachineGemm>) -> PyResult<()> {
    d.set_item("gemm_peak_flops", gemm.as_ref().map(|g| g.flops))?;
    d.set_item("gemm_kernels", gemm.as_ref().map(|g| g.kernels.clone()))?;
    d.set_item("gemm_loaded_flops", gemm.and_then(|g| g.loaded_flops))?;
    Ok(())
}

fn work(
    source: Source,
    job: Job,
    world: WorldArgs,
    shared: Arc<Shared>,
) -> Result<Outcome, Failure> {
    let rt = build_runtime(&world).map_err(|error| Failure { error, rank: 0 })?;
    let rank = rt.rank();
    *shared.interrupter.lock().unwrap_or_else(|e| e.into_inner()) = Some(rt.interrupter());
    *shared.progress.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::clone(rt.progress()));
    if shared
        .interrupted
        .load(std::sync::atomic::Ordering::Acquire)
    {
        rt.interrupter().interrupt();
    }
    // Other ranks may wait for this one in a collective: a failure is announced to them.
    let fail = |error: Error| {
        let error = rankwise::fail_collectively(&rt, error);
        let rank = error.peer_failure().map_or(rank, |(r, _)| r);
        Failure { error, rank }
    };
    if job.command == Command::Calibrate {
        let values = job
            .values
            .unwrap_or(rankwise::sizing::DEFAULT_CALIBRATION_VALUES);
        let rates = rankwise::sizing::calibrate(&rt, values).map_err(fail)?;
        return Ok(Outcome::Calibrate(
            serde_json::to_string_pretty(&rates).unwrap_or_default() + "\n",
        ));
    }
    // The lease ends when this function returns, before the interpreter gets its arrays
    // back: no read can outlive the call.
    let (input, _lease) = match source {
        Source::Spec(spec) => (rankwise::open(&spec).map_err(fail)?, None),
        Source::Matrix(b) => {
            // SAFETY: the interpreter's thread holds the array (borrowed read-only) until
            // this thread has ended; `buffer` checked its shape and strides, and its
            // element size says its type.
            let (input, lease) = unsafe {
                match b.elem {
                    4 => rankwise::memory::rows_in_place(
                        &rt,
                        b.ptr as *const f32,
                        b.rows,
                        b.cols,
                        b.strides,
                        job.panel_rows,
                    ),
                    _ => rankwise::memory::rows_in_place(
                        &rt,
                        b.ptr as *const f64,
                        b.rows,
                        b.cols,
                        b.strides,
                        job.panel_rows,
                    ),
                }
            }
            .map_err(fail)?;
            (input, Some(lease))
        }
        Source::Calls(c, mask, ids) => {
            // SAFETY: as for a matrix; `buffer3` read the shapes and strides.
            let (input, lease) = unsafe {
                rankwise::memory::calls_in_place(
                    c.ptr as *const i8,
                    c.shape,
                    c.strides,
                    mask.map(|m| (m.ptr as *const u8, m.strides)),
                    ids,
                )
            }
            .map_err(fail)?;
            (input, Some(lease))
        }
        Source::Pulled(puller, rows, cols) => (
            rankwise::memory::rows_pulled(&rt, puller, rows, cols, job.panel_rows).map_err(fail)?,
            None,
        ),
        Source::Dosages(b, ids) => {
            // SAFETY: as for a matrix.
            let (input, lease) = unsafe {
                rankwise::memory::dosages_in_place(
                    b.ptr as *const i8,
                    b.rows,
                    b.cols,
                    b.strides,
                    ids,
                )
            }
            .map_err(fail)?;
            (input, Some(lease))
        }
    };
    let outcome = match job.command {
        Command::Svd => {
            let (r, local) =
                rankwise::svd(&rt, &input, &SvdOptions { check: job.check }).map_err(fail)?;
            // Collective: every rank probes at once.
            let peaks = match job.machine_limit {
                true => {
                    let gemm = rankwise::linalg::machine_gemm_peak(
                        &rt,
                        rankwise::Precision::F64,
                        job.gemm_probe.as_ref(),
                    )
                    .map_err(|e| fail(e.into()))?;
                    let production = rankwise::production_peak(&rt, &input).map_err(fail)?;
                    Some((gemm, production))
                }
                false => None,
            };
            Outcome::Svd {
                s: r.s,
                wt: r.wt,
                local,
                transposed: r.transposed,
                timings: r.timings,
                peaks,
            }
        }
        Command::Rsvd => {
            // A float32 array or Zarr array holds f32 values.
            let stored_f32 = input.matrix().ok().is_some_and(|(s, _)| s.holds_f32());
            let options = job
                .solver
                .options(Values::Dense { f32: stored_f32 })
                .map_err(fail)?;
            let (result, local) =
                rankwise::rsvd_with_factor(&rt, &input, &options).map_err(fail)?;
            if job.require_converged && !result.convergence.converged {
                return Err(fail(Error::NotConverged(not_converged(
                    &result.convergence,
                ))));
            }
            // Collective: every rank probes at once. A randomized SVD's input is a float
            // matrix: its passes produce the tiles they multiply.
            let peaks = match job.machine_limit {
                true => {
                    let gemm = rankwise::linalg::machine_gemm_peak(
                        &rt,
                        options.precision,
                        job.gemm_probe.as_ref(),
                    )
                    .map_err(|e| fail(e.into()))?;
                    let production = rankwise::tile_production_peak(
                        &rt,
                        &input,
                        &result.plan,
                        options.precision,
                    )
                    .map_err(fail)?;
                    Some((gemm, production))
                }
                false => None,
            };
            Outcome::Rsvd {
                result: Box::new(result),
                local,
                peaks,
            }
        }
        Command::Pca => {
            let params = PcaParams {
                solver: job.solver.options(Values::Genotypes).map_err(fail)?,
                filter: job.filter,
                selection: job.selection,
                panel_rows: (job.panel_rows > 0).then_some(job.panel_rows),
                require_converged: job.require_converged,
                weights: job.weights.map(std::path::PathBuf::from),
                // sgkit's `sample_pca_loading`, which `to_xarray` returns as sgkit does.
                loadings: true,
            };
            let pca = match job.out {
                Some(out) => {
                    let mut files = rankwise::pca_group::PcaFiles::new(out);
                    files.zarr_format = match job.zarr_format.unwrap_or(3) {
                        3 => ZarrFormat::V3,
                        2 => ZarrFormat::V2,
                        other => {
                            return Err(fail(Error::Parameter {
                                parameter: "zarr_format",
                                message: format!("{other}: 2 or 3"),
                            }))
                        }
                    };
                    rankwise::pca_to_group(&rt, &input, &params, files)
                }
                None => rankwise::pca(&rt, &input, &params),
            };
            let pca = pca.map_err(fail)?;
            // Collective: every rank probes at once. A genotype pass's products read
            // packed codes: its limit is the GEMM rate's alone.
            let peak = match job.machine_limit {
                true => Some(
                    rankwise::linalg::machine_gemm_peak(
                        &rt,
                        params.solver.precision,
                        job.gemm_probe.as_ref(),
                    )
                    .map_err(|e| fail(e.into()))?,
                ),
                false => None,
            };
            Outcome::Pca {
                pca: Box::new(pca),
                peak,
            }
        }
        Command::Calibrate => unreachable!("answered before the input is opened"),
        Command::Project => {
            let Some(pca) = job.weights else {
                return Err(fail(Error::Parameter {
                    parameter: "pca",
                    message: "the PCA's prefix is required".into(),
                }));
            };
            let panels = (job.panel_rows > 0).then_some(job.panel_rows);
            Outcome::Project(Box::new(
                rankwise::project(&rt, &input, std::path::Path::new(&pca), panels).map_err(fail)?,
            ))
        }
    };
    Ok(outcome)
}

fn not_converged(c: &rankwise::Convergence) -> String {
    let missed: Vec<String> = c
        .met
        .iter()
        .enumerate()
        .filter(|(_, m)| !**m)
        .map(|(i, _)| format!("{} ({:.1e})", i + 1, c.residuals[i]))
        .collect();
    format!(
        "components {} did not reach the tolerance {:.1e}",
        missed.join(", "),
        c.tol
    )
}

/// Python's exception for a failure: `ValueError` for a bad argument, `FileNotFoundError`
/// for a missing input, `KeyboardInterrupt` for an interrupted run, else
/// `rankwise.RankwiseError(message, rank, cause)`.
fn to_py(py: Python<'_>, f: Failure) -> PyErr {
    let message = f.error.to_string();
    if f.error.parameter().is_some() {
        return PyValueError::new_err(message);
    }
    match &f.error {
        Error::Runtime(RuntimeError::Interrupted { .. }) => {
            return PyKeyboardInterrupt::new_err(message)
        }
        Error::Linalg(LinalgError::Runtime(RuntimeError::Interrupted { .. })) => {
            return PyKeyboardInterrupt::new_err(message)
        }
        _ => {}
    }
    if f.error.is_not_found() {
        return PyFileNotFoundError::new_err(message);
    }
    let kind = match &f.error {
        Error::NotConverged(_) => "not-converged",
        // A panel that could not be read or holds values that cannot be used.
        Error::Source(_)
        | Error::Linalg(LinalgError::Source(_))
        | Error::Linalg(LinalgError::Panel { .. })
        | Error::Linalg(LinalgError::NonFinite { .. }) => "input",
        Error::Transport(_) | Error::Linalg(LinalgError::Transport(_)) => "transport",
        Error::Runtime(_) | Error::Linalg(LinalgError::Runtime(_)) => "runtime",
        _ => "compute",
    };
    match py
        .import("rankwise")
        .and_then(|m| m.getattr("RankwiseError"))
        .and_then(|cls| cls.call1((message.clone(), f.rank, kind)))
    {
        Ok(e) => PyErr::from_value(e),
        Err(e) => e,
    }
}

fn progress_dict<'py>(py: Python<'py>, p: &Progress) -> PyResult<Bound<'py, PyDict>> {
    let s = p.snapshot();
    let d = PyDict::new(py);
    d.set_item("title", s.title)?;
    d.set_item("subject", s.subject)?;
    d.set_item("seconds", s.seconds)?;
    d.set_item("pass", s.pass)?;
    d.set_item("max_passes", s.max_passes)?;
    d.set_item("jobs_done", s.jobs.0)?;
    d.set_item("jobs", s.jobs.1)?;
    d.set_item("residual", s.residual.map(|r| r.0))?;
    d.set_item("tol", s.residual.map(|r| r.1))?;
    d.set_item("passes_left", s.passes_left)?;
    Ok(d)
}

fn convergence_dict<'py>(
    py: Python<'py>,
    c: &rankwise::Convergence,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("converged", c.converged)?;
    d.set_item("tol", c.tol)?;
    d.set_item("residuals", c.residuals.clone())?;
    d.set_item("met", c.met.clone())?;
    d.set_item("measure", c.measure)?;
    d.set_item("history", c.history.clone())?;
    d.set_item(
        "pass_precisions",
        c.pass_precisions
            .iter()
            .map(|p| match p {
                Precision::F32 => "f32",
                Precision::F64 => "f64",
            })
            .collect::<Vec<_>>(),
    )?;
    d.set_item("stopped", c.stopped.clone())?;
    Ok(d)
}

/// Phases as dicts: name, seconds, flops of the products with the whole matrix, and the
/// bytes of matrix values this rank produced (8 a value).
fn phases_list<'py>(
    py: Python<'py>,
    timings: &[rankwise::linalg::PhaseTiming],
) -> PyResult<Bound<'py, PyList>> {
    let phases = PyList::empty(py);
    for t in timings {
        let p = PyDict::new(py);
        p.set_item("phase", &t.phase)?;
        p.set_item("seconds", t.seconds)?;
        p.set_item("flops", t.flops)?;
        p.set_item("produced_bytes", t.produced_bytes)?;
        phases.append(p)?;
    }
    Ok(phases)
}

fn outcome_dict<'py>(py: Python<'py>, o: Outcome) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    match o {
        Outcome::Svd {
            s,
            wt,
            local,
            transposed,
            timings,
            peaks,
        } => {
            d.set_item("s", s.into_pyarray(py))?;
            d.set_item("wt", wt.into_pyarray(py))?;
            d.set_item("factor", local.values.into_pyarray(py))?;
            d.set_item("factor_rows", local.rows.into_pyarray(py))?;
            d.set_item("transposed", transposed)?;
            // This rank's phases, each with its flops and the bytes it produced: at the two
            // probes' rates, a pass's machine limit (`rankwise svd --machine-limit`).
            d.set_item("phases", phases_list(py, &timings)?)?;
            d.set_item("production_peak_bytes_per_s", peaks.as_ref().map(|p| p.1))?;
            gemm_items(&d, peaks.map(|p| p.0))?;
        }
        Outcome::Rsvd {
            result,
            local,
            peaks,
        } => {
            let r = *result;
            d.set_item("s", r.s.into_pyarray(py))?;
            d.set_item("wt", r.wt.into_pyarray(py))?;
            d.set_item("factor", local.values.into_pyarray(py))?;
            d.set_item("factor_rows", local.rows.into_pyarray(py))?;
            d.set_item("transposed", r.transposed)?;
            d.set_item("convergence", convergence_dict(py, &r.convergence)?)?;
            d.set_item("passes", r.passes)?;
            d.set_item("total_sum_squares", r.total_sum_squares)?;
            d.set_item("estimate", r.estimate.map(|e| e.relative_frobenius))?;
            d.set_item("bytes_read", r.read.stored_bytes)?;
            // This rank's phases, each with its products' flops with the whole matrix and
            // the bytes it produced: at the two probes' rates, a pass's machine limit
            // (`rankwise rsvd --machine-limit`).
            d.set_item("phases", phases_list(py, &r.timings)?)?;
            d.set_item("production_peak_bytes_per_s", peaks.as_ref().map(|p| p.1))?;
            gemm_items(&d, peaks.map(|p| p.0))?;
        }
        Outcome::Pca { pca, peak } => {
            let p = *pca;
            d.set_item("passes", p.passes)?;
            d.set_item("phases", phases_list(py, &p.timings)?)?;
            gemm_items(&d, peak)?;
            d.set_item("pcs", p.pcs.into_pyarray(py))?;
            d.set_item("eigenvalues", p.eigenvalues.into_pyarray(py))?;
            d.set_item(
                "explained_variance_ratio",
                p.explained_variance_ratio.into_pyarray(py),
            )?;
            d.set_item("singular_values", p.singular_values.into_pyarray(py))?;
            d.set_item("sample_ids", PyList::new(py, p.sample_ids)?)?;
            d.set_item("family_ids", p.family_ids)?;
            d.set_item("convergence", convergence_dict(py, &p.convergence)?)?;
            d.set_item("variants_used", p.variants_used)?;
            if let Some(l) = p.loadings {
                d.set_item("loadings", l.values.into_pyarray(py))?;
                d.set_item("loading_rows", l.rows.into_pyarray(py))?;
            }
        }
        Outcome::Calibrate(json) => {
            d.set_item("rates", json)?;
        }
        Outcome::Project(p) => {
            let p = *p;
            d.set_item("pcs", p.pcs.into_pyarray(py))?;
            d.set_item("sample_ids", PyList::new(py, p.sample_ids)?)?;
            d.set_item("family_ids", p.family_ids)?;
            for (key, v) in [
                ("matched", p.matched),
                ("flipped", p.flipped),
                ("absent", p.absent),
                ("allele_mismatches", p.allele_mismatches),
                ("unnamed", p.unnamed),
                ("weighted", p.weighted),
            ] {
                d.set_item(key, v)?;
            }
        }
    }
    Ok(d)
}

/// Runs `command` (`"svd"`, `"rsvd"`, `"pca"` or `"project"`) on `source` (a specification string, a
/// 2-D float64 array, a 2-D int8 array of dosages, or a 3-D int8 `call_genotype` with its
/// `mask`; with `sample_ids`) with `options`
/// and the `world` settings, and returns the results as a dictionary. The package's
/// functions (`rankwise.svd`, `rsvd`, `pca`) document the options.
#[pyfunction]
#[pyo3(signature = (command, source, options, world, sample_ids=None, progress=None, mask=None))]
fn run<'py>(
    py: Python<'py>,
    command: &str,
    source: &Bound<'py, PyAny>,
    options: &Bound<'py, PyDict>,
    world: &Bound<'py, PyDict>,
    sample_ids: Option<Vec<String>>,
    progress: Option<Bound<'py, PyAny>>,
    mask: Option<Bound<'py, PyUntypedArray>>,
) -> PyResult<Bound<'py, PyDict>> {
    let mut job = parse_job(command, options)?;
    if job.machine_limit {
        job.gemm_probe = gemm_probe(py);
    }
    let world = parse_world(world)?;
    // The array stays borrowed for the whole call: numpy refuses a writable borrow of it
    // from Rust meanwhile, and the object lives at least as long.
    let mut _held = None;
    let mut puller = None;
    let source = if let Ok(spec) = source.extract::<String>() {
        Source::Spec(spec)
    } else if source.hasattr("fetch")? && source.hasattr("shape")? {
        // (rows, cols) of this rank's block, and `fetch(start, stop)`.
        let (rows, cols): (u64, u64) = source.getattr("shape")?.extract()?;
        let what: String = source.str()?.extract()?;
        let p = Arc::new(PyPuller {
            fetch: source.getattr("fetch")?.unbind(),
            cols: cols as usize,
            what,
            raised: Mutex::new(None),
        });
        puller = Some(Arc::clone(&p));
        Source::Pulled(p, rows, cols)
    } else if let Ok(a) = source.cast::<PyUntypedArray>() {
        let kind = a.dtype().kind();
        let size = a.dtype().itemsize();
        let s = match (kind, size) {
            (b'i', 1) if a.ndim() == 3 => {
                let m = match &mask {
                    Some(m) if m.shape() != a.shape() => {
                        return Err(value_error(
                            "call_genotype_mask",
                            format!("shape {:?}, not call_genotype's {:?}", m.shape(), a.shape()),
                        ))
                    }
                    Some(m) => Some(buffer3(m, "call_genotype_mask")?),
                    None => None,
                };
                Source::Calls(buffer3(a, "call_genotype")?, m, sample_ids)
            }
            (b'f', 8) => Source::Matrix(buffer(a, 8)?),
            (b'f', 4) => Source::Matrix(buffer(a, 4)?),
            (b'i', 1) => Source::Dosages(buffer(a, 1)?, sample_ids),
            _ => {
                return Err(value_error(
                    "a",
                    format!(
                        "dtype {} is neither float64 or float32 (a matrix) nor int8 (dosages)",
                        a.dtype()
                    ),
                ))
            }
        };
        _held = Some((a.clone(), mask.clone()));
        s
    } else {
        return Err(PyTypeError::new_err(format!(
            "source must be a str or a numpy array, not {}",
            source.get_type().name()?
        )));
    };
    let shared = Arc::new(Shared::default());
    let (tx, rx) = bounded(1);
    let theirs = Arc::clone(&shared);
    let handle = std::thread::Builder::new()
        .name("rankwise-call".into())
        .spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                work(source, job, world, theirs)
            }));
            let _ = tx.send(r);
        })
        .map_err(|e| PyErr::new::<pyo3::exceptions::PyOSError, _>(e.to_string()))?;
    let mut last_progress = Instant::now();
    let mut signal: Option<PyErr> = None;
    let result = loop {
        match py.detach(|| rx.recv_timeout(POLL)) {
            Ok(r) => break r,
            Err(RecvTimeoutError::Disconnected) => {
                break Err(Box::new("the work thread ended without a result") as _)
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
        if signal.is_none() {
            if let Err(e) = py.check_signals() {
                // Stop the actors, then wait for them: the buffers are lent until then.
                shared
                    .interrupted
                    .store(true, std::sync::atomic::Ordering::Release);
                if let Some(i) = &*shared.interrupter.lock().unwrap_or_else(|e| e.into_inner()) {
                    i.interrupt();
                }
                signal = Some(e);
            }
        }
        if let Some(cb) = &progress {
            if last_progress.elapsed() >= PROGRESS_EVERY {
                last_progress = Instant::now();
                let p = shared
                    .progress
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                if let Some(p) = p {
                    if let Err(e) = progress_dict(py, &p).and_then(|d| cb.call1((d,))) {
                        shared
                            .interrupted
                            .store(true, std::sync::atomic::Ordering::Release);
                        if let Some(i) =
                            &*shared.interrupter.lock().unwrap_or_else(|e| e.into_inner())
                        {
                            i.interrupt();
                        }
                        signal.get_or_insert(e);
                    }
                }
            }
        }
    };
    let _ = py.detach(|| handle.join());
    if let Some(e) = signal {
        return Err(e);
    }
    match result {
        Ok(Ok(outcome)) => outcome_dict(py, outcome),
        Ok(Err(f)) => {
            let e = to_py(py, f);
            // The exception a dask computation raised is the cause.
            if let Some(raised) =
                puller.and_then(|p| p.raised.lock().unwrap_or_else(|p| p.into_inner()).take())
            {
                e.set_cause(py, Some(raised));
            }
            Err(e)
        }
        Err(panic) => Err(to_py(
            py,
            Failure {
                error: Error::Runtime(RuntimeError::Panic {
                    rank: 0,
                    actor: 0,
                    message: rankwise::exec::panic_message(panic.as_ref()),
                }),
                rank: 0,
            },
        )),
    }
}

/// Answers a GEMM probe when this process was started as one
/// ([`rankwise::linalg::serve_gemm_probe`]): the status to exit with, or `None`.
#[pyfunction]
fn serve_gemm_probe() -> Option<i32> {
    rankwise::linalg::serve_gemm_probe()
}

/// The kernels OpenBLAS loaded in this process, and those `rankwise` runs where they differ
/// ([`rankwise::linalg::openblas_preferred_core`]: layout-independent ones, so that results
/// are the same bits for any number of ranks, and the AVX2 ones where OpenBLAS fell back to
/// its generic kernels); `None` where they are the same.
#[pyfunction]
fn blas_kernels() -> (String, Option<&'static str>) {
    (
        rankwise::linalg::openblas_core(),
        rankwise::linalg::openblas_preferred_core(),
    )
}

/// `rankwise.plan`: the predicted run of a job on a cluster ([`rankwise::sizing::predict`])
/// as the JSON of its [`rankwise::sizing::Prediction`]. `options` names the job (`job`, `k`,
/// `oversample`, `passes`, `solver`, `panel_rows`), the cluster (`nodes`, `network`,
/// `ranks_per_node`, `actors_per_rank`, `cores_per_node`, `memory_per_node`,
/// `gpus_per_node`, `transport`, `read_gbps`) and `calibration`, the rates' JSON text.
#[pyfunction]
fn plan(py: Python<'_>, rows: u64, cols: u64, options: &Bound<'_, PyDict>) -> PyResult<String> {
    use rankwise::sizing::{predict, Cluster, Network, Rates, Solver, Transport, Workload};
    let mut used = Vec::new();
    let text: String = get(options, "calibration", &mut used)?
        .ok_or_else(|| value_error("calibration", "the rates `calibrate` made are needed"))?;
    let rates: Rates = serde_json::from_str(&text).map_err(|e| {
        value_error(
            "calibration",
            format!("not the rates `rankwise.calibrate` makes: {e}"),
        )
    })?;
    let network: Network = get::<String>(options, "network", &mut used)?
        .unwrap_or_default()
        .parse()
        .map_err(|e| to_py(py, Failure { error: e, rank: 0 }))?;
    let mut cluster =
        Cluster::like_this_node(get(options, "nodes", &mut used)?.unwrap_or(1), network);
    if let Some(v) = get(options, "ranks_per_node", &mut used)? {
        cluster.ranks_per_node = v;
    }
    if let Some(v) = get(options, "actors_per_rank", &mut used)? {
        cluster.actors_per_rank = v;
    }
    if let Some(v) = get(options, "cores_per_node", &mut used)? {
        cluster.cores_per_node = v;
    }
    if let Some(v) = get(options, "memory_per_node", &mut used)? {
        cluster.memory_per_node = v;
    }
    if let Some(v) = get(options, "gpus_per_node", &mut used)? {
        cluster.gpus_per_node = v;
    }
    cluster.read_gbps = get(options, "read_gbps", &mut used)?;
    cluster.transport = match get::<String>(options, "transport", &mut used)?.as_deref() {
        None | Some("mpi") => Transport::Mpi,
        Some("ucx") => Transport::Ucx,
        Some(t) => return Err(value_error("transport", format!("{t:?} is not mpi or ucx"))),
    };
    let solver = match get::<String>(options, "solver", &mut used)?.as_deref() {
        // As the jobs run: block Lanczos for a PCA, LOBPCG for an rsvd.
        None => None,
        Some("lobpcg") => Some(Solver::Lobpcg),
        Some("lanczos") => Some(Solver::Lanczos),
        Some("power-iters") | Some("power_iters") => Some(Solver::PowerIters),
        Some(x) => {
            return Err(value_error(
                "solver",
                format!("{x:?} is not lobpcg, lanczos or power_iters"),
            ))
        }
    };
    let k = get(options, "k", &mut used)?.unwrap_or(10);
    let oversample = get(options, "oversample", &mut used)?.unwrap_or(10);
    let passes = get(options, "passes", &mut used)?.unwrap_or(10);
    let workload = match get::<String>(options, "job", &mut used)?.as_deref() {
        Some("svd") => Workload::Svd,
        Some("rsvd") => Workload::Rsvd {
            k,
            oversample,
            passes,
            solver: solver.unwrap_or(Solver::Lobpcg),
        },
        None | Some("pca") => Workload::Pca {
            k,
            oversample,
            passes,
            solver: solver.unwrap_or(Solver::Lanczos),
        },
        Some(j) => return Err(value_error("job", format!("{j:?} is not svd, rsvd or pca"))),
    };
    let panel_rows = get(options, "panel_rows", &mut used)?.unwrap_or(0);
    for key in options.keys() {
        let key: String = key.extract()?;
        if !used.contains(&key) {
            return Err(PyTypeError::new_err(format!(
                "unexpected keyword argument {key:?}"
            )));
        }
    }
    let p = predict(rows, cols, panel_rows, &workload, &cluster, &rates).map_err(|e| {
        // The library's names of the cluster's description, as this call's arguments.
        let name = match e.parameter() {
            Some("rates") => Some("calibration"),
            Some("cluster") => Some("nodes"),
            _ => None,
        };
        match (name, &e) {
            (Some(n), Error::Parameter { message, .. }) => value_error(n, message),
            _ => to_py(py, Failure { error: e, rank: 0 }),
        }
    })?;
    serde_json::to_string(&p).map_err(|e| value_error("plan", e))
}

/// The library's version.
#[pyfunction]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// The native module.
#[pymodule]
fn _rankwise(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(serve_gemm_probe, m)?)?;
    m.add_function(wrap_pyfunction!(blas_kernels, m)?)?;
    Ok(())
}
