//! What a run's report.html must draw of its throughput over time, read from the HTML:
//! a graph per path, the paths that carried traffic with their series, a path that carried
//! nothing greyed as a whole with its reason. And what evidence.json must hold for it: each
//! transfer's `series`, at least one point per 250 ms of the transfer, with its provenance.

use serde_json::Value;

/// The `<figure>` of path `p` in a report (or a page).
pub fn figure<'a>(html: &'a str, p: &str) -> &'a str {
    let start = html
        .find(&format!("<figure class=\"graph path-{p} "))
        .unwrap_or_else(|| panic!("no graph of path {p} in the report"));
    let end = html[start..].find("</figure>").expect("a closed figure") + start;
    &html[start..end]
}

/// Did step `s` carry bytes (its throughput above zero)?
fn carried(s: &Value) -> bool {
    s["metrics"]["throughput_mbps"]["value"]
        .as_f64()
        .is_some_and(|v| v > 0.0)
}

/// Every path that carried traffic is drawn with its series (a polyline of at least two
/// points for each such transfer); every transfer's series has a point per 250 ms of it
/// on average and no hole of a second, with a provenance; a path whose transfers all
/// failed is drawn greyed, with a reason. Returns the paths drawn as carried.
pub fn report_draws_throughput(run_dir: &std::path::Path, e: &Value) -> Vec<String> {
    let html = std::fs::read_to_string(run_dir.join("report.html")).expect("report.html");
    let steps = e["steps"].as_array().unwrap();
    let mut drawn = vec![];
    for p in e["paths"].as_array().unwrap() {
        let p = p.as_str().unwrap();
        let mine: Vec<&Value> = steps
            .iter()
            .filter(|s| s["kind"] == "traffic" && s["path"] == p)
            .collect();
        let with_bytes: Vec<&&Value> = mine.iter().filter(|s| carried(s)).collect();
        for s in &with_bytes {
            let series = &s["series"];
            let points = series["points"]
                .as_array()
                .unwrap_or_else(|| panic!("{p} {}: no series: {s}", s["id"]));
            assert!(points.len() >= 2, "{p} {}: {points:?}", s["id"]);
            let t: Vec<f64> = points.iter().map(|x| x[0].as_f64().unwrap()).collect();
            let span = t[t.len() - 1] - t[0];
            assert!(
                points.len() as f64 >= span / 0.25,
                "{p} {}: {} points over {span:.2} s, fewer than one per 250 ms",
                s["id"],
                points.len()
            );
            let hole = t.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
            assert!(hole < 1.0, "{p} {}: a hole of {hole:.2} s", s["id"]);
            assert!(
                series["provenance"]["kind"] == s["provenance"]["kind"]
                    && series["provenance"]["source"]
                        .as_str()
                        .is_some_and(|x| x.contains("/proc/PID/net/dev")),
                "{p} {}: {series}",
                s["id"]
            );
        }
        let fig = figure(&html, p);
        if !with_bytes.is_empty() {
            assert!(fig.contains("data-status=\"carried\""), "{p}: {fig}");
            let lines = fig.matches("<polyline class=\"series\"").count();
            assert!(
                lines >= with_bytes.len(),
                "{p}: {lines} series drawn for {} transfers",
                with_bytes.len()
            );
            drawn.push(p.to_string());
        } else if mine
            .iter()
            .any(|s| matches!(s["verdict"].as_str(), Some("fail" | "error")))
        {
            assert!(
                fig.contains("data-status=\"failed\"") && fig.contains("carried-nothing"),
                "{p} carried nothing and is not drawn failed: {fig}"
            );
            let caption = fig.split("<figcaption").nth(1).unwrap_or("");
            assert!(
                caption.contains('✘'),
                "{p}: no reason under the graph: {fig}"
            );
        }
    }
    drawn
}
