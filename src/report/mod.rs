//! Reports: pure functions of the evidence document (terminal, JSON, JUnit, HTML).

pub mod html;
pub mod junit;
pub mod retention;
pub mod stages;
pub mod terminal;
pub mod topology;

use std::path::Path;

use crate::evidence::Evidence;

/// Write evidence.json, junit.xml and report.html into the run folder.
pub fn write_all(e: &Evidence, dir: &Path) -> std::io::Result<()> {
    let json = serde_json::to_string_pretty(e).map_err(std::io::Error::other)?;
    std::fs::write(dir.join("evidence.json"), json)?;
    std::fs::write(dir.join("junit.xml"), junit::render(e))?;
    std::fs::write(dir.join("report.html"), html::render(e))?;
    Ok(())
}

/// Read an evidence document back from a run folder.
pub fn read(dir: &Path) -> Result<Evidence, String> {
    let path = dir.join("evidence.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut e: Evidence = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not an iblab evidence document: {e}", path.display()))?;
    e.run_dir = dir.to_path_buf();
    Ok(e)
}
