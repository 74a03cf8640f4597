//! Reading a file's structure so that every unknown key and every value of the wrong type is
//! reported, not only the first one serde meets.
//!
//! serde stops at its first error. So the document is parsed once into a `serde_yaml::Value`,
//! then deserialized into [`raw::Config`]; each failure is recorded with its key path (tracked by
//! `serde_path_to_error`), the node it names is cut out of the document, and the rest is
//! deserialized again, until it goes through. What is left then still gets its semantic checks,
//! so one run shows an operator the misspelt key, the stray one and the zero batch together.
//!
//! The raw structs stay the only statement of which keys exist and what they hold: nothing here
//! lists a key. Each pass after the first reads the pruned document written back as YAML rather
//! than the `Value` itself, because serde_yaml reads an unquoted scalar as text where the struct
//! wants text (`key_prefix: 2026`, `ttl: 300`), and a `Value` would not.

use serde_path_to_error::Segment;
use serde_yaml::Value;

use super::{raw, Problem};

/// Past this many structural problems the file is not a waitroom configuration at all (another
/// program's, a paste gone wrong): the first ones say enough, and each costs another pass.
const MAX_PROBLEMS: usize = 50;

/// What the structural reading found.
pub(super) struct Read {
    /// The raw configuration of what was left after cutting out every bad node; `None` when the
    /// text is not YAML or a problem left nothing to cut.
    pub raw: Option<raw::Config>,
    /// Named as in the operator's file.
    pub problems: Vec<Problem>,
    /// The key paths cut out (as in the file), so that a check of the default that took a cut
    /// node's place does not report a second problem for one mistake.
    cut: Vec<String>,
    /// Each list that lost elements, by key path, with the indices they had in the file
    /// (ascending): the elements after them moved up, and problems must name them as written.
    removed: Vec<(String, Vec<usize>)>,
}

impl Read {
    /// Whether a problem at `path` (as in the file) is about what replaced a cut node: it lies
    /// at or below one, or names the list that lost an element.
    pub fn covers(&self, path: &str) -> bool {
        self.cut.iter().any(|cut| {
            let list = match cut.rfind('[') {
                Some(i) if cut.ends_with(']') => &cut[..i],
                _ => cut.as_str(),
            };
            path == list
                || path == cut
                || path.strip_prefix(cut.as_str()).is_some_and(|rest| rest.starts_with(['.', '[']))
        })
    }

    /// A key path of the pruned document (what `Validator` saw) as the operator's file has it.
    pub fn in_file(&self, path: &str) -> String {
        for (list, gone) in &self.removed {
            let Some(rest) = path.strip_prefix(list.as_str()).and_then(|r| r.strip_prefix('[')) else {
                continue;
            };
            if let Some((index, tail)) = rest.split_once(']') {
                if let Ok(index) = index.parse::<usize>() {
                    return format!("{list}[{}]{tail}", file_index(gone, index));
                }
            }
        }
        path.to_owned()
    }

    /// `path` (of the pruned document) with every list index as in the file.
    fn file_path(&self, path: &[Segment]) -> Vec<Segment> {
        let mut out: Vec<Segment> = Vec::with_capacity(path.len());
        for segment in path {
            let segment = match segment {
                Segment::Seq { index } => {
                    let list = render(&out);
                    let gone = self.removed.iter().find(|(l, _)| *l == list).map(|(_, g)| g.as_slice());
                    Segment::Seq { index: file_index(gone.unwrap_or_default(), *index) }
                }
                other => other.clone(),
            };
            out.push(segment);
        }
        out
    }

    /// Records that the element at `file` (a path ending in a list index) left its list.
    fn remember_removed(&mut self, file: &[Segment]) {
        let Some((Segment::Seq { index }, list)) = file.split_last() else { return };
        let list = render(list);
        let at = match self.removed.iter().position(|(l, _)| *l == list) {
            Some(at) => at,
            None => {
                self.removed.push((list, Vec::new()));
                self.removed.len() - 1
            }
        };
        let gone = &mut self.removed[at].1;
        let slot = gone.partition_point(|g| g < index);
        gone.insert(slot, *index);
    }
}

