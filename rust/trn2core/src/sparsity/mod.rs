//! Structured N:M sparsity (contract section 3): pruning, the compressed form, and PyTorch's
//! CUTLASS semi-structured layout.
//!
//! - [`Pattern`]: the seven N:M patterns of the tensor engine (`spec::SPARSITY_PATTERNS`,
//!   \[S1\]\[S4\]): at most `n` stored elements in every group of `m` consecutive
//!   elements along one axis.
//! - [`prune()`]: keeps the `n` largest magnitudes of every group and zeroes the rest.
//! - [`compress()`] / [`Compressed::decompress()`]: the packed values and position metadata of an
//!   input that already conforms, and back, bit for bit. [`check()`] only validates.
//! - [`to_cutlass()`] / [`from_cutlass()`]: PyTorch's `to_sparse_semi_structured` (CUTLASS
//!   backend) `(packed, meta)` pair for 2:4 (16- and 8-bit elements) and 1:2 (32-bit elements).
//!
//! Everything works on raw element codes ([`Element`]: `u8`, `u16`, `u32`, `u64`), so every bit of
//! a stored value survives: `-0.0`, NaN payloads, subnormals. Only [`prune()`] needs to know what
//! the codes mean, to compare magnitudes; the caller says so with a [`Dtype`].
//!
//! # Data layout
//!
//! An input is a C-contiguous array of `shape`, seen as `[outer, axis_len, inner]` where `outer`
//! is the product of the dimensions before `axis` and `inner` the product of those after it. A
//! *group* is `m` consecutive elements along the axis: for `outer` index `o`, group `g` and
//! `inner` index `i`, its element `k` (`0 <= k < m`) is at flat index
//! `(o * axis_len + g * m + k) * inner + i`. The axis length must be a multiple of `m`
//! ([`Error::Shape`] otherwise).
//!
//! # Magnitude order of [`prune()`]
//!
//! Each code maps to an unsigned key monotone in `|value|` ([`Dtype::magnitude_key`]): for the
//! float formats the code with its sign bit cleared (sign-magnitude codes order like their
//! magnitudes, and every NaN code lies above Inf, or above the largest finite value in
//! `fp8_e4m3fn`), with all NaN codes mapped to one key just above Inf so that NaNs tie with each
//! other; for signed integers the absolute value, for unsigned integers the value. An element is
//! kept when fewer than `n` elements of its group rank above it, where `j` ranks above `k` if its
//! key is larger, or equal with `j < k`: so ties keep the lower index and NaN counts as the
//! largest. The others become all-bits-zero (`+0.0`).
//!
//! # Compressed layout
//!
//! `compress` counts every element whose bits are not all zero as stored (so `-0.0` and NaN are
//! kept) and needs at most `n` of them per group; otherwise [`Error::Sparsity`] names the first
//! offending group in C order, with its index in the array.
//!
//! - **values**: `n` slots per group, C-contiguous with shape `shape` except that the axis has
//!   length `axis_len / m * n`: slot `s` of group `(o, g, i)` is at flat index
//!   `(o * (axis_len / m * n) + g * n + s) * inner + i`.
//! - **positions**: each slot has a position `0..m` within its group. The `n` positions of a group
//!   are distinct and strictly ascending, and each slot holds the value of the element at its
//!   position. A group with fewer than `n` stored elements fills its free slots with the *lowest
//!   positions that hold no stored element*; since such an element is all-bits-zero, the slot
//!   holds zero, and scattering every slot back is unambiguous and bit-exact.
//! - **indices** (packed metadata): the positions in the order of the values (flat C order of the
//!   values array), `b = ceil(log2 m)` bits each (1:2 -> 1 bit; 2:4, 1:4 -> 2; 2:8, 4:8 -> 3;
//!   4:12, 4:16 -> 4), packed LSB-first into a little-endian bit stream: position number `j`
//!   occupies bits `j*b .. j*b + b` of the stream, and stream bit `t` is bit `t % 8` of byte
//!   `t / 8` (so 3-bit positions may straddle bytes). The stream takes `ceil(count * b / 8)` bytes;
//!   unused high bits of the last byte are zero.
//! - `nbytes` = values bytes + packed index bytes.
//!
//! **Worked example**, 2:4 along the last axis of one float32 row of 8:
//! `[0, 3.0, 0, -1.0 | 5.0, 0, 0, 0]`. Group 0 stores positions 1 and 3; group 1 stores position 0
//! and pads with the lowest free position, 1. So values `[3.0, -1.0, 5.0, 0.0]` and positions
//! `[1, 3, 0, 1]`, 2 bits each, in bits 0-1, 2-3, 4-5 and 6-7 of one byte:
//! `1 | 3 << 2 | 0 << 4 | 1 << 6` = `0b01_00_11_01` = `0x4D`. `nbytes` = 4 * 4 + 1 = 17.
//!
//! # CUTLASS semi-structured layout
//!
//! See [`cutlass`] and `docs/sparsity_layout_notes.md`: per group of 4 a 4-bit code
//! `idx0 | idx1 << 2`, packed into int16 (16- and 32-bit elements) or int32 (8-bit elements) words
//! and reordered for the sparse tensor core, following `torch/sparse/_semi_structured_conversions.py`.

