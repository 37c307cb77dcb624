//! The page's own words, in the course's language (Chinese, its own terms: ①②③, 主机内部 /
//! 网络层, 标灰 / 标绿, 保持率, 子网管理器, 以太网无损) and in English: one table, one row a
//! word. The browser's Accept-Language picks the language (`?lang=` overrides it). What a
//! lab says (its title, goal, scenarios, expectations) comes from the lab and its evidence
//! as they are (the lessons module is the one place that reads them).

use iblab_report::graphs;

/// A language of the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    Zh,
    En,
}

impl Lang {
    /// The tag the page declares (`<html lang>`).
    pub fn tag(self) -> &'static str {
        match self {
            Lang::Zh => "zh-CN",
            Lang::En => "en",
        }
    }

    /// `zh`, `zh-CN`, `en`, `en-US`…
    pub fn parse(s: &str) -> Option<Lang> {
        let s = s.trim().to_ascii_lowercase();
        let primary = s.split(['-', '_']).next().unwrap_or("");
        match primary {
            "zh" => Some(Lang::Zh),
            "en" => Some(Lang::En),
            _ => None,
        }
    }

    /// The language an `Accept-Language` header prefers among ours (by its q-values, in
    /// its order on a tie); English when it names neither.
    pub fn from_accept(header: Option<&str>) -> Lang {
        let mut best: Option<(f32, usize, Lang)> = None;
        for (i, part) in header.unwrap_or("").split(',').enumerate() {
            let mut it = part.split(';');
            let Some(lang) = it.next().and_then(Lang::parse) else {
                continue;
            };
            let q = it
                .find_map(|p| p.trim().strip_prefix("q="))
                .and_then(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            if q <= 0.0 {
                continue;
            }
            if best.is_none_or(|(bq, bi, _)| q > bq || (q == bq && i < bi)) {
                best = Some((q, i, lang));
            }
        }
        best.map_or(Lang::En, |b| b.2)
    }
}

/// Every word of the page: key, English, Chinese.
pub const WORDS: &[(&str, &str, &str)] = &[
    ("title", "iblab · the course's page", "iblab · 课程仿真页"),
    ("lessons", "Lessons", "课程"),
    ("lesson_n", "Lesson {n}", "第 {n} 课"),
    ("more_labs", "More labs", "更多实验"),
    ("goal", "Goal", "本课目标"),
    ("scenario", "Scenario", "场景"),
    ("scenario_default", "as written", "默认"),
    ("switches", "Switches", "开关"),
    ("switch_lossless", "Ethernet lossless", "以太网无损"),
    ("on", "on", "开"),
    ("off", "off", "关"),
    ("params", "Parameters", "参数"),
    (
        "param_rate_mbit",
        "bottleneck rate (Mbit/s)",
        "瓶颈速率（Mbit/s）",
    ),
    ("param_seconds", "seconds per transfer", "每次传输的秒数"),
    ("param_queue", "bottleneck queue", "瓶颈队列长度"),
    ("param_loss", "loss (%)", "丢包率（%）"),
    ("backend", "Backend", "后端"),
    ("run", "Run", "运行"),
    ("stop", "Stop", "停止"),
    (
        "stopping",
        "stopping: tearing down…",
        "正在停止：拆除实验环境…",
    ),
    (
        "busy",
        "a run is going: stop it first",
        "已有一次运行在进行：请先停止它",
    ),
    ("now", "Now", "当前"),
    ("steps", "Steps", "步骤"),
    ("graphs", "Throughput over time", "吞吐随时间变化"),
    (
        "graphs_note",
        "Per path, what the receiving node took in, every 50 ms (faint) and its mean over 250 ms (bold), each transfer after the other; ⚡ marks a fault's moment; a transfer that failed is banded red; a path that carried nothing is greyed as a whole.",
        "每条路径一张图：接收节点收到的流量，每 50 ms 一点（浅色）和 250 ms 均值（粗线），各次传输依次排开；⚡ 标出故障发生的时刻；失败的传输标红；一个字节都没传过去的路径整张发灰。",
    ),
    ("path_tcp", "① Ethernet + TCP/IP", "① 普通以太网 + TCP/IP"),
    (
        "path_roce",
        "② Ethernet + RDMA (RoCEv2)",
        "② 以太网 + RDMA（RoCEv2）",
    ),
    ("path_ib", "③ InfiniBand + RDMA", "③ InfiniBand + RDMA"),
    (
        "about_tcp",
        "kernel stack: copies, syscalls, the peer's CPU",
        "内核协议栈：拷贝、系统调用、对端 CPU",
    ),
    (
        "about_roce",
        "verbs over Ethernet; lossless only once PFC/ECN are configured",
        "以太网上的 verbs；配好 PFC/ECN 才无损",
    ),
    (
        "about_ib",
        "the same verbs; addresses and routes from the subnet manager; credit-based, lossless by design",
        "同一套 verbs；地址和路由由子网管理器分配；credit 流控，无损是设计出来的",
    ),
    ("comparison", "Comparison", "对比表"),
    ("host", "host-internal", "主机内部"),
    ("network", "network layer", "网络层"),
    (
        "grey_green",
        "Rows where ② and ③ are the same are grey; rows where they differ are green.",
        "②③ 相同的行标灰，不同的行标绿。",
    ),
    ("row", "row", "对比项"),
    ("detail", "detail", "详情"),
    ("retention", "Throughput retention", "吞吐保持率"),
    (
        "retention_note",
        "The throughput under the fault over what the path could have had (its clean throughput, or the bottleneck's rate if lower).",
        "故障下的吞吐 ÷ 这条路径本来能有的吞吐（它无故障时的吞吐，或瓶颈速率，取较小者）。",
    ),
    (
        "expectations",
        "What the evidence must show",
        "证据要证明的事",
    ),
    ("expression", "expression", "判定表达式"),
    ("verdict", "Verdict", "结论"),
    ("v_pass", "pass", "通过"),
    ("v_fail", "fail", "未通过"),
    ("v_error", "error", "环境错误"),
    ("v_interrupted", "interrupted", "已中断"),
    ("v_skipped", "skipped", "跳过"),
    ("v_running", "running", "运行中"),
    ("carried_nothing", "carried nothing", "一个字节都没传过去"),
    (
        "no_throughput",
        "no throughput measured on this path in this run",
        "本次运行在这条路径上没有测吞吐",
    ),
    ("not_run", "not in this run", "本次没有运行"),
    (
        "not_in_lab",
        "this lab does not use this path",
        "本实验不用这条路径",
    ),
    (
        "waiting",
        "waiting for its first transfer",
        "等待第一次传输",
    ),
    ("average_only", "average only", "只有平均值"),
    (
        "seconds_axis",
        "s since each transfer began",
        "秒（自每次传输开始）",
    ),
    ("failed", "failed", "失败"),
    ("history", "Runs", "历史运行"),
    ("no_runs", "no runs yet", "还没有运行记录"),
    (
        "pick_two",
        "Pick two runs (say lossless off and on) to see them side by side.",
        "选两次运行（比如以太网无损关、开各一次）并排对比。",
    ),
    ("compare", "Side by side", "并排对比"),
    ("report", "report", "报告"),
    ("notes", "Notes", "说明"),
    ("console", "What `iblab up` printed", "`iblab up` 的输出"),
    ("could_not_start", "could not start", "无法启动"),
    ("other_lang", "中文", "English"),
    ("other_lang_code", "zh", "en"),
    ("run_a", "A", "A"),
    ("run_b", "B", "B"),
    ("close", "close", "关闭"),
    ("params_used", "parameters", "参数"),
];