/// The file's index of what is now element `index` of a list whose file elements `gone`
/// (ascending) were cut.
fn file_index(gone: &[usize], mut index: usize) -> usize {
    for g in gone {
        if *g <= index {
            index += 1;
        }
    }
    index
}

pub(super) fn read(text: &str) -> Read {
    let mut read = Read { raw: None, problems: Vec::new(), cut: Vec::new(), removed: Vec::new() };
    let mut doc: Value = match serde_yaml::from_str(text) {
        Ok(doc) => doc,
        Err(e) => {
            // Not YAML: libyaml's message names the line, which is all there is to go by.
            read.problems.push(Problem { path: String::new(), message: format!("not valid YAML: {e}") });
            return read;
        }
    };
    // An empty file (or one of comments only) is a document with every default.
    if doc.is_null() {
        doc = Value::Mapping(Default::default());
    }
    // The first pass reads the operator's own text, exactly as a file without problems is read.
    let mut source = if doc.as_mapping().is_some_and(|m| m.is_empty()) { "{}".to_owned() } else { text.to_owned() };
    loop {
        let error = match serde_path_to_error::deserialize::<_, raw::Config>(
            serde_yaml::Deserializer::from_str(&source),
        ) {
            Ok(raw) => {
                read.raw = Some(raw);
                return read;
            }
            Err(error) => error,
        };
        let path: Vec<Segment> = error.path().iter().cloned().collect();
        let finding = describe(&path, &bare_message(error.inner()));
        let named = render(&read.file_path(&finding.names));
        // A required key whose bad value was cut is missing now: that is no second mistake.
        if !(finding.missing && read.cut.contains(&named)) {
            read.problems.push(Problem { path: named, message: finding.message });
        }
        if read.problems.len() >= MAX_PROBLEMS {
            read.problems.push(Problem {
                path: String::new(),
                message: format!("stopped after {MAX_PROBLEMS} problems"),
            });
            return read;
        }
        let file_target = read.file_path(&finding.cut);
        if !cut(&mut doc, &finding.cut) {
            return read;
        }
        read.cut.push(render(&file_target));
        read.remember_removed(&file_target);
        source = match serde_yaml::to_string(&doc) {
            Ok(text) => text,
            Err(_) => return read,
        };
    }
}

/// One structural problem, in the pruned document's terms.
struct Finding {
    /// The key the problem is about.
    names: Vec<Segment>,
    message: String,
    /// The node to cut so that the next pass gets further.
    cut: Vec<Segment>,
    /// A required key is absent.
    missing: bool,
}

/// serde_yaml's message without what it adds itself: the key path in front (ours is better: it
/// names the key, not only the map holding it) and the line behind (after a cut, lines refer to
/// the rewritten document, not the operator's file).
fn bare_message(error: &serde_yaml::Error) -> String {
    let mut message = error.to_string();
    if let Some(at) = message.rfind(" at line ") {
        let tail = &message[at + " at line ".len()..];
        let is_position = tail
            .split_once(" column ")
            .is_some_and(|(l, c)| l.parse::<u64>().is_ok() && c.parse::<u64>().is_ok());
        if is_position {
            message.truncate(at);
        }
    }
    message
}

/// What a serde message at `path` reports.
fn describe(path: &[Segment], message: &str) -> Finding {
    // serde_yaml names the map or key itself: "admission: unknown field ...".
    let message = (0..=path.len())
        .rev()
        .find_map(|n| message.strip_prefix(&format!("{}: ", render(&path[..n]))))
        .unwrap_or(message);
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let (key, expected) = rest.split_once('`').unwrap_or((rest, ""));
        let mut at = path.to_vec();
        if !matches!(at.last(), Some(Segment::Map { key: k }) if k == key) {
            at.push(Segment::Map { key: key.to_owned() });
        }
        let known: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
        return Finding { names: at.clone(), message: unknown_key(key, &known), cut: at, missing: false };
    }
    if let Some(rest) = message.strip_prefix("missing field `") {
        let key = rest.split_once('`').map_or(rest, |(k, _)| k);
        let mut at = path.to_vec();
        at.push(Segment::Map { key: key.to_owned() });
        // The map that lacks it goes: the key's value cannot be made up.
        return Finding { names: at, message: "is required".to_owned(), cut: path.to_vec(), missing: true };
    }
    let message = match message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "))
        .and_then(|rest| rest.rsplit_once(", expected "))
    {
        Some((found, expected)) => format!("expected {}, found {found}", plain_expectation(expected)),
        None => message.to_owned(),
    };
    Finding { names: path.to_vec(), message, cut: path.to_vec(), missing: false }
}

