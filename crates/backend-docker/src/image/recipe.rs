//! What goes into the lab image: the Debian packages, the suite, and the mirror taken from
//! this host's apt sources; and a hash of all that, which names the cached rootfs.

use sha2::{Digest, Sha256};

/// The tools every fabric needs, as Debian packages (the lab image's, shared with the kube
/// backend that runs it).
pub use iblab_core::images::{LAB_MINBASE as MINBASE, LAB_PACKAGES as PACKAGES};

/// Used when the host is not Debian or its apt sources name no usable mirror.
pub const FALLBACK_SUITE: &str = "bookworm";
pub const FALLBACK_MIRROR: &str = "http://deb.debian.org/debian";

/// Bumped when the way a rootfs is made changes (what is pruned, how it is packed).
const FORMAT: u32 = 1;

/// A debootstrap recipe.
#[derive(Debug, Clone, PartialEq)]
pub struct Recipe {
    pub suite: String,
    pub mirror: String,
    pub packages: Vec<String>,
}

impl Recipe {
    /// The recipe for this host: its Debian suite and mirror (overridable).
    pub fn for_host(suite: Option<&str>, mirror: Option<&str>) -> Recipe {
        let os = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
        let host_suite = debian_codename(&os);
        let suite = suite
            .map(str::to_string)
            .or(host_suite.clone())
            .unwrap_or_else(|| FALLBACK_SUITE.to_string());
        let mirror = mirror.map(str::to_string).or_else(|| {
            // The host's mirror only serves the host's suite for sure.
            (host_suite.as_deref() == Some(suite.as_str()))
                .then(|| mirror_for(&host_sources(), &suite))
                .flatten()
        });
        Recipe {
            suite,
            mirror: mirror.unwrap_or_else(|| FALLBACK_MIRROR.to_string()),
            packages: PACKAGES.iter().map(|p| p.to_string()).collect(),
        }
    }

    /// A stable hash of everything that decides the rootfs (hex sha256).
    pub fn hash(&self) -> String {
        let mut pkgs = self.packages.clone();
        pkgs.sort();
        let text = format!(
            "format={FORMAT}\nvariant=debootstrap-minbase\nsuite={}\nmirror={}\npackages={}\n",
            self.suite,
            self.mirror.trim_end_matches('/'),
            pkgs.join(",")
        );
        hex(&Sha256::digest(text.as_bytes()))
    }
}

/// Lower-case hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `VERSION_CODENAME` from os-release text, when the system is Debian.
pub fn debian_codename(os_release: &str) -> Option<String> {
    let field = |k: &str| {
        os_release.lines().find_map(|l| {
            l.strip_prefix(k)
                .and_then(|r| r.strip_prefix('='))
                .map(|v| v.trim().trim_matches('"').to_string())
        })
    };
    (field("ID").as_deref() == Some("debian"))
        .then(|| field("VERSION_CODENAME"))
        .flatten()
        .filter(|c| !c.is_empty())
}

/// One apt source: a `deb` line or a deb822 stanza.
#[derive(Debug, Clone, PartialEq)]
pub struct AptSource {
    pub uris: Vec<String>,
    pub suites: Vec<String>,
    pub components: Vec<String>,
}

/// Sources from one-line `sources.list` text (`deb [opts] URI SUITE COMPONENT…`).
pub fn parse_one_line(text: &str) -> Vec<AptSource> {
    text.lines()
        .filter_map(|l| {
            let l = l.split('#').next()?.trim();
            let rest = l.strip_prefix("deb ")?.trim_start();
            let rest = match rest.strip_prefix('[') {
                Some(r) => r.split_once(']')?.1.trim_start(),
                None => rest,
            };
            let mut words = rest.split_whitespace();
            let uri = words.next()?.to_string();
            let suite = words.next()?.to_string();
            Some(AptSource {
                uris: vec![uri],
                suites: vec![suite],
                components: words.map(str::to_string).collect(),
            })
        })
        .collect()
}

