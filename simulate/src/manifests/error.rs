//! Why manifests could not be read.

/// Input that could not be read as manifests, saying where.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// A file, directory or stream could not be read.
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The input is not Kubernetes objects: where, what, and the fix.
    #[error("{0}")]
    Invalid(String),
}

impl ReadError {
    pub(super) fn io(context: String, source: std::io::Error) -> Self {
        Self::Io { context, source }
    }
}
