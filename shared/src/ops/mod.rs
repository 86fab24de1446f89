//! Operations described once (issue 37): each file here holds one
//! operation's parameters as a typed struct that derives serde (the tab's
//! worker messages, job files) and, with the `cli` feature, `clap::Args`
//! (the CLI flattens it), with the defaults, ranges and help in one place,
//! and turns them into the method's options (`methods/`).
//!
//! The inputs of an operation (a path in the CLI, a loaded model in the
//! tab, a checkpoint id on the server) stay with the caller; what it is
//! asked to do lives here. So far: [`upcycle`].

pub mod upcycle;
