//! The API version of every Tidemark kind.

/// `apiVersion` of every Tidemark document and resource.
pub const API_VERSION: &str = "tidemark.io/v1alpha1";