mod compress;
pub mod cutlass;
mod prune;

pub use compress::{
    check, compress, compress_into, pack_indices, positions, unpack_indices, Compressed,
    CompressedLayout,
};
pub use cutlass::{from_cutlass, to_cutlass, Cutlass, CutlassMeta};
pub use prune::{prune, prune_to};

use crate::dtype::{array_type, ElementType, Kind, ELEMENT_TYPES};
use crate::numerics::Format;
use crate::{spec, Error, Result};

// ===================================== patterns ==============================================

/// An N:M structured-sparsity pattern: at most `n` stored elements in every group of `m`
/// consecutive elements along an axis. Only the seven patterns of [`spec::SPARSITY_PATTERNS`]
/// exist; the fields are private so every `Pattern` is one of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pattern {
    n: usize,
    m: usize,
}

impl Pattern {
    /// 2:4, the pattern of NVIDIA's sparse tensor cores and PyTorch's semi-structured tensors.
    pub const TWO_FOUR: Pattern = Pattern { n: 2, m: 4 };

    /// All patterns, in the order of `trn2core.SPARSITY_PATTERNS`.
    pub const ALL: [Pattern; 7] = {
        let mut all = [Pattern { n: 0, m: 0 }; 7];
        let mut i = 0;
        while i < 7 {
            let (n, m) = spec::SPARSITY_PATTERNS[i];
            all[i] = Pattern { n, m };
            i += 1;
        }
        all
    };

    /// The pattern `n:m`, if it is one of the seven.
    pub fn new(n: usize, m: usize) -> Result<Pattern> {
        Pattern::ALL
            .iter()
            .copied()
            .find(|p| p.n == n && p.m == m)
            .ok_or_else(|| Pattern::unknown(&format!("{n}:{m}")))
    }

    /// Parses `"N:M"` (surrounding whitespace allowed); the error lists the accepted names.
    pub fn parse(name: &str) -> Result<Pattern> {
        let trimmed = name.trim();
        Pattern::ALL
            .iter()
            .copied()
            .find(|p| p.name() == trimmed)
            .ok_or_else(|| Pattern::unknown(name))
    }

    fn unknown(name: &str) -> Error {
        let names: Vec<String> = Pattern::ALL.iter().map(|p| p.name()).collect();
        Error::value(
            "pattern",
            format!("unknown sparsity pattern {name:?}; expected one of {names:?}"),
        )
    }

    /// The contract's name, `"N:M"`.
    pub fn name(self) -> String {
        format!("{}:{}", self.n, self.m)
    }

    /// Largest number of stored elements per group.
    pub const fn n(self) -> usize {
        self.n
    }

    /// Group size (consecutive elements along the axis).
    pub const fn m(self) -> usize {
        self.m
    }

