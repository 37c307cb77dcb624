//! Two languages, zh-CN (the course's) and en: every built-in lab's learner text is written
//! in both, every message of iblab's own has both (with the same blanks to fill), every
//! message the code asks for is written, and a run's evidence read in Chinese gives a
//! Chinese summary and report.html. No root needed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use iblab_lab::{Lang, TextKind};

fn is_chinese(s: &str) -> bool {
    s.chars().any(|c| ('\u{4e00}'..='\u{9fff}').contains(&c))
}

/// Every text of every built-in lab a learner reads is written in zh-CN and en (words in
/// Chinese really Chinese); an expression is one for both or one per language, each.
#[test]
fn every_builtin_lab_speaks_both_languages() {
    for b in iblab_lab::builtin::all() {
        let loaded = iblab_lab::load::resolve(b.name).unwrap();
        let lab = &loaded.lab;
        for (at, text, kind) in lab.texts() {
            let langs = text.languages();
            match kind {
                TextKind::Words => {
                    assert_eq!(
                        langs,
                        vec![Lang::En, Lang::ZhCn],
                        "{}: {at} is not written in both languages",
                        b.name
                    );
                    let zh = text.get(Lang::ZhCn);
                    // A unit (`ms/MiB`) may be the same words in both.
                    assert!(
                        is_chinese(zh) || zh == text.get(Lang::En),
                        "{}: {at} in zh-CN is not Chinese: {zh}",
                        b.name
                    );
                }
                TextKind::Expression | TextKind::Unit => assert!(
                    langs.is_empty() || langs == vec![Lang::En, Lang::ZhCn],
                    "{}: {at} is an expression in {langs:?} only",
                    b.name
                ),
            }
        }
        for lang in Lang::ALL {
            assert!(lab.falls_back(lang).is_empty(), "{}: {lang}", b.name);
        }
    }
}

/// The message files of the crates that speak: (crate folder, locale file).
const MESSAGES: &[(&str, &str)] = &[
    ("src", "locales/cli.yml"),
    ("crates/core/src", "crates/core/locales/core.yml"),
    ("crates/report/src", "crates/report/locales/report.yml"),
    ("crates/engine/src", "crates/engine/locales/engine.yml"),
];

fn messages(file: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
    let mut all: BTreeMap<String, serde_json::Value> = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(all.remove("_version"), Some(serde_json::json!(2)), "{file}");
    all.into_iter()
        .map(|(k, v)| (k, serde_json::from_value(v).unwrap()))
        .collect()
}

/// The `%{name}` blanks of a message.
fn blanks(s: &str) -> BTreeSet<String> {
    s.split("%{")
        .skip(1)
        .filter_map(|p| p.split_once('}').map(|(n, _)| n.to_string()))
        .collect()
}

/// The page's words (iblab ui), asked for by its script (`t('key')`: the ui crate's own
/// test checks the script asks only for words the file has).
const PAGE_WORDS: &str = "crates/ui/locales/ui.yml";

#[test]
fn every_message_has_both_languages_with_the_same_blanks() {
    for file in MESSAGES.iter().map(|m| m.1).chain([PAGE_WORDS]) {
        for (key, by) in messages(file) {
            let langs: Vec<&str> = by.keys().map(String::as_str).collect();
            assert_eq!(langs, vec!["en", "zh-CN"], "{file}: {key}");
            assert!(by.values().all(|v| !v.trim().is_empty()), "{file}: {key}");
            assert_eq!(blanks(&by["en"]), blanks(&by["zh-CN"]), "{file}: {key}");
        }
    }
}

