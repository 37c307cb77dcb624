//! Words a learner reads, in the languages iblab speaks: Simplified Chinese (zh-CN), the
//! course's own language, and English.
//!
//! [`Lang`] is a language iblab speaks, chosen by `--lang`, else by the locale
//! ([`Lang::from_env`]: `LC_ALL`, `LC_MESSAGES`, `LANG`), or by a browser's
//! `Accept-Language` where a page is served ([`Lang::from_accept_language`]). [`Text`] is
//! what a lab file writes for a learner: one string, or one per language
//! (`{en: …, zh-CN: …}`); [`Text::get`] gives it in a language, falling back to another the
//! text has when it lacks that one ([`Text::resolve`] says when it did).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A language iblab speaks.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub enum Lang {
    /// English.
    #[default]
    #[serde(rename = "en")]
    En,
    /// Simplified Chinese, the course's own language and terms.
    #[serde(rename = "zh-CN")]
    ZhCn,
}

impl Lang {
    pub const ALL: [Lang; 2] = [Lang::En, Lang::ZhCn];

    /// The language's tag (BCP 47), as lab files, evidence.json and HTML write it.
    pub fn tag(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::ZhCn => "zh-CN",
        }
    }

    /// The language's name, in itself.
    pub fn name(self) -> &'static str {
        match self {
            Lang::En => "English",
            Lang::ZhCn => "简体中文",
        }
    }

    /// A tag or a locale name: `en`, `en-US`, `zh`, `zh-CN`, `zh_CN.UTF-8`, `zh-Hans`, …
    /// Every Chinese one is zh-CN (the course is written in Simplified Chinese); `C` and
    /// `POSIX` are English. `None` for a language iblab does not speak.
    pub fn parse(s: &str) -> Option<Lang> {
        // `zh_CN.UTF-8@euro` → `zh_CN` → `zh`.
        let s = s.trim();
        let base = s.split(['.', '@']).next().unwrap_or("");
        let primary = base
            .split(['-', '_'])
            .next()
            .unwrap_or("")
            .to_ascii_lowercase();
        match primary.as_str() {
            "en" | "c" | "posix" => Some(Lang::En),
            "zh" => Some(Lang::ZhCn),
            _ => None,
        }
    }

    /// The language of a locale as the environment gives it: the first of `LC_ALL`,
    /// `LC_MESSAGES` and `LANG` that is set and not empty (POSIX's order); English when
    /// none is, or when it names a language iblab does not speak.
    pub fn from_locale(var: impl Fn(&str) -> Option<String>) -> Lang {
        ["LC_ALL", "LC_MESSAGES", "LANG"]
            .iter()
            .filter_map(|v| var(v))
            .find(|v| !v.trim().is_empty())
            .and_then(|v| Lang::parse(&v))
            .unwrap_or_default()
    }

    /// [`Lang::from_locale`] of this process's environment.
    pub fn from_env() -> Lang {
        Lang::from_locale(|v| std::env::var(v).ok())
    }

    /// The language a browser asks for most (`Accept-Language: zh-CN,zh;q=0.9,en;q=0.8`)
    /// among those iblab speaks; `None` when it asks for none of them.
    pub fn from_accept_language(header: &str) -> Option<Lang> {
        let mut best: Option<(f32, Lang)> = None;
        for item in header.split(',') {
            let mut parts = item.split(';');
            let tag = parts.next().unwrap_or("").trim();
            let q = parts
                .filter_map(|p| p.trim().strip_prefix("q="))
                .find_map(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            // `*` (any) is not a choice of language; `C`/`POSIX` are not tags.
            if tag == "*" || q <= 0.0 || tag.eq_ignore_ascii_case("c") {
                continue;
            }
            if let Some(l) = Lang::parse(tag)
                && best.is_none_or(|(b, _)| q > b)
            {
                best = Some((q, l));
            }
        }
        best.map(|(_, l)| l)
    }
}

