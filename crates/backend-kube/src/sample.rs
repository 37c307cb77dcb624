//! Process counters from inside a pod. The pod's processes are the node's, not this
//! host's: iblab cannot read their `/proc` from here. So a traffic tool whose counters its
//! step reports runs under a POSIX shell wrapper (the lab image's `sh`, no binary of iblab's in the pod) that samples the
//! same files the other backends read, every 50 ms while the command runs, and reads them
//! once more when the command has exited but is not yet reaped: the command is the child
//! of a holder subshell that waits for it only when the sampler says so, so its zombie
//! keeps its accounting (what `waitid(WNOWAIT)` gives on the other backends). The samples
//! come back on standard error after a mark, and [`parse`] turns them into the
//! [`ProcessCounters`] the rest of iblab knows, data phase and all.
//!
//! No process is started per sample: the files are read by the shell's own `read`, and
//! the pace comes from one ticker (perl, where the image has it: Debian's images do) that
//! writes a line to a fifo every 50 ms; only without perl is `sleep` started each time.
//! Measured in a pod on the test cluster's emulated node: `cat` of the four files took
//! 64 ms a sample and `sleep` 38 ms, so two sampled commands kept both of its vCPUs busy
//! and perftest's clock calibration failed beside them; the shell's reads take 2.5 ms.
//!
//! A long life is sampled less often (after 1024 samples every 100 ms, then every 512
//! more the interval doubles, up to 800 ms), as the host's sampler halves its timeline.
//! The command is `exec`ed (a program, never the shell's builtin of that name); started as
//! an asynchronous list, it begins with SIGINT and SIGQUIT ignored (POSIX), which the
//! tools iblab stops with SIGTERM do not mind.
//!
//! Where the pod has no `mktemp` or `mkfifo`, or `/tmp` is not writable, the command runs
//! unwrapped and has no counters.

use iblab_core::counters;
use iblab_core::counters::{Counts, ProcessCounters, Sample};

/// The programs the sampler's script starts in the pod, besides the shell (and `perl`,
/// which it starts only where the image has it: it paces itself with `sleep` otherwise).
pub const PROGRAMS: &[&str] = &["sh", "mktemp", "mkfifo", "getconf", "cat", "sleep", "rm"];

/// The line that separates a command's own standard error from its samples.
pub const MARK: &str = "--- iblab process samples ---";

/// The prefix of the line by which a background command's wrapper says the command's pid.
pub const PID_LINE: &str = "iblab-pid ";

/// `$1` is `run` (samples after the mark on standard error at the end) or `spawn` (the
/// command's pid first on standard output, then the same); the command follows.
const SCRIPT: &str = r#"mode=$1; shift
if ! { d=$(mktemp -d /tmp/iblab-sample.XXXXXX) && mkfifo "$d/pid" "$d/reap"; } 2>/dev/null; then
  [ "$mode" = spawn ] && echo "iblab-pid $$"
  exec "$@"
fi
trap 'rm -rf "$d"; exit 143' HUP INT TERM
exec 3<&0
( exec "$@" <&3 3<&- & echo $! >"$d/pid"; read -r _ <"$d/reap"; wait $!; echo $? >"$d/rc" ) &
exec 3<&-
read -r pid <"$d/pid"
[ "$mode" = spawn ] && echo "iblab-pid $pid"
{
  echo "hz $(getconf CLK_TCK 2>/dev/null || echo 100)"
  n=0 every=0.05 next=1024 k=1 ticker=
  if command -v perl >/dev/null 2>&1 && mkfifo "$d/tick" 2>/dev/null; then
    perl -e '$|=1; while (print "\n") { select(undef, undef, undef, 0.05) }' >"$d/tick" &
    ticker=$!
    exec 4<"$d/tick"
  fi
  while read -r st <"/proc/$pid/stat"; do
    case $st in *") Z "*) z=end ;; *) z= ;; esac
    echo "@$z"
    for f in /proc/uptime "/proc/$pid/stat" "/proc/$pid/io"; do
      while IFS= read -r l; do echo "$l"; done <"$f"
    done
    while read -r k v; do case $k in *ctxt_switches:) echo "$k $v" ;; esac; done <"/proc/$pid/status"
    [ -n "$z" ] && break
    while IFS= read -r l; do echo "$l"; done <"/proc/$pid/net/dev"
    n=$((n + 1))
    if [ "$n" -ge "$next" ]; then
      next=$((next + 512))
      case $every in 0.05) every=0.1 k=2 ;; 0.1) every=0.2 k=4 ;; 0.2) every=0.4 k=8 ;; *) every=0.8 k=16 ;; esac
    fi
    if [ -n "$ticker" ]; then
      i=0; while [ "$i" -lt "$k" ] && read -r _ <&4; do i=$((i + 1)); done
    else
      sleep "$every"
    fi
  done
  if [ -n "$ticker" ]; then kill "$ticker"; exec 4<&-; fi
} >"$d/samples" 2>/dev/null
echo >"$d/reap"
wait
read -r rc <"$d/rc" || rc=125
printf '\n%s\n' '--- iblab process samples ---' >&2
cat "$d/samples" >&2
rm -rf "$d"
exit "$rc""#;

