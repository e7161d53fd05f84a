//! Bounded fuzzing of what a store's writer controls: the array metadata (`zarr.json`,
//! `.zarray`) and the chunk files of every codec chain decoded here (uncompressed, Blosc,
//! zstd, gzip, zlib), in Zarr 2 and 3.
//!
//! Each case mutates a valid store (bytes flipped, cut, extended, numbers replaced by
//! absurd ones, fields dropped or retyped), opens it and reads it through the library,
//! and asserts that nothing panics and that no read allocates beyond a bound set by the
//! array's declared chunk (a counting global allocator measures the peak of live bytes).
//! Errors are the expected outcome of most cases; what they must not do is panic, hang or
//! allocate by what the bytes claim.
//!
//! The seed is drawn per run and printed (RANKWISE_FUZZ_SEED reproduces a run); cases per
//! target: RANKWISE_FUZZ_CASES (default 300, a few seconds in release mode).

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use ndarray::Array2;
use rankwise_sources::PanelSource;
use rankwise_sources::ZarrMatrix;
use rankwise_testkit::Draw;

/// Counts live bytes and their peak since the last [`reset_peak`].
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only counters are
// added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            if new >= l.size() {
                let now = LIVE.fetch_add(new - l.size(), Ordering::Relaxed) + new - l.size();
                PEAK.fetch_max(now, Ordering::Relaxed);
            } else {
                LIVE.fetch_sub(l.size() - new, Ordering::Relaxed);
            }
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Held by each fuzz target while it runs: the counters are the process's, so a target
/// running beside another would count the other's allocations (a bomb being encoded) as
/// its own.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Live bytes now, made the peak from here on.
fn reset_peak() -> usize {
    let now = LIVE.load(Ordering::Relaxed);
    PEAK.store(now, Ordering::Relaxed);
    now
}

