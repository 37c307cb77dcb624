//! What a run starts, as data: where a program runs, who provides it there, the list of
//! one plan's programs, the program an argument vector starts through iblab's wrappers,
//! and whether a launcher said it could not start it. The list itself is derived by the
//! engine (`run::programs::of`); nothing here runs anything.

use std::collections::BTreeSet;

use serde::Serialize;

use crate::command::ExecOutput;

/// Where a program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Place {
    /// This host: the backend's own helpers (`ip`, qemu).
    Host,
    /// The lab's nodes: this host's programs in a namespace (local), the guest image
    /// (vm), the lab image (docker, kube).
    Nodes,
    /// Where path ③'s emulated subnet runs: a namespace of this host, or a pod of the run.
    Subnet,
}

impl Place {
    pub fn as_str(self) -> &'static str {
        match self {
            Place::Host => "host",
            Place::Nodes => "nodes",
            Place::Subnet => "subnet",
        }
    }
}

/// Who provides a place's programs.
#[derive(Debug, Clone, Copy)]
pub enum Provider {
    /// This host's own programs, found on PATH; a missing one is installed with its package.
    Host,
    /// An image iblab builds itself: `what` names it, `has` says whether a program is in
    /// it. A program it lacks is a bug in iblab, not something a user installs.
    Image {
        what: &'static str,
        has: fn(&str) -> bool,
    },
}

/// One program a run starts.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Need {
    pub place: Place,
    pub program: String,
    /// What starts it: `the link check`, `fabric ibsim`, `step send [① tcp]`.
    pub by: String,
}

/// The programs of one plan.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(transparent)]
pub struct Needs(Vec<Need>);

impl Needs {
    /// `program` runs at `place`, started by `by`.
    pub fn add(&mut self, place: Place, program: impl Into<String>, by: impl Into<String>) {
        let program = program.into();
        if program.is_empty() || self.has(place, &program) {
            return;
        }
        self.0.push(Need {
            place,
            program,
            by: by.into(),
        });
    }

    /// Every program of a list, all started by `by`.
    pub fn add_all(&mut self, place: Place, programs: &[&str], by: &str) {
        for p in programs {
            self.add(place, *p, by);
        }
    }

    pub fn all(&self) -> &[Need] {
        &self.0
    }

    /// Does the list name `program` (by its name, or the file name of a path) at `place`?
    pub fn has(&self, place: Place, program: &str) -> bool {
        let name = base(program);
        self.0
            .iter()
            .any(|n| n.place == place && (n.program == program || base(&n.program) == name))
    }

    /// The programs at one place, by name.
    pub fn at(&self, place: Place) -> BTreeSet<&str> {
        self.0
            .iter()
            .filter(|n| n.place == place)
            .map(|n| n.program.as_str())
            .collect()
    }

    pub fn sorted(mut self) -> Needs {
        self.0
            .sort_by(|a, b| (a.place, &a.program).cmp(&(b.place, &b.program)));
        self
    }
}

/// A program's file name (`/usr/sbin/ip` → `ip`).
pub fn base(program: &str) -> &str {
    program.rsplit('/').next().unwrap_or(program)
}

/// The program an argument vector starts, looking through the wrappers iblab puts around
/// commands: `ip netns exec NS`, `nsenter … --`, `timeout [-k N] SECS`, `env VAR=…`.
pub fn program_of(argv: &[String]) -> Option<&str> {
    let mut rest = argv;
    loop {
        let first = base(rest.first()?.as_str());
        rest = match first {
            "ip" if rest.len() > 4 && rest[1] == "netns" && rest[2] == "exec" => &rest[4..],
            "busybox" if rest.get(1).is_some_and(|a| a == "nsenter") => {
                let dash = rest.iter().position(|a| a == "--")?;
                &rest[dash + 1..]
            }
            "nsenter" => {
                let dash = rest.iter().position(|a| a == "--")?;
                &rest[dash + 1..]
            }
            "timeout" => {
                let mut i = 1;
                while let Some(a) = rest.get(i) {
                    match a.as_str() {
                        "-k" | "-s" | "--kill-after" | "--signal" => i += 2,
                        a if a.starts_with('-') => i += 1,
                        _ => break,
                    }
                }
                // The duration, then the command.
                &rest[(i + 1).min(rest.len())..]
            }
            "env" => {
                let mut i = 1;
                while let Some(a) = rest.get(i) {
                    match a.as_str() {
                        "-C" | "-u" | "--chdir" | "--unset" => i += 2,
                        a if a.starts_with('-') || a.contains('=') => i += 1,
                        _ => break,
                    }
                }
                &rest[i.min(rest.len())..]
            }
            _ => return rest.first().map(String::as_str),
        };
    }
}

