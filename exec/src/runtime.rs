//! One rank: its transport, its actors, and the world they belong to.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam_channel::unbounded;
use rankwise_transports::{Comm, CommCounts, Counted};

use crate::actor::{Actor, ActorSpec};
use crate::grid::{ActorKind, ActorShape, World};
use crate::progress::Progress;
use crate::topology::Topology;
use crate::RuntimeError;
use rankwise_device::{self as gpu, DeviceChoice, GpuDevice};

/// How a rank sets up its actors.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// Actors on this rank; default one per NUMA domain given to the rank.
    pub actors: Option<usize>,
    /// Worker threads per actor; default the cores the actor was given.
    pub threads_per_actor: Option<usize>,
    /// Memory budget per actor in bytes; default 70% of the rank's memory shared by its
    /// actors, the rank's memory being its share of the node's available memory (shared by
    /// all ranks on the node), or `memory_limit_per_rank` when that is smaller.
    pub memory_per_actor: Option<u64>,
    /// The most this rank may use, when something outside it sets a limit (a batch system's
    /// allocation, e.g. Slurm's `--mem`): the default budget stays within it.
    pub memory_limit_per_rank: Option<u64>,
    /// This rank's index among the ranks on its node.
    pub local_rank: usize,
    /// Ranks on this node.
    pub local_size: usize,
    /// Pin worker threads to their cores.
    pub pin: bool,
    /// Who shares the node's cores out among its ranks.
    pub core_share: CoreShare,
    /// CPU actors, GPU actors, or GPU actors where the node has usable GPUs.
    pub device: DeviceChoice,
}

/// Who shares a node's cores out among the ranks on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoreShare {
    /// The launcher, where it bound this process to part of the node (`mpirun --bind-to`,
    /// `srun --cpu-bind`): every core the process may use is then this rank's. A process
    /// left unbound is shared out as with [`CoreShare::ByLocalRank`].
    LauncherIfBound,
    /// rankwise: each rank takes the NUMA domains (or part of one) its local rank names,
    /// whatever the process's binding (ranks that are threads of one process).
    ByLocalRank,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            actors: None,
            threads_per_actor: None,
            memory_per_actor: None,
            memory_limit_per_rank: None,
            local_rank: 0,
            local_size: 1,
            pin: true,
            core_share: CoreShare::LauncherIfBound,
            device: DeviceChoice::Cpu,
        }
    }
}