/// serde's name of what it wanted, in the file's terms.
fn plain_expectation(expected: &str) -> &str {
    match expected {
        "i8" | "i16" | "i32" | "i64" | "u8" | "u16" | "u32" | "u64" | "usize" => "a whole number",
        "a boolean" => "true or false",
        "a sequence" => "a list",
        "a map" => "a mapping of keys",
        e if e.starts_with("struct ") => "a mapping of keys",
        e => e,
    }
}

fn unknown_key(key: &str, known: &[&str]) -> String {
    let list = known.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ");
    let closest = known
        .iter()
        .map(|k| (edit_distance(key, k), *k))
        .min()
        // A slip of a letter or two, not a different word ("foo" is not "too" of anything).
        .filter(|(d, k)| *d == 1 || (*d == 2 && k.len() >= 6));
    match (closest, known.is_empty()) {
        (_, true) => "unknown key (this map takes no keys)".to_owned(),
        (Some((_, k)), false) => format!("unknown key, did you mean `{k}`? (known keys: {list})"),
        (None, false) => format!("unknown key (known keys: {list})"),
    }
}

/// Edits (insert, delete, replace, swap two neighbours) from `a` to `b`: the optimal string
/// alignment distance, so `pgae` is one slip from `page`. Keys are short: the table is nothing.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}

/// `admission.batch_size`, `protected[0].method`: the key paths `Validator` uses too.
fn render(path: &[Segment]) -> String {
    let mut out = String::new();
    for segment in path {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                // A quoted key may hold a line break: a problem stays one line.
                if key.chars().any(char::is_control) {
                    out.push_str(&key.escape_debug().to_string());
                } else {
                    out.push_str(key);
                }
            }
            Segment::Enum { variant } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(variant);
            }
            Segment::Unknown => out.push_str(if out.is_empty() { "?" } else { ".?" }),
        }
    }
    out
}

/// Removes the node at `path`; false when there is none (the root, or a path serde could not
/// name), which ends the reading with what was found so far.
fn cut(doc: &mut Value, path: &[Segment]) -> bool {
    let Some((last, parents)) = path.split_last() else { return false };
    let mut node = doc;
    for segment in parents {
        node = match child(node, segment) {
            Some(child) => child,
            None => return false,
        };
    }
    match (last, untagged(node)) {
        (Segment::Map { key }, Value::Mapping(map)) => {
            let Some(found) = map.keys().find(|k| key_text(k).as_deref() == Some(key)).cloned() else {
                return false;
            };
            map.remove(&found).is_some()
        }
        (Segment::Seq { index }, Value::Sequence(list)) if *index < list.len() => {
            list.remove(*index);
            true
        }
        _ => false,
    }
}

fn child<'a>(node: &'a mut Value, segment: &Segment) -> Option<&'a mut Value> {
    match (segment, untagged(node)) {
        (Segment::Map { key }, Value::Mapping(map)) => {
            map.iter_mut().find(|(k, _)| key_text(k).as_deref() == Some(key)).map(|(_, v)| v)
        }
        (Segment::Seq { index }, Value::Sequence(list)) => list.get_mut(*index),
        _ => None,
    }
}

fn untagged(node: &mut Value) -> &mut Value {
    match node {
        Value::Tagged(tagged) => untagged(&mut tagged.value),
        other => other,
    }
}

