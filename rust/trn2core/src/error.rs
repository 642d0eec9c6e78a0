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
        /// The documented rule broken, when one is (e.g. `"matmul_memory"`), for callers that
        /// act on it without reading the message (Python: the exception's `rule` attribute).
        rule: Option<&'static str>,
    },
    /// A number format, dtype or rounding mode is unknown or not allowed here (`FormatError`).
    #[error("{arg}: {message}")]
    Format {
        /// The offending argument's name as the caller spelled it (e.g. `"shape"`).
        arg: String,
        /// What is wrong: the value seen and the limit or the expected form.
        message: String,
        /// The documented rule broken, when one is (e.g. `"matmul_memory"`), for callers that
        /// act on it without reading the message (Python: the exception's `rule` attribute).
        rule: Option<&'static str>,
    },
    /// A value is out of its allowed range (`ValueError`).
    #[error("{arg}: {message}")]
    Value {
        /// The offending argument's name as the caller spelled it (e.g. `"shape"`).
        arg: String,
        /// What is wrong: the value seen and the limit or the expected form.
        message: String,
        /// The documented rule broken, when one is (e.g. `"matmul_memory"`), for callers that
        /// act on it without reading the message (Python: the exception's `rule` attribute).
        rule: Option<&'static str>,
    },
    /// A tensor does not follow the requested N:M sparsity pattern (`SparsityError`).
    #[error("{arg}: {message}")]
    Sparsity {
        /// The offending argument's name as the caller spelled it (e.g. `"shape"`).
        arg: String,
        /// What is wrong: the value seen and the limit or the expected form.
        message: String,
        /// The documented rule broken, when one is (e.g. `"matmul_memory"`), for callers that
        /// act on it without reading the message (Python: the exception's `rule` attribute).
        rule: Option<&'static str>,
    },
    /// A compressed stream is truncated or altered (`CorruptDataError`).
    #[error("{arg}: {message}")]
    CorruptData {
        /// The offending argument's name as the caller spelled it (e.g. `"shape"`).
        arg: String,
        /// What is wrong: the value seen and the limit or the expected form.
        message: String,
        /// The documented rule broken, when one is (e.g. `"matmul_memory"`), for callers that
        /// act on it without reading the message (Python: the exception's `rule` attribute).
        rule: Option<&'static str>,
    },
    /// A request exceeds a hardware or host capacity (`CapacityError`).
    #[error("{arg}: {message}")]
    Capacity {
        /// The offending argument's name as the caller spelled it (e.g. `"shape"`).
        arg: String,
        /// What is wrong: the value seen and the limit or the expected form.
        message: String,
        /// The documented rule broken, when one is (e.g. `"matmul_memory"`), for callers that
        /// act on it without reading the message (Python: the exception's `rule` attribute).
        rule: Option<&'static str>,
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
            rule: None,
        }
    }
    /// A `FormatError` about argument `arg`.
    pub fn format(arg: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Format {
            arg: arg.into(),
            message: message.into(),
            rule: None,
        }
    }
    /// A `ValueError` about argument `arg`.
    pub fn value(arg: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Value {
            arg: arg.into(),
            message: message.into(),
            rule: None,
        }
    }
    /// A `CapacityError` about argument `arg`.
    pub fn capacity(arg: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Capacity {
            arg: arg.into(),
            message: message.into(),
            rule: None,
        }
    }

    /// The argument an error names (`None` for [`Error::Interrupted`]).
    pub fn arg(&self) -> Option<&str> {
        match self {
            Error::Shape { arg, .. }
            | Error::Format { arg, .. }
            | Error::Value { arg, .. }
            | Error::Sparsity { arg, .. }
            | Error::CorruptData { arg, .. }
            | Error::Capacity { arg, .. } => Some(arg),
            Error::Interrupted => None,
        }
    }

    /// The documented rule an error reports, if any.
    pub fn rule(&self) -> Option<&'static str> {
        match self {
            Error::Shape { rule, .. }
            | Error::Format { rule, .. }
            | Error::Value { rule, .. }
            | Error::Sparsity { rule, .. }
            | Error::CorruptData { rule, .. }
            | Error::Capacity { rule, .. } => *rule,
            Error::Interrupted => None,
        }
    }

    /// The same error naming argument `to` where it named `from` (a caller that took the
    /// argument under another name reports the name its user wrote).
    pub fn renamed(mut self, from: &str, to: &str) -> Self {
        match &mut self {
            Error::Shape { arg, .. }
            | Error::Format { arg, .. }
            | Error::Value { arg, .. }
            | Error::Sparsity { arg, .. }
            | Error::CorruptData { arg, .. }
            | Error::Capacity { arg, .. } => {
                if arg == from {
                    *arg = to.to_string();
                }
            }
            Error::Interrupted => {}
        }
        self
    }

    /// The same error, reporting `name` as the rule broken.
    pub fn with_rule(mut self, name: &'static str) -> Self {
        match &mut self {
            Error::Shape { rule, .. }
            | Error::Format { rule, .. }
            | Error::Value { rule, .. }
            | Error::Sparsity { rule, .. }
            | Error::CorruptData { rule, .. }
            | Error::Capacity { rule, .. } => *rule = Some(name),
            Error::Interrupted => {}
        }
        self
    }
}