/// Whether a command runs to completion or in the background.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Run,
    Spawn,
}

/// The argument vector that runs `argv` in a pod under the sampler.
pub fn wrap(mode: Mode, argv: &[String]) -> Vec<String> {
    let mut v = vec![
        "sh".to_string(),
        "-c".into(),
        SCRIPT.into(),
        "iblab-sample".into(),
        match mode {
            Mode::Run => "run",
            Mode::Spawn => "spawn",
        }
        .into(),
    ];
    v.extend(argv.iter().cloned());
    v
}

/// A command's standard error as it wrote it, and the sampler's text after the mark
/// (`None`: the command ran unwrapped, or was killed before the wrapper wrote them).
pub fn split(stderr: &str) -> (&str, Option<&str>) {
    let mark = format!("\n{MARK}\n");
    match stderr.rfind(&mark) {
        Some(at) => (&stderr[..at], Some(&stderr[at + mark.len()..])),
        None => (stderr, None),
    }
}

/// Why the sampler's text gives no counters.
#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    #[error("the samples do not start with the clock tick (`hz N`)")]
    NoClockTick,
    /// Records there were, and none read.
    #[error(
        "no sample reads: {}",
        .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    )]
    NoneRead(Vec<RecordError>),
}

/// Why one record of the sampler's text does not read (it is left out).
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("a record without the uptime")]
    NoUptime,
    #[error("a record without the stat line")]
    NoStat,
    #[error("a stat line without the start time")]
    NoStartTime,
    /// The stat, io and status lines (`Counts::parse` says what is wrong).
    #[error(transparent)]
    Counts(#[from] iblab_core::counters::CountsError),
}

/// The counters of the sampled command: its accounting at its end (read from its zombie,
/// else its last sample) and its data phase, found from the samples as on every backend.
/// `Ok(None)`: no sample at all (it ended before the first).
pub fn parse(text: &str) -> Result<Option<ProcessCounters>, SampleError> {
    let mut lines = text.lines();
    let hz: f64 = lines
        .next()
        .and_then(|l| l.strip_prefix("hz "))
        .and_then(|v| v.trim().parse().ok())
        .filter(|h: &f64| *h > 0.0)
        .ok_or(SampleError::NoClockTick)?;
    let mut samples = Vec::new();
    let mut end: Option<(f64, Counts)> = None;
    let mut record: Vec<&str> = Vec::new();
    let mut is_end = false;
    let mut started = false;
    let mut bad = Vec::new();
    let mut close = |record: &[&str], is_end: bool| {
        if record.is_empty() {
            return;
        }
        // A record cut short (the command gone mid-read) is left out, not the whole run.
        let (t_s, counts, wire) = match one(record, hz) {
            Ok(r) => r,
            Err(e) => {
                bad.push(e);
                return;
            }
        };
        if is_end {
            end = Some((t_s, counts));
        } else {
            samples.push(Sample {
                t_s,
                counts,
                wire_bytes: wire.map(|b| b.rx.saturating_add(b.tx)),
                rx_bytes: wire.map(|b| b.rx),
                // A pod's processes stay in the pod's network namespace.
                netns: None,
            });
        }
    };
    for line in lines {
        if line == "@" || line == "@end" {
            if started {
                close(&record, is_end);
            }
            record.clear();
            is_end = line == "@end";
            started = true;
        } else if started {
            record.push(line);
        }
    }
    if started {
        close(&record, is_end);
    }
    if samples.is_empty() && end.is_none() && !bad.is_empty() {
        return Err(SampleError::NoneRead(bad));
    }
    let t_end = end
        .map(|e| e.0)
        .or_else(|| samples.last().map(|s| s.t_s))
        .unwrap_or(0.0);
    Ok(counters::ended(samples, t_end, end.map(|e| e.1)))
}

