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
                Self::ALL
                    .iter()
                    .copied()
                    .find(|v| v.name() == name)
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
    named_enum! {
        /// A test enum.
        #[derive(Default)]
        pub enum Colour("colour", value) {
            /// Red.
            #[default]
            Red = "red",
            /// Green.
            Green = "green",
        }
    }

    #[test]
    fn lists_names_and_parses_them_back() {
        assert_eq!(Colour::ALL, [Colour::Red, Colour::Green]);
        assert_eq!(Colour::NAMES, ["red", "green"]);
        assert_eq!(Colour::default(), Colour::Red);
        for c in Colour::ALL {
            assert_eq!(Colour::parse("c", c.name()).ok(), Some(c));
            assert_eq!(c.to_string(), c.name());
        }
        let err = Colour::parse("c", "blue").err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("c: unknown colour \"blue\"; expected one of [\"red\", \"green\"]")
        );
    }
}
