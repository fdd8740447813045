//! Builds many Maglev tables at once on the machine's cores (a full recompute at start-up or
//! after a fleet-wide change rebuilds every model's table). Each table is built by one thread
//! from its own inputs, so the tables are the same as built one by one. [`build_streamed`]
//! hands each table to the caller as soon as it and the ones before it are built, so that the
//! caller writes tables into the kernel while the next ones are being built.

use std::{
    collections::BTreeMap,
    num::NonZeroUsize,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use ailb_common::maglev::{self, MaglevBackend, MaglevError};

/// Below this many table slots in all, threads cost more than they save (a thread starts in
/// tens of microseconds; a table of 16381 slots builds in about one millisecond).
const PARALLEL_MIN_SLOTS: usize = 32 * 1024;

/// One built table and the time its build took (on its thread).
#[derive(Debug, PartialEq)]
pub struct Built {
    pub table: Result<Vec<u32>, MaglevError>,
    pub took: Duration,
}

fn build_one(members: &[MaglevBackend], size: u32) -> Built {
    let started = Instant::now();
    let table = maglev::build(members, size);
    Built { table, took: started.elapsed() }
}

/// The table of each job (`members`, table size), in job order.
pub fn build_all(jobs: &[(&[MaglevBackend], u32)]) -> Vec<Built> {
    let threads = thread::available_parallelism().map_or(1, NonZeroUsize::get).min(jobs.len());
    let slots: usize = jobs.iter().map(|(_, size)| *size as usize).sum();
    if threads <= 1 || slots < PARALLEL_MIN_SLOTS {
        return jobs.iter().map(|(members, size)| build_one(members, *size)).collect();
    }
    // Jobs are taken from a shared counter, so a thread that got small tables takes more.
    let next = AtomicUsize::new(0);
    let mut done: Vec<(usize, Built)> = thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let j = next.fetch_add(1, Ordering::Relaxed);
                        let Some((members, size)) = jobs.get(j) else { break out };
                        out.push((j, build_one(members, *size)));
                    }
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("a table builder thread panicked")).collect()
    });
    done.sort_unstable_by_key(|(j, _)| *j);
    done.into_iter().map(|(_, t)| t).collect()
}

/// Calls `take(j, table)` for each job `j` in job order, on the calling thread, while worker
/// threads build the jobs after it. Stops at the first error of `take` (the workers stop
/// taking jobs) and returns it.
pub fn build_streamed<E>(
    jobs: &[(&[MaglevBackend], u32)],
    mut take: impl FnMut(usize, Built) -> Result<(), E>,
) -> Result<(), E> {
    let threads = thread::available_parallelism().map_or(1, NonZeroUsize::get).min(jobs.len());
    let slots: usize = jobs.iter().map(|(_, size)| *size as usize).sum();
    if threads <= 1 || slots < PARALLEL_MIN_SLOTS {
        return jobs.iter().enumerate().try_for_each(|(j, (members, size))| take(j, build_one(members, *size)));
    }
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    thread::scope(|s| {
        let (tx, rx) = mpsc::channel::<(usize, Built)>();
        for _ in 0..threads {
            let (tx, next, stop) = (tx.clone(), &next, &stop);
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let j = next.fetch_add(1, Ordering::Relaxed);
                    let Some((members, size)) = jobs.get(j) else { break };
                    if tx.send((j, build_one(members, *size))).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        // Tables that came before their turn wait here.
        let mut early: BTreeMap<usize, Built> = BTreeMap::new();
        let mut want = 0;
        let result = (|| {
            while want < jobs.len() {
                let built = match early.remove(&want) {
                    Some(b) => b,
                    None => match rx.recv() {
                        Ok((j, b)) if j == want => b,
                        Ok((j, b)) => {
                            early.insert(j, b);
                            continue;
                        }
                        Err(_) => panic!("a table builder thread panicked"),
                    },
                };
                take(want, built)?;
                want += 1;
            }
            Ok(())
        })();
        stop.store(true, Ordering::Relaxed);
        result
    })
}

#[cfg(test)]
mod tests;