/// Every literal key a `t!` of a crate asks for is in that crate's file (keys made at run
/// time, `provenance.{kind}`, are checked where they are made).
#[test]
fn every_message_the_code_asks_for_is_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (dir, file) in MESSAGES {
        let known = messages(file);
        let mut asked = BTreeSet::new();
        let mut stack = vec![root.join(dir)];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "rs" || x == "html") {
                    let text = std::fs::read_to_string(&p).unwrap();
                    for pat in ["t!(\"", "t!(\n", "t(\""] {
                        let pieces: Vec<&str> = text.split(pat).collect();
                        for (before, piece) in pieces.iter().zip(pieces.iter().skip(1)) {
                            // `t!(`, not `assert!(` or `format(`.
                            if before
                                .chars()
                                .last()
                                .is_some_and(|c| c.is_alphanumeric() || c == '_')
                            {
                                continue;
                            }
                            let piece = piece.trim_start().trim_start_matches('"');
                            let key: String = piece
                                .chars()
                                .take_while(|c| c.is_ascii_alphanumeric() || "._".contains(*c))
                                .collect();
                            if key.contains('.') && !key.ends_with('.') {
                                asked.insert((key, p.display().to_string()));
                            }
                        }
                    }
                }
            }
        }
        assert!(!asked.is_empty(), "{dir}: no message asked for");
        for (key, at) in asked {
            assert!(
                known.contains_key(&key),
                "{at} asks for `{key}`, not in {file}"
            );
        }
    }
}

