//! The one integration-test binary of the core (one binary keeps link times down on 2 cores).

mod access_pattern;
mod cancel;
mod collectives;
mod distributed;
mod dma;
mod engine;
mod estimate_scale;
mod fuzz;
mod gemm_call;
mod machine;
mod numerics_exhaustive;
mod sparse_gemm;
mod sparsity;
mod view_model;

/// Reference conversions the tests share, written from the formats' definitions (independent
/// of the core's kernels).
mod reference {
    /// The value of an IEEE binary16 code (NaN for every NaN code).
    pub fn f16_value(code: u16) -> f64 {
        let sign = if code & 0x8000 != 0 { -1.0 } else { 1.0 };
        let e = i32::from((code >> 10) & 0x1F);
        let m = f64::from(code & 0x3FF);
        match e {
            0 => sign * m * 2f64.powi(-24),
            0x1F if m == 0.0 => sign * f64::INFINITY,
            0x1F => f64::NAN,
            _ => sign * (1.0 + m / 1024.0) * 2f64.powi(e - 15),
        }
    }

    /// The bfloat16 code of a finite float32, rounded to nearest even.
    pub fn bf16_rne(x: f32) -> u16 {
        let b = x.to_bits();
        ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
    }
}
