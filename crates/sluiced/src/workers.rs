//! Connection threads: each gRPC and HTTP connection lives on one thread of its own
//! single-threaded runtime, with every call it spawns.
//!
//! On the work-stealing runtime a call spawned by its connection's task was often woken,
//! stolen or run on the other worker, so each request crossed threads (wakeups through the
//! shared queues, a parked worker unparked, the connection's state moved between caches).
//! With the load generator on the same two cores, `sluiced` did 33–53k decisions/s there
//! against 82–93k with its connections on two threads like these (docs/benchmark.md,
//! 2026-12-01). The engine and the store are shared as before; only where a connection's
//! tasks run changes. A daemon with one CPU has one runtime and no such threads.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::runtime::Handle;
use tokio::sync::watch;

/// The connection threads, each running a single-threaded runtime until the pool is dropped.
pub struct Workers {
    threads: Vec<Worker>,
    /// Dropped with the pool: every thread's runtime then stops, and with it what is left of
    /// its connections.
    _stop: watch::Sender<()>,
}

struct Worker {
    handle: Handle,
    /// Connections placed on this thread and not finished yet.
    open: Arc<AtomicUsize>,
}

/// A place on one thread, held by a connection until it ends.
pub struct Slot {
    /// Where the connection's future is spawned.
    pub handle: Handle,
    open: Arc<AtomicUsize>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Workers {
    /// Starts `n` threads (`sluiced-conn-0`, …), each with its own single-threaded runtime.
    pub fn start(n: usize) -> std::io::Result<Workers> {
        let (stop, stopped) = watch::channel(());
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let handle = rt.handle().clone();
            let mut stopped = stopped.clone();
            std::thread::Builder::new()
                .name(format!("sluiced-conn-{i}"))
                .spawn(move || {
                    // Until the pool's sender is dropped; the runtime drops here, on its own
                    // thread, cancelling the tasks left on it.
                    rt.block_on(async move { while stopped.changed().await.is_ok() {} });
                })?;
            threads.push(Worker {
                handle,
                open: Arc::new(AtomicUsize::new(0)),
            });
        }
        Ok(Workers {
            threads,
            _stop: stop,
        })
    }

    /// A place for a new connection on the thread with the fewest open connections (the
    /// first of them on a tie), so a thread whose connections ended takes the next ones.
    pub fn place(&self) -> Option<Slot> {
        let w = self
            .threads
            .iter()
            .min_by_key(|w| w.open.load(Ordering::Relaxed))?;
        w.open.fetch_add(1, Ordering::Relaxed);
        Some(Slot {
            handle: w.handle.clone(),
            open: w.open.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The thread a future spawned at `slot` runs on.
    async fn thread_of(slot: &Slot) -> String {
        slot.handle
            .spawn(async {
                std::thread::current()
                    .name()
                    .unwrap_or_default()
                    .to_string()
            })
            .await
            .expect("the task runs")
    }

    #[tokio::test]
    async fn connections_spread_over_the_threads_and_ended_ones_free_their_place() {
        let w = Workers::start(2).expect("threads start");
        let a = w.place().expect("a place");
        let b = w.place().expect("a place");
        assert_eq!(thread_of(&a).await, "sluiced-conn-0");
        assert_eq!(thread_of(&b).await, "sluiced-conn-1");
        let c = w.place().expect("a place");
        assert_eq!(thread_of(&c).await, "sluiced-conn-0", "a tie: the first");
        drop(b);
        let d = w.place().expect("a place");
        assert_eq!(
            thread_of(&d).await,
            "sluiced-conn-1",
            "the thread with fewer open connections"
        );
    }

    #[tokio::test]
    async fn a_dropped_pool_stops_its_threads_tasks() {
        let w = Workers::start(1).expect("threads start");
        let slot = w.place().expect("a place");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = slot.handle.spawn(async move {
            let _tx = tx;
            std::future::pending::<()>().await;
        });
        drop(w);
        // The task is dropped with its runtime: its sender goes, and the receiver hears it.
        assert!(rx.await.is_err());
        assert!(task.await.is_err_and(|e| e.is_cancelled()));
    }
}
