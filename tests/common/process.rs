//! Child processes whose output goes to files, so a failing test can show what the process said,
//! and signals sent through `kill(1)` (the tests have no libc dependency).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Spawns `cmd` with stdout/stderr in `dir/<name>.out` and `dir/<name>.err` (truncated first).
pub fn spawn_logged(cmd: &mut Command, dir: &Path, name: &str) -> Child {
    let out = File::create(dir.join(format!("{name}.out"))).expect("create stdout log");
    let err = File::create(dir.join(format!("{name}.err"))).expect("create stderr log");
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {:?}: {e}", cmd.get_program()))
}

/// Both logs of `name`, stdout first.
pub fn read_logs(dir: &Path, name: &str) -> String {
    let read = |ext| std::fs::read_to_string(dir.join(format!("{name}.{ext}"))).unwrap_or_default();
    read("out") + &read("err")
}

/// `kill -<sig> <pid>`, e.g. `signal(pid, "HUP")`.
pub fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{sig} {pid} failed");
}

/// SIGKILL and reap; a process that already exited is fine.
pub fn kill_and_reap(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// True when the child has exited (and reaps it).
pub fn has_exited(child: &mut Child) -> bool {
    matches!(child.try_wait(), Ok(Some(_)))
}

/// A binary of the `tools/` package (`demo-order-api`, `identity-front`). It belongs to another
/// package of the workspace, and cargo hands a test the paths of its own package's binaries only
/// (`CARGO_BIN_EXE_*`). Every package of the workspace builds into one target directory, so the
/// binary sits beside this test's own: `<target>/<profile>/deps/<test>` is next to
/// `<target>/<profile>/<name>`. `cargo test` builds it along with the tools' own tests;
/// `cargo test --test X` does not, hence `cargo build --bins` first (scripts/test.sh does).
pub fn tools_binary(name: &str) -> PathBuf {
    let name = format!("{name}{}", std::env::consts::EXE_SUFFIX);
    let exe = std::env::current_exe().expect("the test executable's path");
    exe.ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join(&name))
        .find(|path| path.is_file())
        .unwrap_or_else(|| {
            panic!(
                "no {name} in the target directory of {}: build it first (cargo build --bins)",
                exe.display()
            )
        })
}
