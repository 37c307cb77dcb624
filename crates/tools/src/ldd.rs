//! ldd(1): the shared libraries a dynamic executable loads (for the quick lab image).

use std::path::PathBuf;

/// What ldd said about one executable.
#[derive(Debug, Default, PartialEq)]
pub struct Closure {
    /// Absolute paths of the libraries and the dynamic loader.
    pub libraries: Vec<PathBuf>,
    /// Sonames ldd could not find (`libx.so => not found`).
    pub missing: Vec<String>,
}

/// Parse ldd's output. Static executables ("not a dynamic executable") give an empty closure.
pub fn parse(text: &str) -> Closure {
    let mut c = Closure::default();
    for line in text.lines().map(str::trim) {
        if let Some((name, target)) = line.split_once("=>") {
            let target = target.trim();
            if target.starts_with("not found") {
                c.missing.push(name.trim().to_string());
            } else if let Some(path) = target
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/'))
            {
                c.libraries.push(PathBuf::from(path));
            }
        } else if let Some(path) = line
            .split_whitespace()
            .next()
            .filter(|p| p.starts_with('/'))
        {
            // The loader: `/lib64/ld-linux-x86-64.so.2 (0x…)`.
            c.libraries.push(PathBuf::from(path));
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    // `ldd /usr/sbin/ip` on Debian 12, as captured.
    const IP: &str = "\tlinux-vdso.so.1 (0x00007fc9bb7d2000)
\tlibbpf.so.1 => /lib/x86_64-linux-gnu/libbpf.so.1 (0x00007fc9bb66f000)
\tlibelf.so.1 => /lib/x86_64-linux-gnu/libelf.so.1 (0x00007fc9bb654000)
\tlibmnl.so.0 => /lib/x86_64-linux-gnu/libmnl.so.0 (0x00007fc9bb64c000)
\tlibbsd.so.0 => /lib/x86_64-linux-gnu/libbsd.so.0 (0x00007fc9bb636000)
\tlibcap.so.2 => /lib/x86_64-linux-gnu/libcap.so.2 (0x00007fc9bb62a000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007fc9bb446000)
\tlibz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x00007fc9bb427000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007fc9bb7d4000)
\tlibmd.so.0 => /lib/x86_64-linux-gnu/libmd.so.0 (0x00007fc9bb41a000)
";

    #[test]
    fn closure_of_ip() {
        let c = parse(IP);
        assert_eq!(c.libraries.len(), 9);
        assert!(
            c.libraries
                .contains(&PathBuf::from("/lib64/ld-linux-x86-64.so.2"))
        );
        assert!(
            c.libraries
                .contains(&PathBuf::from("/lib/x86_64-linux-gnu/libbpf.so.1"))
        );
        assert!(
            !c.libraries
                .iter()
                .any(|p| p.to_string_lossy().contains("vdso"))
        );
        assert!(c.missing.is_empty());
    }

    #[test]
    fn static_and_missing() {
        assert_eq!(parse("\tnot a dynamic executable\n"), Closure::default());
        let c = parse("\tlibgone.so.3 => not found\n");
        assert_eq!(c.missing, vec!["libgone.so.3".to_string()]);
    }
}