/// One record: `/proc/uptime`, the stat line, `io` and the two context-switch lines of
/// `status`, then (not in the end record) `net/dev`. Its time is seconds since the command
/// started (the stat line's start time, in clock ticks since boot).
fn one(record: &[&str], hz: f64) -> Result<(f64, Counts, Option<counters::Bytes>), RecordError> {
    let uptime: f64 = record
        .first()
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or(RecordError::NoUptime)?;
    let stat = record.get(1).ok_or(RecordError::NoStat)?;
    let start_ticks: f64 = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(19))
        .and_then(|v| v.parse().ok())
        .ok_or(RecordError::NoStartTime)?;
    let dev_at = record
        .iter()
        .position(|l| l.starts_with("Inter-|"))
        .unwrap_or(record.len());
    let fields = record[2..dev_at].join("\n");
    let counts = Counts::parse(&fields, stat, &fields, hz).map_err(RecordError::Counts)?;
    let wire = (dev_at < record.len())
        .then(|| counters::wire(&record[dev_at..].join("\n")))
        .flatten();
    Ok((uptime - start_ticks / hz, counts, wire))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/kube")
            .join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn the_mark_splits_a_commands_stderr_from_its_samples() {
        let (own, s) = split("warning: x\n\n--- iblab process samples ---\nhz 100\n@\n");
        assert_eq!(own, "warning: x\n");
        assert_eq!(s, Some("hz 100\n@\n"));
        let (own, s) = split("no samples here\n");
        assert_eq!((own, s), ("no samples here\n", None));
    }

    #[test]
    fn the_wrapper_passes_the_argument_vector_untouched() {
        let argv = ["iperf3".to_string(), "-c".into(), "a b".into()];
        let v = wrap(Mode::Run, &argv);
        assert_eq!(&v[..2], ["sh", "-c"]);
        assert_eq!(&v[3..], ["iblab-sample", "run", "iperf3", "-c", "a b"]);
        assert!(v[2].contains(MARK), "the script and split() share the mark");
        assert!(v[2].contains(PID_LINE.trim_end()));
    }

    /// An iperf3 client's samples as the wrapper wrote them in a pod of the test cluster:
    /// the zombie's final accounting is the total, and the data phase holds nearly all of
    /// the bytes it wrote (the payload crosses write() once).
    #[test]
    fn an_iperf3_clients_samples_from_a_pod() {
        let text = fixture("samples-iperf3-client.txt");
        let (_, s) = split(&text);
        let c = parse(s.expect("a mark")).unwrap().expect("samples");
        assert!(c.total.write_bytes > 50_000_000, "{c:?}");
        assert!(c.total.write_syscalls > 100, "{c:?}");
        let p = c.data_phase.expect("a data phase");
        assert!(p.to_s > p.from_s && p.from_s >= 0.0, "{p:?}");
        assert!(p.counts.write_bytes > c.total.write_bytes / 2, "{p:?}");
        assert!(p.counts.write_bytes <= c.total.write_bytes);
        assert!(p.wire_bytes <= p.wire_total && p.wire_total > 0, "{p:?}");
    }

    #[test]
    fn a_command_that_ended_before_the_first_sample_still_has_its_end() {
        let text = fixture("samples-short-command.txt");
        let (own, s) = split(&text);
        assert!(own.contains("err"), "{own}");
        let c = parse(s.unwrap()).unwrap().expect("its end record");
        assert!(c.total.read_syscalls > 0, "{c:?}");
        assert_eq!(c.data_phase, None);
    }

    /// The last record cut short (the process gone between two reads) is left out; the
    /// rest still counts.
    #[test]
    fn a_record_cut_short_is_left_out() {
        let text = fixture("samples-iperf3-client.txt");
        let (_, s) = split(&text);
        let whole = parse(s.unwrap()).unwrap().unwrap();
        let cut = s.unwrap().rsplit_once("@end").unwrap().0.to_string() + "@\n12.5 1.0\n";
        let c = parse(&cut).unwrap().expect("the samples before it");
        assert!(c.total.write_bytes > 0 && c.total.write_bytes <= whole.total.write_bytes);
    }

    #[test]
    fn garbage_is_an_error_not_a_figure() {
        assert!(parse("nonsense").is_err());
        assert!(parse("hz 100\n@\n12.5 1.0\n1 (x) R\n").is_err());
        assert_eq!(parse("hz 100\n").unwrap(), None);
    }
}
