//! Tidemark operator.
