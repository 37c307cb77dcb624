//! Reports: pure functions of the evidence document (terminal, JSON, JUnit, HTML).

// The reports' own words, in zh-CN and en (locales/report.yml).
rust_i18n::i18n!("locales", fallback = "en");

pub mod describe;
pub mod graphs;
pub mod html;
pub mod junit;
pub mod retention;
pub mod stages;
pub mod terminal;
pub mod topology;

use std::path::Path;

use iblab_core::evidence::Evidence;

/// Write evidence.json, junit.xml and report.html into the run folder.
pub fn write_all(e: &Evidence, dir: &Path) -> std::io::Result<()> {
    let json = serde_json::to_string_pretty(e).map_err(std::io::Error::other)?;
    write_whole(&dir.join("evidence.json"), json.as_bytes())?;
    write_whole(&dir.join("junit.xml"), junit::render(e).as_bytes())?;
    write_whole(&dir.join("report.html"), html::render(e).as_bytes())?;
    Ok(())
}

/// Write a file whole or not at all: a full disk must not leave a truncated evidence.json
/// that `iblab report` would later misread. The text goes to a temporary file beside it,
/// renamed over the name once complete; on failure the temporary file is removed.
pub fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.partial"));
    let written = std::fs::File::create(&tmp).and_then(|mut f| {
        use std::io::Write;
        f.write_all(bytes)?;
        f.sync_all()
    });
    match written.and_then(|()| std::fs::rename(&tmp, path)) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Why a run folder's evidence could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read {}: {source}", path.display())]
    Unreadable {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not an iblab evidence document: {source}", path.display())]
    NotEvidence {
        path: std::path::PathBuf,
        source: serde_json::Error,
    },
}

/// Read an evidence document back from a run folder.
pub fn read(dir: &Path) -> Result<Evidence, ReadError> {
    let path = dir.join("evidence.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(source) => return Err(ReadError::Unreadable { path, source }),
    };
    let mut e: Evidence = match serde_json::from_str(&text) {
        Ok(e) => e,
        Err(source) => return Err(ReadError::NotEvidence { path, source }),
    };
    e.run_dir = dir.to_path_buf();
    Ok(e)
}