    /// Bits of one packed position, `ceil(log2 m)`.
    pub const fn index_bits(self) -> u32 {
        usize::BITS - (self.m - 1).leading_zeros()
    }

    /// Dense-over-stored ratio `m / n` (2, 3 or 4): the tensor engine's speed-up.
    pub fn ratio(self) -> f64 {
        self.m as f64 / self.n as f64
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.n, self.m)
    }
}

// ===================================== elements ==============================================

mod sealed {
    pub trait Sealed {}
    impl Sealed for u8 {}
    impl Sealed for u16 {}
    impl Sealed for u32 {}
    impl Sealed for u64 {}
}

/// A raw element code of 8, 16, 32 or 64 bits. The sparsity routines move codes without looking
/// at them, so any dtype of that width (float, integer, bool) round-trips bit for bit.
pub trait Element:
    Copy + Default + PartialEq + Ord + Send + Sync + std::fmt::Debug + 'static + sealed::Sealed
{
    /// Width in bits.
    const BITS: u32;
    /// The all-bits-zero code (`+0.0`): what pruning writes and compression leaves out.
    const ZERO: Self;
    /// The code zero-extended.
    fn to_u64(self) -> u64;
    /// The low `BITS` bits of `v`.
    fn from_u64(v: u64) -> Self;
    /// Bitwise and.
    fn and(self, other: Self) -> Self;
    /// Wrapping addition.
    fn wrapping_add(self, other: Self) -> Self;
    /// The absolute value of the code read as a two's-complement integer (`MIN` gives
    /// `2^(BITS-1)`).
    fn abs_signed(self) -> Self;
}

// The kernels compute in the element's own width (not through u64), so that the compiler keeps
// one group per narrow SIMD lane.
macro_rules! element {
    ($($t:ty, $s:ty);*) => {$(
        impl Element for $t {
            const BITS: u32 = <$t>::BITS;
            const ZERO: Self = 0;
            #[inline(always)]
            fn to_u64(self) -> u64 {
                self as u64
            }
            #[inline(always)]
            fn from_u64(v: u64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn and(self, other: Self) -> Self {
                self & other
            }
            #[inline(always)]
            fn wrapping_add(self, other: Self) -> Self {
                <$t>::wrapping_add(self, other)
            }
            #[inline(always)]
            fn abs_signed(self) -> Self {
                (self as $s).unsigned_abs()
            }
        }
    )*};
}
element!(u8, i8; u16, i16; u32, i32; u64, i64);

named_enum! {
    /// What the codes of an array mean, for the magnitude order of [`prune()`]: the numpy /
    /// ml_dtypes dtypes the Python API accepts. A view of the element-type table
    /// ([`crate::dtype::ELEMENT_TYPES`], its `array` rows, by numpy name): bits and kind are read
    /// from there.
    pub enum Dtype("dtype", format) {
        /// IEEE binary64.
        F64 = "float64",
        /// IEEE binary32 (also tf32, held in a float32 container).
        F32 = "float32",
        /// IEEE binary16.
        F16 = "float16",
        /// bfloat16.
        Bf16 = "bfloat16",
        /// `float8_e4m3` (IEEE-style: Inf and NaN in the all-ones exponent).
        Fp8E4m3 = "float8_e4m3",
        /// `float8_e5m2`.
        Fp8E5m2 = "float8_e5m2",
        /// `float8_e3m4`.
        Fp8E3m4 = "float8_e3m4",
        /// `float8_e4m3fn` (no Inf, NaN = S.1111.111).
        Fp8E4m3fn = "float8_e4m3fn",
        /// Two's-complement signed integers.
        I8 = "int8",
        /// 16-bit signed integers.
        I16 = "int16",
        /// 32-bit signed integers.
        I32 = "int32",
        /// 64-bit signed integers.
        I64 = "int64",
        /// Unsigned integers.
        U8 = "uint8",
        /// 16-bit unsigned integers.
        U16 = "uint16",
        /// 32-bit unsigned integers.
        U32 = "uint32",
        /// 64-bit unsigned integers.
        U64 = "uint64",
        /// numpy `bool` (one byte, 0 or 1).
        Bool = "bool",
    }
}

/// How a dtype's codes map to magnitude keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyRule {
    /// Sign-magnitude float: clear the sign bit; magnitudes above `nan_above` are NaN and all map
    /// to `nan_above + 1`.
    Float { sign: u64, nan_above: u64 },
    /// Two's complement of `bits` bits: the absolute value.
    Signed { bits: u32 },
    /// The value itself.
    Unsigned,
}

