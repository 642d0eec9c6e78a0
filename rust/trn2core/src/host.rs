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
//! file cache) and to the room left under the process's address-space limit (`ulimit -v`). The environment variable `TRN2CORE_HOST_MEMORY` replaces it, for tests and for
//! users who want a tighter cap: a byte count, optionally with a binary unit (`8388608`, `8MiB`,
//! `8 MiB`, `8M`, `1.5GiB`; K, M, G, T with or without `B`/`iB`, any case, all powers of 1024);
//! an empty value counts as unset, anything else is refused with a `Trn2ValueError` naming the
//! variable by every call that checks the host (never silently ignored). Elsewhere there is no
//! limit beyond the allocator's own failure. The check is per allocation: two concurrent
//! requests that each fit may together not.

use crate::{Error, Result};

/// Allocations below this size are never checked (reading `/proc` costs microseconds, and a
/// few MiB cannot matter).
pub const CHECK_FROM_BYTES: u64 = 1 << 22;

/// The environment variable that overrides [`available_memory`] (a byte count, see
/// [`parse_bytes`]).
pub const ENV_LIMIT: &str = "TRN2CORE_HOST_MEMORY";

/// A byte count as [`ENV_LIMIT`] takes it: digits (a decimal fraction allowed before a unit),
/// then optionally a binary unit `K`, `M`, `G` or `T` (1024^1..4), each alone or followed by
/// `B` or `iB`, or `B` alone; spaces around and before the unit; any case. `None` for anything
/// else, a fraction of a byte, or a count beyond `u64`.
pub fn parse_bytes(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let shift = match unit.trim_start().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() || frac.contains('.') || (num.contains('.') && frac.is_empty()) {
        return None;
    }
    // Exact: int * 2^shift + frac * 2^shift / 10^len(frac), which must be whole.
    let whole = int.parse::<u128>().ok()?.checked_shl(shift)?;
    let mut part = 0u128;
    if !frac.is_empty() {
        let den = 10u128.checked_pow(u32::try_from(frac.len()).ok()?)?;
        let scaled = frac.parse::<u128>().ok()?.checked_mul(1u128 << shift)?;
        if scaled % den != 0 {
            return None;
        }
        part = scaled / den;
    }
    u64::try_from(whole.checked_add(part)?).ok()
}

/// The limit [`ENV_LIMIT`] sets: `Ok(None)` when it is unset or empty, a `Trn2ValueError` on
/// the variable when it is not a byte count.
pub fn env_limit() -> Result<Option<u64>> {
    match std::env::var(ENV_LIMIT) {
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => parse_bytes(&v).map(Some).ok_or_else(|| {
            Error::value(
                ENV_LIMIT,
                format!(
                    "{v:?} is not a byte count; expected e.g. 8589934592, 8GiB or 512 MiB \
                     (units K, M, G, T: powers of 1024), or unset it"
                ),
            )
        }),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => {
            Err(Error::value(ENV_LIMIT, format!("{v:?} is not a byte count (not even text)")))
        }
    }
}

/// Bytes trn2core may still allocate on this host, and where the figure comes from; `None`
/// when unknown. A `Trn2ValueError` when [`ENV_LIMIT`] is set to something that is not a byte
/// count.
pub fn available_memory() -> Result<Option<(u64, &'static str)>> {
    Ok(limit_from(env_limit()?))
}

/// The limit: [`ENV_LIMIT`]'s value if set, else the system's figure; either way lowered to the
/// room left under the process's address-space limit (`ulimit -v`, `RLIMIT_AS`), a hard cap
/// beyond which every allocation fails however much memory the host has.
fn limit_from(env: Option<u64>) -> Option<(u64, &'static str)> {
    let base = match env {
        Some(n) => Some((n, ENV_LIMIT)),
        None => system_available(),
    };
    let room = address_space_room().map(|b| (b, "the process's address-space limit (ulimit -v)"));
    match (base, room) {
        (Some(b), Some(r)) => Some(if r.0 < b.0 { r } else { b }),
        (b, r) => b.or(r),
    }
}

