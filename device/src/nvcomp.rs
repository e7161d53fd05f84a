//! nvCOMP's batched LZ4 and Zstandard decompression, loaded at run time.
//!
//! # Why
//!
//! Staging a compressed Zarr store to the GPU was bound by the host's decode: 6.5 GB/s of
//! int8 genotypes on 16 cores, against 55 GB/s of page-locked copies (RESULTS.md's GPU
//! section). A Blosc frame's streams are independent LZ4 or zstd streams, so the device can
//! decompress a whole batch of them at once: the host only reads the chunk files and copies
//! the compressed bytes up, a fifth of the decoded bytes for genotypes.
//!
//! cudarc has no binding of nvCOMP, and the build keeps no CUDA dependency: the library is
//! found at run time, as the other CUDA libraries are, under the names NVIDIA's
//! `nvidia-libnvcomp-cu12`/`-cu13` wheels and tarballs give it ([`crate::probe`] lists it).
//! The functions and option structs follow nvCOMP 5 and 6's C API (`nvcomp/lz4.h`,
//! `nvcomp/zstd.h`: the options are 64-byte structs passed by value).

use std::ffi::c_void;
use std::sync::OnceLock;

use cudarc::driver::sys::CUstream;
use cudarc::driver::CudaStream;

/// The file names nvCOMP is loaded under: NVIDIA's `nvidia-libnvcomp-cu12`/`-cu13` wheels
/// and its tarballs ship `libnvcomp.so.N` (N the major version: 5 since nvCOMP 5, 6 since
/// 6), with a plain `libnvcomp.so` link only in the tarballs. cudarc has no binding of it
/// (this module).
pub(crate) const NVCOMP_NAMES: [&str; 4] = [
    "libnvcomp.so",
    "libnvcomp.so.6",
    "libnvcomp.so.5",
    "libnvcomp.so.4",
];

/// The compressors nvCOMP decompresses here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NvcompCodec {
    /// LZ4 blocks (Blosc's LZ4 streams).
    Lz4,
    /// Zstandard frames (Blosc's zstd streams).
    Zstd,
}

impl NvcompCodec {
    /// The alignment nvCOMP needs of every input, output and temporary buffer
    /// (`nvcompLZ4RequiredDecompressionAlignment`, `nvcompZstdRequiredDecompressionAlignment`).
    pub fn alignment(self) -> usize {
        match self {
            NvcompCodec::Lz4 => 4,
            NvcompCodec::Zstd => 8,
        }
    }

    fn name(self) -> &'static str {
        match self {
            NvcompCodec::Lz4 => "LZ4",
            NvcompCodec::Zstd => "zstd",
        }
    }
}

/// `nvcompBatchedLZ4DecompressOpts_t`: the default backend, no sorting, bytes, no bitshuffle.
#[repr(C)]
#[derive(Clone, Copy)]
struct Lz4Opts {
    backend: i32,
    sort_before_hw_decompress: i32,
    data_type: i32,
    bitshuffle_mode: i32,
    reserved: [u8; 48],
}

/// `nvcompBatchedZstdDecompressOpts_t`: the default backend.
#[repr(C)]
#[derive(Clone, Copy)]
struct ZstdOpts {
    backend: i32,
    reserved: [u8; 60],
}

const LZ4_OPTS: Lz4Opts = Lz4Opts {
    backend: 0,
    sort_before_hw_decompress: 0,
    data_type: 0,
    bitshuffle_mode: 0,
    reserved: [0; 48],
};
const ZSTD_OPTS: ZstdOpts = ZstdOpts {
    backend: 0,
    reserved: [0; 60],
};

/// `nvcompBatched*DecompressGetTempSize`.
type TempSize<O> = unsafe extern "C" fn(usize, usize, O, *mut usize, usize, CUstream) -> i32;
/// `nvcompBatched*DecompressAsync`.
type Decompress<O> = unsafe extern "C" fn(
    *const *const c_void,
    *const usize,
    *const usize,
    *mut usize,
    usize,
    *mut c_void,
    usize,
    *const *mut c_void,
    O,
    *mut i32,
    CUstream,
) -> i32;

/// nvCOMP, loaded.
pub struct Nvcomp {
    /// The file name it loaded under.
    pub found: String,
    lz4_temp: TempSize<Lz4Opts>,
    lz4: Decompress<Lz4Opts>,
    zstd_temp: TempSize<ZstdOpts>,
    zstd: Decompress<ZstdOpts>,
    /// Keeps the functions above loaded.
    _lib: libloading::Library,
}

/// nvCOMP's status codes, named (`nvcomp/shared_types.h`).
pub fn status_name(status: i32) -> &'static str {
    match status {
        0 => "success",
        10 => "invalid value",
        11 => "not supported",
        12 => "cannot decompress (corrupt stream, or output too small)",
        13 => "bad checksum",
        15 => "output buffer too small",
        17 => "misaligned buffer",
        18 => "chunk too large",
        20 => "wrong input length",
        21 => "batch too large",
        1000 => "CUDA error",
        10000 => "internal error",
        _ => "unknown status",
    }
}

