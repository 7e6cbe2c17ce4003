//! Tidemark engine (under construction).
