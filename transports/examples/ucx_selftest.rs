//! Self-test of the UCX transport; run it under `mpirun` with any number of processes.
//!
//! ```text
//! mpirun -np 4 target/release/examples/ucx_selftest [basic|big [BYTES]|abort]
//! ```
//!
//! Modes:
//! * `basic` (default): point-to-point (also to itself), broadcast, allgather, allreduce
//!   (checked bit for bit against the rank-ordered sum), barrier, and an all-to-all exchange
//!   of 4 MiB messages with every send before any receive. Rank 0 prints
//!   `SELFTEST PASSED size=P transport=ucx`.
//! * `big`: rank 0 sends one message of BYTES (default [`BIG_BYTES`], 256 MiB and a tail)
//!   to rank 1 and rank 1 one back; each checks every byte and prints `BIG OK bytes=...`.
//! * `abort`: rank P−1 calls `abort("injected failure")` while all others wait in
//!   `recv_bytes`; every rank prints `rank R FAILED: ...` naming rank P−1 and exits with 3.
//!
//! * `vanish`: rank 1 kills itself (SIGKILL) while the others wait for its message; with
//!   peer error handling (TCP) the others print `rank R TRANSPORT ERROR: rank 1
//!   disconnected` at once and exit with 2. Run it with `mpirun --enable-recovery`, so that
//!   the launcher leaves the detection to the transport.
//!
//! Failing ranks leave through [`UcxComm::exit_after_failure`].
//!
//! Exit codes: 0 success, 1 a check failed, 2 an unexpected transport error, 3 a failure
//! reported through abort (the expected outcome of `abort`).

use std::time::Duration;

use rankwise_transports::{Comm, TransportError, UcxComm};

/// Bytes of the `big` message: 256 MiB and a ragged tail.
const BIG_BYTES: usize = (256 << 20) + 12_345;

/// How long a failing rank waits in `MPI_Finalize` for the others.
const GRACE: Duration = Duration::from_secs(5);

enum Failure {
    Check(String),
    Transport(TransportError),
}

impl From<TransportError> for Failure {
    fn from(e: TransportError) -> Self {
        Failure::Transport(e)
    }
}

fn ensure(ok: bool, what: impl FnOnce() -> String) -> Result<(), Failure> {
    if ok {
        Ok(())
    } else {
        Err(Failure::Check(what()))
    }
}

/// Bytes that depend on `seed` and their position.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed).rotate_left(17) as u8)
        .collect()
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "basic".into());
    let mut comm = match UcxComm::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ucx_selftest: cannot start UCX: {e}");
            std::process::exit(2);
        }
    };
    comm.set_timeout(Duration::from_secs(60));
    let rank = comm.rank();
    let result = match mode.as_str() {
        "basic" => basic(&comm),
        "big" => match std::env::args().nth(2).map(|b| b.parse::<usize>()) {
            None => big(&comm, BIG_BYTES),
            Some(Ok(bytes)) => big(&comm, bytes),
            Some(Err(e)) => Err(Failure::Check(format!("big: BYTES: {e}"))),
        },
        "abort" => abort(&comm),
        "vanish" => vanish(&comm),
        other => Err(Failure::Check(format!("unknown mode {other:?}"))),
    };
    let code = match result {
        Ok(()) => {
            drop(comm);
            std::process::exit(0)
        }
        Err(Failure::Check(msg)) => {
            println!("rank {rank} CHECK FAILED: {msg}");
            comm.abort(&format!("check failed on rank {rank}: {msg}"));
            1
        }
        Err(Failure::Transport(e @ TransportError::PeerFailed { .. })) => {
            println!("rank {rank} FAILED: {e}");
            3
        }
        Err(Failure::Transport(e)) => {
            println!("rank {rank} TRANSPORT ERROR: {e}");
            comm.abort(&format!("rank {rank}: {e}"));
            2
        }
    };
    comm.exit_after_failure(code, GRACE)
}

