//! Run-time SIMD dispatch for the machine's hot loops (the same scheme as `numerics`: portable
//! code, re-compiled inside `#[target_feature]` functions for AVX2 and AVX-512 and chosen once
//! per call from the CPU's features).
//!
//! [`dispatch!`] wraps an `#[inline(always)]` body: the body is written once, in plain Rust, and
//! LLVM vectorises it for each feature level. Every level computes the same IEEE binary32
//! operations element by element (no reassociation, no FMA contraction: Rust never contracts),
//! so the level changes the speed, never a bit.

use std::sync::atomic::{AtomicU8, Ordering};

/// Portable code only.
pub(crate) const PORTABLE: u8 = 1;
/// AVX2 + FMA + BMI2.
pub(crate) const AVX2: u8 = 2;
/// AVX-512 F/BW/DQ/VL.
pub(crate) const AVX512: u8 = 3;

static LEVEL: AtomicU8 = AtomicU8::new(0);

/// The widest level this CPU offers (detected once, then cached).
#[inline]
pub(crate) fn level() -> u8 {
    let l = LEVEL.load(Ordering::Relaxed);
    if l != 0 {
        return l;
    }
    let l = detect();
    LEVEL.store(l, Ordering::Relaxed);
    l
}

#[cfg(target_arch = "x86_64")]
fn detect() -> u8 {
    if crate::numerics::has_avx512_bw_vl_dq() {
        AVX512
    } else if std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("bmi2")
    {
        AVX2
    } else {
        PORTABLE
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> u8 {
    PORTABLE
}

/// `dispatch!(fn name(args: types) -> ret { body })` defines `name`, which runs `body` compiled
/// for the best SIMD level of this CPU. The body must be safe code.
macro_rules! dispatch {
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident $(<$($g:ident : $bound:path),*>)? ( $($arg:ident : $ty:ty),* $(,)? ) $(-> $ret:ty)? $body:block
    ) => {
        $(#[$meta])*
        $vis fn $name $(<$($g: $bound),*>)? ( $($arg: $ty),* ) $(-> $ret)? {
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn body $(<$($g: $bound),*>)? ( $($arg: $ty),* ) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,bmi2")]
                #[allow(clippy::too_many_arguments)]
                fn avx512 $(<$($g: $bound),*>)? ( $($arg: $ty),* ) $(-> $ret)? { body($($arg),*) }
                #[target_feature(enable = "avx2,fma,bmi2")]
                #[allow(clippy::too_many_arguments)]
                fn avx2 $(<$($g: $bound),*>)? ( $($arg: $ty),* ) $(-> $ret)? { body($($arg),*) }
                match $crate::machine::simd::level() {
                    // SAFETY: the level is what this CPU reported, so it has the features.
                    $crate::machine::simd::AVX512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: as above.
                    $crate::machine::simd::AVX2 => return unsafe { avx2($($arg),*) },
                    _ => {}
                }
            }
            body($($arg),*)
        }
    };
}
pub(crate) use dispatch;
