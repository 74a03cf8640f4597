//! The README's "Running it" block, run as written: the commands come from README.md itself, so
//! the README cannot drift from what works.
//!
//! What differs from a person at a terminal, and why:
//! - `target/release/NAME` becomes the binary cargo built for this test (`cargo build --bins`):
//!   the `apt-get` and `cargo build` lines are checked to be there, not run.
//! - The block runs in one `bash` in a process group of its own (killed with the test), in a
//!   folder of the test's own that holds the shipped `proxy.yaml`, with `TMPDIR` there too. The
//!   block picks free ports and starts its own Redis, for the test as for a person.
//! - Every line's output is checked. A line the test has no check for fails it, so a new README
//!   line comes with its check.

mod common;

use common::*;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const README: &str = include_str!("../README.md");
const SHIPPED_CONFIG: &str = include_str!("../proxy.yaml");
const MARKER: &str = "<!-- tests/readme.rs runs the next block";

/// The commands of the fenced block after `MARKER`, comments removed, one a line.
fn running_it_commands() -> Vec<String> {
    let after = README
        .split_once(MARKER)
        .expect("README.md has the block tests/readme.rs runs")
        .1;
    let body = after
        .split_once("```sh\n")
        .expect("a ```sh block follows the marker")
        .1;
    let block = body.split_once("\n```").expect("the block is closed").0;
    block
        .lines()
        .map(|line| {
            line.split_once("  # ")
                .map_or(line, |(cmd, _)| cmd)
                .trim()
                .to_owned()
        })
        .filter(|line| !line.is_empty())
        .collect()
}

/// `target/release/NAME` as the binary built for this test.
fn built_binary(name: &str) -> PathBuf {
    if name == "waitroom" {
        PathBuf::from(env!("CARGO_BIN_EXE_waitroom"))
    } else {
        tools_binary(name)
    }
}

fn substitute_binaries(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(at) = rest.find("target/release/") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "target/release/".len()..];
        let end = after
            .find(|c: char| c.is_whitespace())
            .unwrap_or(after.len());
        out.push_str(&built_binary(&after[..end]).display().to_string());
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// One foreground line and what it printed.
struct Ran {
    line: String,
    rc: i32,
    out: String,
}

/// The block's shell, in a process group of its own: whatever its `&` lines started dies with it.
struct Block {
    group: u32,
}

impl Drop for Block {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.group)])
            .stderr(Stdio::null())
            .status();
    }
}