impl fmt::Display for Lang {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.tag())
    }
}

impl std::str::FromStr for Lang {
    type Err = String;
    fn from_str(s: &str) -> Result<Lang, String> {
        Lang::parse(s).ok_or_else(|| {
            format!("`{s}` is not a language iblab speaks; use zh-CN (简体中文) or en (English)")
        })
    }
}

impl JsonSchema for Lang {
    fn schema_name() -> Cow<'static, str> {
        "Lang".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A language iblab speaks: `zh-CN` (Simplified Chinese) or `en` (English).",
            "type": "string",
            "enum": ["en", "zh-CN"]
        })
    }
}

/// Words a learner reads (or an expression giving them): one string, or one per language.
///
/// A string written without a language is, once its lab is loaded, in the lab's
/// `metadata.language` (English unless it says). Built without a lab
/// ([`Text::from`]), it is the same words in every language.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Text {
    /// Words of no stated language: the same for every language.
    plain: Option<String>,
    by_lang: BTreeMap<Lang, String>,
}

impl Text {
    /// The same words in every language.
    pub fn new(s: impl Into<String>) -> Text {
        Text {
            plain: Some(s.into()),
            by_lang: BTreeMap::new(),
        }
    }

    /// Words in given languages.
    pub fn of(pairs: impl IntoIterator<Item = (Lang, String)>) -> Text {
        Text {
            plain: None,
            by_lang: pairs.into_iter().collect(),
        }
    }

    /// The words in `lang`, else in another language the text has (English first).
    pub fn get(&self, lang: Lang) -> &str {
        self.resolve(lang).0
    }

    /// [`Text::get`], and the language the words are in when that is not `lang` (a
    /// fallback the reader should be told of); `None` when they are in `lang` or of no
    /// stated language.
    pub fn resolve(&self, lang: Lang) -> (&str, Option<Lang>) {
        if let Some(s) = self.by_lang.get(&lang) {
            return (s, None);
        }
        if let Some(s) = &self.plain {
            return (s, None);
        }
        let other = [Lang::En]
            .into_iter()
            .chain(Lang::ALL)
            .find_map(|l| self.by_lang.get(&l).map(|s| (s.as_str(), Some(l))));
        other.unwrap_or(("", None))
    }

    /// Does the text have words in `lang` (its own, or words of no stated language)?
    pub fn has(&self, lang: Lang) -> bool {
        self.plain.is_some() || self.by_lang.contains_key(&lang)
    }

    /// The languages the text is written in (none for words of no stated language).
    pub fn languages(&self) -> Vec<Lang> {
        self.by_lang.keys().copied().collect()
    }

    /// Every version the text has: `(None, words)` for words of no stated language.
    pub fn versions(&self) -> Vec<(Option<Lang>, &str)> {
        self.plain
            .iter()
            .map(|s| (None, s.as_str()))
            .chain(self.by_lang.iter().map(|(l, s)| (Some(*l), s.as_str())))
            .collect()
    }

    /// Words of no stated language become words in `lang` (what a loaded lab does with
    /// every learner text, in its `metadata.language`); Chinese words lose the spaces a
    /// folded YAML line put between two Chinese characters (see [`tidy_chinese`]).
    pub fn settle(&mut self, lang: Lang) {
        if let Some(s) = self.plain.take() {
            self.by_lang.entry(lang).or_insert(s);
        }
        if let Some(zh) = self.by_lang.get_mut(&Lang::ZhCn) {
            *zh = tidy_chinese(zh);
        }
    }
}

/// A character Chinese prose sets without spaces around it: a Han character or a
/// full-width punctuation mark (，。：；（）「」、！？…).
fn closed(c: char) -> bool {
    matches!(c,
        '\u{4e00}'..='\u{9fff}' | '\u{3000}'..='\u{303f}' | '\u{ff00}'..='\u{ffef}')
}

