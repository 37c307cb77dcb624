//! `up --yes`: install the Debian/Ubuntu packages a run lacks, quietly: the packages are
//! named, then one progress line stands for apt while it runs (on a terminal it follows
//! apt's own status), and apt's output goes to a log whose path is printed, with its last
//! lines, if apt fails.

use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use rust_i18n::t;

/// Offer to install `packages`: with `yes`, or yes at a prompt on a terminal. True when
/// they were installed.
pub fn install(packages: &[&str], yes: bool) -> bool {
    let l = super::lang().tag();
    let list = packages.join(" ");
    if !yes {
        if !std::io::stdin().is_terminal() {
            return false;
        }
        eprint!("{}", t!("install.ask", locale = l, packages = list));
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        // Nothing exists yet: Ctrl-C at the question ends iblab at once, as it always did
        // (a caught one would wait for the answer: reads resume after a handler).
        let read =
            iblab_sys::interrupt::default_during(|| std::io::stdin().lock().read_line(&mut answer));
        let yes = ["y", "Y", "yes", "是", "好"];
        if read.is_err() || !yes.contains(&answer.trim()) {
            return false;
        }
    }
    eprintln!("{}", t!("install.installing", locale = l, packages = list));
    let log = log_path();
    let progress = iblab_sys::progress::Progress::new();
    progress.start(&t!("install.running", locale = l, log = log.display()));
    if !std::io::stderr().is_terminal() {
        eprintln!("{}", t!("install.running", locale = l, log = log.display()));
    }
    // What was named and what it depends on, nothing it merely recommends (qemu's GUI).
    let mut args = vec!["install", "-y", "-q", "--no-install-recommends"];
    args.extend_from_slice(packages);
    let done = apt(&args, &log, &progress)
        || (apt(&["update", "-q"], &log, &progress) && apt(&args, &log, &progress));
    progress.finish();
    if done {
        return true;
    }
    let tail = std::fs::read_to_string(&log)
        .map(|text| {
            let lines: Vec<&str> = text.lines().filter(|l| !is_status(l)).collect();
            lines[lines.len().saturating_sub(10)..].join("\n")
        })
        .unwrap_or_default();
    eprintln!(
        "{}\n{tail}",
        t!("install.failed", locale = l, log = log.display())
    );
    false
}

/// Where apt's output goes: /var/log/iblab (iblab installs as root), else the temporary
/// folder.
fn log_path() -> PathBuf {
    let name = format!(
        "apt-{}-{}.log",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        std::process::id()
    );
    let dir = PathBuf::from("/var/log/iblab");
    if std::fs::create_dir_all(&dir).is_ok() {
        dir.join(name)
    } else {
        std::env::temp_dir().join(format!("iblab-{name}"))
    }
}

/// A line apt writes on its status descriptor (`APT::Status-Fd`), not its output.
fn is_status(line: &str) -> bool {
    [
        "dlstatus:",
        "pmstatus:",
        "pmerror:",
        "pmconffile:",
        "media-change:",
    ]
    .iter()
    .any(|p| line.starts_with(p))
}

/// What a status line says, for the progress line: `42% Unpacking iperf3`.
fn status_words(line: &str) -> Option<String> {
    let mut f = line.splitn(4, ':');
    let kind = f.next()?;
    if kind != "pmstatus" && kind != "dlstatus" {
        return None;
    }
    let _package = f.next()?;
    let percent: f64 = f.next()?.parse().ok()?;
    let message = f.next()?.trim();
    Some(format!("{percent:.0}% {message}"))
}

/// Run `apt-get ARGS`, its output appended to `log`, its status on the progress line.
fn apt(args: &[&str], log: &PathBuf, progress: &iblab_sys::progress::Progress) -> bool {
    let Ok(file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
    else {
        return false;
    };
    let Ok(err) = file.try_clone() else {
        return false;
    };
    let mut out = std::io::BufWriter::new(file);
    let _ = writeln!(out, "$ apt-get {}", args.join(" "));
    let _ = out.flush();
    let child = Command::new("apt-get")
        .args(["-o", "APT::Status-Fd=1"])
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(err))
        .spawn();
    let Ok(mut child) = child else {
        let _ = writeln!(out, "(apt-get could not be started)");
        return false;
    };
    let l = super::lang().tag();
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = writeln!(out, "{line}");
            if let Some(words) = status_words(&line) {
                progress.start(&t!("install.status", locale = l, status = words));
            }
        }
    }
    let _ = out.flush();
    child.wait().map(|s| s.success()).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// apt's status lines, as `apt-get -o APT::Status-Fd=1 install` writes them.
    #[test]
    fn apt_status_lines_become_the_progress_line() {
        assert_eq!(
            status_words("pmstatus:iperf3:42.8571:Unpacking iperf3 (amd64)").as_deref(),
            Some("43% Unpacking iperf3 (amd64)")
        );
        assert_eq!(
            status_words("dlstatus:1:9.3458:Retrieving file 1 of 3").as_deref(),
            Some("9% Retrieving file 1 of 3")
        );
        assert_eq!(status_words("Setting up iperf3 (3.12-1) ..."), None);
        assert!(is_status("pmstatus:dpkg-exec:0:Running dpkg"));
        assert!(!is_status(
            "Selecting previously unselected package iperf3."
        ));
    }
}
