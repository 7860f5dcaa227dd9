//! The HAProxy SPOE agent's listener (SPOA_HOST, SPOA_PORT) and its frame cap, validated into
//! the address to bind and [`SpoaOptions`].

use std::net::SocketAddr;

use super::SettingsError;
use super::addrs::{check_distinct, resolve_listener};
use super::parse::Named;
use super::parse::in_range_or;
use crate::api::spoa::{DEFAULT_MAX_FRAME_BYTES, MAX_FRAME_BYTES, MIN_FRAME_BYTES, SpoaOptions};

/// Raw SPOA settings, as typed by the operator.
#[derive(Clone, Debug, clap::Args)]
pub struct SpoaArgs {
    /// Address of the HAProxy SPOE agent listener.
    #[arg(
        long,
        env = "SPOA_HOST",
        default_value = "0.0.0.0",
        help_heading = "Listeners"
    )]
    pub spoa_host: String,
    /// Port of the HAProxy SPOE agent listener; 0 (the default) leaves it off.
    #[arg(
        long,
        env = "SPOA_PORT",
        default_value_t = 0,
        help_heading = "Listeners"
    )]
    pub spoa_port: u16,
    /// The largest SPOP frame the agent announces and accepts (HAProxy's own is lower or equal).
    #[arg(
        long,
        env = "SLUICE_SPOA_MAX_FRAME_BYTES",
        default_value_t = DEFAULT_MAX_FRAME_BYTES,
        help_heading = "Listener limits"
    )]
    pub spoa_max_frame_bytes: u32,
}

/// The SPOE agent's listener: where it binds, and its options.
pub(super) struct SpoaListener {
    pub(super) addr: SocketAddr,
    pub(super) options: SpoaOptions,
}

impl SpoaArgs {
    /// Where the agent listens, with its options; `None` when SPOA_PORT is 0. `others` are the
    /// other listeners, which it must not share an address with.
    pub(super) fn validate(
        &self,
        others: &[Named<SocketAddr>],
    ) -> Result<Option<SpoaListener>, SettingsError> {
        let max = in_range_or(
            "SLUICE_SPOA_MAX_FRAME_BYTES",
            self.spoa_max_frame_bytes,
            &(MIN_FRAME_BYTES..=MAX_FRAME_BYTES),
            format_args!("expected {MIN_FRAME_BYTES} to {MAX_FRAME_BYTES}"),
        )?;
        if self.spoa_port == 0 {
            return Ok(None);
        }
        let addr = resolve_listener("SPOA_HOST", &self.spoa_host, self.spoa_port)?;
        let mut all = others.to_vec();
        all.push(Named::new("SPOA_PORT", addr));
        check_distinct(&all)?;
        Ok(Some(SpoaListener {
            addr,
            options: SpoaOptions {
                max_frame_bytes: max,
            },
        }))
    }
}
