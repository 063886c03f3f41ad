//! `scripts/setup.sh` on a machine that lacks Debian packages it needs: it installs them
//! after one `apt-get update` (a fresh image has no package lists), and says nothing once
//! everything is there. `apt-get` is a stand-in that records its arguments and "installs"
//! by creating the command; everything else (the venv, the stub, the padding) is real.

mod support;

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::process::{Command, Output};

fn script(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A `PATH` directory with the system's commands but without curl and openssl, and with a
/// recording apt-get (and a sudo that just runs it, for runs as another user than root).
fn path_without_curl_and_openssl(bin: &Path, log: &Path) {
    for dir in ["/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"] {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let target = bin.join(&name);
            if ["curl", "openssl", "apt-get", "sudo"].contains(&name.to_str().unwrap_or(""))
                || target.exists()
            {
                continue;
            }
            symlink(entry.path(), target).unwrap();
        }
    }
    script(
        &bin.join("apt-get"),
        &format!(
            "echo \"$*\" >> {log}\n\
             [ \"$1\" = install ] || exit 0\n\
             for p; do case \"$p\" in curl|openssl) printf '#!/bin/sh\\n' > {bin}/$p; chmod +x {bin}/$p;; esac; done\n",
            log = log.display(),
            bin = bin.display()
        ),
    );
    script(&bin.join("sudo"), "[ \"$1\" = -n ] && shift\nexec \"$@\"\n");
}

fn run_setup(bin: &Path) -> Output {
    Command::new(bin.join("bash"))
        .arg(support::repo_root().join("scripts/setup.sh"))
        .env("PATH", bin)
        .output()
        .unwrap()
}

#[test]
fn setup_installs_missing_packages_after_one_update_and_is_quiet_when_done() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let log = dir.path().join("apt-get.log");
    path_without_curl_and_openssl(&bin, &log);

    let first = run_setup(&bin);
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert!(first.status.success(), "{stderr}");
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(
        calls.lines().collect::<Vec<_>>(),
        [
            "update -q",
            "install -y -q --no-install-recommends openssl curl"
        ],
        "{stderr}"
    );

    // Everything there now: no apt-get, no output.
    let second = run_setup(&bin);
    assert!(second.status.success());
    assert_eq!(std::fs::read_to_string(&log).unwrap(), calls);
    assert_eq!(String::from_utf8_lossy(&second.stderr), "");
    assert_eq!(String::from_utf8_lossy(&second.stdout), "");
}
