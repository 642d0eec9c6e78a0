//! The one table of element types: every type trn2core names, with its bits, its kind, the
//! numpy / ml_dtypes dtype that holds it, and which of the core's views it belongs to: a
//! number format of `numerics` ([`Format`]), an element type of the machine's memories
//! ([`MachineDtype`]), and/or an array dtype the sparsity functions take
//! ([`crate::sparsity::Dtype`], which reads its bits and kind from its row). Python builds its dtype maps from this table (`_core.element_types()`),
//! so a type is spelled once. The other names users write for a format (numpy, JAX, PyTorch
//! spellings) are [`Format::ALIASES`].

use crate::machine::Dtype as MachineDtype;
use crate::numerics::Format;

/// What kind of number an element type holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A floating-point format.
    Float,
    /// Two's-complement signed integers.
    Signed,
    /// Unsigned integers.
    Unsigned,
    /// numpy's `bool` (one byte, 0 or 1).
    Bool,
}

impl Kind {
    /// `"float"`, `"signed"` or `"unsigned"`.
    pub const fn name(self) -> &'static str {
        match self {
            Kind::Float => "float",
            Kind::Signed => "signed",
            Kind::Unsigned => "unsigned",
            Kind::Bool => "bool",
        }
    }
}

/// One element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElementType {
    /// trn2core's name (`"bf16"`, `"int8"`).
    pub name: &'static str,
    /// The numpy / ml_dtypes dtype of its container (`"bfloat16"`; tf32 lives in `"float32"`).
    pub numpy: &'static str,
    /// Bits of the container.
    pub bits: u32,
    /// Float or integer.
    pub kind: Kind,
    /// The number format, for the float types.
    pub format: Option<Format>,
    /// The machine's element type, for the types SBUF, PSUM and HBM tensors hold.
    pub machine: Option<MachineDtype>,
    /// Whether arrays of this numpy dtype are a [`crate::sparsity::Dtype`] (named `numpy`):
    /// every container dtype once (tf32's float32 is fp32's row).
    pub array: bool,
}

const fn float(
    name: &'static str, numpy: &'static str, bits: u32, f: Format, m: Option<MachineDtype>,
) -> ElementType {
    ElementType { name, numpy, bits, kind: Kind::Float, format: Some(f), machine: m, array: true }
}

const fn int(name: &'static str, bits: u32, kind: Kind, m: MachineDtype) -> ElementType {
    ElementType { machine: Some(m), ..array(name, bits, kind) }
}

/// A numpy dtype of arrays only (no format, no machine type): its name is numpy's.
const fn array(name: &'static str, bits: u32, kind: Kind) -> ElementType {
    ElementType { name, numpy: name, bits, kind, format: None, machine: None, array: true }
}

/// Every element type: the formats in [`Format::ALL`]'s order, then the integer types, then
/// the numpy dtypes only arrays have (the sparsity functions take them).
/// `fp8_e4m3fn` (OCP E4M3) converts, but no Trainium2 engine or memory type holds it.
#[rustfmt::skip]
pub const ELEMENT_TYPES: [ElementType; 18] = [
    float("fp32", "float32", 32, Format::Fp32, Some(MachineDtype::Fp32)),
    ElementType { array: false, ..float("tf32", "float32", 32, Format::Tf32, Some(MachineDtype::Tf32)) },
    float("bf16", "bfloat16", 16, Format::Bf16, Some(MachineDtype::Bf16)),
    float("fp16", "float16", 16, Format::Fp16, Some(MachineDtype::Fp16)),
    float("fp8_e4m3", "float8_e4m3", 8, Format::Fp8E4m3, Some(MachineDtype::Fp8E4m3)),
    float("fp8_e5m2", "float8_e5m2", 8, Format::Fp8E5m2, Some(MachineDtype::Fp8E5m2)),
    float("fp8_e3m4", "float8_e3m4", 8, Format::Fp8E3m4, Some(MachineDtype::Fp8E3m4)),
    float("fp8_e4m3fn", "float8_e4m3fn", 8, Format::Fp8E4m3fn, None),
    int("uint8", 8, Kind::Unsigned, MachineDtype::Uint8),
    int("int8", 8, Kind::Signed, MachineDtype::Int8),
    int("uint16", 16, Kind::Unsigned, MachineDtype::Uint16),
    int("int16", 16, Kind::Signed, MachineDtype::Int16),
    int("uint32", 32, Kind::Unsigned, MachineDtype::Uint32),
    int("int32", 32, Kind::Signed, MachineDtype::Int32),
    array("float64", 64, Kind::Float),
    array("int64", 64, Kind::Signed),
    array("uint64", 64, Kind::Unsigned),
    array("bool", 8, Kind::Bool),
];