/// A command that could not be started: the program, and why (as its launcher said).
#[derive(Debug, Clone, PartialEq)]
pub struct NotStarted {
    pub program: String,
    pub why: String,
    /// The launcher's own line, for the evidence.
    pub said: String,
}

/// Did this command fail to start at all (its program missing or not executable), by what
/// the launcher in between printed? The launchers are the ones iblab runs commands
/// through, with their messages as captured on real systems: `ip netns exec`, coreutils'
/// `timeout`, busybox's `nsenter`, a POSIX shell's `exec`, iblab's guest agent, the
/// container runtimes' exec.
pub fn not_started(out: &ExecOutput, program: &str) -> Option<NotStarted> {
    if out.success() || out.timed_out {
        return None;
    }
    let name = base(program);
    let why_of = |tail: &str| {
        let t = tail.trim();
        if t.is_empty() || t == "not found" {
            "not found".to_string()
        } else {
            t.to_string()
        }
    };
    for line in out.stderr.lines().chain(out.stdout.lines()) {
        let line = line.trim();
        // A named program and what followed it, in the launcher's own words.
        let found = named(line, "exec of \"", "\" failed: ")
            .or_else(|| named(line, "failed to run command ‘", "’: "))
            .or_else(|| named(line, "failed to run command '", "': "))
            .or_else(|| named(line, "can't execute '", "': "))
            .or_else(|| named(line, "exec: \"", "\": "))
            .or_else(|| named(line, "cannot run ", ": "))
            .or_else(|| shell_exec(line));
        if let Some((who, why)) = found
            && (who == program || base(who) == name || base(first_word(who)) == name)
            && missing_or_denied(why)
        {
            return Some(NotStarted {
                program: program.to_string(),
                why: why_of(why.split(": unknown").next().unwrap_or(why)),
                said: line.to_string(),
            });
        }
    }
    None
}

fn first_word(s: &str) -> &str {
    s.split_whitespace().next().unwrap_or(s)
}

/// `… {open}NAME{close}WHY`: (NAME, WHY).
fn named<'a>(line: &'a str, open: &str, close: &str) -> Option<(&'a str, &'a str)> {
    let start = line.find(open)? + open.len();
    let rest = &line[start..];
    let end = rest.find(close)?;
    Some((&rest[..end], &rest[end + close.len()..]))
}

/// dash: `sh: 1: exec: NAME: not found`; busybox: `sh: exec: line 0: NAME: not found`.
fn shell_exec(line: &str) -> Option<(&str, &str)> {
    let rest = line.strip_suffix(": not found")?;
    let name = rest.rsplit(": ").next()?;
    (rest.contains("exec: ") && !name.is_empty()).then_some((name, "not found"))
}

