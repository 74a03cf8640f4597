//! The page's texts: the languages it speaks, the operator's overrides (`page.texts`), and the
//! choice of a language from `Accept-Language`. Below the configuration, which checks
//! `page.texts` against these texts.

use serde_json::{Map, Value};
use std::sync::OnceLock;

const EN_JSON: &str = include_str!("../../assets/i18n/en.json");
const KO_JSON: &str = include_str!("../../assets/i18n/ko.json");

/// A language the page has texts for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    En,
    Ko,
}

impl Lang {
    /// In order of preference when the visitor states none, or accepts any (`*`).
    pub const ALL: [Lang; 2] = [Lang::En, Lang::Ko];

    /// The value of `<html lang>`.
    pub fn code(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::Ko => "ko",
        }
    }

    /// The supported language a language tag (`ko`, `ko-KR`, `en-GB`, any case) asks for.
    fn from_tag(tag: &str) -> Option<Lang> {
        let primary = tag.split('-').next().unwrap_or("");
        Lang::ALL
            .into_iter()
            .find(|l| l.code().eq_ignore_ascii_case(primary))
    }

    /// The language a configuration names (`page.texts`): its code, any case.
    pub fn from_code(code: &str) -> Option<Lang> {
        Lang::ALL.into_iter().find(|l| l.code().eq_ignore_ascii_case(code))
    }

    /// Whether the page has a text under `key`.
    pub fn has_text(self, key: &str) -> bool {
        self.texts().contains_key(key)
    }

    pub(crate) fn texts(self) -> &'static Map<String, Value> {
        static TEXTS: OnceLock<[Map<String, Value>; 2]> = OnceLock::new();
        let all = TEXTS.get_or_init(|| [parse_texts(EN_JSON), parse_texts(KO_JSON)]);
        &all[self as usize]
    }
}

/// `page.texts`: an operator's texts, per language, in place of the page's own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TextOverrides(Vec<(Lang, String, String)>);

impl TextOverrides {
    pub fn insert(&mut self, lang: Lang, key: String, text: String) {
        self.0.push((lang, key, text));
    }

    /// `lang`'s texts with the overrides for it applied.
    pub(crate) fn texts(&self, lang: Lang) -> std::borrow::Cow<'static, Map<String, Value>> {
        let mut mine = self.0.iter().filter(|(l, _, _)| *l == lang).peekable();
        if mine.peek().is_none() {
            return std::borrow::Cow::Borrowed(lang.texts());
        }
        let mut texts = lang.texts().clone();
        for (_, key, text) in mine {
            texts.insert(key.clone(), Value::String(text.clone()));
        }
        std::borrow::Cow::Owned(texts)
    }
}

fn parse_texts(json: &str) -> Map<String, Value> {
    // Compiled in and checked by the unit tests below: a broken file cannot reach a release.
    serde_json::from_str(json).expect("assets/i18n/*.json is a JSON object of strings")
}

/// The best supported language for an `Accept-Language` header (RFC 9110 section 12.5.4): the
/// highest q-value wins, the earlier entry on a tie; `q=0` excludes; `*` stands for the preferred
/// language not named elsewhere in the header. English when nothing supported is acceptable or
/// the header is missing or unreadable.
pub fn choose_language(accept_language: Option<&[u8]>) -> Lang {
    let Some(header) = accept_language.and_then(|h| std::str::from_utf8(h).ok()) else {
        return Lang::En;
    };
    let ranges: Vec<(&str, u16)> = header.split(',').filter_map(language_range).collect();
    let named = |lang: Lang| {
        ranges
            .iter()
            .any(|(tag, _)| Lang::from_tag(tag) == Some(lang))
    };
    let mut best: Option<(Lang, u16)> = None;
    for &(tag, q) in &ranges {
        let lang = if tag == "*" {
            Lang::ALL.into_iter().find(|&l| !named(l))
        } else {
            Lang::from_tag(tag)
        };
        if let Some(lang) = lang {
            if q > 0 && best.is_none_or(|(_, best_q)| q > best_q) {
                best = Some((lang, q));
            }
        }
    }
    best.map_or(Lang::En, |(lang, _)| lang)
}

/// One `tag;q=0.8` entry as (tag, q in thousandths); None for an empty or malformed entry.
fn language_range(item: &str) -> Option<(&str, u16)> {
    let mut parts = item.split(';');
    let tag = parts.next()?.trim();
    let well_formed = tag == "*"
        || (!tag.is_empty() && tag.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    if !well_formed {
        return None;
    }
    let mut q = 1000;
    for param in parts {
        let (name, value) = param.split_once('=')?;
        if name.trim().eq_ignore_ascii_case("q") {
            q = parse_qvalue(value.trim())?;
        }
    }
    Some((tag, q))
}

/// `0`, `0.5`, `1.000`, ...: at most three decimals, at most 1 (RFC 9110 section 12.4.2).
fn parse_qvalue(text: &str) -> Option<u16> {
    let (int, frac) = text.split_once('.').unwrap_or((text, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let thousandths = match int {
        "0" => format!("{frac:0<3}").parse().ok()?,
        "1" if frac.bytes().all(|b| b == b'0') => 1000,
        _ => return None,
    };
    Some(thousandths)
}

