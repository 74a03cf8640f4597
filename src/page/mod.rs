//! The waiting page served at `GET {prefix}/` (section 10 of the contract): one self-contained
//! HTML document compiled into the binary, filled in per request with the room's settings and the
//! texts of the visitor's language.
//!
//! Why the pieces are separate files under `assets/`:
//! - `waiting.html` is the markup and inline CSS, with `{{...}}` placeholders (see `render`).
//! - `poll.mjs` holds the page's decisions (state of an answer, delay and target of the next call,
//!   wording of the wait) as pure functions, so `node --test` checks them without a browser
//!   (`tests/page/poll.test.mjs`). `page.js` is the DOM and timer glue. Both are inlined into one
//!   `<script type="module">`, poll.mjs first, so the page needs no second request.
//! - `i18n/{en,ko}.json` are the texts, one flat map per language with the same keys. The page's
//!   script gets the whole map (for the texts it writes later); the markup gets each text through a
//!   `{{t:key}}` placeholder, so the page reads right before any script has run.
//!
//! The language is chosen here, on the server, from `Accept-Language`, which is why the proxy
//! answers with `Vary: Accept-Language`.
//!
//! The texts and the shop's template live in modules of their own ([`texts`], [`template`]) below
//! the configuration, which checks `page.texts` and `page.template_file` against them; this module
//! renders the page from the configuration.

pub mod template;
pub mod texts;

use serde_json::{Map, Value};

pub use template::{Template, MAX_TEMPLATE};
pub use texts::{choose_language, Lang, TextOverrides};

const TEMPLATE: &str = include_str!("../../assets/waiting.html");
const POLL_JS: &str = include_str!("../../assets/poll.mjs");
const PAGE_JS: &str = include_str!("../../assets/page.js");
/// What the page shows of the room's configuration.
#[derive(Debug, Clone, Copy)]
pub struct PageSettings<'a> {
    /// `endpoints.prefix`: where the page's script sends its calls.
    pub prefix: &'a str,
    /// `page.ready_url`.
    pub ready_url: &'a str,
    /// `page.texts`.
    pub texts: &'a TextOverrides,
    /// `page.sign_in_url`; empty: no sign-in link.
    pub sign_in_url: &'a str,
    /// Whether a scheduled event is configured: the page then shows the seed's hash.
    pub event: bool,
    /// `page.template_file`, read at load; `None`: the built-in page.
    pub template: Option<&'a Template>,
}

