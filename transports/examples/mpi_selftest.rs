//! Self-test of the MPI transport; run it under `mpirun` with any number of processes.
//!
//! ```text
//! mpirun -np 4 target/debug/examples/mpi_selftest [basic|big|abort|timeout]
//! ```
//!
//! Modes:
//! * `basic` (default): point-to-point (also to itself), broadcast, allgather, allreduce
//!   (checked bit for bit against the rank-ordered sum), barrier, an all-to-all exchange of
//!   large messages with every send before any receive, split messages with
//!   `max_message_bytes` lowered to 1000, tag limits. Rank 0 prints
//!   `SELFTEST PASSED size=P`.
//! * `big`: rank 0 sends one message of 2 200 000 000 bytes to rank 1 (split at `i32::MAX`);
//!   rank 1 checks every byte and prints `BIG OK bytes=... pieces=...`.
//! * `abort`: rank P−1 calls `abort("injected failure")` while all others wait in
//!   `recv_bytes`; every rank prints `rank R FAILED: ...` naming rank P−1 and exits with 3.
//! * `timeout`: timeout 2 s; rank 0 waits for a message rank 1 never sends and prints
//!   `TIMEOUT OK ...` when it gets [`TransportError::Timeout`].
//! * `stuck`: like `abort`, but rank 0 is busy outside MPI for 120 s and never learns of the
//!   failure. The others must not wait for it: after [`GRACE`] they exit without
//!   finalizing and the launcher ends the job.
//!
//! Failing ranks leave through [`MpiComm::exit_after_failure`]: all ranks that know of the
//! failure finalize together, so each one prints its line before `mpirun` ends the job.
//!
//! Exit codes: 0 success, 1 a check failed, 2 an unexpected transport error, 3 a failure
//! reported through abort (the expected outcome of `abort`).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use rankwise_transports::{Comm, MpiComm, TransportError};

/// Bytes sent in `big` mode: more than `i32::MAX`, so the message must be split.
const BIG_BYTES: usize = 2_200_000_000;

/// How long a failing rank waits in `MPI_Finalize` for the others.
const GRACE: Duration = Duration::from_secs(5);

type Check = std::result::Result<(), String>;

fn main() -> ExitCode {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "basic".into());
    let code = match MpiComm::init() {
        Ok(comm) => run(comm, &mode),
        Err(e) => {
            eprintln!("mpi_selftest: cannot initialize MPI: {e}");
            2
        }
    };
    // The communicator (and with it MPI) is finalized inside `run`.
    ExitCode::from(code)
}

fn run(mut comm: MpiComm, mode: &str) -> u8 {
    let rank = comm.rank();
    let result = match mode {
        "basic" => basic(&mut comm),
        "big" => big(&comm),
        "abort" => abort(&mut comm, false),
        "stuck" => abort(&mut comm, true),
        "timeout" => timeout(&mut comm),
        other => Err(Failure::Check(format!("unknown mode {other:?}"))),
    };
    let code = match result {
        Ok(()) => 0,
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
    if code != 0 {
        comm.exit_after_failure(i32::from(code), GRACE);
    }
    drop(comm);
    code
}

enum Failure {
    Check(String),
    Transport(TransportError),
}

impl From<TransportError> for Failure {
    fn from(e: TransportError) -> Self {
        Failure::Transport(e)
    }
}

impl From<String> for Failure {
    fn from(s: String) -> Self {
        Failure::Check(s)
    }
}

fn ensure(ok: bool, what: impl FnOnce() -> String) -> Check {
    if ok {
        Ok(())
    } else {
        Err(what())
    }
}

/// Deterministic test bytes: byte `i` of the message `seed`.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64 ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
        .collect()
}

