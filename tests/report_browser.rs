//! report.html in a real browser: headless Chromium draws it without console errors.

use std::process::Command;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_iblab");

fn chromium() -> Option<&'static str> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
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
    let profile = dir.join("profile");
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
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "chromium failed: {log}");
    let console: Vec<&str> = log.lines().filter(|l| l.contains(":CONSOLE")).collect();
    assert!(console.is_empty(), "console messages: {console:?}");
    // The browser built the page: three stage diagrams and the chart, the expectations.
    assert_eq!(dom.matches("<svg").count(), 4, "{dom}");
    assert!(dom.contains("How the bytes travel") && dom.contains("tcp_degrades_gracefully"));
    let _ = std::fs::remove_dir_all(&dir);
}
