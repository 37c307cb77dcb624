//! A run's events as JSON lines, for a program that watches it: `iblab ui` starts `iblab up
//! … --events FILE` and reads the file as it grows. One object per line, written whole and
//! flushed at once: `{"event": KIND, "t": seconds since the file was opened, …}`. The
//! kinds: `run` (the run and its planned steps), `stage` and `line` (what the terminal
//! shows), `step_started`, `step` (a step's whole record, its throughput over time
//! included), `end` (the verdict and the exit code). Nothing is written unless a file was
//! opened; a file that cannot be written to any more is closed with a warning and the run
//! goes on: the events are for watching, the evidence is the record.

use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

struct Sink {
    file: std::fs::File,
    t0: Instant,
}

static SINK: Mutex<Option<Sink>> = Mutex::new(None);

/// Write this process's events to `path` from now on (created, or emptied).
pub fn open(path: &Path) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let file = std::fs::File::create(path)?;
    if let Ok(mut s) = SINK.lock() {
        *s = Some(Sink {
            file,
            t0: Instant::now(),
        });
    }
    Ok(())
}

/// Whether events are being written.
pub fn active() -> bool {
    SINK.lock().is_ok_and(|s| s.is_some())
}

/// One event of `kind`; `body` (an object) carries its fields.
pub fn emit(kind: &str, body: serde_json::Value) {
    let Ok(mut guard) = SINK.lock() else {
        return;
    };
    let Some(sink) = guard.as_mut() else {
        return;
    };
    let mut o = match body {
        serde_json::Value::Object(o) => o,
        serde_json::Value::Null => serde_json::Map::new(),
        other => {
            let mut o = serde_json::Map::new();
            o.insert("value".into(), other);
            o
        }
    };
    o.insert("event".into(), kind.into());
    o.insert("t".into(), sink.t0.elapsed().as_secs_f64().into());
    let mut line = serde_json::Value::Object(o).to_string();
    line.push('\n');
    if let Err(e) = sink
        .file
        .write_all(line.as_bytes())
        .and_then(|()| sink.file.flush())
    {
        tracing::warn!("cannot write the run's events any more: {e}");
        *guard = None;
    }
}

/// Stop writing events (the file stays).
pub fn close() {
    if let Ok(mut s) = SINK.lock() {
        *s = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_is_one_whole_line() {
        let dir = std::env::temp_dir().join(format!("iblab-events-{}", std::process::id()));
        let path = dir.join("sub").join("events.jsonl");
        assert!(!active());
        emit("stage", serde_json::json!({"what": "before any file"}));
        open(&path).unwrap();
        assert!(active());
        emit(
            "stage",
            serde_json::json!({"what": "provisioning\nwith a newline"}),
        );
        emit("end", serde_json::json!(3));
        close();
        emit("stage", serde_json::json!({"what": "after"}));
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0]["event"], "stage");
        assert_eq!(lines[0]["what"], "provisioning\nwith a newline");
        assert!(lines[0]["t"].as_f64().unwrap() >= 0.0);
        assert_eq!(lines[1]["event"], "end");
        assert_eq!(lines[1]["value"], 3);
    }
}
