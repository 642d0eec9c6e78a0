//! The host's memory, as a limit on what trn2core allocates (not a hardware model).
//!
//! A request whose result cannot fit in the host's memory must be refused with
//! `CapacityError` *before* anything is allocated: Rust aborts the process when an allocation
//! fails, and Linux's overcommit lets a huge allocation succeed only to have the OOM killer end
//! the process when the pages are touched. So every allocation whose size a user controls goes
//! through [`check_alloc`] (the Python binding does the same for the numpy arrays it allocates)
//! or [`zeroed_vec`], which also turns an allocation failure into an error.
//!
//! The limit ([`available_memory`]) is, on Linux, `MemAvailable` from `/proc/meminfo`, lowered to
//! what the process's memory cgroup still allows (v2 `memory.max - memory.current`, v1
//! `memory.limit_in_bytes - memory.usage_in_bytes`, each plus the cgroup's reclaimable inactive
//! file cache). The environment variable `TRN2CORE_HOST_MEMORY` (bytes) replaces it, for tests
//! and for users who want a tighter cap. Elsewhere there is no limit beyond the allocator's own
//! failure. The check is per allocation: two concurrent requests that each fit may together not.

use crate::{Error, Result};

/// Allocations below this size are never checked (reading `/proc` costs microseconds, and a
/// few MiB cannot matter).
pub const CHECK_FROM_BYTES: u64 = 1 << 22;

/// The environment variable that overrides [`available_memory`] (a byte count).
pub const ENV_LIMIT: &str = "TRN2CORE_HOST_MEMORY";

/// Bytes trn2core may still allocate on this host, and where the figure comes from; `None`
/// when unknown.
pub fn available_memory() -> Option<(u64, &'static str)> {
    if let Ok(v) = std::env::var(ENV_LIMIT) {
        if let Ok(n) = v.trim().parse::<u64>() {
            return Some((n, ENV_LIMIT));
        }
    }
    let meminfo = meminfo_available().map(|b| (b, "MemAvailable"));
    let cgroup = cgroup_available().map(|b| (b, "the memory cgroup's limit"));
    match (meminfo, cgroup) {
        (Some(m), Some(c)) => Some(if c.0 < m.0 { c } else { m }),
        (m, c) => m.or(c),
    }
}

/// `Ok` if `bytes` more can be allocated, else a `CapacityError` on `arg` that says what the
/// allocation was for (`what`, e.g. "the 1048576 x 1048576 float32 result"), its size and the
/// limit.
pub fn check_alloc(arg: &str, what: &str, bytes: u128) -> Result<()> {
    if bytes > usize::MAX as u128 / 2 {
        return Err(Error::capacity(
            arg,
            format!(
                "{what} needs {} ({bytes} bytes), more than this host's address space",
                human(bytes)
            ),
        ));
    }
    if bytes < CHECK_FROM_BYTES as u128 {
        return Ok(());
    }
    match available_memory() {
        Some((avail, source)) if bytes > avail as u128 => Err(Error::capacity(
            arg,
            format!(
                "{what} needs {} ({bytes} bytes) but this host has {} available ({source}); \
                 nothing was allocated",
                human(bytes),
                human(avail as u128)
            ),
        )),
        _ => Ok(()),
    }
}

/// Element types whose all-zero bit pattern is a valid value (0, +0.0).
pub trait Zeroable: Copy + Send + Sync + 'static {}
impl Zeroable for u8 {}
impl Zeroable for u16 {}
impl Zeroable for u32 {}
impl Zeroable for u64 {}
impl Zeroable for usize {}
impl Zeroable for i8 {}
impl Zeroable for i16 {}
impl Zeroable for i32 {}
impl Zeroable for i64 {}
impl Zeroable for f32 {}
impl Zeroable for f64 {}
impl Zeroable for bool {}