fn basic(comm: &mut MpiComm) -> Result<(), Failure> {
    let (rank, size) = (comm.rank(), comm.size());
    let next = (rank + 1) % size;
    let prev = (rank + size - 1) % size;

    // Ring of small messages (to itself when alone), bytes then f64.
    comm.send_bytes(next, 5, format!("hello from {rank}").as_bytes())?;
    let got = comm.recv_bytes(prev, 5)?;
    ensure(got == format!("hello from {prev}").as_bytes(), || {
        format!("ring: got {:?}", String::from_utf8_lossy(&got))
    })?;
    let values: Vec<f64> = (0..7).map(|i| rank as f64 + i as f64 / 8.0).collect();
    comm.send_f64(next, 6, &values)?;
    let got = comm.recv_f64(prev, 6)?;
    let want: Vec<f64> = (0..7).map(|i| prev as f64 + i as f64 / 8.0).collect();
    ensure(got == want, || format!("ring f64: got {got:?}"))?;
    // Two messages with one tag arrive in order; an empty message arrives as empty.
    comm.send_bytes(next, 8, b"first")?;
    comm.send_bytes(next, 8, b"")?;
    comm.send_bytes(next, 8, b"third")?;
    let got: Vec<Vec<u8>> = (0..3)
        .map(|_| comm.recv_bytes(prev, 8))
        .collect::<Result<_, _>>()?;
    ensure(
        got == [b"first".to_vec(), vec![], b"third".to_vec()],
        || format!("order: got {got:?}"),
    )?;

    // Broadcast from the last rank, small (inline) and large (header + pieces).
    for len in [0usize, 100, 200_000] {
        let root = size - 1;
        let mut data = if rank == root {
            pattern(len as u64, len)
        } else {
            b"junk".to_vec()
        };
        comm.broadcast_bytes(root, &mut data)?;
        ensure(data == pattern(len as u64, len), || {
            format!("broadcast of {len} bytes differs")
        })?;
    }

    // Allgather: rank r contributes r + 1 copies of r.
    let all = comm.allgather_bytes(&vec![rank as u8; rank + 1])?;
    ensure(all.len() == size, || {
        format!("allgather: {} parts", all.len())
    })?;
    for (r, part) in all.iter().enumerate() {
        ensure(*part == vec![r as u8; r + 1], || {
            format!("allgather part {r}: {part:?}")
        })?;
    }

    // Allreduce: must equal the sum taken in rank order, bit for bit.
    let contribution = |r: usize| -> Vec<f64> {
        (0..1000)
            .map(|i| ((r * 1000 + i) as f64 * 0.1).sin() * 10f64.powi((i % 7) as i32 - 3))
            .collect()
    };
    let mut data = contribution(rank);
    comm.allreduce_sum_f64(&mut data)?;
    let mut want = vec![0.0f64; 1000];
    for r in 0..size {
        for (w, c) in want.iter_mut().zip(contribution(r)) {
            *w += c;
        }
    }
    ensure(
        data.iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        || "allreduce differs from the rank-ordered sum".into(),
    )?;

    comm.barrier()?;

    // All-to-all with every send first, large (split) messages included: works only if
    // messages are taken in while a rank waits for its own sends, as LocalComm does.
    for (round, max) in [(0u64, usize::MAX), (1, 4096)] {
        comm.set_max_message_bytes(max);
        for peer in 0..size {
            let seed = round * 1_000_000 + (rank * size + peer) as u64;
            comm.send_bytes(peer, 15, &pattern(seed, 300_000 + peer))?;
        }
        for peer in 0..size {
            let seed = round * 1_000_000 + (peer * size + rank) as u64;
            let got = comm.recv_bytes(peer, 15)?;
            ensure(got == pattern(seed, 300_000 + rank), || {
                format!("all-to-all round {round}: message from rank {peer} differs")
            })?;
        }
    }

    // Split messages: pieces of at most 1000 bytes, at the boundaries and for 1 MB.
    comm.set_max_message_bytes(1000);
    for len in [991usize, 992, 993, 1000, 1001, 2000, 1_000_000] {
        let seed = 1000 + len as u64;
        if rank == 0 {
            for peer in 1..size {
                comm.send_bytes(peer, 9, &pattern(seed, len))?;
            }
            for peer in 1..size {
                let back = comm.recv_bytes(peer, 10)?;
                ensure(back == pattern(seed + peer as u64, len), || {
                    format!("split {len}: reply of rank {peer} differs")
                })?;
            }
        } else {
            let got = comm.recv_bytes(0, 9)?;
            ensure(got == pattern(seed, len), || {
                format!("split {len}: got {} bytes, content differs", got.len())
            })?;
            comm.send_bytes(0, 10, &pattern(seed + rank as u64, len))?;
        }
    }
    // Collectives with small pieces too.
    let mut data = if rank == 0 {
        pattern(77, 12_345)
    } else {
        vec![]
    };
    comm.broadcast_bytes(0, &mut data)?;
    ensure(data == pattern(77, 12_345), || {
        "split broadcast differs".into()
    })?;
    comm.set_max_message_bytes(usize::MAX);

    // Tags: the largest user tag works, the next one and reserved ones are refused.
    let top = comm.max_user_tag();
    comm.send_bytes(next, top, b"top")?;
    ensure(comm.recv_bytes(prev, top)? == b"top", || "top tag".into())?;
    let too_big = comm.send_bytes(next, top + 1, b"x");
    ensure(matches!(too_big, Err(TransportError::Mpi(_))), || {
        format!("tag {} accepted", top + 1)
    })?;
    let reserved = comm.send_bytes(next, rankwise_transports::RESERVED_TAG_BASE, b"x");
    ensure(
        matches!(reserved, Err(TransportError::ReservedTag(_))),
        || "reserved tag accepted".into(),
    )?;

    comm.barrier()?;
    println!("rank {rank} basic OK");
    comm.barrier()?;
    if rank == 0 {
        println!("SELFTEST PASSED size={size} max_user_tag={top}");
    }
    Ok(())
}

