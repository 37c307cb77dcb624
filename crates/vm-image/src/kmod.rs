//! Kernel modules of the guest: an index of a kernel's `.ko` files and the load order of
//! a module set with its dependencies, read from each module's `.modinfo` ELF section.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Every module under a kernel's module folder, by name (`-` written as `_`).
pub struct Index {
    modules: BTreeMap<String, PathBuf>,
}

/// A module's name as the kernel spells it in `depends=`.
fn norm(name: &str) -> String {
    name.trim_end_matches(".xz")
        .trim_end_matches(".ko")
        .replace('-', "_")
}

/// Why a module, or the order of a set of them, could not be read.
#[derive(Debug, thiserror::Error)]
pub enum KmodError {
    #[error("cannot run xz for {}: {source}", .path.display())]
    Xz {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("xz -dc {}: {stderr}", .path.display())]
    XzFailed { path: PathBuf, stderr: String },
    #[error("{}: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("module {0} is not in the kernel package")]
    NotInPackage(String),
    #[error("module dependencies loop at {0}")]
    Loop(String),
    #[error("{}: {source}", .path.display())]
    NoModinfo { path: PathBuf, source: NoModinfo },
}

/// A file with no `.modinfo` section: no kernel module of this architecture.
#[derive(Debug, thiserror::Error)]
#[error("no .modinfo section (not a 64-bit kernel module?)")]
pub struct NoModinfo;

