//! GGUF v3 reader (placeholder, being written).
