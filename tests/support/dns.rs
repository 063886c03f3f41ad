//! A real DNS server for discovery tests: Debian's `dnsmasq` on a free loopback port,
//! authoritative for `.test` (an unknown name is NXDOMAIN, a name without AAAA records
//! has none), its records in a hosts directory the test rewrites as pods come and go.

use super::{free_ports, kill_group, spawn_in_own_group};
use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// One running dnsmasq; killed on drop.
pub struct Dns {
    /// Where it answers (UDP and TCP).
    pub address: SocketAddr,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Dns {
    /// Starts dnsmasq with no records.
    pub fn start() -> anyhow::Result<Dns> {
        let dir = tempfile::Builder::new()
            .prefix("infergate-dns-")
            .tempdir()?;
        std::fs::create_dir(dir.path().join("hosts"))?;
        // Started as root, dnsmasq reads its records as `nobody`.
        for path in [dir.path().to_path_buf(), dir.path().join("hosts")] {
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        }
        let [port] = free_ports::<1>()?;
        let mut dns = Dns {
            address: SocketAddr::from(([127, 0, 0, 1], port)),
            child: None,
            dir,
        };
        dns.resume()?;
        Ok(dns)
    }

    /// Starts dnsmasq again at the same address with the same records (after `stop`).
    pub fn resume(&mut self) -> anyhow::Result<()> {
        // Debian puts it in /usr/sbin, which a non-root PATH may lack.
        let sbin = std::path::Path::new("/usr/sbin/dnsmasq");
        let mut cmd = Command::new(if sbin.exists() {
            sbin
        } else {
            "dnsmasq".as_ref()
        });
        cmd.args([
            "--keep-in-foreground",
            "--no-resolv",
            "--no-hosts",
            "--local=/test/",
            "--listen-address=127.0.0.1",
            "--bind-interfaces",
        ])
        .arg(format!("--port={}", self.address.port()))
        .arg(format!("--hostsdir={}", self.hosts().display()))
        .arg(format!(
            "--pid-file={}",
            self.dir.path().join("pid").display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        let child = spawn_in_own_group(cmd).map_err(|e| {
            anyhow::anyhow!("cannot start dnsmasq (scripts/setup.sh installs dnsmasq-base): {e}")
        })?;
        self.child = Some(child);
        // Answering once its UDP socket is bound.
        for _ in 0..100 {
            if std::net::UdpSocket::bind(self.address).is_err() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        anyhow::bail!("dnsmasq did not bind {}", self.address)
    }

    /// Sets `name`'s A/AAAA records to `addresses` (none: the name is gone). The file is
    /// written beside the directory and moved in, so dnsmasq never reads half of it.
    pub fn publish(&self, name: &str, addresses: &[IpAddr]) {
        let text: String = addresses.iter().map(|a| format!("{a} {name}\n")).collect();
        let staged = self.dir.path().join(format!("{name}.staged"));
        std::fs::write(&staged, text).expect("write records");
        std::fs::rename(&staged, self.hosts().join(name)).expect("publish records");
    }

    /// Kills dnsmasq: lookups get no answer at all.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_group(&mut child);
        }
    }

    fn hosts(&self) -> std::path::PathBuf {
        self.dir.path().join("hosts")
    }
}

impl Drop for Dns {
    fn drop(&mut self) {
        self.stop();
    }
}
