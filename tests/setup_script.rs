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

/// Commands setup.sh installs when missing, and the Debian package that brings each.
const INSTALLED: [(&str, &str); 9] = [
    ("openssl", "openssl"),
    ("curl", "curl"),
    ("prometheus", "prometheus"),
    ("promtool", "prometheus"),
    ("docker-compose", "docker-compose"),
    ("etcd", "etcd-server"),
    ("haproxy", "haproxy"),
    ("stress-ng", "stress-ng"),
    ("dnsmasq", "dnsmasq-base"),
];

/// A `PATH` directory with the system's commands but without those setup.sh installs, and
/// with a recording apt-get (and a sudo that just runs it, for runs as another user than root).
fn path_without_installed_commands(bin: &Path, log: &Path) {
    for dir in ["/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"] {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let target = bin.join(&name);
            let name_str = name.to_str().unwrap_or("");
            if INSTALLED.iter().any(|(command, _)| *command == name_str)
                || ["apt-get", "sudo"].contains(&name_str)
                || target.exists()
            {
                continue;
            }
            symlink(entry.path(), target).unwrap();
        }
    }
    // "Installing" a package creates the commands it brings.
    let mut cases = String::new();
    for (_, package) in INSTALLED {
        if cases.contains(&format!("{package})")) {
            continue;
        }
        cases.push_str(&format!("{package})"));
        for (command, _) in INSTALLED.iter().filter(|(_, p)| *p == package) {
            cases.push_str(&format!(
                " printf '#!/bin/sh\\n' > {bin}/{command}; chmod +x {bin}/{command}\n",
                bin = bin.display()
            ));
        }
        cases.push_str(";;\n");
    }
    script(
        &bin.join("apt-get"),
        &format!(
            "echo \"$*\" >> {log}\n\
             [ \"$1\" = install ] || exit 0\n\
             for p; do case \"$p\" in {cases}esac; done\n",
            log = log.display(),
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
    path_without_installed_commands(&bin, &log);

    let first = run_setup(&bin);
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert!(first.status.success(), "{stderr}");
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(
        calls.lines().collect::<Vec<_>>(),
        [
            "update -q",
            "install -y -q --no-install-recommends openssl curl prometheus docker-compose etcd-server haproxy stress-ng dnsmasq-base"
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

/// Crates that generate Rust from .proto files, with `protoc` unless handed descriptors.
const PROTO_GENERATORS: [&str; 4] = [
    "prost-build",
    "tonic-build",
    "tonic-prost-build",
    "protobuf-codegen",
];

/// setup.sh installs no `protoc`, so nothing in the build may run one. Our own build scripts
/// hand the generators protox's descriptors (pure Rust); a crate from a registry that uses a
/// generator compiles its protos in its build script with `protoc` (as `etcd-client` did),
/// and would break the build on a machine with Rust only. Read from Cargo.lock, whose
/// entries list each crate's normal and build dependencies.
#[test]
fn no_dependency_compiles_protos_with_protoc() {
    let lock = std::fs::read_to_string(support::repo_root().join("Cargo.lock")).unwrap();
    let lock: toml::Table = toml::from_str(&lock).unwrap();
    let generates = |package: &toml::Value| {
        let dependencies = package.get("dependencies").and_then(|d| d.as_array());
        (dependencies.into_iter().flatten())
            .filter_map(|d| d.as_str()?.split(' ').next())
            .any(|d| PROTO_GENERATORS.contains(&d))
    };
    let offenders: Vec<&str> = (lock["package"].as_array().unwrap().iter())
        // From a registry (a workspace crate has no `source`), and not a generator itself.
        .filter(|p| p.get("source").is_some())
        .filter(|p| !PROTO_GENERATORS.contains(&p["name"].as_str().unwrap()))
        .filter(|p| generates(p))
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert!(
        offenders.is_empty(),
        "these crates run protoc in their build: {offenders:?}"
    );
}