/// Decides this rank's actors from the topology: the node's NUMA domains are shared out
/// among the node's ranks (a domain shared by several ranks has its cores split between
/// them), then the rank's cores among its actors. With GPUs (`config.device`), the rank has
/// one actor per GPU it is given ([`gpu::gpus_for_rank`]), its cores shared among them.
pub fn actor_specs(
    topology: &Topology,
    config: &RuntimeConfig,
) -> Result<Vec<ActorSpec>, RuntimeError> {
    let gpus = match config.device {
        DeviceChoice::Cpu => Vec::new(),
        choice => {
            gpu::resolve_devices(choice, gpu::probed(), config.local_rank, config.local_size)?.0
        }
    };
    if let (Some(a), false) = (config.actors, gpus.is_empty()) {
        if a != gpus.len() {
            return Err(RuntimeError::Option {
                parameter: "actors",
                message: format!(
                    "this rank has {} GPU(s), one actor each; `actors` {a} asks for another \
                     count (use `device` cpu for CPU actors)",
                    gpus.len()
                ),
            });
        }
    }
    if config.actors == Some(0) {
        return Err(RuntimeError::Option {
            parameter: "actors",
            message: "a rank needs at least one actor".into(),
        });
    }
    if config.threads_per_actor == Some(0) {
        return Err(RuntimeError::Option {
            parameter: "threads_per_actor",
            message: "an actor needs at least one thread".into(),
        });
    }
    let local_size = config.local_size.max(1);
    // A process the launcher bound has its share already; sharing it out again by local
    // rank would leave this rank a fraction of its own cores.
    let (sharing, local_rank) = if config.core_share == CoreShare::LauncherIfBound && topology.bound
    {
        (1, 0)
    } else {
        (local_size, config.local_rank % local_size)
    };
    let domains: Vec<(usize, Vec<usize>)> = if topology.numa.is_empty() {
        vec![(0, vec![0])]
    } else {
        topology
            .numa
            .iter()
            .map(|d| {
                (
                    d.index,
                    if d.cores.is_empty() {
                        vec![0]
                    } else {
                        d.cores.clone()
                    },
                )
            })
            .collect()
    };
    // Domains (with their cores) this rank gets.
    let mine: Vec<(usize, Vec<usize>)> = if sharing <= domains.len() {
        domains
            .iter()
            .enumerate()
            .filter(|(i, _)| i % sharing == local_rank)
            .map(|(_, d)| d.clone())
            .collect()
    } else {
        let d = local_rank % domains.len();
        let sharers: Vec<usize> = (0..sharing).filter(|r| r % domains.len() == d).collect();
        let pos = sharers.iter().position(|&r| r == local_rank).unwrap_or(0);
        let cores = &domains[d].1;
        let share: Vec<usize> = if sharers.len() > cores.len() {
            // More ranks than cores: consecutive ranks share a core (ranks 0–7 the first of
            // two, 8–15 the second). The panels go to ranks spread evenly over the rank
            // range (8 panels on 16 ranks: the even ones), so each core gets its share of
            // them; taking turns (even ranks on the first core, odd on the second) put
            // every panel on one core and left the other idle: `mpirun -np 16` of a PCA on
            // 2 cores took 5–6 s where 8 ranks took 3.2 s.
            vec![cores[pos * cores.len() / sharers.len()]]
        } else {
            cores
                .iter()
                .enumerate()
                .filter(|(i, _)| i % sharers.len() == pos)
                .map(|(_, &c)| c)
                .collect()
        };
        vec![(domains[d].0, share)]
    };
    let split = config.actors.is_some() || !gpus.is_empty();
    let n_actors = if gpus.is_empty() {
        config.actors.unwrap_or(mine.len())
    } else {
        gpus.len()
    };
    let all_cores: Vec<(usize, usize)> = mine
        .iter()
        .flat_map(|(d, cs)| cs.iter().map(move |&c| (*d, c)))
        .collect();
    let memory = match config.memory_per_actor {
        Some(m) => m,
        None => {
            let avail = available_memory().unwrap_or(4 << 30);
            let mut rank_memory = avail as f64 / local_size as f64;
            if let Some(limit) = config.memory_limit_per_rank {
                rank_memory = rank_memory.min(limit as f64);
            }
            (rank_memory * 0.7 / n_actors as f64) as u64
        }
    };
    let mut specs = Vec::with_capacity(n_actors);
    for a in 0..n_actors {
        let (domain, mut cores) = if !split {
            (mine[a].0, mine[a].1.clone())
        } else {
            // Split the rank's cores round-robin; with more actors than cores, share them.
            let cs: Vec<(usize, usize)> = all_cores
                .iter()
                .enumerate()
                .filter(|(i, _)| i % n_actors == a)
                .map(|(_, &x)| x)
                .collect();
            if cs.is_empty() {
                let (d, c) = all_cores[a % all_cores.len()];
                (d, vec![c])
            } else {
                (cs[0].0, cs.iter().map(|x| x.1).collect())
            }
        };
        if let Some(t) = config.threads_per_actor {
            cores = (0..t).map(|i| cores[i % cores.len()]).collect();
        }
        specs.push(ActorSpec {
            domain,
            cores,
            memory,
            pin: config.pin,
            gpu: gpus.get(a).copied(),
        });
    }
    Ok(specs)
}

