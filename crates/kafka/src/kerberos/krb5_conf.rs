//! Reads the parts of an MIT `krb5.conf` a Kerberos client needs: the default realm and each
//! realm's KDCs (docs/configuration.md, "Kerberos (GSSAPI)"). The file is MIT's profile format:
//! `[section]` headers, `name = value` relations, `name = { ... }` subsections, `#`/`;`
//! comments, and `include FILE` / `includedir DIR` lines at the start of a line. Everything
//! else in it (enctype lists, domain_realm, plugins) is read past, not applied.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The default KDC port (RFC 4120 §7.2.3).
pub const KDC_PORT: u16 = 88;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Krb5Conf {
    pub default_realm: Option<String>,
    /// Realm name → its `kdc` entries as written (`host`, `host:port`, `[v6]:port`).
    pub kdcs: BTreeMap<String, Vec<String>>,
}

impl Krb5Conf {
    /// Reads `path` and the files it includes. Errors name the file and line.
    pub fn load(path: &Path) -> Result<Krb5Conf, String> {
        let mut conf = Krb5Conf::default();
        conf.read_file(path, 0)?;
        Ok(conf)
    }

    fn read_file(&mut self, path: &Path, depth: u8) -> Result<(), String> {
        if depth > 8 {
            return Err(format!("{}: includes nest deeper than 8", path.display()));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read krb5.conf {}: {e}", path.display()))?;
        self.read_text(&text, path, depth)
    }

    /// Parses one file's text; `path` names it in errors and anchors nothing else.
    pub fn read_text(&mut self, text: &str, path: &Path, depth: u8) -> Result<(), String> {
        let mut section = String::new();
        // The open subsections, outermost first: (name, realm it belongs to if in [realms]).
        let mut open: Vec<String> = Vec::new();
        for (n, raw) in text.lines().enumerate() {
            let at = || format!("{} line {}", path.display(), n + 1);
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            if let Some(file) = line.strip_prefix("include ") {
                self.read_file(&PathBuf::from(file.trim()), depth + 1)?;
                continue;
            }
            if let Some(dir) = line.strip_prefix("includedir ") {
                self.read_dir(Path::new(dir.trim()), depth + 1)?;
                continue;
            }
            // A plugin module directive: nothing kmirror reads.
            if line.starts_with("module ") {
                continue;
            }
            if line.starts_with('[') {
                let name = line
                    .strip_prefix('[')
                    .and_then(|l| l.split(']').next())
                    .ok_or_else(|| format!("{}: a section header without ']'", at()))?;
                section = name.trim().to_string();
                open.clear();
                continue;
            }
            if line.starts_with('}') {
                if open.pop().is_none() {
                    return Err(format!("{}: '}}' closes no subsection", at()));
                }
                continue;
            }
            let Some((name, value)) = line.split_once('=') else {
                return Err(format!("{}: expected name = value", at()));
            };
            let name = name.trim();
            let value = value.trim();
            if value == "{" {
                open.push(name.to_string());
                continue;
            }
            let value = value.trim_end_matches('*').trim().trim_matches('"');
            match (section.as_str(), open.as_slice()) {
                // MIT takes a relation's first value.
                ("libdefaults", []) if name == "default_realm" => {
                    self.default_realm.get_or_insert_with(|| value.to_string());
                }
                ("realms", [realm]) if name == "kdc" => self
                    .kdcs
                    .entry(realm.clone())
                    .or_default()
                    .push(value.to_string()),
                _ => {}
            }
        }
        if !open.is_empty() {
            return Err(format!(
                "{}: a subsection is not closed with '}}'",
                path.display()
            ));
        }
        Ok(())
    }

    /// MIT reads the files in an included directory whose names are only letters, digits,
    /// '-' and '_', or that end in ".conf", in name order.
    fn read_dir(&mut self, dir: &Path, depth: u8) -> Result<(), String> {
        let entries = std::fs::read_dir(dir)
            .map_err(|e| format!("cannot read includedir {}: {e}", dir.display()))?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                name.ends_with(".conf")
                    || (!name.is_empty()
                        && name
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            })
            .collect();
        files.sort();
        for f in files {
            self.read_file(&f, depth)?;
        }
        Ok(())
    }

    /// The KDC addresses of `realm` as `(host, port)`, in file order.
    pub fn kdcs_of(&self, realm: &str) -> Result<Vec<(String, u16)>, String> {
        let list = self
            .kdcs
            .get(realm)
            .filter(|l| !l.is_empty())
            .ok_or_else(|| {
                format!("names no kdc for realm {realm} (kmirror does not look KDCs up in DNS)")
            })?;
        list.iter().map(|k| kdc_address(k)).collect()
    }
}