/// A module file's contents, decompressed when it is a `.ko.xz` (by `xz`, which every
/// Debian system has).
pub fn read(path: &Path) -> Result<Vec<u8>, KmodError> {
    if path.extension().is_some_and(|x| x == "xz") {
        let out = std::process::Command::new("xz")
            .arg("-dc")
            .arg(path)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|source| KmodError::Xz {
                path: path.to_path_buf(),
                source,
            })?;
        if !out.status.success() {
            return Err(KmodError::XzFailed {
                path: path.to_path_buf(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        return Ok(out.stdout);
    }
    std::fs::read(path).map_err(|source| KmodError::Read {
        path: path.to_path_buf(),
        source,
    })
}

impl Index {
    pub fn scan(dir: &Path) -> std::io::Result<Index> {
        let mut modules = BTreeMap::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d)? {
                let p = e?.path();
                if p.is_dir() {
                    stack.push(p);
                } else if let Some(n) = p.file_name().and_then(|n| n.to_str())
                    && (n.ends_with(".ko") || n.ends_with(".ko.xz"))
                {
                    modules.insert(norm(n), p.clone());
                }
            }
        }
        Ok(Index { modules })
    }

    /// Whether the package holds this module (else it is built in, or absent).
    pub fn has(&self, name: &str) -> bool {
        self.modules.contains_key(&norm(name))
    }

    /// `wanted` and everything they depend on, dependencies first.
    pub fn load_order(&self, wanted: &[&str]) -> Result<Vec<PathBuf>, KmodError> {
        let mut order: Vec<String> = Vec::new();
        for w in wanted {
            self.visit(&norm(w), &mut order, 0)?;
        }
        order
            .iter()
            .map(|m| {
                self.modules
                    .get(m)
                    .cloned()
                    .ok_or_else(|| KmodError::NotInPackage(m.clone()))
            })
            .collect()
    }

    fn visit(&self, name: &str, order: &mut Vec<String>, depth: usize) -> Result<(), KmodError> {
        if order.iter().any(|o| o == name) {
            return Ok(());
        }
        if depth > 64 {
            return Err(KmodError::Loop(name.to_string()));
        }
        let path = self
            .modules
            .get(name)
            .ok_or_else(|| KmodError::NotInPackage(name.to_string()))?;
        let data = read(path)?;
        let deps = depends(&data).map_err(|source| KmodError::NoModinfo {
            path: path.clone(),
            source,
        })?;
        for dep in deps {
            self.visit(&dep, order, depth + 1)?;
        }
        if !order.iter().any(|o| o == name) {
            order.push(name.to_string());
        }
        Ok(())
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The `.modinfo` section of a 64-bit little-endian ELF object.
fn modinfo(elf: &[u8]) -> Option<&[u8]> {
    if elf.get(..4)? != b"\x7fELF" || elf.get(4)? != &2 || elf.get(5)? != &1 {
        return None;
    }
    let shoff = u64_at(elf, 0x28)? as usize;
    let shentsize = u16_at(elf, 0x3a)? as usize;
    let shnum = u16_at(elf, 0x3c)? as usize;
    let shstrndx = u16_at(elf, 0x3e)? as usize;
    let section = |i: usize| -> Option<(u32, usize, usize)> {
        let h = shoff + i * shentsize;
        Some((
            u32_at(elf, h)?,
            u64_at(elf, h + 0x18)? as usize,
            u64_at(elf, h + 0x20)? as usize,
        ))
    };
    let (_, stroff, strsize) = section(shstrndx)?;
    let strtab = elf.get(stroff..stroff + strsize)?;
    (0..shnum).find_map(|i| {
        let (name, off, size) = section(i)?;
        let rest = strtab.get(name as usize..)?;
        let end = rest.iter().position(|&c| c == 0)?;
        (&rest[..end] == b".modinfo")
            .then(|| elf.get(off..off + size))
            .flatten()
    })
}

/// The modules a `.ko` depends on (its `depends=` line).
pub fn depends(elf: &[u8]) -> Result<Vec<String>, NoModinfo> {
    let info = modinfo(elf).ok_or(NoModinfo)?;
    Ok(info
        .split(|&c| c == 0)
        .filter_map(|kv| kv.strip_prefix(b"depends="))
        .flat_map(|v| {
            String::from_utf8_lossy(v)
                .split(',')
                .filter(|s| !s.is_empty())
                .map(norm)
                .collect::<Vec<_>>()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 image with a `.modinfo` section, laid out as the kernel's are.
    fn fake_ko(modinfo: &[u8]) -> Vec<u8> {
        let shstr = b"\0.modinfo\0.shstrtab\0";
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        let info_off = elf.len();
        elf.extend_from_slice(modinfo);
        let str_off = elf.len();
        elf.extend_from_slice(shstr);
        let shoff = elf.len();
        let mut sh = |name: u32, off: usize, size: usize| {
            let mut h = vec![0u8; 64];
            h[..4].copy_from_slice(&name.to_le_bytes());
            h[0x18..0x20].copy_from_slice(&(off as u64).to_le_bytes());
            h[0x20..0x28].copy_from_slice(&(size as u64).to_le_bytes());
            elf.extend_from_slice(&h);
        };
        sh(0, 0, 0);
        sh(1, info_off, modinfo.len());
        sh(10, str_off, shstr.len());
        elf[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        elf[0x3e..0x40].copy_from_slice(&2u16.to_le_bytes());
        elf
    }

    #[test]
    fn reads_depends_from_modinfo() {
        let ko =
            fake_ko(b"license=GPL\0depends=ib_core,ip6_udp_tunnel,udp-tunnel\0name=rdma_rxe\0");
        assert_eq!(
            depends(&ko).unwrap(),
            vec!["ib_core", "ip6_udp_tunnel", "udp_tunnel"]
        );
        assert_eq!(
            depends(&fake_ko(b"depends=\0")).unwrap(),
            Vec::<String>::new()
        );
        assert!(depends(b"not an elf").is_err());
    }

    #[test]
    fn orders_dependencies_first() {
        let dir = std::env::temp_dir().join(format!("iblab-kmod-test-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("a.ko"), fake_ko(b"depends=b,c-d\0")).unwrap();
        std::fs::write(dir.join("sub/b.ko"), fake_ko(b"depends=c_d\0")).unwrap();
        std::fs::write(dir.join("sub/c-d.ko"), fake_ko(b"depends=\0")).unwrap();
        let idx = Index::scan(&dir).unwrap();
        let order: Vec<String> = idx
            .load_order(&["a"])
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(order, vec!["c-d.ko", "b.ko", "a.ko"]);
        assert!(idx.load_order(&["missing"]).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
