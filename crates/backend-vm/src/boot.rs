//! Why a boot of the lab's VM did not reach its guest agent, and whether booting it again
//! may help. I/O-free: the backend gives what it saw (is qemu still running, what the
//! console says).
//!
//! Under TCG with two vCPUs the guest kernel has, rarely, hung silently before its init
//! (seen once in CI, empty console) or crashed during boot ("Kernel panic - not syncing:
//! Fatal exception in interrupt" at 1.5 s, seen once in CI on a verbose boot; not seen in
//! 40 boots by hand since). Neither is the lab's doing, so the VM is booted again, up to
//! [`ATTEMPTS`] boots in all.

/// Boots of the lab's VM before its failure is the run's.
pub const ATTEMPTS: usize = 3;

/// How a boot failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// qemu runs, but the guest has not said hello in time.
    Hung,
    /// The guest kernel crashed; its console's own words.
    Crashed(String),
    /// qemu exited and its guest did not crash: qemu's own failure, which a new boot
    /// would repeat.
    Qemu,
}

/// How a boot that did not reach the agent failed, from whether qemu still runs and the
/// guest's console.
pub fn failure(qemu_running: bool, console: &str) -> Failure {
    match crash(console) {
        Some(words) => Failure::Crashed(words),
        None if qemu_running => Failure::Hung,
        None => Failure::Qemu,
    }
}

/// The kernel's words for a crash on `console`, if it crashed: its panic line, without
/// the timestamp (the whole console, with what led to it, is kept in the logs).
pub fn crash(console: &str) -> Option<String> {
    console
        .lines()
        .map(|l| strip_stamp(l.trim_end_matches('\r')))
        .find(|l| l.starts_with("Kernel panic - not syncing"))
        .map(str::to_string)
}

/// `[    1.549786] text` → `text`.
fn strip_stamp(line: &str) -> &str {
    let t = line.trim_start();
    match t.strip_prefix('[').and_then(|r| r.split_once(']')) {
        Some((stamp, rest)) if stamp.trim().parse::<f64>().is_ok() => rest.trim_start(),
        _ => t,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        std::fs::read_to_string(format!(
            "{}/tests/fixtures/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    }

    #[test]
    fn a_crash_is_told_by_its_panic_line() {
        let c = fixture("console-init-exits.log");
        let words = crash(&c).expect("a crash");
        assert_eq!(
            words,
            "Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000100"
        );
        assert_eq!(failure(false, &c), Failure::Crashed(words.clone()));
        // A crashed guest whose qemu has not exited yet is no hang.
        assert_eq!(failure(true, &c), Failure::Crashed(words));
    }

    #[test]
    fn the_crash_seen_in_ci_is_a_crash() {
        // The console's last lines as the CI run's error gave them.
        let c = "[    1.549786] CR2: ffff888004401000 CR3: 000000000322a000 CR4: 0000000000750ef0\r\n\
                 [    1.549786] PKRU: 55555554\r\n\
                 [    1.549786] Kernel panic - not syncing: Fatal exception in interrupt\r\n";
        assert_eq!(
            crash(c).as_deref(),
            Some("Kernel panic - not syncing: Fatal exception in interrupt")
        );
    }

    #[test]
    fn a_silent_guest_is_hung_while_qemu_runs_and_qemus_own_failure_after() {
        let booting = fixture("console-boot-verbose.log");
        assert_eq!(failure(true, ""), Failure::Hung);
        assert_eq!(failure(true, &booting), Failure::Hung);
        assert_eq!(failure(false, &booting), Failure::Qemu);
        assert_eq!(failure(false, ""), Failure::Qemu);
    }

    #[test]
    fn a_panic_word_inside_a_line_is_no_crash() {
        let c = "[    0.100000] Kernel command line: console=ttyS0 panic=-1\n\
                 [    0.200000] printk: Kernel panic - not syncing is the word, quoted\n";
        assert_eq!(crash(c), None);
    }
}