/// Runs `lines` in one bash (so `token=$(...)` and the ports reach the lines after them) and
/// splits the output per line with markers that carry each line's exit status; then prints the
/// variables named in `report`, one a line, after a marker of their own.
fn run_block(lines: &[(String, String)], report: &[&str], dir: &Path) -> (Vec<Ran>, Vec<String>, Block) {
    let mut script = String::new();
    for (i, (_, cmd)) in lines.iter().enumerate() {
        script.push_str(&format!("{cmd}\nprintf '\\n@@readme %d %d\\n' {i} $?\n"));
    }
    script.push_str("printf '@@report\\n'\n");
    for name in report {
        script.push_str(&format!("printf '%s\\n' \"${name}\"\n"));
    }
    let child = Command::new("bash")
        .args(["-c", &script])
        .current_dir(dir)
        .env("TMPDIR", dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("run bash");
    let block = Block { group: child.id() };
    // The `&` lines send their output to files, so the pipes close when bash exits.
    let output = child.wait_with_output().expect("wait for bash");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let Some((lines_out, reported)) = stdout.split_once("@@report\n") else {
        panic!(
            "the block did not run to its end:\n{stdout}\n--- stderr\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let mut ran = Vec::new();
    let mut current = String::new();
    for l in lines_out.lines() {
        if let Some(marker) = l.strip_prefix("@@readme ") {
            let (i, rc) = marker.split_once(' ').expect("marker");
            let i: usize = i.parse().expect("marker index");
            ran.push(Ran {
                line: lines[i].0.clone(),
                rc: rc.parse().expect("marker status"),
                out: std::mem::take(&mut current).trim().to_owned(),
            });
        } else {
            current.push_str(l);
            current.push('\n');
        }
    }
    assert_eq!(
        ran.len(),
        lines.len(),
        "not every line ran:\n{stdout}\n--- stderr\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    (ran, reported.lines().map(str::to_owned).collect(), block)
}

fn json(ran: &Ran) -> serde_json::Value {
    serde_json::from_str(&ran.out)
        .unwrap_or_else(|e| panic!("`{}` printed no JSON ({e}): {:?}", ran.line, ran.out))
}

fn is_uuid(s: &str) -> bool {
    s.len() == 36 && s.chars().filter(|&c| c == '-').count() == 4
}

#[tokio::test]
async fn running_it_works_as_written() {
    let commands = running_it_commands();
    assert!(
        commands.iter().any(|c| c.contains("apt-get install") && c.contains("redis-server")),
        "the block starts by installing what is missing, Redis included: {commands:#?}"
    );
    assert!(
        commands[0].starts_with("sudo=") && commands[1].starts_with("$sudo apt-get install"),
        "apt-get runs through sudo only when the reader is not root: {commands:#?}"
    );
    assert!(
        commands.iter().any(|c| c == "cargo build --release --bins"),
        "the block builds every binary it runs: {commands:#?}"
    );

    let dir = tempfile::Builder::new()
        .prefix("waitroom-readme")
        .tempdir()
        .expect("tempdir");
    std::fs::write(dir.path().join("proxy.yaml"), SHIPPED_CONFIG).expect("write proxy.yaml");
    let lines: Vec<(String, String)> = commands
        .iter()
        .filter(|l| !l.contains("apt-get install") && !l.starts_with("cargo build"))
        .map(|l| (l.clone(), substitute_binaries(l)))
        .collect();
    for (line, _) in &lines {
        if line.ends_with('&') {
            assert!(
                line.contains("> \"$dir/") && line.ends_with("2>&1 &"),
                "a server's output goes to a log in $dir, not over the next answers: `{line}`"
            );
        }
    }
    let (ran, reported, block) = run_block(&lines, &["proxy", "front", "dir"], dir.path());
    let [proxy, front, block_dir] = &reported[..] else {
        panic!("the block's variables: {reported:?}");
    };
    let ctx = || {
        let mut logs = String::new();
        for entry in std::fs::read_dir(block_dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "log") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                logs.push_str(&format!("--- {}\n{text}\n", path.display()));
            }
        }
        logs
    };
    assert!(
        Path::new(block_dir).starts_with(dir.path()),
        "mktemp -d made {block_dir} outside TMPDIR"
    );

    // Every line's answer, in order.
    let mut orders = 0;
    let mut token = None;
    let mut page_url = None;
    for r in &ran {
        assert_eq!(r.rc, 0, "`{}` failed: {:?}\n{}", r.line, r.out, ctx());
        let l = r.line.as_str();
        let quiet = ["sudo=", "dir=", "read -r ", "sed -e ", "sleep ", "token=$("];
        if quiet.iter().any(|q| l.starts_with(q)) || l.ends_with('&') {
            assert!(r.out.is_empty(), "`{l}` prints nothing: {:?}", r.out);
        } else if l.contains("/readyz") {
            assert_eq!(r.out, "ready", "`{l}`\n{}", ctx());
        } else if l.contains("/queue/enter") {
            let body = json(r);
            let waiting = body["status"] == "WAITING" && body["position"] == 1;
            assert!(
                waiting || body["status"] == "READY",
                "`{l}`: {body}\n{}",
                ctx()
            );
        } else if l.contains("/queue/status") {
            let body = json(r);
            assert_eq!(body["status"], "READY", "`{l}`: {body}\n{}", ctx());
            assert!(
                is_uuid(body["token"].as_str().unwrap_or("")),
                "`{l}`: {body}"
            );
            token = body["token"].as_str().map(str::to_owned);
        } else if l.contains("/api/orders") {
            let body = json(r);
            orders += 1;
            if orders == 1 {
                // The demo order API's own answer, passed through unchanged.
                assert_eq!(body["user"], "alice", "`{l}`: {body}\n{}", ctx());
                assert!(body["orderId"].as_u64().is_some(), "`{l}`: {body}");
            } else {
                assert!(
                    body["error"].is_string(),
                    "a spent token is refused: {body}"
                );
                assert!(body.get("orderId").is_none(), "{body}");
            }
        } else if l.contains("/metrics") {
            assert!(
                r.out.contains(r#"waitroom_admitted_total{room="default"} 1"#),
                "`{l}`: {}",
                r.out
            );
            assert!(
                r.out.contains(r#"waitroom_tokens_consumed_total{room="default"} 1"#),
                "`{l}`: {}",
                r.out
            );
        } else if l.starts_with("echo ") && l.contains("/queue/") {
            let url = r.out.rsplit(' ').next().unwrap_or("").to_owned();
            assert_eq!(url, format!("http://127.0.0.1:{front}/queue/"), "`{l}`");
            page_url = Some(url);
        } else {
            panic!("tests/readme.rs has no check for the README line `{l}`: add one");
        }
    }
    assert!(
        token.is_some(),
        "no status line answered READY: {commands:#?}"
    );
    assert_eq!(
        orders, 2,
        "an order with the token, then the same again: {commands:#?}"
    );

    // The page: the URL the block prints, through the identity-front the line before started.
    let page_url = page_url.expect("the block prints the waiting page's URL");
    let client = http_client();
    let up = wait_until(Duration::from_secs(20), Duration::from_millis(50), || {
        let req = client.get(&page_url);
        async move { try_send(req).await.is_ok() }
    })
    .await;
    assert!(up, "identity-front never answered {page_url}:\n{}", ctx());
    let page = send(client.get(&page_url)).await;
    assert_eq!(page.status, 200, "{page_url}: {}\n{}", page.body, ctx());
    assert!(page
        .header("content-type")
        .unwrap_or("")
        .starts_with("text/html"));
    let cookie = page
        .header("set-cookie")
        .and_then(|c| c.split(';').next())
        .unwrap_or_else(|| panic!("identity-front gave no cookie:\n{}", ctx()))
        .to_owned();
    let enter_url = page_url.replace("/queue/", "/queue/enter");
    let enter = send(client.post(&enter_url).header("cookie", &cookie)).await;
    assert_eq!(
        enter.status, 200,
        "the page's enter, named by the cookie: {}",
        enter.body
    );
    let again = send(client.post(&enter_url).header("cookie", &cookie)).await;
    let (first, again) = (enter.json(), again.json());
    // The same user keeps their place, or, admitted in between (the block's room admits every
    // 100 ms), is READY: a new user would be neither.
    assert!(
        again["position"] == first["position"] || again["status"] == "READY",
        "the same user again: {first} then {again}"
    );
    // Straight on the proxy, nobody names the browser: 401, which the page shows as SIGN_IN.
    let direct = format!("http://127.0.0.1:{proxy}/queue/enter");
    assert_eq!(send(client.post(&direct)).await.status, 401);
    drop(block);
}

/// The Markdown files a reader of the repository opens.
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if path.is_dir() {
                if !name.starts_with('.') && !["target", "node_modules"].contains(&name.as_ref()) {
                    walk(&path, out);
                }
            } else if name.ends_with(".md") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(Path::new(env!("CARGO_MANIFEST_DIR")), &mut out);
    out.sort();
    out
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(markdown: &str) -> Vec<String> {
    let mut in_code = false;
    markdown
        .lines()
        .filter(|l| {
            if l.starts_with("```") {
                in_code = !in_code;
            }
            !in_code && l.starts_with('#')
        })
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect()
}

/// Every `](target)` of a Markdown file that stays inside the repository (no scheme).
fn relative_links(markdown: &str) -> Vec<String> {
    let mut links = Vec::new();
    let mut in_code = false;
    for line in markdown.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = &after[..end];
            if !target.contains("://") && !target.starts_with("mailto:") {
                links.push(target.to_owned());
            }
            rest = &after[end..];
        }
    }
    links
}

/// A reader can follow every link the docs make inside the repository: the file exists, and the
/// heading a `#fragment` names is in it.
#[test]
fn every_relative_link_in_the_docs_resolves() {
    let mut broken = Vec::new();
    let files = markdown_files();
    assert!(files.len() >= 6, "found only {files:?}");
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read markdown");
        for link in relative_links(&text) {
            let (path, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            if !target.exists() {
                broken.push(format!("{}: {link} (no such file)", file.display()));
            } else if !fragment.is_empty() && target.extension().is_some_and(|e| e == "md") {
                let headings = anchors(&std::fs::read_to_string(&target).expect("read target"));
                if !headings.iter().any(|a| a == fragment) {
                    broken.push(format!("{}: {link} (no such heading)", file.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The README names these configurations as working ones; `scripts/test.sh` checks them too, and
/// this keeps `cargo test` alone from missing one that broke. An example with files of its own
/// lives in a folder (`examples/branded-page/`), so the folders are walked too.
#[test]
fn every_example_configuration_passes_check() {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for path in std::fs::read_dir(dir).expect("read examples/").flatten().map(|e| e.path()) {
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                out.push(path);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut examples = Vec::new();
    walk(&root.join("examples"), &mut examples);
    examples.sort();
    assert!(examples.len() >= 6, "{examples:?}");
    for example in examples {
        let name = example
            .strip_prefix(root.join("examples"))
            .expect("under examples/")
            .to_string_lossy()
            .into_owned();
        assert!(
            README.contains(&format!("(examples/{name})")),
            "the README links examples/{name}"
        );
        // From another folder, with no environment prepared: as CI runs it.
        let out = Command::new(env!("CARGO_BIN_EXE_waitroom"))
            .arg("--config")
            .arg(&example)
            .arg("--check")
            .current_dir(std::env::temp_dir())
            .env_clear()
            .output()
            .expect("run waitroom --check");
        assert!(
            out.status.success(),
            "{name}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn anchors_are_githubs() {
    assert_eq!(
        anchor(" The waiting page: `GET /queue/`"),
        "the-waiting-page-get-queue"
    );
    assert_eq!(
        anchor("Sale day: pause, close, open"),
        "sale-day-pause-close-open"
    );
    assert_eq!(
        anchor("Operator endpoints on `metrics_listen`"),
        "operator-endpoints-on-metrics_listen"
    );
}

/// Files that name a README section in words (`README: "Sale day"`) rather than by a link: YAML,
/// scripts and the dashboard cannot hold Markdown links.
#[test]
fn every_readme_section_named_in_words_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let headings: Vec<String> = README
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| l.trim_start_matches('#').trim().to_owned())
        .collect();
    let mut files = markdown_files();
    for dir in ["", "docs", "dashboards", "scripts", "bench", "examples"] {
        for entry in std::fs::read_dir(root.join(dir))
            .expect("read_dir")
            .flatten()
        {
            let path = entry.path();
            let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
            if ["yaml", "yml", "sh", "json"].contains(&ext) {
                files.push(path);
            }
        }
    }
    let mut named = 0;
    let mut missing = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read");
        for form in ["README: \"", "README's \"", "README, \"", "README.md, \""] {
            for piece in text.split(form).skip(1) {
                let Some((section, _)) = piece.split_once('"') else {
                    continue;
                };
                // A name may wrap across lines.
                let section = section.split_whitespace().collect::<Vec<_>>().join(" ");
                named += 1;
                if !headings.iter().any(|h| h.starts_with(&section)) {
                    missing.push(format!("{}: README section \"{section}\"", file.display()));
                }
            }
        }
    }
    assert!(named >= 5, "found only {named} sections named in words");
    assert!(
        missing.is_empty(),
        "no such README sections:\n{}",
        missing.join("\n")
    );
}