impl<'a> PageSettings<'a> {
    pub fn of(config: &'a crate::config::Config) -> PageSettings<'a> {
        PageSettings {
            prefix: &config.endpoints.prefix,
            ready_url: &config.page.ready_url,
            texts: &config.page.texts,
            sign_in_url: &config.page.sign_in_url,
            event: config.event.is_some(),
            template: config.page.template.as_ref(),
        }
    }
}

/// Renders the page with these settings, in the language `Accept-Language` asks for.
pub fn render(settings: PageSettings<'_>, accept_language: Option<&[u8]>) -> Vec<u8> {
    render_lang(settings, choose_language(accept_language)).into_bytes()
}

/// Fills the template's placeholders in one pass (text put in is never scanned again):
/// `{{lang}}`, `{{t:key}}` (a text, HTML-escaped), `{{settings}}` (JSON for the script) and
/// `{{script}}` (poll.mjs then page.js).
fn render_lang(settings: PageSettings<'_>, lang: Lang) -> String {
    let texts = settings.texts.texts(lang);
    if let Some(template) = settings.template {
        return render_template(template, settings, lang, &texts);
    }
    let mut out = String::with_capacity(TEMPLATE.len() + POLL_JS.len() + PAGE_JS.len() + 4096);
    let mut rest = TEMPLATE;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            rest = &rest[start..];
            break;
        };
        match &after[..end] {
            "lang" => out.push_str(lang.code()),
            "settings" => out.push_str(&settings_json(settings, lang, &texts)),
            "script" => {
                out.push_str(POLL_JS);
                out.push('\n');
                out.push_str(PAGE_JS);
            }
            key => match key.strip_prefix("t:").and_then(|k| texts.get(k)) {
                Some(Value::String(text)) => push_html_escaped(&mut out, text),
                // The tests render every language and check that nothing is left unresolved.
                _ => debug_assert!(false, "waiting.html: unknown placeholder {{{{{key}}}}}"),
            },
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

/// The shop's page with the proxy's script inserted before its `</body>`. The shop's text is sent
/// as written: it is the shop's own HTML, and `{{` in it may mean something to the shop.
fn render_template(template: &Template, settings: PageSettings<'_>, lang: Lang, texts: &Map<String, Value>) -> String {
    let settings = settings_json(settings, lang, texts);
    let mut out = String::with_capacity(
        template.before_body_end.len() + template.from_body_end.len() + settings.len() + POLL_JS.len() + PAGE_JS.len() + 128,
    );
    out.push_str(&template.before_body_end);
    out.push_str(r#"<script type="application/json" id="waitroom-settings">"#);
    out.push_str(&settings);
    out.push_str("</script>\n<script type=\"module\">\n");
    out.push_str(POLL_JS);
    out.push('\n');
    out.push_str(PAGE_JS);
    out.push_str("\n</script>\n");
    out.push_str(&template.from_body_end);
    out
}

/// What the page's script needs, as JSON that is safe inside `<script type="application/json">`:
/// every `<` is escaped, so no text can close the element.
fn settings_json(settings: PageSettings<'_>, lang: Lang, texts: &Map<String, Value>) -> String {
    let settings = serde_json::json!({
        "prefix": settings.prefix,
        "readyUrl": settings.ready_url,
        "signInUrl": settings.sign_in_url,
        "event": settings.event,
        "lang": lang.code(),
        "texts": texts,
    });
    script_safe_json(&settings)
}

/// JSON text with every `<` written as `\u003c`: the same value for `JSON.parse`, but no `</script>`
/// or `<!--` can appear in it.
fn script_safe_json(value: &Value) -> String {
    value.to_string().replace('<', "\\u003c")
}

fn push_html_escaped(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn page_settings(config: &Config) -> PageSettings<'_> {
        PageSettings::of(config)
    }

    fn choose(header: &str) -> Lang {
        choose_language(Some(header.as_bytes()))
    }

    #[test]
    fn english_without_a_usable_header() {
        assert_eq!(choose_language(None), Lang::En);
        assert_eq!(choose(""), Lang::En);
        assert_eq!(choose("fr-FR, de;q=0.9"), Lang::En);
        assert_eq!(choose_language(Some(b"ko\xff")), Lang::En, "not UTF-8");
        assert_eq!(choose(";;,,"), Lang::En);
    }

    #[test]
    fn korean_by_tag_in_any_case_and_region() {
        assert_eq!(choose("ko"), Lang::Ko);
        assert_eq!(choose("ko-KR"), Lang::Ko);
        assert_eq!(choose("KO-kr"), Lang::Ko);
        assert_eq!(choose("ko-KR,ko;q=0.9,en-US;q=0.8,en;q=0.7"), Lang::Ko);
        assert_eq!(choose("fr, ko;q=0.5"), Lang::Ko, "the first supported one");
        assert_eq!(choose("kok"), Lang::En, "Konkani is not Korean");
    }

    #[test]
    fn q_values_decide_not_order() {
        assert_eq!(choose("en;q=0.5, ko;q=0.8"), Lang::Ko);
        assert_eq!(choose("ko;q=0.5, en"), Lang::En);
        assert_eq!(choose("ko; Q=0.9 , en ;q=0.8"), Lang::Ko, "spaces and case");
        assert_eq!(
            choose("en;q=0.7, ko;q=0.700"),
            Lang::En,
            "a tie goes to the earlier entry"
        );
        assert_eq!(choose("ko;q=1.000, en;q=0.999"), Lang::Ko);
    }

    #[test]
    fn q_zero_excludes() {
        assert_eq!(choose("ko;q=0"), Lang::En);
        assert_eq!(choose("en;q=0, ko;q=0.1"), Lang::Ko);
        assert_eq!(choose("en;q=0.0, ko;q=0.001"), Lang::Ko);
    }

    #[test]
    fn malformed_entries_are_skipped() {
        assert_eq!(choose("ko;q=2, en;q=0.1"), Lang::En, "q above 1");
        assert_eq!(choose("ko;q=0.5555, en;q=0.1"), Lang::En, "four decimals");
        assert_eq!(choose("ko;q=abc"), Lang::En);
        assert_eq!(choose("ko;q"), Lang::En);
        assert_eq!(choose("k o, ko-KR;q=0.4"), Lang::Ko);
        assert_eq!(
            choose("ko;level=1"),
            Lang::Ko,
            "other parameters are ignored"
        );
    }

    #[test]
    fn wildcard_is_the_preferred_language_not_named() {
        assert_eq!(choose("*"), Lang::En);
        assert_eq!(choose("fr, *;q=0.5"), Lang::En);
        assert_eq!(choose("en;q=0, *"), Lang::Ko);
        assert_eq!(
            choose("en;q=0.1, *;q=0.5"),
            Lang::Ko,
            "* is not en when en is named"
        );
        assert_eq!(choose("ko;q=0, *"), Lang::En);
        assert_eq!(
            choose("en;q=0, ko;q=0, *"),
            Lang::En,
            "nothing acceptable: the default"
        );
    }

    #[test]
    fn every_language_has_the_same_texts() {
        let keys = |l: Lang| l.texts().keys().cloned().collect::<Vec<_>>();
        for lang in Lang::ALL {
            assert_eq!(
                keys(lang),
                keys(Lang::En),
                "{lang:?} has other keys than en"
            );
            for (key, value) in lang.texts() {
                let text = value
                    .as_str()
                    .unwrap_or_else(|| panic!("{lang:?}.{key} is not a string"));
                assert!(!text.trim().is_empty(), "{lang:?}.{key} is empty");
            }
        }
    }

    fn config() -> Config {
        let yaml = "upstream: \"127.0.0.1:8081\"\nendpoints: {prefix: /line}\npage: {ready_url: /shop/checkout}\n";
        Config::parse(yaml).expect("test config is valid")
    }

    #[test]
    fn renders_every_placeholder_in_every_language() {
        for lang in Lang::ALL {
            let page = render_lang(page_settings(&config()), lang);
            assert!(!page.contains("{{"), "{lang:?}: placeholder left:\n{page}");
            assert!(page.contains(&format!("<html lang=\"{}\">", lang.code())));
            let title = lang.texts()["title"].as_str().unwrap();
            assert!(
                page.contains(&format!("<title>{title}</title>")),
                "{lang:?}"
            );
        }
    }

    #[test]
    fn settings_reach_the_script_and_cannot_close_it() {
        let page = render_lang(page_settings(&config()), Lang::Ko);
        let start = page
            .find("<script type=\"application/json\" id=\"waitroom-settings\">")
            .unwrap();
        let json_start = page[start..].find('>').unwrap() + start + 1;
        let json_end = page[json_start..].find("</script>").unwrap() + json_start;
        let settings: Value = serde_json::from_str(&page[json_start..json_end]).unwrap();
        assert_eq!(settings["prefix"], "/line");
        assert_eq!(settings["readyUrl"], "/shop/checkout");
        assert_eq!(settings["lang"], "ko");
        assert_eq!(settings["texts"]["continue"], Lang::Ko.texts()["continue"]);

        let hostile = Value::from("</script><!-- <script>alert(1)</script>");
        let json = script_safe_json(&hostile);
        assert!(!json.contains('<'), "{json}");
        assert_eq!(serde_json::from_str::<Value>(&json).unwrap(), hostile);
    }

    #[test]
    fn the_scripts_cannot_end_their_element_early() {
        for js in [POLL_JS, PAGE_JS] {
            assert!(!js.to_ascii_lowercase().contains("</script"));
            assert!(!js.contains("<!--"));
        }
    }

    #[test]
    fn page_texts_override_the_page_own_in_their_language_only() {
        let yaml = "upstream: 127.0.0.1:1\npage: {texts: {ko: {heading_PREQUEUED: \"<b>곧 시작</b>\"}, EN: {title: Drop}}}\n";
        let config = Config::parse(yaml).unwrap();
        let ko = render_lang(page_settings(&config), Lang::Ko);
        assert!(ko.contains(r"\u003cb>곧 시작\u003c/b>"), "in the script's texts, script-safe");
        assert!(ko.contains(Lang::Ko.texts()["title"].as_str().unwrap()), "the rest stays");
        let en = render_lang(page_settings(&config), Lang::En);
        assert!(en.contains("<title>Drop</title>"));
        let problems = Config::parse("upstream: 127.0.0.1:1\npage: {texts: {fr: {title: x}, ko: {nope: y}}}\n")
            .unwrap_err()
            .problems
            .iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>();
        assert_eq!(
            problems,
            [
                "page.texts.fr: not a language of the page (en, ko)",
                "page.texts.ko.nope: not a text of the page (see assets/i18n/en.json)"
            ]
        );
    }

    #[test]
    fn the_sign_in_texts_can_be_overridden_like_the_others() {
        for lang in Lang::ALL {
            assert!(lang.has_text("heading_SIGN_IN") && lang.has_text("message_SIGN_IN"), "{lang:?}");
        }
        let yaml = "upstream: 127.0.0.1:1\npage: {texts: {en: {heading_SIGN_IN: Log in at the shop first}}}\n";
        let page = render_lang(page_settings(&Config::parse(yaml).unwrap()), Lang::En);
        assert!(page.contains(r#""heading_SIGN_IN":"Log in at the shop first""#));
    }

    #[test]
    fn html_escaping() {
        let mut out = String::new();
        push_html_escaped(&mut out, r#"<a href="x">Tom & 'Jerry'</a>"#);
        assert_eq!(
            out,
            "&lt;a href=&quot;x&quot;&gt;Tom &amp; &#39;Jerry&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn a_template_needs_the_state_hook_and_a_body_end() {
        let ok = |t: &str| Template::parse(t.to_owned());
        assert!(ok(r#"<body><p data-waitroom="state"></p></body>"#).is_ok());
        assert!(ok(r#"<BODY><p data-waitroom='state'></p></BODY></html>"#).is_ok());
        assert!(ok(r#"<body><p data-waitroom="position"></p></body>"#).unwrap_err().contains("state"));
        assert!(ok(r#"<body><p data-waitroom="state"></p>"#).unwrap_err().contains("</body>"));
    }

    #[test]
    fn a_template_gets_the_script_before_its_last_body_end() {
        let template = Template::parse(
            r#"<html><body><!-- </body> in a comment --><p data-waitroom="state"></p>{{shop}}</body></html>"#.to_owned(),
        )
        .unwrap();
        let mut config = config();
        config.page.template = Some(template);
        config.page.sign_in_url = "/login".to_owned();
        let page = String::from_utf8(render(page_settings(&config), None)).unwrap();
        let script = page.find(r#"<script type="module">"#).unwrap();
        assert!(page.find("{{shop}}").unwrap() < script, "the shop's text is left as written");
        assert!(page.ends_with("</script>\n</body></html>"), "{}", &page[page.len() - 60..]);
        assert!(page.contains(r#""signInUrl":"/login""#));
        assert!(!page.contains("waitroom-heading"), "none of the built-in markup");
    }
}
