//! Child processes whose output goes to files, so a failing test can show what the process said,
//! and signals sent through `kill(1)` (the tests have no libc dependency).

use std::collections::{BTreeSet, HashSet};
use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
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

/// The resident memory of process `pid`, in KiB (`VmRSS` of /proc/<pid>/status).
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// The TCP addresses process `pid` listens on, read from the kernel (its socket fds matched
/// with the LISTEN entries of /proc/net/tcp and tcp6): what it serves, whoever else might hold a
/// port. Empty once the process is gone.
pub fn listening_addrs(pid: u32) -> BTreeSet<SocketAddr> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return BTreeSet::new() };
    let inodes: HashSet<String> = fds
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']').map(str::to_owned))
        .collect();
    let mut out = BTreeSet::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if f.len() < 10 || f[3] != "0A" || !inodes.contains(f[9]) {
                continue;
            }
            let Some((ip, port)) = f[1].split_once(':') else { continue };
            let (Some(ip), Ok(port)) = (kernel_ip(ip), u16::from_str_radix(port, 16)) else { continue };
            out.insert(SocketAddr::new(ip, port));
        }
    }
    out
}

/// An address as /proc/net/tcp{,6} prints it: hex of 32-bit words in host (little-endian) order.
fn kernel_ip(hex: &str) -> Option<IpAddr> {
    let words: Vec<u32> = (0..hex.len() / 8)
        .map(|i| u32::from_str_radix(&hex[i * 8..i * 8 + 8], 16))
        .collect::<Result<_, _>>()
        .ok()?;
    match words.as_slice() {
        [v4] => Some(IpAddr::V4(Ipv4Addr::from(v4.to_le_bytes()))),
        [a, b, c, d] => {
            let mut bytes = [0u8; 16];
            for (i, w) in [a, b, c, d].iter().enumerate() {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
            }
            Some(IpAddr::V6(Ipv6Addr::from(bytes)))
        }
        _ => None,
    }
}
