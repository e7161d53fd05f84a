//! Actors: the only owners of their chunks.
//!
//! An actor is a mailbox (a crossbeam channel of jobs) served by worker threads pinned to
//! the cores of one NUMA domain. Panel buffers are allocated inside the jobs, by the
//! actor's own threads, so first touch places them in the actor's domain; the rank thread
//! only ever moves them between passes and never reads them.

use std::thread::JoinHandle;

use std::sync::Arc;

use crossbeam_channel::{unbounded, Sender};

use crate::topology::bind_current_thread;
use rankwise_device::GpuDevice;

/// Work sent to an actor.
pub type Job = Box<dyn FnOnce() + Send + 'static>;

/// What an actor is given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActorSpec {
    /// NUMA domain (logical index) it runs on.
    pub domain: usize,
    /// OS indices of the cores its threads are pinned to; one worker thread per entry.
    pub cores: Vec<usize>,
    /// Memory budget in bytes.
    pub memory: u64,
    /// Whether to pin the threads (off in some tests and when binding is unavailable).
    pub pin: bool,
    /// The CUDA device (ordinal) of a GPU actor; its threads still run on `cores`.
    pub gpu: Option<usize>,
}

impl ActorSpec {
    /// Human-readable device name: `cpu numa0 cores 0,1`, or `gpu 0 (cpu numa0 cores 0,1)`.
    pub fn device(&self) -> String {
        let cores: Vec<String> = self.cores.iter().map(|c| c.to_string()).collect();
        let cpu = format!("cpu numa{} cores {}", self.domain, cores.join(","));
        match self.gpu {
            Some(g) => format!("gpu {g} ({cpu})"),
            None => cpu,
        }
    }
}

/// A running actor.
pub struct Actor {
    spec: ActorSpec,
    gpu: Option<Arc<GpuDevice>>,
    mailbox: Option<Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
    pin_error: Option<String>,
}

impl Actor {
    /// Starts the actor's worker threads, pinned to its cores.
    pub fn spawn(name: &str, spec: ActorSpec) -> std::io::Result<Actor> {
        Actor::spawn_with(name, spec, None)
    }

    /// Starts a GPU actor (with `gpu`, the device of `spec.gpu` already opened) or a CPU
    /// actor (`None`).
    pub fn spawn_with(
        name: &str,
        spec: ActorSpec,
        gpu: Option<Arc<GpuDevice>>,
    ) -> std::io::Result<Actor> {
        let (tx, rx) = unbounded::<Job>();
        let (pin_tx, pin_rx) = unbounded::<Option<String>>();
        let mut workers = Vec::with_capacity(spec.cores.len());
        for (t, &core) in spec.cores.iter().enumerate() {
            let rx = rx.clone();
            let pin_tx = pin_tx.clone();
            let pin = spec.pin;
            workers.push(
                std::thread::Builder::new()
                    .name(format!("{name}-w{t}"))
                    .spawn(move || {
                        let err = if pin {
                            bind_current_thread(&[core]).err().map(|e| e.to_string())
                        } else {
                            None
                        };
                        let _ = pin_tx.send(err);
                        drop(pin_tx);
                        while let Ok(job) = rx.recv() {
                            job();
                        }
                    })?,
            );
        }
        drop(pin_tx);
        let pin_error = pin_rx.iter().flatten().next();
        Ok(Actor {
            spec,
            gpu,
            mailbox: Some(tx),
            workers,
            pin_error,
        })
    }

    /// Queues a job for one of the actor's threads.
    pub fn submit(&self, job: Job) {
        if let Some(tx) = &self.mailbox {
            // The receivers live as long as the workers, which live as long as `self`.
            let _ = tx.send(job);
        }
    }

    /// The actor's specification.
    pub fn spec(&self) -> &ActorSpec {
        &self.spec
    }

    /// The device of a GPU actor.
    pub fn gpu(&self) -> Option<&Arc<GpuDevice>> {
        self.gpu.as_ref()
    }

    /// Number of worker threads.
    pub fn threads(&self) -> usize {
        self.workers.len()
    }

    /// Why pinning failed, if it did (the actor still runs, unpinned).
    pub fn pin_error(&self) -> Option<&str> {
        self.pin_error.as_deref()
    }
}

impl Drop for Actor {
    fn drop(&mut self) {
        self.mailbox = None;
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}