fn basic(comm: &UcxComm) -> Result<(), Failure> {
    let (rank, size) = (comm.rank(), comm.size());
    ensure(comm.name() == "ucx", || format!("name {}", comm.name()))?;

    // Ring, with a message to itself first.
    comm.send_bytes(rank, 5, b"self")?;
    ensure(comm.recv_bytes(rank, 5)? == b"self", || {
        "self message".into()
    })?;
    let next = (rank + 1) % size;
    let prev = (rank + size - 1) % size;
    for len in [0usize, 1, 8, 1000, 70_000, 3 << 20] {
        comm.send_bytes(next, 7, &pattern(rank as u64 * 31 + len as u64, len))?;
        let got = comm.recv_bytes(prev, 7)?;
        ensure(got == pattern(prev as u64 * 31 + len as u64, len), || {
            format!("ring message of {len} bytes from rank {prev} differs")
        })?;
    }

    // Same source, same tag: in order.
    if size > 1 {
        if rank == 0 {
            for i in 0..20u32 {
                comm.send_bytes(1, 9, &i.to_le_bytes())?;
            }
        } else if rank == 1 {
            for i in 0..20u32 {
                let got = comm.recv_bytes(0, 9)?;
                ensure(got == i.to_le_bytes(), || {
                    format!("message {i} out of order")
                })?;
            }
        }
    }

    // All-to-all of large messages, every send before any receive.
    let big = 4 << 20;
    for dest in 0..size {
        comm.send_bytes(dest, 11, &pattern((rank * 1000 + dest) as u64, big))?;
    }
    for src in 0..size {
        let got = comm.recv_bytes(src, 11)?;
        ensure(got == pattern((src * 1000 + rank) as u64, big), || {
            format!("all-to-all message from rank {src} differs")
        })?;
    }

    // Collectives.
    let mut data = if rank == 0 {
        b"root".to_vec()
    } else {
        Vec::new()
    };
    comm.broadcast_bytes(0, &mut data)?;
    ensure(data == b"root", || "broadcast".into())?;
    let all = comm.allgather_bytes(&[rank as u8; 3])?;
    ensure(
        all == (0..size).map(|r| vec![r as u8; 3]).collect::<Vec<_>>(),
        || "allgather".into(),
    )?;
    let value = |r: usize| 0.1 * (r as f64 + 1.0).sqrt();
    let mut sum = [value(rank), -value(rank)];
    comm.allreduce_sum_f64(&mut sum)?;
    let mut want = [0.0f64; 2];
    for r in 0..size {
        want[0] += value(r);
        want[1] += -value(r);
    }
    ensure(sum[0].to_bits() == want[0].to_bits(), || {
        format!("allreduce {} != {}", sum[0], want[0])
    })?;
    comm.barrier()?;
    println!("rank {rank} basic OK");
    comm.barrier()?;
    if rank == 0 {
        println!("SELFTEST PASSED size={size} transport=ucx");
    }
    Ok(())
}

fn big(comm: &UcxComm, bytes: usize) -> Result<(), Failure> {
    let rank = comm.rank();
    ensure(comm.size() >= 2, || "big needs two ranks".into())?;
    if rank > 1 {
        return Ok(());
    }
    let peer = 1 - rank;
    let mine = pattern(rank as u64 + 1, bytes);
    // Both send first, then receive: the mailbox must take the peer's message in.
    comm.send_bytes(peer, 3, &mine)?;
    let got = comm.recv_bytes(peer, 3)?;
    drop(mine);
    ensure(got.len() == bytes, || {
        format!("got {} bytes, expected {bytes}", got.len())
    })?;
    ensure(got == pattern(peer as u64 + 1, bytes), || {
        "the big message differs".into()
    })?;
    println!("rank {rank} BIG OK bytes={bytes}");
    Ok(())
}

fn abort(comm: &UcxComm) -> Result<(), Failure> {
    let (rank, size) = (comm.rank(), comm.size());
    if rank == size - 1 {
        std::thread::sleep(Duration::from_millis(300));
        comm.abort("injected failure");
        return Err(Failure::Transport(TransportError::PeerFailed {
            rank,
            message: "injected failure".into(),
        }));
    }
    comm.recv_bytes((rank + 1) % size, 1)?;
    Err(Failure::Check(
        "the receive returned without a message".into(),
    ))
}

fn vanish(comm: &UcxComm) -> Result<(), Failure> {
    let rank = comm.rank();
    ensure(comm.size() >= 2, || "vanish needs two ranks".into())?;
    comm.barrier()?;
    if rank == 1 {
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: ends this process at once, as a crash or the OOM killer would.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
    comm.recv_bytes(1, 1)?;
    Err(Failure::Check(
        "the receive returned without a message".into(),
    ))
}
