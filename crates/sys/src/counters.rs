//! Sampling a process on this host: its accounting every 50 ms while it runs, and once
//! more after it has finished but before it is reaped (`waitid(WNOWAIT)`). The figures and
//! what they mean are in [`iblab_core::counters`].

use std::time::{Duration, Instant};

use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::Pid;

use iblab_core::counters::{Counts, MAX_SAMPLES, ProcessCounters, Sample, ended, wire};

/// How often a running process is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(50);

/// Samples a child of ours while it runs (it must not be reaped meanwhile), to find its
/// data phase afterwards.
pub struct Sampler {
    samples: std::sync::Arc<std::sync::Mutex<Vec<Sample>>>,
    task: Option<tokio::task::JoinHandle<()>>,
    started: Instant,
}

impl Sampler {
    /// Start sampling `pid`, a child of ours (nothing happens outside a tokio runtime).
    pub fn start(pid: u32) -> Sampler {
        Sampler::spawn(pid, None)
    }

    /// Start sampling `pid`, a process on this host that is not our child (a container
    /// engine's exec): it lives while its start time stays the same. Its end cannot be
    /// read, so its last sample stands for its end.
    pub fn start_adopted(pid: u32) -> Sampler {
        Sampler::spawn(pid, crate::pid::start_ticks_of(pid).or(Some(0)))
    }

    fn spawn(pid: u32, adopted_start: Option<u64>) -> Sampler {
        let started = Instant::now();
        let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let task = tokio::runtime::Handle::try_current().ok().map(|rt| {
            let samples = samples.clone();
            rt.spawn(async move {
                let mut every = SAMPLE_EVERY;
                loop {
                    let gone = match adopted_start {
                        None => exited_unreaped(pid),
                        Some(t) => crate::pid::start_ticks_of(pid) != Some(t),
                    };
                    if gone {
                        return;
                    }
                    if let Some(s) = sample(pid, started) {
                        let mut v = samples.lock().unwrap_or_else(|e| e.into_inner());
                        v.push(s);
                        if v.len() >= MAX_SAMPLES {
                            let kept: Vec<Sample> = v.iter().step_by(2).copied().collect();
                            *v = kept;
                            every *= 2;
                        }
                    }
                    tokio::time::sleep(every).await;
                }
            })
        });
        Sampler {
            samples,
            task,
            started,
        }
    }

    /// The process has ended: its final accounting (`end`, read before it was reaped; else
    /// its last sample) with its data phase.
    pub fn finish(mut self, end: Option<Counts>) -> Option<ProcessCounters> {
        if let Some(t) = self.task.take() {
            t.abort();
        }
        let samples = std::mem::take(&mut *self.samples.lock().unwrap_or_else(|e| e.into_inner()));
        ended(samples, self.started.elapsed().as_secs_f64(), end)
    }
}

/// A process's counters from its samples: `end` is its final accounting, read after it
/// exited and before it was reaped (`None`: its last sample stands for it), taken `t_end`
/// seconds after it started; the data phase is found from the samples. A process that has
/// exited has no network namespace to read: its last wire figure stands for the end.
impl Drop for Sampler {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

fn sample(pid: u32, started: Instant) -> Option<Sample> {
    let counts = read(pid)?;
    let netns = std::fs::metadata(format!("/proc/{pid}/ns/net"))
        .ok()
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m));
    let wire = std::fs::read_to_string(format!("/proc/{pid}/net/dev"))
        .ok()
        .and_then(|t| wire(&t));
    Some(Sample {
        t_s: started.elapsed().as_secs_f64(),
        counts,
        wire_bytes: wire.map(|b| b.rx.saturating_add(b.tx)),
        rx_bytes: wire.map(|b| b.rx),
        netns,
    })
}

/// Read a process's counters now (`None` when it is gone or not readable).
pub fn read(pid: u32) -> Option<Counts> {
    let dir = format!("/proc/{pid}");
    let io = std::fs::read_to_string(format!("{dir}/io")).ok()?;
    let stat = std::fs::read_to_string(format!("{dir}/stat")).ok()?;
    let status = std::fs::read_to_string(format!("{dir}/status")).ok()?;
    Counts::parse(&io, &stat, &status, clock_ticks()).ok()
}

/// The kernel's clock tick (`USER_HZ`), in ticks per second.
fn clock_ticks() -> f64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(t)) if t > 0 => t as f64,
        _ => 100.0,
    }
}

/// Has our child `pid` exited? Asks without reaping it (`WNOWAIT`), so its `/proc` entry
/// and accounting stay readable until someone waits for it.
pub fn exited_unreaped(pid: u32) -> bool {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    match waitid(Id::Pid(Pid::from_raw(pid as i32)), flags) {
        Ok(WaitStatus::StillAlive) => false,
        Ok(_) => true,
        // Not our child (or already reaped): nothing to wait for.
        Err(_) => true,
    }
}

/// Wait up to `timeout` for our child `pid` to exit, without reaping it; true if it did.
pub async fn wait_unreaped(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now().checked_add(timeout);
    let mut pause = Duration::from_millis(1);
    loop {
        if exited_unreaped(pid) {
            return true;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return false;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real child, run to completion: 256 reads and 256 writes of 4 KiB, seen by the
    /// kernel's accounting before the child is reaped.
    #[tokio::test]
    async fn a_finished_child_is_read_before_it_is_reaped() {
        let argv: Vec<String> = ["dd", "if=/dev/zero", "of=/dev/null", "bs=4k", "count=256"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let out = crate::process::run(&argv, None, Duration::from_secs(10))
            .await
            .unwrap();
        assert!(out.success(), "{out:?}");
        let c = out.counters.expect("counters of a child of ours");
        // No network traffic: no data phase, the whole life stands.
        assert_eq!(c.data_phase, None);
        assert!(c.read_syscalls >= 256 && c.write_syscalls >= 256, "{c:?}");
        assert!(c.write_bytes >= 256 * 4096, "{c:?}");
        // A background server that ends on its own is read too.
        let log = std::env::temp_dir().join(format!("iblab-counters-{}.log", std::process::id()));
        let bg = crate::process::Background::start(&argv, &log).unwrap();
        let end = bg.finish(Duration::from_secs(5)).await;
        let _ = std::fs::remove_file(&log);
        assert_eq!(end.exit_code, Some(0));
        assert!(end.counters.expect("counters").read_syscalls >= 256);
    }
}
