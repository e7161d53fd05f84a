//! Decodes every chunk of a Blosc-compressed Zarr array on GPU 0 and prints the rates as
//! JSON: the chunk files read on the host (all cores), and the device's decode (the copy of
//! the compressed streams, nvCOMP, the unshuffle kernels), in batches of about `BATCH_MIB`
//! MiB of decoded bytes (default 1024), the reads of a batch overlapping the device's decode
//! of the one before, after one untimed decode of the first batch (modules load on first
//! use); with the seconds of each step (host packing, copy, nvCOMP, unshuffle). `benches/
//! gpu.sh` runs it beside `rankwise read`, the host's decode.
//!
//! ```sh
//! cargo run --release --example device_decode -- PATH[:ARRAY] [BATCH_MIB]
//! ```

use std::process::ExitCode;
use std::time::Instant;

use rankwise::device::{probed, GpuDevice};
use rankwise::linalg::device_decode::{DecodeStats, DeviceDecoder};
use rankwise::sources::ZarrArray;

/// The chunk files of rows `chunks` (one column of chunks: the arrays rankwise writes span
/// every column), read on `threads` threads.
fn read_frames(
    array: &ZarrArray,
    chunks: std::ops::Range<u64>,
    threads: usize,
) -> Result<Vec<Vec<u8>>, String> {
    let ids: Vec<u64> = chunks.collect();
    let per = ids.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        let parts: Vec<_> = ids
            .chunks(per)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|&i| {
                            let mut f = Vec::new();
                            match array.blosc_chunk(&[i, 0], &mut f) {
                                Ok(true) => Ok(f),
                                Ok(false) => Err(format!(
                                    "chunk {i}: not a Blosc frame of a local, unsharded array \
                                     spanning every column"
                                )),
                                Err(e) => Err(e.to_string()),
                            }
                        })
                        .collect::<Result<Vec<_>, String>>()
                })
            })
            .collect();
        let mut all = Vec::new();
        for p in parts {
            all.extend(
                p.join()
                    .map_err(|_| "a reader thread panicked".to_string())??,
            );
        }
        Ok(all)
    })
}

fn main() -> ExitCode {
    let run = || -> Result<(), String> {
        let spec = std::env::args()
            .nth(1)
            .ok_or("usage: device_decode PATH[:ARRAY] [BATCH_MIB]")?;
        let batch_mib: u64 = std::env::args().nth(2).map_or(Ok(1024), |s| {
            s.parse().map_err(|e| format!("BATCH_MIB: {e}"))
        })?;
        let array = ZarrArray::open(&spec).map_err(|e| e.to_string())?;
        let (shape, chunk) = (
            array.shape(),
            array.chunk_shape().map_err(|e| e.to_string())?,
        );
        if shape.len() != 2 || chunk[1] < shape[1] {
            return Err(format!(
                "{spec}: a 2-d array whose chunks span every column is needed ({shape:?} in \
                 chunks of {chunk:?})"
            ));
        }
        let elem = array.element_type().map_or(1, |t| t.size()) as u64;
        let chunk_bytes = chunk[0] * chunk[1] * elem;
        let n = shape[0].div_ceil(chunk[0]);
        let per_batch = ((batch_mib << 20) / chunk_bytes.max(1)).max(1);
        let dev = GpuDevice::open(0, probed()).map_err(|e| e.to_string())?;
        let decoder = DeviceDecoder::new(&dev).map_err(|e| e.to_string())?;
        let threads = std::thread::available_parallelism().map_or(4, |p| p.get());
        let mut out = dev
            .stream()
            .alloc_zeros::<u8>((per_batch * chunk_bytes) as usize)
            .map_err(|e| e.to_string())?;
        let (mut read_s, mut device_s) = (0.0f64, 0.0f64);
        let mut total = DecodeStats::default();
        let batches: Vec<std::ops::Range<u64>> = (0..n)
            .step_by(per_batch as usize)
            .map(|b| b..(b + per_batch).min(n))
            .collect();
        let t = Instant::now();
        let mut next = Some(read_frames(&array, batches[0].clone(), threads)?);
        read_s += t.elapsed().as_secs_f64();
        // One untimed decode first: nvCOMP's and the kernels' modules load on first use,
        // and the page-locked buffer is allocated.
        let warm = Instant::now();
        {
            let frames = next.as_ref().expect("read");
            let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_slice()).collect();
            decoder.decode(&refs, &mut out).map_err(|e| e.to_string())?;
        }
        let warmup_s = warm.elapsed().as_secs_f64();
        let start = Instant::now();
        for b in 0..batches.len() {
            let frames = next.take().expect("read ahead");
            // The next batch's files are read while the device decodes this one.
            let (stats, ahead) = std::thread::scope(|s| {
                let reader = batches.get(b + 1).map(|r| {
                    let (array, r) = (&array, r.clone());
                    s.spawn(move || {
                        let t = Instant::now();
                        read_frames(array, r, threads).map(|f| (f, t.elapsed().as_secs_f64()))
                    })
                });
                let t = Instant::now();
                let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_slice()).collect();
                let stats = decoder.decode(&refs, &mut out).map_err(|e| e.to_string());
                let took = t.elapsed().as_secs_f64();
                let ahead = reader.map(|h| h.join().map_err(|_| "a reader panicked".to_string()));
                (stats.map(|s| (s, took)), ahead)
            });
            let (stats, took) = stats?;
            device_s += took;
            if let Some(ahead) = ahead {
                let (f, secs) = ahead??;
                read_s += secs;
                next = Some(f);
            }
            total.add(&stats);
        }
        let wall = start.elapsed().as_secs_f64();
        let gb = |bytes: u64, s: f64| bytes as f64 / s.max(1e-9) / 1e9;
        println!(
            "{}",
            serde_json::json!({
                "array": spec,
                "device": dev.name(),
                "chunks": n,
                "batches": batches.len(),
                "decoded_bytes": total.decoded_bytes,
                "staged_bytes": total.staged_bytes,
                "compressed_streams": total.compressed_streams,
                "stored_streams": total.stored_streams,
                "read_seconds": read_s,
                "device_seconds": device_s,
                "seconds": wall,
                "device_decoded_gb_per_s": gb(total.decoded_bytes, device_s),
                "decoded_gb_per_s": gb(total.decoded_bytes, wall),
                "warmup_seconds": warmup_s,
                "pack_seconds": total.pack_seconds,
                "copy_seconds": total.copy_seconds,
                "decompress_seconds": total.decompress_seconds,
                "unshuffle_seconds": total.unshuffle_seconds,
                "nvcomp_gb_per_s": gb(total.decoded_bytes, total.decompress_seconds),
                "unshuffle_gb_per_s": gb(total.decoded_bytes, total.unshuffle_seconds),
                "copy_gb_per_s": gb(total.staged_bytes, total.copy_seconds),
                "read_threads": threads,
            })
        );
        Ok(())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("device_decode: {e}");
            ExitCode::FAILURE
        }
    }
}