/// `host`, `host:port`, `[v6]`, `[v6]:port`, optionally with MIT's `tcp/` prefix.
fn kdc_address(entry: &str) -> Result<(String, u16), String> {
    let e = entry.strip_prefix("tcp/").unwrap_or(entry);
    if e.starts_with("udp/") || e.contains("://") {
        return Err(format!(
            "kdc {entry}: kmirror talks to KDCs over TCP only; write host or host:port"
        ));
    }
    let (host, port) = if let Some(rest) = e.strip_prefix('[') {
        let (h, tail) = rest
            .split_once(']')
            .ok_or_else(|| format!("kdc {entry}: '[' without ']'"))?;
        (h, tail.strip_prefix(':'))
    } else {
        match e.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (e, None),
        }
    };
    let port = match port {
        None => KDC_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| format!("kdc {entry}: the port must be a number from 1 to 65535"))?,
    };
    if host.is_empty() {
        return Err(format!("kdc {entry}: no host"));
    }
    Ok((host.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEBIAN_LIKE: &str = "\
# a comment
module /usr/lib/plugin.so:residual
[libdefaults]
    default_realm = EXAMPLE.COM
    default_realm = IGNORED.COM
    dns_lookup_kdc = false
    ticket_lifetime = 24h
[realms]
    EXAMPLE.COM = {
        kdc = kdc1.example.com
        kdc = kdc2.example.com:750
        admin_server = kdc1.example.com
        v4_name_convert = {
            host = {
                rcmd = host
            }
        }
    }
    V6.TEST = {
        kdc = [::1]:8888 *
    }
[domain_realm]
    .example.com = EXAMPLE.COM
";

    #[test]
    fn realms_and_their_kdcs_are_read_and_nested_subsections_skipped() {
        let mut c = Krb5Conf::default();
        c.read_text(DEBIAN_LIKE, Path::new("krb5.conf"), 0).unwrap();
        assert_eq!(c.default_realm.as_deref(), Some("EXAMPLE.COM"));
        assert_eq!(
            c.kdcs_of("EXAMPLE.COM").unwrap(),
            vec![
                ("kdc1.example.com".to_string(), 88),
                ("kdc2.example.com".to_string(), 750)
            ]
        );
        assert_eq!(
            c.kdcs_of("V6.TEST").unwrap(),
            vec![("::1".to_string(), 8888)]
        );
        let e = c.kdcs_of("OTHER.TEST").unwrap_err();
        assert!(e.contains("no kdc for realm OTHER.TEST"), "{e}");
    }

    #[test]
    fn broken_files_are_named_with_their_line() {
        let mut c = Krb5Conf::default();
        let e = c
            .read_text("[realms]\n R = {\n kdc\n", Path::new("/etc/k.conf"), 0)
            .unwrap_err();
        assert_eq!(e, "/etc/k.conf line 3: expected name = value");
        let e = c
            .read_text("[realms]\n R = {\n kdc = a\n", Path::new("k"), 0)
            .unwrap_err();
        assert!(e.contains("not closed"), "{e}");
        assert!(kdc_address("udp/kdc").unwrap_err().contains("TCP only"));
        assert!(kdc_address("kdc:0").unwrap_err().contains("port"));
        assert_eq!(kdc_address("tcp/kdc:99").unwrap(), ("kdc".to_string(), 99));
    }

    #[test]
    fn included_files_and_directories_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("krb5.conf.d");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(
            d.join("realm.conf"),
            "[realms]\nR.TEST = {\nkdc = 127.0.0.1:1088\n}\n",
        )
        .unwrap();
        std::fs::write(
            d.join("skipped.rpmsave"),
            "[libdefaults]\ndefault_realm = NO\n",
        )
        .unwrap();
        let main = dir.path().join("krb5.conf");
        std::fs::write(
            &main,
            format!(
                "includedir {}\n[libdefaults]\ndefault_realm = R.TEST\n",
                d.display()
            ),
        )
        .unwrap();
        let c = Krb5Conf::load(&main).unwrap();
        assert_eq!(c.default_realm.as_deref(), Some("R.TEST"));
        assert_eq!(
            c.kdcs_of("R.TEST").unwrap(),
            vec![("127.0.0.1".to_string(), 1088)]
        );
        let e = Krb5Conf::load(&dir.path().join("absent")).unwrap_err();
        assert!(
            e.contains("cannot read krb5.conf") && e.contains("absent"),
            "{e}"
        );
    }
}