/// Sources from deb822 `.sources` text (stanzas of `Types:`, `URIs:`, `Suites:`, …).
pub fn parse_deb822(text: &str) -> Vec<AptSource> {
    let mut out = Vec::new();
    for stanza in text.split("\n\n") {
        let mut field = std::collections::HashMap::new();
        for l in stanza.lines() {
            if l.trim_start().starts_with('#') || l.starts_with(' ') || l.starts_with('\t') {
                continue;
            }
            if let Some((k, v)) = l.split_once(':') {
                field.insert(k.trim().to_lowercase(), v.trim().to_string());
            }
        }
        let words = |k: &str| -> Vec<String> {
            field
                .get(k)
                .map(|v| v.split_whitespace().map(str::to_string).collect())
                .unwrap_or_default()
        };
        let enabled = field.get("enabled").is_none_or(|v| v != "no");
        if enabled && words("types").iter().any(|t| t == "deb") && !words("uris").is_empty() {
            out.push(AptSource {
                uris: words("uris"),
                suites: words("suites"),
                components: words("components"),
            });
        }
    }
    out
}

/// This host's apt sources (sources.list, sources.list.d/*.list and *.sources).
pub fn host_sources() -> Vec<AptSource> {
    let mut out = Vec::new();
    if let Ok(t) = std::fs::read_to_string("/etc/apt/sources.list") {
        out.extend(parse_one_line(&t));
    }
    let mut files: Vec<_> = std::fs::read_dir("/etc/apt/sources.list.d")
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    for f in files {
        let Ok(t) = std::fs::read_to_string(&f) else {
            continue;
        };
        match f.extension().and_then(|e| e.to_str()) {
            Some("list") => out.extend(parse_one_line(&t)),
            Some("sources") => out.extend(parse_deb822(&t)),
            _ => {}
        }
    }
    out
}

/// The first http(s) mirror that serves `suite` with component `main`.
pub fn mirror_for(sources: &[AptSource], suite: &str) -> Option<String> {
    sources
        .iter()
        .filter(|s| s.suites.iter().any(|x| x == suite))
        .filter(|s| s.components.iter().any(|c| c == "main"))
        .flat_map(|s| s.uris.iter())
        .find(|u| u.starts_with("http://") || u.starts_with("https://"))
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    // This machine's /etc/apt/sources.list.d/debian.sources, as captured.
    const DEB822: &str = "Types: deb\n# http://snapshot.debian.org/archive/debian/20250520T000000Z\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\nTypes: deb\n# http://snapshot.debian.org/archive/debian-security/20250520T000000Z\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n";

    #[test]
    fn mirror_from_deb822() {
        let s = parse_deb822(DEB822);
        assert_eq!(s.len(), 2);
        assert_eq!(
            mirror_for(&s, "bookworm").as_deref(),
            Some("http://deb.debian.org/debian")
        );
        assert_eq!(
            mirror_for(&s, "bookworm-security").as_deref(),
            Some("http://deb.debian.org/debian-security")
        );
        assert_eq!(mirror_for(&s, "trixie"), None);
    }

    #[test]
    fn mirror_from_one_line() {
        let text = "# comment\ndeb [arch=amd64 signed-by=/k.gpg] http://ftp.de.debian.org/debian bookworm main contrib\ndeb-src http://x/debian bookworm main\ndeb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n";
        let s = parse_one_line(text);
        assert_eq!(s.len(), 2);
        assert_eq!(
            mirror_for(&s, "bookworm").as_deref(),
            Some("http://ftp.de.debian.org/debian")
        );
    }

    #[test]
    fn codename_only_on_debian() {
        let deb = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\nVERSION_CODENAME=bookworm\n";
        assert_eq!(debian_codename(deb).as_deref(), Some("bookworm"));
        let ubuntu = "ID=ubuntu\nVERSION_CODENAME=noble\n";
        assert_eq!(debian_codename(ubuntu), None);
    }

    #[test]
    fn recipe_hash_is_stable_and_order_free() {
        let a = Recipe {
            suite: "bookworm".into(),
            mirror: "http://deb.debian.org/debian/".into(),
            packages: vec!["b".into(), "a".into()],
        };
        let mut b = a.clone();
        b.packages.reverse();
        b.mirror = "http://deb.debian.org/debian".into();
        assert_eq!(a.hash(), b.hash());
        assert_eq!(a.hash().len(), 64);
        b.suite = "trixie".into();
        assert_ne!(a.hash(), b.hash());
    }
}
