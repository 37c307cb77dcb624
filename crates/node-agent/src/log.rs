//! What the node agent writes where a node's administrator reads it: its own log file on
//! the node and runc's log (whose last error the shim puts in the pod's events). Whatever
//! a pod wrote (its annotation, the names in it, a tool's complaint about them) is escaped
//! and cut before it gets there, and the node's log is kept to a size.

use std::io::Write;
use std::path::Path;

/// Where the node keeps a line per pod it prepared (and why one failed).
pub const LOG: &str = "/var/log/iblab-node-runtime.log";
/// The log's size past which it is moved to `<log>.1` (the one before goes): at most
/// twice this on the node.
pub const LOG_CAP: u64 = 1024 * 1024;
/// The longest line the agent writes (a line past it is cut, saying how much went).
pub const LINE_CAP: usize = 2048;

/// `s` as one line of printable text, at most `max` bytes: control characters, escapes
/// and anything past the Basic Multilingual Plane's printable range come out as `\u{…}`,
/// so a pod's text can neither end a log line, draw on a terminal nor pass for another
/// entry.
pub fn clean(s: &str, max: usize) -> String {
    let mut out = String::new();
    for (i, c) in s.char_indices() {
        let piece: String = if c == '\\' {
            "\\\\".into()
        } else if c.is_control() || !(' '..='\u{ffef}').contains(&c) {
            c.escape_unicode().to_string()
        } else {
            c.to_string()
        };
        if out.len() + piece.len() > max {
            out.push_str(&format!("… ({} bytes more)", s.len() - i));
            return out;
        }
        out.push_str(&piece);
    }
    out
}

/// Append a line to the log at `path` (best effort): escaped and cut to [`LINE_CAP`]; the
/// file is moved to `<path>.1` first when it has grown past `cap`.
pub fn append(path: &Path, line: &str, cap: u64) {
    if std::fs::metadata(path).is_ok_and(|m| m.len() >= cap) {
        let mut old = path.as_os_str().to_owned();
        old.push(".1");
        let _ = std::fs::rename(path, old);
    }
    let _ = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| writeln!(f, "{}", clean(line, LINE_CAP)));
}

/// Append a line to the node's log ([`LOG`]).
pub fn note(line: &str) {
    append(Path::new(LOG), line, LOG_CAP);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_text_is_one_escaped_line_of_bounded_length() {
        assert_eq!(clean("pod a/b: made", 100), "pod a/b: made");
        let e = clean("x\nrefused: pod evil\u{1b}[2J\r\\", 100);
        assert!(!e.contains(['\n', '\r', '\u{1b}']), "{e}");
        assert!(
            e.contains("\\u{a}") && e.contains("\\u{1b}") && e.contains("\\\\"),
            "{e}"
        );
        let long = clean(&"é".repeat(5000), 100);
        assert!(long.len() < 130 && long.ends_with("bytes more)"), "{long}");
        assert!(clean("réseau ②", 100).contains('②'));
    }

    #[test]
    fn the_log_moves_aside_past_its_cap_and_keeps_one_before() {
        let dir = std::env::temp_dir().join(format!("iblab-node-log-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("agent.log");
        for i in 0..200 {
            append(&log, &format!("line {i} {}", "x".repeat(100)), 1000);
        }
        let now = std::fs::metadata(&log).unwrap().len();
        let before = std::fs::metadata(dir.join("agent.log.1")).unwrap().len();
        assert!(now <= 1000 + LINE_CAP as u64 && before <= 1000 + LINE_CAP as u64);
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.ends_with(&format!("line 199 {}\n", "x".repeat(100))));
        append(&log, &"y".repeat(10 * LINE_CAP), u64::MAX);
        let last = std::fs::read_to_string(&log).unwrap();
        assert!(last.lines().last().unwrap().len() < LINE_CAP + 40);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
