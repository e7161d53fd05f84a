//! Point-to-point latency and bandwidth between two ranks, and the R-factor tree reduction
//! of TSQR, over the MPI or the UCX transport. Run it under `mpirun -np 2` (the tree also
//! on more ranks):
//!
//! ```text
//! mpirun -np 2 target/release/examples/transport_bench mpi
//! UCX_TLS=tcp,self mpirun -np 2 target/release/examples/transport_bench ucx
//! ```
//!
//! Rank 0 prints one tab-separated line per measurement: `name`, `median`, `min`, `max`,
//! `unit`, `repetitions`. Measurements:
//! * `latency 8 B`: half the round-trip time of an 8-byte ping-pong between ranks 0 and 1
//!   (each repetition the mean over a batch of 200 round trips), µs.
//! * `bandwidth 1 MiB`, `bandwidth 64 MiB`: rank 0 streams a batch of messages to rank 1
//!   (64 × 1 MiB, 4 × 64 MiB), which answers with 8 bytes at the end; payload bytes over the
//!   batch's time, GB/s (10⁹ bytes per second).
//! * `R tree n = 20`, `R tree n = 200`: `Tree::up` over 16 panels spread evenly over the
//!   ranks, each leaf an n × n upper triangular R, combined as TSQR does (QR of the two
//!   stacked children): the reduction of the R factors as `svd` runs it; ms per reduction.

use std::collections::BTreeMap;
use std::time::Instant;

use ndarray::Array2;
use rankwise::linalg::internals::kernels::{qr, stack_rows};
use rankwise::linalg::Tree;
use rankwise::transports::Comm;

const PANELS: usize = 16;

/// Median, min and max.
fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn report(comm: &dyn Comm, name: &str, values: Vec<f64>, unit: &str) {
    if comm.rank() == 0 {
        let n = values.len();
        let (median, min, max) = stats(values);
        println!("{name}\t{median:.6}\t{min:.6}\t{max:.6}\t{unit}\t{n}");
    }
}

fn latency(comm: &dyn Comm, reps: usize) {
    const BATCH: usize = 200;
    let msg = [7u8; 8];
    let mut times = Vec::new();
    for rep in 0..reps + 2 {
        comm.barrier().expect("barrier");
        let t = Instant::now();
        for _ in 0..BATCH {
            match comm.rank() {
                0 => {
                    comm.send_bytes(1, 1, &msg).expect("send");
                    comm.recv_bytes(1, 2).expect("recv");
                }
                1 => {
                    comm.recv_bytes(0, 1).expect("recv");
                    comm.send_bytes(0, 2, &msg).expect("send");
                }
                _ => {}
            }
        }
        // Two warm-up batches.
        if rep >= 2 {
            times.push(t.elapsed().as_secs_f64() / BATCH as f64 / 2.0 * 1e6);
        }
    }
    report(comm, "latency 8 B", times, "µs");
}

fn bandwidth(comm: &dyn Comm, name: &str, bytes: usize, batch: usize, reps: usize) {
    let msg = vec![3u8; bytes];
    let mut rates = Vec::new();
    for rep in 0..reps + 1 {
        comm.barrier().expect("barrier");
        let t = Instant::now();
        match comm.rank() {
            0 => {
                for _ in 0..batch {
                    comm.send_bytes(1, 3, &msg).expect("send");
                }
                comm.recv_bytes(1, 4).expect("ack");
            }
            1 => {
                for _ in 0..batch {
                    let got = comm.recv_bytes(0, 3).expect("recv");
                    assert_eq!(got.len(), bytes);
                }
                comm.send_bytes(0, 4, &[0u8; 8]).expect("ack");
            }
            _ => {}
        }
        if rep >= 1 {
            rates.push((bytes * batch) as f64 / t.elapsed().as_secs_f64() / 1e9);
        }
    }
    report(comm, name, rates, "GB/s");
}

fn r_tree(comm: &dyn Comm, n: usize, reps: usize) {
    let owners: Vec<usize> = (0..PANELS).map(|p| p * comm.size() / PANELS).collect();
    let tree = Tree::new(&owners);
    let leaf = |p: usize| {
        Array2::from_shape_fn((n, n), |(i, j)| {
            if i <= j {
                1.0 + ((p * 31 + i * 7 + j * 3) % 17) as f64 / 17.0
            } else {
                0.0
            }
        })
    };
    let mut times = Vec::new();
    for rep in 0..reps + 2 {
        let leaves: BTreeMap<usize, Array2<f64>> = (0..PANELS)
            .filter(|&p| owners[p] == comm.rank())
            .map(|p| (p, leaf(p)))
            .collect();
        comm.barrier().expect("barrier");
        let t = Instant::now();
        let root = tree
            .up(comm, leaves, |_, _, a, b| {
                Ok(qr(stack_rows(&[a.view(), b.view()]))?.1)
            })
            .expect("tree");
        // The root's owner has it; everyone waits for it, as `svd` does with its broadcast.
        let mut done = vec![root.is_some() as u8];
        comm.broadcast_bytes(tree.root_owner(), &mut done)
            .expect("broadcast");
        if rep >= 2 {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    report(comm, &format!("R tree n = {n}"), times, "ms");
}

fn run(comm: &dyn Comm, quick: bool) {
    let reps = if quick { 5 } else { 21 };
    if comm.rank() == 0 {
        println!(
            "# transport {} on {} ranks, {reps} repetitions",
            comm.name(),
            comm.size()
        );
    }
    if comm.size() >= 2 {
        latency(comm, reps);
        bandwidth(comm, "bandwidth 1 MiB", 1 << 20, 64, reps);
        bandwidth(comm, "bandwidth 64 MiB", 64 << 20, 4, reps.min(11));
    }
    r_tree(comm, 20, reps * 5);
    r_tree(comm, 200, reps);
}

fn main() {
    rankwise::linalg::init_blas_threads();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let transport = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map(String::as_str)
        .unwrap_or("mpi");
    match transport {
        "mpi" => {
            let comm = rankwise::transports::MpiComm::init().expect("MPI");
            run(&comm, quick);
        }
        "ucx" => {
            let comm = rankwise::transports::UcxComm::init().expect("UCX");
            run(&comm, quick);
        }
        other => {
            eprintln!("transport_bench: unknown transport {other:?} (mpi or ucx)");
            std::process::exit(2);
        }
    }
}
