//! Tests of profiles and matching. Hand-built inventories live in [`build`].
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod build;
mod catalog;
mod demo;
mod hosts;
mod match_host;
mod match_mdev;
mod match_vf;
mod offers;
mod props;
mod spec;
