//! The JSON Schema of `proxy.yaml` (docs/proxy.schema.json), held against the binary that
//! generates it and against every configuration the project ships:
//!
//! - the checked-in file is exactly what `waitroom --print-schema` prints (it is generated from
//!   the raw config structs; a new key changes both or this test says how to regenerate);
//! - `proxy.yaml` and every `examples/**/*.yaml` validate against it with check-jsonschema
//!   (pinned in docs/requirements-api.txt, found like tests/openapi.rs finds its tools);
//! - the files under tests/schema/, which use every section of the contract, pass both
//!   `waitroom --check` and the schema: the schema takes what the proxy takes;
//! - a file with unknown keys and a misspelt duration is refused by both, each problem named.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_waitroom");
const REPO: &str = env!("CARGO_MANIFEST_DIR");
const REGENERATE: &str = "cargo run -q --bin waitroom -- --print-schema > docs/proxy.schema.json";

/// The environment the tests/schema/ files name (a JWT secret, an admin token, a Redis password,
/// a bypass secret).
const FIXTURE_ENV: [(&str, &str); 4] = [
    ("WAITROOM_SCHEMA_TEST_BYPASS", "a-bypass-secret"),
    ("WAITROOM_SCHEMA_TEST_SECRET", "a-secret"),
    ("WAITROOM_SCHEMA_TEST_ADMIN", "an-admin-token"),
    ("WAITROOM_SCHEMA_TEST_REDIS_PASSWORD", "a-redis-password"),
];

fn schema_path() -> PathBuf {
    Path::new(REPO).join("docs/proxy.schema.json")
}

fn said(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// check-jsonschema on `files` with the checked-in schema.
fn check_jsonschema(files: &[PathBuf]) -> Output {
    Command::new(api_tool("check-jsonschema"))
        .arg("--schemafile")
        .arg(schema_path())
        .args(files)
        .output()
        .expect("run check-jsonschema")
}

fn waitroom_check(file: &Path) -> Output {
    Command::new(BIN)
        .arg("--config")
        .arg(file)
        .arg("--check")
        .envs(FIXTURE_ENV)
        .output()
        .expect("run waitroom --check")
}

/// `dir`'s YAML files, in every folder below it, sorted.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return found };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(yaml_files(&path));
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            found.push(path);
        }
    }
    found.sort();
    found
}

#[test]
fn the_checked_in_schema_is_what_print_schema_prints() {
    // From a folder without a proxy.yaml, naming a file that does not exist: printing the
    // schema needs no configuration.
    let empty = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["--config", "nowhere.yaml", "--print-schema"])
        .current_dir(empty.path())
        .output()
        .expect("run waitroom --print-schema");
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let printed = String::from_utf8(out.stdout).expect("the schema is UTF-8");
    let schema: serde_json::Value = serde_json::from_str(&printed).expect("the schema is JSON");
    assert_eq!(schema["$schema"], "http://json-schema.org/draft-07/schema#");
    let checked_in = std::fs::read_to_string(schema_path()).unwrap_or_default();
    assert!(
        printed == checked_in,
        "docs/proxy.schema.json is not what `waitroom --print-schema` prints (a config struct \
         changed?); regenerate it with `{REGENERATE}` and commit it"
    );
}

#[test]
fn every_shipped_configuration_follows_the_schema() {
    let mut shipped = vec![Path::new(REPO).join("proxy.yaml")];
    shipped.extend(yaml_files(&Path::new(REPO).join("examples")));
    let out = check_jsonschema(&shipped);
    assert_eq!(out.status.code(), Some(0), "{shipped:?}:\n{}", said(&out));
    // The editor hint the README shows is in the file operators copy.
    let proxy_yaml = std::fs::read_to_string(&shipped[0]).unwrap();
    assert_eq!(
        proxy_yaml.lines().next(),
        Some("# yaml-language-server: $schema=docs/proxy.schema.json"),
        "proxy.yaml starts with the schema hint"
    );
}

#[test]
fn the_schema_takes_every_section_the_proxy_takes() {
    let fixtures = yaml_files(&Path::new(REPO).join("tests/schema"));
    assert!(fixtures.len() >= 3, "{fixtures:?}");
    for file in &fixtures {
        let out = waitroom_check(file);
        assert_eq!(out.status.code(), Some(0), "{} is valid for the proxy:\n{}", file.display(), said(&out));
    }
    let out = check_jsonschema(&fixtures);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
}

#[test]
fn unknown_keys_and_misspelt_values_are_refused_by_both() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("proxy.yaml");
    std::fs::write(
        &file,
        "upstream: \"127.0.0.1:8081\"\nfoo: 1\nadmission: {intervall: 1s}\n\
         protected: [{method: POST, path: /a, mtach: prefix}]\n\
         redis: {sentinel: {master: m, addrs: [\"redis://127.0.0.1:26379\"], mode: x}}\n\
         queue: {retry_after: 30x}\n",
    )
    .unwrap();
    let out = check_jsonschema(std::slice::from_ref(&file));
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let text = said(&out);
    for (at, unexpected) in [
        ("$:", "'foo' was unexpected"),
        ("$.admission:", "'intervall' was unexpected"),
        ("$.protected[0]:", "'mtach' was unexpected"),
        ("$.redis.sentinel:", "'mode' was unexpected"),
        ("$.queue.retry_after:", "'30x' does not match"),
    ] {
        assert!(
            text.lines().any(|l| l.contains(at) && l.contains(unexpected)),
            "check-jsonschema names {at} {unexpected}:\n{text}"
        );
    }
    let out = waitroom_check(&file);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    let paths: Vec<String> = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter_map(|l| l.split_once(": ").map(|(p, _)| p.to_owned()))
        .collect();
    assert_eq!(
        paths,
        ["foo", "admission.intervall", "protected[0].mtach", "redis.sentinel.mode", "queue.retry_after"],
        "{}",
        said(&out)
    );
}
