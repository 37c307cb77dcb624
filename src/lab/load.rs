//! Reading a lab file: parse with positions, reject unknown fields, then validate.

use std::path::Path;
use std::sync::Arc;

use super::diag::{Diagnostic, LoadError, SourceFile};
use super::locate::{Locator, offset_of};
use super::{Lab, builtin, validate};

/// A lab that parsed and validated, with its source kept for later diagnostics.
#[derive(Debug)]
pub struct LoadedLab {
    pub lab: Lab,
    pub source: SourceFile,
    pub locator: Locator,
}

/// Largest lab file accepted (lab files are small; this refuses accidents early).
const MAX_BYTES: usize = 1 << 20;

/// Resolve a built-in lab name or a path to a file, and load it.
pub fn resolve(name_or_path: &str) -> Result<LoadedLab, LoadError> {
    if let Some(b) = builtin::find(name_or_path) {
        return load_str(&format!("labs/{}.yaml", b.name), b.text);
    }
    let path = Path::new(name_or_path);
    if path.exists() {
        return load_file(path);
    }
    let known: Vec<&str> = builtin::all().iter().map(|b| b.name).collect();
    Err(
        Diagnostic::whole(name_or_path, "no built-in lab and no file by this name")
            .hint(format!(
                "built-in labs: {}; or give a path to a lab file",
                known.join(", ")
            ))
            .into(),
    )
}

/// Load a lab from a file.
pub fn load_file(path: &Path) -> Result<LoadedLab, LoadError> {
    let name = path.display().to_string();
    let meta = std::fs::metadata(path)
        .map_err(|e| Diagnostic::whole(&name, format!("cannot read: {e}")))?;
    if meta.len() as usize > MAX_BYTES {
        return Err(Diagnostic::whole(
            &name,
            format!(
                "file is {} bytes; lab files are at most {MAX_BYTES}",
                meta.len()
            ),
        )
        .into());
    }
    let text = std::fs::read_to_string(path).map_err(|e| {
        Diagnostic::whole(&name, format!("cannot read: {e}")).hint("lab files are UTF-8 YAML")
    })?;
    load_str(&name, &text)
}

/// Load a lab from text; `name` is what diagnostics call the file.
pub fn load_str(name: &str, text: &str) -> Result<LoadedLab, LoadError> {
    let source = SourceFile {
        name: name.to_string(),
        text: Arc::from(text),
    };
    let lab: Lab = serde_saphyr::from_str(text).map_err(|e| parse_diagnostic(&source, &e))?;
    let locator = Locator::new(text);
    let loaded = LoadedLab {
        lab,
        source,
        locator,
    };
    validate::validate(&loaded)?;
    Ok(loaded)
}

fn parse_diagnostic(src: &SourceFile, err: &serde_saphyr::Error) -> Diagnostic {
    let inner = err.without_snippet();
    let mut message = inner.to_string();
    // The position goes into the headline; drop the deserializer's own suffix.
    if let Some(i) = message.find(" at line ") {
        message.truncate(i);
    }
    let message = message.trim().trim_end_matches('.').to_string();
    let hint = hint_for(&message);
    let (line, col) = match err.location() {
        Some(l) => (l.line() as usize, l.column() as usize),
        None => (1, 1),
    };
    let pos = super::locate::Pos {
        line,
        col,
        offset: offset_of(&src.text, line, col),
        len: 1,
    };
    let d = Diagnostic::at(src, pos, message);
    match hint {
        Some(h) => d.hint(h),
        None => d,
    }
}

fn hint_for(message: &str) -> Option<String> {
    let m = message.to_lowercase();
    if m.contains("unknown field") {
        Some("check the spelling against `iblab schema`; fields are camelCase".into())
    } else if m.contains("missing field") {
        Some("add the field; `iblab schema` lists what each section needs".into())
    } else if m.contains("unknown variant") {
        Some("use one of the values listed".into())
    } else if m.contains("invalid type") {
        Some("the value has the wrong type here; see `iblab schema`".into())
    } else if m.contains("duplicate") {
        Some("each key may appear once in a mapping".into())
    } else if m.contains("expected")
        || m.contains("found")
        || m.contains("duration")
        || m.contains("does not fit")
    {
        Some("the value has the wrong form here; `iblab schema` describes every field".into())
    } else {
        Some("this is not valid YAML here: check indentation, colons and quotes".into())
    }
}
