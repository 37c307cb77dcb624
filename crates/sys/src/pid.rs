//! Facts about a process by its pid, and waiting for a child under a deadline: what the
//! state file, the process supervisor and the sampler all need, below each of them.

use std::time::{Duration, Instant};

use nix::sys::signal::kill;
use nix::unistd::Pid;

/// A process's start time in clock ticks since boot (field 22 of /proc/PID/stat).
pub fn start_ticks_of(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Is the process that owns a run still alive?
pub fn alive(pid: u32) -> bool {
    kill(Pid::from_raw(pid as i32), None).is_ok()
}

/// Wait for a child started with `std::process` for at most `limit`; past it, kill it and
/// reap it. `None` when it had to be killed. For the few synchronous commands outside a
/// step (teardown's namespace batch, host queries): none may hold iblab forever.
pub fn wait_within(
    child: &mut std::process::Child,
    limit: Duration,
) -> std::io::Result<Option<std::process::ExitStatus>> {
    let deadline = Instant::now() + limit;
    // Short commands end within milliseconds: look again soon, then less often (a fixed
    // 10 ms pause added 5 ms on average to every teardown).
    let mut pause = Duration::from_micros(250);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(10));
    }
}