/// Available memory from /proc/meminfo, in bytes.
pub(crate) fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// One rank of a rankwise job.
pub struct Runtime {
    /// The transport, counting what it carries ([`Runtime::comm_counts`]).
    comm: Counted,
    actors: Vec<Actor>,
    world: World,
    progress: Arc<Progress>,
    interrupted: Arc<AtomicBool>,
}

/// Interrupts the work of a [`Runtime`] from another thread (a signal handler's thread,
/// the Python interpreter's on Ctrl-C): jobs not yet started are skipped, and the call in
/// progress returns [`RuntimeError::Interrupted`] once the jobs already running finish.
#[derive(Clone, Debug)]
pub struct Interrupter(Arc<AtomicBool>);

impl Interrupter {
    /// Asks the runtime to stop.
    pub fn interrupt(&self) {
        self.0.store(true, Ordering::Release);
    }
}

impl Runtime {
    /// Starts this rank's actors and learns every other rank's (a collective call: every
    /// rank of `comm` must make it).
    pub fn new(comm: Box<dyn Comm>, specs: Vec<ActorSpec>) -> Result<Runtime, RuntimeError> {
        Runtime::try_new(comm, specs).map_err(|(_, e)| e)
    }

    /// [`Runtime::new`], giving the transport back when this rank fails before it spoke to
    /// the others (a GPU that cannot be opened, threads that cannot start), so that the
    /// caller can tell every rank instead of leaving them waiting.
    pub fn try_new(
        comm: Box<dyn Comm>,
        specs: Vec<ActorSpec>,
    ) -> Result<Runtime, (Box<dyn Comm>, RuntimeError)> {
        let rank = comm.rank();
        let mut devices = Vec::with_capacity(specs.len());
        for spec in &specs {
            devices.push(match spec.gpu {
                Some(g) => match GpuDevice::open(g, gpu::probed()) {
                    Ok(d) => Some(Arc::new(d)),
                    Err(e) => return Err((comm, e.into())),
                },
                None => None,
            });
        }
        let mut actors = Vec::with_capacity(specs.len());
        for (i, (spec, dev)) in specs.into_iter().zip(devices).enumerate() {
            match Actor::spawn_with(&format!("r{rank}a{i}"), spec, dev) {
                Ok(a) => {
                    if let Some(d) = a.gpu() {
                        // Every thread may stage a panel at once, holding four buffers.
                        d.keep_pinned(4 * a.threads());
                    }
                    actors.push(a)
                }
                Err(e) => return Err((comm, e.into())),
            }
        }
        let shapes: Vec<ActorShape> = actors
            .iter()
            .map(|a| ActorShape {
                threads: a.threads(),
                memory: a.spec().memory,
                device: match a.gpu() {
                    Some(d) => format!("{} {}", a.spec().device(), d.name()),
                    None => a.spec().device(),
                },
                kind: match a.gpu() {
                    Some(_) => ActorKind::Gpu,
                    None => ActorKind::Cpu,
                },
            })
            .collect();
        let mine = encode_shapes(&shapes);
        let all = match comm.allgather_bytes(&mine) {
            Ok(all) => all,
            Err(e) => return Err((comm, e.into())),
        };
        let mut world = World::default();
        for (r, bytes) in all.iter().enumerate() {
            match decode_shapes(bytes) {
                Some(s) => world.ranks.push(s),
                None => {
                    let e = rankwise_transports::TransportError::Length {
                        peer: r,
                        got: bytes.len(),
                        expected: 0,
                    };
                    return Err((comm, e.into()));
                }
            }
        }
        Ok(Runtime {
            comm: Counted::new(comm),
            actors,
            world,
            progress: Arc::default(),
            interrupted: Arc::default(),
        })
    }

    /// Stops the actors and gives the transport back (to end the process after a failure
    /// in the transport's own way).
    pub fn into_comm(self) -> Box<dyn Comm> {
        let Runtime { comm, actors, .. } = self;
        drop(actors);
        comm.into_inner()
    }

    /// What this rank's transport has carried since the runtime was made: messages and
    /// bytes each way, and the seconds its receives waited.
    pub fn comm_counts(&self) -> CommCounts {
        self.comm.counts()
    }