impl Dtype {
    /// Each dtype's row of the element-type table, in [`Self::ALL`]'s order (a dtype without
    /// one does not compile).
    const ROWS: [ElementType; Dtype::ALL.len()] = {
        let mut rows = [ELEMENT_TYPES[0]; Dtype::ALL.len()];
        let mut i = 0;
        while i < rows.len() {
            rows[i] = match array_type(Dtype::ALL[i].name()) {
                Some(t) => t,
                None => panic!("a sparsity dtype without a row in dtype::ELEMENT_TYPES"),
            };
            i += 1;
        }
        rows
    };

    /// Its row of the element-type table.
    pub const fn element(self) -> ElementType {
        Dtype::ROWS[self as usize]
    }

    /// Width of one code in bits.
    pub const fn bits(self) -> u32 {
        self.element().bits
    }

    /// Float, signed, unsigned or bool.
    pub const fn kind(self) -> Kind {
        self.element().kind
    }

    pub(crate) const fn key_rule(self) -> KeyRule {
        // `nan_above` is the magnitude code of +Inf (IEEE-style formats) or of the largest finite
        // value (fp8_e4m3fn, whose only NaN magnitude is all ones).
        const fn float(bits: u32, nan_above: u64) -> KeyRule {
            KeyRule::Float { sign: 1 << (bits - 1), nan_above }
        }
        let bits = self.bits();
        match self.kind() {
            Kind::Float => float(
                bits,
                match self {
                    Dtype::F64 => 0x7FF0_0000_0000_0000,
                    Dtype::F32 => 0x7F80_0000,
                    Dtype::F16 => 0x7C00,
                    Dtype::Bf16 => 0x7F80,
                    Dtype::Fp8E4m3 => 0x78,
                    Dtype::Fp8E5m2 => 0x7C,
                    Dtype::Fp8E3m4 => 0x70,
                    Dtype::Fp8E4m3fn => 0x7E,
                    _ => panic!("a float row for an integer dtype"),
                },
            ),
            Kind::Signed => KeyRule::Signed { bits },
            Kind::Unsigned | Kind::Bool => KeyRule::Unsigned,
        }
    }

    /// A key of `code` (its low `bits()` bits) that is monotone in the magnitude `|value|`, with
    /// every NaN above Inf and all NaNs equal; it fits in `bits()` bits.
    pub const fn magnitude_key(self, code: u64) -> u64 {
        self.key_rule().key(code)
    }
}

// Every dtype's key rule is evaluated at compile time: a float row of the table for a dtype
// without a NaN bound above does not compile.
const _: () = {
    let mut i = 0;
    while i < Dtype::ALL.len() {
        Dtype::ALL[i].key_rule();
        i += 1;
    }
};

impl KeyRule {
    #[inline(always)]
    pub(crate) const fn key(self, code: u64) -> u64 {
        match self {
            KeyRule::Float { sign, nan_above } => {
                let mag = code & (sign - 1);
                if mag > nan_above {
                    nan_above + 1
                } else {
                    mag
                }
            }
            KeyRule::Signed { bits } => {
                let shift = 64 - bits;
                (((code << shift) as i64) >> shift).unsigned_abs() & (u64::MAX >> shift)
            }
            KeyRule::Unsigned => code,
        }
    }
}

