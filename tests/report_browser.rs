//! report.html in a real browser: headless Chromium draws it without console errors.

use std::process::Command;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_iblab");

fn chromium() -> Option<&'static str> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
}

/// Chromium's DOM of a local page and its console lines.
fn draw(browser: &str, dir: &std::path::Path, page: &std::path::Path) -> (String, Vec<String>) {
    let out = Command::new("timeout")
        .arg("120")
        .arg(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "chromium failed: {log}");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        log.lines()
            .filter(|l| l.contains(":CONSOLE"))
            .map(str::to_string)
            .collect(),
    )
}

/// `show --format svg` draws a lab without a run; the browser draws it without errors,
/// and Graphviz reads `show --format dot`.
#[test]
fn the_topology_draws_in_chromium_and_graphviz_reads_its_dot() {
    let Some(browser) = chromium() else {
        common::missing("chromium is not installed (bash .ci/run installs Debian's chromium)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("iblab-topology-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let svg = Command::new(BIN)
        .args(["show", "lesson4-reroute", "--format", "svg"])
        .output()
        .unwrap();
    assert!(svg.status.success());
    let page = dir.join("topology.html");
    std::fs::write(
        &page,
        format!(
            "<!doctype html><title>t</title>{}",
            String::from_utf8_lossy(&svg.stdout)
        ),
    )
    .unwrap();
    let (dom, console) = draw(browser, &dir, &page);
    assert!(console.is_empty(), "console messages: {console:?}");
    for want in [
        "sw1",
        "sw2",
        "isl1",
        "isl2",
        "198.18.0.2/24",
        "runs a subnet manager",
    ] {
        assert!(dom.contains(want), "{want} not drawn: {dom}");
    }
    if common::installed("dot") {
        let dot = Command::new(BIN)
            .args(["show", "lesson4-reroute", "--format", "dot"])
            .output()
            .unwrap();
        let mut gv = Command::new("dot")
            .arg("-Tsvg")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        gv.stdin.take().unwrap().write_all(&dot.stdout).unwrap();
        let out = gv.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "dot: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("isl2"));
    } else {
        common::missing("graphviz's dot is not installed (bash .ci/run installs graphviz)");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn report_draws_in_headless_chromium_without_console_errors() {
    let Some(browser) = chromium() else {
        common::missing("chromium is not installed (bash .ci/run installs Debian's chromium)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("iblab-report-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        "tests/fixtures/evidence/tcp-loss.json",
        dir.join("evidence.json"),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["report", "--color", "never", "--rewrite"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("frames_were_dropped"));
    let page = dir.join("report.html");
    let (dom, console) = draw(browser, &dir, &page);
    assert!(console.is_empty(), "console messages: {console:?}");
    // The browser built the page: three graphs over time, three stage diagrams and the
    // chart, the expectations.
    assert_eq!(dom.matches("<svg").count(), 7, "{dom}");
    assert!(dom.contains("Throughput over time") && dom.contains("data-status=\"carried\""));
    assert!(dom.contains("How the bytes travel") && dom.contains("tcp_degrades_gracefully"));
    let _ = std::fs::remove_dir_all(&dir);
}
