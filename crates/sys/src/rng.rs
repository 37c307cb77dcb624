//! The kernel's random number generator, rekeyed on demand: a guest restored from a
//! snapshot holds the generator state of the boot that was saved, shared by every run.

use std::io::Write;
use std::os::fd::AsRawFd;

/// Mix `seed` into the kernel's input pool and have it rekey its generator from the pool
/// at once (`RNDRESEEDCRNG`, needs CAP_SYS_ADMIN), so that what it draws from now on
/// depends on the seed.
pub fn reseed(seed: &[u8]) -> Result<(), ReseedError> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/urandom")
        .map_err(ReseedError::Open)?;
    f.write_all(seed).map_err(ReseedError::Write)?;
    // _IO('R', 0x07), linux/random.h.
    const RNDRESEEDCRNG: nix::libc::Ioctl = 0x5207;
    // SAFETY: an ioctl without an argument, on a file descriptor this function owns and
    // keeps open across the call.
    let r = unsafe { nix::libc::ioctl(f.as_raw_fd(), RNDRESEEDCRNG) };
    if r != 0 {
        return Err(ReseedError::Rekey(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Why the generator could not be reseeded.
#[derive(Debug, thiserror::Error)]
pub enum ReseedError {
    #[error("/dev/urandom: {0}")]
    Open(#[source] std::io::Error),
    #[error("cannot write the seed to /dev/urandom: {0}")]
    Write(#[source] std::io::Error),
    /// The kernel refused to rekey (no CAP_SYS_ADMIN, or a kernel without the ioctl).
    #[error("RNDRESEEDCRNG: {0}")]
    Rekey(#[source] std::io::Error),
}