fn seed() -> u64 {
    let s = std::env::var("RANKWISE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("RANKWISE_FUZZ_SEED={s}");
    s
}

fn cases() -> usize {
    std::env::var("RANKWISE_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300)
}

const ROWS: u64 = 40;
const COLS: u64 = 30;
const CHUNK_ROWS: u64 = 10;
/// Decoded bytes of one chunk (float64).
const CHUNK_BYTES: usize = (CHUNK_ROWS * COLS * 8) as usize;

#[derive(Clone, Copy, Debug)]
enum Codec {
    Raw,
    Blosc,
    Zstd,
    Gzip,
    Zlib,
}

/// The encoding of `data` by `codec`, as the stores' writers make it.
fn encode(codec: Codec, data: &[u8]) -> Vec<u8> {
    match codec {
        Codec::Raw => data.to_vec(),
        Codec::Blosc => {
            let mut out = vec![0u8; data.len() + blosc_src::BLOSC_MAX_OVERHEAD as usize];
            let lz4 = std::ffi::CString::new("lz4").unwrap();
            // SAFETY: `out` has room for the worst case (input + overhead).
            let n = unsafe {
                blosc_src::blosc_compress_ctx(
                    5,
                    blosc_src::BLOSC_BITSHUFFLE as i32,
                    8,
                    data.len(),
                    data.as_ptr().cast(),
                    out.as_mut_ptr().cast(),
                    out.len(),
                    lz4.as_ptr(),
                    0,
                    1,
                )
            };
            assert!(n > 0);
            out.truncate(n as usize);
            out
        }
        Codec::Zstd => zstd::bulk::compress(data, 3).unwrap(),
        Codec::Gzip => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(data).unwrap();
            e.finish().unwrap()
        }
        Codec::Zlib => {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(data).unwrap();
            e.finish().unwrap()
        }
    }
}

/// The metadata of a `ROWS × COLS` float64 array in chunks of `CHUNK_ROWS` rows.
fn metadata(v3: bool, codec: Codec) -> (String, serde_json::Value) {
    use serde_json::json;
    if v3 {
        let mut codecs = vec![json!({"name": "bytes", "configuration": {"endian": "little"}})];
        match codec {
            Codec::Raw => {}
            Codec::Blosc => codecs.push(json!({"name": "blosc", "configuration":
                {"cname": "lz4", "clevel": 5, "shuffle": "bitshuffle", "typesize": 8, "blocksize": 0}})),
            Codec::Zstd => codecs.push(json!({"name": "zstd", "configuration": {"level": 3, "checksum": false}})),
            Codec::Gzip | Codec::Zlib => codecs.push(json!({"name": "gzip", "configuration": {"level": 5}})),
        }
        let meta = json!({
            "zarr_format": 3, "node_type": "array", "shape": [ROWS, COLS],
            "data_type": "float64",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [CHUNK_ROWS, COLS]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0.0, "codecs": codecs, "attributes": {}
        });
        ("zarr.json".into(), meta)
    } else {
        let compressor = match codec {
            Codec::Raw => serde_json::Value::Null,
            Codec::Blosc => {
                json!({"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 2, "blocksize": 0})
            }
            Codec::Zstd => json!({"id": "zstd", "level": 3}),
            Codec::Gzip => json!({"id": "gzip", "level": 5}),
            Codec::Zlib => json!({"id": "zlib", "level": 5}),
        };
        let meta = json!({
            "zarr_format": 2, "shape": [ROWS, COLS], "chunks": [CHUNK_ROWS, COLS],
            "dtype": "<f8", "compressor": compressor, "fill_value": 0.0, "order": "C",
            "filters": null
        });
        (".zarray".into(), meta)
    }
}

fn chunk_path(dir: &Path, v3: bool, i: u64) -> PathBuf {
    if v3 {
        dir.join("c").join(i.to_string()).join("0")
    } else {
        dir.join(format!("{i}.0"))
    }
}

/// Writes a valid store and returns its chunks' encodings.
fn write_store(dir: &Path, v3: bool, codec: Codec, meta_text: &str) -> Vec<Vec<u8>> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let (name, _) = metadata(v3, codec);
    std::fs::write(dir.join(name), meta_text).unwrap();
    let mut chunks = Vec::new();
    for i in 0..ROWS / CHUNK_ROWS {
        let values: Vec<u8> = (0..CHUNK_ROWS * COLS)
            .flat_map(|j| ((i * 1000 + j) as f64 * 0.5).to_le_bytes())
            .collect();
        let enc = encode(codec, &values);
        let path = chunk_path(dir, v3, i);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &enc).unwrap();
        chunks.push(enc);
    }
    chunks
}

/// Opens and reads the store at `dir` (every row), catching a panic as the failure it is.
/// Returns the peak of bytes allocated beyond those live before.
fn read_store(dir: &Path, what: &str) -> usize {
    let base = reset_peak();
    let spec = dir.to_str().unwrap().to_string();
    let outcome = std::panic::catch_unwind(|| {
        let m = match ZarrMatrix::open(&spec) {
            Ok(m) => m,
            Err(_) => return,
        };
        let (rows, cols) = m.shape();
        // A shape the metadata made absurd is refused by the grid before any panel is
        // allocated for it; reading it here would only allocate what the test asks.
        if rows.saturating_mul(cols) > 1 << 20 {
            return;
        }
        let mut out = Array2::<f64>::zeros((rows as usize, cols as usize));
        let _ = m.fill(0..rows, out.view_mut());
    });
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    assert!(outcome.is_ok(), "{what}: reading panicked");
    peak
}

/// Bytes a read of a `ROWS × COLS` store may hold: the output, each chunk's encoding,
/// decoded chunk and decoder state (zstd's window floor is 8 MiB; gzip's 32 KiB), and
/// zarrs' and serde's bookkeeping.
const READ_BOUND: usize = (ROWS * COLS * 8) as usize + 4 * CHUNK_BYTES + (12 << 20);

#[test]
fn mutated_chunk_files_never_panic_or_allocate_by_what_they_claim() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut rng = Draw(seed());
    let root = std::env::temp_dir().join(format!("rankwise-fuzz-chunks-{}", std::process::id()));
    let codecs = [
        Codec::Raw,
        Codec::Blosc,
        Codec::Zstd,
        Codec::Gzip,
        Codec::Zlib,
    ];
    for case in 0..cases() {
        let codec = codecs[rng.below(codecs.len() as u64) as usize];
        let v3 = !matches!(codec, Codec::Zlib) && rng.below(2) == 0;
        let (_, meta) = metadata(v3, codec);
        let dir = root.join(format!("c{case}"));
        let chunks = write_store(&dir, v3, codec, &meta.to_string());
        let victim = rng.below(chunks.len() as u64);
        let mut bytes = chunks[victim as usize].clone();
        let how = rng.below(6);
        match how {
            // Flip bytes.
            0 => {
                for _ in 0..1 + rng.below(8) {
                    let at = rng.below(bytes.len() as u64) as usize;
                    bytes[at] ^= 1 << rng.below(8);
                }
            }
            // Cut.
            1 => bytes.truncate(rng.below(bytes.len() as u64) as usize),
            // Extend with garbage.
            2 => bytes.extend((0..1 + rng.below(4096)).map(|_| rng.next() as u8)),
            // Random bytes of a random length.
            3 => {
                bytes = (0..rng.below(3 * CHUNK_BYTES as u64))
                    .map(|_| rng.next() as u8)
                    .collect()
            }
            // A header's size fields (Blosc's nbytes/blocksize/cbytes, a zstd frame's
            // content size) set to something huge.
            4 => {
                let at = rng.below(bytes.len().min(16) as u64) as usize;
                let end = (at + 4).min(bytes.len());
                for b in &mut bytes[at..end] {
                    *b = 0xff;
                }
            }
            // A bomb: a valid stream of 10,000 times the chunk (24 MB, twice the bound).
            _ => bytes = encode(codec, &vec![0u8; 10_000 * CHUNK_BYTES]),
        }
        std::fs::write(chunk_path(&dir, v3, victim), &bytes).unwrap();
        let what = format!(
            "case {case}: {codec:?} v{} chunk {victim}, mutation {how}",
            if v3 { 3 } else { 2 }
        );
        let peak = read_store(&dir, &what);
        assert!(
            peak <= READ_BOUND,
            "{what}: allocated {peak} bytes, more than {READ_BOUND}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// A random JSON value of a kind a hostile writer might put in place of a field.
fn hostile_value(rng: &mut Draw) -> serde_json::Value {
    use serde_json::json;
    match rng.below(12) {
        0 => json!(u64::MAX),
        1 => json!(-1),
        2 => json!(0),
        3 => json!(1u64 << 50),
        4 => json!(1e300),
        5 => json!("x"),
        6 => json!(null),
        7 => json!([]),
        8 => json!([u64::MAX, u64::MAX]),
        9 => json!([1u64 << 40, 1u64 << 40]),
        10 => json!({"name": "nope"}),
        _ => json!([0, 0]),
    }
}

/// Every path to a value inside `v` (object keys and array indices).
fn paths(v: &serde_json::Value, at: Vec<String>, out: &mut Vec<Vec<String>>) {
    out.push(at.clone());
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                let mut p = at.clone();
                p.push(k.clone());
                paths(x, p, out);
            }
        }
        serde_json::Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                let mut p = at.clone();
                p.push(i.to_string());
                paths(x, p, out);
            }
        }
        _ => {}
    }
}

