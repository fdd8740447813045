//! The few system calls aya 0.14 does not expose: creating a cgroup BPF link that we can pin
//! (aya keeps its cgroup links private, so they die with the process, which would defeat
//! fail-static routing), and pinning it; the batch update of an array map (many entries in one
//! call: a recompute writes thousands); the shared mapping of an mmapable array map (aya
//! 0.14 does not map one), worked on with atomics. Also mount-table helpers, and the kernel
//! programs' clock.
#![allow(
    unsafe_code,
    reason = "raw bpf(2), mmap(2), mount(2) and clock_gettime(2) calls that aya and std do not expose"
)]

use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
};

const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;

/// `enum bpf_attach_type` values used by ailb.
pub(crate) const BPF_CGROUP_SOCK_OPS: u32 = 3;
pub(crate) const BPF_CGROUP_INET4_CONNECT: u32 = 10;
pub(crate) const BPF_CGROUP_INET6_CONNECT: u32 = 11;
pub(crate) const BPF_CGROUP_SETSOCKOPT: u32 = 22;

/// A zeroed `union bpf_attr` large enough for every command used here; the kernel accepts a
/// larger buffer as long as the bytes it does not know are zero.
#[repr(C, align(8))]
struct Attr([u8; 160]);

fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a valid, writable buffer of the size we pass; the kernel reads (and
    // for some commands writes) at most that many bytes.
    let ret = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.0.as_mut_ptr(), attr.0.len() as libc::c_uint) };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `BPF_LINK_CREATE` for a cgroup attach type.
pub(crate) fn link_create(prog: BorrowedFd<'_>, cgroup: BorrowedFd<'_>, attach_type: u32) -> io::Result<OwnedFd> {
    let mut attr = Attr([0; 160]);
    attr.0[0..4].copy_from_slice(&(prog.as_raw_fd() as u32).to_ne_bytes());
    attr.0[4..8].copy_from_slice(&(cgroup.as_raw_fd() as u32).to_ne_bytes());
    attr.0[8..12].copy_from_slice(&attach_type.to_ne_bytes());
    let fd = bpf(BPF_LINK_CREATE, &mut attr)?;
    // SAFETY: on success BPF_LINK_CREATE returns a new file descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `BPF_OBJ_PIN`: pins a map, program or link fd at `path` (in bpffs).
pub(crate) fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut attr = Attr([0; 160]);
    attr.0[0..8].copy_from_slice(&(c.as_ptr() as u64).to_ne_bytes());
    attr.0[8..12].copy_from_slice(&(fd.as_raw_fd() as u32).to_ne_bytes());
    bpf(BPF_OBJ_PIN, &mut attr)?;
    Ok(())
}

/// `BPF_MAP_UPDATE_BATCH` of an array map: entry `keys[k]` becomes `values[k]` (`V` is the
/// map's value type, so the kernel's value size). The kernel writes the entries in order, each
/// as one update would, and stops at the first it refuses; an error means some may be written,
/// so the caller writes them again one by one (each write is idempotent) to learn which.
pub(crate) fn map_update_batch<V: aya::Pod>(map: BorrowedFd<'_>, keys: &[u32], values: &[V]) -> io::Result<()> {
    if keys.len() != values.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "a batch needs one value per key"));
    }
    if keys.is_empty() {
        return Ok(());
    }
    let count = u32::try_from(keys.len()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut attr = Attr([0; 160]);
    // struct { in_batch, out_batch, keys, values: u64; count, map_fd: u32; elem_flags, flags: u64 }
    attr.0[16..24].copy_from_slice(&(keys.as_ptr() as u64).to_ne_bytes());
    attr.0[24..32].copy_from_slice(&(values.as_ptr() as u64).to_ne_bytes());
    attr.0[32..36].copy_from_slice(&count.to_ne_bytes());
    attr.0[36..40].copy_from_slice(&(map.as_raw_fd() as u32).to_ne_bytes());
    // The kernel reads `count` keys of 4 bytes and `count` values of `size_of::<V>()` bytes from
    // the two slices, which outlive the call; `V: Pod` has no padding it could read uninitialised.
    bpf(BPF_MAP_UPDATE_BATCH, &mut attr)?;
    Ok(())
}

/// `CLOCK_MONOTONIC` in ns: the clock of `bpf_ktime_get_ns()`, so that what the daemon stamps
/// and what `ailb explain` computes compare with what the programs read.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the valid timespec passed.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Mount points of a filesystem type, from `/proc/mounts`.
pub(crate) fn mounts_of(fstype: &str) -> io::Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string("/proc/mounts")?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_dev, dir, ty) = (f.next()?, f.next()?, f.next()?);
            (ty == fstype).then(|| PathBuf::from(dir.replace("\\040", " ")))
        })
        .collect())
}

/// `mount -t bpf bpf /sys/fs/bpf`.
pub(crate) fn mount_bpffs(at: &Path) -> io::Result<()> {
    let target = CString::new(at.as_os_str().as_bytes()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let src = c"bpf";
    // SAFETY: all pointers are valid NUL-terminated strings for the duration of the call.
    let r = unsafe { libc::mount(src.as_ptr(), target.as_ptr(), src.as_ptr(), 0, std::ptr::null()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// An mmapable array map's values mapped shared, as `u64` words read and written only
/// atomically (the kernel's programs write the same words).
pub(crate) struct SharedWords {
    words: std::ptr::NonNull<std::sync::atomic::AtomicU64>,
    len: usize,
    mapped: usize,
}

// SAFETY: the mapping is shared memory reached only through atomics; it lives until drop.
unsafe impl Send for SharedWords {}
// SAFETY: as above.
unsafe impl Sync for SharedWords {}

impl SharedWords {
    /// Maps the first `bytes` bytes of the values of the mmapable array map `map` (at most
    /// its entries times its value size).
    pub(crate) fn map(map: BorrowedFd<'_>, bytes: usize) -> io::Result<Self> {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1);
        let mapped = bytes.div_ceil(page).max(1) * page;
        // SAFETY: a new shared mapping of the map's values from offset 0, which the kernel
        // allows up to their size rounded up to pages; it aliases no Rust object.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let words = std::ptr::NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self { words, len: bytes / 8, mapped })
    }

    /// Words mapped.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Word `i`; panics out of bounds.
    pub(crate) fn word(&self, i: usize) -> &std::sync::atomic::AtomicU64 {
        assert!(i < self.len, "word {i} of {}", self.len);
        // SAFETY: in bounds (checked), 8-byte aligned (the mapping is page-aligned), valid
        // while `self` lives, and every access to the shared words is atomic.
        unsafe { &*self.words.as_ptr().add(i) }
    }
}

impl Drop for SharedWords {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, of that length; no reference to it outlives
        // `self` (`word` borrows `self`).
        unsafe { libc::munmap(self.words.as_ptr().cast(), self.mapped) };
    }
}
