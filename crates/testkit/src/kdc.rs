//! A real MIT Kerberos KDC for tests (Debian's `krb5-kdc` and `krb5-admin-server`, which
//! `.ci/run` installs): its own realm, database and krb5.conf in a temporary directory,
//! listening on 127.0.0.1 only, killed and removed on drop. Nothing of the machine's Kerberos
//! setup is read or changed: every tool runs with `KRB5_CONFIG` and `KRB5_KDC_PROFILE` set to
//! the directory's files.

use crate::HarnessError;

fn failed(what: &str, why: impl std::fmt::Display) -> HarnessError {
    HarnessError::Failed {
        what: what.to_string(),
        status: "error".into(),
        stderr: why.to_string(),
    }
}
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOOLS: [&str; 3] = [
    "/usr/sbin/krb5kdc",
    "/usr/sbin/kdb5_util",
    "/usr/sbin/kadmin.local",
];

#[derive(Debug)]
pub struct Kdc {
    dir: PathBuf,
    realm: String,
    port: u16,
    child: Child,
}

impl Kdc {
    /// Creates realm `realm` and starts its KDC; tickets live at most an hour unless a
    /// principal's own limit is shorter.
    pub fn start(realm: &str) -> Result<Kdc, HarnessError> {
        for tool in TOOLS {
            if !Path::new(tool).exists() {
                return Err(failed(
                    "the test KDC",
                    format!("{tool} not found: install Debian's krb5-kdc and krb5-admin-server (.ci/run does)"),
                ));
            }
        }
        let port = crate::free_ports(1);
        let dir = std::env::temp_dir().join(format!("kmirror-kdc-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| failed("the KDC's directory", e))?;
        let d = dir.display();
        let write = |name: &str, text: String| {
            std::fs::write(dir.join(name), text).map_err(|e| failed(name, e))
        };
        write(
            "krb5.conf",
            format!(
                "[libdefaults]\n default_realm = {realm}\n dns_lookup_realm = false\n dns_lookup_kdc = false\n \
                 rdns = false\n dns_canonicalize_hostname = false\n udp_preference_limit = 1\n\
                 [realms]\n {realm} = {{\n  kdc = 127.0.0.1:{port}\n }}\n"
            ),
        )?;
        write(
            "kdc.conf",
            format!(
                "[kdcdefaults]\n kdc_listen = 127.0.0.1:{port}\n kdc_tcp_listen = 127.0.0.1:{port}\n\
                 [realms]\n {realm} = {{\n  database_name = {d}/principal\n  key_stash_file = {d}/stash\n  \
                 acl_file = {d}/kadm5.acl\n  max_life = 1h\n  \
                 supported_enctypes = aes256-cts-hmac-sha1-96:normal aes128-cts-hmac-sha1-96:normal\n }}\n\
                 [logging]\n kdc = FILE:{d}/kdc.log\n"
            ),
        )?;
        run(
            &dir,
            "/usr/sbin/kdb5_util",
            &["create", "-s", "-r", realm, "-P", "kmirror-test-master"],
        )?;
        let child = command(&dir, "/usr/sbin/krb5kdc")
            .args(["-n", "-r", realm])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| failed("krb5kdc", e))?;
        let kdc = Kdc {
            dir,
            realm: realm.to_string(),
            port,
            child,
        };
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if t0.elapsed() > Duration::from_secs(20) {
                return Err(failed(
                    "krb5kdc",
                    format!("no listener on 127.0.0.1:{port} within 20 s: {}", kdc.log()),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(kdc)
    }

    fn kadmin(&self, query: &str) -> Result<String, HarnessError> {
        run(
            &self.dir,
            "/usr/sbin/kadmin.local",
            &["-r", &self.realm, "-q", query],
        )
    }

    /// Adds `name` (without realm) with a random key; tickets for or of it live at most
    /// `max_life` (an MIT duration such as "60 seconds") when given.
    pub fn add_principal(&self, name: &str, max_life: Option<&str>) -> Result<(), HarnessError> {
        let life = max_life
            .map(|l| format!("-maxlife \"{l}\" "))
            .unwrap_or_default();
        let out = self.kadmin(&format!("addprinc -randkey {life}{name}"))?;
        if !out.contains("created") {
            return Err(failed(&format!("addprinc {name}"), out));
        }
        Ok(())
    }

    /// Makes `name` need pre-authentication (PA-ENC-TIMESTAMP), as most production realms do:
    /// a client with a wrong key is then refused at once (KDC_ERR_PREAUTH_FAILED).
    pub fn require_preauth(&self, name: &str) -> Result<(), HarnessError> {
        self.kadmin(&format!("modprinc +requires_preauth {name}"))?;
        Ok(())
    }

    /// Writes new keys of `principals` into `file` in the KDC's directory (appended when the
    /// file exists, as `ktadd` does). MIT's `ktadd` makes new keys: a keytab written before for
    /// the same principal is stale.
    pub fn keytab(&self, file: &str, principals: &[&str]) -> Result<PathBuf, HarnessError> {
        let path = self.dir.join(file);
        for p in principals {
            self.kadmin(&format!("ktadd -k {} {p}", path.display()))?;
        }
        Ok(path)
    }

    pub fn realm(&self) -> &str {
        &self.realm
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The client configuration naming this KDC (for kmirror and the brokers' JVMs).
    pub fn krb5_conf(&self) -> PathBuf {
        self.dir.join("krb5.conf")
    }

    /// The KDC's log: one line per AS and TGS request, with the principals and the outcome.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("kdc.log")).unwrap_or_default()
    }
}

fn command(dir: &Path, tool: &str) -> Command {
    let mut c = Command::new(tool);
    c.env("KRB5_CONFIG", dir.join("krb5.conf"))
        .env("KRB5_KDC_PROFILE", dir.join("kdc.conf"))
        .stdin(Stdio::null());
    c
}

fn run(dir: &Path, tool: &str, args: &[&str]) -> Result<String, HarnessError> {
    let out = command(dir, tool)
        .args(args)
        .output()
        .map_err(|e| failed(tool, e))?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(failed(&format!("{tool} {args:?}"), text));
    }
    Ok(text)
}

impl Drop for Kdc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