    /// This rank's progress, for a display (the drivers and [`Runtime::map`] update it).
    pub fn progress(&self) -> &Arc<Progress> {
        &self.progress
    }

    /// A handle that interrupts this runtime's work from another thread.
    pub fn interrupter(&self) -> Interrupter {
        Interrupter(Arc::clone(&self.interrupted))
    }

    /// The transport.
    pub fn comm(&self) -> &dyn Comm {
        &self.comm
    }

    /// This rank's number.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// This rank's actors.
    pub fn actors(&self) -> &[Actor] {
        &self.actors
    }

    /// Every rank's actors.
    pub fn world(&self) -> &World {
        &self.world
    }

    /// Runs `f(actor, item)` for every item of `inputs[actor]` on that actor's threads and
    /// returns the results in the same shape. A panic inside a job becomes
    /// [`RuntimeError::Panic`] naming the rank and actor; the other jobs still finish first,
    /// so no actor is left holding work.
    pub fn map<T, R, F>(&self, inputs: Vec<Vec<T>>, f: F) -> Result<Vec<Vec<R>>, RuntimeError>
    where
        T: Send + 'static,
        R: Send + 'static,
        F: Fn(usize, T) -> R + Send + Sync + 'static,
    {
        assert_eq!(inputs.len(), self.actors.len(), "one input list per actor");
        if self.interrupted.load(Ordering::Acquire) {
            return Err(RuntimeError::Interrupted { rank: self.rank() });
        }
        let f = Arc::new(f);
        // Err(None): skipped, the runtime being interrupted.
        let (tx, rx) = unbounded::<(usize, usize, Result<R, Option<String>>)>();
        let mut counts = Vec::with_capacity(inputs.len());
        let counted = self
            .progress
            .claim(inputs.iter().map(|i| i.len() as u64).sum());
        for (a, items) in inputs.into_iter().enumerate() {
            counts.push(items.len());
            for (i, item) in items.into_iter().enumerate() {
                let f = Arc::clone(&f);
                let tx = tx.clone();
                let interrupted = Arc::clone(&self.interrupted);
                self.actors[a].submit(Box::new(move || {
                    // A job not started when the runtime is interrupted is skipped.
                    let r = if interrupted.load(Ordering::Acquire) {
                        Err(None)
                    } else {
                        catch_unwind(AssertUnwindSafe(|| f(a, item)))
                            .map_err(|p| Some(crate::panic_message(p.as_ref())))
                    };
                    let _ = tx.send((a, i, r));
                }));
            }
        }
        drop(tx);
        let mut slots: Vec<Vec<Option<R>>> = counts
            .iter()
            .map(|&c| (0..c).map(|_| None).collect())
            .collect();
        let mut first_panic = None;
        for (a, i, r) in rx.iter() {
            if counted {
                self.progress.finished();
            }
            match r {
                Ok(v) => slots[a][i] = Some(v),
                Err(None) => {}
                Err(Some(message)) => {
                    first_panic.get_or_insert(RuntimeError::Panic {
                        rank: self.rank(),
                        actor: a,
                        message,
                    });
                }
            }
        }
        if let Some(e) = first_panic {
            return Err(e);
        }
        if self.interrupted.load(Ordering::Acquire) {
            return Err(RuntimeError::Interrupted { rank: self.rank() });
        }
        Ok(slots
            .into_iter()
            .map(|v| {
                v.into_iter()
                    .map(|x| x.expect("every job reported"))
                    .collect()
            })
            .collect())
    }
}

fn encode_shapes(shapes: &[ActorShape]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(shapes.len() as u64).to_le_bytes());
    for s in shapes {
        out.extend_from_slice(&(s.threads as u64).to_le_bytes());
        out.extend_from_slice(&s.memory.to_le_bytes());
        out.extend_from_slice(&(s.device.len() as u64).to_le_bytes());
        out.extend_from_slice(s.device.as_bytes());
        out.push(match s.kind {
            ActorKind::Cpu => 0,
            ActorKind::Gpu => 1,
        });
    }
    out
}