fn at_path<'v>(v: &'v mut serde_json::Value, path: &[String]) -> &'v mut serde_json::Value {
    path.iter().fold(v, |v, k| match v {
        serde_json::Value::Object(m) => m.get_mut(k).unwrap(),
        serde_json::Value::Array(a) => &mut a[k.parse::<usize>().unwrap()],
        _ => unreachable!(),
    })
}

#[test]
fn mutated_metadata_never_panics_or_allocates_by_its_shapes() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut rng = Draw(seed() ^ 0x5eed);
    let root = std::env::temp_dir().join(format!("rankwise-fuzz-meta-{}", std::process::id()));
    let codecs = [
        Codec::Raw,
        Codec::Blosc,
        Codec::Zstd,
        Codec::Gzip,
        Codec::Zlib,
    ];
    for case in 0..cases() {
        let codec = codecs[rng.below(codecs.len() as u64) as usize];
        let v3 = !matches!(codec, Codec::Zlib) && rng.below(2) == 0;
        let (_, mut meta) = metadata(v3, codec);
        let how = rng.below(4);
        let text = match how {
            // A field (or an element) replaced by a hostile value.
            0 | 1 => {
                let mut all = Vec::new();
                paths(&meta, Vec::new(), &mut all);
                for _ in 0..1 + rng.below(3) {
                    let p = all[1 + rng.below(all.len() as u64 - 1) as usize].clone();
                    *at_path(&mut meta, &p) = hostile_value(&mut rng);
                    all.clear();
                    paths(&meta, Vec::new(), &mut all);
                }
                meta.to_string()
            }
            // A field dropped.
            2 => {
                let keys: Vec<String> = meta.as_object().unwrap().keys().cloned().collect();
                let k = &keys[rng.below(keys.len() as u64) as usize];
                meta.as_object_mut().unwrap().remove(k);
                meta.to_string()
            }
            // The text cut or a byte flipped.
            _ => {
                let mut t = meta.to_string().into_bytes();
                if rng.below(2) == 0 {
                    t.truncate(rng.below(t.len() as u64) as usize);
                } else {
                    let at = rng.below(t.len() as u64) as usize;
                    t[at] = rng.next() as u8;
                }
                String::from_utf8_lossy(&t).into_owned()
            }
        };
        let dir = root.join(format!("m{case}"));
        write_store(&dir, v3, codec, &text);
        let what = format!(
            "case {case}: {codec:?} v{}, mutation {how}: {text}",
            if v3 { 3 } else { 2 }
        );
        let peak = read_store(&dir, &what);
        assert!(
            peak <= READ_BOUND,
            "{what}: allocated {peak} bytes, more than {READ_BOUND}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
    let _ = std::fs::remove_dir_all(&root);
}
