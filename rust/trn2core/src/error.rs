//! The one error type of the core. The binding crate maps each variant onto a Python exception
//! of the `trn2core.Trn2Error` tree (`ShapeError`, `FormatError`, ...), so every message names the
//! offending argument, the value seen and the limit.

/// Result alias used throughout the core.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Declares [`Error`]: every variant but `Interrupted` is an argument error with the same
/// fields (`arg`, `message`, `rule`); `=> ctor` gives a variant a constructor of that name.
/// Also [`Error::parts`] and [`Error::parts_mut`], the fields every argument error has.
macro_rules! argument_errors {
    ($( $(#[$doc:meta])* $Variant:ident $(=> $ctor:ident)? ),+ $(,)?) => {
        /// Everything that can go wrong in trn2core, with structured fields.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum Error {
            $(
                $(#[$doc])*
                $Variant {
                    /// The offending argument's name as the caller spelled it (e.g. `"shape"`).
                    arg: String,
                    /// What is wrong: the value seen and the limit or the expected form.
                    message: String,
                    /// The documented rule broken, when one is (e.g. `"matmul_memory"`), for
                    /// callers that act on it without reading the message (Python: the
                    /// exception's `rule` attribute).
                    rule: Option<&'static str>,
                },
            )+
            /// The call was cancelled through its [`crate::cancel::Cancel`] token (Ctrl-C in
            /// Python, where the binding raises `KeyboardInterrupt` instead).
            Interrupted,
        }

        // Written out rather than derived (thiserror): the core then needs no proc-macro crate,
        // so its compile (on `make test`'s critical path) need not wait for syn.
        impl std::fmt::Display for Error {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                match self {
                    $(Error::$Variant { arg, message, .. })|+ => write!(f, "{arg}: {message}"),
                    Error::Interrupted => {
                        f.write_str("interrupted: the call was cancelled before it finished")
                    }
                }
            }
        }

        impl std::error::Error for Error {}

        impl Error {
            $($(
                #[doc = concat!("An [`Error::", stringify!($Variant), "`] about argument `arg`.")]
                pub fn $ctor(arg: impl Into<String>, message: impl Into<String>) -> Self {
                    Error::$Variant {
                        arg: arg.into(),
                        message: message.into(),
                        rule: None,
                    }
                }
            )?)+

            /// The argument and rule of an argument error (`None` for
            /// [`Error::Interrupted`]).
            fn parts(&self) -> Option<(&String, Option<&'static str>)> {
                match self {
                    $(Error::$Variant { arg, rule, .. })|+ => Some((arg, *rule)),
                    Error::Interrupted => None,
                }
            }

            /// [`Error::parts`], to change.
            fn parts_mut(&mut self) -> Option<(&mut String, &mut Option<&'static str>)> {
                match self {
                    $(Error::$Variant { arg, rule, .. })|+ => Some((arg, rule)),
                    Error::Interrupted => None,
                }
            }
        }
    };
}

argument_errors! {
    /// An array has the wrong shape or size for the operation (`ShapeError`).
    Shape => shape,
    /// A number format, dtype or rounding mode is unknown or not allowed here (`FormatError`).
    Format => format,
    /// A value is out of its allowed range (`ValueError`).
    Value => value,
    /// A tensor does not follow the requested N:M sparsity pattern (`SparsityError`).
    Sparsity,
    /// A compressed stream is truncated or altered (`CorruptDataError`).
    CorruptData,
    /// A request exceeds a hardware or host capacity (`CapacityError`).
    Capacity => capacity,
}

impl Error {
    /// The argument an error names (`None` for [`Error::Interrupted`]).
    pub fn arg(&self) -> Option<&str> {
        self.parts().map(|(arg, _)| arg.as_str())
    }

    /// The documented rule an error reports, if any.
    pub fn rule(&self) -> Option<&'static str> {
        self.parts().and_then(|(_, rule)| rule)
    }

    /// The same error naming argument `to` where it named `from` (a caller that took the
    /// argument under another name reports the name its user wrote).
    pub fn renamed(mut self, from: &str, to: &str) -> Self {
        if let Some((arg, _)) = self.parts_mut() {
            if arg == from {
                *arg = to.to_string();
            }
        }
        self
    }

    /// The same error, reporting `name` as the rule broken.
    pub fn with_rule(mut self, name: &'static str) -> Self {
        if let Some((_, rule)) = self.parts_mut() {
            *rule = Some(name);
        }
        self
    }
}
