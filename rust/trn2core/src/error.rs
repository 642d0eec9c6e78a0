//! The one error type of the core. The binding crate maps each variant onto a Python exception
//! of the `trn2core.Trn2Error` tree (`ShapeError`, `FormatError`, ...), so every message names the
//! offending argument, the value seen and the limit.

/// Result alias used throughout the core.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in trn2core, with structured fields.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// An array has the wrong shape or size for the operation (`ShapeError`).
    #[error("{arg}: {message}")]
    Shape {
        /// The offending argument's name as the caller spelled it (e.g. `"shape"`).
        arg: String,
        /// What is wrong: the value seen and the limit or the expected form.
        message: String,
    },
    /// A number format, dtype or rounding mode is unknown or not allowed here (`FormatError`).
    #[error("{arg}: {message}")]
    Format {
        /// The offending argument's name as the caller spelled it (e.g. `"shape"`).
        arg: String,
        /// What is wrong: the value seen and the limit or the expected form.
        message: String,
    },
    /// A value is out of its allowed range (`ValueError`).
    #[error("{arg}: {message}")]
    Value {
        /// The offending argument's name as the caller spelled it (e.g. `"shape"`).
        arg: String,
        /// What is wrong: the value seen and the limit or the expected form.
        message: String,
    },
    /// A tensor does not follow the requested N:M sparsity pattern (`SparsityError`).
    #[error("{arg}: {message}")]
    Sparsity {
        /// The offending argument's name as the caller spelled it (e.g. `"shape"`).
        arg: String,
        /// What is wrong: the value seen and the limit or the expected form.
        message: String,
    },
    /// A compressed stream is truncated or altered (`CorruptDataError`).
    #[error("{arg}: {message}")]
    CorruptData {
        /// The offending argument's name as the caller spelled it (e.g. `"shape"`).
        arg: String,
        /// What is wrong: the value seen and the limit or the expected form.
        message: String,
    },
    /// A request exceeds a hardware or host capacity (`CapacityError`).
    #[error("{arg}: {message}")]
    Capacity {
        /// The offending argument's name as the caller spelled it (e.g. `"shape"`).
        arg: String,
        /// What is wrong: the value seen and the limit or the expected form.
        message: String,
    },
    /// The call was cancelled through its [`crate::cancel::Cancel`] token (Ctrl-C in Python,
    /// where the binding raises `KeyboardInterrupt` instead).
    #[error("interrupted: the call was cancelled before it finished")]
    Interrupted,
}

impl Error {
    /// A `ShapeError` about argument `arg`.
    pub fn shape(arg: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Shape {
            arg: arg.into(),
            message: message.into(),
        }
    }
    /// A `FormatError` about argument `arg`.
    pub fn format(arg: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Format {
            arg: arg.into(),
            message: message.into(),
        }
    }
    /// A `ValueError` about argument `arg`.
    pub fn value(arg: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Value {
            arg: arg.into(),
            message: message.into(),
        }
    }
    /// A `CapacityError` about argument `arg`.
    pub fn capacity(arg: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Capacity {
            arg: arg.into(),
            message: message.into(),
        }
    }
}