fn decode_shapes(mut b: &[u8]) -> Option<Vec<ActorShape>> {
    let u64_at = |b: &mut &[u8]| -> Option<u64> {
        let (h, t) = b.split_at_checked(8)?;
        *b = t;
        Some(u64::from_le_bytes(h.try_into().ok()?))
    };
    let n = u64_at(&mut b)? as usize;
    let mut out = Vec::with_capacity(n.min(4096));
    for _ in 0..n {
        let threads = u64_at(&mut b)? as usize;
        let memory = u64_at(&mut b)?;
        let len = u64_at(&mut b)? as usize;
        let (d, t) = b.split_at_checked(len)?;
        let (&kind, t) = t.split_first()?;
        b = t;
        out.push(ActorShape {
            threads,
            memory,
            device: String::from_utf8_lossy(d).into_owned(),
            kind: match kind {
                0 => ActorKind::Cpu,
                1 => ActorKind::Gpu,
                _ => return None,
            },
        });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::NumaDomain;

    fn topo(domains: &[&[usize]]) -> Topology {
        let mut t = Topology::detect();
        t.numa = domains
            .iter()
            .enumerate()
            .map(|(i, c)| NumaDomain {
                index: i,
                os_index: i,
                cores: c.to_vec(),
                memory_bytes: 1 << 30,
            })
            .collect();
        t.bound = false;
        t
    }

    /// Regression: a rank that `srun --cpu-bind` or `mpirun --bind-to` bound to its share
    /// of the node was given half of that share again (its local rank's part of it).
    #[test]
    fn a_rank_bound_by_its_launcher_keeps_every_core_it_was_bound_to() {
        let mut t = topo(&[&[2, 3]]);
        t.bound = true;
        let cfg = |lr, ls, share| RuntimeConfig {
            local_rank: lr,
            local_size: ls,
            memory_per_actor: Some(1),
            core_share: share,
            ..Default::default()
        };
        let bound = actor_specs(&t, &cfg(1, 2, CoreShare::LauncherIfBound)).unwrap();
        assert_eq!(bound[0].cores, vec![2, 3]);
        // Ranks that are threads of one bound process still share its cores.
        let threads = actor_specs(&t, &cfg(1, 2, CoreShare::ByLocalRank)).unwrap();
        assert_eq!(threads[0].cores, vec![3]);
        // An unbound process is shared out by local rank either way.
        t.bound = false;
        let unbound = actor_specs(&t, &cfg(1, 2, CoreShare::LauncherIfBound)).unwrap();
        assert_eq!(unbound[0].cores, vec![3]);
    }

    #[test]
    fn ranks_share_domains_and_cores() {
        let t = topo(&[&[0, 1, 2, 3], &[4, 5, 6, 7]]);
        let cfg = |lr, ls| RuntimeConfig {
            local_rank: lr,
            local_size: ls,
            memory_per_actor: Some(1),
            ..Default::default()
        };
        let one = actor_specs(&t, &cfg(0, 1)).unwrap();
        assert_eq!(one.len(), 2);
        assert_eq!(one[1].cores, vec![4, 5, 6, 7]);
        let r1of2 = actor_specs(&t, &cfg(1, 2)).unwrap();
        assert_eq!((r1of2.len(), r1of2[0].domain), (1, 1));
        let r3of4 = actor_specs(&t, &cfg(3, 4)).unwrap();
        assert_eq!((r3of4[0].domain, r3of4[0].cores.clone()), (1, vec![5, 7]));
        let many = actor_specs(&t, &cfg(0, 16)).unwrap();
        assert_eq!(many[0].cores.len(), 1);
        // More ranks than cores: consecutive ranks share one, so ranks spread evenly over
        // the range (those holding panels) are spread over the cores.
        let two = topo(&[&[0, 1]]);
        let core = |lr| actor_specs(&two, &cfg(lr, 16)).unwrap()[0].cores.clone();
        for lr in 0..16 {
            assert_eq!(core(lr), vec![lr / 8], "local rank {lr} of 16");
        }
        let even: Vec<usize> = (0..16).step_by(2).map(|lr| core(lr)[0]).collect();
        assert_eq!(even.iter().filter(|&&c| c == 0).count(), 4);
    }

    #[test]
    fn actor_override_splits_and_shares_cores() {
        let t = topo(&[&[0, 1]]);
        let cfg = RuntimeConfig {
            actors: Some(4),
            memory_per_actor: Some(1),
            ..Default::default()
        };
        let s = actor_specs(&t, &cfg).unwrap();
        assert_eq!(s.len(), 4);
        assert!(s.iter().all(|a| a.cores.len() == 1));
        let zero = RuntimeConfig {
            actors: Some(0),
            ..Default::default()
        };
        assert!(actor_specs(&t, &zero)
            .unwrap_err()
            .to_string()
            .contains("`actors`"));
    }

    #[test]
    fn a_memory_limit_caps_the_default_budget() {
        let t = topo(&[&[0, 1], &[2, 3]]);
        let limited = RuntimeConfig {
            memory_limit_per_rank: Some(1000),
            ..Default::default()
        };
        // 70% of the limit, shared by the rank's two actors.
        let s = actor_specs(&t, &limited).unwrap();
        assert_eq!(s.iter().map(|a| a.memory).collect::<Vec<_>>(), [350, 350]);
        // A limit above the available memory leaves the budget within what is available.
        let huge = RuntimeConfig {
            memory_limit_per_rank: Some(u64::MAX),
            ..Default::default()
        };
        let avail = available_memory().unwrap_or(4 << 30);
        assert!(actor_specs(&t, &huge).unwrap()[0].memory <= avail);
        // An explicit budget wins over the limit.
        let explicit = RuntimeConfig {
            memory_per_actor: Some(5000),
            ..limited
        };
        assert_eq!(actor_specs(&t, &explicit).unwrap()[0].memory, 5000);
    }

    #[test]
    fn shapes_round_trip() {
        let s = vec![
            ActorShape {
                threads: 3,
                memory: 77,
                device: "cpu numa0".into(),
                kind: ActorKind::Cpu,
            },
            ActorShape {
                threads: 2,
                memory: 1 << 40,
                device: "gpu 0 (cpu numa1 cores 8,9) NVIDIA H200".into(),
                kind: ActorKind::Gpu,
            },
        ];
        let bytes = encode_shapes(&s);
        assert_eq!(decode_shapes(&bytes).unwrap(), s);
        assert!(decode_shapes(&[1, 2]).is_none());
        // A kind no rank writes, or a message cut before it, is refused.
        let mut bad = bytes.clone();
        *bad.last_mut().unwrap() = 7;
        assert!(decode_shapes(&bad).is_none());
        assert!(decode_shapes(&bytes[..bytes.len() - 1]).is_none());
    }

    #[test]
    fn map_runs_jobs_and_reports_panics() {
        let comm = rankwise_transports::LocalWorld::create(1).remove(0);
        let specs = vec![
            ActorSpec {
                domain: 0,
                cores: vec![0, 0],
                memory: 1,
                pin: false,
                gpu: None,
            };
            2
        ];
        let rt = Runtime::new(Box::new(comm), specs).unwrap();
        let out = rt
            .map(vec![vec![1, 2, 3], vec![4]], |a, x: i32| x * 10 + a as i32)
            .unwrap();
        assert_eq!(out, vec![vec![10, 20, 30], vec![41]]);
        let err = rt
            .map(vec![vec![1], vec![2]], |_, x: i32| {
                assert!(x != 2, "boom");
                x
            })
            .unwrap_err();
        assert!(
            err.to_string().contains("actor 1 on rank 0 panicked: boom"),
            "{err}"
        );
    }
}