/// The word `key` in `lang` (the key itself when there is none: a bug the tests catch).
pub fn word(lang: Lang, key: &str) -> &'static str {
    WORDS
        .iter()
        .find(|w| w.0 == key)
        .map(|w| match lang {
            Lang::En => w.1,
            Lang::Zh => w.2,
        })
        .unwrap_or("?")
}

/// Every word in `lang`, by key, for the page's script.
pub fn catalog(lang: Lang) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for w in WORDS {
        m.insert(
            w.0.into(),
            match lang {
                Lang::En => w.1,
                Lang::Zh => w.2,
            }
            .into(),
        );
    }
    m.insert("lang".into(), lang.tag().into());
    serde_json::Value::Object(m)
}

/// The graphs' words in `lang`.
pub fn graph_words(lang: Lang) -> graphs::Words {
    graphs::Words {
        seconds: word(lang, "seconds_axis"),
        mbps: "Mbit/s",
        carried_nothing: word(lang, "carried_nothing"),
        no_throughput: word(lang, "no_throughput"),
        not_run: word(lang, "not_run"),
        not_in_lab: word(lang, "not_in_lab"),
        waiting: word(lang, "waiting"),
        average_only: word(lang, "average_only"),
        failed: word(lang, "failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_exists_in_both_languages_once() {
        let mut keys = std::collections::BTreeSet::new();
        for (k, en, zh) in WORDS {
            assert!(keys.insert(*k), "{k} twice");
            assert!(!en.is_empty() && !zh.is_empty(), "{k}");
        }
        // The course's own terms are the page's.
        let zh: String = WORDS.iter().map(|w| w.2).collect();
        for term in [
            "①",
            "②",
            "③",
            "主机内部",
            "网络层",
            "标灰",
            "标绿",
            "保持率",
            "子网管理器",
            "以太网无损",
        ] {
            assert!(zh.contains(term), "{term}");
        }
    }

    /// Every word the page's script asks for is in the table (`t('key')`).
    #[test]
    fn the_script_asks_only_for_words_the_table_has() {
        let js = include_str!("../assets/app.js");
        let mut n = 0;
        for (at, _) in js.match_indices("t('") {
            let before = js[..at].chars().next_back().unwrap_or(' ');
            if before.is_alphanumeric() || before == '_' || before == '.' {
                continue;
            }
            let key = js[at + 3..].split('\'').next().unwrap();
            assert!(WORDS.iter().any(|w| w.0 == key), "app.js asks for `{key}`");
            n += 1;
        }
        assert!(n > 20, "only {n} words asked for");
    }

    #[test]
    fn accept_language_picks_by_preference() {
        assert_eq!(Lang::from_accept(Some("zh-CN,zh;q=0.9,en;q=0.8")), Lang::Zh);
        assert_eq!(Lang::from_accept(Some("en-US,en;q=0.9,zh;q=0.8")), Lang::En);
        assert_eq!(Lang::from_accept(Some("fr-FR, zh-TW;q=0.5")), Lang::Zh);
        assert_eq!(Lang::from_accept(Some("en;q=0.2, zh;q=0.7")), Lang::Zh);
        assert_eq!(Lang::from_accept(Some("zh;q=0, en")), Lang::En);
        assert_eq!(Lang::from_accept(Some("fr")), Lang::En);
        assert_eq!(Lang::from_accept(None), Lang::En);
        assert_eq!(word(Lang::Zh, "switch_lossless"), "以太网无损");
        assert_eq!(catalog(Lang::Zh)["lang"], "zh-CN");
    }
}
