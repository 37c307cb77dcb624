//! What a run is doing, on the terminal: a spinner on a terminal, plain lines otherwise.
//! Long stages inside a backend that would otherwise be silent (building the vm image or
//! the docker lab image on first use) announce themselves here: on a terminal the spinner
//! says what is built and why; elsewhere one line, and nothing more. Each is also an event
//! for a watcher of the run ([`crate::events`]), when one asked for them.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// The spinner of the run in progress, if stderr is a terminal.
static CURRENT: Mutex<Option<ProgressBar>> = Mutex::new(None);

fn current() -> Option<ProgressBar> {
    CURRENT.lock().ok().and_then(|c| c.clone())
}

/// A spinner on a terminal; plain lines otherwise.
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    pub fn new() -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::new_spinner();
            b.set_style(
                ProgressStyle::with_template("{spinner} {msg} {elapsed}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            b.enable_steady_tick(Duration::from_millis(120));
            b
        });
        if let Ok(mut c) = CURRENT.lock() {
            *c = bar.clone();
        }
        Progress { bar }
    }
    pub fn start(&self, what: &str) {
        crate::events::emit("stage", serde_json::json!({ "what": what }));
        if let Some(b) = &self.bar {
            b.set_message(what.to_string());
            b.reset_elapsed();
        }
    }
    pub fn line(&self, text: &str) {
        crate::events::emit("line", serde_json::json!({ "text": text }));
        match &self.bar {
            Some(b) => b.println(text),
            None => eprintln!("{text}"),
        }
    }
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
        if let Ok(mut c) = CURRENT.lock() {
            *c = None;
        }
    }
}

impl Default for Progress {
    fn default() -> Progress {
        Progress::new()
    }
}

/// A long stage starts: `why` (what is built and why) is printed once, on a terminal
/// above the spinner, which then says `what`; elsewhere that one line is all.
pub fn stage(why: &str, what: &str) {
    crate::events::emit("stage", serde_json::json!({ "what": what, "why": why }));
    match current() {
        Some(b) => {
            b.println(why);
            b.set_message(what.to_string());
            b.reset_elapsed();
        }
        None => eprintln!("{why}"),
    }
}

/// A step inside a stage (downloading, assembling): on a terminal only, in the spinner.
pub fn detail(what: &str) {
    if let Some(b) = current() {
        b.set_message(what.to_string());
    }
}

/// A line of its own (above the spinner on a terminal).
pub fn say(line: &str) {
    crate::events::emit("line", serde_json::json!({ "text": line }));
    match current() {
        Some(b) => b.println(line),
        None => eprintln!("{line}"),
    }
}

/// Whether a spinner is showing (stderr is a terminal and a run is in progress).
pub fn on_terminal() -> bool {
    current().is_some()
}