impl From<Format> for Dtype {
    /// The container dtype of a format's codes (tf32 lives in float32).
    fn from(format: Format) -> Dtype {
        match format {
            Format::Fp32 | Format::Tf32 => Dtype::F32,
            Format::Bf16 => Dtype::Bf16,
            Format::Fp16 => Dtype::F16,
            Format::Fp8E4m3 => Dtype::Fp8E4m3,
            Format::Fp8E5m2 => Dtype::Fp8E5m2,
            Format::Fp8E3m4 => Dtype::Fp8E3m4,
            Format::Fp8E4m3fn => Dtype::Fp8E4m3fn,
        }
    }
}

// ===================================== axis view =============================================

/// An array seen as `[outer, axis_len, inner]` around its sparsity axis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AxisView {
    /// The array's shape.
    pub shape: Vec<usize>,
    /// The axis, normalised to `0..ndim`.
    pub axis: usize,
    /// Product of the dimensions before the axis.
    pub outer: usize,
    /// Length of the axis (a multiple of the pattern's `m`).
    pub axis_len: usize,
    /// Product of the dimensions after the axis.
    pub inner: usize,
}

impl AxisView {
    /// Validates `shape` against `len` elements and `axis` (negative counts from the end, as in
    /// numpy) against the pattern's group size.
    pub fn new(shape: &[usize], axis: isize, len: usize, pattern: Pattern) -> Result<AxisView> {
        let ndim = shape.len();
        let ax = normalize_axis(axis, ndim)?;
        let count =
            shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)).ok_or_else(|| {
                Error::shape("x", format!("shape {shape:?} has more elements than fit in memory"))
            })?;
        if count != len {
            return Err(Error::shape(
                "x",
                format!("shape {shape:?} holds {count} elements but the data has {len}"),
            ));
        }
        let axis_len = shape[ax];
        if !axis_len.is_multiple_of(pattern.m) {
            return Err(Error::shape(
                "x",
                format!(
                    "axis {ax} of shape {shape:?} has length {axis_len}, which is not a multiple \
                     of the group size {} of pattern {pattern}",
                    pattern.m
                ),
            ));
        }
        // Saturating: a dimension of 0 lets the others be anything, and then nothing is read.
        let product = |dims: &[usize]| dims.iter().fold(1usize, |a, &d| a.saturating_mul(d));
        Ok(AxisView {
            shape: shape.to_vec(),
            axis: ax,
            outer: product(&shape[..ax]),
            axis_len,
            inner: product(&shape[ax + 1..]),
        })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.outer.saturating_mul(self.axis_len).saturating_mul(self.inner)
    }

    /// Whether the array has no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The numpy-style index of the group whose first element is `(o, g, i)`, e.g. `[3, 8:12]`.
    pub(crate) fn group_index(&self, o: usize, g: usize, i: usize, m: usize) -> String {
        let mut parts = Vec::with_capacity(self.shape.len());
        let mut rest = o;
        let mut before = vec![0usize; self.axis];
        for (slot, &d) in before.iter_mut().zip(&self.shape[..self.axis]).rev() {
            *slot = rest % d.max(1);
            rest /= d.max(1);
        }
        parts.extend(before.iter().map(|v| v.to_string()));
        parts.push(format!("{}:{}", g * m, g * m + m));
        let after_dims = &self.shape[self.axis + 1..];
        let mut after = vec![0usize; after_dims.len()];
        let mut rest = i;
        for (slot, &d) in after.iter_mut().zip(after_dims).rev() {
            *slot = rest % d.max(1);
            rest /= d.max(1);
        }
        parts.extend(after.iter().map(|v| v.to_string()));
        format!("[{}]", parts.join(", "))
    }
}

/// `axis` (negative counts from the end) as an index into a shape of `ndim` dimensions.
pub fn normalize_axis(axis: isize, ndim: usize) -> Result<usize> {
    let n = ndim as isize;
    if ndim == 0 {
        return Err(Error::shape(
            "x",
            "a 0-dimensional array has no axis to group along; give at least one dimension",
        ));
    }
    if axis < -n || axis >= n {
        return Err(Error::shape(
            "axis",
            format!("axis {axis} is out of range for an array of {ndim} dimensions"),
        ));
    }
    Ok(if axis < 0 { axis + n } else { axis } as usize)
}

