//! NCCL collectives on GPU actors' device buffers.
//!
//! # When NCCL is used
//!
//! When every rank of the job has a GPU actor, and its first GPU actor's device is one that
//! no other rank's is (NCCL refuses two ranks on one device), and every rank found the NCCL
//! library. NCCL runs on that device, one NCCL rank per rank: a rank with several GPUs
//! sums its own actors' parts on the host first, as for the transport.
//! The ranks agree on that before any NCCL call ([`NcclComm::join`]: one all-gather over the
//! job's transport), so either every rank initializes NCCL or none does; otherwise sums go
//! through the transport (MPI, UCX) from host memory.
//!
//! # The unique id
//!
//! Rank 0 draws NCCL's unique id and broadcasts its 128 bytes over the transport, after a
//! status byte: when rank 0 cannot draw one, it says why and every rank falls back together
//! rather than waiting in NCCL's initialization for a rank that will never come.

use std::sync::{Arc, Mutex};

use cudarc::nccl::{Comm, Id, ReduceOp};
use rankwise_transports::Comm as Transport;

use crate::{probed, GpuDevice, GpuError};

/// A communicator over the ranks' GPUs.
pub struct NcclComm {
    comm: Mutex<Comm>,
    ordinal: usize,
}

// SAFETY: the NCCL communicator is a handle that NCCL lets any thread use, one call at a
// time; every use goes through the mutex.
unsafe impl Send for NcclComm {}
// SAFETY: as above.
unsafe impl Sync for NcclComm {}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclComm(gpu {})", self.ordinal)
    }
}

/// What [`NcclComm::join`] decided.
#[derive(Debug)]
pub enum NcclJoin {
    /// Every rank joined.
    Joined(NcclComm),
    /// NCCL is not used; why.
    Declined(String),
}

fn nccl_error(ordinal: usize, what: &str, e: cudarc::nccl::result::NcclError) -> GpuError {
    GpuError::Cuda {
        ordinal,
        what: what.into(),
        message: format!("NCCL {:?}", e.0),
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// This rank's claim to NCCL: `"1 HOST PCI"` when it qualifies, `"0 WHY"` otherwise.
fn claim(gpu: Option<&GpuDevice>) -> String {
    let Some(dev) = gpu else {
        return "0 it has no GPU actor".into();
    };
    let libs = probed();
    if libs.find("nccl").is_none() {
        return "0 the NCCL library was not found (see rankwise info: NCCL is loaded as libnccl.so)".into();
    }
    let pci = libs
        .devices
        .iter()
        .find(|d| d.ordinal == dev.ordinal())
        .map(|d| d.pci_bus_id.clone())
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| format!("ordinal-{}", dev.ordinal()));
    format!("1 {} {pci}", hostname())
}

impl NcclComm {
    /// Joins the ranks of `transport` in an NCCL communicator, when they all qualify (see
    /// the module's notes). Collective: every rank calls it, `gpu` being its first GPU
    /// actor's device, or `None` when it has none.
    pub fn join(
        transport: &dyn Transport,
        gpu: Option<&Arc<GpuDevice>>,
    ) -> Result<NcclJoin, GpuError> {
        let transport_error = |e: rankwise_transports::TransportError| GpuError::Cuda {
            ordinal: gpu.map_or(0, |d| d.ordinal()),
            what: "agreeing on NCCL".into(),
            message: e.to_string(),
        };
        let mine = claim(gpu.map(|d| d.as_ref()));
        let all = transport
            .allgather_bytes(mine.as_bytes())
            .map_err(transport_error)?;
        let claims: Vec<String> = all
            .iter()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect();
        if let Some((r, why)) = claims
            .iter()
            .enumerate()
            .find_map(|(r, c)| c.strip_prefix("0 ").map(|why| (r, why)))
        {
            return Ok(NcclJoin::Declined(format!("rank {r}: {why}")));
        }
        for (a, ca) in claims.iter().enumerate() {
            if let Some(b) = claims[a + 1..].iter().position(|cb| cb == ca) {
                return Ok(NcclJoin::Declined(format!(
                    "ranks {a} and {} use the same GPU ({})",
                    a + 1 + b,
                    ca.trim_start_matches("1 ")
                )));
            }
        }
        let dev = gpu.expect("every rank claimed a GPU, this one too");
        let ordinal = dev.ordinal();
        let mut id = Vec::with_capacity(129);
        if transport.rank() == 0 {
            match Id::new() {
                Ok(new) => {
                    id.push(1);
                    id.extend(new.internal().iter().map(|&c| c as u8));
                }
                Err(e) => {
                    id.push(0);
                    id.extend(
                        format!("rank 0 could not draw NCCL's unique id: NCCL {:?}", e.0).bytes(),
                    );
                }
            }
        }
        transport
            .broadcast_bytes(0, &mut id)
            .map_err(transport_error)?;
        if id.first() != Some(&1) || id.len() != 129 {
            return Ok(NcclJoin::Declined(
                String::from_utf8_lossy(id.get(1..).unwrap_or_default()).into_owned(),
            ));
        }
        let mut internal = [0 as std::ffi::c_char; 128];
        for (d, &b) in internal.iter_mut().zip(&id[1..]) {
            *d = b as std::ffi::c_char;
        }
        // NCCL ties the communicator to the device current on this thread.
        dev.bind()?;
        let comm = Comm::from_rank(
            Arc::clone(dev.stream()),
            transport.rank(),
            transport.size(),
            Id::uninit(internal),
        )
        .map_err(|e| nccl_error(ordinal, "initializing the NCCL communicator", e))?;
        Ok(NcclJoin::Joined(NcclComm {
            comm: Mutex::new(comm),
            ordinal,
        }))
    }

    /// Sums `values` (the same length on every rank) into rank `root`'s `values`, in device
    /// buffers on the GPU actor's stream. Collective over the communicator's ranks.
    pub fn reduce_sum(&self, root: usize, values: &mut [f64]) -> Result<(), GpuError> {
        let comm = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        let stream = comm.stream();
        let cuda = |what: &'static str| {
            let ordinal = self.ordinal;
            move |e: cudarc::driver::DriverError| GpuError::Cuda {
                ordinal,
                what: what.into(),
                message: e.to_string(),
            }
        };
        if values.is_empty() {
            return Ok(());
        }
        let mut buf = stream
            .clone_htod(&*values)
            .map_err(cuda("copying a sum to the device"))?;
        comm.reduce_in_place(&mut buf, &ReduceOp::Sum, root as i32)
            .map_err(|e| nccl_error(self.ordinal, "NCCL reduce", e))?;
        if comm.rank() == root {
            stream
                .memcpy_dtoh(&buf, values)
                .map_err(cuda("copying a sum back"))?;
        }
        stream
            .synchronize()
            .map_err(cuda("waiting for an NCCL reduce"))
    }
}