/// The element type named `name`, if there is one.
pub fn element_type(name: &str) -> Option<&'static ElementType> {
    ELEMENT_TYPES.iter().find(|t| t.name == name)
}

/// The row of the array dtype numpy calls `numpy` (`"float32"`: fp32's), if there is one; a
/// `const fn`, so views can read their rows at compile time.
pub const fn array_type(numpy: &str) -> Option<ElementType> {
    let mut i = 0;
    while i < ELEMENT_TYPES.len() {
        let t = ELEMENT_TYPES[i];
        if t.array && same(t.numpy, numpy) {
            return Some(t);
        }
        i += 1;
    }
    None
}

/// `a == b`, in a `const fn`.
const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sparsity::Dtype as SparseDtype;

    #[test]
    fn the_table_agrees_with_both_views() {
        let formats: Vec<Format> = ELEMENT_TYPES.iter().filter_map(|t| t.format).collect();
        assert_eq!(formats, Format::ALL.to_vec(), "formats in Format::ALL's order, once");
        for f in Format::ALL {
            let t = element_type(f.name()).expect("every format has a row");
            assert_eq!((t.format, t.bits, t.kind), (Some(f), f.code_bits(), Kind::Float));
        }
        let machine: Vec<MachineDtype> = ELEMENT_TYPES.iter().filter_map(|t| t.machine).collect();
        assert_eq!(machine.len(), MachineDtype::ALL.len());
        for d in MachineDtype::ALL {
            let t = element_type(d.name()).expect("every machine dtype has a row");
            assert_eq!(t.machine, Some(d));
            assert_eq!(t.bits as usize, 8 * d.size(), "{}", d.name());
            assert_eq!(t.format, d.format(), "{}", d.name());
            assert_eq!(t.kind == Kind::Float, !d.is_int(), "{}", d.name());
        }
        assert_eq!(element_type("fp8_e4m3fn").and_then(|t| t.machine), None);
        // The array view: every sparsity dtype is one row, named by numpy, and no other row is.
        let arrays: Vec<&str> = ELEMENT_TYPES.iter().filter(|t| t.array).map(|t| t.numpy).collect();
        let mut sorted = arrays.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), arrays.len(), "each numpy dtype once: {arrays:?}");
        assert_eq!(arrays.len(), SparseDtype::ALL.len());
        for d in SparseDtype::ALL {
            let t = array_type(d.name()).expect("every sparsity dtype has a row");
            assert_eq!((t.bits, t.kind), (d.bits(), d.kind()), "{}", d.name());
            if let Some(f) = t.format {
                assert_eq!(SparseDtype::from(f), d, "{}", d.name());
            }
        }
        for f in Format::ALL {
            let d = SparseDtype::from(f);
            assert_eq!(array_type(d.name()).map(|t| t.bits), Some(f.code_bits()));
        }
        let f64_row = element_type("float64").expect("float64 has a row");
        assert_eq!((f64_row.format, f64_row.machine), (None, None));
        assert_eq!(element_type("bool").map(|t| (t.bits, t.kind)), Some((8, Kind::Bool)));
        assert!(array_type("complex64").is_none() && array_type("fp32").is_none());
    }
}