fn missing_or_denied(why: &str) -> bool {
    let w = why.to_ascii_lowercase();
    [
        "no such file or directory",
        "not found",
        "permission denied",
        "executable file not found",
    ]
    .iter()
    .any(|k| w.contains(k))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(words: &[&str]) -> Vec<String> {
        words.iter().map(|s| s.to_string()).collect()
    }

    fn failed(code: i32, stderr: &str) -> ExecOutput {
        ExecOutput::exited(code, stderr)
    }

    #[test]
    fn the_program_is_found_through_iblabs_wrappers() {
        let p = |w: &[&str]| program_of(&v(w)).map(str::to_string);
        assert_eq!(p(&["ping", "-c", "1"]).as_deref(), Some("ping"));
        assert_eq!(
            p(&["ip", "netns", "exec", "iblab-1-a", "iperf3", "-s"]).as_deref(),
            Some("iperf3")
        );
        assert_eq!(p(&["ip", "-j", "link"]).as_deref(), Some("ip"));
        assert_eq!(
            p(&["timeout", "-k", "2", "5.0", "ib_write_bw", "-d"]).as_deref(),
            Some("ib_write_bw")
        );
        assert_eq!(
            p(&[
                "/usr/bin/busybox",
                "nsenter",
                "--net=/run/netns/a",
                "--",
                "/usr/bin/rping"
            ])
            .as_deref(),
            Some("/usr/bin/rping")
        );
        assert_eq!(
            p(&["env", "SIM_HOST=a", "LD_PRELOAD=x.so", "smpquery", "-D"]).as_deref(),
            Some("smpquery")
        );
        assert_eq!(
            p(&["env", "-C", "/tmp/iblab-ib/scratch", "A=1", "opensm", "-F"]).as_deref(),
            Some("opensm")
        );
        assert_eq!(
            p(&["ip", "netns", "exec", "ns", "timeout", "3", "ping"]).as_deref(),
            Some("ping")
        );
        assert_eq!(p(&[]), None);
    }

    /// What each launcher printed on this project's machines when the program was not
    /// there (or not executable): Debian 12's iproute2 6.1, coreutils 9.1 (UTF-8 and C
    /// locales), dash, busybox 1.35 (nsenter and sh), the guest agent.
    #[test]
    fn a_program_that_could_not_start_is_told_from_one_that_failed() {
        let cases = [
            (
                1,
                "exec of \"no-such-prog-x\" failed: No such file or directory",
            ),
            (
                127,
                "timeout: failed to run command ‘no-such-prog-x’: No such file or directory",
            ),
            (
                127,
                "timeout: failed to run command 'no-such-prog-x': No such file or directory",
            ),
            (127, "sh: 1: exec: no-such-prog-x: not found"),
            (
                127,
                "nsenter: can't execute 'no-such-prog-x': No such file or directory",
            ),
            (127, "sh: exec: line 0: no-such-prog-x: not found"),
            (
                127,
                "cannot run no-such-prog-x -c 1: No such file or directory (os error 2)",
            ),
            // Debian's docker.io 20.10 (runc 1.1), its CLI and its Engine API alike.
            (
                126,
                "OCI runtime exec failed: exec failed: unable to start container process: exec: \"no-such-prog-x\": executable file not found in $PATH: unknown",
            ),
        ];
        for (code, text) in cases {
            let got = not_started(&failed(code, text), "no-such-prog-x");
            assert!(got.is_some(), "{text}");
        }
        let denied = not_started(
            &failed(1, "exec of \"/tmp/noexec-x\" failed: Permission denied"),
            "/tmp/noexec-x",
        )
        .unwrap();
        assert_eq!(denied.why, "Permission denied");
        // A program that ran and failed, or a message about another program, is a result.
        for (code, text, prog) in [
            (1, "ping: connect: Network is unreachable", "ping"),
            (2, "iperf3: error - unable to connect to server", "iperf3"),
            (
                1,
                "exec of \"other\" failed: No such file or directory",
                "ping",
            ),
            (1, "Couldn't open file: No such file or directory", "cat"),
        ] {
            assert_eq!(not_started(&failed(code, text), prog), None, "{text}");
        }
        let mut ok = failed(0, "exec of \"ping\" failed: No such file or directory");
        ok.exit_code = Some(0);
        assert_eq!(not_started(&ok, "ping"), None);
    }

    #[test]
    fn needs_are_named_once_and_found_by_file_name() {
        let mut n = Needs::default();
        n.add(Place::Nodes, "ping", "the link check");
        n.add(Place::Nodes, "ping", "step x");
        n.add(Place::Host, "/usr/sbin/ip", "the local backend");
        assert_eq!(n.all().len(), 2);
        assert!(n.has(Place::Nodes, "/usr/bin/ping"));
        assert!(n.has(Place::Host, "ip"));
        assert!(!n.has(Place::Host, "ping"));
        assert_eq!(n.all()[0].by, "the link check");
    }
}