/// Bytes of address space left under the soft `RLIMIT_AS` (`None` when unlimited or unknown):
/// the limit (`getrlimit`, a system call: the check runs for every allocation of 4 MiB or
/// more, and reading `/proc/self/limits` took as long as the rest of it) minus `VmSize` from
/// `/proc/self/status`, read only under a limit.
fn address_space_room() -> Option<u64> {
    let soft = soft_address_limit()?;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find(|l| l.starts_with("VmSize:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(soft.saturating_sub(kib.saturating_mul(1024)))
}

/// The soft `RLIMIT_AS` in bytes (`None` when unlimited or unknown).
#[cfg(unix)]
fn soft_address_limit() -> Option<u64> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes the struct it is given, which lives for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut r) } != 0 || r.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    // rlim_t is u64 on Linux but not a u64 by definition on every Unix.
    #[allow(clippy::useless_conversion)]
    u64::try_from(r.rlim_cur).ok()
}

/// The soft `RLIMIT_AS` in bytes (`None`: no such limit here).
#[cfg(not(unix))]
fn soft_address_limit() -> Option<u64> {
    None
}

/// What the system says is available (MemAvailable, lowered to the memory cgroup's room).
fn system_available() -> Option<(u64, &'static str)> {
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
    // A bad TRN2CORE_HOST_MEMORY is refused by every call, not only the large ones.
    let env = env_limit()?;
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
    match limit_from(env) {
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
            format!("{what}: the allocator refused {} ({bytes} bytes)", human(bytes)),
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

/// Reserves room in `v` for `additional` more elements (exactly) through the host check: a
/// `CapacityError` naming `arg` and `what` instead of an abort when the host cannot hold them.
pub fn reserve<T>(v: &mut Vec<T>, additional: usize, arg: &str, what: &str) -> Result<()> {
    let bytes = (v.len() as u128 + additional as u128) * std::mem::size_of::<T>() as u128;
    check_alloc(arg, what, bytes)?;
    v.try_reserve_exact(additional).map_err(|_| {
        Error::capacity(arg, format!("{what}: the allocator refused {}", human(bytes)))
    })
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
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix(key)?.trim().parse::<u64>().ok()))
            .unwrap_or(0)
    };
    // cgroup v2 ("max" does not parse: no limit).
    if let (Some(max), Some(cur)) =
        (num(read("/sys/fs/cgroup/memory.max")), num(read("/sys/fs/cgroup/memory.current")))
    {
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
        assert!(matches!(err, Error::Capacity { ref arg, .. } if arg == "out"), "{err}");
        assert!(err.to_string().contains("address space"), "{err}");
        let err = zeroed_vec::<f32>("out", "the result", usize::MAX / 2).expect_err("too big");
        assert!(matches!(err, Error::Capacity { .. }), "{err}");
        assert_eq!(zeroed_vec::<f32>("out", "x", 3).expect("small"), vec![0.0; 3]);
        assert!(zeroed_vec::<u8>("out", "x", 0).expect("empty").is_empty());
    }

    #[test]
    fn the_host_limit_is_known_on_linux() {
        if cfg!(target_os = "linux") && std::env::var(ENV_LIMIT).is_err() {
            let (avail, _) =
                available_memory().expect("no TRN2CORE_HOST_MEMORY").expect("/proc/meminfo");
            assert!(avail > 0);
            // A request of twice the available memory is refused.
            let err = check_alloc("x", "y", 2 * avail as u128).expect_err("over");
            assert!(err.to_string().contains("available"), "{err}");
        }
    }

    #[test]
    fn host_memory_values_parse_with_binary_units() {
        for (text, want) in [
            ("8388608", Some(8 << 20)),
            ("8MiB", Some(8 << 20)),
            (" 8 MiB ", Some(8 << 20)),
            ("8m", Some(8 << 20)),
            ("8MB", Some(8 << 20)),
            ("1.5GiB", Some(3 << 29)),
            ("2T", Some(2 << 40)),
            ("0", Some(0)),
            ("12 B", Some(12)),
            ("18446744073709551615", Some(u64::MAX)),
            ("18446744073709551616", None),
            ("16777216T", None),
            ("1.5", None),
            ("1.5B", None),
            ("0.1K", None),
            ("lots", None),
            ("8 MiBs", None),
            ("-8M", None),
            ("8..5M", None),
            (".5M", None),
            ("5.M", None),
            ("M", None),
            ("1e9", None),
            ("", None),
        ] {
            assert_eq!(parse_bytes(text), want, "{text:?}");
        }
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(12), "12 bytes");
        assert_eq!(human(1 << 42), "4.0 TiB");
        assert_eq!(human(3 << 29), "1.5 GiB");
    }
}
