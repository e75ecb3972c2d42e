//! Tests of profiles and matching. Hand-built inventories live in [`build`].
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod build;
mod catalog;
mod matching;
mod props;
mod spec;