/// A mapping key as serde_yaml hands it to a struct: the scalar's text.
fn key_text(key: &Value) -> Option<String> {
    match key {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        read(text).problems.iter().map(Problem::to_string).collect()
    }

    #[test]
    fn every_unknown_key_and_wrong_type_is_found_in_one_reading() {
        let r = read("admission: {intervall: 1s, batch_size: lots}\nfoo: 1\nqueue: {capacity: 5}\n");
        let got: Vec<String> = r.problems.iter().map(Problem::to_string).collect();
        assert_eq!(
            got,
            vec![
                "admission.intervall: unknown key, did you mean `interval`? (known keys: `interval`, \
                 `batch_size`, `instant`, `max_active`, `adaptive`)",
                "admission.batch_size: expected a whole number, found string \"lots\"",
                "foo: unknown key (known keys: `listen`, `metrics_listen`, `upstream`, `redis`, \
                 `identity`, `token`, `protected`, `admission`, `queue`, `endpoints`, `poll_after`, \
                 `shutdown`, `reload`, `polling`, `abuse`, `page`, `limits`, `event`, `admin`, `bypass`, `mode`, `rooms`)",
            ]
        );
        // What was left is read: the good value survives the cuts around it.
        assert_eq!(r.raw.expect("the rest reads").queue.capacity, 5);
    }

    #[test]
    fn a_required_key_with_a_bad_value_is_reported_once() {
        assert_eq!(
            lines("protected: [{method: [1], path: /a}, {path: /b}]"),
            vec![
                "protected[0].method: expected a string, found sequence",
                "protected[1].method: is required",
            ]
        );
        assert_eq!(lines("redis: {sentinel: {addrs: []}}"), vec!["redis.sentinel.master: is required"]);
    }

    #[test]
    fn problems_under_a_cut_list_are_left_to_the_structural_line() {
        let r = read("poll_after: [{min_wait: 1s}, {min_wait: 0s, poll_after: 2s}]");
        assert_eq!(r.problems.len(), 1);
        // The second tier is now the first: a check of poll_after[0] would name the wrong one.
        assert!(r.covers("poll_after[0].min_wait") && r.covers("poll_after"));
        assert!(!r.covers("poll_after_x") && !r.covers("queue.capacity"));
    }

    #[test]
    fn unquoted_scalars_stay_text_after_a_cut() {
        // Without the cut of `foo` the first pass reads the file itself; with it, the rewritten
        // document must read the same: 300 as the text "300", 2026 as "2026".
        let r = read("foo: 1\ntoken: {ttl: 300}\nredis: {key_prefix: 2026}\npolling: {enforce: true}");
        assert_eq!(r.problems.len(), 1);
        let raw = r.raw.unwrap();
        assert_eq!((raw.token.ttl.as_str(), raw.redis.key_prefix.as_str()), ("300", "2026"));
        assert!(raw.polling.enforce);
    }

    #[test]
    fn text_that_is_no_map_of_keys_is_one_problem() {
        assert_eq!(lines("- 1"), vec!["expected a mapping of keys, found sequence"]);
        let broken = lines("admission: {interval: [1\nqueue: {{{\n");
        assert!(broken.len() == 1 && broken[0].starts_with("not valid YAML: ") && broken[0].contains("line"), "{broken:?}");
        assert!(lines("").is_empty() && lines("# nothing yet\n").is_empty());
        assert_eq!(lines("? [1, 2]\n: 3").len(), 1);
        let got = lines("\"a\\nb\": 1\nadmission: {\"x\\ty\": 2}");
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].starts_with("a\\nb: unknown key") && got[1].starts_with("admission.x\\ty: unknown key"), "{got:?}");
    }

    #[test]
    fn a_flood_of_problems_stops_at_the_cap() {
        let text: String = (0..200).map(|i| format!("k{i}: 1\n")).collect();
        let got = lines(&text);
        assert_eq!(got.len(), MAX_PROBLEMS + 1);
        assert_eq!(got.last().unwrap(), &format!("stopped after {MAX_PROBLEMS} problems"));
    }

    #[test]
    fn suggestions_are_for_slips_not_for_other_words() {
        assert_eq!(edit_distance("intervall", "interval"), 1);
        assert_eq!(edit_distance("batch_sise", "batch_size"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("pgae", "page"), 1);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert!(unknown_key("foo", &["too_long_a_key", "page"]).starts_with("unknown key (known"));
        assert!(unknown_key("pgae", &["page", "admin"]).contains("did you mean `page`?"));
    }
}
