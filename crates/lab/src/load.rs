//! Reading a lab file: parse with positions, reject unknown fields, then validate.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use super::diag::{Diagnostic, LoadError, SourceFile};
use super::locate::{Locator, offset_of};
use super::{Lab, builtin, validate};

/// What a load gives (defined beside [`Lab`], so that validation needs nothing of loading).
pub use super::LoadedLab;

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

/// Load a lab from a file. Only a regular file of at most [`MAX_BYTES`] is read: a
/// device (`/dev/zero`), a fifo or a folder would block or never end, and is refused
/// before it is opened.
pub fn load_file(path: &Path) -> Result<LoadedLab, LoadError> {
    let name = path.display().to_string();
    let meta = std::fs::metadata(path)
        .map_err(|e| Diagnostic::whole(&name, format!("cannot read: {e}")))?;
    if !meta.is_file() {
        return Err(Diagnostic::whole(
            &name,
            format!(
                "not a regular file (it is {}); a lab is a YAML file of at most 1 MiB",
                file_kind(&meta)
            ),
        )
        .hint("give the path of a lab file, or the name of a built-in lab (`iblab list`)")
        .into());
    }
    let too_big = |len: u64| {
        Diagnostic::whole(
            &name,
            format!("the file is {len} bytes; a lab file is at most 1 MiB ({MAX_BYTES} bytes)"),
        )
        .hint("is this the right file? A lab is a short YAML file; split a larger one")
    };
    if meta.len() > MAX_BYTES as u64 {
        return Err(too_big(meta.len()).into());
    }
    // The size may change between the look and the read: read one byte more than allowed
    // at most, so a file that grows cannot make this read forever.
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_BYTES as u64 + 1).read_to_end(&mut bytes))
        .map_err(|e| Diagnostic::whole(&name, format!("cannot read: {e}")))?;
    if bytes.len() > MAX_BYTES {
        return Err(too_big(bytes.len() as u64).into());
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        Diagnostic::whole(&name, format!("cannot read: not UTF-8 text ({e})"))
            .hint("lab files are UTF-8 YAML")
    })?;
    load_str(&name, &text)
}

/// What a path that is not a regular file is, in words.
fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "a folder"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a fifo"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

/// Load a lab from text; `name` is what diagnostics call the file.
pub fn load_str(name: &str, text: &str) -> Result<LoadedLab, LoadError> {
    let source = SourceFile {
        name: name.to_string(),
        text: Arc::from(text),
    };
    let mut lab: Lab = serde_saphyr::from_str(text).map_err(|e| parse_diagnostic(&source, &e))?;
    lab.settle_language();
    let locator = Locator::new(text);
    let mut loaded = LoadedLab {
        lab,
        steps: Vec::new(),
        source,
        locator,
    };
    // Raw steps are resolved once, by the validation that proves each has one kind.
    loaded.steps = validate::validate(&loaded)?;
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
