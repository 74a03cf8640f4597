//! The pinned Python tools some tests run (docs/requirements-api.txt: the API description's
//! checkers, check-jsonschema), found in the venv `scripts/lib.sh`'s `ensure_api_tools` fills. A
//! missing tool, or another version than the pinned one, fails the test with the command that
//! installs it: skipping would let CI pass without checking anything.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The venv `ensure_api_tools` fills: `api-tools` in the target directory this test was built in
/// (the proxy's binary is `<target>/debug/waitroom`), so `CARGO_TARGET_DIR` is followed too.
fn api_tools() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_waitroom"))
        .parent()
        .and_then(Path::parent)
        .expect("the binary lies in <target>/<profile>/")
        .join("api-tools")
}

const INSTALL_HINT: &str = "install them with `bash -c '. scripts/lib.sh && ensure_api_tools'` \
                            (scripts/test.sh does it)";

/// `(package, version)` of each pin in docs/requirements-api.txt.
fn pins() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/requirements-api.txt"))
        .expect("read docs/requirements-api.txt");
    let pins: Vec<(String, String)> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (name, version) = l
                .split_once("==")
                .unwrap_or_else(|| panic!("docs/requirements-api.txt: {l:?} is not pinned (==)"));
            (name.trim().to_owned(), version.trim().to_owned())
        })
        .collect();
    assert!(!pins.is_empty(), "docs/requirements-api.txt pins nothing");
    pins
}

/// The path of the venv's `command`, once every pinned tool is there at its pinned version;
/// panics naming what is missing or different, and how to install it.
pub fn api_tool(command: &str) -> PathBuf {
    let venv = api_tools();
    let python = venv.join("bin/python");
    let wanted = pins();
    let names: Vec<&str> = wanted.iter().map(|(n, _)| n.as_str()).collect();
    let script = "import sys, importlib.metadata as m\n\
                  for name in sys.argv[1:]:\n\
                  \x20   try: print(name, m.version(name))\n\
                  \x20   except m.PackageNotFoundError: print(name, '-')";
    let out = Command::new(&python)
        .args(["-c", script])
        .args(&names)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "the API tools are not installed ({} cannot run: {e}); {INSTALL_HINT}",
                python.display()
            )
        });
    let found = String::from_utf8_lossy(&out.stdout);
    let wrong: Vec<String> = wanted
        .iter()
        .filter(|(name, version)| !found.lines().any(|l| l == format!("{name} {version}")))
        .map(|(name, version)| format!("{name}=={version}"))
        .collect();
    assert!(
        wrong.is_empty(),
        "{} lacks {} (it has: {}); {INSTALL_HINT}",
        venv.display(),
        wrong.join(", "),
        found.trim().replace('\n', ", ")
    );
    let path = venv.join("bin").join(command);
    assert!(
        path.exists(),
        "{} is missing; {INSTALL_HINT}",
        path.display()
    );
    path
}