/// Blocks (one `(outer, group)` pair: `m * inner` input elements) per parallel task: about 64 Ki
/// elements, and a multiple of 8 so that every task's packed positions start on a byte boundary.
pub(crate) fn blocks_per_task(m: usize, inner: usize) -> usize {
    let per_block = m.saturating_mul(inner).max(1);
    let blocks = ((1usize << 16) / per_block).max(1);
    blocks.div_ceil(8).saturating_mul(8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_follow_the_spec() {
        let names: Vec<String> = Pattern::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(names, ["1:2", "2:4", "1:4", "2:8", "4:8", "4:12", "4:16"]);
        let bits: Vec<u32> = Pattern::ALL.iter().map(|p| p.index_bits()).collect();
        assert_eq!(bits, [1, 2, 2, 3, 3, 4, 4]);
        assert_eq!(Pattern::parse(" 4:16 ").map(|p| (p.n(), p.m())), Ok((4, 16)));
        assert_eq!(Pattern::new(2, 4), Ok(Pattern::TWO_FOUR));
        assert!(matches!(Pattern::parse("3:4"), Err(Error::Value { .. })));
        assert!(matches!(Pattern::parse(""), Err(Error::Value { .. })));
        assert!(matches!(Pattern::new(0, 0), Err(Error::Value { .. })));
    }

    #[test]
    fn magnitude_keys() {
        // bf16: -2.0 (0xC000) above 1.5 (0x3FC0); NaNs above Inf and equal to each other.
        let k = |d: Dtype, c: u64| d.magnitude_key(c);
        assert!(k(Dtype::Bf16, 0xC000) > k(Dtype::Bf16, 0x3FC0));
        assert_eq!(k(Dtype::Bf16, 0x8000), 0);
        assert_eq!(k(Dtype::Bf16, 0x7FC0), k(Dtype::Bf16, 0xFF81));
        assert!(k(Dtype::Bf16, 0x7FC0) > k(Dtype::Bf16, 0xFF80));
        assert_eq!(k(Dtype::Fp8E4m3fn, 0xFF), 0x7F);
        assert!(k(Dtype::Fp8E4m3fn, 0x7F) > k(Dtype::Fp8E4m3fn, 0x7E));
        assert_eq!(k(Dtype::I8, 0x80), 128);
        assert_eq!(k(Dtype::I8, 0xFF), 1);
        assert_eq!(k(Dtype::I64, u64::MAX), 1);
        assert_eq!(k(Dtype::I64, 1 << 63), 1 << 63);
        assert_eq!(k(Dtype::U8, 0xFF), 0xFF);
        assert_eq!(k(Dtype::F64, f64::NAN.to_bits()), f64::INFINITY.to_bits() + 1);
    }

    #[test]
    fn axis_views_and_group_names() {
        let v = AxisView::new(&[2, 8, 3], 1, 48, Pattern::TWO_FOUR).expect("valid view");
        assert_eq!((v.outer, v.axis_len, v.inner), (2, 8, 3));
        assert_eq!(v.group_index(1, 1, 2, 4), "[1, 4:8, 2]");
        let half = Pattern::new(1, 2).expect("1:2 exists");
        assert!(AxisView::new(&[2, 8, 3], -3, 48, half).is_ok());
        assert!(matches!(
            AxisView::new(&[2, 6], -1, 12, Pattern::TWO_FOUR),
            Err(Error::Shape { .. })
        ));
        assert!(matches!(
            AxisView::new(&[2, 8], 2, 16, Pattern::TWO_FOUR),
            Err(Error::Shape { .. })
        ));
        assert!(matches!(
            AxisView::new(&[2, 8], 0, 15, Pattern::TWO_FOUR),
            Err(Error::Shape { .. })
        ));
        assert!(matches!(
            AxisView::new(&[usize::MAX, 4], 1, 0, Pattern::TWO_FOUR),
            Err(Error::Shape { .. })
        ));
        assert!(AxisView::new(&[], 0, 1, Pattern::TWO_FOUR).is_err());
    }
}
