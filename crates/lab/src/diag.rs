//! Diagnostics for bad lab files: file:line:col, what is wrong, how to fix it.

use std::fmt;
use std::sync::Arc;

use miette::{GraphicalReportHandler, GraphicalTheme, NamedSource, SourceSpan};

use super::locate::Pos;

/// The text of a lab file and the name it is reported under.
#[derive(Debug, Clone)]
pub struct SourceFile {
    pub name: String,
    pub text: Arc<str>,
}

/// One problem in a lab file.
#[derive(Debug, Clone)]
pub struct Diagnostic {
    pub file: String,
    pub line: usize,
    pub col: usize,
    pub message: String,
    pub hint: Option<String>,
    offset: usize,
    len: usize,
    source: Option<Arc<str>>,
}

impl Diagnostic {
    pub fn at(src: &SourceFile, pos: Pos, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            file: src.name.clone(),
            line: pos.line,
            col: pos.col,
            message: message.into(),
            hint: None,
            offset: pos.offset,
            len: pos.len,
            source: Some(src.text.clone()),
        }
    }

    /// A problem with no place in a file (e.g. the file cannot be read).
    pub fn whole(file: impl Into<String>, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            file: file.into(),
            line: 0,
            col: 0,
            message: message.into(),
            hint: None,
            offset: 0,
            len: 0,
            source: None,
        }
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Diagnostic {
        self.hint = Some(hint.into());
        self
    }

    /// `file:line:col` (or just the file when there is no position).
    pub fn location(&self) -> String {
        if self.line == 0 {
            self.file.clone()
        } else {
            format!("{}:{}:{}", self.file, self.line, self.col)
        }
    }

    /// Human rendering: a headline, the source snippet with a pointer, and the hint.
    pub fn render(&self, colour: bool) -> String {
        let mut out = format!("error: {}: {}\n", self.location(), self.message);
        if let Some(text) = &self.source {
            let report = Snippet {
                message: self.message.clone(),
                src: NamedSource::new(self.file.clone(), text.to_string()),
                span: SourceSpan::new(self.offset.into(), self.len.max(1)),
                help: self.hint.clone(),
            };
            let theme = if colour {
                GraphicalTheme::unicode()
            } else {
                GraphicalTheme::unicode_nocolor()
            };
            let mut body = String::new();
            if GraphicalReportHandler::new_themed(theme)
                .with_context_lines(1)
                .render_report(&mut body, &report)
                .is_ok()
            {
                out.push_str(&body);
                return out;
            }
        }
        if let Some(h) = &self.hint {
            out.push_str(&format!("  help: {h}\n"));
        }
        out
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.location(), self.message)?;
        if let Some(h) = &self.hint {
            write!(f, " (help: {h})")?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("{message}")]
struct Snippet {
    message: String,
    #[source_code]
    src: NamedSource<String>,
    #[label("here")]
    span: SourceSpan,
    #[help]
    help: Option<String>,
}

/// Every problem found in one lab file.
#[derive(Debug, Clone)]
pub struct LoadError {
    pub diagnostics: Vec<Diagnostic>,
}

impl LoadError {
    pub fn render(&self, colour: bool) -> String {
        let mut out = String::new();
        for d in &self.diagnostics {
            out.push_str(&d.render(colour));
            out.push('\n');
        }
        let n = self.diagnostics.len();
        out.push_str(&format!(
            "{n} problem{} found; nothing was deployed.\n",
            if n == 1 { "" } else { "s" }
        ));
        out
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.diagnostics {
            writeln!(f, "{d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for LoadError {}

impl From<Diagnostic> for LoadError {
    fn from(d: Diagnostic) -> LoadError {
        LoadError {
            diagnostics: vec![d],
        }
    }
}