/// `len` zeros, after [`check_alloc`]; an allocation failure is a `CapacityError` too, never
/// an abort. The memory comes zeroed from the allocator (fresh pages for large sizes), so
/// nothing touches it before the caller's parallel kernels do.
pub fn zeroed_vec<T: Zeroable>(arg: &str, what: &str, len: usize) -> Result<Vec<T>> {
    let bytes = len as u128 * std::mem::size_of::<T>() as u128;
    check_alloc(arg, what, bytes)?;
    let fail = || {
        Error::capacity(
            arg,
            format!(
                "{what}: the allocator refused {} ({bytes} bytes)",
                human(bytes)
            ),
        )
    };
    let layout = std::alloc::Layout::array::<T>(len).map_err(|_| fail())?;
    if layout.size() == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if ptr.is_null() {
        return Err(fail());
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of `len` `T`s, all of them
    // initialised (all-zero bits are a valid `T`, the `Zeroable` contract); the Vec owns it.
    Ok(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

/// A byte count for messages: "4.0 TiB".
pub fn human(bytes: u128) -> String {
    const UNITS: [&str; 6] = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn meminfo_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// What the process's memory cgroup still allows, if it has a limit.
fn cgroup_available() -> Option<u64> {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let num = |s: Option<String>| s.and_then(|s| s.trim().parse::<u64>().ok());
    let stat = |p: &str, key: &str| -> u64 {
        read(p)
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix(key)?.trim().parse::<u64>().ok())
            })
            .unwrap_or(0)
    };
    // cgroup v2 ("max" does not parse: no limit).
    if let (Some(max), Some(cur)) = (
        num(read("/sys/fs/cgroup/memory.max")),
        num(read("/sys/fs/cgroup/memory.current")),
    ) {
        let inactive = stat("/sys/fs/cgroup/memory.stat", "inactive_file ");
        return Some(max.saturating_sub(cur.saturating_sub(inactive)));
    }
    // cgroup v1: an unlimited group reports a limit near i64::MAX.
    let limit = num(read("/sys/fs/cgroup/memory/memory.limit_in_bytes"))?;
    if limit >= 1 << 62 {
        return None;
    }
    let usage = num(read("/sys/fs/cgroup/memory/memory.usage_in_bytes"))?;
    let inactive = stat("/sys/fs/cgroup/memory/memory.stat", "total_inactive_file ");
    Some(limit.saturating_sub(usage.saturating_sub(inactive)))
}

/// Asks the kernel to back `v` with transparent huge pages where its 2 MiB-aligned parts allow
/// (Linux `MADV_HUGEPAGE`; elsewhere nothing): a fresh buffer of hundreds of MiB that is written
/// once then costs 512 times fewer page faults. Advice only: nothing changes if it is refused.
pub fn advise_huge_pages<T>(v: &mut [T]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let (p, len) = (v.as_mut_ptr() as usize, std::mem::size_of_val(v));
        let start = p.next_multiple_of(HUGE);
        let end = (p + len) / HUGE * HUGE;
        if end > start {
            // SAFETY: madvise only changes how the kernel backs pages of this mapping, which
            // `v` owns; the range lies inside `v`. Its result is advice and may be ignored.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = v;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absurd_sizes_are_refused_before_allocating() {
        let err = check_alloc("out", "the result", 1u128 << 100).expect_err("too big");
        assert!(
            matches!(err, Error::Capacity { ref arg, .. } if arg == "out"),
            "{err}"
        );
        assert!(err.to_string().contains("address space"), "{err}");
        let err = zeroed_vec::<f32>("out", "the result", usize::MAX / 2).expect_err("too big");
        assert!(matches!(err, Error::Capacity { .. }), "{err}");
        assert_eq!(
            zeroed_vec::<f32>("out", "x", 3).expect("small"),
            vec![0.0; 3]
        );
        assert!(zeroed_vec::<u8>("out", "x", 0).expect("empty").is_empty());
    }

    #[test]
    fn the_host_limit_is_known_on_linux() {
        if cfg!(target_os = "linux") && std::env::var(ENV_LIMIT).is_err() {
            let (avail, _) = available_memory().expect("/proc/meminfo");
            assert!(avail > 0);
            // A request of twice the available memory is refused.
            let err = check_alloc("x", "y", 2 * avail as u128).expect_err("over");
            assert!(err.to_string().contains("available"), "{err}");
        }
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(12), "12 bytes");
        assert_eq!(human(1 << 42), "4.0 TiB");
        assert_eq!(human(3 << 29), "1.5 GiB");
    }
}
