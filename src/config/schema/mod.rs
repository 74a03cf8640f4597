//! The JSON Schema of `proxy.yaml`, derived from the raw config structs ([`super::raw`]) rather
//! than written beside them, so the two cannot drift: editors (yaml-language-server) complete and
//! check the file with it, and the suite validates every shipped configuration against it.
//! `waitroom --print-schema` prints it; `docs/proxy.schema.json` is that output, checked in.
//!
//! The raw structs keep durations, sizes and times as text (so that `--check` can name a bad one
//! by its key path). The types here say which text each such field holds; their patterns accept
//! at least what the proxy's own parsers accept, so a file the proxy takes is never refused by
//! the schema for its spelling of a value. Ranges and cross-key rules (`min_batch` at most
//! `batch_size`, ...) stay with `--check`: the schema is about the file's shape.
//!
//! Draft-07, the draft editors' YAML plugins understand most widely.

use super::raw;

pub mod kinds;

/// The schema, as `waitroom --print-schema` prints it: pretty JSON with a final newline, stable
/// from run to run (the order of the raw structs), so the checked-in copy diffs cleanly.
pub fn text() -> String {
    let mut schema = schemars::generate::SchemaSettings::draft07()
        .into_generator()
        .into_root_schema_for::<raw::Config>();
    schema.insert("title".into(), "waitroom proxy.yaml".into());
    let mut text = serde_json::to_string_pretty(&schema).expect("a schema is JSON");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::kinds::*;
    use super::*;
    use serde_json::Value;

    fn schema() -> Value {
        serde_json::from_str(&text()).unwrap()
    }

    /// Every object of the schema that has properties refuses others: an unknown key anywhere
    /// is an error, as in the proxy (contract section 2).
    #[test]
    fn every_object_refuses_unknown_keys() {
        fn walk(v: &Value, at: &str, objects: &mut usize) {
            match v {
                Value::Object(map) => {
                    if map.contains_key("properties") {
                        *objects += 1;
                        assert_eq!(map.get("additionalProperties"), Some(&Value::Bool(false)), "{at}");
                    }
                    for (k, child) in map {
                        walk(child, &format!("{at}/{k}"), objects);
                    }
                }
                Value::Array(items) => items.iter().for_each(|c| walk(c, at, objects)),
                _ => {}
            }
        }
        let mut objects = 0;
        walk(&schema(), "", &mut objects);
        // Config and its 20 sections and items (Redis, Sentinel, Identity, Jwt, ...).
        assert!(objects >= 20, "{objects}");
    }

    /// Whether the proxy takes `value` at `section.key` (nothing else set but the upstream).
    fn proxy_takes(section: &str, key: &str, value: &str) -> bool {
        let mut inner = serde_yaml::Mapping::new();
        inner.insert(key.into(), value.into());
        let mut doc = serde_yaml::Mapping::new();
        doc.insert("upstream".into(), "a:1".into());
        doc.insert(section.into(), inner.into());
        crate::config::Config::parse(&serde_yaml::to_string(&doc).unwrap()).is_ok()
    }

    fn matches(pattern: &str, value: &str) -> bool {
        regex::Regex::new(pattern).unwrap().is_match(value)
    }

    proptest::proptest! {
        /// Every spelling the proxy takes, the schema takes too (the other way round is left to
        /// `--check`, which also knows the ranges).
        #[test]
        fn the_patterns_take_every_spelling_the_proxy_takes(
            duration in "[0-9 .]{0,4}(ms|s|m|h|us|µs|ns|d|w|M|y|min|mins|sec|secs|hours|x|)[0-9 .]{0,3}(ms|s|m|h|)",
            size in " ?[0-9]{0,4} ?(B|KiB|MiB|kB|k|b|)[ ]?",
            percent in " ?[+-]?[0-9.]{0,4}([eE][+-]?[0-9]{1,2})? ?%? ?",
            time in "20[0-9]{2}-[01][0-9]-[0-3][0-9][Tt ][0-2][0-9]:[0-5][0-9]:[0-6][0-9](\\.[0-9]{1,9})?([Zz]|[+-][01][0-9]:[0-5][0-9]|)",
        ) {
            if proxy_takes("shutdown", "grace", &duration) {
                proptest::prop_assert!(matches(DURATION_PATTERN, &duration), "duration {duration:?}");
            }
            if proxy_takes("limits", "max_request_head", &size) {
                proptest::prop_assert!(matches(SIZE_PATTERN, &size), "size {size:?}");
            }
            if proxy_takes("polling", "grace", &percent) {
                proptest::prop_assert!(matches(PERCENT_PATTERN, &percent), "percent {percent:?}");
            }
            if proxy_takes("event", "opens_at", &time) {
                proptest::prop_assert!(matches(TIME_PATTERN, &time), "time {time:?}");
            }
        }
    }

    #[test]
    fn the_patterns_take_the_contract_s_examples_and_refuse_unitless_numbers() {
        for d in ["100ms", "2s", "5m", "1h", "0s", "1h 30m", "1h30m", "1.5s", " 2 s ", "3µs", "2 weeks", "0", " 0 "] {
            assert!(proxy_takes("shutdown", "grace", d) && matches(DURATION_PATTERN, d), "{d:?}");
        }
        for d in ["300", "5x", "", "s", "1.s", "00", "0 0"] {
            assert!(!proxy_takes("shutdown", "grace", d), "{d:?}");
            assert!(!matches(DURATION_PATTERN, d), "{d:?}");
        }
        assert!(matches(SIZE_PATTERN, "32KiB") && !matches(SIZE_PATTERN, "32KB"));
        assert!(matches(PERCENT_PATTERN, "20%") && !matches(PERCENT_PATTERN, "20"));
        assert!(matches(TIME_PATTERN, "2026-12-24T10:00:00Z") && !matches(TIME_PATTERN, "2026-12-24"));
    }

    #[test]
    fn keys_carry_their_doc_comment_and_default() {
        let s = schema();
        let interval = &s["definitions"]["Admission"]["properties"]["interval"];
        assert_eq!(interval["description"], "One admission tick per interval (1ms to 24h).");
        assert_eq!(interval["default"], "100ms");
        assert_eq!(interval["pattern"], DURATION_PATTERN);
        assert_eq!(s["required"], serde_json::json!(["upstream"]));
        assert_eq!(s["properties"]["upstream"]["type"], "string");
    }
}
