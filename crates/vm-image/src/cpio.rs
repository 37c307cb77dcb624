//! A cpio "newc" archive writer (the format the Linux kernel unpacks as an initramfs),
//! and a reader that finds one entry in such an archive.

use std::io::{self, Write};

/// Writes entries one after the other; [`Cpio::finish`] adds the trailer.
pub struct Cpio<W: Write> {
    out: W,
    ino: u32,
    written: u64,
}

impl<W: Write> Cpio<W> {
    pub fn new(out: W) -> Cpio<W> {
        Cpio {
            out,
            ino: 1,
            written: 0,
        }
    }

    fn header(&mut self, name: &str, mode: u32, size: usize) -> io::Result<()> {
        let namesize = name.len() + 1;
        let head = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            mode,
            0, // uid
            0, // gid
            1, // nlink
            0, // mtime: fixed, so equal inputs give equal archives
            size,
            0,
            0,
            0,
            0,
            namesize,
            0, // check
        );
        self.ino += 1;
        self.put(head.as_bytes())?;
        self.put(name.as_bytes())?;
        self.put(&[0])?;
        self.pad()
    }

    fn put(&mut self, b: &[u8]) -> io::Result<()> {
        self.out.write_all(b)?;
        self.written += b.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> io::Result<()> {
        let rem = (4 - (self.written % 4) as usize) % 4;
        self.put(&[0u8; 3][..rem])
    }

    /// A folder (`name` without a leading slash, e.g. `usr/bin`).
    pub fn dir(&mut self, name: &str) -> io::Result<()> {
        self.header(name, 0o040755, 0)
    }

    /// A regular file with the given permission bits.
    pub fn file(&mut self, name: &str, perm: u32, data: &[u8]) -> io::Result<()> {
        self.header(name, 0o100000 | (perm & 0o7777), data.len())?;
        self.put(data)?;
        self.pad()
    }

    /// A symbolic link to `target`.
    pub fn symlink(&mut self, name: &str, target: &str) -> io::Result<()> {
        self.header(name, 0o120777, target.len())?;
        self.put(target.as_bytes())?;
        self.pad()
    }

    /// Write the trailer and hand back the writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.header("TRAILER!!!", 0, 0)?;
        // The kernel reads archives in 512-byte blocks; pad so another can follow.
        let rem = (512 - (self.written % 512) as usize) % 512;
        self.put(&vec![0u8; rem])?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// The contents of the first regular entry whose name ends with `suffix`, walking the
/// headers (no copy, no scan of the data).
pub fn find<'a>(archive: &'a [u8], suffix: &str) -> Option<&'a [u8]> {
    let align = |n: usize| n.div_ceil(4) * 4;
    let hex = |b: &[u8]| {
        std::str::from_utf8(b)
            .ok()
            .and_then(|t| usize::from_str_radix(t, 16).ok())
    };
    let mut at = 0usize;
    while at + 110 <= archive.len() {
        let head = &archive[at..at + 110];
        if &head[..6] != b"070701" {
            return None;
        }
        let filesize = hex(&head[54..62])?;
        let namesize = hex(&head[94..102])?;
        let name_end = at + 110 + namesize;
        let name = archive.get(at + 110..name_end.saturating_sub(1))?;
        let data_at = align(name_end);
        let data = archive.get(data_at..data_at + filesize)?;
        if name == b"TRAILER!!!" {
            return None;
        }
        let regular = hex(&head[14..22]).is_some_and(|mode| mode & 0o170000 == 0o100000);
        if regular && name.ends_with(suffix.as_bytes()) && filesize > 0 {
            return Some(data);
        }
        at = align(data_at + filesize);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpio_tool_reads_what_we_write() {
        let mut c = Cpio::new(Vec::new());
        c.dir("bin").unwrap();
        c.file("bin/hello", 0o755, b"#!/bin/sh\necho hi\n").unwrap();
        c.symlink("bin/sh", "busybox").unwrap();
        let bytes = c.finish().unwrap();
        assert_eq!(bytes.len() % 512, 0);
        assert!(bytes.starts_with(b"070701"));
        // Cross-check with GNU cpio when the machine has it.
        if let Ok(mut child) = std::process::Command::new("cpio")
            .args(["-t", "-v"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
        {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(&bytes).unwrap();
            let out = child.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains("bin/hello"), "{text}");
            assert!(text.contains("bin/sh -> busybox"), "{text}");
            assert!(text.contains("drwxr-xr-x"), "{text}");
        }
    }

    #[test]
    fn finds_an_entry_by_the_end_of_its_name() {
        let mut c = Cpio::new(Vec::new());
        c.dir("lib").unwrap();
        c.file("lib/a.ko", 0o644, b"first").unwrap();
        c.file("lib/drivers/rdma_rxe.ko", 0o644, b"\0rxe_net_add\0")
            .unwrap();
        let bytes = c.finish().unwrap();
        assert_eq!(find(&bytes, "/rdma_rxe.ko"), Some(&b"\0rxe_net_add\0"[..]));
        assert_eq!(find(&bytes, "/a.ko"), Some(&b"first"[..]));
        assert_eq!(find(&bytes, "/missing.ko"), None);
        assert_eq!(find(b"not an archive", "x"), None);
    }
}
