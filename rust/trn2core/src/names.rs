//! One definition for every enum whose values users name with strings (formats, rounding modes,
//! perf modes, codecs, memories, collectives, algorithms, reduce ops, ...).
//!
//! `named_enum!` declares the enum together with `ALL` (every value, in the order Python lists
//! them), `name()` (the string users write), `parse()` (the inverse, with an error that names the
//! argument and lists the accepted names) and `Display`. Python reads the lists through the
//! binding (`_core.names()`), so a name exists in exactly one place.

/// Declares an enum of named values. Syntax:
///
/// ```ignore
/// named_enum! {
///     /// Doc of the enum.
///     pub enum PerfMode("perf_mode", value) {
///         /// Doc of the value.
///         None = "none",
///         DoubleRow = "double_row",
///     }
/// }
/// ```
///
/// The string after the enum name is what the value is called in error messages ("unknown
/// perf_mode ..."); the word after it is the [`crate::Error`] constructor for an unknown name
/// (`format` or `value`). A `#[default]` attribute may mark one variant (the enum then derives
/// `Default`: list `Default` in an outer `#[derive(...)]`).
#[macro_export]
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $Enum:ident ($what:literal, $ctor:ident) {
            $( $(#[$vmeta:meta])* $Variant:ident = $name:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $Enum {
            $( $(#[$vmeta])* $Variant ),+
        }

        impl $Enum {
            /// Every value, in the order the Python API lists them.
            pub const ALL: [$Enum; [$($name),+].len()] = [$($Enum::$Variant),+];

            /// Every value's name, in the order of [`Self::ALL`].
            pub const NAMES: [&'static str; [$($name),+].len()] = [$($name),+];

            /// The name users write for this value.
            pub const fn name(self) -> &'static str {
                match self {
                    $($Enum::$Variant => $name),+
                }
            }

            /// The value named `name`; an error naming the argument `arg` and listing every
            /// accepted name otherwise.
            pub fn parse(arg: &str, name: &str) -> $crate::Result<$Enum> {
                // A `match` on the text (compiled to a dispatch on its length, then one
                // comparison), not a scan comparing it with each name: instruction issue parses
                // its operator and engine names on every call.
                match name {
                    $($name => Some($Enum::$Variant),)+
                    _ => None,
                }
                .ok_or_else(|| {
                    $crate::Error::$ctor(
                        arg,
                        format!(
                            concat!("unknown ", $what, " {:?}; expected one of {:?}"),
                            name,
                            Self::NAMES
                        ),
                    )
                })
            }
        }

        impl ::std::fmt::Display for $Enum {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use crate::engine::PerfMode;

    /// What the macro declares, on one of its enums with a `#[default]` variant.
    #[test]
    fn lists_names_and_parses_them_back() {
        assert_eq!(PerfMode::ALL, [PerfMode::None, PerfMode::DoubleRow]);
        assert_eq!(PerfMode::NAMES, ["none", "double_row"]);
        assert_eq!(PerfMode::default(), PerfMode::None);
        for c in PerfMode::ALL {
            assert_eq!(PerfMode::parse("c", c.name()).ok(), Some(c));
            assert_eq!(c.to_string(), c.name());
        }
        let err = PerfMode::parse("c", "blue").err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("c: unknown perf_mode \"blue\"; expected one of [\"none\", \"double_row\"]")
        );
    }

    /// Every named enum of the crate: each value parses back from its name (under the argument
    /// name its callers use), and each listed unknown name is refused with an error that lists
    /// every accepted name.
    #[test]
    fn every_named_enum_parses_its_names_back() {
        macro_rules! round_trip {
            ($($Enum:ty, $arg:literal, [$($unknown:literal),*];)+) => {$(
                for v in <$Enum>::ALL {
                    assert_eq!(<$Enum>::parse($arg, v.name()), Ok(v));
                }
                $(
                    let err = <$Enum>::parse($arg, $unknown).expect_err($unknown);
                    for name in <$Enum>::NAMES {
                        assert!(err.to_string().contains(name), "{err}");
                    }
                )*
            )+};
        }
        round_trip! {
            crate::machine::ActFunc, "op", ["prelu"];
            crate::machine::AluOp, "op", ["mod"];
            crate::machine::Dtype, "dtype", ["float64"];
            crate::machine::ReduceCmd, "reduce_cmd", [];
            crate::engine::PerfMode, "perf_mode", ["fast"];
            crate::sparsity::Dtype, "dtype", ["complex64"];
        }
    }
}