/// Block length of the `big` pattern: a prime, so no piece boundary lines up with a block.
const BIG_BLOCK: usize = 1_048_573;

/// Byte block `b` of the `big` message: a fixed random block stamped with its index, so a
/// lost, repeated or misplaced piece shows. Built and checked with memcpy/memcmp only, which
/// is fast even in debug builds.
fn big_block(template: &[u8], b: usize, len: usize) -> Vec<u8> {
    let mut block = template[..len].to_vec();
    let stamp = (b as u64).to_le_bytes();
    let n = len.min(8);
    block[..n].copy_from_slice(&stamp[..n]);
    block
}

fn big(comm: &MpiComm) -> Result<(), Failure> {
    let rank = comm.rank();
    if comm.size() < 2 {
        return Err(Failure::Check("big needs at least 2 ranks".into()));
    }
    let template = pattern(0xB16, BIG_BLOCK);
    let blocks = || {
        (0..BIG_BYTES.div_ceil(BIG_BLOCK))
            .map(|b| (b, b * BIG_BLOCK, ((b + 1) * BIG_BLOCK).min(BIG_BYTES)))
    };
    let start = Instant::now();
    match rank {
        0 => {
            // One buffer: the message itself.
            let mut data = vec![0u8; BIG_BYTES];
            for (b, s, e) in blocks() {
                data[s..e].copy_from_slice(&big_block(&template, b, e - s));
            }
            let filled = start.elapsed();
            comm.send_bytes(1, 11, &data)?;
            let sent = start.elapsed();
            drop(data);
            let ack = comm.recv_bytes(1, 12)?;
            ensure(ack == b"ok", || "big: rank 1 reported a mismatch".into())?;
            println!(
                "rank 0 filled {BIG_BYTES} bytes in {:.1} s, sent them in {:.1} s",
                filled.as_secs_f64(),
                (sent - filled).as_secs_f64()
            );
        }
        1 => {
            let data = comm.recv_bytes(0, 11)?;
            let received = start.elapsed();
            let ok = data.len() == BIG_BYTES
                && blocks().all(|(b, s, e)| data[s..e] == big_block(&template, b, e - s)[..]);
            drop(data);
            comm.send_bytes(0, 12, if ok { b"ok" } else { b"bad" })?;
            ensure(ok, || "big: received bytes differ from the pattern".into())?;
            let pieces = rankwise_transports::split_counts(BIG_BYTES, comm.max_message_bytes());
            println!(
                "BIG OK bytes={BIG_BYTES} pieces={} received_after={:.1}s checked_after={:.1}s",
                pieces.len(),
                received.as_secs_f64(),
                start.elapsed().as_secs_f64()
            );
        }
        _ => {}
    }
    comm.barrier()?;
    Ok(())
}

fn abort(comm: &mut MpiComm, stuck: bool) -> Result<(), Failure> {
    let (rank, size) = (comm.rank(), comm.size());
    // Long enough that only the abort notice can end the waits within the test's limit.
    comm.set_timeout(Duration::from_secs(120));
    comm.barrier()?;
    if rank == size - 1 {
        // Give the others time to block in their receives.
        std::thread::sleep(Duration::from_millis(300));
        println!("rank {rank} injecting failure");
        comm.abort("injected failure");
        return Err(TransportError::PeerFailed {
            rank,
            message: "injected failure".into(),
        }
        .into());
    }
    if stuck && rank == 0 {
        // Busy outside MPI: only the launcher can end this rank early.
        println!("rank 0 computing");
        std::thread::sleep(Duration::from_secs(120));
        return Err(Failure::Check(
            "stuck: rank 0 was not ended by the launcher".into(),
        ));
    }
    let start = Instant::now();
    let got = comm.recv_bytes(size - 1, 13);
    let waited = start.elapsed().as_secs_f64();
    match got {
        Err(e @ TransportError::PeerFailed { .. }) => {
            eprintln!("rank {rank} learned of the failure after {waited:.2} s");
            Err(e.into())
        }
        Err(e) => Err(e.into()),
        Ok(_) => Err(Failure::Check("abort: a message arrived".into())),
    }
}

fn timeout(comm: &mut MpiComm) -> Result<(), Failure> {
    let rank = comm.rank();
    if comm.size() < 2 {
        return Err(Failure::Check("timeout needs at least 2 ranks".into()));
    }
    comm.set_timeout(Duration::from_secs(2));
    if rank == 0 {
        let start = Instant::now();
        match comm.recv_bytes(1, 14) {
            Err(e @ TransportError::Timeout { .. }) => {
                let waited = start.elapsed().as_secs_f64();
                ensure((1.9..20.0).contains(&waited), || {
                    format!("timeout after {waited:.2} s")
                })?;
                println!("TIMEOUT OK after {waited:.2} s: {e}");
            }
            Err(e) => return Err(e.into()),
            Ok(_) => return Err(Failure::Check("timeout: a message arrived".into())),
        }
    }
    Ok(())
}
