//! The page's own words, in the course's language (Chinese, its own terms: ①②③, 主机内部 /
//! 网络层, 标灰 / 标绿, 保持率, 子网管理器, 以太网无损) and in English: locales/ui.yml, both
//! languages side by side, read through rust-i18n like the rest of iblab's words. The browser's Accept-Language picks the language (`?lang=` overrides it). What a
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

impl Lang {
    /// The same language as the rest of iblab names it.
    pub fn lab(self) -> iblab_lab::Lang {
        match self {
            Lang::Zh => iblab_lab::Lang::ZhCn,
            Lang::En => iblab_lab::Lang::En,
        }
    }
}

/// The page's words as written: locales/ui.yml, compiled in by `i18n!` (lib.rs); its keys
/// are read from the same file for the catalog the script gets.
const LOCALES: &str = include_str!("../locales/ui.yml");

/// Every key of the page's words, in the file's order.
pub fn keys() -> impl Iterator<Item = &'static str> {
    LOCALES.lines().filter_map(|l| {
        let k = l.strip_suffix(':')?;
        (!k.is_empty() && !k.starts_with([' ', '#', '_'])).then_some(k)
    })
}

/// The word `key` in `lang` (the key itself when there is none: a bug the tests catch).
pub fn word(lang: Lang, key: &str) -> String {
    rust_i18n::t!(key, locale = lang.tag()).into_owned()
}

/// Every word in `lang`, by key, for the page's script.
pub fn catalog(lang: Lang) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for k in keys() {
        m.insert(k.into(), word(lang, k).into());
    }
    m.insert("lang".into(), lang.tag().into());
    serde_json::Value::Object(m)
}

/// The graphs' words in `lang` (the report's own).
pub fn graph_words(lang: Lang) -> graphs::Words {
    graphs::Words::of(lang.lab())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_exists_in_both_languages_once() {
        let mut seen = std::collections::BTreeSet::new();
        for k in keys() {
            assert!(seen.insert(k), "{k} twice");
            // Written in both (a missing one would fall back to English, or read as its key).
            let block: Vec<&str> = LOCALES
                .split(&format!("\n{k}:\n"))
                .nth(1)
                .unwrap_or("")
                .lines()
                .take_while(|l| l.starts_with("  "))
                .collect();
            for lang in [Lang::En, Lang::Zh] {
                assert!(
                    block
                        .iter()
                        .any(|l| l.starts_with(&format!("  {}: ", lang.tag()))),
                    "{k} is not written in {}",
                    lang.tag()
                );
                assert!(!word(lang, k).is_empty(), "{k} in {}", lang.tag());
            }
        }
        assert!(seen.len() > 50, "only {} keys read", seen.len());
        // The course's own terms are the page's.
        let zh: String = keys().map(|k| word(Lang::Zh, k)).collect();
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
            assert!(keys().any(|k| k == key), "app.js asks for `{key}`");
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