/// Chinese words as a folded YAML string gives them, without the space it put where a line
/// broke between two Chinese characters (`全部重发，⏎又把` → `全部重发，又把`); a space
/// between a Chinese character and a Latin word (`由 SM 分配`) stays, as the course writes.
pub fn tidy_chinese(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len());
    for (i, &c) in chars.iter().enumerate() {
        if c == ' ' && i > 0 && i + 1 < chars.len() && closed(chars[i - 1]) && closed(chars[i + 1])
        {
            continue;
        }
        out.push(c);
    }
    out
}

impl From<&str> for Text {
    fn from(s: &str) -> Text {
        Text::new(s)
    }
}

impl From<String> for Text {
    fn from(s: String) -> Text {
        Text::new(s)
    }
}

impl Serialize for Text {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match (&self.plain, self.by_lang.is_empty()) {
            (Some(p), true) => s.serialize_str(p),
            _ => {
                let mut all = self.by_lang.clone();
                if let Some(p) = &self.plain {
                    all.entry(Lang::En).or_insert_with(|| p.clone());
                }
                all.serialize(s)
            }
        }
    }
}

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Text, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string, or one per language: `{en: …, zh-CN: …}`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text, E> {
                Ok(Text::new(v))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Text, E> {
                Ok(Text::new(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Text, A::Error> {
                let mut by_lang = BTreeMap::new();
                while let Some(key) = m.next_key::<String>()? {
                    let lang = match key.as_str() {
                        "en" => Lang::En,
                        "zh-CN" => Lang::ZhCn,
                        other => {
                            return Err(de::Error::custom(format!(
                                "unknown language `{other}`: a text is written in `zh-CN` (Simplified Chinese) and `en` (English)"
                            )));
                        }
                    };
                    let words: String = m.next_value()?;
                    if by_lang.insert(lang, words).is_some() {
                        return Err(de::Error::custom(format!(
                            "duplicate language `{key}` in a text"
                        )));
                    }
                }
                if by_lang.is_empty() {
                    return Err(de::Error::custom(
                        "a text with no language: write `{zh-CN: …, en: …}` or a string",
                    ));
                }
                Ok(Text {
                    plain: None,
                    by_lang,
                })
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for Text {
    fn schema_name() -> Cow<'static, str> {
        "Text".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "Words a learner reads: a string (in the lab's metadata.language, English unless it says), or one per language: {zh-CN: …, en: …}.",
            "anyOf": [
                {"type": "string"},
                {
                    "type": "object",
                    "properties": {"zh-CN": {"type": "string"}, "en": {"type": "string"}},
                    "additionalProperties": false,
                    "minProperties": 1
                }
            ]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locales_and_tags_name_a_language() {
        for (s, l) in [
            ("en", Some(Lang::En)),
            ("en_US.UTF-8", Some(Lang::En)),
            ("C.UTF-8", Some(Lang::En)),
            ("POSIX", Some(Lang::En)),
            ("zh", Some(Lang::ZhCn)),
            ("zh-CN", Some(Lang::ZhCn)),
            ("zh_CN.UTF-8", Some(Lang::ZhCn)),
            ("zh_CN.GB18030@x", Some(Lang::ZhCn)),
            ("zh-Hans-CN", Some(Lang::ZhCn)),
            ("fr_FR.UTF-8", None),
            ("", None),
        ] {
            assert_eq!(Lang::parse(s), l, "{s}");
        }
        assert!("fr".parse::<Lang>().unwrap_err().contains("zh-CN"));
    }

    #[test]
    fn the_locale_is_lc_all_then_lc_messages_then_lang() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |v: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == v)
                    .map(|(_, x)| x.to_string())
            }
        };
        assert_eq!(Lang::from_locale(env(&[])), Lang::En);
        assert_eq!(
            Lang::from_locale(env(&[("LANG", "zh_CN.UTF-8")])),
            Lang::ZhCn
        );
        assert_eq!(
            Lang::from_locale(env(&[("LANG", "zh_CN.UTF-8"), ("LC_MESSAGES", "C")])),
            Lang::En
        );
        assert_eq!(
            Lang::from_locale(env(&[
                ("LANG", "en_US.UTF-8"),
                ("LC_MESSAGES", "en_GB"),
                ("LC_ALL", "zh_CN.UTF-8")
            ])),
            Lang::ZhCn
        );
        // An empty LC_ALL is not set.
        assert_eq!(
            Lang::from_locale(env(&[("LC_ALL", ""), ("LANG", "zh_CN.UTF-8")])),
            Lang::ZhCn
        );
        assert_eq!(Lang::from_locale(env(&[("LANG", "de_DE.UTF-8")])), Lang::En);
    }

    #[test]
    fn a_browser_gets_the_language_it_prefers_most() {
        assert_eq!(
            Lang::from_accept_language("zh-CN,zh;q=0.9,en;q=0.8"),
            Some(Lang::ZhCn)
        );
        assert_eq!(
            Lang::from_accept_language("fr;q=1, en;q=0.5, zh;q=0.7"),
            Some(Lang::ZhCn)
        );
        assert_eq!(Lang::from_accept_language("en-GB,en;q=0.9"), Some(Lang::En));
        assert_eq!(Lang::from_accept_language("de, *;q=0.1"), None);
        assert_eq!(Lang::from_accept_language("zh;q=0, en"), Some(Lang::En));
    }

    #[test]
    fn a_text_falls_back_and_says_so() {
        let both = Text::of([(Lang::En, "hello".into()), (Lang::ZhCn, "你好".into())]);
        assert_eq!(both.get(Lang::ZhCn), "你好");
        assert_eq!(both.resolve(Lang::En), ("hello", None));
        let zh = Text::of([(Lang::ZhCn, "你好".into())]);
        assert_eq!(zh.resolve(Lang::En), ("你好", Some(Lang::ZhCn)));
        let plain = Text::new("steps.a.tcp.ok");
        assert_eq!(plain.resolve(Lang::ZhCn), ("steps.a.tcp.ok", None));
        let mut settled = plain.clone();
        settled.settle(Lang::En);
        assert_eq!(
            settled.resolve(Lang::ZhCn),
            ("steps.a.tcp.ok", Some(Lang::En))
        );
        assert!(!settled.has(Lang::ZhCn));
    }

    #[test]
    fn a_folded_line_leaves_no_space_between_chinese_characters() {
        assert_eq!(
            tidy_chinese("全部重发， 又把队列撑爆"),
            "全部重发，又把队列撑爆"
        );
        assert_eq!(
            tidy_chinese("由 SM 分配的 LID 为 0"),
            "由 SM 分配的 LID 为 0"
        );
        assert_eq!(tidy_chinese("一个 数据包"), "一个数据包");
        let mut t = Text::of([(Lang::ZhCn, "甲， 乙".into()), (Lang::En, "a, b".into())]);
        t.settle(Lang::En);
        assert_eq!(t.get(Lang::ZhCn), "甲，乙");
        assert_eq!(t.get(Lang::En), "a, b");
    }

    #[test]
    fn a_text_reads_from_a_string_or_one_per_language() {
        let t: Text = serde_json::from_str(r#""plain""#).unwrap();
        assert_eq!(t, Text::new("plain"));
        let t: Text = serde_json::from_str(r#"{"zh-CN": "中文", "en": "English"}"#).unwrap();
        assert_eq!(t.languages(), vec![Lang::En, Lang::ZhCn]);
        assert_eq!(
            serde_json::to_string(&t).unwrap(),
            r#"{"en":"English","zh-CN":"中文"}"#
        );
        let e = serde_json::from_str::<Text>(r#"{"fr": "x"}"#).unwrap_err();
        assert!(e.to_string().contains("unknown language `fr`"), "{e}");
        assert!(serde_json::from_str::<Text>("{}").is_err());
    }
}
