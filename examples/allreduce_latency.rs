//! Latency of the collectives rankwise uses, under mpirun (MPI transport) or alone (Local
//! transport with 2 threads). Prints, on rank 0, the median and spread over `ITERS` calls of
//! an allreduce of n×n f64 for each n given (default 20 and 200).
//!
//! `mpirun -np 2 target/release/examples/allreduce_latency 20 200`

use std::time::Instant;

use rankwise::transports::Comm;

const ITERS: usize = 1000;

fn measure(comm: &dyn Comm, n: usize) -> Option<String> {
    let mut buf = vec![1.0f64; n * n];
    for _ in 0..50 {
        comm.allreduce_sum_f64(&mut buf).expect("allreduce");
    }
    let mut times = Vec::with_capacity(ITERS);
    for _ in 0..ITERS {
        comm.barrier().expect("barrier");
        let t = Instant::now();
        comm.allreduce_sum_f64(&mut buf).expect("allreduce");
        times.push(t.elapsed().as_secs_f64() * 1e6);
        buf.iter_mut().for_each(|x| *x = 1.0);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    (comm.rank() == 0).then(|| {
        format!(
            "allreduce {n}×{n} f64 over {} ranks ({}): median {:.1} µs, p10 {:.1} µs, p90 {:.1} µs ({ITERS} calls)",
            comm.size(),
            comm.name(),
            times[ITERS / 2],
            times[ITERS / 10],
            times[ITERS * 9 / 10]
        )
    })
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![20, 200]
    } else {
        sizes
    };
    if std::env::var_os("OMPI_COMM_WORLD_RANK").is_some() || std::env::var_os("PMIX_RANK").is_some()
    {
        let comm = rankwise::transports::MpiComm::init().expect("MPI");
        for &n in &sizes {
            if let Some(line) = measure(&comm, n) {
                println!("{line}");
            }
        }
    } else {
        let handles: Vec<_> = rankwise::transports::LocalWorld::create(2)
            .into_iter()
            .map(|c| {
                let sizes = sizes.clone();
                std::thread::spawn(move || {
                    sizes
                        .iter()
                        .filter_map(|&n| measure(&c, n))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for h in handles {
            for line in h.join().unwrap() {
                println!("{line}");
            }
        }
    }
}