impl Nvcomp {
    /// nvCOMP, loaded once per process; why not, naming the files tried.
    pub fn get() -> Result<&'static Nvcomp, String> {
        static LOADED: OnceLock<Result<Nvcomp, String>> = OnceLock::new();
        LOADED
            .get_or_init(Nvcomp::load)
            .as_ref()
            .map_err(Clone::clone)
    }

    fn load() -> Result<Nvcomp, String> {
        let mut why = Vec::new();
        for name in NVCOMP_NAMES {
            // SAFETY: loading runs nvCOMP's initializers, which only register its kernels
            // with the CUDA runtime it links statically.
            let lib = match unsafe { libloading::Library::new(name) } {
                Ok(lib) => lib,
                Err(e) => {
                    why.push(format!("{name}: {e}"));
                    continue;
                }
            };
            // SAFETY: each symbol is looked up under its C name with the signature of
            // nvCOMP 5 and 6's headers (module docs); the pointers stay valid while `lib`
            // is loaded, which `Nvcomp` keeps.
            let loaded = unsafe {
                (|| -> Result<Nvcomp, libloading::Error> {
                    Ok(Nvcomp {
                        found: name.to_string(),
                        lz4_temp: *lib.get(b"nvcompBatchedLZ4DecompressGetTempSize\0")?,
                        lz4: *lib.get(b"nvcompBatchedLZ4DecompressAsync\0")?,
                        zstd_temp: *lib.get(b"nvcompBatchedZstdDecompressGetTempSize\0")?,
                        zstd: *lib.get(b"nvcompBatchedZstdDecompressAsync\0")?,
                        _lib: lib,
                    })
                })()
            };
            match loaded {
                Ok(n) => return Ok(n),
                Err(e) => why.push(format!("{name}: {e} (nvCOMP 5 or later is needed)")),
            }
        }
        Err(format!("nvCOMP not loaded: {}", why.join("; ")))
    }

    /// Bytes of device scratch a batch of `chunks` streams of at most `max_chunk` decoded
    /// bytes, `total` in all, needs.
    pub fn temp_bytes(
        &self,
        codec: NvcompCodec,
        chunks: usize,
        max_chunk: usize,
        total: usize,
        stream: &CudaStream,
    ) -> Result<usize, String> {
        let stream = stream.cu_stream();
        let mut bytes = 0usize;
        // SAFETY: sizes only; `bytes` is a valid out-pointer and `stream` a live stream.
        let status = unsafe {
            match codec {
                NvcompCodec::Lz4 => {
                    (self.lz4_temp)(chunks, max_chunk, LZ4_OPTS, &mut bytes, total, stream)
                }
                NvcompCodec::Zstd => {
                    (self.zstd_temp)(chunks, max_chunk, ZSTD_OPTS, &mut bytes, total, stream)
                }
            }
        };
        match status {
            0 => Ok(bytes),
            s => Err(format!(
                "nvCOMP {} scratch size for {chunks} streams: {} ({s})",
                codec.name(),
                status_name(s)
            )),
        }
    }

    /// Queues the decompression of `chunks` streams on `stream`.
    ///
    /// # Safety
    ///
    /// Every address is a device address valid on `stream`'s context: `inputs`, `in_bytes`,
    /// `out_capacity`, `out_bytes`, `outputs` and `statuses` arrays of `chunks` entries;
    /// each input holds its `in_bytes` and each output has room for its `out_capacity`,
    /// all aligned to [`NvcompCodec::alignment`]; `temp` holds `temp_bytes` (from
    /// [`Nvcomp::temp_bytes`] for this batch). They stay alive until the stream has run.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn decompress(
        &self,
        codec: NvcompCodec,
        chunks: usize,
        inputs: u64,
        in_bytes: u64,
        out_capacity: u64,
        out_bytes: u64,
        temp: u64,
        temp_bytes: usize,
        outputs: u64,
        statuses: u64,
        stream: &CudaStream,
    ) -> Result<(), String> {
        let stream = stream.cu_stream();
        let status = match codec {
            // SAFETY: the caller's contract above.
            NvcompCodec::Lz4 => unsafe {
                (self.lz4)(
                    inputs as *const *const c_void,
                    in_bytes as *const usize,
                    out_capacity as *const usize,
                    out_bytes as *mut usize,
                    chunks,
                    temp as *mut c_void,
                    temp_bytes,
                    outputs as *const *mut c_void,
                    LZ4_OPTS,
                    statuses as *mut i32,
                    stream,
                )
            },
            // SAFETY: as above.
            NvcompCodec::Zstd => unsafe {
                (self.zstd)(
                    inputs as *const *const c_void,
                    in_bytes as *const usize,
                    out_capacity as *const usize,
                    out_bytes as *mut usize,
                    chunks,
                    temp as *mut c_void,
                    temp_bytes,
                    outputs as *const *mut c_void,
                    ZSTD_OPTS,
                    statuses as *mut i32,
                    stream,
                )
            },
        };
        match status {
            0 => Ok(()),
            s => Err(format!(
                "nvCOMP {} decompression of {chunks} streams: {} ({s})",
                codec.name(),
                status_name(s)
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_option_structs_have_the_headers_layout() {
        // nvCOMP's headers: 64-byte option structs, passed by value.
        assert_eq!(std::mem::size_of::<Lz4Opts>(), 64);
        assert_eq!(std::mem::size_of::<ZstdOpts>(), 64);
    }

    #[test]
    fn loading_says_which_files_it_tried_or_finds_every_function() {
        match Nvcomp::get() {
            Ok(n) => assert!(NVCOMP_NAMES.contains(&n.found.as_str())),
            Err(e) => {
                for name in NVCOMP_NAMES {
                    assert!(e.contains(name), "{e}");
                }
            }
        }
    }
}
