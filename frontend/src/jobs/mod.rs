//! The Jobs page's client of `moe-studio serve`: HTTP calls with the bearer
//! token ([`api`]), chunked resumable uploads ([`upload`]), the per-job
//! server-sent event stream ([`events`]) and the live loss curve
//! ([`loss_chart`]). The page itself is [`crate::pages::jobs`].

pub mod api;
pub mod events;
pub mod loss_chart;
pub mod upload;