/// Lesson 5's captured evidence, judged again in Chinese from its own step records: the
/// terminal summary and report.html are Chinese, the ids and expressions unchanged; and
/// JUnit stays English.
#[test]
fn lesson5_reads_in_chinese() {
    let english: iblab_core::evidence::Evidence =
        iblab_core::testdata::evidence(iblab_core::testdata::LESSON5_CONGESTION);
    let e = rejudged(&english, "lesson5", Lang::ZhCn);
    assert_eq!(e.lang, Lang::ZhCn);
    assert_eq!(e.title, "无损：设计出来的 vs 后加的");
    for x in &e.expectations {
        assert!(is_chinese(&x.explanation), "{}: {}", x.id, x.explanation);
        let en = x.explanation_en.as_deref().unwrap_or("");
        assert!(!en.is_empty() && !is_chinese(en), "{}: {en}", x.id);
    }
    let summary = iblab_report::terminal::render(&e, false, false);
    for words in [
        "无损：设计出来的 vs 后加的",
        "场景 default",
        "预期",
        "RoCE 发送时没有拥塞控制；浅队列一溢出",
        "证据在",
    ] {
        assert!(summary.contains(words), "{words} missing:\n{summary}");
    }
    let html = iblab_report::html::render(&e);
    assert!(html.contains(r#"<html lang="zh-CN">"#));
    for words in [
        "吞吐随时间变化",
        "路径 roce：吞吐随时间变化",
        "只有平均值",
        "字节怎么走",
        "吞吐",
        "预期",
        "保持率",
        "对端 CPU",
        "通过",
    ] {
        assert!(html.contains(words), "{words} missing from report.html");
    }
    for english in [
        "Throughput over time",
        "throughput over time",
        "average only",
        "How the bytes travel",
        "Expectations",
        "retained",
    ] {
        assert!(
            !html.contains(english),
            "{english} in the Chinese report.html"
        );
    }
    let junit = iblab_report::junit::render(&e);
    assert!(!is_chinese(&junit), "JUnit is English:\n{junit}");
    // The ids are the English run's (the lab's expressions may have changed since).
    let ids = |e: &iblab_core::evidence::Evidence| {
        e.expectations
            .iter()
            .map(|x| x.id.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&e), ids(&english));
}

/// `evidence` judged again from its own step records, in `lang`: the plan of `lab` for
/// its scenario and paths, the expectations and the declared rows.
fn rejudged(
    evidence: &iblab_core::evidence::Evidence,
    lab: &str,
    lang: Lang,
) -> iblab_core::evidence::Evidence {
    use iblab_core::evidence::judge;
    let loaded = iblab_lab::load::resolve(lab).unwrap();
    let req = iblab_core::plan::Request {
        scenario: Some(evidence.scenario.clone()),
        backend: "vm".into(),
        lang,
        ..Default::default()
    };
    let caps = iblab_core::caps::HostCaps::for_tests().assuming(&["qemu-system-x86_64"]);
    let plan = iblab_core::plan::plan(
        &loaded,
        &req,
        &caps,
        &iblab_core::plan::backend::testing::backends(),
    )
    .unwrap();
    let ctx = judge::context(&plan, &evidence.steps);
    let mut e = evidence.clone();
    e.lang = lang;
    e.title = plan.title.clone();
    e.expectations = plan
        .expectations
        .iter()
        .map(|x| judge::judge(&plan, x, &ctx, &evidence.steps))
        .collect();
    e.comparison.rows = judge::declared_rows(&plan, &ctx, &evidence.steps);
    e
}

/// Lesson 3's comparison (a real run's step records, its rows as the lab now writes them),
/// in either language: one line per row, every line within the width; at 120 columns no
/// value is cut, narrower a value is cut with `…` and still one line; with -v every value
/// whole and the details beside it.
#[test]
fn lesson3s_comparison_is_a_line_per_row() {
    use iblab_report::terminal::{cols, render_width};
    let run: iblab_core::evidence::Evidence =
        iblab_core::testdata::evidence(iblab_core::testdata::LESSON3);
    for lang in Lang::ALL {
        let e = rejudged(&run, "lesson3", lang);
        assert_eq!(e.comparison.rows.len(), 8, "{lang}");
        for width in [120, 80] {
            let out = render_width(&e, false, false, width);
            let lines: Vec<&str> = out.lines().collect();
            let head = lines
                .iter()
                .position(|l| l.starts_with("  comparison ") || l.starts_with("  对比 "))
                .unwrap();
            // The title, two group headings and a line per row, then the legend.
            let table = &lines[head..head + 3 + e.comparison.rows.len()];
            // Every row on a line of its own (at 120 whole, so found by its name): the
            // legend comes right after the last.
            for r in e.comparison.rows.iter().filter(|_| width == 120) {
                let start = format!("  {}  ", r.name);
                let on = table.iter().filter(|l| l.starts_with(&start)).count();
                assert_eq!(
                    on, 1,
                    "{lang} at {width}: row {} on {on} lines:\n{out}",
                    r.name
                );
            }
            for l in table {
                assert!(cols(l) <= width, "{lang}: wider than {width}: {l}\n{out}");
            }
            assert!(
                lines[head + 3 + e.comparison.rows.len()].contains("[s]")
                    || lines[head + 3 + e.comparison.rows.len()].contains("[软]"),
                "{lang}: no legend under the table:\n{out}"
            );
            if width == 120 {
                assert!(!out.contains('…'), "{lang}: a value cut at 120:\n{out}");
            } else {
                assert!(out.contains('…'), "{lang}: nothing cut at 80:\n{out}");
            }
        }
        let verbose = render_width(&e, false, true, 120);
        let detail = e.comparison.rows[0].values[&iblab_lab::PathKind::Roce]
            .detail
            .clone()
            .unwrap();
        assert!(verbose.contains(&detail), "{lang}: -v lacks {detail}");
    }
}

/// A lab of one's own may be written in one language (its `metadata.language`): a reader
/// of the other reads its words as written, and the plan (so the run's evidence) says so
/// in the reader's language; a reader of its own language is told nothing.
#[test]
fn a_lab_in_one_language_falls_back_with_a_note() {
    let text = r#"
apiVersion: iblab.dev/v1
kind: Lab
metadata:
  name: zhonly
  title: 只有中文的实验
  language: zh-CN
spec:
  topology:
    nodes: [a, b]
    switches: [sw1]
    links:
      - { ends: [a, sw1] }
      - { ends: [b, sw1] }
  steps:
    - id: clean
      name: 干净链路上的吞吐
      traffic: { from: b, to: a, seconds: 1 }
  expect:
    - id: works
      that: steps.clean.tcp.ok
      because: >-
        能通。
        数据过去了。
"#;
    let loaded = iblab_lab::load::load_str("zhonly.yaml", text).unwrap();
    // A folded line between two Chinese characters leaves no space.
    assert_eq!(
        loaded.lab.spec.expect[0].because.get(Lang::ZhCn),
        "能通。数据过去了。"
    );
    let plan = |lang| {
        let req = iblab_core::plan::Request {
            backend: "local".into(),
            lang,
            ..Default::default()
        };
        iblab_core::plan::plan(
            &loaded,
            &req,
            &iblab_core::caps::HostCaps::for_tests(),
            &iblab_core::plan::backend::testing::backends(),
        )
        .unwrap()
    };
    let en = plan(Lang::En);
    assert_eq!(en.title, "只有中文的实验");
    assert_eq!(en.notes.len(), 1, "{:?}", en.notes);
    assert!(
        en.notes[0].contains("no English version") && en.notes[0].contains("简体中文"),
        "{}",
        en.notes[0]
    );
    assert!(plan(Lang::ZhCn).notes.is_empty());
}
