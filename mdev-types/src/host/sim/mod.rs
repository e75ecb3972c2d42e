//! [`SimHost`]: an in-memory kernel model with the kernel's semantics (being built).
